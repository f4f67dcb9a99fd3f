// The K-major copies of an FP8 grouped GEMM's weights (launcher declared in evenep/cuda/fp8_transpose.hpp): the
// 64 x 64 byte tiles of every group (device::transpose_byte_tiles) in one grid-strided loop.
#include <cuda_runtime.h>

#include "cuda/device/byte_transpose.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/fp8_transpose.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

inline constexpr int kThreads = 256;
inline constexpr int kMaxBlocks = 2048;  // grid cap (the loop strides over the rest)
static_assert(kFp8Block % device::kByteTile == 0, "the tiles cover a matrix of multiples of 128 exactly");

__device__ __forceinline__ bool copied(const Fp8GroupTranspose& p, int g) {
    const int32_t begin = g == 0 ? 0 : p.cu_seqlens[g - 1];
    return p.weights[g] != nullptr && p.cu_seqlens[g] > begin;
}

__global__ void __launch_bounds__(kThreads) transpose_groups_kernel(const Fp8GroupTranspose p) {
    __shared__ __align__(4) device::ByteTile tile;
    const int64_t mat = static_cast<int64_t>(p.in_dim) * p.out_dim;
    // ---- phase 1: the table of the copies (every entry written: a copy or null) ----
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < p.num_groups;
         g += static_cast<int64_t>(gridDim.x) * kThreads)
        p.transposed_table[g] = copied(p, static_cast<int>(g)) ? p.transposed + g * mat : nullptr;
    // ---- phase 2: the tiles of the copied groups ----
    device::transpose_byte_tiles<kThreads>(
        p.num_groups, p.in_dim, p.out_dim, blockIdx.x, gridDim.x, [&](int g) { return copied(p, g); },
        [&](int g) {
            return device::ByteTileGroup{p.weights[g], p.transposed + g * mat};
        },
        tile);
}

}  // namespace

void launch_fp8_transpose_groups(const Fp8GroupTranspose& p, cudaStream_t stream) {
    EVENEP_CHECK(p.num_groups >= 1, "fp8 transpose groups: num_groups = ", p.num_groups, ", expected >= 1");
    EVENEP_CHECK(p.in_dim > 0 && p.in_dim % kFp8Block == 0 && p.out_dim > 0 && p.out_dim % kFp8Block == 0,
                 "fp8 transpose groups: ", p.in_dim, " x ", p.out_dim, " must be positive multiples of ", kFp8Block);
    EVENEP_CHECK(
        p.weights != nullptr && p.cu_seqlens != nullptr && p.transposed != nullptr && p.transposed_table != nullptr,
        "fp8 transpose groups: null pointer among weights, cu_seqlens, transposed, transposed_table");
    const int64_t tiles =
        static_cast<int64_t>(p.num_groups) * (p.in_dim / device::kByteTile) * (p.out_dim / device::kByteTile);
    const int blocks = static_cast<int>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
    transpose_groups_kernel<<<blocks, kThreads, 0, stream>>>(p);
    check_launch(stream);
}

}  // namespace evenep::cuda
