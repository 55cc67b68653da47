"""sparsegen.compile on the CPU (emulator backend): the pipeline, the plan cache, the errors."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import sparsegen
from sparsegen import api
from sparsegen.errors import FormatError, ShapeError, SparsegenError, UnsupportedError

from .helpers import random_csr, reference, rel_error


def test_compile_returns_a_kernel_exposing_every_stage():
    a = random_csr(100, 80, 0.1, seed=1)
    k = sparsegen.compile(a, op="spmm", n=16, backend="emulate")
    assert k.spec.name.startswith("csr_rowsplit.f32.n16.")
    assert k.selection.spec == k.spec and k.selection.reason
    assert k.source.startswith("/*") and 'extern "C"' in k.source
    assert set(k.plan.arrays) == {"indptr", "indices", "values"}
    assert k.shape == (100, 80) and k.stats.nnz == a.nnz
    x = np.random.default_rng(0).standard_normal((80, 16)).astype(np.float32)
    assert rel_error(k(x), reference(a, x)) <= 1e-5
    out = np.empty((100, 16), np.float32)
    assert k(x, out=out) is out


def test_compile_accepts_dense_arrays_and_other_sparse_formats():
    d = np.array([[0, 2.0, 0], [1.0, 0, 0]], dtype=np.float32)
    for m in (d, sp.coo_matrix(d), sp.csc_array(d)):
        k = sparsegen.compile(m, n=2, backend="emulate")
        assert np.allclose(k(np.eye(3, 2, dtype=np.float32)), d @ np.eye(3, 2))


def test_compile_a_file_path_with_reader_options(examples_dir):
    k = sparsegen.compile(examples_dir / "n1024-l1.tsv.gz", n=4, backend="emulate", shape=(1024, 1024))
    assert k.shape == (1024, 1024)
    layer = examples_dir / "n1024-l1.tsv.gz"
    assert f"reproduce: sparsegen compile {layer} --op spmm --n 4 --dtype float32" in k.source
    sddmm = sparsegen.compile(examples_dir / "n1024-l1.tsv.gz", op="sddmm", k=64, backend="emulate")
    assert "--op sddmm --k 64 --dtype float32" in sddmm.source


def test_bias_and_relu_fuse():
    a = random_csr(50, 40, 0.2, seed=2)
    x = np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32)
    k = sparsegen.compile(a, n=8, bias=-0.5, relu=True, backend="emulate")
    assert k.spec.bias and k.spec.relu and k.spec.name.endswith(".bias.relu")
    assert rel_error(k(x), reference(a, x, np.full(50, -0.5), True)) <= 1e-6


@pytest.mark.parametrize("kwargs,error,needle", [
    ({"n": 0}, ShapeError, "positive integer"),
    ({"n": 2.5}, ShapeError, "positive integer"),
    ({"n": 4, "op": "spgemm"}, UnsupportedError, "spgemm"),
    ({"n": 4, "dtype": "float64"}, UnsupportedError, "float64"),
    ({"n": 4, "bias": [1.0, 2.0]}, ShapeError, "bias"),
    ({"n": 4, "backend": "tpu"}, SparsegenError, "backend"),
    ({"n": 4, "arch": "sm90"}, SparsegenError, "sm_XY"),
])
def test_bad_requests_are_named(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        sparsegen.compile(random_csr(10, 10, 0.3), **{"backend": "emulate", **kwargs})


def test_non_finite_values_are_rejected():
    a = random_csr(10, 10, 0.5)
    a.data[3] = np.nan
    with pytest.raises(FormatError, match="NaN|non-finite|finite"):
        sparsegen.compile(a, n=4, backend="emulate")


def test_operand_errors_name_expected_and_given():
    k = sparsegen.compile(random_csr(10, 12, 0.3), n=4, backend="emulate")
    with pytest.raises(ShapeError, match=r"input x: expected shape \(12, 4\), got \(4, 12\)"):
        k(np.zeros((4, 12), np.float32))
    with pytest.raises(ShapeError, match="float64"):
        k(np.zeros((12, 4)))


def test_warm_compile_loads_the_plan_and_runs_no_analysis(monkeypatch):
    a = random_csr(300, 200, 0.05, seed=9)
    cold = sparsegen.compile(a, n=32, backend="emulate")
    assert cold.timings.cached["plan"] is False
    api = importlib.import_module("sparsegen.api")

    def boom(*_):
        raise AssertionError("analysis ran on a warm compile")

    monkeypatch.setattr(api, "analyze", boom)
    monkeypatch.setattr(api, "select_request", boom)
    warm = sparsegen.compile(a, n=32, backend="emulate")
    assert warm.timings.cached["plan"] is True
    assert warm.spec == cold.spec and warm.source == cold.source
    assert warm.selection.to_dict() == cold.selection.to_dict()
    for name, arr in cold.plan.arrays.items():
        assert np.array_equal(warm.plan.arrays[name], arr)
    assert warm.stats == cold.stats


def test_plan_key_separates_values_bias_n_and_dtype():
    a = random_csr(60, 60, 0.1, seed=4)
    b = a.copy()
    b.data *= 2
    sparsegen.compile(a, n=8, backend="emulate")
    for other in (dict(matrix=b, n=8), dict(matrix=a, n=9), dict(matrix=a, n=8, dtype="float16"),
                  dict(matrix=a, n=8, bias=1.0)):
        k = sparsegen.compile(backend="emulate", **other)
        assert k.timings.cached["plan"] is False, other


def test_auto_backend_without_gpu_warns_and_emulates(monkeypatch):
    runtime = importlib.import_module("sparsegen.runtime")
    monkeypatch.setattr(runtime, "available", lambda: False)
    with pytest.warns(RuntimeWarning, match="emulator"):
        k = sparsegen.compile(random_csr(5, 5, 0.5), n=2)
    assert k.backend == "emulate"


def test_describe_is_json():
    k = sparsegen.compile(random_csr(30, 30, 0.1), n=8, backend="emulate")
    d = json.loads(json.dumps(k.describe()))
    assert d["selection"]["spec"] == k.spec.name and d["stats"]["nnz"] == k.stats.nnz


@pytest.mark.nvcc
def test_dump_writes_source_cubin_selection_and_sass(tmp_path):
    k = sparsegen.compile(random_csr(30, 30, 0.1), n=8, backend="emulate")
    written = k.dump(tmp_path)
    name = k.spec.name
    assert (tmp_path / f"{name}.cu").read_text() == k.source
    assert (tmp_path / f"{name}.cubin").read_bytes()[:4] == b"\x7fELF"
    sel = json.loads((tmp_path / "selection.json").read_text())
    assert sel["selection"]["reason"] == k.selection.reason and "stats" in sel
    if "sass" in written:
        assert "csr_rowsplit_spmm" in written["sass"].read_text()


# ---- values the kernel's dtype cannot hold ----------------------------------------------------

def two_by_two(value, dtype=np.float64):
    return sp.csr_matrix(np.array([[1.0, value], [0.0, 1.0]], dtype))


@pytest.mark.parametrize("value,dtype,stored", [
    (1e300, np.float64, "float32"),
    (70000.0, np.float32, "float16"),
    (65520.0, np.float32, "float16"),  # halfway past 65504: rounds to even, which is inf
    (3.4e38, np.float32, "bfloat16"),
    (1e39, np.float64, "bfloat16"),
])
def test_values_the_storage_dtype_cannot_hold_are_named(value, dtype, stored):
    with pytest.raises(FormatError, match=rf"<matrix>: expected finite values that {stored} can hold .*"
                                          rf"found .* at \(row 0, col 1\) \(0-based\), which is inf in {stored}"):
        sparsegen.compile(two_by_two(value, dtype), n=2, dtype=stored, backend="emulate")


@pytest.mark.parametrize("value,stored", [(65504.0, "float16"), (3.3895e38, "bfloat16"), (3.4e38, "float32")])
def test_the_largest_values_a_dtype_holds_compile(value, stored):
    k = sparsegen.compile(two_by_two(value, np.float32), n=2, dtype=stored, backend="emulate")
    y = k(np.ones((2, 2), np.float16 if stored == "float16" else np.float32))  # bf16 travels as float32
    assert np.isfinite(y).all() and y[0, 0] >= value


def test_an_overflowing_file_value_names_the_file(tmp_path):
    f = tmp_path / "m.tsv"
    f.write_text("1\t1\t1.0\n2\t2\t70000\n")
    with pytest.raises(FormatError, match=r"m\.tsv: expected finite values that float16 can hold.*"
                                          r"70000\.0 at \(row 1, col 1\)"):
        sparsegen.compile(f, n=2, dtype="float16", backend="emulate")


def test_sddmm_reads_only_the_pattern():
    k = sparsegen.compile(two_by_two(1e300), op="sddmm", k=4, backend="emulate")
    assert k.plan.constants["nnz"] == 3


@pytest.mark.parametrize("bias,needle", [
    (float("nan"), "found nan$"),
    (float("inf"), "found inf$"),
    (-1e300, r"found -1e\+300, which is inf in float32$"),
    ([1.0, float("nan")], "found nan at index 1$"),
    ([1.0, 1e39], r"found 1e\+39 at index 1, which is inf in float32$"),
    ("0.5", "expected real numbers, got str"),
])
def test_a_bias_the_kernel_cannot_store_is_an_error(bias, needle):
    with pytest.raises(ShapeError, match=r"^bias: .*" + needle):
        sparsegen.compile(two_by_two(2.0), n=2, bias=bias, backend="emulate")


@pytest.mark.parametrize("kwargs,needle", [
    ({"bias": float("nan")}, "bias: .* found nan"),
    ({"bias": -0.3, "cap": float("inf")}, "cap: .* found inf"),
    ({"bias": -0.3, "cap": 1e40}, r"cap: .* found 1e\+40, which is inf in float32"),
])
def test_spdnn_layer_bias_and_cap_must_be_finite(kwargs, needle):
    with pytest.raises(ShapeError, match=needle):
        sparsegen.compile(two_by_two(2.0), op="spdnn_layer", backend="emulate", **kwargs)


# ---- operands: refused, never converted, on both backends ------------------------------------

def _strided_view(x):
    wide = np.zeros((x.shape[0], 2 * x.shape[1]), x.dtype)
    return wide[:, ::2]


BAD_INPUTS = [
    (lambda x: x.tolist(), r"input x: expected a NumPy array .*, got list$"),
    (lambda x: float(x[0, 0]), r"input x: expected a NumPy array .*, got float$"),
    (lambda x: x.reshape(12, 4, 1), r"input x: expected shape \(12, 4\), got \(12, 4, 1\)$"),
    (lambda x: x.astype(np.float64), r"input x: expected dtype float32, got float64"),
    (np.asfortranarray, r"input x: expected a C-contiguous \(row-major\) array, got strides \(4, 48\)"),
    (_strided_view, r"input x: expected a C-contiguous \(row-major\) array, got strides \(32, 8\)"),
]


def _read_only(shape):
    out = np.full(shape, 7.0, np.float32)
    out.flags.writeable = False
    return out


BAD_OUTPUTS = [
    (_read_only, r"output y: expected a writeable array, got a read-only one$"),
    (lambda shape: np.full(shape, 7.0, np.float32).tolist(), r"output y: expected a NumPy array, as the inputs are, "
                                                              r"got list$"),
    (lambda shape: np.full(shape, 7.0), r"output y: expected dtype float32, got float64"),
    (lambda shape: np.full(shape[::-1], 7.0, np.float32), r"output y: expected shape \(10, 4\), got \(4, 10\)$"),
    (lambda shape: np.full(shape + (1,), 7.0, np.float32), r"output y: expected shape \(10, 4\), got \(10, 4, 1\)$"),
    (lambda shape: np.full(shape, 7.0, np.float32, order="F"), r"output y: expected a C-contiguous"),
    (lambda shape: _strided_view(np.full(shape, 7.0, np.float32)), r"output y: expected a C-contiguous"),
]


def emulated_kernel():
    k = sparsegen.compile(random_csr(10, 12, 0.3, seed=3), n=4, backend="emulate")
    return k, np.ones((12, 4), np.float32)


@pytest.mark.parametrize("make,needle", BAD_INPUTS)
def test_the_emulator_refuses_inputs_it_would_have_to_convert(make, needle):
    k, x = emulated_kernel()
    with pytest.raises(ShapeError, match=needle):
        k(make(x))


@pytest.mark.parametrize("make,needle", BAD_OUTPUTS)
def test_the_emulator_refuses_an_out_it_cannot_write_and_leaves_it_alone(make, needle):
    k, x = emulated_kernel()
    out = make((10, 4))
    before = np.array(out, copy=True)
    with pytest.raises(ShapeError, match=needle):
        k(x, out=out)
    assert np.array_equal(np.asarray(out), before)


def test_the_emulator_refuses_a_cpu_torch_tensor():
    torch = pytest.importorskip("torch", reason="torch not installed")
    k, x = emulated_kernel()
    with pytest.raises(ShapeError, match=r"input x: expected a NumPy array .*, got torch\.Tensor on cpu$"):
        k(torch.from_numpy(x))


class _Launcher:
    """The parts of runtime.Launcher that the host path reads before it touches the GPU."""

    def __init__(self, kernel):
        self.inputs, self.output = kernel.family.operands(kernel.spec, kernel.plan)


@pytest.mark.parametrize("make,needle", BAD_INPUTS)
def test_the_gpu_backend_checks_host_inputs_as_the_emulator_does(make, needle):
    """runtime's host path raises, before it needs a GPU, the error the emulator raises."""
    from sparsegen import runtime

    k, x = emulated_kernel()
    with pytest.raises(ShapeError, match=needle) as gpu:
        runtime._run_host(k.spec.family, _Launcher(k), (make(x),), None, None)
    with pytest.raises(ShapeError) as emulated:
        k(make(x))
    assert str(gpu.value).replace(runtime.GPU_TAKES, "*") == str(emulated.value).replace(api.EMULATOR_TAKES, "*")


