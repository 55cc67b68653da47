"""Converge (exact deduplication, the proven fixed point, per-neuron biases, widths that change) on
the emulator and, in the GPU tier, on the device, against scipy and against converge="off"."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsegen
from sparsegen import graphchallenge as gc
from sparsegen import spdnn, spdnn_converge as cv
from sparsegen.errors import ShapeError


# ---- networks ------------------------------------------------------------------------------------

def uneven_network(widths, seed, negative=0.2, low=0.05, high=0.5, sparsest=0.02):
    """W_l (widths[l] x widths[l+1]) whose output neurons have uneven fan-in (from `sparsest` to 60 %
    of the inputs), with a share `negative` of the weights negative."""
    rng = np.random.default_rng(seed)
    layers = []
    for n_in, n_out in zip(widths[:-1], widths[1:]):
        density = rng.uniform(sparsest, 0.6, n_out)
        mask = rng.random((n_in, n_out)) < density[None, :]
        mask[rng.integers(0, n_in, n_out), np.arange(n_out)] = True  # every output has an input
        values = rng.uniform(low, high, (n_in, n_out))
        values[rng.random((n_in, n_out)) < negative] *= -0.5
        layers.append(sp.csr_matrix(np.where(mask, values, 0).astype(np.float32)))
    return layers


def neuron_biases(widths, seed, scale=0.3):
    """Per-neuron biases of both signs, except one layer with a single number."""
    rng = np.random.default_rng(seed)
    out = [rng.uniform(-scale, scale, n).astype(np.float32) for n in widths[1:]]
    out[1] = np.float32(-0.05)
    return out


def inputs_with_copies(count, neurons, seed, copies=10):
    """Sparse non-negative inputs, `copies` of which repeat earlier ones exactly."""
    rng = np.random.default_rng(seed)
    y = (rng.random((count, neurons)) < 0.25) * rng.uniform(0.2, 1.0, (count, neurons))
    y[-copies:] = y[rng.integers(0, count - copies, copies)]
    return sp.csr_matrix(y.astype(np.float32))


def saturating_network(width, layers, seed):
    """Both-sign weights whose every output's weights sum to 1.1..1.4: rows climb slowly to the cap
    and stay there."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for w in uneven_network([width] * (layers + 1), seed, negative=0.1, low=0.3, high=0.9, sparsest=0.25):
        sums = np.asarray(w.sum(axis=0)).ravel()
        out.append(sp.csr_matrix(w.multiply(rng.uniform(1.1, 1.4, width) / sums[None, :]), dtype=np.float32))
    return out


@pytest.fixture(scope="module")
def official(data_dir):
    """The official 1024-neuron network and its first 1,200 inputs, read once: (folder, layers, inputs)."""
    d = data_dir / "graphchallenge"
    return d, gc.read_network(d), gc.read_inputs(d / "sparse-images-1024-first1200.tsv.gz", 1024)


def bitwise(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def both(net, x, **kw):
    return net.run(x, converge="auto", **kw), net.run(x, converge="off", **kw)


# ---- the scipy reference with per-layer and per-neuron biases ---------------------------------

def test_reference_takes_per_neuron_biases_of_both_signs():
    widths = [30, 50, 20]
    layers = uneven_network(widths, seed=1)
    biases = neuron_biases(widths, seed=2)
    x = inputs_with_copies(40, 30, seed=3)
    r = gc.reference_inference(layers, x, biases, cap=2.0, dtype=np.float64)
    y = x.toarray().astype(np.float64)
    for w, b in zip(layers, biases):
        z = y @ w.toarray().astype(np.float64)
        y = np.clip(np.where(z != 0, z + b, 0), 0, 2.0)
    alive = np.flatnonzero((y > 0).any(axis=1))
    assert np.array_equal(r.ids, alive) and np.allclose(r.features.toarray(), y[alive])
    dense = gc.reference_inference(layers, x, [np.abs(biases[0]), biases[1]], cap=2.0, bias_rule="all")
    assert dense.features.shape == (dense.ids.size, 20)
    with pytest.raises(ShapeError, match="bias of layer 2: expected a number or an array of its 20"):
        gc.reference_inference(layers, x, [biases[0], np.zeros(19)])
    with pytest.raises(ShapeError, match="one entry per layer"):
        gc.reference_inference(layers, x, [0.1])


# ---- the emulator: exact with converge on and off --------------------------------------------------

@pytest.mark.parametrize("bias_rule", ["nonzero", "all"])
def test_non_challenge_network_matches_scipy_with_converge_on_and_off(bias_rule):
    widths = [48, 80, 40, 64, 64, 32]
    layers = uneven_network(widths, seed=4)
    biases = neuron_biases(widths, seed=5)
    x = inputs_with_copies(60, 48, seed=6)
    net = sparsegen.SparseDNN(layers, bias=biases, cap=3.0, bias_rule=bias_rule, backend="emulate", progress=False)
    assert net.neurons == 48 and net.outputs == 32 and net.width == 80
    on, off = both(net, x)
    ref = gc.reference_inference(layers, x, biases, cap=3.0, dtype=np.float64, bias_rule=bias_rule)
    assert ref.ids.size > 10
    assert np.array_equal(on.ids, ref.ids) and np.allclose(on.features, ref.features.toarray(), rtol=1e-5, atol=1e-5)
    assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features)
    assert on.alive_per_layer == off.alive_per_layer == ref.alive_per_layer


