"""sparsegen.io against hostile files: special files, decompression bombs, sizes no file backs,
damaged archives, lenient number syntax. Each reader answers with a FormatError (or, for a genuine
matrix too big for the machine, a SparsegenError naming the memory it needs): never a crash, a
MemoryError, an OverflowError or a hang."""
from __future__ import annotations

import gzip
import os
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.errors import FormatError, SparsegenError
from sparsegen.io import _files, load


def write(path: Path, data: str | bytes, compress: bool = False) -> Path:
    data = data.encode() if isinstance(data, str) else data
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def fails(path, *fragments, line=None, **options) -> FormatError:
    with pytest.raises(FormatError) as e:
        load(path, **options)
    assert e.value.line == line, str(e.value)
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))
    return e.value


# ------------------------------------------------------------------------------------ special files

def test_fifo_fails_at_once(tmp_path):
    fifo = tmp_path / "pipe.tsv"
    os.mkfifo(fifo)
    outcome = []

    def attempt():
        try:
            load(fifo)
        except Exception as e:  # noqa: BLE001 - the test reports whatever happened
            outcome.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # release the reader blocked in open() before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail("load() blocked on a FIFO")
    assert isinstance(outcome[0], FormatError), outcome
    assert "a regular file" in str(outcome[0]) and "FIFO" in str(outcome[0])


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_device_is_not_read(device):
    if not Path(device).exists():
        pytest.skip(f"{device} absent")
    fails(device, "a regular file", "character device", format="tsv")


def test_directory_and_dangling_link(tmp_path):
    (tmp_path / "d.npz").mkdir()
    fails(tmp_path / "d.npz", "a directory")
    (tmp_path / "l.mtx").symlink_to(tmp_path / "absent.mtx")
    fails(tmp_path / "l.mtx", "no such file")


# ------------------------------------------------------------------------------------ decompression

def test_gzip_bomb_stops_at_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv(_files.MAX_DECOMPRESSED_ENV, "100000")
    bomb = write(tmp_path / "b.tsv.gz", b"1 1 1\n" + b" " * 10_000_000, compress=True)
    assert bomb.stat().st_size < 20_000
    fails(bomb, "at most 100000 bytes after decompression", _files.MAX_DECOMPRESSED_ENV)
    ok = write(tmp_path / "ok.tsv.gz", b"1 1 1\n" + b" " * 90_000, compress=True)
    assert load(ok).nnz == 1


def test_gzip_bomb_idx(tmp_path, monkeypatch):
    monkeypatch.setenv(_files.MAX_DECOMPRESSED_ENV, "100000")
    head = struct.pack(">iiii", 2051, 1000, 100, 100)  # 10 MB of pixels, all zero: compresses 1000:1
    p = write(tmp_path / "b-idx3-ubyte.gz", head + bytes(10_000_000), compress=True)
    fails(p, "at most 100000 bytes after decompression")
    assert load(p, limit=5).shape == (5, 10000)  # a prefix inside the limit is fine


def test_decompression_limit_variable_checked(tmp_path, monkeypatch):
    p = write(tmp_path / "m.tsv.gz", "1 1 1\n", compress=True)
    for bad in ("lots", "-1", "0", "1e9", "1_000"):
        monkeypatch.setenv(_files.MAX_DECOMPRESSED_ENV, bad)
        with pytest.raises(SparsegenError, match=_files.MAX_DECOMPRESSED_ENV):
            load(p)


def test_gzip_members_padding_and_trailing_garbage(tmp_path):
    two = gzip.compress(b"1 1 1\n") + gzip.compress(b"2 2 2\n")
    assert load(write(tmp_path / "two.tsv.gz", two)).nnz == 2
    assert load(write(tmp_path / "pad.tsv.gz", gzip.compress(b"1 1 1\n") + bytes(8))).nnz == 1
    fails(write(tmp_path / "junk.tsv.gz", gzip.compress(b"1 1 1\n") + b"junk"), "other data after a member")
    whole = gzip.compress(b"1 1 1\n" * 100)
    fails(write(tmp_path / "cut.tsv.gz", whole[:-10]), "complete gzip stream")
    bad_crc = bytearray(whole)
    bad_crc[-6] ^= 0xFF
    fails(write(tmp_path / "crc.tsv.gz", bytes(bad_crc)), "complete gzip stream")


