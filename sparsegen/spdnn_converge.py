"""Converge: compute each distinct row once, and stop where the network has converged -- exactly.

Two facts make this exact rather than approximate:

- Identical rows have identical futures. A layer computes each row from that row alone, in an order
  the plan fixes, so two inputs whose fp32 rows are bitwise equal stay equal through every later
  layer. A deduplication pass keeps one representative per group of equal rows (equality is checked
  value by value, never by a hash alone), points the others at it, and adds their weights (how many
  inputs a representative stands for); at the end each input takes its root representative's fate
  and features.
- A layer that maps the all-cap row to itself, in the kernel's fp32 arithmetic, can be skipped for
  rows at the cap everywhere. `fixed_layers` proves it per layer from the weights and biases with a
  rounding-error bound that holds for any summation order; nothing is assumed.

The policy (when a pass runs, when layers are skipped) is the same on the GPU, where every decision
is taken on the device from what earlier launches wrote, and here, where `run` emulates it with
NumPy: both give the same per-layer table. docs/decisions/006-converge.md says why the rule is so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

MODES = ("auto", "off")

# Deduplication: a candidate pass follows every DEDUP_EVERY-th layer; it runs when at least two rows
# are left, a layer follows, and the back-off allows. A pass that removes a 1/DEDUP_PAYS share of its
# rows or more keeps the interval at DEDUP_EVERY; one that removes less doubles it, up to
# DEDUP_MAX_INTERVAL (docs/decisions/006-converge.md).
DEDUP_EVERY = 4
DEDUP_PAYS = 8
DEDUP_MAX_INTERVAL = 256
# how many layers the host may run ahead of the device while it watches for the converged tail
RUN_AHEAD = 8

# per-layer history fields, as the kernels write them (templates/spdnn_sliced_ell.cu.j2: H_*)
H_ROWS, H_KEPT, H_INPUTS, H_OFF = range(4)
H = 4
# per-candidate pass fields (P_*) and the gate's answers
P_WHY, P_ROWS, P_REMOVED, P_NEXT = range(4)
P = 4
WHY = {1: "ran", 2: "fewer than two rows", 3: "no layer left", 4: "back-off", 5: "layer skipped"}

U32 = 2.0 ** -24  # unit roundoff of fp32
U64 = 2.0 ** -53


@dataclass(frozen=True)
class Pass:
    """One deduplication candidate: after `layer` (0-based), over `rows` rows; whether it ran, why,
    how many rows it found to be copies of others, and (when it waited) the layer the back-off allowed."""

    layer: int
    ran: bool
    reason: str
    rows: int
    removed: int
    next_layer: int
    batch: int = 0

    def to_dict(self) -> dict:
        return {"layer": self.layer + 1, "ran": self.ran, "reason": self.reason, "rows": self.rows,
                "removed": self.removed, "batch": self.batch}


def check_mode(converge) -> str:
    if converge not in MODES:
        from .errors import ShapeError

        raise ShapeError(f"converge must be 'auto' or 'off', got {converge!r}")
    return converge


def is_candidate(layer: int, layers: int) -> bool:
    """Whether a deduplication pass may follow `layer` (0-based): the host launches those only."""
    return (layer + 1) % DEDUP_EVERY == 0 and layer + 1 < layers


def gate(layer: int, layers: int, count: int, next_pass: int) -> int:
    """The pass gate, as spdnn_dedup computes it (1: run; else the reason code of WHY)."""
    return 2 if count < 2 else 3 if layer + 1 >= layers else 4 if layer < next_pass else 1


def back_off(layer: int, rows: int, removed: int, interval: int) -> tuple[int, int]:
    """(interval, next pass layer) after a pass that ran, as spdnn_prune updates them."""
    interval = DEDUP_EVERY if removed * DEDUP_PAYS >= rows else min(2 * interval, DEDUP_MAX_INTERVAL)
    return interval, layer + interval


# --------------------------------------------------------------------------------------- fixed point

def fixed_layer(a: sp.csr_matrix, bias, cap: float | None, bias_rule: str) -> bool:
    """Whether the layer (A: rows = output neurons) maps the all-cap row to the all-cap row in the
    kernel's arithmetic, for every output neuron j, proven:

    the kernel computes acc_j as an fp32 fma chain over the row's k_j weights times cap, in some
    order (padding adds exact zeros), then z_j = fl(acc_j + b_j). Any order: |acc_j - cap·Σw| <=
    γ_k · cap · Σ|w| with γ_k = k·u / (1 - k·u), u = 2^-24. Rounding to nearest is monotone and
    fl(t) >= t·(1 - u) for t > 0, so z_j >= (cap·Σw - γ_k·cap·Σ|w| + b_j)(1 - u) =: z_lo. The neuron is
    fixed when z_lo >= cap (then min(max(z, 0), cap) = cap), and, under the "nonzero" bias rule, when
    acc_j > 0 (so the bias applies). The float64 arithmetic of this check is covered by a slack of
    16 float64 units of every magnitude involved."""
    if cap is None:
        return False
    c = float(np.float32(cap))
    if c <= 0:
        return False  # the all-cap row is the zero row: a dead row, dropped rather than skipped
    m = a.shape[0]
    k = np.diff(a.indptr).astype(np.float64)
    if m == 0:
        return True
    if k.max() * U32 >= 0.5:
        return False  # rows this long: the bound says nothing useful
    s, sa = _row_sums(a)
    b = np.broadcast_to(np.asarray(bias, np.float32).astype(np.float64), (m,))
    slack = 16 * U64 * (k + 2) * (c * sa + np.abs(b) + c)
    gamma = k * U32 / (1 - k * U32)
    acc_lo = c * s - gamma * c * sa - slack
    z_lo = (acc_lo + b) * (1 - U32) - slack
    ok = z_lo >= c
    if bias_rule == "nonzero":
        ok &= acc_lo > 0
    return bool(ok.all())


def _row_sums(a: sp.csr_matrix):
    """Each row's Σw and Σ|w| in float64 (reduceat over the row starts; an empty row sums to 0)."""
    m = a.shape[0]
    if not a.nnz:
        return np.zeros(m), np.zeros(m)
    w = a.data.astype(np.float64)
    starts = np.minimum(a.indptr[:-1], a.nnz - 1)
    empty = a.indptr[:-1] == a.indptr[1:]
    s = np.where(empty, 0.0, np.add.reduceat(w, starts))
    sa = np.where(empty, 0.0, np.add.reduceat(np.abs(w), starts))
    return s, sa


