"""`sparsegen calibrate` on the CPU: the fits recover the rates that made their rows, and the whole
calibration (plan, measuring loop, fits, rates file) run against a probe that answers from known
rates writes a file that selection then reads. The GPU side (GpuProbe) runs where a GPU is."""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from sparsegen import calibration as cal
from sparsegen.bench import prefetch
from sparsegen.families.base import Request
from sparsegen.select import device as device_model
from sparsegen.select import fit, fp32_cost, ratesfile, skinny_cost

from .tiled_helpers import uniform_stats

H100 = device_model.default()


def tile_rows(key, truth, noise=0.0, device=H100):
    """Rows of a tile key on three densities, four N and two shapes, timed by `truth` (times
    multiplied by exp(N(0, noise)))."""
    family, _, pairs = key.partition(".")
    rng = np.random.default_rng(0)
    rows = []
    for (m, k) in ((7168, 7168), (21504, 7168)):
        for density in (0.5, 0.3, 0.1):
            stats = uniform_stats(m, k, density)
            for n in (8, 16, 32, 64):
                options = (("granule", 2 if pairs else 1),) if family == cal.BITMAP else ()
                request = Request("spmm", n=n, dtype="float16", options=options, device=device)
                spec, _ = skinny_cost.build(stats, request, family)
                seconds = skinny_cost.spec_seconds(stats, request, spec, truth) * np.exp(rng.normal(0, noise))
                rows.append(fit.Row(stats, request, spec, seconds))
    return rows


def off(rates, factor=1.3):
    return dataclasses.replace(rates, base=rates.base * factor, per_column=rates.per_column / factor,
                               per_nonzero=rates.per_nonzero * factor, fixed_s=rates.fixed_s / factor,
                               wide=1.0, n16=1.0)


def known(tiles, key):
    """A key's rates in `tiles`; for tiled lanes, which the shipped H100 file lacks, bitmap register
    pairs' with a cheaper decode (base 0.7x, per nonzero 0.6x)."""
    mine = tiles.of(key)
    if mine is not None:
        return mine
    g2 = tiles.of(cal.BITMAP + ".g2")
    return dataclasses.replace(g2, base=g2.base * 0.7, per_nonzero=g2.per_nonzero * 0.6)


@pytest.mark.parametrize("key", cal.TILE_KEYS)
def test_the_tile_fit_recovers_the_rates_that_made_its_rows(key):
    truth = known(H100.rates.tiles, key)
    result = fit.fit_tile_rates(tile_rows(key, truth), off(truth))
    for field in fit.TILE_FIELDS:
        assert getattr(result.rates, field) == pytest.approx(getattr(truth, field), rel=1e-3), field
    assert result.max_error < 1e-6 and result.rows == 24


def test_the_tile_fit_through_noise_and_as_one_factor():
    truth = H100.rates.tiles.of(cal.CSL)
    noisy = fit.fit_tile_rates(tile_rows(cal.CSL, truth, noise=0.03), off(truth))
    assert 0.005 < noisy.median_error < 0.04 and noisy.rates.base == pytest.approx(truth.base, rel=0.1)
    slower = dataclasses.replace(truth, **{f: getattr(truth, f) * 1.25 for f in fit.CYCLE_FIELDS})
    scaled = fit.fit_tile_rates(tile_rows(cal.CSL, slower), truth, "scale")
    assert scaled.rates.base == pytest.approx(slower.base, rel=1e-3) and scaled.rates.n16 == truth.n16


def test_the_line_fit_and_the_ratio_error():
    work = np.array([1e8, 4e8, 1.6e9, 6.4e9])
    fixed, rate, err = fit.fit_line(work, 3.69e-6 + work / 2.724e12)
    assert fixed == pytest.approx(3.69e-6, rel=1e-3) and rate == pytest.approx(2.724e12, rel=1e-3) and err < 1e-6
    # predicted ratios 0.8 each; measured 0.8 except one at 1.0: the 90 % quantile of |log| over 10
    # cases lies a tenth of the way from the ninth (0) to the tenth (log 1.25)
    pairs = [(0.8, 1.0, 0.8, 1.0)] * 9 + [(0.8, 1.0, 1.0, 1.0)]
    assert fit.ratio_error(pairs) == pytest.approx(np.expm1(0.1 * np.log(1.25)), rel=1e-6)
    assert fit.ratio_error(pairs[:8] + [pairs[-1]] * 2) == pytest.approx(0.25)


