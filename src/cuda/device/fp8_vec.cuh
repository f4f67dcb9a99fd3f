// The FP8 activation cast on 16-byte vectors, shared by the dispatch's quantising send (kernels/dispatch.cu) and the
// row cast (kernels/fp8.cu): a 1 x 128 block is held by a half warp, 8 bf16 channels (one 16-byte vector) a lane,
// so a warp casts two blocks per vector it loads. Bit for bit the functions of evenep/detail/fp8.hpp
// (fp8_block_scale, fp8_quantize): the amax is a max (any reduction order agrees with the CPU's loop), x / s is the
// same IEEE division (__fdiv_rn), and the e4m3 rounding is the hardware's cvt.rn.satfinite.e4m3x2.f32, which
// float_to_e4m3 is written to equal (fp8_cast_test's Fp8CastHardware case checks every float).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/device/vec.cuh"
#include "evenep/detail/fp8.hpp"

namespace evenep::cuda::device {

inline constexpr int kFp8LanesPerBlock = kFp8Block / kBf16PerVec;  // 16: a half warp holds a 1 x 128 block
static_assert(kFp8LanesPerBlock * 2 == kWarpSize, "two 1 x 128 blocks per warp-wide 16-byte load");

// The e4m3 codes of a and b, a in the low byte (saturating, round to nearest even: float_to_e4m3 of each; a NaN
// gives a NaN code, its sign not kept).
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// Element i (0..7) of 8 bf16 loaded as one 16-byte vector (little-endian: the lower half of each word first).
__device__ __forceinline__ Bf16 bf16x8_lane(const uint4& v, int i) {
    const uint32_t w = i < 2 ? v.x : i < 4 ? v.y : i < 6 ? v.z : v.w;
    return Bf16{static_cast<uint16_t>(i % 2 ? w >> 16 : w & 0xFFFFu)};
}

// Index (0..7) of the first NaN or inf of 8 bf16, or -1.
__device__ __forceinline__ int first_nonfinite_bf16x8(const uint4& v) {
#pragma unroll
    for (int i = 0; i < kBf16PerVec; ++i)
        if (!bf16_is_finite(bf16x8_lane(v, i))) return i;
    return -1;
}

// Index (0..15) of the first NaN code (0x7F or 0xFF) of 16 e4m3 codes, or -1. Per byte b & 0x7F is at most 0x7F,
// so adding 1 sets its top bit exactly when it is 0x7F (no carry into the next byte).
__device__ __forceinline__ int first_nan_e4m3x16(const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t top = ((w[i] & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
        if (top != 0) return 4 * i + (__ffs(static_cast<int>(top)) - 1) / 8;
    }
    return -1;
}

// The codes e4m3(x / s) of 8 bf16 (fp8_quantize of each), channel order.
__device__ __forceinline__ uint2 quantize_bf16x8_with(const uint4& v, float s) {
    float f[kBf16PerVec];
    unpack_bf16x8(v, f);
    uint32_t w[2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
        w[j] = e4m3x2(__fdiv_rn(f[4 * j], s), __fdiv_rn(f[4 * j + 1], s)) |
               (e4m3x2(__fdiv_rn(f[4 * j + 2], s), __fdiv_rn(f[4 * j + 3], s)) << 16);
    return make_uint2(w[0], w[1]);
}

struct Fp8Vec {
    uint2 codes;  // the lane's 8 codes, channel order
    float scale;  // the block's scale (every lane of the half warp)
};

// Casts the 1 x 128 block whose 8-channel vectors lanes 0-15 (and, separately, lanes 16-31) hold in v: every lane
// of the warp calls it (shuffles). Finite input gives fp8.hpp's scale and codes; a NaN or inf gives unspecified
// ones (callers check with first_nonfinite_bf16x8).
__device__ __forceinline__ Fp8Vec quantize_bf16x8(const uint4& v, bool ue8m0) {
    float f[kBf16PerVec];
    unpack_bf16x8(v, f);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kBf16PerVec; ++i) {
        const float a = fabsf(f[i]);
        amax = a > amax ? a : amax;
    }
#pragma unroll
    for (int o = kFp8LanesPerBlock / 2; o > 0; o >>= 1) {
        const float a = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = a > amax ? a : amax;
    }
    const float s = fp8_block_scale(amax, ue8m0);
    return {quantize_bf16x8_with(v, s), s};
}

// Lane j of the warp keeps, in `keep`, the scale of block j of a step of kUnroll vectors a lane (block 2u + h is half
// h of vector u): called once per u, in order, with that vector's quantize_bf16x8 scale. Every lane calls it.
__device__ __forceinline__ void keep_step_scale(float scale, int u, int lane, float& keep) {
    const float s = __shfl_sync(0xffffffffu, scale, (lane & 1) * kFp8LanesPerBlock);
    if (lane / 2 == u) keep = s;
}

// One warp step of the flat 1 x 128 cast: vectors [v0, v0 + 32 kUnroll) of `in` (8 bf16 a vector, nvec in all, a
// multiple of 16; vector v0 + 32u + lane is the lane's u-th), its codes (8 bytes a vector) into `codes` and its
// blocks' scales (one per 16 vectors) into `scales`, at the same flat positions. Every lane of the warp calls it.
// Returns false in every lane when the step held a NaN or inf (its codes and scales are then unspecified).
template <int kUnroll>
__device__ __forceinline__ bool cast_rows_step(
    const uint16_t* in, int64_t v0, int64_t nvec, bool ue8m0, uint8_t* codes, float* scales, int lane) {
    uint4 buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + u * kWarpSize + lane;
        buf[u] = v < nvec ? ld_nc_v4(in + v * kBf16PerVec) : make_uint4(0, 0, 0, 0);
    }
    bool finite = true;
    float keep = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + u * kWarpSize + lane;
        finite = finite && first_nonfinite_bf16x8(buf[u]) < 0;
        const Fp8Vec c = quantize_bf16x8(buf[u], ue8m0);
        if (v < nvec) *reinterpret_cast<uint2*>(codes + v * kBf16PerVec) = c.codes;
        keep_step_scale(c.scale, u, lane, keep);
    }
    const int64_t b0 = v0 / kFp8LanesPerBlock, left = nvec / kFp8LanesPerBlock - b0;
    if (lane < 2 * kUnroll && lane < left) scales[b0 + lane] = keep;
    return __all_sync(0xffffffffu, finite) != 0;
}

}  // namespace evenep::cuda::device
