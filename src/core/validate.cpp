// The independent plan checker (SPEC §2, §3). Deliberately a separate code path from the planner: it never
// includes evenep/detail/plan_core.hpp and recomputes every quantity from the plan's inputs (cfg, s, tpe) with
// its own plain loops, so a bug in the planner cannot hide behind the same bug here.
//
// validate_plan: sizes -> inputs -> loads and quotas -> alloc (balance, conservation) -> per-rank group layout
//                (experts, counts, cu_seqlens, seg_row) -> weight sources and the copies table -> token -> slot
//                prefix arrays -> counters and costs.
// validate_dst:  validate_plan, then every rank's encoded destinations against a concrete routing.
#include "evenep/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

// At most this many messages are stored; the rest are counted and summarised in one last line.
inline constexpr size_t kMaxStoredErrors = 200;

class Sink {
  public:
    explicit Sink(ValidationReport& report) : report_(report) {}
    ~Sink() {
        if (dropped_ > 0) report_.errors.push_back("... and " + std::to_string(dropped_) + " more errors not listed");
    }
    Sink(const Sink&) = delete;
    Sink& operator=(const Sink&) = delete;

    template <typename... Args>
    void fail(Args&&... parts) {
        ++count_;
        if (report_.errors.size() >= kMaxStoredErrors) {
            ++dropped_;
            return;
        }
        std::ostringstream os;
        ((os << std::forward<Args>(parts)), ...);
        report_.errors.push_back(os.str());
    }
    size_t count() const { return count_; }

  private:
    ValidationReport& report_;
    size_t count_ = 0;
    size_t dropped_ = 0;
};

int64_t align_to(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

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

// Everything validate_plan derives from the plan's inputs and its alloc matrix, shared with validate_dst.
struct Expected {
    int R = 0, E = 0, K = 0, S = 0, epn = 0, G = 0, B = 0, tp = 1;
    int64_t nvs = 0;
    bool optimized = false;
    std::vector<int64_t> load;             // [E] T_e
    std::vector<int64_t> q;                // [R]
    std::vector<std::vector<int>> remote;  // [R] remote experts with alloc > 0, ascending
    std::vector<int64_t> keep;             // [E*R] locality keep required by the mode
    std::vector<int64_t> seg_begin;        // [R*E] first row of e's group on r from the plan's cu_seqlens, -1 if none
};

template <typename V>
bool check_size(Sink& sink, const char* name, const V& v, size_t want) {
    if (v.size() == want) return true;
    sink.fail("plan: ", name, " has ", v.size(), " values, expected ", want);
    return false;
}

bool check_sizes(const Plan& p, Sink& sink) {
    const size_t R = p.cfg.R, E = p.cfg.E, G = p.cfg.num_groups(), B = p.cfg.num_slots();
    bool ok = true;
    ok &= check_size(sink, "s", p.s, R);
    ok &= check_size(sink, "tpe", p.tpe, R * E);
    ok &= check_size(sink, "expert_load", p.expert_load, E);
    ok &= check_size(sink, "load_before", p.load_before, R);
    ok &= check_size(sink, "q", p.q, R);
    ok &= check_size(sink, "alloc", p.alloc, E * R);
    ok &= check_size(sink, "local_keep", p.local_keep, E * R);
    ok &= check_size(sink, "rest_prefix", p.rest_prefix, E * (R + 1));
    ok &= check_size(sink, "cap_prefix", p.cap_prefix, E * (R + 1));
    ok &= check_size(sink, "seg_row", p.seg_row, R * E);
    ok &= check_size(sink, "group_expert", p.group_expert, R * G);
    ok &= check_size(sink, "group_count", p.group_count, R * G);
    ok &= check_size(sink, "cu_seqlens", p.cu_seqlens, R * G);
    ok &= check_size(sink, "group_source", p.group_source, R * G);
    ok &= check_size(sink, "group_slot", p.group_slot, R * G);
    ok &= check_size(sink, "copies", p.copies, R * B);
    ok &= check_size(sink, "remote_experts", p.remote_experts, R);
    ok &= check_size(sink, "copies_received", p.copies_received, R);
    ok &= check_size(sink, "copies_pushed", p.copies_pushed, R);
    ok &= check_size(sink, "peer_reads", p.peer_reads, R);
    ok &= check_size(sink, "crossing_out", p.crossing_out, R);
    return ok;
}

// Returns false when the plan cannot be inspected further (bad config or array sizes).
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
    x.nvs = detail::recv_rows(cfg.S, cfg.K, x.epn, cfg.tp);
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
    x.q.assign(R, 0);
    for (int r = 0; r < R; ++r) {
        x.q[r] = n / R + (r < n % R ? 1 : 0);
        if (p.q[r] != x.q[r])
            sink.fail("balance: rank ", r, ": q = ", p.q[r], ", expected floor(N/R) + (r < N mod R) = ", x.q[r],
                      " (N = ", n, ")");
        int64_t homed = 0;
        for (int g = 0; g < epn; ++g) homed += x.load[r * epn + g];
        if (p.load_before[r] != homed)
            sink.fail("loads: rank ", r, ": load_before = ", p.load_before[r], ", sum of its experts' T_e = ", homed);
    }

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
            const int64_t want_rows = gc > 0 ? align_to(gc, x.tp) : 0;
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
    return true;
}

