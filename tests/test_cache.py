"""The on-disk cache: atomic writes, checked reads, corruption as a miss, concurrent writers."""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import sparsegen
from sparsegen.errors import SparsegenError
from sparsegen.cache import Cache, _checkout_cache, cubin_problem, cubin_sm, default_dir, enabled, key, max_bytes, pack_arrays, unpack_arrays, unwrap, wrap

from .helpers import random_csr

REPO = Path(__file__).resolve().parents[1]


def elf_header(abi=8, flags=0x06005A04, magic=b"\x7fELF", elf_class=2, data=1, machine=190) -> bytes:
    """A 64-byte ELF64 header spelled field by field (defaults: what nvcc 13.0 writes for sm_90)."""
    return (magic + bytes([elf_class, data, 1, 0x41, abi]) + bytes(7)  # e_ident
            + (2).to_bytes(2, "little") + machine.to_bytes(2, "little") + (1).to_bytes(4, "little")
            + bytes(24) + flags.to_bytes(4, "little") + bytes(12))


def test_round_trip_and_layout(tmp_path):
    c = Cache(tmp_path, active=True)
    k = key("x", 1)
    cubin = elf_header() + b"sections"
    assert c.get("cubin", k) is None
    path = c.put("cubin", k, cubin)
    assert path == tmp_path / "cubin" / k[:2] / f"{k}.cubin"
    assert c.get("cubin", k, arch="sm_90") == cubin
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_key_is_length_prefixed():
    assert key("ab", "c") != key("a", "bc")
    assert key("a") == key(b"a")


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "empty"])
def test_damaged_entries_are_misses_and_logged(tmp_path, caplog, damage):
    c = Cache(tmp_path, active=True)
    k = key("damage", damage)
    path = c.put("plan", k, b"0123456789" * 10)
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-3] ^= 0xFF
    elif damage == "truncate":
        blob = blob[:-7]
    elif damage == "foreign":
        blob[:4] = b"ELF!"
    else:
        blob = bytearray()
    path.write_bytes(bytes(blob))
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.get("plan", k) is None
    assert caplog.messages == [f"cache: skipping {path} (corrupt or truncated; it will be rewritten); "
                               "treating it as a miss"]


def test_corrupt_plan_is_rebuilt_and_rewritten():
    a = random_csr(80, 80, 0.1, seed=11)
    sparsegen.compile(a, n=4, backend="emulate")
    entries = Cache().entries("plan")
    newest = max(entries, key=lambda e: e.mtime)
    newest.path.write_bytes(newest.path.read_bytes()[:50])
    k = sparsegen.compile(a, n=4, backend="emulate")
    assert k.timings.cached["plan"] is False
    assert unwrap(newest.path.read_bytes()) is not None  # rewritten whole
    assert sparsegen.compile(a, n=4, backend="emulate").timings.cached["plan"] is True


def test_tiled_plans_for_every_n_share_one_encoding(tmp_path, monkeypatch):
    """The tensor-core tiles do not depend on n: the second n finds the analysis and the encoding
    in the cache, its plan entry points at the format entry instead of copying the arrays, and a
    plan whose format entry is gone is built again."""
    import numpy as np

    from .tiled_helpers import host_x, rounded_half

    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path))
    a = rounded_half(random_csr(256, 384, 0.3, seed=4), "float16")
    opts = {"family": "tiled_csl_spmm"}
    first = sparsegen.compile(a, n=16, dtype="float16", options=opts, backend="emulate")
    assert first.timings.cached == {"plan": False, "stats": False, "format": False}
    second = sparsegen.compile(a, n=8, dtype="float16", options=opts, backend="emulate")
    assert second.timings.cached == {"plan": False, "stats": True, "format": True}
    assert second.spec.n == 8 and second.spec.tile_m == first.spec.tile_m
    formats, plans = Cache().entries("format"), Cache().entries("plan")
    assert len(formats) == 1 and len(plans) == 2
    assert all(p.size < formats[0].size / 4 for p in plans)  # meta and source, no words
    x = host_x(np.random.default_rng(1), 384, 8, "float16")
    for _ in range(2):
        k = sparsegen.compile(a, n=8, dtype="float16", options=opts, backend="emulate")
        np.testing.assert_array_equal(k(x), second(x))
        np.testing.assert_allclose(k(x).astype(np.float32), (a @ x.astype(np.float32)), rtol=2e-2, atol=2e-2)
        assert k.timings.cached["plan"] is True
        formats[0].path.unlink()  # the second pass: the plan's arrays are gone, so it is rebuilt
        k = sparsegen.compile(a, n=8, dtype="float16", options=opts, backend="emulate")
        assert k.timings.cached["plan"] is False and Cache().entries("format")


def test_disabled_cache_reads_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEGEN_DISABLE_CACHE", "1")
    c = Cache(tmp_path)
    assert not c.active
    assert c.put("cubin", key("x"), b"x") is None and c.get("cubin", key("x")) is None
    assert not any(tmp_path.iterdir())


def test_unwritable_cache_does_not_break_compile(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(blocker))
    k = sparsegen.compile(random_csr(10, 10, 0.3), n=2, backend="emulate")
    assert k.timings.cached["plan"] is False