def test_network_built_to_converge_deduplicates_then_skips_exactly():
    layers = saturating_network(40, 40, seed=7)
    x = inputs_with_copies(80, 40, seed=8, copies=20)
    net = sparsegen.SparseDNN(layers, bias=-0.01, cap=8.0, backend="emulate", progress=False)
    assert all(net.fixed) and net.fixed_from == 0  # every layer provably maps the all-cap row to itself
    on, off = both(net, x)
    assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features)
    assert on.ids.size > 40 and np.all(on.features == 8.0)
    assert on.alive_per_layer == off.alive_per_layer
    assert any(on.skipped) and not any(off.skipped) and on.layers_run < 40
    ran = [p for p in on.passes if p.ran]
    assert ran and ran[0].removed >= 1  # the copies among the inputs, at least
    assert on.rows_computed < off.rows_computed
    first_skipped = on.skipped.index(True)
    assert all(on.skipped[first_skipped:]) and all(d == 0 for d in on.distinct_per_layer[first_skipped:])
    ref = gc.reference_inference(layers, x, -0.01, cap=8.0)
    assert np.array_equal(on.ids, ref.ids) and bitwise(on.features, ref.features.toarray())
    assert "layers ran, on" in on.summary() and on.per_layer()[0]["alive_inputs"] == on.alive_per_layer[0]


def test_skipping_needs_the_proof_of_every_later_layer():
    """The same kind of network with one last layer that does not fix the all-cap row: no layer may be
    skipped before it, though the rows sit at the cap long before."""
    layers = saturating_network(40, 40, seed=7)
    last = layers[-1].toarray()
    last[:, 0] = 0
    last[5, 0] = 0.1  # neuron 0 of the last layer sums to 0.1: cap * 0.1 - 0.01 < cap
    layers[-1] = sp.csr_matrix(last)
    x = inputs_with_copies(80, 40, seed=8, copies=20)
    net = sparsegen.SparseDNN(layers, bias=-0.01, cap=8.0, backend="emulate", progress=False)
    assert net.fixed[:-1] == (True,) * 39 and net.fixed[-1] is False and net.fixed_from == 40
    on, off = both(net, x)
    assert not any(on.skipped) and on.ids.size > 40
    assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features)
    assert on.rows_computed < off.rows_computed  # deduplication still pays
    assert on.distinct_per_layer[-1] == 1  # every survivor's row is the same by then
    assert np.all(on.features[:, 1:] == 8.0) and np.all(on.features[:, 0] < 8.0)


def test_official_network_converges_at_the_all_cap_row(official):
    d, layers, x = official
    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="emulate", progress=False)
    assert net.fixed_from == 0
    on, off = both(net, x)
    assert on.categories.tolist() == np.loadtxt(d / "categories-first1200.tsv", dtype=int).tolist()
    assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features)
    assert on.alive_per_layer == off.alive_per_layer
    assert on.layers_run < 30 and on.distinct_per_layer[on.layers_run - 1] <= 2


def test_every_input_dies_and_the_rest_is_skipped():
    layers = saturating_network(32, 12, seed=10)
    net = sparsegen.SparseDNN(layers, bias=-1000.0, cap=2.0, backend="emulate", progress=False)
    r = net.run(inputs_with_copies(20, 32, seed=11))
    assert r.ids.size == 0 and r.features.shape == (0, 32)
    assert r.alive_per_layer == (0,) * 12 and r.skipped == (False,) + (True,) * 11


def test_a_network_without_a_cap_never_skips():
    layers = saturating_network(32, 10, seed=12)
    net = sparsegen.SparseDNN(layers, bias=0.1, cap=None, backend="emulate", progress=False)
    assert net.fixed_from == 10
    on, off = both(net, inputs_with_copies(30, 32, seed=13, copies=12))
    assert not any(on.skipped) and np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features)
    assert sum(p.removed for p in on.passes) >= 1


# ---- the pieces ---------------------------------------------------------------------------------------

def test_dedup_merges_equal_rows_only_and_carries_weights():
    z = np.array([[1, 2], [3, 4], [1, 2], [0, 0], [3, 4], [1, 2.0000002]], np.float32)
    keep = np.array([True, True, True, False, True, True])
    slots = np.array([10, 11, 12, 13, 14, 15])
    parent, weight = np.arange(16), np.ones(16, np.int64)
    weight[12] = 5  # row 12 already stands for five inputs
    assert cv._dedup(z, keep, slots, parent, weight) == 2
    assert keep.tolist() == [True, True, False, False, False, True]
    assert parent[12] == 10 and parent[14] == 11 and parent[15] == 15
    assert weight[10] == 6 and weight[11] == 2
    z2 = np.array([[0.0], [-0.0]], np.float32)  # equal as numbers, not as bits: kept apart
    assert cv._dedup(z2, np.array([True, True]), np.array([0, 1]), np.arange(2), np.ones(2, np.int64)) == 0


def test_expand_follows_parents_to_the_root():
    trace = cv.Trace(None, None, 5, np.array([1, 4]), np.array([0, 1, 1, 2, 4, 4]), None)
    ids, feats = cv.expand(trace, np.array([[1.0], [4.0]], np.float32), 6)
    assert ids.tolist() == [1, 2, 3, 4, 5] and feats.ravel().tolist() == [1, 1, 1, 4, 4]


def test_the_pass_gate_and_back_off():
    assert cv.gate(3, 10, 1, 0) == 2 and cv.gate(9, 10, 5, 0) == 3 and cv.gate(3, 10, 5, 8) == 4
    assert cv.gate(7, 10, 5, 4) == 1
    assert cv.back_off(3, 80, 10, 4) == (cv.DEDUP_EVERY, 3 + cv.DEDUP_EVERY)  # removed 1/8: pays
    assert cv.back_off(3, 80, 9, 4) == (8, 11) and cv.back_off(3, 80, 0, 256) == (256, 259)
    assert [l for l in range(12) if cv.is_candidate(l, 12)] == [3, 7]


