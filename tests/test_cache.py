"""The on-disk cache: atomic writes, checked reads, corruption as a miss, concurrent writers."""
from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sparsegen
from sparsegen.cache import Cache, default_dir, key, pack_arrays, unpack_arrays, unwrap, wrap

from .helpers import random_csr

REPO = Path(__file__).resolve().parents[1]


def test_round_trip_and_layout(tmp_path):
    c = Cache(tmp_path, active=True)
    k = key("x", 1)
    assert c.get("cubin", k) is None
    path = c.put("cubin", k, b"payload")
    assert path == tmp_path / "cubin" / k[:2] / f"{k}.cubin"
    assert c.get("cubin", k) == b"payload"
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
    assert "corrupt or truncated" in caplog.text


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
