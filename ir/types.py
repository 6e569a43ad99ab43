"""Tensor types: element dtype plus a static shape."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class DType(enum.Enum):
    """Element type of a tensor. Every one is 4 bytes wide on the device.

    - ``F32``: IEEE float32.
    - ``U32``: unsigned indices (Embedding rows, cache positions).
    - ``I32``: signed 32-bit integers; ONNX int64 tensors are narrowed to it, with range
      checks (WGSL has no 64-bit integers).
    - ``BOOL``: booleans, numpy ``bool`` on the host and a ``u32`` of 0 or 1 on the device.
    """

    F32 = "f32"
    U32 = "u32"
    I32 = "i32"
    BOOL = "bool"

    @property
    def size_bytes(self) -> int:
        """Bytes per element on the device."""
        return 4

    @property
    def numpy(self) -> np.dtype:
        """The host (numpy) dtype of this element type."""
        return _HOST[self]

    @property
    def device_numpy(self) -> np.dtype:
        """The numpy dtype of the device's bytes (BOOL is stored as u32)."""
        return _DEVICE[self]

    @property
    def wgsl(self) -> str:
        """The WGSL element type of a storage array of this dtype."""
        return "u32" if self is DType.BOOL else self.value

    @property
    def is_integer(self) -> bool:
        return self in (DType.U32, DType.I32)


_HOST = {DType.F32: np.dtype(np.float32), DType.U32: np.dtype(np.uint32), DType.I32: np.dtype(np.int32),
         DType.BOOL: np.dtype(np.bool_)}
_DEVICE = _HOST | {DType.BOOL: np.dtype(np.uint32)}


@dataclass(frozen=True)
class TensorType:
    """A static tensor type: ``shape`` (a tuple of ints >= 1; ``()`` is a scalar, one element)
    and ``dtype``."""

    shape: tuple[int, ...]
    dtype: DType = DType.F32

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def size_bytes(self) -> int:
        return self.num_elements * self.dtype.size_bytes

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"