def test_location_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "mine"))
    assert default_dir() == tmp_path / "mine"
    monkeypatch.delenv("SPARSEGEN_CACHE_DIR")
    cache_mod = importlib.import_module("sparsegen.cache")
    assert default_dir() == REPO / "cache"  # running from a checkout
    monkeypatch.setattr(cache_mod, "_checkout_cache", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "sparsegen"


def test_pack_arrays_round_trip():
    import numpy as np

    meta, arrays = unpack_arrays(pack_arrays({"a": 1}, {"x": np.arange(5, dtype=np.int32)}))
    assert meta == {"a": 1} and arrays["x"].dtype == np.int32 and arrays["x"].tolist() == [0, 1, 2, 3, 4]


def test_envelope():
    assert unwrap(wrap(b"abc")) == b"abc"
    assert unwrap(wrap(b"abc")[:-1]) is None


RACE = textwrap.dedent("""
    import sys, numpy as np, scipy.sparse as sp, sparsegen
    rng = np.random.default_rng(123)
    a = sp.random(400, 400, density=0.05, format="csr", random_state=rng, dtype=np.float32)
    k = sparsegen.compile(a, n=16, backend=sys.argv[1])
    x = np.ones((400, 16), np.float32)
    assert np.allclose(k(x), a @ x, rtol=1e-5, atol=1e-5)
    print("ok", k.timings.cached)
""")


def _race(tmp_path, backend):
    env = {**os.environ, "SPARSEGEN_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", RACE, backend], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.startswith("ok")
    c = Cache(tmp_path, active=True)
    for e in c.entries():
        assert unwrap(e.path.read_bytes()) is not None
    return c


def test_two_processes_compiling_the_same_kernel_both_succeed(tmp_path):
    c = _race(tmp_path, "emulate")
    assert len(c.entries("plan")) == 1


CUBIN_RACE = textwrap.dedent("""
    import numpy as np, scipy.sparse as sp, sparsegen
    a = sp.random(64, 64, density=0.1, format="csr", random_state=7, dtype=np.float32)
    k = sparsegen.compile(a, n=24, backend="emulate")
    assert k.cubin[:4] == b"\\x7fELF"
""")


@pytest.mark.nvcc
def test_two_processes_racing_on_the_same_cubin(tmp_path):
    """Both run nvcc and publish the same cubin key; the second os.replace is harmless."""
    env = {**os.environ, "SPARSEGEN_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", CUBIN_RACE], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    cubins = Cache(tmp_path, active=True).entries("cubin")
    assert len(cubins) == 1 and unwrap(cubins[0].path.read_bytes())[:4] == b"\x7fELF"


# Behaviour pinned value by value: flags, digests, byte layouts, temporaries and counts.

@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " On ", "Yes\n"])
def test_every_spelling_that_disables_the_cache(tmp_path, monkeypatch, value):
    monkeypatch.setenv("SPARSEGEN_DISABLE_CACHE", value)
    assert enabled() is False and Cache(tmp_path).active is False


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "OFF", " 0 "])
def test_every_spelling_that_keeps_the_cache_on(tmp_path, monkeypatch, value):
    monkeypatch.setenv("SPARSEGEN_DISABLE_CACHE", value)
    assert enabled() is True and Cache(tmp_path).active is True


@pytest.mark.parametrize("value", ["maybe", "2", "disable", "o n", "1 1"])
def test_an_unknown_flag_value_is_an_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv("SPARSEGEN_DISABLE_CACHE", value)
    with pytest.raises(SparsegenError, match=f"SPARSEGEN_DISABLE_CACHE='{value}': expected 1, true, yes or on"):
        Cache(tmp_path)


