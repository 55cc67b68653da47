"""The generator's fingerprint: what a cached plan, analysis or encoding was made by.

A plan caches generated source, so a change to the code that shapes a plan (not only a version
bump) must miss, and a change elsewhere (the CLI, the benchmarks, the readers) keeps the cache.
The plan, stats, format and tune cache keys all carry it.
"""
from __future__ import annotations

import functools
from pathlib import Path

from .cache import key
from .render import template_dir

# What shapes a plan: the stages from analysis to rendered source, the dtype table they read, and the
# rates selection reads.
PLAN_SOURCES = ("api.py", "analyze.py", "render.py", "dtypes.py", "families/*.py", "formats/*.py", "select/*.py",
                "select/rates/*.json")


@functools.lru_cache(maxsize=4)
def generator_fingerprint(package: Path | None = None, templates: Path | None = None) -> str:
    """sha256 of the templates and of the code that shapes a plan (PLAN_SOURCES)."""
    package = package or Path(__file__).resolve().parent
    files = sorted((templates or template_dir()).glob("*.j2"))
    files += sorted(f for pattern in PLAN_SOURCES for f in package.glob(pattern))
    return key(*(part for f in files for part in (f.relative_to(f.parent.parent).as_posix(), f.read_bytes())))
