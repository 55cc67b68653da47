"""Decode tokens/s of an OPT decoder whose every decoder-layer Linear is pruned and run by sparsegen,
against the same pruned model run dense, both under torch.compile and CUDA graphs.

    python examples/sparse_decode.py --model opt-1.3b --sparsity 0.8 --batch 1,16
    python examples/sparse_decode.py --model tiny --device cpu --dtype float32   # emulator, no graphs

The model is transformers' OPTForCausalLM made from a config (OPT-1.3B or OPT-6.7B shapes, or a tiny
one; `--layers` keeps the first L decoder layers), random weights (seeded; nothing is downloaded),
in fp16 or bf16. Every Linear of its decoder layers (q, k, v and out projections, fc1, fc2) is
magnitude-pruned by sparsegen's rule; the sparse model holds them as `sparsegen.torch.SparseLinear`
(the operator `torch.ops.sparsegen.linear`), the dense one as the pruned `nn.Linear`s. Embeddings and
the LM head stay dense in both.

Decoding (`Decoder`): OPT's forward written over the model's own modules with a static KV cache,
so that one step has fixed shapes and no host synchronisation. The prompt (random ids) fills the
cache once, by the dense model; both models then decode the same new tokens (random ids, fixed in
advance, so every step's logits compare like for like). The step is compiled (torch.compile,
fullgraph, inductor), captured in a CUDA graph after a warm-up that prepares every kernel, and
replayed once per token (`Runner`). tokens/s = batch x new tokens / decode time (CUDA events,
median of the timed passes). Every step's logits of the sparse model are checked against the
dense model's: the relative (Frobenius, over batch x vocabulary) difference must stay within the
dtype's TOLERANCE. Weights' memory: the dense layers' bytes against what the sparse layers hold
on the device (one plan per layer, shared by every token count, plus workspaces).

`sparsegen bench decode` runs `measure` for its cases and writes the results like the other suites.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, never a download
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHAPES = {  # OPTConfig fields of the published models' shapes; "tiny" is for tests
    "opt-1.3b": dict(hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32),
    "opt-6.7b": dict(hidden_size=4096, ffn_dim=16384, num_hidden_layers=32, num_attention_heads=32),
    "tiny": dict(hidden_size=64, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=512,
                 max_position_embeddings=256),
}
# Largest relative difference of one step's logits, sparse against dense pruned, both in this dtype:
# the two differ in summation order and rounding points only, through every layer.
TOLERANCE = {"float16": 2e-2, "bfloat16": 8e-2, "float32": 1e-4}
WARMUP_STEPS = 3


def decoder_linear(name: str) -> bool:
    """The Linears that are pruned: those of the decoder layers (not the LM head)."""
    return ".layers." in name


def build(shape: str, dtype, device, layers: int | None = None, seed: int = 0):
    """OPTForCausalLM of the named shape with seeded random weights (biases too) in `dtype` (a
    torch dtype or its name)."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    fields = dict(SHAPES[shape])
    if layers:
        fields["num_hidden_layers"] = layers
    config = OPTConfig(**fields, word_embed_proj_dim=fields["hidden_size"], dropout=0.0, do_layer_norm_before=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = OPTForCausalLM(config)
    model = model.to(dtype).eval()
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():  # OPT's init leaves biases zero: make them count
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.normal_(0.0, 0.02, generator=generator)
    return model


def pruned_pair(model, sparsity: float, *, backend: str, tune=False, workers: int = 0, ns=()):
    """(dense, sparse): `model` with its decoder Linears pruned, and a copy holding them as
    SparseLinear (compiled ahead for the token counts `ns` in `workers` processes); and the report."""
    import torch

    import sparsegen.torch as sgt

    sparse = copy.deepcopy(model)
    report = sgt.sparsify(sparse, sparsity, include=decoder_linear, backend=backend, tune=tune, max_kernels=8)
    with torch.no_grad():
        for layer in report.layers:  # the same rule on the same weights: the same pattern and values
            weight = model.get_submodule(layer.name).weight
            weight.copy_(sgt.magnitude_prune(weight, sparsity))
    if workers and ns:
        sgt.precompile([r.module for r in report.layers], ns, workers=workers)
    return model, sparse, report


class KVCache:
    """Keys and values of every layer for `length` positions: (batch, heads, length, head_dim) each."""

    def __init__(self, config, batch: int, length: int, dtype, device):
        import torch

        heads = config.num_attention_heads
        shape = (batch, heads, length, config.hidden_size // heads)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.length = length


class Decoder:
    """OPT's forward over a static KV cache, from the model's own modules (HF's attention without
    its cache and mask machinery): `prefill(prompt)` writes slots [0, P), `step()` reads the next
    new token (`tokens[:, pos - P]`), writes slot `pos`, returns its logits and advances `pos` (a
    device tensor: no host value is read, so the step can be captured and replayed)."""

    def __init__(self, model, cache: KVCache, tokens, prompt_length: int):
        import torch

        config, decoder = model.config, model.model.decoder
        self.model, self.cache, self.tokens, self.prompt = model, cache, tokens, prompt_length
        self.embed, self.positions, self.layers = decoder.embed_tokens, decoder.embed_positions, decoder.layers
        self.final_norm, self.lm_head = decoder.final_layer_norm, model.lm_head
        self.project_in, self.project_out = decoder.project_in, decoder.project_out
        self.heads, self.pre_norm = config.num_attention_heads, config.do_layer_norm_before
        self.slots = torch.arange(cache.length, device=tokens.device)
        self.pos = torch.full((1,), prompt_length, dtype=torch.long, device=tokens.device)

    def reset(self):
        self.pos.fill_(self.prompt)

    def prefill(self, prompt):
        """The prompt's logits at its last position; its keys and values into slots [0, P)."""
        import torch

        return self.forward(prompt, torch.arange(prompt.shape[1], device=prompt.device), None)[:, -1]

    def step(self):
        """The next new token's logits (batch, vocabulary)."""
        ids = self.tokens.index_select(1, self.pos - self.prompt)
        logits = self.forward(ids, self.pos, (self.slots <= self.pos).view(1, -1))
        self.pos.add_(1)
        return logits[:, -1]

    def forward(self, ids, positions, mask):
        """Logits of `ids` (B, S) at `positions` (S,); `mask` (S, length) says which slots each
        query reads, None for a prompt read causally from slot 0."""
        h = self.embed(ids)
        if self.project_in is not None:
            h = self.project_in(h)
        h = h + self.positions.weight.index_select(0, positions + self.positions.offset)  # OPT's offset of 2
        for i, layer in enumerate(self.layers):
            h = self.layer(i, layer, h, positions, mask)
        if self.final_norm is not None:
            h = self.final_norm(h)
        if self.project_out is not None:
            h = self.project_out(h)
        return self.lm_head(h)

    def layer(self, i: int, layer, h, positions, mask):
        import torch.nn.functional as F

        attn, (b, s, width) = layer.self_attn, h.shape
        x = layer.self_attn_layer_norm(h) if self.pre_norm else h

        def heads(t):
            return t.view(b, s, self.heads, -1).transpose(1, 2)

        q, k, v = heads(attn.q_proj(x) * attn.scaling), heads(attn.k_proj(x)), heads(attn.v_proj(x))
        self.cache.k[i].index_copy_(2, positions, k)
        self.cache.v[i].index_copy_(2, positions, v)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
        else:
            o = F.scaled_dot_product_attention(q, self.cache.k[i], self.cache.v[i], attn_mask=mask, scale=1.0)
        h = h + attn.out_proj(o.transpose(1, 2).reshape(b, s, width))
        if not self.pre_norm:
            h = layer.self_attn_layer_norm(h)
        x = layer.final_layer_norm(h) if self.pre_norm else h
        h = h + layer.fc2(layer.activation_fn(layer.fc1(x)))
        return h if self.pre_norm else layer.final_layer_norm(h)


class Runner:
    """One decoder's decode loop: the step compiled (`backend`, None: eager) and, with `graphs`,
    captured in a CUDA graph after a warm-up on a side stream, then replayed once per token."""

    def __init__(self, decoder: Decoder, backend: str | None, graphs: bool):
        import torch

        self.decoder, self.graphs, self.graph, self.out = decoder, graphs, None, None
        if backend:
            # Every Runner's step is the same code on another decoder: without a reset, dynamo would
            # recompile up to its limit and then run eagerly, and keep every earlier model alive.
            torch._dynamo.reset()
        self.fn = torch.compile(decoder.step, fullgraph=True, dynamic=False, backend=backend) if backend else decoder.step
        started = time.perf_counter()
        if graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compiles, and prepares every kernel, before the capture
                for _ in range(WARMUP_STEPS):
                    self.fn()
            torch.cuda.current_stream().wait_stream(side)
            decoder.reset()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.fn()
        else:
            self.fn()
        decoder.reset()
        self.setup_s = time.perf_counter() - started

    def next(self):
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out

    def decode(self, steps: int):
        """Every step's logits, (steps, batch, vocabulary), from a fresh start at the prompt's end."""
        self.decoder.reset()
        first = self.next()
        out = first.new_empty((steps,) + tuple(first.shape))
        out[0].copy_(first)
        for t in range(1, steps):
            out[t].copy_(self.next())
        return out

    def time(self, steps: int, repeats: int) -> list:
        """Seconds of `steps` decode steps, `repeats` times (CUDA events on the GPU)."""
        import torch

        runs = []
        for _ in range(repeats):
            self.decoder.reset()
            if self.graphs:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(steps):
                    self.next()
                end.record()
                end.synchronize()
                runs.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                for _ in range(steps):
                    self.next()
                runs.append(time.perf_counter() - t)
        return runs


def step_errors(sparse, dense) -> list:
    """Per step: ||sparse - dense|| / ||dense|| over (batch, vocabulary), in float32."""
    s, d = sparse.float().flatten(1), dense.float().flatten(1)
    return ((s - d).norm(dim=1) / d.norm(dim=1)).tolist()


def linear_bytes(model) -> int:
    """Bytes of the dense decoder Linears' weights and biases."""
    import torch

    return sum(p.numel() * p.element_size() for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and decoder_linear(name) for p in m.parameters())


def measure(dense, sparse, report, *, batch: int, prompt: int, new_tokens: int, device: str,
            backend: str | None, graphs: bool, repeats: int = 5, seed: int = 0) -> dict:
    """One batch size: prefill, then decode with each model; times, step errors and bytes."""
    import torch

    config, dtype = dense.config, next(dense.parameters()).dtype
    generator = torch.Generator().manual_seed(seed * 1000 + batch)
    ids = torch.randint(config.vocab_size, (batch, prompt + new_tokens), generator=generator).to(device)
    cache = KVCache(config, batch, prompt + new_tokens, dtype, device)
    decoders = {"dense": Decoder(dense, cache, ids[:, prompt:], prompt),
                "sparse": Decoder(sparse, cache, ids[:, prompt:], prompt)}
    record = {"batch": batch, "prompt": prompt, "new_tokens": new_tokens, "setup_s": {}, "seconds": {}}
    logits = {}
    with torch.inference_mode():
        decoders["dense"].prefill(ids[:, :prompt])  # the shared prompt cache
        for name, decoder in decoders.items():
            runner = Runner(decoder, backend, graphs)
            record["setup_s"][name] = round(runner.setup_s, 3)
            logits[name] = runner.decode(new_tokens)
            record["seconds"][name] = runner.time(new_tokens, repeats)
            del runner
    errors = step_errors(logits["sparse"], logits["dense"])
    agree = (logits["sparse"].argmax(-1) == logits["dense"].argmax(-1)).float().mean().item()
    tps = {name: batch * new_tokens / statistics.median(s) for name, s in record["seconds"].items()}
    record.update(tokens_per_s=tps, speedup=tps["sparse"] / tps["dense"], max_error=max(errors),
                  mean_error=sum(errors) / len(errors), argmax_agreement=agree,
                  tolerance=TOLERANCE[str(dtype).replace("torch.", "")])
    record["pass"] = bool(record["max_error"] <= record["tolerance"])
    record["bytes"] = {"dense": linear_bytes(dense),
                       "sparse": sum(r.module.device_bytes() for r in report.layers)}
    record["specs"] = sorted({r.specs.get(batch, "-").split(".")[0] for r in report.layers})
    return record


def host_time(report) -> dict:
    """`host_time_per_call` at N = 1 of the first pruned layer that runs a sparse kernel there (a
    layer routed to F.linear has F.linear's host time), named; a note where it cannot run."""
    import torch

    if report.layers[0].module.backend != "gpu" or not torch.cuda.is_available():
        return {"note": "host time per call is measured on CUDA layers only"}
    named = next(((r.name, r.module) for r in report.layers if not r.module.op.routes_dense(1)),
                 (report.layers[0].name, report.layers[0].module))
    name, layer = named
    x = torch.randn(1, layer.in_features, device="cuda", dtype=layer.torch_dtype)
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in host_time_per_call(layer, x).items()}
    return {**out, "layer": f"{name} {layer.out_features}x{layer.in_features}"}


def host_time_per_call(layer, x, calls: int = 2000) -> dict:
    """Host microseconds per call of `layer(x)` (a CUDA layer): eager through forward, through the
    dispatcher (torch.ops.sparsegen.linear), and inside a replayed CUDA graph of 100 calls; and of
    the dense nn.Linear of the same weights and x, eager. Only the time the Python call takes is
    summed (the GPU is synchronised between batches of calls)."""
    import torch

    def per_call(fn):
        for _ in range(20):
            fn()
        total = 0.0
        for _ in range(calls // 100):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(100):
                fn()
            total += time.perf_counter() - t
        return 1e6 * total / (calls // 100 * 100)

    with torch.inference_mode():
        eager = per_call(lambda: layer(x))
        dispatcher = per_call(lambda: torch.ops.sparsegen.linear(x, layer.handle, layer.out_features))
        dense = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                device="cuda", dtype=layer.torch_dtype)
        dense_us = per_call(lambda: dense(x))
        del dense
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(100):
                layer(x)
        replay = per_call(graph.replay) / 100
    return {"eager": eager, "dispatcher": dispatcher, "graph_replay": replay, "dense_linear": dense_us,
            "spec": layer.specs.get(x.numel() // x.shape[-1])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="opt-1.3b")
    parser.add_argument("--layers", type=int, help="keep the first L decoder layers (default: all)")
    parser.add_argument("--sparsity", type=float, default=0.8)
    parser.add_argument("--batch", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float16")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: sparsegen's emulator, no CUDA graphs, eager (for checking without a GPU)")
    parser.add_argument("--compile", default=None, help="torch.compile backend (default: inductor on cuda, none on cpu)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8, help="processes compiling the layers' kernels ahead")
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device: run on the GPU machine, or pass --device cpu for the emulator")
    batches = [int(b) for b in args.batch.split(",")]
    gpu = args.device == "cuda"
    backend = args.compile or ("inductor" if gpu else None)
    model = build(args.model, getattr(torch, args.dtype), args.device, args.layers)
    dense, sparse, report = pruned_pair(model, args.sparsity, backend="gpu" if gpu else "emulate",
                                        workers=args.workers if gpu else 0, ns=batches)
    print(f"{args.model} ({model.config.num_hidden_layers} layers) {args.dtype}, {len(report.layers)} Linears "
          f"pruned to {args.sparsity:.0%}; prompt {args.prompt}, {args.new_tokens} new tokens")
    failed = False
    for batch in batches:
        r = measure(dense, sparse, report, batch=batch, prompt=args.prompt, new_tokens=args.new_tokens,
                    device=args.device, backend=backend, graphs=gpu, repeats=args.repeats)
        failed |= not r["pass"]
        saved = 1 - r["bytes"]["sparse"] / r["bytes"]["dense"] if r["bytes"]["sparse"] else None
        print(f"batch {batch:3d}: sparse {r['tokens_per_s']['sparse']:9.1f} tok/s, dense "
              f"{r['tokens_per_s']['dense']:9.1f} tok/s, speedup {r['speedup']:.2f}x; max step error "
              f"{r['max_error']:.2e} (tolerance {r['tolerance']:g}), argmax agreement {r['argmax_agreement']:.3f}"
              + (f"; weights {r['bytes']['dense'] / 1e9:.2f} GB -> {r['bytes']['sparse'] / 1e9:.2f} GB "
                 f"({saved:.0%} saved)" if saved is not None else "") + f"; kernels {', '.join(r['specs'])}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
