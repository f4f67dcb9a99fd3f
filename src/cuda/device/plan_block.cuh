// The planner on one thread block: the same plan as src/core/planner.cpp, bit for bit, with the loops of
// evenep/detail/plan_core.hpp and plan_candidates.hpp spread over warps and threads.
//
// Why it is bit-exact: every quantity is an integer; sums, counts and maxima are order-independent; every argmax
// of the sequential code ("first index wins ties", or the lexicographic key of plan_alloc_global_fill) is a warp
// reduction that keeps the lowest index among equal keys; every step whose result depends on its predecessor (the
// greedy loops) stays sequential, executed by one warp with lane 0 committing the update (plan_warp.cuh). Helpers
// that are cheap per element (plan_local_keep, plan_is_prefetched) are called from plan_core.hpp itself.
//
// Optimized mode runs all six candidates of plan_candidates.hpp plan_alloc_mode (the default candidate set).
//
// Two entry points:
//   plan_block_serial   thread 0 runs planner.cpp's sequence of plan_core calls (reference for tests; slow);
//   plan_block_parallel all threads, warp-specialised (see the phase headers below).
// Both write the plan arrays `a` and cost[4] = {max_rank_copy_traffic, total_copies, crossing_rows,
// moved_entries}; both record DeviceErrorKind::kInternal if a rank ends with more than epn remote experts.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "cuda/device/plan_warp.cuh"
#include "evenep/detail/ep_layout.hpp"
#include "evenep/detail/plan_candidates.hpp"

