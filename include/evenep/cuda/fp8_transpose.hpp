// evenep/cuda/fp8_transpose.hpp — the K-major e4m3 weights of an FP8 grouped GEMM's forward, from the groups' codes
// (kernel in src/cuda/kernels/fp8_transpose.cu).
//
// cuda::grouped_gemm_fp8 (evenep/cuda/grouped_gemm.hpp) reads W_g^T [out][in] in its forward (fp8 wgmma reads only
// K-major operands) and W_g [in][out] in dgrad. Where the bf16 weights are at hand the weight cast writes both from
// one pass (Fp8WeightCast::transposed, evenep/cuda/fp8_cast.hpp); a caller that holds only the [in][out] codes (the
// PyTorch op evenep::grouped_gemm_fp8, whose weights arrive as e4m3 tensors) transposes the groups the GEMM will
// compute with this, into caller-owned memory, and passes the table it writes as the forward's weights.
//
// Device pointers; stream last; no allocation, no host synchronisation (graph capturable); cudaGetLastError()
// checked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace evenep::cuda {

// A group is copied when it has rows (cu_seqlens[g] > cu_seqlens[g-1], cu_seqlens[-1] = 0) and a non-null weight:
// transposed + g * in * out = weights[g]^T, [out][in] e4m3, and transposed_table[g] points at it. Every other entry
// of transposed_table is null (the GEMM computes no tile for it). Each group gets its own copy (a matrix named by
// several groups is copied once per group), so no two threads write one byte. The tables and cu_seqlens are those
// of the grouped GEMM (cuda::build_group_table writes them for the plan's receive rows).
struct Fp8GroupTranspose {
    const uint8_t* const* weights = nullptr;     // [num_groups] device table of W_g [in][out] e4m3, 4-byte aligned
    const int32_t* cu_seqlens = nullptr;         // [num_groups] device, inclusive end rows, non-decreasing
    int num_groups = 0;                          // >= 1
    int in_dim = 0;                              // multiple of 128
    int out_dim = 0;                             // multiple of 128
    uint8_t* transposed = nullptr;               // [num_groups][out][in] e4m3 (16-byte aligned: the GEMM's operand)
    const uint8_t** transposed_table = nullptr;  // out: [num_groups] device
};

// One launch over every group's 64 x 64 tiles (through shared memory); the tiles of groups not copied are skipped.
// Throws evenep::Error(kInvalidArgument) naming the value for a null pointer, num_groups < 1 or in/out not positive
// multiples of 128.
void launch_fp8_transpose_groups(const Fp8GroupTranspose& args, cudaStream_t stream);

}  // namespace evenep::cuda
