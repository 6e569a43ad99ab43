"""Tensor types: element dtype plus a static shape."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class DType(enum.Enum):
    """Element type of a tensor. Both are 4 bytes wide on the device."""

    F32 = "f32"
    U32 = "u32"

    @property
    def size_bytes(self) -> int:
        return 4

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(np.float32) if self is DType.F32 else np.dtype(np.uint32)


@dataclass(frozen=True)
class TensorType:
    """A static tensor type: ``shape`` (tuple of ints >= 1) and ``dtype``."""

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
