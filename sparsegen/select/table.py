"""The selection table: an ordered list of named rules over `MatrixStats` and the request.

The families' own rules (structural: row lengths, footprints, options) and the policy rules of
`policy.py` (the cost models' choices) stand in the families' order (`families.ORDER`); the first
that accepts wins, and the others that accept become candidates for `tune=True`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedError
from ..families import ORDER, spec_from_dict
from ..families.base import KernelSpec, Request, Rule
from . import policy

RULES = tuple(rule for fam in ORDER for rule in policy.RULES.get(fam.name, fam.rules))


@dataclass(frozen=True)
class Selection:
    """The chosen spec, why, the other rules that would have accepted, and every rule's answer."""

    spec: KernelSpec
    reason: str
    rule: str
    candidates: tuple = ()  # ((rule, spec, reason), ...) accepted by later rules
    tried: tuple = ()  # ((rule, accepted, reason), ...) in table order
    # compile options forcing each candidate the cost model cannot tell from the chosen one, which the
    # GPU times (`policy.Costs.contenders`); empty where the model's choice stands alone
    contenders: tuple = ()

    def to_dict(self) -> dict:
        return {
            "family": self.spec.family,
            "spec": self.spec.name,
            "rule": self.rule,
            "reason": self.reason,
            "params": self.spec.to_dict(),
            "candidates": [{"rule": r, "spec": s.name, "reason": why, "params": s.to_dict()}
                           for r, s, why in self.candidates],
            "tried": [{"rule": r, "accepted": ok, "reason": why} for r, ok, why in self.tried],
            "contenders": [dict(c) for c in self.contenders],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Selection":
        return cls(spec_from_dict(d["params"]), d["reason"], d["rule"],
                   tuple((c["rule"], spec_from_dict(c["params"]), c["reason"]) for c in d["candidates"]),
                   tuple((t["rule"], t["accepted"], t["reason"]) for t in d["tried"]),
                   tuple(tuple(sorted(c.items())) for c in d.get("contenders", ())))


def decide(rule, stats, request: Request, costs: policy.Costs):
    """One rule's Decision: a family's rule reads the matrix and request, a policy rule their costs."""
    if isinstance(rule, Rule):
        return rule.decide(stats, request)
    return rule.decide(costs)


def rule_decision(stats, request: Request, family: str):
    """The Decision of `family`'s first rule alone (tests and probes ask one family)."""
    rule = next(r for r in RULES if r.family == family)
    return decide(rule, stats, request, policy.Costs(stats, request))


def select_request(stats, request: Request, rules=RULES) -> Selection:
    """Run every rule in order; the first to accept wins, later acceptances become candidates.
    `options={"family": name}` in the request restricts the table to that family's rules. The cost
    models run once for the request, whichever rules consult them."""
    tried, accepted = [], []
    only = request.option("family")
    if only is not None and only not in {rule.family for rule in rules}:
        raise UnsupportedError(f"options family={only!r}: no such kernel family "
                               f"(families: {', '.join(sorted({r.family for r in rules}))})")
    costs = policy.Costs(stats, request)
    for rule in rules:
        if only is not None and rule.family != only:
            tried.append((rule.name, False, f"family {only!r} was requested"))
            continue
        decision = decide(rule, stats, request, costs)
        tried.append((rule.name, decision.accepted, decision.reason))
        if decision.accepted:
            accepted.append((rule.name, decision.spec, decision.reason))
    if not accepted:
        declines = [(name, why) for name, _, why in tried]
        raise UnsupportedError(f"no kernel family accepts op={request.op} dtype={request.dtype}", declines)
    (rule, spec, reason), rest = accepted[0], accepted[1:]
    return Selection(spec, reason, rule, tuple(rest), tuple(tried), costs.contenders(spec.family))


def select(stats, op: str = "spmm", n: int | None = None, dtype: str = "float32", arch: str = "sm_90",
           **options) -> Selection:
    """Choose a kernel spec for a matrix (`MatrixStats`) and an operation; `options` are the
    request's other fields (k, bias, relu, options, device: a `DeviceModel`, default the default
    device)."""
    return select_request(stats, Request(op=op, n=n, dtype=dtype, arch=arch, **options))
