"""CUDA-event timing of one GPU launch at a time (the method of ../shared/BENCHMARKS.md).

    time_cuda(fn) -> {"median_ms", "min_ms", "runs", ...}

`fn` enqueues GPU work (one kernel, or one library call) on the current CUDA stream and returns
without synchronising. Each timed launch is bracketed by a pair of CUDA events, and only the GPU
time between the two events is reported.

Why a GPU spin before every timed launch
----------------------------------------
A CUDA event is timestamped when the GPU *reaches* it in the stream, not when the CPU records it.
If the GPU is idle when the CPU records the start event, the start event is stamped at once, and
the end event is stamped only after the CPU has finished submitting the launch and the kernel has
run: the interval then contains the host's launch overhead (Python, argument packing, library
set-up such as cuSPARSE descriptors), which for small sparse kernels is as long as the kernel
itself. So before each start event we enqueue `torch.cuda._sleep(cycles)`, a kernel that spins
for a fixed number of GPU clock cycles. While the GPU spins, the CPU records the start event,
submits the launch and records the end event; when the spin ends the start event is stamped and
the launch is already queued behind it, so the interval covers the GPU work alone. The spin must
outlast the host-side submit time of `fn`: we measure that time during warm-up and size the spin
to max(50 us, 1.5 x that + 20 us). The spin's cycles-per-microsecond is calibrated once per
process with events.

Cold L2 (`flush_l2=True`)
-----------------------
Launching one kernel back to back reads its operands from L2 from the second launch on, wherever
they fit (50 MB on the H100, 60 MB on the H200). A model's forward pass reads each layer's weight
once, from DRAM: a pruned 4096 x 4096 fp16 W at 80 % is 13 MB, its dense copy 34 MB, and both fit. So the
suites that stand for inference (`llm`, the calibration, tuning) flush L2 before every timed
launch: a kernel reads a scratch buffer twice L2's size (its lines are clean, so nothing is written
back when the launch evicts them), before the spin, outside the events. The flush is not timed.

Runs: warm-up is at least `warmup_runs` launches and `warmup_ms` of wall time, synchronised
after every launch (which is also how the host-side submit time is measured on an idle queue).
The timed phase then launches at least `min_runs` times and for at least `min_ms` of GPU time,
counted from the first start event to the last end event (spins included), synchronising once at
the end of the batch; it reads every event pair after that one synchronisation. If the first
batch covered less than `min_ms` (its size is estimated from warm-up), another batch follows.

Samples the spin may not have covered
-------------------------------------
The warm-up's submit time is a median; a host that is busy later (other processes compiling on
every core, a thread holding the GIL) can take longer than the spin to submit one launch, and that
sample then holds host time. The host clock is read around each timed iteration, from just before
the spin is enqueued to just after the end event is recorded; if that took at least the spin's
length, the spin may have ended before the launch was queued, so the sample is set aside. Only the
other samples are reported; when more than `MAX_SUSPECT_FRACTION` of a batch is set aside, the spin
is doubled for the next batch and the runs continue until `min_runs` clean samples are in hand (at
`MAX_SLEEP_US` the remaining samples are kept, marked by "host_bound").
"""
from __future__ import annotations

import math
import statistics
import time

__all__ = ["time_cuda", "TorchCudaBackend", "calibrate_sleep", "recorded"]

# Spin length bounds (microseconds) and the spin used to calibrate cycles per microsecond.
BASE_SLEEP_US = 50.0
MAX_SLEEP_US = 10_000.0
_CALIBRATION_CYCLES = 1_000_000
MAX_RUNS = 100_000
MAX_WARMUP_RUNS = 100_000
# What the benchmarks keep of each measurement besides its median and minimum.
RECORDED_KEYS = ("runs", "sleep_us", "host_ms", "set_aside", "host_bound", "l2")
MAX_SUSPECT_FRACTION = 0.1  # more samples than this set aside in a batch: double the spin

_cycles_per_us_cache: dict = {}
_flush_buffers: dict = {}  # backend key -> the scratch buffer `flush_l2` reads


