"""A prompt through a prefill plan, then one decode step per later token, on two sessions sharing one
KV cache (``Session(..., share=)``), for several lowerings of the same LLaMA graphs: each lowering's
outputs bit for bit the first's, and the numpy reference's values."""

from __future__ import annotations

import numpy as np

from eggfuse.ir import evaluate
from eggfuse.models.llama import LlamaConfig, build_llama_graph
from eggfuse.pipeline import lower_for
from eggfuse.rewrites import random_feeds
from eggfuse.runtime import Session


def prefill_then_steps(decode: Session, prefill: Session, tokens: np.ndarray, prompt: int,
                       cache: str) -> list[np.ndarray]:
    """The prefill's logits of ``tokens[:prompt]`` at position 0, the decode step's logits at each
    later position, then the decode session's state parameter ``cache`` (e.g. ``blk.1.k_cache``)."""
    outs = [prefill.run({"tokens": tokens[:prompt], "pos": [0]})[0]]
    outs += [decode.run({"tokens": tokens[p:p + 1], "pos": [p]})[0] for p in range(prompt, len(tokens))]
    outs.append(decode.read_parameter(cache))
    return outs


def lowerings_agree(config: LlamaConfig, decode_graph, prefill_graph, device, lowerings: list[dict], *,
                    seed: int, prompt: int, total: int, cache: str) -> list[tuple]:
    """Lower the decode and prefill graphs (``build_llama_cache_graph`` of one row and of ``prompt``
    rows, optimised) with ``lower_for(..., **options)`` for each dict of ``lowerings``, run
    :func:`prefill_then_steps` over ``total`` random tokens on random weights (``seed``), assert every
    lowering's outputs and ``cache`` equal the first's bit for bit and its logits the numpy
    reference's (``build_llama_graph`` of ``total`` tokens) within 1e-4; return each lowering's
    (decode plan, prefill plan)."""
    _, params = random_feeds(build_llama_graph(config, 1), seed=seed)
    tokens = np.random.default_rng(seed + 1).integers(0, config.vocab_size, total)
    want = evaluate(build_llama_graph(config, total), {"tokens": tokens}, params)[0]
    results, plans = [], []
    for options in lowerings:
        decode = Session(lower_for(decode_graph, device, **options), params, device=device)
        prefill = Session(lower_for(prefill_graph, device, **options), {}, share=decode)
        results.append(prefill_then_steps(decode, prefill, tokens, prompt, cache))
        plans.append((decode.plan, prefill.plan))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(b, a)
    got = np.concatenate(results[0][:-1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    return plans
