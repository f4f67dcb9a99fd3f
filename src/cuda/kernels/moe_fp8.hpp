// The FP8 layout and cast kernels of the GPU MoE layer's FP8 path (src/cuda/kernels/moe_fp8.cu; the layer is
// src/cuda/runtime/moe_layer_fp8.cpp, the formats docs/fp8.md). Host-only declarations.
//
// Like swiglu.hpp's launchers, every launcher covers the served ranks in one launch (grid.y = rank - rank_begin)
// and bounds itself on the device by the rank's used rows (cu_seqlens[G-1] of its own plan copy): no host
// synchronisation, graph capturable. Row buffers are [num_local][NvS][dim] (rank r at (r - rank_begin)*NvS*dim).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels/swiglu.hpp"

namespace evenep::cuda::kernels {

// 1 x 128 cast of the used rows of `in` ([.., dim] bf16, dim a multiple of 128) into codes [.., dim] e4m3 and
// scales [.., dim/128] fp32: the bytes of cpu::quantize_rows_fp8 (evenep/detail/fp8.hpp's functions).
// Non-finite values are not checked (the layer's own intermediate rows; the dispatch checks the input).
void launch_moe_fp8_cast_rows(const MoeKernelParams& p,
                              const uint16_t* in,
                              int dim,
                              bool ue8m0,
                              uint8_t* codes,
                              float* scales,
                              cudaStream_t stream);

// One served rank's FP8 receive rows (Ep::recv_x8 [NvS, H] e4m3, Ep::recv_scale [NvS, H/128] fp32).
struct MoeFp8RankView {
    const uint8_t* x8;
    const float* scale;
};

// launch_moe_place_output for the FP8 path (whose recv_x holds no bf16 rows to save): recv_x <- y (combine reads the
// expert output in place) and x = bf16(float(q) * s) of the received codes (q, s: views[rank - rank_begin], device
// [num_local]) — the bf16 x the CPU layer saves for the bf16 wgrad — on the used rows of every served rank.
void launch_moe_fp8_place_output(const MoeKernelParams& p, const MoeFp8RankView* views, cudaStream_t stream);

// recv_x = bf16(float(a) + float(b)) on the used rows (a, b: [num_local][NvS][H] bf16, the two FP8 dgrads' outputs):
// launch_moe_sum_dx on the widened values, bit for bit, without the fp32 round trip.
void launch_moe_fp8_sum_dx(const MoeKernelParams& p, const uint16_t* a, const uint16_t* b, cudaStream_t stream);

// out[row, i] = float(in[row, i]) on the used rows of every served rank: in is [num_local][NvS][dim] bf16, out the
// fp32 region of [num_local][NvS][out_dim] (dim <= out_dim) whose rows inside a rank are packed at dim — the layout
// the dgrad GEMMs write and swiglu_backward reads.
void launch_moe_widen(
    const MoeKernelParams& p, const uint16_t* in, int dim, float* out, int64_t out_dim, cudaStream_t stream);

// The forward's K-major copies: for every served rank and group g < G with rows whose table and dst_table entries
// are both non-null, dst_table[rank][g] = table[rank][g]^T ([in][out] e4m3 -> [out][in]). The layer passes the
// tables of its slot groups only (the homes' transposes come from the weight cast, Experts::prefetch_weight).
// table and dst_table: device [num_local][G+1].
void launch_moe_fp8_transpose_groups(const MoeKernelParams& p,
                                     const uint8_t* const* table,
                                     const uint8_t* const* dst_table,
                                     int in,
                                     int out,
                                     cudaStream_t stream);

}  // namespace evenep::cuda::kernels
