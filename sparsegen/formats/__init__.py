"""Data layouts: each module encodes a canonical CSR matrix into a `Plan` and emulates a kernel on it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Plan:
    """An encoded matrix: named NumPy arrays exactly as the kernel reads them, and scalar constants.

    `arrays` are uploaded to the GPU once; `constants` are passed as kernel arguments or used
    for launch geometry. A plan never holds Python objects, so it round-trips through `.npz`.
    """

    format: str
    arrays: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))

    def describe(self) -> dict:
        return {
            "format": self.format,
            "constants": dict(self.constants),
            "arrays": {k: {"dtype": str(a.dtype), "shape": list(a.shape)} for k, a in self.arrays.items()},
        }


def as_index(a: np.ndarray) -> np.ndarray:
    """int32 copy-if-needed: every kernel addresses with 32-bit indices unless its spec says otherwise."""
    a = np.asarray(a)
    if a.size and (a.max() > np.iinfo(np.int32).max):
        raise OverflowError("index exceeds 32 bits")
    return np.ascontiguousarray(a, dtype=np.int32)
