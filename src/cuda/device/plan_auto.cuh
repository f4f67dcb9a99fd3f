// Phase 1b of the block planner (plan_block.cuh): the imbalance budget's targets on one warp — under the auto policy
// with the budget the decision of evenep/detail/plan_auto.hpp chooses per plan (docs/auto.md), under a fixed budget
// with that budget (detail::plan_slack_targets' targets).
//
// Why it is the CPU's result bit for bit: every per-rank quantity is one of plan_auto.hpp's per-rank functions
// (plan_auto_no_copy_key, plan_slack_donor_rise, plan_slack_target, plan_auto_rank_terms) on the same integers, and
// everything across ranks is a sum or a maximum of integers below 2^31 (entries, experts, copies; the compute term a
// non-negative int64), which no order changes. The targets use plan_slack_targets' closed form (plan_auto.hpp; the
// CPU tests check it against the sequential loop): a receiver's cut needs only the donors' total rise and the sum of
// the deficits of the receivers ahead of it in (deficit, rank) order, so no rank waits for another.
//
// Critical path (one warp, lane l takes ranks l + 32 k): the receivers' order (R broadcast reads), then for all candidates at
// once one pass over the lane's ranks and a handful of warp reductions per candidate — instead of, per candidate on
// its own lane, the sequential plan_slack_targets (O(R) per receiver cut) and an O(R) loop with 64-bit divisions.
#pragma once

#include <cstdint>

#include "cuda/device/plan_warp.cuh"
#include "evenep/detail/plan_auto.hpp"

namespace evenep::cuda::device {

// The per-rank statistics phase 1's rank loop leaves for the decision: [kBudgetStats][R] int32 words of the planner
// scratch (cost_pushed, free until phase 2a). load and q always; the others under the auto policy only.
inline constexpr int kBudgetStats = 7;
struct BudgetStats {
    int32_t* load;      // load_before (< N < 2^31)
    int32_t* q;         // the even quota
    int32_t* nonzero;   // own experts with at least one entry
    int32_t* own;       // own experts' entries sourced on the rank
    int32_t* src;       // entries sourced on the rank
    int32_t* top;       // largest load of one own expert
    uint32_t* no_copy;  // detail::plan_auto_no_copy_key
};
__device__ __forceinline__ BudgetStats budget_stats(int32_t* words, int R) {
    return BudgetStats{words,         words + R,     words + 2 * R,
                       words + 3 * R, words + 4 * R, words + 5 * R,
                       reinterpret_cast<uint32_t*>(words + 6 * R)};
}

// Rank r's statistics on one warp (r warp-uniform): the definitions of detail::plan_auto_rank_stats — own sums
// t_home (the home rank's entries of each own expert: tpe[r][e]), src the histogram row r (int4 reads when tpe_vec:
// rows 16-byte aligned; tpe == nullptr: st.src already holds the row sums, the column pass's). load and q are the
// rank loop's.
__device__ __forceinline__ void warp_budget_rank_stats(const PlanDims& d,
                                                       int r,
                                                       int64_t load,
                                                       int32_t q,
                                                       const int64_t* expert_load,
                                                       const int32_t* t_home,
                                                       const int32_t* tpe,
                                                       bool tpe_vec,
                                                       const BudgetStats& st,
                                                       int lane) {
    if (lane == 0) st.load[r] = static_cast<int32_t>(load), st.q[r] = q;
    if (!d.auto_slack) return;
    const int E = d.E, epn = d.epn;
    unsigned nonzero = 0, own = 0, src = 0, top = 0;  // each < N < 2^31
    for (int g = lane; g < epn; g += kWarpSize) {
        const int e = r * epn + g;
        const unsigned x = static_cast<unsigned>(expert_load[e]);
        nonzero += x > 0 ? 1u : 0u;
        top = x > top ? x : top;
        own += static_cast<unsigned>(t_home[e]);
    }
    const int32_t* row = tpe == nullptr ? nullptr : tpe + static_cast<int64_t>(r) * E;
    if (row != nullptr && tpe_vec) {
        const int4* v = reinterpret_cast<const int4*>(row);
#pragma unroll 8
        for (int i = lane; i < E / 4; i += kWarpSize) {
            const int4 x = v[i];
            src += static_cast<unsigned>(x.x) + static_cast<unsigned>(x.y) + static_cast<unsigned>(x.z) +
                   static_cast<unsigned>(x.w);
        }
    } else if (row != nullptr) {
#pragma unroll 4
        for (int e = lane; e < E; e += kWarpSize) src += static_cast<unsigned>(row[e]);
    }
    nonzero = __reduce_add_sync(kFullMask, nonzero);
    own = __reduce_add_sync(kFullMask, own);
    if (row != nullptr) src = __reduce_add_sync(kFullMask, src);
    top = __reduce_max_sync(kFullMask, top);
    if (lane == 0) {
        st.nonzero[r] = static_cast<int32_t>(nonzero), st.own[r] = static_cast<int32_t>(own);
        st.top[r] = static_cast<int32_t>(top);
        if (row != nullptr) st.src[r] = static_cast<int32_t>(src);
        st.no_copy[r] = detail::plan_auto_no_copy_key(load, q, detail::plan_auto_max_ppm(d));
    }
}

// The maximum of a 64-bit unsigned value over the warp (two 32-bit reductions: the high words, then the low words
// of the lanes holding the highest).
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
    const unsigned hi = __reduce_max_sync(kFullMask, static_cast<unsigned>(v >> 32));
    const unsigned lo =
        __reduce_max_sync(kFullMask, static_cast<unsigned>(v >> 32) == hi ? static_cast<unsigned>(v) : 0u);
    return (static_cast<uint64_t>(hi) << 32) | lo;
}