def fixed_from(fixed) -> int:
    """The first layer of the longest proven-fixed suffix (len(fixed) when the last layer is not)."""
    f = np.asarray(fixed, bool)
    bad = np.flatnonzero(~f)
    return int(bad[-1] + 1) if bad.size else 0


# ------------------------------------------------------------------------------------ emulated run

@dataclass
class Trace:
    """What a run records per batch: the history table (layers x H), the candidate passes (layers x P),
    the first skipped layer, the representatives left (slots) and each input's parent and weight."""

    history: np.ndarray
    passes: np.ndarray
    skip_from: int
    slots: np.ndarray
    parent: np.ndarray
    weight: np.ndarray


def run(layer, x: np.ndarray, layers: int, cap: float | None, fix_from: int, converge: bool):
    """Emulate the GPU driver's run over dense inputs `x`: `layer(l, y) -> z` computes layer l for the
    rows y. Returns (Trace, final rows of the representatives, in `Trace.slots` order)."""
    rows = x.shape[0]
    slots = np.arange(rows)
    parent, weight = np.arange(rows), np.ones(rows, np.int64)
    hist, passes = np.zeros((layers, H), np.int64), np.zeros((layers, P), np.int64)
    skip_from, next_pass, interval = layers, 0, DEDUP_EVERY
    y = x
    for l in range(layers):  # over layers
        count = slots.size
        if converge and l > 0 and (l >= skip_from or count == 0 or (l >= fix_from and hist[l - 1, H_OFF] == 0)):
            skip_from = min(skip_from, l)
            continue
        hist[l, H_ROWS] = count
        z = layer(l, y)
        keep = (z > 0).any(axis=1)
        off = (z != np.float32(cap)).any(axis=1) if cap is not None else np.ones(count, bool)
        if converge and is_candidate(l, layers):
            why = gate(l, layers, count, next_pass)
            passes[l] = (why, count, 0, next_pass)
            if why == 1:
                removed = _dedup(z, keep, slots, parent, weight)
                passes[l, P_REMOVED] = removed
                interval, next_pass = back_off(l, count, removed, interval)
        hist[l, H_KEPT] = keep.sum()
        hist[l, H_INPUTS] = weight[slots[keep]].sum()
        hist[l, H_OFF] = bool((off & keep).any())
        slots, y = slots[keep], z[keep]
    return Trace(hist, passes, skip_from, slots, parent, weight), y