# ---- the whole calibration against a probe of known rates -------------------------------------------

H200_RAW = {"name": "NVIDIA H200", "compute_capability": (9, 0), "sm_count": 132, "clock_khz": 1980000,
            "shared_per_sm": 233472, "shared_per_block_optin": 232448, "registers_per_sm": 65536,
            "l2_bytes": 62914560, "max_threads_per_sm": 2048, "memory_clock_khz": 3201000, "bus_width_bits": 6144,
            "total_memory": 150_000_000_000, "driver": 13000}


class KnownProbe:
    """Times every case with the cost models at `truth` (no GPU): what a perfect measurement of a GPU
    whose rates are `truth` would give."""

    def __init__(self, truth):
        self.truth = truth
        self.props = device_model.properties_from(H200_RAW)
        self.device = device_model.DeviceModel.from_properties(self.props, truth)
        self.ran = []

    def properties(self):
        return dict(H200_RAW)

    def copy_seconds(self, nbytes, settings):
        return 2.0 * nbytes / self.truth.memory.copy_bytes_per_s

    def prepare(self, cases, device):
        pass

    def close(self):
        pass

    def run(self, case, device, settings):
        self.ran.append(case)
        stats = uniform_stats(case.m, case.k, case.density)
        request = Request("spmm", n=case.n, dtype=case.dtype, device=device,
                          options=tuple(kv for kv in case.options if kv[0] != "family"))
        spec, seconds = self.time(case, stats, dataclasses.replace(request, device=self.device))
        return cal.Timed(case, stats, request, spec, seconds)

    def time(self, case, stats, request):
        t = self.truth
        if case.stage in ("tiles", "atomic"):
            spec, _ = skinny_cost.build(stats, request, case.family)
            return spec, skinny_cost.spec_seconds(stats, request, spec)
        if case.stage == "launch":
            return None, t.launch.launch_s
        if case.stage == "floor":
            floor = {cal.CSL: t.launch.tiled_floor_s, "csr_rowsplit": t.launch.csr_floor_s, cal.DENSE: t.cublas_fp16.floor_s}
            return None, floor[case.family]
        if case.stage == "cublas":
            return None, skinny_cost.dense_seconds(case.m, case.k, case.n, t)
        if case.stage == "csr":
            nnz = stats.nnz
            if case.family == "csr_rowsplit":
                return None, nnz / t.csr_fp16.nonzeros_per_s
            return None, 2.0 * nnz * case.n / t.csr_fp16.gather_bytes_per_s
        mma = dict(case.options).get("mma")
        if case.family == cal.DENSE:
            return None, fp32_cost.dense_seconds(case.m, case.k, case.n, t)
        if mma:
            return None, fp32_cost.tensor_seconds(case.m, case.k, case.n, t, mma == "f16x3")
        return None, fp32_cost.sparse_seconds(stats.nnz, case.n, t)


def h200_truth():
    """An H200 as the issue found it: cuBLAS 1.4x faster, the tile kernels a little slower per tile."""
    v = H100.rates.values
    tiles = dataclasses.replace(v.tiles, **{k.replace(".", "_"): dataclasses.replace(
        known(v.tiles, k), base=known(v.tiles, k).base * 1.1, per_nonzero=known(v.tiles, k).per_nonzero * 0.9)
        for k in cal.TILE_KEYS})
    fp32 = dataclasses.replace(v.fp32, sgemm=ratesfile.Line(11e-6, 50e12), tf32x3=ratesfile.Line(8e-6, 60e12),
                               f16x3=ratesfile.Line(10e-6, 75e12), csr=ratesfile.Line(7e-6, 9e12))
    cublas = ratesfile.CublasFp16(3.5e-6, 3.9e12, 480e12, 7.5e-6, k_s=0.4e-9)
    truth = H100.rates.replace("truth", cublas_fp16=cublas, tiles=tiles, fp32=fp32,
                               csr_fp16=ratesfile.CsrFp16(9e10, 1.7e13),
                               launch=dataclasses.replace(v.launch, launch_s=2.5e-6))
    # what the tile kernels stream at: calibrate reads it off cuBLAS's skinny products, as measured
    skinny = [c for c in cal.cublas_cases(cal.FULL) if c.n <= 64]
    achieved = float(np.median([cal.moved_bytes(c.m, c.k, c.n) / skinny_cost.dense_seconds(c.m, c.k, c.n, truth)
                                for c in skinny]))
    return truth.replace(memory=dataclasses.replace(v.memory, copy_bytes_per_s=4.26e12, achieved_bytes_per_s=achieved,
                                                    atomic_bytes_per_s=5.5e12))


