"""sparsegen.io: every reader's round trips, every malformed input's message, real data files."""
from __future__ import annotations

import csv
import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsegen.errors import FormatError, SparsegenError
from sparsegen.io import as_csr, detect_format, load

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ helpers

@pytest.fixture(scope="module")
def data_dir() -> Path:
    """The shared data folder (SPARSEGEN_DATA overrides it); skips when it is absent."""
    root = Path(os.environ.get("SPARSEGEN_DATA", REPO / ".." / "shared" / "data")).resolve()
    if not root.is_dir():
        pytest.skip(f"data folder {root} absent (set SPARSEGEN_DATA to the shared data)")
    return root


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} absent from the data folder")
    return path


def write(path: Path, text: str | bytes, compress: bool = False) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def tsv_text(m, one_based=True, sep="\t") -> str:
    coo = sp.coo_matrix(m)
    b = 1 if one_based else 0
    return "".join(f"{r + b}{sep}{c + b}{sep}{float(v)!r}\n" for r, c, v in zip(coo.row, coo.col, coo.data))


def smtx_text(m) -> str:
    m = sp.csr_matrix(m)
    return (f"{m.shape[0]}, {m.shape[1]}, {m.nnz}\n" + "".join(f"{x} " for x in m.indptr) + "\n"
            + "".join(f"{x} " for x in m.indices) + "\n")


def idx_bytes(pixels: np.ndarray, magic: int = 2051) -> bytes:
    n, r, c = pixels.shape
    return struct.pack(">iiii", magic, n, r, c) + pixels.astype(np.uint8).tobytes()


def random_csr(m, n, density, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    a = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    a.data = (rng.standard_normal(a.nnz) * 3).astype(dtype)
    return a


def assert_canonical(a):
    assert isinstance(a, sp.csr_matrix)
    assert a.indices.dtype == np.int32 and a.indptr.dtype == np.int32
    for i in range(a.shape[0]):  # test code: a loop is fine
        row = a.indices[a.indptr[i]:a.indptr[i + 1]]
        assert np.all(np.diff(row) > 0)


def assert_same(a, b):
    assert a.shape == b.shape
    a, b = sp.csr_matrix(a), sp.csr_matrix(b)
    a.sort_indices()
    b.sort_indices()
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.data, b.data)


def error(path, **options) -> FormatError:
    with pytest.raises(FormatError) as e:
        load(path, **options)
    assert str(Path(path)) in str(e.value)
    return e.value


def check(err: FormatError, line, *fragments):
    """err names `line` (None: no line) and holds every fragment in its message."""
    assert err.line == line, str(err)
    if line is not None:
        assert f":{line}: " in str(err)
    for f in fragments:
        assert f in str(err), (f, str(err))


# ------------------------------------------------------------------------------------------ TSV

def test_tsv_round_trip(tmp_path):
    m = random_csr(40, 30, 0.1)
    a = load(write(tmp_path / "m.tsv", tsv_text(m)), shape=(40, 30))
    assert_canonical(a)
    assert a.dtype == np.float32
    assert_same(a, m)
    assert a.has_canonical_format


def test_tsv_shape_inferred_and_options(tmp_path):
    text = "3\t2\t1.5\n1\t5\t-2\n"
    a = load(write(tmp_path / "m.tsv", text))
    assert a.shape == (3, 5)
    np.testing.assert_array_equal(a.toarray()[[2, 0], [1, 4]], [1.5, -2])
    b = load(write(tmp_path / "z.tsv", "0 0 1\n2 4 2\n"), one_based=False, dtype=np.float64)
    assert b.shape == (3, 5) and b.dtype == np.float64 and b[2, 4] == 2


