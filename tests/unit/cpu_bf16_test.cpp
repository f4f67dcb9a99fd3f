// bf16 storage and conversions (include/evenep/detail/bf16.hpp), the bits CUDA's __float2bfloat16_rn and
// __bfloat162float produce.
//
// Cases:
//   CpuBf16.KnownValues             1, -2, 0.1, +-0, +-inf, largest finite, smallest subnormal.
//   CpuBf16.TiesRoundToEven         exact halfway cases round to the even neighbour, just above/below do not.
//   CpuBf16.OverflowToInfinity      values past the largest finite bf16 + half an ulp become +-inf.
//   CpuBf16.NanBecomesCanonical     every NaN (quiet, signalling, negative) becomes 0x7FFF.
//   CpuBf16.SubnormalsKept          float subnormals round like normals (no flush to zero).
//   CpuBf16.EveryBf16RoundTrips     all 65536 patterns: bf16 -> float -> bf16 is the identity for non-NaN.
//   CpuBf16.MatchesNearestByDouble  2^20 random floats (seed 7): the result is the nearest bf16 computed in
//                                   double, ties to even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "evenep/detail/bf16.hpp"

namespace evenep {
namespace {

uint16_t to_bits(float f) { return float_to_bf16(f).bits; }
uint16_t from_float_bits(uint32_t u) { return float_to_bf16(bits_as_float(u)).bits; }

TEST(CpuBf16, KnownValues) {
    EXPECT_EQ(to_bits(1.0f), 0x3F80);
    EXPECT_EQ(to_bits(-2.0f), 0xC000);
    EXPECT_EQ(to_bits(0.1f), 0x3DCD);  // 0x3DCCCCCD rounds up
    EXPECT_EQ(to_bits(0.0f), 0x0000);
    EXPECT_EQ(to_bits(-0.0f), 0x8000);
    EXPECT_EQ(to_bits(std::numeric_limits<float>::infinity()), 0x7F80);
    EXPECT_EQ(to_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
    EXPECT_EQ(from_float_bits(0x7F7F0000u), 0x7F7F);  // largest finite bf16
    EXPECT_EQ(bf16_to_float(Bf16{0x3F80}), 1.0f);
    EXPECT_EQ(bf16_to_float(Bf16{0x0001}), bits_as_float(0x00010000u));
    EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 512), 1.0f);  // below half an ulp (1/256)
}

TEST(CpuBf16, TiesRoundToEven) {
    EXPECT_EQ(from_float_bits(0x3F808000u), 0x3F80);  // tie, 0x3F80 even: stays
    EXPECT_EQ(from_float_bits(0x3F818000u), 0x3F82);  // tie, 0x3F81 odd: up
    EXPECT_EQ(from_float_bits(0x3F808001u), 0x3F81);  // just above the tie
    EXPECT_EQ(from_float_bits(0x3F807FFFu), 0x3F80);  // just below the tie
    EXPECT_EQ(from_float_bits(0xBF818000u), 0xBF82);  // negative tie, odd: away from zero
    EXPECT_EQ(from_float_bits(0xBF808000u), 0xBF80);
}

TEST(CpuBf16, OverflowToInfinity) {
    EXPECT_EQ(from_float_bits(0x7F7F7FFFu), 0x7F7F);  // below the halfway point to 2^128
    EXPECT_EQ(from_float_bits(0x7F7F8000u), 0x7F80);  // tie, 0x7F7F odd: up to inf
    EXPECT_EQ(to_bits(std::numeric_limits<float>::max()), 0x7F80);
    EXPECT_EQ(to_bits(-std::numeric_limits<float>::max()), 0xFF80);
}

TEST(CpuBf16, NanBecomesCanonical) {
    for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0xFFFFFFFFu, 0x7FFFFFFFu, 0x7FBFFFFFu})
        EXPECT_EQ(from_float_bits(u), kBf16CanonicalNan) << std::hex << u;
    EXPECT_TRUE(std::isnan(bf16_to_float(Bf16{kBf16CanonicalNan})));
}

TEST(CpuBf16, SubnormalsKept) {
    EXPECT_EQ(from_float_bits(0x00010000u), 0x0001);
    EXPECT_EQ(from_float_bits(0x00008000u), 0x0000);  // tie to even (0)
    EXPECT_EQ(from_float_bits(0x00018000u), 0x0002);  // tie, odd: up
    EXPECT_EQ(from_float_bits(0x00008001u), 0x0001);
    EXPECT_EQ(from_float_bits(0x807F8000u), 0x8080);  // largest negative subnormal rounds to the smallest normal
}

TEST(CpuBf16, EveryBf16RoundTrips) {
    for (uint32_t b = 0; b < 65536; ++b) {
        const Bf16 v{static_cast<uint16_t>(b)};
        const float f = bf16_to_float(v);
        if (std::isnan(f)) {
            EXPECT_EQ(float_to_bf16(f).bits, kBf16CanonicalNan);
            continue;
        }
        ASSERT_EQ(float_to_bf16(f).bits, b);
    }
}

TEST(CpuBf16, MatchesNearestByDouble) {
    uint64_t state = 7;
    for (int i = 0; i < (1 << 20); ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t u = static_cast<uint32_t>(state >> 32);
        const float f = bits_as_float(u);
        if (std::isnan(f) || std::isinf(f)) continue;
        // Neighbours: truncation toward zero and the next bf16 away from zero.
        const uint16_t lo = static_cast<uint16_t>(u >> 16);
        const uint16_t hi = static_cast<uint16_t>(lo + 1);
        const double dlo = bf16_to_float(Bf16{lo});
        const double dhi = (hi & 0x7FFF) == 0x7F80 ? std::copysign(std::ldexp(1.0, 128), f) : bf16_to_float(Bf16{hi});
        const double ef = f;
        const double a = std::fabs(ef - dlo), b = std::fabs(dhi - ef);
        const uint16_t expect = a < b ? lo : (b < a ? hi : ((lo & 1) ? hi : lo));
        ASSERT_EQ(float_to_bf16(f).bits, expect) << std::hex << "float bits 0x" << u;
    }
}

}  // namespace
}  // namespace evenep
