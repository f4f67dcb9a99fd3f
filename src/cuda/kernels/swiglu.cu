// The elementwise kernels of the GPU MoE layer: SwiGLU forward and backward, the backward row prologue (route
// weight gradient and dy), the dx sum and moving the expert output into the receive buffer (declarations and
// contracts in swiglu.hpp; the grouped GEMM's tables are cuda::build_group_table's, expert_ops.cu).
//
// Arithmetic mirrors src/cpu/moe_layer.cpp operation for operation: every product and sum is rounded on its own
// (__fmul_rn/__fadd_rn: nvcc would otherwise contract a*b+c into an FMA, which the CPU build forbids), the
// sigmoid is an IEEE division, bf16 rounding is evenep::float_to_bf16 (round to nearest even). Only expf differs
// from the host's libm (CUDA's is within 2 ulp).
//
// Layout: every launch has grid (blocks_per_rank, R); block (x, r) works on rank r's rows [0, cu_seqlens[G-1])
// with a grid-stride loop over 16-byte vectors (8 bf16 or 8 fp32 values; H and H' are multiples of 8).
#include <cuda_runtime.h>

#include "cuda/device/vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/swiglu.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/detail/row_grad.hpp"
#include "evenep/plan.hpp"

namespace evenep::cuda::kernels {
namespace {

using device::kBf16PerVec;
using device::kWarpSize;
using device::pack_bf16x8;
using device::unpack_bf16x8;

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / kWarpSize;

// Rows of rank `rank` the experts compute: the end of its last group (padding included), clamped to NvS.
__device__ __forceinline__ int64_t used_rows(const MoeKernelParams& p, int rank) {
    const int64_t end = p.ranks[rank].cu_seqlens[p.G - 1];
    return end < 0 ? 0 : (end > p.nvs ? p.nvs : end);
}

__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The CPU layer's sigmoid, silu and silu' (src/cpu/moe_layer.cpp), each operation rounded on its own.
__device__ __forceinline__ float sigmoid_rn(float g) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))); }
__device__ __forceinline__ float silu_rn(float g) { return __fmul_rn(g, sigmoid_rn(g)); }
__device__ __forceinline__ float silu_grad_rn(float g) {
    const float s = sigmoid_rn(g);
    return __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
}

__device__ __forceinline__ void load_f32x8(const float* p, float (&f)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// ---------------------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(const MoeKernelParams p) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t num_vec = used_rows(p, rank) * p.F / kBf16PerVec;
    const int64_t base = static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.F;
    const uint4* g = reinterpret_cast<const uint4*>(p.g + base);
    const uint4* u = reinterpret_cast<const uint4*>(p.u + base);
    uint4* h = reinterpret_cast<uint4*>(p.h + base);
    for (int64_t i = first_index(); i < num_vec; i += grid_stride()) {
        float gf[8], uf[8], hf[8];
        unpack_bf16x8(g[i], gf);
        unpack_bf16x8(u[i], uf);
#pragma unroll
        for (int j = 0; j < 8; ++j) hf[j] = __fmul_rn(silu_rn(gf[j]), uf[j]);
        h[i] = pack_bf16x8(hf);
    }
}

__global__ void __launch_bounds__(kThreads) moe_place_output_kernel(const MoeKernelParams p) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t num_vec = used_rows(p, rank) * p.H / kBf16PerVec;
    const int64_t base = static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.H;
    uint4* recv = reinterpret_cast<uint4*>(p.ranks[rank].recv_x);
    uint4* x = reinterpret_cast<uint4*>(p.x + base);
    const uint4* y = reinterpret_cast<const uint4*>(p.y + base);
    for (int64_t i = first_index(); i < num_vec; i += grid_stride()) {
        x[i] = recv[i];
        recv[i] = y[i];
    }
}

// ---------------------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------------------
// One receive row of the weighted combine's backward by the calling warp (evenep/detail/row_grad.hpp, whose host form
// the CPU computes): dy = bf16(w * grad) (dy may alias grad: each lane reads its vectors before writing them) and
// the returned dw = <grad, y>. Lane l takes vectors l, l+32, ...; the partial dot products meet in a xor butterfly
// (the same sum on every lane, independent of the launch shape).
__device__ __forceinline__ float row_grad_warp(
    const uint4* grad, const uint4* y, uint4* dy, float w, int row_vec, int lane) {
    float dot = 0.0f;
    for (int c = lane; c < row_vec; c += kWarpSize) {
        float gf[8], yf[8], df[8];
        unpack_bf16x8(grad[c], gf);
        unpack_bf16x8(y[c], yf);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            dot = detail::add_product_rn(dot, gf[j], yf[j]);
            df[j] = __fmul_rn(w, gf[j]);
        }
        dy[c] = pack_bf16x8(df);
    }
