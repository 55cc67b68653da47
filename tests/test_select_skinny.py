"""fp16/bf16 SpMM selection among tiled_bitmap_spmm, tiled_csl_spmm, dense_gemm and the CSR kernels:
the skinny cost model against the H100 measurements in tests/fixtures/h100_tiled_probe_rows.txt,
the decisions and reasons it gives the rules, and float32 selection left as it was."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import tune
from sparsegen.analyze import analyze
from sparsegen.errors import UnsupportedError
from sparsegen.families import _tiled, dense_gemm
from sparsegen.families.base import Request
from sparsegen.select import skinny_cost
from sparsegen.select.device import default as default_device
from sparsegen.select.table import RULES, select_request

from .conftest import REPO
from .helpers import random_csr
from .tiled_helpers import pinned_library, uniform_stats

# The probe rows the tile rates were fitted to (with the llm run's forced-family rows): three OPT
# shapes, 70-90 %, N 8-64, each family's default spec and bitmap in both encodings, beside cuBLAS.
MEASURED = (REPO / "tests" / "fixtures" / "h100_tiled_probe_rows.txt",)
H100 = default_device()
SKINNY = ("tiled_bitmap_spmm", "tiled_csl_spmm", "dense_gemm")
VARIANTS = {"cuBLAS": "dense_gemm", "csl": "tiled_csl_spmm", "bitmap": "tiled_bitmap_spmm",
            "bitmap.g2": "tiled_bitmap_spmm.g2"}


def probe_rows():
    """(m, k, sparsity, n, nnz, {variant: measured ms}) for every (W, N) of the runs the model was fitted
    to; variants are dense_gemm (cuBLAS: the fallback is that call), tiled_csl_spmm, tiled_bitmap_spmm
    (single elements) and tiled_bitmap_spmm.g2 (register pairs)."""
    rows = {}
    for path in MEASURED:
        for line in path.read_text().splitlines():
            p = line.split()
            if len(p) < 5 or not re.match(r"\d+x\d+$", p[0]) or p[3] not in VARIANTS:
                continue
            m, k = (int(v) for v in p[0].split("x"))
            key = (m, k, float(p[1]), int(p[2]))
            rows.setdefault(key, {})[VARIANTS[p[3]]] = float(p[4]) * 1e-3
    return [(m, k, s, n, round((1 - s) * m * k), ms) for (m, k, s, n), ms in sorted(rows.items())]


@pytest.fixture
def torch_binding():
    with pinned_library("torch"):
        yield


def request(n, dtype="float16", **options):
    return Request("spmm", n=n, dtype=dtype, options=tuple(sorted(options.items())))


def predicted_ms(stats, n) -> dict:
    comparison = skinny_cost.compare(stats, request(n))
    return {p.family: p.seconds * 1e3 for p in comparison.predictions}


# ---- calibration against the measured rows ---------------------------------------------------------

def test_the_measured_run_has_the_cases_the_model_was_fitted_to():
    rows = probe_rows()
    assert len(rows) >= 36 and {n for *_, n, _, _ in rows} == {8, 16, 32, 64}


def test_model_reproduces_the_measured_times(torch_binding):
    """The tile rates were fitted to these times: median error within 10 %, every case within 25 %,
    for each family's default spec and for bitmap in each encoding."""
    errors = {v: [] for v in ("tiled_csl_spmm", "tiled_bitmap_spmm", "tiled_bitmap_spmm.g2")}
    for m, k, sparsity, n, nnz, measured in probe_rows():
        stats = uniform_stats(m, k, nnz / (m * k))
        for key in errors:
            family, _, pairs = key.partition(".")
            req = request(n, **({"granule": 2 if pairs else 1} if family == "tiled_bitmap_spmm" else {}))
            predicted = skinny_cost.tiled_seconds(stats, req, family) * 1e3
            errors[key].append(abs(predicted / measured[key] - 1))
    for key, e in errors.items():
        assert np.median(e) <= 0.10 and max(e) <= 0.25, (key, np.median(e), max(e))


