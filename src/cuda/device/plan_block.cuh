// The planner on one thread block: the same plan as src/core/planner.cpp, bit for bit, with the loops of
// evenep/detail/plan_core.hpp spread over warps and threads.
//
// Why it is bit-exact: every quantity is an integer; sums, counts and maxima are order-independent; every argmax
// of the sequential code ("first index wins ties", or the lexicographic key of plan_alloc_global_fill) is a warp
// reduction that keeps the lowest index among equal keys; every step whose result depends on its predecessor (the
// greedy loops) stays sequential, executed by one warp with lane 0 committing the update. Helpers that are cheap
// per element (plan_local_keep, plan_is_prefetched) are called from plan_core.hpp itself.
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
#include "evenep/detail/ep_layout.hpp"
#include "evenep/detail/plan_core.hpp"

namespace evenep::cuda::device {

using detail::PlanArrays;
using detail::PlanCostValues;
using detail::PlanDims;

inline constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------------------
// The sequential planner (planner.cpp's Planner::plan without the host input checks), on thread 0.
// ---------------------------------------------------------------------------------------------------------
__device__ inline void plan_block_serial(
    const PlanDims& d, const int32_t* tpe, const PlanArrays& a, int64_t* cost_out, int64_t* work64, int32_t* work32) {
    if (threadIdx.x != 0) return;
    const int R = d.R, E = d.E;
    detail::plan_loads_and_quotas(d, tpe, const_cast<PlanArrays&>(a));
    int64_t* balance = work64;
    int64_t* z = balance + R;
    int64_t* w1 = z + static_cast<size_t>(R) * R;
    int64_t* w2 = w1 + R;
    int64_t* wE = w2 + R;
    int32_t* cand = work32;
    int32_t* i1 = cand + 4 * static_cast<size_t>(E) * R;
    int32_t* i2 = i1 + R;
    int32_t* i3 = i2 + R;
    detail::plan_alloc_reference(d, a, balance, z, wE, a.alloc);
    if (d.locality) {
        PlanCostValues ref_cost{}, best_cost{};
        detail::plan_cost_of(d, tpe, a.alloc, i1, i2, i3, ref_cost);
        best_cost = ref_cost;
        int32_t* best = a.alloc;
        for (int variant = 0; variant < 2; ++variant) {
            int32_t* alloc = cand + static_cast<size_t>(variant) * E * R;
            if (!detail::plan_alloc_global_fill(d, a, tpe, variant == 1, balance, w1, wE, i1, alloc)) continue;
            PlanCostValues c{};
            if (!detail::plan_cost_of(d, tpe, alloc, i1, i2, i3, c)) continue;
            if (c.max_rank_copy_traffic > ref_cost.max_rank_copy_traffic || c.total_copies > ref_cost.total_copies)
                continue;
            if (detail::plan_cost_less(c, best_cost)) {
                best_cost = c;
                best = alloc;
            }
        }
        if (best != a.alloc)
            for (size_t i = 0; i < static_cast<size_t>(E) * R; ++i) a.alloc[i] = best[i];
    }
    PlanCostValues cost{};
    detail::plan_finalize(d, tpe, const_cast<PlanArrays&>(a), cost);
    cost_out[0] = cost.max_rank_copy_traffic;
    cost_out[1] = cost.total_copies;
    cost_out[2] = cost.crossing_rows;
    cost_out[3] = cost.moved_entries;
}

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

// plan_alloc_global_fill on one warp. excess/deficit/remote/avail/alloc initialised by the caller
// (excess/deficit from balance, remote 0, avail = T_e, alloc = home). Returns the same bool.
__device__ inline bool warp_global_fill(const PlanDims& d,
                                        const int32_t* tpe,
                                        bool best_fit,
                                        int64_t* excess,
                                        int64_t* deficit,
                                        int64_t* avail,
                                        int32_t* remote,
                                        int32_t* alloc,
                                        int lane,
                                        int& iterations) {
    const int R = d.R, E = d.E;
    for (;; ++iterations) {
        const int u = warp_first_max(deficit, R, lane);
        const int64_t need = deficit[u];
        if (need <= 0) return true;
        const bool must_fill = remote[u] + 1 >= d.epn;
        unsigned bp = 0, bl = 0;  // this lane's best (primary, local); ascending e keeps the lowest id on ties
        int be = -1;
        for (int e = lane; e < E; e += kWarpSize) {
            const int h = e / d.epn;
            const int64_t ex = excess[h], av = avail[e];
            if (ex <= 0 || av <= 0) continue;
            if (alloc[static_cast<int64_t>(e) * R + u] > 0) continue;
            const int64_t piece = detail::imin64(av, ex);
            const bool fills = piece >= need;
            if (must_fill && !fills) continue;
            const unsigned cp = fill_primary(piece, fills, best_fit);
            const unsigned cl = static_cast<unsigned>(tpe[static_cast<int64_t>(u) * E + e]);
            if (cp > bp || (cp == bp && cl > bl)) bp = cp, bl = cl, be = e;
        }
        const unsigned pmax = __reduce_max_sync(kFullMask, bp);
        if (pmax == 0) return false;
        const unsigned lmax = __reduce_max_sync(kFullMask, bp == pmax ? bl : 0u);
        const int best = static_cast<int>(
            __reduce_min_sync(kFullMask, bp == pmax && bl == lmax ? static_cast<unsigned>(be) : 0xffffffffu));
        if (lane == 0) {
            const int h = best / d.epn;
            const int64_t moved = detail::imin64(detail::imin64(avail[best], excess[h]), need);
            avail[best] -= moved;
            excess[h] -= moved;
            deficit[u] -= moved;
            remote[u] += 1;
            alloc[static_cast<int64_t>(best) * R + h] -= static_cast<int32_t>(moved);
            alloc[static_cast<int64_t>(best) * R + u] += static_cast<int32_t>(moved);
        }
        __syncwarp();  // orders lane 0's updates before the next iteration's reads
    }
}

// ---------------------------------------------------------------------------------------------------------
// The parallel planner. kThreads >= 128 (warp 0: reference transfers, warps 1-2: the two global fills).
// ---------------------------------------------------------------------------------------------------------
// The block planner's state (PlanScratchLayout) carved from `base` (shared or global memory).
struct PlanScratch {
    int64_t *balance, *z, *remaining, *excess, *deficit, *avail, *expert_load;
    int32_t *tpe, *alloc, *cand, *fill_remote, *cost_pushed, *cost_remote, *groups;
};

__device__ inline PlanScratch carve_scratch(char* base, int R, int E) {
    const PlanScratchLayout l = PlanScratchLayout::make(R, E);
    return PlanScratch{
        reinterpret_cast<int64_t*>(base + l.balance),     reinterpret_cast<int64_t*>(base + l.z),
        reinterpret_cast<int64_t*>(base + l.remaining),   reinterpret_cast<int64_t*>(base + l.excess),
        reinterpret_cast<int64_t*>(base + l.deficit),     reinterpret_cast<int64_t*>(base + l.avail),
        reinterpret_cast<int64_t*>(base + l.expert_load), reinterpret_cast<int32_t*>(base + l.tpe),
        reinterpret_cast<int32_t*>(base + l.alloc),       reinterpret_cast<int32_t*>(base + l.cand),
        reinterpret_cast<int32_t*>(base + l.fill_remote), reinterpret_cast<int32_t*>(base + l.cost_pushed),
        reinterpret_cast<int32_t*>(base + l.cost_remote), reinterpret_cast<int32_t*>(base + l.groups)};
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
    static_assert(kThreads >= 128 && kThreads % kWarpSize == 0, "plan_block_parallel needs >= 4 whole warps");
    constexpr int kWarps = kThreads / kWarpSize;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, E = d.E, epn = d.epn, G = d.G, B = d.B;
    const size_t ER = static_cast<size_t>(E) * R;
    const bool optimized = d.locality;
    int64_t* balance = sc.balance;
    int64_t* z = sc.z;
    int64_t* remaining = sc.remaining;
    int64_t* excess = sc.excess;            // [2][R]
    int64_t* deficit = sc.deficit;          // [2][R]
    int64_t* avail = sc.avail;              // [2][E]
    int32_t* cand = sc.cand;                // [2][E*R]
    int32_t* fill_remote = sc.fill_remote;  // [2][R]
    int32_t* cost_pushed = sc.cost_pushed;  // [3][R]
    int32_t* cost_remote = sc.cost_remote;  // [3][R]
    int32_t* alloc = sc.alloc;              // the working alloc (copied to alloc at the end)
    const int32_t* tpe = sc.tpe;
    auto stamp = [&](int i) {
        if (timing != nullptr && tid == 0) timing[i] = static_cast<int64_t>(global_timer_ns());
    };
    stamp(0);
    if (timing != nullptr && tid == 0) timing[11] = 0, timing[12] = static_cast<int64_t>(clock64());
    if (sc.tpe != tpe_in)
        for (size_t i = tid; i < static_cast<size_t>(R) * E; i += kThreads) sc.tpe[i] = tpe_in[i];

    __shared__ unsigned long long s_acc[3][3];  // per candidate: total_copies, crossing_rows, moved_entries
    __shared__ unsigned long long s_total;
    __shared__ int s_fill_ok[2];
    __shared__ int s_best;

    // ---- Phase 1: loads and quotas (plan_loads_and_quotas). ----
    if (tid == 0) s_total = 0;
    if (tid < 9) s_acc[tid / 3][tid % 3] = 0;
    __syncthreads();
    {
        unsigned long long part = 0;
        for (int e = tid; e < E; e += kThreads) {
            int64_t t = 0;
            for (int r = 0; r < R; ++r) t += tpe[static_cast<int64_t>(r) * E + e];
            a.expert_load[e] = t;
            sc.expert_load[e] = t;
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
    for (size_t i = tid; i < ER; i += kThreads) {
        const int e = static_cast<int>(i / R), r = static_cast<int>(i % R);
        const int32_t home = r == e / epn ? static_cast<int32_t>(sc.expert_load[e]) : 0;
        alloc[i] = home;
        if (optimized) cand[i] = cand[ER + i] = home;
    }
    for (int e = tid; e < E; e += kThreads) {
        remaining[e] = sc.expert_load[e];
        if (optimized) avail[e] = avail[E + e] = sc.expert_load[e];
    }
    for (int i = tid; i < R * R; i += kThreads) z[i] = 0;
    for (int r = tid; r < R; r += kThreads) {
        const int64_t b = balance[r];  // written in phase 1
        if (optimized)
            for (int v = 0; v < 2; ++v) {
                excess[v * R + r] = b > 0 ? b : 0;
                deficit[v * R + r] = b < 0 ? -b : 0;
                fill_remote[v * R + r] = 0;
            }
    }
    __syncthreads();
    stamp(2);

    // ---- Phase 2b: warp 0 runs the rank-level transfers; warps 1 and 2 the two global fills. ----
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
    } else if (optimized && (warp == 1 || warp == 2)) {
        const int v = warp - 1;
        int iterations = 0;
        const bool ok = warp_global_fill(d, tpe, v == 1, excess + v * R, deficit + v * R, avail + v * E,
                                         fill_remote + v * R, cand + v * ER, lane, iterations);
        if (lane == 0) s_fill_ok[v] = ok ? 1 : 0;
        if (lane == 0 && timing != nullptr) timing[9 + v] = iterations;
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

    // ---- Phase 2d (optimized): costs of the three candidates (plan_cost_of), then the choice of planner.cpp. ----
    if (optimized) {
        for (int i = tid; i < 3 * R; i += kThreads) cost_pushed[i] = cost_remote[i] = 0;
        __syncthreads();
        // Warp-uniform loops: per-warp sums (each < N < 2^31) before one 64-bit shared atomic per warp.
        for (int c = 0; c < 3; ++c) {
            if (c > 0 && !s_fill_ok[c - 1]) continue;
            const int32_t* X = c == 0 ? alloc : cand + (c - 1) * ER;
            for (int e0 = warp * kWarpSize; e0 < E; e0 += kThreads) {
                const int e = e0 + lane;
                int64_t crossing = 0, copies = 0, moved = 0;
                if (e < E) {
                    const int h = e / epn;
                    int64_t rest_lo = 0, cap_lo = 0;
                    for (int r = 0; r < R; ++r) {
                        const int64_t a_er = X[static_cast<int64_t>(e) * R + r];
                        const int64_t t_re = tpe[static_cast<int64_t>(r) * E + e];
                        const int64_t keep = detail::plan_local_keep(d, tpe, X, e, r);
                        const int64_t rest = t_re - keep, cap = a_er - keep;
                        const int64_t lo = detail::imax64(rest_lo, cap_lo),
                                      hi = detail::imin64(rest_lo + rest, cap_lo + cap);
                        crossing += t_re - (keep + (hi > lo ? hi - lo : 0));
                        rest_lo += rest;
                        cap_lo += cap;
                        if (r != h && a_er > 0) {
                            atomicAdd(cost_remote + c * R + r, 1);
                            copies += 1;
                            moved += a_er;
                            if (B >= epn || detail::plan_is_prefetched(d, X, r, e))
                                atomicAdd(cost_pushed + c * R + h, 1);
                        }
                    }
                }
                const unsigned wc = __reduce_add_sync(kFullMask, static_cast<unsigned>(copies));
                const unsigned wx = __reduce_add_sync(kFullMask, static_cast<unsigned>(crossing));
                const unsigned wm = __reduce_add_sync(kFullMask, static_cast<unsigned>(moved));
                if (lane == 0) {
                    if (wc) atomicAdd(&s_acc[c][0], static_cast<unsigned long long>(wc));
                    if (wx) atomicAdd(&s_acc[c][1], static_cast<unsigned long long>(wx));
                    if (wm) atomicAdd(&s_acc[c][2], static_cast<unsigned long long>(wm));
                }
            }
        }
        __syncthreads();
        if (tid == 0) {
            PlanCostValues cv[3];
            bool ok[3];
            for (int c = 0; c < 3; ++c) {
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
            for (int v = 0; v < 2; ++v) {
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

    // ---- Phase 3a: locality keep, prefixes, crossing rows and moved entries (plan_finalize), thread per expert. ----
    for (int e0 = warp * kWarpSize; e0 < E; e0 += kThreads) {  // warp-uniform: per-warp sums before atomics
        const int e = e0 + lane;
        const bool valid = e < E;
        int32_t rest = 0, cap = 0;
        int32_t* rp = a.rest_prefix + static_cast<int64_t>(e) * (R + 1);
        int32_t* cp = a.cap_prefix + static_cast<int64_t>(e) * (R + 1);
        int64_t moved = 0;
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
                if (r != e / epn) moved += a_er;
            }
            const unsigned wsum = __reduce_add_sync(kFullMask, static_cast<unsigned>(cross));  // < entries of r
            if (lane == 0 && wsum)
                atomicAdd(reinterpret_cast<unsigned long long*>(a.crossing_out + r),
                          static_cast<unsigned long long>(wsum));
        }
        if (valid) {
            rp[R] = rest;
            cp[R] = cap;
        }
        const unsigned wm = __reduce_add_sync(kFullMask, static_cast<unsigned>(moved));
        if (lane == 0 && wm) atomicAdd(&s_acc[0][2], static_cast<unsigned long long>(wm));
    }
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
            if (e < E && e / epn != r) cnt = alloc[static_cast<int64_t>(e) * R + r];
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
        if (e >= 0) atomicAdd(a.copies_pushed + e / epn, 1);
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
