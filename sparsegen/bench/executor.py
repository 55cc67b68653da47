"""The GPU side the suites share: compile through the public API, check, time, and the baselines.

`GpuExecutor` owns torch, the device, the arch and the `DeviceModel` selection plans for, and
measures into a case record:

- `compile(rec, name, A, options=..., **request)`: `sparsegen.compile` for the GPU; a family that
  declines or a compile that fails is written into the record, never raised;
- `measure(rec, name, run, check)`: one launch checked against the reference, then timed by
  `timing.time_cuda`; `measure_spmm` runs a kernel into a NaN-filled output;
- `time_families(...)`: each family forced through `options={"family": name}` on the same
  request, the selected kernel's own family measured once;
- `baseline(rec, name, fn, check, cap_ms=...)`: a library call (cuBLAS, cuSPARSE) the same way,
  timed once when a single launch is longer than `cap_ms`;
- `copy_bandwidth()`: the device's copy bandwidth, the yardstick of the bytes-moved columns.

A suite subclasses it with its per-matrix context (`dlmc`'s `matrix(A)`, `llm`'s `weight(A)`).
Torch, CuPy and sparsegen's GPU runtime are imported only when an executor is made.
"""
from __future__ import annotations

import functools
import time
import warnings
from dataclasses import asdict, dataclass

from sparsegen.bench.records import join_notes, message
from sparsegen.bench.timing import recorded
from sparsegen.errors import UnsupportedError

COPY_BYTES = 1 << 30


@dataclass(frozen=True)
class CopyBandwidth:
    """A device-to-device copy of `size` bytes: read + write = 2 x size bytes per copy."""
    size: int
    median_ms: float
    min_ms: float
    runs: int

    @property
    def bytes_per_s(self) -> float:
        return 2.0 * self.size / (self.median_ms * 1e-3)

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes_per_s": self.bytes_per_s,
                "tb_per_s": round(self.bytes_per_s / 1e12, 4),
                "method": "torch dst.copy_(src) of float16 tensors, read + write bytes over the "
                          "median of time_cuda launches"}


def fraction_of(bytes_moved, ms, copy_bytes_per_s):
    """bytes / time as a fraction of the copy bandwidth; None when something is missing."""
    if not bytes_moved or not ms or not copy_bytes_per_s or ms <= 0:
        return None
    return bytes_moved / (ms * 1e-3) / copy_bytes_per_s