# ------------------------------------------------------------------------------------ npz arrays

def savez(path: Path, **members) -> Path:
    np.savez(path, **members)
    return path


def csr_members(**change):
    base = dict(format=b"csr", shape=np.array([3, 4]), data=np.float32([1, 2, 3]),
                indices=np.int32([0, 3, 1]), indptr=np.int32([0, 2, 2, 3]))
    base.update(change)
    return {k: v for k, v in base.items() if v is not None}


def test_npz_segfault_reproducer_in_a_subprocess(tmp_path):
    """The issue's reproducer: out-of-range CSC indices reached scipy's converters and crashed them."""
    import subprocess
    import sys
    p = savez(tmp_path / "bad.npz", format=b"csc", shape=[2, 2], data=np.float32([1, 2]),
              indices=np.int32([0, 1000000]), indptr=np.int32([0, 1, 2]))
    code = ("import sys; from sparsegen.io import load; from sparsegen.errors import FormatError\n"
            "try:\n    load(sys.argv[1])\nexcept FormatError as e:\n    print(e)\n")
    repo = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120,
                         cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert "member indices.npy: row indices in 0..1" in run.stdout and "1000000" in run.stdout


@pytest.mark.parametrize("change, fragments", [
    (dict(indices=np.int32([0, 4, 1])), ["indices.npy: column indices in 0..3", "4 at position 1"]),
    (dict(indices=np.int32([0, -1, 1])), ["column indices", "-1 at position 1 (negative)"]),
    (dict(indptr=np.int32([0, 2, 1, 3])), ["indptr.npy: non-decreasing", "pointer 2 = 1 < pointer 1 = 2"]),
    (dict(indptr=np.int32([1, 2, 2, 3])), ["starting at 0"]),
    (dict(indptr=np.int32([0, 2, 2, 4])), ["ending at the number of stored entries, 3", "last pointer 4"]),
    (dict(indptr=np.int32([0, 2, 3])), ["indptr.npy: length 4 (rows + 1)", "length 3"]),
    (dict(indptr=np.int32([0, 2, 2, 3, 3])), ["length 4", "length 5"]),
    (dict(data=np.float32([1, 2])), ["indices.npy: length 2", "length 3"]),
    (dict(indices=np.float64([0, 3, 1])), ["indices.npy: an integer array", "float64"]),
    (dict(indices=np.array([0, 3, 1], object)), ["indices.npy", "no objects", "object"]),
    (dict(indptr=np.array([[0, 2, 2, 3]])), ["indptr.npy: a 1-D array", "(1, 4)"]),
    (dict(indices=np.uint64([0, 2**64 - 1, 1])), ["integers <=", "18446744073709551615"]),
    (dict(data=np.array(["a", "b", "c"])), ["data.npy", "real numeric", "non-numeric"]),
    (dict(data=np.complex64([1, 2, 3])), ["data.npy", "complex"]),
    (dict(data=np.float32([1, np.nan, 3])), ["finite values", "1 non-finite", "(row 0, col 3)"]),
    (dict(shape=np.array([3.0, 4.0])), ["shape.npy: an integer array", "float64"]),
    (dict(shape=np.array([3, -4])), ["shape.npy: non-negative sizes", "[3, -4]"]),
    (dict(shape=np.array([3, 4, 1])), ["shape.npy: 2 entries", "3: [3, 4, 1]"]),
    (dict(shape=np.array([10**18, 4])), ["a shape that", "bytes of content back", "1000000000000000000 x 4"]),
    (dict(shape=np.array([3, 10**18])), ["a shape that", "3 x 1000000000000000000"]),
    (dict(shape=np.array([3, 2**40])), ["rows + cols <="]),
    (dict(format=b"lil"), ["format.npy: one of csr, csc, coo, bsr, dia", "'lil'"]),
    (dict(format=np.array([b"csr"])), ["format.npy: a 0-d string array", "shape (1,)"]),
    (dict(format=np.int64(3)), ["format.npy: a 0-d string array", "int64"]),
    (dict(format=None), ["a member format.npy"]),
    (dict(indices=None), ["member indices.npy: present", "none"]),
    (dict(data=np.array([(1, 2)] * 3, dtype="i4,i4")), ["data.npy", "no objects, records"]),
])
def test_npz_csr_arrays_checked(tmp_path, change, fragments):
    fails(savez(tmp_path / "m.npz", **csr_members(**change)), *fragments)


