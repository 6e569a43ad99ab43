"""Lowering entries of the in-place optimiser updates (ir/ops_train.py)."""

from __future__ import annotations

from ..ir.graph import Node
from ..ir.types import TensorType
from .kernels import KernelCall, _elementwise_groups, kernel
from .wgsl import render, uniform_bytes


def _bindings(reads: list[tuple[str, str]], written: str) -> str:
    decls = [f"@group(0) @binding({i}) var<storage, read> {name}: array<{ty}>;" for i, (name, ty) in enumerate(reads)]
    decls.append(f"@group(0) @binding({len(reads)}) var<storage, read_write> {written}: array<f32>;")
    return "\n".join(decls)


# name -> (the inputs read, in binding order, with their WGSL types; the written input; WGSL)
_UPDATES = {
    "SgdUpdate": ([("step", "f32")], "param", "    param[i] = param[i] - p.a * (step[i] + p.b * param[i]);"),
    "SgdMomentum": ([("grad", "f32"), ("param", "f32")], "velocity",
                    "    velocity[i] = p.a * velocity[i] + grad[i];"),
    "AdamMoments": ([("grad", "f32")], "moments",
                    "    let g = grad[i];\n"
                    "    moments[i] = p.a * moments[i] + (1.0 - p.a) * g;\n"
                    "    moments[p.n + i] = p.b * moments[p.n + i] + (1.0 - p.b) * g * g;"),
    "AdamStep": ([("moments", "f32"), ("step", "u32")], "param",
                 "    let t = f32(step[0]);\n"
                 "    let m_hat = moments[i] / (1.0 - pow(p.c, t));\n"
                 "    let v_hat = moments[p.n + i] / (1.0 - pow(p.d, t));\n"
                 "    param[i] = param[i] - p.a * (m_hat / (sqrt(v_hat) + p.e) + p.f * param[i]);"),
}


@kernel(*_UPDATES)
def _optimizer(node: Node, ins: list[TensorType]) -> KernelCall:
    reads, written, update = _UPDATES[node.op]
    a = node.attrs
    n = ins[1].num_elements if node.op == "AdamMoments" else node.type.num_elements
    fields = {
        "SgdUpdate": ("lr", "weight_decay"),
        "SgdMomentum": ("momentum",),
        "AdamMoments": ("beta1", "beta2"),
        "AdamStep": ("lr", None, "beta1", "beta2", "eps", "weight_decay"),
    }[node.op]
    values = [0.0 if f is None else a[f] for f in fields] + [0.0] * (6 - len(fields))
    src = render("optimizer.wgsl", BINDINGS=_bindings(reads, written), UNIFORM=len(reads) + 1, UPDATE=update)
    return KernelCall(f"optimizer_{node.op}", src, uniform_bytes(n, *(float(v) for v in values)),
                      _elementwise_groups(n))
