// A 64 x 64 byte tile transposed through shared memory (the K-major e4m3 copies of FP8 weights: the FP8 MoE layer's
// per-step copies, kernels/moe_fp8.cu, and launch_fp8_transpose_groups, kernels/fp8_transpose.cu).
#pragma once

#include <cstdint>

namespace evenep::cuda::device {

inline constexpr int kByteTile = 64;                              // tile edge, bytes
inline constexpr int kByteTileWords = kByteTile * kByteTile / 4;  // 4-byte words of a tile
using ByteTile = uint8_t[kByteTile][kByteTile + 4];               // shared memory, rows padded against bank conflicts

// dst[c][r] = src[r][c] for the tile at rows r0.., columns c0.. of src ([in][out] bytes; dst is [out][in]), by every
// thread of the block (kThreads of them; two __syncthreads, so block-uniform). 4-byte words both ways (in, out and
// the tile's row stride are multiples of 4): a source word is 4 bytes of one row; a destination word gathers one
// column's bytes of 4 consecutive source rows.
template <int kThreads>
__device__ __forceinline__ void transpose_byte_tile(
    const uint8_t* src, uint8_t* dst, int64_t in, int64_t out, int64_t r0, int64_t c0, ByteTile& tile) {
    for (int e = threadIdx.x; e < kByteTileWords; e += kThreads) {
        const int r = e / (kByteTile / 4), c = 4 * (e % (kByteTile / 4));
        *reinterpret_cast<uint32_t*>(&tile[r][c]) = *reinterpret_cast<const uint32_t*>(src + (r0 + r) * out + c0 + c);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kByteTileWords; e += kThreads) {
        const int c = e / (kByteTile / 4), r = 4 * (e % (kByteTile / 4));  // dst row c0 + c, columns r0 + r ..
        const uint32_t word = static_cast<uint32_t>(tile[r][c]) | static_cast<uint32_t>(tile[r + 1][c]) << 8 |
                              static_cast<uint32_t>(tile[r + 2][c]) << 16 | static_cast<uint32_t>(tile[r + 3][c]) << 24;
        *reinterpret_cast<uint32_t*>(dst + (c0 + c) * in + r0 + r) = word;
    }
    __syncthreads();  // the tile is read before the block's next call overwrites it
}

// One group's matrices for transpose_byte_tiles: src [in][out] bytes, dst [out][in].
struct ByteTileGroup {
    const uint8_t* src;
    uint8_t* dst;
};

// Every 64 x 64 tile of num_groups [in][out] byte matrices (in, out multiples of kByteTile) transposed
// (transpose_byte_tile): the flat (group, tile) list, tile k of a group at rows (k / (out / kByteTile)) * kByteTile,
// columns (k % (out / kByteTile)) * kByteTile, dealt round robin to the blocks (block `block` of `num_blocks`, i.e.
// blockIdx.x of gridDim.x, takes tiles block, block + num_blocks, ...). live(g): whether group g is transposed (its
// tiles are skipped if not); group(g): its ByteTileGroup, asked for live groups only. By every thread of the block (two
// __syncthreads a tile), so live(g) must be block-uniform.
template <int kThreads, typename Live, typename Group>
__device__ __forceinline__ void transpose_byte_tiles(int num_groups,
                                                     int in,
                                                     int out,
                                                     unsigned block,
                                                     unsigned num_blocks,
                                                     const Live& live,
                                                     const Group& group,
                                                     ByteTile& tile) {
    const int tiles_out = out / kByteTile, per_group = (in / kByteTile) * tiles_out;
    const int64_t total = static_cast<int64_t>(num_groups) * per_group;
    for (int64_t w = block; w < total; w += num_blocks) {
        const int g = static_cast<int>(w / per_group), k = static_cast<int>(w % per_group);
        if (!live(g)) continue;  // block-uniform: no thread reaches the barriers
        const ByteTileGroup m = group(g);
        const int64_t r0 = static_cast<int64_t>(k / tiles_out) * kByteTile;
        const int64_t c0 = static_cast<int64_t>(k % tiles_out) * kByteTile;
        transpose_byte_tile<kThreads>(m.src, m.dst, in, out, r0, c0, tile);
    }
}

}  // namespace evenep::cuda::device
