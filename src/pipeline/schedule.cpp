// The interleaved 1F1B order and the event simulator (include/evenep/pipeline.hpp, docs/pipeline.md).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/pipeline.hpp"

namespace evenep::pipeline {

const char* to_string(OpKind kind) {
    switch (kind) {
        case OpKind::kForward: return "F";
        case OpKind::kBackward: return "B";
        case OpKind::kVitForward: return "VF";
        case OpKind::kVitBackward: return "VB";
    }
    return "?";
}

void PipelineConfig::validate() const {
    EVENEP_CHECK(P >= 1, "pipeline: P = ", P, " must be >= 1");
    EVENEP_CHECK(m >= 1, "pipeline: m = ", m, " must be >= 1");
    EVENEP_CHECK(V >= 1, "pipeline: V = ", V, " must be >= 1");
    EVENEP_CHECK(V == 1 || m % P == 0, "pipeline: m = ", m, " must be a multiple of P = ", P,
                 " when V = ", V, " > 1 (interleaved 1F1B runs micro-batches in groups of P)");
    EVENEP_CHECK(std::isfinite(latency) && latency >= 0, "pipeline: latency = ", latency, " must be >= 0");
    for (const auto* costs : {&forward, &backward}) {
        const char* name = costs == &forward ? "forward" : "backward";
        EVENEP_CHECK(costs->empty() || costs->size() == static_cast<size_t>(m), "pipeline: ", name, " costs have ",
                     costs->size(), " values, expected m = ", m);
        for (size_t i = 0; i < costs->size(); ++i)
            EVENEP_CHECK(std::isfinite((*costs)[i]) && (*costs)[i] >= 0, "pipeline: ", name, " cost of micro-batch ",
                         i, " = ", (*costs)[i], " must be >= 0");
    }
}

void VitWork::validate(int m) const {
    EVENEP_CHECK(forward.size() == static_cast<size_t>(m) && backward.size() == static_cast<size_t>(m),
                 "pipeline: ViT work has ", forward.size(), " forward and ", backward.size(),
                 " backward rows, expected m = ", m);
    for (int i = 0; i < m; ++i) {
        EVENEP_CHECK(forward[i].size() == backward[i].size(), "pipeline: micro-batch ", i, " has ",
                     forward[i].size(), " ViT forward pieces but ", backward[i].size(), " backward pieces");
        for (size_t p = 0; p < forward[i].size(); ++p) {
            EVENEP_CHECK(std::isfinite(forward[i][p]) && forward[i][p] >= 0, "pipeline: ViT forward cost of micro-batch ",
                         i, " piece ", p, " = ", forward[i][p], " must be >= 0");
            EVENEP_CHECK(std::isfinite(backward[i][p]) && backward[i][p] >= 0,
                         "pipeline: ViT backward cost of micro-batch ", i, " piece ", p, " = ", backward[i][p],
                         " must be >= 0");
        }
    }
}

double VitWork::total() const {
    double t = 0;
    for (const auto* rows : {&forward, &backward})
        for (const auto& row : *rows)
            for (double c : row) t += c;
    return t;
}

int VitWork::num_pieces() const {
    int n = 0;
    for (const auto& row : forward) n += static_cast<int>(row.size());
    return n;
}

RankOrders interleaved_1f1b_order(const PipelineConfig& cfg) {
    cfg.validate();
    const int P = cfg.P, m = cfg.m, V = cfg.V, PV = P * V;
    const int total = m * V;  // forwards (and backwards) per rank
    RankOrders orders(P);
    for (int r = 0; r < P; ++r) {
        int warmup = 0;
        if (V == 1)
            warmup = std::min(P - r - 1, m);
        else if (m == P)
            warmup = total;  // Megatron: all warm-up when there is exactly one group of micro-batches
        else
            warmup = std::min((P - r - 1) * 2 + (V - 1) * P, total);
        // Forward / backward k of this rank: micro-batch and virtual chunk, then the model chunk v * P + r.
        const auto mb_of = [&](int k) { return (k / PV) * P + k % P; };
        const auto fwd = [&](int k) { return Step{OpKind::kForward, mb_of(k), ((k % PV) / P) * P + r}; };
        const auto bwd = [&](int k) { return Step{OpKind::kBackward, mb_of(k), (V - 1 - (k % PV) / P) * P + r}; };
        std::vector<Step>& o = orders[r];
        for (int k = 0; k < warmup; ++k) o.push_back(fwd(k));
        for (int k = 0; k < total - warmup; ++k) {
            o.push_back(fwd(warmup + k));
            o.push_back(bwd(k));
        }
        for (int k = total - warmup; k < total; ++k) o.push_back(bwd(k));
    }
    return orders;
}

namespace {

// The op graph of one instance: text ops first ([F|B][mb][chunk]), then VF pieces, then VB pieces.
struct Graph {
    int m = 0, PV = 0;
    std::vector<int> vf_base, vb_base;  // [m] first node of the micro-batch's VF / VB pieces
    int num_text = 0, num_nodes = 0;