@pytest.mark.parametrize("row", probe_rows(), ids=lambda r: f"{r[0]}x{r[1]}-s{r[2]}-n{r[3]}")
def test_selected_kernel_is_never_measured_below_095x_cublas_and_takes_clear_wins(row, torch_binding):
    """The kernel the rules pick, looked up in the measured row: at 50 % sparsity (none in this run: the
    llm suite checks it) at least 0.95x cuBLAS (the llm suite's floor), elsewhere at least 0.90x; and a
    sparse kernel whenever one was measured 1.35x faster than cuBLAS. Over these 36 rows the picks
    reach 1.37/1.50/1.73x cuBLAS at 70/80/90 %, the best of the four 1.37/1.53/1.74x (the one miss
    past 5 %: 7168^2 at 80 %, N = 8, Tiled-CSL where register pairs ran 9 % faster)."""
    m, k, sparsity, n, nnz, measured = row
    chosen = skinny_cost.rates_key(select_request(uniform_stats(m, k, nnz / (m * k)), request(n)).spec)
    floor = 0.95 if sparsity == 0.5 else 0.90
    assert measured["dense_gemm"] / measured[chosen] >= floor, (chosen, measured)
    best = min(measured, key=measured.get)
    if measured["dense_gemm"] / measured[best] >= 1.35:
        assert chosen != "dense_gemm", measured


def test_half_sparse_wide_goes_dense_and_ninety_percent_narrow_goes_to_register_pairs(torch_binding):
    """As measured (probes/tiled_probe_granule_unrolled.txt): 7168^2 at 50 %, N = 64: cuBLAS 41.6 us
    against bitmap 50.9; 28672 x 7168 at 90 %, N = 8: bitmap in register pairs 57.4 us against
    Tiled-CSL 63.7 and single-element bitmap 76.4."""
    half = predicted_ms(uniform_stats(7168, 7168, 0.5), 64)
    assert half["dense_gemm"] < min(half["tiled_csl_spmm"], half["tiled_bitmap_spmm"])
    assert select_request(uniform_stats(7168, 7168, 0.5), request(64)).spec.family == "dense_gemm"
    ninety = uniform_stats(28672, 7168, 0.1)
    assert predicted_ms(ninety, 8)["tiled_bitmap_spmm"] < predicted_ms(ninety, 8)["tiled_csl_spmm"]
    spec = select_request(ninety, request(8)).spec
    assert spec.family == "tiled_bitmap_spmm" and spec.granule == 2 and spec.name.endswith(".g2")
    # forced either way, the encoding is what was asked for
    assert select_request(ninety, request(8, granule=1, family="tiled_bitmap_spmm")).spec.granule == 1


def test_sixteen_column_blocks_take_their_own_factor_and_ninety_percent_goes_to_register_pairs(torch_binding):
    """As measured on the H100 (its llm suite): 12288 x 49152 at 90 %, N = 16: register pairs 157.4 us
    against Tiled-CSL's stream-K 181.0. The line through N = 8 and 32 alone (n16 = 1) picked
    Tiled-CSL there; the fitted n16 factor scales 16-column blocks only."""
    ninety = uniform_stats(12288, 49152, 0.1)
    spec = select_request(ninety, request(16)).spec
    assert spec.family == "tiled_bitmap_spmm" and spec.granule == 2
    rates = H100.rates.tiles.of("tiled_bitmap_spmm.g2")
    plain = dataclasses.replace(rates, n16=1.0)
    for bn in (8, 16, 32, 64):
        ratio = (skinny_cost.kernel_cycles(ninety, "tiled_bitmap_spmm", 2, bn, 1, H100, rates)
                 / skinny_cost.kernel_cycles(ninety, "tiled_bitmap_spmm", 2, bn, 1, H100, plain))
        assert ratio == pytest.approx(rates.n16 if bn == 16 else 1.0)
    assert rates.n16 < 1.0


def test_dense_prediction_is_bytes_over_the_achieved_bandwidth_or_math():
    rates = H100.rates
    c = rates.cublas_fp16
    bytes_bound = skinny_cost.dense_seconds(7168, 7168, 16, rates)
    assert bytes_bound == pytest.approx(c.fixed_s + 2 * (7168 * 7168 + 2 * 7168 * 16) / c.bytes_per_s)
    wide = skinny_cost.dense_seconds(8192, 8192, 1024, rates)  # 137 GFLOP: tensor-core math binds
    assert wide == pytest.approx(2 * 8192 * 8192 * 1024 / c.flops)
    assert skinny_cost.dense_seconds(64, 64, 8, rates) == c.floor_s
    assert skinny_cost.dense_seconds(7168, 7168, 16, rates, epilogue=True) > bytes_bound + rates.launch.launch_s


