// 16-byte vector memory access, bf16 <-> fp32 conversion and warp helpers shared by the data-path kernels.
#pragma once

#include <cstdint>

#include "evenep/detail/bf16.hpp"

namespace evenep::cuda::device {

inline constexpr int kWarpSize = 32;
inline constexpr int kBf16PerVec = 8;  // one 16-byte vector holds 8 bf16 values

// fp32 -> bf16 bits: the CPU oracle's conversion (evenep/detail/bf16.hpp: round to nearest even, canonical NaN).
__device__ __forceinline__ uint32_t float_to_bf16_bits(float f) { return evenep::float_to_bf16(f).bits; }

// Read-only streaming load (the source row is read once: no L1 allocation).
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Coherent load (data another block or rank wrote in this launch, ordered by a barrier).
__device__ __forceinline__ uint4 ld_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void st_v4(void* p, const uint4& v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// Unpacks 8 bf16 of a vector into fp32.
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = float_to_bf16_bits(f[2 * i]) | (float_to_bf16_bits(f[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ unsigned lanemask_lt() {
    unsigned m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// dst[i] = load(i) for i < n over the block's kThreads threads, each with eight loads in flight before its stores
// (a plain strided loop waits one memory latency per element).
template <int kThreads, typename T, typename Load>
__device__ __forceinline__ void block_copy_batched(T* dst, int64_t n, const Load& load) {
    for (int64_t i0 = threadIdx.x; i0 < n; i0 += 8 * kThreads) {
        T v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = i0 + k * kThreads < n ? load(i0 + k * kThreads) : T{};
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if (i0 + k * kThreads < n) dst[i0 + k * kThreads] = v[k];
    }
}

}  // namespace evenep::cuda::device