// Key of entry (source rank, token, k) in (source rank, token, k) order.
struct EntryKey {
    int32_t rank = -1, token = -1, k = -1;
    bool valid() const { return rank >= 0; }
    bool operator<(const EntryKey& o) const {
        if (rank != o.rank) return rank < o.rank;
        if (token != o.token) return token < o.token;
        return k < o.k;
    }
};

std::ostream& operator<<(std::ostream& os, const EntryKey& k) {
    return os << "(rank " << k.rank << ", token " << k.token << ", k " << k.k << ")";
}

void check_dst(const Plan& p,
               const Routing& routing,
               const std::vector<std::vector<int32_t>>& dst,
               Sink& sink,
               const Expected& x) {
    const int R = x.R, E = x.E, K = x.K, G = x.G;
    // ---- Shapes and histograms.
    if (routing.R != R || routing.E != E || routing.K != K) {
        sink.fail("routing: R/E/K = ", routing.R, "/", routing.E, "/", routing.K, " differ from the plan's ", R, "/", E,
                  "/", K);
        return;
    }
    if (routing.s.size() != static_cast<size_t>(R) || routing.topk_idx.size() != static_cast<size_t>(R) ||
        dst.size() != static_cast<size_t>(R)) {
        sink.fail("routing: s / topk_idx / dst have ", routing.s.size(), " / ", routing.topk_idx.size(), " / ",
                  dst.size(), " ranks, expected R = ", R);
        return;
    }
    const size_t errors_before = sink.count();
    for (int r = 0; r < R; ++r) {
        if (p.s[r] < 1 || p.s[r] > x.S) return;  // already reported by check_plan
        if (routing.s[r] != p.s[r]) sink.fail("routing: rank ", r, ": s = ", routing.s[r], ", plan has ", p.s[r]);
        const size_t want = static_cast<size_t>(std::max(p.s[r], 0)) * K;
        if (routing.topk_idx[r].size() < want)
            sink.fail("routing: rank ", r, ": topk_idx has ", routing.topk_idx[r].size(),
                      " ids, expected s*K = ", want);
        if (dst[r].size() < want) sink.fail("dst: rank ", r, ": ", dst[r].size(), " codes, expected s*K = ", want);
    }
    if (sink.count() != errors_before) return;
    for (int r = 0; r < R; ++r) {
        std::vector<int64_t> hist(E, 0);
        const size_t n = static_cast<size_t>(p.s[r]) * K;
        for (size_t i = 0; i < n; ++i) {
            const int32_t e = routing.topk_idx[r][i];
            if (e == -1) continue;
            if (e < 0 || e >= E) {
                sink.fail("routing: rank ", r, " token ", i / K, " k ", i % K, ": expert id ", e,
                          " outside [-1, E = ", E, ")");
                continue;
            }
            ++hist[e];
        }
        for (int e = 0; e < E; ++e)
            if (hist[e] != p.tpe[static_cast<size_t>(r) * E + e])
                sink.fail("routing: rank ", r, " expert ", e, ": topk_idx has ", hist[e], " entries, plan tpe says ",
                          p.tpe[static_cast<size_t>(r) * E + e]);
    }
    if (sink.count() != errors_before) return;

    // ---- Row ownership: which expert's segment (and group) each row of each rank belongs to.
    const int64_t nvs = x.nvs;
    std::vector<int32_t> row_expert(static_cast<size_t>(R) * nvs, -1);
    for (int d = 0; d < R; ++d)
        for (int g = 0; g < G; ++g) {
            const int32_t e = p.group_expert[static_cast<size_t>(d) * G + g];
            if (e < 0 || e >= E) continue;
            const int64_t begin = g == 0 ? 0 : p.cu_seqlens[static_cast<size_t>(d) * G + g - 1];
            const int64_t end = std::min<int64_t>(begin + p.group_count[static_cast<size_t>(d) * G + g], nvs);
            for (int64_t row = std::max<int64_t>(begin, 0); row < end; ++row)
                row_expert[static_cast<size_t>(d) * nvs + row] = e;
        }
    std::vector<EntryKey> row_entry(static_cast<size_t>(R) * nvs);

    // Reference-mode expected destinations: entry number g of expert e's (source rank, token, k) sequence.
    std::vector<int64_t> before_src(static_cast<size_t>(E) * R, 0);  // entries of e on source ranks < r
    for (int e = 0; e < E; ++e) {
        int64_t acc = 0;
        for (int r = 0; r < R; ++r) {
            before_src[static_cast<size_t>(e) * R + r] = acc;
            acc += p.tpe[static_cast<size_t>(r) * E + e];
        }
    }
    auto reference_dst = [&](int e, int64_t ordinal) -> int64_t {
        int64_t acc = 0;
        for (int d = 0; d < R; ++d) {
            const int64_t a = p.alloc[static_cast<size_t>(e) * R + d];
            if (ordinal < acc + a) {
                const int64_t begin = x.seg_begin[static_cast<size_t>(d) * E + e];
                return begin < 0 ? -1 : d * nvs + begin + (ordinal - acc);
            }
            acc += a;
        }
        return -1;
    };

    // ---- Every entry.
    std::vector<int64_t> crossing(R, 0);
    std::vector<int64_t> local(static_cast<size_t>(E) * R, 0);  // entries of (e, r) computed on their source r
    std::vector<int64_t> pos(E, 0);
    const bool reference = p.mode == PlannerMode::kReference;
    for (int r = 0; r < R; ++r) {
        std::fill(pos.begin(), pos.end(), 0);
        const int s = p.s[r];
        std::vector<int> seen_ranks;
        for (int t = 0; t < s; ++t) {
            seen_ranks.clear();
            for (int k = 0; k < K; ++k) {
                const size_t i = static_cast<size_t>(t) * K + k;
                const int32_t e = routing.topk_idx[r][i];
                const int32_t code = dst[r][i];
                const EntryKey key{r, t, k};
                if (e == -1) {
                    if (code != detail::kMaskedDst)
                        sink.fail("dst: ", key, ": masked entry has code ", code, ", expected kMaskedDst");
                    continue;
                }
                const int64_t ordinal = before_src[static_cast<size_t>(e) * R + r] + pos[e]++;
                if (code == detail::kMaskedDst) {
                    sink.fail("dst: ", key, " expert ", e, ": unmasked entry encoded as kMaskedDst");
                    continue;
                }
                const int64_t flat = code >= 0 ? code : -(static_cast<int64_t>(code) + 1);
                if (flat < 0 || flat >= R * nvs) {
                    sink.fail("dst: ", key, " expert ", e, ": flat destination ", flat,
                              " outside [0, R*NvS = ", R * nvs, ")");
                    continue;
                }
                const int d = static_cast<int>(flat / nvs);
                const int64_t row = flat % nvs;
                // Dedup (SPEC §3.4): first entry of the token per destination rank carries the payload.
                const bool first = std::find(seen_ranks.begin(), seen_ranks.end(), d) == seen_ranks.end();
                if (first) seen_ranks.push_back(d);
                if (first && code < 0)
                    sink.fail("dst: ", key, " expert ", e, ": first entry of the token for rank ", d,
                              " is encoded as a duplicate (", code, "), expected payload ", flat);
                if (!first && code >= 0)
                    sink.fail("dst: ", key, " expert ", e, ": later entry of the token for rank ", d,
                              " is encoded as a payload (", code, "), expected duplicate ", -flat - 1);
                const int32_t owner = row_expert[static_cast<size_t>(d) * nvs + row];
                if (owner != e) {
                    if (owner < 0)
                        sink.fail("dst: ", key, " expert ", e, ": lands on rank ", d, " row ", row,
                                  ", which is padding or outside every segment");
                    else
                        sink.fail("dst: ", key, " expert ", e, ": lands on rank ", d, " row ", row,
                                  " in the segment of expert ", owner);
                    continue;
                }
                EntryKey& slot = row_entry[static_cast<size_t>(d) * nvs + row];
                if (slot.valid())
                    sink.fail("dst: rank ", d, " row ", row, " (expert ", e, ") hit twice: by ", slot, " and by ", key);
                else
                    slot = key;
                if (d != r)
                    crossing[r] += 1;
                else
                    local[static_cast<size_t>(e) * R + r] += 1;
                if (reference) {
                    const int64_t want = reference_dst(e, ordinal);
                    if (want != flat)
                        sink.fail("dst: ", key, " expert ", e, ": reference mode puts entry #", ordinal,
                                  " of the expert at flat ", want, " (rank ", want < 0 ? -1 : want / nvs, " row ",
                                  want < 0 ? -1 : want % nvs, "), got rank ", d, " row ", row);
                }
            }
        }
    }

    // ---- Every used row hit exactly once, in (source rank, token, k) order within its segment.
    for (int d = 0; d < R; ++d)
        for (int g = 0; g < G; ++g) {
            const int32_t e = p.group_expert[static_cast<size_t>(d) * G + g];
            if (e < 0 || e >= E) continue;
            const int64_t begin = g == 0 ? 0 : p.cu_seqlens[static_cast<size_t>(d) * G + g - 1];
            const int64_t end = std::min<int64_t>(begin + p.group_count[static_cast<size_t>(d) * G + g], nvs);
            EntryKey prev;
            for (int64_t row = std::max<int64_t>(begin, 0); row < end; ++row) {
                const EntryKey& cur = row_entry[static_cast<size_t>(d) * nvs + row];
                if (!cur.valid()) {
                    sink.fail("dst: rank ", d, " group ", g, " (expert ", e, ") row ", row, " is never written");
                    continue;
                }
                if (prev.valid() && !(prev < cur))
                    sink.fail("dst: rank ", d, " group ", g, " (expert ", e, ") row ", row, " holds ", cur, " after ",
                              prev, ": rows are not in (source rank, token, k) order");
                prev = cur;
            }
        }

    // ---- Locality (optimized mode, SPEC §3.3).
    if (!reference)
        for (int e = 0; e < E; ++e)
            for (int r = 0; r < R; ++r) {
                const size_t at = static_cast<size_t>(e) * R + r;
                const int64_t want = std::min<int64_t>(p.tpe[static_cast<size_t>(r) * E + e], p.alloc[at]);
                if (local[at] != want)
                    sink.fail("dst: expert ", e, " rank ", r, ": ", local[at], " entries stay on their source rank, ",
                              "expected min(tpe ", p.tpe[static_cast<size_t>(r) * E + e], ", alloc ", p.alloc[at],
                              ") = ", want);
            }

    // ---- Crossing counters from dst.
    int64_t total = 0;
    for (int r = 0; r < R; ++r) {
        total += crossing[r];
        if (p.crossing_out[r] != crossing[r])
            sink.fail("dst: rank ", r, ": ", crossing[r],
                      " entries leave the rank, plan crossing_out = ", p.crossing_out[r]);
    }
    if (p.cost.crossing_rows != total)
        sink.fail("dst: ", total, " entries cross ranks, plan cost.crossing_rows = ", p.cost.crossing_rows);
}

}  // namespace

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
        check_plan(plan, sink, x);
    }
    return report;
}

ValidationReport validate_dst(const Plan& plan, const Routing& routing, const std::vector<std::vector<int32_t>>& dst) {
    ValidationReport report;
    {
        Sink sink(report);
        Expected x;
        if (check_plan(plan, sink, x)) check_dst(plan, routing, dst, sink, x);
    }
    return report;
}

}  // namespace evenep
