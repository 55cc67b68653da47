"""sparsegen.select pinned: the cost models' formulas against times worked out by hand on round
rates, every strict and non-strict comparison of the verdicts on both sides (exact binary
fractions make the ties exact), the rates file's checks and messages, the device model's lookup
order and scaling, and the rules' reasons. Selections under the shipped rates files, with each
measured crossover approached from both sides, are at the end."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sparsegen.errors import FormatError
from sparsegen.select import device as D
from sparsegen.select import fit, fp32_cost, ratesfile as R, skinny_cost as S
from sparsegen.select.ratesfile import CsrFp16, CublasFp16, Errors, Fp32, Launch, Line, Memory

DEFAULT = R.default()


def rates(**groups) -> R.Rates:
    return DEFAULT.replace(source="hand", **groups)


def stats(m, k, nnz, **more):
    return SimpleNamespace(shape=(m, k), nnz=nnz, **more)


# ================================================================================= fp32_cost.py

FP32 = Fp32(csr=Line(1e-6, 1e12), sgemm=Line(2e-6, 4e12), tf32x3=Line(3e-6, 8e12), f16x3=Line(4e-6, 16e12),
            epilogue_s=5e-6, epilogue_bytes_per_s=1e12, sgemm_margin=1.25, tensor_margin=1.5)


def test_fp32_lines_by_hand():
    r = rates(fp32=FP32)
    assert fp32_cost.sparse_seconds(1000, 10, r) == pytest.approx(1e-6 + 2e4 / 1e12, rel=1e-14)
    assert fp32_cost.dense_seconds(100, 200, 10, r) == pytest.approx(2e-6 + 4e5 / 4e12, rel=1e-14)
    # the epilogue pass: a launch plus Y read and written (8 bytes an element)
    assert fp32_cost.dense_seconds(100, 200, 10, r, epilogue=True) == pytest.approx(2.1e-6 + 5e-6 + 8e3 / 1e12,
                                                                                    rel=1e-14)
    assert fp32_cost.tensor_seconds(100, 200, 10, r, f16x3=False) == pytest.approx(3e-6 + 4e5 / 8e12, rel=1e-14)
    assert fp32_cost.tensor_seconds(100, 200, 10, r, f16x3=True) == pytest.approx(4e-6 + 4e5 / 16e12, rel=1e-14)
    # by default, the line of the products dense_tile_spmm takes: 3xFP16 from 1e9 flops at n >= 256
    assert fp32_cost.tensor_seconds(100, 200, 10, r) == fp32_cost.tensor_seconds(100, 200, 10, r, f16x3=False)
    assert fp32_cost.tensor_seconds(1000, 2000, 256, r) == fp32_cost.tensor_seconds(1000, 2000, 256, r, f16x3=True)
    assert fp32_cost.tensor_seconds(1000, 2000, 255, r) == fp32_cost.tensor_seconds(1000, 2000, 255, r, f16x3=False)


# exact binary times: no launches, power-of-two rates; sparse = 2 nnz n / 2**40, dense = 2 m k n / 2**42,
# tensor = 2 m k n / 2**43
EXACT = Fp32(csr=Line(0.0, 2.0**40), sgemm=Line(0.0, 2.0**42), tf32x3=Line(0.0, 2.0**43), f16x3=Line(0.0, 2.0**44),
             epilogue_s=0.0, epilogue_bytes_per_s=2.0**40, sgemm_margin=1.25, tensor_margin=1.5)




def test_judge_tensor_margin_is_strict_on_both_sides():
    r = rates(fp32=EXACT)
    m, k, n = 64, 64, 8  # 2 m k n = 2**16: dense = 2**-26, tensor = 2**-27
    # tensor * 1.5 = 1.5 * 2**-27 against sparse = 2 nnz n / 2**40 = nnz * 2**-36: equal at nnz = 768
    assert fp32_cost.judge(stats(m, k, 768), n, r).pick != "tensor"
    v = fp32_cost.judge(stats(m, k, 769), n, r)
    assert v.pick == "tensor" and v.tensor_s * 1.5 < v.sparse_s
    assert (v.sparse_s, v.dense_s, v.tensor_s) == (769 * 2.0**-36, 2.0**-26, 2.0**-27)
    assert v.tensor_mma == "3xTF32" and (v.sgemm_margin, v.tensor_margin, v.rates) == (1.25, 1.5, "hand")


def test_judge_sgemm_margin_is_strict_on_both_sides():
    r = rates(fp32=dataclasses.replace(EXACT, tensor_margin=1e30))
    m, k, n = 64, 64, 8  # dense = 2**-26; dense * 1.25 = 1.25 * 2**-26 = sparse at nnz = 1.25 * 2**10 = 1280
    assert fp32_cost.judge(stats(m, k, 1280), n, r).pick == "sparse"
    v = fp32_cost.judge(stats(m, k, 1281), n, r)
    assert v.pick == "sgemm" and v.dense
    assert not fp32_cost.judge(stats(m, k, 1280), n, r).dense


def test_judge_tensor_against_the_faster_of_the_other_two():
    r = rates(fp32=EXACT)
    m, k, n = 64, 64, 8
    # sparse far slower: tensor (2**-27) * 1.5 against dense (2**-26): taken
    assert fp32_cost.judge(stats(m, k, 10**6), n, r).pick == "tensor"
    # tensor_margin 2: tensor * 2 = dense exactly: not taken; dense * 1.25 < sparse: sgemm
    r2 = rates(fp32=dataclasses.replace(EXACT, tensor_margin=2.0))
    assert fp32_cost.judge(stats(m, k, 10**6), n, r2).pick == "sgemm"


def test_judge_epilogue_and_3xfp16():
    r = rates(fp32=EXACT)
    v = fp32_cost.judge(stats(64, 64, 100), 8, r, epilogue=True)
    assert v.dense_s == 2.0**-26 + 8 * 64 * 8 / 2.0**40
    v = fp32_cost.judge(stats(2048, 2048, 100), 256, r)  # 2 m k n = 2**31 >= 1e9 at n = 256: 3xFP16
    assert v.tensor_mma == "3xFP16" and v.tensor_s == 2.0**31 / 2.0**44
    v = fp32_cost.judge(stats(2048, 2048, 100), 255, r)
    assert v.tensor_mma == "3xTF32"


def test_fp32_verdict_text():
    v = fp32_cost.Fp32Verdict("sgemm", 1e-3, 2.5e-4, 1.25e-3, "3xFP16", 1.25, 1.5, "h.json")
    assert v.text == ("CSR kernels 1 ms, dense cuBLAS SGEMM 0.25 ms, 3xFP16 tensor cores 1.25 ms predicted (SGEMM "
                      "taken when 1.25x faster than the CSR kernels, tensor cores when 1.5x faster than both; rates "
                      "h.json)")
    assert v.dense and not dataclasses.replace(v, pick="tensor").dense


# =============================================================================== skinny_cost.py

def test_rates_key_of_a_spec():
    assert S.rates_key(SimpleNamespace(family="tiled_csl_spmm")) == "tiled_csl_spmm"
    assert S.rates_key(SimpleNamespace(family="tiled_bitmap_spmm", granule=1)) == "tiled_bitmap_spmm"
    assert S.rates_key(SimpleNamespace(family="tiled_bitmap_spmm", granule=2)) == "tiled_bitmap_spmm.g2"


def test_column_factor_of_block_widths():
    t = R.TileRates(1, 2, 3, wide=0.75, n16=0.5)
    assert [S.column_factor(t, bn) for bn in (8, 16, 32, 33, 64)] == [1.0, 0.5, 1.0, 0.75, 0.75]


CUBLAS = CublasFp16(fixed_s=1e-6, bytes_per_s=1e12, flops=1e15, floor_s=2e-6)


def test_skinny_dense_seconds_bytes_math_and_floor():
    r = rates(cublas_fp16=CUBLAS, memory=Memory(1.0, 2e12, 1.0), launch=Launch(3e-6, 0.0, 0.0, 0.0))
    # bytes: 2 (m k + k n + m n) = 2 (1e6 + 1e5 + 1e5) = 2.4e6 bytes at 1e12/s, plus 1e-6
    assert S.dense_seconds(1000, 1000, 100, r) == pytest.approx(1e-6 + 2.4e6 / 1e12, rel=1e-14)
    # math: 2 m k n = 2e12 flops at 1e15/s = 2e-3 s, beyond the bytes
    assert S.dense_seconds(10000, 10000, 10000, r) == pytest.approx(2e12 / 1e15, rel=1e-14)
    assert S.dense_seconds(1, 1, 1, r) == 2e-6  # the floor
    # epilogue: a launch plus Y read and written in fp16 and the bias: (4 m n + 4 m) bytes
    assert S.dense_seconds(1000, 1000, 100, r, epilogue=True) == pytest.approx(
        1e-6 + 2.4e6 / 1e12 + 3e-6 + (4e5 + 4e3) / 2e12, rel=1e-14)


def test_csr_seconds_binds_on_the_slowest_term():
    r = rates(csr_fp16=CsrFp16(nonzeros_per_s=1e9, gather_bytes_per_s=1e12), memory=Memory(1.0, 1e12, 1.0),
              launch=Launch(1e-6, 0.0, 0.0, 5e-6))
    # 16-bit indices up to 32767 columns: nnz (2 + 2) + 4 (m + 1) + 2 (k n + m n) bytes
    s = stats(1000, 32767, 10**6)
    moved = 10**6 * 4.0 + 4.0 * 1001 + 2.0 * (32767 * 8 + 1000 * 8)
    assert S.csr_seconds(s, 8, r) == pytest.approx(1e-6 + max(moved / 1e12, 1e6 / 1e9, 2.0 * 1e6 * 8 / 1e12), rel=1e-14)
    assert S.csr_seconds(s, 8, r) == pytest.approx(1e-6 + 1e-3, rel=1e-14)  # the nonzero rate binds
    wide = stats(1000, 32768, 10**6)  # 32-bit indices
    r2 = rates(csr_fp16=CsrFp16(nonzeros_per_s=1e15, gather_bytes_per_s=1e15), memory=Memory(1.0, 1e12, 1.0),
               launch=Launch(1e-6, 0.0, 0.0, 5e-6))
    moved = 10**6 * 6.0 + 4.0 * 1001 + 2.0 * (32768 * 8 + 1000 * 8)
    assert S.csr_seconds(wide, 8, r2) == pytest.approx(1e-6 + moved / 1e12, rel=1e-14)
    moved16 = 10**6 * 4.0 + 4.0 * 1001 + 2.0 * (32767 * 8 + 1000 * 8)
    assert S.csr_seconds(s, 8, r2) == pytest.approx(1e-6 + moved16 / 1e12, rel=1e-14)
    gather = rates(csr_fp16=CsrFp16(nonzeros_per_s=1e15, gather_bytes_per_s=1e9), memory=Memory(1.0, 1e15, 1.0),
                   launch=Launch(1e-6, 0.0, 0.0, 5e-6))
    assert S.csr_seconds(s, 8, gather) == pytest.approx(1e-6 + 2.0 * 1e6 * 8 / 1e9, rel=1e-14)
    assert S.csr_seconds(stats(1, 1, 1), 1, gather) == 5e-6  # the floor


def comparison(*pairs, errors=0.25):
    preds = tuple(S.Prediction(f, f.upper(), s, key="csr" if f != S.DENSE else S.DENSE) for f, s in pairs)
    return S.Comparison(preds, "spread", Errors(errors, errors, errors, errors), "r.json")


def test_winner_keeps_dense_inside_the_sparse_error():
    # sparse 0.8 s * 1.25 = 1.0 s = dense: dense keeps it; sparse 0.79 s: sparse wins
    assert comparison(("csr", 0.75), (S.DENSE, 1.0), errors=0.25).winner().family == "csr"
    assert comparison(("csr", 0.8), (S.DENSE, 1.0), errors=0.25).winner().family == S.DENSE
    assert comparison(("csr", 0.8), (S.DENSE, 1.0), errors=0.24).winner().family == "csr"
    assert comparison(("csr", 0.8)).winner().family == "csr"
    assert comparison((S.DENSE, 1.0)).winner().family == S.DENSE
    assert comparison().winner() is None
    assert comparison((S.DENSE, 0.5), ("csr", 0.8)).winner().family == S.DENSE


def test_comparison_texts():
    c = comparison(("csr", 0.00075), (S.DENSE, 0.001))
    assert c.get("csr").text == "CSR 0.75 ms" and c.get("nothing") is None
    assert c.best_sparse().family == "csr" and c.margin(c.get("csr")) == 0.25
    assert c.summary() == "CSR 0.75 ms, DENSE_GEMM 1 ms"
    assert c.margin_text() == "CSR predicted 1.33x dense, past its 25% error (rates r.json)"
    c = comparison(("csr", 0.0008), (S.DENSE, 0.001))
    assert c.margin_text() == "CSR predicted 1.25x dense, inside its 25% error (rates r.json)"
    assert comparison(("csr", 0.0008)).margin_text() == "rates r.json"
    assert comparison((S.DENSE, 0.0008)).margin_text() == "rates r.json"
    assert comparison((S.DENSE, 0.0008)).best_sparse() is None


# four 128 x 64 analysis tiles: two of density 0.25 (2048 nonzeros each), two empty; density 0.125
TILES = SimpleNamespace(tile_rows=128, tile_cols=64, tiles=4, nonempty=2, max_nnz=2048,
                        density_hist=(2, 0, 2, 0, 0, 0, 0, 0, 0, 0), density_means=(0.0, 0.0, 0.25) + (0.0,) * 7)
TILE_STATS = SimpleNamespace(shape=(256, 128), nnz=4096, density=0.125, tiles=TILES)


def hand_device(**groups):
    """The default device with 100 SMs, and its rates' memory and tile clock round."""
    base = D.default()
    tiles = dataclasses.replace(base.rates.tiles, clock_hz=1e9, empty_tile_cycles=50.0, occupancy_h=1.0,
                                tall_64_wide=2.0)
    r = rates(memory=Memory(2e12, 1e12, 1e12), launch=Launch(1e-6, 2e-6, 1e-7, 4e-6), tiles=tiles, **groups)
    return dataclasses.replace(base, sm_count=100, rates=r)


