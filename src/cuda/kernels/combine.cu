// combine (SPEC §4.2): out[t] = sum over the token's entries of y[row] (times the route weight with apply_weights),
// in fp32, rounded to bf16 once. The summation order is fixed and identical in both modes and in the CPU oracle:
//
//   for each destination rank d of the token, in the order of its first entry (k ascending):
//       partial_d = ((0 + term_k1) + term_k2) + ...   over the token's entries on d, k ascending
//   acc = ((0 + partial_d1) + partial_d2) + ...;  out = bf16_rne(acc)
//   term_k = apply_weights ? w_k * y_k : y_k            (fp32, round-to-nearest, never fused)
//
// kPull          one pass on the source, a warp per token: reads each entry's row through the peer pointer.
// kPushPartials  destination: a warp per chain head row; a single-entry chain sends its bf16 row unchanged, a
//                longer one its fp32 partial (no bf16 rounding), into the source's staging units at the head's
//                return address (evenep/detail/buffer_layout.hpp); team barrier (kCombinePartial); source: a warp
//                per token adds its partials (a bf16 one times the entry's weight with apply_weights). Every
//                (token, destination rank) crosses the link once. Identical to the CPU oracle's combine.
// The two modes give the same bits: 0 + term equals term except for -0, and acc, which starts at +0, is never -0,
// so acc + (0 + term) == acc + term.
// bf16 partials (EpLayout::bf16_partials, DataPrecision::bf16_partials; upstream MoonEP's format): the partial of a
// chain of >= 2 entries is rounded to bf16 before it is added (pull: in registers; push: it crosses as a bf16 row in
// the first of its two staging units, half the bytes) — one more rounding, as the CPU oracle's combine.
// Both first pass a team barrier (kCombineReady: every rank's expert output is final) and, with out_w set,
// gather recv_w of every entry back to [s, K] (0 for masked entries).
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/device/data_path.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"

namespace evenep::cuda {
namespace {

using device::DataParams;
using device::kBf16PerVec;
using device::kWarpSize;

inline constexpr int kCombineThreads = 256;
inline constexpr int kCombineUnroll = 4;  // 16-byte vectors per lane per chunk

// The fp32 partial-sum step of the contract above, the only one of both modes: part[u][i] += term of one bf16 row
// (times w with apply_weights; round-to-nearest, never fused) on vectors v0 + u*32 + lane. Lanes past num_vec add 0
// (their sums are never stored).
template <int kUnroll>
__device__ __forceinline__ void add_row_terms(
    float (&part)[kUnroll][8], const uint16_t* yrow, float w, int num_vec, int v0, int lane, bool apply_weights) {
    uint4 buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * kWarpSize + lane;
        buf[u] = v < num_vec ? device::ld_v4(yrow + static_cast<int64_t>(v) * kBf16PerVec) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        float f[8];
        device::unpack_bf16x8(buf[u], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) part[u][i] = __fadd_rn(part[u][i], apply_weights ? __fmul_rn(w, f[i]) : f[i]);
    }
}

template <int kUnroll>
__device__ __forceinline__ void zero(float (&v)[kUnroll][8]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[u][i] = 0.0f;
}

// acc[u][i] += (0 + sum of the chain's terms), for the lanes of `chain` (ascending), vectors v0 + u*32 + lane;
// row: each live lane's receive row (device::recv_rows). bf16_partials: a chain of >= 2 entries adds its partial
// rounded to bf16.
template <int kUnroll>
__device__ __forceinline__ void add_chain(float (&acc)[kUnroll][8],
                                          unsigned chain,
                                          const uint16_t* row,
                                          float w,
                                          int num_vec,
                                          int v0,
                                          int lane,
                                          bool apply_weights,
                                          bool bf16_partials) {
    float part[kUnroll][8];
    zero(part);
    for (unsigned m = chain; m; m &= m - 1) {
        const int l = __ffs(m) - 1;
        add_row_terms(part, device::shfl_ptr(row, l), __shfl_sync(0xffffffffu, w, l), num_vec, v0, lane, apply_weights);
    }
    const bool round = bf16_partials && (chain & (chain - 1)) != 0;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[u][i] = __fadd_rn(acc[u][i], round ? round_to_bf16(part[u][i]) : part[u][i]);
}

template <int kUnroll>
__device__ __forceinline__ void store_out(
    uint16_t* orow, const float (&acc)[kUnroll][8], int v0, int lane, int num_vec) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * kWarpSize + lane;
        if (v < num_vec) device::st_v4(orow + static_cast<int64_t>(v) * kBf16PerVec, device::pack_bf16x8(acc[u]));
    }
}

