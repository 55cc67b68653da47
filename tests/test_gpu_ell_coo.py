"""GPU tier for `ell_coo_spmm`: the three passes against scipy on skewed random and real matrices,
the edge cases, and widths the rule would not pick (the family encoded and rendered directly)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen.analyze import analyze
from sparsegen.api import Kernel
from sparsegen.families import ell_coo_spmm as fam
from sparsegen.families.base import Request
from sparsegen.formats import ell_coo as fmt
from sparsegen.render import Provenance, render
from sparsegen.select import Selection

from .helpers import TOL, random_csr, reference, rel_error, rounded
from .test_ell_coo import csr_from_lengths, minilm_like, skewed_csr

pytestmark = pytest.mark.gpu


def forced_kernel(a, n, dtype, width=None, bias=None, relu=False) -> Kernel:
    """The hybrid at ELL width `width` (default: the rule's), whether or not the rule accepts `a`."""
    from sparsegen import runtime

    width = fmt.choose_width(np.diff(a.indptr)) if width is None else width
    spec = fam.make_spec(dtype, n, width, bias=bias is not None, relu=relu)
    plan = fam.encode(a, spec, None if bias is None else np.asarray(bias, np.float32))
    request = Request("spmm", n=n, dtype=dtype, bias=bias is not None, relu=relu)
    return Kernel(spec=spec, selection=Selection(spec, f"forced ELL width {width}", "test"), plan=plan,
                  source=render(spec, Provenance("test", "tests/test_gpu_ell_coo.py")), request=request,
                  backend="gpu", arch=runtime.current_arch() or "sm_90", structure="test")


def rule_accepts(a, n=8, dtype="float32") -> bool:
    return fam.RULES[0].decide(analyze(a), Request("spmm", n=n, dtype=dtype)).accepted


def kernel_for(a, n, dtype, bias=None, relu=False, width=None) -> Kernel:
    """Through `sparsegen.compile` when the rule takes the matrix (and the width is the rule's)."""
    if width is None and rule_accepts(a, n, dtype):
        kernel = sparsegen.compile(a, n=n, dtype=dtype, bias=bias, relu=relu, options={"family": fam.FAMILY},
                                   backend="gpu")
        assert kernel.spec.family == "ell_coo_spmm", kernel.selection.reason
        return kernel
    return forced_kernel(a, n, dtype, width, bias, relu)


def check(a, n, dtype="float32", bias=None, relu=False, width=None, seed=0, x=None):
    kernel = kernel_for(a, n, dtype, bias, relu, width)
    if x is None:
        x = np.random.default_rng(seed).standard_normal((a.shape[1], n)).astype(dtype)
    y = kernel(x)
    assert y.shape == (a.shape[0], n) and y.dtype == np.dtype(dtype)
    err = rel_error(y, reference(rounded(a, dtype), x, bias, relu))
    assert err <= TOL[dtype], (kernel.spec.name, err)
    emulated = fam.emulate(kernel.spec, kernel.plan, {"x": x})
    assert rel_error(y, emulated) <= TOL[dtype], (kernel.spec.name, "GPU vs emulator")
    return kernel, y


@settings(max_examples=40, deadline=None)  # each example compiles its own width: ~1 s of nvcc
@given(m=st.integers(1, 300), k=st.integers(1, 300), n=st.integers(1, 300), alpha=st.floats(0.6, 2.5),
       empty=st.sampled_from([0.0, 0.1, 0.5]), dtype=st.sampled_from(["float32", "float16"]),
       epilogue=st.sampled_from(["none", "bias", "bias_relu", "relu"]), seed=st.integers(0, 10_000))
def test_random_skewed_matrices_match_scipy(m, k, n, alpha, empty, dtype, epilogue, seed):
    a = skewed_csr(m, k, seed, alpha=alpha, empty=empty)
    bias = np.random.default_rng(seed).standard_normal(m) if "bias" in epilogue else None
    check(a, n, dtype, bias, "relu" in epilogue, seed=seed)


def edge_matrix(case):
    rng = np.random.default_rng(7)
    if case == "empty_rows":  # half the rows empty, the rest heavy-tailed
        return skewed_csr(500, 400, 1, empty=0.5)
    if case == "one_huge_row":  # 4000 nonzeros in one row, a few in the others: 125 chunks of one row
        lengths = rng.integers(0, 6, 200)
        lengths[77] = 4000
        return csr_from_lengths(lengths, 5000, 2)
    if case == "minilm":  # rows of 4 to 874 nonzeros
        return minilm_like(384, 1536, 3)
    if case == "single_column":  # k = 1: every row has 0 or 1 nonzero
        return random_csr(300, 1, 0.3, seed=4)
    raise ValueError(case)


@pytest.mark.parametrize("case", ["empty_rows", "one_huge_row", "minilm", "single_column"])
@pytest.mark.parametrize("n", [1, 7, 12, 33, 128, 130])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_edge_cases(case, n, dtype):
    a = edge_matrix(case)
    bias = np.linspace(-1, 1, a.shape[0]) if n % 2 else None  # odd n with the epilogue, even without
    check(a, n, dtype, bias, relu=bias is not None, seed=n)


@pytest.mark.parametrize("width", [0, 1, 5, 900])  # all tail; thin ELL; wide ELL; no tail at all
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_widths_the_rule_would_not_pick(width, dtype):
    a = minilm_like(256, 1000, 5)
    kernel, _ = check(a, 64, dtype, np.linspace(-2, 2, 256), relu=True, width=width)
    assert len(fam.steps(kernel.spec, kernel.plan)) == (1 if width >= 874 else 3)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("width", [0, 3, None])
def test_inf_in_x_stays_out_of_rows_that_do_not_reference_it(dtype, width):
    a = minilm_like(128, 600, 6)
    x = np.random.default_rng(2).standard_normal((600, 40)).astype(dtype)
    x[0, :] = np.inf  # padding slots point at column 0
    kernel = kernel_for(a, 40, dtype, np.ones(128), relu=True, width=width)
    y = kernel(x)
    coo = a.tocoo()
    touched = np.zeros(128, bool)
    touched[coo.row[coo.col == 0]] = True
    assert touched.any() and not touched.all()
    clean = x.copy()
    clean[0, :] = 0
    ref = reference(rounded(a, dtype), clean, np.ones(128), relu=True)
    assert np.isfinite(y[~touched]).all()
    assert rel_error(y[~touched], ref[~touched]) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_row_is_written_before_the_tail_adds_and_calls_repeat(dtype):
    """`out` full of NaN: the ELL pass must overwrite every row (the tail only adds); a second call
    into the same `out` must not add the tail twice."""
    from sparsegen import runtime

    a = minilm_like(300, 900, 8)
    kernel = kernel_for(a, 96, dtype, np.linspace(-1, 1, 300), relu=True)
    x = np.random.default_rng(3).standard_normal((900, 96)).astype(dtype)
    out = runtime.to_gpu(np.full((300, 96), np.nan, dtype))
    xg = runtime.to_gpu(x)
    first = kernel(xg, out=out).get()
    second = kernel(xg, out=out).get()
    ref = reference(rounded(a, dtype), x, np.linspace(-1, 1, 300), relu=True)
    assert rel_error(first, ref) <= TOL[dtype] and rel_error(second, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_large_skewed_matrix_with_wide_n(dtype):
    """Many chunks per row and many rows: atomics from different blocks onto the same rows."""
    a = minilm_like(3072, 3072, 9)
    check(a, 256, dtype, np.zeros(3072), relu=True)


def test_every_dlmc_matrix_the_rule_accepts(data_dir):
    lines = (data_dir / "dlmc" / "index.tsv").read_text().splitlines()[1:]
    ran = []
    for i, line in enumerate(lines):
        path = line.split("\t")[0]
        a = sparsegen.load(data_dir / "dlmc" / path, values="random", seed=i)
        if analyze(a).row_lengths.cov < fam.COV_MIN:  # skewed enough for the hybrid (forced where the rule declines)
            continue
        for dtype, n in (("float32", 128), ("float16", 32), ("float16", 7)):
            check(a, n, dtype, np.linspace(-1, 1, a.shape[0]), relu=True, seed=i)
        ran.append(path)
    if not ran:
        pytest.skip(f"no DLMC matrix has row-length CoV >= {fam.COV_MIN}")
