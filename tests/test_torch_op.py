"""`torch.ops.sparsegen.spmm` on the CPU: torch.compile(fullgraph=True) with the eager and inductor
backends and torch.export trace SparseLinear models as the operator (no graph break) and give the
eager module's and the dense pruned model's answers; the fake implementation reads no data; the
handle registry; and the GPU call's machinery against a stand-in CUDA driver (tests/fixtures/
fake_libcuda.c, built with the C compiler): arguments packed as each step's list says, the operand
cells patched per call, the launch on the caller's stream. Skips where torch is not installed."""
from __future__ import annotations

import copy
import ctypes
import gc
import pickle
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch", reason="torch not installed: sparsegen.torch is optional")

import sparsegen  # noqa: E402
import sparsegen.torch as sgt  # noqa: E402
from sparsegen import cudriver, prune, runtime, torch_op  # noqa: E402
from sparsegen.errors import LaunchError, ShapeError, SparsegenError  # noqa: E402

from .conftest import REPO  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-6}


def toy(dtype=torch.float32, seed=5):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48),
                               torch.nn.GELU(), torch.nn.Linear(48, 16, bias=False)).to(dtype)


def sparse_and_dense(dtype=torch.float32, sparsity=0.6):
    """The toy model with its Linears as SparseLinear (emulator) and its dense pruned twin."""
    model = toy(dtype)
    dense = copy.deepcopy(model)
    report = sgt.sparsify(model, sparsity, backend="emulate")
    with torch.no_grad():
        for r in report.layers:
            dense.get_submodule(r.name).weight.copy_(r.module.dense_weight())
    return model, dense


