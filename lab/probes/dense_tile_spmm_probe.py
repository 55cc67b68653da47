"""dense_tile_spmm probe: the DLMC / random-square float32 shapes at n = 32-1024, the selected spec and
variants (resident blocks, K split, tile width) against cuBLAS SGEMM (TF32 off) in the same process,
each checked against float64 twice (the split-K workspace must come back zeroed).

    python lab/probes/dense_tile_spmm_probe.py [--few] [--out DIR]   # DIR/dense_tile_spmm_probe.{txt,json}
"""
import argparse, json, os, numpy as np, scipy.sparse as sp, torch
import sparsegen
from sparsegen.bench.timing import time_cuda
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
SHAPES = [(512, 2048), (2048, 512), (512, 4608), (512, 512), (1000, 2048), (2048, 2048), (4096, 4096), (8192, 8192), (2048, 1024), (256, 2304)]
ap = argparse.ArgumentParser()
ap.add_argument("--few", action="store_true", help="only resident blocks, K split x2 and /2, 128-column tiles")
ap.add_argument("--out", default=os.environ.get("OUT", "."))
ap.add_argument("--n", default="32,128,256,1024", help="comma-separated n")
ap.add_argument("--narrow", action="store_true", help="n <= 32 variants: 32- and 64-column tiles, 64 and 128 rows, K split x2 and /2")
args = ap.parse_args()


def variants_for(s0, args) -> list:
    """The option sets tried beside the selected spec s0 (the first, {})."""
    if args.narrow:
        return [{}, {"tile_m": 128}, {"tile_n": 64}, {"split_k": s0.split_k * 2}, {"split_k": max(1, s0.split_k // 2)}]
    variants = [{}, {"min_blocks": 4}]
    if args.few:
        return variants + [{"split_k": s0.split_k * 2}, {"split_k": max(1, s0.split_k // 2)}, {"tile_n": 128}]
    if s0.split_k > 1:
        variants += [{"split_k": max(1, s0.split_k // 2)}, {"split_k": s0.split_k * 2}]
    else:
        variants += [{"split_k": 2}]
    return variants + [{"tile_m": 128}, {"tile_n": 128}, {"tile_m": 128, "tile_n": 128, "min_blocks": 1}]


rows = []
out = open(os.path.join(args.out, "dense_tile_spmm_probe.txt"), "w")
def say(s):
    print(s, flush=True); out.write(s + "\n"); out.flush()
for (m, k) in SHAPES:
    A = sp.random(m, k, density=0.3, format="csr", random_state=m + k, dtype=np.float32)
    A.data = np.random.default_rng(1).standard_normal(A.nnz).astype(np.float32)
    W64 = torch.from_numpy(A.toarray()).to(dev).double()
    W32 = W64.float()
    for n in [int(v) for v in args.n.split(',')]:
        x = torch.randn(k, n, device=dev)
        ref = W64 @ x.double()
        y = torch.empty(m, n, device=dev)
        tb = time_cuda(lambda: torch.matmul(W32, x, out=y))["median_ms"]
        base = sparsegen.compile(A, op="spmm", n=n, options={"family": "dense_tile_spmm"})
        variants = variants_for(base.spec, args)
        seen = set()
        for v in variants:
            try:
                kern = sparsegen.compile(A, op="spmm", n=n, options={"family": "dense_tile_spmm", **v})
            except Exception as e:
                say(f"{m}x{k} n={n} {v} compile failed: {e}"); continue
            if kern.spec.name in seen:
                continue
            seen.add(kern.spec.name)
            got = kern(x, out=y)
            got = kern(x, out=y)  # twice: the workspace must come back zeroed
            err = float(torch.linalg.norm(got.double() - ref) / torch.linalg.norm(ref))
            t = time_cuda(lambda: kern(x, out=y))["median_ms"]
            got = kern(x, out=y)
            err2 = float(torch.linalg.norm(got.double() - ref) / torch.linalg.norm(ref))
            rows.append(dict(m=m, k=k, n=n, spec=kern.spec.name, variant=v, ms=t, cublas_ms=tb, err=max(err, err2)))
            say(f"{m:5d}x{k:<5d} n={n:5d} {kern.spec.name:60s} {t*1e3:8.2f} us  sgemm {tb*1e3:8.2f} us  x{tb/t:5.2f}  err {max(err,err2):.1e}  tf/s {2*m*k*n/t/1e9:6.1f}")
json.dump(rows, open(os.path.join(args.out, "dense_tile_spmm_probe.json"), "w"), indent=1)