def test_fixed_point_proof_on_challenge_layers_and_at_the_edges(examples_dir):
    w = sparsegen.load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    a = w.T.tocsr()
    assert cv.fixed_layer(a, -0.3, 32.0, "nonzero")
    assert not cv.fixed_layer(a, -32.1, 32.0, "nonzero")  # 64 - 32.1 < 32
    assert not cv.fixed_layer(a, -0.3, None, "nonzero") and not cv.fixed_layer(a, -0.3, 0.0, "nonzero")
    empty = sp.csr_matrix((2, 3), dtype=np.float32)
    assert not cv.fixed_layer(empty, 5.0, 2.0, "nonzero")  # no product: the nonzero rule adds no bias
    assert cv.fixed_layer(empty, 5.0, 2.0, "all") and not cv.fixed_layer(empty, 1.0, 2.0, "all")
    bias = np.full(1024, -0.3, np.float32)
    bias[7] = -40.0  # one neuron that does not reach the cap
    assert not cv.fixed_layer(a, bias, 32.0, "nonzero")
    assert cv.fixed_from([False, True, False, True, True]) == 3 and cv.fixed_from([True] * 3) == 0
    assert cv.fixed_from([True, False]) == 2


def test_fixed_point_proof_is_never_fooled_by_rounding():
    """Rows whose exact sum reaches the threshold only by less than a rounding are refused; where the
    proof says yes, fp32 sums in many orders (fma-like: one rounding per term) all reach it."""
    rng = np.random.default_rng(14)
    cap = np.float32(1.5)
    for trial in range(200):
        k = int(rng.integers(1, 40))
        w = rng.uniform(-0.3, 1.0, k).astype(np.float32)
        s = float(np.sum(w.astype(np.float64)))
        target = 1.0 - s  # bias that makes cap*s + b == cap exactly, give or take the slack below
        b = np.float32(cap * target + rng.choice([-1e-6, 0.0, 1e-6, 1e-4, 1e-2]) * cap)
        a = sp.csr_matrix((w, (np.zeros(k, int), np.arange(k))), shape=(1, k))
        proven = cv.fixed_layer(a, b, float(cap), "all")
        if proven:
            for _ in range(20):
                acc = np.float32(0)
                for t in rng.permutation(k):
                    acc = np.float32(np.float64(acc) + np.float64(w[t]) * np.float64(cap))
                assert min(max(np.float32(acc + b), 0), cap) == cap
        if cap * s + float(b) < float(cap) * (1 + 2.0 ** -24):  # within one rounding of the threshold
            assert not proven, (k, s, b)
        if cap * s + float(b) > float(cap) * (1 + 2.0 ** -16) and np.all(w > 0):
            assert proven, (k, s, b)  # and not so timid that a clear margin is refused


def test_relabeling_chain_matches_relabeled():
    from sparsegen.spdnn import relabeled
    from sparsegen.spdnn_build import next_order

    a = [w.T.tocsr() for w in gc.generate_network(4096, 4, seed=1)]
    out, last = relabeled(a)
    orders = []
    for m in a:
        orders.append(next_order(m.indptr, m.indices, m.shape, orders[-1] if orders else None))
    assert np.array_equal(orders[-1], last)
    for l in range(1, 4):
        assert (out[l] != a[l][orders[l]][:, orders[l - 1]]).nnz == 0


def test_relabeled_network_with_neuron_biases_puts_them_back():
    layers = gc.generate_network(4096, 4, seed=1)
    rng = np.random.default_rng(15)
    biases = [rng.uniform(-0.6, 0.1, 4096).astype(np.float32) for _ in range(4)]
    x = sp.csr_matrix((rng.random((30, 4096)) < 0.3).astype(np.float32))
    moved = sparsegen.SparseDNN(layers, bias=biases, backend="emulate", relabel="always", progress=False)
    plain = sparsegen.SparseDNN(layers, bias=biases, backend="emulate", relabel="never", progress=False)
    r1, r2 = moved.run(x), plain.run(x)
    ref = gc.reference_inference(layers, x, biases)
    assert ref.ids.size > 3
    assert np.array_equal(r1.ids, ref.ids) and np.array_equal(r2.ids, ref.ids)
    assert np.allclose(r1.features, ref.features.toarray(), atol=1e-4)
    assert np.allclose(r1.features, r2.features, atol=1e-4)


def test_layers_built_in_worker_processes_are_the_same():
    layers = gc.GeneratedNetwork(1024, 6, seed=2)
    x = sp.csr_matrix((np.random.default_rng(16).random((40, 1024)) < 0.1).astype(np.float32))
    here = sparsegen.SparseDNN(layers, bias=-0.3, backend="emulate", workers=0, progress=False)
    pool = sparsegen.SparseDNN(layers, bias=-0.3, backend="emulate", workers=2, relabel="always", progress=False)
    chained = sparsegen.SparseDNN(layers, bias=-0.3, backend="emulate", workers=0, relabel="always", progress=False)
    assert pool.workers == 2 and here.workers == 0
    assert [k.spec.name for k in pool.kernels] == [k.spec.name for k in chained.kernels]
    assert all(np.array_equal(p.plan.arrays["index"], c.plan.arrays["index"]) for p, c in zip(pool.kernels, chained.kernels))
    a, b = here.run(x), pool.run(x)
    assert np.array_equal(a.ids, b.ids) and np.allclose(a.features, b.features)
    assert pool.fixed == here.fixed


