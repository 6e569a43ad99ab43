"""The f16 family (ir/ops/half.py) on the GPU: ToF16 of computed tensors, one dispatch per input
(WGSL pack2x16float), bit for bit against the numpy reference (numpy's float16 rounding, round
to nearest even). Of parameters ToF16 packs on the host and dispatches nothing: see
tests/gpu/test_f16_models.py."""

from __future__ import annotations

import pytest
from op_table import Row, check_row  # tests/op_table.py


def _to_f16(shapes: tuple[tuple[int, int], ...], scale: float = 1.0, transposed: bool = False) -> Row:
    # transposed: inputs [K, n_i] (weights as exporters store them), the output's rows their columns
    rid = ("ToF16-" + "+".join(f"[{r},{c}]" for r, c in shapes) + (f"x{scale:g}" if scale != 1 else "")
           + ("-transposed" if transposed else ""))
    return Row("ToF16", rid, lambda g: g.add_node("ToF16", tuple(g.input(f"x{i}", list(s))
                                                                 for i, s in enumerate(shapes)),
                                                  transposed=transposed), scale=scale)


ROWS = [
    _to_f16(((3, 64),)),
    _to_f16(((1, 2),)),
    _to_f16(((3, 64), (5, 64), (1, 64))),  # three dispatches into one output
    _to_f16(((4, 10),), scale=1e4),  # large halves (ulp 8 to 32), all below 65504
    _to_f16(((4, 10),), scale=1e-6),  # subnormal halves
    _to_f16(((64, 3),), transposed=True),
    _to_f16(((2, 1),), transposed=True),
    _to_f16(((10, 3), (10, 5), (10, 1)), transposed=True),  # three inputs [K, n_i]: their transposes stacked
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_op_matches_reference(row: Row, device):
    check_row(row, device, subgroups=None)
