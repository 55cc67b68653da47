"""examples/sparse_decode.py on the CPU with a tiny OPT config: its static-cache decoder gives
transformers' own logits; the sparse model (SparseLinear on the emulator) decodes within the
dtype's tolerance of the dense pruned one, eagerly and with the step compiled whole (fullgraph);
the command line; `sparsegen bench decode` end to end on it; compiling ahead in a worker process.
Skips without torch and transformers."""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch", reason="torch not installed")
pytest.importorskip("transformers", reason="transformers not installed: the decode example needs it")

import sparsegen.torch as sgt  # noqa: E402
from sparsegen.bench import BenchConfig  # noqa: E402
from sparsegen.bench import decode as suite  # noqa: E402

from .conftest import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "examples"))
import sparse_decode as sd  # noqa: E402

sys.path.pop(0)


def test_static_cache_decoder_gives_transformers_logits():
    model = sd.build("tiny", torch.float32, "cpu", seed=3)
    prompt, new, batch = 7, 5, 3
    ids = torch.randint(model.config.vocab_size, (batch, prompt + new), generator=torch.Generator().manual_seed(1))
    decoder = sd.Decoder(model, sd.KVCache(model.config, batch, prompt + new, torch.float32, "cpu"), ids[:, prompt:],
                         prompt)
    with torch.inference_mode():
        full = model(ids).logits  # transformers' forward over the whole sequence, no cache
        assert torch.allclose(decoder.prefill(ids[:, :prompt]), full[:, prompt - 1], atol=1e-5)
        for t in range(new):  # step t reads token prompt + t and predicts what follows it
            assert torch.allclose(decoder.step(), full[:, prompt + t], atol=1e-5), t
        assert int(decoder.pos) == prompt + new
        decoder.reset()
        assert int(decoder.pos) == prompt


def test_pruned_pair_prunes_the_decoder_linears_only():
    model = sd.build("tiny", torch.float16, "cpu", layers=1)
    head = model.lm_head.weight.clone()
    dense, sparse, report = sd.pruned_pair(model, 0.7, backend="emulate")
    names = [r.name for r in report.layers]
    assert names == [f"model.decoder.layers.0.{n}" for n in ("self_attn.k_proj", "self_attn.v_proj",
                                                             "self_attn.q_proj", "self_attn.out_proj", "fc1", "fc2")]
    for r in report.layers:
        assert isinstance(sparse.get_submodule(r.name), sgt.SparseLinear)
        assert torch.equal(dense.get_submodule(r.name).weight, r.module.dense_weight())  # the same pruned weights
        assert r.module.bias is not None and abs(r.module.bias).max() > 0  # biases are random, not zero
    assert torch.equal(dense.lm_head.weight, head) and type(sparse.lm_head) is torch.nn.Linear
    assert sd.linear_bytes(dense) == sum(2 * (r.in_features + 1) * r.out_features for r in report.layers)


@pytest.mark.parametrize("dtype,backend", [(torch.float32, None), (torch.float16, None), (torch.bfloat16, None),
                                           (torch.float16, "eager")])
def test_sparse_decode_matches_dense_pruned(dtype, backend):
    torch._dynamo.reset()
    model = sd.build("tiny", dtype, "cpu")
    dense, sparse, report = sd.pruned_pair(model, 0.6, backend="emulate")
    r = sd.measure(dense, sparse, report, batch=2, prompt=8, new_tokens=4, device="cpu", backend=backend,
                   graphs=False, repeats=2)
    assert r["pass"] and r["max_error"] <= sd.TOLERANCE[str(dtype)[6:]] and r["argmax_agreement"] == 1.0
    assert 0 <= r["mean_error"] <= r["max_error"]
    assert len(r["seconds"]["sparse"]) == 2 and r["tokens_per_s"]["dense"] > 0
    assert r["bytes"]["dense"] == sd.linear_bytes(dense) and r["bytes"]["sparse"] > 0
    assert all(2 in layer.specs for layer in report.layers)  # every layer ran at N = batch


def test_a_broken_sparse_layer_fails_the_check():
    model = sd.build("tiny", torch.float32, "cpu")
    dense, sparse, report = sd.pruned_pair(model, 0.5, backend="emulate")
    with torch.no_grad():
        dense.get_submodule(report.layers[-1].name).weight.mul_(1.5)  # the dense model no longer matches
    r = sd.measure(dense, sparse, report, batch=1, prompt=4, new_tokens=2, device="cpu", backend=None,
                   graphs=False, repeats=1)
    assert not r["pass"] and r["max_error"] > r["tolerance"]


def test_compiled_step_is_one_graph_with_every_layer():
    model = sd.build("tiny", torch.float32, "cpu")
    dense, sparse, report = sd.pruned_pair(model, 0.5, backend="emulate")
    cache = sd.KVCache(model.config, 1, 6, torch.float32, "cpu")
    decoder = sd.Decoder(sparse, cache, torch.zeros(1, 2, dtype=torch.long), 4)
    with torch.inference_mode():
        explain = torch._dynamo.explain(decoder.step)()
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    spmm = sum(1 for g in explain.graphs for n in g.graph.nodes
               if n.target in (torch.ops.sparsegen.linear, torch.ops.sparsegen.linear.default))
    assert spmm == len(report.layers) == 12


def test_command_line_on_the_cpu(capsys):
    status = sd.main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--batch", "1,2", "--prompt", "6",
                      "--new-tokens", "3", "--repeats", "1", "--sparsity", "0.7"])
    out = capsys.readouterr().out
    assert status == 0
    assert "tiny (2 layers) float32, 12 Linears pruned to 70%" in out
    assert out.count("tok/s, speedup") == 2 and "batch   2:" in out


def test_bench_suite_runs_the_example(monkeypatch, tmp_path):
    monkeypatch.setattr(suite, "RUN", {"device": "cpu", "backend": None, "graphs": False})
    monkeypatch.setattr(suite, "REPEATS", 1)
    cfg = BenchConfig(suite="decode", data_dir=None, models=("tiny",), dtypes=("float32",), sparsities=(0.5,),
                      batches=(1, 2), prompt=6, new_tokens=3, workers=0)
    lines = []
    doc = suite.run(cfg, env={"gpu": "cpu"}, emit=lines.append)
    assert [c["id"] for c in doc["cases"]] == ["tiny/float32/s0.5/b1", "tiny/float32/s0.5/b2"]
    assert all(c["status"] == "ok" for c in doc["cases"]), doc["cases"]
    assert doc["cases"][1]["linears"] == 12 and doc["host_us"] == {"note": "host time per call is measured on "
                                                                            "CUDA layers only"}
    paths = suite.write_reports(doc, tmp_path)
    assert "## tiny float32: speedup" in paths["md"].read_text()


def test_precompile_fills_the_cache_in_a_worker():
    dense = sd.build("tiny", torch.float16, "cpu", layers=1)
    _, _, report = sd.pruned_pair(dense, 0.5, backend="emulate", workers=1, ns=(3,))
    assert all(r.module.kernel(3).timings.cached.get("plan") for r in report.layers)  # the worker made them
    assert not report.layers[0].module.kernel(5).timings.cached.get("plan")  # an N it was not asked for