# ---- build="lazy": the layers a run reaches, and no others -------------------------------------

def same_run(a, b):
    return (np.array_equal(a.ids, b.ids) and bitwise(a.features, b.features) and a.alive_per_layer == b.alive_per_layer
            and a.skipped == b.skipped)


def whole_and_lazy(layers, cap):
    """The network built whole and lazily (relabeled: the chain must go on window by window)."""
    kw = {"bias": -0.01, "cap": cap, "backend": "emulate", "relabel": "always", "progress": False}
    return sparsegen.SparseDNN(layers, **kw), sparsegen.SparseDNN(layers, **kw, build="lazy")


def test_lazy_network_builds_only_the_layers_a_converged_run_reaches(monkeypatch):
    monkeypatch.setattr(spdnn, "LAZY_FIRST", 8)
    layers = saturating_network(40, 40, seed=7)
    x = inputs_with_copies(80, 40, seed=8, copies=20)
    whole, lazy = whole_and_lazy(layers, 8.0)
    assert lazy.layers_built == 8 and whole.layers_built == 40 and lazy.fixed == whole.fixed and lazy.fixed_from == 0
    assert (lazy.edges, lazy.outputs, lazy.width, lazy.neurons) == (whole.edges, whole.outputs, whole.width, whole.neurons)
    on = lazy.run(x)
    assert same_run(on, whole.run(x)) and on.ids.size > 40 and np.all(on.features == 8.0)
    assert 8 < lazy.layers_built < 40 and lazy.layers_built in (16, 32)  # windows of 8, then doubling
    assert on.skipped.index(True) <= lazy.layers_built and on.distinct_per_layer[lazy.layers_built:] == (0,) * (
        40 - lazy.layers_built)
    assert [w["layers"][0] for w in on.launches["windows"]] == [1, 9, 17][:len(on.launches["windows"])]
    # the chain of relabelings went on window by window: the same plans as the whole build's
    assert all(np.array_equal(a.plan.arrays["index"], b.plan.arrays["index"]) for a, b in zip(lazy.kernels, whole.kernels))
    off = lazy.run(x, converge="off")  # every layer is needed: the rest is built, then run whole
    assert lazy.layers_built == 40 and same_run(off, whole.run(x, converge="off"))
    assert np.array_equal(lazy.output_order, whole.output_order)


def test_lazy_network_that_never_converges_runs_every_window_exactly(monkeypatch):
    """Rows that never reach the cap: every window is built and run, the rows carried from one to
    the next in the hidden labels; the answer is the whole build's, bit for bit."""
    monkeypatch.setattr(spdnn, "LAZY_FIRST", 4)
    layers = saturating_network(40, 20, seed=9)
    x = inputs_with_copies(60, 40, seed=10, copies=10)
    whole, lazy = whole_and_lazy(layers, 1e6)
    assert lazy.fixed_from == 0 and lazy.layers_built == 4
    r, ref = lazy.run(x), whole.run(x)
    assert same_run(r, ref) and not any(r.skipped) and r.ids.size
    assert [w["layers"] for w in r.launches["windows"]] == [[1, 4], [5, 8], [9, 16], [17, 20]]
    assert lazy.layers_built == 20 and np.array_equal(lazy.output_order, whole.output_order)
    assert np.array_equal(r.ids, gc.reference_inference(layers, x, -0.01, cap=1e6).ids)


def test_lazy_network_whose_inputs_all_die_skips_the_rest_unbuilt(monkeypatch):
    monkeypatch.setattr(spdnn, "LAZY_FIRST", 4)
    layers = saturating_network(32, 12, seed=10)
    net = sparsegen.SparseDNN(layers, bias=-1000.0, cap=2.0, backend="emulate", progress=False, build="lazy")
    r = net.run(inputs_with_copies(20, 32, seed=11))
    assert r.ids.size == 0 and r.features.shape == (0, 32) and net.layers_built == 4
    assert r.alive_per_layer == (0,) * 12 and r.skipped == (False,) + (True,) * 11


def test_lazy_official_network_builds_one_window(official):
    d, layers, x = official
    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="emulate", progress=False, build="lazy")
    r = net.run(x)
    assert r.categories.tolist() == np.loadtxt(d / "categories-first1200.tsv", dtype=int).tolist()
    assert net.layers_built == spdnn.LAZY_FIRST and len(r.launches["windows"]) == 1 and r.skipped[-1]


def test_lazy_layers_built_in_worker_processes_are_the_same(monkeypatch):
    monkeypatch.setattr(spdnn, "LAZY_FIRST", 4)
    layers = gc.GeneratedNetwork(1024, 10, seed=2)
    x = sp.csr_matrix((np.random.default_rng(16).random((40, 1024)) < 0.1).astype(np.float32))
    lazy = sparsegen.SparseDNN(layers, bias=-0.3, backend="emulate", workers=2, relabel="always", progress=False,
                               build="lazy")
    whole = sparsegen.SparseDNN(layers, bias=-0.3, backend="emulate", workers=0, relabel="always", progress=False)
    assert lazy.layers_built == 4 and lazy.fixed == whole.fixed and lazy.edges == whole.edges
    assert same_run(lazy.run(x, converge="off"), whole.run(x, converge="off")) and lazy.layers_built == 10
    assert all(np.array_equal(a.plan.arrays["index"], b.plan.arrays["index"]) for a, b in zip(lazy.kernels, whole.kernels))


def test_build_must_be_all_or_lazy():
    with pytest.raises(ShapeError, match="build must be one of 'all', 'lazy', got 'some'"):
        sparsegen.SparseDNN(saturating_network(8, 2, seed=1), bias=0.0, backend="emulate", build="some")


