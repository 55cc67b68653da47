"""Compiling ahead: worker processes build the coming cases' kernels while the GPU measures.

Encoding a large matrix is CPU work that can dwarf its GPU time, so a suite may hand its coming
cases to a `Prefetcher`: one job per matrix (all its cases), run in a process pool into a scratch
cache folder per matrix, where the measuring process's own `sparsegen.compile` then finds plans,
encodings and cubins warm (`cache_dir` points sparsegen's cache there). A job marks each case as
it finishes it (`mark_done`), so the measurement of a matrix's first case starts while the job
compiles the rest. Jobs start in run order
within memory and disk budgets; a folder is removed once the matrix's last case is released, so
large encodings never pile up on disk. A dead pool (a worker killed, e.g. out of memory) turns
prefetching off and the run says so.

The mechanism is generic; a suite subclasses `Prefetcher` and says what a job is
(`folder_of(root, case)`, `memory_of(case)`, `disk_of(case)`, `default_job`). Cases need a `key`.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from sparsegen.bench.records import message

__all__ = ["Job", "Prefetcher", "cache_dir", "clear_stale", "compile_ahead", "scratch_root", "default_workers",
           "mark_done", "marked"]

POLL_S = 0.05  # how often `take` looks for a case's mark while its matrix's job runs


@dataclass(frozen=True)
class Job:
    """What a worker compiles: every case of one matrix, into `cache_dir`, in run order, so the later
    cases find the matrix's analysis and encodings in the format cache."""
    cases: tuple
    arch: str | None
    cache_dir: str
    cubin: bool = True
    device: object = None  # the measuring process's DeviceModel: selection plans for it here too


def _mark(folder, key) -> Path:
    """Where a job says that one case of its matrix is compiled (beside the cache's own folders,
    which it never lists)."""
    return Path(folder) / f".ahead-{zlib.crc32(repr(key).encode()):08x}.json"


def mark_done(folder, key, result: dict) -> None:
    """Worker side: the case `key` is compiled, with `result`: the measuring process may take it
    while the job goes on to the matrix's other cases. Written whole (a rename), never half."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-ahead-")
    with os.fdopen(fd, "w") as f:
        json.dump({"key": repr(key), "result": result}, f)
    os.replace(tmp, _mark(folder, key))


def marked(folder, key) -> dict | None:
    """The result a job marked for `key` in `folder` (`mark_done`), or None: not yet, or unreadable."""
    try:
        doc = json.loads(_mark(folder, key).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("result") if doc.get("key") == repr(key) else None


@contextlib.contextmanager
def cache_dir(path):
    """Point sparsegen's cache at `path` (None: leave it) for the duration."""
    from sparsegen.cache import ENV_DIR

    if path is None:
        yield
        return
    old = os.environ.get(ENV_DIR)
    os.environ[ENV_DIR] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_DIR, None)
        else:
            os.environ[ENV_DIR] = old



def _available_memory() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 16e9


