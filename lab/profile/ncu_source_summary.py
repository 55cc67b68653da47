"""Summarise an `ncu --page source --print-source sass --csv` dump by SASS opcode, per tile.

    ncu --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        -k tiled_csl_spmm -c 1 python lab/profile/profile_tiled.py 28672,7168,0.9,8,tiled_csl_spmm > src.csv
    python lab/profile/ncu_source_summary.py src.csv TILES [ROWS]

TILES: the kernel's 128 x 64 tiles times its column tiles (28672 x 7168, one column tile: 25088).
Prints warp instructions and shared-memory wavefronts per tile, the ROWS (default 16) opcodes with
the most stall samples, and the stall reasons over 2 % of the samples.
"""
from __future__ import annotations

import collections
import csv
import re
import sys
from dataclasses import dataclass

WAVEFRONTS, EXCESSIVE = "L1 Wavefronts Shared", "L1 Wavefronts Shared Excessive"
EXECUTED, SAMPLES = "Instructions Executed", "Warp Stall Sampling (All Samples)"


@dataclass
class OpcodeTotals:
    wavefronts: float = 0.0
    excessive: float = 0.0
    executed: float = 0.0
    samples: float = 0.0


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_instructions(path: str) -> list[dict]:
    """One dict per SASS instruction row (header: the row that starts with "Address")."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[start]
    return [dict(zip(header, r)) for r in rows[start + 1:] if len(r) == len(header)]


def opcode(source: str) -> str:
    """The opcode of a SASS line, without its predicate (`@!P0 BRA ...` -> `BRA`)."""
    words = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split()
    return words[0] if words else "?"


def by_opcode(instructions: list[dict]) -> dict[str, OpcodeTotals]:
    totals: dict[str, OpcodeTotals] = collections.defaultdict(OpcodeTotals)
    for ins in instructions:
        t = totals[opcode(ins["Source"])]
        t.wavefronts += number(ins[WAVEFRONTS])
        t.excessive += number(ins[EXCESSIVE])
        t.executed += number(ins[EXECUTED])
        t.samples += number(ins[SAMPLES])
    return totals


def main() -> int:
    path, tiles = sys.argv[1], float(sys.argv[2])
    shown = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    instructions = read_instructions(path)
    totals = by_opcode(instructions)
    executed = sum(t.executed for t in totals.values())
    wavefronts = sum(t.wavefronts for t in totals.values())
    samples = sum(t.samples for t in totals.values())
    print(f"total warp instr {executed:.0f}, per tile {executed / tiles:.0f}; "
          f"smem wavefronts per tile {wavefronts / tiles:.0f}")
    for op, t in sorted(totals.items(), key=lambda kv: -kv[1].samples)[:shown]:
        print(f"{op:24s} {t.executed / tiles:6.1f}/tile wf={t.wavefronts / tiles:6.1f}/tile "
              f"ex={t.excessive / tiles:6.1f} stall-samples={100 * t.samples / samples:5.1f}%")
    reasons = [k for k in instructions[0] if k.startswith("stall_") and "Not Issued" not in k]
    shares = {k[len("stall_"):]: sum(number(ins[k]) for ins in instructions) / samples for k in reasons}
    print(" ".join(f"{k}={100 * v:.0f}%" for k, v in shares.items() if v > 0.02))
    return 0


if __name__ == "__main__":
    sys.exit(main())