namespace evenep::cuda::device {

using detail::PlanArrays;
using detail::PlanCostValues;
using detail::PlanDims;

// ---------------------------------------------------------------------------------------------------------
// The sequential planner (planner.cpp's Planner::plan without the host input checks), on thread 0: the same
// plan_candidates.hpp call (plan_sequential) as the host, so the two cannot drift apart.
// ---------------------------------------------------------------------------------------------------------
__device__ inline void plan_block_serial(
    const PlanDims& d, const int32_t* tpe, const PlanArrays& a, int64_t* cost_out, int64_t* work64, int32_t* work32) {
    if (threadIdx.x != 0) return;
    PlanCostValues cost{};
    detail::plan_sequential(d, tpe, const_cast<PlanArrays&>(a), detail::PlanWork{work64, work32}, /*legacy=*/false,
                            cost);
    cost_out[0] = cost.max_rank_copy_traffic;
    cost_out[1] = cost.total_copies;
    cost_out[2] = cost.crossing_rows;
    cost_out[3] = cost.moved_entries;
}

// ---------------------------------------------------------------------------------------------------------
// The parallel planner. kThreads >= 128 (warp 0: reference transfers, warps 1-2: the two global fills).
// ---------------------------------------------------------------------------------------------------------
// The block planner's state (PlanScratchLayout) carved from `base` (shared or global memory).
struct PlanScratch {
    int64_t *balance, *z, *remaining, *excess, *deficit, *avail, *expert_load, *path_load;
    int32_t *tpe, *alloc, *cand, *fill_remote, *spread, *order, *path_q, *cost_pushed, *cost_remote, *home, *groups;
};

__device__ inline PlanScratch carve_scratch(char* base, int R, int E) {
    const PlanScratchLayout l = PlanScratchLayout::make(R, E);
    return PlanScratch{
        reinterpret_cast<int64_t*>(base + l.balance),     reinterpret_cast<int64_t*>(base + l.z),
        reinterpret_cast<int64_t*>(base + l.remaining),   reinterpret_cast<int64_t*>(base + l.excess),
        reinterpret_cast<int64_t*>(base + l.deficit),     reinterpret_cast<int64_t*>(base + l.avail),
        reinterpret_cast<int64_t*>(base + l.expert_load), reinterpret_cast<int64_t*>(base + l.path_load),
        reinterpret_cast<int32_t*>(base + l.tpe),
        reinterpret_cast<int32_t*>(base + l.alloc),       reinterpret_cast<int32_t*>(base + l.cand),
        reinterpret_cast<int32_t*>(base + l.fill_remote), reinterpret_cast<int32_t*>(base + l.spread),
        reinterpret_cast<int32_t*>(base + l.order),       reinterpret_cast<int32_t*>(base + l.path_q),
        reinterpret_cast<int32_t*>(base + l.cost_pushed),
        reinterpret_cast<int32_t*>(base + l.cost_remote), reinterpret_cast<int32_t*>(base + l.home),
        reinterpret_cast<int32_t*>(base + l.groups)};
}

// timing (optional, [24]): thread 0 stores %globaltimer at each phase boundary into [0..9) and loop counts into
// [9..12) (fill iterations of both candidates, most split pieces of one donor).
template <int kThreads>
__device__ __forceinline__ void plan_block_parallel(const PlanDims& d,
                                                    const int32_t* __restrict__ tpe_in,
                                                    const PlanArrays& a,
                                                    int64_t* cost_out,
                                                    const PlanScratch& sc,
                                                    const TeamView& team,
                                                    int rank,
                                                    int64_t* timing) {
    static_assert(kThreads >= 256 && kThreads % kWarpSize == 0, "plan_block_parallel needs >= 8 whole warps");
    constexpr int kWarps = kThreads / kWarpSize;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, E = d.E, epn = d.epn, G = d.G, B = d.B;
    const size_t ER = static_cast<size_t>(E) * R;
    const bool optimized = d.locality;
    int64_t* balance = sc.balance;
    int64_t* z = sc.z;
    int64_t* remaining = sc.remaining;
    int64_t* excess = sc.excess;            // [4][R]   fills (candidates 0-3 of plan_alloc_mode)
    int64_t* deficit = sc.deficit;          // [4][R]
    int64_t* avail = sc.avail;              // [4][E]
    int32_t* cand = sc.cand;                // [6][E*R] fills 0-3, paths 4-5
    int32_t* fill_remote = sc.fill_remote;  // [6][R]
    int32_t* cost_pushed = sc.cost_pushed;  // [7][R]   reference, then the six candidates
    int32_t* cost_remote = sc.cost_remote;  // [7][R]
    int32_t* alloc = sc.alloc;              // the working alloc (copied to alloc at the end)
    const int32_t* tpe = sc.tpe;
    auto stamp = [&](int i) {
        if (timing != nullptr && tid == 0) timing[i] = static_cast<int64_t>(global_timer_ns());
    };
    stamp(0);
    if (timing != nullptr && tid == 0) timing[11] = 0, timing[12] = static_cast<int64_t>(clock64());
    if (sc.tpe != tpe_in)
        for (size_t i = tid; i < static_cast<size_t>(R) * E; i += kThreads) sc.tpe[i] = tpe_in[i];

    constexpr int kCand = detail::kNumOptimizedCandidates;  // 6
    __shared__ unsigned s_acc[kCand + 1][3];  // per candidate: total_copies, crossing_rows, moved_entries (< N < 2^31)
    __shared__ unsigned long long s_total;
    __shared__ int s_fill_ok[kCand];
    __shared__ int s_best;

    // ---- Phase 1: loads and quotas (plan_loads_and_quotas). ----
    if (tid == 0) s_total = 0;
    if (tid < 3 * (kCand + 1)) s_acc[tid / 3][tid % 3] = 0;
    __syncthreads();
    {
        unsigned long long part = 0;
        for (int e = tid; e < E; e += kThreads) {
            int64_t t = 0;
            for (int r = 0; r < R; ++r) t += tpe[static_cast<int64_t>(r) * E + e];
            a.expert_load[e] = t;
            sc.expert_load[e] = t;
            sc.home[e] = e / epn;
            part += static_cast<unsigned long long>(t);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kFullMask, part, off);
        if (lane == 0 && part) atomicAdd(&s_total, part);
    }
    __syncthreads();
    const int64_t total = static_cast<int64_t>(s_total);
    for (int r = tid; r < R; r += kThreads) {
        int64_t l = 0;
        for (int g = 0; g < epn; ++g) l += sc.expert_load[r * epn + g];
        const int32_t q = static_cast<int32_t>(total / R + (r < total % R ? 1 : 0));
        a.load_before[r] = l;
        a.q[r] = q;
        sc.balance[r] = l - q;  // load_before - q: the rank's balance
        a.crossing_out[r] = 0;
    }
    __syncthreads();
    // Imbalance budget (opt-in; d.slack_ppm is block-uniform): the targets of detail::plan_slack_targets replace the
    // quotas in a.q on thread 0 (sequential, as in plan_loads_and_quotas), and the balances follow them.
    if (d.slack_ppm > 0) {
        if (tid == 0) detail::plan_slack_targets(d, a.load_before, a.q);
        __syncthreads();
        for (int r = tid; r < R; r += kThreads) sc.balance[r] = a.load_before[r] - a.q[r];
        __syncthreads();
    }
    stamp(1);

    // ---- Phase 2a: initial state of the reference greedy and of both global fills. ----
    {
        // (e, r) of i = e*R + r advanced incrementally: no integer division per element.
        const int step_e = kThreads / R, step_r = kThreads % R;
        int e = tid / R, r = tid % R;
        for (size_t i = tid; i < ER; i += kThreads) {
            const int32_t home = r == sc.home[e] ? static_cast<int32_t>(sc.expert_load[e]) : 0;
            alloc[i] = home;
            if (optimized)
                for (int v = 0; v < kCand; ++v) cand[v * ER + i] = home;
            r += step_r, e += step_e;
            if (r >= R) r -= R, ++e;
        }
    }
    for (int e = tid; e < E; e += kThreads) {
        remaining[e] = sc.expert_load[e];
        if (optimized)
            for (int v = 0; v < 4; ++v) avail[v * E + e] = sc.expert_load[e];
    }
    for (int i = tid; i < R * R; i += kThreads) z[i] = 0;
    for (int r = tid; r < R; r += kThreads) {
        const int64_t b = balance[r];  // written in phase 1
        if (optimized) {
            for (int v = 0; v < 4; ++v) {
                excess[v * R + r] = b > 0 ? b : 0;
                deficit[v * R + r] = b < 0 ? -b : 0;
            }
            for (int v = 0; v < kCand; ++v) fill_remote[v * R + r] = 0;
            for (int c = 0; c <= kCand; ++c) cost_pushed[c * R + r] = cost_remote[c * R + r] = 0;
            sc.spread[r] = sc.spread[R + r] = 0;
            sc.path_load[r] = sc.path_load[R + r] = a.load_before[r];
            sc.path_q[r] = sc.path_q[R + r] = a.q[r];
        }
    }
    __syncthreads();
    stamp(2);

    // ---- Phase 2b: warp 0 runs the rank-level transfers; warps 1-4 the four global fills (plan_alloc_candidate
    // 0-3: largest piece, best fit, each with pushes spread; all with overshoot), warps 5-6 lane 0 the two paths
    // (plan_alloc_path itself: R-level, short). ----
    if (warp == 0) {
        for (;;) {
            const int h = warp_first_extreme<true>(balance, R, lane);
            const int u = warp_first_extreme<false>(balance, R, lane);
            if (balance[h] <= 0) break;
            __syncwarp();  // every lane has read balance before lane 0 changes it
            if (lane == 0) {
                const int64_t amount = -balance[u];
                z[h * R + u] += amount;
                balance[h] -= amount;
                balance[u] = 0;
            }
            __syncwarp();
        }
    } else if (optimized && warp >= 1 && warp <= 4) {
        const int v = warp - 1;
        int iterations = 0;
        const bool ok = warp_global_fill(d, tpe, v % 2 == 1, /*overshoot=*/true, excess + v * R, deficit + v * R,
                                         avail + v * E, fill_remote + v * R, v >= 2 ? sc.spread + (v - 2) * R : nullptr,
                                         cand + v * ER, sc.home, lane, iterations);
        if (lane == 0) s_fill_ok[v] = ok ? 1 : 0;
        if (lane == 0 && timing != nullptr && v < 2) timing[9 + v] = iterations;
    } else if (optimized && (warp == 5 || warp == 6)) {
        const int v = warp - 1;  // 4: path sorted, 5: path alternating
        // The path reads only load_before and q: from the block's copies (shared memory when the scratch is).
        const bool ok = warp_alloc_path(d, sc.path_load + (v - 4) * R, sc.path_q + (v - 4) * R, v == 5,
                                        sc.order + (v - 4) * R, fill_remote + v * R, cand + v * ER, lane);
        if (lane == 0) s_fill_ok[v] = ok ? 1 : 0;
        if (lane == 0 && timing != nullptr) timing[14 + (v - 4)] = static_cast<int64_t>(global_timer_ns());
    }
    __syncthreads();
    stamp(3);

    // ---- Phase 2c: expert split of the reference plan, one warp per donor (donors touch disjoint state). ----
    for (int h = warp; h < R; h += kWarps) {
        int64_t* zh = z + h * R;
        int pieces = 0;
        for (;; ++pieces) {
            const int dst = warp_first_max(zh, R, lane);
            if (zh[dst] <= 0) break;
            const int e = h * epn + warp_first_max(remaining + h * epn, epn, lane);
            const int64_t moved = detail::imin64(remaining[e], zh[dst]);
            if (moved <= 0) break;
            __syncwarp();  // every lane has read remaining and zh before lane 0 changes them
            if (lane == 0) {
                remaining[e] -= moved;
                zh[dst] -= moved;
                alloc[static_cast<int64_t>(e) * R + h] -= static_cast<int32_t>(moved);
                alloc[static_cast<int64_t>(e) * R + dst] += static_cast<int32_t>(moved);
            }
            __syncwarp();
        }
        if (lane == 0 && timing != nullptr) atomicMax(reinterpret_cast<unsigned long long*>(timing + 11), pieces);
    }
    __syncthreads();
    stamp(4);

    // ---- Phase 2d (optimized): costs of the reference and the six candidates (plan_cost_of), then the choice of planner.cpp. ----
    if (optimized) {
        // Work items (candidate, chunk of 32 experts) spread over all warps.
        const int chunks = (E + kWarpSize - 1) / kWarpSize;
        for (int item = warp; item < (kCand + 1) * chunks; item += kWarps) {
            const int c = item / chunks;
            if (c > 0 && !s_fill_ok[c - 1]) continue;
            warp_cost_chunk(d, tpe, c == 0 ? alloc : cand + (c - 1) * ER, sc.home, (item - c * chunks) * kWarpSize + lane,
                            lane,
                            cost_remote + c * R, cost_pushed + c * R, s_acc[c]);
        }
        __syncthreads();
        if (tid == 0) {
            PlanCostValues cv[kCand + 1];
            bool ok[kCand + 1];
            for (int c = 0; c <= kCand; ++c) {
                ok[c] = true;
                int64_t traffic = 0;
                for (int r = 0; r < R; ++r) {
                    const int32_t rem = cost_remote[c * R + r];
                    if (rem > epn) ok[c] = false;
                    traffic = detail::imax64(traffic, (rem < B ? rem : B) + cost_pushed[c * R + r]);
                }
                cv[c] =
                    PlanCostValues{traffic, static_cast<int64_t>(s_acc[c][0]), static_cast<int64_t>(s_acc[c][1]), 0};
            }
            int best = 0;
            for (int v = 0; v < kCand; ++v) {
                const int c = v + 1;
                if (!s_fill_ok[v] || !ok[c]) continue;
                if (cv[c].max_rank_copy_traffic > cv[0].max_rank_copy_traffic ||
                    cv[c].total_copies > cv[0].total_copies)
                    continue;
                if (detail::plan_cost_less(cv[c], cv[best])) best = c;
            }
            s_best = best;
        }
        __syncthreads();
        if (s_best != 0) {
            const int32_t* src = cand + (s_best - 1) * ER;
            for (size_t i = tid; i < ER; i += kThreads) alloc[i] = src[i];
        }
        __syncthreads();
        if (tid < 3) s_acc[0][tid] = 0;  // reused below for the final costs
        __syncthreads();
    }

    stamp(5);

    // ---- Phase 3a: locality keep, prefixes, crossing rows and moved entries (plan_finalize). Up to 32 ranks: a
    // thread per expert walks the ranks (short loop, registers). More: a warp per expert, lanes over ranks in
    // chunks of 32 with a warp scan, so the [E][R] and [E][R+1] rows are stored coalesced; crossing rows per rank
    // collect in shared memory. ----
    constexpr int kCrossSmem = 256;
    __shared__ unsigned s_cross[kCrossSmem];  // < entries of rank r < 2^31
    const bool cross_smem = R <= kCrossSmem;
    for (int r = tid; r < kCrossSmem; r += kThreads) s_cross[r] = 0;
    __syncthreads();
    if (R > kWarpSize && cross_smem) {
        unsigned moved = 0;  // this lane's moved entries (< N < 2^31 in all)
        for (int e = warp; e < E; e += kWarps) {
            const int h = sc.home[e];
            int32_t* rp = a.rest_prefix + static_cast<int64_t>(e) * (R + 1);
            int32_t* cp = a.cap_prefix + static_cast<int64_t>(e) * (R + 1);
            int32_t rest_carry = 0, cap_carry = 0;
            for (int r0 = 0; r0 <= R; r0 += kWarpSize) {
                const int r = r0 + lane;
                int32_t t_re = 0, a_er = 0, keep = 0;
                if (r < R) {
                    t_re = tpe[static_cast<int64_t>(r) * E + e];
                    a_er = alloc[static_cast<int64_t>(e) * R + r];
                    keep = d.locality ? (t_re < a_er ? t_re : a_er) : 0;  // plan_local_keep
                    a.local_keep[static_cast<int64_t>(e) * R + r] = keep;
                    if (r != h) moved += static_cast<unsigned>(a_er);
                }
                const int32_t rest = t_re - keep, cap = a_er - keep;
                int32_t ri = rest, ci = cap;  // inclusive scans
#pragma unroll
                for (int off = 1; off < kWarpSize; off <<= 1) {
                    const int32_t nr = __shfl_up_sync(kFullMask, ri, off), nc = __shfl_up_sync(kFullMask, ci, off);
                    if (lane >= off) ri += nr, ci += nc;
                }
                const int32_t rest_lo = rest_carry + ri - rest, cap_lo = cap_carry + ci - cap;
                if (r <= R) rp[r] = rest_lo, cp[r] = cap_lo;
                if (r < R) {
                    const int32_t lo = rest_lo > cap_lo ? rest_lo : cap_lo;
                    const int32_t hi = rest_lo + rest < cap_lo + cap ? rest_lo + rest : cap_lo + cap;
                    const int32_t cross = t_re - (keep + (hi > lo ? hi - lo : 0));
                    if (cross) atomicAdd(&s_cross[r], static_cast<unsigned>(cross));
                }
                rest_carry += __shfl_sync(kFullMask, ri, kWarpSize - 1);
                cap_carry += __shfl_sync(kFullMask, ci, kWarpSize - 1);
            }
        }
        const unsigned wm = __reduce_add_sync(kFullMask, moved);
        if (lane == 0 && wm) atomicAdd(&s_acc[0][2], wm);
    } else {
        for (int e0 = warp * kWarpSize; e0 < E; e0 += kThreads) {  // warp-uniform: per-warp sums before atomics
            const int e = e0 + lane;
            const bool valid = e < E;
            int32_t rest = 0, cap = 0;
            int32_t* rp = a.rest_prefix + static_cast<int64_t>(e) * (R + 1);
            int32_t* cp = a.cap_prefix + static_cast<int64_t>(e) * (R + 1);
            int64_t moved = 0;
            const int h = valid ? sc.home[e] : -1;
            for (int r = 0; r < R; ++r) {
                int64_t cross = 0;
                if (valid) {
                    const int32_t keep = static_cast<int32_t>(detail::plan_local_keep(d, tpe, alloc, e, r));
                    const int32_t t_re = tpe[static_cast<int64_t>(r) * E + e];
                    const int32_t a_er = alloc[static_cast<int64_t>(e) * R + r];
                    a.local_keep[static_cast<int64_t>(e) * R + r] = keep;
                    rp[r] = rest;
                    cp[r] = cap;
                    const int32_t rest_lo = rest, cap_lo = cap;
                    rest += t_re - keep;
                    cap += a_er - keep;
                    const int64_t lo = detail::imax64(rest_lo, cap_lo), hi = detail::imin64(rest, cap);
                    cross = t_re - (keep + (hi > lo ? hi - lo : 0));
                    if (r != h) moved += a_er;
                }
                const unsigned wsum = __reduce_add_sync(kFullMask, static_cast<unsigned>(cross));  // < entries of r
                if (lane == 0 && wsum) {
                    if (cross_smem)
                        atomicAdd(&s_cross[r], wsum);
                    else
                        atomicAdd(reinterpret_cast<unsigned long long*>(a.crossing_out + r),
                                  static_cast<unsigned long long>(wsum));
                }
            }
            if (valid) {
                rp[R] = rest;
                cp[R] = cap;
            }
            const unsigned wm = __reduce_add_sync(kFullMask, static_cast<unsigned>(moved));
            if (lane == 0 && wm) atomicAdd(&s_acc[0][2], wm);
        }
    }
    __syncthreads();
    if (cross_smem)
        for (int r = tid; r < R; r += kThreads) a.crossing_out[r] = static_cast<int64_t>(s_cross[r]);
    stamp(6);

    // ---- Phase 3b: segment layout, weight sources, slots, cu_seqlens, seg_row; one warp per rank. ----
    // The group arrays are built in the warp's part of sc.groups (shared memory when the scratch is), then copied
    // out: their read-after-write steps stay out of global memory.
    static_assert(kWarps <= kPlanMaxWarps, "PlanScratchLayout::groups holds kPlanMaxWarps warps");
    for (int r = warp; r < R; r += kWarps) {
        int32_t* tw = sc.groups + static_cast<int64_t>(warp) * 5 * G;
        int32_t* ge = tw;
        int32_t* gc = tw + G;
        int32_t* gs = tw + 2 * G;
        int32_t* gsl = tw + 3 * G;
        int32_t* cu = tw + 4 * G;
        int32_t* seg = a.seg_row + static_cast<int64_t>(r) * E;
        int32_t* cs = a.copies + static_cast<int64_t>(r) * B;
        for (int g = lane; g < G; g += kWarpSize) {
            ge[g] = -1, gc[g] = 0, gs[g] = detail::kSourceEmpty, gsl[g] = -1;
        }
        for (int b = lane; b < B; b += kWarpSize) cs[b] = -1;
        for (int e = lane; e < E; e += kWarpSize) seg[e] = -1;
        __syncwarp();
        for (int g = lane; g < epn; g += kWarpSize) {
            const int e = r * epn + g;
            const int32_t cnt = alloc[static_cast<int64_t>(e) * R + r];
            if (cnt > 0) ge[g] = e, gc[g] = cnt, gs[g] = detail::kSourceLocal;
        }
        // Remote experts in ascending id: a stable warp compaction.
        int next = epn;
        for (int e0 = 0; e0 < E; e0 += kWarpSize) {
            const int e = e0 + lane;
            int32_t cnt = 0;
            if (e < E && sc.home[e] != r) cnt = alloc[static_cast<int64_t>(e) * R + r];
            const unsigned m = __ballot_sync(kFullMask, cnt > 0);
            if (cnt > 0) {
                const int g = next + __popc(m & lanemask_lt());
                if (g < G) {
                    ge[g] = e, gc[g] = cnt;
                    gs[g] = detail::plan_is_prefetched(d, alloc, r, e) ? detail::kSourceSlot : detail::kSourcePeer;
                }
            }
            next += __popc(m);
        }
        __syncwarp();
        // Slots in ascending group (= expert) order among the prefetched groups.
        int slot = 0, peer = 0;
        for (int g0 = epn; g0 < G; g0 += kWarpSize) {
            const int g = g0 + lane;
            const int32_t src = g < G ? gs[g] : detail::kSourceEmpty;
            const unsigned ms = __ballot_sync(kFullMask, src == detail::kSourceSlot);
            const unsigned mp = __ballot_sync(kFullMask, src == detail::kSourcePeer);
            if (src == detail::kSourceSlot) {
                const int s = slot + __popc(ms & lanemask_lt());
                cs[s] = ge[g];
                gsl[g] = s;
            }
            slot += __popc(ms);
            peer += __popc(mp);
        }
        // cu_seqlens: inclusive prefix of the padded group sizes (warp scan per 32 groups).
        int32_t end = 0;
        for (int g0 = 0; g0 < G; g0 += kWarpSize) {
            const int g = g0 + lane;
            int32_t v = g < G ? static_cast<int32_t>(detail::align_up(gc[g], d.tp)) : 0;
#pragma unroll
            for (int off = 1; off < kWarpSize; off <<= 1) {
                const int32_t n = __shfl_up_sync(kFullMask, v, off);
                if (lane >= off) v += n;
            }
            if (g < G) cu[g] = end + v;
            end += __shfl_sync(kFullMask, v, kWarpSize - 1);
        }
        __syncwarp();
        for (int g = lane; g < G; g += kWarpSize) {
            if (ge[g] >= 0) seg[ge[g]] = g == 0 ? 0 : cu[g - 1];
            const int64_t o = static_cast<int64_t>(r) * G + g;
            a.group_expert[o] = ge[g];
            a.group_count[o] = gc[g];
            a.group_source[o] = static_cast<int8_t>(gs[g]);
            a.group_slot[o] = gsl[g];
            a.cu_seqlens[o] = cu[g];
        }
        __syncwarp();  // the temporaries are rebuilt for the warp's next rank
        if (lane == 0) {
            a.remote_experts[r] = next - epn;
            a.copies_received[r] = slot;
            a.peer_reads[r] = peer;
            a.copies_pushed[r] = 0;
        }
    }
    __syncthreads();
    stamp(7);
    if (alloc != a.alloc)
        for (size_t i = tid; i < ER; i += kThreads) a.alloc[i] = alloc[i];

    // ---- Phase 3c: copies pushed per home rank, then the costs. ----
    for (int i = tid; i < R * B; i += kThreads) {
        const int32_t e = a.copies[i];
        if (e >= 0) atomicAdd(a.copies_pushed + sc.home[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int64_t traffic = 0, copies = 0, crossing = 0;
        for (int r = 0; r < R; ++r) {
            traffic = detail::imax64(traffic, a.copies_received[r] + a.copies_pushed[r]);
            copies += a.remote_experts[r];
            crossing += a.crossing_out[r];
            if (a.remote_experts[r] > epn)
                record_error(team, DeviceErrorKind::kInternal, rank, -1, Phase::kPlanReady, -1, -1, a.remote_experts[r],
                             epn, 0);
        }
        cost_out[0] = traffic;
        cost_out[1] = copies;
        cost_out[2] = crossing;
        cost_out[3] = static_cast<int64_t>(s_acc[0][2]);
    }
    __syncthreads();
    stamp(8);
    if (timing != nullptr && tid == 0) timing[13] = static_cast<int64_t>(clock64());  // SM cycles of the plan
}

}  // namespace evenep::cuda::device
