"""bench/exported_peers.py's steps that need no GPU or torch: the inputs it draws, and the parameters it
rebuilds for a peer's weights from the saved file's skeleton (deberta_tiny, a committed fixture, in place of
the large exports)."""

import json
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import exported_peers  # noqa: E402

from eggfuse.onnx import load  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "exported" / "deberta_tiny.dynamo.onnx"


@pytest.mark.parametrize("stem, padded", [("gpt2_small", np.s_[:3]), ("deberta_v3_small", np.s_[-3:])])
def test_inputs_pad_the_second_sequence_on_the_models_side(stem, padded):
    model = exported_peers.MODELS[stem]
    x = exported_peers.inputs(model, 3, 10)
    ids, mask = x["input_ids"], x["attention_mask"]
    assert ids.shape == mask.shape == (3, 10) and ids.dtype == mask.dtype == np.int64
    assert 0 <= ids.min() and ids.max() < model.vocab
    want = np.ones((3, 10), np.int64)
    want[1, padded] = 0
    assert np.array_equal(mask, want)


def test_peer_params_follow_the_peers_weights_through_what_the_import_folds(tmp_path):
    path = tmp_path / "deberta_tiny.dynamo.onnx"
    shutil.copy(FIXTURE, path)
    proto = onnx.load(str(path))
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer
               if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) >= 1 and np.prod(i.dims) > 1}
    # the names map of a peer whose state_dict keys are the initializers' own names
    (tmp_path / "deberta_tiny.names.json").write_text(json.dumps({k: {"key": k, "transpose": False}
                                                                  for k in weights}))
    model = exported_peers.Exported("deberta_tiny", "DebertaV2Model", 64, "right", "dynamo")
    exported_peers.save(tmp_path / "graphs", model, path, 2, 7)
    saved = pickle.loads((tmp_path / "graphs" / "deberta_tiny_onnx.pkl").read_bytes())
    assert len(saved["skeleton"]) < path.stat().st_size  # the weights' values left out
    shapes = {"input_ids": [2, 7], "attention_mask": [2, 7]}
    _, want = load(path, shapes=shapes)
    same = exported_peers.peer_params(saved, weights)
    assert set(same) == set(want) and all(np.array_equal(same[k], want[k]) for k in want)
    doubled = exported_peers.peer_params(saved, {k: 2 * v for k, v in weights.items()})
    for k in weights:
        if k in want:
            np.testing.assert_array_equal(doubled[k], 2 * want[k])
    derived = [k for k in want if k not in weights and not np.array_equal(doubled[k], want[k])]
    assert derived, "no parameter the import computed from the weights followed them"
    with pytest.raises(SystemExit, match="the peer's .* is \\[3\\], the file's"):
        exported_peers.peer_params(saved, {**weights, next(iter(weights)): np.zeros(3, np.float32)})
