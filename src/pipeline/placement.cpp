// ViT placement policies none | sync | bubbles and the policy entry point (include/evenep/pipeline.hpp,
// docs/pipeline.md). The exact policy is in optimal.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/pipeline.hpp"
#include "placement_internal.hpp"

namespace evenep::pipeline {

const char* to_string(VitPolicy policy) {
    switch (policy) {
        case VitPolicy::kNone: return "none";
        case VitPolicy::kSync: return "sync";
        case VitPolicy::kBubbles: return "bubbles";
        case VitPolicy::kOptimal: return "optimal";
    }
    return "?";
}

VitPolicy parse_vit_policy(const std::string& name) {
    for (VitPolicy p : {VitPolicy::kNone, VitPolicy::kSync, VitPolicy::kBubbles, VitPolicy::kOptimal})
        if (name == to_string(p)) return p;
    EVENEP_CHECK(false, "pipeline: unknown ViT policy '", name, "' (expected none, sync, bubbles or optimal)");
}

namespace detail {

VitWork no_vit(int m) {
    VitWork w;
    w.forward.resize(m);
    w.backward.resize(m);
    return w;
}

RankOrders merge_orders(const PipelineConfig& cfg, const RankOrders& text, const Schedule& text_schedule,
                        const std::vector<PlacedPiece>& pieces) {
    // Sort key per step: (planned start, class, sequence) with class 0 = VF, 1 = text, 2 = VB, so a zero-length
    // piece at a text op's start keeps VF before and VB after it.
    struct Keyed {
        double start;
        int cls;
        int seq;
        Step step;
    };
    std::vector<std::vector<Keyed>> keyed(cfg.P);
    // Text ops' planned starts from the text-only schedule.
    const int PV = cfg.num_chunks();
    const auto text_idx = [&](OpKind k, int mb, int chunk) {
        return ((k == OpKind::kForward ? 0 : 1) * cfg.m + mb) * PV + chunk;
    };
    std::vector<double> planned(2 * static_cast<size_t>(cfg.m) * PV, 0);
    for (const Op& op : text_schedule.ops) planned[text_idx(op.kind, op.mb, op.chunk)] = op.start;
    for (int r = 0; r < cfg.P; ++r)
        for (size_t j = 0; j < text[r].size(); ++j) {
            const Step& st = text[r][j];
            keyed[r].push_back({planned[text_idx(st.kind, st.mb, st.index)], 1, static_cast<int>(j), st});
        }
    int seq = 0;
    for (const PlacedPiece& p : pieces)
        keyed[p.rank].push_back({p.start, p.step.kind == OpKind::kVitForward ? 0 : 2, seq++, p.step});
    RankOrders out(cfg.P);
    for (int r = 0; r < cfg.P; ++r) {
        std::stable_sort(keyed[r].begin(), keyed[r].end(), [](const Keyed& a, const Keyed& b) {
            if (a.start != b.start) return a.start < b.start;
            if (a.cls != b.cls) return a.cls < b.cls;
            return a.seq < b.seq;
        });
        for (const Keyed& k : keyed[r]) out[r].push_back(k.step);
    }
    return out;
}

}  // namespace detail

namespace {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct Piece {
    Step step;
    double cost;
};

// The pieces of one direction in micro-batch order.
std::vector<Piece> pieces_of(const VitWork& vit, OpKind kind) {
    std::vector<Piece> out;
    const auto& rows = kind == OpKind::kVitForward ? vit.forward : vit.backward;
    for (int i = 0; i < static_cast<int>(rows.size()); ++i)
        for (int p = 0; p < static_cast<int>(rows[i].size()); ++p) out.push_back({{kind, i, p}, rows[i][p]});
    return out;
}

// LPT over the ranks: the largest piece first onto the least-loaded rank.
std::vector<std::vector<Step>> lpt_over_ranks(std::vector<Piece> pieces, int P) {
    std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.cost > b.cost; });
    std::vector<double> load(P, 0);
    std::vector<std::vector<Step>> out(P);
    for (const Piece& p : pieces) {
        const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        load[r] += p.cost;
        out[r].push_back(p.step);
    }
    return out;
}

PolicyResult sync_policy(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& text) {
    const auto vf = lpt_over_ranks(pieces_of(vit, OpKind::kVitForward), cfg.P);
    const auto vb = lpt_over_ranks(pieces_of(vit, OpKind::kVitBackward), cfg.P);
    RankOrders orders(cfg.P);
    for (int r = 0; r < cfg.P; ++r) {
        orders[r] = vf[r];
        orders[r].insert(orders[r].end(), text[r].begin(), text[r].end());
        orders[r].insert(orders[r].end(), vb[r].begin(), vb[r].end());
    }
    PolicyResult res;
    res.schedule = simulate(cfg, vit, orders, Barrier::kVitOutside);
    return res;
}

// Free time of every rank: sorted disjoint intervals, the first starting at -inf and the last ending at +inf.
using Intervals = std::vector<std::pair<double, double>>;

std::vector<Intervals> free_time(const PipelineConfig& cfg, const Schedule& text_schedule) {
    std::vector<Intervals> free(cfg.P);
    std::vector<double> at(cfg.P, -kInf);
    for (const Op& op : text_schedule.ops) {  // sorted by (rank, start)
        if (op.start > at[op.rank]) free[op.rank].push_back({at[op.rank], op.start});
        at[op.rank] = std::max(at[op.rank], op.end);
    }
    for (int r = 0; r < cfg.P; ++r) free[r].push_back({at[r], kInf});
    return free;
}

void occupy(Intervals& iv, size_t j, double start, double end) {
    const auto [a, b] = iv[j];
    iv.erase(iv.begin() + static_cast<std::ptrdiff_t>(j));
    if (end < b) iv.insert(iv.begin() + static_cast<std::ptrdiff_t>(j), {end, b});
    if (a < start) iv.insert(iv.begin() + static_cast<std::ptrdiff_t>(j), {a, start});
}

