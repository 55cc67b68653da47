"""Peer: Flash-LLM's own Tiled-CSL SpMM beside sparsegen's selected kernel and cuBLAS fp16, on the llm suite's W.

    python lab/peers/peer_flashllm.py [--lib .devpeer/libflashllm_peer.so] [--shapes 28672x7168,7168x7168]
                                       [--sparsity 0.7,0.8,0.9] [--n 8,16,32,64] [--split-k auto|1,2,7]
                                       [--workers J] [--max-minutes M] [--out FILE.json]
    python lab/peers/peer_flashllm.py --check [--shapes 7168x7168]   # CPU only: the library's
        Tiled-CSL encoder against a NumPy decoder, on small random matrices and the suite's W

Flash-LLM (Xia et al., VLDB 2024; github.com/AlibabaResearch/flash-llm) is the peer for skinny
unstructured-sparse products on tensor cores; its paper reports 1.4x / 1.7x / 2.1x cuBLAS at
70 / 80 / 90 % on an A100 (N = 8-64). This harness runs the peer's own code, not a re-implementation:
its kernel and host-side encoder (csrc/SpMM_API.cu, SpMM_SplitK_API and InitSparseMatrixA_API)
built for sm_90a into a shared library by lab/peers/build_flashllm.sh, with a small C shim
(lab/peers/flashllm_shim.cu) that ctypes loads here. Flash-LLM's source is never part of this
repository; `--lib` names the built library.

Per weight: W = the llm suite's own (sparsegen.bench.llm: the OPT-shaped Weight of that id, its
seed, values rounded to fp16), encoded once by Flash-LLM's InitSparseMatrixA_API (with its
"ahead of time sparse data reordering", what its benchmark times as Flash-LLM). Per N: X (K x N,
fp16, seeded), the fp32 reference W X, then (standalone_probe) cuBLAS fp16 (torch.matmul) and
sparsegen's selected kernel, then Flash-LLM at every split-K it accepts; all timed by
sparsegen.bench.timing.time_cuda (median, L2 warm, as the llm suite), each output checked against
the reference (relative Frobenius error <= 1e-2).

Flash-LLM's operand layouts (its MatMulUtilities.cuh and kernel_benchmark/spmm_test.cu): A (= W)
M x K row-major; B "K x N column-major", i.e. X^T as N x K row-major; C "M x N column-major", i.e.
Y^T as N x M row-major. These are an LLM's natural activations (tokens x hidden), so no transpose
is charged to it: X^T is made once per case outside the timed call, and Y is read back as C^T.
sparsegen takes X (K x N) and writes Y (M x N), also untimed layouts of its own.

Split-K: the API splits K's 64-wide tile columns (KT = K / 64) into Split_K ranges of
ceil(KT / Split_K) (the last one shorter) and, when Split_K > 1, sums the fp16 partial outputs
(workspace Split_K x M x N halves) with its SplitK_Reduction kernel; both kernels are in the timed
call. A split is valid when the last range is non-empty: (Split_K - 1) * ceil(KT / Split_K) < KT.
Flash-LLM hand-tunes it per shape (kernel_benchmark/benchmark.sh: SPLITK_THEIRS below), so with
--split-k auto every valid split in 1..12 is screened (short time_cuda runs, each output checked),
the two fastest and Flash-LLM's own choice for the shape are timed in full, and the fastest full
median is the peer's time ("flash-llm best"); Flash-LLM's own choice is reported beside it.

Kernel limits (its SpMM_API.cu): N in {8, 16, 32, 64} or a multiple of 128; M a multiple of 256 for
N <= 32 (256-row blocks) and of 128 for N = 64; K a multiple of 64; a 128 x 64 tile holds at most
4096 encoded values (its per-thread register buffer), i.e. the kernel needs >= 50 % sparsity tile
by tile (checked here from TileOffsets; a tile over it would be silently dropped by the kernel).
One read past the end the original code makes is kept harmless: the last block's prefetch reads one
TileOffsets entry past the array, so it is copied to the GPU with 8 extra entries (equal to its last).
Flash-LLM's own benchmark averages 10,000 back-to-back calls; here every kernel is timed alike, one
launch at a time (time_cuda), so the figures compare with the llm suite's, not with the paper's.

Encoding a large W is CPU work (sparsegen's encodings, Flash-LLM's encoder, the dense fp16 W for
cuBLAS): `--workers J` processes (the llm suite's Prefetcher, spawn) prepare the coming weights
ahead of the measurement: each regenerates W (seeded: bit-identical), saves the fp16 CSR, its dense
fp16 copy and Flash-LLM's encoding into a scratch folder, and compiles sparsegen's selected kernel
for every N there (plans, encodings, cubins), where the measuring process finds them warm.
Torch is imported only for the GPU run.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from sparsegen.bench import llm, prefetch, weights  # noqa: E402
from sparsegen.bench.records import seed_for  # noqa: E402
from sparsegen.bench.report import geomean  # noqa: E402

DEFAULT_LIB = ROOT / ".devpeer" / "libflashllm_peer.so"
LIB_ENV = "SPARSEGEN_PEER_FLASHLLM_LIB"   # how the preparing workers find the library
SHIM_VERSION = 1
TILE_M, TILE_K, VECTOR = 128, 64, 4
TILE_CAPACITY = 4096            # encoded values per 128 x 64 tile the kernel's registers hold
OFFSET_SLACK = 8                # extra TileOffsets entries on the GPU (see the docstring)
TOLERANCE = 1e-2
AUTO_SPLITS = tuple(range(1, 13))
SCREEN = {"min_runs": 5, "min_ms": 10.0, "warmup_runs": 2, "warmup_ms": 5.0}
FULL_TIMED = 2                  # screened splits timed in full, besides Flash-LLM's own choice
DEFAULT_SPARSITY = "0.7,0.8,0.9"
DEFAULT_N = "8,16,32,64"
# Flash-LLM's own split-K per OPT shape (M, K), from its kernel_benchmark/benchmark.sh
SPLITK_THEIRS = {(21504, 7168): 5, (7168, 7168): 7, (28672, 7168): 7, (7168, 28672): 7,
                 (27648, 9216): 2, (9216, 9216): 6, (36864, 9216): 3, (9216, 36864): 6,
                 (36864, 12288): 3, (12288, 12288): 9, (49152, 12288): 9, (12288, 49152): 9}


# --------------------------------------------------------------------------- the library

class FlashLLM:
    """ctypes view of libflashllm_peer.so (lab/peers/flashllm_shim.cu)."""

    def __init__(self, path):
        self.path = str(path)
        if not Path(self.path).is_file():
            raise SystemExit(f"{self.path}: no such library; build it with bash lab/peers/build_flashllm.sh")
        lib = ctypes.CDLL(self.path)
        u32p, i32p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_int)
        lib.flashllm_version.restype = ctypes.c_int
        lib.flashllm_init.restype = ctypes.c_int
        lib.flashllm_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(u32p), ctypes.POINTER(i32p), ctypes.POINTER(ctypes.c_longlong)]
        lib.flashllm_free.restype = None
        lib.flashllm_free.argtypes = [ctypes.c_void_p]
        lib.flashllm_spmm.restype = ctypes.c_int
        lib.flashllm_spmm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [ctypes.c_void_p, ctypes.c_int]
        lib.flashllm_error_string.restype = ctypes.c_char_p
        lib.flashllm_error_string.argtypes = [ctypes.c_int]
        if lib.flashllm_version() != SHIM_VERSION:
            raise SystemExit(f"{self.path}: shim version {lib.flashllm_version()}, expected {SHIM_VERSION}: rebuild it")
        self.lib = lib

    def encode(self, dense16: np.ndarray, reorder: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Flash-LLM's host encoder on a dense fp16 W (M x K, C order): (items uint32, TileOffsets int32)."""
        w = np.ascontiguousarray(dense16, dtype=np.float16)
        m, k = w.shape
        if m % TILE_M or k % TILE_K:
            raise ValueError(f"Flash-LLM's encoder needs M % {TILE_M} == 0 and K % {TILE_K} == 0, got {m}x{k}")
        if m * k >= 1 << 31:
            raise ValueError(f"{m}x{k}: Flash-LLM's encoder indexes W with int")
        items_p, offs_p = ctypes.POINTER(ctypes.c_uint32)(), ctypes.POINTER(ctypes.c_int)()
        count = ctypes.c_longlong()
        n_offs = self.lib.flashllm_init(w.ctypes.data, m, k, int(bool(reorder)), ctypes.byref(items_p),
                                        ctypes.byref(offs_p), ctypes.byref(count))
        try:
            offsets = np.ctypeslib.as_array(offs_p, shape=(n_offs,)).copy()
            items = (np.ctypeslib.as_array(items_p, shape=(count.value,)).copy() if count.value
                     else np.zeros(0, np.uint32))
        finally:
            self.lib.flashllm_free(ctypes.cast(items_p, ctypes.c_void_p))
            self.lib.flashllm_free(ctypes.cast(offs_p, ctypes.c_void_p))
        return items, offsets

    def spmm(self, stream: int, items_ptr: int, offs_ptr: int, bt_ptr: int, ct_ptr: int, m: int, n: int, k: int,
             ws_ptr: int, split_k: int) -> None:
        err = self.lib.flashllm_spmm(stream, items_ptr, offs_ptr, bt_ptr, ct_ptr, m, n, k, ws_ptr, split_k)
        if err:
            raise RuntimeError(f"SpMM_SplitK_API: {self.lib.flashllm_error_string(err).decode()} ({err})")


