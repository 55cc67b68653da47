"""`panel_spmm`: the panel-segment encoder, parameter choices, the emulator, and the code through nvcc."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsegen
from sparsegen import nvcc
from sparsegen.analyze import analyze
from sparsegen.errors import UnsupportedError
from sparsegen.families import panel_spmm as fam
from sparsegen.formats import panel as fmt
from sparsegen.select import select
from sparsegen.select.device import default as default_device

from .helpers import TOL, random_csr, reference, rel_error, rounded, without_tensor_cores


def spec_for(a, n, dtype="float32", **options):
    options.setdefault("family", "panel_spmm")
    return select(analyze(a), op="spmm", n=n, dtype=dtype, options=tuple(sorted(options.items()))).spec


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 90), k=st.integers(0, 90), density=st.floats(0, 1), rows=st.sampled_from([1, 4, 32]),
       kc=st.sampled_from([1, 8, 64]), dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 999))
def test_encoding_decodes_to_the_matrix(m, k, density, rows, kc, dtype, seed):
    a = random_csr(m, k, density, seed=seed)
    plan = fmt.encode(a, dtype, rows=rows, kc=kc, tile_n=8)
    back = fmt.decode(plan).arrays
    want = rounded(a, dtype)
    assert np.array_equal(back["indptr"], want.indptr) and np.array_equal(back["indices"], want.indices)
    assert np.array_equal(back["values"].astype(np.float32), want.data)


def test_segments_are_contiguous_and_records_padded_with_their_end():
    a = random_csr(70, 300, 0.2, seed=1)
    plan = fmt.encode(a, "float32", rows=32, kc=64, tile_n=16)
    rowoff = plan.arrays["rowoff"]
    assert rowoff.shape == (3, 5, 36)  # 3 panels, 5 chunks, 33 offsets padded to 36
    flat = rowoff[:, :, :33].reshape(-1, 33)
    assert (flat[1:, 0] == flat[:-1, 32]).all()  # a segment starts where the previous one ended
    assert (rowoff[:, :, 33:] == rowoff[:, :, 32:33]).all()
    assert rowoff[0, 0, 0] == 0 and rowoff[-1, -1, 32] == a.nnz
    # Offsets are (column mod kc) x tile_n: the element offset inside the staged tile.
    p, c = 1, 2
    start, end = rowoff[p, c, 0], rowoff[p, c, 32]
    cols = a[32:64, 128:192].tocoo()
    assert sorted(plan.arrays["pairs"][start:end, 0].tolist()) == sorted((cols.col * 16).tolist())
    assert plan.constants["max_segment"] == int(np.diff(rowoff[:, :, [0, 32]], axis=2).max())


def test_fp16_pairs_pack_offset_and_value():
    a = sp.csr_matrix(np.array([[0, 1.5, 0, -2.0]], dtype=np.float32))
    plan = fmt.encode(a, "float16", rows=1, kc=2, tile_n=8)
    words = plan.arrays["pairs"]
    assert words.dtype == np.uint32
    assert (words & 0xFFFF).tolist() == [8, 8]  # columns 1 and 3: (col mod 2) x 8
    assert (words >> 16).astype(np.uint16).view(np.float16).tolist() == [1.5, -2.0]


def test_fp16_offsets_past_16_bits_are_refused():
    with pytest.raises(OverflowError, match="16-bit"):
        fmt.encode(random_csr(4, 4, 0.5), "float16", rows=4, kc=1024, tile_n=128)


@pytest.mark.parametrize("dtype,n,vec,group", [
    ("float32", 1, 1, 1), ("float32", 6, 2, 4), ("float32", 32, 4, 8), ("float32", 128, 4, 32),
    ("float32", 1024, 4, 32), ("float32", 130, 2, 32), ("float16", 128, 8, 16), ("float16", 7, 1, 8)])
def test_vector_and_group_follow_n(dtype, n, vec, group):
    spec = spec_for(random_csr(2000, 700, 0.1, seed=2), n, dtype)
    assert (spec.vec, spec.group) == (vec, group)
    assert spec.rpg * spec.vec <= fam.MAX_ACC
    assert spec.shared_bytes <= 2 * fam.STAGE_BYTES


def test_panel_height_follows_density_and_k_splits_when_panels_are_few():
    dense = spec_for(random_csr(4096, 1024, 0.5, seed=3), 128)
    sparse = spec_for(random_csr(4096, 1024, 0.05, seed=3), 128)
    assert dense.panel_rows < sparse.panel_rows  # fewer rows give the same reuse of a staged row
    few = spec_for(random_csr(256, 4096, 0.2, seed=4), 128)
    assert few.splits > 1 and few.panels * few.splits >= 132
    many = spec_for(random_csr(20000, 512, 0.2, seed=4), 128)  # 313 panels: two per SM already
    assert many.splits == 1


def test_selected_by_default_only_where_measured_faster(monkeypatch):
    without_tensor_cores(monkeypatch)  # these layers are dense enough for dense_tile_spmm
    def chosen(a, n):
        return select(analyze(a), op="spmm", n=n).spec.family

    assert chosen(random_csr(512, 4608, 0.2, seed=5), 128) == "panel_spmm"  # DLMC rn50 bottleneck shape
    fp16 = select(analyze(random_csr(512, 4608, 0.2, seed=5)), op="spmm", n=128, dtype="float16").spec
    assert fp16.family != "panel_spmm"  # measured slower in fp16
    assert chosen(random_csr(512, 4608, 0.02, seed=5), 128) != "panel_spmm"  # 2 %: too little reuse
    assert chosen(random_csr(512, 512, 0.5, seed=5), 128) != "panel_spmm"  # X fits L1 anyway
    assert chosen(random_csr(1000, 2048, 0.3, seed=5), 128) == "panel_spmm"  # DLMC rn50 final_dense
    assert chosen(random_csr(4096, 4096, 0.2, seed=5), 128) != "panel_spmm"  # many rows: the row kernels win
    reason = select(analyze(random_csr(512, 512, 0.5, seed=5)), op="spmm", n=128).tried
    assert any(r == "panel_spmm" and "columns" in why for r, _, why in reason)
    sparse = random_csr(512, 4608, 0.1, seed=5)  # 10 %: panels pay only for wide X
    assert chosen(sparse, 32) == chosen(sparse, 128) == "sputnik_spmm"
    assert chosen(sparse, 256) == chosen(sparse, 1024) == "panel_spmm"
    why = dict((r, w) for r, _, w in select(analyze(sparse), op="spmm", n=128).tried)["panel_spmm"]
    assert "n=128 <= 128 at density 0.100 < 0.15" in why


def test_options_are_validated():
    a = random_csr(300, 300, 0.2, seed=5)
    with pytest.raises(UnsupportedError, match="reuse=0"):
        spec_for(a, 32, reuse=0)
    with pytest.raises(UnsupportedError, match="blocks_per_sm"):
        spec_for(a, 32, blocks_per_sm="x")
    assert spec_for(a, 32, blocks_per_sm=1).splits <= spec_for(a, 32, blocks_per_sm=8).splits


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", [1, 5, 64, 200])
def test_emulator_matches_scipy(dtype, n):
    a = random_csr(150, 333, 0.15, seed=n, empty_rows=0.2)
    bias = np.linspace(-1, 1, 150)
    kernel = sparsegen.compile(a, n=n, dtype=dtype, backend="emulate", bias=bias, relu=True,
                               options={"family": "panel_spmm"})
    x = np.random.default_rng(n).standard_normal((333, n)).astype(dtype)
    err = rel_error(kernel(x), reference(rounded(a, dtype), x, bias, relu=True))
    assert err <= TOL[dtype]


def test_source_names_the_choices():
    a = random_csr(256, 4096, 0.2, seed=6)
    kernel = sparsegen.compile(a, n=128, backend="emulate", bias=np.ones(256), options={"family": "panel_spmm"})
    src, spec = kernel.source, kernel.spec
    assert f"constexpr int PANEL_ROWS = WARPS * GROUPS_PER_WARP * RPG;  // {spec.panel_rows} rows" in src
    assert f"constexpr int KC = {spec.kc};" in src
    assert f"constexpr int SPLITS = {spec.splits};" in src and "fp32 workspace" in src
    assert "panel_spmm_finish" in src and "+ bias[i / N]" in src  # split K: the bias waits for the sums
    assert "density 0.200" in src


@pytest.mark.nvcc
@pytest.mark.parametrize("shape", [(512, 2048, 0.2, 128, "float32"), (300, 1000, 0.1, 32, "float32"),
                                   (77, 130, 0.5, 6, "float32"), (512, 4608, 0.2, 128, "float16"),
                                   (100, 100, 0.3, 7, "float16"), (8192, 300, 0.05, 1024, "float32")],
                         ids=lambda s: f"{s[0]}x{s[1]}-n{s[3]}-{s[4]}")
@pytest.mark.parametrize("epilogue", [False, True])
def test_every_code_shape_compiles_for_sm90(shape, epilogue):
    m, k, density, n, dtype = shape
    kernel = sparsegen.compile(random_csr(m, k, density, seed=7), n=n, dtype=dtype, backend="emulate",
                               bias=np.ones(m) if epilogue else None, relu=epilogue,
                               options={"family": "panel_spmm"})
    assert nvcc.compile_cubin(kernel.source, "sm_90", name=kernel.spec.name)


def test_k_splits_fill_one_wave_of_the_blocks_an_sm_holds():
    h100 = default_device()
    assert fam.resident_blocks(81 * 1024, h100) == 2 and fam.resident_blocks(73 * 1024, h100) == 3
    assert fam.resident_blocks(10 * 1024, h100) == fam.REGISTER_BLOCKS
    assert fam.choose_splits(72, 64, 2 * 132) == 4  # 256 blocks: no second, partial wave of 320
    assert fam.choose_splits(72, 64, 3 * 132) == 6
    assert fam.choose_splits(3, 64, 3 * 132) == 3  # at most one chunk a block
    assert fam.choose_splits(72, 500, 2 * 132) == 1
