// evenep/cpu/grouped_gemm.hpp — the CPU grouped GEMM over receive-buffer groups (SPEC §4.5), the reference for
// the GPU grouped GEMM (compared within tolerance, not bitwise: tile order differs on the GPU).
//
// A problem is driven by a rank's cu_seqlens/group_count (plan arrays) and a per-group weight table. Group g
// holds rows [begin_g, begin_g + count_g) with begin_g = cu_seqlens[g-1] (0 for g = 0); its padding rows are
// not computed. Inputs are bf16 (widened exactly), accumulation is fp32 in ascending order of the inner index,
// each product and sum rounded separately (no FMA), so results do not depend on the build's -march.
#pragma once

#include <cstdint>
#include <span>

#include "evenep/detail/bf16.hpp"

namespace evenep::cpu {

struct GroupedGemmShape {
    std::span<const int32_t> cu_seqlens;   // [G] inclusive padded end rows
    std::span<const int32_t> group_count;  // [G] rows holding entries
    int in_dim = 0;                        // K of the product
    int out_dim = 0;                       // N of the product
};

// out[row, o] (fp32, row stride out_dim) = (accumulate ? out[row, o] : 0) + sum_i in[row, i] * W_g(i, o), for
// every used row of every group. W_g = weights[g]: stored [in_dim, out_dim] row-major, or [out_dim, in_dim]
// when `transposed` (the product then uses W_g^T). Empty groups may have a null weight. in: [rows, in_dim] bf16.
void grouped_gemm(const GroupedGemmShape& shape,
                  std::span<const Bf16* const> weights,
                  bool transposed,
                  std::span<const Bf16> in,
                  std::span<float> out,
                  bool accumulate);

// Weight gradient: grads[g][i, o] += sum over the used rows of group g, ascending, of a[row, i] * b[row, o]
// (fp32). a: [rows, a_dim] bf16, b: [rows, b_dim] bf16, grads[g]: [a_dim, b_dim] fp32 (null for empty groups).
// shape.in_dim = a_dim, shape.out_dim = b_dim.
void grouped_gemm_wgrad(const GroupedGemmShape& shape,
                        std::span<const Bf16> a,
                        std::span<const Bf16> b,
                        std::span<float* const> grads);

// Dense helpers on fp32 (the building blocks; exposed for the dense reference and tests):
// c[m, n] = (accumulate ? c : 0) + a[m, k] · b[k, n]; each c element sums over k ascending.
void gemm_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool accumulate);
// c[k, n] += a[m, k]^T · b[m, n]; each c element sums over m ascending.
void gemm_tn_accumulate_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n);

}  // namespace evenep::cpu
