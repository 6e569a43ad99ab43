"""Model latency: our compiled MiniLM and SmolLM2 (prefill, decode) against Hugging Face transformers
with the same weights, eager and ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), same device.

Run it in two steps: the graphs are optimised here (egglog) and pickled, because the GPU
machine has no egglog; there, one command times everything (several minutes on an H200, most of
them torch.compile's warm-up: each peer row records its own in ``peer_setup_s``)::

    .venv/bin/python bench/models.py --save-graphs bench/graphs        # here: optimise and pickle
    python3 bench/models.py --graphs bench/graphs --json bench/results/models_h200.json   # GPU machine
    python3 bench/models.py --graphs bench/graphs --check               # outputs of both sides agree?

A smoke test without CUDA (lavapipe; torch CPU, e.g. a Python 3.11 venv with eggfuse installed
``--no-deps``)::

    .venv/bin/python bench/models.py --save-graphs /tmp/g --quick
    python3 bench/models.py --graphs /tmp/g --check                   # HF (CPU) vs numpy reference vs ours
    python3 bench/models.py --graphs /tmp/g --cpu-peer --peers eager:fp32,default:fp32

What is compared (``torch_peers.py`` builds the peers and maps the weights):

- ``minilm``: all-MiniLM-L6-v2, batch ``--batch`` x ``--seq`` tokens -> L2-normalised mean-pooled
  embeddings; peer ``BertModel`` + the same pooling and normalisation.
- ``smollm2_prefill``: SmolLM2-135M on ``--seq`` tokens -> logits of every position (no cache);
  peer ``LlamaForCausalLM``.
- ``smollm2_decode``: one token at the next position after a prompt of ``--seq`` tokens, over a
  KV cache of 512 positions -> logits [1, V]. Within a sample the calls decode positions seq,
  seq+1, ...; every sample starts at seq again. Peer ``LlamaForCausalLM`` with a ``StaticCache``
  (the peer attends over all 512 cache rows under a mask, ours over pos+1 rows).

Weights are random, of the real shapes, identical on both sides (latency does not depend on
their values). Timing, the same on both sides: ``--calls`` back-to-back calls (ours:
``Session.run(feeds, read=())``, the plan pre-recorded; the peer: the eager module or the
compiled function, a CUDA-graph replay per call), wall clock around them with one
synchronisation at the end, divided by the calls; ``--repeats`` such samples give the median and
p90. Ours also by GPU timestamps around the same number of back-to-back plan copies
(``ours_gpu_ms``), the peer also by CUDA events (``peer_event_ms``). Outputs stay on the device
on both sides. The peers are fp32 with TF32 off, except the bf16 rows (ours computes in fp32, on
fp32 weights or, with ``--weights q4_1``, blocks).

Columns (JSON fields): ``model``; ``ours_ms``/``ours_p90_ms`` (fused plan, wall clock, median /
p90, ms per call); ``ours_gpu_ms`` (timestamps); ``ours_unfused_ms``; ``ours_dispatches``;
``peer`` (the HF module), ``peer_mode`` (eager or the torch.compile mode), ``peer_dtype``,
``peer_ms``/``peer_p90_ms`` (wall clock, as ours), ``peer_event_ms``; ``ratio`` = ours_ms /
peer_ms (below 1: ours faster); ``floor_fp32_ms``/``floor_bf16_ms``: the bandwidth floor, weight
bytes / the device-to-device copy bandwidth measured in the same run (``copy_gbs``, read + write
bytes per second), i.e. the time to read every weight once; ``rel_diff_vs_ours``: max |peer -
ours| / max |ours| of the outputs of the timed peer and ours on the same inputs (fp32 peers
warn above 1e-3); ``peer_cudagraph_skips``: torch.compile calls that fell back to no CUDA
graphs (a warning is printed on CUDA); ``peer_setup_s``, ``error`` (a peer that failed). Without
CUDA the peer fields say ``skipped: no CUDA`` (``--cpu-peer`` runs the peers on the CPU instead).

``--weights q4_1`` runs the SmolLM2 rows with the weights kept as blocks, laid out as the
shipped GGUF file lays them out (Q4_1 layers, a Q8_0 embedding table; ``ir/ops/quant.py``,
decoded inside the matmul kernels): the random weights are quantised with gguf's quantisers and
the peer gets them dequantised, so both sides still compute the same function (``--check``
holds to 1e-3). ``weights`` (``f32`` or ``q4_1``) is then a column; ``weight_bytes`` counts our
bytes, ``floor_ours_ms`` is those bytes over the copy bandwidth, while ``floor_fp32_ms`` and
``floor_bf16_ms`` stay those of the model in fp32 and bf16; MiniLM stays fp32. ``--weights`` is
given with ``--save-graphs`` (the graphs differ); the saved graphs remember it.
``--weights f16`` runs the SmolLM2 rows with every 2-D weight rounded to float16 instead (the f16
rows of ``ir/ops/quant.py``, what ``generate --weights f16`` and ``precision="f16"`` store), the
peer getting the rounded values in fp32; ``weights`` is then ``f16``. MiniLM's plan is then the
one ``compile(..., precision="f16")`` makes (its matmul weights and embedding tables stored f16 by
the f16 ruleset, rounded when the session is created); its peer keeps the unrounded fp32 weights,
so ``rel_diff_vs_ours`` shows the rounding.

``--check`` times nothing: on padded inputs with random token types it compares the eager fp32
peer with the numpy reference (``eggfuse.ir.evaluate``) and with ours, and every other peer of
``--peers`` with the eager one (``--peers eager:fp32`` skips the compilations); it exits 1 when
a difference exceeds 1e-3 of the output's largest magnitude (1e-1 for bf16). ``--models`` picks
models; ``--merge`` keeps the other models' rows already in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

from eggfuse.ir import DType, Graph, evaluate
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph
from eggfuse.models.minilm import Batch, BertConfig, build_bert_graph, feeds

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402
import torch_peers  # noqa: E402

MODELS = ("minilm", "smollm2_prefill", "smollm2_decode")
MINILM_LAYERS = 6
#: Positions held by the decode benchmark's KV cache (ours and the peer's StaticCache).
DECODE_MAX_SEQ = 512
#: --check fails when max |a - b| exceeds this fraction of max |peer|.
CHECK_RTOL = 1e-3


def minilm_graph(batch: int, seq: int, layers: int = MINILM_LAYERS) -> Graph:
    cfg = BertConfig(hidden_size=384, num_hidden_layers=layers, num_attention_heads=12, intermediate_size=1536,
                     vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12)
    return build_bert_graph(cfg, batch, seq)


#: ``--weights``: SmolLM2's weight storage.
WEIGHTS = ("f32", "q4_1", "f16")


def smollm2_quant(weights: str) -> dict[str, str]:
    """The block format of each SmolLM2 weight for ``weights``: none for f32; for q4_1 the
    shipped GGUF file's layout (every projection Q4_1, the embedding table Q8_0); for f16 every
    2-D weight f16 (``generate --weights f16``)."""
    if weights == "f32":
        return {}
    names = build_llama_graph(LlamaConfig.smollm2_135m(), 1).parameters
    if weights == "f16":
        return {n: "f16" for n, t in names.items() if len(t.shape) == 2}
    return {n: "q8_0" if n == "token_embd.weight" else "q4_1" for n, t in names.items() if len(t.shape) == 2}


def graphs(seq: int, batch: int, layers: int | None = None, weights: str = "f32") -> dict[str, Graph]:
    """Our unfused graphs; ``layers`` (None: the real depths) cuts both models to their first layers;
    ``weights`` is SmolLM2's weight storage (:func:`smollm2_quant`)."""
    cfg, quant = LlamaConfig.smollm2_135m(), smollm2_quant(weights)
    return {
        "minilm": minilm_graph(batch, seq, min(layers or MINILM_LAYERS, MINILM_LAYERS)),
        "smollm2_prefill": build_llama_graph(cfg, seq, layers=layers, quant=quant),
        "smollm2_decode": build_llama_cache_graph(cfg, 1, DECODE_MAX_SEQ, layers=layers, quant=quant),
    }


