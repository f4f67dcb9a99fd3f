// The FP8 kernels of the GPU MoE layer (declarations and contracts in moe_fp8.hpp): the layer's own 1 x 128 casts
// (h, dy, dg, du), the output placement with the dequantised x for the bf16 wgrad, the bf16 -> fp32 widening of dh,
// the dx sum of the two FP8 dgrads' bf16 outputs and the transposes (K-major) of the prefetched e4m3 copies. The
// casts (device/fp8_vec.cuh) give evenep/detail/fp8.hpp's bytes, so cpu::quantize_rows_fp8's (docs/fp8.md).
#include <cuda_runtime.h>

#include "cuda/device/byte_transpose.cuh"
#include "cuda/device/fp8_vec.cuh"
#include "cuda/kernels/moe_fp8.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda::kernels {
namespace {

using device::kWarpSize;

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / kWarpSize;
inline constexpr int kPerLane = 4;     // elements per thread of the elementwise kernels
inline constexpr int kCastUnroll = 4;  // 16-byte vectors a lane loads before casting them

__device__ __forceinline__ int64_t used_rows(const MoeKernelParams& p, int rank) {
    const int64_t end = p.ranks[rank].cu_seqlens[p.G - 1];
    return end < 0 ? 0 : (end > p.nvs ? p.nvs : end);
}

// The rank's used rows as one flat array, in warp steps of kCastUnroll 16-byte vectors a lane, a half warp per
// 1 x 128 block (device::cast_rows_step), grid-strided.
__global__ void __launch_bounds__(kThreads)
    cast_rows_kernel(const MoeKernelParams p, const uint16_t* in, int dim, bool ue8m0, uint8_t* codes, float* scales) {
    constexpr int kStep = kWarpSize * kCastUnroll;
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t base = static_cast<int64_t>(blockIdx.y) * p.nvs * dim;
    const int64_t nvec = used_rows(p, rank) * dim / device::kBf16PerVec;
    const int lane = threadIdx.x % kWarpSize;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * kStep;
    for (int64_t v0 = warp * kStep; v0 < nvec; v0 += stride)
        device::cast_rows_step<kCastUnroll>(in + base, v0, nvec, ue8m0, codes + base, scales + base / kFp8Block, lane);
}

// Per thread 4 elements: recv_x <- y (8 bytes), x <- the 4 codes dequantised with their block's scale.
__global__ void __launch_bounds__(kThreads) place_output_kernel(const MoeKernelParams p, const MoeFp8RankView* views) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const MoeFp8RankView v = views[blockIdx.y];
    const int64_t n = used_rows(p, rank) * p.H / kPerLane;
    const int64_t base = static_cast<int64_t>(blockIdx.y) * p.nvs * p.H;
    uint2* x = reinterpret_cast<uint2*>(p.x + base);
    const uint2* y = reinterpret_cast<const uint2*>(p.y + base);
    uint2* recv = reinterpret_cast<uint2*>(p.ranks[rank].recv_x);
    const uint32_t* q4 = reinterpret_cast<const uint32_t*>(v.x8);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        recv[i] = y[i];
        const uint32_t q = q4[i];
        const float s = v.scale[i * kPerLane / kFp8Block];
        uint32_t b[kPerLane];
#pragma unroll
        for (int j = 0; j < kPerLane; ++j)
            b[j] = float_to_bf16(fp8_dequantize(Fp8E4m3{static_cast<uint8_t>(q >> (8 * j))}, s)).bits;
        x[i] = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
    }
}

__device__ __forceinline__ float lo_bf16(uint32_t w) { return bf16_to_float(Bf16{static_cast<uint16_t>(w & 0xFFFFu)}); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return bf16_to_float(Bf16{static_cast<uint16_t>(w >> 16)}); }
// Two bf16 sums of a word pair, each rounded once (launch_moe_sum_dx's __fadd_rn, then bf16).
__device__ __forceinline__ uint32_t sum_bf16x2(uint32_t x, uint32_t y) {
    return static_cast<uint32_t>(float_to_bf16(__fadd_rn(lo_bf16(x), lo_bf16(y))).bits) |
           static_cast<uint32_t>(float_to_bf16(__fadd_rn(hi_bf16(x), hi_bf16(y))).bits) << 16;
}

__global__ void __launch_bounds__(kThreads)
    sum_dx_kernel(const MoeKernelParams p, const uint16_t* a, const uint16_t* b) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t n = used_rows(p, rank) * p.H / kPerLane;
    const int64_t base = static_cast<int64_t>(blockIdx.y) * p.nvs * p.H;
    const uint2* a2 = reinterpret_cast<const uint2*>(a + base);
    const uint2* b2 = reinterpret_cast<const uint2*>(b + base);
    uint2* dx = reinterpret_cast<uint2*>(p.ranks[rank].recv_x);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint2 u = a2[i], v = b2[i];
        dx[i] = make_uint2(sum_bf16x2(u.x, v.x), sum_bf16x2(u.y, v.y));
    }
}

