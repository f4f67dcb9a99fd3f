// The planner on one thread block: the same plan as src/core/planner.cpp, bit for bit, with the loops of
// evenep/detail/plan_core.hpp and plan_candidates.hpp spread over warps and threads.
//
// Why it is bit-exact: every quantity is an integer; sums, counts and maxima are order-independent; every argmax
// of the sequential code ("first index wins ties", or the lexicographic key of plan_alloc_global_fill) is a warp
// reduction that keeps the lowest index among equal keys; every step whose result depends on its predecessor (the
// greedy loops) stays sequential, executed by one warp with lane 0 committing the update (plan_warp.cuh). Every
// allocation is kept in sparse form (evenep/detail/plan_sparse.hpp: home column + pieces); its costs, stays,
// prefetched test and route rows are plan_sparse.hpp's own functions, checked against plan_core.hpp's dense code on
// the CPU (tests/unit/planner_sparse_test.cpp).
//
// Optimized mode runs all six candidates of plan_candidates.hpp plan_alloc_mode (the default candidate set).
//
// Two entry points:
//   plan_block_serial   thread 0 runs planner.cpp's sequence of plan_core calls (reference for tests; slow);
//   plan_block_parallel all threads, warp-specialised (see the phase headers below).
// plan_block_parallel<kThreads, kCluster = true> is block 0 of the planner's thread-block cluster (plan_cluster.cuh):
// blocks 1-4 run the four global fills and blocks 5-7 the home route rows, and this block waits for them before phase
// 3 (a template parameter: each kernel compiles only its own variant, the cluster's block 0 without the warp fills).
// Both write the plan arrays `a` and cost[4] = {max_rank_copy_traffic, total_copies, crossing_rows, moved_entries};
// both record DeviceErrorKind::kInternal if a rank ends with more than epn remote experts.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/device/cluster.cuh"
#include "cuda/device/plan_auto.cuh"
#include "cuda/device/plan_fill.cuh"
#include "cuda/device/plan_finish.cuh"
#include "cuda/device/plan_home.cuh"
#include "cuda/device/plan_stamps.cuh"
#include "cuda/device/plan_warp.cuh"
#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
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
    cost_out[kPlanCostSlackWord] = detail::plan_sequential(d, tpe, const_cast<PlanArrays&>(a),
                                                           detail::PlanWork{work64, work32}, /*legacy=*/false, cost);
    cost_out[0] = cost.max_rank_copy_traffic;
    cost_out[1] = cost.total_copies;
    cost_out[2] = cost.crossing_rows;
    cost_out[3] = cost.moved_entries;
}

// ---------------------------------------------------------------------------------------------------------
// The parallel planner: 16 warps (kThreads = 512).
// Every alloc matrix (the reference split, the six candidates) is kept in sparse form (evenep/detail/plan_sparse.hpp:
// home column + pieces, a few hundred entries instead of E*R), so the whole state (plan_finish.cuh PlanScratch) fits
// in shared memory up to R = 128 at E = 896; only the histogram tpe[R][E] stays in global memory when it does not fit.
// ---------------------------------------------------------------------------------------------------------
// Named barrier of the warps that run the reference split (warp 0 and warps 7..): warp 0's transfers are done.
__device__ __forceinline__ void split_group_sync(int threads) {
    asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}
// Its counterpart for the other warps (1-6, the fills and paths), placed where they finish phase 2b: it orders nothing
// the next __syncthreads does not, but it keeps the count of barriers every warp has passed equal. compute-sanitizer
// racecheck (CUDA 13.0) pairs accesses by that count whatever the barrier's id: without it, every write warp 0 made
// between two block barriers was reported against the reads warps 1-6 made after the second (hundreds of "RAW
// hazards" across a __syncthreads, plan_block.cuh:466 -> 475, plan.cu:332 -> 345, team.cuh:157 -> 160; synccheck
// clean).
__device__ __forceinline__ void other_group_sync(int threads) {
    asm volatile("bar.sync 3, %0;" ::"r"(threads) : "memory");
}

