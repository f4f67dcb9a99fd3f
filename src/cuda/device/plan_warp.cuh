// Warp-level pieces of the block planner (plan_block.cuh): reductions with the sequential code's tie rule and
// one-warp versions of plan_candidates.hpp's greedy loops (path, the reference expert split; the global fill is in
// plan_fill.cuh) that keep their alloc matrix in sparse form (evenep/detail/plan_sparse.hpp: the home column and a
// list of pieces). Each builds exactly the matrix its plan_candidates.hpp counterpart builds (see plan_block.cuh).
#pragma once

#include <cstdint>

#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "evenep/detail/plan_candidates.hpp"
#include "evenep/detail/plan_sparse.hpp"

namespace evenep::cuda::device {

using detail::PlanArrays;
using detail::PlanCostValues;
using detail::PlanDims;

inline constexpr unsigned kFullMask = 0xffffffffu;
// Ranks per lane when a warp keeps per-rank values in registers (every team has R <= kMaxVirtualRanks).
inline constexpr int kMaxRanksPerLane = kMaxVirtualRanks / kWarpSize;

// ---------------------------------------------------------------------------------------------------------
// Warp reductions with the sequential code's tie rule (lowest index wins among equal keys), on redux.sync.
// NOTE: every quantity reduced here (balances, deficits, quotas, remaining entries, pieces, local counts) is bounded
// by the group's entry count N < 2^31 (Config::validate keeps R*NvS inside int32), so a 32-bit key orders it.
// ---------------------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned order_key(int64_t v) {
    return static_cast<unsigned>(static_cast<int32_t>(v)) ^ 0x80000000u;
}

// First index of the maximum (kMax) or minimum of x[0..n) (the sequential "if (x[r] > x[best]) best = r").
template <bool kMax, typename T>
__device__ __forceinline__ int warp_first_extreme(const T* x, int n, int lane) {
    T v = 0;
    int i = -1;
    for (int r = lane; r < n; r += kWarpSize) {
        const T xr = x[r];
        if (i < 0 || (kMax ? xr > v : xr < v)) v = xr, i = r;
    }
    const unsigned key = i < 0 ? 0u : (kMax ? order_key(v) : ~order_key(v));
    const unsigned best = __reduce_max_sync(kFullMask, key);
    return static_cast<int>(
        __reduce_min_sync(kFullMask, i >= 0 && key == best ? static_cast<unsigned>(i) : 0xffffffffu));
}

template <typename T>
__device__ __forceinline__ int warp_first_max(const T* x, int n, int lane) {
    return warp_first_extreme<true>(x, n, lane);
}

// Rank r's load (load_before): its epn experts' loads summed on one warp, every lane gets it (r warp-uniform). Each
// load and the sum are < N < 2^31 (the NOTE above), so one 32-bit redux adds them.
__device__ __forceinline__ int64_t warp_rank_load(const int64_t* expert_load, int r, int epn, int lane) {
    unsigned l = 0;
    for (int g = lane; g < epn; g += kWarpSize) l += static_cast<unsigned>(expert_load[r * epn + g]);
    return static_cast<int64_t>(__reduce_add_sync(kFullMask, l));
}

// Per-rank values kept in a warp's registers: lane holds rank lane + 32 k in v[k] (every warp of a block may hold the
// same copy). regs_first_max: the first rank with the largest value, rank `skip` left out (-1: none), its value in
// `value` (INT_MIN and -1 when no rank is left). regs_get: rank r's value on every lane (r warp-uniform).
template <int kN>
__device__ __forceinline__ int regs_first_max(const int32_t (&v)[kN], int R, int lane, int skip, int32_t& value) {
    const int RK = (R + kWarpSize - 1) / kWarpSize;
    unsigned dk = 0;
    int di = -1;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
        if (k >= RK) break;
        const int r = lane + kWarpSize * k;
        const unsigned key = order_key(v[k]);
        if (r < R && r != skip && (di < 0 || key > dk)) dk = key, di = r;
    }
    const unsigned dmax = __reduce_max_sync(kFullMask, di >= 0 ? dk : 0u);
    value = static_cast<int32_t>(dmax ^ 0x80000000u);
    return static_cast<int>(
        __reduce_min_sync(kFullMask, di >= 0 && dk == dmax ? static_cast<unsigned>(di) : 0xffffffffu));
}

// regs_first_max for values in [0, 2^25) on up to 128 ranks: one reduction of ((value + 1) << 7) | (127 - r) (the
// larger value, then the lower rank); -1 (value -1) when no rank is left. Half the dependent reductions of the above.
template <int kN>
__device__ __forceinline__ int regs_first_max_small(const int32_t (&v)[kN], int R, int lane, int skip, int32_t& value) {
    static_assert(kN * kWarpSize <= 128, "regs_first_max_small: 7 bits of rank");
    unsigned key = 0;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
        const int r = lane + kWarpSize * k;
        if (r < R && r != skip)
            key = max(key, ((static_cast<unsigned>(v[k]) + 1u) << 7) | static_cast<unsigned>(127 - r));
    }
    const unsigned m = __reduce_max_sync(kFullMask, key);
    value = static_cast<int32_t>(m >> 7) - 1;
    return m != 0 ? 127 - static_cast<int>(m & 127u) : -1;
}