def test_unset_flag_keeps_the_cache_on(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARSEGEN_DISABLE_CACHE", raising=False)
    assert enabled() and Cache(tmp_path).active


def test_active_argument_overrides_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEGEN_DISABLE_CACHE", "1")
    assert Cache(tmp_path, active=True).active
    monkeypatch.setenv("SPARSEGEN_DISABLE_CACHE", "0")
    assert not Cache(tmp_path, active=False).active


def test_a_disabled_cache_does_not_read_an_existing_entry(tmp_path):
    k = key("present")
    Cache(tmp_path, active=True).put("plan", k, b"stored")
    assert Cache(tmp_path, active=True).get("plan", k) == b"stored"
    assert Cache(tmp_path, active=False).get("plan", k) is None


def test_key_digest_is_sha256_of_length_prefixed_parts():
    assert key() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of nothing
    spelled = b"\x01\x00\x00\x00\x00\x00\x00\x00" b"a" b"\x02\x00\x00\x00\x00\x00\x00\x00" b"17"
    assert key("a", 17) == hashlib.sha256(spelled).hexdigest()
    assert key(b"a", "17") == key("a", 17)


def test_envelope_byte_layout():
    # magic, payload length (u64 LE), CRC-32 of b"abc" (0x352441C2, u32 LE), payload
    expected = b"SGC1" + b"\x03\x00\x00\x00\x00\x00\x00\x00" + b"\xc2\x41\x24\x35" + b"abc"
    assert wrap(b"abc") == expected
    assert bytes(unwrap(expected)) == b"abc"
    assert bytes(unwrap(b"SGC1" + b"\x00" * 8 + b"\x00" * 4)) == b""  # an empty payload is valid (CRC 0)


@pytest.mark.parametrize("cut", [1, 16])
def test_envelope_shorter_than_its_header_or_length_is_foreign(cut):
    blob = wrap(b"abc")
    assert unwrap(blob[:-cut]) is None
    assert unwrap(blob + b"x") is None  # longer than its length field


def test_envelope_with_wrong_magic_length_or_crc_is_rejected():
    good = bytearray(wrap(b"abc"))
    for at in (0, 4, 12):  # magic, length, crc
        bad = bytearray(good)
        bad[at] ^= 1
        assert unwrap(bytes(bad)) is None, at


def test_packed_arrays_byte_layout():
    import numpy as np

    header = (b'{"arrays": {"x": {"dtype": "<i2", "offset": 0, "shape": [2]}, '
              b'"y": {"dtype": "|u1", "offset": 64, "shape": [3]}}, "meta": {"a": 1}}')
    assert len(header) == 131
    expected = (b"SGPLAN1\x00" + b"\x83\x00\x00\x00\x00\x00\x00\x00" + header + b"\x00" * (192 - 147)
                + b"\x01\x00\x02\x00" + b"\x00" * 60 + b"\x07\x08\x09" + b"\x00" * 61)
    packed = pack_arrays({"a": 1}, {"x": np.array([1, 2], dtype="<i2"), "y": np.array([7, 8, 9], np.uint8)})
    assert packed == expected
    meta, arrays = unpack_arrays(expected)
    assert meta == {"a": 1}
    assert arrays["x"].tolist() == [1, 2] and arrays["x"].dtype == np.dtype("<i2")
    assert arrays["y"].tolist() == [7, 8, 9] and arrays["y"].dtype == np.uint8
    assert not arrays["x"].flags.writeable


@pytest.mark.parametrize("pad, start", [(30, 128), (31, 128), (32, 192)])
def test_packed_arrays_start_at_the_first_64_byte_boundary_after_the_header(pad, start):
    """Header lengths 111, 112 and 113: magic + length + header = 127, 128 and 129 bytes."""
    import numpy as np

    header = (b'{"arrays": {"x": {"dtype": "<i2", "offset": 0, "shape": [2]}}, "meta": {"p": "'
              + b"x" * pad + b'"}}')
    assert len(header) == 81 + pad
    expected = (b"SGPLAN1\x00" + len(header).to_bytes(8, "little") + header
                + bytes(start - 16 - len(header)) + b"\x05\x00\x06\x00" + bytes(60))
    packed = pack_arrays({"p": "x" * pad}, {"x": np.array([5, 6], dtype="<i2")})
    assert packed == expected
    assert unpack_arrays(expected)[1]["x"].tolist() == [5, 6]


def test_packed_arrays_keep_their_shape():
    import numpy as np

    _, arrays = unpack_arrays(pack_arrays({}, {"m": np.arange(6, dtype=np.float32).reshape(2, 3)}))
    assert arrays["m"].shape == (2, 3) and arrays["m"][1, 2] == 5.0


def test_unpack_rejects_a_payload_without_the_plan_magic():
    import numpy as np

    packed = bytearray(pack_arrays({}, {"x": np.zeros(2, np.int32)}))
    packed[7] = 1  # the magic's last byte
    with pytest.raises(ValueError, match="^not a sparsegen plan$"):
        unpack_arrays(bytes(packed))


def test_failed_write_removes_its_temporary_file(tmp_path, monkeypatch, caplog):
    c = Cache(tmp_path, active=True)
    k = key("fails")

    def refuse(src, dst):
        raise PermissionError(13, "refused", str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.put("plan", k, b"data") is None
    assert caplog.messages == [f"cache: cannot write {c.path('plan', k)} ([Errno 13] refused: '{c.path('plan', k)}')"]
    assert caplog.records[0].name == "sparsegen.cache"
    assert list(c.path("plan", k).parent.iterdir()) == []


def test_interrupted_write_removes_its_temporary_file_and_reraises(tmp_path, monkeypatch):
    c = Cache(tmp_path, active=True)
    k = key("interrupted")

    def interrupt(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        c.put("plan", k, b"data")
    assert list(c.path("plan", k).parent.iterdir()) == []


def test_entries_lists_entries_and_not_temporary_files(tmp_path):
    c = Cache(tmp_path, active=True)
    a, b = key("a"), key("b")
    c.put("plan", a, b"1234")
    c.put("stats", b, b"12")
    (c.path("plan", a).parent / f".tmp-abc{'.plan'}").write_bytes(b"half")
    listed = {(e.kind, e.key, e.size) for e in c.entries()}
    assert listed == {("plan", a, 16 + 4), ("stats", b, 16 + 2)}
    assert [e.key for e in c.entries("stats")] == [b]
    assert c.entries("cubin") == []


def test_clear_counts_exactly_what_it_removed(tmp_path):
    c = Cache(tmp_path, active=True)
    for i in range(3):
        c.put("plan", key("p", i), b"x")
    c.put("tune", key("t"), b"{}")
    assert c.clear() == 4
    assert c.entries() == [] and c.clear() == 0
    assert not any((tmp_path / kd).exists() for kd in ("plan", "tune"))


# Entries that are not regular files: skipped with a logged miss, never read, never followed.

def _within(seconds, fn):
    """fn()'s result; fails the test instead of hanging when fn blocks."""
    result = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"blocked for more than {seconds} s"
    return result[0]


def _obstacle(tmp_path, what):
    """A cache whose plan entry `k` is replaced by `what`; returns (cache, k, path)."""
    c = Cache(tmp_path / "c", active=True)
    k = key("obstacle", what)
    path = c.path("plan", k)
    path.parent.mkdir(parents=True)
    outside = tmp_path / "outside.plan"
    outside.write_bytes(wrap(b"planted"))  # a valid envelope: reading it through a link is the bug
    if what == "directory":
        path.mkdir()
        (path / "inner").write_bytes(b"x")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif what == "link outside":
        path.symlink_to(outside)
    elif what == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif what == "link to fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    elif what == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # the node of /dev/zero
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD; the link to /dev/zero covers a device reached by a link")
    return c, k, path


OBSTACLES = ["directory", "fifo", "dangling link", "link outside", "link to /dev/zero", "link to fifo", "device"]


@pytest.mark.parametrize("what", OBSTACLES)
def test_an_entry_that_is_not_a_regular_file_is_a_logged_miss(tmp_path, caplog, what):
    c, k, path = _obstacle(tmp_path, what)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert _within(10, lambda: c.get("plan", k)) is None
    (message,) = caplog.messages
    assert message.startswith(f"cache: skipping {path} (not a regular file: ")
    assert message.endswith("); treating it as a miss") and caplog.records[0].name == "sparsegen.cache"
    assert c.entries() == []


def test_a_shard_directory_that_is_a_link_is_not_followed(tmp_path, caplog):
    c = Cache(tmp_path / "c", active=True)
    k = key("shard link")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / (k + ".plan")).write_bytes(wrap(b"planted"))
    (tmp_path / "c" / "plan").mkdir(parents=True)
    c.path("plan", k).parent.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.get("plan", k) is None
    assert caplog.messages == [f"cache: skipping {c.path('plan', k)} ({c.path('plan', k).parent} is not a "
                               "directory but lrwxrwxrwx); treating it as a miss"]
    assert c.entries() == []


def test_a_kind_directory_that_is_a_link_is_not_followed(tmp_path, caplog):
    c = Cache(tmp_path / "c", active=True)
    k = key("kind link")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / k[:2]).mkdir(parents=True)
    (elsewhere / k[:2] / (k + ".plan")).write_bytes(wrap(b"planted"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "plan").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.get("plan", k) is None
    assert caplog.messages == [f"cache: skipping {c.path('plan', k)} ({tmp_path / 'c' / 'plan'} is not a "
                               "directory but lrwxrwxrwx); treating it as a miss"]
    assert c.entries() == []


def test_an_entry_at_the_size_bound_is_read_and_one_byte_over_is_a_miss(tmp_path, caplog):
    k = key("bound")
    path = Cache(tmp_path, active=True).put("plan", k, b"0123456789")
    assert path.stat().st_size == 26  # 16-byte envelope + 10
    assert bytes(Cache(tmp_path, active=True, limit=26).get("plan", k)) == b"0123456789"
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert Cache(tmp_path, active=True, limit=25).get("plan", k) is None
    assert caplog.messages == [f"cache: skipping {path} (26 bytes, over the 25-byte bound "
                               "(SPARSEGEN_CACHE_MAX_BYTES)); treating it as a miss"]


def test_read_payload_is_read_only(tmp_path):
    c = Cache(tmp_path, active=True)
    c.put("plan", key("ro"), b"abc")
    with pytest.raises(TypeError):
        c.get("plan", key("ro"))[0] = 1


def test_max_bytes_default_and_setting(monkeypatch):
    monkeypatch.delenv("SPARSEGEN_CACHE_MAX_BYTES", raising=False)
    assert max_bytes() == 4294967296 == Cache().max_bytes
    monkeypatch.setenv("SPARSEGEN_CACHE_MAX_BYTES", "  ")
    assert max_bytes() == 4294967296
    monkeypatch.setenv("SPARSEGEN_CACHE_MAX_BYTES", "1000")
    assert max_bytes() == 1000 == Cache().max_bytes
    monkeypatch.setenv("SPARSEGEN_CACHE_MAX_BYTES", "0")
    assert max_bytes() == 0


@pytest.mark.parametrize("value", ["2G", "-1", "1e9", "1.5", "1_000", "\u0662"])
def test_max_bytes_rejects_anything_but_a_whole_number(monkeypatch, value):
    monkeypatch.setenv("SPARSEGEN_CACHE_MAX_BYTES", value)
    with pytest.raises(SparsegenError, match="SPARSEGEN_CACHE_MAX_BYTES=.*expected a whole number of bytes"):
        Cache()


# Cubin entries: a CUDA ELF file for the requested arch, or a miss.

@pytest.mark.parametrize("abi, flags, sm", [
    (8, 0x06005A04, 90), (8, 0x06005004, 80), (8, 0x06007802, 120), (8, 0x06004B04, 75),  # nvcc 13.0's
    (7, 0x005A055A, 90), (7, 0x00500550, 80), (7, 0x004B054B, 75),  # EF_CUDA_SM in bits 0-7, virtual SM 16-23
])
def test_cubin_sm_from_e_flags(abi, flags, sm):
    assert cubin_sm(abi, flags) == sm
    assert cubin_problem(elf_header(abi, flags), f"sm_{sm}") is None
    assert cubin_problem(elf_header(abi, flags), f"sm_{sm + 1}") == f"built for sm_{sm}"


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "sm_90f", None])
def test_cubin_suffixes_and_no_arch_accept_the_same_number(arch):
    assert cubin_problem(elf_header(), arch) is None