class Prefetcher:
    """Compiles the coming matrices in worker processes (one job per matrix: all its cases), in run
    order, within memory and disk budgets (a job is always admitted when nothing else runs);
    `take` waits for a case's job, `release` removes the matrix's folder once all its cases are
    released. A dead pool (a worker killed, e.g. out of memory) turns prefetching off: the
    measuring process then compiles cold, and the run says so.

    A suite's subclass defines `folder_of(root, case)` (the cases of one matrix share a folder),
    `memory_of(case)` and `disk_of(case)` (a job's peak host bytes and the cache bytes it leaves) and
    `default_job` (a module-level function of a `Job`, run in the worker)."""

    @staticmethod
    def folder_of(root, case) -> Path:
        raise NotImplementedError

    @staticmethod
    def memory_of(case) -> float:
        raise NotImplementedError

    @staticmethod
    def disk_of(case) -> float:
        raise NotImplementedError

    default_job = None

    def __init__(self, cases, root, arch, workers: int, *, pool=None, memory=None, disk=None,
                 job_fn=None, cubin=True, device=None):
        self.root = Path(root)
        groups: dict = {}
        for case in cases:  # run order: a matrix's cases are consecutive
            groups.setdefault(self.folder_of(self.root, case), []).append(case)
        self.queue = [tuple(g) for g in groups.values()]
        self.arch = arch
        self.device = device
        self.workers = max(1, int(workers))
        self.memory = 0.6 * _available_memory() if memory is None else memory
        self.root.mkdir(parents=True, exist_ok=True)
        self.disk = 0.5 * shutil.disk_usage(self.root).free if disk is None else disk
        self.job_fn = job_fn or type(self).default_job
        self.cubin = cubin
        self.jobs: dict = {}            # folder -> (future, cases, keys not yet released)
        self.note = None
        self.stats = {"submitted": 0, "completed": 0, "failed": 0, "seconds": 0.0}
        if pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: workers must not inherit the parent's CUDA context
            pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        self.pool = pool
        self._fill()

    def _fill(self):
        if self.note is not None:
            return
        while self.queue:
            running = [cs[0] for f, cs, _ in self.jobs.values() if not f.done()]
            if len(running) >= self.workers or len(self.jobs) >= 2 * self.workers:
                return
            cases = self.queue[0]
            if running and sum(map(self.memory_of, running)) + self.memory_of(cases[0]) > self.memory:
                return
            if self.jobs and sum(self.disk_of(cs[0]) for _, cs, _ in self.jobs.values()) + self.disk_of(cases[0]) > self.disk:
                return
            self.queue.pop(0)
            folder = self.folder_of(self.root, cases[0])
            job = Job(cases, self.arch, str(folder), self.cubin, self.device)
            try:
                self.jobs[folder] = (self.pool.submit(self.job_fn, job), cases, {c.key for c in cases})
            except Exception as exc:  # a broken pool refuses new work
                self._broken(exc)
                return
            self.stats["submitted"] += 1

    def _broken(self, exc):
        self.note = f"compiling ahead stopped ({message(exc)}); the rest compiled in-process"

    def take(self, case):
        """Wait for the case's part of its matrix's job (the job's mark for it, or the whole job);
        the case's result dict, or None (never submitted, or failed)."""
        self._fill()
        folder = self.folder_of(self.root, case)
        entry = self.jobs.get(folder)
        if entry is None or self.note is not None:  # after a broken pool every job is lost
            return None
        try:
            res = None
            while not entry[0].done() and res is None:
                res = marked(folder, case.key)
                if res is None:
                    self._fill()
                    time.sleep(POLL_S)
            if res is None:
                res = entry[0].result().get(case.key)
            if res is not None:
                self.stats["completed"] += 1
                self.stats["seconds"] += res.get("seconds", 0.0)
            return res
        except Exception as exc:
            self.stats["failed"] += 1
            from concurrent.futures.process import BrokenProcessPool

            if isinstance(exc, BrokenProcessPool):
                self._broken(exc)
            return None
        finally:
            self._fill()  # the next jobs compile while this case is measured

    def release(self, case):
        folder = self.folder_of(self.root, case)
        entry = self.jobs.get(folder)
        if entry is not None:
            entry[2].discard(case.key)
            if entry[2]:  # the matrix's other cases still to measure
                return
            self.jobs.pop(folder)
            entry[0].cancel()
        shutil.rmtree(folder, ignore_errors=True)
        self._fill()

    def close(self):
        self.queue = []
        for fut, _, _ in self.jobs.values():
            fut.cancel()
        pool, self.pool = self.pool, None
        if pool is not None:
            kill = getattr(pool, "terminate_workers", None)  # Python >= 3.14
            if kill is not None:
                kill()
            else:  # a running job of a large W would otherwise hold the exit for minutes
                for p in list((getattr(pool, "_processes", None) or {}).values()):
                    with contextlib.suppress(Exception):
                        p.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
        for folder in list(self.jobs):
            self.jobs.pop(folder)
            shutil.rmtree(folder, ignore_errors=True)

    def summary(self) -> dict:
        return {"workers": self.workers, **self.stats, "seconds": round(self.stats["seconds"], 1),
                "note": self.note}


def compile_ahead(A, request: dict, families, job: Job) -> dict:
    """Worker side of one case: the default selection, the contenders the GPU will time for it
    (`selection.contenders`) and each of `families` forced, compiled with backend "emulate" for the
    measuring GPU's arch and device model (cubins too, when `job.cubin`), so that the measuring
    process's compile() finds them cached: {"errors", "specs"} by name ("sparsegen", a family, or a
    contender's options). A family that declines or fails is recorded; the measuring process meets
    it again and reports it."""
    import sparsegen

    out = {"errors": {}, "specs": {}}

    def one(name, options):
        try:
            k = sparsegen.compile(A, arch=job.arch, backend="emulate", options=options, device=job.device,
                                  **request)
            if job.cubin:
                k.cubin  # noqa: B018 - compiles and caches it
            out["specs"][name] = k.spec.name
            return k
        except Exception as exc:  # noqa: BLE001 - recorded; the measuring process raises it again
            out["errors"][name] = message(exc)
            return None

    selected = one("sparsegen", None)
    for contender in selected.selection.contenders if selected is not None else ():
        one(",".join(f"{k}={v}" for k, v in contender), dict(contender))
    for fam in families:
        if selected is None or fam != selected.spec.family:
            one(fam, {"family": fam})
    return out


def scratch_root(suite: str) -> Path:
    """Where a suite's per-matrix cache folders go: bench-<suite>/ under sparsegen's cache folder."""
    from sparsegen.cache import default_dir

    return default_dir() / f"bench-{suite}"


def default_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def clear_stale(root: Path, folders) -> None:
    """Remove the folders under `root` of earlier, killed runs that are not in `folders` (entries
    are content-addressed, so the folders this run will use are safe to reuse and stay)."""
    if not root.is_dir():
        return
    keep = {Path(f).name for f in folders}
    for p in root.iterdir():
        if p.is_dir() and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