// The budget (ppm) of the plan and its targets, on one warp (every lane; needs d.auto_slack or d.slack_ppm > 0):
// q_out[r] = the target, balance[r] = load - target for every rank. Under auto: detail::plan_auto_slack_ppm's choice
// (candidates, piece, per-candidate prediction, first cheapest), then detail::plan_slack_targets for it; under a fixed
// budget its targets. before: [R] int32 scratch. Lane l takes ranks l, l + 32, ... in rolled loops reading the
// statistics from shared memory (the planner is at its register limit: arrays of ranks in registers spilled).
__device__ inline int32_t warp_budget_targets(const PlanDims& d,
                                              const BudgetStats& st,
                                              int32_t* before,
                                              int32_t* q_out,
                                              int64_t* balance,
                                              int lane) {
    constexpr int C = detail::kAutoMaxCandidates;
    const int R = d.R;
    auto deficit = [&](int r) {  // receivers (L < q): q - L; 0 otherwise
        const int32_t l = st.load[r], q = st.q[r];
        return q > l ? q - l : 0;
    };
    // before[r]: the deficits of the receivers ahead of r in (deficit, rank) order, summed (<= N < 2^31).
#pragma unroll 1
    for (int r = lane; r < R; r += kWarpSize) {
        const int32_t dr = deficit(r);
        int32_t b = 0;
        for (int s = 0; s < R; ++s) {  // broadcast reads
            const int32_t ds = deficit(s);
            if (ds > 0 && detail::plan_slack_receiver_first(ds, s, dr, r)) b += ds;
        }
        before[r] = b;
    }
    // The candidates: the fixed budget alone, or plan_auto_candidates' (the no-copy budget from the ranks' keys).
    int32_t ppm[C] = {d.slack_ppm};
    int n = 1;
    if (d.auto_slack) {
        const int32_t mx = detail::plan_auto_max_ppm(d);
        uint32_t key = 0;
        for (int r = lane; r < R; r += kWarpSize) key = max(key, st.no_copy[r]);
        key = __reduce_max_sync(kFullMask, key);
        n = detail::plan_auto_candidate_list(mx, detail::plan_auto_no_copy_of_key(key, mx), ppm);
    }
    // Each candidate's total donor rise (<= the donors' excess <= N).
    uint32_t extra[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        extra[c] = 0;
        if (c >= n) continue;  // warp-uniform
        unsigned part = 0;
#pragma unroll 1
        for (int r = lane; r < R; r += kWarpSize)
            part += static_cast<unsigned>(detail::plan_slack_donor_rise(st.load[r], st.q[r], ppm[c]));
        extra[c] = __reduce_add_sync(kFullMask, part);
    }
    int best = 0;
    if (n > 1) {
        // The piece (plan_auto_piece) from the donors' sums and maximum.
        unsigned entries = 0, experts = 0, top = 0;
#pragma unroll 1
        for (int r = lane; r < R; r += kWarpSize) {
            const int32_t l = st.load[r];
            if (l <= st.q[r]) continue;
            entries += static_cast<unsigned>(l);
            experts += static_cast<unsigned>(st.nonzero[r]);
            top = max(top, static_cast<unsigned>(st.top[r]));
        }
        entries = __reduce_add_sync(kFullMask, entries);
        experts = __reduce_add_sync(kFullMask, experts);
        top = __reduce_max_sync(kFullMask, top);
        const int64_t piece = detail::plan_auto_piece_of(entries, experts, top);
        // Every candidate's terms in one pass over the lane's ranks (plan_auto_predict's loop), then its reductions.
        uint64_t compute[C];
        unsigned tokens[C], copy[C], copies[C];
#pragma unroll
        for (int c = 0; c < C; ++c) compute[c] = 0, tokens[c] = copy[c] = copies[c] = 0;
#pragma unroll 1
        for (int r = lane; r < R; r += kWarpSize) {
            const int32_t l = st.load[r], q = st.q[r], b = before[r];
            const int32_t nz = st.nonzero[r], own = st.own[r], src = st.src[r];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                if (c >= n) continue;
                const int32_t t = detail::plan_slack_target(l, q, ppm[c], extra[c], b);
                const detail::AutoRankTerms x = detail::plan_auto_rank_terms(d, piece, l, t, nz, own, src);
                const uint64_t cx = static_cast<uint64_t>(x.compute > 0 ? x.compute : 0);
                compute[c] = cx > compute[c] ? cx : compute[c];
                tokens[c] = max(tokens[c], static_cast<unsigned>(x.tokens));
                copy[c] = max(copy[c], static_cast<unsigned>(x.copy));
                copies[c] += static_cast<unsigned>(x.recv);
            }
        }
        int64_t cost[C];
#pragma unroll
        for (int c = 0; c < C; ++c) {
            cost[c] = 0;
            if (c >= n) continue;
            cost[c] = detail::plan_auto_step(d.auto_model, static_cast<int64_t>(warp_max_u64(compute[c])),
                                             __reduce_max_sync(kFullMask, tokens[c]),
                                             __reduce_max_sync(kFullMask, copy[c]),
                                             __reduce_add_sync(kFullMask, copies[c]));
        }
        best = detail::plan_auto_choose(cost, n);
    }
    int32_t p = ppm[0];
    uint32_t x = extra[0];
#pragma unroll
    for (int c = 1; c < C; ++c)
        if (c == best) p = ppm[c], x = extra[c];
#pragma unroll 1
    for (int r = lane; r < R; r += kWarpSize) {
        const int32_t l = st.load[r];
        const int32_t t = detail::plan_slack_target(l, st.q[r], p, x, before[r]);
        q_out[r] = t;
        balance[r] = static_cast<int64_t>(l) - t;
    }
    return p;
}

}  // namespace evenep::cuda::device
