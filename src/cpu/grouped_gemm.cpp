// CPU grouped GEMM (evenep/cpu/grouped_gemm.hpp): fp32 accumulation in a fixed order, blocked for the cache.

// Products and sums rounded separately (no FMA): results independent of -march. The dynamic cost model lets GCC
// vectorize the inner loops at -O2 too (its -O2 default, "very cheap", skips loops that need an epilogue).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic")
#endif

#include "evenep/cpu/grouped_gemm.hpp"

#include <algorithm>
#include <vector>

#include "evenep/error.hpp"

namespace evenep::cpu {
namespace {

constexpr int64_t kRowBlock = 8;    // rows of C kept hot while a row of B streams by
constexpr int64_t kColBlock = 512;  // columns of C per pass (8 rows x 512 fp32 = 16 KiB)

void widen(const Bf16* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

int32_t group_begin(const GroupedGemmShape& s, int g) { return g == 0 ? 0 : s.cu_seqlens[g - 1]; }

void check_shape(const GroupedGemmShape& s, size_t num_tables, const char* what) {
    EVENEP_CHECK(s.cu_seqlens.size() == s.group_count.size(), what, ": cu_seqlens has ", s.cu_seqlens.size(),
                 " groups but group_count has ", s.group_count.size());
    EVENEP_CHECK(num_tables == s.cu_seqlens.size(), what, ": table has ", num_tables,
                 " entries, expected G = ", s.cu_seqlens.size());
    EVENEP_CHECK(s.in_dim >= 1 && s.out_dim >= 1, what, ": dims ", s.in_dim, " x ", s.out_dim, " must be >= 1");
    for (size_t g = 0; g < s.cu_seqlens.size(); ++g) {
        const int32_t begin = group_begin(s, static_cast<int>(g));
        EVENEP_CHECK(s.group_count[g] >= 0 && begin + s.group_count[g] <= s.cu_seqlens[g], what, ": group ", g, " has ",
                     s.group_count[g], " rows but spans [", begin, ", ", s.cu_seqlens[g], ")");
    }
}

}  // namespace

void gemm_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, bool accumulate) {
    if (!accumulate) std::fill(c, c + m * n, 0.0f);
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
        const int64_t r1 = std::min(m, r0 + kRowBlock);
        for (int64_t c0 = 0; c0 < n; c0 += kColBlock) {
            const int64_t c1 = std::min(n, c0 + kColBlock);
            for (int64_t i = 0; i < k; ++i) {
                const float* __restrict brow = b + i * n;
                for (int64_t r = r0; r < r1; ++r) {
                    const float av = a[r * k + i];
                    float* __restrict crow = c + r * n;
                    for (int64_t o = c0; o < c1; ++o) crow[o] += av * brow[o];
                }
            }
        }
    }
}

void gemm_tn_accumulate_f32(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n) {
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
        const int64_t r1 = std::min(m, r0 + kRowBlock);
        for (int64_t i = 0; i < k; ++i) {
            float* __restrict crow = c + i * n;
            for (int64_t r = r0; r < r1; ++r) {
                const float av = a[r * k + i];
                const float* __restrict brow = b + r * n;
                for (int64_t o = 0; o < n; ++o) crow[o] += av * brow[o];
            }
        }
    }
}

void grouped_gemm(const GroupedGemmShape& shape,
                  std::span<const Bf16* const> weights,
                  bool transposed,
                  std::span<const Bf16> in,
                  std::span<float> out,
                  bool accumulate) {
    check_shape(shape, weights.size(), "grouped_gemm");
    const int G = static_cast<int>(shape.cu_seqlens.size());
    const int64_t kin = shape.in_dim, kout = shape.out_dim;
    const int64_t rows = G == 0 ? 0 : shape.cu_seqlens[G - 1];
    EVENEP_CHECK(in.size() >= static_cast<size_t>(rows * kin), "grouped_gemm: input has ", in.size(),
                 " values, expected >= rows*in_dim = ", rows * kin);
    EVENEP_CHECK(out.size() >= static_cast<size_t>(rows * kout), "grouped_gemm: output has ", out.size(),
                 " values, expected >= rows*out_dim = ", rows * kout);
    std::vector<float> wf(static_cast<size_t>(kin * kout));
    std::vector<float> af;
    for (int g = 0; g < G; ++g) {
        const int64_t count = shape.group_count[g];
        if (count == 0) continue;
        const Bf16* w = weights[g];
        EVENEP_CHECK(w != nullptr, "grouped_gemm: group ", g, " has ", count, " rows but no weight");
        if (!transposed) {
            widen(w, wf.data(), kin * kout);
        } else {
            for (int64_t o = 0; o < kout; ++o)
                for (int64_t i = 0; i < kin; ++i) wf[i * kout + o] = bf16_to_float(w[o * kin + i]);
        }
        const int64_t begin = group_begin(shape, g);
        af.resize(static_cast<size_t>(count * kin));
        widen(in.data() + begin * kin, af.data(), count * kin);
        gemm_f32(af.data(), wf.data(), out.data() + begin * kout, count, kin, kout, accumulate);
    }
}