@pytest.mark.parametrize("members, fragments", [
    (dict(format=b"csc", shape=[2, 2], data=np.float32([1, 2]), indices=np.int32([0, 2]), indptr=np.int32([0, 1, 2])),
     ["indices.npy: row indices in 0..1", "2 at position 1"]),
    (dict(format=b"csc", shape=[2, 3], data=np.float32([1, 2]), indices=np.int32([0, 1]), indptr=np.int32([0, 1, 2])),
     ["indptr.npy: length 4 (columns + 1)"]),
    (dict(format=b"coo", shape=[3, 3], data=np.float32([1, 2]), row=np.int64([0, 3]), col=np.int64([0, 0])),
     ["row.npy: row indices in 0..2", "3 at position 1"]),
    (dict(format=b"coo", shape=[3, 3], data=np.float32([1, 2]), row=np.int64([0, 1]), col=np.int64([0, -7])),
     ["col.npy: column indices", "-7 at position 1 (negative)"]),
    (dict(format=b"coo", shape=[3, 3], data=np.float32([1, 2]), row=np.int64([0]), col=np.int64([0, 1])),
     ["row.npy: length 2"]),
    (dict(format=b"coo", shape=[3, 3], data=np.float32([1]), coords=np.int64([[0], [3]])),
     ["coords.npy: column indices in 0..2"]),
    (dict(format=b"coo", shape=[3, 3], data=np.float32([1]), coords=np.int64([[0], [1], [1]])),
     ["coords.npy: 2 rows"]),
    (dict(format=b"coo", shape=[3, 3], data=np.float64([1e308, 1e308]), row=np.int64([1, 1]), col=np.int64([2, 2])),
     ["duplicate entries whose sum is finite", "(row 1, col 2)"]),
    (dict(format=b"coo", shape=[10**15, 10**15], data=np.float32([1]), row=np.int64([5]), col=np.int64([5])),
     ["a shape that", "1000000000000000 x 1000000000000000"]),
    (dict(format=b"bsr", shape=[3, 4], data=np.ones((1, 2, 2)), indices=np.int32([0]), indptr=np.int32([0, 1])),
     ["data.npy: blocks (nblocks, R, C) with R >= 1 dividing 3 rows", "shape (1, 2, 2)"]),
    (dict(format=b"bsr", shape=[4, 4], data=np.ones((1, 0, 2)), indices=np.int32([0]), indptr=np.int32([0, 1, 1])),
     ["blocks (nblocks, R, C)", "(1, 0, 2)"]),
    (dict(format=b"bsr", shape=[4, 4], data=np.ones((1, 2, 2)), indices=np.int32([2]), indptr=np.int32([0, 1, 1])),
     ["indices.npy: block column indices in 0..1", "2 at position 0"]),
    (dict(format=b"bsr", shape=[4, 4], data=np.ones((2, 2)), indices=np.int32([0]), indptr=np.int32([0, 1, 1])),
     ["data.npy: a 3-D array"]),
    (dict(format=b"bsr", shape=[4, 4], data=np.ones((1, 2, 2)), indices=np.int32([0]), indptr=np.int32([0, 1])),
     ["indptr.npy: length 3 (block rows (4 / 2) + 1)"]),
    (dict(format=b"dia", shape=[4, 4], data=np.ones((2, 4)), offsets=np.int32([1, 1])),
     ["offsets.npy: distinct diagonal offsets", "1 twice"]),
    (dict(format=b"dia", shape=[4, 4], data=np.ones((2, 4)), offsets=np.int32([1])),
     ["offsets.npy: length 2 (one per diagonal in data)"]),
    (dict(format=b"dia", shape=[4, 4], data=np.ones(4), offsets=np.int32([1])), ["data.npy: a 2-D array"]),
    (dict(format=b"dia", shape=[4, 4], data=np.ones((1, 4)), offsets=np.uint64([2**64 - 1])), ["integers <="]),
    (dict(format=b"dia", shape=[4, 4], data=np.float32([[1, np.inf, 0, 0]]), offsets=np.int32([0])),
     ["1 non-finite", "inf at (row 1, col 1)"]),
])
def test_npz_other_formats_checked(tmp_path, members, fragments):
    fails(savez(tmp_path / "m.npz", **members), *fragments)