def test_a_full_calibration_recovers_the_gpus_rates_and_selection_reads_them(tmp_path, monkeypatch):
    truth = h200_truth()
    probe = KnownProbe(truth)
    lines = []
    path = cal.calibrate(out=tmp_path / "h200.json", emit=lines.append, probe=probe)
    rates = ratesfile.load(path)
    assert rates.memory.copy_bytes_per_s == pytest.approx(4.26e12)
    assert rates.memory.atomic_bytes_per_s == pytest.approx(5.5e12, rel=0.02)
    assert "atomic: split-K 4/14/28" in rates.provenance["memory"]["error"]
    assert rates.launch.launch_s == pytest.approx(2.5e-6) and rates.launch.tiled_floor_s == truth.launch.tiled_floor_s
    c = rates.cublas_fp16
    assert (c.fixed_s, c.bytes_per_s) == (pytest.approx(3.5e-6, rel=1e-3), pytest.approx(3.9e12, rel=1e-3))
    assert c.k_s == pytest.approx(0.4e-9, rel=1e-2) and "fixed + bytes + K loop" in rates.provenance["cublas_fp16"]["error"]
    assert c.floor_s == 7.5e-6 and c.flops == pytest.approx(truth.cublas_fp16.flops, rel=0.01)
    for key in cal.TILE_KEYS:
        got, want = rates.tiles.of(key), truth.tiles.of(key)
        assert got.base == pytest.approx(want.base, rel=0.02) and got.per_nonzero == pytest.approx(want.per_nonzero, rel=0.1)
        assert rates.errors.of(key) < 0.01  # the model predicts these rows exactly: its ratio error is ~0
    assert rates.fp32.sgemm.flops == pytest.approx(50e12, rel=1e-3) and rates.fp32.f16x3.launch_s == pytest.approx(10e-6, rel=1e-3)
    assert rates.csr_fp16.nonzeros_per_s == pytest.approx(9e10) and rates.csr_fp16.gather_bytes_per_s == pytest.approx(1.7e13)
    assert rates.device["name"] == "NVIDIA H200" and rates.measured["driver"] == 13000
    assert "every rate fitted" in rates.provenance["tiles"]["error"]
    # the starting file named as shipped, not by this machine's path to it
    assert rates.provenance["tiles"]["source"].endswith(f"kept from {cal.starting_rates(probe.props).label}")
    assert "/" not in rates.provenance["tiles"]["source"]
    assert [line.split()[0] for line in lines][:4] == ["device", "copy", "launch", "cublas"]
    assert lines[-1].startswith("wrote") and str(path) in lines[-1]
    # the file serves the GPU it was measured on
    props = probe.props
    monkeypatch.setattr(device_model, "calibrated_path", lambda p, root=None: path)
    assert device_model.rates_for(props) == rates
    h200 = device_model.DeviceModel.from_properties(props, rates)
    stats = uniform_stats(28672, 7168, 0.3)
    from sparsegen.select import select_request

    from .tiled_helpers import pinned_library

    with pinned_library("torch"):
        assert select_request(stats, Request("spmm", n=64, dtype="float16", device=h200)).spec.family == "dense_gemm"
        assert select_request(stats, Request("spmm", n=64, dtype="float16")).spec.family == "tiled_bitmap_spmm"


