// validate_dst (evenep/validate.hpp): every rank's encoded destinations (SPEC §3.4) checked against a concrete
// routing and the plan check_plan accepted — shapes and histograms, each entry's destination row, the rows' order
// inside each group, locality and the crossing counters. Like validate.cpp, never uses the planner's code.
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "evenep/detail/layout.hpp"
#include "evenep/validate.hpp"
#include "validate_checks.hpp"

namespace evenep::validate_detail {
namespace {

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

}  // namespace

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

}  // namespace evenep::validate_detail

namespace evenep {

ValidationReport validate_dst(const Plan& plan, const Routing& routing, const std::vector<std::vector<int32_t>>& dst) {
    ValidationReport report;
    {
        validate_detail::Sink sink(report);
        validate_detail::Expected x;
        if (validate_detail::check_plan(plan, sink, x)) validate_detail::check_dst(plan, routing, dst, sink, x);
    }
    return report;
}

}  // namespace evenep