def test_tsv_whitespace_variants(tmp_path):
    ref = load(write(tmp_path / "a.tsv", "1\t1\t0.25\n2\t3\t4\n"))
    for i, text in enumerate(["1 1 0.25\n2 3 4\n", "1\t1\t0.25\r\n2\t3\t4\r\n", "\n1  1\t 0.25\n\n2 3 4",
                              "1\t1\t0.25\n2\t3\t4\n\n\n", "  1 1 0.25   \n 2 3 4"]):
        assert_same(load(write(tmp_path / f"v{i}.tsv", text)), ref)


def test_tsv_values_exact(tmp_path):
    vals = ["6.250000e-02", "-6.250000e-02", "1", "0.1", "1e-05", "3.4028234663852886e38", "-0", "+2.5E+3",
            ".5", "5.", "123456789012345678e-20", "0.30000000000000004"]
    text = "".join(f"{i + 1}\t1\t{v}\n" for i, v in enumerate(vals))
    a = load(write(tmp_path / "v.tsv", text), dtype=np.float64)
    np.testing.assert_array_equal(a.toarray()[:, 0], [float(v) for v in vals])


def test_tsv_gzip_and_format_override(tmp_path):
    m = random_csr(20, 20, 0.2, seed=3)
    gz = write(tmp_path / "m.tsv.gz", tsv_text(m), compress=True)
    assert_same(load(gz, shape=(20, 20)), m)
    other = write(tmp_path / "weights.txt", tsv_text(m), compress=True)  # gzip found by its magic
    assert_same(load(other, format="tsv", shape=(20, 20)), m)


def test_tsv_empty(tmp_path):
    check(error(write(tmp_path / "e.tsv", "")), None, "empty file")
    check(error(write(tmp_path / "w.tsv", "\n \n")), None, "empty file")


@pytest.mark.parametrize("text, line, fragments", [
    ("1\t1\t1\n2\tx\t1\n", 2, ["integer column index", "'x'"]),
    ("1\t1\t1\n1.5\t1\t1\n", 2, ["integer row index", "'1.5'"]),
    ("1\t1\t1\n2\t2\tabc\n", 2, ["a number (value)", "'abc'"]),
    ("1\t1\t1\n\n2\t2\n3\t3\t1\n", 3, ["3 whitespace-separated fields", "found 2 fields", "'2\\t2'"]),
    ("1\t1\t1\n2\t2\t1\t7\n", 2, ["3 whitespace-separated fields", "found 4 fields"]),
    ("1\t1\t1\n2\t2\t1\n3\t3", 3, ["3 whitespace-separated fields", "found 2 fields"]),  # truncated
    ("1\t1\t1\n0\t2\t1\n", 2, ["row index >= 1", "0 (indices are 1-based)"]),
    ("1\t1\t1\n2\t-3\t1\n", 2, ["column index >= 1", "-3 (negative)"]),
    ("1\t1\t1\n2\t2\tnan\n", 2, ["a finite value", "'nan'", "1 non-finite"]),
    ("1\t1\t-inf\n2\t2\tinf\n", 1, ["a finite value", "'-inf'", "2 non-finite"]),
    ("1\t1\t1\n2\t2\t1\n1\t1\t5\n", 3, ["at most one entry per (row, col)", "(row 1, col 1)", "first is on line 1"]),
    ("1\t1\t1\n2\t2\t1e300\n", 2, ["representable in float32", "overflows"]),
])
def test_tsv_malformed(tmp_path, text, line, fragments):
    check(error(write(tmp_path / "bad.tsv", text)), line, *fragments)


def test_tsv_past_declared_shape(tmp_path):
    p = write(tmp_path / "s.tsv", "1\t1\t1\n4\t2\t1\n")
    check(error(p, shape=(3, 3)), 2, "row index in 1..3", "4, past the declared shape (3, 3)")
    p = write(tmp_path / "z.tsv", "0\t0\t1\n1\t3\t1\n")
    check(error(p, shape=(3, 3), one_based=False), 2, "column index in 0..2", "3, past")