__device__ __forceinline__ void gather_weights(
    const device::TokenEntries& te, char* const* peers, const EpLayout& L, float* out_w, int K, int lane) {
    if (out_w != nullptr && lane < K)
        out_w[lane] = te.live ? EpLayout::at<float>(peers[te.drank], L.recv_w())[te.row] : 0.0f;
}

// What both combine kernels start from: the rank's shape, the calling warp among the rank's warps, the team's bases.
struct CombineCtx {
    int K, H, num_vec;
    int lane, warp, num_warps;  // lane of the thread; warp among the num_warps warps serving the rank
    char* const* peers;
    char* base;  // this rank's symmetric allocation
    bool apply;  // multiply rows by their route weights
    bool bf16_partials;
};

template <int kThreads>
__device__ __forceinline__ CombineCtx combine_ctx(const DataParams& p, const device::RankCtx& c) {
    constexpr int kWarps = kThreads / kWarpSize;
    CombineCtx x;
    x.K = p.lay.K, x.H = p.lay.H, x.num_vec = p.lay.H / kBf16PerVec;
    x.lane = threadIdx.x % kWarpSize;
    x.warp = c.block * kWarps + static_cast<int>(threadIdx.x) / kWarpSize, x.num_warps = c.num_blocks * kWarps;
    x.peers = p.team.peers, x.base = p.team.peers[c.rank];
    x.apply = p.apply_weights != 0;
    x.bf16_partials = p.lay.bf16_partials;
    return x;
}

template <int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) combine_pull_kernel(const DataParams p) {
    const device::RankCtx c = device::rank_ctx(p.team, p.blocks_per_rank);
    if (!device::barrier(p.team, c, Phase::kCombineReady, true)) return;
    const EpLayout& L = p.lay;
    const CombineCtx x = combine_ctx<kThreads>(p, c);
    const int K = x.K, H = x.H, num_vec = x.num_vec, lane = x.lane, gw = x.warp, num_warps = x.num_warps;
    char* const* peers = x.peers;
    const bool apply = x.apply;
    const int s = p.s[c.rank];
    const RankIo io = p.io[c.rank];
    const int32_t* dst = EpLayout::at<int32_t>(x.base, L.dst);
    for (int t = gw; t < s; t += num_warps) {
        const device::TokenEntries te = device::load_token_entries(dst + static_cast<int64_t>(t) * K, K, L.nvs, lane);
        const float w = lane < K ? io.topk_w[static_cast<int64_t>(t) * K + lane] : 0.0f;
        gather_weights(te, peers, L, io.out_w ? io.out_w + static_cast<int64_t>(t) * K : nullptr, K, lane);
        uint16_t* orow = io.out + static_cast<int64_t>(t) * H;
        const uint16_t* row = te.live ? device::recv_rows(p, te.drank) + static_cast<int64_t>(te.row) * H : nullptr;
        for (int v0 = 0; v0 < num_vec; v0 += kWarpSize * kUnroll) {
            float acc[kUnroll][8];
            zero(acc);
            for (unsigned m = te.payloads; m; m &= m - 1) {
                const unsigned chain = __shfl_sync(0xffffffffu, te.same, __ffs(m) - 1);
                add_chain<kUnroll>(acc, chain, row, w, num_vec, v0, lane, apply, x.bf16_partials);
            }
            store_out<kUnroll>(orow, acc, v0, lane, num_vec);
        }
    }
}