def _dedup(z: np.ndarray, keep: np.ndarray, slots, parent, weight) -> int:
    """Merge the alive rows of z that are bitwise equal into the first of each group (in place:
    keep, parent, weight). Returns how many rows were merged."""
    idx = np.flatnonzero(keep)
    if idx.size < 2:
        return 0
    raw = np.ascontiguousarray(z[idx]).view(np.uint8).reshape(idx.size, -1)
    _, first, inverse = np.unique(raw, axis=0, return_index=True, return_inverse=True)
    rep = idx[first[inverse.ravel()]]
    dup = rep != idx
    src, dst = slots[idx[dup]], slots[rep[dup]]
    parent[src] = dst
    np.add.at(weight, dst, weight[src])
    keep[idx[dup]] = False
    return int(dup.sum())


# ------------------------------------------------------------------------------------------ results

def expand(trace: Trace, reps: np.ndarray, rows: int):
    """Each input's answer from its root representative: (ids ascending, features). `reps` are the
    final features of `trace.slots`, row for row."""
    root = trace.parent.copy()
    while True:  # pointer jumping: depth at most the number of passes
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    pos = np.full(rows, -1, np.int64)
    pos[trace.slots] = np.arange(trace.slots.size)
    ids = np.flatnonzero(pos[root] >= 0)
    return ids, reps[pos[root[ids]]]


def final_rows(trace: Trace, rows: np.ndarray, layers: int, width: int, cap) -> np.ndarray:
    """The representatives' final features: the rows as computed, or, when the run stopped at the
    proven fixed point, the all-cap row of the last layer's width."""
    if trace.skip_from < layers and trace.slots.size:
        return np.full((trace.slots.size, width), np.float32(cap), np.float32)
    return rows


def per_layer(traces, layers: int):
    """(alive inputs after each layer, distinct rows computed by each layer, skipped) over batches."""
    alive = np.zeros(layers, np.int64)
    distinct = np.zeros(layers, np.int64)
    skipped = np.ones(layers, bool)
    for t in traces:
        last = np.minimum(np.arange(layers), t.skip_from - 1)
        inputs = np.where(last >= 0, t.history[np.maximum(last, 0), H_INPUTS], 0)
        alive += inputs
        distinct += t.history[:, H_ROWS]
        skipped &= np.arange(layers) >= t.skip_from
    return tuple(int(a) for a in alive), tuple(int(d) for d in distinct), tuple(bool(s) for s in skipped)


def pass_records(traces) -> tuple:
    """The candidate passes each batch decided. Left out: those over a single row, which the
    converged tail (one launch for the last row's layers) does not make, and those of layers skipped
    on the way, which the host launches only until it sees the skip: so the records do not depend
    on how far the host ran ahead."""
    out = []
    for b, t in enumerate(traces):
        for l in np.flatnonzero((t.passes[:, P_WHY] > 0) & ~np.isin(t.passes[:, P_WHY], (2, 5))):
            why, rows, removed, nxt = (int(v) for v in t.passes[l])
            out.append(Pass(int(l), why == 1, WHY[why], rows, removed, nxt, b))
    return tuple(out)