enum class PieceOrder { kByTime, kBySize };

// Mirrors time (t -> -t) so "as late as possible before a deadline" becomes "as early as possible after a release".
void mirror(std::vector<Intervals>& free) {
    for (Intervals& iv : free) {
        std::reverse(iv.begin(), iv.end());
        for (auto& [a, b] : iv) std::tie(a, b) = std::pair{-b, -a};
    }
}

// Places every piece (in the order given: by release, then largest first, or largest first) at the earliest
// start >= release(piece, rank) at which some rank is free for its whole cost (lowest rank on ties), and marks
// that time busy. Returns (rank, start) per piece.
template <typename Release>
std::vector<std::pair<int, double>> place_earliest(std::vector<Intervals>& free, std::vector<Piece>& pieces,
                                                   PieceOrder order, Release release) {
    std::stable_sort(pieces.begin(), pieces.end(), [&](const Piece& a, const Piece& b) {
        if (order == PieceOrder::kByTime && release(a, 0) != release(b, 0)) return release(a, 0) < release(b, 0);
        return a.cost > b.cost;
    });
    std::vector<std::pair<int, double>> out;
    for (const Piece& p : pieces) {
        double best = kInf;
        int best_r = -1;
        size_t best_j = 0;
        for (int r = 0; r < static_cast<int>(free.size()); ++r)
            for (size_t j = 0; j < free[r].size(); ++j) {
                const double lo = std::max(free[r][j].first, release(p, r));
                if (free[r][j].second - lo < p.cost) continue;
                if (lo < best) {
                    best = lo;
                    best_r = r;
                    best_j = j;
                }
                break;
            }
        EVENEP_ASSERT(best_r >= 0, "bubbles: no slot for a ViT piece");
        occupy(free[best_r], best_j, best, best + p.cost);
        out.push_back({best_r, best});
    }
    return out;
}

// The K3 placement: forwards as late as possible before their deadline (mirror image of list scheduling, so the
// early micro-batches' forwards spill before time 0: the synchronous part up front), backwards as early as
// possible after their release. Returns the planned pieces (the simulator then executes the merged order).
std::vector<detail::PlacedPiece> bubbles_plan(const PipelineConfig& cfg, const VitWork& vit,
                                              const Schedule& text_schedule, PieceOrder order) {
    std::vector<Intervals> free = free_time(cfg, text_schedule);
    std::vector<double> f0_start(cfg.m), b0_end(cfg.m);
    for (const Op& op : text_schedule.ops) {
        if (op.chunk != 0) continue;
        if (op.kind == OpKind::kForward) f0_start[op.mb] = op.start;
        if (op.kind == OpKind::kBackward) b0_end[op.mb] = op.end;
    }
    const auto lag = [&](int r) { return r == 0 ? 0.0 : cfg.latency; };
    std::vector<detail::PlacedPiece> placed;

    std::vector<Piece> vf = pieces_of(vit, OpKind::kVitForward);
    mirror(free);  // deadline f0_start - lag is the mirrored release lag - f0_start
    const auto vf_at = place_earliest(free, vf, order, [&](const Piece& p, int r) { return lag(r) - f0_start[p.step.mb]; });
    mirror(free);
    for (size_t i = 0; i < vf.size(); ++i) placed.push_back({vf_at[i].first, -(vf_at[i].second + vf[i].cost), vf[i].step});

    std::vector<Piece> vb = pieces_of(vit, OpKind::kVitBackward);
    const auto vb_at = place_earliest(free, vb, order, [&](const Piece& p, int r) { return b0_end[p.step.mb] + lag(r); });
    for (size_t i = 0; i < vb.size(); ++i) placed.push_back({vb_at[i].first, vb_at[i].second, vb[i].step});
    return placed;
}

}  // namespace

namespace detail {

Schedule bubbles_schedule(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& text,
                          const Schedule& text_schedule) {
    // Both piece orders, and the sync placement as a floor: the best makespan wins.
    Schedule best = sync_policy(cfg, vit, text).schedule;
    for (PieceOrder order : {PieceOrder::kByTime, PieceOrder::kBySize}) {
        const auto placed = bubbles_plan(cfg, vit, text_schedule, order);
        Schedule s = simulate(cfg, vit, merge_orders(cfg, text, text_schedule, placed));
        if (s.makespan < best.makespan) best = std::move(s);
    }
    return best;
}

}  // namespace detail

PolicyResult place_vit(const PipelineConfig& cfg, const VitWork& vit, VitPolicy policy, const PolicyOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    cfg.validate();
    vit.validate(cfg.m);
    const RankOrders text = interleaved_1f1b_order(cfg);
    const VitWork none = detail::no_vit(cfg.m);
    const Schedule text_schedule = simulate(cfg, none, text);

    PolicyResult res;
    switch (policy) {
        case VitPolicy::kNone: res.schedule = text_schedule; break;
        case VitPolicy::kSync: res = sync_policy(cfg, vit, text); break;
        case VitPolicy::kBubbles: res.schedule = detail::bubbles_schedule(cfg, vit, text, text_schedule); break;
        case VitPolicy::kOptimal: res = detail::optimal_policy(cfg, vit, text, text_schedule, options); break;
    }
    res.text_makespan = text_schedule.makespan;
    res.vit_total = policy == VitPolicy::kNone ? 0.0 : vit.total();
    res.exposed = res.schedule.makespan - res.text_makespan;
    res.hidden_fraction = res.vit_total > 0 ? 1.0 - res.exposed / (res.vit_total / cfg.P) : 1.0;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

}  // namespace evenep::pipeline
