"""Models exported by torch.onnx, run by eggfuse.onnx.Model, against torch's own outputs.

The fixtures under tests/data/exported/ come from scripts/export_torch_fixtures.py
(transformers BertModel, LlamaForCausalLM with GQA and the other families the script lists, 2 layers,
random weights; torch's
classic exporter at opset 17, and 14 for BERT, and the dynamo exporter at opset 18), with
the inputs and torch's outputs in NAME.npz. Each runs unfused and optimised, at the exported
shapes (batch 2, distilbert_tiny's 3, sequence 7) and at a second shape bound from the feeds (the
padded row alone, cut to its real tokens: the same values at those positions, as padding is masked).
distilbert_tiny's third sequence is wholly masked: there the dynamo exporter's graph is not torch
(tests/exported_graphs.py GRAPH_NOT_TORCH), and onnxruntime's outputs of that file are expected.

Tolerance: max |eggfuse - torch| <= 2e-5 * max |torch| per output. Both compute in float32
but sum in other orders (lavapipe and GPUs differ again) and WGSL's exp, erf and tanh are
approximations; on lavapipe the error is 3e-7 to 5e-7 of the scale, so the bound leaves a
factor of 40 for other devices. Every weight and bias of the fixtures is random, so one
dropped, transposed or applied at the wrong place, or a mask shifted by one position, moves
the outputs by far more; an eps moved inside or outside a square root (1e-5 or less of the
variance here) stays below it, and the rules' soundness tests have to catch that.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eggfuse.onnx import Model
from tests.exported_graphs import expected_outputs

DATA = Path(__file__).resolve().parent.parent / "data" / "exported"
FIXTURES = [row["file"] for row in json.loads((DATA / "manifest.json").read_text())]
RTOL = 2e-5
#: the padded row of each fixture's batch and its number of real tokens (export_torch_fixtures.py); gpt2_tiny pads
#: on the left, which cutting would move its tokens' positions: its first row, unpadded, instead; vit_tiny's
#: second image alone (None: the whole row)
PADDED_ROW = {"bert_tiny": (1, 4), "bert_tiny_pooled": (1, 4), "distilbert_tiny": (1, 4), "llama_tiny": (1, 5),
              "gpt2_tiny": (0, 7), "roberta_tiny": (1, 4), "vit_tiny": (1, None),
              "t5_tiny": (1, 4), "mpnet_tiny": (1, 4), "albert_tiny": (1, 4), "electra_tiny": (1, 4),
              "deberta_tiny": (1, 4), "qwen2_tiny": (1, 5)}


def _expected(file: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    # torch's outputs, but onnxruntime's at the rows where the exported graph is not torch (GRAPH_NOT_TORCH)
    data = np.load(DATA / f"{file.split('.')[0]}.npz")
    feeds = {k.removeprefix("input."): data[k] for k in data.files if k.startswith("input.")}
    return feeds, expected_outputs(DATA / file, data)


def _check(model: Model, feeds: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    outs = model.run(feeds)
    assert model.output_names == list(want), what
    for name, got in zip(model.output_names, outs, strict=True):
        ref = want[name]
        assert got.shape == ref.shape and got.dtype == np.float32, (what, name, got.shape, ref.shape, got.dtype)
        scale = float(np.abs(ref).max())
        err = float(np.abs(got.astype(np.float64) - ref).max())
        assert err <= RTOL * scale, f"{what} {name}: max |diff| {err:.3g} against scale {scale:.3g}"


def test_every_fixture_is_listed():
    onnx_files = sorted(p.name for p in DATA.glob("*.onnx"))
    assert onnx_files == sorted(FIXTURES) and len(FIXTURES) == 26
    for file in FIXTURES:
        assert (DATA / f"{file.split('.')[0]}.npz").is_file()


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "optimised"])
@pytest.mark.parametrize("file", FIXTURES)
def test_exported_matches_torch(file, fuse):
    feeds, want = _expected(file)
    model = Model(DATA / file, fuse=fuse)
    assert not model.static  # batch and sequence are symbolic: the shapes bind from the feeds
    first = next(iter(feeds))
    _check(model, feeds, want, f"{file} at {feeds[first].shape}")
    spec = next(iter(model.plans.values()))
    assert spec.compiled.dispatches_fused <= spec.compiled.dispatches_unfused
    if not fuse:
        assert spec.compiled.dispatches_fused == spec.compiled.dispatches_unfused

    # the padded row alone, cut to its real tokens: a second plan, other shapes
    row, n = PADDED_ROW[file.split(".")[0]]
    small = {k: np.ascontiguousarray(v[row:row + 1, :n]) for k, v in feeds.items()}
    assert small.get("attention_mask", np.ones(1)).all()
    cut = {k: v[row:row + 1, :n] if v.ndim == 3 else v[row:row + 1] for k, v in want.items()}
    _check(model, small, cut, f"{file} at {small[first].shape}")
    assert len(model.plans) == 2


@pytest.mark.parametrize("file", ["gpt2_tiny.classic.onnx", "gpt2_tiny.dynamo.onnx"])
def test_pre_ln_residual_sums_stored_with_their_layer_norms_match_onnxruntime(file):
    # at 2 x 8 tokens the [16, hidden] residual sums are a multiple of 256 bytes, so each one the next residual
    # add and the next LayerNorm read is stored with its LayerNorm by one product (FusedMatMulLayerNormPair, its
    # two values Select views): against onnxruntime's run of the same file, the first sequence left-padded
    import onnxruntime

    rng = np.random.default_rng(8)
    vocab = int(np.load(DATA / "gpt2_tiny.npz")["output.logits"].shape[-1])
    mask = np.ones((2, 8), np.int64)
    mask[0, :3] = 0
    feeds = {"input_ids": rng.integers(0, vocab, (2, 8)).astype(np.int64), "attention_mask": mask}
    session = onnxruntime.InferenceSession(str(DATA / file), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(names, feeds), strict=True))
    model = Model(DATA / file, fuse=True)
    _check(model, feeds, want, f"{file} at 2 x 8")
    ops = [n.op for n in next(iter(model.plans.values())).compiled.graph.live_nodes()]
    assert ops.count("FusedMatMulLayerNormPair") >= 2 and "Select" in ops, ops


def test_deberta_in_its_real_form_matches_torch(monkeypatch):
    # the dynamo DeBERTa's batch-sized copies imported as broadcasts (importer.lazy_copies, from 1 MiB at real
    # sizes; at 0 here), so its position terms read q's and k's heads in place, in the packed Q/K/V product
    # (PermutedBatchMatMul), and gather with the bucket tables broadcast (GatherElementsBroadcast); with the
    # optional gathered_products, only the elements the tables pick (GatheredBatchMatMul): the plans on the
    # device against torch
    import eggfuse.onnx.importer as importer

    monkeypatch.setattr(importer, "LAZY_COPY_BYTES", 0)
    from eggfuse.rewrites.rulesets import select

    feeds, want = _expected("deberta_tiny.dynamo.onnx")
    for optional, op in (([], "PermutedBatchMatMul"), (["gathered_products"], "GatheredBatchMatMul")):
        model = Model(DATA / "deberta_tiny.dynamo.onnx", fuse=True, cache=False, rulesets=select(optional=optional))
        _check(model, feeds, want, f"deberta_tiny.dynamo.onnx with lazy copies and {optional}")
        ops = [n.op for n in next(iter(model.plans.values())).compiled.graph.live_nodes()]
        assert ops.count(op) == 4, ops
