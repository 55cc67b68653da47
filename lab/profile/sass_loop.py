"""The main loop of a kernel's SASS, counted statically (a lab helper for `probes/decode_budget.py`).

    python lab/profile/sass_loop.py KERNEL.cubin [--kernel NAME] [--listing]

Reads `cuobjdump -sass` of a cubin, cuts each kernel into basic blocks and finds its main loop: the
backward branch whose range holds the most HMMA (ties: the widest range). Three counts per kernel:

- `body`: every instruction from the loop's head to its backward branch, once each (what an earlier
  static count of these kernels, "331 instructions a tile per warp", measured);
- `path`: the instructions one warp issues in one trip through a non-empty tile: from the head,
  taking the fall-through side of every conditional branch (the kernels guard only rare cases with
  branches: an empty tile, a divergent shuffle, the ring's last trips) and every unconditional jump,
  to the backward branch. Predicated instructions count (they take an issue slot whatever the
  predicate), and out-of-line blocks (the divergent side of `BRA.DIV`) do not;
- `outside`: the instructions outside the loop (prologue, epilogue and the split-K finish), all of
  them once: what a block issues once, to be amortised over its tiles.

Inner loops (backward branches inside the main loop) are counted once on the path and listed with
their size, so a caller who knows their trip count from the plan can weigh them
(`LoopCount.weighted`). One thread's work is counted apart (`single`): the instructions on the path
inside a region that a forward branch skips and that issues a bulk copy or an mbarrier arrival (a
producer's `if (threadIdx.x == 0)`: one warp of the block runs it, the others branch past it), so
that a per-warp average can weigh it by 1 / warps (`LoopCount.per_warp`).
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*\s*0x[0-9a-f]+\s*\*/")
FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
PREDICATE = re.compile(r"^@(!?)(U?P[T0-9]+)\s+")
TARGET = re.compile(r"\b0x([0-9a-f]+)\s*$")

# Opcode classes the probe reports, by the opcode's first word (before its first dot).
CLASSES = {
    "HMMA": "mma", "HGMMA": "mma",
    "LDSM": "ldmatrix",
    "LDS": "shared load", "STS": "shared store",
    "LDGSTS": "cp.async", "LDGDEPBAR": "cp.async", "DEPBAR": "cp.async", "UBLKCP": "bulk copy", "SYNCS": "mbarrier",
    "UTMALDG": "bulk copy",
    "SHFL": "shuffle", "REDUX": "shuffle", "VOTE": "shuffle",
    "BAR": "barrier", "WARPSYNC": "barrier", "BSSY": "branch", "BSYNC": "branch", "BRA": "branch", "EXIT": "branch",
    "POPC": "bit", "FLO": "bit", "BREV": "bit", "R2P": "bit", "P2R": "bit", "PRMT": "bit", "LOP3": "bit", "SHF": "bit",
    "LOP": "bit", "BMSK": "bit", "SGXT": "bit", "PLOP3": "bit",
    "MOV": "move", "CS2R": "move", "IMAD.MOV": "move", "UMOV": "move", "S2R": "move", "S2UR": "move",
}


@dataclass(frozen=True)
class Instruction:
    address: int
    text: str  # without the predicate
    predicate: str  # "" or e.g. "!P0"

    @property
    def opcode(self) -> str:
        return self.text.split()[0] if self.text else "?"

    @property
    def family(self) -> str:
        """The opcode class of CLASSES (IMAD.MOV is a move, other IMAD arithmetic), else "alu"."""
        op = self.opcode
        if op.startswith("IMAD.MOV"):
            return CLASSES["IMAD.MOV"]
        return CLASSES.get(op.split(".")[0], "alu")

    @property
    def is_branch(self) -> bool:
        return self.opcode.split(".")[0] == "BRA"

    @property
    def conditional(self) -> bool:
        """A branch or exit that may fall through: predicated (not on PT), or BRA.DIV / BRA.U."""
        if self.predicate and self.predicate != "PT":
            return True
        return self.opcode in ("BRA.DIV",) or (self.is_branch and "," in self.text)

    @property
    def target(self) -> int | None:
        if not self.is_branch:
            return None
        m = TARGET.search(self.text)
        return int(m.group(1), 16) if m else None

    @property
    def ends_flow(self) -> bool:
        """Control never falls through: an unconditional branch or exit."""
        return (self.is_branch or self.opcode == "EXIT") and not self.conditional


def parse(sass: str) -> dict[str, list[Instruction]]:
    """`cuobjdump -sass` text -> {kernel name: its instructions in address order}."""
    kernels: dict[str, list[Instruction]] = {}
    current = None
    for line in sass.splitlines():
        f = FUNCTION.match(line)
        if f:
            current = kernels.setdefault(f.group(1), [])
            continue
        m = LINE.search(line)
        if m is None or current is None:
            continue
        text = m.group(2).strip()
        p = PREDICATE.match(text)
        pred = ""
        if p:
            pred = p.group(1) + p.group(2)
            text = text[p.end():]
        current.append(Instruction(int(m.group(1), 16), text, pred))
    return kernels


def disassemble(cubin: bytes) -> str:
    """`cuobjdump -sass` of a cubin (cuobjdump on PATH, or an error saying so)."""
    if shutil.which("cuobjdump") is None:
        raise SystemExit("cuobjdump is not on PATH (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True, check=True).stdout


@dataclass
class LoopCount:
    kernel: str
    head: int  # address of the loop's first instruction
    back: int  # address of its backward branch
    body: int  # instructions in [head, back]
    path: int  # instructions on the fall-through path through one trip
    outside: int  # instructions of the kernel outside [head, back]
    classes: dict = field(default_factory=dict)  # opcode class -> instructions on the path
    opcodes: dict = field(default_factory=dict)  # opcode -> instructions on the path
    inner: list = field(default_factory=list)  # (head, back, instructions) of inner loops on the path
    skipped: list = field(default_factory=list)  # (branch address, instructions it skips) of forward branches
    single: int = 0  # instructions of the path only one warp runs (a producer thread's copies)

    def weighted(self, trips: dict[int, float]) -> float:
        """The path with each inner loop (by its head address) counted `trips[head]` times instead of once."""
        extra = sum((trips.get(h, 1.0) - 1.0) * size for h, _, size in self.inner)
        return self.path + extra

    def per_warp(self, warps: int, trips: dict[int, float] | None = None) -> float:
        """`weighted`, with one thread's work shared out over the block's `warps` warps."""
        return self.weighted(trips or {}) - self.single * (1.0 - 1.0 / warps)


def main_loop(code: list[Instruction]) -> tuple[int, int]:
    """(head index, back-edge index) of the backward branch whose range holds the most HMMA/HGMMA
    (ties: the widest); a range holding an unconditional EXIT is no loop (out-of-line code jumping
    back, such as the divergent side of a shuffle)."""
    index = {ins.address: i for i, ins in enumerate(code)}
    best = None
    for i, ins in enumerate(code):
        t = ins.target
        if t is None or t > ins.address or t not in index:
            continue
        h = index[t]
        if any(c.opcode == "EXIT" and not c.conditional for c in code[h:i + 1]):
            continue
        mma = sum(1 for c in code[h:i + 1] if c.family == "mma")
        key = (mma, i - h)
        if best is None or key > best[0]:
            best = (key, h, i)
    if best is None or best[0][0] == 0:
        raise ValueError("no loop holding an mma instruction")
    return best[1], best[2]


def walk(code: list[Instruction], head: int, back: int) -> tuple[list[int], list, list]:
    """Indices of the instructions on the fall-through path from `head` to `back`, inner loops met on
    it (head, back, size), and forward branches passed (address, instructions skipped)."""
    index = {ins.address: i for i, ins in enumerate(code)}
    path, inner, skipped = [], [], []
    i, steps = head, 0
    while steps < 100_000:
        steps += 1
        ins = code[i]
        path.append(i)
        if i == back:
            break
        t = ins.target
        if ins.is_branch and t is not None and t in index:
            j = index[t]
            if ins.conditional:
                if head <= j <= i:
                    inner.append((t, ins.address, i - j + 1))
                elif i < j <= back + 1:  # (a target past the loop is out-of-line code, not skipped code)
                    skipped.append((ins.address, j - i - 1))
                i += 1
                continue
            i = j  # unconditional jump
            continue
        if ins.ends_flow:
            raise ValueError(f"the path through the loop ends at {ins.address:#x} ({ins.text})")
        i += 1
    return path, inner, skipped


PRODUCER = ("UBLKCP", "UTMALDG", "SYNCS.ARRIVE")  # opcodes (prefixes) only a producer thread issues
ALL_THREADS = ("LDGSTS", "HMMA", "HGMMA", "LDSM")  # ... and some that every thread issues


def single_thread(code: list[Instruction], path: list[int], head: int, back: int) -> int:
    """Instructions of `path` inside the widest region a forward branch of the loop skips that issues
    a bulk copy or an mbarrier arrival and no per-thread copy or mma (a producer thread's work, not a
    guard every warp passes, such as the ring's last trips)."""
    index = {ins.address: i for i, ins in enumerate(code)}
    best = None
    for i in range(head, back):
        ins = code[i]
        t = ins.target
        if not (ins.is_branch and ins.conditional and t in index and i < index[t] <= back + 1):
            continue
        body = code[i + 1:index[t]]
        if any(c.opcode.startswith(PRODUCER) for c in body) and not any(
                c.opcode.startswith(ALL_THREADS) for c in body):
            if best is None or index[t] - i > best[1] - best[0]:
                best = (i + 1, index[t])
    return 0 if best is None else sum(1 for i in path if best[0] <= i < best[1])


def count(code: list[Instruction], kernel: str = "") -> LoopCount:
    head, back = main_loop(code)
    path, inner, skipped = walk(code, head, back)
    on_path = [code[i] for i in path]
    classes = collections.Counter(ins.family for ins in on_path)
    opcodes = collections.Counter(ins.opcode for ins in on_path)
    tail = [ins for ins in code if ins.opcode != "NOP" or ins.address < code[back].address]
    outside = sum(1 for ins in tail if not code[head].address <= ins.address <= code[back].address)
    return LoopCount(kernel, code[head].address, code[back].address, back - head + 1, len(path), outside,
                     dict(classes), dict(opcodes), inner, skipped, single_thread(code, path, head, back))


def count_cubin(cubin: bytes, kernel: str | None = None) -> LoopCount:
    """The main loop of `kernel` (default: the kernel holding an mma) in a cubin."""
    kernels = parse(disassemble(cubin))
    names = [kernel] if kernel else [k for k, code in kernels.items() if any(c.family == "mma" for c in code)]
    if not names or names[0] not in kernels:
        raise ValueError(f"kernel {kernel!r} not in the cubin (kernels: {', '.join(kernels)})")
    return count(kernels[names[0]], names[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cubin")
    p.add_argument("--kernel")
    p.add_argument("--listing", action="store_true", help="print the path's instructions")
    a = p.parse_args()
    cubin = open(a.cubin, "rb").read()
    c = count_cubin(cubin, a.kernel)
    print(f"{c.kernel}: loop {c.head:#x}-{c.back:#x}: body {c.body}, path {c.path} (one thread's: {c.single}), "
          f"outside {c.outside}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(c.classes.items(), key=lambda kv: -kv[1])))
    for h, b, size in c.inner:
        print(f"  inner loop {h:#x}-{b:#x}: {size} instructions")
    for at, n in c.skipped:
        print(f"  branch at {at:#x} skips {n}")
    if a.listing:
        code = parse(disassemble(cubin))[c.kernel]
        head = next(i for i, ins in enumerate(code) if ins.address == c.head)
        back = next(i for i, ins in enumerate(code) if ins.address == c.back)
        for i in walk(code, head, back)[0]:
            ins = code[i]
            print(f"  {ins.address:#06x} {'@' + ins.predicate + ' ' if ins.predicate else ''}{ins.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