def test_npz_every_save_npz_format_round_trips(tmp_path):
    a = sp.random(12, 8, density=0.3, random_state=1, format="csr", dtype=np.float64)
    a.data[0] = 0.0  # an explicit zero: kept by every format but DIA, as scipy converts them
    for fmt in ("csr", "csc", "coo", "bsr", "dia"):
        for kind in ("matrix", "array"):
            m = sp.bsr_matrix(a, blocksize=(4, 2)) if fmt == "bsr" else a.asformat(fmt)
            if kind == "array":
                m = getattr(sp, f"{fmt}_array")(m)
            for compressed in (True, False):
                sp.save_npz(tmp_path / "m.npz", m, compressed=compressed)
                got = load(tmp_path / "m.npz", dtype=np.float64)
                ref = sp.csr_matrix(m)
                ref.sum_duplicates()
                assert got.shape == ref.shape and got.nnz == ref.nnz, (fmt, kind)
                np.testing.assert_array_equal(got.indptr, ref.indptr)
                np.testing.assert_array_equal(got.indices, ref.indices)
                np.testing.assert_array_equal(got.data, ref.data)
    d = sp.dia_matrix((np.float32([[1, 2, 3, 4], [5, 0, 7, 8]]), [0, 7]), shape=(4, 4))  # offset 7: outside
    sp.save_npz(tmp_path / "d.npz", d)
    np.testing.assert_array_equal(load(tmp_path / "d.npz").toarray(), np.diag([1, 2, 3, 4]))


