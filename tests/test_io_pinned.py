"""sparsegen.io pinned: every limit on both sides, every error's line, expected and found text as
written, parsed numbers and arrays against values worked out by hand, the byte streams of the
readers' inputs spelled out. Each test states one behaviour; none uses the reader under test to
compute what it expects."""
from __future__ import annotations

import gzip
import io
import os
import stat
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen.errors import FormatError, SparsegenError
from sparsegen.io import _arrays, _files, _text, idx, load, mtx, npz, smtx, tsv
from sparsegen.io import as_csr, detect_format


def error(fn, *args, **kwargs) -> FormatError:
    with pytest.raises(FormatError) as e:
        fn(*args, **kwargs)
    return e.value


def parts(e: FormatError) -> tuple:
    return (e.path, e.line, e.expected, e.found)


def dense(m) -> np.ndarray:
    return np.asarray(m.todense())


def arrays(m) -> tuple:
    return m.indptr.tolist(), m.indices.tolist(), m.data.tolist()


# ===================================================================================== _files.py
# ---------------------------------------------------------------------------------------- limits

def test_decompression_limit_default_and_spellings(monkeypatch):
    monkeypatch.delenv(_files.MAX_DECOMPRESSED_ENV, raising=False)
    assert _files.max_decompressed() == 4294967296
    for text, value in (("", 4294967296), ("   ", 4294967296), ("1", 1), (" 12 ", 12)):
        monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", text)
        assert _files.max_decompressed() == value, text


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "1e3", "٣", "x"])
def test_decompression_limit_refuses_what_is_not_a_positive_whole_number(monkeypatch, text):
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", text)
    with pytest.raises(SparsegenError) as e:
        _files.max_decompressed()
    assert str(e.value) == f"SPARSEGEN_MAX_DECOMPRESSED_BYTES must be a positive whole number of bytes, not {text!r}"


def test_dims_limit_is_2_to_22_plus_16_per_byte():
    assert _files.dims_limit(0) == 4194304
    assert _files.dims_limit(1) == 4194320
    assert _files.dims_limit(1000) == 4194304 + 16000


def test_check_shape_on_both_sides_of_the_limit():
    assert _files.check_shape("f", (4194300, 4), 0) == (4194300, 4)
    assert _files.check_shape("f", ("4194310", 10), 1) == (4194310, 10)
    e = error(_files.check_shape, "f", (4194301, 4), 0, line=7, source="the header")
    assert parts(e) == ("f", 7, "a shape that 0 bytes of content back (rows + cols <= 4194304: 2**22 + 16 per byte)",
                        "4194301 x 4 (the header)")
    e = error(_files.check_shape, "f", (4194311, 10), 1)
    assert parts(e) == ("f", None, "a shape that 1 bytes of content back (rows + cols <= 4194320: 2**22 + 16 per byte)",
                        "4194311 x 10")


class _Meminfo:
    """Stands in for open("/proc/meminfo", "rb")."""

    def __init__(self, lines):
        self.lines = lines

    def __call__(self, name, mode="r"):
        assert (name, mode) == ("/proc/meminfo", "rb")
        if self.lines is None:
            raise OSError("no /proc")
        return io.BytesIO(b"".join(self.lines))


class _Cgroup:
    """Stands in for Path(...).read_text() of the cgroup v2 files."""

    files: dict = {}

    def __init__(self, name):
        self.name = name

    def read_text(self):
        if self.name not in self.files:
            raise FileNotFoundError(self.name)
        return self.files[self.name]


def _memory(monkeypatch, meminfo, cgroup=None, sysconf=None):
    monkeypatch.setattr(_files, "open", _Meminfo(meminfo), raising=False)
    monkeypatch.setattr(_Cgroup, "files", cgroup or {})
    monkeypatch.setattr(_files, "Path", _Cgroup)
    if sysconf is not None:
        monkeypatch.setattr(_files.os, "sysconf", sysconf)
    return _files.available_memory()


def test_available_memory_reads_memavailable_in_kib(monkeypatch):
    lines = [b"MemTotal:  9999 kB\n", b"MemFree:  5 kB\n", b"MemAvailable:    1000 kB\n", b"Cached: 7 kB\n"]
    assert _memory(monkeypatch, lines) == 1024000


def test_available_memory_is_capped_by_the_cgroup_limit(monkeypatch):
    lines = [b"MemAvailable: 1000 kB\n"]
    cg = {"/sys/fs/cgroup/memory.max": "2000000\n", "/sys/fs/cgroup/memory.current": "1500000\n"}
    assert _memory(monkeypatch, lines, cg) == 500000
    cg = {"/sys/fs/cgroup/memory.max": "3000000\n", "/sys/fs/cgroup/memory.current": "1000000\n"}
    assert _memory(monkeypatch, lines, cg) == 1024000  # the cgroup leaves more than the machine has
    cg = {"/sys/fs/cgroup/memory.max": "1000\n", "/sys/fs/cgroup/memory.current": "5000\n"}
    assert _memory(monkeypatch, lines, cg) == 0  # over its limit already: nothing, never negative
    cg = {"/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/memory.current": "5000\n"}
    assert _memory(monkeypatch, lines, cg) == 1024000  # no limit
    cg = {"/sys/fs/cgroup/memory.max": "1000\n", "/sys/fs/cgroup/memory.current": "x\n"}
    assert _memory(monkeypatch, lines, cg) == 1024000
    cg = {"/sys/fs/cgroup/memory.max": "1000\n"}
    assert _memory(monkeypatch, lines, cg) == 1024000  # memory.current unreadable


def test_available_memory_falls_back_to_sysconf(monkeypatch):
    pages = {"SC_AVPHYS_PAGES": 3, "SC_PAGE_SIZE": 4096}
    assert _memory(monkeypatch, [b"MemTotal: 1 kB\n"], sysconf=pages.__getitem__) == 12288
    assert _memory(monkeypatch, None, sysconf=pages.__getitem__) == 12288
    assert _memory(monkeypatch, [b"MemAvailable: x kB\n"], sysconf=pages.__getitem__) == 12288
    cg = {"/sys/fs/cgroup/memory.max": "8192", "/sys/fs/cgroup/memory.current": "0"}
    assert _memory(monkeypatch, None, cg, sysconf=pages.__getitem__) == 8192

    def no_sysconf(name):
        raise ValueError(name)
    assert _memory(monkeypatch, None, cg, sysconf=no_sysconf) is None


@pytest.mark.parametrize("n, text", [(0, "0 bytes"), (1023, "1023 bytes"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                     (1024**2 - 1, "1024.0 KiB"), (1024**2, "1.0 MiB"), (5 * 1024**3, "5.0 GiB"),
                                     (1024**4, "1.0 TiB"), (1024**5, "1.0 PiB"), (1024**6, "1024.0 PiB")])
def test_human_bytes(n, text):
    assert _files.human_bytes(n) == text


def test_require_memory_on_both_sides(monkeypatch):
    monkeypatch.setattr(_files, "available_memory", lambda: 2048)
    _files.require_memory(2048, "x")
    with pytest.raises(SparsegenError) as e:
        _files.require_memory(2049, "building it", "a/b.tsv")
    assert str(e.value) == "a/b.tsv: building it needs about 2.0 KiB of memory; 2.0 KiB is available"
    assert not isinstance(e.value, FormatError)
    with pytest.raises(SparsegenError) as e:
        _files.require_memory(10**6, "reading")
    assert str(e.value) == "reading needs about 976.6 KiB of memory; 2.0 KiB is available"
    monkeypatch.setattr(_files, "available_memory", lambda: None)
    _files.require_memory(10**18, "anything")  # unknown: not refused


# ----------------------------------------------------------------------------------------- files

@pytest.mark.parametrize("mode, text", [(stat.S_IFDIR, "a directory"), (stat.S_IFIFO, "a FIFO (named pipe)"),
                                        (stat.S_IFCHR, "a character device"), (stat.S_IFBLK, "a block device"),
                                        (stat.S_IFSOCK, "a socket"), (stat.S_IFLNK, "not a regular file")])
def test_kind_names_each_file_type(mode, text):
    assert _files._kind(mode | 0o644) == text


def test_open_regular_errors(tmp_path):
    e = error(_files.open_regular, tmp_path / "none.tsv")
    assert parts(e) == (str(tmp_path / "none.tsv"), None, "an existing file", "no such file")
    e = error(_files.open_regular, str(tmp_path))
    assert parts(e) == (str(tmp_path), None, "a regular file", "a directory")
    e = error(_files.open_regular, "a\0b.tsv")
    assert parts(e) == ("'a\\x00b.tsv'", None, "a file name", "embedded null byte")
    (tmp_path / "f").touch()
    e = error(_files.open_regular, tmp_path / "f" / "x.tsv")
    assert parts(e) == (str(tmp_path / "f" / "x.tsv"), None, "a readable file", "Not a directory")


def test_open_regular_returns_the_file_and_its_size(tmp_path):
    p = tmp_path / "a.bin"
    p.write_bytes(b"12345")
    f, size = _files.open_regular(p)
    with f:
        assert (f.read(), size) == (b"12345", 5)
        assert f.mode == "rb"


def test_open_regular_checks_the_opened_file_again(tmp_path, monkeypatch):
    p = tmp_path / "a.tsv"
    p.write_text("1 1 1\n")
    real = os.fstat

    def fstat_says_fifo(fd):
        st = real(fd)
        return os.stat_result((stat.S_IFIFO | 0o644,) + tuple(st)[1:])
    monkeypatch.setattr(_files.os, "fstat", fstat_says_fifo)
    e = error(_files.open_regular, p)
    assert parts(e) == (str(p), None, "a regular file", "a FIFO (named pipe)")


def test_read_bytes_gunzips_by_content_not_by_name(tmp_path):
    (tmp_path / "a.tsv").write_bytes(gzip.compress(b"1 1 2\n"))
    assert _files.read_bytes(tmp_path / "a.tsv") == b"1 1 2\n"
    (tmp_path / "b.tsv").write_bytes(b"\x1f")  # one byte of the magic is not the magic
    assert _files.read_bytes(tmp_path / "b.tsv") == b"\x1f"
    for name in ("c.tsv.gz", "C.TSV.GZ"):
        (tmp_path / name).write_bytes(b"1 1 2\n")
        e = error(_files.read_bytes, tmp_path / name)
        assert parts(e) == (str(tmp_path / name), None, "gzip data (the name ends in .gz)", "first bytes b'1 1 '")


def test_gunzip_limit_on_both_sides():
    raw = gzip.compress(b"x" * 100)
    assert _files.gunzip(raw, "p", limit=100) == b"x" * 100
    e = error(_files.gunzip, raw, "p", limit=99)
    assert parts(e) == ("p", None, "at most 99 bytes after decompression (the limit SPARSEGEN_MAX_DECOMPRESSED_BYTES)",
                        "more")


def test_gunzip_default_limit_is_the_variable(monkeypatch):
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "10")
    assert _files.gunzip(gzip.compress(b"0123456789"), "p") == b"0123456789"
    e = error(_files.gunzip, gzip.compress(b"0123456789A"), "p")
    assert e.expected.startswith("at most 10 bytes after decompression")


def test_gunzip_members_padding_and_what_follows():
    one, two = gzip.compress(b"ab"), gzip.compress(b"cd")
    assert _files.gunzip(one + two, "p") == b"abcd"
    assert _files.gunzip(one + b"\0" * 5 + two + b"\0", "p") == b"abcd"
    assert _files.gunzip(one + b"\0\0\0", "p") == b"ab"
    e = error(_files.gunzip, one + b"\0\0x", "p")
    assert parts(e) == ("p", None, "a complete gzip stream", "1 byte of other data after a member")
    e = error(_files.gunzip, one + b"xy", "p")
    assert parts(e) == ("p", None, "a complete gzip stream (members only)", "other data after a member")
    e = error(_files.gunzip, one + b"\x1f", "p")
    assert e.found == "1 byte of other data after a member"


def test_gunzip_damage_is_named():
    raw = gzip.compress(b"abcdef" * 10)
    e = error(_files.gunzip, raw[:-3], "p")
    assert parts(e) == ("p", None, "a complete gzip stream",
                        "EOFError: the stream ends before its end-of-stream marker")
    bad = bytearray(raw)
    bad[3] = 0xE0  # reserved header flag bits
    e = error(_files.gunzip, bytes(bad), "p")
    assert e.found.startswith("zlib.error: ")


def test_gunzip_reads_a_file_in_pieces_across_members():
    # a member boundary inside a read: the second member's first bytes come from the rest of the file
    data = os.urandom(200000)
    raw = gzip.compress(data[:150000]) + gzip.compress(data[150000:])
    g = _files.Gunzip(io.BytesIO(raw), "p")
    out = g.read(100000) + g.read(100000) + g.read(100000)
    assert out == data
    assert g.read(5) == b""


def test_gunzip_read_error_is_a_format_error():
    class Broken(io.BytesIO):
        def read(self, n=-1):
            raise OSError(5, "Input/output error")
    e = error(_files.Gunzip(Broken(b""), "p").read, 10)
    assert parts(e) == ("p", None, "a readable file", "Input/output error")


def test_source_plain_and_gzip(tmp_path):
    (tmp_path / "a.idx").write_bytes(b"0123456789")
    with _files.Source(tmp_path / "a.idx") as s:
        assert (s.gzip, s.size) == (False, 10)
        assert s.read(4) == b"0123" and s.read(100) == b"456789" and s.read(1) == b""
        assert s.consumed == 10
    (tmp_path / "b.idx").write_bytes(gzip.compress(b"0123456789"))
    with _files.Source(tmp_path / "b.idx") as s:
        assert (s.gzip, s.size) == (True, None)
        assert s.read(3) == b"012" and s.read(7) == b"3456789"
    assert s.file.closed


def test_source_stops_gzip_at_the_limit(tmp_path, monkeypatch):
    (tmp_path / "b.idx").write_bytes(gzip.compress(b"0123456789"))
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "10")
    with _files.Source(tmp_path / "b.idx") as s:
        assert s.read(4) == b"0123"
        assert s.read(6) == b"456789"  # exactly the limit
        assert s.read(5) == b""
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "9")
    with _files.Source(tmp_path / "b.idx") as s:
        assert s.read(9) == b"012345678"
        e = error(s.read, 1)
        assert parts(e) == (str(tmp_path / "b.idx"), None,
                            "at most 9 bytes after decompression (the limit SPARSEGEN_MAX_DECOMPRESSED_BYTES)", "more")
    monkeypatch.setattr(_files, "READ_CHUNK", 2)  # a read larger than a chunk goes chunk by chunk
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "100")
    with _files.Source(tmp_path / "b.idx") as s:
        assert s.read(7) == b"0123456"


# ====================================================================================== _text.py
# ---------------------------------------------------------------------------------------- tokens

