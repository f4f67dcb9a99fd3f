// Warp-level pieces of the block planner (plan_block.cuh): reductions with the sequential code's tie rule and
// one-warp versions of plan_candidates.hpp's greedy loops (global fill in every variant, path) and of plan_cost_of's
// per-expert sums. Each returns exactly what its plan_candidates.hpp counterpart computes (see plan_block.cuh for why).
#pragma once

#include <cstdint>

#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "evenep/detail/plan_candidates.hpp"

namespace evenep::cuda::device {

using detail::PlanArrays;
using detail::PlanCostValues;
using detail::PlanDims;

inline constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------------------
// Warp reductions with the sequential code's tie rule (lowest index wins among equal keys), on redux.sync.
// NOTE: every quantity reduced here (balances, deficits, quotas, remaining entries, pieces, local counts) is bounded
// by the group's entry count N < 2^31 (Config::validate keeps R*NvS inside int32), so a 32-bit key orders it.
// ---------------------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned order_key(int64_t v) {
    return static_cast<unsigned>(static_cast<int32_t>(v)) ^ 0x80000000u;
}

// First index of the maximum (kMax) or minimum of x[0..n) (the sequential "if (x[r] > x[best]) best = r").
template <bool kMax>
__device__ __forceinline__ int warp_first_extreme(const int64_t* x, int n, int lane) {
    int64_t v = 0;
    int i = -1;
    for (int r = lane; r < n; r += kWarpSize) {
        const int64_t xr = x[r];
        if (i < 0 || (kMax ? xr > v : xr < v)) v = xr, i = r;
    }
    const unsigned key = i < 0 ? 0u : (kMax ? order_key(v) : ~order_key(v));
    const unsigned best = __reduce_max_sync(kFullMask, key);
    return static_cast<int>(
        __reduce_min_sync(kFullMask, i >= 0 && key == best ? static_cast<unsigned>(i) : 0xffffffffu));
}

__device__ __forceinline__ int warp_first_max(const int64_t* x, int n, int lane) {
    return warp_first_extreme<true>(x, n, lane);
}

// plan_alloc_global_fill's order of candidates as (primary, local) keys, larger is better, lower expert id on
// ties: best_fit: pieces that fill the receiver first, the smallest of those, else the largest piece;
// otherwise the largest piece; then the receiver's own entries of the expert. primary 0 means no candidate.
__device__ __forceinline__ unsigned fill_primary(int64_t piece, bool fills, bool best_fit) {
    const unsigned p = static_cast<unsigned>(piece);  // 1 <= piece < 2^31
    return best_fit && fills ? 0x80000000u | (0x7fffffffu - p) : p;
}

