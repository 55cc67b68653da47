"""Count local-memory spills (STL/LDL) and registers in the SASS of forced kernels (a probe).

    python lab/profile/sass_spills.py 'sddmm:k=256:family=dense_tile_sddmm' 'sddmm:k=256:family=dense_tile_sddmm,min_blocks=1'

Each argument is op:n-or-k=value:options (options as name=value, comma-separated; numbers as ints).
Compiles for a 2048 x 2048 random matrix at 50 %% density through sparsegen (emulate backend: no GPU
needed), then runs `cuobjdump -sass` and `-res-usage` on the cubin and prints, per kernel, its
registers, stack bytes and the count of STL and LDL instructions.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import sparsegen  # noqa: E402


def parse(text: str) -> tuple[str, dict, dict]:
    op, size, opts = (text.split(":") + [""])[:3]
    dim, value = size.split("=")
    options = {k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in (o.split("=") for o in opts.split(",") if o)}
    return op, {dim: int(value)}, options


def main() -> int:
    a = sp.random(2048, 2048, density=0.5, format="csr", dtype=np.float32, random_state=0)
    for arg in sys.argv[1:]:
        op, size, options = parse(arg)
        kernel = sparsegen.compile(a, op=op, backend="emulate", arch="sm_90", options=options, **size)
        cubin = kernel.cubin
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
            res = subprocess.run(["cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
        usage = " ".join(re.findall(r"REG:\d+|STACK:\d+|SHARED:\d+", res))
        stl, ldl = (len(re.findall(rf"\b{ins}\b", sass)) for ins in ("STL", "LDL"))
        print(f"{kernel.spec.name}: {usage} STL {stl} LDL {ldl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
