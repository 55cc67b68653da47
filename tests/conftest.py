"""The three test tiers (DESIGN.md): CPU (unmarked), `nvcc` (needs nvcc), `gpu` (needs a GPU + PyCUDA).

Tiers skip with a stated reason where their tool is absent. Every test session gets its own
cache directory, so tests never read or pollute a user's cache.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    if "SPARSEGEN_TEST_KEEP_CACHE" not in os.environ:
        os.environ["SPARSEGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="sparsegen-test-cache-")
    os.environ.pop("SPARSEGEN_DISABLE_CACHE", None)


def _nvcc_missing() -> str | None:
    from sparsegen import nvcc

    return None if nvcc.nvcc_path() else "nvcc not on PATH (set SPARSEGEN_NVCC)"


def _gpu_missing() -> str | None:
    from sparsegen import runtime

    if not runtime.available():
        return "no CUDA GPU with PyCUDA here: the GPU tier needs both (pip install -e \".[gpu]\" on a machine with a GPU)"
    return None


def pytest_collection_modifyitems(config, items):
    reasons = {}
    for item in items:
        for tier, probe in (("nvcc", _nvcc_missing), ("gpu", _gpu_missing)):
            if tier in item.keywords:
                if tier not in reasons:
                    reasons[tier] = probe()
                if reasons[tier]:
                    item.add_marker(pytest.mark.skip(reason=reasons[tier]))


def data_root() -> Path | None:
    env = os.environ.get("SPARSEGEN_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root if root.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = data_root()
    if root is None:
        pytest.skip("shared data not found (set SPARSEGEN_DATA or place it at ../shared/data)")
    return root


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return REPO / "examples" / "data"