# --------------------------------------------------------------------------- format and rules

def dense_fp16(A) -> np.ndarray:
    """A CSR matrix as a dense fp16 array (its values are fp16-exact already: weights.as_dtype)."""
    m, k = A.shape
    d = np.zeros((m, k), np.float16)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(A.indptr))
    d[rows, A.indices] = A.data.astype(np.float16)
    return d


def decode(items: np.ndarray, offsets: np.ndarray, m: int, k: int) -> tuple[np.ndarray, dict]:
    """Tiled-CSL (Flash-LLM's InitSparseMatrixA_API output) back to a dense fp16 W, from the format
    as its kernel reads it: 128 x 64 tiles row-major; tile t's items are items[4 * offsets[t]:
    4 * offsets[t + 1]]; an item's low half is the fp16 value, its high half the int16 position
    row * 64 + (col ^ ((row % 8) << 3)) in the tile (the XOR is the shared-memory swizzle the
    kernel's ldmatrix reads undo). Padding items are zeros written over zeros. Raises ValueError on
    a malformed encoding; returns (W, facts)."""
    tk = k // TILE_K
    tiles = (m // TILE_M) * tk
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.size != tiles + 2 or offsets[0] != 0 or offsets[-1] != offsets[-2]:
        raise ValueError(f"TileOffsets: {offsets.size} entries (expected {tiles + 2}), first {offsets[0]}, "
                         f"last two {offsets[-2:].tolist()}")
    counts = np.diff(offsets[:tiles + 1]) * VECTOR
    if (counts < 0).any() or int(counts.sum()) != items.size:
        raise ValueError(f"TileOffsets cover {int(counts.sum())} items, the array has {items.size}")
    tile = np.repeat(np.arange(tiles, dtype=np.int64), counts)
    bits = (items & 0xFFFF).astype(np.uint16)
    vals = bits.view(np.float16)
    pos = (items >> 16).astype(np.int64)
    if (pos >= TILE_M * TILE_K).any():
        raise ValueError(f"position {int(pos.max())} outside a {TILE_M}x{TILE_K} tile")
    row, colp = pos // TILE_K, pos % TILE_K
    col = colp ^ ((row % 8) << 3)
    r = (tile // tk) * TILE_M + row
    c = (tile % tk) * TILE_K + col
    w = np.zeros((m, k), np.float16)
    nz = bits & 0x7FFF != 0
    flat = r[nz] * k + c[nz]
    if np.unique(flat).size != flat.size:
        raise ValueError("two nonzero items at one position")
    w.reshape(-1)[flat] = vals[nz]
    pad_flat = r[~nz] * k + c[~nz]
    if (w.reshape(-1)[pad_flat] != 0).any():
        raise ValueError("a padding item sits on a nonzero")
    facts = {"tiles": int(tiles), "items": int(items.size), "padding": int((~nz).sum()),
             "max_tile_items": int(counts.max()) if tiles else 0}
    return w, facts


def valid_split(k: int, split: int) -> bool:
    """SpMM_Kernel's ranges: ceil(KT / split) tile columns each, the last one what is left; it must
    not be empty (an empty or negative last range reads past its row's tiles)."""
    kt = k // TILE_K
    if split < 1 or split > kt:
        return False
    per = (kt - 1) // split + 1
    return (split - 1) * per < kt


def unsupported(m: int, n: int, k: int) -> str | None:
    """Why Flash-LLM's SpMM_SplitK_API cannot run M x K x N (None: it can)."""
    if not (n in (8, 16, 32, 64) or n % 128 == 0):
        return f"N = {n}: the API has kernels for N in 8, 16, 32, 64 and multiples of 128"
    block_m = 128 if n >= 64 else 256
    if m % block_m:
        return f"M = {m}: N = {n}'s kernel takes {block_m}-row blocks"
    if k % TILE_K:
        return f"K = {k}: not a multiple of {TILE_K}"
    if (m * n) % 256:
        return "M * N not a multiple of 256 (SplitK_Reduction's blocks)"
    return None


def split_candidates(text: str, m: int, k: int) -> list[int]:
    want = AUTO_SPLITS if text == "auto" else tuple(int(s) for s in text.split(",") if s.strip())
    out = [s for s in want if valid_split(k, s)]
    theirs = SPLITK_THEIRS.get((m, k))
    if text == "auto" and theirs is not None and theirs not in out and valid_split(k, theirs):
        out.append(theirs)
    return sorted(set(out))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for t in (s.strip().lower() for s in text.split(",") if s.strip()):
        mt = re.fullmatch(r"(\d+)\s*[x*]\s*(\d+)", t)
        if not mt:
            raise SystemExit(f"--shapes: {t!r} is not MxK")
        out.append((int(mt[1]), int(mt[2])))
    return list(dict.fromkeys(out))


def weight_of(m: int, k: int, s: float) -> llm.Weight:
    """The llm suite's Weight of that shape and sparsity (its id, hence its seed and its W)."""
    return llm.Weight(llm._opt_id((m, k), s), "opt", m, k, s)


# --------------------------------------------------------------------------- preparing weights

def load_prepared(folder: Path | None):
    """(A, dense, items, offsets, seconds) a preparing worker saved, or None."""
    if folder is None or not (folder / "done.json").is_file():
        return None
    import scipy.sparse as sp

    z = np.load(folder / "w.npz")
    A = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))
    A.has_sorted_indices = True
    info = json.loads((folder / "done.json").read_text())
    return (A, np.load(folder / "dense.npy"), np.load(folder / "items.npy"), np.load(folder / "offsets.npy"),
            info["encode_s"])


