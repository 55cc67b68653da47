"""sparsegen: a compiler that writes CUDA kernels for one sparse matrix at a time.

    import sparsegen
    kernel = sparsegen.compile(matrix, op="spmm", n=128, dtype="float32")
    y = kernel(x)            # NumPy in, NumPy out; GPU arrays in, GPU arrays out
    print(kernel.source)     # the generated CUDA

Importing sparsegen needs no GPU, PyCUDA or nvcc.
"""
from ._version import __version__
from .errors import (CompileError, FormatError, LaunchError, OptionsError, ShapeError, SparsegenError,
                     UnsupportedError)

from .analyze import MatrixStats, analyze  # (function shadows the submodule on purpose)
from .api import Kernel, compile  # noqa: A004
from .calibration import calibrate
from .io import load
from .select import select
from .spdnn import Result, SparseDNN

__all__ = ["compile", "calibrate", "load", "SparseDNN", "Result", "analyze", "select", "Kernel", "MatrixStats", "SparsegenError", "FormatError",
           "CompileError", "UnsupportedError", "OptionsError", "LaunchError", "ShapeError", "__version__"]
