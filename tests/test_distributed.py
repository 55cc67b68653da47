"""sparsegen.distributed: the rebalancing rule, the byte ranges each rank reads, segments of layers,
and runs under mpiexec (1, 2 and 3 ranks on the emulator) against one process, bit for bit.

Tests that start ranks need mpi4py and an mpiexec (`pip install -e ".[mpi]"`: MPICH's, next to this
Python) and skip with that reason otherwise. Each mpiexec runs in its own process group under a
timeout: a rank left waiting would fail the test, never hang it.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from sparsegen import SparseDNN
from sparsegen import graphchallenge as gc
from sparsegen.distributed import comm as mpicomm
from sparsegen.distributed import inputs as dinputs
from sparsegen.distributed.rebalance import Boundary, RebalanceRule, decide, plan
from sparsegen.errors import SparsegenError
from tests.conftest import REPO

TIMEOUT_S = 300
OFFICIAL = "sparse-images-1024-first1200.tsv.gz"


# ------------------------------------------------------------------------------- the rule (no MPI)

def test_plan_moves_only_the_excess_and_gives_the_remainder_to_the_fullest():
    targets, transfers = plan([10, 0, 0, 2])
    assert targets.tolist() == [3, 3, 3, 3]
    assert transfers.tolist() == [[0, 3, 3, 1], [0] * 4, [0] * 4, [0] * 4]
    targets, transfers = plan([7, 1, 4])  # 12 rows: 4 each; rank 2 keeps its 4
    assert targets.tolist() == [4, 4, 4] and transfers.tolist() == [[0, 3, 0], [0] * 3, [0] * 3]
    targets, transfers = plan([5, 0, 0])  # 5 = 2 + 2 + 1: the extra row stays with rank 0
    assert targets.tolist() == [2, 2, 1] and transfers[0].tolist() == [0, 2, 1]
    assert plan([4, 4])[1].sum() == 0


def _ranks(rows, compute_s=1e-2, row_layers=1000, staging_s=0.0, width=1024):
    return [Boundary(r, width, compute_s, row_layers, staging_s) for r in rows]


def test_decide_weighs_the_saving_against_the_bytes_moved():
    # t = 2 x 10 ms / 2000 row-layers = 10 us; 16 layers left; the slowest rank has 50 rows too many
    d = decide(4, 20, _ranks([100, 0]), RebalanceRule(mode="auto"))
    assert d.move and d.moved == 50 and d.targets == (50, 50)
    assert d.saving_s == pytest.approx(50 * 16 * 1e-5)
    assert d.cost_s == pytest.approx(50 * (4 * 1024 + 8) / 10e9 + 20e-6 * 2)
    slow = decide(4, 20, _ranks([100, 0]), RebalanceRule(mode="auto", bandwidth=1e5))  # 2 s to move: not worth 8 ms
    assert not slow.move and slow.moved == 0 and "<=" in slow.reason
    even = decide(4, 20, _ranks([52, 48]), RebalanceRule(mode="auto"))  # 52 < 1.1 x 50
    assert not even.move and "within" in even.reason
    forced = decide(4, 20, _ranks([100, 0]), RebalanceRule(mode="always", bandwidth=1e5))
    assert forced.move and forced.moved == 50


def test_decide_drops_the_later_boundaries_when_they_cannot_pay():
    cheap = decide(4, 20, _ranks([100, 0]), RebalanceRule(mode="auto"), next_layer=8)
    assert cheap.go_on
    # staging one boundary costs 1 s; at most 100 x 1/2 x 12 layers x 10 us = 6 ms to gain
    dear = decide(4, 20, _ranks([100, 0], staging_s=1.0), RebalanceRule(mode="auto"), next_layer=8)
    assert not dear.go_on and "no further boundary" in dear.reason
    assert decide(4, 20, _ranks([100, 0], staging_s=1.0), RebalanceRule(mode="always"), next_layer=8).go_on
    assert not decide(16, 20, _ranks([100, 0]), RebalanceRule(mode="auto"), next_layer=None).go_on


def test_rule_boundaries_double_and_the_rule_rejects_bad_values():
    assert RebalanceRule(mode="auto").boundaries(120, 2) == [4, 8, 16, 32, 64]
    assert RebalanceRule(mode="always", first=3).boundaries(20, 4) == [3, 6, 12]
    assert RebalanceRule(mode="auto").boundaries(120, 1) == [] and RebalanceRule().boundaries(120, 8) == []
    for bad in ({"mode": "sometimes"}, {"threshold": 0.5}, {"bandwidth": 0}, {"first": 0}):
        with pytest.raises(SparsegenError):
            RebalanceRule(**bad)
    with pytest.raises(TypeError):
        RebalanceRule(thresold=1.2)


# ------------------------------------------------------------------------- byte ranges (no MPI)

def _shares(path, ranks):
    return [dinputs.read_range(path, r, ranks) for r in range(ranks)]


@pytest.mark.parametrize("block", [7, 1 << 16])
def test_byte_ranges_cover_the_file_once_and_never_split_an_input(tmp_path, monkeypatch, block):
    monkeypatch.setattr(dinputs, "BLOCK", block)
    rng = np.random.default_rng(3)
    for trial in range(60):
        lines = []
        for i in range(1, int(rng.integers(1, 14))):
            lines += [f"{i}\t{c + 1}\t1\n" for c in np.sort(rng.choice(40, int(rng.integers(0, 5)), replace=False))]
            if rng.random() < 0.2:
                lines.append("\n  \n")
        text = "".join(lines).encode()
        if rng.random() < 0.3:
            text = text.rstrip(b"\n")
        path = tmp_path / f"x{trial}.tsv"
        path.write_bytes(text)
        for ranks in (1, 2, 3, 5, 9):
            shares = _shares(path, ranks)
            assert b"".join(data for _, data in shares) == text
            ids = [set(dinputs.parse_range(path, data, start, 40)[0].tolist()) for start, data in shares]
            for a in range(ranks):
                for b in range(a + 1, ranks):
                    assert not ids[a] & ids[b], (trial, ranks, shares)


def test_byte_ranges_of_the_official_inputs_follow_the_inputs(tmp_path, data_dir):
    raw = gzip.decompress((data_dir / "graphchallenge" / OFFICIAL).read_bytes())
    path = tmp_path / "inputs.tsv"
    path.write_bytes(raw)
    shares = _shares(path, 3)
    assert b"".join(d for _, d in shares) == raw
    firsts = [int(dinputs.parse_range(path, d, s, 1024)[0][0]) for s, d in shares]
    assert firsts[0] == 0 and firsts[0] < firsts[1] < firsts[2]
    for start, _ in shares[1:]:  # each range begins a new input, on its first line
        assert raw[start - 1:start] == b"\n"


def test_a_range_error_names_the_files_own_line(tmp_path):
    lines = [f"{i}\t{i}\t1\n" for i in range(1, 201)]
    lines[180] = "181\t9999\t1\n"  # past 1024 neurons
    path = tmp_path / "bad.tsv"
    path.write_text("".join(lines))
    start, data = dinputs.read_range(path, 1, 2)
    with pytest.raises(SparsegenError, match=rf"{path.name}:181: expected a neuron index in 1..1024"):
        dinputs.parse_range(path, data, start, 1024)


def test_ownership_runs_from_each_ranks_first_input_to_the_next():
    assert dinputs.owned([0, 5, None, 9], 12) == [0, 5, 9, 9, 12]
    assert dinputs.owned([0, 5, 9], 7) == [0, 5, 7, 7]  # --count 7: the third rank gets none


def test_the_launchers_environment_says_the_job_size(monkeypatch):
    for name in mpicomm.LAUNCHER_SIZE:
        monkeypatch.delenv(name, raising=False)
    assert mpicomm.launched() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert mpicomm.launched() == 4
    monkeypatch.setenv("PMI_SIZE", "3")
    assert mpicomm.launched() == 3


# ------------------------------------------------------------------------------ segments (no MPI)

def skewed_network(tmp_path, layers: int = 8):
    """A generated network of the official kind and 300 inputs whose survivors all come first: 60
    inputs on 4 to 32 of the 64 residue classes (most grow and live, the narrowest die after layer
    4, where the first boundary is), 240 sparse ones (they die within a few layers), and copies among
    the survivors (deduplication merges them)."""
    rng = np.random.default_rng(0)
    x = np.zeros((300, 1024), np.float32)
    blocks = np.arange(16)[:, None] * 64
    for i in range(60):  # over the survivors' few rows: each its own residue classes
        x[i, (blocks + rng.choice(64, int(rng.integers(4, 33)), replace=False)[None, :]).ravel()] = 1
    x[60:][np.arange(240)[:, None], rng.integers(0, 1024, (240, 40))] = 1
    x[[7, 33, 59]] = x[1]
    gc.write_network(gc.generate_network(1024, layers, seed=1), tmp_path / "net")
    gc.write_inputs(sp.csr_matrix(x), tmp_path / "skewed.tsv")
    return tmp_path / "net", tmp_path / "skewed.tsv"


def one_process(weights, inputs, layers=None, converge="auto", backend="emulate"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = SparseDNN(gc.read_network(weights, layers=layers), bias=-0.3, cap=32, backend=backend,
                        converge=converge)
        return net.run(gc.read_inputs(inputs, 1024))


@pytest.mark.parametrize("backend", ["emulate", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_segments_run_one_after_another_give_the_whole_networks_answer(tmp_path, backend):
    weights, inputs = skewed_network(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = SparseDNN(gc.read_network(weights), bias=-0.3, cap=32, backend=backend, relabel="always")
    x = gc.read_inputs(inputs, 1024)
    whole = net.run(x)
    ids, rows = np.arange(x.shape[0]), x
    for a, b in ((0, 3), (3, 4), (4, 7), (7, 8)):
        part = net.segment(a, b).run(rows)
        ids, rows = ids[part.ids], part.features
    assert whole.ids.size == 51 and np.array_equal(ids, whole.ids)
    assert rows.tobytes() == whole.features.tobytes()
    with pytest.raises(SparsegenError, match="segment"):
        net.segment(4, 4)


# -------------------------------------------------------------------------------- under mpiexec

def _mpiexec_missing() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed: {mpicomm.INSTALL}"
    try:
        mpicomm.mpiexec_command(1)
    except SparsegenError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def mpiexec():
    reason = _mpiexec_missing()
    if reason:
        pytest.skip(reason)
    return mpicomm.mpiexec_command


def mpirun(mpiexec, ranks: int, args, timeout=TIMEOUT_S) -> subprocess.CompletedProcess:
    """`mpiexec -n ranks python ARGS` from the checkout, in its own process group, bounded in time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    for name in mpicomm.LAUNCHER_SIZE:  # a test run under a launcher must not pass its size on
        env.pop(name, None)
    proc = subprocess.Popen([*mpiexec(ranks), sys.executable, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"mpiexec -n {ranks} {' '.join(map(str, args))} ran past {timeout} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_ranks(mpiexec, ranks, tmp_path, weights, inputs, *extra):
    out = tmp_path / f"out{ranks}.npz"
    proc = mpirun(mpiexec, ranks, ["-m", "tests.mpi_spdnn", "--weights", str(weights), "--inputs", str(inputs),
                                   "--out", str(out), *extra])
    assert proc.returncode == 0, proc.stderr
    got = np.load(out)
    return got, json.loads(str(got["ranks"])), json.loads(str(got["boundaries"]))


@pytest.mark.parametrize("ranks, rebalance", [(1, "off"), (2, "auto"), (3, "always")])
def test_ranks_give_the_official_answer_of_one_process_bit_for_bit(mpiexec, tmp_path, data_dir, ranks, rebalance):
    gcdir = data_dir / "graphchallenge"
    inputs = tmp_path / "inputs.tsv"  # plain: each rank reads its own byte range
    inputs.write_bytes(gzip.decompress((gcdir / OFFICIAL).read_bytes()))
    ref = one_process(gcdir, inputs)
    got, table, _ = run_ranks(mpiexec, ranks, tmp_path, gcdir, inputs, "--rebalance", rebalance)
    assert np.array_equal(got["ids"] + 1, gc.read_categories(gcdir / "categories-first1200.tsv"))
    assert np.array_equal(got["ids"], ref.ids) and got["features"].tobytes() == ref.features.tobytes()
    assert got["alive"].tolist() == list(ref.alive_per_layer)
    assert len(table) == ranks and sum(r["inputs"] for r in table) == 1200
    assert [r["first_input"] for r in table] == sorted({r["first_input"] for r in table})
    assert "read by each rank" in str(got["how"])


@pytest.mark.parametrize("ranks", [2, 3])
def test_rebalancing_moves_skewed_survivors_and_keeps_the_answer(mpiexec, tmp_path, ranks):
    weights, inputs = skewed_network(tmp_path)
    ref = one_process(weights, inputs)
    got, table, boundaries = run_ranks(mpiexec, ranks, tmp_path, weights, inputs, "--rebalance", "always")
    assert np.array_equal(got["ids"], ref.ids) and got["features"].tobytes() == ref.features.tobytes()
    moved = sum(r["rows_sent"] for r in table)
    assert moved > 0 and moved == sum(r["rows_received"] for r in table)
    assert 0 < ref.ids.size < ref.alive_per_layer[3]  # inputs die after the boundary: ids must travel right
    assert len(np.unique(ref.features, axis=0)) > ref.ids.size // 2  # and the features differ
    first = boundaries[0]
    assert first["layer"] == 4 and first["move"] and sum(first["rows"]) == sum(first["targets"])
    assert max(first["targets"]) - min(first["targets"]) <= 1


def test_without_rebalancing_the_ranks_run_whole_and_agree_too(mpiexec, tmp_path):
    weights, inputs = skewed_network(tmp_path)
    ref = one_process(weights, inputs, converge="off")
    got, table, boundaries = run_ranks(mpiexec, 2, tmp_path, weights, inputs, "--rebalance", "off", "--converge", "off")
    assert np.array_equal(got["ids"], ref.ids) and got["features"].tobytes() == ref.features.tobytes()
    assert got["distinct"].tolist() == list(ref.distinct_per_layer)  # no dedup: every input, every layer
    assert boundaries == [] and all(r["rows_sent"] == 0 and r["segments"] == 1 for r in table)


def test_the_command_line_on_two_ranks_checks_the_official_answer(mpiexec, data_dir):
    gcdir = data_dir / "graphchallenge"
    proc = mpirun(mpiexec, 2, ["-m", "sparsegen", "spdnn", "--weights", str(gcdir), "--inputs", str(gcdir / OFFICIAL),
                               "--categories", str(gcdir / "categories-first1200.tsv"), "--backend", "emulate", "--json"])
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)  # rank 0 alone prints
    assert record["check"] == "PASSED" and record["survivors"] == 19 and record["inputs"] == 1200
    assert record["mpi"]["ranks"] == 2 and "scattered from rank 0" in record["mpi"]["inputs_read"]
    assert [r["rank"] for r in record["ranks"]] == [0, 1] and sum(r["inputs"] for r in record["ranks"]) == 1200
    assert record["split_ms"]["inference"] == max(r["time_ms"] for r in record["ranks"])


def test_a_failing_rank_ends_the_job_with_its_error(mpiexec, tmp_path, data_dir):
    lines = gzip.decompress((data_dir / "graphchallenge" / OFFICIAL).read_bytes()).decode().splitlines(True)
    bad = len(lines) - 10  # in the second rank's half
    lines[bad] = lines[bad].replace("\t1\n", "\tone\n")
    inputs = tmp_path / "bad.tsv"
    inputs.write_text("".join(lines))
    proc = mpirun(mpiexec, 2, ["-m", "sparsegen", "spdnn", "--weights", str(data_dir / "graphchallenge"),
                               "--inputs", str(inputs), "--backend", "emulate"], timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("sparsegen: error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].endswith(f"rank 1: {inputs}:{bad + 1}: expected a number (value), found 'one'")


@pytest.mark.gpu
def test_two_ranks_share_one_gpu_and_give_one_processes_answer(mpiexec, tmp_path, data_dir):
    gcdir = data_dir / "graphchallenge"
    inputs = tmp_path / "inputs.tsv"
    inputs.write_bytes(gzip.decompress((gcdir / OFFICIAL).read_bytes()))
    ref = one_process(gcdir, inputs, backend="gpu")
    got, table, _ = run_ranks(mpiexec, 2, tmp_path, gcdir, inputs, "--backend", "gpu", "--rebalance", "always")
    assert np.array_equal(got["ids"], ref.ids) and got["features"].tobytes() == ref.features.tobytes()
    assert [r["device"] for r in table] == [0, 0] and all(r["sharing"] == 2 for r in table)
    weights, skewed = skewed_network(tmp_path)
    ref = one_process(weights, skewed, backend="gpu")
    got, table, _ = run_ranks(mpiexec, 2, tmp_path, weights, skewed, "--backend", "gpu", "--rebalance", "always")
    assert np.array_equal(got["ids"], ref.ids) and got["features"].tobytes() == ref.features.tobytes()
    assert sum(r["rows_sent"] for r in table) > 0


def test_one_rank_without_a_launcher_runs_the_mpi_path_with_mpi(tmp_path, data_dir):
    """--mpi in a plain process: MPI starts as a singleton, and --count takes the first inputs there too."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip(f"mpi4py is not installed: {mpicomm.INSTALL}")
    gcdir = data_dir / "graphchallenge"
    inputs = tmp_path / "inputs.tsv"
    inputs.write_bytes(gzip.decompress((gcdir / OFFICIAL).read_bytes()))
    env = {k: v for k, v in os.environ.items() if k not in mpicomm.LAUNCHER_SIZE}
    args = [sys.executable, "-m", "sparsegen", "spdnn", "--weights", str(gcdir), "--inputs", str(inputs),
            "--count", "600", "--layers", "24", "--backend", "emulate", "--json"]
    runs = [subprocess.run(args + extra, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            for extra in ([], ["--mpi"])]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr
    alone, mpi = (json.loads(r.stdout) for r in runs)
    assert "ranks" not in alone and [r["inputs"] for r in mpi["ranks"]] == [600]
    assert mpi["categories"] == alone["categories"] and mpi["inputs"] == alone["inputs"] == 600
    assert mpi["alive_per_layer"] == alone["alive_per_layer"]