def rel(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


class Recorder:
    """A torch.compile backend that keeps the FX graphs dynamo hands it, then runs them eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, inputs):
        self.graphs.append(gm)
        return gm.forward

    def ops(self) -> list:
        return [n.target for g in self.graphs for n in g.graph.nodes if n.op == "call_function"]


# ---- torch.compile ------------------------------------------------------------------------------

def test_compile_traces_the_whole_model_as_one_graph_with_the_operator():
    model, _ = sparse_and_dense()
    rec = Recorder()
    compiled = torch.compile(model, fullgraph=True, backend=rec)
    with torch.inference_mode():
        compiled(torch.randn(5, 32))
    assert len(rec.graphs) == 1
    linear = (torch.ops.sparsegen.linear, torch.ops.sparsegen.linear.default)
    assert sum(op in linear for op in rec.ops()) == 3  # every layer, none run outside the graph
    assert not any(op in (torch.ops.aten.t.default, torch.ops.aten.clone.default) for op in rec.ops())  # no transposes
    explain = torch._dynamo.explain(model)(torch.randn(5, 32))
    assert explain.graph_break_count == 0 and explain.graph_count == 1


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_model_matches_eager_and_dense_pruned(backend):
    torch._dynamo.reset()
    model, dense = sparse_and_dense()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.inference_mode():
        for n in (5, 1, 9):  # new token counts recompile or run dynamic; each compiles its kernel
            x = torch.randn(n, 32)
            y, y_eager, y_dense = compiled(x), model(x), dense(x)
            assert y.shape == (n, 16)
            assert torch.allclose(y, y_eager, rtol=1e-6, atol=1e-6)
            assert rel(y, y_dense) <= TOL[torch.float32]
    assert set(model[0].specs) == {1, 5, 9}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_half_precision_matches_dense_pruned(dtype):
    torch._dynamo.reset()
    model, dense = sparse_and_dense(dtype)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = torch.randn(2, 3, 32).to(dtype)
    with torch.inference_mode():
        y = compiled(x)
        assert y.dtype == dtype and y.shape == (2, 3, 16)
        assert torch.equal(y, model(x))
        assert rel(y, dense(x).double()) <= 4 * TOL[dtype]


def test_compiled_dynamic_token_counts():
    torch._dynamo.reset()
    model, dense = sparse_and_dense()
    compiled = torch.compile(model, fullgraph=True, backend="eager", dynamic=True)
    with torch.inference_mode():
        for n in (3, 4, 7):
            x = torch.randn(n, 32)
            assert rel(compiled(x), dense(x)) <= TOL[torch.float32]


# ---- torch.export ---------------------------------------------------------------------------------

def test_export_holds_the_operator_and_runs(tmp_path):
    model, dense = sparse_and_dense()
    x = torch.randn(4, 32)
    program = torch.export.export(model, (x,))
    calls = [n for n in program.graph.nodes if n.target == torch.ops.sparsegen.linear.default]
    assert [c.args[1:] for c in calls] == [(model[0].handle, 64), (model[2].handle, 48), (model[4].handle, 16)]
    with torch.inference_mode():
        assert torch.equal(program.module()(x), model(x))
        assert rel(program.module()(x), dense(x)) <= TOL[torch.float32]
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    with torch.inference_mode():
        assert torch.equal(loaded.module()(x), model(x))  # in this process, where the layers live


# ---- the operator's pieces -------------------------------------------------------------------------

def test_fake_implementation_reads_no_data(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(32, 24), 0.5, backend="emulate")
    monkeypatch.setattr(torch_op.OpLayer, "run_host", lambda *a: pytest.fail("the fake ran the kernel"))
    with FakeTensorMode():
        y = torch.ops.sparsegen.spmm(torch.empty(32, 7), layer.handle, 24)
        assert y.shape == (24, 7) and y.dtype == torch.float32
        with pytest.raises(ShapeError, match=r"expected X \(32, N\) of float32 and m = 24, got \(32, 7\) of "
                                             r"float16 and m = 24"):
            torch.ops.sparsegen.spmm(torch.empty(32, 7, dtype=torch.float16), layer.handle, 24)
        with pytest.raises(ShapeError, match="m = 23"):
            torch.ops.sparsegen.spmm(torch.empty(32, 7), layer.handle, 23)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_opcheck_passes(dtype):
    """torch.library.opcheck: the schema, the fake against the real kernel (shapes, strides, dtype),
    and tracing through AOT dispatch with dynamic shapes, on contiguous and transposed operands."""
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(32, 24).to(dtype), 0.5, backend="emulate")
    for x in (torch.randn(32, 5).to(dtype), torch.randn(5, 32).to(dtype).t()):
        result = torch.library.opcheck(torch.ops.sparsegen.spmm.default, (x, layer.handle, 24))
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_opcheck_passes(dtype):
    """The layer's operator in nn.Linear's layout, through the kernel and through F.linear (the
    dense fallback's token counts): the schema, the fake against the real kernel, AOT dispatch."""
    # a W this small runs dense as a Linear in half precision: the tile kernel is asked for by name
    kernel = None if dtype == torch.float32 else {"family": "tiled_csl_spmm"}
    sparse = sgt.SparseLinear.from_dense(torch.nn.Linear(32, 24).to(dtype), 0.5, backend="emulate", options=kernel)
    dense = sgt.SparseLinear.from_dense(torch.nn.Linear(32, 24).to(dtype), 0.5, backend="emulate",
                                        options={"family": "dense_gemm"})
    for layer in (sparse, dense):
        for x in (torch.randn(5, 32).to(dtype), torch.randn(2, 3, 32).to(dtype), torch.randn(32, 5).to(dtype).t()):
            result = torch.library.opcheck(torch.ops.sparsegen.linear.default, (x, layer.handle, 24))
            assert set(result.values()) == {"SUCCESS"}, result
    assert set(dense.op.dense_ns) >= {5, 6} and not dense.op.prepared and not dense.op.kernels
    assert set(sparse.op.sparse_ns) >= {5, 6} and not sparse.op.dense_ns and sparse.op.dense is None


def test_dense_fallback_token_counts_run_as_nn_linear():
    """Where selection picks the dense fallback, the layer is F.linear on W densified: bit for bit
    the dense pruned nn.Linear, eager and compiled, and its W counted once."""
    torch._dynamo.reset()
    linear = torch.nn.Linear(32, 24).half()
    layer = sgt.SparseLinear.from_dense(linear, 0.5, backend="emulate", options={"family": "dense_gemm"})
    reference = layer.to_linear()
    x = torch.randn(7, 32).half()
    with torch.inference_mode():
        assert torch.equal(layer(x), reference(x))
        assert torch.equal(torch.compile(layer, fullgraph=True, backend="eager")(x), reference(x))
    assert layer.specs[7].startswith("dense_gemm.") and 7 in layer.op.dense_ns and 7 not in layer.op.kernels
    w, b = layer.op.dense
    assert layer.device_bytes() == w.numel() * 2 + b.numel() * 2  # no plan kept beside it
    layer.prepare(3)
    assert 3 in layer.op.dense_ns and not layer.op.prepared
    y = torch.ops.sparsegen.spmm(x.T.contiguous(), layer.handle, 24)  # the kernels' layout still runs its GEMM
    assert torch.allclose(y.T.float(), reference(x).float(), rtol=2e-3, atol=2e-3)


def test_operator_called_directly_checks_its_operand():
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(32, 24), 0.5, backend="emulate")
    x = torch.randn(32, 3)
    y = torch.ops.sparsegen.spmm(x, layer.handle, 24)
    assert torch.allclose(y, layer(x.T).T)
    with pytest.raises(ShapeError, match=r"expected X \(32, N\) of float32, got \(31, 3\) of float32"):
        torch.ops.sparsegen.spmm(torch.randn(31, 3), layer.handle, 24)
    assert torch.ops.sparsegen.spmm(torch.randn(32, 0), layer.handle, 24).shape == (24, 0)


def test_handles_name_live_layers_only_and_copies_get_their_own():
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(16, 8), 0.5, backend="emulate")
    twin = copy.deepcopy(layer)
    assert twin.handle != layer.handle and torch_op.layer_of(twin.handle) is twin.op
    assert twin.csr is layer.csr  # W is shared, never written
    x = torch.randn(3, 16)
    with torch.inference_mode():
        assert torch.equal(twin(x), layer(x))
    revived = pickle.loads(pickle.dumps(layer))
    assert revived.handle not in (layer.handle, twin.handle)
    with torch.inference_mode():
        assert torch.equal(revived(x), layer(x))
    handle = layer.handle
    del layer
    gc.collect()
    with pytest.raises(SparsegenError, match=f"handle {handle} names no live SparseLinear"):
        torch.ops.sparsegen.spmm(torch.randn(16, 2), handle, 8)