def test_tsv_error_line_after_crlf_and_blank_lines(tmp_path):
    p = write(tmp_path / "l.tsv", "1 1 1\r\n\r\n\r\n2 2 1\r\n2 2 3\r\n")
    check(error(p), 5, "a second entry for (row 2, col 2)", "first is on line 4")


def test_tsv_large_chunks(tmp_path):
    # more tokens than one parsing chunk, with a mix of value layouts
    rng = np.random.default_rng(7)
    n = 70000
    key = rng.choice(500 * 400, n, replace=False)
    r, c = key // 400, key % 400
    v = np.round(rng.standard_normal(n), 4)
    fmt = np.array(["%.4f", "%g", "%.6e"])[rng.integers(0, 3, n)]
    text = "".join(f"{a + 1}\t{b + 1}\t{f % x}\n" for a, b, f, x in zip(r, c, fmt, v))
    a = load(write(tmp_path / "big.tsv", text), shape=(500, 400), dtype=np.float64)
    ref = sp.csr_matrix((np.array([float(f % x) for f, x in zip(fmt, v)]), (r, c)), shape=(500, 400))
    assert_same(a, ref)
    bad = text.replace(f"\t{fmt[60000] % v[60000]}\n", "\tNaN\n", 1)
    check(error(write(tmp_path / "bad.tsv", bad)), 60001, "a finite value")


# ------------------------------------------------------------------------------------------ MTX

def test_mtx_round_trip_scipy(tmp_path):
    m = random_csr(50, 35, 0.08, seed=1, dtype=np.float64)
    scipy.io.mmwrite(tmp_path / "m.mtx", m)
    a = load(tmp_path / "m.mtx", dtype=np.float64)
    assert_same(a, m)
    assert_same(load(tmp_path / "m.mtx"), m.astype(np.float32))


def test_mtx_symmetric_expansion(tmp_path):
    text = ("%%MatrixMarket matrix coordinate real symmetric\n% a comment\n%\n3 3 4\n"
            "1 1 2.0\n2 1 -1\n3 2 4.5\n3 3 7\n")
    a = load(write(tmp_path / "s.mtx", text))
    expected = np.array([[2, -1, 0], [-1, 0, 4.5], [0, 4.5, 7]], np.float32)
    np.testing.assert_array_equal(a.toarray(), expected)
    assert a.nnz == 6
    assert_canonical(a)


def test_mtx_symmetric_from_scipy(tmp_path):
    m = random_csr(30, 30, 0.1, seed=2, dtype=np.float64)
    m = sp.csr_matrix(m + m.T)
    scipy.io.mmwrite(tmp_path / "s.mtx", m, symmetry="symmetric")
    assert b"symmetric" in (tmp_path / "s.mtx").read_bytes()[:80]
    assert_same(load(tmp_path / "s.mtx", dtype=np.float64), m)


def test_mtx_skew_pattern_integer(tmp_path):
    skew = "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 1.5\n3 1 -2\n"
    a = load(write(tmp_path / "k.mtx", skew))
    np.testing.assert_array_equal(a.toarray(), [[0, -1.5, 2], [1.5, 0, 0], [-2, 0, 0]])
    pat = "%%MatrixMarket matrix coordinate pattern general\n2 4 3\n1 4\n2 1\n1 2\n"
    np.testing.assert_array_equal(load(write(tmp_path / "p.mtx", pat)).toarray(),
                                  [[0, 1, 0, 1], [1, 0, 0, 0]])
    ints = "%%MatrixMarket matrix coordinate integer general\n2 2 2\n1 1 -3\n2 2 12\n"
    np.testing.assert_array_equal(load(write(tmp_path / "i.mtx", ints)).toarray(), [[-3, 0], [0, 12]])
    empty = "%%MatrixMarket matrix coordinate real general\n4 5 0\n"
    e = load(write(tmp_path / "z.mtx", empty))
    assert e.shape == (4, 5) and e.nnz == 0


