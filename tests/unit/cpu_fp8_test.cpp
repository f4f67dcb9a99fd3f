// e4m3 storage, conversions and block scales (include/evenep/detail/fp8.hpp), against an independent float64
// reference written here: decode by ldexp, encode by the nearest of the 127 finite positive codes (ties to the
// even code), saturating at 448, NaN to 0x7F | sign.
//
// Cases:
//   CpuFp8.KnownValues             1, -2, 448, -448, +-0, 2^-6 (smallest normal), 2^-9 (smallest subnormal), 0.1.
//   CpuFp8.EveryCodeDecodesExactly all 256 codes: the float equals the float64 reference value (NaN for 0x7F/0xFF).
//   CpuFp8.EveryCodeRoundTrips     encode(decode(b)) == b for all 256 codes (NaN codes keep their sign).
//   CpuFp8.TiesBetweenEveryPair    for every pair of neighbouring codes (both signs): the midpoint goes to the even
//                                  code, one float ulp either side goes to the nearer code.
//   CpuFp8.Saturation              (448, 464) -> 448, 464 (a tie) -> 448, above 464, FLT_MAX and +-inf -> +-448.
//   CpuFp8.Subnormals              2^-10 (tie) -> 0, 3*2^-10 (tie) -> 2*2^-9, just above 2^-10 -> 2^-9, float
//                                  subnormals -> +-0, the largest value below 2^-6 -> 2^-6.
//   CpuFp8.NanKeepsSign            quiet, signalling, negative NaNs -> 0x7F | sign.
//   CpuFp8.SweepMatchesReference   every exponent 2^-14..2^10, every top-11-bit mantissa, 8 low-bit patterns
//                                  (ties, +-1), both signs (~1.6M floats) against the reference.
//   CpuFp8.RandomMatchesReference  2^20 random float bit patterns (seed 11) against the reference.
//   CpuFp8.ScaleRules              amax = 0 and tiny amax -> 2^-126; amax = 448 -> 1; fp32 scale = amax/448
//                                  correctly rounded; UE8M0 = the smallest power of two >= it.
//   CpuFp8.ActivationBlock         one 1x128 block with an outlier: the outlier hits +-448 (or its neighbour), every
//                                  element within the stated bound (relative 2^-4 above 2^-6 * s, absolute
//                                  2^-10 * s below), zero block gives +0 codes, -0 stays -0.
//   CpuFp8.WeightBlock             a 128x128 block inside a wider matrix (stride): scale from the block's own amax,
//                                  codes written with the stride, the neighbouring columns untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "evenep/detail/fp8.hpp"
#include "evenep/detail/hash.hpp"

namespace evenep {
namespace {

// ---- float64 reference ----------------------------------------------------------------------------------
double ref_decode(uint8_t c) {
    const int e = (c >> 3) & 0xF, m = c & 7;
    const double sign = (c & 0x80) ? -1.0 : 1.0;
    if (e == 0xF && m == 7) return std::numeric_limits<double>::quiet_NaN();
    return sign * (e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
}

uint8_t ref_encode(double x) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return 0x7F | sign;
    const double a = std::fabs(x);
    if (a >= 448.0) return 0x7E | sign;
    static const std::vector<double> vals = [] {
        std::vector<double> v;
        for (int c = 0; c <= 0x7E; ++c) v.push_back(ref_decode(static_cast<uint8_t>(c)));
        return v;
    }();
    const int lo = static_cast<int>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin()) - 1;
    if (vals[lo] == a) return static_cast<uint8_t>(lo) | sign;
    const double dlo = a - vals[lo], dhi = vals[lo + 1] - a;
    const int c = dlo < dhi ? lo : (dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1));
    return static_cast<uint8_t>(c) | sign;
}

uint8_t enc(float f) { return float_to_e4m3(f).bits; }
uint8_t enc_bits(uint32_t u) { return enc(bits_as_float(u)); }
float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

// ---- format ---------------------------------------------------------------------------------------------
TEST(CpuFp8, KnownValues) {
    EXPECT_EQ(enc(1.0f), 0x38);
    EXPECT_EQ(enc(-2.0f), 0xC0);
    EXPECT_EQ(enc(448.0f), 0x7E);
    EXPECT_EQ(enc(-448.0f), 0xFE);
    EXPECT_EQ(enc(0.0f), 0x00);
    EXPECT_EQ(enc(-0.0f), 0x80);
    EXPECT_EQ(enc(std::ldexp(1.0f, -6)), 0x08);
    EXPECT_EQ(enc(std::ldexp(1.0f, -9)), 0x01);
    EXPECT_EQ(enc(0.1f), 0x1D);  // 0.1 = 1.6 * 2^-4: 1.625 is nearer than 1.5
    EXPECT_EQ(e4m3_to_float(Fp8E4m3{0x7E}), 448.0f);
    EXPECT_EQ(e4m3_to_float(Fp8E4m3{0x01}), std::ldexp(1.0f, -9));
    EXPECT_EQ(round_to_e4m3(3.3f), 3.25f);
}

