"""Mutation run over sparsegen's core modules: does a single-point change to the code fail a test?

    python lab/mutation/run.py --list                          # the configured modules and their tests
    python lab/mutation/run.py --module analyze                # every mutant of one module
    python lab/mutation/run.py --module formats/ --sample 40   # 40 mutants (seeded) of each formats/ module
    python lab/mutation/run.py --module analyze --survivors    # re-run last run's survivors, merged into it
    python lab/mutation/run.py --nightly                       # every configured module, every mutant

Modules and the tests that cover them are in `modules.toml` (next to this file); mutants judged
equivalent, with the reason, in `equivalent.toml`. Mutants are made by `mutants.py`.

How a mutant runs: the checkout's files (git's tracked and untracked-but-not-ignored ones) are copied
once into a scratch folder; each mutant is written into that copy, the module's mapped tests run on
it (`pytest -x -q -p no:cacheprovider <tests>`, Hypothesis derandomized and without its example
database, so a run repeats), and the original file is put back, also on Ctrl-C or a crash. The
checkout itself is never written. The test process is forked from a parent that has already
imported NumPy, SciPy, pytest and Hypothesis (never sparsegen), which saves ~1.5 s a mutant;
`--no-fork` runs `python -m pytest` in a fresh process instead.

Before the mutants, the unmutated tests run once under a line tracer: they must pass, their time
sets the per-mutant timeout, and a mutant on lines they never execute is reported `uncovered`
without running (it cannot be killed). The tracer sees the test process only: where tests run the
module in forked children (the cache's tests, as another user), `run_uncovered = true` in
modules.toml runs those mutants anyway. Statuses: killed (a test failed or errored), timeout (counts
as killed), survived, uncovered (counts as survived), equivalent (listed in equivalent.toml with a
reason; out of the score). Score = (killed + timeout) / (mutants - equivalent).

Results: <out>/<module>.json per module (every mutant, its status and time) and <out>/summary.md
(per-module scores, each surviving mutant with its line and text), regenerated from every JSON
in <out>. Default out: lab/mutation/results/. `--survivors` re-runs only the mutants that survived
the module's last run (and those the module gained since, when its code changed) and merges their
new status into that run's JSON, dropping mutants the module no longer has (its time is listed apart).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import mutants as mutgen  # noqa: E402

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # the machine is shared: one core per test process
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
sys.dont_write_bytecode = True

PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
HYPOTHESIS_PROFILE = "sparsegen-mutation"


# ---- configuration ----------------------------------------------------------------------------

def load_config(path: Path) -> dict:
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    mods = cfg.get("module", {})
    for name, m in mods.items():
        unknown = set(m) - {"tests", "functions", "exclude_functions", "operators", "run_uncovered", "timeout", "owner",
                           "note"}
        if unknown:
            raise SystemExit(f"{path}: module {name!r}: unknown keys {sorted(unknown)}")
        if not (REPO / name).is_file():
            raise SystemExit(f"{path}: module {name!r}: no such file under {REPO}")
        if not m.get("tests"):
            raise SystemExit(f"{path}: module {name!r}: no tests")
        extra = set(m.get("operators", ())) - set(mutgen.EXTRA)
        if extra:
            raise SystemExit(f"{path}: module {name!r}: unknown operators {sorted(extra)}; known: {mutgen.EXTRA}")
    return cfg


def load_equivalents(path: Path) -> dict:
    """{(module, function, original, mutated, nth): reason}."""
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for e in data.get("equivalent", []):
        missing = {"module", "function", "original", "mutated", "reason"} - set(e)
        if missing:
            raise SystemExit(f"{path}: entry {e}: missing {sorted(missing)}")
        out[(e["module"], e["function"], e["original"], e["mutated"], int(e.get("nth", 0)))] = e["reason"]
    return out


def pick_modules(cfg: dict, patterns: list[str]) -> list[str]:
    names = list(cfg["module"])
    if not patterns:
        return names
    picked = []
    for p in patterns:
        hits = [n for n in names if n == p or n == f"sparsegen/{p}" or n == f"sparsegen/{p}.py"
                or n.startswith(f"sparsegen/{p}") and p.endswith("/") or fnmatch.fnmatch(n, p)
                or fnmatch.fnmatch(n, f"sparsegen/{p}")]
        if not hits:
            raise SystemExit(f"--module {p!r} matches no configured module (see --list)")
        picked += [h for h in hits if h not in picked]
    return picked


def in_scope(m: mutgen.Mutant, conf: dict) -> bool:
    top = m.function.split(".")[0]
    want = conf.get("functions")
    if want and not any(fnmatch.fnmatch(m.function, w) or fnmatch.fnmatch(top, w) for w in want):
        return False
    return not any(fnmatch.fnmatch(m.function, w) or fnmatch.fnmatch(top, w)
                   for w in conf.get("exclude_functions", []))


# ---- the scratch copy -------------------------------------------------------------------------

def make_scratch() -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    root = Path(tempfile.mkdtemp(prefix="sparsegen-mutation-"))
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return root


def test_env() -> dict:
    env = dict(os.environ)
    data = REPO.parent / "shared" / "data"
    if "SPARSEGEN_DATA" not in env and data.is_dir():
        env["SPARSEGEN_DATA"] = str(data)  # the scratch copy has no ../shared next to it
    return env


# ---- running pytest ---------------------------------------------------------------------------

def _child(scratch: Path, args: list[str], log: Path, trace_file: str | None, trace_out: Path | None) -> int:
    """Body of the test process: pytest on the scratch copy; optionally record executed lines."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(scratch)
    sys.path.insert(0, str(scratch))
    os.environ.update(test_env())
    import hypothesis
    hypothesis.settings.register_profile(HYPOTHESIS_PROFILE, database=None, derandomize=True, deadline=None)
    hypothesis.settings.load_profile(HYPOTHESIS_PROFILE)
    lines: set[int] = set()
    if trace_file:
        import threading

        def local(frame, event, arg):
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        def tracer(frame, event, arg):
            if frame.f_code.co_filename == trace_file:
                lines.add(frame.f_lineno)
                return local
            return None
        sys.settrace(tracer)
        threading.settrace(tracer)
    import pytest
    rc = int(pytest.main(args))
    if trace_file:
        sys.settrace(None)
        trace_out.write_text(json.dumps(sorted(lines)))
    sys.stdout.flush()
    sys.stderr.flush()
    return rc


