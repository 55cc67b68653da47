"""Single-point mutation testing for one module at a time, with nothing but `ast` and pytest.

    python lab/mutation/mutate.py sparsegen/cache.py tests/test_cache.py [more test files]
        [--timeout S] [--only N,M] [--list] [--json out.json]

It copies the checkout (without .git and the cache) into a temporary directory, so the working
tree is never touched. For each mutant it writes the mutated module there, runs
`python -m pytest -x -q -p no:cacheprovider <tests>` under a timeout, and counts the mutant as
killed (the tests fail), survived (they pass) or timed out (counted as killed in the score, shown
apart). The unmutated module runs first and must pass.

Mutants, each applied alone: comparison operators flipped or relaxed (< <=, == !=, in / not in,
is / is not), integer constants +1 and -1, True/False swapped, string and bytes constants changed,
`and`/`or` swapped, `not` removed, `return X` replaced by `return None`, and a statement deleted
(a call used as a statement, raise, continue, break). Docstrings and annotations are left alone.
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
DELETABLE = (ast.Raise, ast.Continue, ast.Break)


@dataclass
class Mutant:
    index: int
    line: int
    what: str
    outcome: str = ""
    seconds: float = 0.0


def _variants(node, parent):
    """(description, replacement node) for each single-point change of `node`."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in FLIP:
                new = copy.deepcopy(node)
                new.ops[i] = FLIP[type(op)]()
                yield f"{type(op).__name__} -> {FLIP[type(op)].__name__}", new
    elif isinstance(node, ast.Constant):
        yield from _constant_variants(node)
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield f"{type(node.op).__name__} -> {type(other).__name__}", ast.BoolOp(other, copy.deepcopy(node.values))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "not removed", copy.deepcopy(node.operand)
    elif isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
        yield "return X -> return None", ast.Return(ast.Constant(None))
    elif isinstance(node, DELETABLE) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        yield f"{type(node).__name__} statement deleted: {ast.unparse(node)[:60]}", ast.Pass()


def _constant_variants(node):
    value = node.value
    if isinstance(value, bool):
        yield f"{value} -> {not value}", ast.Constant(not value)
    elif isinstance(value, int):
        yield f"{value} -> {value + 1}", ast.Constant(value + 1)
        yield f"{value} -> {value - 1}", ast.Constant(value - 1)
    elif isinstance(value, str):
        yield f"{value[:30]!r} -> 'XX' + it", ast.Constant("XX" + value)
    elif isinstance(value, bytes):
        yield f"{value[:30]!r} -> b'XX' + it", ast.Constant(b"XX" + value)


def _is_none(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _skipped(tree) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, f-string pieces."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        annotations = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        if isinstance(node, ast.JoinedStr):
            annotations.extend(node.values)
        for ann in annotations:
            skip.update(id(n) for n in ast.walk(ann))
    return skip


class _Apply(ast.NodeTransformer):
    """Walks the tree in a fixed order, numbering every variant; replaces only number `target`
    (or none, when target is None, which lists them all)."""

    def __init__(self, tree, target=None):
        self.skip, self.target, self.count, self.found = _skipped(tree), target, 0, []

    def visit(self, node):
        replacement = None
        if id(node) not in self.skip:
            for what, new in _variants(node, None):
                if self.count == self.target:
                    replacement = ast.copy_location(new, node)
                self.found.append(Mutant(self.count, getattr(node, "lineno", 0), what))
                self.count += 1
        if replacement is not None:
            return replacement
        return self.generic_visit(node)


def mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    walker = _Apply(tree)
    walker.visit(tree)
    return walker.found


def mutated(source: str, index: int) -> str:
    tree = ast.parse(source)
    tree = _Apply(tree, index).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _copy_checkout(dest: Path):
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", "benchmarks")
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    for item in (dest / "cache").iterdir():
        if item.name != "README.md":
            shutil.rmtree(item) if item.is_dir() else item.unlink()


def _run_tests(work: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(work)}
    env.setdefault("SPARSEGEN_DATA", str(ROOT.parent / "shared" / "data"))
    for pyc in work.rglob("__pycache__"):
        shutil.rmtree(pyc, ignore_errors=True)
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t
    # 1: a test failed; 2: collection failed (the mutant breaks the import); others: pytest itself
    outcome = {0: "survived", 1: "killed", 2: "killed"}.get(proc.returncode, f"error rc={proc.returncode}")
    return outcome, time.perf_counter() - t


def run(module: str, tests: list[str], timeout: float, only=None) -> list[Mutant]:
    source = (ROOT / module).read_text()
    todo = [m for m in mutants(source) if only is None or m.index in only]
    with tempfile.TemporaryDirectory(prefix="sparsegen-mutation-") as tmp:
        work = Path(tmp) / "repo"
        _copy_checkout(work)
        base, seconds = _run_tests(work, tests, timeout * 3)
        if base != "survived":
            sys.exit(f"the unmutated module fails its tests ({base}); fix that first")
        print(f"baseline: tests pass in {seconds:.1f} s; {len(todo)} mutants", flush=True)
        limit = max(timeout, 3 * seconds + 10)
        for m in todo:
            (work / module).write_text(mutated(source, m.index))
            m.outcome, m.seconds = _run_tests(work, tests, limit)
            print(f"  #{m.index:<4} line {m.line:<4} {m.outcome:<9} {m.what}", flush=True)
    return todo


def report(module: str, results: list[Mutant]) -> str:
    killed = sum(m.outcome == "killed" for m in results)
    timeouts = sum(m.outcome == "timeout" for m in results)
    survived = [m for m in results if m.outcome == "survived"]
    other = [m for m in results if m.outcome not in ("killed", "timeout", "survived")]
    score = 100.0 * (killed + timeouts) / max(1, len(results))
    lines = [f"{module}: {len(results)} mutants, killed {killed}, timeouts {timeouts}, "
             f"survived {len(survived)}, errors {len(other)}; score {score:.1f} %"]
    lines += [f"  survived #{m.index} line {m.line}: {m.what}" for m in survived]
    lines += [f"  {m.outcome} #{m.index} line {m.line}: {m.what}" for m in other]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module", help="path of the module, relative to the checkout root")
    ap.add_argument("tests", nargs="+", help="test files to run against each mutant")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a mutant's test run may take")
    ap.add_argument("--only", help="comma-separated mutant numbers to run")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.list:
        for m in mutants((ROOT / args.module).read_text()):
            print(f"#{m.index:<4} line {m.line:<4} {m.what}")
        return 0
    only = {int(x) for x in args.only.split(",")} if args.only else None
    t = time.perf_counter()
    results = run(args.module, args.tests, args.timeout, only)
    print(report(args.module, results))
    print(f"wall time {time.perf_counter() - t:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(m) for m in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
