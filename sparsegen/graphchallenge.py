"""The Sparse DNN Graph Challenge: its files, its networks, its inputs and its reference inference.

    layers = read_network("data/graphchallenge")              # [W_1 .. W_L], float32 CSR, N x N
    y0 = read_inputs("sparse-images-1024.tsv", 1024)           # inputs x neurons
    result = reference_inference(layers, y0, BIAS[1024])        # Y_{l+1} = min(max(Y_l W_l + b, 0), 32)
    check(result, read_categories("neuron1024-l120-categories.tsv"))

Conventions (the challenge's): Y holds one input per ROW; `W_l[i, j]` (TSV line `i j v`, 1-based) joins
input neuron i to output neuron j; the bias is one constant per network size (`BIAS`), added to the
structural nonzeros of `Y W` (the MATLAB reference's rule); values are capped at `CAP`. The answer
("categories") is the 1-based ids of the inputs whose final row has any nonzero.

Also here: `mnist_inputs` (MNIST -> challenge-like inputs, the FFT-resample recipe that matches the
official images on 99.95 % of pixels) and `generate_network` (networks of the official kind, any size
16 * 2**m). Everything is vectorised: Python loops run over layers, digit positions or image batches,
never over rows, nonzeros or images.
"""
from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.signal
import scipy.sparse as sp

from . import io
from .errors import FormatError, ShapeError, SparsegenError
from .io._text import Tokens, read_bytes

__all__ = [
    "BIAS", "CAP", "WEIGHT", "ROW_NNZ", "MNIST_THRESHOLD", "BIAS_RULES", "Result",
    "bias_for", "layer_biases", "check_layer_bias", "read_network", "read_inputs", "read_categories", "mnist_inputs", "generate_network",
    "reference_inference", "categories_of", "check", "write_network", "write_inputs", "network_path",
    "GeneratedNetwork",
]

BIAS = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}
CAP = 32.0
WEIGHT = 1.0 / 16  # every official weight (written 6.250000e-02)
ROW_NNZ = 32  # nonzeros per row and per column of every official layer
BLOCKS = 16  # B_k = kron(ones(BLOCKS, BLOCKS), b_k): each base residue pattern repeats 16 times
MIN_GROUPS = 32  # neurons // 16 must be a power of two at least this
MNIST_THRESHOLD = 0.7234  # ~184.5/255: the best single threshold against the official images
BIAS_RULES = ("nonzero", "all")

_NAME = re.compile(r"^n(\d+)-l(\d+)\.tsv(\.gz)?$")
_WEIGHT_FORMAT = "%e"  # the official layers' value text: 6.250000e-02
_INPUT_FORMAT = "%g"  # the official inputs' value text: 1


def bias_for(neurons: int) -> float:
    """The challenge's bias for a network of this size; SparsegenError for a size it does not define."""
    try:
        return BIAS[int(neurons)]
    except KeyError:
        raise SparsegenError(f"the challenge defines a bias for {', '.join(map(str, BIAS))} neurons, "
                             f"not {neurons}; pass bias= explicitly") from None


# ---------------------------------------------------------------------------------------------- reading

def network_path(directory, neurons: int, layer: int, compress: bool = False) -> Path:
    """Where layer `layer` (1-based) of an N-neuron network lives: `n{N}-l{layer}.tsv[.gz]`."""
    return Path(directory) / f"n{neurons}-l{layer}.tsv{'.gz' if compress else ''}"


