// evenep/detail/plan_core.hpp — the planning algorithm on raw arrays, shared by host and device.
//
// The CPU planner (src/core/planner.cpp) and the GPU planner (src/cuda/kernels/plan.cu) both call these
// functions, so the two produce the same plan bit for bit (SPEC invariant 5). Nothing here allocates,
// throws or uses the standard library's containers; inputs are checked by the callers.
//
// Phases (SPEC §3):
//   1. quotas            q_r = floor(N/R) + (r < N mod R); with slack the targets of plan_slack_targets replace them
//                        (under the auto policy with the budget evenep/detail/plan_auto.hpp chooses per step)
//   2. alloc[E][R]       reference greedy (§3.1/§3.2) or one of the balanced constructions of optimized mode
//                        (those and the whole sequence plan_sequential: evenep/detail/plan_candidates.hpp)
//   3. finalize          locality keep, rest/capacity prefixes, segment layout, copies, weight sources, costs
//   4. per-rank dst      (plan_entry_dst) the destination of one entry from the arrays of phase 3
#pragma once

#include <cstdint>

#include "evenep/detail/host_device.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/detail/plan_auto_model.hpp"

namespace evenep::detail {

struct PlanDims {
    int R;
    int E;
    int epn;
    int G;   // 2 * epn
    int B;   // prefetch slots per rank
    int tp;
    bool locality;  // optimized mode: keep entries on their source rank first (§3.3)
    int32_t slack_ppm;  // imbalance budget ε in parts per million (Config::slack_ppm); 0 = exact balance
    // Auto policy (docs/auto.md): slack_ppm is then the largest budget allowed, and each plan uses the budget
    // plan_auto_slack_ppm (evenep/detail/plan_auto.hpp) chooses from the histogram with auto_model's coefficients.
    bool auto_slack = false;
    AutoCostModel auto_model = {};
};

// Views of the plan's arrays (see evenep/plan.hpp for their meaning and sizes).
struct PlanArrays {
    int64_t* expert_load;    // [E]
    int64_t* load_before;    // [R]
    int32_t* q;              // [R]
    int32_t* alloc;          // [E*R]
    int32_t* local_keep;     // [E*R]
    int32_t* rest_prefix;    // [E*(R+1)]
    int32_t* cap_prefix;     // [E*(R+1)]
    int32_t* seg_row;        // [R*E]
    int32_t* group_expert;   // [R*G]
    int32_t* group_count;    // [R*G]
    int32_t* cu_seqlens;     // [R*G]
    int8_t* group_source;    // [R*G] WeightSource values
    int32_t* group_slot;     // [R*G]
    int32_t* copies;         // [R*B]
    int32_t* remote_experts; // [R]
    int32_t* copies_received;// [R]
    int32_t* copies_pushed;  // [R]
    int32_t* peer_reads;     // [R]
    int64_t* crossing_out;   // [R]
};

struct PlanCostValues {
    int64_t max_rank_copy_traffic;
    int64_t total_copies;
    int64_t crossing_rows;
    int64_t moved_entries;
};

inline constexpr int8_t kSourceEmpty = 0;
inline constexpr int8_t kSourceLocal = 1;
inline constexpr int8_t kSourceSlot = 2;
inline constexpr int8_t kSourcePeer = 3;

EVENEP_HOST_DEVICE inline int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
EVENEP_HOST_DEVICE inline int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }

// e / epn as one multiply (the GPU fill's expert -> home rank in its scan): (2e + 1) * m >> 32 with
// m = ceil(2^32 / (2 epn)). Exact for e < 1024 and 1 <= epn <= 1024: (2e + 1) / (2 epn) is never within 1 / (2 epn) of
// the next integer and the rounding of m adds less than (2e + 1) * 2 epn / 2^32 < 1 / (2 epn) (checked for every such
// pair by planner_sparse_test).
EVENEP_HOST_DEVICE constexpr uint32_t home_magic(int epn) {
    return 0xffffffffu / (2u * static_cast<uint32_t>(epn)) + 1u;
}
EVENEP_HOST_DEVICE constexpr int home_by_magic(int e, uint32_t magic) {
    return static_cast<int>((static_cast<uint64_t>(2u * static_cast<uint32_t>(e) + 1u) * magic) >> 32);
}

