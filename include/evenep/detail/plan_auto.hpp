// evenep/detail/plan_auto.hpp — the auto planner policy (docs/auto.md): each step, from the gathered histogram alone,
// the imbalance budget to plan with — exact balance, a slack budget up to the configured maximum, or the budget at
// which no rank needs a copy — whichever the step-cost model (AutoCostModel, plan_auto_model.hpp) predicts fastest.
//
// The CPU planner (plan_sequential in plan_candidates.hpp) and the GPU planner (plan_block.cuh, phase 1) both call
// these functions on the same integers, so the GPU's decision is the CPU oracle's bit for bit: every quantity is an
// integer count or an integer number of picoseconds, and nothing depends on a summation order. The plan is then
// exactly the slack planner's plan for the chosen budget (plan_slack_targets with slack_ppm = the choice).
#pragma once

#include <cstdint>

#include "evenep/detail/host_device.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/detail/plan_core.hpp"

namespace evenep::detail {

// Candidates: 0, max/4, max/2, max and the no-copy budget (when it is within max), ascending and distinct.
inline constexpr int kAutoMaxCandidates = 5;

// Per-rank statistics of the prediction (AutoRankView) and the decision's workspace in int32 words: the statistics
// [kAutoRankStats][R], then one targets array [R] per candidate.
inline constexpr int kAutoRankStats = 4;
EVENEP_HOST_DEVICE constexpr int64_t plan_auto_work_size(int R) {
    return static_cast<int64_t>(kAutoRankStats + kAutoMaxCandidates) * R;
}

// What the prediction reads per rank (all but load and q from plan_auto_rank_stats, or the GPU's warp sums of the
// same definitions).
struct AutoRankView {
    const int64_t* load;     // [R] load_before: entries of the rank's own experts
    const int32_t* q;        // [R] even quotas (invariant 1)
    const int32_t* nonzero;  // [R] own experts with at least one entry
    const int32_t* own;      // [R] entries sourced on the rank for its own experts (stay home without a copy)
    const int32_t* src;      // [R] entries sourced on the rank
    const int32_t* top;      // [R] the largest load of one of the rank's own experts
};

// Rank r's statistics from the histogram tpe [R*E] and expert_load [E] (the CPU's loop; the GPU sums and maxes the same
// integers per warp). All four are < 2^31 (entries, or experts).
EVENEP_HOST_DEVICE inline void plan_auto_rank_stats(const PlanDims& d,
                                                    const int32_t* tpe,
                                                    const int64_t* expert_load,
                                                    int r,
                                                    int32_t& nonzero,
                                                    int32_t& own,
                                                    int32_t& src,
                                                    int32_t& top) {
    const int32_t* row = tpe + static_cast<int64_t>(r) * d.E;
    nonzero = own = src = top = 0;
    for (int g = 0; g < d.epn; ++g) {
        const int e = r * d.epn + g;
        nonzero += expert_load[e] > 0 ? 1 : 0;
        own += row[e];
        top = expert_load[e] > top ? static_cast<int32_t>(expert_load[e]) : top;
    }
    for (int e = 0; e < d.E; ++e) src += row[e];
}

// Rank r's share of the no-copy budget (below): 0 unless it is a donor (L_r > q_r); a donor's smallest budget (ppm,
// rounded up) under which it keeps all of its own experts' entries; -1 when none exists (entries and a zero quota).
EVENEP_HOST_DEVICE inline int64_t plan_auto_no_copy_need(int64_t load, int32_t q) {
    if (load <= q) return 0;
    if (q <= 0) return -1;
    // q·ppm >= (L - q)·10^6  =>  ⌈q·ppm / 10^6⌉ >= L - q  =>  slack_cap(q, ppm) >= L.
    return ((load - q) * kSlackPpmOne + q - 1) / q;
}

// The smallest budget (ppm, rounded up) under which every rank keeps all of its own experts' entries: then the
// slack targets are the loads themselves and the plan has no copy at all. -1 when none exists (a rank with entries
// and a zero quota).
EVENEP_HOST_DEVICE inline int64_t plan_auto_no_copy_ppm(int R, const int64_t* load, const int32_t* q) {
    int64_t ppm = 0;
    for (int r = 0; r < R; ++r) {
        const int64_t need = plan_auto_no_copy_need(load[r], q[r]);
        if (need < 0) return -1;
        ppm = need > ppm ? need : ppm;
    }
    return ppm;
}

// The no-copy need as an unsigned key whose maximum over the ranks decides the same candidate (the GPU's warp
// reduction, plan_auto.cuh): the need when it is within mx (the largest budget), mx + 1 when it is above it or
// does not exist — either way no no-copy budget within mx. plan_auto_no_copy_of_key turns the maximum back.
EVENEP_HOST_DEVICE inline uint32_t plan_auto_no_copy_key(int64_t load, int32_t q, int32_t mx) {
    const int64_t need = plan_auto_no_copy_need(load, q);
    return need >= 0 && need <= mx ? static_cast<uint32_t>(need) : static_cast<uint32_t>(mx) + 1u;
}
EVENEP_HOST_DEVICE inline int64_t plan_auto_no_copy_of_key(uint32_t key, int32_t mx) {
    return key <= static_cast<uint32_t>(mx) ? static_cast<int64_t>(key) : -1;
}

// The largest budget a plan of d may choose (d.slack_ppm, at least 0).
EVENEP_HOST_DEVICE inline int32_t plan_auto_max_ppm(const PlanDims& d) { return d.slack_ppm > 0 ? d.slack_ppm : 0; }

// The candidate budgets (ppm) into ppm[kAutoMaxCandidates], ascending and distinct, from the largest budget mx and
// the no-copy budget (taken when within [0, mx]); returns how many.
EVENEP_HOST_DEVICE inline int plan_auto_candidate_list(int32_t mx, int64_t no_copy, int32_t* ppm) {
    int n = 0;
    auto add = [&](int64_t v) {  // v ascending over the calls but the no-copy budget: insert in order
        if (v < 0 || v > mx) return;
        int at = n;
        while (at > 0 && ppm[at - 1] > v) --at;
        if (at > 0 && ppm[at - 1] == v) return;
        for (int i = n; i > at; --i) ppm[i] = ppm[i - 1];
        ppm[at] = static_cast<int32_t>(v);
        ++n;
    };
    add(0);
    add(mx / 4);
    add(mx / 2);
    add(mx);
    add(no_copy);
    return n;
}

// The candidate budgets (ppm) of a plan of d with these loads and quotas (plan_auto_candidate_list).
EVENEP_HOST_DEVICE inline int plan_auto_candidates(const PlanDims& d,
                                                   const int64_t* load,
                                                   const int32_t* q,
                                                   int32_t* ppm) {
    return plan_auto_candidate_list(plan_auto_max_ppm(d), plan_auto_no_copy_ppm(d.R, load, q), ppm);
}

// Entries of one copied piece, for the copy counts the prediction estimates: over the donors (L_r > q_r), the mean of
// their mean non-empty expert load and their largest expert load, at least 1. Why the midpoint (docs/auto.md,
// "Calibration"): against the step model on the MoonEP workloads the mean alone over-counts copies (a fill takes the
// large experts first) and chose budgets that lost up to 1.6 ms a step on drift; the largest alone under-counts them
// (a lower bound) and kept exact balance where the no-copy budget won 3.6 ms (zero_load); the midpoint lost at most
// 0.25 ms a step (drift) and recovered most of the gain elsewhere.
EVENEP_HOST_DEVICE inline int64_t plan_auto_piece_of(int64_t entries, int64_t experts, int64_t top) {
    // entries, experts, top: the donors' entries, non-empty experts and largest expert load (0 without a donor)
    // entries < N < 2^31: the mean divides in 32 bits (the 64-bit quotient; the GPU's 64-bit division is a routine).
    top = top > 1 ? top : 1;
    const int64_t mean =
        experts > 0 && entries > experts ? static_cast<uint32_t>(entries) / static_cast<uint32_t>(experts) : 1;
    return (mean + top) / 2 > 1 ? (mean + top) / 2 : 1;
}
EVENEP_HOST_DEVICE inline int64_t plan_auto_piece(int R, const AutoRankView& v) {
    int64_t entries = 0, experts = 0, top = 0;
    for (int r = 0; r < R; ++r)
        if (v.load[r] > v.q[r]) {
            entries += v.load[r];
            experts += v.nonzero[r];
            top = v.top[r] > top ? v.top[r] : top;
        }
    return plan_auto_piece_of(entries, experts, top);
}

// plan_slack_targets in closed form, one rank at a time (the GPU computes every rank's target at once, plan_auto.cuh;
// tests/unit/planner_auto_test.cpp checks it against plan_slack_targets). With the budget ppm > 0: a donor (L > q)
// keeps min(L, slack_cap(q, ppm)); the donors' total rise `extra` is cut from the receivers' (L < q) quotas in
// (deficit, rank) order, each receiver by min(its deficit, what is left of extra after the receivers before it):
// before = the deficits of the receivers before it (plan_slack_receiver_first), summed.
EVENEP_HOST_DEVICE inline int64_t plan_slack_donor_rise(int64_t load, int32_t q, int32_t ppm) {
    if (ppm <= 0 || load <= q) return 0;
    return imin64(load, slack_cap(q, ppm)) - q;
}
EVENEP_HOST_DEVICE inline bool plan_slack_receiver_first(int64_t deficit_s, int s, int64_t deficit_r, int r) {
    return deficit_s < deficit_r || (deficit_s == deficit_r && s < r);
}
EVENEP_HOST_DEVICE inline int32_t plan_slack_target(int64_t load, int32_t q, int32_t ppm, int64_t extra, int64_t before) {
    if (ppm <= 0) return q;
    if (load > q) return static_cast<int32_t>(q + plan_slack_donor_rise(load, q, ppm));
    const int64_t deficit = q - load, left = extra - before;
    const int64_t cut = left <= 0 ? 0 : imin64(left, deficit);
    return static_cast<int32_t>(q - cut);
}

// One rank's terms of the prediction (plan_auto_predict) with target t: its compute, its token phase (entries sent or
// received, at least 0), its copies (received or pushed) and the copies it receives.
struct AutoRankTerms {
    int64_t compute, tokens, copy, recv;
};
EVENEP_HOST_DEVICE inline AutoRankTerms plan_auto_rank_terms(
    const PlanDims& d, int64_t piece, int64_t load, int64_t target, int32_t nonzero, int32_t own, int32_t src) {
    const AutoCostModel& m = d.auto_model;
    // |t - L| and piece are in [0, N) and [1, N), N < 2^31 entries: the ceiling divides in 32 bits (the quotient of
    // the 64-bit division, without the GPU's long 64-bit division routine).
    const uint32_t gap = static_cast<uint32_t>(target > load ? target - load : load - target);
    const uint32_t p = static_cast<uint32_t>(piece);
    const int64_t pieces = (gap + p - 1) / p;
    const int64_t recv = target > load ? imin64(pieces, d.epn) : 0;
    const int64_t push = load > target ? pieces : 0;
    AutoRankTerms t;
    t.compute = m.row_ps * target + m.group_ps * (nonzero + recv);
    t.tokens = imax64(0, imax64(src - own, target - own));
    t.copy = imax64(recv, push);
    t.recv = recv;
    return t;
}

// The predicted step from the ranks' terms: compute, tokens and copy their maxima (each at least 0), copies the sum of
// the copies received.
EVENEP_HOST_DEVICE inline int64_t plan_auto_step(
    const AutoCostModel& m, int64_t compute, int64_t tokens, int64_t copy, int64_t copies) {
    const int64_t phase = tokens * m.entry_ps;
    const int64_t dispatch = tokens * (m.dispatch_entry_ps > 0 ? m.dispatch_entry_ps : m.entry_ps);
    return m.plan_copy_ps * copies + imax64(dispatch, copy * m.weight_ps) + compute + 3 * phase + copy * m.grad_ps;
}

// Predicted step time (ps) of planning with budget `ppm`; t: [R] int32 scratch (the targets on exit). With t_r the
// targets of plan_slack_targets and P = plan_auto_piece:
//   copies   receivers (t_r > L_r) get ⌈(t_r − L_r)/P⌉ copies (at most epn), donors push ⌈(L_r − t_r)/P⌉;
//   compute  max_r row_ps·t_r + group_ps·(non-empty own experts + copies received);
//   tokens   one phase = max_r max(src_r − own_r, t_r − own_r) entries (sent, received) · entry_ps (the dispatch
//            phase · dispatch_entry_ps where set: FP8 rows);
//   copy     c = max_r max(copies received, pushed): prefetch c·weight_ps overlaps dispatch, reduce c·grad_ps does not;
//   step     plan_copy_ps·copies + max(tokens, prefetch) + compute + 3·tokens + reduce (perf/step_model.hpp's step).
EVENEP_HOST_DEVICE inline int64_t plan_auto_predict(
    const PlanDims& d, const AutoRankView& v, int64_t piece, int32_t ppm, int32_t* t) {
    const int R = d.R;
    for (int r = 0; r < R; ++r) t[r] = v.q[r];
    PlanDims dd = d;
    dd.slack_ppm = ppm;
    plan_slack_targets(dd, v.load, t);
    int64_t compute = 0, tokens = 0, copy = 0, copies = 0;
    for (int r = 0; r < R; ++r) {
        const AutoRankTerms k = plan_auto_rank_terms(d, piece, v.load[r], t[r], v.nonzero[r], v.own[r], v.src[r]);
        compute = imax64(compute, k.compute);
        tokens = imax64(tokens, k.tokens);
        copy = imax64(copy, k.copy);
        copies += k.recv;
    }
    return plan_auto_step(d.auto_model, compute, tokens, copy, copies);
}

// The chosen candidate: the first (smallest budget) of the least predicted cost.
EVENEP_HOST_DEVICE inline int plan_auto_choose(const int64_t* cost, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (cost[i] < cost[best]) best = i;
    return best;
}

// The whole decision on one thread (the CPU planner and the GPU's serial planner kernel): loads, quotas and the
// expert loads of phase 1 in; the chosen budget (ppm, in [0, d.slack_ppm]) out. work: [plan_auto_work_size(R)] int32.
EVENEP_HOST_DEVICE inline int32_t plan_auto_slack_ppm(const PlanDims& d,
                                                      const int32_t* tpe,
                                                      const int64_t* expert_load,
                                                      const int64_t* load,
                                                      const int32_t* q,
                                                      int32_t* work) {
    const int R = d.R;
    int32_t* nonzero = work;
    int32_t* own = work + R;
    int32_t* src = work + 2 * R;
    int32_t* top = work + 3 * R;
    int32_t* t = work + kAutoRankStats * R;
    for (int r = 0; r < R; ++r) plan_auto_rank_stats(d, tpe, expert_load, r, nonzero[r], own[r], src[r], top[r]);
    const AutoRankView v{load, q, nonzero, own, src, top};
    int32_t ppm[kAutoMaxCandidates];
    int64_t cost[kAutoMaxCandidates];
    const int n = plan_auto_candidates(d, load, q, ppm);
    if (n == 1) return ppm[0];  // nothing to compare
    const int64_t piece = plan_auto_piece(R, v);
    for (int i = 0; i < n; ++i) cost[i] = plan_auto_predict(d, v, piece, ppm[i], t);
    return ppm[plan_auto_choose(cost, n)];
}

// Phase 1b under the auto policy: chooses the budget, then the slack targets for it replace the quotas in a.q (as
// plan_loads_and_quotas does for a fixed budget). Returns the chosen budget (ppm).
EVENEP_HOST_DEVICE inline int32_t plan_auto_targets(const PlanDims& d,
                                                    const int32_t* tpe,
                                                    PlanArrays& a,
                                                    int32_t* work) {
    PlanDims dd = d;
    dd.slack_ppm = plan_auto_slack_ppm(d, tpe, a.expert_load, a.load_before, a.q, work);
    plan_slack_targets(dd, a.load_before, a.q);
    return dd.slack_ppm;
}

}  // namespace evenep::detail