TEST(CpuFp8, EveryCodeDecodesExactly) {
    for (int c = 0; c < 256; ++c) {
        const double want = ref_decode(static_cast<uint8_t>(c));
        const float got = e4m3_to_float(Fp8E4m3{static_cast<uint8_t>(c)});
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << c;
            EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
            continue;
        }
        ASSERT_EQ(static_cast<double>(got), want) << "code 0x" << std::hex << c;
        ASSERT_EQ(std::signbit(got), (c & 0x80) != 0) << c;  // -0 for 0x80
    }
}

TEST(CpuFp8, EveryCodeRoundTrips) {
    for (int c = 0; c < 256; ++c) ASSERT_EQ(enc(e4m3_to_float(Fp8E4m3{static_cast<uint8_t>(c)})), c) << c;
}

TEST(CpuFp8, TiesBetweenEveryPair) {
    for (int c = 0; c < 0x7E; ++c) {
        for (uint8_t sign : {0x00, 0x80}) {
            const float lo = e4m3_to_float(Fp8E4m3{static_cast<uint8_t>(c | sign)});
            const float hi = e4m3_to_float(Fp8E4m3{static_cast<uint8_t>((c + 1) | sign)});
            const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in float
            const uint8_t even = static_cast<uint8_t>((c % 2 == 0 ? c : c + 1) | sign);
            EXPECT_EQ(enc(mid), even) << "between codes " << c << " and " << c + 1 << " sign " << int(sign);
            const float toward_lo = sign ? next_up(mid) : next_down(mid);
            const float toward_hi = sign ? next_down(mid) : next_up(mid);
            EXPECT_EQ(enc(toward_lo), c | sign);
            EXPECT_EQ(enc(toward_hi), (c + 1) | sign);
            EXPECT_EQ(enc(mid), ref_encode(mid));
        }
    }
}

TEST(CpuFp8, Saturation) {
    const float inf = std::numeric_limits<float>::infinity();
    for (float f : {next_up(448.0f), 456.0f, next_down(464.0f), 464.0f, next_up(464.0f), 500.0f, 1e6f,
                    std::numeric_limits<float>::max(), inf}) {
        EXPECT_EQ(enc(f), 0x7E) << f;
        EXPECT_EQ(enc(-f), 0xFE) << f;
    }
    EXPECT_EQ(enc(next_down(448.0f)), 0x7E);  // nearer to 448 than to 416
    EXPECT_EQ(enc(432.0f), 0x7E);             // tie between 416 (0x7D, odd) and 448 (0x7E): even
    EXPECT_EQ(enc(next_down(432.0f)), 0x7D);
}

TEST(CpuFp8, Subnormals) {
    EXPECT_EQ(enc(std::ldexp(1.0f, -10)), 0x00);  // tie between 0 and 2^-9: even (0)
    EXPECT_EQ(enc(-std::ldexp(1.0f, -10)), 0x80);
    EXPECT_EQ(enc(next_up(std::ldexp(1.0f, -10))), 0x01);
    EXPECT_EQ(enc(3 * std::ldexp(1.0f, -10)), 0x02);  // tie between 1 and 2 (x 2^-9): even
    EXPECT_EQ(enc(5 * std::ldexp(1.0f, -10)), 0x02);  // tie between 2 and 3: even
    EXPECT_EQ(enc(7 * std::ldexp(1.0f, -10)), 0x04);
    EXPECT_EQ(enc(next_down(std::ldexp(1.0f, -6))), 0x08);  // rounds up to the smallest normal
    EXPECT_EQ(enc(15 * std::ldexp(1.0f, -10)), 0x08);       // tie between 7 (odd) and 8
    EXPECT_EQ(enc(next_down(15 * std::ldexp(1.0f, -10))), 0x07);
    EXPECT_EQ(enc_bits(0x00000001u), 0x00);  // float subnormals
    EXPECT_EQ(enc_bits(0x807FFFFFu), 0x80);
    EXPECT_EQ(enc(std::ldexp(1.0f, -12)), 0x00);
}

TEST(CpuFp8, NanKeepsSign) {
    for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FBFFFFFu}) {
        EXPECT_EQ(enc_bits(u), 0x7F) << std::hex << u;
        EXPECT_EQ(enc_bits(u | 0x80000000u), 0xFF) << std::hex << u;
    }
}

TEST(CpuFp8, SweepMatchesReference) {
    const uint32_t lows[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF, 0x3FF, 0xC00};
    int64_t n = 0;
    for (int e = -14; e <= 10; ++e)
        for (uint32_t top = 0; top < (1u << 11); ++top)
            for (uint32_t low : lows)
                for (uint32_t sign : {0u, 0x80000000u}) {
                    const uint32_t u = sign | (static_cast<uint32_t>(e + 127) << 23) | (top << 12) | low;
                    const float f = bits_as_float(u);
                    ASSERT_EQ(enc(f), ref_encode(f)) << std::hex << "float bits 0x" << u;
                    ++n;
                }
    EXPECT_EQ(n, 25 * 2048 * 8 * 2);
}