TR = R.TileRates(base=100.0, per_column=2.0, per_nonzero=0.5, fixed_s=1e-6, wide=0.75, n16=0.5)


def test_kernel_cycles_by_hand():
    dev = hand_device()
    # bytes: 4 (2048 + 1.5) + 4 = 8202 at 1e12 / (100 x 1e9) = 10 bytes a cycle: 820.2 cycles;
    # issue: 100 + 2 bn + 0.5 x 2048 = 1188 at bn 32, larger; two such tiles and two empty ones (50 each)
    assert S.kernel_cycles(TILE_STATS, "tiled_csl_spmm", 1, 32, 2, dev, TR) == pytest.approx(2 * (2 * 1188 + 100),
                                                                                               rel=1e-12)
    assert S.kernel_cycles(TILE_STATS, "tiled_csl_spmm", 1, 64, 3, dev, TR) == pytest.approx(
        3 * 0.75 * (2 * 1252 + 100), rel=1e-12)
    assert S.kernel_cycles(TILE_STATS, "tiled_csl_spmm", 1, 16, 1, dev, TR) == pytest.approx(
        0.5 * (2 * 1156 + 100), rel=1e-12)
    # bytes bind when the issue rates are small: 820.2 cycles a tile
    small = R.TileRates(1.0, 0.0, 0.0)
    assert S.kernel_cycles(TILE_STATS, "tiled_csl_spmm", 1, 32, 1, dev, small) == pytest.approx(2 * 820.2 + 100,
                                                                                                 rel=1e-12)
    # the device's own rates by family and granule when none are given
    t = dataclasses.replace(dev.rates.tiles, tiled_csl_spmm=TR, tiled_bitmap_spmm=small,
                            tiled_bitmap_spmm_g2=R.TileRates(0.0, 0.0, 1.0))
    dev2 = dataclasses.replace(dev, rates=dev.rates.replace(tiles=t))
    assert S.kernel_cycles(TILE_STATS, "tiled_csl_spmm", 1, 32, 2, dev2) == pytest.approx(2 * (2 * 1188 + 100))
    assert S.kernel_cycles(TILE_STATS, "tiled_bitmap_spmm", 2, 32, 1, dev2) == pytest.approx(2 * 2048 + 100)


def test_kernel_seconds_spreads_the_cycles_over_the_sms():
    dev = hand_device()
    t = dataclasses.replace(dev.rates.tiles, tiled_csl_spmm=TR)
    dev = dataclasses.replace(dev, rates=dev.rates.replace(tiles=t))
    req = S.Request("spmm", n=40, dtype="float16", device=dev)  # bn 64, one column tile
    assert S.kernel_seconds(TILE_STATS, req, "tiled_csl_spmm") == pytest.approx(0.75 * (2 * 1252 + 100) / (100 * 1e9))
    req = S.Request("spmm", n=130, dtype="float16", device=dev)  # three column tiles of 64
    assert S.kernel_seconds(TILE_STATS, req, "tiled_csl_spmm") == pytest.approx(3 * 0.75 * 2604 / 1e11)


def spec(**f):
    base = dict(family="tiled_csl_spmm", granule=1, bn=32, n_tiles=2, reduction="none", grid=0, m_tiles=100,
                split_k=1, min_blocks=2, tile_m=128, m=256, n=64)
    base.update(f)
    return SimpleNamespace(**base)


def test_spec_seconds_narrow_blocks_by_hand():
    dev = hand_device()
    req = S.Request("spmm", n=64, dtype="float16", device=dev)
    cycles = 2 * (2 * 1188 + 100)
    # grid 100 x 2 = 200 = one full wave of 2 blocks on 100 SMs: factor 1
    assert S.spec_seconds(TILE_STATS, req, spec(), TR) == pytest.approx(1e-6 + 1e-6 + cycles / 1e11, rel=1e-12)
    # a grid one block short: the busiest SM still runs 2 blocks, (2 + h) 200 / (199 (2 + h)) = 200 / 199
    s = spec(m_tiles=199, n_tiles=1)
    cycles1 = 2 * 1188 + 100
    assert S.spec_seconds(TILE_STATS, req, s, TR) == pytest.approx(2e-6 + cycles1 / 1e11 * 200 / 199, rel=1e-12)
    # the floor
    slow_floor = dataclasses.replace(dev, rates=dev.rates.replace(launch=Launch(1e-6, 2e-6, 1.0, 4e-6)))
    req2 = S.Request("spmm", n=64, dtype="float16", device=slow_floor)
    assert S.spec_seconds(TILE_STATS, req2, spec(), TR) == 1.0


def test_spec_seconds_wide_blocks_and_stream_grids():
    dev = hand_device()
    req = S.Request("spmm", n=64, dtype="float16", device=dev)
    # bn 64: wave_factor(grid 300, 100 SMs, 2 resident, h 1): 3 blocks an SM = one wave of 2 (2 + 1) and one
    # of 1 (1 + 1): 5 block-times; x 100 / 300 x 3 / (3 + 1)
    waves = 100 / 300 * 3 / 4 * 5
    cycles = 3 * 0.75 * (2 * 1252 + 100)
    s = spec(bn=64, n_tiles=3)
    assert S.spec_seconds(TILE_STATS, req, s, TR) == pytest.approx(2e-6 + cycles / 1e11 * waves, rel=1e-12)
    # 64-row tiles of wide blocks: x tall_64_wide (2.0)
    s64 = spec(bn=64, n_tiles=3, tile_m=64)
    assert S.spec_seconds(TILE_STATS, req, s64, TR) == pytest.approx(2e-6 + cycles / 1e11 * waves * 2.0, rel=1e-12)
    # a stream grid counts its own blocks, not tiles x splits: 150 blocks of bn 32 on 2 x 100 slots
    st = spec(reduction="stream", grid=150, m_tiles=2, n_tiles=2, split_k=7, tile_m=128, m=256, n=64)
    factor = (2 + 1) * 100 * 2 / (150 * (2 + 1))
    red = 4.0 * (150 + 2) * 128 * 64 / 1e12 + 8.0 * 256 * 64 / 2e12
    assert S.spec_seconds(TILE_STATS, req, st, TR) == pytest.approx(
        2e-6 + 2 * (2 * 1188 + 100) / 1e11 * factor + red, rel=1e-12)


