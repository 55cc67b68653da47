"""The correctness check behind unscatter_correctness.txt: each case (M,K,SPARSITY,N,ROUNDS, ROUNDS T for
the plan-sized default) compiled with and without options unscatter, called three times, errors and
the rows off by more than 5 % printed. Needs unscatter_not_kept.diff applied; run from the repository root."""
import sys, numpy as np, scipy.sparse as sp
sys.path.insert(0, '.')
import sparsegen
from tests.helpers import reference, rel_error
from tests.tiled_helpers import host_x, rounded_half
sys.path.insert(0, 'benchmarks')
from tiled_probe import random_weight
cases = [tuple(s.split(',')) for s in sys.argv[1:]]
for m, k, sparsity, n, us_opt in cases:
    m, k, sparsity, n = int(m), int(k), float(sparsity), int(n)
    us_opt = True if us_opt == 'T' else int(us_opt)
    a = random_weight(m, k, 1 - sparsity, seed=m + k)
    x = host_x(np.random.default_rng(0), k, n, "float16")
    ref = reference(rounded_half(a, "float16"), x.astype(np.float32), None, False)
    for us in (False, us_opt):
        kern = sparsegen.compile(a, n=n, dtype="float16", backend="gpu", options={"family": "tiled_csl_spmm", "unscatter": us})
        errs = []
        for rep in range(3):
            y = kern(x)
            errs.append(rel_error(y, ref))
        bad = np.abs(y.astype(np.float32) - ref) > 0.05 * (np.abs(ref) + 1)
        rows = np.flatnonzero(bad.any(axis=1))
        print(m, k, sparsity, n, kern.spec.name, ["%.1e" % e for e in errs], "bad rows", rows.size, rows[:8], flush=True)