def test_value_dtype_takes_floating_dtypes_only():
    assert [_text.value_dtype(d) for d in ("float16", np.float32, "f8")] == [np.float16, np.float32, np.float64]
    for bad in ("int32", "complex64", bool):
        with pytest.raises(ValueError) as e:
            _text.value_dtype(bad)
        assert str(e.value).startswith("dtype must be a floating dtype (float16, float32, float64), not ")


def test_tokens_offsets_lines_and_newlines():
    # \v and \f separate tokens but end no line; \r\n and blank lines end one
    tok = _text.Tokens(b"ab  c\r\n\n d\tee\x0bf\x0cg", "p")
    assert tok.count == 6
    assert [tok.offset(t) for t in range(6)] == [0, 4, 9, 11, 14, 16]
    assert [tok.line_of(t) for t in range(6)] == [1, 1, 3, 3, 3, 3]
    assert [tok.text(t) for t in range(6)] == ["'ab'", "'c'", "'d'", "'ee'", "'f'", "'g'"]
    assert tok.newline_after().tolist() == [False, True, False, False, False, True]
    assert tok.end_line() == 4


def test_tokens_of_a_slice_count_lines_from_first_line():
    tok = _text.Tokens(b"xx 12 -3\n+4 5\n", "p", first_line=3, start=3)
    assert tok.count == 4
    assert [tok.offset(t) for t in range(4)] == [3, 6, 9, 12]
    assert [tok.line_of(t) for t in range(4)] == [3, 3, 4, 4]
    assert tok.end_line() == 5
    assert tok.ints(slice(None), "v").tolist() == [12, -3, 4, 5]
    assert _text.Tokens(b"abc def", "p", start=1, stop=5).count == 2  # 'bc', 'd'
    assert _text.Tokens(b"", "p", first_line=5).end_line() == 5
    assert _text.Tokens(b" \n\n", "p", first_line=2).end_line() == 2


def test_tokens_long_gaps_count_their_newlines():
    tok = _text.Tokens(b"1  2\n\n 3\r\n4 \n", "p")
    assert tok.newline_after().tolist() == [False, True, True, True]
    tok = _text.Tokens(b"1\n2", "p")
    assert tok.newline_after().tolist() == [True, True]
    tok = _text.Tokens(b"1 2 3", "p")
    assert tok.newline_after().tolist() == [False, False, True]


def test_token_text_and_line_text_are_shortened():
    word = b"x" * 41
    tok = _text.Tokens(b"a\n  " + word + b" y  \nz", "p")
    assert tok.text(1) == repr("x" * 40 + "...")
    assert tok.text(0) == "'a'"
    assert tok.line_text(1) == repr(("x" * 41 + " y")[:60])
    assert tok.line_text(3) == "'z'"
    assert _text._shorten(b"x" * 40) == repr("x" * 40)
    line = b"y" * 61
    tok = _text.Tokens(line, "p")
    assert tok.line_text(0) == repr("y" * 60 + "...")
    assert _text._shorten(b"\xff") == repr("\ufffd")


def test_check_rows_counts_lines_of_width_fields():
    assert _text.Tokens(b"1 2 3\n4 5 6\n", "p").check_rows(3, "r c v") == 2
    assert _text.Tokens(b"1 2 3\r\n\r\n4 5 6", "p").check_rows(3, "r c v") == 2
    assert _text.Tokens(b"7\n8\n", "p").check_rows(1, "value") == 2


@pytest.mark.parametrize("text, line, found", [
    (b"1 2 3\n4 5\n6 7 8\n", 2, "2 fields: '4 5'"),
    (b"1 2 3\n4 5 6 7\n", 2, "4 fields: '4 5 6 7'"),
    (b"1 2 3 4 5 6\n", 1, "6 fields: '1 2 3 4 5 6'"),
    (b"1 2 3\n\n4\n5 6 7\n8 9\n", 3, "1 field: '4'"),
    (b"1 2\n3\n4 5 6\n", 1, "2 fields: '1 2'"),
])
def test_check_rows_names_the_first_bad_line(text, line, found):
    e = error(_text.Tokens(text, "p").check_rows, 3, "r c v")
    assert parts(e) == ("p", line, "3 whitespace-separated fields (r c v)", found)


# --------------------------------------------------------------------------------------- numbers

def ints(text: bytes, what="row index"):
    return _text.Tokens(text, "p").ints(slice(None), what)


def floats(text: bytes, what="value"):
    return _text.Tokens(text, "p").floats(slice(None), what)


def test_ints_up_to_18_digits_with_signs():
    got = ints(b"0 7 -7 +7 0042 123456789012345678 -999999999999999999 +100000000000000000")
    assert got.dtype == np.int64
    assert got.tolist() == [0, 7, -7, 7, 42, 123456789012345678, -999999999999999999, 100000000000000000]


def test_ints_by_index_array_and_slice():
    tok = _text.Tokens(b"10 20 30 40 50", "p")
    assert tok.ints(np.array([4, 0, 2]), "v").tolist() == [50, 10, 30]
    assert tok.ints(slice(1, None, 2), "v").tolist() == [20, 40]
    assert tok.ints(np.array([], np.int64), "v").tolist() == []


@pytest.mark.parametrize("token, expected", [
    (b"1234567890123456789", "an integer row index of at most 18 digits"),
    (b"-1234567890123456789", "an integer row index of at most 18 digits"),
    (b"+", "an integer row index"), (b"-", "an integer row index"), (b"1:", "an integer row index"),
    (b"1/", "an integer row index"), (b":1", "an integer row index"), (b"+-1", "an integer row index"),
    (b"--1", "an integer row index"), (b"1-", "an integer row index"), (b"1+", "an integer row index"),
    (b"1.0", "an integer row index"), (b"1e3", "an integer row index"), (b"\xc3\xa9", "an integer row index"),
])
def test_ints_refuse_what_is_not_an_integer(token, expected):
    e = error(ints, b"1 2\n3 " + token + b"\n")
    assert parts(e) == ("p", 2, expected, repr(token.decode("utf-8", "replace")))


def test_ints_name_the_first_bad_token_of_a_later_chunk(monkeypatch):
    monkeypatch.setattr(_text, "CHUNK", 2)
    tok = _text.Tokens(b"1 2 3\n4 x 6 y", "p")
    assert tok.ints(slice(0, 4), "v").tolist() == [1, 2, 3, 4]
    e = error(tok.ints, slice(None), "v")
    assert (e.line, e.found) == (2, "'x'")


def test_floats_fast_path_values():
    got = floats(b"1e22 -2.5 +3 .5 5. 1E5 1e+5 1e-5 0.1 123456789012345 1.5e-22 0 -0")
    assert got.tolist() == [1e22, -2.5, 3.0, 0.5, 5.0, 1e5, 1e5, 1e-5, 0.1, 123456789012345.0, 1.5e-22, 0.0, -0.0]
    assert np.signbit(got[-1])


def test_floats_past_the_exact_powers_read_correctly():
    # 10**23 is not a float64: one multiply by it would round twice
    assert floats(b"1e23 1e23").tolist() == [1e23, 1e23]
    assert floats(b"1e22 1e23 12e21 1e-23 1.5e-22").tolist() == [1e22, 1e23, 1.2e22, 1e-23, 1.5e-22]
    assert floats(b"8.988465674311579e307").tolist() == [8.988465674311579e307]
    assert floats(b"1234567890123456").tolist() == [1234567890123456.0]
    assert floats(b"0.30000000000000004 1.7976931348623157e308 5e-324").tolist() == [
        0.30000000000000004, 1.7976931348623157e308, 5e-324]


def test_floats_mixed_layouts_by_index():
    tok = _text.Tokens(b"0.5 1e-05 3 2.25 7 -1e-05", "p")
    assert tok.floats(slice(None), "v").tolist() == [0.5, 1e-05, 3.0, 2.25, 7.0, -1e-05]
    assert tok.floats(np.array([5, 0]), "v").tolist() == [-1e-05, 0.5]


def test_floats_of_many_layouts_and_a_later_chunk(monkeypatch):
    monkeypatch.setattr(_text, "CHUNK", 3)
    text = b" ".join(f"{v}".encode() for v in (1.5, 22.25, 3e-7, 4, 0.125, 6e10, -7.5, 8.0625, 9e-3, 1e-300, 11))
    assert floats(text).tolist() == [1.5, 22.25, 3e-7, 4.0, 0.125, 6e10, -7.5, 8.0625, 9e-3, 1e-300, 11.0]


def test_floats_non_finite_words():
    got = floats(b"nan inf -Infinity +NaN INF -inf +infinity")
    assert np.isnan(got[[0, 3]]).all()
    assert got[[1, 2, 4, 5, 6]].tolist() == [np.inf, -np.inf, np.inf, -np.inf, np.inf]


@pytest.mark.parametrize("token", [b"1e", b"e5", b"1.2.3", b"1e5e", b"--1", b".", b"+.", b"1e+", b"infinit",
                                   b"0x10", b"1_0", b"nana", b"in", b"+-1", b"1e1.5", b".e1", b"-", b"1,5",
                                   b"infinityy", b"\xc3\xa9"])
def test_floats_refuse_what_is_not_a_number(token):
    e = error(floats, b"1.5\n2 " + token)
    assert parts(e) == ("p", 2, "a number (value)", repr(token.decode("utf-8", "replace")))


def test_floats_slow_path_grammar_accepts():
    got = floats(b"1.25e+002 -.5E-1 +5.e0 12345678901234567890 1.0000000000000000001 007.5e0001")
    assert got.tolist() == [125.0, -0.05, 5.0, 1.2345678901234567e19, 1.0, 75.0]


def test_number_length_limit_on_both_sides():
    ok = b"1" + b"0" * 255  # 256 characters
    assert floats(ok).tolist() == [1e255]
    e = error(floats, b"0.5 " + ok + b"0")
    assert parts(e) == ("p", 1, "a number (value) of at most 256 characters", repr("1" + "0" * 39 + "..."))


def test_float_grammar_on_a_table_of_tokens():
    words = [b"1", b"+1", b"1.", b".1", b"1e1", b"1E-1", b"nan", b"-inf", b"Infinity", b"", b"+", b"e", b"1e",
             b"1.e", b"1..", b"n", b"nan0"]
    width = max(map(len, words))
    chars = np.zeros((len(words), width), np.uint8)
    for i, w in enumerate(words):
        chars[i, :len(w)] = np.frombuffer(w, np.uint8)
    lens = np.array([len(w) for w in words])
    inside = np.arange(width) < lens[:, None]
    got = _text._float_grammar(chars, inside, lens)
    assert got.tolist() == [True, True, True, True, True, True, True, True, True, False, False, False, False,
                            False, False, False, False]


def test_layout_of_plain_decimals():
    assert _text._layout(b"12.5e-3") == (["m", "m", ".", "m", "e", "s", "x"], 1)
    assert _text._layout(b"5.") == (["m", "."], 0)
    assert _text._layout(b".25") == ([".", "m", "m"], 2)
    assert _text._layout(b"1E+123") == (["m", "e", "s", "x", "x", "x"], 0)
    assert _text._layout(b"123456789012345") == (["m"] * 15, 0)
    for token in (b"1234567890123456", b"1e1234", b"e5", b"1e", b"1+", b"", b"1.2.3", b"1e5.", b"1e-", b".e5",
                  b"-1", b"1e+-5", b"1ee5", b"nan"):
        assert _text._layout(token) is None, token


# -------------------------------------------------------------------------------------- matrices

def test_indptr_of_rows():
    assert _text.indptr_of_rows(np.array([0, 0, 2, 2, 2]), 4).tolist() == [0, 2, 2, 5, 5]
    assert _text.indptr_of_rows(np.array([], np.int64), 2).tolist() == [0, 0, 0]
    assert _text.indptr_of_rows(np.array([], np.int64), 2).dtype == np.int64


def test_indptr_of_rows_asks_for_16_bytes_a_row(monkeypatch):
    monkeypatch.setattr(_files, "available_memory", lambda: 16 * 11)
    _text.indptr_of_rows(np.array([0]), 10)
    with pytest.raises(SparsegenError) as e:
        _text.indptr_of_rows(np.array([0]), 11, "f")
    assert str(e.value) == ("f: building the row pointers of 11 rows needs about 192 bytes of memory; "
                            "176 bytes is available")


def test_tokens_ask_for_11_bytes_a_byte(monkeypatch):
    monkeypatch.setattr(_files, "available_memory", lambda: 110)
    _text.Tokens(b"1 2 3 4 5 ", "p")
    with pytest.raises(SparsegenError) as e:
        _text.Tokens(b"1 2 3 4 5 6", "p")
    assert str(e.value) == "p: tokenizing 11 bytes of text needs about 121 bytes of memory; 110 bytes is available"


@pytest.mark.parametrize("word, value", [(b"0", 0), (b"12", 12), (b"+3", 3), (b"-4", -4), (b"007", 7)])
def test_strict_int_reads(word, value):
    assert _text.strict_int(word) == value


@pytest.mark.parametrize("word", [b"", b"+", b"-", b"1_000", b" 1", b"1 ", b"1\0", b"\xd9\xa3", b"1.0", b"+-1", b"x"])
def test_strict_int_refuses(word):
    assert _text.strict_int(word) is None


def test_index_dtype_at_the_int32_limit():
    assert _text.index_dtype((2147483647, 1), 0) == np.int32
    assert _text.index_dtype((1, 2147483647), 2147483647) == np.int32
    assert _text.index_dtype((2147483648, 1), 0) == np.int64
    assert _text.index_dtype((1, 2147483648), 0) == np.int64
    assert _text.index_dtype((1, 1), 2147483648) == np.int64
    assert _text.index_dtype((), 0) == np.int32


def test_make_csr_sets_the_canonical_flags_and_index_dtype():
    m = _text.make_csr(np.array([1.0, 2.0]), np.array([1, 0], np.int64), np.array([0, 1, 2], np.int64), (2, 3))
    assert m.shape == (2, 3) and m.indices.dtype == np.int32 and m.indptr.dtype == np.int32
    assert m.has_sorted_indices and m.has_canonical_format
    assert arrays(m) == ([0, 1, 2], [1, 0], [1.0, 2.0])


def _no_duplicates(i, j):
    raise AssertionError((i, j))


def test_coo_to_csr_sorts_and_keeps_sorted_input():
    m = _text.coo_to_csr(np.array([1, 0, 1]), np.array([0, 2, 1]), np.array([1.0, 2.0, 3.0]), (2, 3),
                         duplicate=_no_duplicates)
    assert arrays(m) == ([0, 1, 3], [2, 0, 1], [2.0, 1.0, 3.0])
    m = _text.coo_to_csr(np.array([0, 1]), np.array([2, 0]), np.array([5.0, 6.0]), (2, 3), duplicate=_no_duplicates)
    assert arrays(m) == ([0, 1, 2], [2, 0], [5.0, 6.0])
    m = _text.coo_to_csr(np.array([], np.int64), np.array([], np.int64), np.array([]), (2, 2), duplicate=_no_duplicates)
    assert arrays(m) == ([0, 0, 0], [], [])