void grouped_gemm_wgrad(const GroupedGemmShape& shape,
                        std::span<const Bf16> a,
                        std::span<const Bf16> b,
                        std::span<float* const> grads) {
    check_shape(shape, grads.size(), "grouped_gemm_wgrad");
    const int G = static_cast<int>(shape.cu_seqlens.size());
    const int64_t ka = shape.in_dim, kb = shape.out_dim;
    const int64_t rows = G == 0 ? 0 : shape.cu_seqlens[G - 1];
    EVENEP_CHECK(a.size() >= static_cast<size_t>(rows * ka) && b.size() >= static_cast<size_t>(rows * kb),
                 "grouped_gemm_wgrad: operands have ", a.size(), " and ", b.size(), " values, expected >= ", rows * ka,
                 " and ", rows * kb);
    std::vector<float> af, bf;
    for (int g = 0; g < G; ++g) {
        const int64_t count = shape.group_count[g];
        if (count == 0) continue;
        EVENEP_CHECK(grads[g] != nullptr, "grouped_gemm_wgrad: group ", g, " has ", count, " rows but no gradient");
        const int64_t begin = group_begin(shape, g);
        af.resize(static_cast<size_t>(count * ka));
        bf.resize(static_cast<size_t>(count * kb));
        widen(a.data() + begin * ka, af.data(), count * ka);
        widen(b.data() + begin * kb, bf.data(), count * kb);
        gemm_tn_accumulate_f32(af.data(), bf.data(), grads[g], count, ka, kb);
    }
}

// ---- FP8 ----------------------------------------------------------------------------------------------------

namespace {

void check_finite(const Bf16* v, int64_t rows, int64_t cols, int64_t ld, const char* what) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            EVENEP_CHECK(bf16_is_finite(v[r * ld + c]), what, ": value [", r, ", ", c,
                         "] = ", bf16_to_float(v[r * ld + c]), " is not finite; FP8 quantises each block by its amax");
}

void check_fp8_dims(int64_t a, int64_t b, const char* what) {
    EVENEP_CHECK(a % kFp8Block == 0 && b % kFp8Block == 0, what, ": dims ", a, " x ", b, " must be multiples of ",
                 kFp8Block, " (FP8 block scaling)");
}

}  // namespace

void quantize_rows_fp8(std::span<const Bf16> in,
                       int64_t rows,
                       int64_t dim,
                       bool ue8m0,
                       std::span<Fp8E4m3> codes,
                       std::span<float> scales) {
    check_fp8_dims(dim, kFp8Block, "quantize_rows_fp8");
    const int64_t spr = dim / kFp8Block;
    EVENEP_CHECK(in.size() >= static_cast<size_t>(rows * dim) && codes.size() >= static_cast<size_t>(rows * dim) &&
                     scales.size() >= static_cast<size_t>(rows * spr),
                 "quantize_rows_fp8: ", rows, " rows of ", dim, " need ", rows * dim, " values and ", rows * spr,
                 " scales; got ", in.size(), ", ", codes.size(), " and ", scales.size());
    check_finite(in.data(), rows, dim, dim, "quantize_rows_fp8");
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < spr; ++b)
            scales[r * spr + b] = fp8_quantize_act_block(in.data() + r * dim + b * kFp8Block,
                                                         codes.data() + r * dim + b * kFp8Block, ue8m0);
}

void quantize_weight_fp8(const Bf16* w, int64_t in, int64_t out, bool ue8m0, Fp8E4m3* codes, float* scales) {
    check_fp8_dims(in, out, "quantize_weight_fp8");
    check_finite(w, in, out, out, "quantize_weight_fp8");
    const int64_t ob = out / kFp8Block;
    for (int64_t i = 0; i < in / kFp8Block; ++i)
        for (int64_t o = 0; o < ob; ++o) {
            const int64_t at = i * kFp8Block * out + o * kFp8Block;
            scales[i * ob + o] = fp8_quantize_weight_block(w + at, out, codes + at, ue8m0);
        }
}

