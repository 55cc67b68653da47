"""Selection on the default device (the H100 80GB HBM3 with its shipped rates) makes exactly the
picks pinned in tests/fixtures/h100_picks.jsonl.gz (tests/h100_picks.py says how they were made)."""
from __future__ import annotations

import gzip
import json

import pytest

from . import h100_picks
from .conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "h100_picks.jsonl.gz"


def pinned_rows() -> list:
    with gzip.open(FIXTURE, "rt") as f:
        return [json.loads(line) for line in f]


def test_the_default_device_makes_the_pinned_picks():
    pinned = [r for r in pinned_rows() if "compiled" not in r]
    now = h100_picks.pick_table()
    assert len(now) == len(pinned)
    for want, got in zip(pinned, now):
        assert (got["case"], got["request"], got["library"]) == (want["case"], want["request"], want["library"])
        assert got.get("error") == want.get("error"), want
        assert got.get("spec") == want.get("spec"), want
        assert got.get("accepted") == want.get("accepted"), want
        assert got.get("candidates") == want.get("candidates"), want
        assert got.get("predicted", {}).keys() == want.get("predicted", {}).keys(), want
        for family, seconds in want.get("predicted", {}).items():
            assert got["predicted"][family] == pytest.approx(seconds, rel=1e-9), (want, family)


def test_whole_compiles_on_the_default_device_build_the_pinned_specs():
    pinned = [r for r in pinned_rows() if "compiled" in r]
    assert [r["compiled"] for r in h100_picks.compiled_table()] == [r["compiled"] for r in pinned]
