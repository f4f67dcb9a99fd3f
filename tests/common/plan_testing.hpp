// tests/common/plan_testing.hpp — header-only helpers for the planner and validator tests.
//
// A small routing generator of its own (independent of evenep::Rng and the library generators, so the tests
// keep working and stay meaningful if those change), histograms computed with plain loops, all ranks'
// encoded destinations, the Theorem 2 instance, and a field-by-field plan comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep::testing {

// SplitMix64: tiny, fully specified, the same numbers on every platform.
class TestRng {
  public:
    explicit TestRng(uint64_t seed) : state_(seed) {}
    uint64_t next() { return detail::splitmix64_next(state_); }
    // Uniform integer in [0, n), n >= 1.
    int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
    // Uniform integer in [lo, hi].
    int between(int lo, int hi) { return lo + below(hi - lo + 1); }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
    bool chance(double p) { return uniform() < p; }

  private:
    uint64_t state_;
};

// How random_routing draws top-k ids.
struct RoutingOptions {
    double skew = 0.0;       // popularity_e = u_e^-skew, u_e uniform in (0, 1]: 0 = uniform, 3 = very heavy tail
    double mask_prob = 0.0;  // probability that an entry is masked (-1)
    bool unequal_s = false;  // s_r uniform in [1, S] instead of S on every rank
    int num_hot = 0;         // > 0: only experts [hot_first, hot_first + num_hot) are ever picked
    int hot_first = 0;
};

inline std::string describe(const RoutingOptions& o) {
    std::ostringstream os;
    os << "skew=" << o.skew << " mask=" << o.mask_prob << (o.unequal_s ? " unequal_s" : "");
    if (o.num_hot > 0) os << " hot=[" << o.hot_first << "," << o.hot_first + o.num_hot << ")";
    return os.str();
}

// Random routing: each token picks K distinct experts (as far as the candidate set allows; when fewer than K
// candidates exist the remaining entries are masked) with probability proportional to popularity, sequential
// sampling without replacement.
inline Routing random_routing(const Config& cfg, uint64_t seed, const RoutingOptions& opt = {}) {
    TestRng rng(seed);
    Routing out;
    out.R = cfg.R;
    out.E = cfg.E;
    out.K = cfg.K;
    out.S = cfg.S;
    std::vector<double> pop(cfg.E, 0.0);
    for (int e = 0; e < cfg.E; ++e) {
        const bool candidate = opt.num_hot <= 0 || (e >= opt.hot_first && e < opt.hot_first + opt.num_hot);
        if (!candidate) continue;
        const double u = 1.0 - rng.uniform();  // (0, 1]
        pop[e] = opt.skew > 0 ? std::pow(u, -opt.skew) : 1.0;
    }
    out.s.resize(cfg.R);
    out.topk_idx.resize(cfg.R);
    std::vector<double> w;
    for (int r = 0; r < cfg.R; ++r) {
        const int s = opt.unequal_s ? rng.between(1, cfg.S) : cfg.S;
        out.s[r] = s;
        out.topk_idx[r].assign(static_cast<size_t>(s) * cfg.K, -1);
        for (int t = 0; t < s; ++t) {
            w = pop;
            for (int k = 0; k < cfg.K; ++k) {
                double total = 0;
                for (double v : w) total += v;
                if (total <= 0) break;
                double x = rng.uniform() * total;
                int pick = -1;
                for (int e = 0; e < cfg.E; ++e) {
                    if (w[e] <= 0) continue;
                    pick = e;
                    if (x < w[e]) break;
                    x -= w[e];
                }
                w[pick] = 0;
                if (!rng.chance(opt.mask_prob)) out.topk_idx[r][static_cast<size_t>(t) * cfg.K + k] = pick;
            }
        }
    }
    return out;
}

// [R*E] histogram of a routing, computed with plain loops (ids outside [0, E) are ignored).
inline std::vector<int32_t> histogram_of(const Routing& routing) {
    std::vector<int32_t> tpe(static_cast<size_t>(routing.R) * routing.E, 0);
    for (int r = 0; r < routing.R; ++r)
        for (int32_t e : routing.topk_idx[r])
            if (e >= 0 && e < routing.E) ++tpe[static_cast<size_t>(r) * routing.E + e];
    return tpe;
}