// plan_alloc_global_fill on one warp, every variant of it: best_fit, overshoot, spread (spread_pushed != nullptr).
// excess/deficit/remote/avail/alloc (and spread_pushed) initialised by the caller (excess/deficit from balance,
// remote and spread 0, avail = T_e, alloc = home). Returns the same bool.
__device__ __forceinline__ bool warp_global_fill(const PlanDims& d,
                                        const int32_t* tpe,
                                        bool best_fit,
                                        bool overshoot,
                                        int64_t* excess,
                                        int64_t* deficit,
                                        int64_t* avail,
                                        int32_t* remote,
                                        int32_t* spread_pushed,
                                        int32_t* alloc,
                                        const int32_t* home,
                                        int lane,
                                        int& iterations) {
    const int R = d.R, E = d.E;
    for (;; ++iterations) {
        const int u = warp_first_max(deficit, R, lane);
        const int64_t need = deficit[u];
        if (need <= 0) return true;
        const bool must_fill = remote[u] + 1 >= d.epn;
        // This lane's best (spread, primary, local); ascending e keeps the lowest id on ties. spread: fewer pushes
        // of the donor so far is better (the sequential code compares it first), 0 when not spreading.
        unsigned bs = 0, bp = 0, bl = 0;
        int be = -1;
        for (int e = lane; e < E; e += kWarpSize) {
            const int h = home[e];
            const int64_t ex = excess[h], av = avail[e];
            if (ex <= 0 || av <= 0) continue;
            if (alloc[static_cast<int64_t>(e) * R + u] > 0) continue;
            const int64_t piece = detail::imin64(av, ex);
            const bool fills = piece >= need;
            if (must_fill && !fills) continue;
            const unsigned cs = spread_pushed ? 0x7fffffffu - static_cast<unsigned>(spread_pushed[h]) : 0u;
            const unsigned cp = fill_primary(piece, fills, best_fit);
            const unsigned cl = static_cast<unsigned>(tpe[static_cast<int64_t>(u) * E + e]);
            if (be < 0 || cs > bs || (cs == bs && (cp > bp || (cp == bp && cl > bl)))) bs = cs, bp = cp, bl = cl, be = e;
        }
        int best = -1;
        if (__any_sync(kFullMask, be >= 0)) {
            const unsigned smax = __reduce_max_sync(kFullMask, be >= 0 ? bs : 0u);
            const bool s_ok = be >= 0 && bs == smax;
            const unsigned pmax = __reduce_max_sync(kFullMask, s_ok ? bp : 0u);
            const bool p_ok = s_ok && bp == pmax;
            const unsigned lmax = __reduce_max_sync(kFullMask, p_ok ? bl : 0u);
            best = static_cast<int>(
                __reduce_min_sync(kFullMask, p_ok && bl == lmax ? static_cast<unsigned>(be) : 0xffffffffu));
        }
        if (best < 0 && overshoot) {
            // Overshoot (plan_alloc_global_fill's second pass): the smallest expert whose avail covers the need
            // (ties: more of the receiver's own tokens, then lower id); its donor becomes a receiver.
            unsigned ba = 0, bl2 = 0;
            int be2 = -1;
            for (int e = lane; e < E; e += kWarpSize) {
                const int h = home[e];
                if (excess[h] <= 0 || avail[e] < need) continue;
                if (alloc[static_cast<int64_t>(e) * R + u] > 0) continue;
                const unsigned ka = 0x7fffffffu - static_cast<unsigned>(avail[e]);  // smaller avail is better
                const unsigned kl = static_cast<unsigned>(tpe[static_cast<int64_t>(u) * E + e]);
                if (be2 < 0 || ka > ba || (ka == ba && kl > bl2)) ba = ka, bl2 = kl, be2 = e;
            }
            if (__any_sync(kFullMask, be2 >= 0)) {
                const unsigned amax = __reduce_max_sync(kFullMask, be2 >= 0 ? ba : 0u);
                const bool a_ok = be2 >= 0 && ba == amax;
                const unsigned lmax = __reduce_max_sync(kFullMask, a_ok ? bl2 : 0u);
                const int over = static_cast<int>(
                    __reduce_min_sync(kFullMask, a_ok && bl2 == lmax ? static_cast<unsigned>(be2) : 0xffffffffu));
                if (lane == 0)
                    detail::plan_fill_take(d, over, u, need, /*overshoot=*/true, excess, deficit, avail, remote,
                                           spread_pushed, alloc);
                __syncwarp();
                continue;
            }
        }
        if (best < 0) return false;
        if (lane == 0)
            detail::plan_fill_take(d, best, u, detail::imin64(detail::imin64(avail[best], excess[home[best]]), need),
                                   /*overshoot=*/false, excess, deficit, avail, remote, spread_pushed, alloc);
        __syncwarp();  // orders lane 0's updates before the next iteration's reads
    }
}

