"""Small shared builders for tests (random matrices with controlled structure)."""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp


def random_csr(m, k, density, seed=0, dtype=np.float32, empty_rows=0.0):
    """Random CSR with values in N(0,1); a share `empty_rows` of rows is emptied."""
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", random_state=rng, dtype=np.float64,
                  data_rvs=rng.standard_normal)
    if empty_rows and m:
        keep = rng.random(m) >= empty_rows
        a = sp.diags(keep.astype(np.float64)) @ a
    a = sp.csr_matrix(a, dtype=dtype)
    a.eliminate_zeros()
    a.sort_indices()
    return a


def reference(a, x, bias=None, relu=False):
    y = a.astype(np.float64) @ np.asarray(x, dtype=np.float64)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(-1, 1)
    return np.maximum(y, 0.0) if relu else y


def term_magnitudes(a, x, bias=None):
    """|A|·|X| (+ |bias|) in float64: each output's sum of the magnitudes of its terms, the scale of
    a dot product's rounding error where the terms cancel."""
    return reference(abs(a), np.abs(x), None if bias is None else np.abs(bias))


def term_error(y, ref, a, x, bias=None) -> float:
    """||y - ref|| relative to the terms' magnitudes (`term_magnitudes`), not to ref: where the bias or
    the products cancel, ref is small but the rounding error of the sum is not."""
    scale = np.linalg.norm(term_magnitudes(a, x, bias))
    diff = np.linalg.norm(np.asarray(y, dtype=np.float64) - np.asarray(ref, dtype=np.float64))
    if scale:
        return float(diff / scale)
    return 0.0 if diff == 0 else math.inf  # no terms: any difference is wrong


def rel_error(y, ref) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.linalg.norm(np.asarray(y, dtype=np.float64) - ref)
    denom = np.linalg.norm(ref)
    return float(diff / denom) if denom else float(diff)


TOL = {"float32": 1e-5, "float16": 1e-2}


def rounded(a, dtype):
    """`a` with values rounded to `dtype` but stored as float32 (scipy.sparse has no float16)."""
    a = sp.csr_matrix(a, dtype=np.float32, copy=True)
    a.data = a.data.astype(dtype).astype(np.float32)
    return a


def torch_cuda(why: str):
    """PyTorch with a CUDA device, else skip the test saying `why` it needs torch."""
    import pytest

    try:
        import torch
    except ImportError:
        pytest.skip(f"torch not installed: {why}")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def without_tensor_cores(monkeypatch):
    """The fp32 cost model never picks dense_tile_spmm: for tests of the CSR families' and the SGEMM
    fallback's own rules on layers dense enough that the tensor-core kernel would take them."""
    from sparsegen.select import policy

    with_rates(monkeypatch, "no tensor cores", fp32={"tensor_margin": 1e30})
    monkeypatch.setattr(policy, "PANEL_NARROW_N", 0)  # nor where panel_spmm would serve n <= 128


def elf_symbols(blob: bytes) -> set[str]:
    """Names in the symbol tables of a 64-bit little-endian ELF file (a cubin), read without
    cuobjdump: section headers, then each SHT_SYMTAB's entries and their string table."""
    import struct

    assert blob[:4] == b"\x7fELF" and blob[4] == 2 and blob[5] == 1, "not a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", blob, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            start = strtab + struct.unpack_from("<I", blob, at)[0]
            names.add(blob[start:blob.index(b"\0", start)].decode())
    return names - {""}


def synthetic_device(label: str = "synthetic", **changes):
    """The default device with reported properties (sm_count=..., shared_per_sm=...) and rate groups
    replaced; a rate group is given as a dict of its fields to change (fp32={"tensor_margin": 2.0})."""
    import dataclasses

    from sparsegen.select.device import default

    base = default()
    props = {k: v for k, v in changes.items() if not isinstance(v, dict)}
    groups = {g: dataclasses.replace(getattr(base.rates.values, g), **v) for g, v in changes.items() if isinstance(v, dict)}
    rates = base.rates.replace(source=f"{base.rates.label} ({label})", **groups) if groups else base.rates
    return dataclasses.replace(base, rates=rates, **props)


def with_rates(monkeypatch, label: str, **groups):
    """Both the default device and the GPU in use (`DeviceModel.current`, for backend "gpu") with
    rate groups changed, e.g. fp32={"tensor_margin": 2.0}."""
    import dataclasses
    import functools

    from sparsegen.select import device as device_model

    default, current = device_model.default, device_model.current

    def changed(device):
        values = {g: dataclasses.replace(getattr(device.rates.values, g), **v) for g, v in groups.items()}
        return device.with_rates(device.rates.replace(source=f"{device.rates.label} ({label})", **values))

    fixed = changed(default())
    monkeypatch.setattr(device_model, "default", lambda: fixed)
    monkeypatch.setattr(device_model, "current", functools.lru_cache(maxsize=1)(lambda: changed(current())))