// NOTE: one shuffle per slot, not a select then one shuffle: the compiler turned that select into an indexed load
// and moved the whole array to local memory.
template <int kN>
__device__ __forceinline__ int32_t regs_get(const int32_t (&v)[kN], int r) {
    int32_t x = 0;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
        const int32_t y = __shfl_sync(kFullMask, v[k], r % kWarpSize);
        x = k == r / kWarpSize ? y : x;
    }
    return x;
}

// One alloc matrix in sparse form as the warps build it: the home column and the pieces (count in *n).
struct PieceList {
    int32_t* home_rem;  // [E]
    int32_t* at;        // [cap] e * R + u
    int32_t* amount;    // [cap]
    int32_t* n;
};

// plan_alloc_path on one warp (same matrix bit for bit): the selection sort's pick and each piece's expert are
// warp reductions (first index wins ties, as in the sequential loops); lane 0 commits. lb/q: load_before and q.
// pl.home_rem holds T_e on entry (the home matrix).
// NOTE: plan_alloc_path also requires alloc[f][taker] == 0 of the giver's expert f; that always holds, so this
// version does not keep the matrix to test it: a taker receives from a giver only on their one shared edge, and there
// f leaves the candidates once taken (either the whole rest of f moved, left = 0, or the edge's flow is done).
__device__ __forceinline__ bool warp_alloc_path(const PlanDims& d, const int64_t* lb, const int32_t* q, bool alternate,
                                                int32_t* order, int32_t* remote, const PieceList& pl, int lane) {
    const int R = d.R, epn = d.epn;
    int32_t* left = pl.home_rem;
    int n = 0;
    for (int r0 = 0; r0 < R; r0 += kWarpSize) {  // order = the ranks with a non-zero balance, ascending
        const int r = r0 + lane;
        const bool in = r < R && lb[r] != q[r];
        const unsigned m = __ballot_sync(kFullMask, in);
        if (r < R) remote[r] = 0;
        if (in) order[n + __popc(m & lanemask_lt())] = r;
        n += __popc(m);
    }
    __syncwarp();
    int64_t running = 0;
    for (int i = 0; i < n; ++i) {
        // Best j in [i, n): key larger is better; ties: lower rank id (order[j] < order[pick]).
        unsigned bk = 0;
        int bj = -1, brank = 0;
        for (int j = i + lane; j < n; j += kWarpSize) {
            const int rj = order[j];
            const int64_t b = lb[rj] - q[rj];
            unsigned key;
            if (!alternate || i == 0) {
                key = order_key(b);  // larger balance first
            } else {
                const int64_t s = running + b;
                key = ~static_cast<unsigned>(s < 0 ? -s : s);  // smaller |running + b| first (< 2^31)
            }
            if (bj < 0 || key > bk || (key == bk && rj < brank)) bk = key, bj = j, brank = rj;
        }
        const unsigned kmax = __reduce_max_sync(kFullMask, bj >= 0 ? bk : 0u);
        const unsigned rmin =
            __reduce_min_sync(kFullMask, bj >= 0 && bk == kmax ? static_cast<unsigned>(brank) : 0xffffffffu);
        const int pick = __reduce_min_sync(kFullMask, bj >= 0 && bk == kmax && static_cast<unsigned>(brank) == rmin
                                                          ? static_cast<unsigned>(bj)
                                                          : 0xffffffffu);
        if (lane == 0) {
            const int t = order[i];
            order[i] = order[pick];
            order[pick] = t;
        }
        __syncwarp();
        running += lb[order[i]] - q[order[i]];
    }
    int np = 0;
    bool result = true;
    int64_t flow = 0;
    for (int i = 0; i + 1 < n && result; ++i) {
        const int oi = order[i], on = order[i + 1];
        flow += lb[oi] - q[oi];
        if (flow == 0) continue;
        const int giver = flow > 0 ? oi : on;
        const int taker = flow > 0 ? on : oi;
        int64_t give = flow > 0 ? flow : -flow;
        if (epn <= 2 * kWarpSize) {
            // The giver's entries left in registers (lane owns g = lane and lane + 32); only this warp changes them.
            const int f0 = giver * epn + lane, f1 = f0 + kWarpSize;
            int32_t l0 = lane < epn ? left[f0] : 0, l1 = lane + kWarpSize < epn ? left[f1] : 0;
            int32_t rem = remote[taker];
            while (give > 0) {
                // The giver's expert with the most entries left (first on ties).
                unsigned most = 0;
                int g = -1;
                if (l0 > 0) most = static_cast<unsigned>(l0), g = lane;
                if (l1 > 0 && static_cast<unsigned>(l1) > most) most = static_cast<unsigned>(l1), g = lane + kWarpSize;
                const unsigned mmax = __reduce_max_sync(kFullMask, most);
                if (mmax == 0 || rem >= epn) {
                    result = false;
                    break;
                }
                const int gbest = static_cast<int>(
                    __reduce_min_sync(kFullMask, g >= 0 && most == mmax ? static_cast<unsigned>(g) : 0xffffffffu));
                const int64_t moved = detail::imin64(static_cast<int64_t>(mmax), give);
                if (gbest == lane) l0 -= static_cast<int32_t>(moved);
                if (gbest == lane + kWarpSize) l1 -= static_cast<int32_t>(moved);
                rem += 1;
                if (lane == 0) {
                    pl.at[np] = (giver * epn + gbest) * R + taker;
                    pl.amount[np] = static_cast<int32_t>(moved);
                }
                ++np;
                give -= moved;
            }
            __syncwarp();  // every lane has read remote[taker] before lane 0 writes it
            if (lane < epn) left[f0] = l0;
            if (lane + kWarpSize < epn) left[f1] = l1;
            if (lane == 0) remote[taker] = rem;
            __syncwarp();
            continue;
        }
        while (give > 0) {
            // The giver's expert with the most entries left (first on ties).
            unsigned most = 0;
            int e = -1;
            for (int g = lane; g < epn; g += kWarpSize) {
                const int f = giver * epn + g;
                const int32_t l = left[f];
                if (l > 0 && static_cast<unsigned>(l) > most) most = static_cast<unsigned>(l), e = f;
            }
            const unsigned mmax = __reduce_max_sync(kFullMask, most);
            if (mmax == 0 || remote[taker] >= epn) {
                result = false;
                break;
            }
            const int best = static_cast<int>(
                __reduce_min_sync(kFullMask, e >= 0 && most == mmax ? static_cast<unsigned>(e) : 0xffffffffu));
            const int64_t moved = detail::imin64(static_cast<int64_t>(mmax), give);
            __syncwarp();  // every lane has read left and remote before lane 0 changes them
            if (lane == 0) {
                left[best] -= static_cast<int32_t>(moved);
                remote[taker] += 1;
                pl.at[np] = best * R + taker;
                pl.amount[np] = static_cast<int32_t>(moved);
            }
            ++np;
            __syncwarp();
            give -= moved;
        }
    }
    if (lane == 0) *pl.n = np;
    return result;
}