@pytest.mark.parametrize("arch", ["sm_9", "sm_900", "sm_90x", "compute_90", "90", ""])
def test_cubin_for_another_spelling_is_refused(arch):
    assert cubin_problem(elf_header(), arch) == "built for sm_90"


@pytest.mark.parametrize("header, problem", [
    (elf_header(magic=b"\x7fELG"), "not a 64-bit little-endian ELF file"),
    (elf_header(elf_class=1), "not a 64-bit little-endian ELF file"),
    (elf_header(data=2), "not a 64-bit little-endian ELF file"),
    (elf_header(machine=62), "e_machine 62, not EM_CUDA (190)"),
    (elf_header(abi=9), "CUDA ELF ABI version 9, whose e_flags sparsegen cannot read"),
    (elf_header(abi=6), "CUDA ELF ABI version 6, whose e_flags sparsegen cannot read"),
    (elf_header()[:51], "shorter than an ELF header"),
    (b"payload", "shorter than an ELF header"),
])
def test_cubin_problems(header, problem):
    assert cubin_problem(header, "sm_90") == problem
    assert cubin_problem(header, None) == problem


def test_cubin_header_of_exactly_52_bytes_is_read():
    assert cubin_problem(elf_header()[:52], "sm_90") is None


def test_cubin_entry_for_another_arch_or_not_a_cubin_is_a_logged_miss(tmp_path, caplog):
    c = Cache(tmp_path, active=True)
    c.put("cubin", key("80"), elf_header(flags=0x06005004))
    c.put("cubin", key("text"), b"#!/bin/sh\necho not a cubin, but long enough to hold a header\n")
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.get("cubin", key("80"), arch="sm_90") is None
        assert c.get("cubin", key("text")) is None
    assert caplog.messages == [
        f"cache: skipping {c.path('cubin', key('80'))} (not a cubin for sm_90: built for sm_80); treating it as a miss",
        f"cache: skipping {c.path('cubin', key('text'))} (not a cubin for any arch: not a 64-bit little-endian "
        "ELF file); treating it as a miss"]
    assert c.get("cubin", key("80"), arch="sm_80") is not None and c.get("cubin", key("80")) is not None


