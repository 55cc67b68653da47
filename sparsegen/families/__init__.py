"""The kernel families, in selection order. Adding a family: write its module (the contract is
`contract.py`), import it here and append it; its rules (or, for a family the cost models choose, its
policy in `select/policy.py`) join the selection table in this order (`select/table.py`).
Registration checks each module against the contract and fails on import, naming what is missing."""
from __future__ import annotations

import dataclasses

from . import csr_rowsplit, spdnn_sliced_ell
from . import sputnik_spmm
from . import dense_tile_sddmm, dense_tile_spmm, sputnik_sddmm
from . import ell_coo_spmm
from . import tiled_bitmap_spmm, tiled_csl_spmm, dense_gemm
from . import panel_spmm
from .contract import Family, register

# Ordered: the first rule that accepts wins; specialised families go before the baseline.
# fp16/bf16 spmm meets the skinny cost model first: the two tensor-core tile families and the dense
# cuBLAS fallback each accept only where predicted fastest, and all three decline (float32 at once)
# so the CSR families after them choose as before.
ORDER: tuple[Family, ...] = tuple(register(m) for m in (
    spdnn_sliced_ell, tiled_bitmap_spmm, tiled_csl_spmm, dense_tile_spmm, dense_gemm, ell_coo_spmm, panel_spmm,
    sputnik_spmm, dense_tile_sddmm, sputnik_sddmm, csr_rowsplit))
FAMILIES = {fam.name: fam for fam in ORDER}


def family_of(spec) -> Family:
    return FAMILIES[spec.family]


def spec_from_dict(d: dict):
    """Rebuild a spec from `spec.to_dict()` (the plan cache stores specs this way)."""
    fam = FAMILIES[d["family"]]
    # Only the constructor's fields: `fields()` may add derived template variables (panel_spmm's record).
    names = {f.name for f in dataclasses.fields(fam.Spec) if f.init}
    return fam.Spec(**{k: v for k, v in d.items() if k in names})
