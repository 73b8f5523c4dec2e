// MERE_CUDA(call) for host C++ files of the CUDA backend: a failed CUDA runtime
// call is a mere::Error naming the call, the file and line, and CUDA's message.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define MERE_CUDA(call)                                                                       \
  do {                                                                                        \
    cudaError_t mere_cuda_err_ = (call);                                                      \
    if (mere_cuda_err_ != cudaSuccess)                                                        \
      ::mere::fail("CUDA error in {} ({}:{}): {}", #call, __FILE__, __LINE__,                 \
                   cudaGetErrorString(mere_cuda_err_));                                       \
  } while (0)