def prepare(job) -> dict:
    """Worker side (llm.Prefetcher job_fn): regenerate W, save it (fp16 CSR and dense) and Flash-LLM's
    encoding into job.cache_dir, then compile sparsegen's selected kernel for each N there.
    Returns {case key: {"seconds", "errors", "specs"}} as llm.precompile does."""
    import sparsegen

    folder = Path(job.cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    results = {}
    t0 = time.perf_counter()
    A = weights.as_dtype(job.cases[0].weight.load(), "float16")
    np.savez(folder / "w.npz", data=A.data, indices=A.indices, indptr=A.indptr, shape=np.array(A.shape))
    dense = dense_fp16(A)
    np.save(folder / "dense.npy", dense)
    t1 = time.perf_counter()
    items, offsets = FlashLLM(os.environ[LIB_ENV]).encode(dense)
    encode_s = time.perf_counter() - t1
    np.save(folder / "items.npy", items)
    np.save(folder / "offsets.npy", offsets)
    del dense
    (folder / "done.json").write_text(json.dumps({"encode_s": encode_s}))
    with prefetch.cache_dir(job.cache_dir):
        for case in job.cases:
            out = {"errors": {}, "specs": {}}
            try:
                kern = sparsegen.compile(A, op="spmm", n=case.n, dtype=case.dtype, arch=job.arch,
                                         backend="emulate")
                if job.cubin:
                    kern.cubin  # noqa: B018 - compiles and caches it
                out["specs"]["sparsegen"] = kern.spec.name
            except Exception as exc:  # the measuring process meets it again and records it
                out["errors"]["sparsegen"] = f"{type(exc).__name__}: {exc}"[:300]
            out["seconds"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            results[case.key] = out
    return results


# --------------------------------------------------------------------------- CPU check

def check(lib: FlashLLM, shapes) -> int:
    """The library's encoder against the NumPy decoder: small random matrices (uniform, a fully
    dense tile, an empty tile row, both encoders), then the suite's W for `shapes` at 70-90 %."""
    rng = np.random.default_rng(7)
    failures = 0

    def one(label, w, reorder=True):
        nonlocal failures
        t0 = time.perf_counter()
        items, offs = lib.encode(w, reorder=reorder)
        enc_s = time.perf_counter() - t0
        try:
            back, facts = decode(items, offs, *w.shape)
            ok = np.array_equal(back.view(np.uint16) & 0x7FFF != 0, w.view(np.uint16) & 0x7FFF != 0) \
                and np.array_equal(back[w != 0], w[w != 0])
            tile_nnz = (w != 0).reshape(w.shape[0] // TILE_M, TILE_M, -1, TILE_K).sum(axis=(1, 3)).ravel()
            ok = ok and np.array_equal(np.diff(offs[:-1]) * VECTOR, -(-tile_nnz // VECTOR) * VECTOR)
            msg = (f"{facts['items']} items, {facts['padding']} padding, fullest tile {facts['max_tile_items']}"
                   f"{' (over the kernel capacity ' + str(TILE_CAPACITY) + ')' if facts['max_tile_items'] > TILE_CAPACITY else ''}")
        except ValueError as exc:
            ok, msg = False, str(exc)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label:44} {'reorder' if reorder else 'no-reorder':10} {msg}; "
              f"encoded in {enc_s:.2f} s", flush=True)

    for m, k, density in ((256, 128, 0.3), (512, 256, 0.2), (384, 192, 0.1), (128, 64, 0.05)):
        w = np.where(rng.random((m, k)) < density, rng.standard_normal((m, k)), 0).astype(np.float16)
        for reorder in (True, False):
            one(f"random {m}x{k} density {density}", w, reorder)
    w = np.where(rng.random((256, 128)) < 0.3, rng.standard_normal((256, 128)), 0).astype(np.float16)
    w[:128, :64] = rng.standard_normal((128, 64)).astype(np.float16) + np.float16(8)  # a full tile (no zero)
    w[128:, :] = 0                                                                        # an empty tile row
    one("256x128, one full tile, empty tiles", w)
    for m, k in shapes:
        for s in (0.7, 0.8, 0.9):
            A = weights.as_dtype(weight_of(m, k, s).load(), "float16")
            one(f"llm W {m}x{k} at {s:g} ({A.nnz} nonzeros)", dense_fp16(A))
    for k in (7168, 9216, 12288, 28672, 36864, 49152):
        print(f"     K = {k}: valid splits in 1..16: {[s for s in range(1, 17) if valid_split(k, s)]}")
    print("check:", "PASS" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


# --------------------------------------------------------------------------- GPU run

def run(args, lib: FlashLLM) -> int:
    import torch

    from sparsegen.bench.timing import time_cuda
    from standalone_probe import print_header, print_rows, rel_error, start_case, time_baselines

    torch.zeros(1, device="cuda")  # the primary context first, then sparsegen's runtime
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    shapes = parse_shapes(args.shapes)
    sparsities = llm.parse_sparsities(args.sparsity)
    ns = [int(n) for n in args.n.split(",") if n.strip()]
    weights = [(m, k, s) for m, k in shapes for s in sparsities]
    cases = [llm.Case(weight_of(m, k, s), "float16", n) for m, k, s in weights for n in ns]
    doc = {"peer": "Flash-LLM (AlibabaResearch/flash-llm), SpMM_SplitK_API + InitSparseMatrixA_API",
           "device": torch.cuda.get_device_name(), "arch": arch, "torch": torch.__version__,
           "library": lib.path, "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "settings": {"shapes": [f"{m}x{k}" for m, k in shapes], "sparsities": list(sparsities), "n": ns,
                        "split_k": args.split_k, "tolerance": TOLERANCE, "screen": SCREEN,
                        "full_timed": FULL_TIMED, "workers": args.workers, "max_minutes": args.max_minutes,
                        "timer": "sparsegen.bench.timing.time_cuda median (L2 warm)"},
           "truncated": False, "cases": []}
    os.environ[LIB_ENV] = lib.path
    ahead_pf, root = None, None
    if args.workers > 0:
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="peer-flashllm-", dir=os.environ.get("TMPDIR")))
        import peer_flashllm  # the job function by its module's name, not __main__'s, for the spawned workers

        ahead_pf = llm.Prefetcher(cases, root, arch, args.workers, job_fn=peer_flashllm.prepare)
    print_header()
    t_start = time.perf_counter()
    try:
        for m, k, s in weights:
            if args.max_minutes and time.perf_counter() - t_start > 60 * args.max_minutes:
                doc["truncated"] = f"--max-minutes {args.max_minutes:g}: stopped before {m}x{k} at {s:g}"
                print(f"# {doc['truncated']}", flush=True)
                break
            wcases = [c for c in cases if c.weight.sparsity == s and (c.weight.rows, c.weight.cols) == (m, k)]
            folder = llm.case_dir(root, wcases[0]) if ahead_pf is not None else None
            t0 = time.perf_counter()
            ahead = [ahead_pf.take(c) for c in wcases] if ahead_pf is not None else []
            wait_s = time.perf_counter() - t0
            got = load_prepared(folder)
            if got is None:
                A = weights.as_dtype(weight_of(m, k, s).load(), "float16")
                dense = dense_fp16(A)
                t1 = time.perf_counter()
                items, offsets = lib.encode(dense)
                encode_s = time.perf_counter() - t1
            else:
                A, dense, items, offsets, encode_s = got
            setup_s = time.perf_counter() - t0
            tile_items = np.diff(offsets[:-1].astype(np.int64)) * VECTOR
            shape = f"{m}x{k}"
            wrec = {"shape": shape, "m": m, "k": k, "sparsity": s, "id": weight_of(m, k, s).id, "nnz": int(A.nnz),
                    "flashllm_items": int(items.size), "flashllm_bytes": int(items.nbytes + offsets.nbytes),
                    "flashllm_max_tile_items": int(tile_items.max()), "flashllm_encode_s": round(encode_s, 2),
                    "prepared_ahead": got is not None, "wait_s": round(wait_s, 2), "setup_s": round(setup_s, 2)}
            d_w = torch.from_numpy(dense).cuda()
            del dense
            d_items = torch.from_numpy(items.view(np.int32)).cuda()
            d_offs = torch.from_numpy(np.concatenate([offsets, np.full(OFFSET_SLACK, offsets[-1], offsets.dtype)])).cuda()
            print(f"# {shape} {s:g}: {A.nnz} nonzeros; Flash-LLM {items.size} items ({items.nbytes / 2**20:.1f} MiB), "
                  f"fullest tile {wrec['flashllm_max_tile_items']}, encoded in {encode_s:.1f} s; "
                  f"{'prepared ahead' if got is not None else 'prepared here'}, waited {wait_s:.1f} s", flush=True)
            for case, pre in zip(wcases, ahead or [None] * len(wcases)):
                n = case.n
                rec = dict(wrec, n=n)
                torch.manual_seed(seed_for(case.id, n, "X"))
                x, ref, cublas_ms, rows = start_case(d_w, n)
                rec["cublas_ms"] = cublas_ms
                rec["cublas_error"] = rel_error(torch.matmul(d_w, x), ref)
                t1 = time.perf_counter()
                try:
                    with prefetch.cache_dir(folder):
                        time_baselines(A, x, ref, ["selected"], rows)
                    _, sg_ms, sg_err, sg_spec = rows[-1]
                    rec["sparsegen"] = {"ms": sg_ms, "error": sg_err, "spec": sg_spec, "ok": sg_err <= TOLERANCE}
                except Exception as exc:  # noqa: BLE001 - a harness reports and goes on
                    rec["sparsegen"] = {"ms": None, "error": None, "spec": None, "ok": False,
                                        "note": f"{type(exc).__name__}: {exc}"[:500]}
                rec["sparsegen"]["compile_and_time_s"] = round(time.perf_counter() - t1, 2)
                if pre is not None:
                    rec["sparsegen"]["prepared"] = pre
                rec["flashllm"] = time_flashllm(lib, torch, time_cuda, rel_error, m, n, k, d_items, d_offs, x, ref,
                                                rows, args.split_k, tile_items)
                print_rows(shape, s, n, rows, cublas_ms)
                fl, sg = rec["flashllm"], rec["sparsegen"]
                rec["speedup"] = {
                    "flashllm_vs_cublas": cublas_ms / fl["ms"] if fl.get("ms") else None,
                    "flashllm_theirs_vs_cublas": cublas_ms / fl["theirs_ms"] if fl.get("theirs_ms") else None,
                    "sparsegen_vs_cublas": cublas_ms / sg["ms"] if sg.get("ms") else None,
                    "sparsegen_vs_flashllm": fl["ms"] / sg["ms"] if fl.get("ms") and sg.get("ms") else None}
                doc["cases"].append(rec)
                if ahead_pf is not None:
                    ahead_pf.release(case)
                del x, ref
                if args.out:
                    write(args.out, doc)
            del d_w, d_items, d_offs
            torch.cuda.empty_cache()
    finally:
        if ahead_pf is not None:
            doc["prefetch"] = ahead_pf.summary()
            ahead_pf.close()
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    doc["wall_s"] = round(time.perf_counter() - t_start, 1)
    doc["summary"] = summarize(doc["cases"])
    print_summary(doc["summary"])
    if args.out:
        write(args.out, doc)
        print(f"# wrote {args.out}")
    bad = [c for c in doc["cases"] if not c["flashllm"].get("ok") or not c["sparsegen"].get("ok")]
    if bad:
        print(f"# {len(bad)} case(s) with a failed, unsupported or wrong kernel: "
              + ", ".join(f"{c['shape']}/{c['sparsity']:g}/n{c['n']}" for c in bad[:12]))
    return 1 if bad or not doc["cases"] else 0


def time_flashllm(lib, torch, time_cuda, rel_error, m, n, k, d_items, d_offs, x, ref, rows, split_text,
                  tile_items) -> dict:
    """Every candidate split: one checked launch and a short timing; then the FULL_TIMED fastest
    correct ones and Flash-LLM's own choice timed in full. Appends the rows it prints."""
    why = unsupported(m, n, k)
    if why is None and tile_items.max() > TILE_CAPACITY:
        why = f"a tile holds {tile_items.max()} encoded values, over the kernel's {TILE_CAPACITY}"
    if why is not None:
        rows.append(("flash-llm", float("nan"), float("nan"), f"unsupported: {why}"))
        return {"ms": None, "ok": False, "note": why}
    splits = split_candidates(split_text, m, k)
    theirs = SPLITK_THEIRS.get((m, k))
    if not splits:
        rows.append(("flash-llm", float("nan"), float("nan"), f"no valid split in --split-k {split_text}"))
        return {"ms": None, "ok": False, "note": f"no valid split (K = {k}) in {split_text}"}
    bt = x.t().contiguous()                                   # B: N x K row-major (X^T), made untimed
    ct = torch.empty(n, m, dtype=torch.float16, device="cuda")  # C: N x M row-major (Y^T)
    ws = torch.empty(max(splits) * m * n, dtype=torch.float16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    ptrs = (d_items.data_ptr(), d_offs.data_ptr(), bt.data_ptr(), ct.data_ptr())
    screen, errors, failures = {}, {}, {}
    for split in splits:
        def launch(split=split):
            lib.spmm(stream, *ptrs, m, n, k, ws.data_ptr(), split)

        ct.fill_(float("nan"))
        try:
            launch()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            failures[split] = str(exc)[:300]
            continue
        errors[split] = rel_error(ct.t(), ref)
        if errors[split] <= TOLERANCE:  # a wrong split is reported, not timed
            screen[split] = time_cuda(launch, **SCREEN)["median_ms"]
    good = list(screen)
    out = {"splits": splits, "screen_ms": screen, "errors": errors, "failures": failures, "theirs": theirs}
    if not good:
        rows.append(("flash-llm", float("nan"), max(errors.values(), default=float("nan")),
                     f"no correct split among {splits}"))
        out.update(ms=None, ok=False, note="no split gave a correct output")
        return out
    full_set = sorted(good, key=screen.get)[:FULL_TIMED]
    if theirs in good and theirs not in full_set:
        full_set.append(theirs)
    full = {}
    for split in full_set:
        full[split] = time_cuda(lambda split=split: lib.spmm(stream, *ptrs, m, n, k, ws.data_ptr(), split))["median_ms"]
    best = min(full, key=full.get)
    out.update(full_ms=full, best_split=best, ms=full[best], error=errors[best], ok=True,
               theirs_ms=full.get(theirs), theirs_error=errors.get(theirs))
    wrong = [f"{sp} (err {errors[sp]:.1e})" for sp in errors if sp not in screen]
    wrong += [f"{sp} ({msg[:60]})" for sp, msg in failures.items()]
    rows.append((f"flash-llm best (split {best})", full[best], errors[best],
                 f"splits {','.join(map(str, splits))}; screened best {min(good, key=screen.get)}"
                 + (f"; WRONG {', '.join(wrong)}" if wrong else "")))
    if theirs in full and theirs != best:
        rows.append((f"flash-llm theirs (split {theirs})", full[theirs], errors[theirs], "kernel_benchmark/benchmark.sh"))
    return out


# --------------------------------------------------------------------------- summary

def summarize(cases: list) -> dict:
    def table(key, label=str):
        groups: dict = {}
        for c in cases:
            groups.setdefault(key(c), []).append(c)
        out = {}
        for g, cs in sorted(groups.items()):
            g = label(g)
            sp_ = [c["speedup"] for c in cs]
            out[str(g)] = {"cases": len(cs),
                           "flashllm_vs_cublas": geomean(x["flashllm_vs_cublas"] for x in sp_),
                           "flashllm_theirs_vs_cublas": geomean(x["flashllm_theirs_vs_cublas"] for x in sp_),
                           "sparsegen_vs_cublas": geomean(x["sparsegen_vs_cublas"] for x in sp_),
                           "sparsegen_vs_flashllm": geomean(x["sparsegen_vs_flashllm"] for x in sp_),
                           "flashllm_failed": sum(not c["flashllm"].get("ok") for c in cs),
                           "sparsegen_failed": sum(not c["sparsegen"].get("ok") for c in cs)}
        return out

    return {"by_sparsity": table(lambda c: c["sparsity"]), "by_n": table(lambda c: c["n"]),
            "by_sparsity_n": table(lambda c: (c["sparsity"], c["n"]), lambda g: f"{g[0]:g}/n{g[1]}"),
            "by_shape": table(lambda c: (c["m"], c["k"]), lambda g: f"{g[0]}x{g[1]}"), "all": table(lambda c: "all")}


def print_summary(summary: dict) -> None:
    def f(v):
        return "     -" if v is None else f"{v:6.2f}"

    titles = {"by_sparsity": "sparsity", "by_n": "N", "by_sparsity_n": "sparsity/N", "by_shape": "shape", "all": ""}
    print("\n# geomeans: x = cuBLAS fp16 time / time; sg/FL = Flash-LLM time / sparsegen time (> 1: sparsegen faster)")
    for key, title in titles.items():
        print(f"{title or 'all':>12} {'cases':>5} {'FL best':>7} {'FL own':>7} {'sparsegen':>9} {'sg/FL':>6}  failed FL/sg")
        for g, r in summary[key].items():
            print(f"{g:>12} {r['cases']:5d} {f(r['flashllm_vs_cublas']):>7} {f(r['flashllm_theirs_vs_cublas']):>7} "
                  f"{f(r['sparsegen_vs_cublas']):>9} {f(r['sparsegen_vs_flashllm']):>6}  "
                  f"{r['flashllm_failed']}/{r['sparsegen_failed']}")
        print()


def write(path, doc) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    tmp.replace(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=str(DEFAULT_LIB), help="the built Flash-LLM library (lab/peers/build_flashllm.sh)")
    ap.add_argument("--shapes", help="MxK list (default: the llm suite's 12 OPT shapes; with --check 7168x7168)")
    ap.add_argument("--sparsity", default=DEFAULT_SPARSITY, help="the llm suite's sparsities (0.5-0.9)")
    ap.add_argument("--n", default=DEFAULT_N, help="N list (Flash-LLM: 8, 16, 32, 64, multiples of 128)")
    ap.add_argument("--split-k", default="auto",
                    help=f"auto (every valid split in {AUTO_SPLITS[0]}..{AUTO_SPLITS[-1]} plus Flash-LLM's own) or a list")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes preparing the coming weights (default: the llm suite's; 0: in-process)")
    ap.add_argument("--max-minutes", type=float, help="start no new weight after this many minutes (then summarize)")
    ap.add_argument("--out", help="write the JSON here (after every case)")
    ap.add_argument("--check", action="store_true", help="CPU only: the encoder against the NumPy decoder")
    args = ap.parse_args()
    lib = FlashLLM(args.lib)
    if args.check:
        return check(lib, parse_shapes(args.shapes or "7168x7168"))
    args.shapes = args.shapes or ",".join(f"{m}x{k}" for m, k in llm.SHAPES)
    if args.workers is None:
        args.workers = prefetch.default_workers()
    return run(args, lib)


if __name__ == "__main__":
    sys.exit(main())
