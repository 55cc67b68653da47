"""The kernel families, in selection order. Adding a family: write its module (the contract is
`contract.py`), import it here and append it; its rules (or, for a family the cost models choose, its
policy in `select/policy.py`) join the selection table in this order (`select/table.py`).
Registration checks each module against the contract and fails on import, naming what is missing.

Options: each family's are its `Options` dataclass; `options={"family": name}`, the one option of the
request itself, restricts selection to that family. `normalize_options` checks a request's options
and puts them in the one form cache keys read; `check_taken` refuses options that the family serving
the request does not take (given without family=, they meant another family)."""
from __future__ import annotations

import dataclasses

from . import csr_rowsplit, spdnn_sliced_ell
from . import sputnik_spmm
from . import dense_tile_sddmm, dense_tile_spmm, sputnik_sddmm
from . import ell_coo_spmm
from . import tiled_bitmap_spmm, tiled_csl_spmm, tiled_lanes_spmm, dense_gemm
from . import panel_spmm
from ..errors import OptionsError
from .contract import Family, register
from .options import describe_names

# Ordered: the first rule that accepts wins; specialised families go before the baseline.
# fp16/bf16 spmm meets the skinny cost model first: the two tensor-core tile families and the dense
# cuBLAS fallback each accept only where predicted fastest, and all three decline (float32 at once)
# so the CSR families after them choose as before. tiled_lanes_spmm, not yet calibrated, accepts only
# when asked for by options family=.
ORDER: tuple[Family, ...] = tuple(register(m) for m in (
    spdnn_sliced_ell, tiled_bitmap_spmm, tiled_csl_spmm, tiled_lanes_spmm, dense_tile_spmm, dense_gemm,
    ell_coo_spmm, panel_spmm, sputnik_spmm, dense_tile_sddmm, sputnik_sddmm, csr_rowsplit))
FAMILIES = {fam.name: fam for fam in ORDER}


def family_of(spec) -> Family:
    return FAMILIES[spec.family]


def spec_from_dict(d: dict):
    """Rebuild a spec from `spec.to_dict()` (the plan cache stores specs this way)."""
    fam = FAMILIES[d["family"]]
    # Only the constructor's fields: `fields()` may add derived template variables (panel_spmm's record).
    names = {f.name for f in dataclasses.fields(fam.Spec) if f.init}
    return fam.Spec(**{k: v for k, v in d.items() if k in names})


REQUEST_OPTIONS = ("family",)  # options of the request itself, not of a family


def normalize_options(op: str, options) -> tuple:
    """The request's options in normal form: sorted (name, value) pairs, without those not given
    (None) or at their default, each value as its option holds it (equal options, one cache key).

    With family=NAME every other key must be an option of that family and take its value. Without, each
    key must be an option of a family that serves `op`, and one of those families must take its value
    (each family's rule then declines values it does not take). Else OptionsError names the key, and for
    an unknown key the valid ones."""
    given = {k: v for k, v in dict(options or {}).items() if v is not None}
    name = given.pop("family", None)
    if name is not None:
        fam = FAMILIES.get(name)
        if fam is None:  # the selection names the families there are
            return tuple(sorted({**given, "family": name}.items()))
        return tuple(sorted(fam.Options.from_dict(given, name).items() + (("family", name),)))
    serving = [f for f in ORDER if op in f.ops]
    takers = {k: [f for f in serving if k in f.Options.names()] for k in given}
    unknown = sorted(k for k, fams in takers.items() if not fams)
    if unknown:
        valid = sorted({n for f in serving for n in f.Options.names()} | set(REQUEST_OPTIONS))
        raise OptionsError(f"options {', '.join(unknown)}: no kernel family for op={op} takes such an option "
                           f"(options for {op}: {', '.join(valid)})")
    items = []
    for key, value in sorted(given.items()):
        value = _conform_for_any(key, value, takers[key])
        if any(value != f.Options.default(key) for f in takers[key]):
            items.append((key, value))
    return tuple(items)


def _conform_for_any(key: str, value, families: list) -> object:
    """`value` as the first of `families` that takes it holds it, or OptionsError with what each expects."""
    why = {}
    for fam in families:
        try:
            return fam.Options.conform(key, value)
        except OptionsError as exc:
            why.setdefault(str(exc), []).append(fam.name)
    raise OptionsError("; ".join(f"{text} ({', '.join(names)})" for text, names in why.items()))


def check_taken(fam: Family, request) -> None:
    """OptionsError where the request gives options that `fam`, chosen to serve it, does not take:
    given without family=, they were meant for another family, and would be ignored."""
    extra = [k for k, _ in request.options if k not in REQUEST_OPTIONS and k not in fam.Options.names()]
    if not extra:
        return
    takers = [f.name for f in ORDER if request.op in f.ops and set(extra) <= set(f.Options.names())]
    raise OptionsError(f"options {', '.join(extra)}: {fam.name}, selected for this request, takes no such option "
                       f"({describe_names(fam.Options.names())}); "
                       + (f"options family= chooses a family that does ({', '.join(takers)})" if takers
                          else "no one family takes all of them"))
