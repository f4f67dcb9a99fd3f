// Kernels of the all-to-all baseline (NcclAllToAll, perf/cuda/nccl_alltoall.hpp): the Megatron-style
// permutation of routed entries into destination-rank order and the weighted unpermutation after the reverse
// exchange. Device code only; the NCCL calls are in perf/cuda/nccl_alltoall.cpp.
//
//   count    one block: thread i counts the entries of its contiguous chunk per destination rank (shared memory
//            [R][threads]); an exclusive prefix in (rank, thread, entry) order gives every entry its send row, so
//            rows of one destination are in (token, k) order (stable, like a stable argsort by destination).
//   permute  a warp per entry copies its token row into its send row (16-byte vectors).
//   unpermute a warp per token: out = bf16(sum_k (w_k *) y_k) in fp32, k ascending, masked entries skipped.
#include <cuda_runtime.h>

#include "cuda/device/vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "perf/cuda/nccl_alltoall.hpp"

namespace evenep::perf::a2a {
namespace {

namespace device = cuda::device;
using cuda::check_launch;
using device::kBf16PerVec;
using device::kWarpSize;

inline constexpr int kCountThreads = 1024;
inline constexpr int kRowThreads = 256;

__global__ void __launch_bounds__(kCountThreads)
    a2a_count_kernel(const int32_t* topk_idx, int64_t num_entries, int epn, int R, int32_t* pos, int32_t* counts) {
    extern __shared__ int32_t cnt[];  // [R][kCountThreads], then off[R]
    int32_t* off = cnt + static_cast<size_t>(R) * kCountThreads;
    const int tid = threadIdx.x;
    const int64_t chunk = (num_entries + kCountThreads - 1) / kCountThreads;
    const int64_t i0 = min(num_entries, tid * chunk), i1 = min(num_entries, i0 + chunk);
    for (int d = 0; d < R; ++d) cnt[d * kCountThreads + tid] = 0;
    for (int64_t i = i0; i < i1; ++i) {
        const int32_t e = topk_idx[i];
        if (e >= 0) ++cnt[(e / epn) * kCountThreads + tid];
    }
    __syncthreads();
    if (tid < R) {  // exclusive prefix over the threads of destination tid
        int32_t run = 0;
        for (int j = 0; j < kCountThreads; ++j) {
            const int32_t v = cnt[tid * kCountThreads + j];
            cnt[tid * kCountThreads + j] = run;
            run += v;
        }
        counts[tid] = run;
        off[tid] = run;
    }
    __syncthreads();
    if (tid == 0) {  // exclusive prefix over destinations
        int32_t run = 0;
        for (int d = 0; d < R; ++d) {
            const int32_t v = off[d];
            off[d] = run;
            run += v;
        }
    }
    __syncthreads();
    for (int64_t i = i0; i < i1; ++i) {
        const int32_t e = topk_idx[i];
        if (e < 0) {
            pos[i] = -1;
            continue;
        }
        const int d = e / epn;
        pos[i] = off[d] + cnt[d * kCountThreads + tid]++;
    }
}

__global__ void __launch_bounds__(kRowThreads)
    a2a_permute_kernel(const uint16_t* x, const int32_t* pos, int64_t num_entries, int K, int H, uint16_t* send_x) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / kWarpSize;
    const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kRowThreads / kWarpSize;
    const int num_vec = H / kBf16PerVec;
    for (int64_t i = warp; i < num_entries; i += num_warps) {
        const int32_t row = pos[i];
        if (row < 0) continue;
        const uint16_t* src = x + (i / K) * H;
        uint16_t* dst = send_x + static_cast<int64_t>(row) * H;
        for (int v = lane; v < num_vec; v += kWarpSize)
            device::st_v4(dst + static_cast<int64_t>(v) * kBf16PerVec,
                          device::ld_nc_v4(src + static_cast<int64_t>(v) * kBf16PerVec));
    }
}

__global__ void __launch_bounds__(kRowThreads) a2a_unpermute_kernel(
    const uint16_t* y, const int32_t* pos, const float* topk_w, int s, int K, int H, int apply_weights, uint16_t* out) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x) / kWarpSize;
    const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kRowThreads / kWarpSize;
    const int num_vec = H / kBf16PerVec;
    for (int64_t t = warp; t < s; t += num_warps) {
        for (int v = lane; v < num_vec; v += kWarpSize) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int k = 0; k < K; ++k) {
                const int32_t row = pos[t * K + k];
                if (row < 0) continue;
                const float w = apply_weights ? topk_w[t * K + k] : 1.0f;
                float f[8];
                device::unpack_bf16x8(device::ld_v4(y + static_cast<int64_t>(row) * H + v * kBf16PerVec), f);
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], apply_weights ? __fmul_rn(w, f[j]) : f[j]);
            }
            device::st_v4(out + t * H + v * kBf16PerVec, device::pack_bf16x8(acc));
        }
    }
}

int row_blocks(int64_t warps_needed) {
    const int64_t per_block = kRowThreads / kWarpSize;
    const int64_t blocks = (warps_needed + per_block - 1) / per_block;
    return static_cast<int>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace

void launch_a2a_count(const int32_t* topk_idx,
                      int64_t num_entries,
                      int epn,
                      int num_ranks,
                      int32_t* pos,
                      int32_t* counts,
                      cudaStream_t stream) {
    const size_t smem = sizeof(int32_t) * (static_cast<size_t>(num_ranks) * kCountThreads + num_ranks);
    EVENEP_CHECK(smem <= 48 * 1024, "all-to-all baseline: R = ", num_ranks, " needs ", smem,
                 " bytes of shared memory for the counts (R <= 11)");
    a2a_count_kernel<<<1, kCountThreads, smem, stream>>>(topk_idx, num_entries, epn, num_ranks, pos, counts);
    check_launch(stream);
}

void launch_a2a_permute(
    const uint16_t* x, const int32_t* pos, int64_t num_entries, int K, int H, uint16_t* send_x, cudaStream_t stream) {
    a2a_permute_kernel<<<row_blocks(num_entries), kRowThreads, 0, stream>>>(x, pos, num_entries, K, H, send_x);
    check_launch(stream);
}

void launch_a2a_unpermute(const uint16_t* y,
                          const int32_t* pos,
                          const float* topk_w,
                          int s,
                          int K,
                          int H,
                          bool apply_weights,
                          uint16_t* out,
                          cudaStream_t stream) {
    a2a_unpermute_kernel<<<row_blocks(s), kRowThreads, 0, stream>>>(y, pos, topk_w, s, K, H, apply_weights ? 1 : 0,
                                                                    out);
    check_launch(stream);
}

}  // namespace evenep::perf::a2a
