// evenep/detail/bf16.hpp — bfloat16 storage and its conversions, identical on host and device.
//
// A Bf16 is the 16 high bits of an IEEE-754 binary32 value (1 sign, 8 exponent, 7 mantissa bits), stored as
// uint16_t: the same bytes as CUDA's __nv_bfloat16, so host and device buffers can be reinterpreted freely.
//
// Conversions are bit-identical to CUDA's __float2bfloat16_rn and __bfloat162float:
//   - float -> bf16 rounds to nearest, ties to even, on the raw bits; subnormals are kept (no flush to zero);
//     values that round past the largest finite bf16 become +-inf;
//   - every NaN becomes the canonical bf16 NaN 0x7FFF (what __float2bfloat16_rn returns for any NaN input);
//   - bf16 -> float is exact (the 16 bits become the high half of the float).
#pragma once

#include <cstdint>
#include <cstring>

#include "evenep/detail/host_device.hpp"

namespace evenep {

// One bfloat16 value (raw bits). Trivial, so std::vector<Bf16>(n) and Bf16{} are zero (+0.0).
struct Bf16 {
    uint16_t bits;
    friend constexpr bool operator==(Bf16 a, Bf16 b) { return a.bits == b.bits; }  // bitwise (NaN == same NaN)
};
static_assert(sizeof(Bf16) == 2, "Bf16 must be 2 bytes (the layout of __nv_bfloat16)");

inline constexpr uint16_t kBf16CanonicalNan = 0x7FFF;

EVENEP_HOST_DEVICE inline uint32_t float_as_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

EVENEP_HOST_DEVICE inline float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

// float -> bf16, round to nearest even (CUDA __float2bfloat16_rn).
EVENEP_HOST_DEVICE inline Bf16 float_to_bf16(float f) {
    const uint32_t x = float_as_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return Bf16{kBf16CanonicalNan};
    // Adding 0x7FFF plus the lowest kept bit rounds the discarded 16 bits to nearest, ties to even; a carry into
    // the exponent is the correct result (including overflow to infinity).
    const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
    return Bf16{static_cast<uint16_t>(rounded >> 16)};
}

// bf16 -> float, exact (CUDA __bfloat162float).
EVENEP_HOST_DEVICE inline float bf16_to_float(Bf16 b) { return bits_as_float(static_cast<uint32_t>(b.bits) << 16); }

// The float nearest to f that a Bf16 can hold (one rounding step).
EVENEP_HOST_DEVICE inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace evenep