#pragma unroll
    for (int m = kWarpSize / 2; m >= 1; m /= 2) dot = detail::add_rn(dot, __shfl_xor_sync(0xffffffffu, dot, m));
    return dot;
}

// A warp per used row.
__global__ void __launch_bounds__(kThreads) moe_grad_rows_kernel(const MoeKernelParams p) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const MoeRankView& v = p.ranks[rank];
    const int64_t rows = used_rows(p, rank);
    const int row_vec = p.H / kBf16PerVec;
    const int64_t base = static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.H;
    for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
         row += static_cast<int64_t>(gridDim.x) * kWarps) {
        const float dot = row_grad_warp(reinterpret_cast<const uint4*>(v.recv_x + row * p.H),
                                        reinterpret_cast<const uint4*>(p.y + base + row * p.H),
                                        reinterpret_cast<uint4*>(p.dy + base + row * p.H), v.recv_w[row], row_vec,
                                        lane);
        __syncwarp();  // every lane has read recv_w[row] before lane 0 overwrites it
        if (lane == 0) v.recv_w[row] = dot;
    }
}

// The same rows over the plan tensor and caller tensors (cuda::weight_rows): grid (blocks, plan rows), a warp per
// row; dy in place of the gradient rows, dw into grad_w (0 past the groups).
__global__ void __launch_bounds__(kThreads) weight_rows_kernel(const WeightRowsArgs a) {
    const int i = blockIdx.y, warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const PlanRowLayout& c = a.plan.layout;
    const int64_t end = a.plan.data[static_cast<int64_t>(i) * c.width + c.cu_seqlens + c.G - 1];
    const int64_t used = end < 0 ? 0 : (end > a.nvs ? a.nvs : end);
    const int row_vec = a.H / kBf16PerVec;
    for (int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + warp; n < a.nvs;
         n += static_cast<int64_t>(gridDim.x) * kWarps) {
        const int64_t row = static_cast<int64_t>(i) * a.nvs + n;
        if (n >= used) {
            if (lane == 0) a.grad_w[row] = 0.0f;
            continue;
        }
        uint4* g = reinterpret_cast<uint4*>(a.rows + row * a.H);
        const float dot =
            row_grad_warp(g, reinterpret_cast<const uint4*>(a.y + row * a.H), g, a.recv_w[row], row_vec, lane);
        if (lane == 0) a.grad_w[row] = dot;
    }
}

__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(const MoeKernelParams p) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t num_vec = used_rows(p, rank) * p.F / kBf16PerVec;
    const int64_t base = static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.F;
    const float* dh = p.f32a + static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.f32a_dim;
    const uint4* g = reinterpret_cast<const uint4*>(p.g + base);
    const uint4* u = reinterpret_cast<const uint4*>(p.u + base);
    uint4* dg = reinterpret_cast<uint4*>(p.dg + base);
    uint4* du = reinterpret_cast<uint4*>(p.du + base);
    for (int64_t i = first_index(); i < num_vec; i += grid_stride()) {
        float gf[8], uf[8], hf[8], dgf[8], duf[8];
        unpack_bf16x8(g[i], gf);
        unpack_bf16x8(u[i], uf);
        load_f32x8(dh + i * 8, hf);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            dgf[j] = __fmul_rn(__fmul_rn(hf[j], uf[j]), silu_grad_rn(gf[j]));
            duf[j] = __fmul_rn(hf[j], silu_rn(gf[j]));
        }
        dg[i] = pack_bf16x8(dgf);
        du[i] = pack_bf16x8(duf);
    }
}

__global__ void __launch_bounds__(kThreads) moe_sum_dx_kernel(const MoeKernelParams p) {
    const int rank = p.rank_begin + static_cast<int>(blockIdx.y);
    const int64_t num_vec = used_rows(p, rank) * p.H / kBf16PerVec;
    const float* a = p.f32a + static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.f32a_dim;
    const float* b = p.f32b + static_cast<int64_t>(rank - p.rank_begin) * p.nvs * p.f32b_dim;
    uint4* dx = reinterpret_cast<uint4*>(p.ranks[rank].recv_x);
    for (int64_t i = first_index(); i < num_vec; i += grid_stride()) {
        float af[8], bf[8], sf[8];
        load_f32x8(a + i * 8, af);
        load_f32x8(b + i * 8, bf);
#pragma unroll
        for (int j = 0; j < 8; ++j) sf[j] = __fadd_rn(af[j], bf[j]);
        dx[i] = pack_bf16x8(sf);
    }
}