def test_spread_text():
    assert S.spread_text(TILE_STATS) == "density 0.12 (tile densities 0.25-0.25, 2 of 4 tiles empty)"
    empty = SimpleNamespace(density=0.0, tiles=SimpleNamespace(tile_rows=128, tile_cols=64, tiles=3, nonempty=0,
                                                               density_hist=(3,) + (0,) * 9, density_means=()))
    assert S.spread_text(empty) == "density 0.00, all 3 tiles empty"


# ================================================================================ ratesfile.py

DOC = json.loads(R.DEFAULT_FILE.read_text())


def doc(**change):
    d = json.loads(json.dumps(DOC))
    for path, value in change.items():
        *parents, last = path.split("__")
        node = d
        for p in parents:
            node = node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return d


@pytest.mark.parametrize("d, expected, found", [
    ([1], "a JSON object", "list"),
    (doc(schema=2), "schema 1", "schema 2"),
    (doc(schema=KeyError), "schema 1", "schema None"),
    (doc(extra=1), "the keys of the file: schema, device, measured, rates, provenance", "unknown key extra"),
    (doc(measured=KeyError, a=1, b=2), "the keys of the file: schema, device, measured, rates, provenance",
     "unknown keys a, b; missing key measured"),
    (doc(measured=KeyError, device=KeyError), "the keys of the file: schema, device, measured, rates, provenance",
     "missing keys device, measured"),
    (doc(rates__memory__copy_bytes_per_s=True), "memory.copy_bytes_per_s: a finite number >= 0", "True"),
    (doc(rates__memory__copy_bytes_per_s=-1), "memory.copy_bytes_per_s: a finite number >= 0", "-1"),
    (doc(rates__memory__copy_bytes_per_s=-1e-300), "memory.copy_bytes_per_s: a finite number >= 0", "-1e-300"),
    (doc(rates__memory__copy_bytes_per_s=float("inf")), "memory.copy_bytes_per_s: a finite number >= 0", "inf"),
    (doc(rates__memory__copy_bytes_per_s=float("nan")), "memory.copy_bytes_per_s: a finite number >= 0", "nan"),
    (doc(rates__memory__copy_bytes_per_s="1"), "memory.copy_bytes_per_s: a finite number >= 0", "'1'"),
    (doc(rates__memory__copy_bytes_per_s=None), "memory.copy_bytes_per_s: a finite number >= 0", "None"),
    (doc(rates__memory=[1]), "memory: an object", "list"),
    (doc(rates=[1]), "rates: an object", "list"),
    (doc(rates__tiles__tiled_csl_spmm__zz=1, rates__tiles__tiled_csl_spmm__base=KeyError),
     "the keys of tiles.tiled_csl_spmm: base, per_column, per_nonzero, fixed_s, wide, n16",
     "unknown key tiles.tiled_csl_spmm.zz; missing key tiles.tiled_csl_spmm.base"),
    (doc(rates__extra=1), "the keys of the file: memory, launch, cublas_fp16, csr_fp16, tiles, fp32, errors",
     "unknown key extra"),
    (doc(device=[1]), "device: an object", "list"),
    (doc(device__name=KeyError), "the keys of device: " + ", ".join(R.DEVICE_KEYS), "missing key device.name"),
    (doc(provenance=[1]), "provenance: an object", "list"),
    (doc(provenance__memory=KeyError), "the keys of provenance: memory, launch, cublas_fp16, csr_fp16, tiles, fp32, "
     "errors", "missing key provenance.memory"),
    (doc(measured=[1]), "measured: an object", "list"),
])
def test_from_dict_names_what_is_wrong(d, expected, found):
    e = error_of(R.from_dict, d, "f.json")
    assert (e.path, e.line, e.expected, e.found) == ("f.json", None, expected, found)


def error_of(fn, *args) -> FormatError:
    with pytest.raises(FormatError) as e:
        fn(*args)
    return e.value


def test_from_dict_reads_zero_and_integers_as_floats():
    r = R.from_dict(doc(rates__memory__copy_bytes_per_s=0, rates__launch__launch_s=3), "x.json")
    assert r.memory.copy_bytes_per_s == 0.0 and isinstance(r.launch.launch_s, float) and r.launch.launch_s == 3.0
    assert r.source == "x.json" and r.label == "x.json"
    assert r.tiles.of("tiled_bitmap_spmm.g2") == r.tiles.tiled_bitmap_spmm_g2
    assert r.errors.of("tiled_bitmap_spmm.g2") == r.errors.tiled_bitmap_spmm_g2


def test_rates_digest_equality_label_replace_and_to_dict():
    r = R.from_dict(DOC, "/a/b/h.json")
    text = json.dumps({"values": DOC["rates"], "device": DOC["device"]}, sort_keys=True)
    assert r.digest == hashlib.sha256(text.encode()).hexdigest()
    same_values = R.from_dict(doc(measured={"date": "x"}, provenance__memory="other"), "elsewhere.json")
    assert same_values == r and hash(same_values) == hash(r) and r != "h.json"
    other = R.from_dict(doc(rates__memory__copy_bytes_per_s=1.0), "/a/b/h.json")
    assert other != r
    moved = R.from_dict(doc(device__sm_count=1), "/a/b/h.json")
    assert moved != r
    assert r.label == "h.json"
    derived = r.replace(source="h.json scaled", memory=Memory(1.0, 2.0, 3.0))
    assert derived.label == "h.json scaled" and derived.memory == Memory(1.0, 2.0, 3.0)
    assert derived.launch == r.launch and derived.device is r.device and derived.provenance is r.provenance
    assert r.replace().source == "/a/b/h.json" and r.replace() == r
    assert r.to_dict() == {"schema": 1, "device": DOC["device"], "measured": DOC["measured"], "rates": DOC["rates"],
                           "provenance": DOC["provenance"]}
    with pytest.raises(AttributeError):
        r.__wrapped__  # dunder names are not value groups
    with pytest.raises(AttributeError):
        r.nothing


def test_load_reads_once_while_the_file_stays(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(DOC))
    a = R.load(p)
    assert R.load(str(p)) is a
    p.write_text(json.dumps(doc(rates__memory__copy_bytes_per_s=7.0)) + " ")  # another size: read again
    b = R.load(p)
    assert b is not a and b.memory.copy_bytes_per_s == 7.0
    p.write_text("{\n  \"schema\": 1,\n  oops\n}")
    e = error_of(R.load, p)
    assert (e.path, e.line, e.expected) == (str(p), 3, "JSON")
    with pytest.raises(OSError):
        R.load(tmp_path / "none.json")


def test_load_or_default_says_once_and_falls_back(tmp_path, caplog):
    p = tmp_path / "bad.json"
    p.write_text("[1]")
    R._said.clear()
    with caplog.at_level(logging.WARNING, logger="sparsegen"):
        assert R.load_or_default(p) == R.default()
        assert R.load_or_default(p) == R.default()
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [f"sparsegen: rates file {p} unusable ({p}: expected a JSON object, found list); using the "
                     f"default rates h100-80gb-hbm3.json"]
    assert R.load_or_default(tmp_path / "none.json") == R.default()
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    assert R.load_or_default(tmp_path / "bin.json") == R.default()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc(rates__memory__copy_bytes_per_s=5.0)))
    assert R.load_or_default(good).memory.copy_bytes_per_s == 5.0


def test_default_is_the_shipped_h100_file():
    assert R.DEFAULT_FILE == R.SHIPPED / "h100-80gb-hbm3.json"
    assert R.default().source == str(R.DEFAULT_FILE) and R.default().device["name"] == "NVIDIA H100 80GB HBM3"


def test_write_is_atomic_and_round_trips(tmp_path, monkeypatch):
    r = R.from_dict(DOC, "x.json")
    out = R.write(r, tmp_path / "sub" / "w.json")
    assert out == tmp_path / "sub" / "w.json"
    text = out.read_text()
    assert text.endswith("}\n") and json.loads(text) == r.to_dict() and text.startswith('{\n  "schema": 1,')
    assert R.from_dict(json.loads(text)) == r
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["w.json"]  # no temporary file left
    replaced = []
    real = R.__dict__.get("os")
    import os as os_module

    def replace(src, dst):
        replaced.append((Path(src).name, Path(dst).name))
        os_module.rename(src, dst)
    monkeypatch.setattr(os_module, "replace", replace)
    R.write(r, tmp_path / "sub" / "w.json")
    assert len(replaced) == 1 and replaced[0][0].startswith(".w.json.") and replaced[0][0].endswith(".tmp")
    assert replaced[0][1] == "w.json" and real is None


# =================================================================================== device.py

H100 = dict(DOC["device"])
RAW = {"sm_count": 100, "shared_per_sm": 1000, "shared_per_block_optin": 900, "registers_per_sm": 4096,
       "l2_bytes": 2**20, "max_threads_per_sm": 1024, "total_memory": 2**30, "name": "Card X",
       "compute_capability": (8, 6), "clock_khz": 1500000, "memory_clock_khz": 1000000, "bus_width_bits": 256,
       "driver": 12040}


def test_properties_from_what_the_driver_reports():
    p = D.properties_from(RAW)
    assert p == {"sm_count": 100, "shared_per_sm": 1000, "shared_per_block_optin": 900, "registers_per_sm": 4096,
                 "l2_bytes": 2**20, "max_threads_per_sm": 1024, "total_memory": 2**30, "name": "Card X",
                 "compute_capability": [8, 6], "clock_hz": 1.5e9, "memory_bytes_per_s": 2e3 * 1e6 * 256 / 8,
                 "driver": 12040}


