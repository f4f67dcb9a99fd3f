// The FP8 wgrad operands and product of the CPU oracle (cpu::quantize_cols_fp8, cpu::grouped_gemm_wgrad_fp8;
// evenep/detail/fp8.hpp "wgrad cols"): the reference the GPU's transposing cast (bitwise) and FP8 wgrad GEMM (within
// the tolerance) are held to.
//
// Groups used by the cases: {0, 1, 129, 0, 300, 16, 384} rows (an empty group first and in the middle, one row, a
// partial second block, three blocks with a short last one, a 16-row group, exact blocks), ends padded as the
// receive buffer's (cumulative).
//   CpuFp8Wgrad.ColsCastMatchesBlockRule   every code and scale equals fp8_block_scale / fp8_quantize of its
//                                          channel's 128-row block counted from the group's first row, scales at row
//                                          fp8_cols_block(begin, g) + j (no two groups share a scale row), code
//                                          columns past the groups' rows (capacity 850 > 830 rows) are 0; UE8M0
//                                          scales are powers of two.
//   CpuFp8Wgrad.ColsCastRefusesNonFinite   a NaN in the input: evenep::Error naming the row and column.
//   CpuFp8Wgrad.GemmFollowsDocumentedOrder one element per group recomputed by the documented order (block partials
//                                          over the rows ascending, scaled by sa * sb, summed over the blocks) equals
//                                          the reference bit for bit; accumulate adds to the gradient, overwrite
//                                          starts at 0; empty groups keep a null gradient.
//   CpuFp8Wgrad.GemmWithinFp8Bound         against the float64 x^T dy of the unquantised bf16 operands: |got - ref|
//                                          <= 2^-3 sum |x||dy| (each operand within 2^-4 relative of its block's
//                                          quantisation step, plus fp32 sums), and the error is far below the
//                                          values' scale on average.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

const std::vector<int32_t> kRows = {0, 1, 129, 0, 300, 16, 384};
constexpr int64_t kCapacity = 850;  // the buffer's rows: 20 more than the groups'

using testing::GroupRows;
GroupRows make_groups() { return testing::group_rows(kRows); }

std::vector<Bf16> random_rows(int64_t rows, int64_t dim, uint64_t seed) {
    std::vector<Bf16> v(static_cast<size_t>(rows * dim));
    for (size_t i = 0; i < v.size(); ++i) v[i] = detail::random_bf16(detail::hash64(seed, i), 1.0f);
    // An outlier per 128-row block of channel 5: its block's scale is set by it.
    for (int64_t r = 0; r < rows; r += 97) v[static_cast<size_t>(r * dim + 5)] = float_to_bf16(-37.0f);
    return v;
}

struct Cast {
    std::vector<Fp8E4m3> codes;
    std::vector<float> scales;
};
Cast cast_cols(const GroupRows& g, const std::vector<Bf16>& in, int dim, bool ue8m0) {
    const cpu::GroupedGemmShape shape{g.cu, g.count, dim, dim};
    Cast c;
    c.codes.assign(static_cast<size_t>(dim * fp8_cols_ld(kCapacity)), Fp8E4m3{0x55});  // poison: overwritten
    c.scales.assign(static_cast<size_t>(fp8_cols_scale_rows(kCapacity, static_cast<int>(g.cu.size())) * dim), -1.0f);
    cpu::quantize_cols_fp8(shape, kCapacity, in, ue8m0, c.codes, c.scales);
    return c;
}

TEST(CpuFp8Wgrad, ColsCastMatchesBlockRule) {
    const GroupRows g = make_groups();
    const int dim = 256, G = static_cast<int>(g.cu.size());
    const std::vector<Bf16> in = random_rows(g.rows, dim, 3);
    const int64_t ld = fp8_cols_ld(kCapacity);
    for (bool ue8m0 : {false, true}) {
        SCOPED_TRACE(ue8m0 ? "ue8m0" : "fp32 scales");
        const Cast c = cast_cols(g, in, dim, ue8m0);
        std::vector<int> scale_row_owner(c.scales.size() / dim, -1);
        for (int gi = 0; gi < G; ++gi) {
            const int64_t begin = gi == 0 ? 0 : g.cu[gi - 1], end = g.cu[gi];
            for (int64_t j = 0; begin + j * kFp8Block < end; ++j) {
                const int64_t r0 = begin + j * kFp8Block, r1 = std::min<int64_t>(end, r0 + kFp8Block);
                const int64_t sr = fp8_cols_block(begin, gi) + j;
                ASSERT_LT(sr, static_cast<int64_t>(scale_row_owner.size()));
                EXPECT_EQ(scale_row_owner[sr], -1) << "scale row " << sr << " shared by groups";
                scale_row_owner[sr] = gi;
                for (int64_t ch = 0; ch < dim; ++ch) {
                    float amax = 0;
                    for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, std::fabs(bf16_to_float(in[r * dim + ch])));
                    const float s = fp8_block_scale(amax, ue8m0);
                    ASSERT_EQ(c.scales[sr * dim + ch], s) << "group " << gi << " block " << j << " channel " << ch;
                    if (ue8m0) {
                        EXPECT_EQ(std::exp2(std::round(std::log2(s))), s);
                    }
                    for (int64_t r = r0; r < r1; ++r) {
                        ASSERT_EQ(c.codes[ch * ld + r].bits, fp8_quantize(bf16_to_float(in[r * dim + ch]), s).bits)
                            << "row " << r << " channel " << ch;
                    }
                }
            }
        }
        for (int64_t ch = 0; ch < dim; ++ch) {
            for (int64_t r = g.rows; r < ld; ++r) {
                ASSERT_EQ(c.codes[ch * ld + r].bits, 0) << "padding column " << r;
            }
        }
    }
}