def test_other_kinds_are_not_checked_as_cubins(tmp_path):
    c = Cache(tmp_path, active=True)
    c.put("plan", key("p"), b"not an ELF")
    assert bytes(c.get("plan", key("p"), arch="sm_90")) == b"not an ELF"


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
def test_cubins_nvcc_builds_carry_their_arch(tmp_path, arch):
    from sparsegen import nvcc

    cubin = nvcc.compile_cubin('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }', arch)
    assert cubin_problem(cubin, arch) is None
    assert cubin_problem(cubin, "sm_86") == f"built for {arch}"
    c = Cache(tmp_path, active=True)
    c.put("cubin", key(arch), cubin)
    assert c.get("cubin", key(arch), arch=arch) == cubin and c.get("cubin", key(arch), arch="sm_86") is None


# clear(): whatever is in the cache goes, links but never their targets, and the count is exact.

NOBODY = 65534


@pytest.fixture
def shared_tmp():
    """A directory that another user can reach (pytest's tmp_path is private to this user)."""
    path = Path(tempfile.mkdtemp(prefix="sparsegen-cache-test-"))
    os.chmod(path, 0o755)
    yield path
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
    shutil.rmtree(path, ignore_errors=True)


def _give_to_nobody(top: Path):
    """When this is root, everything under `top` (links themselves) becomes the user nobody's."""
    if os.geteuid() == 0:
        for parent, dirs, files in os.walk(top):
            for name in [parent, *(os.path.join(parent, n) for n in dirs + files)]:
                os.chown(name, NOBODY, NOBODY, follow_symlinks=False)


