"""Cross-check of the test oracles (tests/hf_numpy.py) and folders (tests/hf_folders.py) against
transformers and sentence-transformers. Not part of the test suite: it needs torch, which
eggfuse never depends on (and Python 3.11, where the CPU wheel is)::

    python3 -m venv /tmp/V
    /tmp/V/bin/pip install torch==2.13.0+cpu transformers sentence-transformers scipy ml_dtypes
    /tmp/V/bin/python tests/crosscheck_transformers.py

Per decoder folder: the logits of ``AutoModelForCausalLM`` against ``hf_numpy.causal_lm_logits``,
twice: as transformers computes them in float64 (it still computes RoPE, RMSNorm and the
attention softmax in float32 on purpose, so they differ by ~1e-7), and with those float32
steps made float64 (:func:`all_float64`), where they agree to rounding; ``AutoTokenizer``'s
ids against the ``tokenizers`` library's (the BOS its post-processor adds); and ``apply_chat_template`` against
``hf_folders.CHAT_RENDERED``. Per encoder folder: ``SentenceTransformer`` embeddings (float64)
against ``hf_numpy.sentence_embeddings`` on the same ids, and those ids against the
``tokenizers`` library's, padded to the longest sentence. It prints the largest relative
difference per folder and exits 1 if any all-float64 one exceeds 1e-12, a float32-upcast one
1e-6, or any ids or text differ.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import hf_folders  # noqa: E402
import hf_numpy  # noqa: E402
import numpy as np  # noqa: E402

PROMPT = "The capital of France is Paris. The quick brown fox jumps over the lazy dog, and then it runs."
SENTENCES = ["A man is eating food.", "Hi", "The weather is lovely today, it's so sunny outside!"]
DECODERS = [(f"{mt}-tf{g}", mt, {"generation": g}) for mt in hf_folders.DECODER_TYPES for g in (4, 5)] + [
    ("llama-linear", "llama", {"rope_scaling": {"type": "linear", "factor": 4.0}}),
    ("llama-llama3-tf5", "llama", {"generation": 5, "rope_scaling": hf_folders.LLAMA3_SCALING}),
    ("llama-untied-bias", "llama", {"tied": False, "attention_bias": True, "mlp_bias": True}),
    ("mistral-window-8", "mistral", {"sliding_window": 8}),  # the prompt is longer: the window applies
    ("qwen2-window-8", "qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    ("qwen3-bf16", "qwen3", {"generation": 5, "dtype": "bfloat16"}),
]
ENCODERS = [(f"{mt}-tf{g}-{p}", mt, {"generation": g, "pooling": p, "normalize": n, "prefix": pre})
            for mt, pre in (("bert", "bert."), ("roberta", "roberta."), ("xlm-roberta", ""))
            for g, p, n in ((4, "mean", True), (5, "cls", False), (4, "lasttoken", True), (5, "weightedmean", True),
                            (4, "mean_sqrt_len", False))]


def relative(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


@contextlib.contextmanager
def all_float64():
    """Inside: torch's float32 means float64 (``Tensor.to``, ``.float()``, ``arange(dtype=)``,
    ``softmax(dtype=)``), so transformers' deliberate float32 upcasts stay float64."""
    import torch

    to, flt, arange, softmax = torch.Tensor.to, torch.Tensor.float, torch.arange, torch.nn.functional.softmax

    def wide(x):
        return torch.float64 if x is torch.float32 else x

    def to64(self, *args, **kwargs):
        return to(self, *map(wide, args), **{k: wide(v) for k, v in kwargs.items()})

    torch.Tensor.to, torch.Tensor.float = to64, torch.Tensor.double
    torch.arange = lambda *a, dtype=None, **k: arange(*a, dtype=wide(dtype), **k)
    torch.nn.functional.softmax = lambda x, dim=None, dtype=None, **k: softmax(x, dim=dim, dtype=wide(dtype), **k)
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.arange, torch.nn.functional.softmax = to, flt, arange, softmax


def transformers_logits(folder: Path, ids: list[int]):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def check_decoder(folder: Path, model_type: str) -> tuple[float, float, list[str]]:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    problems = []
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(PROMPT).input_ids
    if ids != Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT).ids:
        problems.append("token ids differ from the tokenizers library's")
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False,
                                   add_generation_prompt=True)
    if chat != hf_folders.CHAT_RENDERED[model_type]:
        problems.append(f"chat template renders {chat!r}")
    cfg, weights = hf_numpy.load_folder(folder)
    got = hf_numpy.causal_lm_logits(cfg, weights, ids)
    as_shipped = relative(got, transformers_logits(folder, ids))
    with all_float64():
        wide = relative(got, transformers_logits(folder, ids))
    return wide, as_shipped, problems


def check_encoder(folder: Path, options: dict) -> tuple[float, list[str]]:
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    problems = []
    model = SentenceTransformer(str(folder), device="cpu").double()
    features = model.tokenize(SENTENCES)
    ids, mask = features["input_ids"].numpy(), features["attention_mask"].numpy()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pad = hf_folders.TOKENIZER_STYLES[hf_folders.STYLE_OF[options["model_type"]]]["pad"]
    tok.enable_padding(pad_id=tok.token_to_id(pad), pad_token=pad)
    tok.no_truncation()
    if [e.ids for e in tok.encode_batch(SENTENCES)] != ids.tolist():
        problems.append("token ids differ from the tokenizers library's")
    with torch.no_grad():
        want = model.forward(features)["sentence_embedding"].numpy()
    cfg, weights = hf_numpy.load_folder(folder)
    got = hf_numpy.sentence_embeddings(cfg, weights, ids, mask, options["pooling"], options["normalize"])
    return relative(got, want), problems


def main() -> int:
    import transformers

    print(f"transformers {transformers.__version__}")
    worst, failed = 0.0, False
    root = Path(tempfile.mkdtemp())
    for name, model_type, options in DECODERS:
        err, shipped, problems = check_decoder(hf_folders.decoder_folder(root / name, model_type, **options),
                                               model_type)
        print(f"{name:24s} logits: max |numpy - transformers| / max |transformers| = {err:.2e} all float64, "
              f"{shipped:.2e} as transformers computes {' '.join(problems)}")
        worst, failed = max(worst, err), failed or bool(problems) or shipped > 1e-6
    for name, model_type, options in ENCODERS:
        folder = hf_folders.encoder_folder(root / name, model_type, **options)
        err, problems = check_encoder(folder, {**options, "model_type": model_type})
        print(f"{name:24s} embeddings: relative difference to sentence-transformers {err:.2e} {' '.join(problems)}")
        worst, failed = max(worst, err), failed or bool(problems)
    print(f"largest relative difference {worst:.2e}")
    return 1 if failed or worst > 1e-12 else 0


if __name__ == "__main__":
    sys.exit(main())
