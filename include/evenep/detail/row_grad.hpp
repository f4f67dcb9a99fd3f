// evenep/detail/row_grad.hpp — the backward of a weighted combine on one receive row, defined once for the host
// (the CPU MoE layer, the CPU op combine_backward_weighted) and the device (src/cuda/kernels/swiglu.cu): given the
// row's output gradient g [H] (bf16), its expert output y [H] (bf16) and its route weight w,
//   dy = bf16(w * g)        (one rounding per value)
//   dw = <g, y>             (fp32, in the order below)
// The order of dw is the CUDA kernel's, a warp per row: lane l (of 32) adds the products of its 8-value vectors
// l, l+32, l+64, ... in order, every product and sum rounded on its own (no FMA); then the 32 lane sums meet in a xor
// butterfly: for m = 16, 8, 4, 2, 1, v_l = v_l + v_(l xor m); dw = v_0 (every lane ends with the same value).
// H % 8 == 0.
#pragma once

#include <cstdint>

#include "evenep/detail/bf16.hpp"
#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

inline constexpr int kRowGradLanes = 32;  // the warp of the CUDA kernel
inline constexpr int kRowGradVec = 8;     // values per 16-byte vector

// acc + a*b with the product and the sum rounded on their own (never contracted into an FMA).
EVENEP_HOST_DEVICE inline float add_product_rn(float acc, float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(acc, __fmul_rn(a, b));
#else
    const volatile float p = a * b;  // NOTE: volatile keeps a host compiler with FMA from contracting
    return acc + p;
#endif
}

EVENEP_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// The host form of the whole row: dy (may alias g) and the returned dw, bit for bit what the CUDA kernel computes.
inline float row_grad(const Bf16* g, const Bf16* y, float w, Bf16* dy, int64_t H) {
    float lanes[kRowGradLanes];
    const int64_t num_vec = H / kRowGradVec;
    for (int lane = 0; lane < kRowGradLanes; ++lane) {
        float dot = 0.0f;
        for (int64_t c = lane; c < num_vec; c += kRowGradLanes)
            for (int j = 0; j < kRowGradVec; ++j)
                dot = add_product_rn(dot, bf16_to_float(g[c * kRowGradVec + j]), bf16_to_float(y[c * kRowGradVec + j]));
        lanes[lane] = dot;
    }
    for (int64_t i = 0; i < H; ++i) dy[i] = float_to_bf16(w * bf16_to_float(g[i]));
    for (int m = kRowGradLanes / 2; m >= 1; m /= 2) {
        float next[kRowGradLanes];
        for (int l = 0; l < kRowGradLanes; ++l) next[l] = add_rn(lanes[l], lanes[l ^ m]);
        for (int l = 0; l < kRowGradLanes; ++l) lanes[l] = next[l];
    }
    return lanes[0];
}

}  // namespace evenep::detail