void grouped_gemm_fp8(const GroupedGemmShape& shape,
                      std::span<const Fp8Weight> weights,
                      bool transposed,
                      std::span<const Fp8E4m3> in,
                      std::span<const float> in_scales,
                      std::span<float> out,
                      bool accumulate) {
    check_shape(shape, weights.size(), "grouped_gemm_fp8");
    const int G = static_cast<int>(shape.cu_seqlens.size());
    const int64_t kin = shape.in_dim, kout = shape.out_dim;
    check_fp8_dims(kin, kout, "grouped_gemm_fp8");
    const int64_t nkb = kin / kFp8Block, nob = kout / kFp8Block;
    const int64_t rows = G == 0 ? 0 : shape.cu_seqlens[G - 1];
    EVENEP_CHECK(in.size() >= static_cast<size_t>(rows * kin) && in_scales.size() >= static_cast<size_t>(rows * nkb),
                 "grouped_gemm_fp8: input has ", in.size(), " codes and ", in_scales.size(),
                 " scales, expected >= rows*in_dim = ", rows * kin, " and rows*in_dim/128 = ", rows * nkb);
    EVENEP_CHECK(out.size() >= static_cast<size_t>(rows * kout), "grouped_gemm_fp8: output has ", out.size(),
                 " values, expected >= rows*out_dim = ", rows * kout);
    std::vector<float> wf(static_cast<size_t>(kin * kout)), af, part;
    for (int g = 0; g < G; ++g) {
        const int64_t count = shape.group_count[g];
        if (count == 0) continue;
        const Fp8Weight w = weights[g];
        EVENEP_CHECK(w.codes != nullptr && w.scales != nullptr, "grouped_gemm_fp8: group ", g, " has ", count,
                     " rows but no weight");
        // Unscaled e4m3 values of W as the product uses it ([in, out]); the scales are applied per block below.
        for (int64_t i = 0; i < kin; ++i)
            for (int64_t o = 0; o < kout; ++o)
                wf[i * kout + o] = e4m3_to_float(transposed ? w.codes[o * kin + i] : w.codes[i * kout + o]);
        const int64_t begin = group_begin(shape, g);
        af.resize(static_cast<size_t>(count * kFp8Block));
        part.resize(static_cast<size_t>(count * kout));
        float* acc = out.data() + begin * kout;
        if (!accumulate) std::fill(acc, acc + count * kout, 0.0f);
        for (int64_t kb = 0; kb < nkb; ++kb) {
            for (int64_t r = 0; r < count; ++r)
                for (int64_t i = 0; i < kFp8Block; ++i)
                    af[r * kFp8Block + i] = e4m3_to_float(in[(begin + r) * kin + kb * kFp8Block + i]);
            gemm_f32(af.data(), wf.data() + kb * kFp8Block * kout, part.data(), count, kFp8Block, kout, false);
            for (int64_t r = 0; r < count; ++r) {
                const float sa = in_scales[(begin + r) * nkb + kb];
                for (int64_t ob = 0; ob < nob; ++ob) {
                    const float sw = transposed ? w.scales[ob * nkb + kb] : w.scales[kb * nob + ob];
                    const float s = sa * sw;
                    float* __restrict c = acc + r * kout + ob * kFp8Block;
                    const float* __restrict p = part.data() + r * kout + ob * kFp8Block;
                    for (int64_t o = 0; o < kFp8Block; ++o) c[o] += p[o] * s;
                }
            }
        }
    }
}