def test_cpu_operand_into_a_gpu_layer_is_refused_by_the_operator():
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(16, 8), 0.5)  # backend gpu
    with pytest.raises(ShapeError, match="this layer runs sparsegen's GPU kernel: move it to CUDA"):
        torch.ops.sparsegen.spmm(torch.randn(16, 2), layer.handle, 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_pruning_on_the_device_follows_the_rule(dtype):
    """keep_mask_sorted (the CUDA weight's path) against prune.keep_mask, on ties and zeros too."""
    rng = np.random.default_rng(2)
    weights = [torch.randn(40, 30), torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]]),
               torch.tensor([3.0, -2.0, 2.0, 1.0, -2.0, 5.0, 0.0, 0.0]),
               torch.from_numpy(rng.integers(-3, 4, size=(17, 9)).astype(np.float32))]
    for w in weights:
        w = w.to(dtype)
        for s in (0.0, 0.3, 0.5, 0.77, 1.0):
            expected = prune.keep_mask(w.double().numpy(), s)
            assert np.array_equal(sgt.keep_mask_sorted(w, s).numpy(), expected), (w, s)
    with pytest.raises(ShapeError, match="found nan at index 1"):
        sgt.keep_mask_sorted(torch.tensor([1.0, float("nan")]), 0.5)


