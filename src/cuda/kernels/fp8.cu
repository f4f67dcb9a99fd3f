// FP8 cast kernels (launchers declared in evenep/cuda/fp8_cast.hpp). Rows: warps in grid-strided steps, a half warp
// per 1 x 128 block (device/fp8_vec.cuh). Weights: one thread block per 128 x 128 block, amax by warp shuffles then
// shared memory. Wgrad cols: a thread block per (128-row block of a group, 64 channels), through shared memory. Every
// element is quantised bit for bit as the shared host/device functions of evenep/detail/fp8.hpp do it — the CPU
// oracle's bytes.
#include <cuda_runtime.h>

#include "cuda/device/fp8_vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/fp8_cast.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowThreads = 256;     // 8 warps, each casting 2 kRowUnroll blocks a step
constexpr int kRowUnroll = 4;        // 16-byte vectors a lane loads before casting them
constexpr int kWeightThreads = 256;  // 64 elements per thread of a 128 x 128 block (8 loads of 16 bytes)
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
    const uint16_t* in;
    uint8_t* codes;
    float* scales;
    uint32_t* nonfinite;
    int64_t nvec;  // 16-byte vectors of `in` (16 a 1 x 128 block)
    bool ue8m0;
};

// The flat [rows, dim] array (blocks of a row are contiguous, so the flat block index is also the scale index) in
// warp steps of kRowUnroll 16-byte vectors a lane (device::cast_rows_step), grid-strided.
__global__ void __launch_bounds__(kRowThreads) fp8_cast_rows_kernel(RowCastParams p) {
    constexpr int kStep = kWarp * kRowUnroll;
    const int lane = static_cast<int>(threadIdx.x) % kWarp;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * (kRowThreads / kWarp) + threadIdx.x / kWarp;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / kWarp);
    bool finite = true;
    for (int64_t v0 = warp * kStep; v0 < p.nvec; v0 += warps * kStep)
        finite = device::cast_rows_step<kRowUnroll>(p.in, v0, p.nvec, p.ue8m0, p.codes, p.scales, lane) && finite;
    if (!finite && lane == 0 && p.nonfinite != nullptr) atomicExch(p.nonfinite, 1u);
}

// Block b of launch_fp8_cast_weights: matrix b / tiles, 128 x 128 block b % tiles at (bi, bo) = (t / nob, t % nob).
// Thread t loads 8 vectors of 8 bf16 (16 bytes; vector v = t + 256 k is row v / 16, columns 8 (v % 16) ..), so a warp
// reads two whole 256-byte row segments; it stores its 8 codes of each vector as 8 bytes. With `transposed`, the
// block's codes go through shared memory and each thread writes 32 bytes of two transposed rows (a column of the block:
// 32 consecutive input rows).
constexpr int kVec = 8;                                                     // bf16 per 16-byte load
constexpr int kWeightVecs = kFp8Block * kFp8Block / kVec / kWeightThreads;  // 8 per thread
constexpr int kTChunk = 32;                 // transposed bytes per store (two 16-byte words)
constexpr int kTilePitch = kFp8Block + 16;  // smem row pitch (bytes), 16-byte aligned

__global__ void __launch_bounds__(kWeightThreads) fp8_cast_weights_kernel(Fp8WeightCast p) {
    __shared__ float smem[kWeightThreads / kWarp];
    __shared__ __align__(16) uint8_t tile[kFp8Block][kTilePitch];
    const int nob = p.out / kFp8Block;
    const int tiles = (p.in / kFp8Block) * nob;
    const int m = static_cast<int>(blockIdx.x) / tiles, k = static_cast<int>(blockIdx.x) % tiles;
    const int bi = k / nob, bo = k % nob;
    const Bf16* w = p.w + m * p.w_stride;
    const int64_t base = static_cast<int64_t>(bi) * kFp8Block * p.out + static_cast<int64_t>(bo) * kFp8Block;
    const int t = threadIdx.x;
    uint4 raw[kWeightVecs];
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < kWeightVecs; ++j) {
        const int v = t + j * kWeightThreads, row = v / (kFp8Block / kVec), col = kVec * (v % (kFp8Block / kVec));
        raw[j] = *reinterpret_cast<const uint4*>(w + base + static_cast<int64_t>(row) * p.out + col);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const Bf16 x = device::bf16x8_lane(raw[j], i);
            finite = finite && bf16_is_finite(x);
            const float a = bf16_abs(x);
            amax = a > amax ? a : amax;
        }
    }
    if (!finite && p.nonfinite != nullptr) atomicExch(p.nonfinite, 1u);
    amax = block_amax<kWeightThreads>(amax, t / kWarp, t % kWarp, smem);
    const float s = fp8_block_scale(amax, p.ue8m0);
    Fp8E4m3* codes = p.codes + m * p.codes_stride;
