"""sparsegen.torch on the CPU: magnitude pruning (exact counts, ties), validation errors, and the
x -> Xᵀ -> Y -> yᵀ layout mapping through the NumPy emulator (backend="emulate") against an
independent float64 product. Skips where torch is not installed (CI installs no torch)."""
from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: sparsegen.torch is optional")

import sparsegen.torch as sgt  # noqa: E402
from sparsegen import torch_op  # noqa: E402
from sparsegen.errors import ShapeError, SparsegenError, UnsupportedError  # noqa: E402

from .conftest import REPO  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-6}


def linear(k, m, dtype=torch.float32, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(k, m, bias=bias).to(dtype)


def reference(layer: sgt.SparseLinear, x):
    """y = x·Wᵀ + b in float64 from the layer's pruned dense weight, independent of the kernels."""
    y = x.double() @ layer.dense_weight().double().T
    if layer.bias is not None:
        y = y + torch.from_numpy(layer.bias).double()
    return y


def rel_error(y, ref) -> float:
    return float((y.double() - ref).norm() / ref.norm())


# ---- pruning ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (64, 48), (3, 1000)])
@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.25, 0.5, 0.7, 0.95, 0.999])
def test_prune_zeroes_exactly_round_sparsity_numel(shape, sparsity):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1)) + 1e-3  # no zeros to begin with
    pruned = sgt.magnitude_prune(w, sparsity)
    zeros = int((pruned == 0).sum())
    assert zeros == round(sparsity * w.numel())
    kept = pruned != 0
    assert torch.equal(pruned[kept], w[kept])  # survivors are untouched
    if kept.any() and (~kept).any():
        assert w[kept].abs().min() >= w[~kept].abs().max()  # the largest magnitudes survive


def test_prune_ties_break_by_flat_index_deterministically():
    w = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]])  # six equal magnitudes
    pruned = sgt.magnitude_prune(w, 0.5)
    assert torch.equal(pruned, torch.tensor([[0.0, 0.0, 0.0], [-1.0, 1.0, -1.0]]))
    mixed = torch.tensor([3.0, -2.0, 2.0, 1.0, -2.0, 5.0])  # the tie at |2| straddles the cut
    assert torch.equal(sgt.magnitude_prune(mixed, 0.5), torch.tensor([3.0, 0.0, 0.0, 0.0, -2.0, 5.0]))
    assert torch.equal(sgt.magnitude_prune(mixed, 0.5), sgt.magnitude_prune(mixed.clone(), 0.5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_prune_keeps_dtype_and_leaves_the_input_alone(dtype):
    w = torch.randn(16, 24).to(dtype)
    before = w.clone()
    pruned = sgt.magnitude_prune(w, 0.6)
    assert pruned.dtype == dtype and pruned.shape == w.shape
    assert torch.equal(w, before)


def test_prune_keeps_existing_zeros_past_the_count():
    w = torch.tensor([0.0, 0.0, 0.0, 4.0, 5.0])
    assert int((sgt.magnitude_prune(w, 0.2) == 0).sum()) == 3  # round(0.2 * 5) = 1, but three were zero


def test_prune_rejects_non_finite_weights():
    with pytest.raises(ShapeError, match=r"weight \(magnitude pruning needs finite weights\): .*found nan at index 1"):
        sgt.magnitude_prune(torch.tensor([1.0, float("nan")]), 0.5)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), True, "0.5", None])
def test_sparsity_outside_zero_one_is_rejected(bad):
    with pytest.raises(SparsegenError, match=r"sparsity must be a number in \[0, 1\)"):
        sgt.SparseLinear.from_dense(linear(8, 8), bad, backend="emulate")


# ---- construction errors ----------------------------------------------------------------------

def test_from_dense_takes_only_linear():
    with pytest.raises(SparsegenError, match="takes a torch.nn.Linear, got Conv1d"):
        sgt.SparseLinear.from_dense(torch.nn.Conv1d(4, 4, 1), 0.5)