template <int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) combine_push_kernel(const DataParams p) {
    const device::RankCtx c = device::rank_ctx(p.team, p.blocks_per_rank);
    if (!device::barrier(p.team, c, Phase::kCombineReady, true)) return;
    const EpLayout& L = p.lay;
    const CombineCtx x = combine_ctx<kThreads>(p, c);
    const int K = x.K, H = x.H, num_vec = x.num_vec, lane = x.lane, gw = x.warp, num_warps = x.num_warps;
    char* const* peers = x.peers;
    char* base = x.base;
    const bool apply = x.apply;
    const int64_t unit_bytes = L.buf.stage_unit_bytes(), units_per_rank = L.buf.stage_units();

    // ---- Destination: one partial per chain head, into the source's staging units. ----
    const uint16_t* y = device::recv_rows(p, c.rank);
    const float* recv_w = EpLayout::at<float>(base, L.recv_w());
    const int32_t* next = EpLayout::at<int32_t>(base, L.recv_next());
    const int32_t* ret = EpLayout::at<int32_t>(base, L.recv_ret());
    device::for_each_entry_row(L, base, c.rank, gw, num_warps, [&](int32_t row) {
        const int32_t r = ret[row];
        if (r < 0) return;  // duplicate rows are summed by their chain head
        char* slot = EpLayout::at<char>(peers[detail::ret_rank(r, units_per_rank)], L.stage()) +
                     detail::ret_unit(r, units_per_rank) * unit_bytes;
        const uint16_t* yrow = y + static_cast<int64_t>(row) * H;
        if (next[row] == detail::kChainEnd) {  // one entry: its bf16 row, unchanged
            uint16_t* srow = reinterpret_cast<uint16_t*>(slot);
            for (int v = lane; v < num_vec; v += kWarpSize)
                device::st_v4(srow + static_cast<int64_t>(v) * kBf16PerVec,
                              device::ld_v4(yrow + static_cast<int64_t>(v) * kBf16PerVec));
            return;
        }
        float* prow = reinterpret_cast<float*>(slot);
        for (int v0 = 0; v0 < num_vec; v0 += kWarpSize * kUnroll) {
            float part[kUnroll][8];
            zero(part);
            for (int32_t n = row; n != detail::kChainEnd; n = next[n])
                add_row_terms(part, y + static_cast<int64_t>(n) * H, recv_w[n], num_vec, v0, lane, apply);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int v = v0 + u * kWarpSize + lane;
                if (v >= num_vec) continue;
                if (x.bf16_partials) {  // a bf16 row in the chain's first unit
                    device::st_v4(reinterpret_cast<uint16_t*>(slot) + static_cast<int64_t>(v) * kBf16PerVec,
                                  device::pack_bf16x8(part[u]));
                    continue;
                }
                float4* q = reinterpret_cast<float4*>(prow + static_cast<int64_t>(v) * kBf16PerVec);
                q[0] = make_float4(part[u][0], part[u][1], part[u][2], part[u][3]);
                q[1] = make_float4(part[u][4], part[u][5], part[u][6], part[u][7]);
            }
        }
    });

    if (!device::barrier(p.team, c, Phase::kCombinePartial, true)) return;

    // ---- Source: add the token's partials in the order of their destinations' first k. ----
    const int s = p.s[c.rank];
    const RankIo io = p.io[c.rank];
    const int32_t* dst = EpLayout::at<int32_t>(base, L.dst);
    const char* stage = EpLayout::at<char>(base, L.stage());
    for (int t = gw; t < s; t += num_warps) {
        const device::TokenEntries te = device::load_token_entries(dst + static_cast<int64_t>(t) * K, K, L.nvs, lane);
        const float w = lane < K ? io.topk_w[static_cast<int64_t>(t) * K + lane] : 0.0f;
        gather_weights(te, peers, L, io.out_w ? io.out_w + static_cast<int64_t>(t) * K : nullptr, K, lane);
        const unsigned multi = __ballot_sync(0xffffffffu, te.payload && __popc(te.same) >= 2);
        const char* tstage = stage + static_cast<int64_t>(t) * L.buf.units_per_token * unit_bytes;
        uint16_t* orow = io.out + static_cast<int64_t>(t) * H;
        for (int v0 = 0; v0 < num_vec; v0 += kWarpSize * kUnroll) {
            float acc[kUnroll][8];
            zero(acc);
            int unit = 0;
            for (unsigned m = te.payloads; m; m &= m - 1) {
                const int l = __ffs(m) - 1;
                const char* slot = tstage + unit * unit_bytes;
                if ((multi & (1u << l)) && x.bf16_partials) {  // a rounded partial: weights already applied
                    add_row_terms(acc, reinterpret_cast<const uint16_t*>(slot), 1.0f, num_vec, v0, lane, false);
                    unit += 2;
                } else if (multi & (1u << l)) {
                    const float* prow = reinterpret_cast<const float*>(slot);
#pragma unroll
                    for (int u = 0; u < kUnroll; ++u) {
                        const int v = v0 + u * kWarpSize + lane;
                        if (v >= num_vec) continue;
                        const float4* q = reinterpret_cast<const float4*>(prow + static_cast<int64_t>(v) * kBf16PerVec);
                        const float4 a = q[0], b = q[1];
                        const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[u][i] = __fadd_rn(acc[u][i], f[i]);
                    }
                    unit += 2;
                } else {  // a single entry's bf16 row: its term straight into acc
                    add_row_terms(acc, reinterpret_cast<const uint16_t*>(slot), __shfl_sync(0xffffffffu, w, l), num_vec,
                                  v0, lane, apply);
                    unit += 1;
                }
            }
            store_out<kUnroll>(orow, acc, v0, lane, num_vec);
        }
    }
}

}  // namespace

