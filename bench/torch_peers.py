"""The peers of ``bench/models.py``: Hugging Face transformers models holding the same weights as
ours, run eager or through ``torch.compile`` (``reduce-overhead``: CUDA graphs), in fp32 with
TF32 off or in bf16, and timed like our side.

- ``minilm``: ``BertModel`` (all-MiniLM-L6-v2's config, no pooler) + mean pooling over the
  attention mask + L2 normalisation, as sentence-transformers runs the model.
- ``smollm2_prefill``: ``LlamaForCausalLM`` (SmolLM2-135M's config) on ``seq`` tokens, no
  cache, logits of every position.
- ``smollm2_decode``: one ``LlamaForCausalLM`` step of one token over a ``StaticCache`` of
  ``max_seq`` positions that a prompt of ``seq`` tokens filled (eager). This is the
  static-cache recipe of transformers' "Optimizing inference" guide with transformers 5's
  cache API: the cache keeps its own position (a tensor with a static address, advanced in
  place), so a compiled step needs no ``cache_position``; the compiled function is the
  model's forward (``fullgraph=True``).

Weights: the HF models are built from configs (no download) and every parameter redrawn from
one seed (N(0, 0.02); norm weights 1 + N(0, 0.1); biases N(0, 0.02), so a swapped norm or
bias shows in ``--check``), then copied into our parameter names. SmolLM2's graph uses
``rope_pairing="half"`` (``LlamaConfig.smollm2_135m()`` with ``build_llama_graph``'s
default), HF's own Q/K layout, so q/k weights are copied unpermuted.
"""

from __future__ import annotations

import copy
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_timing  # noqa: E402

#: Peers run by default: MODE:DTYPE (MODE: eager or a torch.compile mode).
DEFAULT_PEERS = "eager:fp32,reduce-overhead:fp32,reduce-overhead:bf16"
#: torch.compile modes that capture CUDA graphs (each call then starts a new cudagraph step).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
MODES = ("eager", "default", *CUDAGRAPH_MODES)
DTYPES = ("fp32", "bf16")


def parse_peers(text: str) -> list[tuple[str, str]]:
    """``"eager:fp32,reduce-overhead:bf16"`` -> [(mode, dtype), ...]; SystemExit for a bad item."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        mode, _, dtype = item.partition(":")
        if mode not in MODES or dtype not in DTYPES:
            raise SystemExit(f"--peers: {item!r} is not MODE:DTYPE with MODE in {MODES} and DTYPE in {DTYPES}")
        out.append((mode, dtype))
    return out


def load_torch():
    """(torch, transformers), or (None, reason) when either is not importable."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return None, f"skipped: {e.name} not importable"
    return torch, transformers


def set_fp32_precision(torch) -> None:
    """True fp32 matmuls and convolutions: TF32 off (cuBLAS, cuDNN, inductor's templates)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _redraw(torch, model, seed: int) -> None:
    # Every parameter from one seeded generator (see the module docstring).
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            draw = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            norm = p.dim() == 1 and "norm" in name.lower()
            p.copy_(1.0 + 0.1 * draw if norm and name.endswith("weight") else 0.02 * draw)


def build_llama(torch, transformers, layers: int, seed: int = 0):
    """SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M config.json) with ``layers``
    layers, fp32, random weights, on the CPU, in eval mode."""
    cfg = transformers.LlamaConfig(
        hidden_size=576, num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=8192, attention_bias=False, mlp_bias=False, hidden_act="silu")
    model = transformers.LlamaForCausalLM(cfg).eval()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise SystemExit("transformers did not tie SmolLM2's LM head to its embeddings: the weight mapping needs it")
    _redraw(torch, model, seed)
    return model


def build_bert(torch, transformers, layers: int, seed: int = 0):
    """all-MiniLM-L6-v2's BERT (its config.json) with ``layers`` layers and no pooler, fp32,
    random weights, on the CPU, in eval mode."""
    cfg = transformers.BertConfig(
        hidden_size=384, num_hidden_layers=layers, num_attention_heads=12, intermediate_size=1536, vocab_size=30522,
        max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    _redraw(torch, model, seed + 1)
    return model


#: HF LlamaForCausalLM names -> ours (models/llama.py: GGUF names), per layer and global.
LLAMA_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight"}


def _our_llama_name(name: str) -> str:
    # Our SmolLM2 parameter name of an HF LlamaForCausalLM parameter.
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name.startswith("model.layers."):
        i, rest = name.removeprefix("model.layers.").split(".", 1)
        return f"blk.{i}.{LLAMA_LAYER_NAMES[rest]}"
    raise SystemExit(f"HF parameter {name!r} has no counterpart in our SmolLM2 graph")


def llama_params(model) -> dict[str, np.ndarray]:
    """Our SmolLM2 parameters (``blk.{i}.attn_q.weight`` ...) from the HF model's: both keep
    linear weights [out, in], and q/k rows in HF order (``rope_pairing="half"``)."""
    # the tied lm_head.weight is listed once, as the embeddings
    return {_our_llama_name(name): p.detach().cpu().numpy().astype(np.float32)
            for name, p in model.named_parameters()}


def set_llama_params(torch, model, values: dict[str, np.ndarray]) -> None:
    """Write our SmolLM2 parameters ``values`` (named as :func:`llama_params` names them) into
    the HF model's, in place: how the peer gets the dequantised values of quantised weights."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(values[_our_llama_name(name)], dtype=np.float32)))