void quantize_cols_fp8(const GroupedGemmShape& shape,
                       int64_t capacity,
                       std::span<const Bf16> in,
                       bool ue8m0,
                       std::span<Fp8E4m3> codes,
                       std::span<float> scales) {
    check_shape(shape, shape.cu_seqlens.size(), "quantize_cols_fp8");
    const int G = static_cast<int>(shape.cu_seqlens.size());
    const int64_t dim = shape.in_dim, rows = G == 0 ? 0 : shape.cu_seqlens[G - 1];
    check_fp8_dims(dim, kFp8Block, "quantize_cols_fp8");
    EVENEP_CHECK(capacity >= rows, "quantize_cols_fp8: capacity ", capacity, " < the groups' ", rows, " rows");
    const int64_t ld = fp8_cols_ld(capacity), nsr = fp8_cols_scale_rows(capacity, G);
    EVENEP_CHECK(in.size() >= static_cast<size_t>(rows * dim) && codes.size() >= static_cast<size_t>(dim * ld) &&
                     scales.size() >= static_cast<size_t>(nsr * dim),
                 "quantize_cols_fp8: ", rows, " rows of ", dim, " need ", rows * dim, " values, ", dim * ld,
                 " codes and ", nsr * dim, " scales; got ", in.size(), ", ", codes.size(), " and ", scales.size());
    check_finite(in.data(), rows, dim, dim, "quantize_cols_fp8");
    std::fill(codes.begin(), codes.begin() + dim * ld, Fp8E4m3{});
    for (int g = 0; g < G; ++g) {
        const int64_t begin = group_begin(shape, g), end = shape.cu_seqlens[g];
        for (int64_t j = 0; begin + j * kFp8Block < end; ++j) {
            const int64_t r0 = begin + j * kFp8Block, r1 = std::min(end, r0 + kFp8Block);
            float* s = scales.data() + (fp8_cols_block(begin, g) + j) * dim;
            for (int64_t c = 0; c < dim; ++c) {
                float amax = 0.0f;
                for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, bf16_abs(in[r * dim + c]));
                s[c] = fp8_block_scale(amax, ue8m0);
                for (int64_t r = r0; r < r1; ++r)
                    codes[c * ld + r] = fp8_quantize(bf16_to_float(in[r * dim + c]), s[c]);
            }
        }
    }
}

void grouped_gemm_wgrad_fp8(const GroupedGemmShape& shape,
                            int64_t capacity,
                            std::span<const Fp8E4m3> a,
                            std::span<const float> a_scales,
                            std::span<const Fp8E4m3> b,
                            std::span<const float> b_scales,
                            std::span<float* const> grads,
                            bool accumulate) {
    check_shape(shape, grads.size(), "grouped_gemm_wgrad_fp8");
    const int G = static_cast<int>(shape.cu_seqlens.size());
    const int64_t kin = shape.in_dim, kout = shape.out_dim, rows = G == 0 ? 0 : shape.cu_seqlens[G - 1];
    check_fp8_dims(kin, kout, "grouped_gemm_wgrad_fp8");
    EVENEP_CHECK(capacity >= rows, "grouped_gemm_wgrad_fp8: capacity ", capacity, " < the groups' ", rows, " rows");
    const int64_t ld = fp8_cols_ld(capacity), nsr = fp8_cols_scale_rows(capacity, G);
    EVENEP_CHECK(
        a.size() >= static_cast<size_t>(kin * ld) && b.size() >= static_cast<size_t>(kout * ld) &&
            a_scales.size() >= static_cast<size_t>(nsr * kin) && b_scales.size() >= static_cast<size_t>(nsr * kout),
        "grouped_gemm_wgrad_fp8: operands have ", a.size(), " / ", b.size(), " codes and ", a_scales.size(), " / ",
        b_scales.size(), " scales, expected >= ", kin * ld, " / ", kout * ld, " and ", nsr * kin, " / ", nsr * kout);
    std::vector<float> af, bt, part;
    for (int g = 0; g < G; ++g) {
        const int64_t begin = group_begin(shape, g), end = shape.cu_seqlens[g];
        if (end == begin) continue;
        float* grad = grads[g];
        EVENEP_CHECK(grad != nullptr, "grouped_gemm_wgrad_fp8: group ", g, " has ", end - begin,
                     " rows but no gradient");
        if (!accumulate) std::fill(grad, grad + kin * kout, 0.0f);
        for (int64_t j = 0; begin + j * kFp8Block < end; ++j) {
            const int64_t r0 = begin + j * kFp8Block, n = std::min(end, r0 + kFp8Block) - r0;
            af.resize(static_cast<size_t>(kin * n));
            bt.resize(static_cast<size_t>(n * kout));
            part.resize(static_cast<size_t>(kin * kout));
            for (int64_t i = 0; i < kin; ++i)
                for (int64_t r = 0; r < n; ++r) af[i * n + r] = e4m3_to_float(a[i * ld + r0 + r]);
            for (int64_t r = 0; r < n; ++r)
                for (int64_t o = 0; o < kout; ++o) bt[r * kout + o] = e4m3_to_float(b[o * ld + r0 + r]);
            gemm_f32(af.data(), bt.data(), part.data(), kin, n, kout, false);  // sums over r ascending
            const int64_t sr = fp8_cols_block(begin, g) + j;
            const float* sa = a_scales.data() + sr * kin;
            const float* sb = b_scales.data() + sr * kout;
            for (int64_t i = 0; i < kin; ++i)
                for (int64_t o = 0; o < kout; ++o) grad[i * kout + o] += part[i * kout + o] * (sa[i] * sb[o]);
        }
    }
}

}  // namespace evenep::cpu
