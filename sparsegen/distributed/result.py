"""What a run over MPI ranks returns."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spdnn import Result


@dataclass(frozen=True)
class DistributedResult(Result):
    """Result of a run over MPI ranks. On rank 0: ids (global, 0-based, ascending), categories and,
    when asked for, features (else None); elsewhere empty ids. On every rank: the per-layer tables
    summed over ranks, `ranks` (one row per rank: its inputs, survivors, rows computed and moved,
    times) and `boundaries` (the rebalancing rule's decision at each). timings_ms["inference"] is
    the slowest rank's time, as the challenge counts it."""

    ranks: tuple = ()
    boundaries: tuple = ()
    size: int = 1
    rebalance: str = "off"
    library: str = ""

    @property
    def rows_moved(self) -> int:
        return int(sum(r["rows_sent"] for r in self.ranks))

    def imbalance(self, key: str = "rows_computed") -> float:
        """max / mean over ranks of `key` (1.0: even)."""
        values = np.array([r[key] for r in self.ranks], np.float64)
        return float(values.max() / values.mean()) if values.size and values.mean() > 0 else 1.0

    def summary(self) -> str:
        moves = sum(1 for b in self.boundaries if b["move"])
        line = super().summary() + f"; {self.size} ranks, {moves} rebalancing(s) moved {self.rows_moved} rows"
        if self.ranks:
            slowest = max(self.ranks, key=lambda r: r["time_ms"])
            line += (f"; slowest rank {slowest['rank']} ({slowest['time_ms']:.3f} ms); row-layers per rank "
                     f"max/mean {self.imbalance():.2f}")
        return line

    def per_rank(self) -> list[dict]:
        return [dict(r) for r in self.ranks]