class TorchCudaBackend:
    """The real backend: torch CUDA events, torch.cuda._sleep, torch.cuda.synchronize."""

    def __init__(self):
        import torch  # lazy: the package imports without torch

        self.torch = torch
        self.key = ("torch", torch.cuda.current_device())

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def synchronize(self):
        self.torch.cuda.synchronize()

    def sleep(self, cycles: int):
        if cycles > 0:
            self.torch.cuda._sleep(int(cycles))

    def flush_l2(self):
        """Read a buffer twice L2's size (made once per device): L2 then holds none of the timed
        launch's operands."""
        buf = _flush_buffers.get(self.key)
        if buf is None:
            torch = self.torch
            l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0))
            buf = torch.ones(max(2 * l2, 64 << 20) // 4, dtype=torch.float32, device="cuda")
            _flush_buffers[self.key] = buf
        buf.sum()

    @staticmethod
    def clock() -> float:
        return time.perf_counter()


def recorded(result: dict) -> dict:
    """What the benchmarks keep of a `time_cuda` result besides its median and minimum."""
    return {k: result[k] for k in RECORDED_KEYS if k in result}


def calibrate_sleep(backend) -> float:
    """GPU clock cycles per microsecond of `backend.sleep`, measured once per backend key."""
    key = getattr(backend, "key", None)
    if key is not None and key in _cycles_per_us_cache:
        return _cycles_per_us_cache[key]
    backend.sleep(1000)  # load the spin kernel
    backend.synchronize()
    rates = []
    for _ in range(3):
        start, end = backend.event(), backend.event()
        start.record()
        backend.sleep(_CALIBRATION_CYCLES)
        end.record()
        backend.synchronize()
        ms = start.elapsed_time(end)
        if ms > 0:
            rates.append(_CALIBRATION_CYCLES / (ms * 1000.0))
    rate = statistics.median(rates) if rates else 1000.0  # ~1 GHz if the events said nothing
    if key is not None:
        _cycles_per_us_cache[key] = rate
    return rate


def time_cuda(fn, *, min_runs: int = 20, min_ms: float = 100.0, warmup_runs: int = 3,
              warmup_ms: float = 25.0, sleep_us: float | None = None, flush_l2: bool = False,
              backend=None) -> dict:
    """Time single launches of `fn` with CUDA events; see the module docstring for the method.

    Returns {"median_ms", "min_ms", "runs", "sleep_us", "host_ms", "warmup_runs", "set_aside",
    "host_bound"}: median and minimum GPU time of one launch over `runs` timed launches the spin
    covered, the spin used last, the median host-side submit time of one call (measured in
    warm-up), how many samples were set aside because their submit outlasted the spin, and whether
    fewer than `min_runs` clean samples could be had.
    `sleep_us` forces the spin length (0 disables it); `flush_l2` empties L2 before every timed
    launch (see "Cold L2"; the result then has "l2": "flushed"); `backend` replaces the torch
    backend (tests).
    """
    be = backend if backend is not None else TorchCudaBackend()
    clock = be.clock

    # --- warm-up: synchronised launches; measures host submit time and a first kernel time.
    host_s: list[float] = []
    dev_ms: list[float] = []
    be.synchronize()
    t0 = clock()
    while (len(host_s) < warmup_runs or (clock() - t0) * 1e3 < warmup_ms) \
            and len(host_s) < MAX_WARMUP_RUNS:
        start, end = be.event(), be.event()
        h0 = clock()
        start.record()
        fn()
        end.record()
        host_s.append(clock() - h0)
        be.synchronize()
        dev_ms.append(start.elapsed_time(end))
    host_ms = statistics.median(host_s) * 1e3
    kernel_est_ms = max(min(dev_ms), 0.0)

    # --- spin length, sized to outlast the host-side submit of one launch.
    if sleep_us is None:
        sleep_us = min(max(BASE_SLEEP_US, 1.5 * host_ms * 1e3 + 20.0), MAX_SLEEP_US)
    sleep_us = max(float(sleep_us), 0.0)
    cycles = int(round(calibrate_sleep(be) * sleep_us)) if sleep_us > 0 else 0

    # --- timed batches: spin, start event, launch, end event; one synchronisation per batch.
    per_iter_ms = max(sleep_us / 1e3 + kernel_est_ms, host_ms, 1e-4)
    runs_wanted = max(min_runs, math.ceil(min_ms / per_iter_ms))
    times: list[float] = []
    suspect = 0
    span_ms = 0.0
    while True:
        batch = max(1, min(runs_wanted - len(times), MAX_RUNS - len(times) - suspect))
        starts = [be.event() for _ in range(batch)]
        ends = [be.event() for _ in range(batch)]
        submit_s = [0.0] * batch
        for i in range(batch):
            if flush_l2:
                be.flush_l2()
            h0 = clock()
            be.sleep(cycles)
            starts[i].record()
            fn()
            ends[i].record()
            submit_s[i] = clock() - h0
        be.synchronize()
        covered = [sleep_us <= 0 or h * 1e6 < sleep_us for h in submit_s]
        batch_suspect = covered.count(False)
        times.extend(s.elapsed_time(e) for s, e, ok in zip(starts, ends, covered) if ok)
        suspect += batch_suspect
        batch_span = starts[0].elapsed_time(ends[-1])
        span_ms += batch_span
        if batch_suspect > MAX_SUSPECT_FRACTION * batch:
            if sleep_us >= MAX_SLEEP_US:
                break  # the longest spin does not cover the host: keep what was covered
            sleep_us = min(2.0 * sleep_us, MAX_SLEEP_US)  # the host is slower than warm-up said
            cycles = int(round(calibrate_sleep(be) * sleep_us))
        if len(times) + suspect >= MAX_RUNS:
            break
        if len(times) >= min_runs and span_ms >= min_ms:
            break
        # Too short (the warm-up estimate was off, or samples set aside): size the next batch.
        per_iter_ms = max(batch_span / batch, 1e-4)
        runs_wanted = len(times) + max(1, math.ceil((min_ms - span_ms) / per_iter_ms),
                                       min_runs - len(times))
    host_bound = len(times) < min_runs
    if not times:  # nothing the spin covered, even at MAX_SLEEP_US: report what was measured
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "runs": len(times),
        "sleep_us": round(sleep_us, 1),
        "host_ms": host_ms,
        "warmup_runs": len(host_s),
        "set_aside": suspect,
        "host_bound": host_bound,
        "l2": "flushed" if flush_l2 else "warm",
    }
