#!/bin/bash
# Build libflashllm_peer.so: Flash-LLM's csrc/SpMM_API.cu (a checkout of AlibabaResearch/flash-llm,
# never part of this repository) + our C shim, for sm_90a (H100). Flags follow Flash-LLM's
# build/Makefile (--use_fast_math, -maxrregcount=255, ptxas -v) with the arch changed from sm_80;
# cudart linked statically so the .so does not depend on the CUDA runtime version torch brings.
#   FLASHLLM_SRC=DIR bash lab/peers/build_flashllm.sh [ARCH]
#       DIR: the checkout's root (holding csrc/ and build/); default .devpeer/flash-llm
#       writes .devpeer/libflashllm_peer.so (and its ptxas report); ARCH default sm_90a; env NVCC
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
arch="${1:-sm_90a}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
src="${FLASHLLM_SRC:-.devpeer/flash-llm}"
for f in csrc/SpMM_API.cu csrc/SpMM_Kernel.cuh csrc/MatMulUtilities.cuh csrc/AsyncCopy_PTX.cuh \
         csrc/MMA_PTX.cuh csrc/Reduction_Kernel.cuh csrc/TilingConfig.h build/SpMM_API.cuh; do
    [ -f "$src/$f" ] || { echo "missing $src/$f (Flash-LLM source)" >&2; exit 1; }
done
mkdir -p .devpeer
out=".devpeer/libflashllm_peer.so"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
flags=(-O3 -std=c++17 -arch="$arch" -Xcompiler -fPIC -maxrregcount=255 --use_fast_math
       --ptxas-options=-v,-warn-lmem-usage,--warn-on-spills -lineinfo)
"$nvcc" "${flags[@]}" -I"$src/csrc" -c "$src/csrc/SpMM_API.cu" -o "$tmp/SpMM_API.o" 2> "$tmp/ptxas.txt" \
    || { cat "$tmp/ptxas.txt" >&2; exit 1; }
"$nvcc" "${flags[@]}" -I"$src/build" -c "$here/flashllm_shim.cu" -o "$tmp/shim.o"
"$nvcc" -shared -arch="$arch" -cudart static "$tmp/SpMM_API.o" "$tmp/shim.o" -o "$tmp/lib.so"
mv "$tmp/lib.so" "$out"
cp "$tmp/ptxas.txt" .devpeer/libflashllm_peer.ptxas.txt
# ptxas: one line per kernel instance (registers, spills); the warnings nvcc printed, if any
grep -E "Compiling entry|registers|spill|warning" "$tmp/ptxas.txt" | sed 's/^ptxas info *: //' | head -40 || true
echo "built $out ($arch, $("$nvcc" --version | tail -1))"