// The reference expert split (plan_alloc_reference's second loop) of donor h on one warp: its transfers (receiver,
// amount) in xu/xa[0..m) (any order), remaining[] the home column. Repeatedly the receiver with the largest transfer
// left (lowest rank on ties: the dense loop's first index) takes min(its transfer, the donor's expert with the most
// entries left). Pieces are appended to the shared list through an atomic counter (several warps split at once;
// consumers of the list do not depend on its order). Returns the pieces made.
__device__ __forceinline__ int warp_split_donor(const PlanDims& d, int h, int32_t* xu, int32_t* xa, int m,
                                                int32_t* remaining, int32_t* piece_at, int32_t* piece_amount,
                                                int32_t* npieces, int lane) {
    const int R = d.R, epn = d.epn;
    int pieces = 0;
    for (;; ++pieces) {
        unsigned bk = 0, bu = 0xffffffffu;
        int bi = -1;
        for (int i = lane; i < m; i += kWarpSize) {
            const int32_t a = xa[i];
            const unsigned u = static_cast<unsigned>(xu[i]);
            if (a > 0 && (bi < 0 || static_cast<unsigned>(a) > bk || (static_cast<unsigned>(a) == bk && u < bu)))
                bk = static_cast<unsigned>(a), bu = u, bi = i;
        }
        const unsigned kmax = __reduce_max_sync(kFullMask, bi >= 0 ? bk : 0u);
        if (kmax == 0) break;
        const unsigned umin = __reduce_min_sync(kFullMask, bi >= 0 && bk == kmax ? bu : 0xffffffffu);
        const int slot = static_cast<int>(
            __reduce_min_sync(kFullMask, bi >= 0 && bk == kmax && bu == umin ? static_cast<unsigned>(bi) : 0xffffffffu));
        const int e = h * epn + warp_first_max(remaining + h * epn, epn, lane);
        const int32_t moved = remaining[e] < static_cast<int32_t>(kmax) ? remaining[e] : static_cast<int32_t>(kmax);
        if (moved <= 0) break;  // see plan_alloc_reference: unreachable with consistent quotas
        __syncwarp();           // every lane has read remaining and xa before lane 0 changes them
        if (lane == 0) {
            remaining[e] -= moved;
            xa[slot] -= moved;
            const int i = atomicAdd(npieces, 1);
            piece_at[i] = e * R + static_cast<int>(umin);
            piece_amount[i] = moved;
        }
        __syncwarp();
    }
    return pieces;
}

}  // namespace evenep::cuda::device
