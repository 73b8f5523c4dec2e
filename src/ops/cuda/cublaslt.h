// The one cuBLASLt handle and workspace the CUDA backend's GEMMs share, and the
// status check for its calls (CUDA builds only).
#pragma once

#include <cublasLt.h>

#include <cstddef>

#include "core/error.h"

#define MERE_CUBLAS(call)                                                                         \
  do {                                                                                            \
    cublasStatus_t mere_st_ = (call);                                                             \
    if (mere_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::mere::fail("cuBLASLt error {} in {} ({}:{})", int(mere_st_), #call, __FILE__, __LINE__); \
  } while (0)

namespace mere::ops::cuda {

cublasLtHandle_t lt_handle();
constexpr size_t kWorkspaceBytes = 32 << 20;
void* lt_workspace();  // kWorkspaceBytes of device memory

}  // namespace mere::ops::cuda
