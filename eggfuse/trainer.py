"""Trainer: one compiled training step (forward, backward, optimiser) whose parameters stay on the device."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from os import PathLike
from typing import TYPE_CHECKING

import numpy as np

from eggfuse.ir.errors import InputError, ModelError
from eggfuse.ir.graph import Graph, NodeId
from eggfuse.ir.optim import Optimizer, StepGraph, step_graph
from eggfuse.ir.reference import check_array
from eggfuse.pipeline import compile as compile_graph

if TYPE_CHECKING:
    from eggfuse.rewrites import CostModel, Report


class Trainer:
    """A training step compiled once: ``Trainer(graph, loss, params, optimizer)``.

    ``graph`` with its f32[1] (or f32[]) node ``loss`` (or a ``TrainingGraph`` with ``loss=None``) is
    turned into one :class:`~eggfuse.ir.optim.StepGraph`: forward, backward
    (:func:`~eggfuse.ir.autodiff.grad`) and the in-place updates of ``optimizer``
    (:class:`~eggfuse.ir.optim.SGD` or :class:`~eggfuse.ir.optim.Adam`) of every parameter
    not in ``frozen``. With ``fuse=True`` that whole graph goes through the rewrite engine
    (``report`` says what it did); it is lowered and uploaded once. ``params`` maps every
    parameter name to an array of its shape (the caller's arrays are not modified);
    optimiser state starts at zero.

    :meth:`step` runs one step and reads nothing back unless asked; parameters stay on the
    device until :meth:`parameters` or :meth:`save`. ``steps`` counts the steps run.
    ``step_graph`` is the step as built, ``graph`` the one that runs (optimised unless
    ``fuse=False``), ``session`` its :class:`Session` (``session.read_parameter`` reads
    optimiser state such as ``"<name>.adam"``). ``timings`` holds seconds for
    ``optimize_s`` (absent unfused) and ``compile_s`` (lowering, upload, pipelines), as
    :class:`~eggfuse.pipeline.Compiled` times them; ``cache`` says whether the compile cache
    had the step (``hit``, ``miss``, ``off``; ``cache=False`` skips it, see :func:`eggfuse.compile`).

    Its device buffers are released when the Trainer (and its ``session``) are no longer referenced (``del
    trainer``); for inference, compile the forward graph with :meth:`parameters` (``eggfuse.compile(graph,
    trainer.parameters())``, at any batch size the graph is built for).

    Raises GraphError for a loss or names ``grad`` refuses (a loss that reaches no parameter trained
    among them), InputError for missing,
    unknown or mis-shaped parameters, RewriteError, LoweringError or DeviceError from
    the later stages. Not thread-safe.
    """

    def __init__(self, graph: Graph, loss: NodeId | None, params: Mapping[str, np.ndarray], optimizer: Optimizer,
                 *, frozen: Iterable[str] = (), fuse: bool = True, cost_model: CostModel | None = None,
                 device=None, cache: bool = True) -> None:
        # what the caller passed, checked before any of it is used (Python's AttributeError, or numpy's "truth
        # value of an array is ambiguous", before)
        if not isinstance(graph, Graph):
            raise InputError(f"Trainer takes an eggfuse Graph first, got {type(graph).__name__}")
        if not isinstance(optimizer, Optimizer):
            raise InputError(f"Trainer's optimizer must be eggfuse.SGD(lr, ...) or eggfuse.Adam(lr, ...), got "
                             f"{type(optimizer).__name__} {optimizer!r:.40}")
        if not isinstance(params, Mapping):
            raise InputError(f"Trainer's params must map each parameter's name to its array, got "
                             f"{type(params).__name__}; e.g. {{'w1': w1, 'b1': b1}}")
        if isinstance(frozen, str):  # read letter by letter: "frozen names ['1', 'w'] are not parameters"
            raise InputError(f"frozen is a list of parameter names, got the str {frozen!r}; write frozen=[{frozen!r}]")
        self.step_graph: StepGraph = step_graph(graph, loss, optimizer, frozen=frozen)
        self.optimizer = optimizer
        self.report: Report | None = None
        self.timings: dict[str, float] = {}
        sg = self.step_graph
        names = [n.attrs["name"] for n in sg.leaves("Parameter") if not n.attrs.get("state")]
        missing = [f"{n!r} ({sg.parameters[n]})" for n in names if n not in params]
        unknown = [n for n in params if n not in names]
        if missing or unknown:
            raise InputError(f"Trainer: parameters not given: {', '.join(missing) or 'none'}; "
                             f"unknown: {', '.join(map(repr, unknown)) or 'none'}")
        values = {n: check_array(f"parameter {n!r}", params[n], sg.parameters[n]) for n in names}
        compiled = compile_graph(sg, values, fuse=fuse, cost_model=cost_model, device=device, cache=cache)
        self.report, self.graph, self.session = compiled.report, compiled.graph, compiled.session
        self.cache = compiled.cache
        self.timings.update(compiled.timings)
        # parameters no live node reads (not reached by the loss): never on the device
        self._host = {n: v for n, v in values.items() if n not in self.session.plan.parameters}
        self._names = names
        self.steps = 0

    @property
    def dispatches(self) -> int:
        """GPU dispatches per training step."""
        return len(self.session.plan.dispatches)

    def step(self, inputs: Mapping[str, np.ndarray], *, read_loss: bool = False) -> float | None:
        """Run one training step on ``inputs`` (every Input of the graph; the optimiser's step
        count is fed here). Returns the step's loss when ``read_loss`` (waits for the
        device), else None without waiting. Raises InputError as ``Session.run``."""
        if not isinstance(inputs, Mapping):
            raise InputError(f"Trainer.step takes a mapping of input name -> array, got {type(inputs).__name__}")
        feeds = dict(inputs)
        if self.step_graph.step_input is not None:
            if self.step_graph.step_input in feeds:
                raise InputError(f"input {self.step_graph.step_input!r} is fed by the Trainer")
            wanted = set(self.session.plan.inputs) - {self.step_graph.step_input}
            if missing := sorted(wanted - feeds.keys()):  # (the session's message would list the step count too)
                raise InputError(f"Trainer.step: missing input(s) {', '.join(map(repr, missing))}; give "
                                 f"{', '.join(map(repr, sorted(wanted)))} (the Trainer feeds "
                                 f"{self.step_graph.step_input!r} itself)")
            feeds[self.step_graph.step_input] = np.array([self.steps + 1], dtype=np.uint32)
        try:
            out = self.session.run(feeds, read=(0,) if read_loss else ())
        except InputError:
            self._check_labels(feeds)  # the class ids' hint in place of the shape error
            raise
        self.steps += 1
        return float(out[0][0]) if read_loss else None

    def _check_labels(self, feeds: dict) -> None:
        # class ids [B] where an input takes [B, C] rows (one-hot labels): the session's shape error, with the fix
        for name, i in self.session.plan.inputs.items():
            value, ty = feeds.get(name), self.session.plan.buffers[i].type
            if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.ndim == 1 and len(ty.shape) == 2 \
                    and value.shape[0] == ty.shape[0]:
                raise InputError(f"input {name!r}: expected {ty} rows, got {value.dtype}[{value.shape[0]}], class ids "
                                 f"it seems: give one-hot rows, eggfuse.models.mlp.one_hot({name}, {ty.shape[1]}) "
                                 "(a row of probabilities is taken as it is: soft labels)")

    def loss(self) -> float:
        """The loss of the last step (waits for the device). Raises InputError before any step."""
        if self.steps == 0:
            raise InputError("Trainer.loss: no step has run yet")
        return float(self.session.read_output(self.step_graph.loss_output)[0])

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter's current value (float32 arrays, read back from the device)."""
        return {n: self._host[n].copy() if n in self._host else self.session.read_parameter(n) for n in self._names}

    def save(self, path: str | PathLike) -> None:
        """Write :meth:`parameters` to a safetensors file (F32 tensors named as the graph's
        parameters; metadata ``steps``). Optimiser state is not saved. Raises ModelError
        when the file cannot be written, or a parameter holds NaN or infinity (nothing is written then:
        :meth:`load` refuses such values)."""
        from safetensors import SafetensorError
        from safetensors.numpy import save_file

        params = self.parameters()
        bad = sorted(n for n, v in params.items() if not np.isfinite(v).all())
        if bad:  # load() refuses such a file: writing it would lose the last good weights for nothing
            raise ModelError(f"not saving to {path}: parameters {', '.join(map(repr, bad))} hold NaN or infinity after "
                             f"{self.steps} steps (training diverged: lower the learning rate); nothing was written")
        try:
            save_file(params, str(path), metadata={"steps": str(self.steps)})
        except (OSError, SafetensorError) as e:  # the Rust writer reports I/O errors as SafetensorError
            raise ModelError(f"cannot write parameters to {path}: {e}") from None

    def load(self, path: str | PathLike) -> None:
        """Replace every parameter with the tensors of a safetensors file (as :meth:`save`
        writes). The file must hold exactly the graph's parameters with their shapes;
        optimiser state and ``steps`` are kept. Raises ModelError naming the file and the
        parameter for an unreadable file, a missing or unknown name, a wrong shape or a
        non-finite value; nothing is written then."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            tensors = load_file(str(path))
        except (OSError, SafetensorError) as e:  # a missing file, a bad header
            raise ModelError(f"cannot read parameters from {path}: {e}") from None
        missing = [f"{n!r} {self.step_graph.parameters[n]}" for n in self._names if n not in tensors]
        unknown = [n for n in tensors if n not in self._names]
        if missing or unknown:
            raise ModelError(f"{path}: parameters missing: {', '.join(missing) or 'none'}; "
                             f"not in the graph: {', '.join(map(repr, unknown)) or 'none'}")
        values = {}
        for name in self._names:
            try:
                values[name] = check_array(f"{path}: parameter {name!r}", tensors[name],
                                           self.step_graph.parameters[name])
            except InputError as e:
                raise ModelError(str(e)) from None
        for name, value in values.items():
            if name in self._host:
                self._host[name] = value
            else:
                self.session.write_parameter(name, value)
