// Local stub (ours, not Sputnik's): sputnik/cuda_utils.h includes glog only for its
// CUDA_CALL/CHECK_EQ macros, which the two kernel files never expand.
#pragma once
