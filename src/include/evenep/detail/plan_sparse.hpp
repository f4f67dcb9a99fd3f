// evenep/detail/plan_sparse.hpp — an alloc matrix in sparse form (its home column and its pieces) and the costs,
// stays and plan rows computed from that form alone, shared by host and device.
//
// Every alloc matrix the planner builds (the reference split, every optimized-mode candidate) is the home matrix
// (alloc[e][home(e)] = T_e) with pieces moved off the home column: expert e's piece on rank u != home(e) holds
// alloc[e][u] > 0 entries, at most one piece per (e, u), and the home keeps home_rem[e] = T_e - its pieces. The
// block planner (src/cuda/device/plan_block.cuh) keeps only that form — a few hundred pieces instead of E*R
// entries per candidate — and computes what plan_core.hpp computes from the dense matrix:
//   * costs (plan_cost_of): copies and moved entries are the pieces; crossing rows are the entries that do not
//     stay on their source rank, and only holders (ranks with alloc > 0) keep entries, so
//       crossing = N - sum_e t[h(e)][e] + sum over moved experts e of (t[h(e)][e] - sum over e's holders of stay)
//     (an expert without pieces keeps exactly its home rank's own entries, t[h][e]);
//   * the route rows of an expert (plan_finalize's local_keep, rest_prefix, cap_prefix): with holders H_e,
//       rest_prefix[e][r] = P[e][r] - sum_{h in H_e, h < r} keep_h,  cap_prefix[e][r] = sum_{h in H_e, h < r} (a_h - keep_h)
//     where P[e][r] = sum_{r' < r} t[r'][e] is the column prefix of the histogram.
// tests/unit/planner_sparse_test.cpp checks every function here against plan_core.hpp's dense code.
#pragma once

#include <cstdint>

#include "evenep/detail/plan_core.hpp"