TEST(CpuFp8, RandomMatchesReference) {
    for (uint64_t i = 0; i < (1u << 20); ++i) {
        const uint32_t u = static_cast<uint32_t>(detail::hash64(11, i) >> 32);
        const float f = bits_as_float(u);
        ASSERT_EQ(enc(f), ref_encode(f)) << std::hex << "float bits 0x" << u;
    }
}

// ---- block scales ---------------------------------------------------------------------------------------
TEST(CpuFp8, ScaleRules) {
    const float min_scale = std::ldexp(1.0f, -126);
    EXPECT_EQ(fp8_block_scale(0.0f, false), min_scale);
    EXPECT_EQ(fp8_block_scale(0.0f, true), min_scale);
    EXPECT_EQ(fp8_block_scale(std::ldexp(1.0f, -120), false), min_scale);  // amax/448 would be subnormal
    EXPECT_EQ(fp8_block_scale(448.0f, false), 1.0f);
    EXPECT_EQ(fp8_block_scale(448.0f, true), 1.0f);
    for (int i = 0; i < 10000; ++i) {
        const float amax = std::ldexp(1.0f + detail::unit_float(detail::hash64(3, i)), i % 40 - 20);
        const float s = fp8_block_scale(amax, false);
        EXPECT_EQ(s, static_cast<float>(static_cast<double>(amax) / 448.0)) << amax;  // one correct rounding
        const float p = fp8_block_scale(amax, true);
        int ex = 0;
        EXPECT_EQ(std::frexp(p, &ex), 0.5f) << amax;  // a power of two
        EXPECT_GE(p, s);
        EXPECT_LT(p / 2, s);
    }
}

TEST(CpuFp8, ActivationBlock) {
    for (bool ue8m0 : {false, true}) {
        std::vector<Bf16> x(kFp8Block);
        for (int i = 0; i < kFp8Block; ++i) x[i] = detail::random_bf16(detail::hash64(5, i), 0.005f);
        x[17] = float_to_bf16(-300.0f);  // an outlier: the small values fall into e4m3's subnormals or to zero
        x[3] = Bf16{0x8000};             // -0
        std::vector<Fp8E4m3> q(kFp8Block);
        const float s = fp8_quantize_act_block(x.data(), q.data(), ue8m0);
        EXPECT_EQ(s, fp8_block_scale(300.0f, ue8m0));
        if (!ue8m0) {
            EXPECT_EQ(q[17].bits, 0xFE);
        }
        EXPECT_EQ(q[3].bits, 0x80);
        for (int i = 0; i < kFp8Block; ++i) {
            const double v = bf16_to_float(x[i]), d = fp8_dequantize(q[i], s);
            EXPECT_EQ(q[i].bits, ref_encode(static_cast<float>(v / s))) << i;
            if (std::fabs(v) >= std::ldexp(static_cast<double>(s), -6))
                EXPECT_LE(std::fabs(d - v), std::ldexp(std::fabs(v), -4) * (1 + 1e-5)) << i;
            else
                EXPECT_LE(std::fabs(d - v), std::ldexp(static_cast<double>(s), -10) * (1 + 1e-5)) << i;
        }
        std::vector<Bf16> zero(kFp8Block, Bf16{0});
        EXPECT_EQ(fp8_quantize_act_block(zero.data(), q.data(), ue8m0), std::ldexp(1.0f, -126));
        for (const Fp8E4m3& c : q) EXPECT_EQ(c.bits, 0x00);
    }
}

TEST(CpuFp8, WeightBlock) {
    const int64_t ld = 2 * kFp8Block + 8;
    std::vector<Bf16> w(static_cast<size_t>(kFp8Block) * ld, float_to_bf16(1000.0f));  // outside: ignored
    for (int r = 0; r < kFp8Block; ++r)
        for (int c = 0; c < kFp8Block; ++c)
            w[r * ld + kFp8Block + c] = float_to_bf16(static_cast<float>((r * 7 + c * 3) % 29 - 14) / 8.0f);
    std::vector<Fp8E4m3> q(w.size(), Fp8E4m3{0x55});
    const float s = fp8_quantize_weight_block(w.data() + kFp8Block, ld, q.data() + kFp8Block, false);
    EXPECT_EQ(s, fp8_block_scale(14.0f / 8.0f, false));
    for (int r = 0; r < kFp8Block; ++r) {
        for (int c = 0; c < kFp8Block; ++c) {
            const float v = bf16_to_float(w[r * ld + kFp8Block + c]);
            ASSERT_EQ(q[r * ld + kFp8Block + c].bits, ref_encode(static_cast<double>(v / s)));
        }
        for (int c = 0; c < kFp8Block; ++c) ASSERT_EQ(q[r * ld + c].bits, 0x55);  // not written
    }
}

}  // namespace
}  // namespace evenep