def test_quick_fits_one_factor_and_keeps_what_it_does_not_measure(tmp_path):
    truth = h200_truth()
    start = cal.starting_rates(device_model.properties_from(H200_RAW))
    # quick's products have one K: the K term it keeps is the starting file's, here the truth's too
    truth = truth.replace("truth", cublas_fp16=dataclasses.replace(truth.cublas_fp16, k_s=start.cublas_fp16.k_s))
    probe = KnownProbe(truth)
    path = cal.calibrate(quick=True, out=tmp_path / "q.json", emit=lambda line: None, probe=probe)
    rates = ratesfile.load(path)
    assert len(probe.ran) == len(cal.plan(cal.QUICK)) <= 21
    assert "one factor on the cycles" in rates.provenance["tiles"]["error"]
    start = cal.starting_rates(probe.props)
    assert rates.fp32 == start.fp32 and rates.csr_fp16 == start.csr_fp16 and rates.errors == start.errors
    assert rates.provenance["fp32"]["error"] == "not measured in this run"
    assert rates.cublas_fp16.bytes_per_s == pytest.approx(3.9e12, rel=1e-3)


def test_a_spent_budget_measures_nothing_more_and_says_so():
    probe = KnownProbe(h200_truth())
    lines = []
    cases = cal.plan(cal.QUICK)
    timed = cal.measure(probe, cases, probe.device, cal.QUICK, lines.append, deadline=0.0)
    assert timed == [] and probe.ran == [] and "the last 21 of 21 cases not measured" in lines[-1]


def test_a_case_that_fails_is_reported_and_the_others_run():
    class Flaky(KnownProbe):
        def run(self, case, device, settings):
            if case.stage == "launch":
                raise RuntimeError("no such kernel\nsecond line")
            return super().run(case, device, settings)

    probe = Flaky(h200_truth())
    lines = []
    timed = cal.measure(probe, cal.plan(cal.QUICK), probe.device, cal.QUICK, lines.append)
    assert len(timed) == 20 and any("failed (RuntimeError: no such kernel)" in line for line in lines)


def test_the_plans_are_within_their_budgets_and_cover_the_fits():
    full, quick = cal.plan(cal.FULL), cal.plan(cal.QUICK)
    assert len(set(full)) == len(full) and len(set(quick)) == len(quick)
    tiles = [c for c in full if c.stage == "tiles"]
    assert {c.key for c in tiles} == set(cal.TILE_KEYS) and {c.n for c in tiles} == {8, 16, 32, 64}
    dense = {(c.m, c.k, c.n) for c in full if c.stage == "cublas"}
    assert all((c.m, c.k, c.n) in dense for c in tiles)  # every tile case has its cuBLAS beside it
    assert cal.QUICK.budget_s == 20.0 and cal.FULL.budget_s == 120.0
    assert (cal.QUICK.reserve_s, cal.FULL.reserve_s) == (6.0, 12.0)  # what ran past the deadline, with room
    assert json.dumps([c.text for c in quick])  # one line each for the progress output


@pytest.mark.parametrize("quick", [True, False])
def test_measuring_stops_its_reserve_before_the_budget(tmp_path, monkeypatch, quick):
    """The deadline leaves room for the case under way, the fit and start-up within the promised
    budget (20 s quick, 2 minutes full)."""
    settings, seen = (cal.QUICK if quick else cal.FULL), {}
    real = cal.measure

    def recording(probe, cases, device, s, emit=print, deadline=None):
        seen["deadline"] = deadline
        return real(probe, cases, device, s, emit, None)

    monkeypatch.setattr(cal, "measure", recording)
    before = time.monotonic()
    cal.calibrate(quick=quick, out=tmp_path / "r.json", emit=lambda line: None, probe=KnownProbe(h200_truth()))
    assert before + settings.budget_s - settings.reserve_s - 1.0 <= seen["deadline"]
    assert seen["deadline"] <= time.monotonic() + settings.budget_s - settings.reserve_s


