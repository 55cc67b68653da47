// Local stub (ours): sputnik/cuda_utils.h includes <cusparse.h> for its CUSPARSE_CALL macro,
// which the kernel files never expand; the kernels use nothing from cuSPARSE.
#pragma once
