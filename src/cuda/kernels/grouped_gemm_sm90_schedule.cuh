// src/cuda/kernels/grouped_gemm_sm90_schedule.cuh — the Hopper grouped GEMM's tile constants, workspace header
// and scheduler (prepare) kernel; included once, by grouped_gemm_sm90.cu (which holds the GEMM kernel and the host
// side). Split from that file to keep each under the size limit; nothing here is used elsewhere.
//
// Scheduling (prepare kernel, one block, before the GEMM on the same stream): units are laid out segment by
// segment (a segment = a group, or in wgrad one chunk of a group's rows). Forward / dgrad, kFixed: groups in index
// order, unit u to block u mod grid. Wgrad, kFixed: never split (deterministic), segments by decreasing unit cost,
// handed out by an atomic counter (longest first: the short groups fill the tail, so a skewed split of the rows
// no longer leaves the SMs that drew a hot group's tiles working alone at the end). kLoadAware: the cost model
// (gemm_cost_model.inc, calibrated by `evenep bench gemm --calibrate`) prices a unit as c_tile + c_kblock *
// k-blocks; in wgrad a group whose unit would cost more than kSplitFraction of the per-SM share of the total is split
// into chunks of whole k-blocks (only when its tiles are too few to occupy the SMs: the partial sums then meet in
// the gradient in an unspecified order); segments are ordered by decreasing unit cost and handed out by an atomic
// counter from the front (longest first, short ones fill the tail).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device/sm90.cuh"
#include "evenep/detail/gemm_cost.hpp"

