// evenep/detail/fp8.hpp — FP8 (e4m3) storage, its conversions and the block-scaling rules of the FP8 data path,
// identical on host and device (the CPU oracle and the CUDA cast kernels call these same functions).
//
// Format: OCP FP8 E4M3 "FN" (CUDA __nv_fp8_e4m3): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
// 0x7F/0xFF are NaN; the largest finite value is 448 (0x7E), the smallest subnormal 2^-9 (0x01).
//
// Conversions are bit-identical to CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) (the sm_89+
// instruction cvt.rn.satfinite.e4m3x2.f32) and to the exact e4m3 -> float widening:
//   - float -> e4m3 rounds to nearest, ties to even (subnormals included, no flush to zero); a magnitude above 448
//     rounds to 448 when below 464 (448 + half an ulp, a tie going to the even 0x7E), and saturates to +-448
//     (0x7E | sign) above, infinities included; NaN becomes 0x7F | sign; the sign of zero is kept;
//   - e4m3 -> float is exact.
//
// Block scaling (DeepSeek-V3 / DeepGEMM style), one scale per block of kFp8Block values:
//   activations  one scale per 1 x 128 block of a row ([rows, H] -> scales [rows, H/128]);
//   weights      one scale per 128 x 128 block of an [in, out] matrix (scales [in/128, out/128], row-major).
//   wgrad cols   the operands of an FP8 wgrad (dW_g = x_g^T dy_g, the rows are its inner dimension): each group's
//                rows transposed and quantised along the rows, one scale per channel and block of 128 rows counted
//                from the group's first row (a group's last block may be shorter); layout at fp8_cols_ld.
//   scale        s = amax / 448 in fp32 (correctly rounded division), floored at kFp8MinScale = 2^-126 (the
//                smallest normal float: an all-zero block (amax = 0) gets s = 2^-126 and all codes +-0; no scale
//                is ever subnormal, so a flush-to-zero build cannot disagree); with `ue8m0` the scale is then
//                rounded up to a power of two (UE8M0: an 8-bit exponent; stored here as the fp32 value).
//   quantise     q = e4m3(x / s) (correctly rounded fp32 division, then the rounding above; saturation absorbs
//                the one-ulp overshoot of x / s at |x| = amax).
//   dequantise   x' = float(q) * s (fp32 multiply, correctly rounded; exact with ue8m0).
// Inputs must be finite: the FP8 entry points refuse NaN/Inf before quantising (cpu::Buffer::dispatch names the
// rank, token and channel; see docs/fp8.md), because one NaN would poison its block's amax and scale.
// The block size divides H and H' (BufferConfig::validate names the value otherwise).
#pragma once

#include <cstdint>

#include "evenep/detail/bf16.hpp"
#include "evenep/detail/host_device.hpp"

