// Our shim (not Sputnik's code): C entry points around Sputnik's fp32 SpMM and SDDMM,
// for lab/peers/peer_sputnik.py (ctypes). Built by build_sputnik.sh into
// libsputnik_peer.so together with sputnik/spmm/cuda_spmm.cu.cc and
// sputnik/sddmm/cuda_sddmm.cu.cc, copied verbatim from google-research/sputnik.
//
// Every pointer is a device pointer; `stream` is a cudaStream_t (torch's
// current stream). Each call returns the cudaError_t of the launch (0: success).

#include <cuda_runtime.h>

#include "sputnik/sddmm/cuda_sddmm.h"
#include "sputnik/spmm/cuda_spmm.h"

extern "C" {

// C (m x n, row-major) = A (m x k, CSR: row_offsets[m+1], column_indices[nnz],
// values[nnz]) * B (k x n, row-major). row_indices[m]: the row swizzle (rows in
// the order thread blocks take them; Sputnik's own benchmarks sort by decreasing
// length).
int sputnik_spmm_f32(int m, int k, int n, int nonzeros, const int* row_indices,
                     const float* values, const int* row_offsets,
                     const int* column_indices, const float* dense_matrix,
                     float* output_matrix, void* stream) {
  return static_cast<int>(sputnik::CudaSpmm(
      m, k, n, nonzeros, row_indices, values, row_offsets, column_indices,
      dense_matrix, output_matrix, static_cast<cudaStream_t>(stream)));
}

// output_values[nnz] = (lhs (m x k, row-major) . rhs (n x k, row-major)^T)
// at the CSR pattern (row_offsets[m+1], column_indices[nnz]), in CSR order.
int sputnik_sddmm_f32(int m, int k, int n, int nonzeros, const int* row_indices,
                      const int* row_offsets, const int* column_indices,
                      const float* lhs_matrix, const float* rhs_matrix,
                      float* output_values, void* stream) {
  return static_cast<int>(sputnik::CudaSddmm(
      m, k, n, nonzeros, row_indices, row_offsets, column_indices, lhs_matrix,
      rhs_matrix, output_values, static_cast<cudaStream_t>(stream)));
}

const char* sputnik_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

// Make `device` current for this library's (static) runtime: call it with torch's device
// before the first launch, so both use that device's primary context.
int sputnik_set_device(int device) {
  return static_cast<int>(cudaSetDevice(device));
}

// Synchronise this library's runtime with the device; returns the sticky error, if any.
int sputnik_device_synchronize(void) {
  return static_cast<int>(cudaDeviceSynchronize());
}

// The CUDA runtime version this library was linked against (e.g. 13000).
int sputnik_runtime_version(void) {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

}  // extern "C"