    int text(OpKind kind, int mb, int chunk) const {
        return ((kind == OpKind::kForward ? 0 : 1) * m + mb) * PV + chunk;
    }
    int node(const Step& s) const {
        switch (s.kind) {
            case OpKind::kForward:
            case OpKind::kBackward: return text(s.kind, s.mb, s.index);
            case OpKind::kVitForward: return vf_base[s.mb] + s.index;
            case OpKind::kVitBackward: return vb_base[s.mb] + s.index;
        }
        return -1;
    }
};

std::string step_name(const Step& s) {
    std::ostringstream os;
    os << to_string(s.kind) << "(mb " << s.mb << (s.kind == OpKind::kForward || s.kind == OpKind::kBackward
                                                        ? ", chunk "
                                                        : ", part ")
       << s.index << ")";
    return os.str();
}

}  // namespace

Schedule simulate(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& orders, Barrier barrier) {
    cfg.validate();
    vit.validate(cfg.m);
    const int P = cfg.P, m = cfg.m, PV = cfg.num_chunks();
    EVENEP_CHECK(orders.size() == static_cast<size_t>(P), "pipeline: simulate: ", orders.size(),
                 " rank orders, expected P = ", P);
    Graph g;
    g.m = m;
    g.PV = PV;
    g.num_text = 2 * m * PV;
    int next = g.num_text;
    g.vf_base.resize(m);
    g.vb_base.resize(m);
    for (int i = 0; i < m; ++i) {
        g.vf_base[i] = next;
        next += static_cast<int>(vit.forward[i].size());
    }
    for (int i = 0; i < m; ++i) {
        g.vb_base[i] = next;
        next += static_cast<int>(vit.backward[i].size());
    }
    g.num_nodes = next;

    // The step that names every node, and the rank that runs it.
    std::vector<Step> step_of(g.num_nodes);
    for (int i = 0; i < m; ++i) {
        for (int c = 0; c < PV; ++c) {
            step_of[g.text(OpKind::kForward, i, c)] = {OpKind::kForward, i, c};
            step_of[g.text(OpKind::kBackward, i, c)] = {OpKind::kBackward, i, c};
        }
        for (int p = 0; p < static_cast<int>(vit.forward[i].size()); ++p) {
            step_of[g.vf_base[i] + p] = {OpKind::kVitForward, i, p};
            step_of[g.vb_base[i] + p] = {OpKind::kVitBackward, i, p};
        }
    }
    std::vector<int> rank_of(g.num_nodes, -1);
    for (int r = 0; r < P; ++r)
        for (const Step& s : orders[r]) {
            bool in_range = s.mb >= 0 && s.mb < m && s.index >= 0;
            if (in_range && (s.kind == OpKind::kForward || s.kind == OpKind::kBackward)) in_range = s.index < PV;
            if (in_range && s.kind != OpKind::kForward && s.kind != OpKind::kBackward)
                in_range = s.index < static_cast<int>(vit.forward[s.mb].size());
            EVENEP_CHECK(in_range, "pipeline: simulate: rank ", r, " has ", step_name(s), ", which does not exist");
            const int n = g.node(s);
            EVENEP_CHECK(rank_of[n] < 0, "pipeline: simulate: ", step_name(s), " appears twice (ranks ", rank_of[n],
                         " and ", r, ")");
            if (n < g.num_text)
                EVENEP_CHECK(s.index % P == r, "pipeline: simulate: ", step_name(s), " is on rank ", r,
                             ", its chunk lives on rank ", s.index % P);
            rank_of[n] = r;
        }
    for (int n = 0; n < g.num_nodes; ++n)
        EVENEP_CHECK(rank_of[n] >= 0, "pipeline: simulate: ", step_name(step_of[n]), " is in no rank's order");

    // Dependencies (node, lag) by the model's rules.
    std::vector<std::vector<std::pair<int, double>>> deps(g.num_nodes);
    std::vector<double> dur(g.num_nodes, 0);
    const auto lag = [&](int a, int b) { return rank_of[a] == rank_of[b] ? 0.0 : cfg.latency; };
    for (int i = 0; i < m; ++i) {
        for (int c = 0; c < PV; ++c) {
            const int f = g.text(OpKind::kForward, i, c), b = g.text(OpKind::kBackward, i, c);
            dur[f] = cfg.forward_cost(i);
            dur[b] = cfg.backward_cost(i);
            if (c > 0) deps[f].push_back({g.text(OpKind::kForward, i, c - 1), 0});
            if (c + 1 < PV)
                deps[b].push_back({g.text(OpKind::kBackward, i, c + 1), 0});
            else
                deps[b].push_back({f, 0});
        }
        const int f0 = g.text(OpKind::kForward, i, 0), b0 = g.text(OpKind::kBackward, i, 0);
        for (size_t p = 0; p < vit.forward[i].size(); ++p) {
            const int vf = g.vf_base[i] + static_cast<int>(p), vb = g.vb_base[i] + static_cast<int>(p);
            dur[vf] = vit.forward[i][p];
            dur[vb] = vit.backward[i][p];
            deps[f0].push_back({vf, 0});
            deps[vb].push_back({b0, 0});
        }
    }
    for (int n = 0; n < g.num_nodes; ++n)
        for (auto& [d, l] : deps[n]) l = lag(d, n);
    if (barrier == Barrier::kVitOutside) {
        // Ranks run their orders in sequence, so the first text op of every rank waiting for all VF and every VB
        // waiting for the last text op of every rank is the whole barrier.
        std::vector<int> vf_nodes, vb_nodes, first_text, last_text;
        for (int n = g.num_text; n < g.num_nodes; ++n)
            (step_of[n].kind == OpKind::kVitForward ? vf_nodes : vb_nodes).push_back(n);
        for (int r = 0; r < P; ++r) {
            int first = -1, last = -1;
            for (const Step& st : orders[r])
                if (const int n = g.node(st); n < g.num_text) {
                    if (first < 0) first = n;
                    last = n;
                }
            if (first >= 0) first_text.push_back(first);
            if (last >= 0) last_text.push_back(last);
        }
        for (int t : first_text)
            for (int v : vf_nodes) deps[t].push_back({v, 0});
        for (int v : vb_nodes)
            for (int t : last_text) deps[v].push_back({t, 0});
    }

    // Execute: each rank runs its next step once its dependencies have ended.
    std::vector<double> start(g.num_nodes, -1), end(g.num_nodes, -1);
    std::vector<size_t> pos(P, 0);
    std::vector<double> free_at(P, 0);
    int done = 0;
    while (done < g.num_nodes) {
        bool progress = false;
        for (int r = 0; r < P; ++r) {
            while (pos[r] < orders[r].size()) {
                const int n = g.node(orders[r][pos[r]]);
                double t = free_at[r];
                bool ready = true;
                for (const auto& [d, l] : deps[n]) {
                    if (end[d] < 0) {
                        ready = false;
                        break;
                    }
                    t = std::max(t, end[d] + l);
                }
                if (!ready) break;
                start[n] = t;
                end[n] = t + dur[n];
                free_at[r] = end[n];
                ++pos[r];
                ++done;
                progress = true;
            }
        }
        if (!progress) {
            std::ostringstream os;
            for (int r = 0; r < P; ++r)
                if (pos[r] < orders[r].size()) os << " rank " << r << ": " << step_name(orders[r][pos[r]]) << ";";
            EVENEP_CHECK(false, "pipeline: simulate: the order deadlocks, stuck at", os.str());
        }
    }

    Schedule s;
    s.busy.assign(P, 0);
    for (int n = 0; n < g.num_nodes; ++n) {
        const Step& st = step_of[n];
        const bool text = n < g.num_text;
        s.ops.push_back({rank_of[n], st.kind, st.mb, text ? st.index : -1, text ? -1 : st.index, start[n], end[n]});
        s.busy[rank_of[n]] += dur[n];
        s.makespan = std::max(s.makespan, end[n]);
    }
    std::sort(s.ops.begin(), s.ops.end(), [](const Op& a, const Op& b) {
        return a.rank != b.rank ? a.rank < b.rank : (a.start != b.start ? a.start < b.start : a.end < b.end);
    });
    s.bubble_fraction.assign(P, 0);
    for (int r = 0; r < P; ++r) s.bubble_fraction[r] = s.makespan > 0 ? 1.0 - s.busy[r] / s.makespan : 0.0;
    return s;
}

}  // namespace evenep::pipeline