#pragma unroll
    for (int j = 0; j < kWeightVecs; ++j) {
        const int v = t + j * kWeightThreads, row = v / (kFp8Block / kVec), col = kVec * (v % (kFp8Block / kVec));
        const uint2 q = device::quantize_bf16x8_with(raw[j], s);
        *reinterpret_cast<uint2*>(codes + base + static_cast<int64_t>(row) * p.out + col) = q;
        if (p.transposed != nullptr) *reinterpret_cast<uint2*>(&tile[row][col]) = q;
    }
    if (t == 0) p.scales[m * p.scale_stride + k] = s;
    if (p.transposed == nullptr) return;  // block-uniform
    __syncthreads();
    // Transposed row (bo*128 + c), columns bi*128 + r0 .. r0 + 31 = tile[r0 .. r0 + 31][c]; chunk u = t + 256 j is
    // (c, r0) = (u % 128, 32 (u / 128)): a warp reads 32 consecutive bytes of each tile row (no bank conflict).
    Fp8E4m3* tr = p.transposed + m * p.codes_stride;
#pragma unroll
    for (int j = 0; j < kFp8Block * (kFp8Block / kTChunk) / kWeightThreads; ++j) {
        const int u = t + j * kWeightThreads, c = u % kFp8Block, r0 = kTChunk * (u / kFp8Block);
        uint32_t word[kTChunk / 4];
#pragma unroll
        for (int i = 0; i < kTChunk / 4; ++i)
            word[i] = static_cast<uint32_t>(tile[r0 + 4 * i][c]) | static_cast<uint32_t>(tile[r0 + 4 * i + 1][c]) << 8 |
                      static_cast<uint32_t>(tile[r0 + 4 * i + 2][c]) << 16 |
                      static_cast<uint32_t>(tile[r0 + 4 * i + 3][c]) << 24;
        auto* d = reinterpret_cast<uint4*>(tr + static_cast<int64_t>(bo * kFp8Block + c) * p.in + bi * kFp8Block + r0);
        d[0] = make_uint4(word[0], word[1], word[2], word[3]);
        d[1] = make_uint4(word[4], word[5], word[6], word[7]);
    }
}

// launch_fp8_cast_cols: a job is one 128-row block of one group and kColsChannels channels (scale row sr, channel
// tile); jobs are grid-strided over (fp8_cols_scale_rows, dim / kColsChannels), a scale row of no block is skipped.
// The rows go through shared memory: loaded as 16-byte vectors along the channels, reduced per channel (4 threads
// of 32 rows each), written along the rows (16 codes a thread, a warp writing 4 channels' 128 bytes each).
constexpr int kColsThreads = 256;
constexpr int kColsChannels = 64;
constexpr int kColsPitch = kColsChannels + 8;  // bf16 per shared row (16 bytes of padding)