def test_mtx_array(tmp_path):
    dense = np.array([[1.5, 0, 2], [0, 0, -1]])
    scipy.io.mmwrite(tmp_path / "d.mtx", dense)
    assert b"array" in (tmp_path / "d.mtx").read_bytes()[:40]
    a = load(tmp_path / "d.mtx")
    np.testing.assert_array_equal(a.toarray(), dense)
    assert a.nnz == 3
    sym = "%%MatrixMarket matrix array real symmetric\n3 3\n1\n2\n0\n4\n5\n6\n"
    np.testing.assert_array_equal(load(write(tmp_path / "s.mtx", sym)).toarray(),
                                  [[1, 2, 0], [2, 4, 5], [0, 5, 6]])


def test_mtx_gzip(tmp_path):
    m = random_csr(10, 12, 0.3, seed=4, dtype=np.float64)
    scipy.io.mmwrite(tmp_path / "m.mtx", m)
    gz = write(tmp_path / "m.mtx.gz", (tmp_path / "m.mtx").read_bytes(), compress=True)
    assert_same(load(gz, dtype=np.float64), m)


HEAD = "%%MatrixMarket matrix coordinate real general\n"


@pytest.mark.parametrize("text, line, fragments", [
    ("", None, ["empty file"]),
    ("%%MatrixMarket matrix coordinate\n2 2 1\n1 1 1\n", 1, ["%%MatrixMarket matrix coordinate|array"]),
    ("2 2 1\n1 1 1\n", 1, ["%%MatrixMarket", "found '2 2 1'"]),
    ("%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1 0\n", 1, ["real, integer or pattern", "complex"]),
    ("%%MatrixMarket matrix coordinate real hermitian\n2 2 1\n1 1 1\n", 1, ["symmetry general", "hermitian"]),
    ("%%MatrixMarket matrix array pattern general\n2 2\n", 1, ["real or integer", "pattern"]),
    (HEAD + "% only comments\n", 3, ["size line 'rows cols nnz'", "end of file"]),
    (HEAD + "2 two 1\n1 1 1\n", 2, ["size line", "'2 two 1'"]),
    (HEAD + "%c\n2 2 3\n1 1 1\n2 2 1\n", 6, ["3 entries (size line 3)", "end of file after 2 entries"]),
    (HEAD + "2 2 1\n1 1 1\n2 2 1\n", 4, ["1 entries (size line 2)", "entry 2: '2 2 1'"]),
    (HEAD + "2 2 2\n1 1 1\n3 1 1\n", 4, ["row index in 1..2", "3, past the shape (2, 2) of the size line (line 2)"]),
    (HEAD + "2 2 2\n1 1 1\n1 0 1\n", 4, ["column index in 1..2", "0 (indices are 1-based)"]),
    (HEAD + "2 2 2\n1 1 1\n-1 1 1\n", 4, ["row index", "-1 (negative)"]),
    (HEAD + "2 2 2\n1 1 1\n2 2 x1\n", 4, ["a number (value)", "'x1'"]),
    (HEAD + "2 2 2\n1 1 1\n2 2 NaN\n", 4, ["a finite value", "'NaN'"]),
    (HEAD + "2 2 2\n1 1 1\n2 2\n", 4, ["3 whitespace-separated fields (row col value)", "found 2 fields"]),
    (HEAD + "2 2 3\n1 1 1\n2 2 1\n1 1 2\n", 5, ["at most one entry", "(row 1, col 1)", "first is on line 3"]),
    ("%%MatrixMarket matrix coordinate real symmetric\n2 2 2\n2 1 1\n1 2 1\n", 4,
     ["at most one entry", "first is on line 3", "symmetric expansion"]),
    ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 2\n2 1 1\n2 2 1\n", 4, ["no diagonal entry"]),
    ("%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n2 1 1\n", 2, ["square shape", "2 x 3"]),
    ("%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 1 1.5\n", 3, ["an integer value", "'1.5'"]),
    ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n", 6, ["4 values", "end of file after 3 values"]),
    ("%%MatrixMarket matrix array real general\n1 1\n1\n2\n", 4, ["1 values", "value 2: '2'"]),
])
def test_mtx_malformed(tmp_path, text, line, fragments):
    check(error(write(tmp_path / "bad.mtx", text)), line, *fragments)