def test_device_pool_uploads_each_distinct_array_once(monkeypatch):
    uploads = []

    def upload(arrays):
        uploads.extend(arrays)
        return {name: 0x1000 * len(uploads) for name in arrays}

    monkeypatch.setattr(runtime, "upload", upload)
    pool = torch_op.DevicePool()
    w = np.arange(12, dtype=np.float32)
    p1, held1 = pool.acquire({"w": w, "idx": np.arange(3, dtype=np.int32)})
    p2, held2 = pool.acquire({"w": w.copy(), "idx": np.arange(3, dtype=np.int32)})  # equal, not the same objects
    assert p1 == p2 and uploads == ["w", "idx"] and pool.nbytes == 48 + 12
    p3, held3 = pool.acquire({"w": -w})
    assert p3["w"] != p1["w"] and uploads == ["w", "idx", "w"]
    negative_zero = np.zeros(12, np.float32)
    pool.acquire({"z": negative_zero})
    pool.acquire({"z": -negative_zero})  # equal as numbers, not as bytes: its own upload
    assert uploads[-2:] == ["z", "z"]
    pool.release(held1)
    assert pool.nbytes == 48 + 12 + 48 + 96  # held2 still reads w and idx
    pool.release(held2)
    pool.release(held3)
    assert pool.nbytes == 96


def test_eviction_keeps_what_a_graph_captured():
    layer = torch_op.OpLayer(prune.magnitude_prune_csr(np.ones((4, 4)), 0.5), None, "float16", options={},
                             tune=None, backend="gpu", max_kernels=2)
    released = []

    class Stub:
        def __init__(self, n, pinned):
            self.n, self.pinned, self.spec = n, pinned, f"stub{n}"

        def release(self):
            released.append(self.n)

    for n, pinned in ((1, True), (2, False), (3, False), (4, False)):
        layer.prepared[n] = Stub(n, pinned)
    layer._evict()
    assert list(layer.prepared) == [1, 4] and released == [2, 3]  # 1 is pinned: kept past max_kernels


def test_preparing_inside_a_capture_is_refused(monkeypatch):
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(16, 8), 0.5)
    monkeypatch.setattr(torch_op, "capturing", lambda: True)
    with pytest.raises(LaunchError, match=r"N = 3 was not prepared before this CUDA graph capture.*prepare\(3\)"):
        layer.prepare(3)
    assert layer.specs == {}  # nothing compiled, nothing uploaded


# ---- the GPU call against a stand-in driver -------------------------------------------------------

@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver")
    out = tmp_path_factory.mktemp("fake_libcuda") / "fake_libcuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(REPO / "tests/fixtures/fake_libcuda.c")],
                   check=True)
    lib = ctypes.CDLL(str(out))
    saved = dict(cudriver._state)
    cudriver.use(lib)
    yield lib
    cudriver._state.clear()
    cudriver._state.update(saved)


def records(lib, count):
    class Record(ctypes.Structure):
        _fields_ = [("func", ctypes.c_size_t), ("dims", ctypes.c_uint * 7), ("stream", ctypes.c_size_t),
                    ("params", ctypes.c_uint64 * 32)]

    array = (Record * 64).in_dll(lib, "fake_launches")
    total = ctypes.c_int.in_dll(lib, "fake_launch_count").value
    return [array[i % 64] for i in range(total - count, total)]