def test_coo_to_csr_of_a_huge_shape_sorts_by_row_then_column():
    # 8 x 2**61: row * n + col overflows int64 past row 3, so positions are sorted as pairs
    n = 2**61
    m = _text.coo_to_csr(np.array([7, 0, 7, 0]), np.array([n - 1, 5, 2, n - 2]), np.array([1.0, 2.0, 3.0, 4.0]),
                         (8, n), duplicate=_no_duplicates)
    assert m.indptr.tolist() == [0, 2, 2, 2, 2, 2, 2, 2, 4]
    assert m.indices.tolist() == [5, n - 2, 2, n - 1] and m.data.tolist() == [2.0, 4.0, 3.0, 1.0]


@pytest.mark.parametrize("shape", [(4, 4), (8, 2**61)])
def test_coo_to_csr_reports_the_earliest_completed_duplicate(shape):
    # entries 0..5; (1,1) at 1 and 4; (2,2) at 2 and 3: the pair whose later entry comes first is (2, 3)
    rows = np.array([0, 1, 2, 2, 1, 3])
    cols = np.array([0, 1, 2, 2, 1, 3])
    seen = []

    def duplicate(i, j):
        seen.append((i, j))
        raise ValueError("dup")
    with pytest.raises(ValueError):
        _text.coo_to_csr(rows, cols, np.arange(6.0), shape, duplicate=duplicate)
    assert seen == [(2, 3)]
    seen.clear()
    with pytest.raises(ValueError):  # three of one position: the first two
        _text.coo_to_csr(np.array([1, 0, 1, 1]), np.array([1, 0, 1, 1]), np.arange(4.0), shape, duplicate=duplicate)
    assert seen == [(0, 2)]


def test_cast_values_refuses_overflow_and_names_its_line():
    v = np.array([1.0, 3.4e38, 1e39, -1e300])
    e = error(_text.cast_values, v, np.dtype(np.float32), "p", where=lambda i: 10 + i)
    assert parts(e) == ("p", 12, "values representable in float32", "1e+39, which overflows it")
    e = error(_text.cast_values, v[2:], np.dtype(np.float32), "p")
    assert (e.line, e.found) == (None, "1e+39, which overflows it")
    assert _text.cast_values(v[:2], np.dtype(np.float32), "p").tolist() == [1.0, np.float32(3.4e38)]
    assert _text.cast_values(np.array([np.inf]), np.dtype(np.float64), "p").tolist() == [np.inf]
    assert _text.cast_values(np.array([6e4], np.float32), np.dtype(np.float16), "p").tolist() == [np.float16(6e4)]
    e = error(_text.cast_values, np.array([7e4, 6.6e4]), np.dtype(np.float16), "p")
    assert e.found == "70000.0, which overflows it"
    widened = _text.cast_values(np.array([1e38], np.float32), np.dtype(np.float64), "p")
    assert widened.dtype == np.float64


def test_check_value_dtype():
    for dt in ("bool", "int8", "uint64", "float16"):
        _text.check_value_dtype(np.dtype(dt), "p")
    e = error(_text.check_value_dtype, np.dtype("complex64"), "p")
    assert parts(e) == ("p", None, "real numeric values (bool, integer or float)", "complex dtype complex64")
    e = error(_text.check_value_dtype, np.dtype("U3"), "p", "member data.npy")
    assert parts(e) == ("p", None, "member data.npy: real numeric values (bool, integer or float)",
                        "non-numeric dtype <U3")


