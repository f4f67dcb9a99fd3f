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
#include "evenep/detail/fp8.hpp"

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

// ---- FP8 block-scaled (docs/fp8.md) -------------------------------------------------------------------------
// One expert's e4m3 weight matrix: codes [in, out] row-major (or [out, in] when used transposed) and its
// 128 x 128 block scales [in/128, out/128] (resp. [out/128, in/128]), both for the matrix as stored.
struct Fp8Weight {
    const Fp8E4m3* codes = nullptr;
    const float* scales = nullptr;
};

// The FP8 grouped GEMM reference. in: [rows, in_dim] e4m3 codes with in_scales [rows, in_dim/128] (1 x 128 blocks);
// W_g = weights[g] as in grouped_gemm (transposed: stored [out_dim, in_dim]); in_dim, out_dim multiples of 128.
// The accumulation order (the contract the GPU matches within the tolerance of docs/fp8.md):
//   for each used row and output o, with ob = o / 128 and kb = 0, 1, ... ascending over the K blocks:
//     p_kb = 0.0f; p_kb += float(a[row, i]) * float(w(i, o)) for i over block kb ascending (products of two e4m3
//            values are exact in fp32; each sum rounded);
//     acc += p_kb * (sa[row, kb] * sw(kb, ob))   (the scale product first, each product and sum rounded);
//   acc starts at out[row, o] when `accumulate`, else at +0; out[row, o] = acc (fp32).
void grouped_gemm_fp8(const GroupedGemmShape& shape,
                      std::span<const Fp8Weight> weights,
                      bool transposed,
                      std::span<const Fp8E4m3> in,
                      std::span<const float> in_scales,
                      std::span<float> out,
                      bool accumulate);

// Activation cast: rows [0, rows) of in ([rows, dim] bf16, dim a multiple of 128) into codes [rows, dim] and
// scales [rows, dim/128] by fp8_quantize_act_block (evenep/detail/fp8.hpp). Every value must be finite (checked:
// throws evenep::Error naming the row and column).
void quantize_rows_fp8(
    std::span<const Bf16> in, int64_t rows, int64_t dim, bool ue8m0, std::span<Fp8E4m3> codes, std::span<float> scales);

// Weight cast: w [in, out] bf16 (multiples of 128) into codes [in, out] and scales [in/128, out/128] by
// fp8_quantize_weight_block. Every value must be finite (checked, as above).
void quantize_weight_fp8(const Bf16* w, int64_t in, int64_t out, bool ue8m0, Fp8E4m3* codes, float* scales);

// Wgrad operand cast (evenep/detail/fp8.hpp, "wgrad cols"): in [rows, dim] bf16 (rows = cu_seqlens[G-1], every
// padded row of every group; dim a multiple of 128) into codes [dim][fp8_cols_ld(capacity)] and scales
// [fp8_cols_scale_rows(capacity, G)][dim], capacity >= rows (the receive buffer's rows: the layout depends on the
// buffer, not on the step's routing): for each group, channel c and block j of its rows (128 from its first row, the
// last one shorter), s = fp8_block_scale(amax over the block's rows of |in[r, c]|) and codes[c][r] =
// fp8_quantize(in[r, c], s). Code columns past `rows` are written 0; scale rows of no block are not written.
// shape.in_dim is dim (out_dim unused). Every value must be finite (checked, as above).
void quantize_cols_fp8(const GroupedGemmShape& shape,
                       int64_t capacity,
                       std::span<const Bf16> in,
                       bool ue8m0,
                       std::span<Fp8E4m3> codes,
                       std::span<float> scales);

// The FP8 wgrad reference: dW_g[i, o] (fp32 [in_dim, out_dim], grads[g]) += sum over the group's padded rows r of
// x[r, i] dy[r, o], from the wgrad cols casts of x (a, a_scales: quantize_cols_fp8 with dim in_dim) and dy (b,
// b_scales: dim out_dim), both of the same capacity. Order (the contract the GPU matches within the tolerance of
// docs/fp8.md): acc starts at dW_g[i, o] (`accumulate`) or +0; for each block j of the group ascending: p = 0.0f; p +=
// float(a[i][r]) * float(b[o][r]) for r over the block ascending (exact products, each sum rounded); acc += p *
// (sa[j][i] * sb[j][o]). Groups without rows are skipped (their gradient may be null).
void grouped_gemm_wgrad_fp8(const GroupedGemmShape& shape,
                            int64_t capacity,
                            std::span<const Fp8E4m3> a,
                            std::span<const float> a_scales,
                            std::span<const Fp8E4m3> b,
                            std::span<const float> b_scales,
                            std::span<float* const> grads,
                            bool accumulate);

// Dense helpers on fp32 (the building blocks; exposed for the dense reference and tests):
// c[m, n] = (accumulate ? c : 0) + a[m, k] · b[k, n]; each c element sums over k ascending.
void gemm_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool accumulate);
// c[k, n] += a[m, k]^T · b[m, n]; each c element sums over m ascending.
void gemm_tn_accumulate_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n);

}  // namespace evenep::cpu
