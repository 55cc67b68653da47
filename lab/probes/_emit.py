"""The probes' printing: each line to stdout and, when $OUT is set, to $OUT/<name> as it comes (a
probe cut by the device's time limit keeps what it printed)."""
from __future__ import annotations

import os


def emitter(name: str, mode: str = "w"):
    """emit(line): print it, and append it to $OUT/`name` (opened with `mode`) when OUT is set."""
    out = open(os.path.join(os.environ["OUT"], name), mode) if os.environ.get("OUT") else None

    def emit(line: str) -> None:
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    return emit