def test_check_finite_counts_and_places_the_first():
    _text.check_finite(np.array([1, 2]), "p", None)  # integers: nothing to check
    _text.check_finite(np.array([1.0, -2.0]), "p", None)
    e = error(_text.check_finite, np.array([[1.0, np.inf], [np.nan, np.nan]]), "p", lambda i: (i // 2, i % 2 + 10))
    assert parts(e) == ("p", None, "finite values",
                        "3 non-finite value(s) (NaN or inf), the first inf at (row 0, col 11) (0-based)")


# ----------------------------------------------------------------------- coordinate text entries

def test_check_indices_bounds_on_both_sides():
    tok = _text.Tokens(b"1 1 1\n3 4 1\n", "p")
    idx = np.array([1, 3])
    assert _text.check_indices(tok, idx, 0, 3, 1, 3, "row").tolist() == [0, 2]
    assert _text.check_indices(tok, idx, 0, 3, 0, 4, "row").tolist() == [1, 3]
    assert _text.check_indices(tok, idx, 0, 3, 1, None, "row").tolist() == [0, 2]
    e = error(_text.check_indices, tok, idx, 0, 3, 1, 2, "row", "declared shape (2, 2)")
    assert parts(e) == ("p", 2, "a row index in 1..2", "3, past the declared shape (2, 2)")
    e = error(_text.check_indices, tok, idx, 1, 3, 0, 3, "column", "shape")
    assert parts(e) == ("p", 2, "a column index in 0..2", "3, past the shape")


def test_check_indices_below_the_base():
    tok = _text.Tokens(b"1 1 1\n0 4 1\n-2 1 1\n", "p")
    e = error(_text.check_indices, tok, np.array([1, 0, -2]), 0, 3, 1, 9, "row")
    assert parts(e) == ("p", 2, "a row index in 1..9", "0 (indices are 1-based)")
    e = error(_text.check_indices, tok, np.array([1, 1, -2]), 0, 3, 1, None, "row")
    assert parts(e) == ("p", 3, "a row index >= 1", "-2 (negative)")
    e = error(_text.check_indices, tok, np.array([1, 1, -2]), 0, 3, 0, None, "row")
    assert parts(e) == ("p", 3, "a row index >= 0", "-2 (negative)")


def test_check_finite_entries_names_the_token_and_the_count():
    tok = _text.Tokens(b"1 1 1\n2 2 inf\n3 3 nan\n", "p")
    e = error(_text.check_finite_entries, tok, np.array([1.0, np.inf, np.nan]), 2, 3)
    assert parts(e) == ("p", 2, "a finite value", "'inf' (2 non-finite value(s) in the file)")
    _text.check_finite_entries(tok, np.array([1.0, 2.0, 3.0]), 2, 3)


def test_duplicate_reporter_names_both_lines():
    tok = _text.Tokens(b"1 1 1\n2 2 1\n3 3 1\n2 2 5\n", "p")
    rows, cols = np.array([0, 1, 2, 1]), np.array([0, 1, 2, 1])
    e = error(_text.duplicate_reporter(tok, 3, rows, cols, 1), 1, 3)
    assert parts(e) == ("p", 4, "at most one entry per (row, col) (duplicates are not allowed)",
                        "a second entry for (row 2, col 2); the first is on line 2")
    e = error(_text.duplicate_reporter(tok, 3, rows, cols, 0), 1, 3)
    assert e.found == "a second entry for (row 1, col 1); the first is on line 2"


def test_duplicate_reporter_after_symmetric_expansion():
    # entries (2,1) on line 1 and (1,2) on line 2; the mirror of entry 0 (index 2) lands on entry 1
    tok = _text.Tokens(b"2 1\n1 2\n", "p")
    rows, cols = np.array([1, 0, 0]), np.array([0, 1, 1])
    entry_of = np.array([0, 1, 0])
    e = error(_text.duplicate_reporter(tok, 2, rows, cols, 1, entry_of), 1, 2)
    assert parts(e) == ("p", 2, "at most one entry per (row, col) (duplicates are not allowed)",
                        "a second entry for (row 1, col 2); the first is on line 1 (after symmetric expansion)")


# ======================================================================================== tsv.py

def test_tsv_reads_one_based_entries_and_infers_the_shape():
    m = tsv.parse(b"1 1 1\n3 2 2.5\n")
    assert (m.shape, arrays(m), m.dtype) == ((3, 2), ([0, 1, 1, 2], [0, 1], [1.0, 2.5]), np.float32)
    m = tsv.parse(b"0 0 1\n2 1 2.5\n", one_based=False, dtype=np.float64)
    assert (m.shape, arrays(m), m.dtype) == ((3, 2), ([0, 1, 1, 2], [0, 1], [1.0, 2.5]), np.float64)
    m = tsv.parse(b"2\t1\t-4\n", shape=(5, 6))
    assert (m.shape, arrays(m)) == ((5, 6), ([0, 0, 1, 1, 1, 1], [0], [-4.0]))


def test_tsv_declared_shape_bounds_the_indices_on_both_sides():
    assert tsv.parse(b"1 1 1\n3 2 2.5\n", shape=(3, 2)).shape == (3, 2)
    e = error(tsv.parse, b"1 1 1\n3 2 2.5\n", shape=(2, 2))
    assert parts(e) == ("<bytes>", 2, "a row index in 1..2", "3, past the declared shape (2, 2)")
    e = error(tsv.parse, b"1 1 1\n3 2 2.5\n", shape=(3, 1))
    assert parts(e) == ("<bytes>", 2, "a column index in 1..1", "2, past the declared shape (3, 1)")
    e = error(tsv.parse, b"0 0 1\n3 2 2.5\n", one_based=False, shape=(3, 3))
    assert parts(e) == ("<bytes>", 2, "a row index in 0..2", "3, past the declared shape (3, 3)")


@pytest.mark.parametrize("text, line, expected, found", [
    (b"0 1 1\n", 1, "a row index >= 1", "0 (indices are 1-based)"),
    (b"1 0 1\n", 1, "a column index >= 1", "0 (indices are 1-based)"),
    (b"1 1 1\n-1 1 1\n", 2, "a row index >= 1", "-1 (negative)"),
    (b"  \n", None, "lines of row col value", "an empty file"),
    (b"1 1 1\n1 1 2.5\n", 2, "at most one entry per (row, col) (duplicates are not allowed)",
     "a second entry for (row 1, col 1); the first is on line 1"),
    (b"1 1 1e39\n", 1, "values representable in float32", "1e+39, which overflows it"),
    (b"1 1 1\n2 2 2\n3 3 inf\n", 3, "a finite value", "'inf' (1 non-finite value(s) in the file)"),
    (b"1 1\n", 1, "3 whitespace-separated fields (row col value)", "2 fields: '1 1'"),
    (b"1 1 x\n", 1, "a number (value)", "'x'"),
    (b"1.5 1 1\n", 1, "an integer row index", "'1.5'"),
    (b"1 c 1\n", 1, "an integer column index", "'c'"),
])
def test_tsv_errors(text, line, expected, found):
    assert parts(error(tsv.parse, text)) == ("<bytes>", line, expected, found)


def test_tsv_float64_keeps_what_float32_refuses():
    assert tsv.parse(b"1 1 1e39\n", dtype="float64").data.tolist() == [1e39]


def test_tsv_overflow_names_the_line_of_the_value():
    e = error(tsv.parse, b"1 1 1\n2 2 2\n3 3 1e39\n")
    assert e.line == 3


def test_tsv_inferred_shape_is_limited_by_the_file_length():
    # 12 bytes back rows + cols <= 2**22 + 192 = 4194496
    assert tsv.parse(b"1 4194495 1\n").shape == (1, 4194495)
    e = error(tsv.parse, b"1 4194496 1\n")
    assert parts(e) == ("<bytes>", 1,
                        "a shape that 12 bytes of content back (rows + cols <= 4194496: 2**22 + 16 per byte)",
                        "1 x 4194496 (inferred from the largest row index 1 and column index 4194496)")
    e = error(tsv.parse, b"1 1 1\n4194600 1 1\n")  # the line of the larger of the two
    assert e.line == 2 and e.found.startswith("4194600 x 1 ")
    e = error(tsv.parse, b"1 4194600 1\n9 1 1\n")
    assert e.line == 1 and e.found.startswith("9 x 4194600 ")
    e = error(tsv.parse, b"0 4194600 1\n9 1 1\n", one_based=False)
    assert e.found == "10 x 4194601 (inferred from the largest row index 9 and column index 4194600)"
    e = error(tsv.parse, b"4194400 4194400 1\n")  # equal sizes: the row's token
    assert (e.line, e.found) == (
        1, "4194400 x 4194400 (inferred from the largest row index 4194400 and column index 4194400)")


def test_tsv_equal_sizes_point_at_the_row_token():
    # 3 * r when m >= n: with the row on line 2 and the column on line 1, line 2 is named
    e = error(tsv.parse, b"1 4194400 1\n4194400 1 1\n")
    assert e.line == 2


@pytest.mark.parametrize("shape, message", [
    ((-1, 1), "shape must be non-negative, not (-1, 1)"),
    ((1, -1), "shape must be non-negative, not (1, -1)"),
    ((1,), "shape must be a pair of integers, not (1,)"),
    ("ab", "shape must be a pair of integers, not 'ab'"),
    (5, "shape must be a pair of integers, not 5"),
    ((1, 2, 3), "shape must be a pair of integers, not (1, 2, 3)"),
])
def test_tsv_shape_option_checked(shape, message):
    with pytest.raises(ValueError) as e:
        tsv.parse(b"1 1 1\n", shape=shape)
    assert str(e.value) == message


def test_tsv_shape_option_of_zero_and_strings():
    assert tsv._shape_option((0, 0)) == (0, 0)
    assert tsv._shape_option(("3", np.int64(4))) == (3, 4)
    assert tsv._shape_option(None) is None


def test_tsv_read_names_the_file(tmp_path):
    p = tmp_path / "a.tsv"
    p.write_bytes(gzip.compress(b"1 2 3\n1 2 4\n"))
    e = error(tsv.read, p)
    assert (e.path, e.line) == (str(p), 2)
    p.write_bytes(b"2 1 3\n")
    m = tsv.read(p, shape=(2, 2), dtype=np.float64)
    assert (m.shape, arrays(m), m.dtype) == ((2, 2), ([0, 0, 1], [0], [3.0]), np.float64)
    assert tsv.read(p, one_based=False).shape == (3, 2)


# ======================================================================================== mtx.py

MTX = b"%%MatrixMarket matrix coordinate real general\n"
BANNER = "a '%%MatrixMarket matrix coordinate|array real|integer|pattern general|symmetric|skew-symmetric' header"


def test_mtx_coordinate_after_comments_and_blank_lines():
    m = mtx.parse(MTX + b"%c\n\n  \n% more\n2 3 2\n1 1 1.5\n2 3 -2\n")
    assert (m.shape, arrays(m), m.dtype) == ((2, 3), ([0, 1, 2], [0, 2], [1.5, -2.0]), np.float32)


def test_mtx_header_words_in_any_case():
    m = mtx.parse(b"%%MATRIXMARKET MATRIX COORDINATE DOUBLE GENERAL\n1 1 1\n1 1 2\n", dtype=np.float64)
    assert (arrays(m), m.dtype) == (([0, 1], [0], [2.0]), np.float64)


def test_mtx_empty_coordinate_matrix():
    m = mtx.parse(MTX + b"2 3 0\n")
    assert (m.shape, arrays(m), m.dtype, m.indices.dtype) == ((2, 3), ([0, 0, 0], [], []), np.float32, np.int32)
    m = mtx.parse(MTX + b"2 3 0", dtype="float16")
    assert m.dtype == np.float16


def test_mtx_symmetric_pattern_is_mirrored():
    m = mtx.parse(b"%%MatrixMarket matrix coordinate pattern symmetric\n3 3 3\n1 1\n2 1\n3 2\n")
    assert arrays(m) == ([0, 2, 4, 5], [0, 1, 0, 2, 1], [1.0] * 5)


def test_mtx_skew_symmetric_integer_negates_the_mirror():
    m = mtx.parse(b"%%MatrixMarket matrix coordinate integer skew-symmetric\n3 3 2\n2 1 4\n3 2 -5\n")
    assert arrays(m) == ([0, 1, 3, 4], [1, 0, 2, 1], [-4.0, 4.0, 5.0, -5.0])


def test_mtx_symmetric_real_keeps_values():
    m = mtx.parse(b"%%MatrixMarket matrix coordinate real symmetric\n2 2 2\n1 1 0.5\n2 1 -3.25\n")
    assert arrays(m) == ([0, 2, 3], [0, 1, 0], [0.5, -3.25, -3.25])


def test_mtx_integer_values_and_their_errors():
    m = mtx.parse(b"%%MatrixMarket matrix coordinate integer general\n1 2 2\n1 1 -7\n1 2 123456789012\n",
                  dtype=np.float64)
    assert m.data.tolist() == [-7.0, 123456789012.0]
    e = error(mtx.parse, b"%%MatrixMarket matrix coordinate integer general\n1 1 1\n1 1 1.5\n")
    assert parts(e) == ("<bytes>", 3, "an integer value (integer matrix)", "'1.5'")


def test_mtx_array_general_is_column_major():
    m = mtx.parse(b"%%MatrixMarket matrix array real general\n2 3\n1\n2\n0\n4\n5\n0\n")
    assert (m.shape, arrays(m)) == ((2, 3), ([0, 2, 4], [0, 2, 0, 1], [1.0, 5.0, 2.0, 4.0]))


def test_mtx_array_symmetric_and_skew():
    m = mtx.parse(b"%%MatrixMarket matrix array real symmetric\n3 3\n1\n2\n3\n4\n5\n6\n")
    assert dense(m).tolist() == [[1, 2, 3], [2, 4, 5], [3, 5, 6]]
    m = mtx.parse(b"%%MatrixMarket matrix array integer skew-symmetric\n3 3\n1\n2\n3\n")
    assert dense(m).tolist() == [[0, -1, -2], [1, 0, -3], [2, 3, 0]]
    m = mtx.parse(b"%%MatrixMarket matrix array integer general\n1 2\n7\n-8\n")
    assert dense(m).tolist() == [[7, -8]]


def test_mtx_array_empty_and_zero_shapes():
    m = mtx.parse(b"%%MatrixMarket matrix array real general\n0 0\n")
    assert (m.shape, m.nnz) == ((0, 0), 0)
    m = mtx.parse(b"%%MatrixMarket matrix array real general\n1 2\n0\n0\n")
    assert (m.shape, arrays(m)) == ((1, 2), ([0, 0], [], []))


@pytest.mark.parametrize("text, line, expected, found", [
    (MTX + b"2 3 2\n1 1 1.5\n", 4, "2 entries (size line 2)", "end of file after 1 entries"),
    (MTX + b"% c\n2 3 1\n1 1 1.5\n2 2 1\n", 5, "1 entries (size line 3)", "entry 2: '2 2 1'"),
    (MTX + b"2 3 2\n", 3, "2 entries (size line 2)", "end of file after 0 entries"),
    (MTX + b"2 3\n", 2, "a size line 'rows cols nnz' of non-negative integers", "'2 3'"),
    (MTX + b"2 3 -1\n", 2, "a size line 'rows cols nnz' of non-negative integers", "'2 3 -1'"),
    (MTX + b"2 3 1 4\n", 2, "a size line 'rows cols nnz' of non-negative integers", "'2 3 1 4'"),
    (MTX + b"2 3 x\n", 2, "a size line 'rows cols nnz' of non-negative integers", "'2 3 x'"),
    (MTX + b"% only\n", 3, "a size line 'rows cols nnz'", "end of file"),
    (MTX, 2, "a size line 'rows cols nnz'", "end of file"),
    (MTX[:-1], 2, "a size line 'rows cols nnz'", "end of file"),
    (b"%%MatrixMarket matrix array real general\n\n", 3, "a size line 'rows cols'", "end of file"),
    (b"%%MatrixMarket matrix array real general\n1 1 1\n", 2, "a size line 'rows cols' of non-negative integers",
     "'1 1 1'"),
    (b"%%MatrixMarket matrix coordinate real symmetric\n2 3 0\n", 2, "a square shape for a symmetric matrix", "2 x 3"),
    (b"%%MatrixMarket matrix array real skew-symmetric\n3 2\n", 2, "a square shape for a skew-symmetric matrix",
     "3 x 2"),
    (b"%%MatrixMarket matrix coordinate integer skew-symmetric\n3 3 2\n2 1 4\n2 2 -5\n", 4,
     "no diagonal entry in a skew-symmetric matrix", "'2 2 -5'"),
    (b"%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 4\n1 2 -5\n", 4,
     "at most one entry per (row, col) (duplicates are not allowed)",
     "a second entry for (row 1, col 2); the first is on line 3 (after symmetric expansion)"),
    (MTX + b"2 2 2\n1 2 1\n1 2 1\n", 4, "at most one entry per (row, col) (duplicates are not allowed)",
     "a second entry for (row 1, col 2); the first is on line 3"),
    (MTX + b"2 2 1\n3 1 1\n", 3, "a row index in 1..2", "3, past the shape (2, 2) of the size line (line 2)"),
    (MTX + b"2 2 1\n1 3 1\n", 3, "a column index in 1..2", "3, past the shape (2, 2) of the size line (line 2)"),
    (MTX + b"2 2 1\n1 1 nan\n", 3, "a finite value", "'nan' (1 non-finite value(s) in the file)"),
    (MTX + b"2 2 1\n1 1\n", 3, "3 whitespace-separated fields (row col value)", "2 fields: '1 1'"),
    (b"%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1 1\n", 3, "2 whitespace-separated fields (row col)",
     "3 fields: '1 1 1'"),
    (MTX + b"1 1 2\n1 1 1\n1 1 1e39\n", 4, "values representable in float32", "1e+39, which overflows it"),
    (b"%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n", 6, "4 values for a general 2 x 2 array",
     "end of file after 3 values"),
    (b"%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n5\n", 7, "4 values for a general 2 x 2 array",
     "value 5: '5'"),
    (b"%%MatrixMarket matrix array real general\n2 2\n", 3, "4 values for a general 2 x 2 array",
     "end of file after 0 values"),
    (b"%%MatrixMarket matrix array real symmetric\n2 2\n1\n2\n", 5, "3 values for a symmetric 2 x 2 array",
     "end of file after 2 values"),
    (b"%%MatrixMarket matrix array real skew-symmetric\n3 3\n1\n2\n", 5, "3 values for a skew-symmetric 3 x 3 array",
     "end of file after 2 values"),
    (b"%%MatrixMarket matrix array real general\n1 1\n1 2\n", 3, "1 whitespace-separated fields (value)",
     "2 fields: '1 2'"),
    (b"%%MatrixMarket matrix array real general\n1 2\n1\ninf\n", 4, "a finite value",
     "'inf' (1 non-finite value(s) in the file)"),
    (b"%%MatrixMarket matrix array real general\n1 2\n1\n1e39\n", 4, "values representable in float32",
     "1e+39, which overflows it"),
    (b"%%MatrixMarket matrix array integer general\n1 1\n1.0\n", 3, "an integer value (integer matrix)", "'1.0'"),
    (b"%%MatrixMarket matrix array pattern general\n2 2\n", 1, "field real or integer", "'pattern'"),
    (b"%%MatrixMarket matrix array real hermitian\n0 0\n", 1, "symmetry general, symmetric or skew-symmetric",
     "'hermitian'"),
    (b"%%MatrixMarket matrix coordinate complex general\n0 0 0\n", 1, "field real, integer or pattern", "'complex'"),
    (b"%%MatrixMarket matrix blah real general\n0 0\n", 1, "format coordinate or array", "'blah'"),
    (b"%%MatrixMarket vector array real general\n0 0\n", 1, BANNER, "'%%MatrixMarket vector array real general'"),
    (b"%%MatrixMarketx matrix array real general\n0 0\n", 1, BANNER, "'%%MatrixMarketx matrix array real general'"),
    (b"%%MatrixMarket matrix array real general extra\n", 1, BANNER,
     "'%%MatrixMarket matrix array real general extra'"),
    (b"%%MatrixMarket matrix array real\n", 1, BANNER, "'%%MatrixMarket matrix array real'"),
    (b"  \n\n", None, BANNER, "an empty file"),
    (MTX + b"4195300 5 0\n", 2, "a shape that 58 bytes of content back (rows + cols <= 4195232: 2**22 + 16 per byte)",
     "4195300 x 5 (the size line)"),
])
def test_mtx_errors(text, line, expected, found):
    assert parts(error(mtx.parse, text)) == ("<bytes>", line, expected, found)


def test_mtx_size_line_shape_limit_on_both_sides():
    assert len(MTX + b"4195227 5 0\n") == 58  # 58 bytes back rows + cols <= 2**22 + 928 = 4195232
    assert mtx.parse(MTX + b"4195227 5 0\n").shape == (4195227, 5)
    e = error(mtx.parse, MTX + b"4195228 5 0\n")
    assert (e.line, e.found) == (2, "4195228 x 5 (the size line)")


def test_mtx_read_names_the_file(tmp_path):
    p = tmp_path / "a.mtx.gz"
    p.write_bytes(gzip.compress(MTX + b"1 1 1\n1 1 2\n"))
    m = mtx.read(p, dtype=np.float64)
    assert (arrays(m), m.dtype) == (([0, 1], [0], [2.0]), np.float64)
    p.write_bytes(gzip.compress(MTX + b"1 1 1\n2 1 2\n"))
    assert error(mtx.read, p).path == str(p)


# ======================================================================================= smtx.py

SMTX = b"3, 4, 3\n0 2 2 3\n0 3 1\n"
# numpy's default_rng(0).standard_normal(3, dtype=float32), as NumPy's stream policy keeps it
RNG0_F32 = [1.1176220178604126, -1.3871248960494995, -0.4265716075897217]


def test_smtx_pattern_with_ones_and_seeded_values():
    m = smtx.parse(SMTX, values="ones")
    assert (m.shape, arrays(m), m.dtype) == ((3, 4), ([0, 2, 2, 3], [0, 3, 1], [1.0, 1.0, 1.0]), np.float32)
    assert smtx.parse(SMTX).data.tolist() == RNG0_F32
    assert smtx.parse(SMTX, seed=5, dtype="float64").data.tolist() == [
        -0.8019314252534474, -1.324358995628145, -0.24836162209524854]
    m = smtx.parse(SMTX, dtype="float16")  # float32 draws, rounded once to float16
    assert (m.dtype, m.data.tolist()) == (np.float16, [1.1171875, -1.38671875, -0.426513671875])
    assert smtx.parse(SMTX, values="ones", dtype="float16").data.tolist() == [1.0, 1.0, 1.0]


def test_smtx_rows_may_restart_columns_at_every_row_boundary():
    m = smtx.parse(b"3 4 3\n0 1 3 3\n2 0 3\n", values="ones")
    assert arrays(m) == ([0, 1, 3, 3], [2, 0, 3], [1.0] * 3)
    m = smtx.parse(b"4 4 3\n0 0 2 2 3\n1 3 0\n", values="ones")  # empty rows around the boundaries
    assert arrays(m) == ([0, 0, 2, 2, 3], [1, 3, 0], [1.0] * 3)


def test_smtx_empty_matrix_with_or_without_its_third_line():
    for text in (b"2, 2, 0\n0 0 0\n", b"2, 2, 0\n0 0 0\n\n", b"2, 2, 0\n0 0 0", b"2, 2, 0\n0 0 0\n  \n"):
        m = smtx.parse(text)
        assert (m.shape, arrays(m)) == ((2, 2), ([0, 0, 0], [], [])), text


@pytest.mark.parametrize("text, line, expected, found", [
    (b"  \n", None, "a header line 'nrows, ncols, nnz'", "an empty file"),
    (b"2 2\n", 1, "a header line 'nrows, ncols, nnz' of 3 integers", "'2 2'"),
    (b"2 2 1 1\n", 1, "a header line 'nrows, ncols, nnz' of 3 integers", "'2 2 1 1'"),
    (b"2 2 x\n", 1, "a header line 'nrows, ncols, nnz' of 3 integers", "'2 2 x'"),
    (b"2 2 -1\n", 1, "a header line 'nrows, ncols, nnz' of non-negative integers", "'2 2 -1'"),
    (b"-2 2 1\n", 1, "a header line 'nrows, ncols, nnz' of non-negative integers", "'-2 2 1'"),
    (b"2 2 1", 2, "3 row offsets (nrows + 1) (file truncated)", "end of file"),
    (b"2 2 1\n0 0 1", 3, "1 column indices (nnz) (file truncated)", "end of file"),
    (b"2 2 1\n0 0 1\n", 3, "1 column indices (nnz)", "0 (truncated)"),
    (b"2 2 1\n0 0 1\n0 1\n", 3, "1 column indices (nnz)", "2"),
    (b"2 2 1\n0 0\n0\n", 2, "3 row offsets (nrows + 1)", "2 (truncated)"),
    (b"2 2 1\n0 0 1 1\n0\n", 2, "3 row offsets (nrows + 1)", "4"),
    (b"2 2 1\n1 0 1\n0\n", 2, "row offsets starting at 0", "first offset 1"),
    (b"2 2 1\n0 0 2\n0\n", 2, "row offsets ending at nnz = 1", "last offset 2"),
    (b"2 2 2\n0 2 1\n0 1\n", 2, "row offsets ending at nnz = 2", "last offset 1"),
    (b"3 2 2\n0 2 1 2\n0 1\n", 2, "non-decreasing row offsets", "offset 2 (row 1 ends) = 1 < offset 1 = 2"),
    (b"2 2 2\n0 1 2\n0 2\n", 3, "column indices in 0..1", "2 at position 1"),
    (b"2 2 2\n0 1 2\n0 -1\n", 3, "column indices in 0..1", "-1 at position 1 (negative)"),
    (b"2 2 2\n0 2 2\n1 1\n", 3, "strictly increasing column indices within each row (no duplicates)",
     "a duplicate column 1 after 1 in row 0 (position 1)"),
    (b"2 2 2\n0 2 2\n1 0\n", 3, "strictly increasing column indices within each row (no duplicates)",
     "out of order column 0 after 1 in row 0 (position 1)"),
    (b"3 4 2\n0 0 2 2\n3 1\n", 3, "strictly increasing column indices within each row (no duplicates)",
     "out of order column 1 after 3 in row 1 (position 1)"),
    (b"2 4 4\n0 1 4\n3 0 2 2\n", 3, "strictly increasing column indices within each row (no duplicates)",
     "a duplicate column 2 after 2 in row 1 (position 3)"),
    (b"2 2 2\n0 1 2\n1 0\nx\n", 4, "nothing after the 3 lines", "'x'"),
    (b"2 2 2\n0 1 2\n1 0\n\n\n  y z\nw\n", 6, "nothing after the 3 lines", "'y z'"),
    (b"2 2 0\n0 0 0\n\nq\n", 4, "nothing after the 3 lines", "'q'"),
    (b"4194900, 1, 0\n", 1, "a shape that 14 bytes of content back (rows + cols <= 4194528: 2**22 + 16 per byte)",
     "4194900 x 1 (the header)"),
])
def test_smtx_errors(text, line, expected, found):
    assert parts(error(smtx.parse, text)) == ("<bytes>", line, expected, found)


def test_smtx_values_option_checked():
    with pytest.raises(ValueError) as e:
        smtx.parse(SMTX, values="zeros")
    assert str(e.value) == "values must be 'random' or 'ones', not 'zeros'"


def test_smtx_read(tmp_path):
    p = tmp_path / "a.smtx"
    p.write_bytes(gzip.compress(SMTX))
    m = smtx.read(p, values="ones", dtype=np.float64)
    assert (arrays(m), m.dtype) == (([0, 2, 2, 3], [0, 3, 1], [1.0] * 3), np.float64)
    assert smtx.read(p).data.tolist() == RNG0_F32


# ======================================================================================== idx.py

def idx_file(tmp_path, n, rows, cols, pixels: bytes, compress=False, name="a.idx") -> Path:
    data = struct.pack(">4I", 2051, n, rows, cols) + pixels
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if compress else data)
    return p


PIXELS = bytes([0, 255, 51, 0, 0, 0, 0, 102])  # two 2x2 images: [[0, 255], [51, 0]] and [[0, 0], [0, 102]]


@pytest.mark.parametrize("compress", [False, True])
def test_idx_images_as_rows_of_pixels_over_255(tmp_path, compress):
    p = idx_file(tmp_path, 2, 2, 2, PIXELS, compress)
    m = idx.read(p)
    assert (m.shape, m.dtype) == ((2, 4), np.float32)
    assert arrays(m) == ([0, 2, 3], [1, 2, 3], [1.0, np.float32(0.2), np.float32(0.4)])
    m = idx.read(p, dtype="float64")
    assert m.data.tolist() == [1.0, 0.2, 0.4]
    m = idx.read(p, order="F")  # column-major pixels: image 0 reads 0, 51, 255, 0
    assert arrays(m) == ([0, 2, 3], [1, 2, 3], [np.float32(0.2), 1.0, np.float32(0.4)])
    assert arrays(idx.read(p, limit=1)) == ([0, 2], [1, 2], [1.0, np.float32(0.2)])
    assert idx.read(p, limit=1.0).shape == (1, 4)
    assert idx.read(p, limit=0).shape == (0, 4)
    assert idx.read(p, limit=2).shape == idx.read(p, limit=5).shape == (2, 4)


def test_idx_rectangular_images_flatten_in_either_order(tmp_path):
    # one 2x3 image [[1, 2, 3], [4, 5, 6]]
    p = idx_file(tmp_path, 1, 2, 3, bytes([1, 2, 3, 4, 5, 6]))
    assert (idx.read(p).toarray() * 255).round().tolist() == [[1, 2, 3, 4, 5, 6]]
    assert (idx.read(p, order="F").toarray() * 255).round().tolist() == [[1, 4, 2, 5, 3, 6]]


@pytest.mark.parametrize("compress", [False, True])
def test_idx_byte_counts_on_both_sides(tmp_path, compress):
    e = error(idx.read, idx_file(tmp_path, 2, 2, 2, PIXELS[:-1], compress))
    assert (e.line, e.expected, e.found) == (None, "8 bytes of pixels for 2 images of 2x2", "7 bytes (truncated)")
    e = error(idx.read, idx_file(tmp_path, 2, 2, 2, PIXELS + b"x", compress))
    assert (e.expected, e.found) == ("8 bytes of pixels for 2 images (the header's count)", "more bytes after them")
    assert idx.read(idx_file(tmp_path, 2, 2, 2, PIXELS + b"x", compress), limit=1).shape == (1, 4)
    assert idx.read(idx_file(tmp_path, 2, 2, 2, PIXELS[:4], compress), limit=1).shape == (1, 4)
    e = error(idx.read, idx_file(tmp_path, 2, 2, 2, PIXELS[:3], compress), limit=1)
    assert (e.expected, e.found) == ("4 bytes of pixels for 1 images of 2x2", "3 bytes (truncated)")


@pytest.fixture
def source_reads(monkeypatch):
    """The sizes asked of `_files.Source.read`, in order, the reads themselves done."""
    reads = []
    real = _files.Source.read

    def read(self, n):
        reads.append(n)
        return real(self, n)
    monkeypatch.setattr(_files.Source, "read", read)
    return reads


def test_idx_plain_file_size_settles_truncation_before_reading(tmp_path, source_reads):
    reads = source_reads
    e = error(idx.read, idx_file(tmp_path, 1000, 100, 100, PIXELS))
    assert e.found == "8 bytes (truncated)"
    assert reads == [16]


@pytest.mark.parametrize("head, expected, found", [
    (b"", "an IDX image file (magic 2051)", "an empty file"),
    (b"\x00\x00", "an IDX image file (magic 2051)", "2 bytes (truncated header)"),
    (b"\x00\x00\x08", "an IDX image file (magic 2051)", "3 bytes (truncated header)"),
    (struct.pack(">I", 2049) + b"x" * 20, "an IDX image file (magic 2051 = 0x00000803)",
     "magic 2049 = 0x00000801 (an IDX labels file)"),
    (struct.pack(">I", 7) + b"x" * 20, "an IDX image file (magic 2051 = 0x00000803)",
     "magic 7 = 0x00000007 (an unknown magic)"),
    (struct.pack(">4I", 2051, 1, 1, 1)[:15], "a 16-byte IDX image header", "15 bytes (truncated)"),
    (struct.pack(">I", 2051), "a 16-byte IDX image header", "4 bytes (truncated)"),
])
def test_idx_header_errors(tmp_path, head, expected, found):
    p = tmp_path / "h.idx"
    p.write_bytes(head)
    assert parts(error(idx.read, p)) == (str(p), None, expected, found)


def test_idx_shape_of_zero_images_is_limited_by_the_header(tmp_path):
    # 0 images of 3000 x 3000: 16 bytes back rows + cols <= 2**22 + 256
    p = idx_file(tmp_path, 1, 3000, 3000, b"")
    e = error(idx.read, p, limit=0)
    assert (e.expected, e.found) == (
        "a shape that 16 bytes of content back (rows + cols <= 4194560: 2**22 + 16 per byte)",
                                     "0 x 9000000 (0 images of 3000x3000 pixels)")
    assert idx.read(idx_file(tmp_path, 1, 2048, 2048, b""), limit=0).shape == (0, 4194304)


@pytest.mark.parametrize("options, message", [
    (dict(order="X"), "order must be 'C' (row-major) or 'F' (column-major), not 'X'"),
    (dict(limit=-1), "limit must be a non-negative integer or None, not -1"),
    (dict(limit=1.5), "limit must be a non-negative integer or None, not 1.5"),
])
def test_idx_options_checked(tmp_path, options, message):
    with pytest.raises(ValueError) as e:
        idx.read(idx_file(tmp_path, 2, 2, 2, PIXELS), **options)
    assert str(e.value) == message


# ======================================================================================== npz.py

def npy(descr: str, shape: tuple, data: bytes, fortran=False, version=(1, 0)) -> bytes:
    """A .npy member spelled out: magic, version, header length, the header dict padded with spaces
    to a multiple of 64 bytes and ended by a newline, then the data bytes."""
    head = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()
    prefix = 10 if version[0] == 1 else 12
    head += b" " * (63 - (prefix + len(head)) % 64) + b"\n"
    size = struct.pack("<H", len(head)) if version[0] == 1 else struct.pack("<I", len(head))
    return b"\x93NUMPY" + bytes(version) + size + head + data


def archive(tmp_path, members: dict, name="m.npz") -> Path:
    p = tmp_path / name
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
        for k, v in members.items():
            z.writestr(k + ".npy", v)
    return p


def csr_archive(**change) -> dict:
    members = {"format": npy("|S3", (), b"csr"), "shape": npy("<i8", (2,), struct.pack("<2q", 2, 3)),
               "data": npy("<f4", (2,), struct.pack("<2f", 1.5, -2.0)),
               "indices": npy("<i4", (2,), struct.pack("<2i", 2, 0)),
               "indptr": npy("<i4", (3,), struct.pack("<3i", 0, 1, 2))}
    members.update(change)
    return {k: v for k, v in members.items() if v is not None}


def test_npy_member_helper_spells_64_byte_headers():
    assert len(npy("|S3", (), b"csr")) == 131 and len(npy("<i4", (3,), b"x" * 12)) == 140
    assert len(npy("<i4", (3,), b"x" * 12, version=(2, 0))) == 140
    assert np.load(io.BytesIO(npy("<i4", (3,), struct.pack("<3i", 0, 1, 2)))).tolist() == [0, 1, 2]


def test_npz_reads_a_hand_built_csr_archive(tmp_path):
    m = npz.read(archive(tmp_path, csr_archive()))
    assert (m.shape, arrays(m), m.dtype) == ((2, 3), ([0, 1, 2], [2, 0], [1.5, -2.0]), np.float32)
    m = npz.read(archive(tmp_path, csr_archive(format=npy("<U3", (), "csr".encode("utf-32-le")))), dtype="float64")
    assert (arrays(m), m.dtype) == (([0, 1, 2], [2, 0], [1.5, -2.0]), np.float64)


def test_npz_version_2_members_and_fortran_order(tmp_path):
    m = npz.read(archive(tmp_path, csr_archive(indptr=npy("<i4", (3,), struct.pack("<3i", 0, 1, 2), version=(2, 0)))))
    assert arrays(m) == ([0, 1, 2], [2, 0], [1.5, -2.0])
    # DIA, data (2 diagonals x 3) stored column-major: rows [1, 2, 3] (offset 0) and [0, 5, 6] (offset 1)
    data = struct.pack("<6f", 1, 0, 2, 5, 3, 6)
    members = {"format": npy("|S3", (), b"dia"), "shape": npy("<i8", (2,), struct.pack("<2q", 3, 3)),
               "data": npy("<f4", (2, 3), data, fortran=True), "offsets": npy("<i4", (2,), struct.pack("<2i", 0, 1))}
    m = npz.read(archive(tmp_path, members))
    assert dense(m).tolist() == [[1, 5, 0], [0, 2, 6], [0, 0, 3]]


def test_npz_coo_with_coords_or_row_and_col(tmp_path):
    base = {"format": npy("|S3", (), b"coo"), "shape": npy("<i8", (2,), struct.pack("<2q", 2, 3)),
            "data": npy("<f4", (3,), struct.pack("<3f", 1, 2, 4))}
    coords = npy("<i8", (2, 3), struct.pack("<6q", 1, 0, 1, 0, 2, 0))
    m = npz.read(archive(tmp_path, {**base, "coords": coords}))
    assert arrays(m) == ([0, 1, 2], [2, 0], [2.0, 5.0])  # the two (1, 0) entries summed
    m = npz.read(archive(tmp_path, {**base, "row": npy("<i8", (3,), struct.pack("<3q", 1, 0, 1)),
                                    "col": npy("<i8", (3,), struct.pack("<3q", 0, 2, 0))}))
    assert arrays(m) == ([0, 1, 2], [2, 0], [2.0, 5.0])


@pytest.mark.parametrize("change, expected, found", [
    (dict(format=None), "a scipy.sparse.save_npz archive (a member format.npy)",
     "members shape.npy, data.npy, indices.npy, indptr.npy"),
    (dict(format=npy("|S3", (1,), b"csr")), "member format.npy: a 0-d string array", "dtype |S3, shape (1,)"),
    (dict(format=npy("<i4", (), b"\0\0\0\0")), "member format.npy: a 0-d string array", "dtype int32, shape ()"),
    (dict(format=npy("|S3", (), b"lil")), "member format.npy: one of csr, csc, coo, bsr, dia", "'lil'"),
    (dict(format=npy("|S50", (), b"x" * 50)), "member format.npy: one of csr, csc, coo, bsr, dia", repr("x" * 40)),
    (dict(indptr=None), "member indptr.npy: present", "none"),
    (dict(shape=None), "member shape.npy: present", "none"),
    (dict(data=npy("|O", (2,), b"")),
     "member data.npy: an array of numbers or a string (no objects, records or pickles)",
     "dtype object"),
    (dict(data=npy("|V8", (2,), b"x" * 16)),
     "member data.npy: an array of numbers or a string (no objects, records or pickles)", "dtype |V8"),
    (dict(data=npy("|S0", (2,), b"")),
     "member data.npy: an array of numbers or a string (no objects, records or pickles)", "dtype |S0"),
    (dict(indptr=npy("<i4", (3,), b"\0" * 12, version=(3, 0))), "member indptr.npy: .npy format version 1.0 or 2.0",
     "version 3.0"),
    (dict(indptr=npy("<i4", (1000,), b"\0" * 12)),
     "member indptr.npy: 4000 bytes of data for its header's shape (1000,) and dtype int32",
     "at most 12 bytes (the zip directory's size)"),
    (dict(indptr=npy("<i4", (2,), b"\0" * 12)), "member indptr.npy: 8 bytes of data", "more bytes after them"),
    (dict(indptr=b"\x93NUMPY\x01\x00\x06\x00{'x':}" + b"\0" * 12), "member indptr.npy: an intact .npy member", None),
])
def test_npz_member_errors(tmp_path, change, expected, found):
    p = archive(tmp_path, csr_archive(**change))
    e = error(npz.read, p)
    assert (e.path, e.line, e.expected) == (str(p), None, expected)
    if found is not None:
        assert e.found == found


def test_npz_names_only_its_first_eight_members(tmp_path):
    p = archive(tmp_path, {f"m{i}": npy("<i4", (), b"\0" * 4) for i in range(10)})
    assert error(npz.read, p).found == "members " + ", ".join(f"m{i}.npy" for i in range(8))
    assert error(npz.read, archive(tmp_path, {})).found == "members none"


def test_npz_empty_and_non_zip_files(tmp_path):
    p = tmp_path / "e.npz"
    p.write_bytes(b"")
    assert parts(error(npz.read, p)) == (str(p), None, "a scipy.sparse.save_npz archive", "an empty file")
    p.write_bytes(b"PK junk")
    assert parts(error(npz.read, p)) == (str(p), None, "a scipy.sparse.save_npz archive (a zip of .npy members)",
                                         "BadZipFile: File is not a zip file")


def test_npz_decompressed_budget_counts_members_in_order(tmp_path, monkeypatch):
    p = archive(tmp_path, csr_archive())  # members of 131, 144, 136, 136 and 140 bytes: 687 in all
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "687")
    assert npz.read(p).shape == (2, 3)
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "686")
    e = error(npz.read, p)
    assert (e.expected, e.found) == (
        "member indptr.npy: at most 139 more bytes after decompression (the limit SPARSEGEN_MAX_DECOMPRESSED_BYTES)",
        "140 bytes")


