// LPLB-like baseline (perf/lplb.hpp).
#include "perf/lplb.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

#include "evenep/error.hpp"

namespace evenep::perf {
namespace {

// Dinic's max-flow on a small graph with int64 capacities.
class MaxFlow {
public:
    explicit MaxFlow(int n) : head_(n, -1), level_(n), it_(n) {}
    int add(int u, int v, int64_t cap) {
        to_.push_back(v), cap_.push_back(cap), next_.push_back(head_[u]), head_[u] = static_cast<int>(to_.size()) - 1;
        to_.push_back(u), cap_.push_back(0), next_.push_back(head_[v]), head_[v] = static_cast<int>(to_.size()) - 1;
        return static_cast<int>(to_.size()) - 2;
    }
    int64_t run(int s, int t) {
        int64_t flow = 0;
        while (bfs(s, t)) {
            it_ = head_;
            while (const int64_t f = dfs(s, t, std::numeric_limits<int64_t>::max())) flow += f;
        }
        return flow;
    }
    int64_t flow_on(int arc) const { return cap_[arc ^ 1]; }  // the reverse arc's residual

private:
    bool bfs(int s, int t) {
        std::fill(level_.begin(), level_.end(), -1);
        std::queue<int> q;
        level_[s] = 0;
        q.push(s);
        while (!q.empty()) {
            const int u = q.front();
            q.pop();
            for (int a = head_[u]; a >= 0; a = next_[a])
                if (cap_[a] > 0 && level_[to_[a]] < 0) {
                    level_[to_[a]] = level_[u] + 1;
                    q.push(to_[a]);
                }
        }
        return level_[t] >= 0;
    }
    int64_t dfs(int u, int t, int64_t f) {
        if (u == t) return f;
        for (int& a = it_[u]; a >= 0; a = next_[a]) {
            const int v = to_[a];
            if (cap_[a] <= 0 || level_[v] != level_[u] + 1) continue;
            if (const int64_t d = dfs(v, t, std::min(f, cap_[a]))) {
                cap_[a] -= d;
                cap_[a ^ 1] += d;
                return d;
            }
        }
        return 0;
    }
    std::vector<int> head_, level_, it_, to_, next_;
    std::vector<int64_t> cap_;
};

int hypercube_dims(int R) {
    int d = 0;
    while ((1 << d) < R) ++d;
    return (1 << d) == R ? d : -1;
}

// Routes every entry with rank loads at most M; fills `split` when it does.
bool feasible(int R, std::span<const int64_t> base, std::span<const LplbEdge> edges,
              std::span<const int64_t> expert_load, int64_t M, LplbSplit* split) {
    MaxFlow g(R + 2);
    const int src = R, sink = R + 1;
    int64_t total = 0;
    for (int r = 0; r < R; ++r) {
        g.add(src, r, base[r]);
        g.add(r, sink, M);
        total += base[r];
    }
    std::vector<int> arcs;
    for (const LplbEdge& e : edges) arcs.push_back(g.add(e.home, e.holder, expert_load[e.expert]));
    if (g.run(src, sink) != total) return false;
    if (split != nullptr) {
        split->moved.resize(edges.size());
        for (size_t j = 0; j < edges.size(); ++j) split->moved[j] = g.flow_on(arcs[j]);
    }
    return true;
}

}  // namespace

LplbTopology parse_lplb_topology(const std::string& name, int R) {
    if (name == "hypercube") return LplbTopology::kHypercube;
    if (name == "cube") {
        EVENEP_CHECK(R == 8, "LPLB topology 'cube' needs R = 8 (got R = ", R, "); use hypercube, torus or ring");
        return LplbTopology::kHypercube;
    }
    if (name == "torus") return LplbTopology::kTorus;
    if (name == "ring") return LplbTopology::kRing;
    EVENEP_CHECK(false, "LPLB topology '", name, "' must be hypercube, cube, torus or ring");
    return LplbTopology::kRing;
}

const char* to_string(LplbTopology t) {
    switch (t) {
        case LplbTopology::kHypercube: return "hypercube";
        case LplbTopology::kTorus: return "torus";
        case LplbTopology::kRing: return "ring";
    }
    return "?";
}

std::vector<std::vector<int32_t>> lplb_neighbours(LplbTopology topology, int R) {
    EVENEP_CHECK(R >= 1, "LPLB: R = ", R, " must be >= 1");
    std::vector<std::vector<int32_t>> nb(R);
    if (topology == LplbTopology::kHypercube) {
        const int dims = hypercube_dims(R);
        EVENEP_CHECK(dims >= 0, "LPLB hypercube: R = ", R, " is not a power of two (use torus or ring)");
        for (int r = 0; r < R; ++r)
            for (int d = 0; d < dims; ++d) nb[r].push_back(r ^ (1 << d));
    } else {
        int a = 1;  // torus a x b, a the largest divisor <= sqrt(R); ring: 1 x R
        if (topology == LplbTopology::kTorus)
            for (int d = 1; d * d <= R; ++d)
                if (R % d == 0) a = d;
        const int b = R / a;
        for (int r = 0; r < R; ++r) {
            const int x = r / b, y = r % b;
            const int cand[] = {x * b + (y + 1) % b, x * b + (y + b - 1) % b, ((x + 1) % a) * b + y,
                                ((x + a - 1) % a) * b + y};
            for (int c : cand)
                if (c != r && std::find(nb[r].begin(), nb[r].end(), c) == nb[r].end()) nb[r].push_back(c);
        }
    }
    for (std::vector<int32_t>& v : nb) std::sort(v.begin(), v.end());
    return nb;
}

std::vector<LplbEdge> lplb_edges(LplbTopology topology, int R, int E, std::span<const int64_t> expert_load) {
    EVENEP_CHECK(E >= R && E % R == 0, "LPLB: E = ", E, " is not a positive multiple of R = ", R);
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(E), "LPLB: expert_load has ", expert_load.size(),
                 " entries, expected E = ", E);
    const int epn = E / R;
    const std::vector<std::vector<int32_t>> nb = lplb_neighbours(topology, R);
    std::vector<LplbEdge> edges;
    for (int r = 0; r < R; ++r) {
        std::vector<int32_t> own(epn);
        std::iota(own.begin(), own.end(), r * epn);
        std::stable_sort(own.begin(), own.end(),
                         [&](int32_t a, int32_t b) { return expert_load[a] > expert_load[b]; });
        for (size_t d = 0; d < nb[r].size() && d < own.size(); ++d) edges.push_back({r, nb[r][d], own[d]});
    }
    return edges;
}

