"""Probe of the tiled tensor-core families against cuBLAS fp16 on OPT-like shapes (stand-in until the `llm` suite exists).

    python lab/probes/llm_probe.py   (on the GPU machine)
"""
import time, numpy as np, scipy.sparse as sp, torch, sparsegen
from sparsegen.bench.timing import time_cuda
rng = np.random.default_rng(0)
for (M, K) in [(7168, 7168), (28672, 7168)]:
    for s in (0.5, 0.7, 0.9):
        t = time.time()
        nnz = int(M * K * (1 - s))
        idx = rng.choice(M * K, size=nnz, replace=False)
        W = sp.csr_matrix((rng.standard_normal(nnz).astype(np.float16).astype(np.float32), (idx // K, idx % K)), shape=(M, K))
        Wd = torch.from_numpy(W.toarray()).cuda().half()
        for N in (16, 64):
            X = torch.randn((K, N), dtype=torch.float16, device="cuda")
            ref = (Wd.float() @ X.float())
            cub = time_cuda(lambda: torch.matmul(Wd, X))["median_ms"]
            line = f"{M}x{K} s={s} N={N} cublas={cub:.4f}"
            for fam in ("tiled_csl_spmm", "tiled_bitmap_spmm"):
                k = sparsegen.compile(W, n=N, dtype="float16", backend="gpu", options={"family": fam})
                Y = torch.empty((M, N), dtype=torch.float16, device="cuda")
                k(X, out=Y)
                err = ((Y.float() - ref).norm() / ref.norm()).item()
                ms = time_cuda(lambda: k(X, out=Y))["median_ms"]
                line += f" {fam.split('_')[1]}={ms:.4f} ({cub/ms:.2f}x, err {err:.1e})"
            print(line, f"[{time.time()-t:.0f}s]", flush=True)