def test_generated_network_is_lazy_and_the_same():
    lazy = gc.GeneratedNetwork(1024, 20, seed=3)
    eager = gc.generate_network(1024, 20, seed=3)
    import pickle

    again = pickle.loads(pickle.dumps(lazy))
    for l in (19, 0, 7, 12):
        assert (lazy[l] != eager[l]).nnz == 0 and (again[l] != eager[l]).nnz == 0
    assert len(lazy) == 20 and len(pickle.dumps(lazy)) < 200
    with pytest.raises(IndexError):
        lazy[20]


# ---- the generated source (TVM style) and its compilation ----------------------------------------

def converge_specs():
    from sparsegen.families.spdnn_sliced_ell import Spec

    return [Spec(1024, 1024, 1024, 16, 20, 1024, 32, 1, 16, 0.0625, -0.3, 32.0, "nonzero"),
            Spec(512, 300, 320, 8, 12, 512, 0, 0, 32, None, 0.1, None, "all", True)]


def test_source_holds_the_converge_kernels_and_the_layout_the_driver_writes():
    from sparsegen.render import render
    from sparsegen.spdnn_gpu import LAYER_DESC

    uniform, vector = (render(s) for s in converge_specs())
    assert "#define BIAS_OF(o) (-0.3f)" in uniform and "#define OFF_CAP(z) ((z) != CAP)" in uniform
    assert "#define BIAS_OF(o) ((o) < N_OUT ? __ldg(bias + (o)) : 0.0f)" in vector
    kernel_bias = "            const float* __restrict__ bias,\n            const float* __restrict__ y_in"
    assert kernel_bias in vector and kernel_bias not in uniform  # the kernel takes a bias array, or not
    assert "#define OFF_CAP(z) true" in vector  # no cap: never converged
    assert "layer_passes<MB / 4>(" in uniform and "fewer_inputs_per_pass<3>(" in uniform
    assert "fewer_inputs_per_pass<1>(" in vector and "fewer_inputs_per_pass<2>(" not in vector  # minibatch 8
    for src in (uniform, vector):
        # one barrier per minibatch for the flags, the device-side skip, the progress word
        assert src.count("__syncthreads_or") == 2  # the tail's two votes; the layer kernel votes by warp
        assert "skip = layer >= state[S_SKIP_FROM] || count == 0 ||" in src
        assert "report(progress, layer, skip, count);" in src
        assert "atomicCAS(keys + i, k, key) == k" in src and "if (__all_sync(0xffffffffu, same))" in src
        assert "extern \"C\" __global__ void __launch_bounds__(1024)\nspdnn_tail(" in src
        # pruning in the layer kernel: one atomic per pass into the next alive list; the counts rotate
        assert "if (compact && warp == 0) {" in src and "first = atomicAdd(count_next, __popc(ballot));" in src
        assert "if (!skip) *count_clear = 0;" in src and "int count = counts[first % 3];" in src
        # fewer inputs per pass where the rows are few: the full minibatch inline, the others called
        assert "const int groups = min(MB / 4, max(1, (count + 4 * passes_wanted - 1) / (4 * passes_wanted)));" in src
    assert LAYER_DESC.itemsize == 80 and LAYER_DESC.fields["bias"][1] == 48
    assert LAYER_DESC.fields["uniform_value"][1] == 56 and LAYER_DESC.fields["block"][1] == 76
    assert "offsetof(LayerDesc, bias) == 48 && offsetof(LayerDesc, uniform_value) == 56" in uniform


@pytest.mark.nvcc
@pytest.mark.parametrize("which", [0, 1])
def test_converge_kernels_compile_for_sm90(which):
    from sparsegen import nvcc
    from sparsegen.render import render

    spec = converge_specs()[which]
    assert nvcc.compile_cubin(render(spec), "sm_90", name=spec.name)[:4] == b"\x7fELF"


# ---- GPU tier ---------------------------------------------------------------------------------------

def tables(r):
    return r.alive_per_layer, r.distinct_per_layer, r.skipped, r.passes


@pytest.mark.gpu
def test_gpu_official_network_converges_exactly(official):
    d, layers, x = official
    emu = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="emulate", progress=False).run(x)
    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="gpu", progress=False)
    expected = np.loadtxt(d / "categories-first1200.tsv", dtype=int).tolist()
    off = net.run(x, converge="off")
    assert off.categories.tolist() == expected and not any(off.skipped)
    for mode in ({}, {"split": True}, {"weights": "streamed"}, {"batch": 500}, {"prune": "kernel"}):
        on = net.run(x, **mode)
        assert on.categories.tolist() == expected, mode
        assert bitwise(on.features, off.features) and on.alive_per_layer == off.alive_per_layer, mode
        if "batch" not in mode:  # one batch: the device takes the emulator's decisions
            assert tables(on) == tables(emu), mode
            assert on.layers_run < 30 and sum(on.launches["layers_launched"]) < 120, mode
    split = net.run(x, split=True)
    t = split.timings_ms
    assert len(split.layer_ms) == 120 and split.per_layer()[0]["ms"]["layers"] > 0
    assert abs(t["layers"] + t["dedup"] + t["pruning"] + t["tail"] - t["inference"]) < 0.05 * t["inference"]
    assert t["dedup"] > 0 and t["pruning"] > 0  # the candidates' pruning kernels
    for mode in ({"prune": "host"}, {"prune": "kernel", "converge": "off"}, {"weights": "streamed", "converge": "off"}):
        other = net.run(x, **mode)
        assert other.converge == "off" and bitwise(other.features, off.features), mode


