"""GPU tier for `torch.ops.sparsegen.spmm`: the operator on CUDA tensors eager, under
torch.compile (fullgraph, inductor; and mode="reduce-overhead", inductor's own CUDA graphs) and
torch.export, against the dense pruned layer, for the families and split-K reductions; CUDA graph
capture (a layer and a whole decode step of examples/sparse_decode.py) replayed 100 times with
changing inputs, every output checked; nothing allocated, uploaded or synchronised inside a capture;
an unprepared token count refused there; one device copy of W for every N."""
from __future__ import annotations

import copy
import sys

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="torch not installed: sparsegen.torch is optional")

import sparsegen.torch as sgt  # noqa: E402
from sparsegen import runtime  # noqa: E402
from sparsegen.errors import LaunchError  # noqa: E402

from .conftest import REPO  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
# (family options) covering one-launch kernels, split-K through atomics (workspace and counters the
# kernel re-zeroes) and through a second launch, the CSR kernels, and the dense fallback's GEMM
VARIANTS = {"selected": None, "csl-atomic": {"family": "tiled_csl_spmm", "split_k": 4, "reduction": "atomic"},
            "csl-two-step": {"family": "tiled_csl_spmm", "split_k": 4, "reduction": "two_step"},
            "bitmap": {"family": "tiled_bitmap_spmm"}, "csr": {"family": "csr_rowsplit"},
            "sputnik": {"family": "sputnik_spmm"}, "dense": {"family": "dense_gemm"}}
HALF_ONLY = {"csr", "sputnik"}  # fp16 only


@pytest.fixture(scope="module", autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def cases():
    for name in VARIANTS:
        for dtype in (torch.float16, torch.bfloat16):
            if not (dtype == torch.bfloat16 and name in HALF_ONLY):
                yield pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}")


