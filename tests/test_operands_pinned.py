"""The operand checks pinned, on the CPU: operands.py's host checks (every message whole, each
check on both sides), and runtime.py's GPU-side checks on stand-ins (an object with
`__cuda_array_interface__`, a class that says it is a torch tensor) with the device ordinal fixed."""
from __future__ import annotations

import numpy as np
import pytest

from sparsegen import operands, runtime
from sparsegen.errors import LaunchError, ShapeError
from sparsegen.families.base import Operand

X = Operand("x", (2, None), "float32")
XG = Operand("x", (2, 7), "float32")  # GPU operands have every dimension fixed
Y = Operand("y", (2, 3), "float32")
ACCEPTED = "a NumPy array"


def shape_error(fn, *args) -> str:
    with pytest.raises(ShapeError) as e:
        fn(*args)
    return str(e.value)


# ================================================================================== operands.py

def test_shape_text():
    assert operands.shape_text((12, None)) == "(12, any)"
    assert operands.shape_text((None,)) == "(any)"
    assert operands.shape_text(()) == "()"
    assert operands.shape_text((0, 3)) == "(0, 3)"


class Tensorish:
    def __init__(self, device):
        self.device = device


def test_kind_of_names_what_was_passed():
    assert operands.kind_of([1]) == "list"
    assert operands.kind_of(np.zeros(1)) == "ndarray"
    assert operands.kind_of(np.float32(1)) == "float32"
    fake = type("Tensor", (Tensorish,), {"__module__": "torch"})
    assert operands.kind_of(fake("cpu")) == "torch.Tensor on cpu"
    assert operands.kind_of(fake(None)) == "torch.Tensor"
    param = type("Parameter", (Tensorish,), {"__module__": "torch.nn.parameter"})
    assert operands.kind_of(param("cuda:1")) == "torch.Parameter on cuda:1"
    cupy = type("ndarray", (Tensorish,), {"__module__": "cupy._core.core"})
    assert operands.kind_of(cupy("gpu")) == "cupy.ndarray"
    assert operands.kind_of(Tensorish("x")) == f"{__name__.split('.')[0]}.Tensorish"


def test_numpy_dtype():
    assert operands.numpy_dtype(X, "input") == np.float32
    assert shape_error(operands.numpy_dtype, Operand("w", (1,), "bfloat16"), "input") == (
        "input w: bfloat16 has no NumPy dtype; pass torch tensors on the GPU")


def test_check_count_on_both_sides():
    operands.check_count("fam", [1, 2], [X, Y])
    assert shape_error(operands.check_count, "fam", [1], [X, Y]) == "fam takes 2 operand(s) (x, y), got 1"
    assert shape_error(operands.check_count, "fam", [1, 2, 3], [X, Y]) == "fam takes 2 operand(s) (x, y), got 3"
    operands.check_count("fam", [], [])


def test_host_array_takes_what_fits():
    a = np.zeros((2, 5), np.float32)
    assert operands.host_array(a, X, "input", ACCEPTED) is a
    out = np.zeros((2, 3), np.float32)
    assert operands.host_array(out, Y, "output", ACCEPTED) is out
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    assert operands.host_array(ro, Y, "input", ACCEPTED) is ro  # inputs may be read-only


@pytest.mark.parametrize("x, message", [
    ([[1.0]], "input x: expected a NumPy array, got list"),
    (np.zeros((3, 5), np.float32), "input x: expected shape (2, any), got (3, 5)"),
    (np.zeros((2,), np.float32), "input x: expected shape (2, any), got (2,)"),
    (np.zeros((2, 5, 1), np.float32), "input x: expected shape (2, any), got (2, 5, 1)"),
    (np.zeros((2, 5), np.float64), "input x: expected dtype float32, got float64 (convert with .astype(np.float32))"),
    (np.zeros((5, 2), np.float32).T, "input x: expected a C-contiguous (row-major) array, got strides (4, 8) (a "
     "transposed, Fortran-ordered or strided view: pass np.ascontiguousarray(...))"),
    (np.zeros((2, 10), np.float32)[:, ::2], "input x: expected a C-contiguous (row-major) array, got strides (40, 8) "
     "(a transposed, Fortran-ordered or strided view: pass np.ascontiguousarray(...))"),
])
def test_host_array_refusals(x, message):
    assert shape_error(operands.host_array, x, X, "input", ACCEPTED) == message


