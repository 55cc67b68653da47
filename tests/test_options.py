"""Family options are dataclasses (sparsegen/families/options.py): each family's take typed values,
refuse unknown keys naming the valid ones, refuse values their option does not take, and normalize
so that equal options make one cache key; options the serving family does not take are refused."""
from __future__ import annotations

import numpy as np
import pytest

import sparsegen
from sparsegen import tune
from sparsegen.api import _request
from sparsegen.errors import OptionsError, UnsupportedError
from sparsegen.families import FAMILIES, ORDER, normalize_options
from sparsegen.families.options import FamilyOptions

from .helpers import random_csr

# Per family: options it takes (with the value each takes them as), then (options, what the error says).
CASES = {
    "csr_rowsplit": ({"unroll": 4, "block": np.int64(256)}, {"unroll": 4, "block": 256},
                     [({"unroll": 3}, "options unroll=3: expected 1, 2, 4 or 8"),
                      ({"block": "256"}, "options block='256': expected a power of two from 32 to 1024")]),
    "spdnn_sliced_ell": ({"minibatch": 8, "unroll": False, "block": 512, "cap": 32}, {"minibatch": 8, "unroll": False,
                                                                                      "block": 512, "cap": 32.0},
                         [({"minibatch": 6}, "options minibatch=6: expected a positive multiple of 4"),
                          ({"block": 48}, "options block=48: expected a multiple of 32 from 32 to 1024"),
                          ({"bias_rule": "some"}, "options bias_rule='some': expected one of 'all', 'nonzero'")]),
    "sputnik_spmm": ({"ksplit": 4, "balance": True, "piece": 64}, {"ksplit": 4, "balance": 1, "piece": 64},
                     [({"ksplit": 3}, "options ksplit=3: expected 1, 2, 4, 8 or 16"),
                      ({"piece": 0}, "options piece=0: expected nonzeros per row group, 1 to 1048576"),
                      ({"piece": 8, "balance": 0}, "options piece with balance=0")]),
    "sputnik_sddmm": ({"tile": 16, "order": "row", "scaled": False}, {"tile": 16, "order": "row", "scaled": False},
                      [({"order": "col"}, "options order='col': expected one of 'phase', 'row'"),
                       ({"min_blocks": 33}, "options min_blocks=33: expected an integer from 1 to 32")]),
    "dense_tile_sddmm": ({"tile_m": 64, "stages": 2}, {"tile_m": 64, "stages": 2},
                         [({"slice_k": 12}, "options slice_k=12: expected 8, 16, 32 or 64")]),
    "dense_tile_spmm": ({"mma": "f16x3", "split_k": 3, "out": "float32"}, {"mma": "f16x3", "split_k": 3,
                                                                            "out": "float32"},
                        [({"split_k": 1.5}, "options split_k=1.5: expected a positive integer"),
                         ({"stages": 2, "mma": "f16x3"}, "options stages=2 with mma='f16x3'")]),
    "dense_gemm": ({"out": "float16"}, {"out": "float16"}, [({"out": "int8"}, "options out='int8': expected one of")]),
    "ell_coo_spmm": ({}, {}, []),
    "panel_spmm": ({"reuse": 8, "splits": 2}, {"reuse": 8, "splits": 2},
                   [({"reuse": 0}, "options reuse=0: expected an integer from 1 to 256"),
                    ({"blocks_per_sm": True}, "options blocks_per_sm=True: expected an integer from 1 to 64")]),
    "tiled_csl_spmm": ({"warps": 8, "reduction": "stream", "strict_banks": 1}, {"warps": 8, "reduction": "stream",
                                                                                 "strict_banks": True},
                       [({"warps": 6}, "options warps=6: expected 4 or 8"),
                        ({"wgmma": "yes"}, "options wgmma='yes': expected True or False"),
                        ({"reduction": "tree"}, "options reduction='tree': expected one of 'atomic', 'cluster'")]),
    "tiled_bitmap_spmm": ({"granule": 2, "bn": 16}, {"granule": 2, "bn": 16},
                          [({"granule": 3}, "options granule=3: expected one of (1, 2)"),
                           ({"blocks": 0}, "options blocks=0: expected resident blocks per SM")]),
    "tiled_lanes_spmm": ({"tile_k": 64, "tile_m": 256}, {"tile_k": 64, "tile_m": 256},
                         [({"tile_k": 32}, "options tile_k=32: expected one of (64, 128)")]),
}


