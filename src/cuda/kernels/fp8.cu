// FP8 cast kernels (launchers declared in evenep/cuda/detail/fp8_cast.hpp): one thread block per scaling block,
// amax by warp shuffles then shared memory, every element quantised by the shared host/device functions of
// evenep/detail/fp8.hpp — the CPU oracle's bytes, bit for bit.
#include <cuda_runtime.h>

#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/fp8_cast.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowThreads = kFp8Block;  // one thread per element of a 1 x 128 block
constexpr int kWeightThreads = 256;     // 64 elements per thread of a 128 x 128 block
constexpr int kWeightPerThread = kFp8Block * kFp8Block / kWeightThreads;
static_assert(kRowThreads % kWarp == 0 && kWeightThreads % kWarp == 0, "whole warps");

// Max of v over the thread block (every thread gets it). v >= 0 (magnitudes); max is exact, so any order agrees
// with the CPU's loop. smem: one float per warp.
template <int kThreads>
__device__ float block_amax(float v, int warp_idx, int lane_idx, float* smem) {
    for (int off = kWarp / 2; off > 0; off /= 2) {
        const float o = __shfl_xor_sync(0xFFFFFFFFu, v, off);
        v = o > v ? o : v;
    }
    if (lane_idx == 0) smem[warp_idx] = v;
    __syncthreads();
    float m = smem[0];
    for (int w = 1; w < kThreads / kWarp; ++w) m = smem[w] > m ? smem[w] : m;
    return m;
}

struct RowCastParams {
    const Bf16* in;
    Fp8E4m3* codes;
    float* scales;
    uint32_t* nonfinite;
    bool ue8m0;
};

// Block b casts 1 x 128 block b of the flattened [rows, dim] array (blocks of a row are contiguous, so the flat
// block index is also the scale index).
__global__ void __launch_bounds__(kRowThreads) fp8_cast_rows_kernel(RowCastParams p) {
    __shared__ float smem[kRowThreads / kWarp];
    const int64_t b = blockIdx.x;
    const int t = threadIdx.x;
    const Bf16 x = p.in[b * kFp8Block + t];
    if (!bf16_is_finite(x) && p.nonfinite != nullptr) atomicExch(p.nonfinite, 1u);
    const float amax = block_amax<kRowThreads>(bf16_abs(x), t / kWarp, t % kWarp, smem);
    const float s = fp8_block_scale(amax, p.ue8m0);
    p.codes[b * kFp8Block + t] = fp8_quantize(bf16_to_float(x), s);
    if (t == 0) p.scales[b] = s;
}

struct WeightCastParams {
    const Bf16* w;
    Fp8E4m3* codes;
    float* scales;
    uint32_t* nonfinite;
    int in, out;
    bool ue8m0;
};

// Block (bi, bo) = blockIdx.x as bi * (out/128) + bo casts the 128 x 128 block at rows bi*128, columns bo*128.
__global__ void __launch_bounds__(kWeightThreads) fp8_cast_weight_kernel(WeightCastParams p) {
    __shared__ float smem[kWeightThreads / kWarp];
    const int nob = p.out / kFp8Block;
    const int bi = static_cast<int>(blockIdx.x) / nob, bo = static_cast<int>(blockIdx.x) % nob;
    const int64_t base = static_cast<int64_t>(bi) * kFp8Block * p.out + static_cast<int64_t>(bo) * kFp8Block;
    const int t = threadIdx.x;
    // Element e = t + k*256 of the block: row e / 128, column e % 128 (consecutive threads, consecutive columns).
    Bf16 v[kWeightPerThread];
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int k = 0; k < kWeightPerThread; ++k) {
        const int e = t + k * kWeightThreads;
        v[k] = p.w[base + static_cast<int64_t>(e / kFp8Block) * p.out + e % kFp8Block];
        finite = finite && bf16_is_finite(v[k]);
        const float a = bf16_abs(v[k]);
        amax = a > amax ? a : amax;
    }
    if (!finite && p.nonfinite != nullptr) atomicExch(p.nonfinite, 1u);
    amax = block_amax<kWeightThreads>(amax, t / kWarp, t % kWarp, smem);
    const float s = fp8_block_scale(amax, p.ue8m0);
#pragma unroll
    for (int k = 0; k < kWeightPerThread; ++k) {
        const int e = t + k * kWeightThreads;
        p.codes[base + static_cast<int64_t>(e / kFp8Block) * p.out + e % kFp8Block] =
            fp8_quantize(bf16_to_float(v[k]), s);
    }
    if (t == 0) p.scales[blockIdx.x] = s;
}

}  // namespace

void launch_fp8_cast_rows(const Bf16* in,
                          int64_t rows,
                          int dim,
                          bool ue8m0,
                          Fp8E4m3* codes,
                          float* scales,
                          uint32_t* nonfinite,
                          cudaStream_t stream) {
    EVENEP_CHECK(dim >= kFp8Block && dim % kFp8Block == 0, "fp8 cast: dim = ", dim, " must be a positive multiple of ",
                 kFp8Block);
    EVENEP_CHECK(rows >= 0, "fp8 cast: rows = ", rows, " must be >= 0");
    const int64_t blocks = rows * (dim / kFp8Block);
    EVENEP_CHECK(blocks <= INT32_MAX, "fp8 cast: ", blocks, " blocks exceed one grid");
    if (blocks == 0) return;
    EVENEP_CHECK(in != nullptr && codes != nullptr && scales != nullptr, "fp8 cast: null buffer");
    launch_clustered(fp8_cast_rows_kernel, static_cast<int>(blocks), 1, kRowThreads, 0, stream, false,
                     RowCastParams{in, codes, scales, nonfinite, ue8m0});
}

void launch_fp8_cast_weight(const Bf16* w,
                            int in,
                            int out,
                            bool ue8m0,
                            Fp8E4m3* codes,
                            float* scales,
                            uint32_t* nonfinite,
                            cudaStream_t stream) {
    EVENEP_CHECK(in >= kFp8Block && in % kFp8Block == 0 && out >= kFp8Block && out % kFp8Block == 0,
                 "fp8 weight cast: dims ", in, " x ", out, " must be positive multiples of ", kFp8Block);
    EVENEP_CHECK(w != nullptr && codes != nullptr && scales != nullptr, "fp8 weight cast: null buffer");
    const int blocks = (in / kFp8Block) * (out / kFp8Block);
    launch_clustered(fp8_cast_weight_kernel, blocks, 1, kWeightThreads, 0, stream, false,
                     WeightCastParams{w, codes, scales, nonfinite, in, out, ue8m0});
}

}  // namespace evenep::cuda