def test_properties_from_fills_what_is_missing_from_the_default_device(caplog):
    R._said.clear()
    raw = dict.fromkeys(RAW)
    with caplog.at_level(logging.WARNING, logger="sparsegen"):
        p = D.properties_from(raw)
    assert p == {**{k: H100[k] for k in D.REPORTED}, "name": "unknown GPU",
                 "compute_capability": H100["compute_capability"], "clock_hz": H100["clock_hz"],
                 "memory_bytes_per_s": H100["memory_bytes_per_s"], "driver": None}
    assert caplog.records[0].getMessage() == (
        "sparsegen: the GPU did not report bus_width_bits, clock_khz, compute_capability, driver, l2_bytes, "
        "max_threads_per_sm, memory_clock_khz, name, registers_per_sm, shared_per_block_optin, shared_per_sm, "
        "sm_count, total_memory; using the NVIDIA H100 80GB HBM3's")
    half = {**RAW, "bus_width_bits": None}
    assert D.properties_from(half)["memory_bytes_per_s"] == H100["memory_bytes_per_s"]
    half = {**RAW, "memory_clock_khz": 0}
    assert D.properties_from(half)["memory_bytes_per_s"] == H100["memory_bytes_per_s"]


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"), ("", "unknown-gpu"),
                                        ("  Tesla--V100 ", "tesla-v100"), ("NVIDIA", "nvidia"), ("***", "unknown-gpu"),
                                        ("NVIDIA-A100", "a100"), ("nvidia-", "nvidia")])
def test_slug(name, slug):
    assert D.slug(name) == slug


def test_calibrated_path(tmp_path, monkeypatch):
    from sparsegen import __version__
    assert D.calibrated_path({"name": "NVIDIA H200", "driver": 580}, tmp_path) == (
        tmp_path / "rates" / f"h200.driver580.sparsegen{__version__}.json")
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "c"))
    assert D.calibrated_path({"name": "X"}) == tmp_path / "c" / "rates" / f"x.driverNone.sparsegen{__version__}.json"


def test_shipped_reads_every_file_and_skips_a_damaged_one(tmp_path, monkeypatch, caplog):
    names = sorted(r.label for r in D.shipped())
    assert names == sorted(p.name for p in R.SHIPPED.glob("*.json")) and "h200.json" in names
    (tmp_path / "a.json").write_text(json.dumps(DOC))
    (tmp_path / "b.json").write_text("[")
    (tmp_path / "c.txt").write_text("x")
    monkeypatch.setattr(R, "SHIPPED", tmp_path)
    R._said.clear()
    with caplog.at_level(logging.WARNING, logger="sparsegen"):
        got = D.shipped()
    assert [r.label for r in got] == ["a.json"]
    assert caplog.records[0].getMessage().startswith("sparsegen: shipped rates file b.json unusable (")


def shipped_pair(tmp_path, monkeypatch):
    """Two shipped files: 'Card A' (sm_80, 1 TB/s) and 'Card B' (sm_90, 3 TB/s)."""
    tmp_path.mkdir(exist_ok=True)
    for name, cc, bw in (("Card A", [8, 0], 1e12), ("Card B", [9, 0], 3e12)):
        d = doc(device__name=name, device__compute_capability=cc, device__memory_bytes_per_s=bw)
        (tmp_path / f"{D.slug(name)}.json").write_text(json.dumps(d))
    monkeypatch.setattr(R, "SHIPPED", tmp_path)
    monkeypatch.delenv("SPARSEGEN_RATES", raising=False)
    monkeypatch.delenv("SPARSEGEN_AUTO_RATES", raising=False)
    return {r.device["name"]: r for r in D.shipped()}


def props(name="Card Z", cc=(9, 0), bw=3e12, **more):
    return {**H100, "name": name, "compute_capability": list(cc), "memory_bytes_per_s": bw, "driver": 1, **more}


def test_rates_for_takes_the_environment_first(tmp_path, monkeypatch):
    files = shipped_pair(tmp_path / "s", monkeypatch)
    env = tmp_path / "env.json"
    env.write_text(json.dumps(doc(rates__memory__copy_bytes_per_s=11.0)))
    monkeypatch.setenv("SPARSEGEN_RATES", str(env))
    assert D.rates_for(props("Card A"), tmp_path).memory.copy_bytes_per_s == 11.0
    monkeypatch.setenv("SPARSEGEN_RATES", "")
    assert D.rates_for(props("Card A"), tmp_path) == files["Card A"]


def test_rates_for_then_the_calibrated_file_then_the_same_name(tmp_path, monkeypatch, caplog):
    files = shipped_pair(tmp_path / "s", monkeypatch)
    p = props("Card A")
    assert D.rates_for(p, tmp_path) == files["Card A"]
    cal = D.calibrated_path(p, tmp_path)
    cal.parent.mkdir(parents=True)
    cal.write_text(json.dumps(doc(rates__memory__copy_bytes_per_s=13.0)))
    assert D.rates_for(p, tmp_path).memory.copy_bytes_per_s == 13.0
    cal.write_text("[")  # damaged: said once, ignored
    R._said.clear()
    with caplog.at_level(logging.WARNING, logger="sparsegen"):
        assert D.rates_for(p, tmp_path) == files["Card A"]
    assert caplog.records[0].getMessage().startswith(f"sparsegen: calibrated rates {cal} unusable (")


def test_rates_for_an_unknown_card_scales_the_nearest(tmp_path, monkeypatch, caplog):
    files = shipped_pair(tmp_path / "s", monkeypatch)
    R._said.clear()
    p = props("Card Z", (9, 0), 1.5e12)  # sm_90 first, whatever the bandwidth
    with caplog.at_level(logging.WARNING, logger="sparsegen"):
        got = D.rates_for(p, tmp_path)
    assert got == D.scaled(files["Card B"], p)
    assert caplog.records[0].getMessage() == (
        f"sparsegen: no rates file for Card Z; selecting with {got.source} (`sparsegen calibrate` measures this GPU; "
        "SPARSEGEN_AUTO_RATES=0 takes the file unscaled)")
    monkeypatch.setenv("SPARSEGEN_AUTO_RATES", " 0 ")
    R._said.clear()
    with caplog.at_level(logging.WARNING, logger="sparsegen"):
        assert D.rates_for(p, tmp_path) is files["Card B"]
    assert caplog.records[-1].getMessage() == (
        "sparsegen: no rates file for Card Z; SPARSEGEN_AUTO_RATES=0: selecting with card-b.json as measured on "
        "Card B (`sparsegen calibrate` measures this GPU)")
    monkeypatch.setenv("SPARSEGEN_AUTO_RATES", "1")
    assert D.rates_for(p, tmp_path) == D.scaled(files["Card B"], p)


def test_rates_for_without_shipped_files_uses_the_default(tmp_path, monkeypatch):
    (tmp_path / "s").mkdir()
    monkeypatch.setattr(R, "SHIPPED", tmp_path / "s")
    monkeypatch.delenv("SPARSEGEN_RATES", raising=False)
    monkeypatch.setenv("SPARSEGEN_AUTO_RATES", "0")
    assert D.rates_for(props("NVIDIA H100 80GB HBM3"), tmp_path) == R.default()


def test_nearest_prefers_the_compute_capability_then_the_bandwidth(tmp_path, monkeypatch):
    files = shipped_pair(tmp_path, monkeypatch)
    a, b = files["Card A"], files["Card B"]
    assert D.nearest([a, b], props(cc=(8, 6), bw=3e12)) is a  # same major, far bandwidth
    assert D.nearest([a, b], props(cc=(7, 0), bw=1.5e12)) is a  # neither major: log ratio 0.41 vs 0.69
    assert D.nearest([a, b], props(cc=(7, 0), bw=1.8e12)) is b  # log ratio 0.59 vs 0.51


def test_scaled_carries_each_term_by_its_own_ratio():
    base = R.from_dict(DOC, "/x/h.json")
    p = props("Card Z", (9, 0), bw=2 * H100["memory_bytes_per_s"], clock_hz=H100["clock_hz"] * 1.5,
              sm_count=H100["sm_count"] * 2)
    s = D.scaled(base, p)
    mem, clock, compute = 2.0, 1.5, 3.0
    v, w = base.values, s.values
    assert w.memory == Memory(v.memory.copy_bytes_per_s * mem, v.memory.achieved_bytes_per_s * mem,
                              v.memory.atomic_bytes_per_s * compute)
    assert w.cublas_fp16 == CublasFp16(v.cublas_fp16.fixed_s, v.cublas_fp16.bytes_per_s * mem,
                                       v.cublas_fp16.flops * compute, v.cublas_fp16.floor_s)
    assert w.csr_fp16 == CsrFp16(v.csr_fp16.nonzeros_per_s * compute, v.csr_fp16.gather_bytes_per_s * compute)
    assert w.tiles == dataclasses.replace(v.tiles, clock_hz=v.tiles.clock_hz * clock)
    for k in ("csr", "sgemm", "tf32x3", "f16x3"):
        assert getattr(w.fp32, k) == Line(getattr(v.fp32, k).launch_s, getattr(v.fp32, k).flops * compute)
    assert w.fp32.epilogue_bytes_per_s == v.fp32.epilogue_bytes_per_s * mem
    assert (w.fp32.epilogue_s, w.fp32.sgemm_margin, w.fp32.tensor_margin) == (
        v.fp32.epilogue_s, v.fp32.sgemm_margin, v.fp32.tensor_margin)
    assert w.launch == v.launch and w.errors == v.errors
    how = "h.json scaled to Card Z (memory x2.00, clock x1.50, SMs x2.00)"
    assert s.source == how and s.measured == {**DOC["measured"], "how": how} and s.provenance == DOC["provenance"]
    assert s.device == {k: p[k] for k in R.DEVICE_KEYS} and s.device["compute_capability"] == [9, 0]
    assert isinstance(s.device["compute_capability"], list)