__global__ void __launch_bounds__(kThreads)
    widen_kernel(const MoeKernelParams p, const uint16_t* in, int dim, float* out, int64_t out_dim) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t rows = used_rows(p, rank), n = rows * dim;
    const uint16_t* a = in + static_cast<int64_t>(blockIdx.y) * p.nvs * dim;
    float* b = out + static_cast<int64_t>(blockIdx.y) * p.nvs * out_dim;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        b[i] = bf16_to_float(Bf16{a[i]});  // rows packed at dim, as the GEMMs write them (swiglu_backward reads so)
}

// Block (x, rank): tiles x, x + gridDim.x, ... of the rank's G groups (device::transpose_byte_tiles); the tiles of
// groups without rows or without both pointers are skipped. in and out are multiples of 128, so the tiles cover the
// matrix exactly.
__global__ void __launch_bounds__(kThreads) transpose_kernel(
    const MoeKernelParams p, const uint8_t* const* table, const uint8_t* const* dst_table, int in, int out) {
    __shared__ __align__(4) device::ByteTile tile;
    const int i = static_cast<int>(blockIdx.y), rank = p.rank_begin + i;
    const int32_t* cu = p.ranks[rank].cu_seqlens;
    const uint8_t* const* t = table + static_cast<int64_t>(i) * (p.G + 1);
    const uint8_t* const* dt = dst_table + static_cast<int64_t>(i) * (p.G + 1);
    device::transpose_byte_tiles<kThreads>(
        p.G, in, out, blockIdx.x, gridDim.x,
        [&](int g) { return t[g] != nullptr && dt[g] != nullptr && cu[g] > (g == 0 ? 0 : cu[g - 1]); },
        [&](int g) {
            return device::ByteTileGroup{t[g], const_cast<uint8_t*>(dt[g])};
        },
        tile);
}

void check_params(const MoeKernelParams& p, const char* name) {
    EVENEP_CHECK(p.ranks != nullptr && p.G >= 1 && p.nvs >= 0 && p.num_local >= 1 && p.blocks_per_rank >= 1, name,
                 ": G = ", p.G, ", NvS = ", p.nvs, ", served ranks ", p.num_local, ", blocks per rank ",
                 p.blocks_per_rank, " (rank table ", p.ranks == nullptr ? "null" : "set", ")");
}

dim3 grid_of(const MoeKernelParams& p) {
    return dim3(static_cast<unsigned>(p.blocks_per_rank), static_cast<unsigned>(p.num_local));
}

}  // namespace

void launch_moe_fp8_cast_rows(const MoeKernelParams& p,
                              const uint16_t* in,
                              int dim,
                              bool ue8m0,
                              uint8_t* codes,
                              float* scales,
                              cudaStream_t stream) {
    check_params(p, "moe fp8 cast rows");
    EVENEP_CHECK(dim > 0 && dim % kFp8Block == 0, "moe fp8 cast rows: dim = ", dim, " must be a positive multiple of ",
                 kFp8Block);
    EVENEP_CHECK(in != nullptr && codes != nullptr && scales != nullptr, "moe fp8 cast rows: null buffer");
    cast_rows_kernel<<<grid_of(p), kThreads, 0, stream>>>(p, in, dim, ue8m0, codes, scales);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_fp8_place_output(const MoeKernelParams& p, const MoeFp8RankView* views, cudaStream_t stream) {
    check_params(p, "moe fp8 place output");
    EVENEP_CHECK(p.H % kFp8Block == 0, "moe fp8 place output: H = ", p.H, " must be a multiple of ", kFp8Block);
    EVENEP_CHECK(views != nullptr && p.x != nullptr && p.y != nullptr, "moe fp8 place output: null buffer");
    place_output_kernel<<<grid_of(p), kThreads, 0, stream>>>(p, views);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_fp8_sum_dx(const MoeKernelParams& p, const uint16_t* a, const uint16_t* b, cudaStream_t stream) {
    check_params(p, "moe fp8 sum dx");
    EVENEP_CHECK(p.H % kPerLane == 0 && a != nullptr && b != nullptr, "moe fp8 sum dx: H = ", p.H,
                 " (or a null buffer)");
    sum_dx_kernel<<<grid_of(p), kThreads, 0, stream>>>(p, a, b);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_widen(
    const MoeKernelParams& p, const uint16_t* in, int dim, float* out, int64_t out_dim, cudaStream_t stream) {
    check_params(p, "moe widen");
    EVENEP_CHECK(dim > 0 && dim <= out_dim && in != nullptr && out != nullptr, "moe widen: dim = ", dim,
                 ", out_dim = ", out_dim, " (or a null buffer)");
    widen_kernel<<<grid_of(p), kThreads, 0, stream>>>(p, in, dim, out, out_dim);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_fp8_transpose_groups(const MoeKernelParams& p,
                                     const uint8_t* const* table,
                                     const uint8_t* const* dst_table,
                                     int in,
                                     int out,
                                     cudaStream_t stream) {
    check_params(p, "moe fp8 transpose");
    EVENEP_CHECK(in > 0 && in % kFp8Block == 0 && out > 0 && out % kFp8Block == 0, "moe fp8 transpose: ", in, " x ",
                 out, " must be positive multiples of ", kFp8Block);
    EVENEP_CHECK(table != nullptr && dst_table != nullptr, "moe fp8 transpose: null table");
    transpose_kernel<<<grid_of(p), kThreads, 0, stream>>>(p, table, dst_table, in, out);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace evenep::cuda::kernels
