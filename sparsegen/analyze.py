"""Analyze stage: canonical CSR -> `MatrixStats`.

The numbers here become template constants (unroll counts, buffer sizes, index widths), so each
one has an exact definition below. Everything is vectorised with NumPy: no Python loop touches
rows, columns, nonzeros or tiles. "Nonzero" means a stored entry: explicit zeros in the CSR are
part of the structure and are counted.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .errors import FormatError, SparsegenError

__all__ = [
    "LengthStats", "Footprint", "TileStats", "MatrixStats",
    "analyze", "row_lengths", "col_lengths", "footprints", "slice_widths", "ell_padding",
    "structure_hash", "values_hash", "index_bits",
    "FOOTPRINT_BLOCK_ROWS", "ELL_SLICE_ROWS", "TILE_ROWS", "TILE_COLS", "DENSITY_BINS",
]

FOOTPRINT_BLOCK_ROWS = (32, 64, 128, 256)
ELL_SLICE_ROWS = 32
TILE_ROWS = 128
TILE_COLS = 64
DENSITY_BINS = 10
PERCENTILES = (50, 90, 99)

# Tile counts use a dense bincount only while its array stays O(nnz) (or small); beyond that a
# sort of the nonempty tile keys, so a huge, very sparse matrix never allocates one slot per tile.
_MIN_BINCOUNT_TILES = 1 << 20


# ---------------------------------------------------------------------------------------------
# Value types


@dataclass(frozen=True)
class LengthStats:
    """Distribution of row (or column) lengths. `std` is the population std; `cov` = std/mean,
    0.0 when the mean is 0; `empty` counts zero-length rows (columns). All 0 for an empty axis."""

    min: int
    max: int
    mean: float
    std: float
    cov: float
    empty: int

    @classmethod
    def of(cls, lengths: np.ndarray) -> "LengthStats":
        if lengths.size == 0:
            return cls(0, 0, 0.0, 0.0, 0.0, 0)
        mean = float(lengths.mean())
        std = float(lengths.std())
        return cls(
            min=int(lengths.min()),
            max=int(lengths.max()),
            mean=mean,
            std=std,
            cov=std / mean if mean > 0 else 0.0,
            empty=int(np.count_nonzero(lengths == 0)),
        )

    @classmethod
    def of_counts(cls, counts: np.ndarray, size: int) -> "LengthStats":
        """The stats of `size` lengths of which only the nonzero ones, `counts`, are given: no
        array of `size` entries is made (a huge, nearly empty axis costs O(len(counts)))."""
        if size == 0:
            return cls(0, 0, 0.0, 0.0, 0.0, 0)
        empty = size - counts.size
        mean = float(counts.sum()) / size
        # population variance: the nonzero lengths' squared deviations plus the empty ones' mean**2
        var = (float(np.square(counts - mean).sum()) + empty * mean * mean) / size
        std = float(np.sqrt(var))
        return cls(
            min=0 if empty else int(counts.min()),
            max=int(counts.max()) if counts.size else 0,
            mean=mean,
            std=std,
            cov=std / mean if mean > 0 else 0.0,
            empty=int(empty),
        )

    def to_dict(self) -> dict:
        return {"min": self.min, "max": self.max, "mean": self.mean, "std": self.std,
                "cov": self.cov, "empty": self.empty}

    @classmethod
    def from_dict(cls, d: dict) -> "LengthStats":
        return cls(int(d["min"]), int(d["max"]), float(d["mean"]), float(d["std"]),
                   float(d["cov"]), int(d["empty"]))


@dataclass(frozen=True)
class Footprint:
    """Distinct columns touched by each block of `block_rows` consecutive rows (see `footprints`),
    reduced to the mean and max over ALL blocks: the last block may be short, and blocks with no
    nonzeros count with footprint 0. A matrix with no rows has no blocks: mean 0.0, max 0."""

    block_rows: int
    mean: float
    max: int

    def to_dict(self) -> dict:
        return {"block_rows": self.block_rows, "mean": self.mean, "max": self.max}

    @classmethod
    def from_dict(cls, d: dict) -> "Footprint":
        return cls(int(d["block_rows"]), float(d["mean"]), int(d["max"]))


@dataclass(frozen=True)
class TileStats:
    """Nonzeros per `tile_rows` x `tile_cols` tile. Edge tiles are smaller and use their real area.

    tiles: ceil(m/tile_rows) * ceil(n/tile_cols); nonempty: tiles with >= 1 nonzero; max_nnz: most
    nonzeros in one tile; mean_nnz: nnz / tiles (over ALL tiles, 0.0 when there are none);
    dense_share: share of all tiles with nnz > 0.5 * area; density_hist: tile count per density
    bin [0, .1), [.1, .2), ..., [.9, 1.0] (density 1.0 falls in the last bin, empty tiles in bin 0).
    """

    tile_rows: int
    tile_cols: int
    tiles: int
    nonempty: int
    max_nnz: int
    mean_nnz: float
    dense_share: float
    density_hist: tuple[int, ...]
    # mean density of the nonempty tiles in each bin (0.0 where none): a uniform pattern of density
    # 0.1 fills bins 0 and 1 about half each, and their centres (0.05, 0.15) would spread it 3x
    density_means: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        return {"tile_rows": self.tile_rows, "tile_cols": self.tile_cols, "tiles": self.tiles,
                "nonempty": self.nonempty, "max_nnz": self.max_nnz, "mean_nnz": self.mean_nnz,
                "dense_share": self.dense_share, "density_hist": list(self.density_hist),
                "density_means": list(self.density_means)}

    @classmethod
    def from_dict(cls, d: dict) -> "TileStats":
        return cls(int(d["tile_rows"]), int(d["tile_cols"]), int(d["tiles"]), int(d["nonempty"]),
                   int(d["max_nnz"]), float(d["mean_nnz"]), float(d["dense_share"]),
                   tuple(int(c) for c in d["density_hist"]), tuple(float(v) for v in d.get("density_means", ())))


@dataclass(frozen=True)
class MatrixStats:
    """Everything selection and the templates may know about one matrix.

    density: nnz / (m*n), 0.0 for an empty shape. row_length_percentiles: {"p50","p90","p99"} of
    the row lengths (NumPy's linear interpolation; 0.0 without rows). footprint: one `Footprint`
    per block size in FOOTPRINT_BLOCK_ROWS. ell_padding: see `ell_padding`. index_bits: see
    `index_bits`. dtype: NumPy name of the value dtype.
    """

    shape: tuple[int, int]
    nnz: int
    density: float
    row_lengths: LengthStats
    col_lengths: LengthStats
    row_length_percentiles: dict[str, float]
    footprint: tuple[Footprint, ...]
    ell_padding: float
    tiles: TileStats
    structure_hash: str
    values_hash: str
    index_bits: int
    dtype: str

    def footprint_for(self, block_rows: int) -> Footprint:
        """The `Footprint` of one block size; KeyError when it was not analysed."""
        for f in self.footprint:
            if f.block_rows == block_rows:
                return f
        raise KeyError(block_rows)

    def to_dict(self) -> dict:
        return {
            "shape": list(self.shape),
            "nnz": self.nnz,
            "density": self.density,
            "row_lengths": self.row_lengths.to_dict(),
            "col_lengths": self.col_lengths.to_dict(),
            "row_length_percentiles": dict(self.row_length_percentiles),
            "footprint": [f.to_dict() for f in self.footprint],
            "ell_padding": self.ell_padding,
            "tiles": self.tiles.to_dict(),
            "structure_hash": self.structure_hash,
            "values_hash": self.values_hash,
            "index_bits": self.index_bits,
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "MatrixStats":
        m, n = d["shape"]
        return cls(
            shape=(int(m), int(n)),
            nnz=int(d["nnz"]),
            density=float(d["density"]),
            row_lengths=LengthStats.from_dict(d["row_lengths"]),
            col_lengths=LengthStats.from_dict(d["col_lengths"]),
            row_length_percentiles={str(k): float(v)
                                    for k, v in d["row_length_percentiles"].items()},
            footprint=tuple(Footprint.from_dict(f) for f in d["footprint"]),
            ell_padding=float(d["ell_padding"]),
            tiles=TileStats.from_dict(d["tiles"]),
            structure_hash=str(d["structure_hash"]),
            values_hash=str(d["values_hash"]),
            index_bits=int(d["index_bits"]),
            dtype=str(d["dtype"]),
        )


# ---------------------------------------------------------------------------------------------
# Public helpers (reused by encoders)


def row_lengths(csr) -> np.ndarray:
    """Nonzeros per row, int64, length m."""
    return np.diff(np.asarray(csr.indptr, dtype=np.int64))


def col_lengths(csr) -> np.ndarray:
    """Nonzeros per column, int64, length n."""
    n = csr.shape[1]
    return np.bincount(csr.indices[: csr.nnz], minlength=n).astype(np.int64, copy=False)


def footprints(csr, block_rows: int) -> np.ndarray:
    """Distinct columns touched by each block of `block_rows` consecutive rows.

    int64 array of length ceil(m / block_rows); the last block may be short; a block without
    nonzeros has footprint 0.
    """
    rows, first = _column_major_rows(csr)
    return _block_footprints(rows, first, csr.shape[0], block_rows)


def slice_widths(lengths: np.ndarray, slice_rows: int = ELL_SLICE_ROWS) -> np.ndarray:
    """Longest row of each slice of `slice_rows` consecutive rows (the last may be short)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    pad = (-lengths.size) % slice_rows
    # Zero rows appended to fill the last slice cannot change its maximum.
    return np.pad(lengths, (0, pad)).reshape(-1, slice_rows).max(axis=1)


def ell_padding(lengths: np.ndarray, slice_rows: int = ELL_SLICE_ROWS) -> float:
    """Sliced-ELL storage over nonzeros: sum over slices of rows_in_slice * slice_width / nnz.

    rows_in_slice is `slice_rows` except for the last slice, which uses its real row count. 1.0
    means no padding; 1.0 also when there are no nonzeros (nothing to pad).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    nnz = int(lengths.sum())
    if nnz == 0:
        return 1.0
    widths = slice_widths(lengths, slice_rows)
    rows_in_slice = np.full(widths.size, slice_rows, dtype=np.int64)
    rows_in_slice[-1] = lengths.size - slice_rows * (widths.size - 1)
    return float(int((rows_in_slice * widths).sum()) / nnz)


def index_bits(shape: tuple[int, int]) -> int:
    """Narrowest index width (16, 32 or 64 bits) that can address any row or column."""
    extent = max(shape) if len(shape) else 0
    if extent <= 1 << 16:
        return 16
    return 32 if extent <= 1 << 32 else 64


# ---------------------------------------------------------------------------------------------
# Hashes


# An array past this many bytes hashes as the sha256 digests of its pieces of this size, computed
# side by side (hashlib releases the GIL): a warm compile of a large matrix is mostly its hashes.
HASH_PIECE = 32 << 20


def _sha256(header: str, arrays) -> str:
    """Hex sha256 of `header` (its "v1" made "v2" where some array is past HASH_PIECE bytes) and then
    each array's bytes: in v2, an array past HASH_PIECE contributes the digests of its HASH_PIECE
    pieces in order instead (a fixed split: the same digest whatever the threads)."""
    views = [memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in arrays]
    pieced = any(v.nbytes > HASH_PIECE for v in views)
    h = hashlib.sha256((header.replace(".v1 ", ".v2 ", 1) if pieced else header).encode())
    for v in views:
        if v.nbytes <= HASH_PIECE:
            h.update(v)
            continue
        from concurrent.futures import ThreadPoolExecutor

        pieces = [v[i: i + HASH_PIECE] for i in range(0, v.nbytes, HASH_PIECE)]
        with ThreadPoolExecutor(max_workers=min(8, len(pieces))) as pool:
            h.update(b"".join(pool.map(lambda p: hashlib.sha256(p).digest(), pieces)))
    return h.hexdigest()


def structure_hash(csr) -> str:
    """Hex sha256 of the sparsity pattern: a header (shape, canonical index dtypes), then indptr
    as little-endian int64 and indices as little-endian int32 (int64 only past 2**31 columns);
    an array past HASH_PIECE bytes as its pieces' digests (`_sha256`).

    Independent of the values and of the index dtypes the CSR happens to use.
    """
    m, n = csr.shape
    nnz = int(csr.indptr[-1]) if len(csr.indptr) else 0
    idx_dtype = np.dtype("<i4") if n <= 1 << 31 else np.dtype("<i8")
    # ascontiguousarray copies only when dtype or layout differ: the common case hashes in place.
    indptr = np.ascontiguousarray(csr.indptr, dtype="<i8")
    indices = np.ascontiguousarray(csr.indices[:nnz], dtype=idx_dtype)
    return _sha256(f"sparsegen.structure.v1 shape={m},{n} indptr=<i8 indices={idx_dtype.str}\n", (indptr, indices))


def values_hash(csr) -> str:
    """Hex sha256 of the values: a header with the (little-endian) dtype, then the data bytes (past
    HASH_PIECE bytes, their pieces' digests: `_sha256`).

    The same numbers in float32 and float64 hash differently, on purpose: they compile differently.
    """
    nnz = int(csr.indptr[-1]) if len(csr.indptr) else 0
    data = csr.data[:nnz]
    dtype = data.dtype.newbyteorder("<")  # a no-op for native little-endian and 1-byte types
    return _sha256(f"sparsegen.values.v1 dtype={dtype.str}\n", (np.ascontiguousarray(data, dtype=dtype),))


# ---------------------------------------------------------------------------------------------
# The stage


def analyze(matrix) -> MatrixStats:
    """Statistics of a canonical CSR matrix (sorted indices, no duplicates).

    Memory is O(rows + nnz): per-column and per-tile arrays are used only while they stay
    O(nnz) or small. A matrix too large for this machine is a SparsegenError, not a MemoryError.
    """
    csr = _require_canonical_csr(matrix)
    try:
        return _analyze(csr)
    except MemoryError as e:
        m, n = csr.shape
        raise SparsegenError(f"analyzing a {m} x {n} matrix with {csr.nnz} nonzeros ran out of memory "
                             f"({e or 'MemoryError'})") from None


def _analyze(csr) -> MatrixStats:
    m, n = (int(x) for x in csr.shape)
    nnz = int(csr.nnz)
    rl = row_lengths(csr)
    rows_cm, first = _column_major_rows(csr)

    fps = []
    for b in FOOTPRINT_BLOCK_ROWS:
        per_block = _block_footprints(rows_cm, first, m, b)
        fps.append(Footprint(b, float(per_block.mean()) if per_block.size else 0.0,
                             int(per_block.max()) if per_block.size else 0))

    if m:
        pct = np.percentile(rl, PERCENTILES)
        percentiles = {f"p{p}": float(v) for p, v in zip(PERCENTILES, pct)}
    else:
        percentiles = {f"p{p}": 0.0 for p in PERCENTILES}

    return MatrixStats(
        shape=(m, n),
        nnz=nnz,
        density=nnz / (m * n) if m * n else 0.0,
        row_lengths=LengthStats.of(rl),
        col_lengths=_col_length_stats(csr, first),
        row_length_percentiles=percentiles,
        footprint=tuple(fps),
        ell_padding=ell_padding(rl, ELL_SLICE_ROWS),
        tiles=_tile_stats(csr, TILE_ROWS, TILE_COLS),
        structure_hash=structure_hash(csr),
        values_hash=values_hash(csr),
        index_bits=index_bits((m, n)),
        dtype=csr.dtype.name,
    )


# ---------------------------------------------------------------------------------------------
# Internals


def _require_canonical_csr(matrix):
    if not (sp.issparse(matrix) and matrix.format == "csr"):
        raise TypeError(f"analyze() needs a scipy.sparse CSR matrix, got {type(matrix).__name__}")
    if matrix.ndim != 2:
        raise FormatError(None, None, "a 2-D CSR matrix", f"{matrix.ndim} dimensions")
    # The hashes and the footprint algorithm depend on canonical order; a cheap O(nnz) check.
    if not matrix.has_canonical_format:
        raise FormatError(None, None, "canonical CSR (sorted indices, no duplicates)",
                          "unsorted or duplicate column indices")
    return matrix


def _by_columns(csr) -> bool:
    """Whether per-column arrays (length n) stay O(nnz) or small; else columns are found by sorting."""
    return csr.shape[1] <= max(2 * csr.nnz, _MIN_BINCOUNT_TILES)


def _column_major_rows(csr) -> tuple[np.ndarray, np.ndarray]:
    """Row index of every nonzero in column-major order, and a mask of each column's first one.

    scipy's csr->csc conversion (a counting sort) emits rows in ascending order within each
    column, which `_block_footprints` relies on; so does the stable sort by column used instead
    when the matrix has far more columns than nonzeros (no array of n entries).
    """
    if _by_columns(csr):
        csc = csr.tocsc()
        ptr = np.asarray(csc.indptr, dtype=np.int64)
        rows = csc.indices[: ptr[-1]]
        first = np.zeros(rows.size, dtype=bool)
        first[ptr[:-1][ptr[1:] > ptr[:-1]]] = True
        return rows, first
    nnz = int(csr.nnz)
    cols = csr.indices[:nnz]
    order = np.argsort(cols, kind="stable")  # CSR order is row-major: rows ascend within each column
    rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), row_lengths(csr))[order]
    c = cols[order]
    first = np.ones(nnz, dtype=bool)
    first[1:] = c[1:] != c[:-1]
    return rows, first


def _col_length_stats(csr, first: np.ndarray) -> LengthStats:
    """Column-length stats; past O(nnz) columns, from the nonempty columns' counts alone."""
    if _by_columns(csr):
        return LengthStats.of(col_lengths(csr))
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, first.size))
    return LengthStats.of_counts(counts, csr.shape[1])