def test_host_array_output_must_be_writeable():
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    assert shape_error(operands.host_array, ro, Y, "output", "x") == "output y: expected a writeable array, got a " \
                                                                      "read-only one"


def test_host_operands_checks_everything_before_use():
    a, out = np.zeros((2, 5), np.float32), np.zeros((2, 3), np.float32)
    arrays, got = operands.host_operands("fam", [a], out, [X], Y, ACCEPTED)
    assert arrays == [a] and arrays[0] is a and got is out
    arrays, got = operands.host_operands("fam", (a,), None, [X], Y, ACCEPTED)
    assert got is None
    assert shape_error(operands.host_operands, "fam", [a, a], None, [X], Y, ACCEPTED) == (
        "fam takes 1 operand(s) (x), got 2")
    assert shape_error(operands.host_operands, "fam", [a], [[0.0]], [X], Y, ACCEPTED) == (
        "output y: expected a NumPy array, as the inputs are, got list")
    assert shape_error(operands.host_operands, "fam", [a], np.zeros((2, 4), np.float32), [X], Y, ACCEPTED) == (
        "output y: expected shape (2, 3), got (2, 4)")


# ====================================================================== runtime.py's operand checks

class Cai:
    """A GPU array as the CUDA array interface describes it."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=4096, readonly=False, device=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides,
                                         "data": (ptr, readonly), "version": 3}
        if device is not None:
            self.device = device


class Dev:
    def __init__(self, type_="cuda", index=None, id_=None):
        self.type = type_
        if index is not None:
            self.index = index
        if id_ is not None:
            self.id = id_

    def __str__(self):
        return f"{self.type}:{getattr(self, 'index', getattr(self, 'id', '?'))}"


@pytest.fixture
def ordinal(monkeypatch):
    monkeypatch.setitem(runtime._state, "ordinal", 1)
    monkeypatch.setitem(runtime._state, "torch_dtypes", {"float32": "T_F32", "float16": "T_F16"})


def test_is_torch_and_is_gpu_array():
    assert not runtime.is_torch(np.zeros(1))
    tensor = type("Tensor", (), {"__module__": "torch", "is_cuda": False})
    param = type("Parameter", (), {"__module__": "torch.nn.parameter", "is_cuda": 1})
    other = type("T", (), {"__module__": "torchvision"})
    assert runtime.is_torch(tensor()) and runtime.is_torch(param()) and not runtime.is_torch(other())
    assert runtime.is_gpu_array(param()) is True and runtime.is_gpu_array(tensor()) is False
    assert runtime.is_gpu_array(Cai((1,))) and not runtime.is_gpu_array(np.zeros(1))


def test_c_strides():
    assert runtime._c_strides((2, 3), 4) == (12, 4)
    assert runtime._c_strides((2, 3, 5), 2) == (30, 10, 2)
    assert runtime._c_strides((0, 3), 4) == (12, 4)
    assert runtime._c_strides((3, 0), 4) == (4, 4)  # an empty dimension steps as one
    assert runtime._c_strides((), 8) == ()


def test_cai_dtype():
    assert runtime._cai_dtype({"typestr": "<f2"}) == np.float16
    assert runtime._cai_dtype({"typestr": "<i4"}) == np.int32


def test_check_gpu_takes_what_fits(ordinal):
    assert runtime._check_gpu(Cai((2, 3), ptr=777), Y, "input") == 777
    assert runtime._check_gpu(Cai((2, 3), strides=(12, 4), ptr=8), Y, "output") == 8
    assert runtime._check_gpu(Cai((2, 3), device=Dev("cuda", index=1)), Y, "input") == 4096
    assert runtime._check_gpu(Cai((2, 3), device=Dev("cuda", id_=1)), Y, "input") == 4096
    assert runtime._check_gpu(Cai((2, 3), device=Dev("cuda")), Y, "input") == 4096
    assert runtime._check_gpu(Cai((2, 3), readonly=True), Y, "input") == 4096


@pytest.mark.parametrize("arr, role, message", [
    (Cai((2, 4)), "input", "input y: expected shape (2, 3), got (2, 4)"),
    (Cai((2, 3), "<f8"), "input", "input y: expected dtype float32, got float64"),
    (Cai((2, 3), strides=(4, 8)), "input", "input y: expected a C-contiguous (row-major) array, got strides (4, 8)"),
    (Cai((2, 3), device=Dev("cpu")), "input", "input y: expected an array on cuda:1, got cpu:?"),
    (Cai((2, 3), device=Dev("cpu", index=1)), "input", "input y: expected an array on cuda:1, got cpu:1"),
    (Cai((2, 3), device=Dev("cuda", index=0)), "input", "input y: expected an array on cuda:1, got cuda:0"),
    (Cai((2, 3), device=Dev("cuda", id_=2)), "input", "input y: expected an array on cuda:1, got cuda:2"),
    (Cai((2, 3), readonly=True), "output", "output y: expected a writeable array, got a read-only one"),
])
def test_check_gpu_refusals(ordinal, arr, role, message):
    assert shape_error(runtime._check_gpu, arr, Y, role) == message


def test_check_gpu_bfloat16_needs_torch(ordinal):
    assert shape_error(runtime._check_gpu, Cai((2, 3)), Operand("w", (2, 3), "bfloat16"), "input") == (
        "input w: bfloat16 has no NumPy dtype; pass torch tensors on the GPU")


def test_check_alignment_on_both_sides():
    runtime.check_alignment(4096, 16, "input x")
    runtime.check_alignment(4100, 4, "input x")
    runtime.check_alignment(4101, 1, "input x")
    runtime.check_alignment(4101, 0, "input x")
    assert shape_error(runtime.check_alignment, 4100, 16, "input x") == (
        "input x: this kernel makes 16-byte vector loads, but the array starts at an address 4 bytes past "
        "alignment (a sliced view?); pass a fresh array")
    assert "2 bytes past" in shape_error(runtime.check_alignment, 4098, 4, "input x")


class FakeTensor:
    __module__ = "torch"

    def __init__(self, shape=(2, 3), dtype="T_F32", contiguous=True, device_index=1, grad=False, ptr=64):
        self.shape, self.dtype, self._c, self._d, self.requires_grad, self._p = shape, dtype, contiguous, \
            device_index, grad, ptr
        self.device = f"cuda:{device_index}"

    def is_contiguous(self):
        return self._c

    def get_device(self):
        return self._d

    def stride(self):
        return (1, 2)

    def data_ptr(self):
        return self._p


def test_check_torch_takes_what_fits(ordinal):
    assert runtime._check_torch(FakeTensor(ptr=99), Y, "input") == 99


@pytest.mark.parametrize("t, role, message", [
    (FakeTensor(shape=(3, 2)), "input", "input y: expected shape (2, 3), got (3, 2)"),
    (FakeTensor(dtype="T_F16"), "input", "input y: expected dtype float32, got T_F16"),
    (FakeTensor(contiguous=False), "output", "output y: expected a C-contiguous (row-major) array, got strides (1, 2)"),
    (FakeTensor(device_index=0), "input", "input y: expected an array on cuda:1, got cuda:0"),
    (FakeTensor(grad=True), "input", "input y: the tensor requires grad, but sparsegen kernels have no backward; "
     "pass it detached (x.detach())"),
])
def test_check_torch_refusals(ordinal, t, role, message):
    assert shape_error(runtime._check_torch, t, Y, role) == message


def test_device_pointer_checks_alignment(ordinal):
    assert runtime._device_pointer(Cai((2, 3), ptr=4096), Y, "input", 16) == 4096
    assert runtime._device_pointer(FakeTensor(ptr=32), Y, "output", 16) == 32
    assert shape_error(runtime._device_pointer, Cai((2, 3), ptr=4104), Y, "input", 16).startswith(
        "input y: this kernel makes 16-byte vector loads, but the array starts at an address 8 bytes past")
    assert shape_error(runtime._device_pointer, FakeTensor(ptr=36), Y, "output", 8).startswith("output y: this kernel")


class FakeLauncher:
    def __init__(self, inputs=(X,), output=Y, align=4):
        self.inputs, self.output, self.align = list(inputs), output, align
        self.launched = []

    def launch(self, ptrs, stream=None):
        self.launched.append((ptrs, stream))


class FakeKernel:
    def __init__(self, launcher):
        self._l = launcher
        self.spec = type("S", (), {"family": "fam"})()

    def launcher(self):
        return self._l


class Stream:
    handle = 1


def test_run_on_gpu_arrays_checks_then_launches(ordinal):
    launcher = FakeLauncher(inputs=(XG,))
    out = Cai((2, 3), ptr=8192)
    got = runtime.run(FakeKernel(launcher), (Cai((2, 7), ptr=4096),), out, Stream())
    assert got is out
    assert launcher.launched[0][0] == {"x": 4096, "y": 8192} and isinstance(launcher.launched[0][1], Stream)
    launcher = FakeLauncher(inputs=(XG,))
    assert shape_error(runtime.run, FakeKernel(launcher), (Cai((2, 7)),), np.zeros((2, 3), np.float32)) == (
        "output y: expected a GPU array, as the inputs are, got ndarray")
    assert shape_error(runtime.run, FakeKernel(launcher), (Cai((3, 7)),), Cai((2, 3))) == (
        "input x: expected shape (2, 7), got (3, 7)")
    assert shape_error(runtime.run, FakeKernel(launcher), (Cai((2, 7)),), Cai((2, 3), ptr=4098)).startswith(
        "output y: this kernel makes 4-byte vector loads")
    assert launcher.launched == []


def test_run_refuses_mixed_counts_and_streams(ordinal):
    launcher = FakeLauncher(inputs=(XG, Y))
    kernel = FakeKernel(launcher)
    assert shape_error(runtime.run, kernel, (Cai((2, 7)),)) == "fam takes 2 operand(s) (x, y), got 1"
    assert shape_error(runtime.run, kernel, (Cai((2, 7)), np.zeros((2, 3), np.float32))) == (
        "operands mix host (NumPy) and GPU arrays; pass all of one kind")
    assert shape_error(runtime.run, kernel, (np.zeros((2, 7), np.float32), Cai((2, 3)))) == (
        "operands mix host (NumPy) and GPU arrays; pass all of one kind")
    with pytest.raises(LaunchError) as e:
        runtime.run(kernel, (Cai((2, 7)), Cai((2, 3))), None, stream=object())
    assert str(e.value) == "stream must be a pycuda.driver.Stream (or None for the default stream)"
    assert launcher.launched == []


def test_run_on_host_arrays_checks_before_the_driver(ordinal, monkeypatch):
    launcher = FakeLauncher()
    kernel = FakeKernel(launcher)

    def no_driver():
        raise LaunchError("no driver here")
    monkeypatch.setattr(runtime, "_driver", no_driver)
    assert shape_error(runtime.run, kernel, (np.zeros((2, 7), np.float64),)) == (
        "input x: expected dtype float32, got float64 (convert with .astype(np.float32))")
    assert shape_error(runtime.run, kernel, ([[1.0]],)) == (
        f"input x: expected {runtime.GPU_TAKES}, got list")
    with pytest.raises(LaunchError) as e:
        runtime.run(kernel, (np.zeros((2, 7), np.float32),))
    assert str(e.value) == "no driver here"
    with pytest.raises(LaunchError):
        runtime.run(FakeKernel(FakeLauncher(inputs=())), ())  # no operands at all: the host path


def test_check_alignment_of_two_byte_loads():
    runtime.check_alignment(4100, 2, "input x")
    assert "1 bytes past" in shape_error(runtime.check_alignment, 4101, 2, "input x")


def test_run_makes_the_output_like_the_first_input(ordinal, monkeypatch):
    made = []

    def like(x, shape, dtype):
        made.append((x, shape, dtype))
        return Cai(shape, ptr=12288)
    monkeypatch.setattr(runtime, "_empty_like_framework", like)
    launcher = FakeLauncher(inputs=(XG, Operand("z", (3,), "float32")))
    a, b = Cai((2, 7), ptr=4096), Cai((3,), ptr=8192)
    out = runtime.run(FakeKernel(launcher), (a, b))
    assert made == [(a, (2, 3), "float32")] and out.__cuda_array_interface__["data"][0] == 12288
    assert launcher.launched[0][0] == {"x": 4096, "z": 8192, "y": 12288}