// ---------------------------------------------------------------------------------------------------------
// Phase 1b: the imbalance budget (SPEC §3.6 slack, opt-in). On entry q[R] holds the even quotas q_r of
// invariant 1, on exit the targets t_r (entries rank r computes), which every later phase reads in place of
// q_r. With c_r = slack_cap(q_r) = ⌈(1+ε)·q_r⌉ and L_r = load_before[r]:
//   donors     (L_r > q_r): t_r = min(L_r, c_r)   keep up to c_r of their own entries (fewer rows leave them);
//   receivers  (L_r < q_r): the donors' extra D = Σ_donors (t_r - q_r) comes off the receivers' deficits
//                           δ_r = q_r - L_r, smallest deficit first (ties: lower rank): each receiver whose δ_r
//                           fits in what is left of D gets t_r = L_r (it needs no copy at all), the first one
//                           that does not fit gets t_r = q_r - (what is left), the rest keep t_r = q_r;
//   balanced   (L_r = q_r): t_r = q_r.
// Why this order: every receiver with a deficit costs at least one copy, so the budget removes the most receivers
// when it goes to the smallest deficits. D <= Σ_donors (L_r - q_r) = Σ_receivers δ_r, so D is always spent and
// Σ t_r = Σ q_r = N. Every target is <= c_r (donors by construction, the others <= q_r) and >= min(L_r, q_r).
// The reference greedy (§3.1) stays feasible: a donor keeps t_h >= q_h and every deficit is <= q_u <= q_h + 1,
// which is the arithmetic Theorem 1 needs; the epn bound holds as before (one donor group per receiver).
// slack_ppm = 0 returns at once (c_r = q_r: the targets are the quotas, bit for bit). Sequential, no workspace,
// O(R) per receiver it zeroes; a pure function of (load_before, q, slack_ppm), so every rank gets the same targets.
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline void plan_slack_targets(const PlanDims& d, const int64_t* load_before, int32_t* q) {
    if (d.slack_ppm <= 0) return;
    const int R = d.R;
    int64_t extra = 0;  // D
    for (int r = 0; r < R; ++r) {
        const int64_t l = load_before[r];
        if (l <= q[r]) continue;
        const int64_t t = imin64(l, slack_cap(q[r], d.slack_ppm));
        extra += t - q[r];
        q[r] = static_cast<int32_t>(t);
    }
    // Receivers in (deficit, rank) order: each pass picks the smallest key above the previous one.
    int64_t prev_deficit = -1;
    int prev_rank = -1;
    while (extra > 0) {
        int u = -1;
        int64_t best = 0;
        for (int r = 0; r < R; ++r) {
            const int64_t deficit = q[r] - load_before[r];
            if (deficit <= 0) continue;  // donors (now t_r <= L_r) and balanced ranks
            const bool after_prev = deficit > prev_deficit || (deficit == prev_deficit && r > prev_rank);
            if (after_prev && (u < 0 || deficit < best)) {
                u = r;
                best = deficit;
            }
        }
        if (u < 0) break;  // unreachable: D <= the receivers' deficits (see above)
        const int64_t cut = imin64(best, extra);
        q[u] = static_cast<int32_t>(q[u] - cut);
        extra -= cut;
        prev_deficit = best;
        prev_rank = u;
    }
}

// Rank r's even quota q_r of `total` entries over R ranks (SPEC invariant 1).
EVENEP_HOST_DEVICE inline int32_t plan_even_quota(int64_t total, int R, int r) {
    return static_cast<int32_t>(total / R + (r < total % R ? 1 : 0));
}