def read_network(directory, neurons: int | None = None, layers: int | None = None) -> list[sp.csr_matrix]:
    """Read W_1..W_L (float32 CSR, N x N) from `n{N}-l{l}.tsv[.gz]` files in `directory`.

    neurons=None: the one N the file names show (SparsegenError naming them when there are several).
    layers=None: every layer, which must run 1..L without a gap; layers=L: exactly W_1..W_L.
    """
    d = Path(os.fspath(directory))
    if not d.is_dir():
        raise FormatError(d, None, "a directory of n{N}-l{l}.tsv[.gz] layer files",
                          "no such directory" if not d.exists() else "a file")
    found = _layer_files(d)  # {N: {l: path}}
    if not found:
        raise FormatError(d, None, "files named n{N}-l{l}.tsv or n{N}-l{l}.tsv.gz", "none")
    sizes = ", ".join(map(str, sorted(found)))
    if neurons is None:
        if len(found) > 1:
            raise SparsegenError(f"{d} holds networks of {sizes} neurons; pass neurons= one of them")
        neurons = next(iter(found))
    elif int(neurons) not in found:
        raise SparsegenError(f"{d} has no n{neurons}-l{{l}}.tsv[.gz] files; its networks have {sizes} neurons")
    neurons = int(neurons)
    files = found[neurons]
    last = max(files) if layers is None else int(layers)
    if last < 1:
        raise ValueError(f"layers must be at least 1, not {layers}")
    missing = [l for l in range(1, last + 1) if l not in files]
    if missing:
        why = f"layers 1..{last} are asked for" if layers is not None else f"the directory has layers up to {last}"
        raise FormatError(network_path(d, neurons, missing[0]), None, f"a layer file ({why})",
                          f"no such file (nor .gz); {len(missing)} layer(s) missing")
    return [io.load(files[l], shape=(neurons, neurons)) for l in range(1, last + 1)]


def _layer_files(d: Path) -> dict[int, dict[int, Path]]:
    found: dict[int, dict[int, Path]] = {}
    for p in d.iterdir():  # over directory entries (files), not over matrix data
        m = _NAME.match(p.name)
        if not m or not p.is_file():
            continue
        n, l = int(m.group(1)), int(m.group(2))
        other = found.setdefault(n, {}).setdefault(l, p)
        if other != p:  # both .tsv and .tsv.gz: refuse to guess which one is meant
            raise SparsegenError(f"both {other.name} and {p.name} exist in {d}; remove one")
    return found


def read_inputs(path, neurons: int, count: int | None = None) -> sp.csr_matrix:
    """Inputs (inputs x neurons, float32 CSR) from TSV `input pixel value` (1-based) or Matrix Market.

    TSV: the row count is the largest input id unless `count` is given (ids must then be <= count).
    Matrix Market (pattern allowed: values 1): its size line must say `neurons` columns (and
    `count` rows when given).
    """
    neurons = int(neurons)
    if io.detect_format(path) != "tsv":
        a = io.load(path)
        if a.shape[1] != neurons or (count is not None and a.shape[0] != count):
            want = f"{'?' if count is None else count} x {neurons}"
            raise FormatError(path, None, f"an inputs x neurons matrix of {want}", f"{a.shape[0]} x {a.shape[1]}")
        return a
    if count is not None:
        return io.load(path, shape=(int(count), neurons))
    a = io.load(path)
    if a.shape[1] > neurons:
        io.load(path, shape=(a.shape[0], neurons))  # error path: parse again to name the offending line
    return _with_shape(a, (a.shape[0], neurons))


def read_categories(path) -> np.ndarray:
    """1-based input ids, one per line (an empty file holds none) -> sorted int64 array."""
    tok = Tokens(read_bytes(path), path)
    if tok.count == 0:
        return np.zeros(0, np.int64)
    tok.check_rows(1, "input id")
    ids = tok.ints(slice(None), "input id")
    bad = ids < 1
    if bad.any():
        tok.fail(int(np.argmax(bad)), "a 1-based input id (>= 1)", tok.text(int(np.argmax(bad))))
    order = np.argsort(ids, kind="stable")
    dup = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if len(dup):
        later = int(order[dup[0] + 1])
        tok.fail(later, "each input id once", f"{ids[later]} again (first on line {tok.line_of(int(order[dup[0]]))})")
    return ids[order]


def _with_shape(a: sp.csr_matrix, shape) -> sp.csr_matrix:
    """The same CSR arrays under a larger shape (more columns): no copy."""
    m = sp.csr_matrix((a.data, a.indices, a.indptr), shape=shape, copy=False)
    m.has_canonical_format = True  # a is canonical already
    return m


# ---------------------------------------------------------------------------------------------- inputs