def test_every_family_is_covered():
    assert set(CASES) == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_valid_options_build_typed_and_normalized(name):
    given, held, _ = CASES[name]
    opts = FAMILIES[name].Options.from_dict(given, name)
    assert isinstance(opts, FamilyOptions) and dict(opts.items()) == held
    assert all(type(getattr(opts, k)) is type(v) for k, v in held.items())
    assert FAMILIES[name].Options.from_dict({}, name).items() == ()
    with pytest.raises(AttributeError):
        opts.extra = 1  # frozen


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_unknown_key_is_refused_naming_the_valid_ones(name):
    valid = FAMILIES[name].Options.names()
    with pytest.raises(OptionsError) as err:
        FAMILIES[name].Options.from_dict({"blokc": 256}, name)
    assert str(err.value).startswith(f"options blokc: {name} takes no such option (")
    assert (f"its options: {', '.join(valid)})" if valid else "it takes none)") in str(err.value)


@pytest.mark.parametrize("name, bad, message", [(n, b, m) for n, (_, _, cases) in sorted(CASES.items())
                                               for b, m in cases])
def test_a_value_its_option_does_not_take_is_refused_saying_what_it_expects(name, bad, message):
    with pytest.raises(OptionsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FAMILIES[name].Options.from_dict(bad, name)


def test_compile_refuses_a_typo_naming_it_and_the_valid_options():
    a = random_csr(64, 64, 0.2, seed=1)
    with pytest.raises(OptionsError, match=r"options blokc: no kernel family for op=spmm takes such an option "
                                           r"\(options for spmm: balance, batch, block, .*family.*tile_m"):
        sparsegen.compile(a, n=64, backend="emulate", options={"tile_m": 64, "blokc": 256})
    with pytest.raises(OptionsError, match=r"options blokc: tiled_csl_spmm takes no such option \(its options: out, "):
        sparsegen.compile(a, n=64, dtype="float16", backend="emulate",
                          options={"family": "tiled_csl_spmm", "blokc": 256})
    with pytest.raises(OptionsError, match="options: expected a dict"):
        sparsegen.compile(a, n=64, backend="emulate", options=[("block", 256)])


def test_compile_refuses_a_value_no_family_takes_and_a_forced_familys_bad_value():
    a = random_csr(64, 64, 0.2, seed=1)
    with pytest.raises(OptionsError, match=r"options tile_m=96: expected one of 64, 128, 256 \(tiled_bitmap_spmm, "
                                           r"tiled_csl_spmm, tiled_lanes_spmm\); options tile_m=96: expected one of 64, 128 "
                                           r"\(dense_tile_spmm\)"):
        sparsegen.compile(a, n=64, backend="emulate", options={"tile_m": 96})
    with pytest.raises(OptionsError, match="options unroll=3"):
        sparsegen.compile(a, n=64, backend="emulate", options={"family": "csr_rowsplit", "unroll": 3})
    assert issubclass(OptionsError, UnsupportedError)  # as the rules' declines of bad values were


def test_options_the_selected_family_does_not_take_are_refused():
    a = random_csr(200, 300, 0.05, seed=2)  # float32, n = 64: a CSR kernel, not the tensor-core tiles
    plain = sparsegen.compile(a, n=64, backend="emulate")
    assert "tile_m" not in plain.family.Options.names()
    with pytest.raises(OptionsError, match=rf"options tile_m: {plain.spec.family}, selected for this request, "
                                           r"takes no such option \(its options: .*\); options family= chooses a "
                                           r"family that does \(tiled_bitmap_spmm, tiled_csl_spmm, tiled_lanes_spmm, dense_tile_spmm\)"):
        sparsegen.compile(a, n=64, backend="emulate", options={"tile_m": 64})
    k = sparsegen.compile(a, n=64, backend="emulate", options={"block": 256})  # both CSR kernels take it
    assert k.spec.block == 256


def test_equal_options_normalize_to_one_form_and_one_cache_entry(tmp_path, monkeypatch):
    assert normalize_options("spdnn_layer", {"minibatch": 16, "unroll": True, "cap": None}) == ()
    assert normalize_options("spmm", {"block": np.int64(256), "tile_m": None}) == (("block", 256),)
    assert normalize_options("spmm", {"warps": 4}) == ()  # every family taking it: its default
    assert (normalize_options("spmm", {"family": "tiled_csl_spmm", "warps": 4, "split_k": np.int32(2)})
            == (("family", "tiled_csl_spmm"), ("split_k", 2)))
    assert normalize_options("spmm", {"prefetch": True, "family": "sputnik_spmm"}) == (("family", "sputnik_spmm"),
                                                                                         ("prefetch", 1))
    monkeypatch.setenv("SPARSEGEN_CACHE_DIR", str(tmp_path))
    a = random_csr(100, 120, 0.1, seed=3)
    first = sparsegen.compile(a, n=32, backend="emulate", options={"family": "csr_rowsplit", "block": 256})
    again = sparsegen.compile(a, n=32, backend="emulate", options={"block": np.int64(256), "unroll": None,
                                                                   "family": "csr_rowsplit"})
    assert first.timings.cached["plan"] is False and again.timings.cached["plan"] is True
    assert again.request.options == first.request.options == (("block", 256), ("family", "csr_rowsplit"))


def test_spdnn_layer_options_keep_working_and_its_epilogue_comes_from_the_arguments():
    w = random_csr(64, 64, 0.2, seed=4)
    k = sparsegen.compile(w, op="spdnn_layer", bias=-0.3, cap=32.0, backend="emulate",
                          options={"minibatch": 8, "unroll": False, "block": 64})
    assert (k.spec.minibatch, k.spec.block, k.spec.width, k.spec.bias, k.spec.cap) == (8, 64, 0, -0.3, 32.0)
    with pytest.raises(OptionsError, match=r"options bias: the layer's bias come from compile\(\)'s arguments"):
        sparsegen.compile(w, op="spdnn_layer", bias=-0.3, backend="emulate", options={"bias": 1.0})
    with pytest.raises(OptionsError, match="options minibatch=6: expected a positive multiple of 4"):
        sparsegen.compile(w, op="spdnn_layer", backend="emulate", options={"minibatch": 6})


def test_tune_times_only_families_that_take_the_options_given():
    req = _request("spmm", 128, None, "float32", "sm_90", None, False, None, "nonzero", {"ksplit": 4})
    assert tune.candidate_families(req) == ["sputnik_spmm"]
    req = _request("spmm", 128, None, "float32", "sm_90", None, False, None, "nonzero", {"block": 256})
    assert tune.candidate_families(req) == ["sputnik_spmm", "csr_rowsplit"]


def test_the_families_of_an_op_that_share_an_option_agree_on_its_default():
    """Normalization drops an option at its default only where every family taking it agrees."""
    for op in ("spmm", "sddmm", "spdnn_layer"):
        serving = [f for f in ORDER if op in f.ops]
        for key in {n for f in serving for n in f.Options.names()}:
            defaults = {repr(f.Options.default(key)) for f in serving if key in f.Options.names()}
            assert len(defaults) == 1, (op, key, defaults)
