// The copy-bandwidth anchor: a plain device-to-device copy with 16-byte vectors, several loads in flight per thread.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/device/vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/grouped_gemm.hpp"

namespace evenep::cuda {
namespace {

inline constexpr int kCopyThreads = 512;
inline constexpr int kCopyUnroll = 4;

__global__ void __launch_bounds__(kCopyThreads) copy_vec16_kernel(uint4* dst, const uint4* src, size_t num_vec) {
    const size_t stride = static_cast<size_t>(gridDim.x) * kCopyThreads * kCopyUnroll;
    for (size_t base = static_cast<size_t>(blockIdx.x) * kCopyThreads * kCopyUnroll + threadIdx.x; base < num_vec;
         base += stride) {
        uint4 buf[kCopyUnroll];
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
            const size_t v = base + static_cast<size_t>(u) * kCopyThreads;
            if (v < num_vec) buf[u] = device::ld_nc_v4(src + v);
        }
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
            const size_t v = base + static_cast<size_t>(u) * kCopyThreads;
            if (v < num_vec) device::st_v4(dst + v, buf[u]);
        }
    }
}

// Up to kRankIoBatch RankIo entries by value (kernel parameters are copied at launch: no host buffer must outlive
// the call, and the store is ordered on the stream before the data-path kernel that reads the table).
inline constexpr int kRankIoBatch = 32;
struct RankIoBatch {
    RankIo entries[kRankIoBatch];
    int first;
    int count;
};

__global__ void store_rank_io_kernel(RankIo* table, const RankIoBatch batch) {
    const int i = static_cast<int>(threadIdx.x);
    if (i < batch.count) table[batch.first + i] = batch.entries[i];
}

}  // namespace

void launch_store_rank_io(RankIo* d_table, int first, std::span<const RankIo> entries, cudaStream_t stream) {
    EVENEP_CHECK(d_table != nullptr && first >= 0, "store rank io: bad table or first = ", first);
    for (size_t done = 0; done < entries.size(); done += kRankIoBatch) {
        RankIoBatch b{};
        b.first = first + static_cast<int>(done);
        b.count = static_cast<int>(std::min<size_t>(kRankIoBatch, entries.size() - done));
        for (int i = 0; i < b.count; ++i) b.entries[i] = entries[done + i];
        store_rank_io_kernel<<<1, kRankIoBatch, 0, stream>>>(d_table, b);
        check_launch(stream);
    }
}

void launch_fill_random_bf16(uint16_t* dst, size_t n, uint64_t seed, cudaStream_t stream) {
    fill_random_bf16(dst, n, seed, 1.0f, stream);
    check_launch(stream);
}

void launch_copy_vec16(void* dst, const void* src, size_t bytes, int num_blocks, cudaStream_t stream) {
    EVENEP_CHECK(bytes % 16 == 0, "copy: ", bytes, " bytes is not a multiple of 16");
    EVENEP_CHECK(num_blocks >= 1, "copy: num_blocks = ", num_blocks);
    copy_vec16_kernel<<<num_blocks, kCopyThreads, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src),
                                                               bytes / 16);
    check_launch(stream);
}

}  // namespace evenep::cuda
