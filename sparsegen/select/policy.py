"""Policy: which family serves a request where cost models decide (the tensor-core tile families,
dense cuBLAS, dense_tile_spmm). The families state what they can build (`gate`, `choose`, `offer`,
their bytes and reasons); these rules weigh them with the cost models on the request's device.

Every rule here reads the same `Costs` of its request: the skinny comparison (fp16/bf16) and the fp32
verdict are each computed once per request, whichever rules consult them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from ..families import dense_gemm, dense_tile_spmm, panel_spmm
from ..families import tiled_bitmap_spmm as bitmap
from ..families import tiled_csl_spmm as csl
from ..families import tiled_lanes_spmm as lanes
from ..families.base import Decision, Request, accept, decline
from . import fp32_cost, skinny_cost

# Where panel_spmm would serve a request at n <= 128 (>= 15 % density, <= 1024 rows, K >= 2048),
# dense_tile_spmm is taken whatever the fp32 model says: on all 74 DLMC matrices at n = 32 and 128
# (probes/spmm_sweep_dense_tile_vs_selection_narrow.txt) it ran 1.06-1.33x faster than panel_spmm in
# all 17 cases the rule had given panel_spmm (the CSR line under-predicted those by 4-38 %), and was
# the choice already in the other 23 of that region.
PANEL_NARROW_GAIN = "1.06-1.33x"
PANEL_NARROW_N = panel_spmm.NARROW_N  # up to this n


class Costs:
    """One request's cost-model answers, each computed at most once (on first use)."""

    def __init__(self, stats, request: Request):
        self.stats = stats
        self.request = request

    @functools.cached_property
    def skinny(self) -> skinny_cost.Comparison:
        return skinny_cost.compare(self.stats, self.request)

    @functools.cached_property
    def fp32(self) -> fp32_cost.Fp32Verdict:
        r = self.request
        return fp32_cost.judge(self.stats, r.n, r.device.rates, r.bias or r.relu)

    def contenders(self, family: str) -> tuple:
        """The compile options forcing each candidate worth timing where the skinny model picked
        `family` but cannot tell it from others (`Comparison.contenders`): () where it can, where it
        did not decide, or where the request forced a family."""
        if "skinny" not in self.__dict__ or self.request.option("family") is not None:
            return ()
        win = self.skinny.winner()
        if win is None or win.family != family:
            return ()
        return tuple(v for p in self.skinny.contenders() for v in self._variants(p.family))

    def _variants(self, family: str) -> tuple:
        """bitmap in both encodings unless the request fixes one; the other families as they are."""
        if family == bitmap.FAMILY and self.request.option("granule") is None:
            return tuple((("family", family), ("granule", g)) for g in (1, 2))
        return ((("family", family),),)


@dataclass(frozen=True)
class PolicyRule:
    """A named entry of the selection table that decides from the request's `Costs`."""

    name: str
    family: str
    decide: Callable  # (Costs) -> Decision


def skinny_verdict(comparison: skinny_cost.Comparison, family: str) -> tuple[bool, str]:
    """(accepted, reason): `family` only where it is the comparison's winner; the reason states the
    predictions, the margin over dense against the model's error, and the rates used."""
    win = comparison.winner()
    if win is None:
        return False, "no candidate serves this request"
    table = comparison.summary()
    if win.family != family:
        return False, f"{win.label} predicted faster: {table}"
    if family == skinny_cost.DENSE:
        sparse = comparison.best_sparse()
        head = (f"no sparse kernel predicted {comparison.margin(sparse):.0%} faster than dense: {table}" if sparse
                else f"dense is the only candidate: {table}")
    else:
        head = f"{win.label} predicted fastest: {table}"
    return True, f"{head}; {comparison.margin_text()}; {comparison.spread}"


# ---- the tensor-core tile families ------------------------------------------------------------

def tile_rule(costs: Costs, family, label: str, describe) -> Decision:
    """A tile family where the skinny model predicts it fastest (or when asked for by options family=);
    `describe(spec, why)` is the family's account of its spec."""
    stats, request = costs.stats, costs.request
    declined = family.gate(stats, request)
    if declined is not None:
        return declined
    if request.option("family") == family.FAMILY:
        spec, why = skinny_cost.build(stats, request, family.FAMILY)
        return accept(spec, f"{label} as asked; {describe(spec, why)}")
    ok, reason = skinny_verdict(costs.skinny, family.FAMILY)
    if not ok:
        return decline(reason)
    mine = costs.skinny.get(family.FAMILY)
    return accept(mine.spec, f"{reason}; {describe(mine.spec, mine.why)}")


