// src/cuda/kernels/grouped_gemm_sm90.hpp — internal: the Hopper (TMA + wgmma) grouped GEMM behind
// evenep::cuda::grouped_gemm / grouped_gemm_wgrad (include/evenep/cuda/grouped_gemm.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "evenep/cuda/grouped_gemm.hpp"

namespace evenep::cuda {
// The last kErrorWordBytes of a grouped GEMM workspace: int32 error word written by the scheduler kernels (G - g of
// the first rejected group, 0 = none), read by grouped_gemm_check.
inline constexpr size_t kErrorWordBytes = 16;
int32_t* gemm_error_word(void* workspace, int num_groups);
}  // namespace evenep::cuda

namespace evenep::cuda::sm90 {

struct LaunchArgs {
    int mode = 0;  // 0 forward, 1 dgrad, 2 wgrad
    const uint16_t* x = nullptr;   // fwd: x [rows][K]; dgrad: dY [rows][K]; wgrad: x [rows][M]
    const uint16_t* dy = nullptr;  // wgrad: dY [rows][N]
    const int32_t* cu = nullptr;
    const void* const* ptrs = nullptr;  // weights [in][out] (fwd/dgrad) or fp32 gradients [M][N] (wgrad)
    void* y = nullptr;                  // fwd/dgrad output [rows][N]
    bool y_fp32 = false;
    int G = 0, K = 0, N = 0, M = 0;
    bool load_aware = true;
    bool accumulate = true;  // wgrad: false writes the tile (dW = ...) instead of adding it; never split
    void* workspace = nullptr;
};

// True when the current device runs the sm_90a kernel (compute capability 9.0).
bool supported();
size_t workspace_bytes(int G);
void launch(const LaunchArgs& args, cudaStream_t stream);
int grid_blocks(int mode);
GemmCostModel cost_model();

}  // namespace evenep::cuda::sm90
