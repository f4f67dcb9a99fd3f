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

}  // namespace evenep::cpu