def bert_params(model) -> dict[str, np.ndarray]:
    """Our MiniLM parameters from the HF ``BertModel``'s: the same names (models/minilm.py
    keeps the safetensors names), linear weights [out, in]."""
    return {name: p.detach().cpu().numpy().astype(np.float32) for name, p in model.named_parameters()}


def _cache_kwarg(model) -> str:
    # transformers <= 5.2x names the cache argument past_key_values; later versions call it cache.
    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params else "cache"


class Peer:
    """One model on one device in one (mode, dtype): ``prepare()`` before each sample (decode:
    reset the cache and prefill the prompt, eager), ``call()`` one forward whose output stays on
    the device. Build with :func:`peer`."""

    def __init__(self, name: str, mode: str, dtype: str, call: Callable, prepare: Callable | None,
                 attn: str) -> None:
        self.name, self.mode, self.dtype, self.call, self.prepare, self.attn = name, mode, dtype, call, prepare, attn


def peer(torch, kind: str, model, mode: str, dtype: str, inputs: dict, device: str, max_seq: int) -> Peer:
    """The peer of our ``kind`` (minilm, smollm2_prefill, smollm2_decode) for ``model`` (the fp32
    HF model on ``device``; bf16 runs a copy). ``inputs``: numpy feeds, see :func:`torch_inputs`."""
    if dtype == "bf16":
        model = copy.deepcopy(model).to(torch.bfloat16)
    t = torch_inputs(torch, kind, inputs, device)
    attn = model.config._attn_implementation
    compiled = mode != "eager"

    def compile_(fn):
        return torch.compile(fn, mode=None if mode == "default" else mode, fullgraph=True, dynamic=False)

    if kind == "minilm":
        def pooled(ids, types, mask):
            h = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers' Pooling (mean)
            return torch.nn.functional.normalize(e, p=2, dim=1)  # sentence-transformers' Normalize

        fn = compile_(pooled) if compiled else pooled
        return Peer("transformers BertModel + mean pooling + L2", mode, dtype,
                    lambda: fn(t["ids"], t["types"], t["mask"]), None, attn)
    forward = compile_(model.forward) if compiled else model.forward
    if kind == "smollm2_prefill":
        return Peer("transformers LlamaForCausalLM", mode, dtype,
                    lambda: forward(input_ids=t["tokens"], use_cache=False).logits, None, attn)
    import transformers

    cache = transformers.StaticCache(config=model.config, max_cache_len=max_seq)
    key = _cache_kwarg(model)

    def prepare():
        cache.reset()
        model(input_ids=t["prompt"], use_cache=True, **{key: cache})  # eager prefill, as the guide does

    return Peer("transformers LlamaForCausalLM + StaticCache", mode, dtype,
                lambda: forward(input_ids=t["token"], use_cache=True, **{key: cache}).logits, prepare, attn)