// timing (nullptr: none; never given without EVENEP_PLANNER_STAMPS): the planner's stamp words, named in
// evenep/detail/plan_stamps.hpp (thread 0: the phase boundaries, fill iterations, split pieces, clock and timer at the
// start and the end; each of phase 2's roles: when it finished).
// NOTE: a reading right after a block barrier is taken when the warp arrives there, not when the barrier releases,
// unless a memory access comes first (see stamp below); that, not clock skew, is why an earlier clock64 reading after
// a barrier came out before readings other warps took ahead of it. The stamps use %globaltimer (one clock per GPU).
template <int kThreads, bool kCluster>
__device__ __forceinline__ void plan_block_parallel(const PlanDims& d,
                                                    const int32_t* __restrict__ tpe_in,
                                                    const PlanArrays& a,
                                                    int64_t* cost_out,
                                                    const PlanScratch& sc,
                                                    const TeamView& team,
                                                    int rank,
                                                    int64_t* timing) {
    constexpr bool cluster = kCluster;
    static_assert(kThreads == 512, "plan_block_parallel: 16 warps (0 transfers, 1-4 fills, 5-6 paths, 7-15 split)");
    constexpr int kWarps = kThreads / kWarpSize;
    static_assert(kWarps <= kPlanMaxWarps, "PlanScratchLayout::warp_area holds kPlanMaxWarps warps");
    constexpr int kCand = detail::kNumOptimizedCandidates;  // 6; list 0 is the reference split, 1..6 the candidates
    constexpr int kSplitWarps = kWarps - 6;                 // warp 0 and warps 7..15
    constexpr int kLoadsInFlight = 8;                       // phase 1: histogram rows per thread read together
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, E = d.E, epn = d.epn, B = d.B;
    const bool optimized = d.locality, loc = d.locality;
    const int cap = sc.piece_cap, W = sc.held_words;
    int32_t* home = sc.home;
    int32_t* t_home = sc.t_home;
    // NOTE: a stamp right after a block barrier needs a shared-memory load before its timer read. The barrier
    // (BAR.SYNC.DEFER_BLOCKING) lets the warp go on issuing instructions that touch no memory, the timer read
    // included, before the other warps arrive: measured, a stamp after phase 2's barrier read 7 us earlier than the
    // fills' end stamps taken before it. A memory access waits for the barrier, and a warp issues in order.
    if constexpr (!detail::kPlannerStamps) timing = nullptr;
    __shared__ int s_stamp_order;
    auto stamp = [&](int i) {  // phase boundary i
        if (timing != nullptr && tid == 0) {
            (void)*static_cast<volatile int*>(&s_stamp_order);
            stamp_time(timing, detail::kStampPhase + i);
        }
    };
    if (timing != nullptr && tid == 0) {
        stamp_time(timing, detail::kStampTimerBegin);
        timing[detail::kStampClockBegin] = static_cast<int64_t>(clock64());
        for (int i = detail::kStampRolesDone; i < detail::kNumPlanStamps; ++i) timing[i] = 0;
        timing[detail::kStampSplitPieces] = 0;
    }
    stamp(0);
    // Phase 1 reads the histogram in place as int4 rows of four experts (vec_sums) when it stays in global memory and
    // its rows are 16-byte aligned. (Measured at R = 8: with the copy in shared memory, copying first and summing
    // from the copy is faster.)
    const bool vec_sums = sc.tpe == tpe_in && E % 4 == 0 && reinterpret_cast<uintptr_t>(tpe_in) % 16 == 0;
    if (sc.tpe != tpe_in)  // the histogram into shared memory
        block_copy_batched<kThreads>(sc.tpe, static_cast<int64_t>(R) * E, [&](int64_t i) { return tpe_in[i]; });
    const int32_t* tpe = sc.tpe;
    auto list_of = [&](int c) { return piece_list(sc, c, E); };
    auto sparse_of = [&](int c) { return sparse_alloc(sc, c, E); };

    __shared__ unsigned long long s_total, s_home_total;
    __shared__ int s_corr[kCand + 1];        // per list: crossing rows minus the base (signed, |.| < N)
    __shared__ unsigned s_moved[kCand + 1];  // per list: moved entries (< N)
    __shared__ int s_fill_ok[kCand];
    __shared__ unsigned s_traffic[kCand + 1];  // per list: the busiest rank's copy traffic
    __shared__ int s_ok[kCand + 1];
    __shared__ int s_best;

    // ---- Phase 1: loads and quotas (plan_loads_and_quotas), each expert's home and its home rank's entries. ----
    if (tid == 0) s_total = s_home_total = 0;
    if (tid <= kCand) s_corr[tid] = 0, s_moved[tid] = 0;
    // Imbalance budget's statistics (plan_auto.cuh BudgetStats in cost_pushed, free until phase 2a): under the auto
    // policy the vectorised column pass below also sums the histogram rows (src_r) when it reads them from global
    // memory (a second pass over [R, E] there is a chain of global reads per rank).
    const BudgetStats st = budget_stats(sc.cost_pushed, R);
    uint32_t* const row_src = d.auto_slack && vec_sums ? reinterpret_cast<uint32_t*>(st.src) : nullptr;
    for (int r = tid; r < R; r += kThreads) {
        sc.cross[r] = 0;  // before the cluster's home-row blocks add to it
        if (row_src != nullptr) row_src[r] = 0;
    }
    __syncthreads();
    {
        unsigned long long part = 0, part_home = 0;
        auto expert_done = [&](int e, int64_t t) {
            const int h = e / epn;
            const int32_t th = tpe[static_cast<int64_t>(h) * E + e];
            a.expert_load[e] = t;
            sc.expert_load[e] = t;
            home[e] = h;
            t_home[e] = th;
            part += static_cast<unsigned long long>(t);
            part_home += static_cast<unsigned long long>(th);
        };
        // The column sums are a chain of histogram reads (from global memory at large R) whose latency, not
        // bandwidth, is the cost: each thread keeps kLoadsInFlight of them in flight. Each partial sum < N < 2^31.
        if (vec_sums) {
            // Items (quad q of four experts, part p): rows p, p + P, ...; the P partial sums per expert meet in the
            // per-expert lists' range (free until phase 3: [P][E], P <= 7).
            const int Q = E / 4, P = max(1, min(7, kThreads / Q));
            int32_t* partial = sc.head;
            const int4* src = reinterpret_cast<const int4*>(tpe_in);
            for (int item = tid; item < Q * P; item += kThreads) {
                const int q = item % Q, p = item / Q;
                // Row sums (row_src): a warp whose lanes all read the same rows (one p) reduces each row's quads and
                // lane 0 adds them, other lanes add their own (integers: any order gives the same sums).
                const bool warp_rows = row_src != nullptr && __activemask() == kFullMask &&
                                       __all_sync(kFullMask, __shfl_sync(kFullMask, p, 0) == p);
                int4 acc = make_int4(0, 0, 0, 0);
                for (int r0 = p; r0 < R; r0 += kLoadsInFlight * P) {
                    // NOTE: every load unconditional (rows past R read row r0 again, dropped after): a guarded load
                    // is a branch, and the in-order warp then waits for each load's sum before the next load issues.
                    int4 x[kLoadsInFlight];
#pragma unroll
                    for (int k = 0; k < kLoadsInFlight; ++k) {
                        const int r = r0 + k * P;
                        x[k] = src[(r < R ? r : r0) * Q + q];
                    }
#pragma unroll
                    for (int k = 0; k < kLoadsInFlight; ++k) {
                        const int r = r0 + k * P;
                        if (r >= R) continue;
                        acc.x += x[k].x, acc.y += x[k].y, acc.z += x[k].z, acc.w += x[k].w;
                        if (row_src == nullptr) continue;
                        const unsigned row = static_cast<unsigned>(x[k].x) + static_cast<unsigned>(x[k].y) +
                                             static_cast<unsigned>(x[k].z) + static_cast<unsigned>(x[k].w);
                        if (!warp_rows) {
                            atomicAdd(row_src + r, row);
                        } else if (const unsigned w = __reduce_add_sync(kFullMask, row); lane == 0) {
                            atomicAdd(row_src + r, w);
                        }
                    }
                }
                int32_t* o = partial + p * E + 4 * q;
                o[0] = acc.x, o[1] = acc.y, o[2] = acc.z, o[3] = acc.w;
            }
            __syncthreads();
            for (int e = tid; e < E; e += kThreads) {
                int64_t t = 0;
                for (int p = 0; p < P; ++p) t += partial[p * E + e];
                expert_done(e, t);
            }
        } else {
            for (int e = tid; e < E; e += kThreads) {
                int32_t tk[kLoadsInFlight] = {};
                int r = 0;
                for (; r + kLoadsInFlight <= R; r += kLoadsInFlight) {
#pragma unroll
                    for (int k = 0; k < kLoadsInFlight; ++k) tk[k] += tpe[static_cast<int64_t>(r + k) * E + e];
                }
                for (; r < R; ++r) tk[0] += tpe[static_cast<int64_t>(r) * E + e];
                int64_t t = 0;
#pragma unroll
                for (int k = 0; k < kLoadsInFlight; ++k) t += tk[k];
                expert_done(e, t);
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            part += __shfl_xor_sync(kFullMask, part, off);
            part_home += __shfl_xor_sync(kFullMask, part_home, off);
        }
        if (lane == 0 && part) atomicAdd(&s_total, part);
        if (lane == 0 && part_home) atomicAdd(&s_home_total, part_home);
    }
    __syncthreads();
    const int64_t total = static_cast<int64_t>(s_total);
    // Crossing rows of the home matrix: every entry not on its expert's home rank (plan_sparse.hpp).
    const int64_t base_crossing = total - static_cast<int64_t>(s_home_total);
    // Imbalance budget (docs/slack.md, docs/auto.md; d.auto_slack and d.slack_ppm are block-uniform): the rank loop
    // leaves the decision's per-rank statistics (plan_auto.cuh BudgetStats, in cost_pushed; cost_remote the receivers'
    // order: both free until phase 2a), then
    // warp 0 chooses the budget under the auto policy and writes the targets into a.q and the balances
    // (warp_budget_targets: detail::plan_auto_slack_ppm's choice and detail::plan_slack_targets' targets, bit for bit).
    const bool budget = d.auto_slack || d.slack_ppm > 0;
    static_assert(kBudgetStats <= kCand + 1, "plan_block_parallel: the budget statistics fit cost_pushed [kCand + 1][R]");
    const bool tpe_vec = E % 4 == 0 && reinterpret_cast<uintptr_t>(tpe) % 16 == 0;
    for (int r = warp; r < R; r += kWarps) {  // a warp per rank
        const int64_t l = warp_rank_load(sc.expert_load, r, epn, lane);
        const int32_t q = detail::plan_even_quota(total, R, r);
        if (lane == 0) {
            a.load_before[r] = l;
            a.q[r] = q;
            sc.balance[r] = l - q;  // load_before - q: the rank's balance
        }
        if (budget)
            warp_budget_rank_stats(d, r, l, q, sc.expert_load, t_home, row_src == nullptr ? tpe : nullptr, tpe_vec, st,
                                   lane);
    }
    __syncthreads();
    if (budget) {
        if (warp == 0) {
            const int32_t ppm = warp_budget_targets(d, st, sc.cost_remote, a.q, sc.balance, lane);
            if (lane == 0) cost_out[kPlanCostSlackWord] = ppm;
        }
        __syncthreads();
    } else if (tid == 0) {
        cost_out[kPlanCostSlackWord] = d.slack_ppm;
    }
    stamp(1);
    // The cluster's other blocks (plan_cluster.cuh) read expert_load and balance once this arrival is seen.
    if (cluster) cluster_arrive();

    // ---- Phase 2a: initial state of the reference greedy, the four fills and the two paths. ----
    for (int e = tid; e < E; e += kThreads) {
        const int32_t t = static_cast<int32_t>(sc.expert_load[e]);
        sc.remaining[e] = t;
        if (optimized) {
            if (!cluster)  // the fill blocks own the fills' state
                for (int v = 0; v < 4; ++v) sc.avail[v * E + e] = t;
            sc.path_left[e] = sc.path_left[E + e] = t;
        }
    }
    for (int r = tid; r < R; r += kThreads) {
        const int64_t b = sc.balance[r];
        if (optimized) {
            if constexpr (!kCluster) {  // the warp fills' state (the cluster's fill blocks keep their own)
                for (int v = 0; v < 4; ++v) {
                    sc.excess[v * R + r] = static_cast<int32_t>(b > 0 ? b : 0);
                    sc.deficit[v * R + r] = static_cast<int32_t>(b < 0 ? -b : 0);
                    sc.fill_remote[v * R + r] = 0;
                }
                sc.spread[r] = sc.spread[R + r] = 0;
            }
            sc.fill_remote[4 * R + r] = sc.fill_remote[5 * R + r] = 0;  // the paths'
            for (int c = 0; c <= kCand; ++c) sc.cost_pushed[c * R + r] = sc.cost_remote[c * R + r] = 0;
            sc.path_load[r] = sc.path_load[R + r] = a.load_before[r];
            sc.path_q[r] = sc.path_q[R + r] = a.q[r];
        }
    }
    if (optimized && !cluster)
        for (size_t i = tid; i < static_cast<size_t>(4) * R * W; i += kThreads) sc.held[i] = 0;
    if (tid < 8 && !(cluster && tid >= 1 && tid <= 4)) sc.npieces[tid] = 0;
    if (tid < kCand) s_fill_ok[tid] = 0;  // a role that does not run (reference mode) leaves its list unused
    __syncthreads();
    stamp(2);

    // ---- Phase 2b, warp-specialised: warp 0 the rank-level transfers, warps 1-4 the four global fills
    // (plan_alloc_candidate 0-3: largest piece, best fit, each with pushes spread; all with overshoot), warps 5-6 the
    // two paths; warps 0 and 7-15 then split the reference transfers over the donors' experts and write the plan's
    // route rows for the home matrix (every expert that no piece leaves keeps them; phase 4 rewrites the others). ----
    int32_t* xh = sc.xfer;
    int32_t* xu = sc.xfer + R;
    int32_t* xa = sc.xfer + 2 * R;
    int32_t* nx = sc.xfer + 3 * R;
    if (warp == 0) {
        // The balances in registers (lane owns r = lane + 32 k): each step is four warp reductions.
        int64_t bal[kMaxRanksPerLane];
#pragma unroll
        for (int k = 0; k < kMaxRanksPerLane; ++k) bal[k] = lane + kWarpSize * k < R ? sc.balance[lane + kWarpSize * k] : 0;
        int n = 0;
        for (;; ++n) {
            // First index of the maximum and of the minimum (ascending r, strict comparisons).
            int64_t vmax = 0, vmin = 0;
            int imax = -1, imin = -1;
#pragma unroll
            for (int k = 0; k < kMaxRanksPerLane; ++k) {
                const int r = lane + kWarpSize * k;
                if (r >= R) continue;
                if (imax < 0 || bal[k] > vmax) vmax = bal[k], imax = r;
                if (imin < 0 || bal[k] < vmin) vmin = bal[k], imin = r;
            }
            const unsigned kmax = __reduce_max_sync(kFullMask, imax >= 0 ? order_key(vmax) : 0u);
            const unsigned kmin = __reduce_max_sync(kFullMask, imin >= 0 ? ~order_key(vmin) : 0u);
            const int h = static_cast<int>(__reduce_min_sync(
                kFullMask, imax >= 0 && order_key(vmax) == kmax ? static_cast<unsigned>(imax) : 0xffffffffu));
            const int u = static_cast<int>(__reduce_min_sync(
                kFullMask, imin >= 0 && ~order_key(vmin) == kmin ? static_cast<unsigned>(imin) : 0xffffffffu));
            const int64_t bh = static_cast<int32_t>(kmax ^ 0x80000000u), bu = static_cast<int32_t>(~kmin ^ 0x80000000u);
            if (bh <= 0) break;
            const int64_t amount = -bu;
#pragma unroll
            for (int k = 0; k < kMaxRanksPerLane; ++k) {
                if (lane + kWarpSize * k == h) bal[k] -= amount;
                if (lane + kWarpSize * k == u) bal[k] = 0;
            }
            if (lane == 0) xh[n] = h, xu[n] = u, xa[n] = static_cast<int32_t>(amount);
        }
        if (lane == 0) *nx = n;
        if (lane == 0 && timing != nullptr) stamp_time(timing, detail::kStampTransfersDone);
    } else if (optimized && !cluster && warp >= 1 && warp <= 4) {
        const int v = warp - 1;
        int iterations = 0;
        const FillState st{sc.excess + v * R, sc.deficit + v * R, sc.fill_remote + v * R,
                           v >= 2 ? sc.spread + (v - 2) * R : nullptr, sc.held + static_cast<size_t>(v) * R * W, W};
        const bool ok = warp_global_fill(d, st, list_of(1 + v), tpe, home, /*best_fit=*/v % 2 == 1, lane, iterations);
        if (lane == 0) s_fill_ok[v] = ok ? 1 : 0;
        if (lane == 0 && timing != nullptr) {
            if (v < 2) timing[detail::kStampFillIterations + v] = iterations;
            stamp_time(timing, detail::kStampFillDone + v);
            stamp_max_time(timing, detail::kStampRolesDone);
        }
    } else if (optimized && (warp == 5 || warp == 6)) {
        const int p = warp - 5;  // candidate 4: path sorted, 5: path alternating
        // The path reads only load_before and q: from the block's copies (shared memory when the scratch is).
        const bool ok = warp_alloc_path(d, sc.path_load + p * R, sc.path_q + p * R, p == 1, sc.order + p * R,
                                        sc.fill_remote + (4 + p) * R, list_of(5 + p), lane);
        if (lane == 0) s_fill_ok[4 + p] = ok ? 1 : 0;
        if (lane == 0 && timing != nullptr) {
            stamp_max_time(timing, detail::kStampRolesDone);
            stamp_max_time(timing, detail::kStampPathsDone);
        }
    }
    if (warp >= 1 && warp <= 6) other_group_sync((kWarps - kSplitWarps) * kWarpSize);
    if (warp == 0 || warp >= 7) {
        const int sg = warp == 0 ? 0 : warp - 6;  // index in the split group
        split_group_sync(kSplitWarps * kWarpSize);
        // The reference split, one warp per donor (donors touch disjoint experts); the donor's transfers are
        // gathered into the warp's area first.
        int32_t* wu = sc.warp_area + static_cast<size_t>(warp) * sc.split_words;
        int32_t* wa = wu + R;
        const int n_xfer = *nx;
        for (int h = sg; h < R; h += kSplitWarps) {
            int m = 0;
            for (int i0 = 0; i0 < n_xfer; i0 += kWarpSize) {
                const int i = i0 + lane;
                const bool in = i < n_xfer && xh[i] == h;
                const unsigned bits = __ballot_sync(kFullMask, in);
                if (in) {
                    const int k = m + __popc(bits & lanemask_lt());
                    wu[k] = xu[i], wa[k] = xa[i];
                }
                m += __popc(bits);
            }
            __syncwarp();
            if (m > 0) {
                const int pieces = warp_split_donor(d, h, wu, wa, m, sc.remaining, sc.piece_at, sc.piece_amount,
                                                    sc.npieces, lane);
                if (lane == 0 && timing != nullptr)
                    stamp_max(timing, detail::kStampSplitPieces, static_cast<uint64_t>(pieces));
            }
            __syncwarp();
        }
        if (lane == 0 && timing != nullptr) stamp_max_time(timing, detail::kStampSplitDone);
        // Route rows of the home matrix (plan_home.cuh; the cluster's blocks 5-7 write them instead).
        if (!cluster) warp_home_rows(d, tpe, a, sc.expert_load, home, t_home, sc.cross, sg, kSplitWarps, lane, true);
        if (!cluster && lane == 0 && timing != nullptr) stamp_max_time(timing, detail::kStampHomeRowsDone);
    }
    __syncthreads();
    if (cluster) {
        // The fill blocks' lists 1-4 and flags, and the home rows, are complete once every block has arrived.
        cluster_wait();
        cluster_arrive();
        cluster_wait();
        if (tid < 4) s_fill_ok[tid] = optimized ? sc.fill_flags[tid] : 0;
        __syncthreads();
    }
    stamp(3);


    // ---- Phase 3a: per-expert lists of every alloc matrix's pieces (the held bitsets' range is free again). ----
    const int num_lists = optimized ? kCand + 1 : 1;
    for (int i = tid; i < num_lists * E; i += kThreads) sc.head[i] = -1;
    __syncthreads();
    {  // one thread per piece of every list (numbered one after the other), not a loop over the lists
        int first[kCand + 2];
        first[0] = 0;
#pragma unroll
        for (int c = 0; c <= kCand; ++c) first[c + 1] = first[c] + (c < num_lists ? sc.npieces[c] : 0);
        for (int t = tid; t < first[kCand + 1]; t += kThreads) {
            int c = 0;
#pragma unroll
            for (int k = 1; k <= kCand; ++k) c += t >= first[k];
            const int i = t - first[c];
            sc.next[c * cap + i] = atomicExch(sc.head + c * E + sc.piece_at[c * cap + i] / R, i);
        }
    }
    __syncthreads();
    stamp(4);
    auto colprefix = [&](int e, int r) { return column_prefix(a, sc, loc, R, e, r); };

    // ---- Phase 3b (optimized): costs of the reference and the six candidates (plan_sparse_cost's terms, a thread
    // per piece), then the choice of plan_alloc_mode. ----
    if (optimized) {
        // One thread per piece of every list (the lists' pieces numbered one after the other).
        int first[kCand + 2];
        first[0] = 0;
#pragma unroll
        for (int c = 0; c <= kCand; ++c) first[c + 1] = first[c] + (c == 0 || s_fill_ok[c - 1] ? sc.npieces[c] : 0);
        for (int t = tid; t < first[kCand + 1]; t += kThreads) {
            int c = 0;
#pragma unroll
            for (int k = 1; k <= kCand; ++k) c += t >= first[k];
            const int i = t - first[c];
            const detail::SparseAlloc s = sparse_of(c);
            const int e = s.piece_at[i] / R, u = s.piece_at[i] - e * R, h = home[e];
            const int32_t amount = s.piece_amount[i];
            // The three histogram-side reads first (independent, in flight together).
            const int32_t t_u = tpe[static_cast<int64_t>(u) * E + e], P_u = colprefix(e, u), P_h = colprefix(e, h);
            atomicAdd(sc.cost_remote + c * R + u, 1);
            if (detail::plan_piece_prefetched(d, s, i)) atomicAdd(sc.cost_pushed + c * R + h, 1);
            int corr = -detail::plan_holder_stay(d, tpe, s, e, u, amount, t_u, P_u);
            if (detail::plan_piece_first_of_expert(s, R, i))
                corr += t_home[e] - detail::plan_holder_stay(d, tpe, s, e, h, s.home_rem[e], t_home[e], P_h);
            if (corr) atomicAdd(s_corr + c, corr);
            atomicAdd(s_moved + c, static_cast<unsigned>(amount));
        }
        __syncthreads();
        // A warp per list: its busiest rank's copy traffic and whether some rank holds more than epn remote experts.
        if (warp <= kCand) {
            const int c = warp;
            bool ok = c == 0 || s_fill_ok[c - 1];
            unsigned traffic = 0;  // < N
            for (int r = lane; r < R; r += kWarpSize) {
                const int32_t rem = sc.cost_remote[c * R + r];
                if (rem > epn) ok = false;
                const unsigned t = static_cast<unsigned>((rem < B ? rem : B) + sc.cost_pushed[c * R + r]);
                traffic = t > traffic ? t : traffic;
            }
            ok = __all_sync(kFullMask, ok);
            traffic = __reduce_max_sync(kFullMask, traffic);
            if (lane == 0) s_traffic[c] = traffic, s_ok[c] = ok ? 1 : 0;
        }
        __syncthreads();
        if (tid == 0) {
            PlanCostValues cv[kCand + 1];
            bool ok[kCand + 1];
            for (int c = 0; c <= kCand; ++c) {
                ok[c] = s_ok[c] != 0;
                cv[c] = PlanCostValues{s_traffic[c], sc.npieces[c], base_crossing + s_corr[c], s_moved[c]};
            }
            int best = 0;
            for (int c = 1; c <= kCand; ++c) {
                if (!ok[c]) continue;
                if (cv[c].max_rank_copy_traffic > cv[0].max_rank_copy_traffic ||
                    cv[c].total_copies > cv[0].total_copies)
                    continue;
                if (detail::plan_cost_less(cv[c], cv[best])) best = c;
            }
            s_best = best;
            sc.finish[0] = best;
        }
    } else if (tid == 0) {
        s_best = 0;
        sc.finish[0] = 0;
    }
    __syncthreads();
    stamp(5);
    const int w = s_best;
    const detail::SparseAlloc sw = sparse_of(w);

    // ---- Phase 4: the winner's plan arrays (plan_finish.cuh). ----
    plan_block_finish<kThreads, kCluster>(d, tpe, a, cost_out, sc, sw, team, rank, stamp);
    stamp(8);
    if (timing != nullptr && tid == 0) {
        timing[detail::kStampClockEnd] = static_cast<int64_t>(clock64());
        stamp_time(timing, detail::kStampTimerEnd);
    }
}

}  // namespace evenep::cuda::device