# ------------------------------------------------------------------------------------------ NPZ

def test_npz_round_trip(tmp_path):
    m = random_csr(25, 18, 0.2, seed=5)
    sp.save_npz(tmp_path / "m.npz", m)
    assert_same(load(tmp_path / "m.npz"), m)
    sp.save_npz(tmp_path / "c.npz", m.tocsc(), compressed=False)
    assert_same(load(tmp_path / "c.npz"), m)
    write(tmp_path / "g.npz.gz", (tmp_path / "m.npz").read_bytes(), compress=True)
    assert_same(load(tmp_path / "g.npz.gz"), m)
    # coo with a duplicate: summed (npz is binary scipy output, not a hand-written listing)
    coo = sp.coo_matrix(([1.0, 2.0, 5.0], ([0, 0, 1], [1, 1, 0])), shape=(2, 2))
    sp.save_npz(tmp_path / "d.npz", coo)
    a = load(tmp_path / "d.npz", dtype=np.float64)
    assert_canonical(a)
    np.testing.assert_array_equal(a.toarray(), [[0, 3], [5, 0]])


def test_npz_malformed(tmp_path):
    check(error(write(tmp_path / "e.npz", b"")), None, "save_npz archive", "empty file")
    check(error(write(tmp_path / "t.npz", b"not a zip at all")), None, "save_npz archive")
    np.savez(tmp_path / "plain.npz", a=np.arange(3))
    check(error(tmp_path / "plain.npz"), None, "save_npz archive")
    half = (write(tmp_path / "h.npz", b"") and None) or tmp_path / "h.npz"
    sp.save_npz(tmp_path / "full.npz", random_csr(10, 10, 0.5))
    half.write_bytes((tmp_path / "full.npz").read_bytes()[:200])
    check(error(half), None, "save_npz archive")
    m = random_csr(5, 5, 0.5)
    m.data[2] = np.nan
    sp.save_npz(tmp_path / "nan.npz", m)
    check(error(tmp_path / "nan.npz"), None, "finite values", "1 non-finite")


# ------------------------------------------------------------------------------------------ SMTX

def test_smtx_round_trip(tmp_path):
    m = random_csr(30, 40, 0.15, seed=6)
    p = write(tmp_path / "m.smtx", smtx_text(m))
    ones = load(p, values="ones")
    assert_canonical(ones)
    assert_same(ones, sp.csr_matrix((np.ones(m.nnz, np.float32), m.indices, m.indptr), shape=m.shape))
    r1, r2, r3 = load(p), load(p, seed=0), load(p, seed=1)
    np.testing.assert_array_equal(r1.data, r2.data)
    assert not np.array_equal(r1.data, r3.data)
    np.testing.assert_array_equal(r1.data, np.random.default_rng(0).standard_normal(m.nnz, dtype=np.float32))
    assert load(p, dtype=np.float64).dtype == np.float64
    gz = write(tmp_path / "m.smtx.gz", smtx_text(m), compress=True)
    assert_same(load(gz, values="ones"), ones)


def test_smtx_empty_rows_and_matrix(tmp_path):
    a = load(write(tmp_path / "z.smtx", "3, 4, 0\n0 0 0 0 \n\n"))
    assert a.shape == (3, 4) and a.nnz == 0
    b = load(write(tmp_path / "y.smtx", "3, 4, 0\n0 0 0 0\n"))
    assert b.shape == (3, 4) and b.nnz == 0
    c = load(write(tmp_path / "x.smtx", "3, 4, 2\n0 0 2 2 \n1 3 \n"), values="ones")
    np.testing.assert_array_equal(c.toarray(), [[0, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]])


