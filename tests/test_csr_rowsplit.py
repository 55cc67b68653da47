"""The csr_rowsplit family: parameter choice, rule, geometry, and its emulator against scipy."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparsegen.analyze import analyze
from sparsegen.errors import UnsupportedError
from sparsegen.families import csr_rowsplit as fam
from sparsegen.families.base import Request
from sparsegen.select import select, select_request

from .helpers import TOL, random_csr, reference, rel_error, rounded, term_error


def stats_with_rows(mean, m=100_000, k=4096):
    """A matrix whose rows all hold about `mean` nonzeros."""
    width = max(int(round(mean)), 0)
    cols = (np.arange(m)[:, None] * 7 + np.arange(width)[None, :]) % k
    a = sp.csr_matrix((np.ones(m * width, np.float32), np.sort(cols, axis=1).ravel(),
                       np.arange(0, m * width + 1, width) if width else np.zeros(m + 1, int)), shape=(m, k))
    return analyze(a)


@pytest.mark.parametrize("dtype,n,vec,lanes_col", [
    ("float32", 128, 4, 32), ("float32", 256, 4, 32), ("float32", 64, 4, 16), ("float32", 12, 4, 4),
    ("float32", 6, 2, 4), ("float32", 7, 1, 8), ("float32", 1, 1, 1),
    ("float16", 128, 8, 16), ("float16", 1024, 8, 32), ("float16", 12, 4, 4), ("float16", 33, 1, 32),
])
def test_vector_width_and_column_lanes_follow_n(dtype, n, vec, lanes_col):
    spec, _ = fam.choose(stats_with_rows(16), Request("spmm", n=n, dtype=dtype))
    assert (spec.vec, spec.lanes_col) == (vec, lanes_col)
    assert n % spec.vec == 0
    assert spec.lanes <= 32 and spec.block % spec.lanes == 0


def test_short_rows_narrow_n_get_one_thread_per_output():
    spec, reason = fam.choose(stats_with_rows(2), Request("spmm", n=1))
    assert spec.lanes == 1
    assert "one thread per row" in reason


def test_long_rows_narrow_n_split_nonzeros_across_lanes():
    spec, reason = fam.choose(stats_with_rows(200), Request("spmm", n=1))
    assert (spec.lanes_col, spec.lanes_k) == (1, 32)
    assert "splitting each row's nonzeros" in reason


def test_few_rows_narrow_the_column_tile_and_split_nonzeros():
    many, _ = fam.choose(stats_with_rows(64, m=100_000), Request("spmm", n=128))
    few, reason = fam.choose(stats_with_rows(64, m=512), Request("spmm", n=128))
    assert (many.lanes_col, many.lanes_k) == (32, 1)
    assert few.vec == 4 and few.lanes == 32 and few.lanes_col < 32
    assert fam.warps_launched(512, 128, 4, few.lanes_col, few.lanes_k) > fam.warps_launched(512, 128, 4, 32, 1)
    assert "narrowed to" in reason and "132 SMs" in reason
    # every k-lane keeps at least 2 nonzeros: short rows are not split further
    short, _ = fam.choose(stats_with_rows(4, m=512), Request("spmm", n=128))
    assert short.lanes_k <= 2


def test_sm_count_follows_the_device_model():
    from .helpers import synthetic_device

    a, _ = fam.choose(stats_with_rows(64, m=2048), Request("spmm", n=128))
    b, _ = fam.choose(stats_with_rows(64, m=2048), Request("spmm", n=128, device=synthetic_device(sm_count=40)))
    assert a.tile_n < b.tile_n
    assert fam.choose(stats_with_rows(64, m=2048), Request("spmm", n=128, arch="sm_75"))[0] == a  # not the target


def test_wide_n_uses_whole_warp_across_columns():
    spec, _ = fam.choose(stats_with_rows(200), Request("spmm", n=512))
    assert (spec.lanes_col, spec.lanes_k, spec.tile_n) == (32, 1, 128)


def test_spec_name_spells_every_parameter():
    spec = fam.Spec("f16", 100, 4, 8, 4, 128, bias=True, relu=True)
    assert spec.name == "csr_rowsplit.f16.n100.v4.c8k4.b128.bias.relu"
    assert fam.Spec("f32", 128, 4, 32, 1, 128).name == "csr_rowsplit.f32.n128.v4.c32k1.b128"


def test_launch_geometry_covers_rows_and_columns():
    a = random_csr(1000, 300, 0.05)
    spec = fam.Spec("f32", 300, 4, 32, 1, 128)
    plan = fam.encode(a, spec)
    g = fam.launch(spec, plan)
    assert g.block == (128, 1, 1)
    assert g.grid[0] * spec.rows_per_block >= 1000 > (g.grid[0] - 1) * spec.rows_per_block
    assert g.grid[1] == 3  # 300 columns in tiles of 128


def test_selection_reason_and_table_order():
    sel = select(stats_with_rows(16), op="spmm", n=32, dtype="float32")  # short rows, narrow n: the baseline's
    assert sel.rule == "csr_rowsplit" and sel.spec.family == "csr_rowsplit"
    assert "rows avg 16.0" in sel.reason and "4-wide loads" in sel.reason
    tried = {rule: (ok, why) for rule, ok, why in sel.tried}
    assert tried["csr_rowsplit"][0] is True
    assert tried["spdnn_sliced_ell"] == (False, "op 'spmm' is not spdnn_layer")


@pytest.mark.parametrize("op,dtype,needle", [("sddmm", "float32", "not spmm"), ("spmm", "float64", "float64")])
def test_unsupported_requests_name_each_declining_rule(op, dtype, needle):
    with pytest.raises(UnsupportedError) as err:
        select_request(stats_with_rows(4), Request(op, n=8, dtype=dtype))
    assert "csr_rowsplit" in str(err.value) and needle in str(err.value)


def _emulate(a, n, dtype, bias=None, relu=False, seed=1):
    request = Request("spmm", n=n, dtype=dtype, bias=bias is not None, relu=relu)
    spec = select_request(analyze(a), request).spec
    a = rounded(a, dtype)
    plan = fam.encode(a, spec, None if bias is None else np.asarray(bias, np.float32))
    x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(dtype)
    return fam.emulate(spec, plan, {"x": x}), reference(a, x, bias, relu), (a, x)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 70), k=st.integers(1, 90), density=st.floats(0, 0.6), n=st.integers(1, 40),
       dtype=st.sampled_from(["float32", "float16"]), epilogue=st.sampled_from(["none", "bias", "bias_relu"]),
       seed=st.integers(0, 10_000))
@example(m=1, k=66, density=0.046875, n=1, dtype="float32", epilogue="bias", seed=1)  # the bias cancels A·X
def test_emulator_matches_scipy_on_random_matrices(m, k, density, n, dtype, epilogue, seed):
    a = random_csr(m, k, density, seed=seed, empty_rows=0.2)
    bias = np.random.default_rng(seed).standard_normal(m) if epilogue != "none" else None
    y, ref, (rounded_a, x) = _emulate(a, n, dtype, bias, epilogue == "bias_relu", seed)
    assert y.shape == (m, n) and y.dtype == np.dtype(dtype)
    assert term_error(y, ref, rounded_a, x, bias) <= TOL[dtype]


def test_emulator_on_official_graph_challenge_layer(examples_dir):
    from sparsegen.io import load

    w = load(examples_dir / "n1024-l1.tsv.gz", shape=(1024, 1024))
    y, ref, _ = _emulate(w.T.tocsr(), 64, "float32", np.full(1024, -0.3), relu=True)
    assert rel_error(y, ref) <= 1e-6


def test_emulator_on_dlmc_matrices(data_dir):
    from sparsegen.io import load

    index = (data_dir / "dlmc" / "index.tsv").read_text().splitlines()[1:]
    for line in index[::12]:  # a spread of models, methods and sparsities
        a = load(data_dir / "dlmc" / line.split("\t")[0], values="random", seed=3)
        for dtype in ("float32", "float16"):
            y, ref, _ = _emulate(a, 32, dtype)
            assert rel_error(y, ref) <= TOL[dtype], line


def test_unroll_option_reaches_the_spec_and_its_source():
    stats = stats_with_rows(200, m=512)
    spec, _ = fam.choose(stats, Request("spmm", n=32, options=(("unroll", 4),)))
    assert spec.unroll == 4 and spec.name.endswith(".u4") and spec.lanes > 1
    assert fam.choose(stats, Request("spmm", n=32))[0].unroll == 1
    scalar, _ = fam.choose(stats_with_rows(1), Request("spmm", n=1, options=(("unroll", 4),)))
    assert scalar.lanes == 1 and scalar.unroll == 1  # one thread per row walks it alone
    from sparsegen.render import render

    src = render(spec)
    assert "constexpr int UNROLL = 4;" in src and "for (; base + UNROLL * LANES <= end" in src
    assert "UNROLL * LANES" not in render(fam.choose(stats, Request("spmm", n=32))[0])


def test_bad_unroll_is_declined():
    decision = fam._rule(stats_with_rows(16, m=64), Request("spmm", n=32, options=(("unroll", 3),)))
    assert not decision.accepted and "unroll=3" in decision.reason


def test_short_rows_at_narrow_n_load_two_chunks_a_step():
    spec, reason = fam.choose(stats_with_rows(100, m=2048), Request("spmm", n=32))
    assert spec.lanes > 1 and spec.unroll == fam.UNROLL == 2 and "2 chunks of" in reason
    for request in (Request("spmm", n=64), Request("spmm", n=32, dtype="float16")):
        assert fam.choose(stats_with_rows(100, m=2048), request)[0].unroll == 1
    assert fam.choose(stats_with_rows(400, m=2048), Request("spmm", n=32))[0].unroll == 1


def test_block_option_sets_rows_per_block():
    stats = stats_with_rows(200, m=512)
    spec, reason = fam.choose(stats, Request("spmm", n=32, options=(("block", 512),)))
    assert spec.block == 512 and spec.name.split(".")[-2 if spec.unroll > 1 else -1] == "b512"
    assert f"{512 // spec.lanes} rows per 512-thread block" in reason
    assert fam.choose(stats, Request("spmm", n=32))[0].block == fam.BLOCK_THREADS
    declined = fam._rule(stats, Request("spmm", n=32, options=(("block", 100),)))
    assert "options block=100: expected a power of two from 32 to 1024" in str(declined)