# ---- decisions and reasons -----------------------------------------------------------------------

@pytest.mark.parametrize("density", [0.5, 0.3, 0.2, 0.1, 0.06, 0.02])
@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256, 512])
def test_exactly_one_skinny_rule_accepts_unless_the_csr_kernels_are_predicted_fastest(density, n, torch_binding):
    stats = uniform_stats(7168, 7168, density)
    sel = select_request(stats, request(n))
    accepted = [r for r, ok, _ in sel.tried if ok and r in SKINNY]
    winner = skinny_cost.compare(stats, request(n)).winner()
    if winner.family == skinny_cost.CSR:
        assert accepted == [] and sel.spec.family in ("ell_coo_spmm", "sputnik_spmm", "csr_rowsplit")
        gated = _tiled.gate(stats, request(n))  # below MIN_DENSITY or past MAX_N: no model asked
        for r, ok, why in sel.tried:
            if r in SKINNY:
                assert why.startswith("CSR kernels predicted faster") or (r != "dense_gemm" and why == gated.reason)
    else:
        assert accepted == [winner.family] == [sel.spec.family]


def test_reasons_state_the_predictions_and_the_cublas_binding(torch_binding):
    sel = select_request(uniform_stats(7168, 7168, 0.5), request(64))
    assert sel.spec.family == "dense_gemm" and sel.spec.library == "torch"
    assert re.search(r"no sparse kernel predicted 7% faster than dense: dense cuBLAS via torch [\d.]+ ms, "
                     r"(Tiled-CSL|bitmap) [\d.]+ ms, (Tiled-CSL|bitmap) [\d.]+ ms", sel.reason), sel.reason
    assert "torch.matmul" in sel.reason and "tile densities" in sel.reason and "102.8 MB" in sel.reason
    declines = dict((r, why) for r, _, why in sel.tried)
    assert declines["tiled_csl_spmm"].startswith("dense cuBLAS via torch predicted faster: dense cuBLAS via torch")
    tiled = select_request(uniform_stats(28672, 7168, 0.05), request(32))
    assert tiled.reason.startswith("Tiled-CSL predicted fastest: Tiled-CSL ") and "split-K" in tiled.reason
    assert dict((r, why) for r, _, why in tiled.tried)["dense_gemm"].startswith("Tiled-CSL predicted faster")
    pairs = select_request(uniform_stats(28672, 7168, 0.1), request(8))
    assert pairs.reason.startswith("bitmap predicted fastest: bitmap ")
    assert re.search(r"register pairs predicted faster \([\d.]+ vs [\d.]+ us with single elements\)", pairs.reason)


def test_bias_and_relu_cost_dense_an_epilogue_pass_and_say_so(torch_binding):
    stats = uniform_stats(7168, 7168, 0.5)
    plain = skinny_cost.compare(stats, request(64)).get("dense_gemm").seconds
    fused = skinny_cost.compare(stats, Request("spmm", n=64, dtype="float16", bias=True, relu=True))
    assert fused.get("dense_gemm").seconds > plain
    sel = select_request(stats, Request("spmm", n=64, dtype="float16", bias=True, relu=True))
    assert sel.spec.family == "dense_gemm" and sel.spec.bias and sel.spec.relu
    assert "bias + ReLU by a generated epilogue kernel" in sel.reason


