// evenep/cuda/check.hpp — EVENEP_CUDA_CHECK: turn a CUDA runtime error into evenep::Error(kRuntime).
#pragma once

#include <cuda_runtime_api.h>

#include "evenep/error.hpp"

// EVENEP_CUDA_CHECK(expr): evaluates a cudaError_t expression once; throws evenep::Error(kRuntime) naming the
// expression, the error name and its description when it is not cudaSuccess.
#define EVENEP_CUDA_CHECK(expr)                                                                                    \
    do {                                                                                                           \
        const cudaError_t evenep_cuda_err_ = (expr);                                                               \
        if (evenep_cuda_err_ != cudaSuccess)                                                                       \
            ::evenep::detail::throw_error(::evenep::ErrorKind::kRuntime, __FILE__, __LINE__, #expr, "CUDA error ", \
                                          cudaGetErrorName(evenep_cuda_err_), " (",                                \
                                          cudaGetErrorString(evenep_cuda_err_), ") in ", #expr);                   \
    } while (0)

namespace evenep::cuda {

// True when at least one CUDA device is usable (cudaGetDeviceCount succeeds and returns > 0).
inline bool device_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace evenep::cuda
