"""``eggfuse generate "prompt"``: stream text from a LLaMA-family model (SmolLM2-135M by default),
then print the run's figures.

The work is :func:`eggfuse.generate.generate`; :func:`add_generate` registers the
subcommand on the CLI's parser.
"""

from __future__ import annotations

import argparse
import json

from eggfuse.cli_cache import add_no_cache, add_precision
from eggfuse.generate import DEFAULT_WEIGHTS
from eggfuse.models.gguf import WEIGHTS

#: Dispatches per generated token of meganeura 0.2.0 on this model (its published figure).
MEGANEURA_DISPATCHES_PER_TOKEN = 423


def cmd_generate(args: argparse.Namespace) -> None:
    from eggfuse.generate import generate

    streaming = not args.json
    started = False

    def show(token: int, piece: str) -> None:
        nonlocal started
        if not started and not args.chat:  # the prompt first, once it has passed every check
            print(args.prompt, end="")
        started = True
        print(piece, end="", flush=True)

    result = generate(args.prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                      seed=args.seed, chat=args.chat, stop_at_eos=not args.no_stop, max_seq=args.max_seq,
                      on_token=show if streaming else None, fuse=not args.no_fuse, layers=args.layers,
                      model=args.model, cache=not args.no_cache, weights=args.weights, precision=args.precision)
    if args.json:
        print(json.dumps(result.to_dict()))
        return
    steps = len(result.generated_ids) - 1
    print()
    print(f"prefill: {len(result.prompt_ids)} prompt tokens, {result.prefill_tokens_per_s:.2f} tokens/s "
          f"(it also gives the first new token)")
    print(f"decode: {steps} tokens, {result.decode_tokens_per_s:.2f} tokens/s (stopped: {result.stop_reason})")
    print(f"time to first token: {result.time_to_first_token_s:.2f}s; compile cache: {result.cache} "
          f"({', '.join(f'{k} {v}' for k, v in result.cache_plans.items())})")
    print(f"model: {result.model}")
    formats = ", ".join(f"{n} {k}" for k, n in sorted(result.weight_formats.items()))
    kept = sorted(set(result.weight_formats) - {result.weights, "f32", "f16"})
    note = (f"; {'/'.join(kept)}: the file's blocks, kept as stored" if kept and result.weights not in ("f32", "f16")
            else "")  # --weights q8_0 on SmolLM2's Q4_1 file keeps its Q4_1 blocks: said so, not hidden in a count
    print(f"weights: {result.weights} ({formats} parameters{note})")
    if result.precision != "f32":
        print(f"precision: {result.precision} (the rewrite engine stores the weights held in f32 as float16)")
    print(memory_line(result.memory))
    print(f"adapter: {result.adapter}")
    peer = f"; meganeura, 30 layers: {MEGANEURA_DISPATCHES_PER_TOKEN}" if args.model is None else ""
    if args.no_fuse:
        print(f"dispatches per decode step: {result.dispatches_per_decode_step_unfused} unfused (--no-fuse; "
              f"{result.layers} layers)")
    else:
        print(f"dispatches per decode step: {result.dispatches_per_decode_step_unfused} unfused -> "
              f"{result.dispatches_per_decode_step} fused ({result.layers} layers{peer})")


def dispatches_line(unfused: int, fused: int, plan: int, fuse: bool = True) -> str:
    """``dispatches per run: ...``: the ops that dispatch before and after fusion (``fuse`` False: the
    unfused graph's only), and the plan's dispatches where lowering added some (split-K reductions)."""
    extra = f" ({plan} in the plan, with split-K reductions)" if plan != fused else ""
    if not fuse:
        return f"dispatches per run: {unfused} unfused (--no-fuse){extra}"
    return f"dispatches per run: {unfused} unfused -> {fused} fused{extra}"


def precision_line(precision: str, f16_weights: list[str]) -> str:
    """``precision: ...``: the plan's precision and how many parameters it stores as float16."""
    return f"precision: {precision} ({len(f16_weights)} parameters stored as float16)"


def memory_line(memory: dict[str, dict[str, int]]) -> str:
    """``device memory: ...``: each plan's ``ExecutionPlan.memory()`` in MB (10^6 bytes)."""
    parts = []
    for plan, m in memory.items():
        parts.append(f"{plan} plan: weights {m['weights_bytes'] / 1e6:.1f} MB, cache {m['cache_bytes'] / 1e6:.1f} MB, "
                     f"intermediates {m['intermediate_bytes'] / 1e6:.2f} MB")
    return "device memory: " + "; ".join(parts)


def add_generate(sub) -> None:
    """Register ``generate`` on the CLI's subparsers."""
    g = sub.add_parser("generate", help="generate text (SmolLM2-135M-Instruct by default); print tokens/s and "
                                        "dispatches")
    g.add_argument("prompt", help="the text to continue (with --chat: the user's message)")
    g.add_argument("--model", metavar="PATH", default=None,
                   help="a .gguf file or a Hugging Face folder (llama, mistral, qwen2, qwen3, smollm3); "
                        "default: the shipped SmolLM2-135M-Instruct")
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate at most (default 32)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampler (default 0)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn of the model's chat template")
    g.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-sequence token")
    g.add_argument("--max-seq", type=int, default=None,
                   help="KV-cache length in tokens, prompt included (default: the model's context; SmolLM2: 8192)")
    g.add_argument("--layers", type=int, default=None,
                   help="run the first N layers only (quick checks: the text is then meaningless)")
    g.add_argument("--weights", choices=WEIGHTS, default=None,
                   help="storage of the matmul and embedding weights: f32, blocks decoded in the kernels (a GGUF "
                        "file's Q4_0/Q4_1/Q8_0 tensors as stored, other weights quantised to the format named), or "
                        "f16 (every weight rounded once to float16, blocks dequantised first); "
                        f"default {DEFAULT_WEIGHTS}")
    g.add_argument("--no-fuse", action="store_true", help="run the graphs without the rewrite engine")
    add_no_cache(g)
    add_precision(g)
    g.add_argument("--json", action="store_true",
                   help="print one JSON object (prompt_ids, generated_ids, text, tokens/s, dispatches)")
    g.set_defaults(func=cmd_generate)