def test_clustered_dense_tiles_favour_bitmap_and_the_reason_shows_the_spread():
    """Same shape and density: dense tiles among empty ones pick bitmap (1/8 + 2 bytes per element
    against CSL's 4), and the reason says which spread it saw; uniform at 10 % picks Tiled-CSL or bitmap's
    register pairs (0.40 against 0.44 B/element, the pairs for half the decode: at 90 %, N = 16 the two
    ran within 2-7 % of each other on six OPT shapes, probes/tiled_probe_granule_stream*.txt), not
    single-element bitmap (18-24 % slower there), and its reason gives the bytes per element."""
    rng = np.random.default_rng(0)
    mask = sp.csr_matrix(rng.random((48, 96)) < 0.25, dtype=np.float32)  # 6144 x 6144: past the time floors
    clustered = sp.kron(mask, sp.csr_matrix(np.ones((128, 64), np.float32)), format="csr")
    clustered.data = rng.standard_normal(clustered.nnz).astype(np.float32)
    clustered = analyze(clustered)
    uniform = uniform_stats(6144, 6144, 0.1)
    with pinned_library(None):
        c = select_request(clustered, request(16))
        u = select_request(uniform, request(16))
    assert c.spec.family == "tiled_bitmap_spmm" and "tile densities 1.00-1.00" in c.reason and "tiles empty" in c.reason
    assert u.spec.family in ("tiled_bitmap_spmm", "tiled_csl_spmm") and "0 of 4608 tiles empty" in u.reason
    if u.spec.family == "tiled_bitmap_spmm":
        assert u.spec.granule == 2
        assert re.search(r"bitmap 0\.3\d B/element \(register pairs 0\.4\d\) vs Tiled-CSL 0\.40", u.reason), u.reason
    else:
        assert "Tiled-CSL 0.40 B/element" in u.reason and "bitmap" in u.reason


def test_sparse_beyond_the_tiled_range_goes_to_csr_kernels_and_wide_moderate_to_dense(torch_binding):
    very_sparse = uniform_stats(7168, 7168, 0.02)  # below MIN_DENSITY: the tiled gates decline
    assert select_request(very_sparse, request(16)).spec.family == "csr_rowsplit"
    wide = select_request(uniform_stats(4096, 4096, 0.3), request(512))  # n > 256: tiled decline
    assert wide.spec.family == "dense_gemm" and "CSR kernels" in wide.reason


def test_bfloat16_has_dense_as_its_fallback_and_no_csr_candidate(torch_binding):
    very_sparse = uniform_stats(4096, 4096, 0.02)
    sel = select_request(very_sparse, request(16, "bfloat16"))
    assert sel.spec.family == "dense_gemm" and sel.reason.startswith("dense is the only candidate")
    with pinned_library("cupy"):  # CuPy has no bfloat16: nothing serves it, as before this family
        with pytest.raises(UnsupportedError):
            select_request(very_sparse, request(16, "bfloat16"))
        assert select_request(very_sparse, request(16)).spec.family == "csr_rowsplit"
        assert select_request(uniform_stats(7168, 7168, 0.5), request(64)).spec.library == "cupy"


def test_without_a_binding_dense_declines_and_the_tiled_choice_stands():
    with pinned_library(None):
        sel = select_request(uniform_stats(7168, 7168, 0.5), request(64))
    assert sel.spec.family in ("tiled_csl_spmm", "tiled_bitmap_spmm")
    why = dict((r, w) for r, _, w in sel.tried)["dense_gemm"]
    assert why.startswith("no cuBLAS binding: neither torch nor CuPy")


@pytest.mark.parametrize("family", list(SKINNY) + ["csr_rowsplit", "sputnik_spmm"])
def test_options_family_forces_every_family_against_the_model(family, torch_binding):
    stats = uniform_stats(7168, 7168, 0.5)
    sel = select_request(stats, request(64, family=family))
    assert sel.spec.family == family
    if family in SKINNY:  # the model would pick dense here; a forced family says it was asked for
        assert sel.reason.startswith(("bitmap as asked", "Tiled-CSL as asked", "dense as asked")), sel.reason


def test_float32_selection_is_what_the_table_without_the_skinny_rules_gives(torch_binding):
    without = tuple(r for r in RULES if r.family not in SKINNY)
    for a in (random_csr(300, 500, 0.3, seed=1), random_csr(2000, 1000, 0.01, seed=2)):
        stats = analyze(a)
        for n in (8, 64, 256, 1024):
            full = select_request(stats, request(n, "float32"))
            assert full.spec == select_request(stats, request(n, "float32"), rules=without).spec
            tiled = [(ok, why) for r, ok, why in full.tried if r in SKINNY and r != "dense_gemm"]
            assert tiled and all(not ok and "float32" in why for ok, why in tiled)
            # the dense fallback answers float32 from its own model (fp32_cost.py): not worth it here
            assert any(r == "dense_gemm" and not ok and why.startswith("sparse kept") for r, ok, why in full.tried)


