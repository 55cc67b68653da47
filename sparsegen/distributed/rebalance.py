"""When the surviving rows of a distributed sparse network move between ranks, and where to.

A run over P ranks stops at boundaries (after layers first, 2·first, 4·first, ...), where the ranks
share how many rows each holds and what the segment just run cost. Every rank evaluates `decide` on
the same shared numbers, so all take the same decision without another message. The rule, in the
units it measures (docs/decisions/007-rebalance.md says why it is so):

    t       seconds per row-layer: the segment's compute time over the row-layers it computed, pooled
            over ranks
    R       layers left after the boundary
    saving  (max_r rows_r - max_r target_r) · R · t: the slowest rank's excess, computed R more times
    cost    moved · (width · 4 + 8) / bandwidth + latency · (messages + 1): the rows and their ids, host-staged
    move    when max rows > threshold · mean rows and saving > margin · cost ("always": past the threshold)

The next boundary is kept while the largest saving it could bring, max_r rows_r · (1 - 1/P) · (layers
after it) · t, exceeds margin · (what this boundary cost);
otherwise the rest of the network runs as one segment. What a boundary costs: the slowest rank's
staging (its rows to the host and back: the segment's wall time less its compute time) and the
exchange of these numbers (latency · P).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import SparsegenError

MODES = ("auto", "always", "off")


@dataclass(frozen=True)
class RebalanceRule:
    """The rule's parameters. mode: "off" (the default: never stop between layers, each rank runs its
    rows through the whole network, as the 2020 code did), "auto" (stop at the boundaries, move when
    the predicted saving pays for the move), "always" (move whenever the imbalance passes the
    threshold; for tests and measurements). Off is the default because a boundary stages the alive
    rows through host memory, which costs more than rebalancing inputs in random order saves
    (docs/decisions/007-rebalance.md).
    bandwidth (bytes/s) and latency (s) describe the slowest hop of a moved row: device to host, the
    interconnect, host to device."""

    mode: str = "off"
    threshold: float = 1.10
    margin: float = 2.0
    bandwidth: float = 10e9
    latency: float = 20e-6
    first: int = 4

    def __post_init__(self):
        if self.mode not in MODES:
            raise SparsegenError(f"rebalance mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not self.threshold >= 1.0 or not self.margin > 0 or not self.bandwidth > 0 or not self.latency >= 0:
            raise SparsegenError(f"rebalance rule: expected threshold >= 1, margin > 0, bandwidth > 0, latency "
                                 f">= 0; got {self.threshold}, {self.margin}, {self.bandwidth}, {self.latency}")
        if int(self.first) != self.first or self.first < 1:
            raise SparsegenError(f"rebalance rule: the first boundary must be a layer count >= 1, not {self.first!r}")

    def boundaries(self, layers: int, ranks: int) -> list[int]:
        """The layers after which the run may stop: first, 2·first, ... below `layers` (none with
        mode "off" or a single rank)."""
        if self.mode == "off" or ranks < 2:
            return []
        out, b = [], int(self.first)
        while b < layers:
            out.append(b)
            b *= 2
        return out


@dataclass(frozen=True)
class Boundary:
    """What one rank tells the others at a boundary: rows it holds, their width, and the segment just
    run (seconds computing, row-layers computed, seconds staging the rows to and from the device)."""

    rows: int
    width: int
    compute_s: float
    row_layers: int
    staging_s: float


@dataclass(frozen=True)
class Decision:
    """The rule's answer at the boundary after `layer` (1-based count of layers done)."""

    layer: int
    rows: tuple
    targets: tuple
    moved: int
    saving_s: float
    cost_s: float
    move: bool
    go_on: bool
    reason: str
    transfers: np.ndarray = field(repr=False, compare=False, default=None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("transfers")
        d["rows"], d["targets"] = list(self.rows), list(self.targets)
        d["saving_ms"], d["cost_ms"] = 1e3 * d.pop("saving_s"), 1e3 * d.pop("cost_s")
        return d


def plan(rows) -> tuple[np.ndarray, np.ndarray]:
    """(targets, transfers): balanced row counts (the remainder's extra rows go to the ranks holding
    the most, so fewer move) and the P x P matrix of rows rank i sends rank j. Only the excess moves:
    ranks over their target send, ranks under it receive, each surplus matched in rank order."""
    rows = np.asarray(rows, np.int64)
    p, total = rows.size, int(rows.sum())
    targets = np.full(p, total // p, np.int64)
    targets[np.argsort(-rows, kind="stable")[:total % p]] += 1
    transfers = np.zeros((p, p), np.int64)
    give, take = np.maximum(rows - targets, 0), np.maximum(targets - rows, 0)
    i = j = 0
    while i < p and j < p:  # over ranks (two pointers), never over rows
        if give[i] == 0:
            i += 1
        elif take[j] == 0:
            j += 1
        else:
            n = min(give[i], take[j])
            transfers[i, j] += n
            give[i] -= n
            take[j] -= n
    return targets, transfers


def decide(layer: int, layers: int, shared, rule: RebalanceRule, next_layer: int | None = None) -> Decision:
    """The rule at the boundary after `layer` of `layers`, from every rank's Boundary (`shared`, in rank
    order: every rank decides alike from the same numbers); next_layer: the next boundary, if any."""
    rows = np.array([b.rows for b in shared], np.int64)
    p = rows.size
    targets, transfers = plan(rows)
    moved = int(transfers.sum())
    work = sum(b.row_layers for b in shared)
    t = sum(b.compute_s for b in shared) / work if work else 0.0
    left = layers - layer
    saving = float(rows.max() - targets.max()) * left * t if p else 0.0
    width = max((b.width for b in shared), default=0)
    cost = moved * (4 * width + 8) / rule.bandwidth + rule.latency * (int((transfers > 0).sum()) + 1)
    mean = rows.mean() if p else 0.0
    uneven = p > 1 and rows.max() > rule.threshold * mean and moved > 0
    if rule.mode == "always":
        move = uneven
        reason = (f"max {rows.max()} rows > {rule.threshold:g} x mean {mean:.1f}" if move
                  else f"max {rows.max()} rows within {rule.threshold:g} x mean {mean:.1f}")
    else:
        move = uneven and saving > rule.margin * cost
        reason = (f"max {rows.max()} rows within {rule.threshold:g} x mean {mean:.1f}" if not uneven else
                  f"saving {1e3 * saving:.3g} ms {'>' if move else '<='} {rule.margin:g} x cost {1e3 * cost:.3g} ms")
    go_on = next_layer is not None and next_layer < layers
    if go_on and rule.mode == "auto":
        boundary_s = max(b.staging_s for b in shared) + rule.latency * p  # staging, and this exchange
        bound = float(rows.max()) * (1 - 1 / p) * (layers - next_layer) * t
        go_on = bound > rule.margin * boundary_s
        if not go_on:
            reason += (f"; no further boundary (at most {1e3 * bound:.3g} ms to save, a boundary costs "
                       f"{1e3 * boundary_s:.3g} ms)")
    move, go_on = bool(move), bool(go_on)
    return Decision(layer, tuple(int(r) for r in rows), tuple(int(r) for r in targets), moved if move else 0,
                    saving, cost, move, go_on, reason, transfers if move else None)