namespace evenep::cuda::sm90 {
namespace {

#include "cuda/kernels/gemm_cost_model.inc"

// Wgrad, kLoadAware: a unit may cost at most this fraction of one SM's share of the whole GEMM before its group is
// split into row chunks. A policy, not calibrated: 0.25 splits only a group whose tiles are too few to keep the SMs
// busy (measured on the H200, `evenep bench gemm --ops wgrad`: equal to the unsplit hand-out on the planner's rows,
// where the 0.02 of the first release split every long group and paid a reduction per chunk).
constexpr float kSplitFraction = 0.25f;

constexpr int kBm = detail::kGemmTileRows, kBn = detail::kGemmTileCols, kBk = detail::kGemmKBlock;
constexpr int kThreads = 384;
constexpr int kModeFwd = 0, kModeDgr = 1, kModeWgr = 2;
constexpr uint32_t kABytes = kBm * kBk * 2;  // 16 KiB
constexpr uint32_t kBBytes = kBk * kBn * 2;  // 32 KiB
constexpr uint32_t kStageBytes = kABytes + kBBytes;
constexpr int kStagesMain = 4;  // forward / dgrad with fp32 output (stored straight from registers)
constexpr int kStagesBf16 = 3;  // forward / dgrad with bf16 output (room for the output staging buffer)
constexpr int kStagesWgr = 3;   // wgrad (leaves room for the reduction staging buffers)
constexpr int kStageRow = 72;   // staging row stride in floats (64 + 8: 288 B, 16-B aligned, fewer bank conflicts)
constexpr uint32_t kStagingBytes = 2 /*WG*/ * 2 /*double buffer*/ * 64 * kStageRow * 4;
constexpr int kMaxSplit = 16;  // wgrad chunks per group at most

constexpr int kOutRow = 256 + 8;  // bf16 output staging row stride in elements (528 B: conflict-free 4-B writes)
constexpr uint32_t kOutStagingBytes = 2 /*WG*/ * 64 * kOutRow * 2;
constexpr int stages_of(int mode, bool out_f32) {
    return mode == kModeWgr ? kStagesWgr : out_f32 ? kStagesMain : kStagesBf16;
}
constexpr uint32_t staging_of(int mode, bool out_f32) {
    return mode == kModeWgr ? kStagingBytes : out_f32 ? 0 : kOutStagingBytes;
}
constexpr size_t smem_bytes(int mode, bool out_f32) {
    return 1024 /*alignment slack*/ + static_cast<size_t>(stages_of(mode, out_f32)) * kStageBytes +
           staging_of(mode, out_f32) + 256 /*barriers*/;
}

// Workspace: [0, 256 G) tensor maps (A_g at 2g, B_g at 2g+1, 128 B each); then the header and segments.
struct Header {
    unsigned long long counter;  // dynamic hand-out: units claimed so far
    int32_t total;               // units
    int32_t nseg;                // segments
};
struct Segment {
    int32_t group;
    int32_t row_begin;  // wgrad: first row of the chunk, relative to the group
    int32_t row_end;    // wgrad: one past the last row of the chunk (relative)
    int32_t units;
};
__host__ __device__ inline size_t maps_bytes(int G) { return static_cast<size_t>(G) * 2 * 128; }
__host__ __device__ inline size_t max_segments(int G) { return static_cast<size_t>(G) * kMaxSplit; }

__host__ __device__ inline const Header* header_of(const uint8_t* ws, int G) {
    return reinterpret_cast<const Header*>(ws + static_cast<size_t>(G) * 2 * 128);
}


// ---------------------------------------------------------------------------------------------------------------
// Prepare kernel: per-group tensor maps, then the segment list in schedule order with its unit prefix.
// ---------------------------------------------------------------------------------------------------------------
struct PrepareParams {
    const int32_t* cu;
    const void* const* ptrs;  // weights (fwd/dgrad) or gradients (wgrad); null = skipped group
    const uint16_t* a_base;   // x (fwd, wgrad) or dY (dgrad)
    const uint16_t* b_rows;   // wgrad: dY (B rows follow the group); else null (B = ptrs[g])
    int64_t lda, ldb;         // elements per row of a_base / b_rows
    int G;
    int mode;
    int n_tiles;   // output column tiles (of kBn)
    int m_tiles;   // wgrad: gradient row tiles (of kBm)
    int k_blocks;  // fwd/dgrad: k-blocks per unit
    int order_by_cost;  // segments by decreasing unit cost (else index order)
    int split;          // wgrad: split long groups into row chunks (kSplitFraction)
    int grid;
    int32_t* error_word;  // see gemm_error_word
    int accumulate;       // wgrad: 0 = overwrite (never split)
};

__global__ void __launch_bounds__(1024) prepare_kernel(const __grid_constant__ CUtensorMap tmpl_a,
                                                       const __grid_constant__ CUtensorMap tmpl_b,
                                                       PrepareParams p,
                                                       uint8_t* __restrict__ ws) {
#if defined(EVENEP_SM90_ENABLED)
        __shared__ float s_total;
        if (threadIdx.x == 0) {
            s_total = 0.f;
            *p.error_word = 0;
        }
        __syncthreads();
        const int G = p.G;
        auto rows_of = [&](int g) {  // 0: empty, null or rejected (not 16-byte aligned: TMA needs it)
            const int r = p.cu[g] - (g == 0 ? 0 : p.cu[g - 1]);
            return r > 0 && p.ptrs[g] != nullptr && (reinterpret_cast<uintptr_t>(p.ptrs[g]) & 15u) == 0 ? r : 0;
        };
        // Unit cost of group g before splitting (µs, the calibrated model) and its chunk count.
        auto kblocks_of = [&](int g) { return detail::gemm_group_k_blocks(p.mode == kModeWgr, rows_of(g), p.k_blocks); };
        const float c_tile = p.mode == kModeWgr ? kCostTileWgradUs : kCostTileUs;
        const float c_kb = p.mode == kModeWgr ? kCostKBlockWgradUs : kCostKBlockUs;

        // 1. tensor maps and the total modelled cost.
        float local = 0.f;
        for (int g = threadIdx.x; g < G; g += blockDim.x) {
            const int r = rows_of(g);
            const int begin = g == 0 ? 0 : p.cu[g - 1];
            const int r_all = p.cu[g] - begin;
            if (r_all > 0 && p.ptrs[g] != nullptr && r == 0) atomicMax(p.error_word, G - g);
            uint4* ma = reinterpret_cast<uint4*>(ws + static_cast<size_t>(2 * g) * 128);
            uint4* mb = ma + 8;
            const uint4* ta = reinterpret_cast<const uint4*>(&tmpl_a);
            const uint4* tb = reinterpret_cast<const uint4*>(&tmpl_b);
            for (int i = 0; i < 8; ++i) {
                ma[i] = ta[i];
                mb[i] = tb[i];
            }
            if (r > 0) {
                tensormap_set_address(ma, p.a_base + static_cast<int64_t>(begin) * p.lda);
                tensormap_set_rows(ma, r);
                if (p.mode == kModeWgr) {
                    tensormap_set_address(mb, p.b_rows + static_cast<int64_t>(begin) * p.ldb);
                    tensormap_set_rows(mb, r);
                } else {
                    tensormap_set_address(mb, p.ptrs[g]);
                }
                const int units = detail::gemm_group_units(p.mode == kModeWgr, r, p.m_tiles, p.n_tiles);
                local += detail::gemm_group_cost_us(units, kblocks_of(g), c_tile, c_kb);
            }
        }
        tensormap_release();
        atomicAdd(&s_total, local);
        __syncthreads();

        // 2. chunks per group (wgrad, load-aware): cap a unit at kSplitFraction of one SM's share of the work.
        const float target = kSplitFraction * s_total / static_cast<float>(p.grid);
        auto chunks_of = [&](int g) {
            const int kb = kblocks_of(g);
            if (p.mode != kModeWgr || !p.split || !p.accumulate || kb <= 1) return 1;
            const float budget = fmaxf(target - c_tile, c_kb * 4.f);
            int c = static_cast<int>(ceilf(c_kb * kb / budget));
            c = c < 1 ? 1 : c;
            c = c > kMaxSplit ? kMaxSplit : c;
            return c > kb ? kb : c;
        };
        // Cost of one unit of group g after splitting: the sort key.
        auto unit_cost = [&](int g) {
            const int r = rows_of(g);
            if (r == 0) return -1.f;
            const int c = chunks_of(g);
            const int kb = (kblocks_of(g) + c - 1) / c;
            return p.mode == kModeWgr ? detail::gemm_unit_cost_us(kb, c_tile, c_kb)
                                      : static_cast<float>(r);  // fwd/dgrad: longest first
        };

        // 3. order: kFixed by index; kLoadAware by decreasing unit cost, ties by index (stable rank sort).
        int32_t* order = reinterpret_cast<int32_t*>(const_cast<Header*>(header_of(ws, G)) + 1);  // [G] scratch
        Segment* segs = reinterpret_cast<Segment*>(order + G + (G & 1));
        int32_t* prefix = reinterpret_cast<int32_t*>(segs + max_segments(G));
        for (int g = threadIdx.x; g < G; g += blockDim.x) {
            int pos = g;
            if (p.order_by_cost) {
                const float cg = unit_cost(g);
                pos = 0;
                for (int h = 0; h < G; ++h) {
                    const float ch = unit_cost(h);
                    pos += (ch > cg) || (ch == cg && h < g);
                }
            }
            order[pos] = g;
        }
        __syncthreads();

        // 4. segments and the unit prefix (one thread; G is small).
        if (threadIdx.x == 0) {
            int nseg = 0, total = 0;
            for (int i = 0; i < G; ++i) {
                const int g = order[i];
                const int r = rows_of(g);
                if (r == 0) continue;
                const int c = chunks_of(g);
                const int kb_per = (kblocks_of(g) + c - 1) / c;
                const int units = detail::gemm_group_units(p.mode == kModeWgr, r, p.m_tiles, p.n_tiles);
                for (int j = 0; j < c; ++j) {
                    const int rb = p.mode == kModeWgr ? j * kb_per * kBk : 0;
                    if (rb >= r) break;
                    const int re = p.mode == kModeWgr ? min(r, (j + 1) * kb_per * kBk) : r;
                    segs[nseg] = Segment{g, rb, re, units};
                    prefix[nseg] = total;
                    total += units;
                    ++nseg;
                }
            }
            prefix[nseg] = total;
            Header* h = const_cast<Header*>(header_of(ws, G));
            h->counter = 0;
            h->total = total;
            h->nseg = nseg;
        }
#endif
}

}  // namespace
}  // namespace evenep::cuda::sm90