def quantise(params: dict[str, np.ndarray], weights: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """SmolLM2 ``params`` stored as ``weights`` (gguf's quantisers, :func:`smollm2_quant`'s formats),
    and the float32 values those hold (what the peer runs on: the blocks dequantised)."""
    from eggfuse.models.gguf import requantise

    quant = {n: f for n, f in smollm2_quant(weights).items() if n in params}
    stored, formats = dict(params), {}
    for fmt in set(quant.values()):
        part, got = requantise({n: params[n] for n, f in quant.items() if f == fmt}, {}, fmt)
        stored.update(part)
        formats.update(got)
    return stored, requantise(stored, formats, "f32")[0]


def f32_weight_bytes(graph: Graph) -> int:
    """Bytes of the graph's weights in fp32: each Dequant's f32 matrix, the other parameters as they are."""
    dequantised = {n.inputs[0]: n.type.size_bytes for n in graph.nodes if n.op == "Dequant"}
    return sum(dequantised.get(n.id, n.type.size_bytes) for n in graph.leaves("Parameter") if not n.attrs["state"])


def save_graphs(out: Path, meta: dict) -> None:
    from eggfuse.rewrites import optimize
    from eggfuse.rewrites.rulesets import optimization_rulesets, optional_ruleset

    out.mkdir(parents=True, exist_ok=True)
    for name, g in graphs(meta["seq"], meta["batch"], meta["layers"], meta["weights"]).items():
        # MiniLM's f16 plan is compile(..., precision="f16")'s: the f16 ruleset rounds its [N, K] weights
        f16 = name == "minilm" and meta["weights"] == "f16"
        fused, rep = optimize(g, rulesets=(*optimization_rulesets(), optional_ruleset("f16")) if f16 else None)
        (out / f"{name}.pkl").write_bytes(pickle.dumps({"unfused": g, "fused": fused, "meta": meta}))
        print(f"{name}: dispatches {rep.dispatches_before} -> {rep.dispatches_after}")
    print(f"wrote {out}/*.pkl ({meta})")


def load_graphs(directory: Path) -> tuple[dict[str, tuple[Graph, Graph]], dict]:
    out, meta = {}, None
    for name in MODELS:
        path = directory / f"{name}.pkl"
        if not path.exists():
            raise SystemExit(f"{path} is missing: make it with "
                             f".venv/bin/python bench/models.py --save-graphs {directory}")
        saved = pickle.loads(path.read_bytes())
        out[name] = (saved["unfused"], saved["fused"])
        meta = {"weights": "f32", **(saved.get("meta") or {"seq": 128, "batch": 8, "layers": None})}
    return out, meta


def saved_model(directory: Path, kind: str, calls: int) -> tuple[Graph, dict, list[dict], dict]:
    """``kind``'s fused graph from a folder of --save-graphs, its random parameters as the folder's
    weights (:func:`random_params`), our feeds for ``calls`` back-to-back runs on the unpadded inputs
    (:func:`our_feeds`) and the folder's meta: what the benchmarks of one plan's variants time."""
    loaded, meta = load_graphs(directory)
    unfused, fused = loaded[kind]
    params = random_params(kind, unfused, meta["layers"], meta["weights"])
    inputs = model_inputs(kind, meta["seq"], meta["batch"], padded=False)
    return fused, params, our_feeds(kind, inputs, meta["seq"], calls), meta


def random_values(graph: Graph, seed: int = 0) -> tuple[dict, dict]:
    """Parameters N(0, 0.02) (norm weights 1), inputs valid for their tables (also used by
    bench/runtime_overhead.py, and here when torch is absent)."""
    rng = np.random.default_rng(seed)
    params = {}
    for n in graph.leaves("Parameter"):
        name, shape = n.attrs["name"], n.type.shape
        ones = len(shape) == 1 and ("norm" in name or "LayerNorm" in name)
        params[name] = np.ones(shape, np.float32) if ones else (0.02 * rng.standard_normal(shape)).astype(np.float32)
    inputs = {}
    for n in graph.leaves("Input"):
        name, shape = n.attrs["name"], n.type.shape
        if n.type.dtype is DType.U32:
            hi = {"tokens": 49152, "input_ids": 30522, "position_ids": 512, "token_type_ids": 1}.get(name, 1)
            inputs[name] = rng.integers(0, hi, shape).astype(np.uint32)
        elif name == "key_mask":
            inputs[name] = np.ones(shape, np.float32)
        elif name == "pool":  # mean pooling of every token: weights 1 / S
            inputs[name] = np.full(shape, 1.0 / shape[1], np.float32)
        else:
            inputs[name] = rng.standard_normal(shape).astype(np.float32)
    return inputs, params


def random_params(kind: str, unfused: Graph, layers: int | None, weights: str) -> dict[str, np.ndarray]:
    """Random parameters of ``kind``'s graph (:func:`random_values`); SmolLM2's stored as ``weights``
    (:func:`quantise`, from random f32 weights) where that is not f32."""
    if kind == "minilm" or weights == "f32":
        return random_values(unfused)[1]
    f32 = build_llama_graph(LlamaConfig.smollm2_135m(), 1, layers=layers)
    return quantise(random_values(f32)[1], weights)[0]


def model_inputs(kind: str, seq: int, batch: int, padded: bool, seed: int = 0) -> dict:
    """The inputs both sides get: minilm ``ids``/``types``/``mask`` [B, S] (``padded``: random
    token types and sentences of decreasing length; else type 0 and no padding); prefill
    ``tokens`` [S]; decode ``prompt`` [S] and ``token`` [1]."""
    rng = np.random.default_rng(seed)
    if kind == "minilm":
        mask = np.ones((batch, seq), np.float32)
        types = np.zeros((batch, seq), np.int64)
        if padded:
            types = rng.integers(0, 2, (batch, seq))
            for b in range(batch):
                mask[b, max(2, seq - b * seq // (2 * batch)):] = 0.0
        return {"ids": rng.integers(0, 30522, (batch, seq)), "types": types, "mask": mask}
    if kind == "smollm2_prefill":
        return {"tokens": rng.integers(0, 49152, seq)}
    return {"prompt": rng.integers(0, 49152, seq), "token": rng.integers(0, 49152, 1)}


def our_feeds(kind: str, inputs: dict, seq: int, calls: int) -> list[dict]:
    """Our graph's feeds for ``calls`` back-to-back runs (decode: positions seq, seq+1, ...; the
    other models: the same feed ``calls`` times)."""
    if kind == "minilm":
        mask = inputs["mask"]
        return [feeds(Batch((), inputs["ids"].astype(np.uint32), mask, inputs["types"].astype(np.uint32)))] * calls
    if kind == "smollm2_prefill":
        return [{"tokens": inputs["tokens"].astype(np.uint32)}] * calls
    token = inputs["token"].astype(np.uint32)
    return [{"tokens": token, "pos": np.array([seq + i], np.uint32)} for i in range(calls)]


def time_ours(graph: Graph, params: dict, kind: str, inputs: dict, seq: int, calls: int, samples: int) -> dict:
    from eggfuse.pipeline import lower_for

    return time_plan(lower_for(graph), params, our_feeds(kind, inputs, seq, calls), calls, samples)


def time_plan(plan, params: dict, feeds: list[dict], calls: int, samples: int) -> dict:
    """A session of ``plan`` timed as :func:`time_ours` does: ``wall`` (gpu_timing.wall_per_call over
    ``feeds``, after its warm-up) and ``gpu`` (gpu_timing.gpu_per_call, None without timestamps), seconds
    per run; ``dispatches``, ``adapter``, and ``output``: the first output of a run on ``feeds[0]``."""
    from eggfuse.runtime import Session

    s = Session(plan, {k: v for k, v in params.items() if k in plan.parameters})
    output = s.run(feeds[0])[0]
    wall = gpu_timing.wall_per_call(s, feeds, samples)
    s.run(feeds[0], read=())
    gpu = gpu_timing.gpu_per_call(s, calls, samples)
    return {"wall": wall, "gpu": gpu, "dispatches": len(plan.dispatches), "adapter": s.adapter, "output": output}


def time_alternately(plans: dict, params: dict, feeds: list[dict] | dict[str, list[dict]], calls: int, samples: int,
                     rounds: int, show: bool = True) -> list[dict]:
    """``plans`` (name -> ExecutionPlan) timed by :func:`time_plan` in turn, ``rounds`` times: one row per
    (round, plan) with ``variant`` (the name), ``round``, ``wall_us`` and ``gpu_us`` (medians, us per run;
    gpu None without timestamps), ``dispatches``, ``max_abs_diff`` (against the first plan's output) and
    ``adapter``; each row printed as it comes with ``show``. ``feeds``: one list for every plan, or a list per
    plan name (plans of graphs with other inputs; their ``max_abs_diff`` then compares other computations)."""
    rows, base = [], None
    for r in range(rounds):
        for name, plan in plans.items():
            t = time_plan(plan, params, feeds[name] if isinstance(feeds, dict) else feeds, calls, samples)
            base = t["output"] if base is None else base
            rows.append({"variant": name, "round": r, "wall_us": gpu_timing.median_p90(t["wall"])[0] * 1e6,
                         "gpu_us": gpu_timing.median_p90(t["gpu"])[0] * 1e6 if t["gpu"] else None,
                         "dispatches": t["dispatches"], "max_abs_diff": float(np.max(np.abs(t["output"] - base))),
                         "adapter": t["adapter"]})
            if show:
                print({k: rows[-1][k] for k in ("variant", "round", "wall_us", "gpu_us", "max_abs_diff")}, flush=True)
    return rows


#: Decode steps of --check: the prompt, then the token fed this many times (positions P, P+1, ...).
CHECK_STEPS = 3


def ours_output(graph: Graph, params: dict, kind: str, inputs: dict) -> np.ndarray:
    """Our fused plan's output on the device (decode: the prompt fed one token per step, then
    ``token`` CHECK_STEPS times; the logits of the last step)."""
    from eggfuse.pipeline import lower_for
    from eggfuse.runtime import Session

    s = Session(lower_for(graph), {k: v for k, v in params.items() if k in graph.parameters})
    if kind != "smollm2_decode":
        return s.run(our_feeds(kind, inputs, 0, 1)[0])[0].astype(np.float64)
    tokens = _check_tokens(inputs)
    for pos, tok in enumerate(tokens):
        s.run({"tokens": tok[None], "pos": np.array([pos], np.uint32)}, read=())
    return s.read_output(0)[0].astype(np.float64)


def _check_tokens(inputs: dict) -> np.ndarray:
    return np.concatenate([inputs["prompt"]] + [inputs["token"]] * CHECK_STEPS).astype(np.uint32)


def reference_output(unfused: Graph, params: dict, kind: str, inputs: dict, layers: int | None,
                     weights: str = "f32") -> np.ndarray:
    """The numpy reference (eggfuse.ir.evaluate, float64) of the same output (decode: the last
    row of the prefill graph over the same tokens, which the cached steps must equal)."""
    if kind != "smollm2_decode":
        return evaluate(unfused, our_feeds(kind, inputs, 0, 1)[0], params)[0]
    tokens = _check_tokens(inputs)
    g = build_llama_graph(LlamaConfig.smollm2_135m(), len(tokens), layers=layers, quant=smollm2_quant(weights))
    return evaluate(g, {"tokens": tokens}, params)[0][-1]


def check(models: dict, hf: dict, params: dict, meta: dict, peers: list, torch, device: str) -> bool:
    """Print max |difference| of the outputs on the same inputs: the peer (eager fp32) against
    the numpy reference and against ours; every other peer of ``peers`` against the eager one
    (bf16 with a 100x looser tolerance). True when all are within tolerance."""
    ok = True

    def report(kind, what, value, peer, rtol):
        nonlocal ok
        diff, scale = float(np.abs(value - peer).max()), float(np.abs(peer).max())
        good = diff <= rtol * scale
        ok &= good
        print(f"check {kind:<16} {what:<52} max |diff| {diff:.3e} (max |eager| {scale:.3e}, rel "
              f"{diff / scale:.2e}) {'ok' if good else 'FAIL'}", flush=True)

    for kind, (unfused, fused) in models.items():
        inputs = model_inputs(kind, meta["seq"], meta["batch"], padded=True, seed=1)
        p = params[kind]

        def output(mode, dtype, kind=kind, inputs=inputs):
            pr = torch_peers.peer(torch, kind, hf[kind], mode, dtype, inputs, device, DECODE_MAX_SEQ)
            return torch_peers.peer_output(torch, pr, CHECK_STEPS).ravel()

        eager = output("eager", "fp32")
        report(kind, f"HF eager fp32 ({device}) vs numpy reference",
               reference_output(unfused, p, kind, inputs, meta["layers"], meta["weights"]).ravel(), eager,
               CHECK_RTOL)
        report(kind, "HF eager fp32 vs ours (fused, wgpu)", ours_output(fused, p, kind, inputs).ravel(), eager,
               CHECK_RTOL)
        for mode, dtype in peers:
            if (mode, dtype) != ("eager", "fp32"):
                report(kind, f"HF eager fp32 vs HF {mode} {dtype}", output(mode, dtype), eager,
                       CHECK_RTOL * (100 if dtype == "bf16" else 1))
                torch._dynamo.reset()
    return ok


def _ms(values) -> tuple[float, float]:
    med, p90 = gpu_timing.median_p90(values)
    return med * 1e3, p90 * 1e3


def peer_row(torch, base: dict, kind: str, model, mode: str, dtype: str, inputs: dict, device: str, calls: int,
             samples: int, ours_out: np.ndarray) -> dict:
    """``base`` (our side) completed with one peer's timing, and ``rel_diff_vs_ours``: max |peer -
    ours| / max |ours| of the outputs on the same inputs (``ours_out``, see :func:`ours_output`),
    from the timed peer after its timing. A peer that fails (compilation, say) gives a row with
    its error, so the other rows still come."""
    import transformers
    from torch._dynamo.utils import counters

    cuda = device == "cuda"
    row = {**base, "peer": f"transformers ({kind})", "peer_mode": mode, "peer_dtype": dtype, "peer_tf32": False,
           "peer_device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__, "peer_ms": None, "peer_p90_ms": None, "ratio": None}
    start, skips = time.perf_counter(), counters["inductor"]["cudagraph_skips"]
    try:
        pr = torch_peers.peer(torch, kind, model, mode, dtype, inputs, device, DECODE_MAX_SEQ)
        row["peer"], row["peer_attn"] = pr.name, pr.attn
        t = torch_peers.time_peer(torch, pr, calls, samples, cuda)
    except Exception as e:  # noqa: BLE001 - reported in the row and on the console
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        print(f"{kind}: peer {mode} {dtype} failed: {row['error']}", flush=True)
    else:
        row["peer_ms"], row["peer_p90_ms"] = _ms(t["wall"])
        row["peer_event_ms"] = _ms(t["events"])[0] if t["events"] else None
        row["ratio"] = row["ours_ms"] / row["peer_ms"]
        out = torch_peers.peer_output(torch, pr, CHECK_STEPS).ravel()
        row["rel_diff_vs_ours"] = float(np.abs(out - ours_out).max() / np.abs(ours_out).max())
        if dtype == "fp32" and row["rel_diff_vs_ours"] > CHECK_RTOL:
            print(f"{kind}: peer {mode} {dtype} and ours disagree: max |diff| / max |ours| "
                  f"{row['rel_diff_vs_ours']:.2e} > {CHECK_RTOL}", flush=True)
    row["peer_setup_s"] = time.perf_counter() - start  # compilation and warm-up included
    # torch.compile falls back to no CUDA graphs with a warning ("skipping cudagraphs due to ..."): count them
    row["peer_cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
    if row["peer_cudagraph_skips"] and cuda and mode in torch_peers.CUDAGRAPH_MODES:
        print(f"{kind}: peer {mode} {dtype} ran without CUDA graphs ({row['peer_cudagraph_skips']} skips; "
              "torch logged why)", flush=True)
    torch._dynamo.reset()
    return row


def print_row(r: dict) -> None:
    def f(key, spec=".3f"):
        return "-" if r.get(key) is None else format(r[key], spec)

    print(f"{r['model']:<16}{f('ours_ms'):>9}{f('ours_p90_ms'):>9}{f('ours_gpu_ms'):>9}  {r['peer'][:44]:<45}"
          f"{r['peer_mode']:<16}{r['peer_dtype']:<6}{f('peer_ms'):>9}{f('peer_p90_ms'):>9}{f('ratio'):>8}"
          f"{f('floor_fp32_ms'):>9}{f('floor_bf16_ms'):>9}", flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, help="tokens per sequence (default 128; --quick 16)")
    ap.add_argument("--batch", type=int, help="MiniLM sentences per batch (default 8; --quick 2)")
    ap.add_argument("--layers", type=int, help="first N layers of each model (default: all; --quick 2)")
    ap.add_argument("--quick", action="store_true", help="small shapes for a smoke test (with --save-graphs)")
    ap.add_argument("--weights", choices=WEIGHTS, help="SmolLM2's weight storage: f32 (default), q4_1 (blocks "
                    "decoded in the kernels, the shipped GGUF file's layout) or f16 (every 2-D weight as float16); "
                    "with --save-graphs")
    ap.add_argument("--repeats", type=int, default=20, help="samples, for median and p90 (default 20)")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back calls per sample (default 10)")
    ap.add_argument("--peers", default=torch_peers.DEFAULT_PEERS, help="MODE:DTYPE,... (MODE: eager, default, "
                    f"reduce-overhead, max-autotune; DTYPE: fp32, bf16); default {torch_peers.DEFAULT_PEERS}")
    ap.add_argument("--models", default=",".join(MODELS), help="which of " + ",".join(MODELS))
    ap.add_argument("--cpu-peer", action="store_true", help="without CUDA, run the peers on the CPU")
    ap.add_argument("--check", action="store_true", help="compare the outputs of both sides instead of timing")
    ap.add_argument("--save-graphs", type=Path, help="optimise the graphs (needs egglog), pickle them there")
    ap.add_argument("--graphs", type=Path, help="folder of graphs saved by --save-graphs")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "models.json")
    ap.add_argument("--merge", action="store_true", help="keep the rows of the models not run now from --json")
    return ap.parse_args()


def shapes_of(args) -> tuple[dict, dict]:
    """The shapes {seq, batch, layers} the options ask for, and those given explicitly."""
    given = {k: v for k, v in {"seq": args.seq, "batch": args.batch, "layers": args.layers,
                               "weights": args.weights}.items() if v is not None}
    meta = {"seq": 16, "batch": 2, "layers": 2} if args.quick else {"seq": 128, "batch": 8, "layers": None}
    meta["weights"] = "f32"
    return {**meta, **given}, given


def select_graphs(args) -> tuple[dict[str, tuple[Graph, Graph]], dict]:
    """(unfused, fused) per model of ``--models``, and the shapes {seq, batch, layers}."""
    meta, given = shapes_of(args)
    if args.graphs:
        loaded, saved_meta = load_graphs(args.graphs)
        clash = {k: v for k, v in given.items() if v != saved_meta.get(k)}
        if "weights" not in given:  # the saved graphs say
            meta["weights"] = saved_meta["weights"]
        if clash or (args.quick and saved_meta != meta):
            raise SystemExit(f"{args.graphs} holds graphs for {saved_meta}, not {clash or meta}: "
                             "save them again with those options")
        meta = saved_meta
    else:
        from eggfuse.rewrites import optimize

        loaded = {name: (g, optimize(g)[0])
                  for name, g in graphs(meta["seq"], meta["batch"], meta["layers"], meta["weights"]).items()}
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in wanted if m not in MODELS]:
        raise SystemExit(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    if meta["seq"] + max(args.calls, 5) > DECODE_MAX_SEQ:
        raise SystemExit(f"--seq {meta['seq']} + the decode calls must stay within the {DECODE_MAX_SEQ}-position "
                         "cache")
    return {name: loaded[name] for name in MODELS if name in wanted}, meta


def hf_models(models: dict, layers: int | None, torch, transformers, device: str,
              weights: str = "f32") -> tuple[dict, dict]:
    """The HF model of each of ``models`` on ``device`` (prefill and decode share one) and our
    parameters holding its weights; without torch, no models and random parameters. With
    ``weights`` q4_1, SmolLM2's parameters are blocks (:func:`quantise`) and the HF model gets
    their dequantised values."""
    hf, params = {}, {}
    for kind, (unfused, _) in models.items():
        if torch is None:  # our side alone, on random weights
            params[kind] = random_params(kind, unfused, layers, weights)
            continue
        torch_peers.set_fp32_precision(torch)
        llama = next((k for k in hf if k != "minilm"), None)
        if kind == "minilm":
            hf[kind] = torch_peers.build_bert(torch, transformers, min(layers or MINILM_LAYERS, MINILM_LAYERS))
            params[kind] = torch_peers.bert_params(hf[kind])
        elif llama is not None:
            hf[kind], params[kind] = hf[llama], params[llama]
        else:
            hf[kind] = torch_peers.build_llama(torch, transformers, layers or LlamaConfig.smollm2_135m().num_layers)
            params[kind] = torch_peers.llama_params(hf[kind])
            if weights != "f32":
                params[kind], values = quantise(params[kind], weights)
                torch_peers.set_llama_params(torch, hf[kind], values)
        missing = sorted(n for n in set(unfused.parameters) - set(params[kind]) if not n.endswith("_cache"))
        if missing:
            raise SystemExit(f"{kind}: no HF weights for our parameters {missing[:5]}")
        hf[kind].to(device)
    return hf, params


def our_row(kind: str, unfused: Graph, fused: Graph, p: dict, meta: dict, args, copy_bps: float | None,
            copy_src: str) -> tuple[dict, dict]:
    """Our side of every row of ``kind`` (fused: wall clock and timestamps; unfused: wall clock;
    the shapes; the bandwidth floor), and the inputs both sides run on."""
    seq = meta["seq"]
    inputs = model_inputs(kind, seq, meta["batch"], padded=False)
    weight_bytes = sum(v.nbytes for k, v in p.items() if k in unfused.parameters and not k.endswith("_cache"))
    f32_bytes = f32_weight_bytes(unfused)
    weights = meta["weights"] if kind != "minilm" or meta["weights"] == "f16" else "f32"
    if kind == "minilm" and weights == "f16":  # the f16 ruleset's weights, as the session stores them
        from eggfuse.lowering import lower

        weight_bytes = lower(fused).memory()["weights_bytes"]
    decode = kind == "smollm2_decode"
    row = {"model": kind, "seq": 1 if decode else seq, "context": seq if decode else None,
           "batch": meta["batch"] if kind == "minilm" else 1, "layers": meta["layers"], "calls": args.calls,
           "samples": args.repeats, "weights": weights,
           "weight_bytes": weight_bytes, "copy_gbs": copy_bps and copy_bps / 1e9,
           "copy_source": copy_src, "floor_fp32_ms": copy_bps and f32_bytes / copy_bps * 1e3,
           "floor_bf16_ms": copy_bps and f32_bytes / 2 / copy_bps * 1e3,
           "floor_ours_ms": copy_bps and weight_bytes / copy_bps * 1e3}
    ours = time_ours(fused, p, kind, inputs, seq, args.calls, args.repeats)
    unf = time_ours(unfused, p, kind, inputs, seq, args.calls, args.repeats)
    row["ours_ms"], row["ours_p90_ms"] = _ms(ours["wall"])
    row["ours_gpu_ms"], row["ours_gpu_p90_ms"] = _ms(ours["gpu"]) if ours["gpu"] else (None, None)
    row["ours_unfused_ms"], row["ours_unfused_dispatches"] = _ms(unf["wall"])[0], unf["dispatches"]
    row["ours_dispatches"], row["adapter"] = ours["dispatches"], ours["adapter"]
    row["ours_timing"] = "wall clock around N back-to-back Session.run(read=()), one wait"
    return row, inputs


def main() -> None:
    args = parse_args()
    if args.save_graphs:
        save_graphs(args.save_graphs, shapes_of(args)[0])
        return
    models, meta = select_graphs(args)
    peers = torch_peers.parse_peers(args.peers)
    torch, transformers = torch_peers.load_torch()
    if args.check and torch is None:
        raise SystemExit(f"--check needs torch and transformers ({transformers})")
    cuda = torch is not None and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    skip = None if cuda or (torch is not None and (args.cpu_peer or args.check)) else (
        transformers if torch is None else "skipped: no CUDA")
    if not peers and not args.check:  # our side alone: one row per model, with no peer
        skip = "none: --peers was empty"
    hf, params = hf_models(models, meta["layers"], torch, transformers, device, meta["weights"])
    if args.check:
        raise SystemExit(0 if check(models, hf, params, meta, peers, torch, device) else 1)

    copy_bps, copy_src = (None, "skipped: no torch") if torch is None else torch_peers.copy_bandwidth(torch, cuda)
    gbs = "-" if copy_bps is None else f"{copy_bps / 1e9:.0f}"
    print(f"shapes {meta}; {args.repeats} samples x {args.calls} back-to-back calls; copy bandwidth "
          f"{gbs} GB/s ({copy_src}); torch {torch and torch.__version__}, "
          f"transformers {getattr(transformers, '__version__', '-')}, peers on {device if not skip else '-'} "
          "(fp32: TF32 off); ms per call")
    print(f"{'model':<16}{'ours ms':>9}{'p90':>9}{'GPU ms':>9}  {'peer':<45}{'mode':<16}{'dtype':<6}"
          f"{'peer ms':>9}{'p90':>9}{'ratio':>8}{'floor32':>9}{'floor16':>9}")
    rows = []
    if args.merge and args.json.exists():
        rows = [r for r in json.loads(args.json.read_text()) if r["model"] not in models]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    for kind, (unfused, fused) in models.items():
        base, inputs = our_row(kind, unfused, fused, params[kind], meta, args, copy_bps, copy_src)
        if skip:
            rows.append({**base, "peer": skip, "peer_mode": "-", "peer_dtype": "-", "peer_ms": None,
                         "peer_p90_ms": None, "ratio": None})
            print_row(rows[-1])
        ours_out = None if skip else ours_output(fused, params[kind], kind, inputs).ravel()
        for mode, dtype in [] if skip else peers:
            rows.append(peer_row(torch, base, kind, hf[kind], mode, dtype, inputs, device, args.calls, args.repeats,
                                 ours_out))
            print_row(rows[-1])
            args.json.write_text(json.dumps(rows, indent=1))  # as it goes: a run cut short keeps its rows
    rows.sort(key=lambda r: MODELS.index(r["model"]))
    args.json.write_text(json.dumps(rows, indent=1))
    png = args.json.with_suffix(".png")
    print(f"wrote {args.json}" + (f" and {png}" if plot(rows, png) else " (no matplotlib: no plot)"))


def plot(rows: list[dict], path: Path) -> bool:
    """Bars of ms per call per model: ours (fused), then each peer row; the bandwidth floor as a tick."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    kinds = list(dict.fromkeys(r["model"] for r in rows))
    series = ["ours (fused, fp32)"] + list(dict.fromkeys(
        f"{r['peer_mode']} {r['peer_dtype']}" for r in rows if r["peer_ms"] is not None))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for j, kind in enumerate(kinds):
        mine = [r for r in rows if r["model"] == kind]
        values = {"ours (fused, fp32)": mine[0]["ours_ms"]}
        values.update({f"{r['peer_mode']} {r['peer_dtype']}": r["peer_ms"] for r in mine if r["peer_ms"] is not None})
        for i, name in enumerate(series):
            ax.bar(j + i * width, values.get(name, 0), width, color=f"C{i}", label=name if j == 0 else None)
        if mine[0].get("floor_fp32_ms"):
            ax.hlines(mine[0]["floor_fp32_ms"], j - width / 2, j + 0.8 - width / 2, colors="black", linestyles=":",
                      label="fp32 bandwidth floor" if j == 0 else None)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(kinds))], kinds)
    ax.set_yscale("log")
    ax.set_ylabel("ms per call (median)")
    ax.set_title(f"eggfuse vs transformers (peer: {rows[0].get('peer_device', rows[0]['peer'])}); "
                 f"ours on {rows[0]['adapter']}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


if __name__ == "__main__":
    main()
