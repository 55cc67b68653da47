"""GPU tier: the GPU backend refuses host operands exactly as the emulator does (the cases of
test_api's BAD_INPUTS and BAD_OUTPUTS) and names device operands it cannot use: a read-only,
strided, Fortran-ordered, wrongly shaped or typed array, a host `out` for device inputs, a CPU tensor.
Nothing is written to a refused `out`."""
from __future__ import annotations

import numpy as np
import pytest

import sparsegen
from sparsegen.errors import ShapeError

from .helpers import random_csr, reference, rel_error
from .test_api import BAD_INPUTS, BAD_OUTPUTS

pytestmark = pytest.mark.gpu


def gpu_kernel():
    """The emulator tests' kernel (x 12 x 4, y 10 x 4) on the GPU, family fixed so the operand names are."""
    a = random_csr(10, 12, 0.3, seed=3)
    kernel = sparsegen.compile(a, n=4, backend="gpu", options={"family": "csr_rowsplit"})
    return a, kernel, np.ones((12, 4), np.float32)


class DeviceView:
    """A view of a device array as the CUDA array interface describes it, with its own shape, strides,
    dtype and read-only flag: layouts that slicing in a library may not make."""

    def __init__(self, base, shape, strides=None, readonly=False, typestr=None):
        cai = base.__cuda_array_interface__
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr or cai["typestr"],
                                         "data": (cai["data"][0], readonly), "strides": strides, "version": 2}


@pytest.mark.parametrize("make,needle", BAD_INPUTS)
def test_host_inputs_are_refused_as_in_the_emulator(make, needle):
    _, kernel, x = gpu_kernel()
    with pytest.raises(ShapeError, match=needle):
        kernel(make(x))


@pytest.mark.parametrize("make,needle", BAD_OUTPUTS)
def test_a_host_out_is_refused_and_left_alone(make, needle):
    _, kernel, x = gpu_kernel()
    out = make((10, 4))
    before = np.array(out, copy=True)
    with pytest.raises(ShapeError, match=needle):
        kernel(x, out=out)
    assert np.array_equal(np.asarray(out), before)


def test_a_cpu_tensor_is_refused_on_the_gpu_backend():
    torch = pytest.importorskip("torch", reason="torch not installed")
    _, kernel, x = gpu_kernel()
    with pytest.raises(ShapeError, match=r"input x: expected a NumPy array or a GPU array .*got torch\.Tensor on cpu$"):
        kernel(torch.from_numpy(x))
    host_out = r"output y: expected a NumPy array, as the inputs are, got torch\.Tensor on cpu$"
    with pytest.raises(ShapeError, match=host_out):
        kernel(x, out=torch.zeros(10, 4))


@pytest.mark.parametrize("view,needle", [
    (lambda xg, wide: DeviceView(xg, (12, 4, 1)), r"input x: expected shape \(12, 4\), got \(12, 4, 1\)"),
    (lambda xg, wide: DeviceView(xg, (12, 4), typestr="<f8"), "input x: expected dtype float32, got float64"),
    (lambda xg, wide: DeviceView(xg, (12, 4), strides=(4, 48)), r"input x: expected a C-contiguous .*\(4, 48\)"),
    (lambda xg, wide: DeviceView(wide, (12, 4), strides=(32, 8)), r"input x: expected a C-contiguous .*\(32, 8\)"),
])
def test_device_inputs_in_a_layout_the_kernel_cannot_read(view, needle):
    from sparsegen import runtime

    _, kernel, x = gpu_kernel()
    xg, wide = runtime.to_gpu(x), runtime.to_gpu(np.zeros((12, 8), np.float32))
    with pytest.raises(ShapeError, match=needle):
        kernel(view(xg, wide))


@pytest.mark.parametrize("view,needle", [
    (lambda yg: DeviceView(yg, (10, 4), readonly=True), r"output y: expected a writeable array, got a read-only one$"),
    (lambda yg: DeviceView(yg, (10, 4), strides=(4, 40)), r"output y: expected a C-contiguous .*\(4, 40\)"),
    (lambda yg: DeviceView(yg, (4, 10)), r"output y: expected shape \(10, 4\), got \(4, 10\)"),
    (lambda yg: np.zeros((10, 4), np.float32), r"output y: expected a GPU array, as the inputs are, got ndarray$"),
    (lambda yg: [[0.0] * 4] * 10, r"output y: expected a GPU array, as the inputs are, got list$"),
])
def test_a_device_out_the_kernel_cannot_write_is_refused_and_left_alone(view, needle):
    from sparsegen import runtime

    _, kernel, x = gpu_kernel()
    xg, yg = runtime.to_gpu(x), runtime.to_gpu(np.full((10, 4), 7.0, np.float32))
    with pytest.raises(ShapeError, match=needle):
        kernel(xg, out=view(yg))
    runtime.synchronize()
    assert (yg.get() == 7.0).all()


def test_the_kernel_still_runs_after_refusals():
    from sparsegen import runtime

    a, kernel, x = gpu_kernel()
    for make, _ in BAD_INPUTS:
        with pytest.raises(ShapeError):
            kernel(make(x))
    assert rel_error(kernel(x), reference(a, x)) <= 1e-5
    assert rel_error(kernel(runtime.to_gpu(x)).get(), reference(a, x)) <= 1e-5