@pytest.mark.parametrize("text, line, fragments", [
    ("", None, ["empty file"]),
    ("2, 3\n0 1 2\n0 1\n", 1, ["nrows, ncols, nnz", "'2, 3'"]),
    ("2, x, 2\n0 1 2\n0 1\n", 1, ["nrows, ncols, nnz", "'2, x, 2'"]),
    ("2, 3, 2\n", 2, ["3 row offsets", "found 0 (truncated)"]),
    ("2, 3, 2", 2, ["3 row offsets", "file truncated"]),
    ("2, 3, 2\n0 1\n0 1\n", 2, ["3 row offsets", "found 2 (truncated)"]),
    ("2, 3, 2\n1 1 2\n0 1\n", 2, ["row offsets starting at 0", "first offset 1"]),
    ("2, 3, 2\n0 1 3\n0 1\n", 2, ["ending at nnz = 2", "last offset 3"]),
    ("2, 3, 2\n0 3 2\n0 1\n", 2, ["non-decreasing row offsets", "offset 2 (row 1 ends) = 2 < offset 1 = 3"]),
    ("2, 3, 2\n0 a 2\n0 1\n", 2, ["an integer row offset", "'a'"]),
    ("2, 3, 2\n0 1 2\n", 3, ["2 column indices", "found 0 (truncated)"]),
    ("2, 3, 2\n0 1 2", 3, ["2 column indices", "file truncated"]),
    ("2, 3, 3\n0 1 3\n0 1\n", 3, ["3 column indices (nnz)", "found 2 (truncated)"]),
    ("2, 3, 2\n0 1 2\n0 3\n", 3, ["column indices in 0..2", "3 at position 1"]),
    ("2, 3, 2\n0 1 2\n-1 0\n", 3, ["column indices in 0..2", "-1 at position 0 (negative)"]),
    ("2, 3, 3\n0 2 3\n1 1 0\n", 3, ["strictly increasing", "a duplicate column 1 after 1 in row 0"]),
    ("2, 3, 4\n0 2 4\n1 2 2 0\n", 3, ["strictly increasing", "out of order column 0 after 2 in row 1 (position 3)"]),
    ("2, 3, 2\n0 1 2\n0 1.0\n", 3, ["an integer column index", "'1.0'"]),
    ("2, 3, 2\n0 1 2\n0 1\n\n7 7\n", 5, ["nothing after the 3 lines", "'7 7'"]),
])
def test_smtx_malformed(tmp_path, text, line, fragments):
    check(error(write(tmp_path / "bad.smtx", text)), line, *fragments)


# ------------------------------------------------------------------------------------------ IDX

def test_idx_images(tmp_path):
    rng = np.random.default_rng(8)
    px = (rng.random((5, 3, 4)) < 0.3) * rng.integers(1, 256, (5, 3, 4))
    p = write(tmp_path / "imgs-idx3-ubyte", idx_bytes(px))
    a = load(p)
    assert_canonical(a)
    assert a.shape == (5, 12) and a.dtype == np.float32
    np.testing.assert_array_equal(a.toarray(), (px.reshape(5, 12) / 255.0).astype(np.float32))
    f = load(p, order="F")
    np.testing.assert_array_equal(f.toarray(), (px.transpose(0, 2, 1).reshape(5, 12) / 255.0).astype(np.float32))
    two = load(write(tmp_path / "i.idx3-ubyte.gz", idx_bytes(px), compress=True), limit=2)
    assert_same(two, a[:2])
    assert load(p, limit=99).shape == (5, 12)
    assert load(write(tmp_path / "x.bin", idx_bytes(px)), format="idx").shape == (5, 12)


