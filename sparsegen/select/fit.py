"""Fitting the cost models to measured times (what `sparsegen calibrate` and the lab's refits run).

- `fit_tile_rates(rows, start)`: the per-tile rates of one tile family (`TileRates`) that minimise
  the squared log error of `skinny_cost.spec_seconds` against the measured times of the specs that
  ran (bounded least squares from `start`; `free` names the rates to fit, "scale" fits one factor
  on the cycles of `start`, for few rows).
- `fit_line(work, seconds)`: a fixed time plus work at a rate (cuBLAS's bytes, a GEMM's flops).
- `ratio_error(pairs)`: the error of the model's sparse / dense ratio, the margin a sparse pick must
  clear over dense (docs/decisions/002-dense-margin.md).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import skinny_cost
from .ratesfile import TileRates

TILE_FIELDS = ("base", "per_column", "per_nonzero", "fixed_s", "wide", "n16")
CYCLE_FIELDS = ("base", "per_column", "per_nonzero")
ERROR_QUANTILE = 0.9  # the quantile of |log error| a margin covers


@dataclass(frozen=True)
class Row:
    """One measured tile kernel: the matrix's stats, the request it was compiled for (its device is
    the one the rates are fitted for), the spec that ran, and its measured seconds."""

    stats: object
    request: object
    spec: object
    seconds: float


@dataclass(frozen=True)
class Fit:
    rates: TileRates
    rows: int
    median_error: float  # |predicted / measured - 1|
    max_error: float
    log_error: float  # ERROR_QUANTILE of |log(predicted / measured)|

    @property
    def text(self) -> str:
        return (f"{self.rows} rows, median error {self.median_error:.1%}, at most {self.max_error:.1%}, "
                f"{ERROR_QUANTILE:.0%} of them within {np.expm1(self.log_error):.1%}")


def predict(rows, rates: TileRates) -> np.ndarray:
    return np.array([skinny_cost.spec_seconds(r.stats, r.request, r.spec, rates) for r in rows])


def quality(rows, rates: TileRates) -> Fit:
    logs = np.log(predict(rows, rates) / np.array([r.seconds for r in rows]))
    rel = np.abs(np.expm1(logs))
    return Fit(rates, len(rows), float(np.median(rel)), float(rel.max()),
               float(np.quantile(np.abs(logs), ERROR_QUANTILE)))


def _vector(rates: TileRates, free) -> np.ndarray:
    return np.array([getattr(rates, f) * (1e6 if f == "fixed_s" else 1.0) for f in free])


def _rates(start: TileRates, free, x) -> TileRates:
    return dataclasses.replace(start, **{f: float(v) * (1e-6 if f == "fixed_s" else 1.0) for f, v in zip(free, x)})


def fit_tile_rates(rows, start: TileRates, free=TILE_FIELDS) -> Fit:
    """The rates of `free` (fields of TileRates, or "scale") that best predict `rows` (all of one
    rates key), the others as in `start`: least squares on log time, every rate >= 0."""
    from scipy.optimize import least_squares

    rows = list(rows)
    measured = np.log(np.array([r.seconds for r in rows]))
    if free == "scale":
        def make(x):
            return dataclasses.replace(start, **{f: getattr(start, f) * float(x[0]) for f in CYCLE_FIELDS})
        x0 = np.array([1.0])
    else:
        free = tuple(free)

        def make(x):
            return _rates(start, free, x)
        x0 = _vector(start, free)

    def residuals(x):
        return np.log(predict(rows, make(x))) - measured

    result = least_squares(residuals, x0, bounds=(0.0, np.inf), x_scale=np.maximum(np.abs(x0), 1e-3),
                           diff_step=1e-4)
    return quality(rows, make(result.x))


def fit_line(work, seconds) -> tuple[float, float, float]:
    """(fixed seconds, work per second, median |error|) of seconds = fixed + work / rate, least
    squares on log time, both terms >= 0."""
    from scipy.optimize import least_squares

    work, seconds = np.asarray(work, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    rate0 = float(np.median(work / seconds))
    x0 = np.array([float(seconds.min()) * 0.1 * 1e6, 1.0])  # fixed in us, rate in units of rate0

    def residuals(x):
        return np.log(x[0] * 1e-6 + work / (x[1] * rate0)) - np.log(seconds)

    result = least_squares(residuals, x0, bounds=([0.0, 1e-6], np.inf))
    fixed, rate = result.x[0] * 1e-6, result.x[1] * rate0
    return fixed, rate, float(np.median(np.abs(np.expm1(residuals(result.x)))))


def fit_terms(columns, seconds, positive=()) -> tuple[np.ndarray, float]:
    """(coefficients, median |error|) of seconds = sum(c_i * columns[i]), least squares on log time,
    every c_i >= 0 and those indexed in `positive` > 0."""
    from scipy.optimize import least_squares

    seconds = np.asarray(seconds, dtype=np.float64)
    a = np.column_stack([np.broadcast_to(np.asarray(c, dtype=np.float64), seconds.shape) for c in columns])
    # each term starts as an equal share of the median time, so the solver works near 1
    scale = np.median(seconds) / len(columns) / np.maximum(np.median(np.abs(a), axis=0), 1e-300)
    lower = np.array([1e-6 if i in positive else 0.0 for i in range(a.shape[1])])

    def residuals(x):
        return np.log(np.maximum(a @ (x * scale), 1e-300)) - np.log(seconds)

    result = least_squares(residuals, np.ones(a.shape[1]), bounds=(lower, np.inf))
    return result.x * scale, float(np.median(np.abs(np.expm1(residuals(result.x)))))


def ratio_error(pairs) -> float:
    """The ERROR_QUANTILE of |log(predicted ratio / measured ratio)| over (predicted sparse, predicted
    dense, measured sparse, measured dense) seconds, as a fraction: how far the model's sparse /
    dense ratio may be off."""
    p = np.array(pairs, dtype=np.float64).reshape(-1, 4)
    logs = np.log(p[:, 0] / p[:, 1]) - np.log(p[:, 2] / p[:, 3])
    return float(np.expm1(np.quantile(np.abs(logs), ERROR_QUANTILE)))
