// The independent plan checker (SPEC §2, §3). Deliberately a separate code path from the planner: it never
// includes evenep/detail/plan_core.hpp and recomputes every quantity from the plan's inputs (cfg, s, tpe) with
// its own plain loops, so a bug in the planner cannot hide behind the same bug here.
//
// validate_plan: sizes -> inputs -> loads and quotas -> alloc (balance, conservation) -> per-rank group layout
//                (experts, counts, cu_seqlens, seg_row) -> weight sources and the copies table -> token -> slot
//                prefix arrays -> counters and costs -> the copy tree
//                (validate_relay.cpp).
// validate_dst:  validate_plan, then every rank's encoded destinations (validate_dst.cpp).
#include "evenep/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "evenep/detail/align.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "validate_checks.hpp"

namespace evenep::validate_detail {
namespace {

const char* source_name(WeightSource s) {
    switch (s) {
        case WeightSource::kEmpty:
            return "empty";
        case WeightSource::kLocal:
            return "local";
        case WeightSource::kSlot:
            return "slot";
        case WeightSource::kPeer:
            return "peer";
    }
    return "invalid";
}

template <typename V>
bool check_size(Sink& sink, const char* name, const V& v, size_t want) {
    if (v.size() == want) return true;
    sink.fail("plan: ", name, " has ", v.size(), " values, expected ", want);
    return false;
}

bool check_sizes(const Plan& p, Sink& sink) {
    bool ok = true;
    for_each_array(p, [&](const char* name, PlanExtent x, const auto& v) {
        ok &= check_size(sink, name, v, plan_extent_size(p.cfg, x));
    });
    return ok;
}

}  // namespace

bool check_plan(const Plan& p, Sink& sink, Expected& x) {
    try {
        p.cfg.validate();
    } catch (const std::exception& err) {
        sink.fail("plan: invalid config (", err.what(), ")");
        return false;
    }
    if (!check_sizes(p, sink)) return false;

    const Config& cfg = p.cfg;
    x.R = cfg.R;
    x.E = cfg.E;
    x.K = cfg.K;
    x.S = cfg.S;
    x.epn = cfg.epn();
    x.G = cfg.num_groups();
    x.B = cfg.num_slots();
    x.tp = cfg.tp;
    const int64_t slack_ppm = cfg.slack_ppm();
    x.nvs = detail::recv_rows(cfg.S, cfg.K, x.epn, cfg.tp, slack_ppm);
    x.optimized = p.mode == PlannerMode::kOptimized;
    const int R = x.R, E = x.E, epn = x.epn, G = x.G, B = x.B;
    auto tpe = [&](int r, int e) -> int64_t { return p.tpe[static_cast<size_t>(r) * E + e]; };
    auto alloc = [&](int e, int r) -> int64_t { return p.alloc[static_cast<size_t>(e) * R + r]; };
    auto home = [&](int e) { return e / epn; };

    // ---- Inputs.
    bool inputs_ok = true;
    for (int r = 0; r < R; ++r) {
        if (p.s[r] < 1 || p.s[r] > cfg.S)
            sink.fail("inputs: rank ", r, ": s = ", p.s[r], " outside [1, S = ", cfg.S, "]");
        int64_t row = 0;
        for (int e = 0; e < E; ++e) {
            if (tpe(r, e) < 0) {
                sink.fail("inputs: rank ", r, ": tpe[", e, "] = ", tpe(r, e), " is negative");
                inputs_ok = false;
            }
            row += tpe(r, e);
        }
        if (row > static_cast<int64_t>(p.s[r]) * cfg.K)
            sink.fail("inputs: rank ", r, ": ", row,
                      " routed entries exceed s*K = ", static_cast<int64_t>(p.s[r]) * cfg.K);
    }

    // ---- Loads and quotas (invariant 1).
    x.load.assign(E, 0);
    int64_t n = 0;
    for (int e = 0; e < E; ++e) {
        for (int r = 0; r < R; ++r) x.load[e] += tpe(r, e);
        n += x.load[e];
        if (p.expert_load[e] != x.load[e])
            sink.fail("loads: expert ", e, ": expert_load = ", p.expert_load[e], ", sum_r tpe = ", x.load[e]);
    }
    // Without slack every rank's q is its even quota; with slack (SPEC §3.6) q is the rank's target: any
    // 0 <= q_r <= ⌈(1+ε)·even quota⌉ with the targets summing to N (the planner's rule itself is not re-derived).
    // The plan's own budget (Plan::slack_ppm): the configured one under the fixed policy, at most it under auto. The
    // targets are checked against the configured budget (fixed) or the plan's, within the configured one (auto).
    const bool fixed = cfg.policy == PlannerPolicy::kFixed;
    const int64_t plan_ppm = fixed ? slack_ppm : std::clamp<int64_t>(p.slack_ppm, 0, slack_ppm);
    if (p.slack_ppm < 0 || p.slack_ppm > slack_ppm || (fixed && p.slack_ppm != slack_ppm))
        sink.fail("balance: the plan's budget slack_ppm = ", p.slack_ppm, ", expected ", fixed ? "" : "at most ",
                  "the configuration's ", slack_ppm, " (policy ", to_string(cfg.policy), ")");
    x.q.assign(R, 0);
    int64_t target_sum = 0;
    for (int r = 0; r < R; ++r) {
        const int64_t even = n / R + (r < n % R ? 1 : 0);
        if (plan_ppm == 0) {
            x.q[r] = even;
            if (p.q[r] != x.q[r])
                sink.fail("balance: rank ", r, ": q = ", p.q[r], ", expected floor(N/R) + (r < N mod R) = ", x.q[r],
                          " (N = ", n, ")");
        } else {
            x.q[r] = p.q[r];
            target_sum += p.q[r];
            const int64_t cap = detail::slack_cap(even, plan_ppm);
            if (p.q[r] < 0 || p.q[r] > cap)
                sink.fail("balance: rank ", r, ": target q = ", p.q[r], " outside [0, ceil((1+slack)*q_r) = ", cap,
                          "] (q_r = ", even, ", slack = ", plan_ppm * 1e-6, ", N = ", n, ")");
        }
        int64_t homed = 0;
        for (int g = 0; g < epn; ++g) homed += x.load[r * epn + g];
        if (p.load_before[r] != homed)
            sink.fail("loads: rank ", r, ": load_before = ", p.load_before[r], ", sum of its experts' T_e = ", homed);
    }

    if (plan_ppm != 0 && target_sum != n)
        sink.fail("balance: the targets sum to ", target_sum, ", expected N = ", n, " (slack = ", plan_ppm * 1e-6, ")");

    // ---- alloc: non-negative, conservation per expert, balance per rank (invariants 1, 2).
    std::vector<int64_t> computed(R, 0);
    bool alloc_ok = true;
    for (int e = 0; e < E; ++e) {
        int64_t sum = 0;
        for (int r = 0; r < R; ++r) {
            if (alloc(e, r) < 0) {
                sink.fail("conservation: expert ", e, " rank ", r, ": alloc = ", alloc(e, r), " is negative");
                alloc_ok = false;
            }
            sum += alloc(e, r);
            computed[r] += alloc(e, r);
        }
        if (sum != x.load[e]) {
            sink.fail("conservation: expert ", e, ": sum_r alloc = ", sum, " != T_e = ", x.load[e]);
            alloc_ok = false;
        }
    }
    for (int r = 0; r < R; ++r)
        if (computed[r] != x.q[r]) {
            sink.fail("balance: rank ", r, ": computes sum_e alloc = ", computed[r], " entries, q_r = ", x.q[r]);
            alloc_ok = false;
        }

    // ---- Remote experts (invariant 3).
    x.remote.assign(R, {});
    for (int r = 0; r < R; ++r) {
        for (int e = 0; e < E; ++e)
            if (home(e) != r && alloc(e, r) > 0) x.remote[r].push_back(e);
        const int num_remote = static_cast<int>(x.remote[r].size());
        if (num_remote > epn) sink.fail("redundancy: rank ", r, ": ", num_remote, " remote experts > epn = ", epn);
        if (p.remote_experts[r] != num_remote)
            sink.fail("counters: rank ", r, ": remote_experts = ", p.remote_experts[r], ", recomputed ", num_remote);
    }

    // ---- Group layout (SPEC §3.2): experts, counts, padded cu_seqlens, NvS bound, seg_row.
    x.seg_begin.assign(static_cast<size_t>(R) * E, -1);
    for (int r = 0; r < R; ++r) {
        const size_t base = static_cast<size_t>(r) * G;
        int64_t prev_end = 0;
        for (int g = 0; g < G; ++g) {
            int want_e = -1;
            if (g < epn) {
                const int e = r * epn + g;
                want_e = alloc(e, r) > 0 ? e : -1;
            } else if (g - epn < static_cast<int>(x.remote[r].size())) {
                want_e = x.remote[r][g - epn];
            }
            const int64_t want_cnt = want_e >= 0 ? alloc(want_e, r) : 0;
            const int32_t ge = p.group_expert[base + g];
            const int32_t gc = p.group_count[base + g];
            if (ge != want_e) {
                if (g < epn)
                    sink.fail("layout: rank ", r, " group ", g, ": expert = ", ge, ", expected ", want_e,
                              " (own expert ", r * epn + g, " with alloc ", alloc(r * epn + g, r), ")");
                else
                    sink.fail("layout: rank ", r, " group ", g, ": expert = ", ge, ", expected ", want_e,
                              " (remote experts with alloc > 0 in ascending id)");
            }
            if (gc != want_cnt)
                sink.fail("layout: rank ", r, " group ", g, ": group_count = ", gc, ", expected alloc[", want_e, "][",
                          r, "] = ", want_cnt);
            const int64_t end = p.cu_seqlens[base + g];
            const int64_t want_rows = gc > 0 ? detail::align_up(gc, x.tp) : 0;
            if (end - prev_end != want_rows)
                sink.fail("layout: rank ", r, " group ", g, ": cu_seqlens gives ", end - prev_end, " rows (end ", end,
                          " - begin ", prev_end, "), expected align_up(count ", gc, ", tp ", x.tp, ") = ", want_rows);
            if (ge >= 0 && ge < E && gc > 0) {
                const size_t at = static_cast<size_t>(r) * E + ge;
                if (x.seg_begin[at] >= 0)
                    sink.fail("layout: rank ", r, " group ", g, ": expert ", ge, " already has a group on this rank");
                x.seg_begin[at] = prev_end;
            } else if (ge >= E || ge < -1) {
                sink.fail("layout: rank ", r, " group ", g, ": expert id ", ge, " outside [-1, E = ", E, ")");
            }
            prev_end = end;
        }
        if (prev_end > x.nvs) sink.fail("layout: rank ", r, ": last cu_seqlens = ", prev_end, " exceeds NvS = ", x.nvs);
        if (prev_end < 0) sink.fail("layout: rank ", r, ": last cu_seqlens = ", prev_end, " is negative");
        for (int e = 0; e < E; ++e) {
            const size_t at = static_cast<size_t>(r) * E + e;
            if (p.seg_row[at] != x.seg_begin[at])
                sink.fail("layout: rank ", r, " expert ", e, ": seg_row = ", p.seg_row[at], ", expected ",
                          x.seg_begin[at], x.seg_begin[at] < 0 ? " (no segment)" : " (begin of its group)");
        }
    }

    // ---- Weight sources and the copies table (SPEC §3.6, §4.4).
    std::vector<int64_t> received(R, 0), pushed(R, 0);
    for (int r = 0; r < R; ++r) {
        const size_t base = static_cast<size_t>(r) * G;
        const size_t cbase = static_cast<size_t>(r) * B;
        // Copies row: prefetched remote experts in ascending id, then -1.
        int filled = 0;
        int prev = -1;
        bool seen_empty = false;
        for (int b = 0; b < B; ++b) {
            const int32_t e = p.copies[cbase + b];
            if (e == -1) {
                seen_empty = true;
                continue;
            }
            if (e < 0 || e >= E) {
                sink.fail("copies: rank ", r, " slot ", b, ": expert id ", e, " outside [-1, E = ", E, ")");
                continue;
            }
            ++filled;
            pushed[home(e)] += 1;
            if (seen_empty) sink.fail("copies: rank ", r, " slot ", b, ": expert ", e, " after an empty slot");
            if (e <= prev)
                sink.fail("copies: rank ", r, " slot ", b, ": expert ", e, " not above the previous slot's ", prev,
                          " (slots hold experts in ascending id)");
            prev = e;
            if (home(e) == r)
                sink.fail("copies: rank ", r, " slot ", b, ": expert ", e, " is homed on this rank");
            else if (alloc(e, r) <= 0)
                sink.fail("copies: rank ", r, " slot ", b, ": expert ", e, " has alloc ", alloc(e, r), " on this rank");
            // The group of e on r must read from this slot.
            bool found = false;
            for (int g = epn; g < G; ++g)
                if (p.group_expert[base + g] == e) {
                    found = true;
                    if (p.group_source[base + g] != WeightSource::kSlot || p.group_slot[base + g] != b)
                        sink.fail("copies: rank ", r, " slot ", b, " holds expert ", e, " but its group ", g,
                                  " has source ", source_name(p.group_source[base + g]), " slot ",
                                  p.group_slot[base + g]);
                }
            if (!found) sink.fail("copies: rank ", r, " slot ", b, ": expert ", e, " has no remote group on this rank");
        }
        received[r] = filled;
        const int num_remote = static_cast<int>(x.remote[r].size());
        const int want_filled = std::min(num_remote, B);
        if (filled != want_filled)
            sink.fail("copies: rank ", r, ": ", filled, " prefetched copies, expected min(remote ", num_remote, ", B ",
                      B, ") = ", want_filled);
        if (filled > B) sink.fail("redundancy: rank ", r, ": ", filled, " prefetched copies > B = ", B);

        for (int g = 0; g < G; ++g) {
            const int32_t e = p.group_expert[base + g];
            const WeightSource src = p.group_source[base + g];
            const int32_t slot = p.group_slot[base + g];
            if (e < 0) {
                if (src != WeightSource::kEmpty || slot != -1)
                    sink.fail("sources: rank ", r, " group ", g, ": empty group has source ", source_name(src),
                              " slot ", slot, ", expected empty, -1");
            } else if (g < epn) {
                if (src != WeightSource::kLocal || slot != -1)
                    sink.fail("sources: rank ", r, " group ", g, " (expert ", e, "): source ", source_name(src),
                              " slot ", slot, ", expected local, -1");
            } else if (src == WeightSource::kSlot) {
                if (slot < 0 || slot >= B || p.copies[cbase + slot] != e)
                    sink.fail("sources: rank ", r, " group ", g, " (expert ", e, "): slot ", slot,
                              " does not hold this expert in copies");
            } else if (src == WeightSource::kPeer) {
                if (slot != -1)
                    sink.fail("sources: rank ", r, " group ", g, " (expert ", e, "): peer group has slot ", slot);
                for (int b = 0; b < B; ++b)
                    if (p.copies[cbase + b] == e)
                        sink.fail("sources: rank ", r, " group ", g, " (expert ", e,
                                  "): read from the peer though slot ", b, " holds it");
            } else {
                sink.fail("sources: rank ", r, " group ", g, " (expert ", e, "): remote group has source ",
                          source_name(src), ", expected slot or peer");
            }
        }
        if (p.copies_received[r] != filled)
            sink.fail("counters: rank ", r, ": copies_received = ", p.copies_received[r], ", copies table holds ",
                      filled);
        if (p.peer_reads[r] != num_remote - filled)
            sink.fail("counters: rank ", r, ": peer_reads = ", p.peer_reads[r], ", expected remote ", num_remote,
                      " - prefetched ", filled, " = ", num_remote - filled);
    }
    for (int r = 0; r < R; ++r)
        if (p.copies_pushed[r] != pushed[r])
            sink.fail("counters: rank ", r, ": copies_pushed = ", p.copies_pushed[r],
                      ", copies of its experts in the table = ", pushed[r]);

    // ---- Token -> slot prefix arrays (SPEC §3.3, plan.hpp). Optimized mode keeps min(tpe, alloc) entries of each
    // (expert, rank) on the rank; the rest go, in source-rank order, to the remaining capacities in rank order.
    x.keep.assign(static_cast<size_t>(E) * R, 0);
    for (int e = 0; e < E; ++e) {
        int64_t rest = 0, cap = 0;
        const size_t pbase = static_cast<size_t>(e) * (R + 1);
        for (int r = 0; r < R; ++r) {
            const size_t at = static_cast<size_t>(e) * R + r;
            x.keep[at] = x.optimized ? std::max<int64_t>(0, std::min(tpe(r, e), alloc(e, r))) : 0;
            if (p.local_keep[at] != x.keep[at])
                sink.fail("locality: expert ", e, " rank ", r, ": local_keep = ", p.local_keep[at], ", expected ",
                          x.keep[at], x.optimized ? " = min(tpe, alloc)" : " (reference mode keeps nothing)");
            if (p.rest_prefix[pbase + r] != rest)
                sink.fail("locality: expert ", e, " rank ", r, ": rest_prefix = ", p.rest_prefix[pbase + r],
                          ", expected ", rest);
            if (p.cap_prefix[pbase + r] != cap)
                sink.fail("locality: expert ", e, " rank ", r, ": cap_prefix = ", p.cap_prefix[pbase + r],
                          ", expected ", cap);
            rest += tpe(r, e) - x.keep[at];
            cap += alloc(e, r) - x.keep[at];
        }
        if (p.rest_prefix[pbase + R] != rest)
            sink.fail("locality: expert ", e, ": rest_prefix[R] = ", p.rest_prefix[pbase + R], ", expected ", rest);
        if (p.cap_prefix[pbase + R] != cap)
            sink.fail("locality: expert ", e, ": cap_prefix[R] = ", p.cap_prefix[pbase + R], ", expected ", cap);
    }

    // ---- Crossing rows: walk each expert's non-kept entries (source-rank order) against the destinations'
    // remaining capacities (rank order); a piece whose source and destination differ crosses.
    if (alloc_ok && inputs_ok) {
        std::vector<int64_t> crossing(R, 0);
        for (int e = 0; e < E; ++e) {
            int src = 0, dst = 0;
            int64_t src_left = tpe(0, e) - x.keep[static_cast<size_t>(e) * R];
            int64_t dst_left = alloc(e, 0) - x.keep[static_cast<size_t>(e) * R];
            for (;;) {
                while (src < R && src_left == 0)
                    if (++src < R) src_left = tpe(src, e) - x.keep[static_cast<size_t>(e) * R + src];
                while (dst < R && dst_left == 0)
                    if (++dst < R) dst_left = alloc(e, dst) - x.keep[static_cast<size_t>(e) * R + dst];
                if (src >= R || dst >= R) break;
                const int64_t piece = std::min(src_left, dst_left);
                if (src != dst) crossing[src] += piece;
                src_left -= piece;
                dst_left -= piece;
            }
        }
        int64_t total = 0;
        for (int r = 0; r < R; ++r) {
            total += crossing[r];
            if (p.crossing_out[r] != crossing[r])
                sink.fail("counters: rank ", r, ": crossing_out = ", p.crossing_out[r], ", recomputed ", crossing[r]);
        }
        if (p.cost.crossing_rows != total)
            sink.fail("cost: crossing_rows = ", p.cost.crossing_rows, ", recomputed ", total);
    }

    // ---- Costs (SPEC §3.1).
    int64_t traffic = 0, copies = 0, moved = 0;
    for (int r = 0; r < R; ++r) {
        traffic = std::max(traffic, received[r] + pushed[r]);
        copies += static_cast<int64_t>(x.remote[r].size());
        for (int e : x.remote[r]) moved += alloc(e, r);
    }
    if (p.cost.max_rank_copy_traffic != traffic)
        sink.fail("cost: max_rank_copy_traffic = ", p.cost.max_rank_copy_traffic, ", recomputed ", traffic);
    if (p.cost.total_copies != copies) sink.fail("cost: total_copies = ", p.cost.total_copies, ", recomputed ", copies);
    if (p.cost.moved_entries != moved)
        sink.fail("cost: moved_entries = ", p.cost.moved_entries, ", recomputed ", moved);
    check_relays(p, sink);
    return true;
}

}  // namespace evenep::validate_detail

namespace evenep {

using validate_detail::Expected;
using validate_detail::Sink;

std::string ValidationReport::summary(size_t max_lines) const {
    if (errors.empty()) return "plan is valid";
    std::ostringstream os;
    os << errors.size() << (errors.size() == 1 ? " error" : " errors");
    const size_t shown = std::min(max_lines, errors.size());
    for (size_t i = 0; i < shown; ++i) os << "\n  " << errors[i];
    if (shown < errors.size()) os << "\n  ... " << errors.size() - shown << " more";
    return os.str();
}

ValidationReport validate_plan(const Plan& plan) {
    ValidationReport report;
    {
        Sink sink(report);
        Expected x;
        validate_detail::check_plan(plan, sink, x);
    }
    return report;
}

}  // namespace evenep