def test_unknown_method_is_rejected():
    with pytest.raises(SparsegenError, match="method 'random'"):
        sgt.SparseLinear.from_dense(linear(8, 8), 0.5, method="random")


def test_unsupported_dtypes_are_rejected():
    with pytest.raises(UnsupportedError, match="weight's dtype float64.*pass dtype="):
        sgt.SparseLinear.from_dense(linear(8, 8, torch.float64), 0.5)
    with pytest.raises(UnsupportedError, match="dtype int8"):
        sgt.SparseLinear.from_dense(linear(8, 8), 0.5, dtype=torch.int8)
    layer = sgt.SparseLinear.from_dense(linear(8, 8, torch.float64), 0.5, dtype=torch.float16, backend="emulate")
    assert layer.dtype == "float16" and layer.torch_dtype == torch.float16


def test_bad_backend_kernel_count_and_bias_are_rejected():
    w = torch.randn(4, 6)
    with pytest.raises(SparsegenError, match="backend 'cuda'"):
        sgt.SparseLinear(w, backend="cuda")
    with pytest.raises(SparsegenError, match="max_kernels"):
        sgt.SparseLinear(w, max_kernels=0)
    with pytest.raises(ShapeError, match=r"bias: expected shape \(4,\)"):
        sgt.SparseLinear(w, torch.zeros(6))
    with pytest.raises(ShapeError, match="2-D"):
        sgt.SparseLinear(torch.randn(4, 6, 2))
    with pytest.raises(UnsupportedError, match="options out='float32'"):
        sgt.SparseLinear(w, options={"out": "float32"})


# ---- forward errors ---------------------------------------------------------------------------

def test_cpu_tensor_into_a_gpu_layer_says_what_to_do():
    layer = sgt.SparseLinear.from_dense(linear(8, 4, torch.float16), 0.5)  # backend gpu: compiles at forward
    with torch.no_grad(), pytest.raises(ShapeError, match="input is on cpu.*move it to CUDA.*backend='emulate'"):
        layer(torch.randn(3, 8).half())
    assert layer.specs == {}  # rejected before any compile


def test_wrong_last_dimension_dtype_and_rank_are_rejected():
    layer = sgt.SparseLinear.from_dense(linear(8, 4), 0.5, backend="emulate")
    with torch.no_grad():
        with pytest.raises(ShapeError, match=r"expected shape \(\.\.\., 8\), got \(3, 7\)"):
            layer(torch.randn(3, 7))
        with pytest.raises(ShapeError, match=r"expected shape \(\.\.\., 8\), got \(\)"):
            layer(torch.tensor(1.0))
        with pytest.raises(ShapeError, match="expected dtype float32 .*got float16"):
            layer(torch.randn(3, 8).half())
        with pytest.raises(ShapeError, match="takes a torch.Tensor, got ndarray"):
            layer(np.zeros((3, 8), np.float32))


def test_forward_with_autograd_is_refused():
    layer = sgt.SparseLinear.from_dense(linear(8, 4), 0.5, backend="emulate")
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(UnsupportedError, match="inference-only"):
        layer(x)
    with torch.no_grad():
        assert layer(x).shape == (3, 4)


# ---- the layout mapping, through the emulator -------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(), (1,), (7,), (16,), (2, 5)])
def test_emulated_forward_matches_float64(dtype, bias, lead):
    layer = sgt.SparseLinear.from_dense(linear(40, 24, dtype, bias), 0.7, backend="emulate")
    x = torch.randn(lead + (40,), generator=torch.Generator().manual_seed(3)).to(dtype)
    with torch.no_grad():
        y = layer(x)
    assert y.shape == lead + (24,) and y.dtype == dtype and y.device.type == "cpu"
    assert rel_error(y, reference(layer, x)) <= TOL[dtype]


def test_non_contiguous_and_offset_inputs_are_read_correctly():
    layer = sgt.SparseLinear.from_dense(linear(16, 12, torch.float16), 0.5, backend="emulate")
    big = torch.randn(9, 40).half()
    with torch.no_grad():
        for x in (big[:, 3:19], big.T[:16].T, big[2:5, 7:23], big.reshape(-1)[1:17]):
            assert rel_error(layer(x), reference(layer, x)) <= TOL[torch.float16]