def run_tests(scratch: Path, tests: list[str], timeout: float, log: Path, fork: bool,
              trace_file: str | None = None, trace_out: Path | None = None) -> tuple[str, int | None, float]:
    """('passed' | 'failed' | 'timeout', return code, seconds)."""
    args = PYTEST_ARGS + tests
    t0 = time.monotonic()
    if fork:
        pid = os.fork()
        if pid == 0:  # the child never returns into the runner
            rc = 70
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.setpgid(0, 0)
                rc = _child(scratch, args, log, trace_file, trace_out)
            except BaseException:  # noqa: BLE001 - report anything as a failed run
                import traceback
                traceback.print_exc()
            finally:
                os._exit(rc)
        return _wait(pid, timeout, t0)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(scratch), str(log),
           trace_file or "", str(trace_out or ""), "--", *args]
    proc = subprocess.Popen(cmd, start_new_session=True, env=test_env())
    return _wait(proc.pid, timeout, t0, proc)


def _wait(pid: int, timeout: float, t0: float, proc=None):
    try:
        return _poll(pid, timeout, t0, proc)
    except KeyboardInterrupt:
        _kill_group(pid)
        if proc is not None:
            proc.wait()
        else:
            os.waitpid(pid, 0)
        raise


def _poll(pid: int, timeout: float, t0: float, proc):
    while True:
        if proc is not None:
            rc = proc.poll()
            done = rc is not None
        else:
            done_pid, status = os.waitpid(pid, os.WNOHANG)
            done = done_pid == pid
            rc = os.waitstatus_to_exitcode(status) if done else None
        if done:
            return ("passed" if rc == 0 else "failed"), rc, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            _kill_group(pid)
            if proc is not None:
                proc.wait()
            else:
                os.waitpid(pid, 0)
            return "timeout", None, time.monotonic() - t0
        time.sleep(0.05)


