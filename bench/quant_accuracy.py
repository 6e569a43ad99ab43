"""SmolLM2-135M with its weights kept as Q4_1/Q8_0 blocks against the fp32 plan of the same
weights dequantised (eggfuse.generate --weights q4_1 vs f32), on any adapter (lavapipe too).
``--weights f16``: the plan of ``precision="f16"`` instead (the rewrite engine stores those
dequantised weights as float16), against the same fp32 plan.

For each prompt: the prefill logits of both plans (relative error: max |q - f| / max |f|),
then greedy generation of ``--tokens`` tokens by each, compared token for token, and the
decode time per token of both (the median over the steps, each step one decode run with its
logits read back and the argmax taken, runs of the two plans interleaved so that a loaded
machine slows both alike). Prints one JSON object; ``--json PATH`` also writes it.

    .venv/bin/python bench/quant_accuracy.py --tokens 24 --json bench/results/quant_accuracy_lavapipe.json
    .venv/bin/python bench/quant_accuracy.py --weights f16 --tokens 24 --json bench/results/f16_accuracy_lavapipe.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from eggfuse.generate import Generator
from eggfuse.models.causal_lm import CausalLM

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colours are", "Water boils at a temperature of")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=24, help="greedy tokens per prompt (default 24)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"prompts to run (at most {len(PROMPTS)})")
    ap.add_argument("--max-seq", type=int, default=64, help="KV-cache positions (default 64)")
    ap.add_argument("--weights", choices=("q4_1", "f16"), default="q4_1",
                    help="q4_1: the file's blocks; f16: precision='f16' on the dequantised weights (default q4_1)")
    ap.add_argument("--json", metavar="PATH", help="also write the result here")
    args = ap.parse_args()
    q = CausalLM.load(weights="q4_1")
    f = q.with_weights("f32")  # the same weights, dequantised exactly (what --weights f32 loads)
    kind = args.weights
    tested = Generator(q, max_seq=args.max_seq, cache=False) if kind == "q4_1" else \
        Generator(f, max_seq=args.max_seq, cache=False, precision="f16")
    gens = {kind: tested, "f32": Generator(f, max_seq=args.max_seq, cache=False)}
    out = {"adapter": tested.adapter, "weights": kind, "tokens": args.tokens, "load_average": os.getloadavg()[0],
           "memory": {w: g.decode.plan.memory() for w, g in gens.items()}, "prompts": []}
    steps = {w: [] for w in gens}
    for prompt in PROMPTS[:args.prompts]:
        ids = q.encode(prompt)
        logits = {w: g.prefill(ids, last_logits=False) for w, g in gens.items()}
        err = float(np.abs(logits[kind] - logits["f32"]).max() / np.abs(logits["f32"]).max())
        tokens = {w: [int(np.argmax(logits[w][-1]))] for w in gens}
        decode_err = 0.0
        for pos in range(ids.size, ids.size + args.tokens - 1):
            step = {}
            for w, g in gens.items():
                t = time.perf_counter()
                step[w] = g.step(tokens[w][-1], pos)
                tokens[w].append(int(np.argmax(step[w])))
                steps[w].append(time.perf_counter() - t)
            decode_err = max(decode_err, float(np.abs(step[kind] - step["f32"]).max() / np.abs(step["f32"]).max()))
        same = tokens[kind] == tokens["f32"]
        out["prompts"].append({"prompt": prompt, "prefill_relative_error": err, "decode_relative_error": decode_err,
                               "same_tokens": same, "text": q.decode(tokens[kind]), f"{kind}_ids": tokens[kind],
                               "f32_ids": tokens["f32"]})
        print(json.dumps(out["prompts"][-1]), flush=True)
    out["decode_ms_per_token"] = {w: 1e3 * float(np.median(s)) for w, s in steps.items()}
    out["load_average_end"] = os.getloadavg()[0]
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