def test_npz_shape_backed_by_the_bytes_of_its_members(tmp_path):
    # COO members of 131 + 144 + 136 + 144 + 144 = 699 bytes back rows + cols <= 2**22 + 16 * 699 = 4205488
    def coo(m, n):
        return archive(tmp_path, {"format": npy("|S3", (), b"coo"), "shape": npy("<i8", (2,), struct.pack("<2q", m, n)),
                                  "data": npy("<f4", (2,), struct.pack("<2f", 1, 2)),
                                  "row": npy("<i8", (2,), struct.pack("<2q", 0, 5)),
                                  "col": npy("<i8", (2,), struct.pack("<2q", 3, 0))})
    m = npz.read(coo(4200000, 5488))
    assert (m.shape, m.nnz) == ((4200000, 5488), 2)
    e = error(npz.read, coo(4200000, 5489))
    assert (e.expected, e.found) == (
        "a shape that 699 bytes of content back (rows + cols <= 4205488: 2**22 + 16 per byte)",
                                     "4200000 x 5489 (member shape.npy)")


def test_npz_members_are_read_once(tmp_path, monkeypatch):
    p = archive(tmp_path, csr_archive())
    opened = []
    real = zipfile.ZipFile.open

    def open_(self, name, *a, **k):
        opened.append(getattr(name, "filename", name))
        return real(self, name, *a, **k)
    monkeypatch.setattr(zipfile.ZipFile, "open", open_)
    npz.read(p)
    assert sorted(opened) == ["data.npy", "format.npy", "indices.npy", "indptr.npy", "shape.npy"]