def _kill_group(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- one module ---------------------------------------------------------------------------------

def covered(m: mutgen.Mutant, source: str, lines: set[int]) -> bool:
    last = m.line + source[m.start:m.end].count("\n")
    return any(n in lines for n in range(m.line, last + 1))


def run_module(name: str, conf: dict, args, scratch: Path, equivalents: dict, out_dir: Path) -> dict:
    path = scratch / name
    source = (REPO / name).read_text()
    all_mutants = [m for m in mutgen.find(source, conf.get("operators", ())) if in_scope(m, conf)]
    chosen = all_mutants
    if args.survivors:
        previous = out_dir / f"{slug(name)}.json"
        if not previous.is_file():
            raise SystemExit(f"--survivors: no previous result {previous}")
        records = json.loads(previous.read_text())["mutants"]
        keys = {tuple(r["key"]) for r in records if r["status"] in ("survived", "uncovered")}
        known = {tuple(r["key"]) for r in records}
        # the survivors, and any mutant the module gained since that run (its code changed)
        chosen = [m for m in chosen if tuple(m.key) in keys or tuple(m.key) not in known]
    if args.function:
        chosen = [m for m in chosen if any(fnmatch.fnmatch(m.function, f) or fnmatch.fnmatch(m.function.split(".")[-1], f)
                                          for f in args.function)]
    if args.sample and args.sample < len(chosen):
        chosen = sorted(random.Random(args.seed).sample(chosen, args.sample), key=lambda m: m.index)
    if args.max_mutants:
        chosen = chosen[:args.max_mutants]
    tests = args.tests or conf["tests"]
    print(f"== {name}: {len(chosen)} of {len(all_mutants)} mutants; tests: {' '.join(tests)}", flush=True)
    if args.dry_run:
        for m in chosen:
            print("   ", m.describe())
        return {}

    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=scratch))
    trace_out = logs / "lines.json"
    status, rc, clean_s = run_tests(scratch, tests, args.clean_timeout, logs / "clean.log", not args.no_fork,
                                    trace_file=str(path), trace_out=trace_out)
    if status != "passed":
        tail = (logs / "clean.log").read_text()[-3000:]
        raise SystemExit(f"{name}: the unmutated tests do not pass ({status}, rc {rc}):\n{tail}")
    lines = set(json.loads(trace_out.read_text()))
    timeout = conf.get("timeout") or max(args.min_timeout, args.timeout_factor * clean_s)
    print(f"   clean run {clean_s:.1f} s (traced); timeout per mutant {timeout:.0f} s", flush=True)

    results, t_start = [], time.monotonic()
    try:
        for i, m in enumerate(chosen, 1):
            rec = {"index": m.index, "key": list(m.key), "line": m.line, "col": m.col, "op": m.op,
                   "function": m.function, "original": m.original, "mutated": m.mutated}
            reason = equivalents.get((name, *m.key))
            if not covered(m, source, lines) and not conf.get("run_uncovered"):
                rec.update(status="uncovered", seconds=0.0, rc=None)
            else:
                path.write_text(m.apply(source))
                try:
                    st, rc, secs = run_tests(scratch, tests, timeout, logs / "mutant.log", not args.no_fork)
                finally:
                    path.write_text(source)
                st = {"passed": "survived", "failed": "killed"}.get(st, st)
                rec.update(status=st, seconds=round(secs, 2), rc=rc)
                log_text = (logs / "mutant.log").read_text(errors="replace")
                if st == "killed":
                    rec["killed_by"] = [ln.split(" - ")[0] for ln in log_text.splitlines()
                                        if ln.startswith(("FAILED ", "ERROR "))][:3]
                if rc not in (None, 0, 1):
                    rec["log_tail"] = log_text[-600:]
            if reason and rec["status"] in ("survived", "uncovered"):
                rec["status"], rec["reason"] = "equivalent", reason
            results.append(rec)
            mark = {"killed": ".", "timeout": "T", "survived": "S", "uncovered": "U", "equivalent": "E"}[rec["status"]]
            print(mark, end="" if i % 60 else f" {i}/{len(chosen)}\n", flush=True)
    except KeyboardInterrupt:
        path.write_text(source)
        print("\ninterrupted: writing the mutants run so far", flush=True)
        args.interrupted = True
    print()
    seconds = time.monotonic() - t_start
    if args.survivors:
        summary = merge_rerun(out_dir / f"{slug(name)}.json", results, seconds, clean_s, tests, args,
                              {m.key for m in all_mutants}, len(all_mutants))
    else:
        summary = summarize(name, results, len(all_mutants), seconds, clean_s, tests, args)
    (out_dir / f"{slug(name)}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"   {summary['score_text']}", flush=True)
    return summary


def slug(name: str) -> str:
    return name.removeprefix("sparsegen/").removesuffix(".py").replace("/", ".")


def merge_rerun(previous: Path, results, seconds, clean_s, tests, args, current: set, total: int) -> dict:
    """The previous run of the module with its survivors' records replaced by this re-run's: the
    score of the whole mutant set after new tests (a killed mutant stays killed when tests are only
    added). Mutants the module no longer has (`current`: the keys it has now) are dropped, and the
    ones it gained were run here and are added. `seconds` stays the full run's; the re-run's time is
    kept apart."""
    prev = json.loads(previous.read_text())
    new = {tuple(r["key"]): r for r in results}
    merged = [new.pop(tuple(r["key"]), r) for r in prev["mutants"] if tuple(r["key"]) in current]
    merged += list(new.values())
    reruns = prev.get("reruns", []) + [{"date": time.strftime("%Y-%m-%d %H:%M"), "mutants": len(results),
                                        "seconds": round(seconds, 1), "tests": tests}]
    was = argparse.Namespace(**{**vars(args), "survivors": False, "sample": prev["sample"], "seed": prev["seed"]})
    summary = summarize(prev["module"], merged, total, prev["seconds"], clean_s, tests, was)
    summary["reruns"] = reruns
    summary["score_text"] += f"; survivors re-run {reruns[-1]['date']} ({len(results)} mutants, {seconds:.0f} s)"
    return summary


def summarize(name, results, total, seconds, clean_s, tests, args) -> dict:
    count = {s: sum(r["status"] == s for r in results)
             for s in ("killed", "timeout", "survived", "uncovered", "equivalent")}
    judged = len(results) - count["equivalent"]
    detected = count["killed"] + count["timeout"]
    score = detected / judged if judged else 1.0
    scope = "all" if len(results) == total else f"{len(results)} of {total}"
    return {
        "module": name, "tests": tests, "mutants_total": total, "mutants_run": len(results),
        "sample": args.sample, "seed": args.seed,
        "counts": count, "score": round(score, 4), "seconds": round(seconds, 1), "clean_seconds": round(clean_s, 1),
        "date": time.strftime("%Y-%m-%d %H:%M"), "fork": not args.no_fork,
        "score_text": f"{name}: {detected}/{judged} = {100 * score:.1f} % ({scope} mutants; "
                      f"{count['equivalent']} equivalent, {count['uncovered']} uncovered; {seconds:.0f} s)",
        "mutants": results,
    }


def write_summary(out_dir: Path):
    rows, survivors = [], []
    for f in sorted(out_dir.glob("*.json")):
        s = json.loads(f.read_text())
        c = s["counts"]
        judged = s["mutants_run"] - c["equivalent"]
        rows.append(f"| `{s['module']}` | {s['mutants_run']} / {s['mutants_total']} | {c['killed'] + c['timeout']} | "
                    f"{c['survived']} | {c['uncovered']} | {c['equivalent']} | {100 * s['score']:.1f} % | "
                    f"{s['seconds']:.0f} s | {s['date']} |")
        for r in s["mutants"]:
            if r["status"] in ("survived", "uncovered"):
                survivors.append(f"| `{s['module']}` | {r['line']} | {r['function']} | {r['op']} | "
                                 f"`{_cell(r['original'])}` | `{_cell(r['mutated'])}` | {r['status']} |")
        del judged
    text = ["# Mutation run: latest result per module", "",
            "Written by `lab/mutation/run.py`; each row is the latest run of that module (see its JSON).", "",
            "| module | mutants run / all | killed | survived | uncovered | equivalent | score | time | date |",
            "|---|---|---|---|---|---|---|---|---|", *rows, "",
            "## Surviving mutants", "",
            "| module | line | function | op | original | mutant | status |", "|---|---|---|---|---|---|---|",
            *survivors, ""]
    (out_dir / "summary.md").write_text("\n".join(text))


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'")


# ---- entry ------------------------------------------------------------------------------------

def _interrupt(signum, frame):
    raise KeyboardInterrupt


def preimport():
    """What every test process imports anyway, loaded once in the parent that forks them. Never
    sparsegen: each mutant's test process must import it from the mutated copy."""
    import importlib
    for mod in ("numpy", "scipy", "scipy.sparse", "scipy.sparse.linalg", "scipy.stats", "pytest", "_pytest.python",
                "hypothesis", "hypothesis.extra.numpy", "jinja2", "networkx"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    assert not any(m == "sparsegen" or m.startswith("sparsegen.") for m in sys.modules)


def main(argv=None):
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        scratch, log, trace_file, trace_out = sys.argv[2:6]
        args = sys.argv[sys.argv.index("--") + 1:]
        rc = _child(Path(scratch), args, Path(log), trace_file or None, Path(trace_out) if trace_out else None)
        raise SystemExit(rc)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", action="append", default=[], help="configured module: path, short name "
                    "(analyze, formats/csr), folder prefix (formats/) or glob; repeatable (default: all)")
    ap.add_argument("--nightly", action="store_true", help="every configured module, every mutant")
    ap.add_argument("--list", action="store_true", help="print the configured modules and their tests")
    ap.add_argument("--dry-run", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--max-mutants", type=int, default=0, help="at most this many mutants per module (first in source order)")
    ap.add_argument("--sample", type=int, default=0, help="a seeded random sample of this many mutants per module")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--survivors", action="store_true", help="only the mutants that survived the module's last run")
    ap.add_argument("--function", action="append", default=[], help="only mutants in functions matching this glob")
    ap.add_argument("--tests", type=shlex.split, help="pytest arguments to run instead of the configured "
                    "tests, one string: --tests 'tests/test_io.py -m \"not gpu\"'")
    ap.add_argument("--no-fork", action="store_true", help="a fresh `python` process per mutant")
    ap.add_argument("--timeout-factor", type=float, default=3.0, help="mutant timeout = factor x clean run")
    ap.add_argument("--min-timeout", type=float, default=30.0)
    ap.add_argument("--clean-timeout", type=float, default=1800.0)
    ap.add_argument("--config", type=Path, default=HERE / "modules.toml")
    ap.add_argument("--equivalents", type=Path, default=HERE / "equivalent.toml")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    args.interrupted = False
    # Ctrl-C or a plain kill stops the run cleanly: the test process is killed, the mutated file
    # restored, the results so far written, the scratch copy removed.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    cfg = load_config(args.config)
    if args.list:
        for name, conf in cfg["module"].items():
            scope = f" (functions {', '.join(conf['functions'])})" if conf.get("functions") else ""
            print(f"{name}{scope}\n    {' '.join(conf['tests'])}")
        return 0
    if args.nightly and (args.sample or args.max_mutants or args.survivors):
        raise SystemExit("--nightly runs every mutant: drop --sample/--max-mutants/--survivors")
    if not args.module and not args.nightly:
        raise SystemExit("name a --module (see --list) or ask for --nightly")
    names = pick_modules(cfg, [] if args.nightly else args.module)
    equivalents = load_equivalents(args.equivalents)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_fork and not args.dry_run:
        preimport()
    scratch = make_scratch()
    t0 = time.monotonic()
    try:
        for name in names:
            run_module(name, cfg["module"][name], args, scratch, equivalents, args.out)
            if args.interrupted:
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not args.dry_run:
        write_summary(args.out)
        print(f"total {time.monotonic() - t0:.0f} s; summary in {args.out / 'summary.md'}")
    return 130 if args.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
