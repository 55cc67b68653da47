// Local stub (ours): sputnik/cuda_utils.h includes <cublas_v2.h> for its CUBLAS_CALL macro,
// which the kernel files never expand; the kernels use nothing from cuBLAS.
#pragma once