# ===================================================================================== _arrays.py

def named(**members) -> _arrays.Arrays:
    return _arrays.Arrays("p", members.get)


def test_arrays_label_and_fail():
    a = _arrays.Arrays("p", {}.get, lambda n: f"member {n}.npy")
    assert parts(error(a.fail, "data", "exp", "found")) == ("p", None, "member data.npy: exp", "found")
    assert parts(error(a.fail, None, "exp", "found")) == ("p", None, "exp", "found")
    assert parts(error(a.get, "data")) == ("p", None, "member data.npy: present", "none")
    assert parts(error(named().get, "row")) == ("p", None, "row: present", "none")


def test_index_array_kinds_dimensions_and_the_uint64_limit():
    got = named(x=np.uint64([2**63 - 1, 0])).index_array("x")
    assert got.dtype == np.int64 and got.tolist() == [2**63 - 1, 0]
    assert named(x=np.uint64([])).index_array("x").tolist() == []
    assert named(x=np.uint32([7])).index_array("x").dtype == np.int64
    assert named(x=np.int8([[1, 2]])).index_array("x", ndim=2).tolist() == [[1, 2]]
    assert parts(error(named(x=np.uint64([5, 2**63])).index_array, "x")) == (
        "p", None, "x: integers <= 9223372036854775807", "9223372036854775808")
    assert parts(error(named(x=np.float32([1])).index_array, "x")) == ("p", None, "x: an integer array",
                                                                       "dtype float32")
    assert parts(error(named(x=np.bool_([1])).index_array, "x")) == ("p", None, "x: an integer array", "dtype bool")
    assert parts(error(named(x=np.int32([[1]])).index_array, "x")) == ("p", None, "x: a 1-D array", "shape (1, 1)")


def test_values_kinds_and_dimensions():
    assert named(x=np.bool_([1, 0])).values("x").tolist() == [True, False]
    assert parts(error(named(x=np.int32([1])).values, "x", ndim=2)) == ("p", None, "x: a 2-D array", "shape (1,)")
    assert parts(error(named(x=np.complex64([1])).values, "x")) == (
        "p", None, "x: real numeric values (bool, integer or float)", "complex dtype complex64")


def test_shape_member():
    assert named(shape=np.int64([0, 7])).shape() == (0, 7)
    assert parts(error(named(shape=np.int64([1, 2, 3])).shape)) == ("p", None, "shape: 2 entries (rows, cols)",
                                                                    "3: [1, 2, 3]")
    assert error(named(shape=np.arange(6)).shape).found == "6: [0, 1, 2, 3]"
    assert parts(error(named(shape=np.int64([1, -2])).shape)) == ("p", None, "shape: non-negative sizes", "[1, -2]")


def test_bounds_on_both_sides():
    a = named()
    a.bounds("x", np.array([0, 2]), 3, "row")
    a.bounds("x", np.array([], np.int64), 0, "row")
    assert parts(error(a.bounds, "x", np.array([0, 3]), 3, "row")) == ("p", None, "x: row indices in 0..2",
                                                                        "3 at position 1")
    assert parts(error(a.bounds, "x", np.array([0, -3]), 3, "column")) == (
        "p", None, "x: column indices in 0..2", "-3 at position 1 (negative)")
    assert parts(error(a.bounds, "x", np.array([0]), 0, "row")) == ("p", None, "x: no row indices (size 0)",
                                                                    "0 at position 0")
    assert error(a.bounds, "x", np.array([[0, 1], [5, 0]]), 3, "row").found == "5 at position 2"


def test_pointers_on_both_sides():
    a = named()
    a.pointers("x", np.array([0, 1, 1, 3]), 3, 3, "rows")
    assert parts(error(a.pointers, "x", np.array([0, 1]), 2, 2, "rows")) == ("p", None, "x: length 3 (rows + 1)",
                                                                            "length 2")
    assert parts(error(a.pointers, "x", np.array([1, 2]), 1, 2, "rows")) == ("p", None, "x: pointers starting at 0",
                                                                            "first pointer 1")
    assert parts(error(a.pointers, "x", np.array([0, 2, 1]), 2, 1, "rows")) == (
        "p", None, "x: non-decreasing pointers", "pointer 2 = 1 < pointer 1 = 2")
    assert parts(error(a.pointers, "x", np.array([0, 1, 1]), 2, 2, "rows")) == (
        "p", None, "x: pointers ending at the number of stored entries, 2", "last pointer 1")


def triplets(fmt, shape, **members):
    rows, cols, vals = _arrays.triplets(fmt, named(**members), shape)
    return rows.tolist(), cols.tolist(), vals.tolist()


def test_triplets_of_each_format_by_hand():
    assert triplets("csr", (2, 3), data=np.float32([1, 2, 3]), indices=np.int32([2, 0, 1]),
                    indptr=np.int32([0, 1, 3])) == ([0, 1, 1], [2, 0, 1], [1.0, 2.0, 3.0])
    assert triplets("csc", (3, 2), data=np.float32([1, 2, 3]), indices=np.int32([2, 0, 1]),
                    indptr=np.int32([0, 1, 3])) == ([2, 0, 1], [0, 1, 1], [1.0, 2.0, 3.0])
    assert triplets("coo", (2, 2), data=np.float32([4]), row=np.int64([1]), col=np.int64([0])) == ([1], [0], [4.0])
    # BSR: one 2 x 2 block [[1, 2], [3, 4]] at block (1, 0) of a 4 x 2 matrix
    assert triplets("bsr", (4, 2), data=np.float32([[[1, 2], [3, 4]]]), indices=np.int32([0]),
                    indptr=np.int32([0, 0, 1])) == ([2, 2, 3, 3], [0, 1, 0, 1], [1.0, 2.0, 3.0, 4.0])
    # BSR with 1 x 2 blocks: block column 1 of row 0 covers columns 2 and 3
    assert triplets("bsr", (1, 4), data=np.float32([[[5, 6]]]), indices=np.int32([1]),
                    indptr=np.int32([0, 1])) == ([0, 0], [2, 3], [5.0, 6.0])
    # DIA: data[d, j] sits at (j - offset, j); zeros and what falls outside are padding
    assert triplets("dia", (3, 4), data=np.float32([[1, 2, 0, 4], [7, 8, 9, 6]]), offsets=np.int32([0, -1])) == (
        [0, 1, 1, 2], [0, 1, 0, 1], [1.0, 2.0, 7.0, 8.0])
    assert triplets("dia", (2, 2), data=np.float32([[1, 2, 3]]), offsets=np.int32([1])) == ([0], [1], [2.0])
    assert triplets("dia", (2, 2), data=np.float32([[1, 2], [3, 4], [5, 6]]), offsets=np.int32([2, -2, 0])) == (
        [0, 1], [0, 1], [5.0, 6.0])


@pytest.mark.parametrize("fmt, shape, members, expected, found", [
    ("csr", (2, 3), dict(data=np.float32([1]), indices=np.int32([0, 1]), indptr=np.int32([0, 1, 1])),
     "indices: length 1 (one per stored value in data)", "length 2"),
    ("csr", (2, 3), dict(data=np.float32([1]), indices=np.int32([3]), indptr=np.int32([0, 1, 1])),
     "indices: column indices in 0..2", "3 at position 0"),
    ("csc", (2, 3), dict(data=np.float32([1]), indices=np.int32([2]), indptr=np.int32([0, 1, 1, 1])),
     "indices: row indices in 0..1", "2 at position 0"),
    ("csc", (2, 3), dict(data=np.float32([1]), indices=np.int32([0]), indptr=np.int32([0, 1, 1])),
     "indptr: length 4 (columns + 1)", "length 3"),
    ("coo", (2, 2), dict(data=np.float32([1]), coords=np.int64([[0], [1], [1]])),
     "coords: 2 rows (row and column indices)", "shape (3, 1)"),
    ("coo", (2, 2), dict(data=np.float32([1, 2]), coords=np.int64([[0], [1]])),
     "coords: length 2 (one per stored value in data)", "length 1"),
    ("coo", (2, 2), dict(data=np.float32([1]), coords=np.int64([[2], [1]])), "coords: row indices in 0..1",
     "2 at position 0"),
    ("coo", (2, 2), dict(data=np.float32([1]), coords=np.int64([[1], [2]])), "coords: column indices in 0..1",
     "2 at position 0"),
    ("coo", (2, 2), dict(data=np.float32([1]), row=np.int64([0]), col=np.int64([0, 1])),
     "col: length 1 (one per stored value in data)", "length 2"),
    ("coo", (2, 2), dict(data=np.float32([1]), row=np.int64([0]), col=np.int64([-1])), "col: column indices in 0..1",
     "-1 at position 0 (negative)"),
    ("bsr", (3, 4), dict(data=np.ones((1, 2, 2)), indices=np.int32([0]), indptr=np.int32([0, 1])),
     "data: blocks (nblocks, R, C) with R >= 1 dividing 3 rows and C >= 1 dividing 4 columns", "shape (1, 2, 2)"),
    ("bsr", (4, 3), dict(data=np.ones((1, 2, 2)), indices=np.int32([0]), indptr=np.int32([0, 1, 1])),
     "data: blocks (nblocks, R, C) with R >= 1 dividing 4 rows and C >= 1 dividing 3 columns", "shape (1, 2, 2)"),
    ("bsr", (4, 4), dict(data=np.ones((1, 2, 0)), indices=np.int32([0]), indptr=np.int32([0, 1, 1])),
     "data: blocks (nblocks, R, C) with R >= 1 dividing 4 rows and C >= 1 dividing 4 columns", "shape (1, 2, 0)"),
    ("bsr", (4, 4), dict(data=np.ones((1, 2, 2)), indices=np.int32([0, 1]), indptr=np.int32([0, 1, 1])),
     "indices: length 1 (one per block in data)", "length 2"),
    ("bsr", (4, 4), dict(data=np.ones((1, 2, 2)), indices=np.int32([0]), indptr=np.int32([0, 1])),
     "indptr: length 3 (block rows (4 / 2) + 1)", "length 2"),
    ("bsr", (4, 4), dict(data=np.ones((1, 2, 2)), indices=np.int32([2]), indptr=np.int32([0, 1, 1])),
     "indices: block column indices in 0..1", "2 at position 0"),
    ("dia", (4, 4), dict(data=np.ones((2, 4)), offsets=np.int32([1, 1])), "offsets: distinct diagonal offsets",
     "1 twice"),
    ("dia", (4, 4), dict(data=np.ones((3, 4)), offsets=np.int32([3, -1, 3])), "offsets: distinct diagonal offsets",
     "3 twice"),
    ("dia", (4, 4), dict(data=np.ones((2, 4)), offsets=np.int32([1])), "offsets: length 2 (one per diagonal in data)",
     "length 1"),
])
def test_triplets_refuse_inconsistent_arrays(fmt, shape, members, expected, found):
    assert parts(error(_arrays.triplets, fmt, named(**members), shape)) == ("p", None, expected, found)


def test_build_sorts_sums_duplicates_in_float64_and_casts():
    a = named(data=np.float32([1, 2, 4, 8]), row=np.int64([1, 0, 1, 1]), col=np.int64([1, 2, 0, 1]))
    m = _arrays.build("coo", a, (2, 3), None, "p")
    assert (arrays(m), m.dtype) == (([0, 1, 3], [2, 0, 1], [2.0, 4.0, 9.0]), np.float32)
    m = _arrays.build("coo", a, (2, 3), np.float16, "p")
    assert m.dtype == np.float16
    ints = named(data=np.int32([3, 5]), row=np.int64([0, 0]), col=np.int64([1, 1]))
    m = _arrays.build("coo", ints, (1, 2), None, "p")
    assert (arrays(m), m.dtype) == (([0, 1], [1], [8.0]), np.float32)
    # float32 values whose sum in float32 would round: 2**24 + 1 + 1 is exact in float64
    big = named(data=np.float32([2**24, 1, 1]), row=np.int64([0, 0, 0]), col=np.int64([0, 0, 0]))
    assert _arrays.build("coo", big, (1, 1), np.float64, "p").data.tolist() == [2**24 + 2]