@pytest.mark.parametrize("make,needle", BAD_OUTPUTS)
def test_the_gpu_backend_checks_a_host_out_as_the_emulator_does(make, needle):
    from sparsegen import runtime

    k, x = emulated_kernel()
    with pytest.raises(ShapeError, match=needle) as gpu:
        runtime._run_host(k.spec.family, _Launcher(k), (x,), make((10, 4)), None)
    with pytest.raises(ShapeError) as emulated:
        k(x, out=make((10, 4)))
    assert str(gpu.value) == str(emulated.value)


def test_operand_count_reads_alike_on_both_backends():
    from sparsegen import runtime

    k, x = emulated_kernel()
    with pytest.raises(ShapeError, match=r"^csr_rowsplit takes 1 operand\(s\) \(x\), got 2$"):
        k(x, x)
    with pytest.raises(ShapeError, match=r"^csr_rowsplit takes 1 operand\(s\) \(x\), got 0$"):
        runtime._run_host(k.spec.family, _Launcher(k), (), None, None)


def test_the_plan_fingerprint_covers_what_shapes_a_plan_and_nothing_else(tmp_path):
    """Editing the CLI keeps every cached plan; editing a family, a format, the selection, its rates
    or a template misses."""
    import shutil

    from sparsegen.fingerprint import generator_fingerprint as cached
    from sparsegen.render import template_dir

    package, templates = tmp_path / "sparsegen", tmp_path / "templates"
    shutil.copytree(Path(sparsegen.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(template_dir(), templates)
    generator_fingerprint = cached.__wrapped__  # the files change under the same arguments
    base = generator_fingerprint(package, templates)
    for unrelated in ("cli.py", "io/tsv.py", "bench/llm.py", "cache.py"):
        with open(package / unrelated, "a") as f:
            f.write("\n# an edit\n")
        assert generator_fingerprint(package, templates) == base, unrelated
    for shaping in ("families/csr_rowsplit.py", "formats/csr.py", "select/policy.py", "select/rates/h200.json",
                    "analyze.py", "render.py", "api.py", "dtypes.py", "families/options.py",
                    "families/contract.py"):
        original = (package / shaping).read_bytes()
        (package / shaping).write_bytes(original + b"\n")
        assert generator_fingerprint(package, templates) != base, shaping
        (package / shaping).write_bytes(original)
    assert generator_fingerprint(package, templates) == base
    (templates / "csr_rowsplit.cu.j2").write_text((templates / "csr_rowsplit.cu.j2").read_text() + "\n")
    assert generator_fingerprint(package, templates) != base


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_extremes_of_float32_and_float16_values_decide_storability(dtype):
    """A float32 or float16 array is judged by its largest and smallest values; each side of the
    float16 limit, either sign, and NaN (which compares false both ways) are told apart."""
    from sparsegen.values import first_unstorable

    below = np.nextafter(np.float32(65520.0), np.float32(0))  # rounds to 65504, the largest half
    fine = np.array([1.0, -65504.0, 65504.0], dtype)
    assert first_unstorable(fine, "float16") is None
    if dtype == np.float32:
        assert first_unstorable(np.array([below, -below], np.float32), "float16") is None
        assert first_unstorable(np.array([0.5, 65520.0, 1.0], np.float32), "float16") == (1, 1)
        assert first_unstorable(np.array([-65520.0, 0.5], np.float32), "float16") == (0, 1)
        assert first_unstorable(np.array([3.4e38], np.float32), "bfloat16") == (0, 1)
    assert first_unstorable(np.array([1.0, np.nan], dtype), "float16") == (1, 1)
    assert first_unstorable(np.array([1.0, -np.inf, np.inf], dtype), "float16") == (1, 2)