namespace evenep::detail {

// One alloc matrix in sparse form. Piece i: expert piece_at[i] / R on rank piece_at[i] % R, piece_amount[i] > 0
// entries. Pieces may be in any order (every consumer sums over them or sorts them).
struct SparseAlloc {
    const int32_t* home_rem;      // [E] alloc[e][home(e)]
    const int32_t* piece_at;      // [n] e * R + u
    const int32_t* piece_amount;  // [n]
    int n;
    // Optional per-expert lists (the GPU planner links them): head[e] = some piece of e, next[i] = the next piece of
    // the same expert, -1 ends. Without them the functions below scan all n pieces.
    const int32_t* head = nullptr;
    const int32_t* next = nullptr;
    // Optional: t[home(e)][e] per expert (else read from the histogram).
    const int32_t* home_t = nullptr;
};

// Calls f(i) for every piece i of expert e.
template <typename F>
EVENEP_HOST_DEVICE inline void plan_for_each_piece_of(const SparseAlloc& s, int R, int e, const F& f) {
    if (s.head != nullptr) {
        for (int i = s.head[e]; i >= 0; i = s.next[i]) f(i);
    } else {
        for (int i = 0; i < s.n; ++i)
            if (s.piece_at[i] / R == e) f(i);
    }
}

// plan_local_keep of one entry of alloc.
EVENEP_HOST_DEVICE inline int32_t plan_keep_of(bool locality, int32_t t, int32_t a) {
    return locality ? (t < a ? t : a) : 0;
}

// Entries of (rank r, expert e) that stay on r (plan_cost_of's `stay`): r keeps `keep` of its own entries and its
// remaining rest = t - keep entries overlap its remaining capacity a - keep in the (rest, cap) prefix order.
EVENEP_HOST_DEVICE inline int32_t plan_stay_of(int32_t t, int32_t a, int32_t keep, int32_t rest_lo, int32_t cap_lo) {
    const int32_t rest = t - keep, cap = a - keep;
    const int32_t lo = rest_lo > cap_lo ? rest_lo : cap_lo;
    const int32_t hi = rest_lo + rest < cap_lo + cap ? rest_lo + rest : cap_lo + cap;
    return keep + (hi > lo ? hi - lo : 0);
}

// Sum of keep and of (a - keep) over expert e's holders on ranks below r (the home, then every piece of e).
EVENEP_HOST_DEVICE inline void plan_holders_below(const PlanDims& d, const int32_t* tpe, const SparseAlloc& s, int e,
                                                  int r, int32_t& keep_sum, int32_t& cap_sum) {
    const int h = e / d.epn;
    keep_sum = cap_sum = 0;
    if (h < r) {
        const int32_t a = s.home_rem[e];
        const int32_t t = s.home_t != nullptr ? s.home_t[e] : tpe[static_cast<int64_t>(h) * d.E + e];
        const int32_t k = plan_keep_of(d.locality, t, a);
        keep_sum += k;
        cap_sum += a - k;
    }
    plan_for_each_piece_of(s, d.R, e, [&](int i) {
        const int u = s.piece_at[i] - e * d.R;
        if (u >= r) return;
        const int32_t a = s.piece_amount[i];
        const int32_t k = plan_keep_of(d.locality, tpe[static_cast<int64_t>(u) * d.E + e], a);
        keep_sum += k;
        cap_sum += a - k;
    });
}

// Stay of holder rank r of expert e with a entries there; t = t[r][e], P_er = the column prefix P[e][r].
EVENEP_HOST_DEVICE inline int32_t plan_holder_stay(const PlanDims& d, const int32_t* tpe, const SparseAlloc& s, int e,
                                                   int r, int32_t a, int32_t t, int32_t P_er) {
    int32_t keep_below = 0, cap_below = 0;
    plan_holders_below(d, tpe, s, e, r, keep_below, cap_below);
    return plan_stay_of(t, a, plan_keep_of(d.locality, t, a), P_er - keep_below, cap_below);
}

// plan_is_prefetched for piece i: fewer than B remote experts of its rank rank strictly before it (more entries,
// then lower id).
EVENEP_HOST_DEVICE inline bool plan_piece_prefetched(const PlanDims& d, const SparseAlloc& s, int i) {
    if (d.B >= d.epn) return true;
    const int u = s.piece_at[i] % d.R, e = s.piece_at[i] / d.R;
    const int32_t mine = s.piece_amount[i];
    int before = 0;
    for (int j = 0; j < s.n; ++j) {
        if (j == i || s.piece_at[j] % d.R != u) continue;
        const int32_t other = s.piece_amount[j];
        const int f = s.piece_at[j] / d.R;
        if (other > mine || (other == mine && f < e)) ++before;
    }
    return before < d.B;
}

// The first piece of its expert among pieces [0, n) (its holders are then summed once per expert).
EVENEP_HOST_DEVICE inline bool plan_piece_first_of_expert(const SparseAlloc& s, int R, int i) {
    bool first = true;
    plan_for_each_piece_of(s, R, s.piece_at[i] / R, [&](int j) { first = first && j >= i; });
    return first;
}

// plan_cost_of on the sparse form, sequential (the block planner spreads the same terms over threads).
// colprefix(e, r) = P[e][r]; base_crossing = N - sum_e t[h(e)][e]. Workspace: pushed[R], recv[R], remote[R].
template <typename ColPrefix>
EVENEP_HOST_DEVICE inline bool plan_sparse_cost(const PlanDims& d, const int32_t* tpe, const SparseAlloc& s,
                                                const ColPrefix& colprefix, int64_t base_crossing, int32_t* pushed,
                                                int32_t* recv, int32_t* remote, PlanCostValues& c) {
    const int R = d.R;
    for (int r = 0; r < R; ++r) pushed[r] = recv[r] = remote[r] = 0;
    c = PlanCostValues{0, 0, base_crossing, 0};
    for (int i = 0; i < s.n; ++i) {
        const int e = s.piece_at[i] / R, u = s.piece_at[i] % R, h = e / d.epn;
        const int32_t a = s.piece_amount[i];
        remote[u] += 1;
        c.total_copies += 1;
        c.moved_entries += a;
        if (plan_piece_prefetched(d, s, i)) pushed[h] += 1;
        c.crossing_rows -= plan_holder_stay(d, tpe, s, e, u, a, tpe[static_cast<int64_t>(u) * d.E + e], colprefix(e, u));
        if (plan_piece_first_of_expert(s, R, i)) {
            const int32_t th = tpe[static_cast<int64_t>(h) * d.E + e];
            c.crossing_rows += th - plan_holder_stay(d, tpe, s, e, h, s.home_rem[e], th, colprefix(e, h));
        }
    }
    bool ok = true;
    for (int r = 0; r < R; ++r) {
        if (remote[r] > d.epn) ok = false;
        recv[r] = remote[r] < d.B ? remote[r] : d.B;
        c.max_rank_copy_traffic = imax64(c.max_rank_copy_traffic, recv[r] + pushed[r]);
    }
    return ok;
}

// Expert e's route rows (plan_finalize's alloc, local_keep, rest_prefix, cap_prefix) at rank r (r == R: only the
// two prefixes' last entries). a_er = alloc[e][r] (0 for r == R).
struct PlanRouteEntry {
    int32_t keep, rest_prefix, cap_prefix;
};
EVENEP_HOST_DEVICE inline PlanRouteEntry plan_route_entry(const PlanDims& d, const int32_t* tpe, const SparseAlloc& s,
                                                          int e, int r, int32_t a_er, int32_t P_er) {
    int32_t keep_below = 0, cap_below = 0;
    plan_holders_below(d, tpe, s, e, r, keep_below, cap_below);
    // Only holders keep entries (min(t, 0) = 0): the histogram is read for them alone.
    const int32_t keep = r < d.R && a_er > 0 ? plan_keep_of(d.locality, tpe[static_cast<int64_t>(r) * d.E + e], a_er) : 0;
    return PlanRouteEntry{keep, P_er - keep_below, cap_below};
}

}  // namespace evenep::detail
