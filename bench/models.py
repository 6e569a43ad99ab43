"""Model latency: our compiled MiniLM and SmolLM2 (fused and unfused) against torch eager, same device.

Both sides run the same architecture with the same weights: random weights of the real
shapes, drawn from one seed (latency does not depend on the values; the real weights do
not fit through the device tool's 64 MiB transfer). Torch runs an eager fp32
implementation written here from the same formulas (TF32 off), on CUDA when available.
Our side runs plans compiled from the graphs of ``eggfuse.models``; ``--save-graphs``
optimises them here (egglog) and pickles them, so a machine without egglog can run them.

    .venv/bin/python bench/models.py --save-graphs bench/graphs     # optimise once (CPU)
    python3 bench/models.py --graphs bench/graphs                    # time on the device

Prints milliseconds per forward (median of ``--repeats``) and the ratio ours / torch.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import statistics
import time
from pathlib import Path

import numpy as np

from eggfuse.ir import DType, Graph
from eggfuse.models.llama import LlamaConfig, build_llama_cache_graph, build_llama_graph

MINILM = dict(hidden=384, layers=6, heads=12, inter=1536, vocab=30522, max_pos=512, eps=1e-12)


def minilm_graph(batch: int, seq: int) -> Graph:
    from eggfuse.models.minilm import BertConfig, build_bert_graph

    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                     vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12)
    return build_bert_graph(cfg, batch, seq)


def random_values(graph: Graph, seed: int = 0) -> tuple[dict, dict]:
    """Parameters N(0, 0.02) (norm weights 1), inputs valid for their tables."""
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
        elif name == "pool":
            b, rows = shape
            pool = np.zeros(shape, np.float32)
            for i in range(b):
                pool[i, i * (rows // b):(i + 1) * (rows // b)] = b / rows
            inputs[name] = pool
        else:
            inputs[name] = rng.standard_normal(shape).astype(np.float32)
    return inputs, params


#: Positions held by the decode benchmark's KV cache; decode starts after a prompt of ``--seq``.
DECODE_MAX_SEQ = 512


def graphs(seq: int, batch: int) -> dict[str, Graph]:
    return {
        "minilm": minilm_graph(batch, seq),
        "smollm2_prefill": build_llama_graph(LlamaConfig.smollm2_135m(), seq),
        "smollm2_decode": build_llama_cache_graph(LlamaConfig.smollm2_135m(), 1, DECODE_MAX_SEQ),
    }


def save_graphs(out: Path, seq: int, batch: int) -> None:
    from eggfuse.rewrites import optimize

    out.mkdir(parents=True, exist_ok=True)
    for name, g in graphs(seq, batch).items():
        fused, rep = optimize(g)
        (out / f"{name}.pkl").write_bytes(pickle.dumps({"unfused": g, "fused": fused}))
        print(f"{name}: dispatches {rep.dispatches_before} -> {rep.dispatches_after}")


def time_ours(graph: Graph, inputs: dict, params: dict, repeats: int, decode_from: int | None = None
              ) -> tuple[float, int, str]:
    """Median ms per run: inputs written, the plan recorded and run, the GPU waited for; the
    output stays on the device, as torch's does (``Session.run(read=())`` + ``wait``). For a
    decode graph (``decode_from`` = prompt length) one run is one step at the next position."""
    from eggfuse.runtime import Session

    s = Session(graph, {k: v for k, v in params.items() if k in graph.parameters})
    s.run(inputs)
    times = []
    for r in range(repeats):
        if decode_from is not None:
            inputs = {**inputs, "pos": np.array([decode_from + r], np.uint32)}
        t = time.perf_counter()
        s.run(inputs, read=())
        s.wait()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, len(s.plan.dispatches), s.adapter


# --- torch eager references (same formulas as eggfuse.models) -------------------------------

def torch_minilm(torch, p, inputs, batch, seq, dev):
    t = {k: torch.from_numpy(v).to(dev) for k, v in p.items()}
    ids = torch.from_numpy(inputs["input_ids"].astype(np.int64)).to(dev)
    pos = torch.from_numpy(inputs["position_ids"].astype(np.int64)).to(dev)
    tt = torch.from_numpy(inputs["token_type_ids"].astype(np.int64)).to(dev)
    pool = torch.from_numpy(inputs["pool"]).to(dev)
    F = torch.nn.functional
    H, nh = 384, 12

    def run():
        x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][pos] \
            + t["embeddings.token_type_embeddings.weight"][tt]
        x = F.layer_norm(x, (H,), t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], 1e-12)
        for i in range(6):
            pre = f"encoder.layer.{i}."

            def lin(h, n, pre=pre):
                return F.linear(h, t[pre + n + ".weight"], t[pre + n + ".bias"])

            q, k, v = (lin(x, f"attention.self.{n}").view(batch, seq, nh, 32).transpose(1, 2)
                       for n in ("query", "key", "value"))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(32), -1) @ v
            a = a.transpose(1, 2).reshape(batch * seq, H)
            x = F.layer_norm(lin(a, "attention.output.dense") + x, (H,), t[pre + "attention.output.LayerNorm.weight"],
                             t[pre + "attention.output.LayerNorm.bias"], 1e-12)
            h = F.gelu(lin(x, "intermediate.dense"))
            x = F.layer_norm(lin(h, "output.dense") + x, (H,), t[pre + "output.LayerNorm.weight"],
                             t[pre + "output.LayerNorm.bias"], 1e-12)
        e = pool @ x
        return e / e.norm(dim=-1, keepdim=True)

    return run


def torch_llama(torch, p, inputs, seq, dev, cfg: LlamaConfig):
    t = {k: torch.from_numpy(v).to(dev) for k, v in p.items()}
    ids = torch.from_numpy(inputs["tokens"].astype(np.int64)).to(dev)
    hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    ang = torch.arange(seq, device=dev).float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    mask = torch.full((seq, seq), float("-inf"), device=dev).triu(1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def run():
        x = t["token_embd.weight"][ids]
        for i in range(cfg.num_layers):
            b = f"blk.{i}."
            h = rms(x, t[b + "attn_norm.weight"])
            q = rope((h @ t[b + "attn_q.weight"].T).view(seq, nh, hd).transpose(0, 1))
            k = rope((h @ t[b + "attn_k.weight"].T).view(seq, nkv, hd).transpose(0, 1))
            v = (h @ t[b + "attn_v.weight"].T).view(seq, nkv, hd).transpose(0, 1)
            k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1) @ v
            x = x + a.transpose(0, 1).reshape(seq, nh * hd) @ t[b + "attn_output.weight"].T
            h = rms(x, t[b + "ffn_norm.weight"])
            g = h @ t[b + "ffn_gate.weight"].T
            x = x + (torch.nn.functional.silu(g) * (h @ t[b + "ffn_up.weight"].T)) @ t[b + "ffn_down.weight"].T
        return rms(x, t["output_norm.weight"]) @ t["token_embd.weight"].T

    return run


def torch_llama_decode(torch, p, prompt: int, dev, cfg: LlamaConfig):
    """One eager decode step per call with a KV cache (as HF's generate with use_cache)."""
    t = {k: torch.from_numpy(v).to(dev) for k, v in p.items() if "cache" not in k}
    hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    caches = [[torch.randn(nkv, prompt, hd, device=dev), torch.randn(nkv, prompt, hd, device=dev)]
              for _ in range(cfg.num_layers)]
    state = {"pos": prompt, "token": torch.tensor([1], device=dev)}

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x, pos):
        ang = pos * inv
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def run():
        pos = state["pos"]
        x = t["token_embd.weight"][state["token"]]
        for i in range(cfg.num_layers):
            b = f"blk.{i}."
            h = rms(x, t[b + "attn_norm.weight"])
            q = rope((h @ t[b + "attn_q.weight"].T).view(nh, 1, hd), pos)
            k = rope((h @ t[b + "attn_k.weight"].T).view(nkv, 1, hd), pos)
            v = (h @ t[b + "attn_v.weight"].T).view(nkv, 1, hd)
            caches[i][0] = torch.cat([caches[i][0], k], 1)
            caches[i][1] = torch.cat([caches[i][1], v], 1)
            kk = caches[i][0].repeat_interleave(nh // nkv, 0)
            vv = caches[i][1].repeat_interleave(nh // nkv, 0)
            a = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(hd), -1) @ vv
            x = x + a.reshape(1, nh * hd) @ t[b + "attn_output.weight"].T
            h = rms(x, t[b + "ffn_norm.weight"])
            x = x + (torch.nn.functional.silu(h @ t[b + "ffn_gate.weight"].T) * (h @ t[b + "ffn_up.weight"].T)) \
                @ t[b + "ffn_down.weight"].T
        logits = rms(x, t["output_norm.weight"]) @ t["token_embd.weight"].T
        state["token"] = logits.argmax(-1)
        state["pos"] = pos + 1
        return logits

    return run


def time_torch(torch, fn, repeats: int, cuda: bool) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="MiniLM sentences per batch")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--save-graphs", type=Path)
    ap.add_argument("--graphs", type=Path)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "models.json")
    args = ap.parse_args()
    if args.save_graphs:
        save_graphs(args.save_graphs, args.seq, args.batch)
        return
    try:
        import torch
    except ImportError:
        torch = None
    cuda = torch is not None and torch.cuda.is_available()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda" if cuda else "cpu"
    rows = []
    for name, g in graphs(args.seq, args.batch).items():
        if args.graphs:
            saved = pickle.loads((args.graphs / f"{name}.pkl").read_bytes())
            unfused, fused = saved["unfused"], saved["fused"]
        else:
            from eggfuse.rewrites import optimize

            unfused, (fused, _) = g, optimize(g)
        inputs, params = random_values(unfused)
        decode = name == "smollm2_decode"
        if decode:
            inputs = {"tokens": np.array([1], np.uint32), "pos": np.array([args.seq], np.uint32)}
        row = {"model": name, "seq": 1 if decode else args.seq, "context": args.seq if decode else None}
        for kind, graph in (("unfused", unfused), ("fused", fused)):
            ms, dispatches, adapter = time_ours(graph, inputs, params, args.repeats, args.seq if decode else None)
            row[f"{kind}_ms"], row[f"{kind}_dispatches"], row["adapter"] = ms, dispatches, adapter
        if torch is not None:
            cfg = LlamaConfig.smollm2_135m()
            fn = (torch_minilm(torch, params, inputs, args.batch, args.seq, dev) if name == "minilm"
                  else torch_llama_decode(torch, params, args.seq, dev, cfg) if decode
                  else torch_llama(torch, params, inputs, args.seq, dev, cfg))
            row["torch_ms"], row["torch_device"] = time_torch(torch, fn, args.repeats, cuda), dev
        rows.append(row)
        ratio = f", ours/torch {row['fused_ms'] / row['torch_ms']:.2f}x" if "torch_ms" in row else ""
        what = f"one token after {args.seq}" if decode else f"seq {args.seq}"
        print(f"{name} ({what}): fused {row['fused_ms']:.2f} ms ({row['fused_dispatches']} dispatches), "
              f"unfused {row['unfused_ms']:.2f} ms ({row['unfused_dispatches']}), "
              f"torch eager {row.get('torch_ms', float('nan')):.2f} ms on {row.get('torch_device', '-')}{ratio}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    plot(rows, args.json.with_suffix(".png"))


def plot(rows: list[dict], path: Path) -> None:
    """Bars of ms per forward (ours fused, unfused, torch eager) per model, when matplotlib exists."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    kinds = [k for k in ("fused", "unfused", "torch") if all(f"{k}_ms" in r for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        ax.bar([j + i * width for j in range(len(rows))], [r[f"{kind}_ms"] for r in rows], width, label=kind)
    ax.set_xticks([j + width * (len(kinds) - 1) / 2 for j in range(len(rows))], [r["model"] for r in rows])
    ax.set_ylabel("ms per forward (median)")
    ax.set_title(f"eggfuse vs torch eager on {rows[0].get('adapter', '?')}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