@pytest.mark.parametrize("damage", ["zip directory", "member bytes", "npy header", "npy version", "truncated"])
def test_npz_damaged_archive(tmp_path, damage):
    p = savez(tmp_path / "m.npz", **csr_members())
    raw = bytearray(p.read_bytes())
    if damage == "zip directory":
        raw = raw[:-30]
    elif damage == "member bytes":  # stored (not deflated) members: the CRC catches a flipped byte
        i = raw.index(b"\x93NUMPY", raw.index(b"indices.npy")) + 130
        raw[i] ^= 0x55
    elif damage == "npy header":
        i = raw.index(b"'descr'", raw.index(b"indices.npy"))
        raw[i:i + 7] = b"'dxscr'"
    elif damage == "npy version":
        i = raw.index(b"\x93NUMPY", raw.index(b"indices.npy"))
        raw[i + 6] = 9
    else:
        raw = raw[: len(raw) // 2]
    fails(write(p, bytes(raw)), "m.npz")


def test_npz_member_sizes_bounded(tmp_path, monkeypatch):
    big = csr_members(data=np.zeros(300_000, np.float32), indices=np.zeros(300_000, np.int32),
                      indptr=np.int32([0, 300_000, 300_000, 300_000]))
    np.savez_compressed(tmp_path / "z.npz", **big)  # zeros: 1.2 MB members in a few kB
    monkeypatch.setenv(_files.MAX_DECOMPRESSED_ENV, "1000000")
    fails(tmp_path / "z.npz", "at most", "after decompression", _files.MAX_DECOMPRESSED_ENV)


# ------------------------------------------------------------------------------------ as_csr

def _broken(kind):
    m = sp.csr_matrix(np.eye(3, dtype=np.float32))
    if kind == "csr index":
        m.indices[1] = 10**6
    elif kind == "csr indptr":
        m.indptr[1] = 5
    elif kind == "csr float indices":
        m.indices = m.indices.astype(np.float64)
    elif kind == "csc index":
        m = sp.csc_matrix(np.eye(3))
        m.indices[0] = 7
    elif kind == "coo negative":
        m = sp.coo_matrix(np.eye(3))
        m.row[0] = -1
    elif kind == "bsr indptr":
        m = sp.bsr_matrix(np.eye(4), blocksize=(2, 2))
        m.indptr[1] = 9
    elif kind == "dia duplicate offsets":
        m = sp.dia_matrix(np.eye(3))
        m.offsets = np.array([0, 0])
        m.data = np.ones((2, 3))
    return m


@pytest.mark.parametrize("kind, fragments", [
    ("csr index", ["indices: column indices in 0..2", "1000000 at position 1"]),
    ("csr indptr", ["indptr: non-decreasing pointers"]),
    ("csr float indices", ["indices: an integer array"]),
    ("csc index", ["indices: row indices in 0..2", "7 at position 0"]),
    ("coo negative", ["row: row indices in 0..2", "-1 at position 0 (negative)"]),
    ("bsr indptr", ["indptr: non-decreasing pointers"]),
    ("dia duplicate offsets", ["offsets: distinct"]),
])
def test_as_csr_inconsistent_arrays(kind, fragments):
    from sparsegen.io import as_csr
    with pytest.raises(FormatError) as e:
        as_csr(_broken(kind))
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_as_csr_stale_canonical_flag():
    from sparsegen.io import as_csr
    m = sp.csr_matrix(np.eye(3, dtype=np.float32))
    assert m.has_canonical_format
    m.indices[:] = [2, 1, 0]  # the flag still says canonical; the arrays are not
    m.indptr[:] = [0, 3, 3, 3]
    a = as_csr(m)
    np.testing.assert_array_equal(a.indices, [0, 1, 2])
    np.testing.assert_array_equal(m.indices, [2, 1, 0])  # the caller's matrix is untouched


def test_as_csr_too_tall_for_memory():
    from sparsegen.io import as_csr
    m = sp.coo_matrix(([1.0], ([10**15 - 1], [0])), shape=(10**15, 1))
    with pytest.raises(SparsegenError, match="needs about .* of memory"):
        as_csr(m)


# ------------------------------------------------------------------------------------ sizes

MTX = "%%MatrixMarket matrix coordinate real general\n"


@pytest.mark.parametrize("name, text, line, fragments", [
    ("a.tsv", "999999999999999999\t1\t1\n", 1, ["999999999999999999 x 1", "inferred from the largest row index"]),
    ("b.tsv", "1 1 1\n2 999999999999 1\n", 2, ["2 x 999999999999", "column index 999999999999"]),
    ("c.mtx", MTX + "1000000000000 5 1\n1 1 1\n", 2, ["1000000000000 x 5 (the size line)"]),
    ("d.mtx", MTX + "5 99999999999999999999999 0\n", 2, ["5 x 99999999999999999999999"]),
    ("e.mtx", "%%MatrixMarket matrix array real general\n0 1000000000000000\n", 2, ["0 x 1000000000000000"]),
    ("f.smtx", "5, 100000000000, 0\n0 0 0 0 0 0\n", 1, ["5 x 100000000000 (the header)"]),
    ("g.smtx", "100000000000, 5, 0\n0 0\n", 1, ["100000000000 x 5"]),
])
def test_shapes_the_file_cannot_back(tmp_path, name, text, line, fragments):
    e = fails(write(tmp_path / name, text), "a shape that", "bytes of content back", "rows + cols <=", *fragments,
              line=line)
    assert e.line == line


def test_idx_header_sizes(tmp_path):
    p = write(tmp_path / "z-idx3-ubyte", struct.pack(">IIII", 2051, 0, 65535, 65535))
    fails(p, "a shape that", "0 x 4294836225")
    p = write(tmp_path / "h-idx3-ubyte", struct.pack(">IIII", 2051, 2**32 - 1, 2**32 - 1, 2**32 - 1) + b"\x01" * 10)
    fails(p, "bytes of pixels for 4294967295 images of 4294967295x4294967295", "10 bytes (truncated)")
    gz = write(tmp_path / "h-idx3-ubyte.gz", struct.pack(">IIII", 2051, 2**32 - 1, 2**32 - 1, 2**32 - 1) + b"\x01" * 10,
               compress=True)
    # read in chunks, never sized by the header
    fails(gz, "bytes of pixels for 4294967295 images", "10 bytes (truncated)")


def test_shape_rule_boundary(tmp_path):
    """rows + cols = the limit is read; one more is refused."""
    for extra in (0, 1):
        size = len((MTX + "1 xxxxxxx 1\n1 1 1\n").encode())  # the limit's 7 digits in place
        cols = _files.dims_limit(size) - 1 + extra
        text = MTX + f"1 {cols} 1\n1 1 1\n"
        assert len(text.encode()) == size
        p = write(tmp_path / f"edge{extra}.mtx", text)
        if extra:
            fails(p, "a shape that", line=2)
        else:
            assert load(p).shape == (1, cols)


def test_declared_shape_option_is_trusted_but_memory_checked(tmp_path, monkeypatch):
    p = write(tmp_path / "t.tsv", "1 1 1\n")
    assert load(p, shape=(5_000_000, 2)).shape == (5_000_000, 2)  # the caller's shape, not the file's
    with pytest.raises(SparsegenError, match=r"row pointers of 1000000000000000 rows needs about .* of memory"):
        load(p, shape=(10**15, 1))


def test_memory_is_asked_for_before_allocating(tmp_path, monkeypatch):
    p = write(tmp_path / "m.tsv", "1 1 1\n" * 1000)
    monkeypatch.setattr(_files, "available_memory", lambda: 20000)
    with pytest.raises(SparsegenError) as e:
        load(p)
    assert not isinstance(e.value, FormatError)
    assert "tokenizing 6000 bytes of text needs about 64.5 KiB of memory; 19.5 KiB is available" in str(e.value)
    monkeypatch.setattr(_files, "available_memory", lambda: 5000)
    with pytest.raises(SparsegenError, match="reading a file of 6000 bytes needs about 5.9 KiB"):
        load(p)


def test_memory_error_becomes_a_sparsegen_error(tmp_path, monkeypatch):
    from sparsegen.io import tsv
    p = write(tmp_path / "m.tsv", "1 1 1\n")

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 6.94 EiB for an array with shape (1000000000000000000,)")
    monkeypatch.setattr(tsv, "parse", exhausted)
    with pytest.raises(SparsegenError, match=r"m.tsv: reading it ran out of memory \(Unable to allocate 6.94 EiB"):
        load(p)


# ------------------------------------------------------------------------------------ number syntax

LENIENT = [b"1_000", b"2\x00", b"1.5\x00", b"\x002", b"+-1", b"--1", b"\xef\xbc\x91", b"1e", b"1e+", b".", b"e5",
           b".e5", b"1e5_0", b"1_0.5", b"0x10", b"1d5", b"1.5f", b"1,5", b"\xa01", b"nan\x00", b"nan(1)", b"infinit"]


@pytest.mark.parametrize("token", LENIENT, ids=repr)
def test_lenient_numbers_are_errors(tmp_path, token):
    cases = [
        ("v.tsv", b"1 1 1\n2 2 " + token + b"\n", 2, "a number (value)"),
        ("r.tsv", b"1 1 1\n" + token + b" 2 1\n", 2, "an integer row index"),
        ("v.mtx", MTX.encode() + b"2 2 2\n1 1 1\n2 2 " + token + b"\n", 4, "a number (value)"),
        ("s.mtx", MTX.encode() + b"2 " + token + b" 1\n1 1 1\n", 2, "a size line"),
        ("h.smtx", b"2, " + token + b", 1\n0 1 1\n0\n", 1, "a header line 'nrows, ncols, nnz'"),
        ("o.smtx", b"2, 3, 1\n0 " + token + b" 1\n0\n", 2, "an integer row offset"),
    ]
    for name, data, line, expected in cases:
        e = fails(write(tmp_path / name, data), expected, line=line)
        assert "expected " + expected in str(e), (name, str(e))


@pytest.mark.parametrize("token, value", [
    (b"1.", 1.0), (b".5", 0.5), (b"+.5", 0.5), (b"-0", -0.0), (b"1.e5", 1e5), (b"1E-05", 1e-5), (b"00012.5000", 12.5),
    (b"5e-400", 0.0), (b"0." + b"1" * 80, float("0." + "1" * 80)), (b"-1.5e+3", -1500.0),
])
def test_strict_numbers_still_read(tmp_path, token, value):
    # "9 9 <irregular layout>" first, so that the token after it takes the grammar-checked path
    a = load(write(tmp_path / "ok.tsv", b"9 9 1.25e-1\n1 1 " + token + b"\n"), dtype=np.float64)
    assert a.indices[0] == 0 and a.data[0] == value and np.signbit(a.data[0]) == np.signbit(value)  # (0, 0) comes first


@pytest.mark.parametrize("token", [b"nan", b"-INF", b"Infinity", b"1e400", b"-1e99999"], ids=repr)
def test_non_finite_values_named(tmp_path, token):
    fails(write(tmp_path / "n.tsv", b"1 1 1\n2 2 " + token + b"\n"), "a finite value", repr(token.decode()), line=2)


def test_number_tokens_have_a_length_limit(tmp_path):
    fails(write(tmp_path / "l.tsv", b"1 1 1\n2 2 " + b"1" * 300 + b"\n"), "of at most 256 characters", line=2)


def test_odd_file_names(tmp_path):
    with pytest.raises(FormatError, match="a file name"):
        load(str(tmp_path / "a\x00b.tsv"))
    long = tmp_path / ("x" * 300 + ".tsv")
    with pytest.raises(FormatError, match="a readable file"):
        load(long)


@pytest.mark.parametrize("name", ["m.tsv.gz", "m-idx3-ubyte.gz"])
def test_gzip_header_checked_as_rfc1952_says(tmp_path, name):
    content = b"1 1 1\n" if name.endswith("tsv.gz") else struct.pack(">IIII", 2051, 1, 2, 2) + b"\x00\x05\x00\x07"
    good = gzip.compress(content)
    reserved = bytearray(good)
    reserved[3] |= 0x20  # a reserved flag bit: "must give an error indication"
    fails(write(tmp_path / name, bytes(reserved)), "complete gzip stream")
    hcrc = bytearray(good)
    hcrc[3] |= 0x02  # FHCRC: a header CRC follows the header; these two bytes are not it
    hcrc[10:10] = b"\x00\x00"
    fails(write(tmp_path / name, bytes(hcrc)), "complete gzip stream")
    split = gzip.compress(content[:10]) + bytes(5) + gzip.compress(content[10:]) + bytes(3)  # members, padding
    assert load(write(tmp_path / name, split)).nnz == 1 if name.endswith("tsv.gz") else 2