// plan_cost_of's sums for the 32 experts e = e0 + lane of an alloc matrix X: remote experts per rank into
// remote[R], pushes per home rank into pushed[R] (shared atomics), total copies / crossing rows / moved entries
// into acc[3]. 32-bit: every count and prefix here is bounded by the group's entries N < 2^31.
__device__ __forceinline__ void warp_cost_chunk(const PlanDims& d, const int32_t* tpe, const int32_t* X,
                                                const int32_t* home, int e, int lane,
                                       int32_t* remote_out, int32_t* pushed_out, unsigned* acc) {
    const int R = d.R, E = d.E;
    const bool valid = e < E;
    const int h = valid ? home[e] : -1;
    int32_t crossing = 0, copies = 0, moved = 0, rest_lo = 0, cap_lo = 0, pushed = 0;
    for (int r = 0; r < R; ++r) {  // per lane: no warp-wide step in the loop
        bool remote = false;
        if (valid) {
            const int32_t a_er = X[static_cast<int64_t>(e) * R + r];
            const int32_t t_re = tpe[static_cast<int64_t>(r) * E + e];
            const int32_t keep = d.locality ? min(t_re, a_er) : 0;  // plan_local_keep
            const int32_t rest = t_re - keep, cap = a_er - keep;
            const int32_t lo = max(rest_lo, cap_lo), hi = min(rest_lo + rest, cap_lo + cap);
            crossing += t_re - (keep + (hi > lo ? hi - lo : 0));
            rest_lo += rest;
            cap_lo += cap;
            if (r != h && a_er > 0) {
                remote = true;
                copies += 1;
                moved += a_er;
                if (d.B >= d.epn || detail::plan_is_prefetched(d, X, r, e)) pushed += 1;
            }
        }
        if (remote) atomicAdd(remote_out + r, 1);  // rare: remote entries are copies (<= E in all)
    }
    if (pushed) atomicAdd(pushed_out + h, pushed);
    const unsigned wc = __reduce_add_sync(kFullMask, static_cast<unsigned>(copies));
    const unsigned wx = __reduce_add_sync(kFullMask, static_cast<unsigned>(crossing));
    const unsigned wm = __reduce_add_sync(kFullMask, static_cast<unsigned>(moved));
    if (lane == 0) {
        if (wc) atomicAdd(acc + 0, wc);
        if (wx) atomicAdd(acc + 1, wx);
        if (wm) atomicAdd(acc + 2, wm);
    }
}

// plan_alloc_path on one warp (same result bit for bit): the selection sort's pick and each piece's expert are
// warp reductions (first index wins ties, as in the sequential loops); lane 0 commits. lb/q: load_before and q.
// alloc already holds the home matrix (plan_alloc_path's init = false).
__device__ __forceinline__ bool warp_alloc_path(const PlanDims& d, const int64_t* lb, const int32_t* q, bool alternate,
                                       int32_t* order, int32_t* remote, int32_t* alloc, int lane) {
    const int R = d.R, epn = d.epn;
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
    int64_t flow = 0;
    for (int i = 0; i + 1 < n; ++i) {
        const int oi = order[i], on = order[i + 1];
        flow += lb[oi] - q[oi];
        if (flow == 0) continue;
        const int giver = flow > 0 ? oi : on;
        const int taker = flow > 0 ? on : oi;
        int64_t give = flow > 0 ? flow : -flow;
        while (give > 0) {
            // The giver's expert with the most entries left that the taker does not hold (first on ties).
            unsigned most = 0;
            int e = -1;
            for (int g = lane; g < epn; g += kWarpSize) {
                const int f = giver * epn + g;
                const int32_t left = alloc[static_cast<int64_t>(f) * R + giver];
                if (left > 0 && static_cast<unsigned>(left) > most && alloc[static_cast<int64_t>(f) * R + taker] == 0)
                    most = static_cast<unsigned>(left), e = f;
            }
            const unsigned mmax = __reduce_max_sync(kFullMask, most);
            if (mmax == 0 || remote[taker] >= epn) return false;
            const int best = static_cast<int>(
                __reduce_min_sync(kFullMask, e >= 0 && most == mmax ? static_cast<unsigned>(e) : 0xffffffffu));
            const int64_t moved = detail::imin64(static_cast<int64_t>(mmax), give);
            __syncwarp();  // every lane has read alloc and remote before lane 0 changes them
            if (lane == 0) {
                alloc[static_cast<int64_t>(best) * R + giver] -= static_cast<int32_t>(moved);
                alloc[static_cast<int64_t>(best) * R + taker] += static_cast<int32_t>(moved);
                remote[taker] += 1;
            }
            __syncwarp();
            give -= moved;
        }
    }
    return true;
}

}  // namespace evenep::cuda::device