@pytest.mark.parametrize("payload, fragments", [
    (b"", ["magic 2051", "empty file"]),
    (b"\x00\x00\x08", ["magic 2051", "3 bytes (truncated header)"]),
    (struct.pack(">ii", 2049, 3) + b"\x01\x02\x03", ["image file (magic 2051", "magic 2049", "labels file"]),
    (struct.pack(">iiii", 7, 1, 1, 1) + b"\x00", ["magic 2051", "found magic 7", "unknown"]),
    (struct.pack(">iii", 2051, 1, 28), ["16-byte IDX image header", "12 bytes"]),
    (struct.pack(">iiii", 2051, 2, 2, 2) + b"\x01" * 7,
     ["8 bytes of pixels for 2 images of 2x2", "7 bytes (truncated)"]),
    (struct.pack(">iiii", 2051, 1, 2, 2) + b"\x01" * 5, ["4 bytes of pixels", "more bytes"]),
])
def test_idx_malformed(tmp_path, payload, fragments):
    check(error(write(tmp_path / "bad.idx", payload)), None, *fragments)


def test_idx_truncated_gzip(tmp_path):
    full = gzip.compress(idx_bytes(np.ones((50, 8, 8))))
    p = write(tmp_path / "t-idx3-ubyte.gz", full[: len(full) // 2])
    check(error(p), None)


# ------------------------------------------------------------------------------------------ load

def test_detect_format():
    assert [detect_format(n) for n in ["a.tsv", "A.TSV.GZ", "x.mtx", "y.npz", "d.smtx.gz", "t10k-images-idx3-ubyte",
                                       "t10k-images.idx3-ubyte", "z.idx", "q.mm.gz"]] == \
        ["tsv", "tsv", "mtx", "npz", "smtx", "idx", "idx", "idx", "mtx"]


def test_load_errors(tmp_path):
    e = error(write(tmp_path / "m.csv", "1,1,1\n"))
    check(e, None, "m.csv", "tsv", "mtx", "npz", "smtx", "idx")
    missing = error(tmp_path / "nope.tsv")
    assert isinstance(missing, SparsegenError)
    check(missing, None, "no such file")
    (tmp_path / "dir.tsv").mkdir()
    check(error(tmp_path / "dir.tsv"), None, "a directory")
    check(error(write(tmp_path / "plain.tsv.gz", "1 1 1\n")), None, "gzip data")
    gz = gzip.compress(b"1 1 1\n" * 1000)
    check(error(write(tmp_path / "cut.tsv.gz", gz[:30])), None, "complete gzip stream")
    p = write(tmp_path / "ok.tsv", "1 1 1\n")
    with pytest.raises(ValueError, match="format must be one of"):
        load(p, format="csv")
    with pytest.raises(TypeError):
        load(p, values="ones")  # a smtx option
    with pytest.raises(ValueError, match="floating"):
        load(p, dtype=np.int32)


# ------------------------------------------------------------------------------------------ as_csr

def test_as_csr_inputs():
    dense = np.array([[0, 2, 0], [1, 0, 3]])
    a = as_csr(dense)
    assert_canonical(a)
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a.toarray(), dense)
    coo = sp.coo_array(([1.0, 2.0, 3.0, 4.0], ([1, 0, 1, 1], [2, 1, 0, 2])), shape=(2, 3))
    before = coo.copy()
    b = as_csr(coo)
    assert b.dtype == np.float64 and b.nnz == 3
    np.testing.assert_array_equal(b.toarray(), [[0, 2, 0], [3, 0, 5]])
    np.testing.assert_array_equal(coo.data, before.data)  # input untouched
    unsorted = sp.csr_matrix((np.array([1.0, 2.0], np.float32), [2, 0], [0, 2]), shape=(1, 3))
    c = as_csr(unsorted)
    np.testing.assert_array_equal(c.indices, [0, 2])
    np.testing.assert_array_equal(unsorted.indices, [2, 0])
    assert as_csr(sp.eye(4, dtype=bool)).dtype == np.float32
    assert as_csr(dense, dtype=np.float64).dtype == np.float64
    assert as_csr(np.zeros((3, 0))).shape == (3, 0)


@pytest.mark.parametrize("matrix, fragments", [
    (np.zeros(3), ["2-D matrix", "shape (3,)"]),
    (np.zeros((2, 2, 2)), ["2-D matrix", "(2, 2, 2)"]),
    (np.array([[1 + 1j]]), ["real numeric", "complex"]),
    (np.array([["a"]]), ["real numeric", "non-numeric"]),
    (np.array([[0, np.nan, 1], [np.inf, 0, np.nan]]), ["finite", "3 non-finite", "nan at (row 0, col 1)"]),
    (sp.csr_matrix(np.array([[0, 0], [0, -np.inf]])), ["1 non-finite", "-inf at (row 1, col 1)"]),
    (sp.coo_array(np.ones(3)), ["2-D matrix", "1-D"]),
])
def test_as_csr_rejects(matrix, fragments):
    with pytest.raises(FormatError) as e:
        as_csr(matrix)
    assert e.value.path == "<matrix>" and e.value.line is None
    check(e.value, None, *fragments)


# ------------------------------------------------------------------------------------------ property

@st.composite
def sparse_matrices(draw):
    m, n = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    cells = draw(st.sets(st.tuples(st.integers(0, m - 1), st.integers(0, n - 1)), min_size=1, max_size=m * n))
    r, c = np.array(sorted(cells)).T
    vals = draw(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=len(r), max_size=len(r)))
    order = draw(st.permutations(range(len(r))))
    return sp.coo_matrix((np.array(vals, np.float32)[order], (r[order], c[order])), shape=(m, n))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=sparse_matrices())