namespace evenep {

// One e4m3 value (raw bits): the byte of __nv_fp8_e4m3. Fp8E4m3{} is +0.
struct Fp8E4m3 {
    uint8_t bits;
    friend constexpr bool operator==(Fp8E4m3 a, Fp8E4m3 b) { return a.bits == b.bits; }
};
static_assert(sizeof(Fp8E4m3) == 1, "Fp8E4m3 must be 1 byte (the layout of __nv_fp8_e4m3)");

inline constexpr int kFp8Block = 128;          // channels per activation scale; rows and columns per weight scale
inline constexpr float kE4m3Max = 448.0f;      // largest finite e4m3
inline constexpr uint8_t kE4m3MaxBits = 0x7E;  // +448
inline constexpr uint8_t kE4m3NanBits = 0x7F;  // NaN (0xFF with the sign)
inline constexpr uint32_t kFp8MinScaleBits = 0x00800000u;  // 2^-126, the smallest normal float

// float -> e4m3, round to nearest even, saturating (CUDA __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)).
EVENEP_HOST_DEVICE inline Fp8E4m3 float_to_e4m3(float f) {
    const uint32_t x = float_as_bits(f);
    const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
    const uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return Fp8E4m3{static_cast<uint8_t>(kE4m3NanBits | sign)};
    if (a > 0x43E80000u) return Fp8E4m3{static_cast<uint8_t>(kE4m3MaxBits | sign)};  // |x| > 464: saturate
    const uint32_t exp = a >> 23;                                                    // biased float exponent
    if (exp >= 121) {  // |x| >= 2^-6: a normal e4m3 (or 448 after rounding)
        // Keep the top 3 mantissa bits; the other 20 round to nearest, ties to even. A carry into the exponent
        // is the correct result; |x| <= 464 never carries past 0x7E.
        uint32_t r = ((exp - 120u) << 3) | ((a >> 20) & 0x7u);
        const uint32_t rest = a & 0xFFFFFu, half = 0x80000u;
        if (rest > half || (rest == half && (r & 1u))) ++r;
        return Fp8E4m3{static_cast<uint8_t>(r | sign)};
    }
    // |x| < 2^-6: a multiple of the subnormal step 2^-9, i.e. round(|x| * 2^9) in [0, 8] (8 is 0x08, the
    // smallest normal 2^-6). With the significand m (implicit bit set) |x| * 2^9 = m * 2^-(141 - exp).
    if (exp < 115) return Fp8E4m3{sign};  // |x| < 2^-12 < half of 2^-9 (float subnormals included)
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 141u - exp;  // 21..26
    uint32_t r = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return Fp8E4m3{static_cast<uint8_t>(r | sign)};
}

// e4m3 -> float, exact. 0x7F/0xFF give a quiet NaN of that sign.
EVENEP_HOST_DEVICE inline float e4m3_to_float(Fp8E4m3 q) {
    const uint32_t sign = static_cast<uint32_t>(q.bits & 0x80u) << 24;
    const uint32_t e = (q.bits >> 3) & 0xFu, m = q.bits & 0x7u;
    if (e == 0xFu && m == 0x7u) return bits_as_float(sign | 0x7FC00000u);
    if (e == 0)
        return bits_as_float(sign | float_as_bits(static_cast<float>(m) * bits_as_float(0x3B000000u)));  // m*2^-9
    return bits_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

// The value e4m3 holds nearest to f (one rounding step, saturating).
EVENEP_HOST_DEVICE inline float round_to_e4m3(float f) { return e4m3_to_float(float_to_e4m3(f)); }

// Scale of a block whose largest magnitude is `amax` (finite, >= 0): max(amax / 448, 2^-126), rounded up to a power
// of two with `ue8m0`.
EVENEP_HOST_DEVICE inline float fp8_block_scale(float amax, bool ue8m0) {
#if defined(__CUDA_ARCH__)
    float s = __fdiv_rn(amax, kE4m3Max);
#else
    float s = amax / kE4m3Max;
#endif
    uint32_t b = float_as_bits(s);
    if (!(b >= kFp8MinScaleBits)) b = kFp8MinScaleBits;                      // also amax = 0 (s = +0)
    if (ue8m0 && (b & 0x7FFFFFu) != 0) b = (b & 0x7F800000u) + 0x00800000u;  // next power of two up
    return bits_as_float(b);
}

// One element of a block with scale s: e4m3(x / s).
EVENEP_HOST_DEVICE inline Fp8E4m3 fp8_quantize(float x, float s) {
#if defined(__CUDA_ARCH__)
    return float_to_e4m3(__fdiv_rn(x, s));
#else
    return float_to_e4m3(x / s);
#endif
}

// float(q) * s.
EVENEP_HOST_DEVICE inline float fp8_dequantize(Fp8E4m3 q, float s) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(e4m3_to_float(q), s);
#else
    return e4m3_to_float(q) * s;
#endif
}

// |x| as a float of a bf16 (sign bit cleared; exact).
EVENEP_HOST_DEVICE inline float bf16_abs(Bf16 x) {
    return bf16_to_float(Bf16{static_cast<uint16_t>(x.bits & 0x7FFFu)});
}

// True when x is neither NaN nor infinite.
EVENEP_HOST_DEVICE inline bool bf16_is_finite(Bf16 x) { return (x.bits & 0x7F80u) != 0x7F80u; }

// Wgrad operands (the "wgrad cols" rule above) of a buffer of `capacity` rows (>= the groups' padded rows,
// cu_seqlens[G-1]) and G groups: codes [dim][fp8_cols_ld(capacity)] (row r of the buffer at column r; columns past
// the groups' rows are 0; the leading dimension is a multiple of 16 bytes, as TMA needs), scales
// [fp8_cols_scale_rows(capacity, G)][dim] (channel-contiguous: block j of group g, which begins at row `begin`, is
// scale row fp8_cols_block(begin, g) + j; rows of no block are unused). begin / 128 + g never lets two groups' blocks
// meet: a group of n rows has ceil(n / 128) <= (begin + n) / 128 - begin / 128 + 1 blocks.
EVENEP_HOST_DEVICE inline int64_t fp8_cols_ld(int64_t rows) { return (rows + 15) / 16 * 16; }
EVENEP_HOST_DEVICE inline int64_t fp8_cols_block(int64_t begin, int g) { return begin / kFp8Block + g; }
EVENEP_HOST_DEVICE inline int64_t fp8_cols_scale_rows(int64_t rows, int G) { return rows / kFp8Block + G + 1; }

// Activations: quantises one 1 x 128 block x[0..128) into q[0..128) and returns its scale. x must be finite.
// The amax is a max (order-free), so any parallel reduction gives the same scale.
EVENEP_HOST_DEVICE inline float fp8_quantize_act_block(const Bf16* x, Fp8E4m3* q, bool ue8m0) {
    float amax = 0.0f;
    for (int i = 0; i < kFp8Block; ++i) {
        const float v = bf16_abs(x[i]);
        amax = v > amax ? v : amax;
    }
    const float s = fp8_block_scale(amax, ue8m0);
    for (int i = 0; i < kFp8Block; ++i) q[i] = fp8_quantize(bf16_to_float(x[i]), s);
    return s;
}

// Weights: quantises the 128 x 128 block starting at w (row stride ld elements) into q (same stride) and returns
// its scale. w must be finite.
EVENEP_HOST_DEVICE inline float fp8_quantize_weight_block(const Bf16* w, int64_t ld, Fp8E4m3* q, bool ue8m0) {
    float amax = 0.0f;
    for (int r = 0; r < kFp8Block; ++r)
        for (int c = 0; c < kFp8Block; ++c) {
            const float v = bf16_abs(w[r * ld + c]);
            amax = v > amax ? v : amax;
        }
    const float s = fp8_block_scale(amax, ue8m0);
    for (int r = 0; r < kFp8Block; ++r)
        for (int c = 0; c < kFp8Block; ++c) q[r * ld + c] = fp8_quantize(bf16_to_float(w[r * ld + c]), s);
    return s;
}

}  // namespace evenep