def prepared_on_host(monkeypatch, kernel):
    """A torch_op.Prepared for `kernel` whose device buffers are made-up addresses, that takes CPU
    tensors (device index -1) and launches on stream 0x5eed through the stand-in driver."""
    addresses = iter(range(0x7000_0000, 0x8000_0000, 0x10_0000))
    monkeypatch.setattr(runtime, "upload", lambda arrays: {name: next(addresses) for name in arrays})
    monkeypatch.setattr(runtime, "scratch_buffers",
                        lambda steps, plan: {a.name: next(addresses) for s in steps for a in s.args
                                             if a.kind == "scratch"})
    monkeypatch.setattr(runtime, "device_ordinal", lambda: -1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    prepared = torch_op.Prepared(kernel, torch_op.DevicePool())
    prepared.stream = lambda index: 0x5EED
    counts = (ctypes.c_int * 64).in_dll(cudriver.library(), "fake_param_count")
    for launch, step in zip(prepared.steps, kernel.steps()):
        counts[launch.func.value % 64] = len(step.args)  # how many arguments the stand-in reads
    return prepared


@pytest.mark.nvcc
@pytest.mark.parametrize("reduction", ["two_step", "atomic"])
def test_prepared_call_packs_each_steps_arguments(fake_driver, monkeypatch, reduction):
    dense = torch.nn.Linear(512, 256).half()
    layer = sgt.SparseLinear.from_dense(dense, 0.7, backend="emulate",
                                        options={"family": "tiled_csl_spmm", "split_k": 4, "reduction": reduction})
    kernel = layer.kernel(8)
    prepared = prepared_on_host(monkeypatch, kernel)
    steps = kernel.steps()
    x = torch.randn(512, 8).half()
    for call in range(2):  # the second call's operands land in the same cells
        x = x + call
        y = prepared(x)
        assert y.shape == (256, 8) and y.dtype == torch.float16
        launched = records(fake_driver, len(steps))
        for step, rec in zip(steps, launched):
            assert tuple(rec.dims) == tuple(step.launch.grid) + tuple(step.launch.block) + (step.launch.shared_bytes,)
            assert rec.stream == 0x5EED
            for i, a in enumerate(step.args):
                got = int(rec.params[i])
                if a.kind == "input":
                    assert got == x.data_ptr()
                elif a.kind == "output":
                    assert got == y.data_ptr()
                elif a.kind == "scratch":
                    assert got == int(prepared.scratch[a.name])
                else:
                    assert got == next(int(e[1]) for e in prepared.pool.entries[a.name])
    assert prepared.scratch_bytes == kernel.plan.constants["workspace_bytes"] + kernel.plan.constants["counters_bytes"]
    opt_in = ctypes.c_int.in_dll(fake_driver, "fake_opt_in").value
    assert opt_in == (steps[0].launch.shared_bytes if steps[0].launch.shared_bytes + 1024 > 48 * 1024 else 0)


@pytest.mark.nvcc
def test_prepared_call_packs_integer_arguments_and_copies_strided_operands(fake_driver, monkeypatch):
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(64, 40).half(), 0.5, backend="emulate",
                                        options={"family": "csr_rowsplit"})
    kernel = layer.kernel(4)
    prepared = prepared_on_host(monkeypatch, kernel)
    (step,) = kernel.steps()
    x = torch.randn(4, 64).half().T  # strided: the call copies it into a contiguous X
    y = prepared(x)
    (rec,) = records(fake_driver, 1)
    args = {a.name: int(rec.params[i]) for i, a in enumerate(step.args)}
    assert args["x"] != x.data_ptr() and args["y"] == y.data_ptr()
    assert args["m"] & 0xFFFFFFFF == kernel.plan.constants["m"] == 40  # 32-bit integers in the low word
    with pytest.raises(ShapeError, match=r"expected X \(64, 4\) of float16, got \(64, 4\) of float32"):
        prepared(x.float())


@pytest.mark.nvcc
def test_launch_failure_names_the_kernel_and_the_error(fake_driver, monkeypatch):
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(64, 40).half(), 0.5, backend="emulate",
                                        options={"family": "csr_rowsplit"})
    prepared = prepared_on_host(monkeypatch, layer.kernel(4))
    fail = ctypes.c_int.in_dll(fake_driver, "fake_fail_code")
    fail.value = 700
    try:
        with pytest.raises(LaunchError, match=r"launch of csr_rowsplit\.f16\.n4\.\S+ \(csr_rowsplit_spmm\) failed: "
                                                r"CUDA_ERROR_ILLEGAL_ADDRESS$"):
            prepared(torch.randn(64, 4).half())
    finally:
        fail.value = 0


def test_params_cells_are_shared_and_values_packed():
    x_cell = ctypes.c_uint64(0)
    first = cudriver.Params([("P", 0xABC), x_cell, ("i", -5)])
    second = cudriver.Params([x_cell])
    x_cell.value = 0x1234
    read = lambda params, i, t: t.from_address(params.array[i]).value  # noqa: E731
    assert read(first, 0, ctypes.c_uint64) == 0xABC and read(first, 2, ctypes.c_int32) == -5
    assert read(first, 1, ctypes.c_uint64) == read(second, 0, ctypes.c_uint64) == 0x1234