def mnist_inputs(images_idx_path, side: int = 32, count: int | None = None,
                 threshold: float = MNIST_THRESHOLD, start: int = 0) -> sp.csr_matrix:
    """Challenge-like inputs from MNIST images: (count x side**2) float32 CSR of 1.0s (images
    start..count-1 when `start` is given, so that workers can share the images out).

    The recipe that best reproduces the official `sparse-images-1024` (see the MNIST data README):
    x = uint8 / 255, resampled 28 -> side on both axes by FFT (`scipy.signal.resample`, MATLAB
    `interpft`), pixels > threshold kept, each image flattened column-major (pixel p = r + side*c).
    For side 32 it matches the official first 1200 images on all but 622 of 1,228,800 pixels.
    """
    side = int(side)
    if side < 1:
        raise ValueError(f"side must be a positive integer, not {side}")
    if count is not None and (int(count) != count or count < 0):
        raise ValueError(f"count must be a non-negative integer or None, not {count!r}")
    # order="F" flattens each image transposed, so a reshape gives x[k, c, r]: resampling both axes
    # and flattening row-major then yields index c*side + r, the challenge's column-major order.
    x = io.load(images_idx_path, limit=count, order="F", dtype=np.float64)  # pixel/255, rounded once
    if count is not None and x.shape[0] < count:
        raise FormatError(images_idx_path, None, f"at least {count} images", f"{x.shape[0]}")
    if not 0 <= int(start) <= x.shape[0]:
        raise ValueError(f"start must be between 0 and {x.shape[0]}, not {start!r}")
    x = x[int(start):]
    k = x.shape[0]
    src = math.isqrt(x.shape[1])
    if src * src != x.shape[1]:
        raise FormatError(images_idx_path, None, "square images", f"{x.shape[1]} pixels per image")
    batch = max(1, (1 << 22) // (side * side))  # ~64 MB of complex spectra per batch
    rows, cols = [], []
    for a in range(0, k, batch):  # over batches of images; each batch is one vectorised resample
        img = x[a:a + batch].toarray().reshape(-1, src, src)
        y = scipy.signal.resample(scipy.signal.resample(img, side, axis=1), side, axis=2)
        r, c = np.nonzero(y.reshape(len(img), side * side) > threshold)  # row-major: canonical order
        rows.append(r + a)
        cols.append(c)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    return _pattern_csr(r, c.astype(np.int32), (k, side * side))


def _pattern_csr(rows, cols, shape) -> sp.csr_matrix:
    """Canonical float32 CSR of 1.0s from row-sorted (rows, cols) with sorted cols per row."""
    indptr = np.zeros(shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
    it = np.int32 if max(shape[1], len(cols)) < 2**31 else np.int64
    m = sp.csr_matrix((np.ones(len(cols), np.float32), cols.astype(it), indptr.astype(it)), shape=shape)
    m.has_canonical_format = True
    return m


# --------------------------------------------------------------------------------------------- networks

def generate_network(neurons: int, layers: int, seed: int = 0) -> list[sp.csr_matrix]:
    """Layers of the official kind: N x N float32 CSR, 32 nonzeros per row and column, all 1/16.

    With g = N/16 and K = log2(g): base pattern k (d = 2**(k-1)) is B_k = kron(ones(16, 16), b_k),
    b_k[i, j] != 0 iff (i - j) mod g in {0, d}; layer l uses k = ((l-1) mod K) + 1, and row r of layer
    l is row perm_c[r] of B_k, with one permutation per cycle c = (l-1) div K (cycle 0: identity;
    the others drawn in order from `default_rng(seed)`, so fewer layers give a prefix of more).
    For N = 1024 layers 1..6 are exactly the official ones. `GeneratedNetwork` makes the same layers
    one at a time, on demand.
    """
    return list(GeneratedNetwork(neurons, layers, seed))


class GeneratedNetwork:
    """`generate_network(neurons, layers, seed)` as a sequence that makes each layer when asked: a
    network of thousands of large layers need not sit in memory, and it pickles as its three numbers
    (worker processes make their own layers). network[i] is W_{i+1}."""

    def __init__(self, neurons: int, layers: int, seed: int = 0):
        self.groups = _groups(neurons)
        if int(layers) != layers or layers < 0:
            raise ValueError(f"layers must be a non-negative integer, not {layers!r}")
        self.neurons, self.layers, self.seed = int(neurons), int(layers), seed
        self._residues = [np.arange(self.neurons, dtype=np.int32) % self.groups]  # cycle 0: identity
        self._rng = None

    def __reduce__(self):
        return GeneratedNetwork, (self.neurons, self.layers, self.seed)

    def __len__(self) -> int:
        return self.layers

    def __iter__(self):
        return (self[i] for i in range(self.layers))

    def __getitem__(self, l: int) -> sp.csr_matrix:
        if not -self.layers <= l < self.layers:
            raise IndexError(f"layer {l} of a {self.layers}-layer network")
        c, k = divmod(l % self.layers, self.groups.bit_length() - 1)
        residue = self._residue(c)
        blocks = (np.arange(BLOCKS, dtype=np.int32) * self.groups)[None, :, None]
        a, b = residue, (residue - (1 << k)) % self.groups  # the row's two column residues: i and i - d
        pair = np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)  # sorted, so columns come sorted
        cols = (blocks + pair[:, None, :]).reshape(-1)  # column q*g + residue, q = 0..15
        indptr = np.arange(0, ROW_NNZ * self.neurons + 1, ROW_NNZ, dtype=np.int32)
        w = sp.csr_matrix((np.full(len(cols), WEIGHT, np.float32), cols, indptr),
                          shape=(self.neurons, self.neurons), copy=False)
        w.has_canonical_format = True
        return w

    def transposed(self, l: int) -> sp.csr_matrix:
        """W_{l+1}^T (rows = output neurons) made directly, without a transpose: output j = q*g + t
        takes the inputs whose residue is t or t + d (mod g), 16 of each, the same for every q."""
        if not -self.layers <= l < self.layers:
            raise IndexError(f"layer {l} of a {self.layers}-layer network")
        g = self.groups
        c, k = divmod(l % self.layers, g.bit_length() - 1)
        by_residue = np.argsort(self._residue(c), kind="stable").astype(np.int32).reshape(g, BLOCKS)
        t = np.arange(g)
        pattern = np.sort(np.hstack([by_residue, by_residue[(t + (1 << k)) % g]]), axis=1)  # (g, 32)
        cols = np.tile(pattern, (BLOCKS, 1)).reshape(-1)
        indptr = np.arange(0, ROW_NNZ * self.neurons + 1, ROW_NNZ, dtype=np.int32)
        a = sp.csr_matrix((np.full(cols.size, WEIGHT, np.float32), cols, indptr), shape=(self.neurons, self.neurons),
                          copy=False)
        a.has_canonical_format = True
        return a

    def _residue(self, cycle: int) -> np.ndarray:
        """Row residues of a cycle: the cycle's permutation (drawn in order from the seed) mod g."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        while len(self._residues) <= cycle:  # over cycles not drawn yet
            self._residues.append(self._rng.permutation(self.neurons).astype(np.int32) % self.groups)
        return self._residues[cycle]


def _groups(neurons) -> int:
    """g = neurons // 16, which must be a power of two >= MIN_GROUPS; ValueError naming the rule."""
    n = int(neurons) if int(neurons) == neurons else -1
    g = n // BLOCKS
    if n <= 0 or n % BLOCKS or g & (g - 1) or g < MIN_GROUPS:
        smallest = ", ".join(str(BLOCKS * MIN_GROUPS << i) for i in range(4))
        raise ValueError(f"neurons must be 16 * 2**m with 2**m >= {MIN_GROUPS} ({smallest}, ...; the challenge's "
                         f"are 1024, 4096, 16384 and 65536), not {neurons!r}")
    return g


# -------------------------------------------------------------------------------------------- inference

@dataclass(frozen=True, eq=False)
class Result:
    """What reference_inference returns.

    features: the final Y rows of the surviving inputs (CSR, in the order of `ids`);
    ids: their 0-based input indices (int64, ascending); alive_per_layer: survivors after each layer.
    """

    features: sp.csr_matrix
    ids: np.ndarray
    alive_per_layer: tuple[int, ...]


def layer_biases(bias, count: int) -> list[np.ndarray]:
    """One bias per layer: `bias` is a number (every neuron of every layer) or a sequence with one entry
    per layer, each a number or an array over that layer's output neurons (`check_layer_bias`)."""
    if not isinstance(bias, (list, tuple)) and np.ndim(bias) == 0:
        return [np.asarray(bias, np.float64)] * count
    entries = list(bias)
    if len(entries) != count:
        raise ShapeError(f"bias: expected a number or one entry per layer ({count}), got {len(entries)} entries")
    return [np.asarray(b) for b in entries]


def check_layer_bias(b: np.ndarray, layer: int, width: int) -> np.ndarray:
    """Layer `layer`'s bias (1-based in messages) as float64, 0-d or one per its `width` outputs."""
    if b.dtype.kind not in "biuf":
        raise ShapeError(f"bias of layer {layer}: expected real numbers, got dtype {b.dtype}")
    if b.ndim > 1 or (b.ndim == 1 and b.shape != (width,)):
        raise ShapeError(f"bias of layer {layer}: expected a number or an array of its {width} output neurons, "
                         f"got shape {b.shape}")
    return b.astype(np.float64)


def reference_inference(layers, inputs, bias, cap: float = CAP, dtype=np.float32,
                        bias_rule: str = "nonzero") -> Result:
    """Y_{l+1} = min(max(Y_l W_l + b_l, 0), cap), sparse x sparse layer by layer (SciPy SpGEMM).

    `bias`: one number, or one entry per layer (a number, or an array over the layer's output neurons:
    see `layer_biases`). Inputs whose row becomes all zero are dropped after each layer, as the
    challenge's reference does; a dropped input stays dropped (its answer is no survival).
    bias_rule "nonzero" adds b to the structural nonzeros of Y W only (the challenge MATLAB reference:
    `Z + logical(Z) .* b`); "all" adds it to every entry (dense semantics). They differ only where b > 0.
    """
    if bias_rule not in BIAS_RULES:
        raise ValueError(f"bias_rule must be one of {', '.join(BIAS_RULES)}, not {bias_rule!r}")
    layers = layers if hasattr(layers, "__getitem__") and hasattr(layers, "__len__") else list(layers)
    if not len(layers):
        raise ValueError("reference_inference needs at least one layer")
    dt = np.dtype(dtype)
    if dt.kind != "f" or dt.itemsize < 4:  # scipy.sparse has no float16 products
        raise ValueError(f"dtype must be float32 or float64, not {dt}")
    if not cap >= 0:
        raise ValueError(f"cap must be >= 0 (np.inf for none), not {cap}")
    biases = layer_biases(bias, len(layers))
    c = dt.type(cap)
    y = io.as_csr(inputs, dt)
    ids = np.arange(y.shape[0], dtype=np.int64)
    alive = []
    for l in range(1, len(layers) + 1):  # over layers (a lazy network makes each one here)
        w = io.as_csr(layers[l - 1], dt)
        if w.shape[0] != y.shape[1]:
            raise ShapeError(f"layer {l} is {w.shape[0]} x {w.shape[1]}, but its input has {y.shape[1]} "
                             f"neurons (rows of W_l are input neurons)")
        b = check_layer_bias(biases[l - 1], l, w.shape[1])
        y = _activate(y @ w, b.astype(dt), c, bias_rule)
        keep = np.diff(y.indptr) > 0
        if not keep.all():
            y, ids = y[keep], ids[keep]
        alive.append(len(ids))
    y.sort_indices()
    return Result(y, ids, tuple(alive))


def _activate(z: sp.csr_matrix, b: np.ndarray, cap, bias_rule: str) -> sp.csr_matrix:
    """min(max(z + b, 0), cap) under the bias rule (b: a number or one per column), as canonical-enough
    CSR without stored zeros."""
    if bias_rule == "all" and np.any(b > 0):
        # every entry of a column whose bias is positive, stored or not, becomes > 0: go dense
        y = z.toarray()
        y += b
        np.clip(y, 0, cap, out=y)
        return sp.csr_matrix(y)
    # "all" with b <= 0 equals "nonzero": an unstored entry gives max(0 + b, 0) = 0 either way.
    z.eliminate_zeros()  # MATLAB's logical(Z): a product that cancels to 0 gets no bias
    z.data += b if b.ndim == 0 else b[z.indices]
    np.clip(z.data, 0, cap, out=z.data)
    z.eliminate_zeros()  # the ReLU's zeros leave the structure, so dead rows are empty rows
    return z


def categories_of(result: Result) -> np.ndarray:
    """The answer: 1-based ids (int64, ascending) of the inputs with a nonzero final row."""
    return result.ids + 1


def check(result: Result, categories) -> bool:
    """Whether the result's categories are exactly `categories` (1-based ids, any order)."""
    return bool(np.array_equal(categories_of(result), np.sort(np.asarray(categories, dtype=np.int64))))


# ---------------------------------------------------------------------------------------------- writing

def write_network(layers, directory, compress: bool = False) -> list[Path]:
    """Write W_1..W_L as `n{N}-l{l}.tsv` (`.tsv.gz` with compress) in the official format.

    Lines `row<TAB>col<TAB>value`, 1-based, column-major order (sorted by col, then row) and values
    written `%e` (6.250000e-02), as the official files are; a value `%e` would not give back exactly
    is written with enough digits to. Creates the directory; returns the paths.
    """
    layers = [io.as_csr(w) for w in layers]
    if not layers:
        raise ValueError("write_network needs at least one layer")
    n = layers[0].shape[0]
    for l, w in enumerate(layers, 1):
        if w.shape != (n, n):
            raise ShapeError(f"layer {l} is {w.shape[0]} x {w.shape[1]}; every layer must be {n} x {n}")
    d = Path(os.fspath(directory))
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for l, w in enumerate(layers, 1):  # over layers
        t = w.tocsc()
        t.sort_indices()
        cols = np.repeat(np.arange(n, dtype=np.int64), np.diff(t.indptr))
        p = network_path(d, n, l, compress)
        _write_bytes(p, _tsv_bytes(t.indices, cols, t.data, _WEIGHT_FORMAT))
        paths.append(p)
    return paths


def write_inputs(matrix, path) -> Path:
    """Write inputs (inputs x neurons) as TSV `input<TAB>pixel<TAB>value`, 1-based, sorted by input
    then pixel, values `%g` (1 for the challenge's binary images); gzip'd when the name ends `.gz`."""
    a = io.as_csr(matrix)
    rows = np.repeat(np.arange(a.shape[0], dtype=np.int64), np.diff(a.indptr))
    p = Path(os.fspath(path))
    _write_bytes(p, _tsv_bytes(rows, a.indices, a.data, _INPUT_FORMAT))
    return p


def _write_bytes(p: Path, data: bytes):
    if p.name.lower().endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)  # mtime 0: same input, same bytes
    p.write_bytes(data)