// The group whose blocks hold scale row sr (the largest g with fp8_cols_block(begin_g, g) <= sr: those starts grow
// strictly with g), or -1.
__device__ int cols_group_of(const int32_t* cu, int G, int64_t sr) {
    int lo = 0, hi = G - 1, g = -1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (fp8_cols_block(mid == 0 ? 0 : cu[mid - 1], mid) <= sr) {
            g = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return g;
}

__global__ void __launch_bounds__(kColsThreads) fp8_cast_cols_kernel(Fp8ColsCast p) {
    __shared__ __align__(16) uint16_t tile[kFp8Block][kColsPitch];
    __shared__ float part[kColsThreads / kColsChannels][kColsChannels];
    __shared__ float scale[kColsChannels];
    const int t = static_cast<int>(threadIdx.x);
    const int G = p.num_groups, dim = p.dim, ctiles = dim / kColsChannels;
    const int64_t ld = fp8_cols_ld(p.capacity), jobs = fp8_cols_scale_rows(p.capacity, G) * ctiles;
    const auto* in = reinterpret_cast<const uint16_t*>(p.in);
    auto* codes = reinterpret_cast<uint8_t*>(p.codes);
    bool finite = true;
    for (int64_t job = blockIdx.x; job < jobs; job += gridDim.x) {
        const int64_t sr = job / ctiles;
        const int c0 = static_cast<int>(job % ctiles) * kColsChannels;
        const int g = cols_group_of(p.cu_seqlens, G, sr);
        if (g < 0) continue;  // block-uniform
        const int64_t begin = g == 0 ? 0 : p.cu_seqlens[g - 1], end = p.cu_seqlens[g];
        const int64_t r0 = begin + (sr - fp8_cols_block(begin, g)) * kFp8Block;
        if (r0 >= end) continue;
        const int n = end - r0 < kFp8Block ? static_cast<int>(end - r0) : kFp8Block;
        // Load: vector v = t + kColsThreads i is (row v / 8, channels 8 (v % 8) ...); rows past n are zeros.
#pragma unroll
        for (int i = 0; i < kFp8Block * kColsChannels / device::kBf16PerVec / kColsThreads; ++i) {
            const int v = t + i * kColsThreads, row = v / (kColsChannels / device::kBf16PerVec),
                      cv = device::kBf16PerVec * (v % (kColsChannels / device::kBf16PerVec));
            uint4 x = make_uint4(0, 0, 0, 0);
            if (row < n) {
                x = __ldg(reinterpret_cast<const uint4*>(in + (r0 + row) * dim + c0 + cv));
                finite = finite && device::first_nonfinite_bf16x8(x) < 0;
            }
            *reinterpret_cast<uint4*>(&tile[row][cv]) = x;
        }
        __syncthreads();
        {  // amax per channel: thread t reduces 32 rows of channel t % 64
            const int ch = t % kColsChannels, q = t / kColsChannels;
            float a = 0.0f;
            for (int r = q * (kFp8Block / 4); r < (q + 1) * (kFp8Block / 4); ++r) {
                const float v = bf16_abs(Bf16{tile[r][ch]});
                a = v > a ? v : a;
            }
            part[q][ch] = a;
        }
        __syncthreads();
        if (t < kColsChannels) {
            float a = part[0][t];
            for (int q = 1; q < kColsThreads / kColsChannels; ++q) a = part[q][t] > a ? part[q][t] : a;
            const float s = fp8_block_scale(a, p.ue8m0);
            scale[t] = s;
            p.scales[sr * dim + c0 + t] = s;
        }
        __syncthreads();
        // Store: chunk u = t + kColsThreads i is channel u / 8, rows 16 (u % 8) .. + 15.
#pragma unroll
        for (int i = 0; i < kColsChannels * (kFp8Block / 16) / kColsThreads; ++i) {
            const int u = t + i * kColsThreads, ch = u / (kFp8Block / 16), k = 16 * (u % (kFp8Block / 16));
            if (k >= n) continue;
            const float s = scale[ch];
            uint32_t w[4];
#pragma unroll
            for (int m = 0; m < 16; m += 2)
                reinterpret_cast<uint16_t*>(w)[m / 2] =
                    static_cast<uint16_t>(device::e4m3x2(__fdiv_rn(bf16_to_float(Bf16{tile[k + m][ch]}), s),
                                                         __fdiv_rn(bf16_to_float(Bf16{tile[k + m + 1][ch]}), s)));
            uint8_t* dst = codes + static_cast<int64_t>(c0 + ch) * ld + r0 + k;
            if (k + 16 <= n && (reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
                *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
            } else {
                const auto* b = reinterpret_cast<const uint8_t*>(w);
                for (int m = 0; m < 16 && k + m < n; ++m) dst[m] = b[m];
            }
        }
        __syncthreads();  // the tile and the scales are rewritten by the next job
    }
    if (!finite && p.nonfinite != nullptr) atomicExch(p.nonfinite, 1u);
    // The code columns past the groups' rows: 0.
    const int64_t rows = G == 0 ? 0 : p.cu_seqlens[G - 1], tail = ld - rows;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kColsThreads + t; i < tail * dim;
         i += static_cast<int64_t>(gridDim.x) * kColsThreads)
        codes[(i / tail) * ld + rows + i % tail] = 0;
}

}  // namespace