def tiled_csl_rule(costs: Costs) -> Decision:
    """Tiled-CSL where the skinny model predicts it fastest (or when asked for by options family=)."""
    return tile_rule(costs, csl, "Tiled-CSL", lambda spec, why: why)


def tiled_bitmap_rule(costs: Costs) -> Decision:
    """bitmap where the skinny model predicts it fastest (or when asked for by options family=)."""
    return tile_rule(costs, bitmap, "bitmap",
                     lambda spec, why: bitmap.describe(costs.stats, costs.request, spec, why))


def tiled_lanes_rule(costs: Costs) -> Decision:
    """tiled lanes where the skinny model predicts it fastest, when the rates file holds its rates;
    under an older file only when asked for by options family= (its split-K then weighed with bitmap
    register pairs' main-loop time, the encoding whose bytes per register it shares)."""
    stats, request = costs.stats, costs.request
    describe = lambda spec, why: lanes.describe(stats, request, spec, why)  # noqa: E731
    if skinny_cost.calibrated(lanes.FAMILY, request.device.rates):
        return tile_rule(costs, lanes, "tiled lanes", describe)
    declined = lanes.gate(stats, request)
    if declined is not None:
        return declined
    if request.option("family") != lanes.FAMILY:
        return decline(f"not calibrated (no rates for it in {request.device.rates.label}): taken only when "
                       f"asked for, options family={lanes.FAMILY!r}")
    spec, why = skinny_cost.build(stats, request, lanes.FAMILY)
    return accept(spec, f"tiled lanes as asked; {describe(spec, why)}")


# ---- dense ------------------------------------------------------------------------------------

def dense_gemm_rule(costs: Costs) -> Decision:
    """cuBLAS on the densified W: fp16/bf16 where the skinny model picks dense, float32 where the fp32
    model predicts SGEMM well ahead of the CSR kernels (or when asked for by options family=)."""
    stats, request = costs.stats, costs.request
    declined = dense_gemm.gate(stats, request)
    if declined is not None:
        return declined
    if request.option("family") == dense_gemm.FAMILY:
        return accept(*dense_gemm.forced(stats, request))
    library = dense_gemm.find_library(request.dtype)
    if library is None:
        return decline(f"no cuBLAS binding: {dense_gemm.unavailable(request)}")
    if request.dtype == "float32":
        if not costs.fp32.dense:
            return decline(f"sparse kept: {costs.fp32.text}")
        reason = f"dense predicted faster: {costs.fp32.text}"
    else:
        ok, reason = skinny_verdict(costs.skinny, dense_gemm.FAMILY)
        if not ok:
            return decline(reason)
    return accept(dense_gemm.make_spec(stats, request, library),
                  f"{reason}; {dense_gemm.describe(stats, request, library)}")


def dense_tile_rule(costs: Costs) -> Decision:
    """dense_tile_spmm (float32 on tensor cores) where the fp32 model predicts it fastest, or where
    panel_spmm would serve a narrow request (PANEL_NARROW_N), or when asked for by options family=."""
    stats, request = costs.stats, costs.request
    offer = dense_tile_spmm.offer(stats, request)
    if not offer.accepted:
        return offer
    spec, reason = offer.spec, offer.reason
    if request.option("family") == dense_tile_spmm.FAMILY:
        return accept(spec, f"dense tiles as asked: {reason}")
    verdict = costs.fp32
    if verdict.pick != "tensor" and request.n <= PANEL_NARROW_N and panel_spmm.serves_by_default(stats, request):
        return accept(spec, f"tensor cores taken where panel_spmm would serve n <= {PANEL_NARROW_N} (the CSR "
                            f"line under-predicts it there: tensor cores measured {PANEL_NARROW_GAIN} faster on every "
                            f"such DLMC case); {verdict.text}; {reason}")
    if verdict.pick != "tensor":
        return decline(f"{verdict.pick} predicted faster: {verdict.text}")
    return accept(spec, f"tensor cores predicted fastest: {verdict.text}; {reason}")


# family -> its rules in the selection table
RULES = {
    bitmap.FAMILY: (PolicyRule("tiled_bitmap_spmm", bitmap.FAMILY, tiled_bitmap_rule),),
    csl.FAMILY: (PolicyRule("tiled_csl_spmm", csl.FAMILY, tiled_csl_rule),),
    lanes.FAMILY: (PolicyRule("tiled_lanes_spmm", lanes.FAMILY, tiled_lanes_rule),),
    dense_tile_spmm.FAMILY: (PolicyRule("dense_tile_spmm", dense_tile_spmm.FAMILY, dense_tile_rule),),
    dense_gemm.FAMILY: (PolicyRule("dense_gemm", dense_gemm.FAMILY, dense_gemm_rule),),
}