@pytest.mark.gpu
def test_gpu_lazy_official_network_builds_one_window_and_gives_the_same_answer(official):
    _, layers, x = official
    whole = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="gpu", progress=False).run(x)
    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="gpu", progress=False, build="lazy").prepare()
    for mode in ({}, {"split": True}, {"weights": "streamed"}, {"batch": 500}):
        on = net.run(x, **mode)
        assert np.array_equal(on.ids, whole.ids) and bitwise(on.features, whole.features), mode
        assert on.alive_per_layer == whole.alive_per_layer and on.skipped == whole.skipped, mode
    assert net.layers_built == spdnn.LAZY_FIRST and on.timings_ms["inference"] > 0
    off = net.run(x, converge="off")
    assert net.layers_built == 120 and bitwise(off.features, whole.features)


@pytest.mark.gpu
def test_gpu_full_minibatches_and_copies_of_every_input(official):
    """The official images twice over (2400 inputs): the first layers take full minibatches (more rows
    than 12 per SM), later ones fewer inputs per pass as rows die; every input has a copy, which the
    passes find. Pruning in the layer kernel or in a kernel of its own, converge on or off: the same bits."""
    d, layers, x = official
    x2 = sp.vstack([x, x], format="csr")
    expected = np.loadtxt(d / "categories-first1200.tsv", dtype=int) - 1
    emu = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="emulate", progress=False).run(x2)
    net = sparsegen.SparseDNN(layers, bias=-0.3, cap=32, backend="gpu", progress=False)
    off = net.run(x2, converge="off")
    assert off.ids.tolist() == expected.tolist() + (expected + 1200).tolist()
    assert bitwise(off.features[:expected.size], off.features[expected.size:])
    for mode in ({}, {"prune": "kernel"}, {"converge": "off", "prune": "kernel"}):
        r = net.run(x2, **mode)
        assert np.array_equal(r.ids, off.ids) and bitwise(r.features, off.features), mode
        assert r.alive_per_layer == off.alive_per_layer == emu.alive_per_layer, mode
        if r.converge == "auto":
            assert tables(r) == tables(emu), mode
            assert r.passes[0].ran and r.passes[0].removed >= r.alive_per_layer[3] // 2, mode  # the copies


@pytest.mark.gpu
@pytest.mark.parametrize("bias_rule", ["nonzero", "all"])
def test_gpu_non_challenge_network_matches_scipy(bias_rule):
    widths = [48, 80, 40, 64, 64, 32]
    layers = uneven_network(widths, seed=4)
    biases = neuron_biases(widths, seed=5)
    x = inputs_with_copies(61, 48, seed=6)
    ref = gc.reference_inference(layers, x, biases, cap=3.0, dtype=np.float64, bias_rule=bias_rule)
    for options in ({}, {"block": 32, "minibatch": 8}, {"unroll": False}):
        net = sparsegen.SparseDNN(layers, bias=biases, cap=3.0, bias_rule=bias_rule, backend="gpu", progress=False,
                                  **options)
        on, off = both(net, x)
        assert np.array_equal(on.ids, ref.ids), options
        assert np.allclose(on.features, ref.features.toarray(), rtol=1e-5, atol=1e-5), options
        assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features), options
        assert on.alive_per_layer == off.alive_per_layer == ref.alive_per_layer, options


@pytest.mark.gpu
def test_gpu_network_built_to_converge_deduplicates_and_skips():
    layers = saturating_network(40, 40, seed=7)
    x = inputs_with_copies(80, 40, seed=8, copies=20)
    emu = sparsegen.SparseDNN(layers, bias=-0.01, cap=8.0, backend="emulate", progress=False).run(x)
    net = sparsegen.SparseDNN(layers, bias=-0.01, cap=8.0, backend="gpu", progress=False)
    on, off = both(net, x)
    assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features) and np.all(on.features == 8.0)
    assert tables(on) == tables(emu) and any(p.ran and p.removed for p in on.passes)
    ref = gc.reference_inference(layers, x, -0.01, cap=8.0)
    assert np.array_equal(on.ids, ref.ids)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{}, {"block": 64}], ids=["one-tile", "four-tiles"])
def test_gpu_converged_tail_runs_the_last_row_in_one_launch(monkeypatch, options):
    """A network whose rows all become one (not provably fixed: its last layer does not fix the
    all-cap row), with a long tail: the host hands the layers left to spdnn_tail; with tiles of 64
    neurons the tail's blocks meet at grid barriers."""
    from sparsegen import spdnn_converge

    monkeypatch.setattr(spdnn_converge, "RUN_AHEAD", 1)  # the host waits for the device's every report
    layers = saturating_network(256, 150, seed=7)
    last = layers[-1].toarray()
    last[:, 0] = 0
    last[5, 0] = 0.1
    layers[-1] = sp.csr_matrix(last)
    x = inputs_with_copies(80, 256, seed=8, copies=20)
    emu = sparsegen.SparseDNN(layers, bias=-0.01, cap=8.0, backend="emulate", progress=False).run(x)
    net = sparsegen.SparseDNN(layers, bias=-0.01, cap=8.0, backend="gpu", progress=False, **options)
    on, off = both(net, x)
    assert on.launches["tail_from"] and on.launches["tail_from"][0] < 140, on.launches
    assert np.array_equal(on.ids, off.ids) and bitwise(on.features, off.features)
    assert tables(on) == tables(emu) and not any(on.skipped)
    ref = gc.reference_inference(layers, x, -0.01, cap=8.0)
    assert np.array_equal(on.ids, ref.ids) and np.allclose(on.features, ref.features.toarray(), atol=1e-5)