// Random histograms without a concrete routing: rank r routes between 0 and s_r*K entries, spread with the
// given skew. Only for planner-level checks (no dst).
inline std::vector<int32_t> random_tpe(const Config& cfg,
                                       const std::vector<int32_t>& s,
                                       uint64_t seed,
                                       double skew = 1.0) {
    TestRng rng(seed);
    std::vector<double> pop(cfg.E);
    for (double& p : pop) p = std::pow(1.0 - rng.uniform(), -skew);
    std::vector<double> cum(cfg.E);
    double total = 0;
    for (int e = 0; e < cfg.E; ++e) cum[e] = (total += pop[e]);
    std::vector<int32_t> tpe(static_cast<size_t>(cfg.R) * cfg.E, 0);
    for (int r = 0; r < cfg.R; ++r) {
        const int cap = s[r] * cfg.K;
        const int n = rng.chance(0.2) ? rng.between(0, cap) : cap;
        for (int i = 0; i < n; ++i) {
            const double x = rng.uniform() * total;
            const int e = static_cast<int>(std::upper_bound(cum.begin(), cum.end(), x) - cum.begin());
            ++tpe[static_cast<size_t>(r) * cfg.E + std::min(e, cfg.E - 1)];
        }
    }
    return tpe;
}

// Theorem 2 instance (SPEC §3.5): rank 0's experts receive nothing, every other expert gets exactly `per_rank`
// entries from every rank. Token t of rank r takes experts epn + ((r*s + t)*K + k) mod (E - epn), so the K ids
// of a token are distinct when K <= E - epn; s = per_rank*(E - epn)/K must be an integer (the caller picks
// per_rank so it is). Requires R >= 2.
inline Routing theorem2_routing(const Config& cfg, int per_rank) {
    const int epn = cfg.epn(), others = cfg.E - epn;
    const int s = per_rank * others / cfg.K;
    Routing out;
    out.R = cfg.R;
    out.E = cfg.E;
    out.K = cfg.K;
    out.S = cfg.S;
    out.s.assign(cfg.R, s);
    out.topk_idx.resize(cfg.R);
    for (int r = 0; r < cfg.R; ++r) {
        out.topk_idx[r].resize(static_cast<size_t>(s) * cfg.K);
        for (int t = 0; t < s; ++t)
            for (int k = 0; k < cfg.K; ++k)
                out.topk_idx[r][static_cast<size_t>(t) * cfg.K + k] =
                    epn + static_cast<int32_t>((static_cast<int64_t>(r * s + t) * cfg.K + k) % others);
    }
    return out;
}

// Every rank's encoded destinations, [R][s_r*K].
inline std::vector<std::vector<int32_t>> all_dst(const Plan& plan, const Routing& routing) {
    std::vector<std::vector<int32_t>> dst(plan.R());
    for (int r = 0; r < plan.R(); ++r) {
        dst[r].assign(static_cast<size_t>(plan.s[r]) * plan.cfg.K, 0);
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
    return dst;
}

// Empty when the two plans are identical in every field; else names the first differing field and index.
inline std::string plan_diff(const Plan& a, const Plan& b) {
    std::ostringstream os;
    auto cmp = [&](const char* name, const auto& x, const auto& y) {
        if (!os.str().empty()) return;
        if (x.size() != y.size()) {
            os << name << ": size " << x.size() << " vs " << y.size();
            return;
        }
        for (size_t i = 0; i < x.size(); ++i)
            if (x[i] != y[i]) {
                os << name << "[" << i << "]: " << static_cast<int64_t>(x[i]) << " vs " << static_cast<int64_t>(y[i]);
                return;
            }
    };
    if (a.cfg.to_string() != b.cfg.to_string()) os << "cfg: " << a.cfg.to_string() << " vs " << b.cfg.to_string();
    if (os.str().empty() && a.mode != b.mode) os << "mode differs";
    if (os.str().empty() && a.slack_ppm != b.slack_ppm) os << "slack_ppm: " << a.slack_ppm << " vs " << b.slack_ppm;
    // Every array of the one list (evenep::for_each_array), as int64 values.
    const auto values = [](const Plan& p) {
        std::vector<std::pair<const char*, std::vector<int64_t>>> out;
        for_each_array(p, [&](const char* name, PlanExtent, const auto& v) {
            std::vector<int64_t> w(v.size());
            for (size_t i = 0; i < v.size(); ++i) w[i] = static_cast<int64_t>(v[i]);
            out.emplace_back(name, std::move(w));
        });
        return out;
    };
    const auto va = values(a), vb = values(b);
    for (size_t k = 0; k < va.size(); ++k) cmp(va[k].first, va[k].second, vb[k].second);
    const std::vector<int64_t> ca{a.cost.max_rank_copy_traffic, a.cost.total_copies, a.cost.crossing_rows,
                                  a.cost.moved_entries, a.cost.copy_critical_path, a.cost.direct_critical_path};
    const std::vector<int64_t> cb{b.cost.max_rank_copy_traffic, b.cost.total_copies, b.cost.crossing_rows,
                                  b.cost.moved_entries, b.cost.copy_critical_path, b.cost.direct_critical_path};
    cmp("cost", ca, cb);
    return os.str();
}

}  // namespace evenep::testing