@pytest.mark.nvcc
def test_prepared_linear_reads_x_in_place_and_allocates_y_as_the_layers_view(fake_driver, monkeypatch):
    """The eager path: one row of x is X itself; more rows are copied transposed; the result is Yᵀ
    as (..., M), the strides the operator's y.t().view(...) would have, over the memory Y fills."""
    layer = sgt.SparseLinear.from_dense(torch.nn.Linear(64, 40).half(), 0.5, backend="emulate",
                                        options={"family": "csr_rowsplit"})
    for n, shape in ((1, (1, 1, 64)), (6, (2, 3, 64))):
        prepared = prepared_on_host(monkeypatch, layer.kernel(n))
        (step,) = layer.kernel(n).steps()
        x = torch.randn(shape).half()
        y = prepared.linear(x)
        (rec,) = records(fake_driver, 1)
        args = {a.name: int(rec.params[i]) for i, a in enumerate(step.args)}
        view = torch.empty(40, n).t().view(shape[:-1] + (40,))
        assert y.shape == view.shape and strides(y) == strides(view) and args["y"] == y.data_ptr()
        assert (args["x"] == x.data_ptr()) == (n == 1)


def strides(t) -> tuple:
    """The strides that matter: those of dimensions longer than one."""
    return tuple(s if d > 1 else None for d, s in zip(t.shape, t.stride()))


def test_transposed_layout_is_that_of_the_view():
    for lead, m in (((5,), 3), ((2, 3), 4), ((1, 1, 7), 2), ((4, 0), 3)):
        n = int(np.prod(lead))
        view = torch.empty(m, n).t().reshape(lead + (m,)) if n else torch.empty(lead + (m,))
        shape, layout = torch_op._transposed_layout(lead, m, n)
        assert shape == tuple(view.shape)
        if n:
            assert strides(torch.empty_strided(shape, layout)) == strides(view)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_compressing_on_the_device_gives_the_hosts_csr(dtype):
    """sgt.compressed (a CUDA weight's path to CSR) against scipy's CSR of the same dense values."""
    w = sgt.magnitude_prune(torch.randn(37, 50), 0.7).to(dtype)
    got, want = sgt.compressed(w), sp.csr_matrix(w.float().numpy())
    assert got.shape == want.shape and got.nnz == want.nnz == round(0.3 * 37 * 50) and got.has_sorted_indices
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data, want.data) and got.dtype == np.float32
    assert sgt.compressed(torch.zeros(3, 4)).nnz == 0


def test_a_layer_with_a_bias_weighs_dense_as_f_linear_runs_it():
    """The dense fallback compile() prices adds the bias in a second launch; F.linear fuses it, as
    the sparse kernels do. Where that launch alone tips selection to the sparse kernel, the layer
    asks without the bias and runs F.linear: exactly the dense pruned Linear."""
    torch.manual_seed(3)
    linear = torch.nn.Linear(2048, 2048).half()
    layer = sgt.SparseLinear.from_dense(linear, 0.8, backend="emulate")
    stats = sparsegen.analyze(layer.csr)
    with_bias = sparsegen.select(stats, op="spmm", n=1, dtype="float16", bias=True)
    fused = sparsegen.select(stats, op="spmm", n=1, dtype="float16", bias=False)
    assert with_bias.spec.family != "dense_gemm" and fused.spec.family == "dense_gemm"  # the case this is about
    x = torch.randn(1, 2048).half()
    with torch.inference_mode():
        assert torch.equal(layer(x), layer.to_linear()(x))
    assert layer.specs[1] == fused.spec.name and 1 in layer.op.dense_ns and 1 not in layer.op.kernels
    no_bias = sgt.SparseLinear(layer.dense_weight(), None, backend="emulate")
    no_bias.prepare(1)
    assert no_bias.specs[1] == fused.spec.name  # without a bias there is nothing to weigh again
    forced = sgt.SparseLinear(layer.dense_weight(), linear.bias, backend="emulate",
                              options={"family": with_bias.spec.family})
    forced.prepare(1)
    assert forced.specs[1].startswith(with_bias.spec.family) and 1 in forced.op.sparse_ns