def test_output_is_contiguous_and_chains():
    """forward returns Yᵀ contiguous, as nn.Linear does (attention reads a strided query on a slow
    path); one row's result is Y itself, uncopied; layers chain on it."""
    first = sgt.SparseLinear.from_dense(linear(32, 24, torch.float16, seed=1), 0.6, backend="emulate")
    second = sgt.SparseLinear.from_dense(linear(24, 8, torch.float16, seed=2), 0.6, backend="emulate")
    x = torch.randn(2, 5, 32).half()
    with torch.no_grad():
        h = first(x)
        assert h.shape == (2, 5, 24) and h.is_contiguous() and h.stride() == (120, 24, 1)
        one = first(x[:1, :1])
        assert one.shape == (1, 1, 24) and one.is_contiguous()
        y = second(h)
    assert rel_error(y, reference(second, reference(first, x).half())) <= TOL[torch.float16]


def test_misaligned_operand_is_copied_to_an_aligned_buffer():
    base = torch.zeros(64, dtype=torch.float16)
    xt = base[1:17].view(16, 1)  # contiguous, but 2 bytes past the allocation's alignment
    assert xt.is_contiguous() and xt.data_ptr() % 16
    out = torch_op.kernel_operand(xt, 16)
    assert out.data_ptr() % 16 == 0 and torch.equal(out, xt)
    assert torch_op.kernel_operand(xt, 2) is xt  # aligned enough for 2-byte loads
    fresh = torch.zeros(16, 1, dtype=torch.float16)
    assert torch_op.kernel_operand(fresh, 16) is fresh
    assert torch_op.kernel_operand(fresh.T.contiguous().T, 16).is_contiguous()  # strided: copied


def test_zero_tokens_give_an_empty_result_without_a_kernel():
    layer = sgt.SparseLinear.from_dense(linear(8, 4), 0.5, backend="emulate")
    with torch.no_grad():
        assert layer(torch.empty(0, 8)).shape == (0, 4)
        assert layer(torch.empty(2, 0, 8)).shape == (2, 0, 4)
    assert layer.specs == {}


def test_kernels_are_kept_per_token_count_least_recently_used_first_out():
    layer = sgt.SparseLinear.from_dense(linear(16, 8), 0.5, backend="emulate", max_kernels=2)
    with torch.no_grad():
        for n in (1, 2, 1, 3):
            layer(torch.randn(n, 16))
    assert list(layer.specs) == [1, 3]
    assert layer.kernel(3) is layer.kernel(3)
    assert all(f".n{n}." in name for n, name in layer.specs.items())


def test_options_reach_the_compiler_and_bias_is_fused():
    layer = sgt.SparseLinear.from_dense(linear(64, 32, torch.float16), 0.5, backend="emulate",
                                        options={"family": "tiled_csl_spmm"})
    assert layer.kernel(8).spec.name.startswith("tiled_csl_spmm.") and layer.kernel(8).spec.name.endswith(".bias")


def test_to_linear_holds_the_pruned_weights():
    dense = linear(20, 10, torch.float16)
    layer = sgt.SparseLinear.from_dense(dense, 0.4, backend="emulate")
    ref = layer.to_linear()
    assert ref.weight.dtype == torch.float16
    assert torch.equal(ref.weight, sgt.magnitude_prune(dense.weight, 0.4))
    assert torch.equal(ref.bias, dense.bias)
    assert layer.nnz == 200 - 80 and layer.sparsity == pytest.approx(0.4)


# ---- sparsify ---------------------------------------------------------------------------------

def toy_model(dtype=torch.float32):
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU()),
                               torch.nn.Linear(48, 16, bias=False)).to(dtype)


def dense_pruned(model, sparsity, names):
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for name in names:
            w = ref.get_submodule(name).weight
            w.copy_(sgt.magnitude_prune(w, sparsity))
    return ref


