// C entry points over Flash-LLM's own SpMM (AlibabaResearch/flash-llm, csrc/SpMM_API.cu), for ctypes.
// Our code; Flash-LLM's sources stay in .devpeer/flash-llm/ (never committed) and are compiled as-is.
//
// Flash-LLM's conventions (csrc/MatMulUtilities.cuh, kernel_benchmark/spmm_test.cu):
//   C = A * B, A (the sparse weight) M x K row-major, B "K x N column-major" (N rows of K contiguous:
//   X^T row-major for X = K x N), C "M x N column-major" (N rows of M contiguous: Y^T row-major).
//   Tiled-CSL: 128 x 64 tiles, row-major over (M/128) x (K/64); each tile's nonzeros as uint32 items
//   (low half = fp16 value, high half = int16 position row*64 + (col ^ ((row%8)<<3))), padded with
//   zeros to a multiple of 4 and reordered ("Ahead of Time Sparse Data Reordering");
//   TileOffsets[t] = first item of tile t / 4, (tiles + 2) entries.
#include <cstdint>
#include <cstdlib>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "SpMM_API.cuh"  // .devpeer/flash-llm/build/SpMM_API.cuh: declarations of csrc/SpMM_API.cu

extern "C" {

// Dense fp16 W (M x K row-major, host) -> Tiled-CSL, host buffers malloc'd by Flash-LLM
// (free with flashllm_free). reorder != 0: InitSparseMatrixA_API (what spmm_test.cu times as
// "Flash-LLM"), else InitSparseMatrixA_API_NoReorder. Returns the number of TileOffsets entries;
// *num_items = padded nonzeros (uint32 items in *compressed) = TileOffsets[last] * 4.
int flashllm_init(const void* w_fp16, int m, int k, int reorder, uint32_t** compressed, int** offsets,
                  long long* num_items)
{
    half* A_h = const_cast<half*>(static_cast<const half*>(w_fp16));
    int   n_offsets = reorder ? InitSparseMatrixA_API(A_h, m, 0, k, compressed, offsets)
                              : InitSparseMatrixA_API_NoReorder(A_h, m, 0, k, compressed, offsets);
    *num_items = static_cast<long long>((*offsets)[n_offsets - 1]) * 4;
    return n_offsets;
}

void flashllm_free(void* p)
{
    free(p);
}

// One SpMM_SplitK_API call on `stream` (a cudaStream_t / CUstream handle; 0 = legacy default).
// compressed: device uint32 items (read as uint4); offsets: device int TileOffsets; b: device fp16
// N x K row-major (= X^T); c: device fp16 N x M row-major (= Y^T); workspace: device fp16,
// split_k * M * N halves when split_k > 1 (unused, may be null, when split_k == 1).
// Returns the cudaError_t of the launches (0 = success).
int flashllm_spmm(void* stream, const void* compressed, const void* offsets, const void* b, void* c, int m,
                  int n, int k, void* workspace, int split_k)
{
    return static_cast<int>(SpMM_SplitK_API(static_cast<cudaStream_t>(stream),
                                            nullptr,  // A: dense weight, read only by the commented-out dense baseline
                                            static_cast<const uint4*>(compressed),
                                            static_cast<const int*>(offsets),
                                            static_cast<const half*>(b),
                                            static_cast<half*>(c),
                                            m,
                                            n,
                                            k,
                                            static_cast<half*>(workspace),
                                            split_k));
}

const char* flashllm_error_string(int err)
{
    return cudaGetErrorString(static_cast<cudaError_t>(err));
}

// The shim's ABI version (the harness checks it).
int flashllm_version()
{
    return 1;
}

}  // extern "C"