void launch_fp8_cast_cols(const Fp8ColsCast& c, cudaStream_t stream) {
    EVENEP_CHECK(c.dim >= kFp8Block && c.dim % kFp8Block == 0, "fp8 cols cast: dim = ", c.dim,
                 " must be a positive multiple of ", kFp8Block);
    EVENEP_CHECK(c.num_groups >= 1, "fp8 cols cast: num_groups = ", c.num_groups, " must be >= 1");
    EVENEP_CHECK(c.capacity >= 0, "fp8 cols cast: capacity = ", c.capacity, " must be >= 0");
    EVENEP_CHECK(c.in != nullptr && c.cu_seqlens != nullptr && c.codes != nullptr && c.scales != nullptr,
                 "fp8 cols cast: null buffer");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(c.in) % 16 == 0 && reinterpret_cast<uintptr_t>(c.codes) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(c.scales) % 4 == 0,
                 "fp8 cols cast: in and codes must be 16-byte aligned, scales 4-byte aligned");
    const int64_t jobs = fp8_cols_scale_rows(c.capacity, c.num_groups) * (c.dim / kColsChannels);
    const std::pair<int, int> occ = co_resident_capacity(fp8_cast_cols_kernel, kColsThreads, 0);
    const int grid = static_cast<int>(std::min<int64_t>(jobs, static_cast<int64_t>(occ.first) * occ.second));
    launch_clustered(fp8_cast_cols_kernel, grid, 1, kColsThreads, 0, stream, false, c);
}

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
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(scales) % 4 == 0,
                 "fp8 cast: in must be 16-byte aligned, codes 8-byte and scales 4-byte aligned");
    const std::pair<int, int> occ = co_resident_capacity(fp8_cast_rows_kernel, kRowThreads, 0);
    const int64_t capacity = static_cast<int64_t>(occ.first) * occ.second;
    const int64_t nvec = blocks * device::kFp8LanesPerBlock,
                  steps = (nvec + kWarp * kRowUnroll - 1) / (kWarp * kRowUnroll);
    const int grid =
        static_cast<int>(std::min<int64_t>((steps + kRowThreads / kWarp - 1) / (kRowThreads / kWarp), capacity));
    launch_clustered(fp8_cast_rows_kernel, grid, 1, kRowThreads, 0, stream, false,
                     RowCastParams{reinterpret_cast<const uint16_t*>(in), reinterpret_cast<uint8_t*>(codes), scales,
                                   nonfinite, nvec, ue8m0});
}

void launch_fp8_cast_weight(const Bf16* w,
                            int in,
                            int out,
                            bool ue8m0,
                            Fp8E4m3* codes,
                            float* scales,
                            uint32_t* nonfinite,
                            cudaStream_t stream) {
    Fp8WeightCast c;
    c.w = w, c.in = in, c.out = out, c.ue8m0 = ue8m0, c.codes = codes, c.scales = scales, c.nonfinite = nonfinite;
    launch_fp8_cast_weights(c, stream);
}

void launch_fp8_cast_weights(const Fp8WeightCast& c, cudaStream_t stream) {
    EVENEP_CHECK(c.in >= kFp8Block && c.in % kFp8Block == 0 && c.out >= kFp8Block && c.out % kFp8Block == 0,
                 "fp8 weight cast: dims ", c.in, " x ", c.out, " must be positive multiples of ", kFp8Block);
    EVENEP_CHECK(c.count >= 0, "fp8 weight cast: count = ", c.count, " must be >= 0");
    if (c.count == 0) return;
    EVENEP_CHECK(c.w != nullptr && c.codes != nullptr && c.scales != nullptr, "fp8 weight cast: null buffer");
    const int64_t tiles = static_cast<int64_t>(c.in / kFp8Block) * (c.out / kFp8Block);
    const int64_t elems = static_cast<int64_t>(c.in) * c.out;
    EVENEP_CHECK(c.count == 1 || (c.w_stride >= elems && c.codes_stride >= elems && c.scale_stride >= tiles &&
                                  c.w_stride % kVec == 0 && c.codes_stride % 16 == 0),
                 "fp8 weight cast: strides (weights ", c.w_stride, ", codes ", c.codes_stride, ", scales ",
                 c.scale_stride, ") must hold one ", c.in, " x ", c.out, " matrix each, 16-byte aligned");
    EVENEP_CHECK(tiles * c.count <= INT32_MAX, "fp8 weight cast: ", tiles * c.count, " blocks exceed one grid");
    launch_clustered(fp8_cast_weights_kernel, static_cast<int>(tiles * c.count), 1, kWeightThreads, 0, stream, false,
                     c);
}

}  // namespace evenep::cuda