LplbSplit lplb_solve(int R, int E, std::span<const int64_t> expert_load, std::span<const LplbEdge> edges) {
    EVENEP_CHECK(R >= 1 && E % R == 0 && expert_load.size() == static_cast<size_t>(E), "LPLB: expert_load has ",
                 expert_load.size(), " entries, expected E = ", E, " (a multiple of R = ", R, ")");
    const int epn = E / R;
    std::vector<int64_t> base(R, 0);
    int64_t total = 0;
    for (int e = 0; e < E; ++e) {
        base[e / epn] += expert_load[e];
        total += expert_load[e];
    }
    for (const LplbEdge& ed : edges)
        EVENEP_CHECK(ed.expert >= 0 && ed.expert < E && ed.expert / epn == ed.home && ed.holder >= 0 && ed.holder < R,
                     "LPLB: edge of expert ", ed.expert, " (home ", ed.home, ", holder ", ed.holder, ") is invalid");
    int64_t lo = (total + R - 1) / R, hi = *std::max_element(base.begin(), base.end());
    lo = std::min(lo, hi);
    while (lo < hi) {  // the smallest feasible M; hi (no moves) always is
        const int64_t mid = lo + (hi - lo) / 2;
        if (feasible(R, base, edges, expert_load, mid, nullptr))
            hi = mid;
        else
            lo = mid + 1;
    }
    LplbSplit out;
    feasible(R, base, edges, expert_load, hi, &out);
    out.rank_load = base;
    for (size_t j = 0; j < edges.size(); ++j) {
        out.rank_load[edges[j].home] -= out.moved[j];
        out.rank_load[edges[j].holder] += out.moved[j];
    }
    out.max_load = *std::max_element(out.rank_load.begin(), out.rank_load.end());
    return out;
}

std::vector<int64_t> lplb_alloc(int R, int E, std::span<const int64_t> expert_load, std::span<const LplbEdge> edges,
                                const LplbSplit& split) {
    const int epn = E / R;
    std::vector<int64_t> alloc(static_cast<size_t>(E) * R, 0);
    for (int e = 0; e < E; ++e) alloc[static_cast<size_t>(e) * R + e / epn] = expert_load[e];
    for (size_t j = 0; j < edges.size(); ++j) {
        alloc[static_cast<size_t>(edges[j].expert) * R + edges[j].home] -= split.moved[j];
        alloc[static_cast<size_t>(edges[j].expert) * R + edges[j].holder] += split.moved[j];
    }
    return alloc;
}

}  // namespace evenep::perf