class GpuExecutor:
    """Measures on the current CUDA device with torch and sparsegen's GPU runtime (CuPy optional)."""

    cold_l2 = False  # flush L2 before every timed launch (bench/timing.py, "Cold L2")

    @classmethod
    def default_timer(cls):
        """`time_cuda`, with L2 flushed before every launch where the suite says so (`cold_l2`)."""
        from sparsegen.bench.timing import time_cuda

        return functools.partial(time_cuda, flush_l2=cls.cold_l2)

    def __init__(self, *, cusparse: bool = True, timer=None, cupy: bool = False):
        from sparsegen.bench import cuda_torch

        torch = cuda_torch()
        import sparsegen
        from sparsegen import runtime
        from sparsegen.select.device import DeviceModel

        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks are implicitly")
        self.torch = torch
        self.sparsegen = sparsegen
        self.timer = timer or self.default_timer()
        self.cusparse = cusparse
        self.device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=self.device)  # the primary context first, then sparsegen's runtime
        self.arch = runtime.current_arch()
        self.device_model = DeviceModel.current()  # what selection plans for, here and in any worker
        self._saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False   # cuBLAS fp32 is true fp32
        torch.backends.cudnn.allow_tf32 = False
        self.cupy = self.cupy_sddmm = None
        if cupy:
            try:
                import cupy as cp
                import cupyx.cusparse
                import cupyx.scipy.sparse  # noqa: F401

                self.cupy, self.cupy_sddmm = cp, getattr(cupyx.cusparse, "sddmm", None)
            except Exception:
                pass
        self.baselines = {"torch": torch.__version__}

    # ------------------------------------------------------------------ sparsegen's kernels
    def compile(self, rec, name, A, *, options=None, quiet_decline=False, **request):
        """`sparsegen.compile(A, **request)` for this GPU, `options` forcing a family; None when it
        declines (the selected kernel's record turns "unsupported"; a forced family's goes to
        rec["family_declined"] when `quiet_decline`, else to the note) or fails (the case fails)."""
        t0 = time.perf_counter()
        try:
            kern = self.sparsegen.compile(A, arch=self.arch, device=self.device_model, backend="gpu",
                                          options=options, **request)
        except UnsupportedError as exc:
            if name == "sparsegen":
                rec["status"], rec["_final_status"] = "unsupported", True
                rec["reason"] = str(exc)[:500]
            if quiet_decline and name != "sparsegen":
                rec.setdefault("family_declined", {})[name] = str(exc)[:200]
            else:
                rec["note"] = join_notes(rec.get("note"), f"{name} unsupported: {str(exc)[:200]}")
            return None
        except Exception as exc:
            rec["status"], rec["_final_status"] = "failed", True
            rec["note"] = join_notes(rec.get("note"), f"{name} compile failed: {message(exc)}")
            return None
        rec.setdefault("compile_s", {})[name] = round(time.perf_counter() - t0, 3)
        rec.setdefault("plan_cached", {})[name] = bool(kern.timings.cached.get("plan"))
        return kern

    def measure(self, rec, name, run, check, *, times=("ms", "ms_min")):
        """Run once, check, time; the sampled error (None when the launch failed, and the case fails).
        The median and minimum go to rec[times[0]][name] and rec[times[1]][name]."""
        try:
            err = check(run())
            tm = self.timer(run)
        except Exception as exc:
            rec["status"], rec["_final_status"] = "failed", True
            rec["note"] = join_notes(rec.get("note"), f"{name} launch failed: {message(exc)}")
            return None
        rec.setdefault(times[0], {})[name] = tm["median_ms"]
        rec.setdefault(times[1], {})[name] = tm["min_ms"]
        rec.setdefault("timing", {})[name] = recorded(tm)
        return err

    def measure_spmm(self, rec, name, kern, x, check, m, *, times=("ms", "ms_min")):
        """`measure` of an SpMM kernel writing into an (m, n) output that starts as NaN."""
        y = self.torch.full((m, x.shape[1]), float("nan"), dtype=x.dtype, device=self.device)

        def run():
            r = kern(x, out=y)
            return y if r is None else r

        return self.measure(rec, name, run, check, times=times)

    def time_families(self, rec, A, request, families, selected, measure, *, times=("ms", "ms_min"),
                      quiet_decline=False, on_kernel=None):
        """Each of `families` forced on `request`: its spec in rec["family_spec"], its error in
        rec["family_error"], its times under `times`. The selected kernel's own family is not built
        again: its spec and times are copied. `measure(name, kernel)` measures one kernel and returns
        its error; `on_kernel(name, kernel)` sees every kernel timed (the selected one included)."""
        for fam in families:
            if selected is not None and selected.spec.family == fam and "sparsegen" in rec.get("ms", {}):
                for dst, src in zip(times, ("ms", "ms_min")):
                    rec.setdefault(dst, {})[fam] = rec[src].get("sparsegen")
                rec.setdefault("family_spec", {})[fam] = selected.spec.name
                if on_kernel is not None:
                    on_kernel(fam, selected)
                continue
            kern = self.compile(rec, fam, A, options={"family": fam}, quiet_decline=quiet_decline, **request)
            if kern is None:
                continue
            rec.setdefault("family_spec", {})[fam] = kern.spec.name
            if on_kernel is not None:
                on_kernel(fam, kern)
            rec.setdefault("family_error", {})[fam] = measure(fam, kern)
            del kern

    # ------------------------------------------------------------------ libraries
    def baseline(self, rec, name, fn, check, *, cap_ms=None):
        """Run once (timed by events), check, then time; over `cap_ms` the single launch stands.
        A failing baseline becomes rec["baseline_notes"][name]; the case goes on."""
        torch = self.torch
        try:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            res = fn()
            end.record()
            torch.cuda.synchronize()
            first_ms = start.elapsed_time(end)
            rec.setdefault("baseline_error", {})[name] = check(res)
            del res
            if cap_ms is not None and first_ms > cap_ms:
                rec["ms"][name] = rec["ms_min"][name] = first_ms
                rec.setdefault("baseline_notes", {})[name] = (
                    f"one launch {first_ms:.1f} ms > {cap_ms:g} ms: timed once, not repeated")
                return
            t = self.timer(fn)
            rec["ms"][name], rec["ms_min"][name] = t["median_ms"], t["min_ms"]
            rec.setdefault("timing", {})[name] = recorded(t)
        except Exception as exc:
            rec.setdefault("baseline_notes", {})[name] = message(exc)

    def copy_bandwidth(self) -> CopyBandwidth:
        t = self._time_copy(COPY_BYTES)
        self.torch.cuda.empty_cache()  # the 2 GiB of buffers are gone once _time_copy returns
        return CopyBandwidth(COPY_BYTES, t["median_ms"], t["min_ms"], t["runs"])

    def _time_copy(self, size: int) -> dict:
        src = self.torch.ones(size // 2, dtype=self.torch.float16, device=self.device)
        dst = self.torch.empty_like(src)
        return self.timer(lambda: dst.copy_(src))

    # ------------------------------------------------------------------ the context
    def context_lost(self):
        """A message when the CUDA context no longer works (then the run must stop), else None."""
        try:
            self.torch.cuda.synchronize()
            self.torch.zeros(1, device=self.device).add_(1).item()
            return None
        except Exception as exc:
            return message(exc)

    def close(self):
        t = self.torch
        t.backends.cuda.matmul.allow_tf32, t.backends.cudnn.allow_tf32 = self._saved
        t.cuda.empty_cache()