def test_device_model_from_properties_and_back():
    p = {k: H100[k] for k in R.DEVICE_KEYS}
    dm = D.DeviceModel.from_properties(p, R.default())
    assert dm.compute_capability == (9, 0) and dm.properties() == p
    assert dm == D.default() and hash(dm) == hash(D.default())
    assert dm != dataclasses.replace(dm, sm_count=1) and dm != "x"
    assert dm.with_rates(R.from_dict(doc(rates__memory__copy_bytes_per_s=1.0))) != dm
    text = json.dumps(p, sort_keys=True) + dm.rates.digest
    assert dm.digest == hashlib.sha256(text.encode()).hexdigest()
    assert repr(dm) == f"DeviceModel('NVIDIA H100 80GB HBM3', rates h100-80gb-hbm3.json, {dm.digest[:16]})"
    assert dm.describe() == {"name": "NVIDIA H100 80GB HBM3", "rates": str(R.DEFAULT_FILE),
                             "rates_digest": dm.rates.digest[:16], "digest": dm.digest[:16],
                             **{k: v for k, v in p.items() if k != "name"}}
    assert D.DeviceModel.default() is D.default()


def test_device_model_text():
    dm = D.default()
    m = DOC["measured"]
    assert dm.text == (f"NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 3.35 TB/s peak); rates h100-80gb-hbm3.json (shipped), "
                       f"measured {m['date']} at {m['revision']}")
    other = dm.with_rates(R.Rates(dm.rates.values, dm.rates.device, {}, dm.rates.provenance, "/tmp/mine.json"))
    assert other.text == "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 3.35 TB/s peak); rates /tmp/mine.json"


def test_current_reads_the_gpu_through_runtime(monkeypatch, tmp_path):
    from sparsegen import runtime
    shipped_pair(tmp_path, monkeypatch)
    monkeypatch.setattr(runtime, "device_properties", lambda: {**RAW, "name": "Card A"})
    D.current.cache_clear()
    try:
        dm = D.DeviceModel.current()
        assert dm.name == "Card A" and dm.sm_count == 100 and dm.rates.device["name"] == "Card A"
        assert D.current() is dm
    finally:
        D.current.cache_clear()


# ====================================================================================== fit.py

def rows_for(monkeypatch, measured):
    """Rows whose 'stats' is a work count; the model's time of a row is base x work + fixed_s (the
    cost model replaced by a line, so the fit's arithmetic can be checked by hand)."""
    monkeypatch.setattr(S, "spec_seconds", lambda stats, request, spec, rates: rates.base * stats + rates.fixed_s)
    return [fit.Row(work, None, None, seconds) for work, seconds in measured]


def test_predict_and_quality_by_hand(monkeypatch):
    rows = rows_for(monkeypatch, [(1.0, 2.0), (2.0, 2.0), (4.0, 2.0)])
    rates = R.TileRates(base=1.0, per_column=0.0, per_nonzero=0.0, fixed_s=0.0)
    assert fit.predict(rows, rates).tolist() == [1.0, 2.0, 4.0]
    q = fit.quality(rows, rates)
    # predicted / measured: 0.5, 1, 2; |ratio - 1|: 0.5, 0, 1; |log|: log 2, 0, log 2
    assert (q.rows, q.median_error, q.max_error, q.rates) == (3, 0.5, 1.0, rates)
    assert q.log_error == pytest.approx(math.log(2), rel=1e-12)  # the 0.9 quantile of (0, log 2, log 2)
    assert q.text == "3 rows, median error 50.0%, at most 100.0%, 90% of them within 100.0%"


def test_fit_tile_rates_recovers_a_line(monkeypatch):
    rows = rows_for(monkeypatch, [(1.0, 3.0 + 2e-6), (2.0, 6.0 + 2e-6), (10.0, 30.0 + 2e-6)])
    start = R.TileRates(base=1.0, per_column=5.0, per_nonzero=7.0, fixed_s=1e-6)
    f = fit.fit_tile_rates(rows, start, free=("base", "fixed_s"))
    assert f.rates.base == pytest.approx(3.0, rel=1e-6) and f.rates.fixed_s == pytest.approx(2e-6, rel=1e-2)
    assert (f.rates.per_column, f.rates.per_nonzero) == (5.0, 7.0) and f.rows == 3
    assert f.max_error < 1e-6


def test_fit_tile_rates_scale_multiplies_the_cycle_rates(monkeypatch):
    rows = rows_for(monkeypatch, [(1.0, 4.0), (3.0, 12.0)])
    start = R.TileRates(base=2.0, per_column=5.0, per_nonzero=7.0, fixed_s=0.0, wide=0.5)
    f = fit.fit_tile_rates(rows, start, free="scale")
    assert f.rates.base == pytest.approx(4.0, rel=1e-6)
    assert f.rates.per_column == pytest.approx(10.0, rel=1e-6) and f.rates.per_nonzero == pytest.approx(14.0, rel=1e-6)
    assert (f.rates.fixed_s, f.rates.wide) == (0.0, 0.5)


def test_fit_vector_scales_fixed_seconds_to_microseconds():
    t = R.TileRates(base=1.5, per_column=2.0, per_nonzero=3.0, fixed_s=4e-6, wide=0.5, n16=0.25)
    assert fit._vector(t, fit.TILE_FIELDS).tolist() == pytest.approx([1.5, 2.0, 3.0, 4.0, 0.5, 0.25], rel=1e-12)
    back = fit._rates(R.TileRates(0, 0, 0), fit.TILE_FIELDS, [1.5, 2.0, 3.0, 4.0, 0.5, 0.25])
    assert (back.base, back.per_column, back.per_nonzero, back.wide, back.n16) == (1.5, 2.0, 3.0, 0.5, 0.25)
    assert back.fixed_s == pytest.approx(4e-6, rel=1e-12)
    assert fit._rates(t, ("base",), [9.0]) == dataclasses.replace(t, base=9.0)


def test_fit_line_recovers_fixed_time_and_rate():
    work = np.array([1e6, 1e7, 1e8, 1e9])
    seconds = 5e-6 + work / 2e12
    fixed, rate, err = fit.fit_line(work, seconds)
    assert fixed == pytest.approx(5e-6, rel=1e-4) and rate == pytest.approx(2e12, rel=1e-4) and err < 1e-6


def test_ratio_error_by_hand():
    # predicted sparse / dense against measured: ratios off by x1, x2, x1/2, x1 (|log|: 0, log 2, log 2, 0)
    pairs = [(1, 2, 1, 2), (2, 2, 1, 2), (1, 2, 1, 1), (3, 3, 5, 5)]
    q = float(np.quantile([0, math.log(2), math.log(2), 0], 0.9))
    assert fit.ratio_error(pairs) == pytest.approx(math.expm1(q), rel=1e-12)
    assert fit.ratio_error([(1, 1, 1, 1)]) == 0.0
    assert fit.ratio_error(np.array([1.0, 4.0, 1.0, 1.0])) == pytest.approx(3.0)


# ========================================================================== policy.py and table.py

from sparsegen.errors import UnsupportedError  # noqa: E402
from sparsegen.families import dense_gemm, panel_spmm  # noqa: E402
from sparsegen.families.base import Request, accept, decline  # noqa: E402
from sparsegen.select import policy, table  # noqa: E402

from .tiled_helpers import pinned_library, uniform_stats  # noqa: E402


def preds(*pairs, errors=0.1):
    out = tuple(S.Prediction(f, label, s, key="csr" if f != S.DENSE else S.DENSE) for f, label, s in pairs)
    return S.Comparison(out, "density 0.30", Errors(errors, errors, errors, errors), "r.json")


def test_skinny_verdict_reasons():
    none = preds()
    assert policy.skinny_verdict(none, "x") == (False, "no candidate serves this request")
    c = preds(("tiled_csl_spmm", "Tiled-CSL", 0.001), (S.DENSE, "dense", 0.002))
    ok, why = policy.skinny_verdict(c, "tiled_csl_spmm")
    assert ok and why == ("Tiled-CSL predicted fastest: Tiled-CSL 1 ms, dense 2 ms; Tiled-CSL predicted 2.00x dense, "
                          "past its 10% error (rates r.json); density 0.30")
    assert policy.skinny_verdict(c, S.DENSE) == (False, "Tiled-CSL predicted faster: Tiled-CSL 1 ms, dense 2 ms")
    c = preds(("tiled_csl_spmm", "Tiled-CSL", 0.001), (S.DENSE, "dense", 0.0011))
    ok, why = policy.skinny_verdict(c, S.DENSE)
    assert ok and why == ("no sparse kernel predicted 10% faster than dense: Tiled-CSL 1 ms, dense 1.1 ms; Tiled-CSL "
                          "predicted 1.10x dense, inside its 10% error (rates r.json); density 0.30")
    only = preds((S.DENSE, "dense", 0.001))
    assert policy.skinny_verdict(only, S.DENSE) == (True, "dense is the only candidate: dense 1 ms; rates r.json; "
                                                          "density 0.30")


def test_costs_are_computed_once_per_request(monkeypatch):
    calls = []
    monkeypatch.setattr(S, "compare", lambda st, req: calls.append("skinny") or "comparison")
    monkeypatch.setattr(fp32_cost, "judge", lambda st, n, r, epi: calls.append(("fp32", n, epi)) or "verdict")
    c = policy.Costs("stats", Request("spmm", n=7, relu=True))
    assert (c.skinny, c.skinny, c.fp32, c.fp32) == ("comparison", "comparison", "verdict", "verdict")
    assert calls == ["skinny", ("fp32", 7, True)]
    calls.clear()
    assert policy.Costs("stats", Request("spmm", n=3, bias=True)).fp32 == "verdict" and calls == [("fp32", 3, True)]
    calls.clear()
    assert policy.Costs("stats", Request("spmm", n=3)).fp32 == "verdict" and calls == [("fp32", 3, False)]


def fp32_request(n, **options):
    return Request("spmm", n=n, dtype="float32", options=tuple(sorted(options.items())))