def rel(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def pair(dtype, options, k=512, m=384, sparsity=0.7, seed=0):
    torch.manual_seed(seed)
    dense = torch.nn.Linear(k, m).to("cuda", dtype)
    layer = sgt.SparseLinear.from_dense(dense, sparsity, options=options, tune=False)
    return layer, layer.to_linear("cuda")


@pytest.mark.parametrize("name,dtype", list(cases()))
def test_eager_compiled_and_exported_match_dense_pruned(name, dtype):
    torch._dynamo.reset()
    layer, dense = pair(dtype, VARIANTS[name])
    model, ref = torch.nn.Sequential(layer, torch.nn.ReLU()), torch.nn.Sequential(dense, torch.nn.ReLU())
    compiled = torch.compile(model, fullgraph=True)
    with torch.inference_mode():
        for lead in ((1,), (8,), (2, 3)):
            x = torch.randn(lead + (512,), device="cuda", dtype=dtype)
            y, y_compiled, y_ref = model(x), compiled(x), ref(x)
            assert rel(y, y_ref) <= 2 * TOL[dtype], (layer.specs, rel(y, y_ref))
            assert rel(y_compiled, y) <= TOL[dtype]
    x = torch.randn(4, 512, device="cuda", dtype=dtype)
    program = torch.export.export(model, (x,))
    with torch.inference_mode():
        assert rel(program.module()(x), ref(x)) <= 2 * TOL[dtype]
    assert name == "selected" or all(s.startswith(VARIANTS[name]["family"]) for s in layer.specs.values())


@pytest.mark.parametrize("name,dtype", list(cases()))
def test_opcheck_passes_on_cuda(name, dtype):
    layer, _ = pair(dtype, VARIANTS[name])
    for x in (torch.randn(512, 8, device="cuda", dtype=dtype), torch.randn(8, 512, device="cuda", dtype=dtype).t()):
        result = torch.library.opcheck(torch.ops.sparsegen.spmm.default, (x, layer.handle, 384))
        assert set(result.values()) == {"SUCCESS"}, result
    for x in (torch.randn(8, 512, device="cuda", dtype=dtype), torch.randn(2, 3, 512, device="cuda", dtype=dtype)):
        result = torch.library.opcheck(torch.ops.sparsegen.linear.default, (x, layer.handle, 384))
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("name,dtype", list(cases()))
def test_layer_graph_replays_100_times_with_changing_inputs(name, dtype):
    """A captured layer replays with whatever X holds; split-K workspaces are zero again after every
    replay (a stale partial sum would show as a growing error)."""
    layer, dense = pair(dtype, VARIANTS[name])
    x = torch.randn(4, 512, device="cuda", dtype=dtype)
    with torch.inference_mode():
        layer(x)  # prepares N = 4 outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x)
        for i in range(100):
            x.copy_(torch.randn(4, 512, device="cuda", dtype=dtype) * (1 + i % 3))
            graph.replay()
            torch.cuda.synchronize()
            assert rel(y, dense(x)) <= 2 * TOL[dtype], (i, layer.specs)


def test_capture_makes_no_upload_allocation_or_sync(monkeypatch):
    layer, dense = pair(torch.float16, VARIANTS["csl-atomic"])
    x = torch.randn(8, 512, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        layer(x)
        for name in ("upload", "scratch_buffers", "synchronize", "ensure_context"):
            monkeypatch.setattr(runtime, name, lambda *a, n=name: pytest.fail(f"runtime.{n} inside a capture"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="global"):  # a sync or cudaMalloc here is an error
            y = layer(x)
        graph.replay()
        torch.cuda.synchronize()
    assert rel(y, dense(x)) <= 2 * TOL[torch.float16]
    assert layer.op.prepared[8].pinned  # the graph holds its workspaces: never evicted


def test_unprepared_token_count_inside_a_capture_is_refused():
    layer, _ = pair(torch.float16, None)
    x = torch.randn(5, 512, device="cuda", dtype=torch.float16)
    with torch.inference_mode(), pytest.raises(LaunchError, match=r"N = 5 was not prepared before this CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            layer(x)
    torch.cuda.synchronize()
    layer.prepare(5)
    with torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(x)
        graph.replay()  # prepared: captured and replayed
    torch.cuda.synchronize()


def test_reduce_overhead_mode_replays_inductors_graphs():
    torch._dynamo.reset()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).to("cuda",
                                                                                                          torch.float16)
    ref = copy.deepcopy(model)
    report = sgt.sparsify(model, 0.8, tune=False)
    with torch.no_grad():
        for r in report.layers:
            ref.get_submodule(r.name).weight.copy_(r.module.dense_weight("cuda"))
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.inference_mode():
        for i in range(6):  # warm-up runs, the recording, then replays
            x = torch.randn(16, 512, device="cuda", dtype=torch.float16)
            assert rel(compiled(x).clone(), ref(x)) <= 4 * TOL[torch.float16], i


def test_one_device_copy_of_w_for_every_token_count():
    layer, dense = pair(torch.float16, {"family": "tiled_csl_spmm"}, k=1024, m=2048)
    with torch.inference_mode():
        for n in (1, 8, 16, 32):
            x = torch.randn(n, 1024, device="cuda", dtype=torch.float16)
            assert rel(layer(x), dense(x)) <= 2 * TOL[torch.float16]
    assert all(len(entries) == 1 for entries in layer.op.pool.entries.values())  # every N reads the same arrays
    plan_bytes = sum(a.nbytes for a in layer.kernel(32).plan.arrays.values())
    assert plan_bytes <= layer.device_bytes() < 2 * plan_bytes


def test_sparsify_precompile_prepares_for_a_capture():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).to("cuda",
                                                                                                        torch.float16)
    ref = copy.deepcopy(model)
    report = sgt.sparsify(model, 0.7, precompile=(3,), tune=False)
    with torch.no_grad():
        for r in report.layers:
            ref.get_submodule(r.name).weight.copy_(r.module.dense_weight("cuda"))
    x = torch.randn(3, 256, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # no warm-up call: sparsify prepared N = 3
            y = model(x)
        graph.replay()
    torch.cuda.synchronize()
    assert rel(y, ref(x)) <= 4 * TOL[torch.float16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_step_captured_and_replayed_100_times(dtype):
    """examples/sparse_decode.py's step (compiled, in a CUDA graph) for 100 new tokens: every step's
    logits of the sparse model against the dense pruned model's, the dense one first under the same
    method (compiled, graph), then run eagerly without a graph (so a replay that went wrong the same
    way in both models cannot pass)."""
    pytest.importorskip("transformers", reason="the decode example needs transformers")
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import sparse_decode as sd
    finally:
        sys.path.pop(0)
    torch._dynamo.reset()
    model = sd.build("tiny", dtype, "cuda", seed=4)
    dense, sparse, report = sd.pruned_pair(model, 0.7, backend="gpu")
    r = sd.measure(dense, sparse, report, batch=4, prompt=32, new_tokens=100, device="cuda", backend="inductor",
                   graphs=True, repeats=2)
    assert r["pass"], (r["max_error"], r["tolerance"])
    assert all(4 in layer.specs for layer in report.layers)
    config, new = dense.config, 100
    ids = torch.randint(config.vocab_size, (4, 32 + new), device="cuda")
    cache = sd.KVCache(config, 4, 32 + new, dtype, "cuda")
    eager, graphed = sd.Decoder(dense, cache, ids[:, 32:], 32), sd.Decoder(sparse, cache, ids[:, 32:], 32)
    with torch.inference_mode():
        eager.prefill(ids[:, :32])
        want = sd.Runner(eager, None, graphs=False).decode(new)
        got = sd.Runner(graphed, "inductor", graphs=True).decode(new)
    errors = sd.step_errors(got, want)
    assert len(errors) == new and max(errors) <= sd.TOLERANCE[str(dtype)[6:]], max(errors)
