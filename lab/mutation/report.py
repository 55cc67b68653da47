"""The generated parts of docs/mutation.md, from the run's results: the duration of a full run, the
score before and after per module, and every equivalent mutant with its line, edit and reason.

    python lab/mutation/report.py                         # print the three parts
    python lab/mutation/report.py --write docs/mutation.md  # replace them between their markers
        [--before lab/mutation/results/baseline] [--after lab/mutation/results]

A part sits in the page between `<!-- report:NAME -->` and `<!-- /report:NAME -->` (NAME: duration,
scores, equivalents); everything else on the page is written by hand. Lines are those of the module
as it is now (a mutant is found again by its key); a result whose mutants no longer match the
module's (the code changed after the run) is marked stale, so a page is never regenerated from a
run of other code without saying so.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import mutants as mutgen  # noqa: E402
import run as runner  # noqa: E402

PARTS = ("duration", "scores", "equivalents")


def load(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.json")):
        s = json.loads(f.read_text())
        out[s["module"]] = s
    return out


def current_lines(name: str, conf: dict) -> dict:
    """{mutant key: its line in the module as it is now}, for the module's configured scope."""
    source = (REPO / name).read_text()
    return {m.key: m.line for m in mutgen.find(source, conf.get("operators", ())) if runner.in_scope(m, conf)}


def key(r: dict) -> tuple:
    """A result's mutant key; the first runs wrote it without `nth` (then 0)."""
    k = tuple(r["key"])
    return k if len(k) == 4 else (*k, 0)


def stale(s: dict, lines: dict) -> bool:
    ran = {key(r) for r in s["mutants"]}
    if s["mutants_run"] == s["mutants_total"]:
        return ran != set(lines)
    return not ran <= set(lines) or s["mutants_total"] != len(lines)


def score(s: dict | None, lines: dict) -> str:
    if s is None:
        return "not measured"
    c = s["counts"]
    judged = s["mutants_run"] - c["equivalent"]
    detected = c["killed"] + c["timeout"]
    scope = "" if s["mutants_run"] == s["mutants_total"] else f", sample of {s['mutants_run']}, seed {s['seed']}"
    mark = f", on an earlier version of the module: {s['mutants_total']} mutants then" if stale(s, lines) else ""
    return f"{100 * s['score']:.1f} % ({detected}/{judged}{scope}{mark})"


def full_seconds(s: dict) -> float:
    """A run of every mutant of the module: the traced clean run plus the mutants' loop."""
    return s["seconds"] + s["clean_seconds"]


def duration_part(after: dict, names: list, config: dict) -> list[str]:
    full = [n for n in names if after[n]["mutants_run"] == after[n]["mutants_total"]]
    total = sum(full_seconds(after[n]) for n in full)
    mutants = sum(after[n]["mutants_total"] for n in full)
    missing = [n for n in config if n not in full]
    out = [f"A full run (`--nightly`) of the {len(full)} modules measured here: {mutants} mutants in "
           f"{total / 60:.0f} minutes ({total:.0f} s: each module's traced clean run plus its mutants, summed; "
           f"{total / max(mutants, 1):.1f} s a mutant), one test process at a time on this machine's two "
           f"cores, which other jobs shared."]
    if missing:
        out += ["", "Not in that sum (no full run measured): " + ", ".join(f"`{n}`" for n in missing) + "."]
    return out


def scores_part(before: dict, after: dict, names: list, config: dict) -> list[str]:
    out = ["| module | mutants | before | after | equivalent | killed by a timeout | full run |",
           "|---|---|---|---|---|---|---|"]
    for n in names:
        a, lines = after[n], current_lines(n, config[n])
        out.append(f"| `{n}` | {a['mutants_total']} | {score(before.get(n), lines)} | {score(a, lines)} | "
                   f"{a['counts']['equivalent']} | {a['counts']['timeout']} | {full_seconds(a):.0f} s |")
    return out


def equivalents_part(after: dict, names: list, config: dict) -> list[str]:
    out = []
    for n in names:
        eq = [r for r in after[n]["mutants"] if r["status"] == "equivalent"]
        left = [r for r in after[n]["mutants"] if r["status"] in ("survived", "uncovered")]
        if not eq and not left:
            continue
        lines = current_lines(n, config[n])
        out += [f"### `{n}`", ""]
        if eq:
            out += ["| line | function | edit | why it is equivalent |", "|---|---|---|---|"]
            for r in eq:
                line = lines.get(key(r), "gone")
                edit = f"`{_cell(r['original'])}` → `{_cell(r['mutated'])}`"
                out.append(f"| {line} | `{r['function']}` | {edit} | {_cell(r['reason'])} |")
            out.append("")
        for r in left:
            out.append(f"- NOT KILLED ({r['status']}), line {lines.get(key(r), 'gone')} `{r['function']}`: "
                       f"`{_cell(r['original'])}` → `{_cell(r['mutated'])}`")
        if left:
            out.append("")
    return out or ["None."]


def parts(before: dict, after: dict, config: dict) -> dict:
    names = [n for n in config if n in after]
    return {"duration": duration_part(after, names, config),
            "scores": scores_part(before, after, names, config),
            "equivalents": equivalents_part(after, names, config)}


def write(page: Path, generated: dict):
    text = page.read_text()
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- report:{name} -->\n).*?(<!-- /report:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{page}: no <!-- report:{name} --> ... <!-- /report:{name} --> markers")
        text = pattern.sub(lambda m: m.group(1) + "\n".join(body).rstrip() + "\n" + m.group(2), text)
    page.write_text(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, default=HERE / "results" / "baseline")
    ap.add_argument("--after", type=Path, default=HERE / "results")
    ap.add_argument("--config", type=Path, default=HERE / "modules.toml")
    ap.add_argument("--write", type=Path, help="the page whose marked parts to replace")
    args = ap.parse_args(argv)
    config = runner.load_config(args.config)["module"]
    generated = parts(load(args.before), load(args.after), config)
    if args.write:
        write(args.write, generated)
        return 0
    for name in PARTS:
        print(f"<!-- report:{name} -->", *generated[name], f"<!-- /report:{name} -->", "", sep="\n")
    return 0


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'")


if __name__ == "__main__":
    sys.exit(main())
