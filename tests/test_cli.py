"""The command line: inspect, compile, demo, cache; bad input is one line and exit status 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import sparsegen
from sparsegen.cli import main
from sparsegen.families import dense_gemm

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_graph_challenge_layer(capsys, examples_dir):
    code, out, _ = run(capsys, "inspect", examples_dir / "n1024-l1.tsv.gz")
    assert code == 0
    assert "shape       1024 x 1024   nnz 32768" in out
    assert "rows        min 32  max 32  mean 32.00  std 0.00  CoV 0.000  empty 0" in out
    assert "footprint   distinct columns per block of rows: 32 rows: mean 528.0 max 528" in out
    assert "ell pad     1.000" in out
    assert "selection   sputnik_spmm.f32.n128.v4.w32.ks4.r1.c32x1.b16.i32s" in out
    assert "4 groups per row (1024 rows alone give 1024 warps" in out
    assert "reason      rows avg 32.0 nnz" in out
    assert "accepts csr_rowsplit: rows avg 32.0 nnz" in out and "narrowed to 4 column tiles" in out


def test_inspect_json_has_the_documented_keys(capsys, examples_dir):
    code, out, _ = run(capsys, "inspect", examples_dir / "dlmc-transformer-mp0.9-encoder0-ffn1.smtx.gz",
                       "--json", "--n", "32", "--dtype", "float32")
    record = json.loads(out)
    for k in ("shape", "nnz", "density", "row_lengths", "footprint", "ell_padding", "tiles",
              "structure_hash", "selection"):
        assert k in record
    assert record["shape"] == [2048, 512] and record["nnz"] == 104857
    assert set(record["row_lengths"]) >= {"min", "max", "mean", "std", "cov", "empty"}
    assert record["selection"]["family"] == "csr_rowsplit"
    assert record["selection"]["spec"].startswith("csr_rowsplit.f32.n32.v4.c4k8")
    assert record["selection"]["reason"]
    assert record["request"] == {"op": "spmm", "n": 32, "k": None, "dtype": "float32", "bias": None, "relu": False}
    code, out, _ = run(capsys, "inspect", examples_dir / "dlmc-transformer-mp0.9-encoder0-ffn1.smtx.gz",
                       "--json", "--op", "sddmm", "--k", "64")
    record = json.loads(out)
    assert record["request"]["k"] == 64 and record["request"]["n"] is None
    assert record["selection"]["family"] in ("sputnik_sddmm", "dense_tile_sddmm")


def test_inspect_source(capsys, examples_dir):
    code, out, _ = run(capsys, "inspect", examples_dir / "n1024-l1.tsv.gz", "--source", "--n", "7")
    assert code == 0 and "constexpr int N = 7;" in out and "reproduce: sparsegen inspect" in out


def test_inspect_plot(tmp_path, capsys, examples_dir):
    pytest.importorskip("matplotlib")
    png = tmp_path / "m.png"
    code, out, _ = run(capsys, "inspect", examples_dir / "n1024-l1.tsv.gz", "--plot", png)
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("content,needle", [
    ("1\t1\t0.5\n2\tx\t1\n", ":2: expected"),
    ("", "empty"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, content, needle):
    f = tmp_path / "bad.tsv"
    f.write_text(content)
    code, out, err = run(capsys, "inspect", f)
    assert code == 2
    assert err.startswith("sparsegen: error: ") and err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_missing_file_and_unknown_extension(tmp_path, capsys):
    code, _, err = run(capsys, "inspect", tmp_path / "nope.tsv")
    assert code == 2 and "nope.tsv" in err and err.count("\n") == 1
    (tmp_path / "m.xyz").write_text("1 2 3\n")
    code, _, err = run(capsys, "inspect", tmp_path / "m.xyz")
    assert code == 2 and "m.xyz" in err


def test_unsupported_request_exit_2(capsys, examples_dir):
    code, _, err = run(capsys, "inspect", examples_dir / "n1024-l1.tsv.gz", "--op", "sddmm", "--k", "64",
                       "--dtype", "bfloat16")
    assert code == 2 and "no kernel family accepts" in err and "csr_rowsplit" in err


def test_inspect_sddmm_takes_k(capsys, examples_dir):
    layer = examples_dir / "n1024-l1.tsv.gz"
    code, out, _ = run(capsys, "inspect", layer, "--op", "sddmm", "--k", "128", "--source")
    assert code == 0
    assert "selection   sputnik_sddmm.f32.k128." in out and "reason      k=128:" in out
    assert f"reproduce: sparsegen inspect {layer} --op sddmm --k 128 --dtype float32 --source" in out
    code, _, err = run(capsys, "inspect", layer, "--op", "sddmm")
    assert code == 2 and "--op sddmm needs --k" in err
    code, _, err = run(capsys, "inspect", layer, "--k", "64")
    assert code == 2 and "--op spmm takes --n" in err
    code, _, err = run(capsys, "inspect", layer, "--op", "sddmm", "--k", "64", "--relu")
    assert code == 2 and "sddmm has no epilogue" in err


@pytest.mark.nvcc
def test_compile_dump(tmp_path, capsys, examples_dir):
    code, out, _ = run(capsys, "compile", examples_dir / "n1024-l1.tsv.gz", "--op", "spmm", "--n", "64",
                       "--dtype", "float16", "--dump", tmp_path)
    assert code == 0
    # The kernel this environment selects (with torch importable, the fp16 cost model may pick cuBLAS).
    name = sparsegen.select(sparsegen.analyze(sparsegen.load(examples_dir / "n1024-l1.tsv.gz")), op="spmm", n=64,
                            dtype="float16").spec.name
    if dense_gemm.find_library("float16") is None:  # no cuBLAS binding: the CSR kernel, by its full name
        assert name == "csr_rowsplit.f16.n64.v8.c2k16.b128"
    assert (tmp_path / f"{name}.cu").read_text().startswith("/*")
    assert (tmp_path / f"{name}.cubin").exists()
    sel = json.loads((tmp_path / "selection.json").read_text())
    assert sel["selection"]["spec"] == name
    assert f"wrote   {tmp_path / (name + '.cu')}" in out


def test_demo_runs_in_the_emulator(capsys):
    code, out, _ = run(capsys, "demo", "--backend", "emulate")
    assert code == 0
    assert out.count("-> PASS") == 3 and "all checks passed" in out


def test_cache_commands(capsys):
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "directory" in out and "plan" in out
    code, out, _ = run(capsys, "cache", "list")
    assert code == 0
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and out.startswith("removed")
    code, out, _ = run(capsys, "cache", "info")
    assert "plan       0 entries" in out


def test_python_dash_m_and_debug_traceback(tmp_path):
    env_py = [sys.executable, "-m", "sparsegen"]
    out = subprocess.run(env_py + ["--version"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.startswith("sparsegen ")
    bad = tmp_path / "bad.mtx"
    bad.write_text("garbage\n")
    out = subprocess.run(env_py + ["--debug", "inspect", str(bad)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and out.stderr.startswith("Traceback")
    assert out.stderr.rstrip("\n").splitlines()[-1].startswith(f"sparsegen: error: {bad}")


# ---- every failure: one line, exit status 2 ------------------------------------------------------

def one_error_line(err: str) -> str:
    """The stderr of a failure is exactly one line, `sparsegen: error: ...`; returns it."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("sparsegen: error: ") and "Traceback" not in err and "usage:" not in err, err
    return err[:-1]


