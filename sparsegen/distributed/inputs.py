"""Each MPI rank's share of the inputs, read by that rank where the format allows.

- Plain (uncompressed) TSV, `input pixel value` one entry per line with the inputs in ascending
  order (the challenge's layout): rank r of P takes the lines that start in its byte range,
  [r·size/P, (r+1)·size/P), moved to input boundaries: a range's edge at byte `pos` becomes the
  start of the first line at or after `pos` whose input differs from the line before it
  (`input_edge`). Rank r computes both of its edges itself, and rank r's end is rank r + 1's
  start by construction, so no input is split and no message is needed; each rank reads its range
  plus a few lines around each edge, never the whole file. Rank r then owns the inputs from its
  first one up to the next rank's first (empty inputs included). A file whose inputs are not in
  ascending order across ranks is read by rank 0 and scattered instead.
- MNIST IDX images: each rank makes its own images (rank r: the r-th equal block).
- Anything else (gzip'd TSV, which cannot be entered in the middle; Matrix Market): rank 0 reads
  the file and scatters equal blocks of inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import io
from ..errors import FormatError
from ..io import tsv
from ..io._files import open_regular
from ..io._text import WIDE, Tokens, cast_values, check_finite_entries, check_indices, coo_to_csr, duplicate_reporter
from .comm import ROOT, collective

GZIP_MAGIC = b"\x1f\x8b"
BLOCK = 1 << 16  # bytes read at a time around a range's edges


@dataclass(frozen=True)
class InputSlice:
    """This rank's inputs: rows are global inputs start .. start + rows.shape[0] - 1 (0-based) of
    `total`; `how` says how the rank got them."""

    rows: sp.csr_matrix
    start: int
    total: int
    how: str


def byte_range(size: int, rank: int, ranks: int) -> tuple[int, int]:
    return size * rank // ranks, size * (rank + 1) // ranks


def is_plain_tsv(path) -> bool:
    """A TSV file that is not gzip'd (by its first bytes, whatever its name): one that can be entered
    at any byte."""
    if io.detect_format(path) != "tsv":
        return False
    f, _ = open_regular(path)
    with f:
        return f.read(2) != GZIP_MAGIC


def input_edge(f, size: int, pos: int, path) -> int:
    """The byte where the input whose line starts at or after `pos` begins, if it differs from the
    input of the line before; else the start of the next input's first line (or `size`)."""
    if pos <= 0:
        return 0
    start = _line_start(f, size, pos)
    previous = _previous_input(f, start, path) if start < size else None
    while start < size:  # over blocks of whole lines, until one holds a different input
        f.seek(start)
        block = f.read(BLOCK)
        if start + len(block) < size:
            cut = block.rfind(b"\n") + 1
            block = block[:cut] if cut else block + _rest_of_line(f)
        ids, offsets = _first_fields(block, path, start)
        other = np.flatnonzero(ids != previous) if previous is not None else np.arange(min(1, ids.size))
        if other.size:
            return start + int(offsets[other[0]])
        start += len(block)
    return size


def _line_start(f, size: int, pos: int) -> int:
    """The first line start at or after `pos`: byte 0 or the byte after a newline."""
    at = pos - 1
    f.seek(at)
    while at < size:  # over blocks, until a newline
        block = f.read(BLOCK)
        if not block:
            break
        nl = block.find(b"\n")
        if nl >= 0:
            return at + nl + 1
        at += len(block)
    return size


def _rest_of_line(f) -> bytes:
    """The bytes up to and including the next newline (a line longer than a block)."""
    out = b""
    while True:  # over blocks of one long line
        block = f.read(BLOCK)
        nl = block.find(b"\n")
        if nl >= 0 or not block:
            return out + (block[:nl + 1] if nl >= 0 else block)
        out += block


def _previous_input(f, start: int, path):
    """The input id of the last non-blank line before byte `start` (None: there is none)."""
    lo = start
    while lo > 0:  # over ever longer stretches backwards, until one holds a whole non-blank line
        lo = max(0, lo - BLOCK)
        f.seek(lo)
        text = f.read(start - lo).rstrip()
        nl = text.rfind(b"\n")
        if text and (nl >= 0 or lo == 0):
            ids, _ = _first_fields(text[nl + 1:] + b"\n", path, lo + nl + 1)
            return int(ids[0])
    return None


def _first_fields(data: bytes, path, offset: int):
    """The first field of each non-blank line of `data` (ints) and its byte offset in `data`; `offset`:
    where data begins in the file (for an error's line number)."""
    tok = Tokens(data, path)
    if not tok.count:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = np.concatenate([[0], np.flatnonzero(tok.newline_after()[:-1]) + 1])
    try:
        ids = tok.ints(first, "input id")
    except FormatError as e:
        raise _in_file(e, path, offset) from None
    return ids, tok.starts[first] - WIDE


def read_range(path, rank: int, ranks: int) -> tuple[int, bytes]:
    """(first byte, bytes) of rank's share of a plain TSV file: the lines between its input edges."""
    f, size = open_regular(path)
    with f:
        lo, hi = byte_range(size, rank, ranks)
        start, stop = input_edge(f, size, lo, path), input_edge(f, size, hi, path)
        f.seek(start)
        data = f.read(max(0, stop - start))
    return start, data