// ---------------------------------------------------------------------------------------------------------
// Phase 1: loads and quotas (then the slack targets, a no-op without slack). Under the auto policy the targets are
// left to the caller (plan_auto_targets in evenep/detail/plan_auto.hpp: it chooses the budget first).
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline int64_t plan_loads_and_quotas(const PlanDims& d, const int32_t* tpe, PlanArrays& a) {
    int64_t total = 0;
    for (int e = 0; e < d.E; ++e) {
        int64_t t = 0;
        for (int r = 0; r < d.R; ++r) t += tpe[static_cast<int64_t>(r) * d.E + e];
        a.expert_load[e] = t;
        total += t;
    }
    for (int r = 0; r < d.R; ++r) {
        int64_t l = 0;
        for (int g = 0; g < d.epn; ++g) l += a.expert_load[r * d.epn + g];
        a.load_before[r] = l;
        a.q[r] = plan_even_quota(total, d.R, r);
    }
    if (!d.auto_slack) plan_slack_targets(d, a.load_before, a.q);
    return total;
}

// alloc[e][r] = T_e on home(e), 0 elsewhere.
EVENEP_HOST_DEVICE inline void plan_alloc_home(const PlanDims& d, const int64_t* expert_load, int32_t* alloc) {
    for (int e = 0; e < d.E; ++e)
        for (int r = 0; r < d.R; ++r)
            alloc[static_cast<int64_t>(e) * d.R + r] = (r == e / d.epn) ? static_cast<int32_t>(expert_load[e]) : 0;
}