def test_build_keeps_canonical_input_and_copies_it():
    data = np.float64([1.0, 0.0, 3.0])  # an explicit zero stays
    rows, cols = np.int64([0, 1, 1]), np.int64([1, 0, 2])
    a = named(data=data, row=rows, col=cols)
    m = _arrays.build("coo", a, (2, 3), None, "p")
    assert (arrays(m), m.dtype) == (([0, 1, 3], [1, 0, 2], [1.0, 0.0, 3.0]), np.float64)
    m.data[0] = 99.0
    m.indices[0] = 2
    assert data.tolist() == [1.0, 0.0, 3.0] and cols.tolist() == [1, 0, 2]


def test_build_of_a_huge_shape_sorts_and_sums_by_row_then_column():
    n = 2**61  # 8 x 2**61: row * n + col overflows int64 past row 3
    a = named(data=np.float32([1, 2, 4, 8]), row=np.int64([7, 0, 7, 7]), col=np.int64([n - 1, 5, 2, n - 1]))
    m = _arrays.build("coo", a, (8, n), None, "p")
    assert m.indptr.tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 3]
    assert m.indices.tolist() == [5, 2, n - 1] and m.data.tolist() == [2.0, 4.0, 9.0]
    e = named(data=np.float32([]), row=np.int64([]), col=np.int64([]))
    assert _arrays.build("coo", e, (8, n), None, "p").nnz == 0


@pytest.mark.parametrize("shape", [(2, 3), (8, 2**61)])
def test_build_refuses_a_duplicate_sum_that_overflows(shape):
    a = named(data=np.float64([1.0, 1e308, 1e308]), row=np.int64([0, 1, 1]), col=np.int64([0, 2, 2]))
    assert parts(error(_arrays.build, "coo", a, shape, None, "p")) == (
        "p", None, "duplicate entries whose sum is finite in float64",
        "a sum that overflows at (row 1, col 2) (0-based)")


def test_build_refuses_non_finite_and_overflowing_values():
    a = named(data=np.float64([1.0, np.nan]), row=np.int64([0, 1]), col=np.int64([0, 2]))
    assert error(_arrays.build, "coo", a, (2, 3), None, "p").found == (
        "1 non-finite value(s) (NaN or inf), the first nan at (row 1, col 2) (0-based)")
    a = named(data=np.float64([1e39]), row=np.int64([0]), col=np.int64([0]))
    assert error(_arrays.build, "coo", a, (1, 1), np.dtype(np.float32), "p").found == "1e+39, which overflows it"


def test_as_csr_of_dense_arrays():
    m = as_csr(np.array([[0, 1.5], [2, 0]]))
    assert (arrays(m), m.dtype, m.indices.dtype) == (([0, 1, 2], [1, 0], [1.5, 2.0]), np.float64, np.int32)
    assert as_csr(np.array([[0, 1], [2, 0]])).dtype == np.float32
    assert as_csr(np.array([[0, True], [True, 0]])).data.tolist() == [1.0, 1.0]
    assert as_csr(np.array([[0, 1], [2, 0]], np.float16)).dtype == np.float16
    assert as_csr(np.array([[0, 1.5], [2, 0]]), dtype="float32").dtype == np.float32
    assert as_csr([[0, 3]]).data.tolist() == [3.0]
    m = as_csr(np.zeros((3, 2)))
    assert (m.shape, arrays(m)) == ((3, 2), ([0, 0, 0, 0], [], []))


@pytest.mark.parametrize("matrix, expected, found", [
    (np.array([[0, 1.5], [np.nan, np.inf]]), "finite values",
     "2 non-finite value(s) (NaN or inf), the first nan at (row 1, col 0) (0-based)"),
    (np.array([1, 2]), "a 2-D matrix", "an array of shape (2,)"),
    (np.array([[1j]]), "real numeric values (bool, integer or float)", "complex dtype complex128"),
    (np.array([["a"]]), "real numeric values (bool, integer or float)", "non-numeric dtype <U1"),
    (sp.csr_matrix(np.array([[1j]])), "real numeric values (bool, integer or float)", "complex dtype complex128"),
    (sp.coo_array(np.ones((1, 1, 1))), "a 2-D matrix", "a 3-D sparse array"),
])
def test_as_csr_refuses(matrix, expected, found):
    assert parts(error(as_csr, matrix)) == ("<matrix>", None, expected, found)


def test_as_csr_of_scipy_matrices():
    m = as_csr(sp.lil_matrix(np.array([[0, 2.0], [3, 0]])))
    assert (arrays(m), m.dtype) == (([0, 1, 2], [1, 0], [2.0, 3.0]), np.float64)
    m = as_csr(sp.csr_matrix(np.array([[0, 2.0], [3, 0]])), dtype="float16")
    assert (arrays(m), m.dtype) == (([0, 1, 2], [1, 0], [2.0, 3.0]), np.float16)
    m = as_csr(sp.csc_matrix(np.array([[0, 2], [3, 4]], np.int8)))
    assert (arrays(m), m.dtype) == (([0, 1, 3], [1, 0, 1], [2.0, 3.0, 4.0]), np.float32)
    m = as_csr(sp.dok_matrix(np.array([[0, 2.0], [3, 0]], np.float32)))
    assert (arrays(m), m.dtype) == (([0, 1, 2], [1, 0], [2.0, 3.0]), np.float32)


def test_as_csr_returns_a_canonical_float_csr_itself():
    a = sp.csr_matrix((np.float32([1, 2]), np.int32([0, 1]), np.int32([0, 1, 2])), shape=(2, 2))
    a.has_canonical_format = False  # stale flag: checked, then stated
    assert as_csr(a) is a and a.has_canonical_format
    assert as_csr(a, dtype="float32") is a
    b = sp.csr_array(a)
    got = as_csr(b)  # a csr_array becomes a csr_matrix over the same arrays
    assert isinstance(got, sp.csr_matrix) and np.shares_memory(got.data, b.data) and got.has_canonical_format
    # what the shortcut turns away, each for one reason, comes back as a copy
    others = [
        sp.csr_matrix((np.float32([1, 2]), np.int32([1, 0]), np.int32([0, 2, 2])), shape=(2, 2)),  # unsorted
        sp.csr_matrix((np.float32([1, 2]), np.int32([1, 1]), np.int32([0, 2, 2])), shape=(2, 2)),  # duplicate
        sp.csr_matrix((np.float16([1, 2]), np.int32([0, 1]), np.int32([0, 1, 2])), shape=(2, 2)),  # float16
        sp.csr_matrix((np.int32([1, 2]), np.int32([0, 1]), np.int32([0, 1, 2])), shape=(2, 2)),  # integers
    ]
    for m in others:
        got = as_csr(m)
        assert got is not m
    assert as_csr(a, dtype="float64") is not a
    mixed = sp.csr_matrix((np.float32([1, 2]), np.int32([0, 1]), np.int32([0, 1, 2])), shape=(2, 2))
    mixed.indptr = mixed.indptr.astype(np.int64)
    assert as_csr(mixed) is not mixed
    assert arrays(as_csr(others[0])) == ([0, 2, 2], [0, 1], [2.0, 1.0])
    assert arrays(as_csr(others[1])) == ([0, 1, 1], [1], [3.0])


def test_as_csr_rows_may_restart_columns_at_row_boundaries():
    # row 0 ends with column 1, row 2 (after an empty row) starts with column 0: canonical
    a = sp.csr_matrix((np.float32([1, 2, 3]), np.int32([0, 1, 0]), np.int32([0, 2, 2, 3])), shape=(3, 2))
    assert as_csr(a) is a
    a = sp.csr_matrix((np.float32([1, 2, 3]), np.int32([0, 1, 0]), np.int32([0, 3, 3, 3])), shape=(3, 2))
    assert as_csr(a) is not a


def test_as_csr_checks_the_shortcut_arrays():
    a = sp.csr_matrix((np.float32([1, np.inf]), np.int32([0, 1]), np.int32([0, 1, 2])), shape=(2, 2))
    assert error(as_csr, a).found == "1 non-finite value(s) (NaN or inf), the first inf at (row 1, col 1) (0-based)"
    a = sp.csr_matrix((np.float32([1, 2]), np.int32([0, 1]), np.int32([0, 1, 2])), shape=(2, 2))
    a.indices[1] = 5
    assert parts(error(as_csr, a)) == ("<matrix>", None, "indices: column indices in 0..1", "5 at position 1")


# =================================================================================== __init__.py

@pytest.mark.parametrize("name, fmt", [
    ("a.tsv", "tsv"), ("a.TSV.GZ", "tsv"), ("a.mtx", "mtx"), ("a.mm", "mtx"), ("a.mm.gz", "mtx"), ("a.npz", "npz"),
    ("a.smtx", "smtx"), ("a.idx", "idx"), ("train-images.idx3-ubyte", "idx"), ("train-images-idx3-ubyte", "idx"),
    ("t10k-images-idx3-ubyte.gz", "idx"), ("dir.tsv/a.smtx", "smtx"), (Path("x/y.npz"), "npz"),
])
def test_detect_format_by_extension(name, fmt):
    assert detect_format(name) == fmt


@pytest.mark.parametrize("name, found", [("a.txt", "name 'a.txt'"), ("a.gz", "name 'a.gz'"), ("x/tsv", "name 'tsv'"),
                                         ("a.tsv.bz2", "name 'a.tsv.bz2'")])
def test_detect_format_refuses_other_names(name, found):
    e = error(detect_format, name)
    assert (e.path, e.line, e.found) == (name, None, found)
    assert e.expected == ("a known extension (.idx3-ubyte, -idx3-ubyte, .smtx, .tsv, .mtx, .mm, .npz, .idx, optionally "
                          "+ .gz) or format= one of tsv, mtx, npz, smtx, idx")


def test_load_dispatches_by_name_or_format(tmp_path):
    (tmp_path / "a.tsv").write_bytes(b"1 2 3\n")
    m = load(tmp_path / "a.tsv")
    assert (m.shape, arrays(m)) == ((1, 2), ([0, 1], [1], [3.0]))
    (tmp_path / "a.dat").write_bytes(MTX + b"1 1 1\n1 1 5\n")
    m = load(tmp_path / "a.dat", format="mtx", dtype="float64")
    assert (arrays(m), m.dtype) == (([0, 1], [0], [5.0]), np.float64)
    with pytest.raises(ValueError) as e:
        load(tmp_path / "a.dat", format="csv")
    assert str(e.value) == "format must be one of tsv, mtx, npz, smtx, idx, not 'csv'"
    with pytest.raises(TypeError):
        load(tmp_path / "a.tsv", seed=3)


def test_load_turns_a_memory_error_into_a_sparsegen_error(tmp_path, monkeypatch):
    (tmp_path / "a.tsv").write_bytes(b"1 2 3\n")

    def exhausted(path, **options):
        raise MemoryError("4 GiB")
    monkeypatch.setitem(__import__("sparsegen.io").io.READERS, "tsv", exhausted)
    with pytest.raises(SparsegenError) as e:
        load(tmp_path / "a.tsv")
    assert str(e.value) == f"{tmp_path / 'a.tsv'}: reading it ran out of memory (4 GiB)"

    def bare(path, **options):
        raise MemoryError
    monkeypatch.setitem(__import__("sparsegen.io").io.READERS, "tsv", bare)
    with pytest.raises(SparsegenError) as e:
        load(tmp_path / "a.tsv")
    assert str(e.value).endswith("reading it ran out of memory (MemoryError)")


def csr32(data, indices, indptr, shape):
    return sp.csr_matrix((np.float32(data), np.int32(indices), np.int32(indptr)), shape=shape)


def test_as_csr_shortcut_at_each_row_boundary():
    # rows 0 and 1 each start again at column 0: canonical, returned as it is
    for a in (csr32([1, 2], [0, 0], [0, 1, 2], (2, 1)),           # boundary at position 1
              csr32([1, 2, 3], [0, 1, 0], [0, 2, 3], (2, 2)),     # the only boundary, at 2
              csr32([1, 2, 3], [0, 1, 0], [0, 1, 2, 3], (3, 2))):  # the last boundary, at 2
        assert as_csr(a) is a
    # one row, unsorted: the third index is above the first but below the second
    a = csr32([1, 2, 3], [0, 2, 1], [0, 3], (1, 3))
    got = as_csr(a)
    assert got is not a and arrays(got) == ([0, 3], [0, 1, 2], [1.0, 3.0, 2.0])
    # an empty first row does not make the last pair a boundary
    a = csr32([1, 2], [1, 0], [0, 0, 2], (2, 2))
    got = as_csr(a)
    assert got is not a and arrays(got) == ([0, 0, 2], [0, 1], [2.0, 1.0])


def test_bsr_blocks_of_one_column_and_of_one_row():
    assert triplets("bsr", (2, 2), data=np.float32([[[5], [6]], [[7], [8]]]), indices=np.int32([0, 1]),
                    indptr=np.int32([0, 2])) == ([0, 1, 0, 1], [0, 0, 1, 1], [5.0, 6.0, 7.0, 8.0])
    assert triplets("bsr", (2, 2), data=np.float32([[[5, 6]]]), indices=np.int32([0]),
                    indptr=np.int32([0, 0, 1])) == ([1, 1], [0, 1], [5.0, 6.0])


# ----------------------------------------------------------------------- files: what races and fails

class OsWith:
    """The os module with some functions replaced, for one module under test."""

    def __init__(self, **replaced):
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(os, name)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_regular_refuses_a_socket_before_opening_it(tmp_path):
    import socket
    path = tmp_path / "s.tsv"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        e = error(_files.open_regular, path)
        assert parts(e) == (str(path), None, "a regular file", "a socket")
    finally:
        s.close()


def test_open_regular_does_not_block_on_a_fifo_swapped_in_after_the_stat(tmp_path, monkeypatch):
    import threading
    fifo = tmp_path / "p.tsv"
    os.mkfifo(fifo)
    regular = os.stat(__file__)
    monkeypatch.setattr(_files.os, "stat", lambda p: regular)  # the stat saw a regular file
    outcome = []

    def attempt():
        try:
            _files.open_regular(fifo)
        except FormatError as e:
            outcome.append(e)
    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # opened without O_NONBLOCK: release the reader, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail("open_regular blocked on a FIFO")
    assert parts(outcome[0]) == (str(fifo), None, "a regular file", "a FIFO (named pipe)")


