#!/bin/bash
# Build libsputnik_peer.so: Sputnik's fp32 SpMM and SDDMM (a checkout of google-research/sputnik,
# never part of this repository) and our C shim, for lab/peers/peer_sputnik.py.
#
#   SPUTNIK_SRC=DIR lab/peers/build_sputnik.sh [OUT.so]
#       DIR: the checkout's root (holding sputnik/spmm/cuda_spmm.cu.cc); default .devpeer/sputnik
#       OUT: default .devpeer/libsputnik_peer.so; env NVCC, SPUTNIK_ARCH (default sm_90a)
#
# Flags: Sputnik's CMake release build has no special CUDA flags (no fast-math), so -O3
# -DNDEBUG. Static cudart: the .so depends on nothing but the driver. The sputnik_stubs directory
# comes first on the include path: it replaces glog/logging.h, cublas_v2.h and cusparse.h,
# which sputnik/cuda_utils.h includes only for macros these kernels never expand.
# The real cuBLAS/cuSPARSE headers would also have brought <stdint.h> (uint32_t in barrier.h
# and sddmm/all_reduce.h); load_store.h uses std::memcpy and cuda_spmm.cu.cc std::function
# without including <cstring>/<functional>: those three are force-included. Warning 68
# (sparse_tile.h: unsigned threadIdx.x times a negative stride, intended) is silenced.
# --expt-relaxed-constexpr: cuda_sddmm.cu.cc calls std::min (constexpr, host) in the kernel,
# which CUDA 13's nvcc rejects without it (older toolkits accepted it).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=${SPUTNIK_SRC:-.devpeer/sputnik}
out=${1:-.devpeer/libsputnik_peer.so}
[ -f "$src/sputnik/spmm/cuda_spmm.cu.cc" ] || { echo "no Sputnik checkout at $src (set SPUTNIK_SRC)" >&2; exit 1; }
nvcc=${NVCC:-nvcc}
arch=${SPUTNIK_ARCH:-sm_90a}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-O3 -DNDEBUG -std=c++17 -arch="$arch" -Xcompiler -fPIC
       -I"$here/sputnik_stubs" -I"$src" -include cstdint -include cstring -include functional -diag-suppress 68
       --expt-relaxed-constexpr)
pids=()
"$nvcc" "${flags[@]}" -x cu -c "$src/sputnik/spmm/cuda_spmm.cu.cc" -o "$tmp/spmm.o" & pids+=($!)
"$nvcc" "${flags[@]}" -x cu -c "$src/sputnik/sddmm/cuda_sddmm.cu.cc" -o "$tmp/sddmm.o" & pids+=($!)
"$nvcc" "${flags[@]}" -c "$here/sputnik_shim.cu" -o "$tmp/shim.o" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done   # set -e: a failed compile stops here
"$nvcc" -shared -cudart static -arch="$arch" "$tmp/spmm.o" "$tmp/sddmm.o" "$tmp/shim.o" -o "$out"
echo "built $out ($arch, $("$nvcc" --version | tail -1))"
