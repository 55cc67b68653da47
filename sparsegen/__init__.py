"""sparsegen: a compiler that writes CUDA kernels for one sparse matrix at a time.

    import sparsegen
    kernel = sparsegen.compile(matrix, op="spmm", n=128, dtype="float32")
    y = kernel(x)            # NumPy in, NumPy out; GPU arrays in, GPU arrays out
    print(kernel.source)     # the generated CUDA

Importing sparsegen needs no GPU, PyCUDA or nvcc.
"""
__version__ = "0.1.0"

from .errors import (CompileError, FormatError, LaunchError, ShapeError,  # noqa: E402
                     SparsegenError, UnsupportedError)

from .analyze import MatrixStats, analyze  # noqa: E402  (function shadows the submodule on purpose)
from .api import Kernel, compile  # noqa: E402,A004
from .calibration import calibrate  # noqa: E402
from .io import load  # noqa: E402
from .select import select  # noqa: E402
from .spdnn import Result, SparseDNN  # noqa: E402

__all__ = ["compile", "calibrate", "load", "SparseDNN", "Result", "analyze", "select", "Kernel", "MatrixStats", "SparsegenError", "FormatError",
           "CompileError", "UnsupportedError", "LaunchError", "ShapeError", "__version__"]