# ---- the command line ---------------------------------------------------------------------------------

def test_cli_reports_the_distinct_rows_and_the_per_layer_table(tmp_path, examples_dir, capsys):
    import json

    from sparsegen.cli import main

    gc.write_network(gc.generate_network(1024, 40), tmp_path)  # the official kind: converges at the cap
    inputs = str(examples_dir / "sparse-images-1024-first64.tsv.gz")
    base = ["spdnn", "run", "--weights", str(tmp_path), "--inputs", inputs, "--backend", "emulate", "--bias", "-0.25"]
    assert main(base) == 0
    text = capsys.readouterr().out
    line = next(l for l in text.splitlines() if l.startswith("converge    "))
    assert " of 40 layers ran, on " in line and "distinct rows" in line and line.endswith("converge auto")
    assert main(base + ["--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert main(base + ["--json", "--converge", "off"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["categories"] == off["categories"] and on["alive_per_layer"] == off["alive_per_layer"]
    assert [r["alive_inputs"] for r in on["per_layer"]] == on["alive_per_layer"]
    assert any(r["skipped"] for r in on["per_layer"]) and not any(r["skipped"] for r in off["per_layer"])
    assert on["rows_computed"] < off["rows_computed"] and off["converge"] == "off" and on["survivors"] > 3
    assert set(on["per_layer"][0]) == {"layer", "alive_inputs", "distinct_rows", "skipped"}


# ---- the host's launches, against a scripted device ----------------------------------------------------

class FakeFunction:
    """A prepared kernel that checks each launch against its prepared format and records it."""

    def __init__(self, name, log, on_launch=None):
        self.name, self.log, self.on_launch, self.fmt = name, log, on_launch, None

    def prepare(self, fmt):
        self.fmt = fmt

    def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
        assert len(args) == len(self.fmt), (self.name, len(args), self.fmt)
        for c, a in zip(self.fmt, args):
            assert isinstance(a, (int, np.integer)) and not isinstance(a, bool), (self.name, c, a)
        self.log.append((self.name, args))
        if self.on_launch:
            self.on_launch(args)


class FakeEvent:
    def record(self, stream=None):
        pass

    def time_till(self, other):
        return 1.0

    def synchronize(self):
        pass


LAYER_ARG = -4  # the layer kernel's trailing arguments: layer, fixed_from, compact, passes_wanted


def fake_run(layers, rows_entering, skip_at=None, tail=True, tiles=1, prune="device"):
    """A GpuRun stand-in whose device reports, as each layer kernel launches, the rows entering it
    (`rows_entering[l]`) and whether it skips (from `skip_at` on); its layers have `tiles` tiles."""
    from types import SimpleNamespace

    from sparsegen import runtime
    from sparsegen.families.spdnn_sliced_ell import arguments
    from sparsegen.spdnn_gpu import NO_REPORT, pruning_and_passes

    log = []
    word = np.array([NO_REPORT], np.uint64)

    def report(args):
        l = int(args[LAYER_ARG])
        skip = skip_at is not None and l >= skip_at
        word[0] = (l << 32) | (0x80000000 if skip else 0) | int(rows_entering[l])

    spec = converge_specs()[0]
    layer = FakeFunction("layer", log, report)
    layer.prepare(runtime.arg_format(arguments(spec)))
    plan_args = sum(a.kind == "plan" for a in arguments(spec))
    funcs = {n: FakeFunction(n, log) for n in ("dedup", "prune", "tail")}
    funcs["dedup"].prepare("PiPPPPPPPiPPii")
    funcs["prune"].prepare("PPPPPPPPPiiii")
    funcs["tail"].prepare("PiiPPPPPPPPPPiP")
    geometry = SimpleNamespace(grid=(tiles, 1, 1), block=(1024, 1, 1), shared_bytes=0)
    table = np.zeros(layers, [("tiles", "i4"), ("block", "i4")])
    table["tiles"], table["block"] = 1, 1024
    run = SimpleNamespace(
        layers=[(layer, geometry, list(range(1, plan_args + 1)))] * layers, stream=None, weights="resident",
        prune_on=prune, one_tile=[pruning_and_passes(tiles, 132)[0]] * layers,
        passes_wanted=[np.int32(pruning_and_passes(tiles, 132)[1])] * layers,
        dedup=funcs["dedup"], prune=funcs["prune"], sms=132, progress=word,
        progress_ptr=np.uintp(1 << 40), tail=(funcs["tail"], 77, table, 4096) if tail else None,
        net=SimpleNamespace(fixed_from=0, kernels=[SimpleNamespace(shape=(1024, 1024))] * layers),
        drv=SimpleNamespace(Event=FakeEvent))
    b = {"y": [10, 11], "alive": [12, 13], "counts": 14, "flags": 15, "parent": 16, "weight": 17, "history": 18,
         "passes": 19, "state": 20, "keys": 21, "slots": 22, "tail_flags": 23, "barriers": 24, "table_size": 256}
    return run, b, log


def launched(log, name):
    return [args for n, args in log if n == name]


def test_host_stops_launching_once_the_device_skips():
    from sparsegen.spdnn_gpu import _Launcher

    run, b, log = fake_run(40, [100] * 40, skip_at=13)
    launcher = _Launcher(run, b, 100, converge=True, split=True)
    launcher.launch_all()
    layers = [int(a[LAYER_ARG]) for a in launched(log, "layer")]
    assert layers == list(range(14))  # layer 13 reported the skip; nothing after it was launched
    assert [int(a[-2]) for a in launched(log, "dedup")] == [3, 7, 11]  # candidates only
    # one tile: the layer kernels prune themselves, except before a deduplication candidate
    assert [int(a[-4]) for a in launched(log, "prune")] == [3, 7, 11]
    assert [int(a[-2]) for a in launched(log, "layer")] == [0 if l in (3, 7, 11) else 1 for l in range(14)]
    assert not launched(log, "tail") and launcher.launched == 14
    times = launcher.times()  # every fake launch takes 1 ms
    assert set(times) == {"inference", "layers", "dedup", "pruning", "tail", "per_layer"}
    assert (times["layers"], times["dedup"], times["pruning"], times["tail"]) == (14, 3, 3, 0)
    assert times["per_layer"][:14].tolist() == [[1, 1, 1] if l in (3, 7, 11) else [1, 0, 0] for l in range(14)]
    assert not times["per_layer"][14:].any()


def test_host_hands_the_last_row_to_the_tail():
    from sparsegen.spdnn_gpu import _Launcher

    rows = [100, 60, 30, 9, 4, 2, 1, 1] + [1] * 32
    run, b, log = fake_run(40, rows)
    launcher = _Launcher(run, b, 100, converge=True, split=False)
    launcher.launch_all()
    assert [int(a[LAYER_ARG]) for a in launched(log, "layer")] == list(range(7))  # layer 6 reported one row
    (tail,) = launched(log, "tail")
    assert (int(tail[1]), int(tail[2])) == (7, 40) and launcher.tail_from == 7
    assert tail[3:8] == (10, 11, 12, 13, 14)  # both activation buffers, both alive lists, the counts
    split = _Launcher(*fake_run(40, rows)[:2], 100, converge=True, split=True)
    split.launch_all()
    assert split.times()["tail"] == 1 and split.times()["per_layer"][7:].sum() == 0


def test_without_converge_or_a_tail_every_layer_launches():
    from sparsegen.spdnn_gpu import _Launcher

    run, b, log = fake_run(24, [1] * 24, skip_at=3)
    _Launcher(run, b, 1, converge=False, split=False).launch_all()
    assert len(launched(log, "layer")) == 24 and not launched(log, "dedup") and not launched(log, "tail")
    assert all(int(a[-3]) == -1 for a in launched(log, "layer"))  # fixed_from -1: no skipping on the device
    run, b, log = fake_run(24, [1] * 24, tail=False)
    _Launcher(run, b, 1, converge=True, split=False).launch_all()
    assert len(launched(log, "layer")) == 24 and not launched(log, "tail")


def test_layer_kernels_prune_themselves_where_one_tile_holds_the_layer():
    """One tile: every layer kernel appends its survivors itself (compact 1), and no pruning kernel
    runs; the counts rotate over three words (read l % 3, append (l + 1) % 3, clear (l + 2) % 3).
    Several tiles, or prune="kernel": a pruning kernel after every layer, and the flags instead."""
    from sparsegen.spdnn_gpu import _Launcher

    run, b, log = fake_run(7, [100] * 7)
    _Launcher(run, b, 100, converge=False, split=False).launch_all()
    layers = launched(log, "layer")
    assert not launched(log, "prune") and [int(a[-2]) for a in layers] == [1] * 7
    counts = [tuple(int(v) for v in a[-13:-10]) for a in layers]  # count_in, count_next, count_clear
    assert counts == [(14 + 4 * (l % 3), 14 + 4 * ((l + 1) % 3), 14 + 4 * ((l + 2) % 3)) for l in range(7)]
    assert [int(a[-10]) for a in layers] == [13, 12] * 3 + [13]  # the next alive list
    assert all(int(a[-1]) == 132 for a in layers)  # passes wanted: one per SM
    for kw in ({"tiles": 4}, {"prune": "kernel"}):
        run, b, log = fake_run(7, [100] * 7, **kw)
        _Launcher(run, b, 100, converge=True, split=False).launch_all()
        assert [int(a[-2]) for a in launched(log, "layer")] == [0] * 7, kw
        assert [int(a[-4]) for a in launched(log, "prune")] == list(range(7)), kw
        prune = launched(log, "prune")[1]  # layer 1 prunes from count word 1 into word 2
        assert (int(prune[1]), int(prune[4])) == (18, 22), kw
    assert [int(a[-1]) for a in launched(log, "layer")] == [132] * 7  # prune="kernel": one tile
    run, b, log = fake_run(7, [100] * 7, tiles=4)
    _Launcher(run, b, 100, converge=False, split=False).launch_all()
    assert all(int(a[-1]) == 33 for a in launched(log, "layer"))  # four tiles per pass


def test_pruning_and_passes_per_layer_shape_and_the_timed_table():
    from sparsegen.spdnn import Result
    from sparsegen.spdnn_gpu import pruning_and_passes

    assert pruning_and_passes(1, 132) == (True, 132) and pruning_and_passes(4, 132) == (False, 33)
    assert pruning_and_passes(256, 132) == (False, 1)  # at least one pass
    ms = ({"layers": 0.5, "dedup": 0.0, "pruning": 0.0}, {"layers": 0.25, "dedup": 0.1, "pruning": 0.05})
    r = Result(np.zeros(0, np.int64), np.zeros((0, 4), np.float32), (3, 2), 4, 10, distinct_per_layer=(4, 3),
               skipped=(False, False), layer_ms=ms)
    assert [row["ms"] for row in r.per_layer()] == list(ms)
    assert "ms" not in Result(r.ids, r.features, (3, 2), 4, 10, distinct_per_layer=(4, 3),
                              skipped=(False, False)).per_layer()[0]