int launch_combine(const TeamView& team,
                   const EpLayout& layout,
                   const RankIo* d_io,
                   std::span<const int32_t> s,
                   bool apply_weights,
                   CombineMode mode,
                   int sm_budget,
                   cudaStream_t stream) {
    EVENEP_CHECK(static_cast<int>(s.size()) == layout.R, "combine: s has ", s.size(),
                 " values, expected R = ", layout.R);
    EVENEP_CHECK(layout.H % kBf16PerVec == 0, "combine: hidden size H = ", layout.H, " must be a multiple of 8");
    DataParams p{};
    p.team = team;
    p.lay = layout;
    p.io = d_io;
    p.apply_weights = apply_weights ? 1 : 0;
    for (int r = 0; r < layout.R; ++r) {
        EVENEP_CHECK(s[r] >= 1 && s[r] <= layout.S, "combine: rank ", r, ": s = ", s[r], " outside [1, S = ", layout.S,
                     "]");
        p.s[r] = s[r];
    }
    int nb = 0;
    if (mode == CombineMode::kPull) {
        auto kernel = combine_pull_kernel<kCombineThreads, kCombineUnroll>;
        nb = clamp_co_resident(kernel, kCombineThreads, 0, team.launch_ranks, sm_budget);
        p.blocks_per_rank = nb;
        launch_cooperative(kernel, team.launch_ranks * nb, kCombineThreads, 0, stream, p);
    } else {
        auto kernel = combine_push_kernel<kCombineThreads, kCombineUnroll>;
        nb = clamp_co_resident(kernel, kCombineThreads, 0, team.launch_ranks, sm_budget);
        p.blocks_per_rank = nb;
        launch_cooperative(kernel, team.launch_ranks * nb, kCombineThreads, 0, stream, p);
    }
    return nb;
}

}  // namespace evenep::cuda
