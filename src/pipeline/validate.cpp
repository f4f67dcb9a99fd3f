// The independent schedule check (include/evenep/pipeline.hpp validate_schedule). It re-derives every rule from
// the model's definition and shares no code with the simulator or the policies: a bug there must show here.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "evenep/pipeline.hpp"

namespace evenep::pipeline {
namespace {

// Times are sums of costs; allow rounding of that order.
inline constexpr double kTolerance = 1e-6;

using Key = std::tuple<int, int, int>;  // (kind, mb, chunk or part)

Key key_of(const Op& op) {
    const bool text = op.kind == OpKind::kForward || op.kind == OpKind::kBackward;
    return {static_cast<int>(op.kind), op.mb, text ? op.chunk : op.part};
}

std::string name_of(const Op& op) {
    std::ostringstream os;
    const bool text = op.kind == OpKind::kForward || op.kind == OpKind::kBackward;
    os << to_string(op.kind) << "(mb " << op.mb << (text ? ", chunk " : ", part ") << (text ? op.chunk : op.part)
       << ") on rank " << op.rank << " [" << op.start << ", " << op.end << ")";
    return os.str();
}

class Report {
public:
    explicit Report(int max_messages) : max_(max_messages) {}
    template <typename... Args>
    void add(Args&&... args) {
        if (static_cast<int>(lines_.size()) >= max_) return;
        std::ostringstream os;
        ((os << args), ...);
        lines_.push_back(os.str());
    }
    std::vector<std::string> take() { return std::move(lines_); }

private:
    int max_;
    std::vector<std::string> lines_;
};

}  // namespace

std::vector<std::string> validate_schedule(const PipelineConfig& cfg, const VitWork& vit, const Schedule& s,
                                           int max_messages) {
    Report rep(max_messages);
    const int P = cfg.P, m = cfg.m, PV = cfg.P * cfg.V;
    std::map<Key, const Op*> found;
    for (const Op& op : s.ops) {
        const bool text = op.kind == OpKind::kForward || op.kind == OpKind::kBackward;
        if (op.rank < 0 || op.rank >= P || op.mb < 0 || op.mb >= m) {
            rep.add("op ", name_of(op), ": rank or micro-batch out of range");
            continue;
        }
        double cost = 0;
        if (text) {
            if (op.chunk < 0 || op.chunk >= PV) {
                rep.add("op ", name_of(op), ": chunk outside [0, ", PV, ")");
                continue;
            }
            if (op.chunk % P != op.rank) rep.add(name_of(op), ": chunk ", op.chunk, " lives on rank ", op.chunk % P);
            cost = op.kind == OpKind::kForward ? cfg.forward_cost(op.mb) : cfg.backward_cost(op.mb);
        } else {
            const auto& row = op.kind == OpKind::kVitForward ? vit.forward[op.mb] : vit.backward[op.mb];
            if (op.part < 0 || op.part >= static_cast<int>(row.size())) {
                rep.add("op ", name_of(op), ": part outside [0, ", row.size(), ")");
                continue;
            }
            cost = row[op.part];
        }
        if (std::abs((op.end - op.start) - cost) > kTolerance)
            rep.add(name_of(op), ": lasts ", op.end - op.start, ", its cost is ", cost);
        if (op.start < -kTolerance) rep.add(name_of(op), ": starts before 0");
        if (!found.emplace(key_of(op), &op).second) rep.add(name_of(op), ": appears more than once");
    }
    // Presence.
    size_t expected = 0;
    for (int i = 0; i < m; ++i) {
        for (int c = 0; c < PV; ++c)
            for (OpKind k : {OpKind::kForward, OpKind::kBackward})
                if (!found.count({static_cast<int>(k), i, c}))
                    rep.add("missing ", to_string(k), "(mb ", i, ", chunk ", c, ")");
        for (OpKind k : {OpKind::kVitForward, OpKind::kVitBackward}) {
            const auto& row = k == OpKind::kVitForward ? vit.forward[i] : vit.backward[i];
            for (int p = 0; p < static_cast<int>(row.size()); ++p)
                if (!found.count({static_cast<int>(k), i, p}))
                    rep.add("missing ", to_string(k), "(mb ", i, ", part ", p, ")");
            expected += row.size();
        }
        expected += 2 * static_cast<size_t>(PV);
    }
    if (s.ops.size() != expected) rep.add("schedule has ", s.ops.size(), " ops, the instance has ", expected);

    // Dependencies: `after` must start no earlier than `before` ends, plus the latency across ranks.
    const auto need = [&](const Op* before, const Op* after) {
        if (before == nullptr || after == nullptr) return;
        const double lag = before->rank == after->rank ? 0.0 : cfg.latency;
        if (after->start + kTolerance < before->end + lag)
            rep.add(name_of(*after), " starts before ", name_of(*before), " ends", lag > 0 ? " (+ latency)" : "");
    };
    const auto get = [&](OpKind k, int mb, int idx) -> const Op* {
        auto it = found.find({static_cast<int>(k), mb, idx});
        return it == found.end() ? nullptr : it->second;
    };
    for (int i = 0; i < m; ++i) {
        for (int c = 1; c < PV; ++c) need(get(OpKind::kForward, i, c - 1), get(OpKind::kForward, i, c));
        need(get(OpKind::kForward, i, PV - 1), get(OpKind::kBackward, i, PV - 1));
        for (int c = PV - 2; c >= 0; --c) need(get(OpKind::kBackward, i, c + 1), get(OpKind::kBackward, i, c));
        for (int p = 0; p < static_cast<int>(vit.forward[i].size()); ++p) {
            need(get(OpKind::kVitForward, i, p), get(OpKind::kForward, i, 0));
            need(get(OpKind::kBackward, i, 0), get(OpKind::kVitBackward, i, p));
        }
    }

    // No overlap on a rank; per-rank busy time and the makespan.
    std::vector<std::vector<const Op*>> by_rank(P);
    double makespan = 0;
    for (const Op& op : s.ops)
        if (op.rank >= 0 && op.rank < P) {
            by_rank[op.rank].push_back(&op);
            makespan = std::max(makespan, op.end);
        }
    for (int r = 0; r < P; ++r) {
        auto& ops = by_rank[r];
        std::sort(ops.begin(), ops.end(), [](const Op* a, const Op* b) { return a->start < b->start; });
        double busy = 0;
        for (size_t j = 0; j < ops.size(); ++j) {
            busy += ops[j]->end - ops[j]->start;
            if (j > 0 && ops[j]->start + kTolerance < ops[j - 1]->end)
                rep.add("rank ", r, ": ", name_of(*ops[j]), " overlaps ", name_of(*ops[j - 1]));
        }
        if (s.busy.size() != static_cast<size_t>(P) || std::abs(s.busy[r] - busy) > kTolerance * (1 + busy))
            rep.add("rank ", r, ": reported busy time ", s.busy.size() > static_cast<size_t>(r) ? s.busy[r] : -1.0,
                    ", the ops add up to ", busy);
        const double frac = makespan > 0 ? 1.0 - busy / makespan : 0.0;
        if (s.bubble_fraction.size() != static_cast<size_t>(P) || std::abs(s.bubble_fraction[r] - frac) > kTolerance)
            rep.add("rank ", r, ": reported bubble fraction does not match ", frac);
    }
    if (std::abs(makespan - s.makespan) > kTolerance * (1 + makespan))
        rep.add("reported makespan ", s.makespan, ", the last op ends at ", makespan);
    return rep.take();
}

}  // namespace evenep::pipeline