def _tsv_bytes(rows, cols, values, fmt: str) -> bytes:
    """`row+1<TAB>col+1<TAB>value<NL>` lines for 0-based rows, cols; built as one byte array."""
    parts = [_digits(np.asarray(rows, np.int64) + 1), _const(b"\t", len(rows)),
             _digits(np.asarray(cols, np.int64) + 1), _const(b"\t", len(rows)),
             _value_texts(values, fmt), _const(b"\n", len(rows))]
    chars = np.concatenate([p[0] for p in parts], axis=1)
    keep = np.concatenate([p[1] for p in parts], axis=1)
    return chars[keep].tobytes()  # row-major: line after line, padding dropped


def _const(text: bytes, n: int):
    chars = np.broadcast_to(np.frombuffer(text, np.uint8), (n, len(text)))
    return chars, np.ones(chars.shape, bool)


def _digits(v: np.ndarray):
    """Decimal text of non-negative ints as (n, width) right-aligned bytes and a mask of the digits."""
    width = len(str(int(v.max(initial=0))))
    chars = np.empty((len(v), width), np.uint8)
    rest = v.copy()
    for k in range(width - 1, -1, -1):  # over digit positions, not over numbers
        chars[:, k] = rest % 10 + 48
        rest //= 10
    ndigits = np.ones(len(v), np.int64)
    for p in range(1, width):
        ndigits += v >= 10**p
    return chars, np.arange(width)[None, :] >= (width - ndigits)[:, None]


def _value_texts(values: np.ndarray, fmt: str):
    """Text of each value as (n, width) left-aligned bytes and a mask; formatted once per DISTINCT
    value (one for the challenge's files), with more digits where fmt would not round-trip."""
    uniq, inverse = np.unique(values, return_inverse=True)
    exact = f"%.{np.finfo(values.dtype).precision + 3}g"  # always reads back to the same value
    texts = [_value_text(u, fmt, exact, values.dtype.type) for u in uniq.tolist()]
    width = max((len(t) for t in texts), default=1)
    table = np.frombuffer(b"".join(t.ljust(width) for t in texts), np.uint8).reshape(len(texts), width)
    lengths = np.array([len(t) for t in texts], np.int64)
    return table[inverse], np.arange(width)[None, :] < lengths[inverse][:, None]


def _value_text(u: float, fmt: str, exact: str, ftype) -> bytes:
    s = fmt % u
    return (s if ftype(float(s)) == ftype(u) else exact % u).encode("ascii")
