"""The sparse DNN family and driver: encoder, emulator and GPU against scipy and the official answer."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsegen
from sparsegen.errors import ShapeError, UnsupportedError
from sparsegen.formats import sliced_ell

from .helpers import random_csr


def scipy_network(layers, y, bias, cap, bias_rule="nonzero"):
    """Float64 reference in the challenge convention, dropping dead inputs; returns (ids, features)."""
    ids = np.arange(y.shape[0])
    y = np.asarray(y, np.float64)
    for w in layers:
        z = y @ w.toarray().astype(np.float64)
        z = np.where(z != 0, z + bias, 0) if bias_rule == "nonzero" else z + bias
        y = np.minimum(np.maximum(z, 0), cap if cap is not None else np.inf)
        keep = (y > 0).any(axis=1)
        ids, y = ids[keep], y[keep]
    return ids, y


def random_layers(neurons, count, per_row, seed):
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(count):
        cols = np.argsort(rng.random((neurons, neurons)), axis=1)[:, :per_row]
        w = sp.csr_matrix((rng.uniform(0.05, 0.3, neurons * per_row).astype(np.float32),
                           (np.repeat(np.arange(neurons), per_row), cols.ravel())), shape=(neurons, neurons))
        layers.append(w)
    return layers


def random_inputs(count, neurons, density, seed):
    return random_csr(count, neurons, density, seed=seed).astype(np.float32).__abs__()


@pytest.mark.parametrize("block,buf", [(32, 7), (64, 100), (256, 512), (1024, 4096)])
def test_encoder_round_trips_through_the_emulator(block, buf):
    a = random_csr(300, 500, 0.03, seed=block)
    plan = sliced_ell.encode(a, block, buf)
    y = np.random.default_rng(1).standard_normal((6, 500)).astype(np.float32)
    assert np.allclose(sliced_ell.layer_product(plan, y), y @ a.T.toarray(), atol=1e-5)
    if buf < 500:
        assert plan.constants["buffers"] > plan.constants["tiles"]  # footprints overflowed one buffer


def test_encoder_on_an_official_layer_is_uniform(examples_dir):
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    plan = sliced_ell.encode(w.T.tocsr(), 1024, 2048)
    c = plan.constants
    assert (c["tiles"], c["buffers"], c["uniform_width"], c["uniform_buffers"]) == (1, 1, 32, 1)
    assert c["uniform_value"] == 0.0625 and "value" not in plan.arrays and c["padding"] == 1.0
    assert plan.arrays["index"].dtype == np.uint16


def test_spec_is_fully_unrolled_for_uniform_layers_and_runtime_otherwise(examples_dir):
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    k = sparsegen.compile(w.T.tocsr(), op="spdnn_layer", bias=-0.3, cap=32, backend="emulate")
    assert k.spec.width == 32 and k.spec.nbuf == 1 and k.spec.value == 0.0625
    assert "constexpr int WIDTH = 32;" in k.source and "#pragma unroll\n            for (int k = 0; k < WIDTH" in k.source
    rt = sparsegen.compile(w.T.tocsr(), op="spdnn_layer", bias=-0.3, cap=32, backend="emulate",
                           options={"unroll": False})
    assert rt.spec.width == 0 and "WIDTH" not in rt.source and ".wrt." in rt.spec.name
    irregular = sparsegen.compile(random_csr(100, 100, 0.1, seed=2), op="spdnn_layer", bias=0.1,
                                  backend="emulate")
    assert irregular.spec.width == 0 and irregular.spec.value is None and "value + (k)" in irregular.source


def test_equal_weights_with_padding_keep_their_zero_padding(examples_dir):
    """Regression: tiles of 256 rows whose footprint spans two buffers pad the ELL; when every
    weight was equal the value array was dropped and padding picked up the common weight."""
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    plan = sliced_ell.encode(w.T.tocsr(), 256, 605)
    assert plan.constants["padding"] > 1.0 and "value" in plan.arrays and plan.constants["uniform_value"] is None
    y = np.random.default_rng(0).random((4, 1024)).astype(np.float32)
    assert np.allclose(sliced_ell.layer_product(plan, y), y @ w.toarray(), atol=1e-5)


def test_thirty_two_bit_indices_when_asked():
    plan = sliced_ell.encode(random_csr(64, 70000, 0.001, seed=3), 64, 70000, np.int32)
    assert plan.arrays["index"].dtype == np.int32 and plan.arrays["index"].max() >= 0


@pytest.mark.parametrize("bias_rule", ["nonzero", "all"])
def test_emulated_network_matches_scipy(bias_rule):
    layers = random_layers(96, 6, 8, seed=4)
    y = random_inputs(50, 96, 0.2, seed=5)
    net = sparsegen.SparseDNN(layers, bias=-0.2, cap=4.0, bias_rule=bias_rule, backend="emulate", progress=False)
    r = net.run(y)
    ids, ref = scipy_network(layers, y.toarray(), -0.2, 4.0, bias_rule)
    assert np.array_equal(r.ids, ids)
    assert np.allclose(r.features, ref, rtol=1e-5, atol=1e-5)
    assert len(r.alive_per_layer) == 6 and r.alive_per_layer[-1] == ids.size


def test_inputs_that_all_die_and_that_never_die():
    layers = random_layers(64, 3, 4, seed=6)
    dead = sparsegen.SparseDNN(layers, bias=-100.0, backend="emulate", progress=False).run(random_inputs(20, 64, 0.3, 7))
    assert dead.ids.size == 0 and dead.features.shape == (0, 64) and dead.alive_per_layer == (0, 0, 0)
    alive = sparsegen.SparseDNN(layers, bias=0.5, backend="emulate", progress=False).run(random_inputs(20, 64, 0.3, 7))
    assert alive.ids.tolist() == list(range(20))


def test_network_errors():
    with pytest.raises(ShapeError, match="at least one layer"):
        sparsegen.SparseDNN([], bias=0.0)
    with pytest.raises(ShapeError, match="layer 2 takes 32 inputs but layer 1 has 16 outputs"):
        sparsegen.SparseDNN([random_csr(8, 16, 0.5), random_csr(32, 8, 0.5)], bias=0.0, backend="emulate")
    net = sparsegen.SparseDNN(random_layers(32, 1, 4, seed=1), bias=0.0, backend="emulate", progress=False)
    with pytest.raises(ShapeError, match="expected 32 columns"):
        net.run(np.zeros((3, 31), np.float32))
    with pytest.raises(ShapeError, match=r"bias: expected a scalar or shape \(8,\), got \(7,\)"):
        sparsegen.compile(random_csr(8, 8, 0.5), op="spdnn_layer", bias=[1.0] * 7, backend="emulate")
    with pytest.raises(ShapeError, match="one per output neuron"):
        sparsegen.compile(random_csr(8, 8, 0.5), op="spdnn_layer", bias=np.ones((8, 1)), backend="emulate")
    with pytest.raises(ShapeError, match="one entry per layer \\(1\\), got 2"):
        sparsegen.SparseDNN(random_layers(32, 1, 4, seed=1), bias=[0.0, 0.0], backend="emulate", progress=False)
    with pytest.raises(ShapeError, match=r"bias of layer 1: expected a number or an array of its 32 output"):
        sparsegen.SparseDNN(random_layers(32, 1, 4, seed=1), bias=[np.zeros(31)], backend="emulate", progress=False)
    with pytest.raises(ShapeError, match="converge must be 'auto' or 'off'"):
        sparsegen.SparseDNN(random_layers(32, 1, 4, seed=1), bias=0.0, backend="emulate", converge="on")


def test_official_network_emulated(data_dir):
    gc = data_dir / "graphchallenge"
    layers = [sparsegen.load(gc / f"n1024-l{i}.tsv.gz", shape=(1024, 1024)) for i in range(1, 121)]
    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="emulate", progress=False)
    assert len(net.specs) == 1  # 120 layers, one kernel
    images = sparsegen.load(gc / "sparse-images-1024-first1200.tsv.gz", shape=(1200, 1024))
    r = net.run(images)
    assert r.categories.tolist() == np.loadtxt(gc / "categories-first1200.tsv", dtype=int).tolist()
    assert np.all(r.features == 32.0)  # from layer 20 on every survivor is saturated


def test_prepare_on_the_emulator_changes_nothing():
    net = sparsegen.SparseDNN([random_csr(16, 16, 0.5, seed=1)], bias=-0.1, backend="emulate", progress=False)
    assert net.prepare() is net and all(k._device_arrays is None for k in net.kernels)


# ---- GPU tier --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_prepare_puts_every_layer_on_the_device_before_a_run():
    layers = [random_csr(64, 64, 0.3, seed=s) for s in range(3)]
    net = sparsegen.SparseDNN(layers, bias=-0.1, backend="gpu", progress=False)
    assert all(k._device_arrays is None for k in net.kernels)
    assert net.prepare() is net and all(k._device_arrays is not None for k in net.kernels)
    x = random_inputs(20, 64, 0.3, 7)
    ids, ref = scipy_network(layers, x.toarray(), -0.1, 32.0)
    setup = net._runs["resident", "device"]
    r = net.run(x)  # the GPU sums in its own order: equal to scipy's within rounding
    assert np.array_equal(r.ids, ids) and np.allclose(r.features, ref, rtol=1e-5, atol=1e-5)
    assert net._runs["resident", "device"] is setup  # the run used the prepared setup
    part = net.segment(1, 3).prepare()
    net.release()  # the segment's setup points into copies that are gone: its next run makes a new one
    assert not part._runs["resident", "device"].current()
    first = net.segment(0, 1).run(x)
    rest = part.run(first.features)
    assert np.array_equal(first.ids[rest.ids], r.ids) and np.array_equal(rest.features, r.features)
    assert part._runs["resident", "device"].current()


@pytest.mark.gpu
def test_gpu_official_network_gives_the_official_categories(data_dir):
    gc = data_dir / "graphchallenge"
    layers = [sparsegen.load(gc / f"n1024-l{i}.tsv.gz", shape=(1024, 1024)) for i in range(1, 121)]
    images = sparsegen.load(gc / "sparse-images-1024-first1200.tsv.gz", shape=(1200, 1024))
    emu = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="emulate", progress=False).run(images)
    # unrolled, runtime trip counts, and tiles whose footprint spans two padded buffers
    for options in ({}, {"unroll": False}, {"block": 256, "minibatch": 8}, {"block": 512, "minibatch": 12}):
        net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="gpu", progress=False, **options)
        r = net.run(images)
        assert r.categories.tolist() == np.loadtxt(gc / "categories-first1200.tsv", dtype=int).tolist()
        assert r.alive_per_layer == emu.alive_per_layer, options
        assert np.array_equal(r.features, emu.features)
    for mode in ({"weights": "streamed"}, {"prune": "host"}, {"weights": "streamed", "prune": "host"}):
        r = net.run(images, **mode)
        assert r.categories.tolist() == emu.categories.tolist() and r.alive_per_layer == emu.alive_per_layer, mode


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["irregular", "multi_buffer", "not_minibatch_multiple", "all_die", "never_die"])
def test_gpu_network_matches_scipy(case):
    neurons, count, bias, cap = 256, 61, -0.15, 3.0
    layers = random_layers(neurons, 5, 12, seed=8)
    options = {}
    if case == "multi_buffer":  # small tiles whose footprints overflow one buffer
        layers = random_layers(4096, 3, 32, seed=9)
        neurons = 4096
    if case == "all_die":
        bias = -50.0
    if case == "never_die":
        bias = 0.5
    y = random_inputs(count if case != "not_minibatch_multiple" else 13, neurons, 0.1, seed=10)
    net = sparsegen.SparseDNN(layers, bias=bias, cap=cap, backend="gpu", progress=False, **options)
    ids, ref = scipy_network(layers, y.toarray(), bias, cap)
    for mode in ({}, {"weights": "streamed"}, {"prune": "host"}):
        r = net.run(y, batch=40 if case == "irregular" else None, **mode)
        assert np.array_equal(r.ids, ids), mode
        assert np.allclose(r.features, ref, rtol=1e-5, atol=1e-5), mode


@pytest.mark.gpu
def test_gpu_layer_kernel_refuses_direct_calls(examples_dir):
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    k = sparsegen.compile(w.T.tocsr(), op="spdnn_layer", bias=-0.3, backend="gpu")
    with pytest.raises(UnsupportedError, match="SparseDNN"):
        k(np.zeros((4, 1024), np.float32))


# ---- relabeling hidden neurons ---------------------------------------------------------------

def generated(neurons, layers):
    from sparsegen import graphchallenge as gc

    return gc.generate_network(neurons, layers, seed=1)


def test_relabeling_shrinks_footprints_and_keeps_the_answer():
    from sparsegen.spdnn import relabeled, tile_footprint

    layers = generated(4096, 8)
    a = [w.T.tocsr() for w in layers]
    b, order = relabeled(a)
    assert sorted(order.tolist()) == list(range(4096))
    assert sum(tile_footprint(m, 1024) for m in b) < 0.5 * sum(tile_footprint(m, 1024) for m in a)
    y = random_inputs(40, 4096, 0.05, seed=11)
    plain = sparsegen.SparseDNN(layers, bias=-0.35, backend="emulate", relabel="never", progress=False)
    moved = sparsegen.SparseDNN(layers, bias=-0.35, backend="emulate", relabel="always", progress=False)
    assert moved.relabel.applied and not plain.relabel.applied
    r1, r2 = plain.run(y), moved.run(y)
    assert np.array_equal(r1.ids, r2.ids) and r1.alive_per_layer == r2.alive_per_layer
    assert np.allclose(r1.features, r2.features, atol=1e-4)  # final neurons back in their labels
    ids, ref = scipy_network(layers, y.toarray(), -0.35, 32.0)
    assert np.array_equal(r2.ids, ids) and np.allclose(r2.features, ref, atol=1e-4)


def test_relabeling_auto_skips_networks_where_it_cannot_pay(examples_dir):
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    net = sparsegen.SparseDNN([w, w], bias=-0.3, backend="emulate", progress=False)
    assert not net.relabel.applied and "not worth it" in net.relabel.reason
    assert sparsegen.SparseDNN(generated(4096, 3), bias=-0.35, backend="emulate", progress=False).relabel.applied
    with pytest.raises(ShapeError, match="relabel must be"):
        sparsegen.SparseDNN([w], bias=-0.3, backend="emulate", relabel="maybe", progress=False)


@pytest.mark.gpu
def test_gpu_relabeled_network_matches_scipy():
    layers = generated(4096, 6)
    y = random_inputs(70, 4096, 0.05, seed=12)
    ids, ref = scipy_network(layers, y.toarray(), -0.35, 32.0)
    for relabel in ("always", "never"):
        r = sparsegen.SparseDNN(layers, bias=-0.35, backend="gpu", relabel=relabel, progress=False).run(y)
        assert np.array_equal(r.ids, ids) and np.allclose(r.features, ref, rtol=1e-5, atol=1e-4), relabel


def test_weights_biases_caps_and_inputs_the_float32_kernel_cannot_hold_are_named():
    from sparsegen.errors import FormatError

    good = random_layers(32, 2, 4, seed=11)
    bad = good[1].astype(np.float64)
    bad.data[5] = 1e300
    row = int(np.searchsorted(bad.indptr, 5, side="right")) - 1
    with pytest.raises(FormatError, match=rf"<layer 2>: expected finite values that float32 can hold.*"
                                          rf"found 1e\+300 at \(row {row}, col {bad.indices[5]}\)"):
        sparsegen.SparseDNN([good[0], bad], bias=-0.3, backend="emulate", progress=False)
    for kwargs, needle in (({"bias": float("nan")}, "bias: .*found nan"), ({"bias": 1e300}, r"bias: .*1e\+300"),
                           ({"bias": -0.3, "cap": float("inf")}, "cap: .*found inf")):
        with pytest.raises(ShapeError, match=needle):
            sparsegen.SparseDNN(good, backend="emulate", progress=False, **kwargs)
    net = sparsegen.SparseDNN(good, bias=-0.3, backend="emulate", progress=False)
    inputs = random_inputs(4, 32, 0.5, 3).astype(np.float64)
    inputs.data[0] = -1e300
    with pytest.raises(FormatError, match=r"<inputs>: .*found -1e\+300 at \(row 0, col"):
        net.run(inputs)


@pytest.mark.nvcc
def test_a_serial_build_compiles_each_distinct_body_once(monkeypatch, tmp_path):
    """Layers built in order get their cubins afterwards, one nvcc per distinct kernel body, and
    then launch on the GPU backend."""
    from sparsegen import api, nvcc, spdnn_build

    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path))
    bodies = []
    real = nvcc.compile_cubin
    monkeypatch.setattr(nvcc, "compile_cubin", lambda source, arch, **kw: bodies.append(source) or real(source, arch, **kw))
    twin = random_csr(64, 64, 0.2, seed=1)
    layers = [(twin, -0.3), (sp.csr_matrix(twin * 2.0), -0.3), (random_csr(64, 64, 0.5, seed=2), -0.2)]
    kernels = [api.compile(w, op="spdnn_layer", bias=b, cap=32.0, backend="emulate", arch="sm_90") for w, b in layers]
    assert kernels[0].cubin_key == kernels[1].cubin_key != kernels[2].cubin_key
    spdnn_build.compile_cubins(kernels, threads=2)
    assert len(bodies) == 2
    assert all(k.backend == "gpu" and k._cubin[:4] == b"\x7fELF" for k in kernels)
    assert kernels[0]._cubin is kernels[1]._cubin


@pytest.mark.nvcc
def test_a_worker_returns_a_cached_cubin_as_bytes(monkeypatch, tmp_path):
    """A network's layers whose spec another network compiled find the cubin in the cache; the
    worker's answer crosses a process boundary, so it must pickle."""
    import pickle

    from sparsegen import api, spdnn_build

    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path))
    kernel = api.compile(random_csr(64, 64, 0.2, seed=1), op="spdnn_layer", bias=-0.3, cap=32.0,
                         backend="emulate", arch="sm_90")
    body = kernel.source.split("*/\n", 1)[1]
    fresh = spdnn_build._cubin_in_worker(body, "sm_90", kernel.spec.name)
    cached = spdnn_build._cubin_in_worker(body, "sm_90", kernel.spec.name)
    assert type(cached) is bytes and cached == fresh
    assert pickle.loads(pickle.dumps(cached)) == fresh
