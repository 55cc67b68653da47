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