// ---------------------------------------------------------------------------------------------------------
// Phase 2a: the reference greedy (SPEC §3.1 rank-level transfers, §3.2 expert split), reproduced exactly.
// Workspace: balance[R] (int64), z[R*R] (int64), remaining[E] (int64).
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline void plan_alloc_reference(const PlanDims& d, const PlanArrays& a, int64_t* balance,
                                                    int64_t* z, int64_t* remaining, int32_t* alloc) {
    const int R = d.R;
    for (int r = 0; r < R; ++r) balance[r] = a.load_before[r] - a.q[r];
    for (int i = 0; i < R * R; ++i) z[i] = 0;
    for (;;) {
        int h = 0, u = 0;
        for (int r = 1; r < R; ++r) {
            if (balance[r] > balance[h]) h = r;
            if (balance[r] < balance[u]) u = r;
        }
        if (balance[h] <= 0) break;
        const int64_t amount = -balance[u];
        z[h * R + u] += amount;
        balance[h] -= amount;
        balance[u] = 0;
    }
    plan_alloc_home(d, a.expert_load, alloc);
    for (int e = 0; e < d.E; ++e) remaining[e] = a.expert_load[e];
    for (int h = 0; h < R; ++h) {
        int64_t* zh = z + h * R;
        for (;;) {
            int dst = 0;
            for (int r = 1; r < R; ++r)
                if (zh[r] > zh[dst]) dst = r;
            if (zh[dst] <= 0) break;
            int e = h * d.epn;
            for (int g = 1; g < d.epn; ++g)
                if (remaining[h * d.epn + g] > remaining[e]) e = h * d.epn + g;
            const int64_t moved = imin64(remaining[e], zh[dst]);
            // NOTE: Theorem 1 guarantees the donor's experts cover every quota it hands out; a zero move here
            // would mean the inputs broke the quota arithmetic, so stop rather than loop forever.
            if (moved <= 0) break;
            remaining[e] -= moved;
            zh[dst] -= moved;
            alloc[static_cast<int64_t>(e) * R + h] -= static_cast<int32_t>(moved);
            alloc[static_cast<int64_t>(e) * R + dst] += static_cast<int32_t>(moved);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Phase 3 helpers: copies and costs from an alloc matrix alone (used to rank optimized-mode candidates and
// by finalize). Slot choice: a rank's remote experts with the most rows get its B slots (ties: lower id).
// Workspace: remote_ids[epn+1] (int32), pushed[R] (int32). Returns false if some rank has > epn remote.
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline bool plan_is_prefetched(const PlanDims& d, const int32_t* alloc, int rank, int e) {
    // e is prefetched on `rank` iff fewer than B remote experts of `rank` rank strictly before it.
    if (d.B >= d.epn) return true;  // training: every remote expert (at most epn) has a slot
    const int64_t mine = alloc[static_cast<int64_t>(e) * d.R + rank];
    int before = 0;
    for (int f = 0; f < d.E; ++f) {
        if (f / d.epn == rank || f == e) continue;
        const int64_t other = alloc[static_cast<int64_t>(f) * d.R + rank];
        if (other <= 0) continue;
        if (other > mine || (other == mine && f < e)) ++before;
    }
    return before < d.B;
}

EVENEP_HOST_DEVICE inline int64_t plan_local_keep(const PlanDims& d, const int32_t* tpe, const int32_t* alloc, int e,
                                                  int r) {
    if (!d.locality) return 0;
    return imin64(tpe[static_cast<int64_t>(r) * d.E + e], alloc[static_cast<int64_t>(e) * d.R + r]);
}

// Costs of an alloc matrix. Workspace: pushed[R], recv[R], remote[R] (int32).
EVENEP_HOST_DEVICE inline bool plan_cost_of(const PlanDims& d, const int32_t* tpe, const int32_t* alloc,
                                            int32_t* pushed, int32_t* recv, int32_t* remote, PlanCostValues& c) {
    const int R = d.R;
    for (int r = 0; r < R; ++r) pushed[r] = recv[r] = remote[r] = 0;
    c = PlanCostValues{0, 0, 0, 0};
    bool ok = true;
    for (int e = 0; e < d.E; ++e) {
        const int h = e / d.epn;
        // Flow of source r to destination r (entries that stay on their source rank).
        int64_t rest_lo = 0, cap_lo = 0;
        for (int r = 0; r < R; ++r) {
            const int64_t a_er = alloc[static_cast<int64_t>(e) * R + r];
            const int64_t t_re = tpe[static_cast<int64_t>(r) * d.E + e];
            const int64_t keep = plan_local_keep(d, tpe, alloc, e, r);
            const int64_t rest = t_re - keep, cap = a_er - keep;
            const int64_t lo = imax64(rest_lo, cap_lo), hi = imin64(rest_lo + rest, cap_lo + cap);
            const int64_t stay = keep + (hi > lo ? hi - lo : 0);
            c.crossing_rows += t_re - stay;
            rest_lo += rest;
            cap_lo += cap;
            if (r != h && a_er > 0) {
                remote[r] += 1;
                c.total_copies += 1;
                c.moved_entries += a_er;
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        if (remote[r] > d.epn) ok = false;
        recv[r] = remote[r] < d.B ? remote[r] : d.B;
    }
    if (d.B >= d.epn) {
        for (int e = 0; e < d.E; ++e)
            for (int r = 0; r < R; ++r)
                if (r != e / d.epn && alloc[static_cast<int64_t>(e) * R + r] > 0) pushed[e / d.epn] += 1;
    } else {
        for (int e = 0; e < d.E; ++e)
            for (int r = 0; r < R; ++r)
                if (r != e / d.epn && alloc[static_cast<int64_t>(e) * R + r] > 0 && plan_is_prefetched(d, alloc, r, e))
                    pushed[e / d.epn] += 1;
    }
    for (int r = 0; r < R; ++r) c.max_rank_copy_traffic = imax64(c.max_rank_copy_traffic, recv[r] + pushed[r]);
    return ok;
}

// Lexicographic order of SPEC §3.1: traffic of the busiest rank, total copies, crossing rows.
EVENEP_HOST_DEVICE inline bool plan_cost_less(const PlanCostValues& x, const PlanCostValues& y) {
    if (x.max_rank_copy_traffic != y.max_rank_copy_traffic) return x.max_rank_copy_traffic < y.max_rank_copy_traffic;
    if (x.total_copies != y.total_copies) return x.total_copies < y.total_copies;
    return x.crossing_rows < y.crossing_rows;
}

// ---------------------------------------------------------------------------------------------------------
// Phase 3: everything else from alloc. Requires alloc to be balanced and to respect the epn bound.
// ---------------------------------------------------------------------------------------------------------
EVENEP_HOST_DEVICE inline void plan_finalize(const PlanDims& d, const int32_t* tpe, PlanArrays& a,
                                             PlanCostValues& cost) {
    const int R = d.R, E = d.E, G = d.G;
    // Locality keep and the two prefix tables of the token -> slot map (§3.3).
    for (int e = 0; e < E; ++e) {
        int32_t rest = 0, cap = 0;
        int32_t* rp = a.rest_prefix + static_cast<int64_t>(e) * (R + 1);
        int32_t* cp = a.cap_prefix + static_cast<int64_t>(e) * (R + 1);
        for (int r = 0; r < R; ++r) {
            const int32_t keep = static_cast<int32_t>(plan_local_keep(d, tpe, a.alloc, e, r));
            a.local_keep[static_cast<int64_t>(e) * R + r] = keep;
            rp[r] = rest;
            cp[r] = cap;
            rest += tpe[static_cast<int64_t>(r) * E + e] - keep;
            cap += a.alloc[static_cast<int64_t>(e) * R + r] - keep;
        }
        rp[R] = rest;
        cp[R] = cap;
    }
    // Segment layout: own experts in groups 0..epn-1, remote experts ascending in groups epn..2epn-1.
    for (int r = 0; r < R; ++r) {
        int32_t* ge = a.group_expert + static_cast<int64_t>(r) * G;
        int32_t* gc = a.group_count + static_cast<int64_t>(r) * G;
        int8_t* gs = a.group_source + static_cast<int64_t>(r) * G;
        int32_t* gsl = a.group_slot + static_cast<int64_t>(r) * G;
        for (int g = 0; g < G; ++g) {
            ge[g] = -1;
            gc[g] = 0;
            gs[g] = kSourceEmpty;
            gsl[g] = -1;
        }
        for (int g = 0; g < d.epn; ++g) {
            const int e = r * d.epn + g;
            const int32_t cnt = a.alloc[static_cast<int64_t>(e) * R + r];
            if (cnt > 0) {
                ge[g] = e;
                gc[g] = cnt;
                gs[g] = kSourceLocal;
            }
        }
        int next = d.epn;
        for (int e = 0; e < E; ++e) {
            if (e / d.epn == r) continue;
            const int32_t cnt = a.alloc[static_cast<int64_t>(e) * R + r];
            if (cnt <= 0) continue;
            if (next < G) {
                ge[next] = e;
                gc[next] = cnt;
                gs[next] = plan_is_prefetched(d, a.alloc, r, e) ? kSourceSlot : kSourcePeer;
            }
            ++next;
        }
        a.remote_experts[r] = next - d.epn;
        // Slots in ascending expert id among the prefetched groups.
        int32_t* cs = a.copies + static_cast<int64_t>(r) * d.B;
        for (int b = 0; b < d.B; ++b) cs[b] = -1;
        int slot = 0, peer = 0;
        for (int g = d.epn; g < G; ++g) {
            if (gs[g] == kSourceSlot) {
                cs[slot] = ge[g];
                gsl[g] = slot++;
            } else if (gs[g] == kSourcePeer) {
                ++peer;
            }
        }
        a.copies_received[r] = slot;
        a.peer_reads[r] = peer;
        int32_t end = 0;
        int32_t* cu = a.cu_seqlens + static_cast<int64_t>(r) * G;
        for (int g = 0; g < G; ++g) {
            end += static_cast<int32_t>(align_up(gc[g], d.tp));
            cu[g] = end;
        }
        for (int e = 0; e < E; ++e) a.seg_row[static_cast<int64_t>(r) * E + e] = -1;
        for (int g = 0; g < G; ++g)
            if (ge[g] >= 0) a.seg_row[static_cast<int64_t>(r) * E + ge[g]] = g == 0 ? 0 : cu[g - 1];
    }
    for (int r = 0; r < R; ++r) a.copies_pushed[r] = 0;
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < d.B; ++b) {
            const int32_t e = a.copies[static_cast<int64_t>(r) * d.B + b];
            if (e >= 0) a.copies_pushed[e / d.epn] += 1;
        }
    // Costs.
    cost = PlanCostValues{0, 0, 0, 0};
    for (int r = 0; r < R; ++r) {
        cost.max_rank_copy_traffic = imax64(cost.max_rank_copy_traffic, a.copies_received[r] + a.copies_pushed[r]);
        cost.total_copies += a.remote_experts[r];
        a.crossing_out[r] = 0;
    }
    for (int e = 0; e < E; ++e) {
        const int32_t* rp = a.rest_prefix + static_cast<int64_t>(e) * (R + 1);
        const int32_t* cp = a.cap_prefix + static_cast<int64_t>(e) * (R + 1);
        for (int r = 0; r < R; ++r) {
            const int64_t lo = imax64(rp[r], cp[r]), hi = imin64(rp[r + 1], cp[r + 1]);
            const int64_t stay = a.local_keep[static_cast<int64_t>(e) * R + r] + (hi > lo ? hi - lo : 0);
            a.crossing_out[r] += tpe[static_cast<int64_t>(r) * E + e] - stay;
            if (r != e / d.epn) cost.moved_entries += a.alloc[static_cast<int64_t>(e) * R + r];
        }
    }
    for (int r = 0; r < R; ++r) cost.crossing_rows += a.crossing_out[r];
}

// ---------------------------------------------------------------------------------------------------------
// Phase 4: flat destination (rank * NvS + row) of entry number `pos` (0-based, in (token, k) order) of
// source rank `src`'s entries of expert `e`.
// ---------------------------------------------------------------------------------------------------------
struct PlanRouteView {
    int R, E;
    int64_t num_recv_rows;
    const int32_t* local_keep;   // [E*R]
    const int32_t* rest_prefix;  // [E*(R+1)]
    const int32_t* cap_prefix;   // [E*(R+1)]
    const int32_t* seg_row;      // [R*E]
};

EVENEP_HOST_DEVICE inline int32_t plan_entry_dst(const PlanRouteView& v, int src, int e, int32_t pos) {
    const int R = v.R;
    const int32_t keep = v.local_keep[static_cast<int64_t>(e) * R + src];
    const int32_t* rp = v.rest_prefix + static_cast<int64_t>(e) * (R + 1);
    const int32_t* cp = v.cap_prefix + static_cast<int64_t>(e) * (R + 1);
    if (pos < keep) {
        // Kept on the source rank: after the rest entries of lower source ranks placed here.
        const int32_t cap = cp[src + 1] - cp[src];
        int32_t before = rp[src] - cp[src];
        before = before < 0 ? 0 : (before > cap ? cap : before);
        const int32_t row = v.seg_row[static_cast<int64_t>(src) * v.E + e] + before + pos;
        return static_cast<int32_t>(flat_dst(src, row, v.num_recv_rows));
    }
    const int32_t off = rp[src] + (pos - keep);
    // Last destination d with cp[d] <= off (zero-capacity destinations share their successor's prefix).
    int lo = 0, hi = R;  // invariant: cp[lo] <= off < cp[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (cp[mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    const int dst = lo;
    const int32_t before_local = dst < src ? v.local_keep[static_cast<int64_t>(e) * R + dst] : 0;
    const int32_t row = v.seg_row[static_cast<int64_t>(dst) * v.E + e] + before_local + (off - cp[dst]);
    return static_cast<int32_t>(flat_dst(dst, row, v.num_recv_rows));
}

}  // namespace evenep::detail