def _block_footprints(rows: np.ndarray, first: np.ndarray, m: int, block_rows: int) -> np.ndarray:
    # Within one column rows ascend, so equal (column, block) pairs are adjacent: each pair's first
    # occurrence is one distinct column of that block. No sort needed.
    nblocks = -(-m // block_rows)
    blocks = rows // block_rows
    new = first.copy()
    new[1:] |= blocks[1:] != blocks[:-1]
    return np.bincount(blocks[new], minlength=nblocks).astype(np.int64, copy=False)


def _tile_stats(csr, tile_rows: int, tile_cols: int) -> TileStats:
    m, n = csr.shape
    nnz = int(csr.nnz)
    ntr, ntc = -(-m // tile_rows), -(-n // tile_cols)
    tiles = ntr * ntc
    keys, counts = _tile_counts(csr, tile_rows, tile_cols, ntr, ntc, nnz)

    tr, tc = keys // ntc, keys % ntc
    area = (np.minimum(tile_rows, m - tr * tile_rows)
            * np.minimum(tile_cols, n - tc * tile_cols))
    # Integer arithmetic keeps the 0.5 threshold and the bin edges exact.
    dense = int(np.count_nonzero(2 * counts > area))
    bins = np.minimum(DENSITY_BINS * counts // np.maximum(area, 1), DENSITY_BINS - 1)
    hist = np.bincount(bins, minlength=DENSITY_BINS)
    sums = np.bincount(bins, weights=counts / np.maximum(area, 1), minlength=DENSITY_BINS)
    means = sums / np.maximum(hist, 1)  # over the nonempty tiles, before the empty ones join bin 0
    hist[0] += tiles - keys.size
    return TileStats(
        tile_rows=tile_rows,
        tile_cols=tile_cols,
        tiles=tiles,
        nonempty=int(keys.size),
        max_nnz=int(counts.max()) if counts.size else 0,
        mean_nnz=nnz / tiles if tiles else 0.0,
        dense_share=dense / tiles if tiles else 0.0,
        density_hist=tuple(int(c) for c in hist),
        density_means=tuple(float(v) for v in means),
    )


def _bincount_fits(tiles: int, nnz: int) -> bool:
    return tiles <= max(2 * nnz, _MIN_BINCOUNT_TILES)


def _tile_counts(csr, tile_rows, tile_cols, ntr, ntc, nnz) -> tuple[np.ndarray, np.ndarray]:
    """(key, nnz) of each nonempty tile, key = tile_row * ntc + tile_col, keys ascending."""
    m = csr.shape[0]
    indptr = np.asarray(csr.indptr, dtype=np.int64)
    # Nonzeros per tile row from indptr at tile-row boundaries: no per-nonzero row array needed.
    per_tile_row = np.diff(indptr[np.r_[0:m:tile_rows, m]])
    key = np.repeat(np.arange(ntr, dtype=np.int64) * ntc, per_tile_row)
    key += csr.indices[:nnz] // tile_cols
    if _bincount_fits(ntr * ntc, nnz):
        full = np.bincount(key, minlength=ntr * ntc)
        keys = np.flatnonzero(full)
        return keys, full[keys]
    return np.unique(key, return_counts=True)
