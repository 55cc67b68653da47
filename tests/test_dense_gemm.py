"""dense_gemm, the dense cuBLAS fallback: the densified plan, the NumPy emulator against scipy (fp16,
bf16, fp32, bias, ReLU), the generated source and its header, the steps the runtime runs, the rule's
gate and errors, the fp32 cost model's choice, and (nvcc tier) the source compiles with and without
the epilogue kernel."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc, runtime
from sparsegen.analyze import analyze
from sparsegen.errors import LaunchError, ShapeError, UnsupportedError
from sparsegen.families import dense_gemm as fam
from sparsegen.families import spec_from_dict
from sparsegen.families.base import LibraryGemm, Request, Step
from sparsegen.formats import dense as fmt
from sparsegen.formats.halfbits import from_bits, round_to
from sparsegen.select import rule_decision

from .helpers import random_csr, reference, rel_error, synthetic_device, term_error, without_tensor_cores
from .tiled_helpers import TOL, host_x, pinned_library, rounded_half


def emulate(a, n, dtype, bias=None, relu=False, seed=0):
    kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, backend="emulate",
                               options={"family": "dense_gemm"})
    x = host_x(np.random.default_rng(seed), a.shape[1], n, dtype)
    return kernel, x, kernel(x)


# ---- plan --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_plan_is_w_densified_as_16_bit_patterns_with_explicit_zeros_kept(dtype):
    a = random_csr(70, 90, 0.2, seed=1)
    a.data[::7] = 0.0  # explicit zeros stay stored entries of the CSR; they densify to 0
    plan = fmt.encode(a, dtype, bias=np.arange(70))
    w = plan.arrays["w"]
    assert w.shape == (70, 90) and w.dtype == np.uint16 and w.flags.c_contiguous
    assert np.array_equal(from_bits(w, dtype), round_to(a.toarray().astype(np.float32), dtype))
    assert plan.arrays["bias"].dtype == np.float32 and plan.constants == {"m": 70, "k": 90, "dtype": dtype}
    assert "bias" not in fmt.encode(a, dtype).arrays


def test_float32_plan_is_w_densified_exactly():
    a = random_csr(70, 90, 0.2, seed=1)
    w = fmt.encode(a, "float32").arrays["w"]
    assert w.dtype == np.float32 and w.flags.c_contiguous and np.array_equal(w, a.toarray().astype(np.float32))


# ---- emulator ----------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 150), k=st.integers(1, 150), density=st.floats(0.0, 1.0), n=st.integers(1, 70),
       dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
       epilogue=st.sampled_from(["none", "bias", "relu", "bias_relu"]), seed=st.integers(0, 1000))
@example(m=1, k=1, density=1.0, n=1, dtype="bfloat16", epilogue="bias", seed=75)  # the bias cancels W·X
def test_emulator_matches_scipy(m, k, density, n, dtype, epilogue, seed):
    a = random_csr(m, k, density, seed=seed)
    bias = np.random.default_rng(seed).standard_normal(m) if "bias" in epilogue else None
    kernel, x, y = emulate(a, n, dtype, bias, "relu" in epilogue, seed)
    assert y.shape == (m, n) and y.dtype == (np.float16 if dtype == "float16" else np.float32)
    w = a.astype(np.float32) if dtype == "float32" else rounded_half(a, dtype)
    ref = reference(w, x.astype(np.float32), bias, "relu" in epilogue)
    # Y is rounded to the 16-bit dtype before the epilogue adds the bias (cuBLAS, then a second pass:
    # formats/dense.spmm), so where the bias cancels W·X the error is relative to the terms, not to Y
    assert term_error(y, ref, w, x, bias) <= TOL[dtype]
    if "relu" in epilogue:
        assert (y >= 0).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_emulator_rounds_as_cublas_then_the_epilogue_do(dtype):
    """Y rounded to 16 bits by the GEMM, then bias added in fp32 and rounded again: exactly."""
    a = random_csr(40, 300, 0.5, seed=2)
    bias = np.random.default_rng(3).standard_normal(40)
    kernel, x, y = emulate(a, 24, dtype, bias, relu=True)
    product = round_to(rounded_half(a, dtype).toarray() @ x.astype(np.float32), dtype)
    expected = np.maximum(round_to(product + bias.astype(np.float32)[:, None], dtype), 0)
    assert np.array_equal(np.asarray(y, dtype=np.float32), expected)
    if dtype == "bfloat16":  # the values leave as float32 but are bf16 numbers
        assert np.array_equal(round_to(y, "bfloat16"), y)


def test_emulator_checks_operands_and_writes_out():
    kernel, x, y = emulate(random_csr(20, 30, 0.3, seed=4), 8, "float16")
    with pytest.raises(ShapeError, match="expected dtype float16"):
        kernel(x.astype(np.float32))
    with pytest.raises(ShapeError, match=r"\(30, 8\)"):
        kernel(np.zeros((31, 8), np.float16))
    out = np.empty((20, 8), np.float16)
    assert kernel(x, out=out) is out and np.array_equal(out, y)


# ---- spec, source, steps -----------------------------------------------------------------------

def test_spec_name_and_dict_round_trip():
    spec = fam.Spec("bf16", 7168, 28672, 16, "torch", True, True)
    assert spec.name == "dense_gemm.bf16.m7168k28672n16.torch.bias.relu"
    assert spec_from_dict(spec.to_dict()) == spec and spec.call == "torch.matmul"
    assert fam.Spec("f16", 8, 8, 1, "cupy").name == "dense_gemm.f16.m8k8n1.cupy"


def test_source_says_it_calls_cublas_with_the_exact_shapes_and_defines_no_kernel():
    a = random_csr(300, 500, 0.3, seed=5)
    kernel = sparsegen.compile(a, n=16, dtype="float16", backend="emulate", options={"family": "dense_gemm"})
    src = kernel.source
    assert src.startswith("/*") and "family:    dense_gemm" in src and "spec:      dense_gemm.f16.m300k500n16." in src
    assert f"structure: sha256:{kernel.structure_hash}" in src and "reproduce: " in src
    body = src.split("*/\n", 1)[1]
    assert "torch.matmul(W, X, out=Y)" in body or "cupy.matmul(W, X, out=Y)" in body
    assert "W 300 x 500, X 500 x 16" in body and "Y 300 x 16, all f16" in body and "300000 bytes" in body
    assert "this file defines no kernel" in body
    assert all(line.startswith("//") or not line.strip() for line in body.splitlines())  # comments only


@pytest.mark.parametrize("bias,relu,expr", [(True, False, "Y = Y + bias[row]"), (False, True, "Y = max(Y, 0)"),
                                            (True, True, "Y = max(Y + bias[row], 0)")])
def test_epilogue_kernel_is_generated_only_with_bias_or_relu(bias, relu, expr):
    spec = fam.Spec("bf16", 300, 500, 16, "torch", bias, relu)
    from sparsegen.render import render

    src = render(spec)
    assert expr in src and 'extern "C" __global__' in src and "dense_gemm_epilogue(" in src
    assert ("const float* __restrict__ bias" in src) == bias and ("fmaxf" in src) == relu
    assert "typedef __nv_bfloat16 value_t;" in src and "constexpr long long N = 16;" in src


def test_float32_source_calls_cublas_with_tf32_off_and_its_epilogue_stays_in_float():
    from sparsegen.render import render

    src = render(fam.Spec("f32", 300, 500, 16, "torch", True, False))
    assert "all f32 row-major; fp32 accumulation" in src and "TF32 off" in src and "600000 bytes" in src
    assert "typedef float value_t;" in src and "rounded once more" not in src and "32-bit values" in src
    assert fam.alignment(fam.Spec("f32", 3, 5, 2, "torch")) == 4


def test_steps_are_the_library_gemm_then_the_epilogue():
    plain = fam.steps(fam.Spec("f16", 300, 500, 16, "torch"), None)
    assert len(plain) == 1 and isinstance(plain[0], LibraryGemm)
    gemm = plain[0]
    assert (gemm.library, gemm.dtype, gemm.m, gemm.k, gemm.n) == ("torch", "float16", 300, 500, 16)
    assert [(a.name, a.kind) for a in gemm.args] == [("w", "plan"), ("x", "input"), ("y", "output")]
    assert gemm.kernel == "torch.matmul"
    gemm2, epilogue = fam.steps(fam.Spec("bf16", 300, 500, 16, "cupy", True, True), None)
    assert isinstance(epilogue, Step) and epilogue.kernel == fam.EPILOGUE_KERNEL
    assert [a.name for a in epilogue.args] == ["bias", "y"] and gemm2.dtype == "bfloat16"
    assert epilogue.launch.grid == (-(-300 * 16 // 256), 1, 1) and epilogue.launch.block == (256, 1, 1)
    assert [a.name for a in fam.steps(fam.Spec("f16", 3, 5, 2, "torch", False, True), None)[1].args] == ["y"]


# ---- rule and errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("request_,needle", [
    (Request("sddmm", n=8, k=8, dtype="float16"), "not spmm"),
    (Request("spmm", n=8, dtype="float16", options=(("out", "float32"),)), "input dtype"),
])
def test_gate_declines_what_dense_cannot_serve(request_, needle):
    d = rule_decision(analyze(random_csr(64, 64, 0.5, seed=6)), request_, fam.FAMILY)
    assert not d.accepted and needle in d.reason


def test_gate_declines_empty_and_huge_shapes():
    empty = rule_decision(analyze(sp.csr_matrix((0, 5))), Request("spmm", n=4, dtype="float16"), fam.FAMILY)
    assert not empty.accepted and "empty shape" in empty.reason
    stats = analyze(random_csr(64, 64, 0.5, seed=6))
    import dataclasses

    huge = dataclasses.replace(stats, shape=(200_000, 100_000))
    assert "GiB" in fam.gate(huge, Request("spmm", n=4, dtype="float16")).reason
    # the limit is a share of the device's memory
    small = synthetic_device(total_memory=8 << 30)
    wide = dataclasses.replace(stats, shape=(60_000, 60_000))  # 7.2 GB as fp16
    assert fam.gate(wide, Request("spmm", n=4, dtype="float16")) is None
    assert "of the NVIDIA H100 80GB HBM3's memory" in fam.gate(wide, Request("spmm", n=4, dtype="float16",
                                                                              device=small)).reason


def test_forced_without_a_binding_still_emulates_and_says_gpu_calls_fail():
    a = random_csr(30, 40, 0.5, seed=7)
    with pinned_library(None):
        kernel = sparsegen.compile(a, n=8, dtype="bfloat16", backend="emulate", options={"family": "dense_gemm"})
    assert kernel.spec.library == "torch"
    assert "GPU calls fail until one is installed" in kernel.selection.reason
    assert kernel(host_x(np.random.default_rng(0), 40, 8, "bfloat16")).shape == (30, 8)


def test_runtime_names_both_bindings_when_neither_imports(monkeypatch):
    def missing(dtype):
        raise ImportError("no module")

    monkeypatch.setattr(runtime, "ensure_context", lambda: None)
    monkeypatch.setattr(runtime, "BLAS", {"torch": missing, "cupy": missing})
    with pytest.raises(LaunchError, match=r'torch is not importable; cupy is not importable.*pip install -e "\.\[torch\]"'):
        runtime.blas("torch", "float16")


def test_runtime_reports_cupy_has_no_bfloat16(monkeypatch):
    def no_torch(dtype):
        raise ImportError("no module")

    def cupy_without_bf16(dtype):
        raise LaunchError("CuPy has no bfloat16: install torch for the bfloat16 dense fallback")

    monkeypatch.setattr(runtime, "ensure_context", lambda: None)
    monkeypatch.setattr(runtime, "BLAS", {"torch": no_torch, "cupy": cupy_without_bf16})
    with pytest.raises(LaunchError, match="CuPy has no bfloat16"):
        runtime.blas("cupy", "bfloat16")


class HostBlas:
    """A stand-in binding over NumPy arrays addressed by fake pointers: checks the runtime's plumbing
    (which buffer is A, B and C, the plan's operand fixed once, the stream passed on)."""

    def __init__(self, memory):
        self.memory, self.calls = memory, []

    def view(self, ptr, shape):
        return self.memory[ptr].reshape(shape)

    def matmul(self, a, b, c, stream=None):
        c[...] = a @ b
        self.calls.append(stream)


def test_prepared_library_step_multiplies_the_plan_operand_by_the_call_operands(monkeypatch):
    rng = np.random.default_rng(11)
    memory = {100: rng.standard_normal(6 * 4), 200: rng.standard_normal(4 * 3), 300: np.zeros(6 * 3)}
    blas = HostBlas(memory)
    monkeypatch.setattr(runtime, "blas", lambda library, dtype: blas)
    (gemm,) = fam.steps(fam.Spec("f16", 6, 4, 3, "torch"), None)
    prepared = runtime._prepare(None, gemm, {"w": 100}, None)
    assert prepared.name == "torch.matmul" and not prepared.empty
    prepared.run({"x": 200, "y": 300}, stream="s")
    expected = memory[100].reshape(6, 4) @ memory[200].reshape(4, 3)
    assert np.allclose(memory[300].reshape(6, 3), expected) and blas.calls == ["s"]
    empty = runtime._prepare(None, fam.steps(fam.Spec("f16", 0, 4, 3, "torch"), None)[0], {"w": 100}, None)
    assert empty.empty and empty.blas is None


def test_bindings_keep_the_newest_views_by_pointer_and_shape():
    class Counting(runtime._Binding):
        VIEWS = 2

        def __init__(self):
            super().__init__()
            self.wrapped = []

        def wrap(self, ptr, shape):
            self.wrapped.append((ptr, shape))
            return (ptr, shape)

    b = Counting()
    assert b.view(1, (2, 3)) == (1, (2, 3)) and b.view(1, (2, 3)) == (1, (2, 3))
    b.view(1, (3, 2))  # same pointer, other shape: another view
    b.view(2, (2, 3))  # a third: the oldest goes
    b.view(1, (3, 2))
    b.view(1, (2, 3))
    assert b.wrapped == [(1, (2, 3)), (1, (3, 2)), (2, (2, 3)), (1, (2, 3))]


def test_device_buffer_describes_the_pointer_for_torch_and_cupy():
    cai = runtime.DeviceBuffer(0x7F0000001000, (3, 4), "<i2").__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<i2", "data": (0x7F0000001000, False), "strides": None, "version": 2}


def test_forced_for_float32_runs_dense_in_float32():
    a = random_csr(20, 20, 0.5, seed=8)
    with pinned_library("cupy"):
        kernel = sparsegen.compile(a, n=8, backend="emulate", options={"family": "dense_gemm"})
    assert kernel.spec.name == "dense_gemm.f32.m20k20n8.cupy"
    x = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    assert rel_error(kernel(x), a.toarray() @ x) <= 1e-6


def test_float32_forced_with_another_output_dtype_is_unsupported():
    with pytest.raises(UnsupportedError, match="input dtype"):
        sparsegen.compile(random_csr(20, 20, 0.5, seed=8), n=8, backend="emulate",
                          options={"family": "dense_gemm", "out": "float16"})


# ---- the fp32 cost model -----------------------------------------------------------------------

def select32(a, n, library="torch", **kw):
    with pinned_library(library):
        return sparsegen.select(analyze(a), op="spmm", n=n, dtype="float32", **kw)


def test_float32_selection_takes_dense_only_where_predicted_much_faster(monkeypatch):
    without_tensor_cores(monkeypatch)  # SGEMM's own rule; dense_tile_spmm takes these first (test_dense_tile_spmm)
    half = random_csr(1024, 1024, 0.5, seed=20)  # 50 %, n = 256: dense predicted ~1.8x faster
    chosen = select32(half, 256)
    assert chosen.spec.family == "dense_gemm" and chosen.spec.dtype == "f32"
    assert "dense predicted faster: CSR kernels" in chosen.reason and "cuBLAS via torch.matmul" in chosen.reason
    sparse = random_csr(512, 512, 0.05, seed=21)  # 95 %: the CSR kernels predicted faster
    kept = select32(sparse, 256)
    assert kept.spec.family != "dense_gemm"
    assert any(r == "dense_gemm" and not ok and "sparse kept" in why for r, ok, why in kept.tried)


def test_float32_dense_needs_the_margin_and_a_binding(monkeypatch):
    from sparsegen.select import device, fp32_cost

    rates = device.default().rates
    assert fp32_cost.judge(analyze(random_csr(1024, 1024, 0.5, seed=20)), 256, rates).pick == "tensor"  # 3xTF32 first
    without_tensor_cores(monkeypatch)
    rates = device.default().rates
    v = fp32_cost.judge(analyze(random_csr(1024, 1024, 0.5, seed=20)), 256, rates)
    assert v.dense and v.dense_s * rates.fp32.sgemm_margin < v.sparse_s
    near = fp32_cost.judge(analyze(random_csr(512, 512, 0.5, seed=22)), 256, rates)  # dense ahead, by less than the margin
    assert near.dense_s < near.sparse_s < near.dense_s * rates.fp32.sgemm_margin and not near.dense
    assert select32(random_csr(1024, 1024, 0.5, seed=20), 256, library=None).spec.family != "dense_gemm"


def test_float32_epilogue_costs_the_dense_path_a_pass_over_y():
    from sparsegen.select import fp32_cost
    from sparsegen.select.device import default

    stats, rates = analyze(random_csr(1024, 1024, 0.5, seed=20)), default().rates
    assert fp32_cost.judge(stats, 256, rates, epilogue=True).dense_s > fp32_cost.judge(stats, 256, rates).dense_s


def test_plan_cache_round_trip_keeps_the_spec():
    a = random_csr(50, 60, 0.4, seed=9)
    first = sparsegen.compile(a, n=12, dtype="float16", bias=np.ones(50), relu=True, backend="emulate",
                              options={"family": "dense_gemm"})
    again = sparsegen.compile(a, n=12, dtype="float16", bias=np.ones(50), relu=True, backend="emulate",
                              options={"family": "dense_gemm"})
    assert again.timings.cached["plan"] and again.spec == first.spec and again.source == first.source
    x = host_x(np.random.default_rng(1), 60, 12, "float16")
    assert np.array_equal(again(x), first(x))


# ---- nvcc tier ---------------------------------------------------------------------------------

@pytest.mark.nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("bias,relu", [(False, False), (True, False), (False, True), (True, True)])
def test_source_compiles_for_sm90(dtype, bias, relu):
    a = random_csr(100, 120, 0.3, seed=10)
    kernel = sparsegen.compile(a, n=24, dtype=dtype, bias=np.ones(100) if bias else None, relu=relu,
                               backend="emulate", options={"family": "dense_gemm"})
    cubin = nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)
    assert cubin[:4] == b"\x7fELF"
    assert (fam.EPILOGUE_KERNEL.encode() in cubin) == (bias or relu)