def failures(examples_dir, tmp_path):
    layer = str(examples_dir / "n1024-l1.tsv.gz")
    return [
        ([], "the following arguments are required: COMMAND (see 'sparsegen --help')"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["inspect"], "the following arguments are required: file (see 'sparsegen inspect --help')"),
        (["inspect", layer, "--n", "abc"], "argument --n: invalid int value: 'abc'"),
        (["inspect", layer, "--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
        (["inspect", layer, "--bogus"], "unrecognized arguments: --bogus"),
        (["inspect", layer, "--n", "0"], "must be a positive integer, got 0"),
        (["inspect", layer, "--format", "xyz"], "format must be one of"),
        (["inspect", str(tmp_path / "a\nb.tsv")], "a\\x0ab.tsv: expected an existing file"),
        (["cache", "nuke"], "argument action: invalid choice: 'nuke'"),
        (["demo", "--backend", "tpu"], "argument --backend: invalid choice: 'tpu'"),
        (["compile", layer, "--dump", str(tmp_path), "--arch", "sm90"], "'sm90' is not of the form sm_XY"),
        (["spdnn", "run"], "sparsegen spdnn run needs --weights and --inputs"),
    ]


def test_every_failure_is_one_line_and_exit_2(capsys, examples_dir, tmp_path):
    for argv, needle in failures(examples_dir, tmp_path):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert needle in one_error_line(err), (argv, err)


@pytest.mark.parametrize("argv", [["--debug", "inspect", "MISSING"], ["inspect", "MISSING", "--debug"],
                                  ["--debug", "bogus"], ["--debug", "inspect", "MISSING", "--n", "abc"]])
def test_debug_prints_the_traceback_then_the_one_line(capsys, tmp_path, argv):
    argv = [str(tmp_path / "nope.tsv") if a == "MISSING" else a for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("Traceback (most recent call last):")
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("sparsegen: error: ") and err.endswith(last + "\n")


def test_a_bug_is_one_line_naming_the_exception(capsys, monkeypatch):
    import sparsegen.cli as cli

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(cli, "cmd_cache", broken)
    code, _, err = run(capsys, "cache", "info")
    assert code == 2
    assert one_error_line(err) == ("sparsegen: error: internal error RuntimeError: boom\\x0asecond line "
                                   "(a bug in sparsegen: rerun with --debug for the traceback and report it)")
    code, _, err = run(capsys, "cache", "info", "--debug")
    assert code == 2 and "Traceback" in err and 'raise RuntimeError("boom' in err


def test_an_interrupt_exits_130_with_one_line(capsys, monkeypatch):
    import sparsegen.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_cache", interrupted)
    code, _, err = run(capsys, "cache", "info")
    assert (code, err) == (130, "sparsegen: interrupted\n")


def module_code(argv, patch: str) -> str:
    """Python that runs `python -m sparsegen ARGV` after `patch` (run with `cli` imported), which makes
    a command fail as a bug or an interrupt would."""
    return (f"import runpy, sys, time\nimport sparsegen.cli as cli\n{patch}\n"
            f"sys.argv = ['sparsegen', *{list(argv)!r}]\nrunpy.run_module('sparsegen', run_name='__main__')\n")


def test_failures_through_python_dash_m(examples_dir, tmp_path):
    plain = [sys.executable, "-m", "sparsegen"]
    for argv, needle in failures(examples_dir, tmp_path)[:8:3]:
        proc = subprocess.run(plain + argv, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 2 and needle in one_error_line(proc.stderr) and proc.stdout == "", argv
    patch = "def broken(args):\n    raise MemoryError('no room')\ncli.cmd_cache = broken"
    proc = subprocess.run([sys.executable, "-c", module_code(["cache", "info"], patch)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "internal error MemoryError: no room" in one_error_line(proc.stderr)


def test_ctrl_c_through_python_dash_m_exits_130():
    import signal

    patch = "def slow(args):\n    print('ready', flush=True)\n    time.sleep(60)\ncli.cmd_cache = slow"
    proc = subprocess.Popen([sys.executable, "-c", module_code(["cache", "info"], patch)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err == "sparsegen: interrupted\n"


def test_spdnn_on_the_emulator_reports_no_rate(tmp_path, examples_dir, capsys):
    """The emulator's time says nothing of a GPU's throughput: no TeraEdges/s figure is printed."""
    import shutil

    shutil.copy(examples_dir / "n1024-l1.tsv.gz", tmp_path)
    code = main(["spdnn", "run", "--weights", str(tmp_path), "--inputs",
                     str(examples_dir / "sparse-images-1024-first64.tsv.gz"), "--backend", "emulate"])
    out = capsys.readouterr().out
    assert code == 0 and "survivors   57" in out
    assert "rate        none: the emulator ran it" in out and "TeraEdges/s (inputs" not in out


def test_a_warning_is_one_line_without_a_pointer_into_the_source(monkeypatch, capsys):
    from sparsegen import runtime

    monkeypatch.setattr(runtime, "available", lambda: False)  # the emulator runs, with its warning
    assert main(["demo"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("sparsegen: warning: ") for line in err)
    assert "no CUDA GPU with PyCUDA here" in err[0] and not any(".py:" in line for line in err)


def _spdnn(tmp_path, examples_dir, *extra):
    import shutil

    shutil.copy(examples_dir / "n1024-l1.tsv.gz", tmp_path)
    return main(["spdnn", "run", "--weights", str(tmp_path), "--inputs",
                 str(examples_dir / "sparse-images-1024-first64.tsv.gz"), "--backend", "emulate", "--json", *extra])


def test_spdnn_count_takes_the_first_inputs_of_a_tsv_file(tmp_path, examples_dir, capsys):
    assert _spdnn(tmp_path, examples_dir, "--count", "10") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["inputs"] == 10 and max(record["categories"]) <= 10 and record["survivors"] == 7


def test_spdnn_does_not_check_part_of_a_network_against_the_whole_networks_answer(tmp_path, examples_dir, capsys):
    answer = tmp_path / "answer.tsv"
    answer.write_text("1\n2\n")
    assert _spdnn(tmp_path, examples_dir, "--layers", "1", "--categories", str(answer)) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["check"] == "SKIPPED" and "--layers 1 ran part of it" in record["check_note"]


def test_spdnn_says_when_the_inputs_are_narrower_than_the_network(tmp_path, examples_dir, capsys):
    from sparsegen import graphchallenge as gc

    gc.write_network(gc.generate_network(4096, 1), tmp_path)
    code = main(["spdnn", "run", "--weights", str(tmp_path), "--inputs",
                 str(examples_dir / "sparse-images-1024-first64.tsv.gz"), "--backend", "emulate"])
    err = capsys.readouterr().err
    assert code == 0 and "the inputs use neurons 1..914 of the network's 4096: inputs made for a smaller network?" in err


def test_spdnn_summary_carries_the_checks_note():
    from sparsegen.cli import format_spdnn

    record = {"layers": 120, "neurons": 1024, "edges": 1, "specs": ["s"], "inputs": 2, "input_nnz": 3, "bias": -0.3,
              "cap": 32.0, "backend": "gpu", "survivors": 1, "check": "FAILED", "expected": 2,
              "check_note": "inputs made from MNIST approximate the official ones, so a few categories may differ",
              "split_ms": {"inference": 1.0, "read": 1.0, "compile": 1.0}, "teraedges_per_s": 1.0}
    assert ("survivors   1   check FAILED (2 expected categories); inputs made from MNIST approximate the official "
            "ones, so a few categories may differ") in format_spdnn(record)


def test_every_option_and_argument_has_help_text():
    import argparse

    from sparsegen.cli import build_parser

    def missing(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from missing(sub, f"{prefix} {name}")
            elif not action.help and action.dest != "help":
                yield f"{prefix} {'/'.join(action.option_strings) or action.dest}"

    assert list(missing(build_parser(), "sparsegen")) == []
