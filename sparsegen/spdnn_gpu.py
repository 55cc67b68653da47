"""A sparse network's run on the GPU: buffers, launches, converge, timing.

Per layer the host launches the layer kernel and, where the layer kernel cannot prune itself (more
than one tile per row, or a deduplication candidate follows: every DEDUP_EVERY-th layer, with
converge), the deduplication candidate and the pruning kernel; it never waits for any of them: each
kernel reads the alive count and the converge state from device memory and decides there (skip, run
a pass or not). The alive counts rotate over three device words: layer l reads word l % 3, appends
to word (l + 1) % 3 and clears word (l + 2) % 3 for the layer after it. The device reports the
layer it is at, and how many rows entered it, in one word of mapped, pinned host memory; the host
reads that word (no synchronisation) to stop launching once the device skips the rest, to hand the
layers left to one tail launch once at most one row is left, and to stay at most RUN_AHEAD layers
ahead of the device so that neither happens late.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from . import spdnn_converge as cv
from .errors import LaunchError, ShapeError

SUPPORT_BLOCK = 256
ALIGN = 256
SPIN_LIMIT_S = 30.0  # a device this far behind is stuck: stop pacing the launches on it

# the tail's per-layer description: struct LayerDesc of templates/spdnn_sliced_ell.cu.j2
LAYER_DESC = np.dtype({"names": ["map", "map_disp", "buf_disp", "warp_disp", "index", "value", "bias",
                                 "uniform_value", "bias_scalar", "n_in", "n_out", "tiles", "block"],
                       "formats": ["u8"] * 7 + ["f4", "f4", "i4", "i4", "i4", "i4"],
                       "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68, 72, 76], "itemsize": 80})
NO_REPORT = np.uint64(0xFFFFFFFF00000000)  # progress word before the device's first report
PRUNE_MODES = ("device", "kernel", "host")
# what split=True times: per layer the layer kernel, the deduplication candidate and the pruning
# (kernel or host round trip); and the converged tail, one launch for the layers left
SPLIT_KINDS = ("layers", "dedup", "pruning", "tail")


def pruning_and_passes(tiles: int, sms: int) -> tuple[bool, int]:
    """For a layer of `tiles` tiles on a GPU of `sms` SMs: whether its kernel can prune (one tile sees
    each whole row), and how many passes (each `tiles` blocks) run at once, about one block per SM."""
    return tiles == 1, max(1, sms // max(tiles, 1))


class GpuRun:
    """One network on the GPU: its layer kernels loaded, weights resident or streamed.

    weights="streamed": each layer's arrays live in one pinned host buffer and are copied on a second
    stream into one of two device slots while the previous layer computes (double buffering).
    prune="device" prunes in the layer kernel where one tile sees whole rows, else in a pruning kernel;
    prune="kernel" always launches the pruning kernel; prune="host" copies the flags back and compacts
    on the host every layer, as the 2020 code did (both kept to measure the difference; converge is off
    with "host").
    """

    def __init__(self, net, runtime, weights: str = "resident", prune: str = "device"):
        if weights not in ("resident", "streamed") or prune not in PRUNE_MODES:
            raise ShapeError(f"weights must be 'resident' or 'streamed', prune one of {', '.join(PRUNE_MODES)}; "
                             f"got {weights!r}, {prune!r}")
        self.net, self.rt, self.weights, self.prune_on = net, runtime, weights, prune
        self.drv = drv = runtime._driver()
        runtime.ensure_context()
        self.sms = runtime.device().get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
        first = net.kernels[0]
        load = lambda name, smem=0: runtime.load_function(first.cubin_key, first.cubin, name, smem)  # noqa: E731
        self.prune, self.scatter, self.iota, self.gather, self.dedup = (
            load(n) for n in ("spdnn_prune", "spdnn_scatter", "spdnn_iota", "spdnn_gather", "spdnn_dedup"))
        self.prune.prepare("PPPPPPPPPiiii")
        self.dedup.prepare("PiPPPPPPPiPPii")
        self.layers = []
        self.resident = []  # the layers' device copies this setup points into (resident weights)
        self.one_tile = []  # per layer: one tile sees every output neuron, so the layer kernel can prune
        self.passes_wanted = []  # per layer: passes the grid runs at once, about one block per SM each
        for k in net.kernels:
            geometry = k.family.launch(k.spec, k.plan, self.sms)
            one_tile, passes = pruning_and_passes(geometry.grid[0], self.sms)
            self.one_tile.append(one_tile)
            self.passes_wanted.append(np.int32(passes))
            func = runtime.load_function(k.cubin_key, k.cubin, k.family.KERNEL, geometry.shared_bytes)
            args = k.family.arguments(k.spec)
            names = [a.name for a in args if a.kind == "plan"]  # in the kernel's parameter order
            func.prepare(runtime.arg_format(args))  # packing by format string, not by inspection
            if weights == "resident":
                plan = k.device_arrays()
                self.resident.append(plan)
                self.layers.append((func, geometry, [int(plan[n]) for n in names]))
            else:
                self.layers.append((func, geometry, _pack(k.plan.arrays, names, drv)))
        if weights == "streamed":
            size = max(packed.nbytes for _, _, (packed, _) in self.layers)
            self.slots = [drv.mem_alloc(size) for _ in range(2)]
            self.copy_stream, self.stream = drv.Stream(), drv.Stream()
        else:
            self.stream = None
        self.progress, self.progress_ptr = self._mapped_word()
        self.tail = self._tail(load) if weights == "resident" else None

    def current(self) -> bool:
        """Whether every layer's device copy this setup points into is still the kernel's."""
        return all(plan is k._device_arrays for plan, k in zip(self.resident, self.net.kernels))

    def _mapped_word(self):
        """One 64-bit word of pinned host memory the device writes its progress to (None: the host
        cannot map memory, and a device word stands in, never read)."""
        drv = self.drv
        try:
            word = drv.pagelocked_empty(1, np.uint64, mem_flags=drv.host_alloc_flags.DEVICEMAP)
            return word, np.uintp(word.base.get_device_pointer())
        except Exception:  # noqa: BLE001 - any failure to map leaves converge on, without pacing
            self._unmapped = drv.mem_alloc(8)
            return None, np.uintp(int(self._unmapped))

    def _tail(self, load):
        """The converged tail's kernel and its table of layer descriptions, when every layer can use
        it: resident weights and one slot-index width (the tail is built with the first layer's)."""
        kernels = self.net.kernels
        if any(k.spec.index_bits != kernels[0].spec.index_bits for k in kernels):
            return None
        table = np.zeros(len(kernels), LAYER_DESC)
        for l, k in enumerate(kernels):
            arrays, c = k.device_arrays(), k.plan.constants
            for name in ("map", "map_disp", "buf_disp", "warp_disp", "index", "value", "bias"):
                table[name][l] = int(arrays[name]) if name in arrays else 0
            table["uniform_value"][l] = k.spec.value or 0.0
            table["bias_scalar"][l] = k.spec.bias
            table["n_in"][l], table["n_out"][l] = k.spec.neurons_in, k.spec.neurons_out
            table["tiles"][l], table["block"][l] = c["tiles"], k.spec.block
        smem = 4 * max(int(k.plan.constants["slots_max"]) for k in kernels)
        func = load("spdnn_tail", smem)
        func.prepare("PiiPPPPPPPPPPiP")
        return func, self.drv.to_device(table), table, smem

    # ------------------------------------------------------------------------------------- running

    def run(self, x: sp.csr_matrix, batch: int | None, converge: bool, split: bool):
        """Every batch of `x` through the network: (traces, representatives' features, batch size,
        timings, memory, launches)."""
        drv, net = self.drv, self.net
        converge = converge and self.prune_on != "host"
        t_all = time.perf_counter()
        free, total = drv.mem_get_info()
        batch = batch or max(1, min(x.shape[0], int(0.6 * free) // self.bytes_per_row()))
        traces, parts = [], []
        timings = {"transfer": 0.0, "inference": 0.0, "host_launch": 0.0,
                   **({kind: 0.0 for kind in SPLIT_KINDS} if split else {})}
        launch_ms = np.zeros((len(self.layers), len(SPLIT_KINDS) - 1)) if split else None
        peak, launches = 0, {"layers_launched": [], "tail_from": []}
        for start in range(0, x.shape[0], batch):
            trace, reps, t, used, launcher = self._run_batch(x[start:start + batch], converge, split)
            traces.append(trace)
            parts.append(reps)
            peak = max(peak, used)
            launches["layers_launched"].append(launcher.launched)
            if launcher.tail_from is not None:
                launches["tail_from"].append(launcher.tail_from)
            for key_ in timings:
                timings[key_] += t[key_]
            if split:
                launch_ms += t["per_layer"]
        timings["compile"] = net.compile_ms
        timings["total_run"] = 1e3 * (time.perf_counter() - t_all)
        timings["batches"] = len(traces)
        memory = {"device_peak_bytes": peak, "device_total_bytes": total, "batch_buffer_bytes": batch * self.bytes_per_row(),
                  "plan_bytes": sum(k.plan.nbytes for k in net.kernels)}
        if split:
            launches["ms_per_layer"] = [dict(zip(SPLIT_KINDS[:-1], (float(v) for v in row))) for row in launch_ms]
        return traces, parts, batch, timings, memory, launches

    def bytes_per_row(self) -> int:
        """Device bytes one input needs: two rows of the widest layer, the alive lists, flags, parent,
        weight, and its share of the deduplication table (two 8-byte words, twice over)."""
        return 2 * self.net.width * 4 + 5 * 4 + 4 * 8

    def _buffers(self, rows: int):
        drv, layers = self.drv, len(self.layers)
        size = 2
        while size < 2 * rows:
            size *= 2
        b = {"y": [drv.mem_alloc(max(rows * self.net.width * 4, 4)) for _ in range(2)],
             "alive": [drv.mem_alloc(max(rows * 4, 4)) for _ in range(2)],
             "counts": drv.mem_alloc(12), "flags": drv.mem_alloc(max(rows * 4, 4)),
             "parent": drv.mem_alloc(max(rows * 4, 4)), "weight": drv.mem_alloc(max(rows * 4, 4)),
             "history": drv.mem_alloc(layers * cv.H * 4), "passes": drv.mem_alloc(layers * cv.P * 4),
             "state": drv.mem_alloc(16), "keys": drv.mem_alloc(size * 8), "slots": drv.mem_alloc(size * 8),
             "tail_flags": drv.mem_alloc(layers * 4), "barriers": drv.mem_alloc(layers * 4), "table_size": size}
        words = {"counts": 3, "flags": max(rows, 1), "history": layers * cv.H, "passes": layers * cv.P,
                 "tail_flags": layers, "barriers": layers, "keys": 2 * size, "slots": 2 * size}
        for name, count in words.items():
            drv.memset_d32(b[name], 0, count)
        drv.memcpy_htod(b["state"], np.array([layers, 0, cv.DEDUP_EVERY, 0], np.int32))
        return b

    def _upload(self, x: sp.csr_matrix, b):
        drv, rows, n = self.drv, x.shape[0], self.net.neurons
        drv.memset_d32(b["y"][0], 0, rows * n)
        indptr = drv.to_device(x.indptr.astype(np.int32))
        cols = drv.to_device(x.indices.astype(np.int32) if x.nnz else np.zeros(1, np.int32))
        vals = drv.to_device(x.data.astype(np.float32) if x.nnz else np.zeros(1, np.float32))
        grid = (min(max(rows, 1), 65535), 1, 1)
        self.scatter(indptr, cols, vals, b["y"][0], np.int32(rows), np.int32(n), block=(SUPPORT_BLOCK, 1, 1), grid=grid)
        self.iota(b["alive"][0], b["counts"], b["parent"], b["weight"], np.int32(rows), block=(SUPPORT_BLOCK, 1, 1),
                  grid=(min(-(-max(rows, 1) // SUPPORT_BLOCK), 4096), 1, 1))

    def _run_batch(self, x: sp.csr_matrix, converge: bool, split: bool):
        drv, rows, layers = self.drv, x.shape[0], len(self.layers)
        t = time.perf_counter()
        b = self._buffers(rows)
        self._upload(x, b)
        drv.Context.synchronize()
        free, total = drv.mem_get_info()
        upload_ms = 1e3 * (time.perf_counter() - t)
        if self.progress is not None:
            self.progress[0] = NO_REPORT
        launcher = _Launcher(self, b, rows, converge, split)
        t = time.perf_counter()
        launcher.launch_all()
        host_ms = 1e3 * (time.perf_counter() - t)
        launcher.done.synchronize()
        timing = launcher.times()
        timing["host_launch"] = host_ms

        t = time.perf_counter()
        hist, passes, state = (np.empty(n, np.int32) for n in (layers * cv.H, layers * cv.P, 4))
        for host, dev in ((hist, "history"), (passes, "passes"), (state, "state")):
            drv.memcpy_dtoh(host, b[dev])
        if state[3]:
            raise LaunchError(f"spdnn: the converged tail found {state[3]} rows left, where the driver expects at most one")
        hist, passes = hist.reshape(layers, cv.H).astype(np.int64), passes.reshape(layers, cv.P).astype(np.int64)
        if self.prune_on == "host":
            hist[:, [cv.H_KEPT, cv.H_INPUTS]] = launcher.host_kept[:, None]
        skip_from = int(min(state[0], layers))
        last = skip_from - 1  # the last layer computed
        counts = np.empty(3, np.int32)
        drv.memcpy_dtoh(counts, b["counts"])
        final = (last + 1) % 2  # the alive list and rows after the last layer computed
        survivors = int(counts[(last + 1) % 3]) if last >= 0 else rows
        slots = np.empty(survivors, np.int32)
        if survivors:
            drv.memcpy_dtoh(slots, b["alive"][final])
        parent = np.empty(rows, np.int32)
        if rows:
            drv.memcpy_dtoh(parent, b["parent"])
        trace = cv.Trace(hist, passes, skip_from, slots.astype(np.int64), parent.astype(np.int64), None)
        width = self.net.kernels[last].shape[0] if last >= 0 else self.net.neurons
        if skip_from < layers:
            reps = cv.final_rows(trace, None, layers, self.net.outputs, self.net.cap)
        else:
            reps = self._gather(b["y"][final], b["alive"][final], int(b["counts"]) + 4 * ((last + 1) % 3), survivors,
                                width)
        timing["transfer"] = upload_ms + 1e3 * (time.perf_counter() - t)
        reps = reps if reps is not None else np.zeros((0, self.net.outputs), np.float32)
        return trace, reps, timing, total - free, launcher

    def _gather(self, y, alive, count: int, survivors: int, width: int) -> np.ndarray:
        drv = self.drv
        out = drv.mem_alloc(max(survivors * width * 4, 4))
        self.gather(y, alive, np.uintp(count), out, np.int32(width),
                    block=(SUPPORT_BLOCK, 1, 1), grid=(min(max(survivors, 1), 65535), 1, 1))
        feats = np.empty((survivors, width), np.float32)
        if survivors:
            drv.memcpy_dtoh(feats, out)
        return feats

    def prefetch(self, l: int, slot_free):
        """Copy layer l's packed weights into slot l % 2 on the copy stream, once the layer that
        last used that slot (l - 2) is done; returns the event that marks the copy complete."""
        packed, _ = self.layers[l][2]
        if slot_free is not None:
            self.copy_stream.wait_for_event(slot_free)
        self.drv.memcpy_htod_async(self.slots[l % 2], packed, self.copy_stream)
        done = self.drv.Event()
        done.record(self.copy_stream)
        return done


class _Launcher:
    """The launches of one batch, in order, with the host's watch on the device's progress."""

    def __init__(self, run: GpuRun, b: dict, rows: int, converge: bool, split: bool):
        self.run, self.rows, self.converge, self.split = run, rows, converge, split
        # prepared launches pack pointers as integers
        self.b = {k: [int(p) for p in v] if isinstance(v, list) else int(v) for k, v in b.items()}
        self.drv = run.drv
        layers = len(run.layers)
        self.host_kept = np.zeros(layers, np.int64)
        self.host_alive = np.arange(rows, dtype=np.int32)
        self.fixed_from = np.int32(run.net.fixed_from if converge else -1)
        self.c = [self.b["counts"] + 4 * i for i in range(3)]
        self.ys, self.alives = self.b["y"], self.b["alive"]
        self.prune_grid = (min(-(-max(rows, 1) // SUPPORT_BLOCK), 8 * run.sms), 1, 1)
        self.dedup_grid = (min(-(-max(rows, 1) // (SUPPORT_BLOCK // 32)), 8 * run.sms), 1, 1)
        self.marks = []  # with split: (event after a launch, its kind, its layer)
        self.previous_layer_done = None  # streamed weights: the event after the last layer kernel
        self.copied = None
        self.launched, self.tail_from = 0, None
        self.direct = {}

    def call(self, func, grid, block, args, shared: int = 0):
        """Launch `func` on the run's stream: packed by its prepared format and launched directly
        (runtime._direct_launch: a layer's launches are most of the host's time per layer), else
        through prepared_async_call."""
        key = id(func)
        if key not in self.direct:
            from . import runtime

            self.direct[key] = runtime._direct_launch(func)
        fast = self.direct[key]
        if fast is not None:
            fast(grid, block, args, shared, self.run.stream)
        else:
            func.prepared_async_call(grid, block, self.run.stream, *args, shared_size=shared)

    def event(self):
        e = self.drv.Event()
        e.record(self.run.stream)
        return e

    def launch_all(self):
        run, layers = self.run, len(self.run.layers)
        self.start = self.event()
        if run.weights == "streamed":
            self.copied = run.prefetch(0, None)
        l = 0
        while l < layers:
            if self.converge and l > 0:
                seen = self.watch(l)
                if seen == "skip":
                    break
                if seen == "tail":
                    self.launch_tail(l)
                    break
            self.launch_layer(l)
            self.launched += 1
            l += 1
        self.done = self.event()

    def watch(self, l: int):
        """What the device has reported, read without waiting: "skip" when it skips layer l on, "tail"
        when at most one row goes into layer l and the tail can take the rest; else None, after
        pacing the host to RUN_AHEAD layers ahead of the device."""
        word = self.run.progress
        if word is None:
            return None
        t0 = None
        while True:
            w = int(word[0])
            if w != int(NO_REPORT):
                at, skip, rows = w >> 32, bool(w & 0x80000000), w & 0x7FFFFFFF
                if skip and at <= l:
                    return "skip"
                if rows <= 1 and self.run.tail is not None:
                    return "tail"
                if l - at <= cv.RUN_AHEAD:
                    return None
            elif l <= cv.RUN_AHEAD:
                return None
            t0 = t0 or time.perf_counter()
            if time.perf_counter() - t0 > SPIN_LIMIT_S:
                return None

    def prunes_itself(self, l: int) -> bool:
        """Whether layer l's kernel appends its survivors to the next alive list itself: one tile sees
        each whole row, and no deduplication candidate (which reads the flags) comes between."""
        run = self.run
        return (run.prune_on == "device" and run.one_tile[l]
                and not (self.converge and cv.is_candidate(l, len(run.layers))))

    def mark(self, kind: str, l: int):
        """With split: an event after the launch just made, so each launch's GPU time is the time between
        two marks."""
        if self.split:
            self.marks.append((self.event(), kind, l))

    def launch_layer(self, l: int):
        run, b, stream = self.run, self.b, self.run.stream
        func, geometry, fixed = run.layers[l]
        cur, nxt, clear = self.c[l % 3], self.c[(l + 1) % 3], self.c[(l + 2) % 3]
        fused = self.prunes_itself(l)
        if run.weights == "streamed":
            stream.wait_for_event(self.copied)  # layer l's weights are in slot l % 2
            base, offsets = int(run.slots[l % 2]), fixed[1]
            fixed = [base + o for o in offsets]
        self.call(func, geometry.grid, geometry.block,
                  (*fixed, self.ys[l % 2], self.ys[(l + 1) % 2], self.alives[l % 2], cur, nxt, clear,
                   self.alives[(l + 1) % 2], b["weight"], b["flags"], b["history"], b["state"], run.progress_ptr, l,
                   self.fixed_from, np.int32(fused), run.passes_wanted[l]), geometry.shared_bytes)
        self.mark("layers", l)
        if run.weights == "streamed":
            after_layer = self.event()
            if l + 1 < len(run.layers):  # slot (l + 1) % 2 is free once layer l - 1 is done
                self.copied = run.prefetch(l + 1, self.previous_layer_done)
            self.previous_layer_done = after_layer
        if fused:
            return
        if self.converge and cv.is_candidate(l, len(run.layers)):
            self.call(run.dedup, self.dedup_grid, (SUPPORT_BLOCK, 1, 1),
                      (self.ys[(l + 1) % 2], np.int32(run.net.kernels[l].shape[0]), self.alives[l % 2], cur, b["flags"],
                       b["parent"], b["weight"], b["keys"], b["slots"], np.int32(b["table_size"]), b["passes"],
                       b["state"], np.int32(l), np.int32(len(run.layers))))
            self.mark("dedup", l)
        if run.prune_on == "host":
            self.prune_on_host(l, nxt)
        else:
            self.call(run.prune, self.prune_grid, (SUPPORT_BLOCK, 1, 1),
                      (self.alives[l % 2], cur, b["flags"], self.alives[(l + 1) % 2], nxt, b["weight"], b["history"],
                       b["state"], b["passes"], np.int32(l), np.int32(cv.DEDUP_PAYS), np.int32(cv.DEDUP_EVERY),
                       np.int32(cv.DEDUP_MAX_INTERVAL)))
        self.mark("pruning", l)

    def launch_tail(self, l: int):
        run, b = self.run, self.b
        func, table_dev, table, smem = run.tail
        grid = min(int(table["tiles"][l:].max()), run.sms)
        block = int(table["block"][l:].max())
        self.call(func, (grid, 1, 1), (block, 1, 1),
                  (int(table_dev), np.int32(l), np.int32(len(run.layers)), b["y"][0], b["y"][1], b["alive"][0],
                   b["alive"][1], b["counts"], b["history"], b["state"], b["weight"], b["tail_flags"], b["barriers"],
                   self.fixed_from, run.progress_ptr), smem)
        self.mark("tail", l)
        self.tail_from = l

    def prune_on_host(self, l: int, count_out):
        """The 2020 way: flags to the host, compact there, alive list and count back (a round trip)."""
        drv, b = self.drv, self.b
        flags = np.empty(self.host_alive.size, np.int32)
        if self.host_alive.size:
            drv.memcpy_dtoh(flags, b["flags"])
        kept = np.ascontiguousarray(self.host_alive[(flags & 1) != 0])
        if kept.size:
            drv.memcpy_htod(self.alives[(l + 1) % 2], kept)
        drv.memcpy_htod(count_out, np.array([kept.size], np.int32))
        if self.host_alive.size:
            drv.memset_d32(b["flags"], 0, self.host_alive.size)
        self.host_alive = kept
        self.host_kept[l] = kept.size

    def times(self) -> dict:
        """GPU time of the batch; with split, also per kind of launch (SPLIT_KINDS), and per layer."""
        out = {"inference": self.start.time_till(self.done)}
        if self.split:
            out.update(dict.fromkeys(SPLIT_KINDS, 0.0))
            per_layer = np.zeros((len(self.run.layers), len(SPLIT_KINDS) - 1))
            previous = self.start
            for event, kind, l in self.marks:
                ms = previous.time_till(event)
                previous = event
                out[kind] += ms
                if kind != "tail":
                    per_layer[l, SPLIT_KINDS.index(kind)] += ms
            out["per_layer"] = per_layer
        return out


def _pack(arrays: dict, names, drv):
    """A layer's arrays in one pinned host buffer (256-byte aligned pieces) and their offsets."""
    offsets, total = [], 0
    for n in names:
        offsets.append(total)
        total += -(-arrays[n].nbytes // ALIGN) * ALIGN
    packed = drv.pagelocked_empty(max(total, ALIGN), np.uint8)
    for n, o in zip(names, offsets):
        raw = np.ascontiguousarray(arrays[n]).view(np.uint8).ravel()
        packed[o:o + raw.size] = raw
    return packed, offsets