def test_property_round_trip_tsv_mtx(tmp_path, m):
    t = load(write(tmp_path / "h.tsv", tsv_text(m)), shape=m.shape)
    assert_canonical(t)
    assert_same(t, m)
    scipy.io.mmwrite(tmp_path / "h.mtx", m.astype(np.float64), symmetry="general")
    x = load(tmp_path / "h.mtx")
    assert_same(x, m)


# ------------------------------------------------------------------------------------------ real data

def test_graphchallenge_layer(data_dir):
    a = load(need(data_dir / "graphchallenge" / "n1024-l1.tsv.gz"))
    assert a.shape == (1024, 1024) and a.nnz == 32768
    assert np.all(a.data == np.float32(0.0625))
    assert_canonical(a)


def test_graphchallenge_images(data_dir):
    a = load(need(data_dir / "graphchallenge" / "sparse-images-1024-first1200.tsv.gz"), shape=(1200, 1024))
    assert a.shape == (1200, 1024) and a.nnz == 122713
    assert np.all(a.data == 1)


def test_dlmc_matrix(data_dir):
    index = need(data_dir / "dlmc" / "index.tsv")
    with open(index) as f:
        row = next(csv.DictReader(f, delimiter="\t"))
    a = load(need(data_dir / "dlmc" / row["path"]))
    assert a.shape == (int(row["rows"]), int(row["cols"]))
    assert a.nnz == int(row["nnz"])
    assert int(np.diff(a.indptr).max()) == int(row["rowlen_max"])
    assert_canonical(a)


def test_mnist_images(data_dir):
    p = need(data_dir / "mnist" / "t10k-images-idx3-ubyte.gz")
    a = load(p, limit=10)
    assert a.shape == (10, 784)
    raw = np.frombuffer(gzip.open(p).read(16 + 7840), np.uint8, offset=16).reshape(10, 784)
    np.testing.assert_array_equal(a.toarray(), (raw / 255.0).astype(np.float32))
    labels = need(data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz")
    check(error(labels, format="idx"), None, "magic 2049", "labels file")