def parse_range(path, data: bytes, start: int, neurons: int):
    """(ids, cols, values) of a range's lines, 0-based; FormatError naming the file's own line."""
    try:
        tok = Tokens(data, path)
        if tok.count == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), tok
        tok.check_rows(3, tsv.LAYOUT)
        ids = check_indices(tok, tok.ints(slice(0, None, 3), "input id"), 0, 3, 1, None, "input")
        cols = check_indices(tok, tok.ints(slice(1, None, 3), "neuron index"), 1, 3, 1, neurons, "neuron",
                             f"network's {neurons} neurons")
        vals = tok.floats(slice(2, None, 3), "value")
        check_finite_entries(tok, vals, 2, 3)
        vals = cast_values(vals, np.float32, path, where=lambda k: tok.line_of(3 * k + 2))
        return ids, cols, vals, tok
    except FormatError as e:
        raise _in_file(e, path, start) from None


def _in_file(e: FormatError, path, start: int) -> FormatError:
    """The error with its line counted from the file's start (the range's lines were counted from 1)."""
    if e.line is None:
        return e
    f, _ = open_regular(path)
    with f:
        before, left = 0, start
        while left > 0:  # over blocks of the file before the range: only on the error path
            block = f.read(min(BLOCK, left))
            before += block.count(b"\n")
            left -= len(block)
    return FormatError(path, e.line + before, e.expected, e.found)


def range_rows(path, parsed, start_byte: int, lo: int, hi: int, neurons: int) -> sp.csr_matrix:
    """The range's entries as CSR rows lo..hi-1 (global, 0-based); entries past `hi` are left out
    (the inputs after COUNT)."""
    ids, cols, vals, tok = parsed
    keep = ids < hi
    rows = ids[keep] - lo
    try:
        return coo_to_csr(rows, cols[keep], vals[keep], (hi - lo, neurons),
                          duplicate=duplicate_reporter(tok, 3, ids[keep], cols[keep], 1), path=path)
    except FormatError as e:
        raise _in_file(e, path, start_byte) from None


def ascending(ids: np.ndarray) -> bool:
    return bool(ids.size < 2 or (np.diff(ids) >= 0).all())


def owned(firsts, total: int) -> list[int]:
    """Each rank's first owned input (0-based) and the end: rank r owns [edges[r], edges[r + 1]).
    firsts[r]: the first input in rank r's range, None for a rank whose range is empty."""
    p = len(firsts)
    edges = [0] * (p + 1)
    edges[p] = total
    for r in range(p - 1, 0, -1):  # over ranks, from the last
        edges[r] = min(firsts[r], total) if firsts[r] is not None else edges[r + 1]
    return edges


def equal_blocks(total: int, ranks: int) -> list[int]:
    return [total * r // ranks for r in range(ranks + 1)]


def read_inputs(path, neurons: int, comm, count: int | None = None, side: int | None = None) -> InputSlice:
    """This rank's inputs of `path` (distributed_io says how each format is shared out). count: the
    first COUNT inputs only. side: MNIST IDX images are made into challenge inputs of side x side."""
    from .. import graphchallenge as gc

    if side is not None:
        return collective(comm, _mnist_slice, path, side, count, comm)
    plain = collective(comm, is_plain_tsv, path)
    if plain:
        part = _tsv_slice(path, neurons, count, comm)
        if part is not None:
            return part
        how = "scattered from rank 0 (the inputs are not in ascending order)"
    else:
        how = "scattered from rank 0 (gzip'd or not TSV: not read from the middle)"
    whole = collective(comm, lambda: gc.read_inputs(path, neurons) if comm.rank == ROOT else None)
    if whole is not None and count is not None:
        whole = whole[:count]
    total = comm.bcast(whole.shape[0] if whole is not None else None, root=ROOT)
    edges = equal_blocks(total, comm.size)
    blocks = [whole[edges[r]:edges[r + 1]] for r in range(comm.size)] if whole is not None else None
    rows = comm.scatter(blocks, root=ROOT)
    return InputSlice(rows, edges[comm.rank], total, how)


def _tsv_slice(path, neurons: int, count, comm):
    """The rank's own byte range (None when the ranks' inputs are not in ascending order)."""
    def parse():
        start, data = read_range(path, comm.rank, comm.size)
        return start, start + len(data), parse_range(path, data, start, neurons)

    start, stop, parsed = collective(comm, parse)
    ids = parsed[0]
    ok = ascending(ids)
    shared = comm.allgather((ok, int(ids[0]) if ids.size else None, int(ids[-1]) if ids.size else None))
    firsts = [f for _, f, _ in shared]
    spans = [(f, l) for _, f, l in shared if f is not None]
    if not all(o for o, _, _ in shared) or any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
        return None
    largest = max((l for _, l in spans), default=-1) + 1
    total = largest if count is None else min(int(count), largest)
    edges = owned(firsts, total)
    lo, hi = edges[comm.rank], edges[comm.rank + 1]
    rows = collective(comm, range_rows, path, parsed, start, lo, hi, neurons)
    return InputSlice(rows, lo, total, f"read by each rank: bytes {start}-{stop} of {path} here")


def _mnist_slice(path, side: int, count, comm):
    from .. import graphchallenge as gc
    from ..io._files import Source
    from ..io.idx import _header

    with Source(path) as f:
        images = _header(f.read(16), path)[0]
    total = images if count is None else min(int(count), images)
    edges = equal_blocks(total, comm.size)
    lo, hi = edges[comm.rank], edges[comm.rank + 1]
    rows = gc.mnist_inputs(path, side=side, count=hi, start=lo)
    return InputSlice(rows, lo, total, "made by each rank from its block of MNIST images")