def torch_inputs(torch, kind: str, inputs: dict, device: str) -> dict:
    """Device tensors of the numpy feeds: minilm ``ids``/``types``/``mask`` [B, S]; prefill
    ``tokens`` [1, S]; decode ``prompt`` [1, P] and ``token`` [1, 1]."""
    def long(a):
        return torch.from_numpy(np.asarray(a, dtype=np.int64)).to(device)

    if kind == "minilm":
        return {"ids": long(inputs["ids"]), "types": long(inputs["types"]),
                "mask": torch.from_numpy(np.asarray(inputs["mask"], np.float32)).to(device)}
    if kind == "smollm2_prefill":
        return {"tokens": long(inputs["tokens"])[None]}
    return {"prompt": long(inputs["prompt"])[None], "token": long(inputs["token"]).reshape(1, 1)}


def time_peer(torch, p: Peer, calls: int, samples: int, cuda: bool) -> dict:
    """Seconds per call, one value per sample, of ``calls`` back-to-back ``p.call()``: wall clock
    with one synchronisation at the end (``wall``) and, on CUDA, events around them (``events``).
    Warm-up calls first (a CUDA-graph mode compiles, records, then replays), then calls for
    ``gpu_timing.WARMUP_S`` seconds, as on our side (the GPU's clock ramps up after idling)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step_begin = torch.compiler.cudagraph_mark_step_begin if p.mode in CUDAGRAPH_MODES else None

    def one():
        if step_begin is not None:  # the previous call's outputs are dead: its graph may be replayed
            step_begin()
        p.call()

    wall, events = [], []
    with torch.no_grad():
        if p.prepare is not None:
            p.prepare()
        for _ in range(2 if p.mode == "eager" else 5):
            one()
        sync()
        start = time.perf_counter()
        while time.perf_counter() - start < gpu_timing.WARMUP_S:
            if p.prepare is not None:  # as a sample does (decode: from position seq again)
                p.prepare()
            for _ in range(calls):
                one()
            sync()
        for _ in range(samples):
            if p.prepare is not None:
                p.prepare()
            sync()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            for _ in range(calls):
                one()
            if cuda:
                end.record()
            sync()
            wall.append((time.perf_counter() - t) / calls)
            if cuda:
                events.append(start.elapsed_time(end) * 1e-3 / calls)
    return {"wall": wall, "events": events or None}


def peer_kernel_times(torch, p: Peer, calls: int) -> list[dict]:
    """The GPU kernels of ``calls`` calls of ``p`` (compiled and recorded before: :func:`time_peer`) under
    ``torch.profiler`` with CUDA activity, per call: rows ``kernel``, ``calls``, ``us``, the largest first."""
    from torch.profiler import ProfilerActivity, profile

    step_begin = torch.compiler.cudagraph_mark_step_begin if p.mode in CUDAGRAPH_MODES else None
    with torch.no_grad():
        if p.prepare is not None:
            p.prepare()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                if step_begin is not None:
                    step_begin()
                p.call()
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = us if us is not None else e.self_cuda_time_total
        if us > 0 and e.key not in ("ProfilerStep*",):
            rows.append({"kernel": e.key, "calls": e.count / calls, "us": us / calls})
    return sorted(rows, key=lambda r: -r["us"])


def peer_output(torch, p: Peer, steps: int) -> np.ndarray:
    """The output of ``p`` as float64 numpy: minilm embeddings [B, H]; prefill logits [S, V];
    decode logits [V] of the last of ``steps`` calls after ``prepare`` (positions P .. P+steps-1).
    Two rounds: the first compiles and records (CUDA-graph modes), the second replays."""
    step_begin = torch.compiler.cudagraph_mark_step_begin if p.mode in CUDAGRAPH_MODES else None
    with torch.no_grad():
        for _ in range(1 if p.mode == "eager" else 2):
            if p.prepare is not None:
                p.prepare()
            for _ in range(steps):
                if step_begin is not None:
                    step_begin()
                out = p.call()
        out = out.detach().cpu().double().numpy()
    return out.reshape(-1, out.shape[-1]).squeeze()


def copy_bandwidth(torch, cuda: bool, nbytes: int = 1 << 28, repeats: int = 20) -> tuple[float, str]:
    """Bytes per second moved (read + write) by a device-to-device copy of ``nbytes`` (median of
    ``repeats`` copies, CUDA events), and what was measured; without CUDA a host copy (numpy)."""
    if not cuda:
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            np.copyto(b, a)
            times.append(time.perf_counter() - t)
        return 2 * nbytes / float(np.median(times)), "host memcpy (numpy), no CUDA"
    a = torch.ones(nbytes // 4, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / float(np.median(times)), f"torch device-to-device copy on {torch.cuda.get_device_name()}"
