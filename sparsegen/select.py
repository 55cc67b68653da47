"""Selection: an ordered table of named rules over `MatrixStats` and the request."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedError
from .families import RULES, spec_from_dict
from .families.base import KernelSpec, Request


@dataclass(frozen=True)
class Selection:
    """The chosen spec, why, the other rules that would have accepted, and every rule's answer."""

    spec: KernelSpec
    reason: str
    rule: str
    candidates: tuple = ()  # ((rule, spec, reason), ...) accepted by later rules
    tried: tuple = ()  # ((rule, accepted, reason), ...) in table order

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
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Selection":
        return cls(spec_from_dict(d["params"]), d["reason"], d["rule"],
                   tuple((c["rule"], spec_from_dict(c["params"]), c["reason"]) for c in d["candidates"]),
                   tuple((t["rule"], t["accepted"], t["reason"]) for t in d["tried"]))


def select_request(stats, request: Request, rules=RULES) -> Selection:
    """Run every rule in order; the first to accept wins, later acceptances become candidates.
    `options={"family": name}` in the request restricts the table to that family's rules."""
    tried, accepted = [], []
    only = request.option("family")
    if only is not None and only not in {rule.family for rule in rules}:
        raise UnsupportedError(f"options family={only!r}: no such kernel family "
                               f"(families: {', '.join(sorted({r.family for r in rules}))})")
    for rule in rules:
        if only is not None and rule.family != only:
            tried.append((rule.name, False, f"family {only!r} was requested"))
            continue
        decision = rule.decide(stats, request)
        tried.append((rule.name, decision.accepted, decision.reason))
        if decision.accepted:
            accepted.append((rule.name, decision.spec, decision.reason))
    if not accepted:
        declines = [(name, why) for name, _, why in tried]
        raise UnsupportedError(f"no kernel family accepts op={request.op} dtype={request.dtype}", declines)
    (rule, spec, reason), rest = accepted[0], accepted[1:]
    return Selection(spec, reason, rule, tuple(rest), tuple(tried))


def select(stats, op: str = "spmm", n: int | None = None, dtype: str = "float32", arch: str = "sm_90",
           **options) -> Selection:
    """Choose a kernel spec for a matrix (`MatrixStats`) and an operation."""
    return select_request(stats, Request(op=op, n=n, dtype=dtype, arch=arch, **options))
