// python/csrc/fp8_args.hpp — argument checks and shapes shared by the FP8 ops on the CPU (ops_fp8.cpp) and on
// CUDA (ops_fp8_cuda.cpp): 1 x 128 (activations) and 128 x 128 (weights) blocked tensors.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "evenep/detail/fp8.hpp"

namespace evenep::python {

constexpr int64_t kBlock = kFp8Block;

// The sizes of t with the last `n` dimensions divided by 128 (the scales of a 1x128 or 128x128 blocked tensor).
inline std::vector<int64_t> scale_sizes(const at::Tensor& t, int n) {
    std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
    for (int i = 0; i < n; ++i) s[s.size() - 1 - i] /= kBlock;
    return s;
}

// t with its last n dimensions positive multiples of 128; with `dtype` also on `device`, of dtype, contiguous.
inline void check_blocked(const at::Tensor& t,
                          const char* op,
                          const char* name,
                          int n,
                          std::optional<at::ScalarType> dtype = std::nullopt,
                          const at::Device& device = at::Device(at::kCPU)) {
    if (dtype) {
        TORCH_CHECK_VALUE(t.device() == device, "evenep.", op, ": ", name, " is on ", t.device(), ", expected ",
                          device);
        TORCH_CHECK_VALUE(t.scalar_type() == *dtype, "evenep.", op, ": ", name, " has dtype ", t.scalar_type(),
                          ", expected ", *dtype);
        TORCH_CHECK_VALUE(t.is_contiguous(), "evenep.", op, ": ", name, " is not contiguous");
    }
    TORCH_CHECK_VALUE(t.dim() >= n, "evenep.", op, ": ", name, " has shape ", t.sizes(), ", expected at least ", n,
                      " dimensions");
    for (int i = 0; i < n; ++i) {
        const int64_t d = t.size(t.dim() - 1 - i);
        TORCH_CHECK_VALUE(d > 0 && d % kBlock == 0, "evenep.", op, ": ", name, " has shape ", t.sizes(),
                          "; FP8 needs dimension ", t.dim() - 1 - i, " = ", d, " a positive multiple of 128");
    }
}

}  // namespace evenep::python