def _as_unprivileged(fn):
    """fn()'s result (JSON-able), run where file permissions hold: here when this is not root, else in
    a forked child that becomes the user nobody."""
    if os.geteuid() != 0:
        return fn()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            reply = [True, fn()]
        except BaseException as exc:
            reply = [False, repr(exc)]
        try:
            os.write(write, json.dumps(reply).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    ok, value = json.loads(out) if out else (False, "no reply")
    assert ok, f"the unprivileged child failed: {value}"
    return value


def _cluttered_cache(root: Path, outside: Path) -> Cache:
    """Ten names to remove: 3 entries (one unreadable, one in an unreadable shard), a temporary file,
    a FIFO, a dangling link, a link to a file outside, a directory in an entry's place, a file in a
    shard's place and a link in a kind's place."""
    c = Cache(root, active=True)
    (outside / "dir").mkdir(parents=True)
    (outside / "file").write_bytes(b"keep me")
    (outside / "dir" / "inner").write_bytes(b"keep me too")
    a, b, d = c.put("plan", "aa" + "1" * 62, b"1"), c.put("plan", "aa" + "2" * 62, b"2"), c.put("plan", "bb" + "3" * 62, b"3")
    shard = a.parent
    (shard / ".tmp-x.plan").write_bytes(b"half")
    os.mkfifo(shard / "fifo.plan")
    (shard / "dangling.plan").symlink_to(outside / "nowhere")
    (shard / "outside.plan").symlink_to(outside / "file")
    (shard / "dir.plan" / "deeper").mkdir(parents=True)
    (shard / "dir.plan" / "deeper" / "f").write_bytes(b"x")
    (shard / "dir.plan" / "second").write_bytes(b"x")  # a directory counts once, whatever it holds
    os.chmod(shard / "dir.plan" / "deeper", 0)
    os.chmod(shard / "dir.plan", 0)
    os.chmod(b, 0)
    os.chmod(d.parent, 0)
    (root / "plan" / "cc").write_bytes(b"a file where a shard belongs")
    (root / "stats").symlink_to(outside / "dir")
    (root / "cubin").mkdir()
    return c


def test_clear_removes_everything_and_counts_it(shared_tmp):
    root, outside = shared_tmp / "cache", shared_tmp / "outside"
    c = _cluttered_cache(root, outside)
    (root / "README.md").write_text("not the cache's to remove")
    _give_to_nobody(shared_tmp)
    count, left = _as_unprivileged(lambda: (c.clear(), sorted(os.listdir(root))))
    assert count == 10
    assert left == ["README.md"]
    assert (outside / "file").read_bytes() == b"keep me"
    assert (outside / "dir" / "inner").read_bytes() == b"keep me too"


def test_clear_of_an_empty_or_missing_cache_is_zero(tmp_path):
    assert Cache(tmp_path / "missing", active=True).clear() == 0
    (tmp_path / "empty" / "plan" / "aa").mkdir(parents=True)
    assert Cache(tmp_path / "empty", active=True).clear() == 0
    assert not (tmp_path / "empty" / "plan").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a name the cache's owner cannot remove")
def test_clear_does_not_count_what_it_cannot_remove(shared_tmp):
    root = shared_tmp / "cache"
    c = Cache(root, active=True)
    c.put("plan", "aa" + "1" * 62, b"1")
    _give_to_nobody(shared_tmp)
    stuck = c.path("plan", "bb" + "2" * 62)  # root's, in a shard of root's: nobody cannot remove it
    stuck.parent.mkdir(mode=0o755)
    stuck.write_bytes(wrap(b"2"))
    assert len(c.entries()) == 2

    def clear_and_log():
        records = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        logging.getLogger("sparsegen.cache").addHandler(handler)
        return c.clear(), records

    count, records = _as_unprivileged(clear_and_log)
    assert count == 1
    assert records == [f"cache: cannot remove {stuck} ([Errno 13] Permission denied: '{stuck}')"]
    assert stuck.exists() and c.entries() == [c.entries()[0]] and c.entries()[0].path == stuck


# Writes repair what sits in the way.

def _in_the_way(root: Path, k: str, what: str, outside: Path) -> Path:
    """Puts `what` where the plan entry `k` or one of its directories belongs; returns the entry path."""
    entry = root / "plan" / k[:2] / (k + ".plan")
    outside.mkdir(parents=True, exist_ok=True)
    parent = {"file as kind": root / "plan", "link as kind": root / "plan"}.get(what, entry.parent)
    parent.parent.mkdir(parents=True, exist_ok=True)
    if what in ("directory", "fifo", "read-only entry", "link to outside entry", "read-only shard"):
        entry.parent.mkdir(parents=True, exist_ok=True)
    if what == "directory":
        (entry / "sub").mkdir(parents=True)
        (entry / "sub" / "f").write_bytes(b"x")
    elif what == "fifo":
        os.mkfifo(entry)
    elif what == "read-only entry":
        entry.write_bytes(b"stale")
        os.chmod(entry, 0o444)
    elif what == "link to outside entry":
        (outside / "target").write_bytes(b"outside")
        entry.symlink_to(outside / "target")
    elif what == "read-only shard":
        os.chmod(entry.parent, 0o500)
    elif what in ("file as shard", "file as kind"):
        parent.write_bytes(b"a file")
    elif what in ("link as shard", "link as kind"):
        parent.symlink_to(outside)
    return entry


IN_THE_WAY = ["directory", "fifo", "read-only entry", "link to outside entry", "read-only shard",
              "file as shard", "file as kind", "link as shard", "link as kind"]


@pytest.mark.parametrize("what", IN_THE_WAY)
def test_a_write_repairs_what_sits_in_the_way(shared_tmp, what):
    root, outside = shared_tmp / "cache", shared_tmp / "outside"
    k = key("in the way", what)
    entry = _in_the_way(root, k, what, outside)
    outside_before = sorted(p.name for p in outside.rglob("*"))
    _give_to_nobody(shared_tmp)
    c = Cache(root, active=True)
    stored, read = _as_unprivileged(lambda: (str(c.put("plan", k, b"fresh")), bytes(c.get("plan", k)).decode()))
    assert stored == str(entry) and read == "fresh"
    assert stat.S_ISREG(os.lstat(entry).st_mode)
    assert sorted(p.name for p in outside.rglob("*")) == outside_before  # nothing written or removed there
    if what == "link to outside entry":
        assert (outside / "target").read_bytes() == b"outside"
    if what == "read-only shard":
        assert stat.S_IMODE(os.stat(entry.parent).st_mode) == 0o700
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary file left


def test_new_directories_are_private(tmp_path):
    c = Cache(tmp_path / "c", active=True)
    path = c.put("plan", key("private"), b"x")
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path.parent.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


# Trust: the directory must be this user's and writable by no one else, or the cache is not used.

@pytest.mark.parametrize("mode", [0o700, 0o755, 0o750, 0o705, 0o500], ids=oct)
def test_a_private_or_read_only_for_others_directory_is_used(tmp_path, caplog, mode):
    root = tmp_path / "c"
    Cache(root, active=True).put("plan", key("m"), b"x")
    os.chmod(root, mode)
    c = Cache(root, active=True)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.refusal() is None and bytes(c.get("plan", key("m"))) == b"x"
    assert caplog.text == ""


@pytest.mark.parametrize("mode", [0o720, 0o702, 0o770, 0o777, 0o1777, 0o722], ids=oct)
def test_a_group_or_world_writable_directory_is_refused_with_one_warning(tmp_path, caplog, mode):
    root = tmp_path / "c"
    Cache(root, active=True).put("plan", key("planted"), b"someone else's")
    os.chmod(root, mode)
    c = Cache(root, active=True)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.get("plan", key("planted")) is None
        assert c.put("plan", key("new"), b"x") is None and c.get("plan", key("new")) is None
    assert not c.path("plan", key("new")).exists()
    assert caplog.messages == [f"cache: not using {root}: it is group- or world-writable "
                               f"({stat.filemode(os.stat(root).st_mode)}); make it private: chmod 700 {root}"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another user")
def test_a_directory_of_another_user_is_refused(tmp_path, caplog):
    root = tmp_path / "c"
    Cache(root, active=True).put("plan", key("theirs"), b"x")
    os.chown(root, NOBODY, NOBODY)
    c = Cache(root, active=True)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.get("plan", key("theirs")) is None
    assert c.refusal() == f"it belongs to uid {NOBODY}, not to this user (uid 0)"


def test_a_file_in_place_of_the_directory_is_refused(tmp_path):
    (tmp_path / "c").write_bytes(b"a file")
    c = Cache(tmp_path / "c", active=True)
    assert c.refusal() == "it is not a directory (-rw-r--r--)" and c.put("plan", key("f"), b"x") is None


def test_the_cache_directory_is_made_private(tmp_path):
    root = tmp_path / "new" / "cache"
    c = Cache(root, active=True)
    assert c.refusal() is None  # missing: the first write makes it
    c.put("plan", key("first"), b"x")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert c.refusal() is None


def test_cache_info_says_why_a_directory_is_refused(tmp_path, monkeypatch, capsys):
    from sparsegen import cli

    root = tmp_path / "c"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(root))
    assert cli.main(["cache", "info"]) == 0
    assert "refused" not in capsys.readouterr().out
    os.chmod(root, 0o775)
    assert cli.main(["cache", "info"]) == 0
    assert f"refused    it is group- or world-writable (drwxrwxr-x); make it private: chmod 700 {root}" in capsys.readouterr().out


# Size cap: least recently used entries go first; stale temporaries go; an entry over the cap is not stored.

def _aged(c: Cache, name: str, payload: bytes, mtime: float) -> Path:
    path = c.put("plan", key(name), payload)
    os.utime(path, (mtime, mtime))
    return path


def _three(tmp_path, limit):
    """Entries a, b, c of 16 + 10 = 26 bytes each, used at times 1000, 2000, 3000."""
    c = Cache(tmp_path, active=True, limit=10**6)
    paths = [_aged(c, name, b"0123456789", t) for name, t in (("a", 1000), ("b", 2000), ("c", 3000))]
    c.max_bytes = limit
    return c, paths


def _left(c):
    return sorted(e.path.name for e in c.entries())


def test_evict_keeps_everything_at_the_cap_and_drops_the_oldest_one_byte_over(tmp_path):
    c, (a, b, d) = _three(tmp_path, 78)
    assert c.evict() == 0 and len(c.entries()) == 3
    c.max_bytes = 77
    assert c.evict() == 1 and _left(c) == sorted([b.name, d.name])


def test_evict_drops_oldest_first_until_it_fits(tmp_path):
    c, (a, b, d) = _three(tmp_path, 26)
    assert c.evict() == 2 and _left(c) == [d.name]
    c.max_bytes = 0
    assert c.evict() == 1 and c.entries() == []


def test_evict_never_drops_the_entry_it_keeps(tmp_path):
    c, (a, b, d) = _three(tmp_path, 52)
    assert c.evict(keep=a) == 1 and _left(c) == sorted([a.name, d.name])


def test_a_hit_makes_an_entry_recently_used(tmp_path):
    c, (a, b, d) = _three(tmp_path, 52)
    before = time.time() - 1
    assert bytes(c.get("plan", key("a"))) == b"0123456789"
    assert os.stat(a).st_mtime >= before
    assert c.evict() == 1 and _left(c) == sorted([a.name, d.name])


def test_a_write_evicts_down_to_the_cap(tmp_path):
    c, (a, b, d) = _three(tmp_path, 78)
    new = c.put("plan", key("new"), b"0123456789")
    assert new is not None and _left(c) == sorted([b.name, d.name, new.name])


def test_an_entry_at_the_cap_is_stored_and_one_byte_over_is_not(tmp_path, caplog):
    c = Cache(tmp_path, active=True, limit=26)
    assert c.put("plan", key("fits"), b"0123456789") is not None
    assert _left(c) == [key("fits") + ".plan"]
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.put("plan", key("big"), b"0123456789A") is None
    assert caplog.messages == [f"cache: not storing {c.path('plan', key('big'))}: 27 bytes, over the 26-byte "
                               "bound (SPARSEGEN_CACHE_MAX_BYTES)"]
    assert _left(c) == [key("fits") + ".plan"]


def test_evict_removes_temporary_files_older_than_an_hour(tmp_path):
    c, (a, b, d) = _three(tmp_path, 10**6)
    shard = a.parent
    for name, mtime in (("old", 5000.0), ("edge", 5000.5), ("new", 6000.0)):
        (shard / f".tmp-{name}.plan").write_bytes(b"half")
        os.utime(shard / f".tmp-{name}.plan", (mtime, mtime))
    assert c.evict(now=8600.5) == 1  # 3600.5 s old: gone; exactly 3600 s: kept
    assert sorted(p.name for p in shard.glob(".tmp-*")) == [".tmp-edge.plan", ".tmp-new.plan"]
    assert c.evict(now=8600.5) == 0 and len(c.entries()) == 3


def test_temporary_files_do_not_count_towards_the_cap(tmp_path):
    c, (a, b, d) = _three(tmp_path, 78)
    (a.parent / ".tmp-writing.plan").write_bytes(b"x" * 1000)
    assert c.evict() == 0 and len(c.entries()) == 3



# Layout, location and listing, value by value.

def test_paths_of_every_kind(tmp_path):
    c = Cache(tmp_path, active=True)
    k = "ab" + "0" * 62
    spelled = {"cubin": "cubin/ab/" + k + ".cubin", "plan": "plan/ab/" + k + ".plan",
               "format": "format/ab/" + k + ".fmt", "stats": "stats/ab/" + k + ".stats",
               "tune": "tune/ab/" + k + ".json"}
    assert {kind: str(c.path(kind, k).relative_to(tmp_path)) for kind in spelled} == spelled


def test_entries_are_values(tmp_path):
    c = Cache(tmp_path, active=True)
    c.put("stats", key("v"), b"x")
    (entry,) = c.entries()
    with pytest.raises(AttributeError):
        entry.size = 0


def test_entries_leave_out_files_of_another_suffix(tmp_path):
    c = Cache(tmp_path, active=True)
    path = c.put("plan", key("listed"), b"x")
    (path.parent / "README").write_bytes(b"x")
    (path.parent / (key("tune") + ".json")).write_bytes(b"x")
    assert [e.path for e in c.entries()] == [path]


def test_checkout_cache_needs_pyproject_and_cache(tmp_path):
    assert _checkout_cache(tmp_path) is None
    (tmp_path / "cache").mkdir()
    assert _checkout_cache(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text("")
    assert _checkout_cache(tmp_path) == tmp_path / "cache"
    (tmp_path / "cache").rmdir()
    assert _checkout_cache(tmp_path) is None


def test_default_dir_without_xdg_is_under_home(monkeypatch, tmp_path):
    cache_mod = importlib.import_module("sparsegen.cache")
    monkeypatch.delenv("SPARSEGEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cache_mod, "_checkout_cache", lambda: None)
    assert default_dir() == tmp_path / ".cache" / "sparsegen"
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", "~/mine")
    assert default_dir() == tmp_path / "mine"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc/self/fd")
def test_reads_leave_no_descriptor_open(tmp_path):
    c = Cache(tmp_path, active=True)
    c.put("plan", key("fd"), b"x")
    c.get("plan", key("fd"))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert c.get("plan", key("fd")) is not None
    assert len(os.listdir("/proc/self/fd")) == before


def _lstat_sees_a_regular_file(monkeypatch, path: Path, decoy: Path):
    """The entry is swapped after the lstat: lstat of `path` reports the regular file `decoy`."""
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **kw: real(decoy) if str(p) == str(path) else real(p, *a, **kw))


@pytest.mark.parametrize("what", ["fifo", "link outside"])
def test_an_entry_swapped_after_the_lstat_is_still_refused(tmp_path, monkeypatch, caplog, what):
    c, k, path = _obstacle(tmp_path, what)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(wrap(b"decoy"))
    _lstat_sees_a_regular_file(monkeypatch, path, decoy)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert _within(10, lambda: c.get("plan", k)) is None
    expected = "not a regular file: prw" if what == "fifo" else "Too many levels of symbolic links"
    assert expected in caplog.text


def test_a_cache_below_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    c = Cache(tmp_path / "file" / "cache", active=True)
    assert c.refusal().startswith("cannot stat it ([Errno 20] Not a directory")
    assert c.put("plan", key("x"), b"x") is None


def test_a_name_another_process_removed_first_is_not_counted_or_logged(tmp_path, monkeypatch, caplog):
    c, (a, b, d) = _three(tmp_path, 52)
    (a.parent / ".tmp-dead.plan").write_bytes(b"half")
    os.utime(a.parent / ".tmp-dead.plan", (1000, 1000))
    real = os.unlink

    def beaten(p, *args, **kw):
        real(p, *args, **kw)
        raise FileNotFoundError(2, "No such file or directory", str(p))

    monkeypatch.setattr(os, "unlink", beaten)
    with caplog.at_level(logging.WARNING, logger="sparsegen.cache"):
        assert c.evict() == 0  # every removal was the other process's, so the total never shrank
    assert caplog.text == "" and _left(c) == []


def test_compile_recompiles_a_cached_cubin_built_for_another_sm(tmp_path, monkeypatch):
    """compile() asks the cache for a cubin of its own target: an sm_80 cubin under an sm_90 key is a
    miss, nvcc runs, and its output replaces the entry."""
    from sparsegen import api, nvcc

    cache = Cache(tmp_path, active=True)
    source = "extern \"C\" __global__ void k() {}\n"
    cache.put("cubin", api.cubin_key(source, "sm_90"), elf_header(flags=0x06005004))  # sm_80
    fresh = elf_header(flags=0x06005A04)
    monkeypatch.setattr(nvcc, "compile_cubin", lambda src, arch, name=None: fresh)
    timings = api.Timings()
    assert bytes(api._cubin_for(source, "sm_90", "k", cache, timings)) == fresh
    assert timings.cached["cubin"] is False
    assert bytes(cache.get("cubin", api.cubin_key(source, "sm_90"), arch="sm_90")) == fresh