def test_open_regular_closes_what_it_opened_when_it_refuses(tmp_path, monkeypatch):
    p = tmp_path / "a.tsv"
    p.write_text("1 1 1\n")
    real = os.fstat

    def fstat_says_fifo(fd):
        return os.stat_result((stat.S_IFIFO | 0o644,) + tuple(real(fd))[1:])
    # the reader's own `os` only: the interpreter and pytest keep the real fstat
    monkeypatch.setattr(_files, "os", OsWith(fstat=fstat_says_fifo))
    before = open_fds()
    error(_files.open_regular, p)
    assert open_fds() == before

    def fstat_fails(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(_files, "os", OsWith(fstat=fstat_fails))
    e = error(_files.open_regular, p)
    assert parts(e) == (str(p), None, "a readable file", "Input/output error") and open_fds() == before


def test_open_and_read_failures_are_format_errors(tmp_path, monkeypatch):
    p = tmp_path / "a.tsv"
    p.write_text("1 1 1\n")
    real_open = os.open

    def denied(path, flags, *a):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(_files.os, "open", denied)
    assert parts(error(_files.open_regular, p)) == (str(p), None, "a readable file", "Permission denied")
    monkeypatch.setattr(_files.os, "open", lambda *a: (_ for _ in ()).throw(OSError("no strerror here")))
    assert error(_files.open_regular, p).found == "no strerror here"
    monkeypatch.setattr(_files.os, "open", real_open)

    class Broken:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n):
            raise OSError(5, "Input/output error")
    monkeypatch.setattr(_files, "open_regular", lambda path: (Broken(), 6))
    assert parts(error(_files.read_bytes, p)) == (str(p), None, "a readable file", "Input/output error")


def test_stat_failures_other_than_missing(tmp_path, monkeypatch):
    def denied(p):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(_files.os, "stat", denied)
    assert parts(error(_files.open_regular, tmp_path / "x")) == (str(tmp_path / "x"), None, "a readable file",
                                                                 "Permission denied")
    monkeypatch.setattr(_files.os, "stat", lambda p: (_ for _ in ()).throw(OSError("odd")))
    assert error(_files.open_regular, tmp_path / "x").found == "odd"


class OneByte(io.BytesIO):
    """A file that gives at most one byte a read."""

    def read(self, n=-1):
        return super().read(1 if n is None or n < 0 else min(n, 1))


def test_gunzip_finds_the_next_member_a_byte_at_a_time():
    raw = gzip.compress(b"ab") + b"\0\0" + gzip.compress(b"cd")
    assert _files.Gunzip(OneByte(raw), "p").read(100) == b"abcd"
    e = error(_files.Gunzip(OneByte(gzip.compress(b"ab") + b"\0x"), "p").read, 100)
    assert e.found == "1 byte of other data after a member"


def test_gunzip_members_use_the_whole_32_kb_window():
    far = os.urandom(20000) * 2  # the second half refers back 20000 bytes: past a 16 KB window
    assert _files.gunzip(gzip.compress(far), "p") == far
    assert _files.gunzip(gzip.compress(b"ab") + gzip.compress(far), "p") == b"ab" + far


def test_gunzip_read_returns_at_most_n_across_members():
    g = _files.Gunzip(io.BytesIO(gzip.compress(b"ab") + gzip.compress(b"cdefghij")), "p")
    assert g.read(5) == b"abcde" and g.read(2) == b"fg" and g.read(100) == b"hij"


class Counting:
    """A stream that records how many bytes were asked of it."""

    def __init__(self, inner):
        self.inner, self.asked = inner, 0

    def read(self, n):
        self.asked += n
        return self.inner.read(n)


def test_source_reads_no_further_than_one_byte_past_the_limit(tmp_path, monkeypatch):
    (tmp_path / "b.idx").write_bytes(gzip.compress(b"0123456789"))
    monkeypatch.setenv("SPARSEGEN_MAX_DECOMPRESSED_BYTES", "5")
    for first, second, asked in ((0, 8, 6), (0, 7, 6), (2, 8, 6), (0, 6, 6)):
        with _files.Source(tmp_path / "b.idx") as s:
            s.stream = Counting(s.stream)
            if first:
                assert s.read(first) == b"01"
            with pytest.raises(FormatError):
                s.read(second)
            assert s.stream.asked == asked, (first, second)


# ---------------------------------------------------------------------- the number paths, observed

def slow_tokens(monkeypatch):
    """The tokens that reach the slow path (grammar check + NumPy's parser)."""
    seen = []
    real = _text.Tokens._floats_slow

    def slow(self, part, what):
        seen.extend(self.text(int(t)) for t in part)
        return real(self, part, what)
    monkeypatch.setattr(_text.Tokens, "_floats_slow", slow)
    return seen


@pytest.mark.parametrize("token, value", [
    (b"1.5", 1.5), (b"-2.25", -2.25), (b"+3", 3.0), (b".5", 0.5), (b"5.", 5.0), (b"1e5", 1e5), (b"1E+5", 1e5),
    (b"1e-5", 1e-5), (b"-1.5e-3", -1.5e-3), (b"+2.5E+2", 250.0), (b"123456789012345", 123456789012345.0),
    (b"1e22", 1e22), (b"1e-22", 1e-22), (b"0", 0.0), (b"9.99", 9.99), (b"0.1e1", 1.0), (b"-.5e-0", -0.5),
])
def test_plain_decimals_take_the_fast_path(monkeypatch, token, value):
    seen = slow_tokens(monkeypatch)
    assert floats(token).tolist() == [value] and seen == []


@pytest.mark.parametrize("token, value", [
    (b"1e23", 1e23), (b"1.5e-22", 1.5e-22), (b"1234567890123456", 1234567890123456.0), (b"1e1234", float("inf")),
    (b"nan", None), (b"1e0001", 10.0),
])
def test_what_the_fast_path_cannot_do_exactly_goes_slow(monkeypatch, token, value):
    seen = slow_tokens(monkeypatch)
    got = floats(token).tolist()[0]
    assert (got == value or value is None) and seen == [repr(token.decode())]


def test_a_file_of_eight_layouts_is_read_fast_and_a_ninth_goes_slow(monkeypatch):
    seen = slow_tokens(monkeypatch)
    eight = b"1 2.5 .25 1e5 -1.5e-3 12 +123.125 1E+22"  # a sign does not change a layout
    assert floats(eight).tolist() == [1.0, 2.5, 0.25, 1e5, -1.5e-3, 12.0, 123.125, 1e22] and seen == []
    assert floats(eight + b" 1234.5 -3").tolist()[-2:] == [1234.5, -3.0] and seen == ["'1234.5'"]
    seen.clear()
    assert floats(b"1e23 2.5 3.5").tolist() == [1e23, 2.5, 3.5]
    assert seen == ["'1e23'", "'2.5'", "'3.5'"]  # the first token is not fast: the rest go slow with it


def test_slow_path_reads_short_tokens_after_a_long_one():
    # the slow batch's width is the longest token's; a short token at the end of the text reads past
    # its own end within the batch's width
    got = floats(b"1" * 100 + b" 5e-400")
    assert got.tolist() == [float("1" * 100), 0.0]


def test_the_fast_path_takes_only_digits_and_e_where_its_layout_has_them():
    # a later token of the first one's layout, with ':' (one past '9') for a digit, or 'd' for 'e'
    for text in (b"12 1:", b"1e5 1d5", b"1e5 1D5", b"1.5 1/5"):
        e = error(floats, text)
        assert (e.expected, e.found) == ("a number (value)", repr(text.split()[1].decode())), text


def test_slow_path_names_the_first_bad_token():
    e = error(floats, b"1e23 x 1e24 y")
    assert (e.line, e.found) == (1, "'x'")


@pytest.mark.parametrize("token", [b"1\xff", b"1/5", b"1:5", b"12a", b"NAN5"])
def test_more_tokens_that_are_not_numbers(token):
    e = error(floats, token)
    assert e.expected == "a number (value)"


def test_non_finite_words_in_capitals():
    got = floats(b"NAN nAN INFINITY -INF")
    assert np.isnan(got[:2]).all() and got[2:].tolist() == [np.inf, -np.inf]


def test_the_number_grammar_against_a_regular_expression():
    import itertools
    import re
    pattern = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
    tokens = [bytes(t) for n in range(1, 6) for t in itertools.product(b"1+-.eEx", repeat=n)]
    width = 5
    chars = np.zeros((len(tokens), width), np.uint8)
    for i, t in enumerate(tokens):
        chars[i, :len(t)] = np.frombuffer(t, np.uint8)
    lens = np.array([len(t) for t in tokens])
    got = _text._float_grammar(chars, np.arange(width) < lens[:, None], lens)
    expected = [pattern.fullmatch(t) is not None for t in tokens]
    assert got.tolist() == expected


def test_integers_with_a_letter_are_not_integers():
    for token in (b"12a", b"1A", b"b"):
        e = error(ints, token)
        assert e.expected == "an integer row index", token


def test_shift_out_is_not_whitespace():
    assert _text.Tokens(b"a\x0eb c", "p").count == 2
    assert _text.Tokens(b"a\x0db\x0cc\x0bd\x09e\x0af", "p").count == 6


def test_cast_values_checks_equal_width_conversions():
    # uint16 65535 is past float16's 65504: refused, not turned into inf
    e = error(as_csr, np.array([[65535, 0]], np.uint16), dtype="float16")
    assert (e.expected, e.found) == ("values representable in float16", "65535.0, which overflows it")
    assert as_csr(np.array([[65504, 0]], np.uint16), dtype="float16").data.tolist() == [65504.0]
    # widening keeps what it is given
    assert _text.cast_values(np.array([np.inf], np.float32), np.dtype(np.float64), "p").tolist() == [np.inf]


def test_check_indices_of_an_empty_axis():
    e = error(tsv.parse, b"1 1 1\n", shape=(0, 5))
    assert (e.expected, e.found) == ("a row index in 1..0", "1, past the declared shape (0, 5)")


def tsv_lines(*lines) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def test_tsv_errors_name_late_lines():
    ok = [b"1 1 1", b"2 2 1", b"3 3 1", b"4 4 1"]
    e = error(tsv.parse, tsv_lines(*ok, b"9 1 1"), shape=(8, 8))
    assert (e.line, e.found) == (5, "9, past the declared shape (8, 8)")
    e = error(tsv.parse, tsv_lines(*ok, b"1 9 1"), shape=(8, 8))
    assert (e.line, e.found) == (5, "9, past the declared shape (8, 8)")
    e = error(tsv.parse, tsv_lines(*ok, b"5 5 1e39"))
    assert e.line == 5
    e = error(tsv.parse, tsv_lines(*ok, b"3 3 2"))
    assert (e.line, e.found) == (5, "a second entry for (row 3, col 3); the first is on line 3")
    e = error(tsv.parse, tsv_lines(*ok, b"4195000 1 1"))
    assert e.line == 5
    e = error(tsv.parse, tsv_lines(*ok, b"1 4195000 1"))
    assert e.line == 5


def test_mtx_banner_errors_show_the_first_line_only():
    e = error(mtx.parse, b"\n" + MTX + b"1 1 0\n")
    assert (e.line, e.found) == (1, "''")
    bad = b"%%MatrixMarket matrix coordinate real general " + b"x" * 40
    e = error(mtx.parse, bad + b"\n1 1 0\n")
    assert e.found == repr(bad.decode()[:80] + "...")
    e = error(mtx.parse, bad[:80] + b"\n1 1 0\n")
    assert e.found == repr(bad.decode()[:80])


def test_mtx_errors_name_late_lines():
    ok = b"1 1 1\n2 2 1\n3 3 1\n"
    e = error(mtx.parse, MTX + b"9 9 5\n" + ok + b"4 4 1e39\n5 5 1\n")
    assert e.line == 6  # the fourth entry's value
    pattern = b"%%MatrixMarket matrix coordinate pattern general\n3 3 3\n1 1\n1 4\n2 2\n"
    e = error(mtx.parse, pattern)
    assert (e.line, e.expected) == (4, "a column index in 1..3")
    e = error(mtx.parse, b"%%MatrixMarket matrix coordinate pattern general\n3 3 3\n1 1\n4 1\n2 2\n")
    assert (e.line, e.expected) == (4, "a row index in 1..3")


def zipped(members: dict, short: str | None = None, missing: int = 0) -> bytes:
    """A deflated zip of .npy members; the directory claims `missing` more bytes for member `short`
    than it holds (zipfile then reads it short, without an error)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in members.items():
            z.writestr(k + ".npy", v)
    raw = bytearray(buf.getvalue())
    if short is not None:
        name = (short + ".npy").encode()
        local = raw.index(name) - 30  # the first occurrence: the local header's name
        central = raw.index(b"PK\x01\x02")
        while raw[central + 46:central + 46 + len(name)] != name:
            central = raw.index(b"PK\x01\x02", central + 4)
        size = len(members[short]) + missing
        struct.pack_into("<I", raw, local + 22, size)
        struct.pack_into("<I", raw, central + 24, size)
    return bytes(raw)


def test_npz_member_shorter_than_its_directory_says(tmp_path):
    members = csr_archive(data=npy("<f4", (2,), struct.pack("<f", 1.5)))  # 4 of its 8 bytes of data
    p = tmp_path / "m.npz"
    p.write_bytes(zipped(members, "data", 4))
    e = error(npz.read, p)
    assert (e.expected, e.found) == ("member data.npy: 8 bytes of data", "4 bytes (truncated)")


def test_npz_extra_bytes_found_whatever_the_read_size(tmp_path, monkeypatch):
    monkeypatch.setattr(npz, "READ_CHUNK", 8)  # 12 bytes of data in reads of 8 and 4
    p = archive(tmp_path, csr_archive(indptr=npy("<i4", (3,), struct.pack("<4i", 0, 1, 2, 9))))
    e = error(npz.read, p)
    assert (e.expected, e.found) == ("member indptr.npy: 12 bytes of data", "more bytes after them")
    assert npz.read(archive(tmp_path, csr_archive(), name="ok.npz")).shape == (2, 3)


def test_smtx_empty_matrix_with_something_on_its_third_line():
    e = error(smtx.parse, b"2 2 0\n0 0 0\n5")
    assert (e.line, e.expected, e.found) == (3, "0 column indices (nnz)", "1")


def test_smtx_columns_of_a_matrix_without_columns():
    e = error(smtx.parse, b"1 0 1\n0 1\n0\n")
    assert (e.line, e.expected, e.found) == (3, "column indices in 0..-1", "0 at position 0")


@pytest.mark.parametrize("magic", [2050, 2052, 2048])
def test_idx_magics_next_to_the_known_ones_are_unknown(tmp_path, magic):
    p = tmp_path / "h.idx"
    p.write_bytes(struct.pack(">I", magic) + b"x" * 20)
    assert error(idx.read, p).found == f"magic {magic} = 0x{magic:08x} (an unknown magic)"


def test_idx_truncation_by_one_byte_is_settled_before_reading(tmp_path, source_reads):
    reads = source_reads
    e = error(idx.read, idx_file(tmp_path, 1, 3, 3, bytes(8)))  # 9 bytes of pixels needed, 8 there
    assert (e.expected, e.found) == ("9 bytes of pixels for 1 images of 3x3", "8 bytes (truncated)")
    assert reads == [16]


def test_idx_a_large_image_is_backed_by_its_own_bytes(tmp_path):
    m = idx.read(idx_file(tmp_path, 1, 512, 512, bytes(512 * 511) + bytes([255]) * 512))
    assert m.shape == (1, 262144) and m.nnz == 512 and m.indices[0] == 512 * 511
