"""Selection: policy over the kernel families, on a model of the GPU.

    table.py        the ordered rule table: `select_request`, `select`, `Selection`
    policy.py       the rules the cost models decide, one `Costs` per request
    skinny_cost.py  fp16/bf16 SpMM: the tile families, dense cuBLAS, the CSR kernels
    fp32_cost.py    float32 SpMM: the CSR kernels, SGEMM, tensor cores
    device.py       `DeviceModel`: what the GPU reports, and its rates
    ratesfile.py    `Rates`: a rates file (rates/*.json ships the measured ones)
    fit.py          fitting tile rates to measured times (`sparsegen calibrate`)

The families import the device model (a request carries one), so this package's own import loads
only the device model and the rates; the table (which imports the families) loads on first use of
`Selection`, `select` or `select_request`.
"""
from __future__ import annotations

from .device import DeviceModel
from .ratesfile import Rates, TileRates

_TABLE = ("Selection", "select", "select_request", "rule_decision", "RULES")
__all__ = ["DeviceModel", "Rates", "TileRates", *_TABLE]


def __getattr__(name):
    if name in _TABLE:
        from . import table

        return getattr(table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