def test_dense_gemm_rule_float32_follows_the_fp32_verdict(monkeypatch):
    st = uniform_stats(512, 512, 0.5)
    verdict = fp32_cost.Fp32Verdict("sgemm", 2e-3, 1e-3, 3e-3, rates="r")
    with pinned_library("torch"):
        costs = policy.Costs(st, fp32_request(64))
        costs.__dict__["fp32"] = verdict
        d = policy.dense_gemm_rule(costs)
        assert d.accepted and d.reason.startswith(f"dense predicted faster: {verdict.text}; W densified (1.0 MB)")
        costs = policy.Costs(st, fp32_request(64))
        costs.__dict__["fp32"] = dataclasses.replace(verdict, pick="sparse")
        d = policy.dense_gemm_rule(costs)
        assert not d.accepted and d.reason == f"sparse kept: {dataclasses.replace(verdict, pick='sparse').text}"
        d = policy.dense_gemm_rule(policy.Costs(st, fp32_request(64, family="dense_gemm")))
        assert d.accepted and d.reason.startswith("dense as asked: W densified, cuBLAS via torch.matmul")
    with pinned_library(None):
        d = policy.dense_gemm_rule(policy.Costs(st, fp32_request(64)))
        assert not d.accepted and d.reason == ("no cuBLAS binding: neither torch nor CuPy (float16 and float32 only) "
                                               "is importable for float32")
    d = policy.dense_gemm_rule(policy.Costs(st, Request("sddmm", n=64)))
    assert not d.accepted and d.reason == "op 'sddmm' is not spmm"


def test_dense_gemm_rule_half_follows_the_skinny_verdict():
    st = uniform_stats(512, 512, 0.5)
    with pinned_library("torch"):
        costs = policy.Costs(st, Request("spmm", n=64, dtype="float16"))
        costs.__dict__["skinny"] = preds(("tiled_csl_spmm", "Tiled-CSL", 0.001), (S.DENSE, "dense", 0.002))
        d = policy.dense_gemm_rule(costs)
        assert not d.accepted and d.reason == "Tiled-CSL predicted faster: Tiled-CSL 1 ms, dense 2 ms"
        costs = policy.Costs(st, Request("spmm", n=64, dtype="float16"))
        costs.__dict__["skinny"] = preds((S.DENSE, "dense", 0.001))
        d = policy.dense_gemm_rule(costs)
        assert d.accepted and d.reason.startswith("dense is the only candidate: dense 1 ms; rates r.json; "
                                                  "density 0.30; W densified (0.5 MB)")


def test_dense_tile_rule_branches():
    st = uniform_stats(512, 512, 0.5)
    d = policy.dense_tile_rule(policy.Costs(st, Request("spmm", n=64, dtype="float16")))
    assert not d.accepted and d.reason.startswith("dtype float16: float32 only")
    forced = policy.dense_tile_rule(policy.Costs(st, fp32_request(64, family="dense_tile_spmm")))
    assert forced.accepted and forced.reason.startswith("dense tiles as asked: 64x64 tiles of Y")
    costs = policy.Costs(st, fp32_request(200))
    costs.__dict__["fp32"] = fp32_cost.Fp32Verdict("tensor", 3e-3, 2e-3, 1e-3, rates="r")
    d = policy.dense_tile_rule(costs)
    assert d.accepted and d.reason.startswith(f"tensor cores predicted fastest: {costs.fp32.text}; ")
    for pick in ("sparse", "sgemm"):
        costs = policy.Costs(st, fp32_request(200))
        costs.__dict__["fp32"] = fp32_cost.Fp32Verdict(pick, 3e-3, 2e-3, 1e-3, rates="r")
        d = policy.dense_tile_rule(costs)
        assert not d.accepted and d.reason == f"{pick} predicted faster: {costs.fp32.text}"


def test_dense_tile_rule_takes_what_panel_would_serve_up_to_n_128():
    st = uniform_stats(1024, 2048, 0.2)
    for n, taken in ((128, True), (129, False)):
        costs = policy.Costs(st, fp32_request(n))
        costs.__dict__["fp32"] = fp32_cost.Fp32Verdict("sparse", 1e-3, 2e-3, 3e-3, rates="r")
        assert panel_spmm.serves_by_default(st, costs.request)
        d = policy.dense_tile_rule(costs)
        assert d.accepted is taken, n
    costs = policy.Costs(st, fp32_request(128))
    costs.__dict__["fp32"] = fp32_cost.Fp32Verdict("sparse", 1e-3, 2e-3, 3e-3, rates="r")
    assert policy.dense_tile_rule(costs).reason.startswith(
        "tensor cores taken where panel_spmm would serve n <= 128 (the CSR line under-predicts it there: tensor "
        f"cores measured 1.06-1.33x faster on every such DLMC case); {costs.fp32.text}; 64x")
    thin = uniform_stats(1024, 2048, 0.1)  # panel_spmm does not serve it by default
    costs = policy.Costs(thin, fp32_request(128))
    costs.__dict__["fp32"] = fp32_cost.Fp32Verdict("sparse", 1e-3, 2e-3, 3e-3, rates="r")
    assert not policy.dense_tile_rule(costs).accepted


def test_tile_rules_forced_and_declined():
    st = uniform_stats(2048, 2048, 0.3)
    with pinned_library("torch"):
        d = policy.tiled_csl_rule(policy.Costs(st, Request("spmm", n=64, dtype="float32")))
        assert not d.accepted and d.reason.startswith("dtype float32: tensor-core tiles take float16/bfloat16")
        d = policy.tiled_csl_rule(policy.Costs(st, Request("spmm", n=64, dtype="float16",
                                                            options=(("family", "tiled_csl_spmm"),))))
        assert d.accepted and d.reason.startswith("Tiled-CSL as asked; ") and d.spec.family == "tiled_csl_spmm"
        d = policy.tiled_bitmap_rule(policy.Costs(st, Request("spmm", n=64, dtype="float16",
                                                               options=(("family", "tiled_bitmap_spmm"),))))
        assert d.accepted and d.reason.startswith("bitmap as asked; ") and d.spec.family == "tiled_bitmap_spmm"
        costs = policy.Costs(st, Request("spmm", n=64, dtype="float16"))
        costs.__dict__["skinny"] = preds((S.DENSE, "dense", 0.001))
        d = policy.tiled_csl_rule(costs)
        assert not d.accepted and d.reason == "dense predicted faster: dense 1 ms"


def test_rules_stand_in_the_families_order():
    assert [r.name for r in table.RULES[:6]] == ["spdnn_sliced_ell", "tiled_bitmap_spmm", "tiled_csl_spmm",
                                                 "tiled_lanes_spmm", "dense_tile_spmm", "dense_gemm"]
    assert all(isinstance(r, policy.PolicyRule) for r in table.RULES[1:6])
    assert sorted(policy.RULES) == ["dense_gemm", "dense_tile_spmm", "tiled_bitmap_spmm", "tiled_csl_spmm",
                                    "tiled_lanes_spmm"]


def test_select_request_restricted_to_one_family_and_its_errors():
    st = uniform_stats(512, 512, 0.3)
    sel = table.select_request(st, fp32_request(64, family="csr_rowsplit"))
    assert sel.spec.family == "csr_rowsplit" and sel.rule == "csr_rowsplit" and sel.candidates == ()
    others = [t for t in sel.tried if t[0] != "csr_rowsplit"]
    assert others and all(t[1:] == (False, "family 'csr_rowsplit' was requested") for t in others)
    with pytest.raises(UnsupportedError) as e:
        table.select_request(st, fp32_request(64, family="nope"))
    assert str(e.value).startswith("options family='nope': no such kernel family (families: csr_rowsplit, ")
    with pytest.raises(UnsupportedError) as e:
        table.select_request(st, Request("spmm", n=64, dtype="float32"), rules=())
    assert str(e.value).startswith("no kernel family accepts op=spmm dtype=float32")


def test_select_request_first_acceptance_wins_the_rest_are_candidates():
    from sparsegen.families.base import Rule
    a, b = object.__new__(dense_gemm.Spec), object.__new__(dense_gemm.Spec)
    rules = (Rule("no", "fam_x", lambda s, r: decline("not this")),
             Rule("yes", "fam_y", lambda s, r: accept(a, "first")),
             Rule("also", "fam_z", lambda s, r: accept(b, "second")))
    sel = table.select_request("stats", Request("spmm", n=1), rules=rules)
    assert (sel.spec, sel.reason, sel.rule) == (a, "first", "yes")
    assert sel.candidates == (("also", b, "second"),)
    assert sel.tried == (("no", False, "not this"), ("yes", True, "first"), ("also", True, "second"))
    with pytest.raises(UnsupportedError) as e:
        table.select_request("stats", Request("spmm", n=1, dtype="float16"), rules=rules[:1])
    assert str(e.value).startswith("no kernel family accepts op=spmm dtype=float16")


def test_selection_round_trips_through_a_dict():
    st = uniform_stats(512, 512, 0.3)
    sel = table.select(st, "spmm", n=64, dtype="float32")
    d = sel.to_dict()
    assert d["family"] == sel.spec.family and d["spec"] == sel.spec.name and d["rule"] == sel.rule
    assert d["params"] == sel.spec.to_dict() and d["reason"] == sel.reason
    assert [t["rule"] for t in d["tried"]] == [t[0] for t in sel.tried]
    assert [c["spec"] for c in d["candidates"]] == [c[1].name for c in sel.candidates]
    back = table.Selection.from_dict(json.loads(json.dumps(d)))
    assert back.spec == sel.spec and back.tried == sel.tried and back.candidates == sel.candidates
    assert (back.reason, back.rule) == (sel.reason, sel.rule)


def test_rule_decision_asks_one_family():
    st = uniform_stats(512, 512, 0.3)
    d = table.rule_decision(st, Request("spmm", n=64, dtype="float16"), "dense_tile_spmm")
    assert not d.accepted and d.reason.startswith("dtype float16: float32 only")
    d = table.rule_decision(st, fp32_request(64), "csr_rowsplit")
    assert d.accepted and d.spec.family == "csr_rowsplit"


def test_select_passes_the_request_fields():
    st = uniform_stats(512, 512, 0.3)
    sel = table.select(st, n=64, dtype="float32", bias=True, relu=True, options=(("family", "csr_rowsplit"),))
    assert sel.spec.bias and sel.spec.relu and sel.spec.family == "csr_rowsplit"