TEST(CpuFp8Wgrad, ColsCastRefusesNonFinite) {
    const GroupRows g = make_groups();
    const int dim = 128;
    std::vector<Bf16> in = random_rows(g.rows, dim, 4);
    in[static_cast<size_t>(200 * dim + 77)] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
    try {
        (void)cast_cols(g, in, dim, false);
        FAIL() << "a NaN was quantised";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("[200, 77]"), std::string::npos) << e.what();
    }
}

struct WgradRun {
    GroupRows g;
    int in = 128, out = 256;
    std::vector<Bf16> x, dy;
    Cast cx, cdy;
    std::vector<std::vector<float>> grads;
    std::vector<float*> ptrs;
    explicit WgradRun(bool accumulate_init) : g(make_groups()) {
        x = random_rows(g.rows, in, 5);
        dy = random_rows(g.rows, out, 6);
        cx = cast_cols(g, x, in, false);
        cdy = cast_cols(g, dy, out, false);
        for (size_t gi = 0; gi < g.cu.size(); ++gi) {
            grads.emplace_back(static_cast<size_t>(in * out), accumulate_init ? 0.5f : 0.0f);
            ptrs.push_back(kRows[gi] == 0 ? nullptr : grads.back().data());  // empty groups: no gradient
        }
    }
    void run(bool accumulate) {
        const cpu::GroupedGemmShape shape{g.cu, g.count, in, out};
        cpu::grouped_gemm_wgrad_fp8(shape, kCapacity, cx.codes, cx.scales, cdy.codes, cdy.scales, ptrs, accumulate);
    }
};

TEST(CpuFp8Wgrad, GemmFollowsDocumentedOrder) {
    for (bool accumulate : {true, false}) {
        SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
        WgradRun w(true);
        w.run(accumulate);
        const int64_t ld = fp8_cols_ld(kCapacity);
        for (size_t gi = 0; gi < w.g.cu.size(); ++gi) {
            if (kRows[gi] == 0) continue;
            const int64_t begin = gi == 0 ? 0 : w.g.cu[gi - 1], end = w.g.cu[gi];
            const int i = 5, o = 131;  // channel 5 holds the outliers
            float acc = accumulate ? 0.5f : 0.0f;
            for (int64_t j = 0; begin + j * kFp8Block < end; ++j) {
                const int64_t r0 = begin + j * kFp8Block, r1 = std::min<int64_t>(end, r0 + kFp8Block);
                float p = 0.0f;
                for (int64_t r = r0; r < r1; ++r)
                    p += e4m3_to_float(w.cx.codes[i * ld + r]) * e4m3_to_float(w.cdy.codes[o * ld + r]);
                const int64_t sr = fp8_cols_block(begin, static_cast<int>(gi)) + j;
                acc += p * (w.cx.scales[sr * w.in + i] * w.cdy.scales[sr * w.out + o]);
            }
            EXPECT_EQ(w.grads[gi][static_cast<size_t>(i * w.out + o)], acc) << "group " << gi;
        }
    }
}

TEST(CpuFp8Wgrad, GemmWithinFp8Bound) {
    WgradRun w(false);
    w.run(true);
    double worst = 0, err_sum = 0, mag_sum = 0;
    for (size_t gi = 0; gi < w.g.cu.size(); ++gi) {
        if (kRows[gi] == 0) continue;
        const int64_t begin = gi == 0 ? 0 : w.g.cu[gi - 1], end = w.g.cu[gi];
        for (int i = 0; i < w.in; ++i)
            for (int o = 0; o < w.out; ++o) {
                double ref = 0, mag = 0;
                for (int64_t r = begin; r < end; ++r) {
                    const double t =
                        static_cast<double>(bf16_to_float(w.x[r * w.in + i])) * bf16_to_float(w.dy[r * w.out + o]);
                    ref += t;
                    mag += std::fabs(t);
                }
                const double err = std::fabs(w.grads[gi][static_cast<size_t>(i * w.out + o)] - ref);
                ASSERT_LE(err, mag / 8 + 1e-30) << "group " << gi << " [" << i << ", " << o << "]";
                worst = std::max(worst, mag > 0 ? err / mag : 0.0);
                err_sum += err;
                mag_sum += mag;
            }
    }
    EXPECT_LT(err_sum / mag_sum, 1.0 / 64) << "mean error over sum |terms| (worst element " << worst << ")";
}

}  // namespace
}  // namespace evenep