def test_sparsify_replaces_every_linear_and_matches_dense_pruned():
    model = toy_model(torch.float16)
    ref = dense_pruned(model, 0.6, ["0", "2.0", "3"])
    report = sgt.sparsify(model, 0.6, backend="emulate", precompile=(5,))
    assert [r.name for r in report.layers] == ["0", "2.0", "3"]
    assert [(r.out_features, r.in_features, r.bias) for r in report.layers] == [(64, 32, True), (48, 64, True),
                                                                                 (16, 48, False)]
    for r in report.layers:
        assert r.nnz == r.in_features * r.out_features - round(0.6 * r.in_features * r.out_features)
        assert list(r.specs) == [5] and model.get_submodule(r.name) is r.module
    table = report.table()
    assert "2.0" in table and report.layers[0].specs[5] in table
    x = torch.randn(5, 32).half()
    with torch.no_grad():
        assert rel_error(model(x), ref(x).double()) <= TOL[torch.float16]


def test_sparsify_filters_by_name_and_reports_no_match():
    model = toy_model()
    report = sgt.sparsify(model, 0.5, include=lambda name: name != "3", backend="emulate")
    assert [r.name for r in report.layers] == ["0", "2.0"]
    assert type(model[3]) is torch.nn.Linear and isinstance(model[0], sgt.SparseLinear)
    assert report.layers[0].specs == {}  # nothing compiled until a forward
    with pytest.raises(SparsegenError, match="no torch.nn.Linear in the model matches include"):
        sgt.sparsify(toy_model(), 0.5, include=lambda name: False)
    with pytest.raises(SparsegenError, match="wrap a bare Linear"):
        sgt.sparsify(torch.nn.Linear(4, 4), 0.5)


# ---- import isolation and the example's model preparation -------------------------------------

def test_importing_sparsegen_does_not_import_torch():
    code = "import sys, sparsegen; assert 'torch' not in sys.modules, 'sparsegen imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_prepare_minilm_converts_floats_to_fp16(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import prepare_minilm
    finally:
        sys.path.pop(0)
    weights = {"w": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), "ids": np.arange(5, dtype=np.int64)}
    out = safetensors.load(prepare_minilm.to_fp16(safetensors.save(weights)))
    assert out["w"].dtype == np.float16 and np.array_equal(out["w"], weights["w"].astype(np.float16))
    assert out["ids"].dtype == np.int64 and np.array_equal(out["ids"], weights["ids"])
    with pytest.raises(SystemExit, match="not an all-MiniLM-L6-v2 folder"):
        prepare_minilm.read_files(tmp_path)


def test_weights_and_biases_the_layer_dtype_cannot_hold_are_named():
    w = torch.tensor([[1.0, 0.0, 70000.0], [0.0, 2.0, 0.0]])
    with pytest.raises(ShapeError, match=r"^weight: expected finite values that float16 can hold .*"
                                         r"found 70000\.0 at index \(0, 2\), which is inf in float16$"):
        sgt.SparseLinear(w, dtype="float16", backend="emulate")
    assert sgt.SparseLinear(w, dtype="float32", backend="emulate").nnz == 3  # float32 holds it
    with pytest.raises(ShapeError, match=r"^weight: .*at index \(0, 0\), which is inf in bfloat16$"):
        sgt.SparseLinear(torch.tensor([[3.4e38, 1.0]]), dtype="bfloat16", backend="emulate")
    with pytest.raises(ShapeError, match=r"^bias: .*found 100000\.0 at index 1, which is inf in float16$"):
        sgt.SparseLinear(torch.ones(2, 3), torch.tensor([1.0, 1e5]), dtype="float16", backend="emulate")
    with pytest.raises(ShapeError, match=r"^bias: .*found nan at index 0$"):
        sgt.SparseLinear(torch.ones(2, 3), torch.tensor([float("nan"), 1.0]), backend="emulate")
    with pytest.raises(ShapeError, match=r"^weight: .*found inf at index \(1, 1\)$"):
        sgt.SparseLinear(torch.tensor([[1.0, 0.0], [0.0, float("inf")]]), backend="emulate")