# ==================================================== selection under the shipped rates: crossovers
# Every shipped rates file, with the device it was measured on (a DeviceModel from the file's own
# device section, as `DeviceModel.current()` builds it on that GPU): the tensor cores are as the
# file says, not switched off. Each crossover is approached from both sides.

SHIPPED = sorted(R.SHIPPED.glob("*.json"))


def shipped_device(path) -> D.DeviceModel:
    r = R.load(path)
    return D.DeviceModel.from_properties(r.device, r)


def with_nnz(st, nnz):
    return dataclasses.replace(st, nnz=nnz)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_fp32_tensor_cores_against_the_csr_line_on_both_sides(path):
    """2048 x 2048 at n = 200 (3xTF32: below F16X3_MIN_N): the tensor cores are taken once the CSR line
    is slower than tensor_margin x theirs; nnz* solved by hand from the file's two lines."""
    dev = shipped_device(path)
    f = dev.rates.fp32
    m = k = 2048
    n = 200
    tensor = f.tf32x3.launch_s + 2 * m * k * n / f.tf32x3.flops
    assert tensor * f.tensor_margin < f.sgemm.launch_s + 2 * m * k * n / f.sgemm.flops  # SGEMM is never ahead
    nnz_star = (tensor * f.tensor_margin - f.csr.launch_s) * f.csr.flops / (2 * n)
    below, above = math.floor(nnz_star), math.floor(nnz_star) + 1
    base = uniform_stats(m, k, nnz_star / (m * k))
    req = Request("spmm", n=n, dtype="float32", device=dev)
    sel = table.select_request(with_nnz(base, below), req)
    assert sel.spec.family not in ("dense_tile_spmm", "dense_gemm")
    assert dict((r, why) for r, _, why in sel.tried)["dense_tile_spmm"].startswith("sparse predicted faster: ")
    sel = table.select_request(with_nnz(base, above), req)
    assert sel.spec.family == "dense_tile_spmm" and sel.reason.startswith("tensor cores predicted fastest: ")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_fp32_panel_region_goes_to_the_tensor_cores_up_to_n_128(path):
    """1024 x 2048 at 15 % (where panel_spmm serves and the fp32 model keeps the CSR kernels): dense
    tiles at n = 128, panel_spmm at n = 129; and at n = 128 just under 15 %, sputnik_spmm's split rows."""
    dev = shipped_device(path)
    st = uniform_stats(1024, 2048, 0.15)
    for n, family in ((128, "dense_tile_spmm"), (129, "panel_spmm")):
        req = Request("spmm", n=n, dtype="float32", device=dev)
        assert fp32_cost.judge(st, n, dev.rates).pick == "sparse"
        assert table.select_request(st, req).spec.family == family, n
    thin = uniform_stats(1024, 2048, 0.1499)
    sel = table.select_request(thin, Request("spmm", n=128, dtype="float32", device=dev))
    assert sel.spec.family not in ("dense_tile_spmm", "panel_spmm")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_half_tiles_need_five_percent_density(path):
    dev = shipped_device(path)
    with pinned_library("torch"):
        for density, tiled in ((0.0499, False), (0.05, True)):
            sel = table.select_request(uniform_stats(7168, 7168, density), Request("spmm", n=8, dtype="float16",
                                                                                     device=dev))
            assert sel.spec.family.startswith("tiled_") is tiled, density
            why = dict((r, w) for r, _, w in sel.tried)["tiled_csl_spmm"]
            assert why.startswith("density 0.050 < 0.05: tile math on zeros") is not tiled


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_half_tiles_stop_past_n_256_when_w_leaves_l2(path):
    dev = shipped_device(path)
    st = uniform_stats(7168, 7168, 0.3)
    with pinned_library("torch"):
        at = skinny_families(st, 256, dev)
        past = skinny_families(st, 257, dev)
    lanes = {"tiled_lanes_spmm"} if dev.rates.tiles.tiled_lanes_spmm else set()  # a family its file has rates for
    assert at == {"tiled_csl_spmm", "tiled_bitmap_spmm", "dense_gemm", "csr"} | lanes
    assert past == {"dense_gemm", "csr"}


def skinny_families(st, n, dev):
    return {p.family for p in S.compare(st, Request("spmm", n=n, dtype="float16", device=dev)).predictions}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_half_dense_keeps_picks_inside_the_sparse_error_on_both_sides(path):
    """7168 x 7168 at n = 32: the density where the best tile family's predicted time x (1 + its error)
    meets dense cuBLAS's, found by bisection on the model; a hair below, the tile family; a hair above,
    dense, with the rule's own test of the margin agreeing on each side."""
    dev = shipped_device(path)

    def comparison(d):
        return S.compare(uniform_stats(7168, 7168, d), Request("spmm", n=32, dtype="float16", device=dev))

    with pinned_library("torch"):
        lo, hi = 0.05, 0.6
        assert comparison(lo).winner().family != "dense_gemm" and comparison(hi).winner().family == "dense_gemm"
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if comparison(mid).winner().family == "dense_gemm" else (mid, hi)
        for d, dense_wins in ((lo, False), (hi, True)):
            c = comparison(d)
            sparse, dense = c.best_sparse(), c.get("dense_gemm")
            assert (sparse.seconds * (1 + c.margin(sparse)) >= dense.seconds) is dense_wins
            assert sparse.seconds < dense.seconds  # the tile family is predicted faster on both sides
            sel = table.select_request(uniform_stats(7168, 7168, d), Request("spmm", n=32, dtype="float16",
                                                                             device=dev))
            assert (sel.spec.family == "dense_gemm") is dense_wins
            assert ("inside its" in sel.reason) is dense_wins and ("past its" in sel.reason) is not dense_wins


def sparse_crossover(dev, n, lo, hi):
    """The density in (lo, hi) where the skinny model's fastest sparse candidate changes, found by
    bisection on the model: (density a hair below, a hair above, the candidate below, above)."""
    def best(d):
        return S.compare(uniform_stats(7168, 7168, d), Request("spmm", n=n, dtype="float16", device=dev)).best_sparse()

    below, above = best(lo).family, best(hi).family
    assert below != above, (lo, hi, below)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best(mid).family == below else (lo, mid)
    return lo, hi, below, above


def check_sparse_sides(dev, n, lo, hi, below, above):
    """On each side the candidate is predicted faster than the other one, the model's winner (not
    dense), and the family selected (a CSR kernel for the CSR line)."""
    for d, fast, slow in ((lo, below, above), (hi, above, below)):
        c = S.compare(uniform_stats(7168, 7168, d), Request("spmm", n=n, dtype="float16", device=dev))
        assert c.get(fast).seconds < c.get(slow).seconds and c.winner().family == fast, d
        family = table.select_request(uniform_stats(7168, 7168, d), Request("spmm", n=n, dtype="float16",
                                                                              device=dev)).spec.family
        assert family == fast if fast != S.CSR else family in ("csr_rowsplit", "sputnik_spmm", "ell_coo_spmm"), d


WITHOUT_LANES = [p for p in SHIPPED if R.load(p).tiles.tiled_lanes_spmm is None]
WITH_LANES = [p for p in SHIPPED if R.load(p).tiles.tiled_lanes_spmm is not None]


@pytest.mark.parametrize("path", WITHOUT_LANES, ids=lambda p: p.name)
def test_half_tiled_csl_against_bitmap_on_both_sides(path):
    """7168 x 7168 at n = 8, on a file without tiled lanes' rates: Tiled-CSL is predicted faster at
    10 %, the bitmap at 11 %; the density where they cross, a hair below and a hair above."""
    dev = shipped_device(path)
    with pinned_library("torch"):
        lo, hi, below, above = sparse_crossover(dev, 8, 0.10, 0.11)
        assert (below, above) == ("tiled_csl_spmm", "tiled_bitmap_spmm")
        check_sparse_sides(dev, 8, lo, hi, below, above)


@pytest.mark.parametrize("path", WITH_LANES, ids=lambda p: p.name)
def test_half_tiled_lanes_ahead_of_the_other_tiles_where_its_rates_say(path):
    """7168 x 7168 on a file with tiled lanes' rates (the H200's, measured): at n = 8 the family is
    predicted fastest from 5 to 30 % and selected, its reason naming it; the other tile families
    stay in the comparison, and dense cuBLAS takes 50 %."""
    dev = shipped_device(path)
    with pinned_library("torch"):
        for d in (0.05, 0.1, 0.2, 0.3):
            c = S.compare(uniform_stats(7168, 7168, d), Request("spmm", n=8, dtype="float16", device=dev))
            assert c.winner().family == "tiled_lanes_spmm" and c.get("tiled_csl_spmm") and c.get("tiled_bitmap_spmm")
            sel = table.select_request(uniform_stats(7168, 7168, d), Request("spmm", n=8, dtype="float16", device=dev))
            assert sel.spec.family == "tiled_lanes_spmm" and sel.reason.startswith("tiled lanes predicted fastest"), d
        dense = table.select_request(uniform_stats(7168, 7168, 0.5), Request("spmm", n=8, dtype="float16", device=dev))
        assert dense.spec.family == "dense_gemm"


def test_half_csr_kernels_against_the_tiles_on_both_sides():
    """On the H100's rates at n = 64 the CSR line is predicted faster than the tiles at 5 % and
    Tiled-CSL at 6 %: the crossing, a hair below and a hair above (the H200's rates have dense
    cuBLAS ahead of both there)."""
    dev = shipped_device(R.SHIPPED / "h100-80gb-hbm3.json")
    with pinned_library("torch"):
        lo, hi, below, above = sparse_crossover(dev, 64, 0.05, 0.06)
        assert (below, above) == (S.CSR, "tiled_csl_spmm")
        check_sparse_sides(dev, 64, lo, hi, below, above)


# ================================================================== more of skinny_cost and table

def test_selection_values_are_frozen():
    for value in (S.Prediction("csr", "CSR", 1.0), comparison(), policy.PolicyRule("r", "f", None),
                  table.Selection(None, "why", "rule")):
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)