def test_find_library_prefers_torch_and_knows_cupy_has_no_bfloat16(monkeypatch):
    installed = set()
    monkeypatch.setattr(dense_gemm.importlib.util, "find_spec", lambda name: object() if name in installed else None)
    assert dense_gemm.find_library("float16") is None
    installed.add("cupy")
    assert dense_gemm.find_library("float16") == "cupy" and dense_gemm.find_library("bfloat16") is None
    installed.add("torch")
    assert dense_gemm.find_library("float16") == dense_gemm.find_library("bfloat16") == "torch"


def test_tune_times_dense_where_a_binding_exists():
    req = request(16)
    with pinned_library("torch"):
        assert {"dense_gemm", "tiled_csl_spmm", "tiled_bitmap_spmm"} <= set(tune.candidate_families(req))
    with pinned_library(None):
        assert "dense_gemm" not in tune.candidate_families(req)
        assert dense_gemm.unavailable(req).startswith("neither torch nor CuPy")


def test_wide_blocks_reduce_split_k_by_a_second_launch():
    """bn = 64 splits K and reduces the partial sums by a second launch (measured faster than the
    cluster and than atomics on the OPT shapes); a reduction asked for in options is kept."""
    from sparsegen.families import _tiled as T
    from sparsegen.families.base import Request

    req = Request("spmm", n=64, dtype="float16", arch="sm_90")
    rates = req.device.rates
    for fam in ("tiled_csl_spmm", "tiled_bitmap_spmm"):  # tiled lanes has no stream or two-step path of its own
        for m, k in ((7168, 28672), (12288, 12288)):
            spec, why = skinny_cost.build(uniform_stats(m, k, 0.1), req, fam)
            assert spec.bn == 64 and spec.split_k > 1 and spec.reduction == "two_step", spec.name
            assert "a second launch measured faster" in why and ".sk%dr." % spec.split_k in spec.name
            two_step = T.reduction_seconds(spec.split_k, m, 64, rates)[1]
            assert T.spec_reduction_seconds(spec, rates) == pytest.approx(rates.tiles.wide_two_step_scale * two_step)
        for how in ("cluster", "atomic"):
            forced, _ = skinny_cost.build(uniform_stats(7168, 28672, 0.1), Request(
                "spmm", n=64, dtype="float16", arch="sm_90", options=(("reduction", how),)), fam)
            assert forced.reduction == how  # as asked
        narrow, _ = skinny_cost.build(uniform_stats(7168, 28672, 0.1), Request("spmm", n=32, dtype="float16"), fam)
        assert narrow.bn == 32 and narrow.reduction == "stream"  # past one wave: stream-K (T.STREAM_BNS)
        one_wave, _ = skinny_cost.build(uniform_stats(1024, 28672, 0.1), Request("spmm", n=32, dtype="float16"), fam)
        assert one_wave.reduction == "atomic"  # narrow blocks within one wave keep their measured atomics


def test_tile_densities_use_each_bins_mean_not_its_centre():
    """A uniform 10 % pattern straddles the histogram's 0.1 edge: its tiles fill bins 0 and 1. The
    model sees their means (about 0.1 each), not the centres 0.05 and 0.15, so a real matrix is
    predicted like the uniform stats the rates were fitted to."""
    stats = analyze(random_csr(2048, 2048, 0.1, seed=3))
    hist = stats.tiles.density_hist
    assert hist[0] > 0 and hist[1] > 0
    dens, counts, empty = _tiled.tile_densities(stats)
    used = dens[counts > 0]
    assert empty == 0 and np.all(np.abs(used - 0.1) < 0.01), used
    n16 = request(16)
    real = skinny_cost.tiled_seconds(stats, n16, "tiled_bitmap_spmm")
    uniform = skinny_cost.tiled_seconds(uniform_stats(2048, 2048, stats.density), n16, "tiled_bitmap_spmm")
    assert real == pytest.approx(uniform, rel=0.02)
