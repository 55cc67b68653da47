"""Selection with tiled lanes' tile rates: an optional group of the rates file that lets the skinny
cost model weigh the family (and its absence keeps it taken only when asked for)."""
from __future__ import annotations

import dataclasses
import json

import pytest

import sparsegen
from sparsegen.families.base import Request

from .tiled_helpers import pinned_library, uniform_stats


def lanes_device(scale: float):
    """The default device whose rates file also holds tiled lanes' rates: bitmap register pairs'
    cycles times `scale`."""
    from sparsegen.select.device import default

    from .helpers import synthetic_device

    g2 = default().rates.tiles.tiled_bitmap_spmm_g2
    lanes = dataclasses.replace(g2, base=g2.base * scale, per_column=g2.per_column * scale,
                                per_nonzero=g2.per_nonzero * scale)
    return synthetic_device(f"lanes x{scale}", tiles={"tiled_lanes_spmm": lanes})


def select_on(device, stats, n, **options):
    from sparsegen.select import select_request

    with pinned_library(None):
        return select_request(stats, Request("spmm", n=n, dtype="float16", arch="sm_90", device=device,
                                             options=tuple(sorted(options.items()))))


def test_a_rates_file_with_its_rates_lets_the_cost_model_weigh_it():
    """Rates that make its main loop half bitmap register pairs' cost: the model predicts it and
    picks it at 90 %, N = 8; at four times their cost it is predicted, and left."""
    from sparsegen.select import skinny_cost

    stats = uniform_stats(7168, 7168, 0.1)
    cheap = select_on(lanes_device(0.5), stats, 8)
    assert cheap.spec.family == "tiled_lanes_spmm" and cheap.reason.startswith("tiled lanes predicted fastest")
    assert cheap.spec.tile_k == 128 and "; rates h100-80gb-hbm3.json (lanes x0.5);" in cheap.reason
    # predicted within the others' errors: the GPU times them all (forced options of each)
    assert (("family", "tiled_lanes_spmm"),) in cheap.contenders and (("family", "tiled_csl_spmm"),) in cheap.contenders
    dear_device = lanes_device(4.0)
    dear = select_on(dear_device, stats, 8)
    assert dear.spec.family != "tiled_lanes_spmm"
    compared = skinny_cost.compare(stats, Request("spmm", n=8, dtype="float16", arch="sm_90", device=dear_device))
    assert compared.get("tiled_lanes_spmm") is not None and compared.predictions[0].family != "tiled_lanes_spmm"
    # without its rates it is not a candidate at all
    plain = skinny_cost.compare(stats, Request("spmm", n=8, dtype="float16", arch="sm_90"))
    assert plain.get("tiled_lanes_spmm") is None


def test_its_error_stands_in_as_the_largest_tile_error_until_measured():
    from sparsegen.select.device import default

    errors = default().rates.errors
    assert errors.tiled_lanes_spmm is None
    assert errors.of("tiled_lanes_spmm") == max(errors.tiled_csl_spmm, errors.tiled_bitmap_spmm,
                                                errors.tiled_bitmap_spmm_g2)
    assert dataclasses.replace(errors, tiled_lanes_spmm=0.03).of("tiled_lanes_spmm") == 0.03


def test_a_rates_file_reads_and_writes_its_rates_only_when_it_has_them(tmp_path):
    from sparsegen.select import ratesfile

    doc = json.loads(ratesfile.DEFAULT_FILE.read_text())
    assert "tiled_lanes_spmm" not in doc["rates"]["tiles"]
    without = ratesfile.from_dict(doc)
    assert without.tiles.tiled_lanes_spmm is None and "tiled_lanes_spmm" not in without.to_dict()["rates"]["tiles"]
    doc["rates"]["tiles"]["tiled_lanes_spmm"] = None
    assert ratesfile.from_dict(doc) == without  # null reads as absent
    doc["rates"]["tiles"]["tiled_lanes_spmm"] = dict(doc["rates"]["tiles"]["tiled_bitmap_spmm_g2"], base=1.0)
    doc["rates"]["errors"]["tiled_lanes_spmm"] = 0.04
    with_it = ratesfile.from_dict(doc)
    assert with_it.tiles.tiled_lanes_spmm.base == 1.0 and with_it.errors.of("tiled_lanes_spmm") == 0.04
    assert with_it != without and with_it.to_dict()["rates"]["tiles"]["tiled_lanes_spmm"]["base"] == 1.0
    del doc["rates"]["tiles"]["tiled_lanes_spmm"]["base"]
    with pytest.raises(sparsegen.FormatError, match="missing key tiles.tiled_lanes_spmm.base"):
        ratesfile.from_dict(doc)


def test_without_its_rates_its_main_loop_is_predicted_with_register_pairs():
    """Under a file without tiled lanes' rates, its split-K is weighed with bitmap register pairs'
    main-loop rates; with them, with its own."""
    from sparsegen.select import skinny_cost
    from sparsegen.select.device import default

    plain_rates, cheap_rates = default().rates, lanes_device(0.5).rates
    assert skinny_cost.main_loop_key("tiled_lanes_spmm", 1, plain_rates) == "tiled_bitmap_spmm.g2"
    assert skinny_cost.main_loop_key("tiled_lanes_spmm", 2, cheap_rates) == "tiled_lanes_spmm"
    assert skinny_cost.main_loop_key("tiled_bitmap_spmm", 2, plain_rates) == "tiled_bitmap_spmm.g2"
    assert skinny_cost.main_loop_key("tiled_bitmap_spmm", 1, plain_rates) == "tiled_bitmap_spmm"
    assert skinny_cost.main_loop_key("tiled_csl_spmm", 2, plain_rates) == "tiled_csl_spmm"
    stats = uniform_stats(7168, 7168, 0.1)
    forced = select_on(default(), stats, 8, family="tiled_lanes_spmm")
    assert forced.spec.family == "tiled_lanes_spmm" and forced.reason.startswith("tiled lanes as asked")
    stand_in = skinny_cost.kernel_seconds(stats, Request("spmm", n=8, dtype="float16", arch="sm_90"),
                                          "tiled_bitmap_spmm", granule=2)
    own = skinny_cost.kernel_seconds(stats, Request("spmm", n=8, dtype="float16", arch="sm_90"), "tiled_lanes_spmm")
    assert own == stand_in  # the lanes' bytes per tile are below register pairs': issue binds both alike
    calibrated = select_on(lanes_device(4.0), stats, 8, family="tiled_lanes_spmm")
    assert calibrated.spec.family == "tiled_lanes_spmm" and calibrated.reason.startswith("tiled lanes as asked")