def test_spread_text_of_a_single_nonempty_tile():
    one = SimpleNamespace(density=0.01, tiles=SimpleNamespace(tile_rows=128, tile_cols=64, tiles=10, nonempty=1,
                                                              density_hist=(10,) + (0,) * 9,
                                                              density_means=(0.1,) + (0.0,) * 9))
    assert S.spread_text(one) == "density 0.01 (tile densities 0.10-0.10, 9 of 10 tiles empty)"


def test_bitmap_encoding_keeps_single_elements_on_a_tie(monkeypatch):
    monkeypatch.setattr(S, "spec_seconds", lambda stats, request, spec, tile_rates=None: 1e-6)
    st = uniform_stats(2048, 2048, 0.3)
    spec, why = S.build(st, Request("spmm", n=32, dtype="float16"), "tiled_bitmap_spmm")
    assert spec.granule == 1
    assert why.startswith("single elements predicted faster (1.0 vs 1.0 us with register pairs); ")
    times = iter([2e-6, 1e-6])  # single elements, then register pairs
    monkeypatch.setattr(S, "spec_seconds", lambda stats, request, spec, tile_rates=None: next(times))
    spec, why = S.build(st, Request("spmm", n=32, dtype="float16"), "tiled_bitmap_spmm")
    assert spec.granule == 2 and why.startswith("register pairs predicted faster (1.0 vs 2.0 us with single elements)")
    times = iter([1e-6, 2e-6])
    monkeypatch.setattr(S, "spec_seconds", lambda stats, request, spec, tile_rates=None: next(times))
    spec, why = S.build(st, Request("spmm", n=32, dtype="float16"), "tiled_bitmap_spmm")
    assert spec.granule == 1 and why.startswith("single elements predicted faster (1.0 vs 2.0 us with register pairs)")


def test_build_weighs_a_fixed_encoding_with_its_own_rates(monkeypatch):
    from sparsegen.families import tiled_bitmap_spmm as bitmap_family
    seen = []
    monkeypatch.setattr(bitmap_family, "choose", lambda stats, request, kernel_s: seen.append(kernel_s) or ("s", "w"))
    dev = hand_device()
    t = dataclasses.replace(dev.rates.tiles, tiled_bitmap_spmm=R.TileRates(1000.0, 0.0, 0.0),
                            tiled_bitmap_spmm_g2=R.TileRates(0.0, 0.0, 1.0))
    dev = dataclasses.replace(dev, rates=dev.rates.replace(tiles=t))
    for granule, cycles in ((2, 2 * 2048 + 100), (1, 2 * 1000 + 100)):
        r = Request("spmm", n=32, dtype="float16", device=dev, options=(("granule", granule),))
        assert S.build(TILE_STATS, r, "tiled_bitmap_spmm") == ("s", "w")
        assert seen[-1] == pytest.approx(cycles / (100 * 1e9), rel=1e-12)


def test_compare_drops_only_the_family_option():
    st = uniform_stats(2048, 2048, 0.3)
    r = Request("spmm", n=32, dtype="float16", options=(("bn", 16), ("family", "tiled_csl_spmm")))
    with pinned_library("torch"):
        c = S.compare(st, r)
    assert {p.family for p in c.predictions} == {"tiled_csl_spmm", "tiled_bitmap_spmm", "dense_gemm", "csr"}
    assert c.get("tiled_csl_spmm").spec.bn == 16 and c.get("tiled_bitmap_spmm").spec.bn == 16


@pytest.mark.parametrize("bias, relu", [(True, False), (False, True), (True, True), (False, False)])
def test_compare_charges_dense_the_epilogue_for_bias_or_relu(bias, relu):
    st = uniform_stats(2048, 2048, 0.3)
    r = Request("spmm", n=32, dtype="float16", bias=bias, relu=relu)
    with pinned_library("torch"):
        dense = S.compare(st, r).get("dense_gemm")
    assert dense.seconds == S.dense_seconds(2048, 2048, 32, r.device.rates, epilogue=bias or relu)
    assert dense.label == "dense cuBLAS via torch" and dense.key == "dense_gemm"


def test_compare_candidates_by_dtype_and_output():
    st = uniform_stats(2048, 2048, 0.3)
    with pinned_library("torch"):
        assert "csr" not in {p.family for p in S.compare(st, Request("spmm", n=32, dtype="bfloat16")).predictions}
        c = S.compare(st, Request("spmm", n=32, dtype="float16", options=(("out", "float32"),)))
        assert {p.family for p in c.predictions} == {"tiled_csl_spmm", "tiled_bitmap_spmm"}
        c = S.compare(st, Request("spmm", n=32, dtype="float16", options=(("out", "float16"),)))
        assert "csr" in {p.family for p in c.predictions}
    with pinned_library(None):
        assert "dense_gemm" not in {p.family for p in S.compare(st, Request("spmm", n=32,
                                                                           dtype="float16")).predictions}
    c = S.compare(st, Request("spmm", n=32, dtype="float16"))
    assert [p.seconds for p in c.predictions] == sorted(p.seconds for p in c.predictions)
    assert c.rates == "h100-80gb-hbm3.json" and c.errors == R.default().errors
    csr = c.get("csr")
    assert (csr.label, csr.key) == ("CSR kernels", "csr") and csr.seconds == S.csr_seconds(st, 32, R.default())
    tiled = c.get("tiled_bitmap_spmm")
    assert tiled.key == S.rates_key(tiled.spec) and tiled.label == "bitmap" and tiled.why


def test_verdict_and_device_model_are_frozen_and_the_verdict_defaults():
    v = fp32_cost.Fp32Verdict("sparse", 1.0, 2.0, 3.0)
    assert (v.tensor_mma, v.sgemm_margin, v.tensor_margin, v.rates) == ("3xTF32", 1.0, 1.0, "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.pick = "tensor"
    with pytest.raises(dataclasses.FrozenInstanceError):
        D.default().sm_count = 1


def test_rates_groups_are_frozen_and_tile_rates_default():
    r = R.from_dict(DOC, "x.json")
    for value in (r.memory, r.launch, r.cublas_fp16, r.csr_fp16, r.tiles, r.tiles.tiled_csl_spmm, r.fp32, r.fp32.csr,
                  r.errors, r.values, r, fit.Row(1, 2, 3, 4.0), fit.Fit(r.tiles.tiled_csl_spmm, 1, 0.0, 0.0, 0.0)):
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
    t = R.TileRates(1.0, 2.0, 3.0)
    assert (t.fixed_s, t.wide, t.n16) == (0.0, 1.0, 1.0)


def test_rates_repr_shows_the_values_and_source_only():
    text = repr(R.from_dict(DOC, "x.json"))
    assert text.startswith("Rates(values=Values(memory=Memory(") and text.endswith(", source='x.json')")
    assert "device=" not in text and "measured=" not in text and "provenance=" not in text


def test_rates_copy_and_pickle():
    import copy
    import pickle
    r = R.from_dict(DOC, "x.json")
    for other in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert other == r and other.source == "x.json" and other.memory == r.memory


def test_load_keeps_sixteen_files(tmp_path):
    paths = []
    for i in range(17):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(doc(rates__memory__copy_bytes_per_s=float(i))))
        paths.append(p)
    R._load.cache_clear()
    first = [R.load(p) for p in paths[:16]]
    assert all(R.load(p) is f for p, f in zip(paths[:16], first))  # 16 kept; r0 the least recently used now
    R.load(paths[16])  # the 17th evicts r0
    assert R.load(paths[1]) is first[1]
    assert R.load(paths[0]) is not first[0]
    R._load.cache_clear()


def test_write_makes_missing_folders(tmp_path):
    out = R.write(R.from_dict(DOC, "x.json"), tmp_path / "a" / "b" / "w.json")
    assert json.loads(out.read_text())["rates"] == DOC["rates"]


def recording_least_squares(monkeypatch):
    import scipy.optimize
    calls = []
    real = scipy.optimize.least_squares

    def record(fun, x0, **kwargs):
        calls.append((np.array(x0, dtype=float), kwargs))
        return real(fun, x0, **kwargs)
    monkeypatch.setattr(scipy.optimize, "least_squares", record)
    return calls


def test_fit_line_starts_from_a_tenth_of_the_fastest_time_in_microseconds(monkeypatch):
    calls = recording_least_squares(monkeypatch)
    fit.fit_line([1e6, 1e7, 1e8], [2e-5, 3e-5, 1.2e-4])
    x0, kwargs = calls[0]
    assert x0.tolist() == pytest.approx([2e-5 * 0.1 * 1e6, 1.0], rel=1e-12)
    assert kwargs["bounds"] == ([0.0, 1e-6], np.inf)


def test_fit_tile_rates_starts_from_the_given_rates(monkeypatch):
    monkeypatch.setattr(S, "spec_seconds", lambda stats, request, spec, rates: rates.base * stats + rates.fixed_s)
    rows = [fit.Row(1.0, None, None, 3.0), fit.Row(2.0, None, None, 6.0)]
    calls = recording_least_squares(monkeypatch)
    fit.fit_tile_rates(rows, R.TileRates(2.0, 0.0, 0.0, 5e-6), free=("base", "fixed_s"))
    x0, kwargs = calls[0]
    assert x0.tolist() == pytest.approx([2.0, 5.0], rel=1e-12)
    assert kwargs["x_scale"].tolist() == pytest.approx([2.0, 5.0], rel=1e-12)
    assert kwargs["bounds"] == (0.0, np.inf) and kwargs["diff_step"] == 1e-4
    fit.fit_tile_rates(rows, R.TileRates(2.0, 0.0, 0.0, 0.0), free="scale")
    x0, kwargs = calls[1]
    assert x0.tolist() == [1.0] and kwargs["x_scale"].tolist() == [1.0]
    fit.fit_tile_rates(rows, R.TileRates(2.0, 0.0, 0.0, 0.0), free=("base", "fixed_s"))
    assert calls[2][1]["x_scale"].tolist() == pytest.approx([2.0, 1e-3], rel=1e-12)  # a zero rate scales as 1e-3