def test_the_compile_ahead_job_leaves_every_n_of_its_weight_and_variant_warm(tmp_path, monkeypatch):
    """The worker side of GpuProbe, in this process: one weight, one forced variant, two N. The
    measuring process's compile then finds each plan in the cache folder the job was given (the
    cubins need nvcc; a job without it still leaves the plans)."""
    import sparsegen

    cases = tuple(cal.Case("tiles", 256, 128, 0.3, n, "float16", cal.forced(cal.CSL)) for n in (8, 16))
    cal.compile_ahead(cases, "sm_90", H100, str(tmp_path / "ahead"), str(tmp_path / "marks"))
    assert all(prefetch.marked(tmp_path / "marks", case) == {} for case in cases)  # each N marked done
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "ahead"))
    w = cal.case_weight(cases[0])
    for case in cases:
        kernel = sparsegen.compile(w, n=case.n, dtype="float16", options=dict(case.options), arch="sm_90",
                                   backend="emulate", device=H100)
        assert kernel.spec.family == cal.CSL and kernel.timings.cached.get("plan"), case.n
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path / "cold"))
    kernel = sparsegen.compile(w, n=32, dtype="float16", options=dict(cases[0].options), arch="sm_90",
                               backend="emulate", device=H100)
    assert not kernel.timings.cached.get("plan")  # another folder: the job's warmth is where it was pointed


def test_compiling_starts_before_the_copy_and_a_failed_copy_closes_the_probe(tmp_path):
    events = []

    class NoCopy(KnownProbe):
        def prepare(self, cases, device):
            events.append(("prepare", len(cases)))

        def copy_seconds(self, nbytes, settings):
            events.append(("copy",))
            raise RuntimeError("out of memory")

        def close(self):
            events.append(("close",))

    with pytest.raises(RuntimeError, match="out of memory"):
        cal.calibrate(quick=True, out=tmp_path / "r.json", emit=lambda line: None, probe=NoCopy(h200_truth()))
    assert events == [("prepare", len(cal.plan(cal.QUICK))), ("copy",), ("close",)]
    assert not (tmp_path / "r.json").exists()


def test_the_term_fit_separates_a_k_loop_from_the_bytes():
    rng = np.random.default_rng(3)
    shapes = [(7168, 7168), (21504, 7168), (7168, 28672), (4096, 4096), (28672, 7168)]
    rows = [(m, k, n) for m, k in shapes for n in (8, 16, 64)]
    moved = [cal.moved_bytes(m, k, n) for m, k, n in rows]
    seconds = [3e-6 + b / 4.2e12 + k * 0.4e-9 for b, (m, k, n) in zip(moved, rows)]
    (fixed, inverse_rate, k_s), err = fit.fit_terms([1.0, moved, [k for _, k, _ in rows]], seconds, positive=(1,))
    assert (fixed, 1 / inverse_rate, k_s) == (pytest.approx(3e-6, rel=1e-3), pytest.approx(4.2e12, rel=1e-3),
                                              pytest.approx(0.4e-9, rel=1e-3)) and err < 1e-6
    noisy = [s * np.exp(rng.normal(0, 0.01)) for s in seconds]
    (_, _, k_noisy), _ = fit.fit_terms([1.0, moved, [k for _, k, _ in rows]], noisy, positive=(1,))
    assert k_noisy == pytest.approx(0.4e-9, rel=0.25)


def test_one_k_keeps_the_k_term_it_started_from():
    """Products of a single K cannot tell a K loop from bytes: the fit keeps the starting k_s."""
    truth = h200_truth()
    base = truth.replace("base", cublas_fp16=dataclasses.replace(truth.cublas_fp16, k_s=0.2e-9))
    rows = [cal.Timed(cal.Case("cublas", m, 7168, 0.1, n, "float16", cal.forced(cal.DENSE)), None, None, None,
                      skinny_cost.dense_seconds(m, 7168, n, base))
            for m in (7168, 21504) for n in (8, 16, 64)]
    notes = {}
    c = cal._fit_cublas({"cublas": rows}, base.values, notes)
    assert c.k_s == 0.2e-9 and c.fixed_s == pytest.approx(base.cublas_fp16.fixed_s, rel=1e-3)
    assert "k_s kept" in notes["cublas_fp16"]


def test_atomic_times_that_do_not_grow_with_the_partial_sums_keep_the_rate():
    truth = h200_truth()
    probe = KnownProbe(truth)
    rows = [dataclasses.replace(probe.run(case, probe.device, cal.FULL), seconds=50e-6) for case in cal.atomic_cases()]
    notes = {"memory": "copy: measured; atomic_bytes_per_s kept"}
    memory = cal._fit_atomic({"atomic": rows}, truth, probe.props, notes)
    assert memory == truth.memory and "kept (split-K [4, 14, 28]: no time grew" in notes["memory"]
