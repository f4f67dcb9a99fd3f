// evenep/detail/plan_candidates.hpp — optimized mode's candidate constructions and the whole planning sequence,
// on raw arrays, shared by host and device (the rest of the algorithm: evenep/detail/plan_core.hpp).
//
// The CPU planner (src/core/planner.cpp) calls plan_sequential; the GPU's serial kernel calls the same function and
// the block planner (src/cuda/device/plan_block.cuh, plan_warp.cuh) mirrors these loops bit for bit. Nothing here
// allocates, throws or uses the standard library's containers; inputs are checked by the callers.
#pragma once

#include <cstdint>

#include "evenep/detail/plan_auto.hpp"
#include "evenep/detail/plan_core.hpp"

namespace evenep::detail {

// ---------------------------------------------------------------------------------------------------------
// Phase 2b: a global balanced construction (optimized mode candidate). Receivers are filled largest
// deficit first; each piece comes from an expert whose home still has excess, never overshooting the donor,
// so no rank is both donor and receiver. `best_fit` picks the smallest piece that fills the receiver
// completely (keeping large experts whole for large deficits), else the largest piece; otherwise always
// the largest piece. Ties between equal pieces go to the expert with more of the receiver's own tokens (fewer
// crossing rows), then the lower id. `overshoot` lets a receiver that could not otherwise be filled within epn
// pieces take a piece larger than its donor's excess (the donor becomes a receiver). With `spread_pushed`
// ([R] workspace) the donor that has pushed the fewest pieces so far is preferred first (aimed at cost 1).
// Returns false if some receiver would need more than epn remote experts (the caller then discards this
// candidate). Workspace: excess[R], deficit[R], avail[E] (int64), remote[R] (int32).
// ---------------------------------------------------------------------------------------------------------
// One step of the global fill: expert e's piece of `moved` entries goes from its home to receiver u. overshoot: the
// piece (moved = the receiver's whole need) exceeds the home's excess, so the home turns receiver of the difference.
// (Also lane 0's commit in the GPU planner's warp version, src/cuda/device/plan_warp.cuh.)
// T: the state's integer type (int64 here, int32 in the GPU planner: every value is < N < 2^31). alloc may be null
// (the GPU planner keeps the pieces instead of the matrix).
template <typename T>
EVENEP_HOST_DEVICE inline void plan_fill_take(const PlanDims& d, int e, int u, int64_t moved, bool overshoot,
                                              T* excess, T* deficit, T* avail, int32_t* remote,
                                              int32_t* spread_pushed, int32_t* alloc) {
    const int h = e / d.epn;
    avail[e] -= static_cast<T>(moved);
    if (overshoot) {
        deficit[h] += static_cast<T>(moved - excess[h]);  // moved > excess[h], else a piece within the excess would have been taken
        excess[h] = 0;
        deficit[u] = 0;
    } else {
        excess[h] -= static_cast<T>(moved);
        deficit[u] -= static_cast<T>(moved);
    }
    remote[u] += 1;
    if (spread_pushed) spread_pushed[h] += 1;
    if (alloc) {
        alloc[static_cast<int64_t>(e) * d.R + h] -= static_cast<int32_t>(moved);
        alloc[static_cast<int64_t>(e) * d.R + u] += static_cast<int32_t>(moved);
    }
}

EVENEP_HOST_DEVICE inline bool plan_alloc_global_fill(const PlanDims& d, const PlanArrays& a, const int32_t* tpe,
                                                      bool best_fit, int64_t* excess, int64_t* deficit,
                                                      int64_t* avail, int32_t* remote, int32_t* alloc,
                                                      bool overshoot = false, int32_t* spread_pushed = nullptr) {
    const int R = d.R, E = d.E;
    for (int r = 0; r < R; ++r) {
        const int64_t b = a.load_before[r] - a.q[r];
        excess[r] = b > 0 ? b : 0;
        deficit[r] = b < 0 ? -b : 0;
        remote[r] = 0;
        if (spread_pushed) spread_pushed[r] = 0;
    }
    plan_alloc_home(d, a.expert_load, alloc);
    for (int e = 0; e < E; ++e) avail[e] = a.expert_load[e];
    for (;;) {
        int u = 0;
        for (int r = 1; r < R; ++r)
            if (deficit[r] > deficit[u]) u = r;
        const int64_t need = deficit[u];
        if (need <= 0) break;
        // The last remote expert a receiver may take must fill it completely.
        const bool must_fill = remote[u] + 1 >= d.epn;
        int best = -1;
        int64_t best_piece = 0;
        bool best_fills = false;
        int32_t best_local = -1;
        for (int e = 0; e < E; ++e) {
            const int h = e / d.epn;
            if (excess[h] <= 0 || avail[e] <= 0) continue;
            if (alloc[static_cast<int64_t>(e) * R + u] > 0) continue;  // one piece per (expert, receiver)
            const int64_t piece = imin64(avail[e], excess[h]);
            const bool fills = piece >= need;
            if (must_fill && !fills) continue;
            const int32_t local = tpe[static_cast<int64_t>(u) * E + e];
            bool better;
            if (best < 0) {
                better = true;
            } else if (spread_pushed && spread_pushed[h] != spread_pushed[best / d.epn]) {
                better = spread_pushed[h] < spread_pushed[best / d.epn];  // spread pushes over donors (cost 1)
            } else if (best_fit && fills != best_fills) {
                better = fills;
            } else if (best_fit && fills) {
                better = piece < best_piece || (piece == best_piece && local > best_local);
            } else {
                better = piece > best_piece || (piece == best_piece && local > best_local);
            }
            if (better) {
                best = e;
                best_piece = piece;
                best_fills = fills;
                best_local = local;
            }
        }
        if (best < 0 && overshoot) {
            // Overshoot: no piece within its donor's excess fills the receiver, so take a piece that does and let its
            // donor become a receiver of the difference (one more copy later instead of more than epn pieces here).
            // The smallest such expert wins (ties: more of the receiver's own tokens, then lower id).
            for (int e = 0; e < E; ++e) {
                const int h = e / d.epn;
                if (excess[h] <= 0 || avail[e] < need) continue;
                if (alloc[static_cast<int64_t>(e) * R + u] > 0) continue;
                const int32_t local = tpe[static_cast<int64_t>(u) * E + e];
                if (best < 0 || avail[e] < best_piece || (avail[e] == best_piece && local > best_local)) {
                    best = e;
                    best_piece = avail[e];
                    best_local = local;
                }
            }
            if (best >= 0) {
                plan_fill_take(d, best, u, need, /*overshoot=*/true, excess, deficit, avail, remote, spread_pushed,
                               alloc);
                continue;
            }
        }
        if (best < 0) return false;
        plan_fill_take(d, best, u, imin64(best_piece, need), /*overshoot=*/false, excess, deficit, avail, remote,
                       spread_pushed, alloc);
    }
    return true;
}

// ---------------------------------------------------------------------------------------------------------
// Phase 2c: a path (optimized mode candidates, aimed at cost 1). The ranks whose balance is not zero are put
// in a line; the flow on the edge between neighbours i and i+1 is the prefix sum F_i of their balances, carried
// by the side that has the surplus in pieces of its own experts (largest first). So every rank exchanges
// copies with at most its two neighbours. `alternate` = false: sorted by balance, largest surplus first (a
// one-directional chain); true: greedily the rank that brings the running sum closest to zero next (keeps the
// flows, hence the pieces per edge, small). Fails (returns false) when a rank runs out of its own entries or
// would receive more than epn remote experts. Ties: lower rank. Workspace: order[R], remote[R] (int32).
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline bool plan_alloc_path(const PlanDims& d, const PlanArrays& a, bool alternate, int32_t* order,
                                               int32_t* remote, int32_t* alloc) {
    const int R = d.R;
    int n = 0;
    for (int r = 0; r < R; ++r) {
        remote[r] = 0;
        if (a.load_before[r] != a.q[r]) order[n++] = r;
    }
    const auto balance = [&](int r) { return a.load_before[r] - a.q[r]; };
    // Selection sort by the order's key (n <= R; small).
    int64_t running = 0;
    for (int i = 0; i < n; ++i) {
        int pick = i;
        for (int j = i + 1; j < n; ++j) {
            const int64_t bj = balance(order[j]), bp = balance(order[pick]);
            bool better;
            if (!alternate || i == 0) {
                better = bj > bp || (bj == bp && order[j] < order[pick]);
            } else {
                const int64_t dj = imax64(running + bj, -(running + bj)), dp = imax64(running + bp, -(running + bp));
                better = dj < dp || (dj == dp && order[j] < order[pick]);
            }
            if (better) pick = j;
        }
        const int t = order[i];
        order[i] = order[pick];
        order[pick] = t;
        running += balance(order[i]);
    }
    plan_alloc_home(d, a.expert_load, alloc);
    int64_t flow = 0;
    for (int i = 0; i + 1 < n; ++i) {
        flow += balance(order[i]);
        if (flow == 0) continue;
        const int giver = flow > 0 ? order[i] : order[i + 1];
        const int taker = flow > 0 ? order[i + 1] : order[i];
        int64_t give = flow > 0 ? flow : -flow;
        while (give > 0) {
            int e = -1;
            int64_t most = 0;
            for (int g = 0; g < d.epn; ++g) {
                const int f = giver * d.epn + g;
                const int64_t left = alloc[static_cast<int64_t>(f) * R + giver];
                if (left > most && alloc[static_cast<int64_t>(f) * R + taker] == 0) {
                    e = f;
                    most = left;
                }
            }
            if (e < 0 || remote[taker] >= d.epn) return false;
            const int64_t moved = imin64(most, give);
            alloc[static_cast<int64_t>(e) * R + giver] -= static_cast<int32_t>(moved);
            alloc[static_cast<int64_t>(e) * R + taker] += static_cast<int32_t>(moved);
            remote[taker] += 1;
            give -= moved;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------------------------------
// Phase 2 driver: the alloc matrix of a mode. Reference: the published greedy. Optimized: the reference plan and
// the candidates below, in this fixed order; the cheapest by plan_cost_less among those no worse than the
// reference on costs 1 and 2 wins (earlier candidates win ties), so optimized is never worse than reference.
//   1 global fill, largest piece     2 global fill, best fit       (both with overshoot unless `legacy`)
//   3 = 1 with pushes spread         4 = 2 with pushes spread
//   5 path, sorted (chain)           6 path, alternating
// The full set is the default of the host Planner and what the GPU planner (src/cuda/device/plan_block.cuh)
// mirrors. `legacy` (Planner's `extended_candidates` = false, kept to measure what the extension buys):
// candidates 1 and 2 only, without overshoot.
// ---------------------------------------------------------------------------------------------------------
inline constexpr int kNumOptimizedCandidates = 6;

// Workspace of plan_alloc_mode: int64 [R*R + 3*R + E], int32 [kNumOptimizedCandidates*E*R + 3*R].
struct PlanWork {
    int64_t* w64;
    int32_t* w32;
};
EVENEP_HOST_DEVICE constexpr int64_t plan_work64_size(int R, int E) { return int64_t{R} * R + 3 * R + E; }
EVENEP_HOST_DEVICE constexpr int64_t plan_work32_size(int R, int E) {
    return int64_t{kNumOptimizedCandidates} * E * R + 3 * R;
}
static_assert(plan_work32_size(1, 1) >= plan_auto_work_size(1), "plan_sequential: the auto decision's workspace");

EVENEP_HOST_DEVICE inline bool plan_alloc_candidate(const PlanDims& d, const PlanArrays& a, const int32_t* tpe,
                                                    int candidate, const PlanWork& w, int32_t* alloc,
                                                    bool legacy = false) {
    const int R = d.R, E = d.E;
    int64_t* balance = w.w64;
    int64_t* w1 = balance + R + static_cast<int64_t>(R) * R;
    int64_t* wE = w1 + 2 * R;
    int32_t* i1 = w.w32 + static_cast<int64_t>(kNumOptimizedCandidates) * E * R;
    int32_t* i2 = i1 + R;
    if (candidate >= 4) return plan_alloc_path(d, a, candidate == 5, i1, i2, alloc);
    return plan_alloc_global_fill(d, a, tpe, candidate % 2 == 1, balance, w1, wE, i1, alloc, /*overshoot=*/!legacy,
                                  candidate >= 2 ? i2 : nullptr);
}

// Writes the chosen alloc into a.alloc.
EVENEP_HOST_DEVICE inline void plan_alloc_mode(const PlanDims& d, const PlanArrays& a, const int32_t* tpe,
                                               const PlanWork& w, bool legacy = false) {
    const int R = d.R, E = d.E;
    int64_t* balance = w.w64;
    int64_t* z = balance + R;
    int64_t* wE = z + static_cast<int64_t>(R) * R + 2 * R;
    plan_alloc_reference(d, a, balance, z, wE, a.alloc);
    if (!d.locality) return;  // reference mode
    int32_t* cand = w.w32;
    int32_t* i1 = cand + static_cast<int64_t>(kNumOptimizedCandidates) * E * R;
    int32_t* i2 = i1 + R;
    int32_t* i3 = i2 + R;
    PlanCostValues ref_cost{}, best_cost{};
    plan_cost_of(d, tpe, a.alloc, i1, i2, i3, ref_cost);
    best_cost = ref_cost;
    int best = -1;
    for (int c = 0; c < (legacy ? 2 : kNumOptimizedCandidates); ++c) {
        int32_t* alloc = cand + static_cast<int64_t>(c) * E * R;
        if (!plan_alloc_candidate(d, a, tpe, c, w, alloc, legacy)) continue;
        PlanCostValues cost{};
        if (!plan_cost_of(d, tpe, alloc, i1, i2, i3, cost)) continue;
        if (cost.max_rank_copy_traffic > ref_cost.max_rank_copy_traffic || cost.total_copies > ref_cost.total_copies)
            continue;
        if (plan_cost_less(cost, best_cost)) {
            best_cost = cost;
            best = c;
        }
    }
    if (best >= 0) {
        const int32_t* src = cand + static_cast<int64_t>(best) * E * R;
        for (int64_t i = 0; i < static_cast<int64_t>(E) * R; ++i) a.alloc[i] = src[i];
    }
}

// ---------------------------------------------------------------------------------------------------------
// The whole sequence (phases 1-3) on one thread: the host Planner and the GPU's serial reference kernel both
// call this, so the two cannot drift apart. The caller checks the inputs and remote_experts <= epn afterwards.
// Returns the budget (ppm) the plan was made with: d.slack_ppm, or under the auto policy the one it chose.
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline int32_t plan_sequential(
    const PlanDims& d, const int32_t* tpe, PlanArrays& a, const PlanWork& w, bool legacy, PlanCostValues& cost) {
    plan_loads_and_quotas(d, tpe, a);
    // The decision's workspace: work32 is free until phase 2 (plan_work32_size >= plan_auto_work_size).
    const int32_t ppm = d.auto_slack ? plan_auto_targets(d, tpe, a, w.w32) : d.slack_ppm;
    plan_alloc_mode(d, a, tpe, w, legacy);
    cost = PlanCostValues{0, 0, 0, 0};
    plan_finalize(d, tpe, a, cost);
    return ppm;
}

}  // namespace evenep::detail
