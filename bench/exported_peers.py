"""An exported model against compiled torch: GPT-2 small (``--model gpt2_small``, the default) or
DeBERTa-v3-small (``--model deberta_v3_small``) as torch.onnx's classic (GPT-2) or dynamo (DeBERTa) exporter writes
it, imported by
``eggfuse.onnx`` (the rewrite engine rediscovering its attention, GELU and epilogues), against
transformers' ``GPT2Model`` or ``DebertaV2Model`` with the same weights, eager and
``torch.compile(mode="reduce-overhead")`` (CUDA graphs), fp32 (TF32 off) and bf16, on the same device.

Three steps, since the export needs torch (a Python 3.11 venv here), the optimisation egglog (the
eggfuse venv), and the timing a GPU machine without either of those problems::

    /tmp/V/bin/python scripts/export_torch_fixtures.py --real --only gpt2_small   # the ONNX file, names map
    .venv/bin/python bench/exported_peers.py save --graphs bench/graphs_exported   # import, optimise, pickle
    python3 bench/exported_peers.py time --graphs bench/graphs_exported --json FILE  # GPU machine

``save`` imports ``build/exported/MODEL.classic.onnx`` (DeBERTa's ``.dynamo.onnx``) at ``--batch`` x ``--seq``
tokens (default 8 x 128), optimises it and pickles the unfused and fused graphs with ``MODEL.names.json`` (which
``state_dict`` entry each initializer holds), the file without those initializers' values (a few
hundred KB) and DeBERTa's ``MODEL.config.json``. ``time`` builds ``GPT2Model(GPT2Config())``
or ``DebertaV2Model`` with random weights
(``torch_peers._redraw``: 0.02 N(0, 1) for all, GPT-2's LayerNorm weights ``ln_*`` too, whose names
hold no ``norm``), puts them into that file through the map and imports it again (:func:`peer_params`: what
the import computes from the weights at load time, such as GPT-2's position rows of ``arange(S)`` or DeBERTa's
position keys and queries, comes from the peer's weights too), and times both
sides as ``bench/models.py`` does (``--calls`` back-to-back calls per sample, ``--repeats`` samples,
median and p90 of the wall clock per call, ours also by GPU timestamps, the peer also by CUDA events;
outputs left on the device). Inputs: random token ids, the second sequence padded by 3 tokens, on the left
for GPT-2 and on the right for DeBERTa (``attention_mask`` 0 there); both sides' ``last_hidden_state`` are
compared at the kept rows (``rel_diff_vs_ours``: max |peer - ours| / max |ours|).

JSON: rows as ``bench/models.py``'s (``model`` ``gpt2_small_onnx`` or ``deberta_v3_small_onnx``, ``ours_ms``,
``ours_p90_ms``, ``ours_gpu_ms``, ``ours_dispatches``, ``ours_unfused_ms``, ``peer``, ``peer_mode``, ``peer_dtype``,
``peer_ms``, ``peer_p90_ms``, ``ratio``, ``rel_diff_vs_ours``, ...) with ``optimise_s`` and
``onnx_nodes``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import torch_peers  # noqa: E402

from models import _ms, time_plan  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXPORTED = ROOT / "build" / "exported"
PADDING = 3  # tokens of padding of the second sequence


@dataclasses.dataclass(frozen=True)
class Exported:
    """A model exported by scripts/export_torch_fixtures.py --real (``EXPORTED/{stem}.{exporter}.onnx`` with
    ``{stem}.names.json``): its rows' ``model`` (``{stem}_onnx``), the transformers class of its peer, its
    vocabulary (the inputs' token ids are drawn below it), the side its second sequence is padded on, and the
    exporter whose file ``save`` reads by default (DeBERTa's classic file holds its position keys and queries as
    constants computed from the weights, which other weights would not match)."""

    stem: str
    peer_class: str
    vocab: int
    padding_side: str
    exporter: str = "classic"

    @property
    def name(self) -> str:
        return f"{self.stem}_onnx"

    def peer(self, transformers, config: dict | None):
        """The peer with transformers' initial weights (``time`` draws them again): GPT-2 small (``GPT2Config()``)
        or DeBERTa-v3-small (``DebertaV2Config`` from the export's ``{stem}.config.json``, kept by ``save``)."""
        if self.peer_class == "GPT2Model":
            return transformers.GPT2Model(transformers.GPT2Config(use_cache=False))
        if config is None:
            raise SystemExit(f"{self.stem}: save found no {self.stem}.config.json beside the export: run "
                             f"scripts/export_torch_fixtures.py --real --only {self.stem} again")
        return transformers.DebertaV2Model(transformers.DebertaV2Config(**config))


MODELS = {"gpt2_small": Exported("gpt2_small", "GPT2Model", 50257, "left"),
          "deberta_v3_small": Exported("deberta_v3_small", "DebertaV2Model", 128100, "right", "dynamo")}


def save(folder: Path, model: Exported, onnx_path: Path, batch: int, seq: int) -> None:
    import onnx

    from eggfuse.onnx import load
    from eggfuse.rewrites import optimize

    names = json.loads(onnx_path.with_name(onnx_path.name.split(".")[0] + ".names.json").read_text())
    proto = onnx.load(str(onnx_path))  # once: 500 MB of weights inside the file (load does not modify it)
    unfused, params = load(proto, shapes={"input_ids": [batch, seq], "attention_mask": [batch, seq]})
    t = time.perf_counter()
    fused, rep = optimize(unfused)
    seconds = time.perf_counter() - t
    # the file without the mapped weights' values (the skeleton): ``time`` puts the peer's in and imports it again,
    # so that what the import computed from the weights at load time (GPT-2's position rows of arange(S),
    # DeBERTa's position keys and queries) is computed from the peer's too
    kept = {i.name for i in proto.graph.initializer}
    if set(names) - kept:
        raise SystemExit(f"{onnx_path.name} has no initializers {sorted(set(names) - kept)[:5]}: export it again")
    for init in proto.graph.initializer:
        if init.name in names:
            init.CopyFrom(onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims))
    # the exporter's small constants, for time --variant (random weights, no peer)
    constants = {k: v for k, v in params.items() if k not in names and v.size <= 1 << 16}
    nodes = len(proto.graph.node)
    folder.mkdir(parents=True, exist_ok=True)
    config = onnx_path.with_name(model.stem + ".config.json")
    (folder / f"{model.name}.pkl").write_bytes(pickle.dumps(
        {"unfused": unfused, "fused": fused, "names": names, "skeleton": proto.SerializeToString(),
         "constants": constants, "batch": batch, "seq": seq, "optimise_s": seconds,
         "onnx_nodes": nodes, "file": onnx_path.name,
         "config": json.loads(config.read_text()) if config.exists() else None}))
    print(f"{onnx_path.name}: {nodes} ONNX nodes, dispatches {rep.dispatches_before} -> {rep.dispatches_after}, "
          f"optimised in {seconds:.2f} s; wrote {folder / (model.name + '.pkl')}")


def inputs(model: Exported, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Random token ids below the model's vocabulary, [batch, seq] int64, and an ``attention_mask`` of ones but for
    PADDING tokens of the second sequence (the first where there is one) on the model's padding side."""
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    mask[1 % batch, slice(None, PADDING) if model.padding_side == "left" else slice(seq - PADDING, None)] = 0
    return {"input_ids": rng.integers(0, model.vocab, (batch, seq)).astype(np.int64), "attention_mask": mask}


def time_variants(folder: Path, model: Exported, out: Path, variants: list[str], calls: int, repeats: int,
                  rounds: int) -> None:
    """Our plan lowered as it is (``tree``) and with each ``--variant NAME:MODULE.NAME=VALUE[,...]``'s settings
    (``plan_ab.parse_setting``), or each ``--variant NAME:@FOLDER``'s graph (another save's fused graph, such as one
    optimised before a rule), timed alternately (``models.time_alternately``) on random weights; no peer."""
    from plan_ab import lowered, parse_setting

    from models import random_values, time_alternately

    saved = pickle.loads((folder / f"{model.name}.pkl").read_bytes())
    plans = {"tree": lowered(saved["fused"], [])}
    for spec in variants:
        name, sep, settings = spec.partition(":")
        if not sep or not name or name in plans:
            raise SystemExit(f"--variant {spec!r}: write NAME:eggfuse.MODULE.NAME=VALUE[,...] with a new NAME")
        if settings.startswith("@"):  # another save's fused graph, lowered as it is
            other = pickle.loads((Path(settings[1:]) / f"{model.name}.pkl").read_bytes())
            if set(other["fused"].parameters) != set(saved["fused"].parameters):
                raise SystemExit(f"--variant {spec!r}: that graph's parameters are not this one's")
            plans[name] = lowered(other["fused"], [])
            continue
        # settings split at the commas before "eggfuse.": a value may be a tuple
        plans[name] = lowered(saved["fused"], [parse_setting(s) for s in re.split(r",(?=eggfuse\.)", settings)])
    _, params = random_values(saved["fused"])
    params.update(saved["constants"])  # the exporter's constants as they are; weights (and rows of them) random
    x = inputs(model, saved["batch"], saved["seq"])
    feeds = [{k: v.astype(np.int32) for k, v in x.items()}] * calls
    rows = time_alternately(plans, params, feeds, calls, repeats, rounds)
    out.write_text(json.dumps([{"model": model.name, **r} for r in rows], indent=1))
    print(f"wrote {out}")


def peer_params(saved: dict, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our parameters for the peer's ``state`` (``state_dict`` key -> array): save's skeleton with the mapped
    weights' values from ``state`` (transposed where the names map says so), imported again by ``eggfuse.onnx.load``
    at save's shapes. Exits where a weight's shape differs or the import's parameters are not the saved graph's."""
    import onnx

    from eggfuse.onnx import load

    if "skeleton" not in saved:
        raise SystemExit("this pickle is from an older save, without the file's skeleton: run save again")
    proto = onnx.ModelProto.FromString(saved["skeleton"])
    for init in proto.graph.initializer:
        m = saved["names"].get(init.name)
        if m is None:
            continue
        value = state[m["key"]].T if m["transpose"] else state[m["key"]]
        if list(value.shape) != list(init.dims):
            raise SystemExit(f"{init.name}: the peer's {m['key']} is {list(value.shape)}, the file's {list(init.dims)}")
        init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(value, np.float32), init.name))
    shape = [saved["batch"], saved["seq"]]
    graph, params = load(proto, shapes={"input_ids": shape, "attention_mask": shape})
    if set(graph.parameters) != set(saved["fused"].parameters):
        raise SystemExit("the import of the peer's weights gave other parameters than save's: save again")
    return params


def time_all(folder: Path, exported: Exported, out: Path, peers: list, calls: int, repeats: int,
             profile: bool = False) -> None:
    from eggfuse.pipeline import lower_for

    saved = pickle.loads((folder / f"{exported.name}.pkl").read_bytes())
    torch, transformers = torch_peers.load_torch()
    if torch is None:
        raise SystemExit(f"time needs torch and transformers ({transformers})")
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch_peers.set_fp32_precision(torch)
    model = exported.peer(transformers, saved.get("config")).eval()
    torch_peers._redraw(torch, model, 0)
    params = peer_params(saved, {k: v.detach().numpy() for k, v in model.state_dict().items()})
    model.to(device)
    x = inputs(exported, saved["batch"], saved["seq"])
    feeds = [{k: v.astype(np.int32) for k, v in x.items()}] * calls
    kept = x["attention_mask"].astype(bool)
    copy_bps, copy_src = torch_peers.copy_bandwidth(torch, cuda)
    weight_bytes = sum(v.nbytes for k, v in params.items() if k in saved["names"])  # the mapped weights
    plan = lower_for(saved["fused"])
    ours = time_plan(plan, params, feeds, calls, repeats)
    unfused = time_plan(lower_for(saved["unfused"]), params, feeds, calls, repeats)
    ours_out = ours["output"][kept]
    base = {"model": exported.name, "file": saved["file"], "batch": saved["batch"], "seq": saved["seq"], "calls": calls,
            "samples": repeats, "weights": "f32", "weight_bytes": weight_bytes, "copy_gbs": copy_bps / 1e9,
            "copy_source": copy_src, "floor_fp32_ms": weight_bytes / copy_bps * 1e3,
            "floor_bf16_ms": weight_bytes / 2 / copy_bps * 1e3, "onnx_nodes": saved["onnx_nodes"],
            "optimise_s": saved["optimise_s"], "ours_dispatches": ours["dispatches"], "adapter": ours["adapter"],
            "ours_unfused_dispatches": unfused["dispatches"], "ours_unfused_ms": _ms(unfused["wall"])[0],
            "ours_timing": "wall clock around N back-to-back Session.run(read=()), one wait"}
    base["ours_ms"], base["ours_p90_ms"] = _ms(ours["wall"])
    base["ours_gpu_ms"], base["ours_gpu_p90_ms"] = _ms(ours["gpu"]) if ours["gpu"] else (None, None)
    t = {k: torch.from_numpy(v).to(device) for k, v in x.items()}
    print(f"{saved['file']} at {saved['batch']} x {saved['seq']} tokens; {repeats} samples x {calls} calls; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; ms per call")
    gpu = base["ours_gpu_ms"] or float("nan")
    print(f"ours: {base['ours_ms']:.3f} (p90 {base['ours_p90_ms']:.3f}, GPU {gpu:.3f}), {ours['dispatches']} "
          f"dispatches; unfused {base['ours_unfused_ms']:.3f} ({unfused['dispatches']})")
    if profile:
        from plan_ab import kernel_times

        base["ours_profile"] = kernel_times(plan, params, feeds[0])
        print(f"ours per kernel ({sum(r['us'] for r in base['ours_profile']):.1f} us summed):")
        for r in base["ours_profile"][:14]:
            print(f"  {r['kernel'][:60]:<62}{r['calls']:>4}{r['us']:>10.1f} us")
    rows = []
    for mode, dtype in peers:
        from torch._dynamo.utils import counters

        m = model if dtype == "fp32" else __import__("copy").deepcopy(model).to(torch.bfloat16)

        def forward(ids, mask, m=m):
            return m(input_ids=ids, attention_mask=mask).last_hidden_state

        fn = forward if mode == "eager" else torch.compile(forward, mode=mode, fullgraph=True, dynamic=False)
        pr = torch_peers.Peer(f"transformers {exported.peer_class}", mode, dtype, lambda fn=fn: fn(t["input_ids"],
                                                                                    t["attention_mask"]), None,
                              model.config._attn_implementation)
        row = {**base, "peer": pr.name, "peer_mode": mode, "peer_dtype": dtype, "peer_tf32": False,
               "peer_attn": pr.attn, "torch": torch.__version__, "transformers": transformers.__version__,
               "peer_device": torch.cuda.get_device_name() if cuda else "cpu", "peer_ms": None, "ratio": None}
        start, skips = time.perf_counter(), counters["inductor"]["cudagraph_skips"]
        try:
            tp = torch_peers.time_peer(torch, pr, calls, repeats, cuda)
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        else:
            row["peer_ms"], row["peer_p90_ms"] = _ms(tp["wall"])
            row["peer_event_ms"] = _ms(tp["events"])[0] if tp["events"] else None
            row["ratio"] = row["ours_ms"] / row["peer_ms"]
            with torch.no_grad():
                if mode in torch_peers.CUDAGRAPH_MODES:
                    torch.compiler.cudagraph_mark_step_begin()
                peer_out = pr.call().float().cpu().numpy()[kept]
            row["rel_diff_vs_ours"] = float(np.abs(peer_out - ours_out).max() / np.abs(ours_out).max())
            row["peer_setup_s"] = time.perf_counter() - start  # compilation and warm-up, not the profile below
            if profile and cuda:
                row["peer_profile"] = torch_peers.peer_kernel_times(torch, pr, calls)
                print(f"peer {mode} {dtype} per kernel ({sum(r['us'] for r in row['peer_profile']):.1f} us):")
                for r in row["peer_profile"][:12]:
                    print(f"  {r['kernel'][:60]:<62}{r['calls']:>5.1f}{r['us']:>10.1f} us")
        row.setdefault("peer_setup_s", time.perf_counter() - start)
        row["peer_cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
        torch._dynamo.reset()
        rows.append(row)
        print(f"peer {mode} {dtype}: " + (row.get("error") or
              f"{row['peer_ms']:.3f} (p90 {row['peer_p90_ms']:.3f}), ratio {row['ratio']:.3f}, "
              f"rel diff {row['rel_diff_vs_ours']:.2e}"), flush=True)
        out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("save", "time"))
    ap.add_argument("--graphs", type=Path, required=True, help="the folder of save's pickle")
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2_small", help="the exported model")
    ap.add_argument("--onnx", type=Path, help=f"save: the exported file (default {EXPORTED}/MODEL.classic.onnx, "
                    "DeBERTa's MODEL.dynamo.onnx)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--peers", default=torch_peers.DEFAULT_PEERS)
    ap.add_argument("--variant", action="append", default=[], help="time: NAME:eggfuse.MODULE.NAME=VALUE[,...], "
                    "our plan lowered with those settings against it as it is, alternately (no peer); "
                    "NAME:@FOLDER, the fused graph another save left in FOLDER")
    ap.add_argument("--rounds", type=int, default=3, help="time --variant: rounds of the alternation")
    ap.add_argument("--profile", action="store_true", help="time: GPU time per kernel of both sides (ours: "
                    "timestamps, each dispatch in a pass of its own; the peer: torch.profiler), in the rows")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "exported_peers.json")
    args = ap.parse_args()
    model = MODELS[args.model]
    if args.command == "save":
        save(args.graphs, model, args.onnx or EXPORTED / f"{model.stem}.{model.exporter}.onnx", args.batch, args.seq)
    elif args.variant:
        if args.profile:
            raise SystemExit("--profile profiles the peers' run; time --variant profiles nothing: give one of them")
        time_variants(args.graphs, model, args.json, args.variant, args.calls, args.repeats, args.rounds)
    else:
        time_all(args.graphs, model, args.json, torch_peers.parse_peers(args.peers), args.calls, args.repeats,
                 args.profile)


if __name__ == "__main__":
    main()