void check_params(const MoeKernelParams& p, const char* name) {
    EVENEP_CHECK(p.ranks != nullptr && p.R >= 1 && p.G >= 1 && p.nvs >= 0, name, ": R = ", p.R, ", G = ", p.G,
                 ", NvS = ", p.nvs, " (rank table ", p.ranks == nullptr ? "null" : "set", ")");
    EVENEP_CHECK(p.H > 0 && p.H % kBf16PerVec == 0 && p.F > 0 && p.F % kBf16PerVec == 0, name, ": H = ", p.H,
                 ", H' = ", p.F, " must be positive multiples of ", kBf16PerVec);
    EVENEP_CHECK(p.blocks_per_rank >= 1, name, ": blocks per rank = ", p.blocks_per_rank);
    EVENEP_CHECK(p.num_local >= 1 && p.rank_begin >= 0 && p.rank_begin + p.num_local <= p.R, name, ": served ranks [",
                 p.rank_begin, ", ", p.rank_begin + p.num_local, ") outside [0, R = ", p.R, ")");
}

template <typename Kernel>
void launch_per_rank(Kernel kernel, const MoeKernelParams& p, const char* name, cudaStream_t stream) {
    check_params(p, name);
    const dim3 grid(static_cast<unsigned>(p.blocks_per_rank), static_cast<unsigned>(p.num_local));
    kernel<<<grid, kThreads, 0, stream>>>(p);
    check_launch(stream);
}

}  // namespace

void launch_swiglu_forward(const MoeKernelParams& p, cudaStream_t stream) {
    EVENEP_CHECK(p.g && p.u && p.h, "swiglu forward: g, u and h buffers required");
    launch_per_rank(swiglu_forward_kernel, p, "swiglu forward", stream);
}

void launch_moe_place_output(const MoeKernelParams& p, cudaStream_t stream) {
    EVENEP_CHECK(p.x && p.y, "moe place output: x and y buffers required");
    launch_per_rank(moe_place_output_kernel, p, "moe place output", stream);
}

void launch_moe_grad_rows(const MoeKernelParams& p, cudaStream_t stream) {
    EVENEP_CHECK(p.y && p.dy, "moe grad rows: y and dy buffers required");
    launch_per_rank(moe_grad_rows_kernel, p, "moe grad rows", stream);
}

void launch_swiglu_backward(const MoeKernelParams& p, cudaStream_t stream) {
    EVENEP_CHECK(p.g && p.u && p.dg && p.du && p.f32a && p.f32a_dim >= p.F, "swiglu backward: buffers required");
    launch_per_rank(swiglu_backward_kernel, p, "swiglu backward", stream);
}

void launch_moe_sum_dx(const MoeKernelParams& p, cudaStream_t stream) {
    EVENEP_CHECK(p.f32a && p.f32b && p.f32a_dim >= p.H && p.f32b_dim >= p.H, "moe sum dx: buffers required");
    launch_per_rank(moe_sum_dx_kernel, p, "moe sum dx", stream);
}

}  // namespace evenep::cuda::kernels

namespace evenep::cuda {

void weight_rows(const WeightRowsArgs& a, cudaStream_t stream) {
    EVENEP_CHECK(a.plan.data != nullptr && a.plan.rows >= 1 && a.nvs >= 0, "weight_rows: plan tensor ",
                 a.plan.data ? "set" : "null", " with ", a.plan.rows, " rows, NvS = ", a.nvs);
    EVENEP_CHECK(a.H > 0 && a.H % kernels::kBf16PerVec == 0, "weight_rows: H = ", a.H, " is not a positive multiple of ",
                 kernels::kBf16PerVec);
    EVENEP_CHECK(a.rows && a.y && a.recv_w && a.grad_w, "weight_rows: rows, y, recv_w and grad_w required");
    if (a.nvs == 0) return;
    const int64_t blocks = (a.nvs + kernels::kWarps - 1) / kernels::kWarps;
    const dim3 grid(static_cast<unsigned>(blocks < 512 ? blocks : 512), static_cast<unsigned>(a.plan.rows));
    kernels::weight_rows_kernel<<<grid, kernels::kThreads, 0, stream>>>(a);
    check_launch(stream);
}

}  // namespace evenep::cuda
