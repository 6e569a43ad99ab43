"""``eggfuse train-digits``: train an MLP on scikit-learn's digits on the GPU, report test accuracy.

:func:`train_digits` is the whole run (data, model, :class:`~eggfuse.trainer.Trainer`, test
accuracy), usable without the command line; :func:`add_train_digits` registers the
subcommand on the CLI's parser.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from eggfuse.cli_cache import add_no_cache
from eggfuse.ir import Graph, InputError

#: Defaults of the run: reach >= 95% test accuracy in a few seconds on lavapipe.
STEPS, BATCH, HIDDEN, SEED = 300, 64, 64, 0
LR = {"adam": 0.01, "sgd": 0.1}
MOMENTUM = 0.9  # SGD's
LOSS_EVERY = 10  # steps between loss read-backs for the progress bar (each waits for the device)


@dataclass
class DigitsRun:
    """What :func:`train_digits` measured. ``seconds_per_step`` is the mean wall-clock
    seconds of steps 2.. (inputs written, the step submitted, a loss read back every
    ``loss_every`` steps and after the last); ``first_step_s`` is step 1 alone, which on
    lavapipe includes compiling the shaders to machine code. ``compile_s`` covers the
    rewrite engine, lowering and pipeline creation (``optimize_s`` + ``compile_s`` of
    :class:`~eggfuse.pipeline.Compiled`); evaluation is not timed. ``cache``: whether the
    compile cache had the training step (``hit``, ``miss``, ``off``)."""

    test_accuracy: float
    train_accuracy: float
    steps: int
    batch: int
    epochs: float
    optimizer: str
    lr: float
    fuse: bool
    seconds_per_step: float
    first_step_s: float
    compile_s: float
    final_loss: float
    first_loss: float
    dispatches_per_step: int
    fused_matmuls: dict[str, int]
    adapter: str
    saved: str | None = None
    cache: str = "off"

    def to_dict(self) -> dict:
        return asdict(self)


def _fused_matmuls(graph: Graph) -> dict[str, int]:
    # FusedMatMul nodes of the compiled step by epilogue ('bias', 'add', 'bias+Relu', 'none')
    from eggfuse.ir.ops.fused_epilogue import step_label

    return dict(Counter("+".join(map(step_label, n.attrs["epilogue"])) or "none"
                        for n in graph.live_nodes() if n.op == "FusedMatMul"))


def train_digits(steps: int = STEPS, batch: int = BATCH, lr: float | None = None, optimizer: str = "adam",
                 seed: int = SEED, hidden: int = HIDDEN, fuse: bool = True, save: str | None = None,
                 progress: Callable[[int, float], None] | None = None, loss_every: int = LOSS_EVERY,
                 device=None, cache: bool = True) -> DigitsRun:
    """Train a 64 -> ``hidden`` (ReLU) -> 10 MLP on the digits training split for ``steps``
    mini-batches of ``batch`` images; returns a :class:`DigitsRun` with the test accuracy.

    ``optimizer``: ``"adam"`` (Adam, lr default 0.01) or ``"sgd"`` (SGD with momentum 0.9,
    lr default 0.1). ``seed`` fixes the train/test split, the initial weights and the
    batch order (each epoch reshuffles; the images left over after the last full batch
    are dropped for that epoch, see :func:`~eggfuse.models.mlp.batches`). ``progress(step,
    loss)`` is called every ``loss_every`` steps and after the last one. ``save`` writes
    the trained parameters as safetensors. Test accuracy is computed on the GPU with the
    forward graph over the 360 test images.

    Raises InputError for steps < 1, an unknown optimizer or a batch outside [1, 1437],
    ModelError when scikit-learn is missing or ``save`` cannot be written, and the
    errors of :class:`~eggfuse.trainer.Trainer`.
    """
    from eggfuse.ir.optim import SGD, Adam
    from eggfuse.models.mlp import (
        DIGITS_CLASSES,
        DIGITS_FEATURES,
        batches,
        build_mlp_graph,
        init_mlp_params,
        load_digits_split,
        one_hot,
    )
    from eggfuse.pipeline import compile as compile_graph
    from eggfuse.trainer import Trainer

    if steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}")
    if optimizer not in LR:
        raise InputError(f"unknown optimizer {optimizer!r}: use adam or sgd")
    if hidden < 1:
        raise InputError(f"hidden must be >= 1, got {hidden}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:  # numpy's raw ValueError before
        raise InputError(f"seed must be an integer >= 0, got {seed!r}")
    if save is not None:  # before the training, not after it
        folder = os.path.dirname(os.path.abspath(os.fspath(save)))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise InputError(f"cannot write {save}: {folder} is not a folder this process may write; give --save a "
                             "path in one")
    lr = LR[optimizer] if lr is None else float(lr)
    opt = Adam(lr) if optimizer == "adam" else SGD(lr, momentum=MOMENTUM)
    data = load_digits_split(seed)
    order = batches(len(data.x_train), batch, seed)  # checks the batch size
    sizes = (DIGITS_FEATURES, hidden, DIGITS_CLASSES)
    graph, loss = build_mlp_graph(batch, sizes)
    trainer = Trainer(graph, loss, init_mlp_params(sizes, seed), opt, fuse=fuse, device=device, cache=cache)
    labels = one_hot(data.y_train)

    first_loss = last_loss = float("nan")
    start = first_end = time.perf_counter()
    for step in range(1, steps + 1):
        idx = next(order)
        read = step == 1 or step == steps or step % loss_every == 0
        value = trainer.step({"x": data.x_train[idx], "labels": labels[idx]}, read_loss=read)
        if read:
            last_loss = value
            first_loss = value if step == 1 else first_loss
            if progress is not None:
                progress(step, value)
        if step == 1:
            first_end = time.perf_counter()
    end = time.perf_counter()

    params = trainer.parameters()
    diverged = sorted(n for n, v in params.items() if not np.isfinite(v).all())
    if diverged:  # the NaN parameters were blamed on the user ("give finite values") and saved
        raise InputError(f"training diverged: after {steps} steps parameters {', '.join(map(repr, diverged))} hold NaN "
                         f"or infinity (the loss {last_loss}); lower the learning rate (now {lr:g}, --lr)"
                         + ("; nothing was saved" if save is not None else ""))
    if save is not None:
        trainer.save(save)

    def accuracy(x: np.ndarray, y: np.ndarray) -> float:
        g, _ = build_mlp_graph(len(x), sizes)
        (logits,) = compile_graph(g, params, fuse=False, device=trainer.session.device, cache=cache).run({"x": x})
        return float(np.mean(np.argmax(logits, axis=1) == y))

    return DigitsRun(
        test_accuracy=accuracy(data.x_test, data.y_test),
        train_accuracy=accuracy(data.x_train, data.y_train),
        steps=steps, batch=batch, epochs=steps * batch / len(data.x_train), optimizer=optimizer, lr=lr, fuse=fuse,
        seconds_per_step=(end - first_end) / (steps - 1) if steps > 1 else first_end - start,
        first_step_s=first_end - start, compile_s=trainer.timings.get("optimize_s", 0.0) + trainer.timings["compile_s"],
        final_loss=last_loss,
        first_loss=first_loss, dispatches_per_step=trainer.dispatches, fused_matmuls=_fused_matmuls(trainer.graph),
        adapter=trainer.session.adapter, saved=save, cache=trainer.cache)


def cmd_train_digits(args: argparse.Namespace) -> None:
    bar = None

    def progress(step: int, loss: float) -> None:
        nonlocal bar
        if args.json:
            return
        if bar is None:  # made at the first step, so that compilation does not count in its rate
            from tqdm import tqdm

            bar = tqdm(total=args.steps, desc="train", unit="step", file=sys.stderr)
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.4f}")

    try:
        run = train_digits(args.steps, args.batch, args.lr, args.optimizer, args.seed, args.hidden,
                           fuse=not args.no_fuse, save=args.save, progress=progress, cache=not args.no_cache)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(run.to_dict()))
        return
    print(f"test accuracy: {run.test_accuracy:.2%} ({run.steps} steps of {run.batch}, {run.epochs:.1f} epochs, "
          f"{run.optimizer} lr {run.lr:g}; train accuracy {run.train_accuracy:.2%})")
    print(f"loss: {run.first_loss:.4f} -> {run.final_loss:.4f}")
    print(f"time per step: {run.seconds_per_step * 1e3:.2f} ms ({run.dispatches_per_step} dispatches, "
          f"{'fused' if run.fuse else 'unfused'}; first step {run.first_step_s:.2f}s); compile {run.compile_s:.2f}s")
    print(f"adapter: {run.adapter}")
    print(f"compile cache: {run.cache}")
    if run.saved:
        print(f"parameters saved to {run.saved}")


def add_train_digits(sub) -> None:
    """Register ``train-digits`` on the CLI's subparsers."""
    t = sub.add_parser("train-digits", help="train an MLP on scikit-learn's digits on the GPU; print test accuracy")
    t.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    t.add_argument("--batch", type=int, default=BATCH, help=f"images per step (default {BATCH})")
    t.add_argument("--lr", type=float, default=None,
                   help=f"learning rate (default {LR['adam']} for adam, {LR['sgd']} for sgd)")
    t.add_argument("--optimizer", choices=sorted(LR), default="adam",
                   help=f"adam (default) or sgd (momentum {MOMENTUM})")
    t.add_argument("--hidden", type=int, default=HIDDEN, help=f"hidden units (default {HIDDEN})")
    t.add_argument("--seed", type=int, default=SEED, help="seed of the split, the weights and the batch order")
    t.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    t.add_argument("--no-fuse", action="store_true", help="run the training step without the rewrite engine")
    t.add_argument("--save", metavar="PATH", help="write the trained parameters as safetensors")
    add_no_cache(t)
    t.set_defaults(func=cmd_train_digits)
