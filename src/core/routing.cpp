// Routing generators (SPEC §7): round-robin, lognormal popularity, target maxvio, adversarial kinds,
// route weights. Everything is a pure function of the spec and the seed.
//
// Determinism: the integer streams (SplitMix64 -> xoshiro256**) are identical everywhere, and results do not
// depend on the number of threads (every rank has its own stream). The float transforms use +, -, *, /, sqrt
// (exact under IEEE 754) and log/exp/cos from the C library; a libm that differs in the last ulp could change
// a selection only on a near-tie of two keys.
#include "evenep/routing.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "evenep/detail/hash.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

// Stream tags for derive_seed: every consumer of a seed draws from its own stream.
inline constexpr uint64_t kStreamPopularity = 1;
inline constexpr uint64_t kStreamRankRoute = 2;
inline constexpr uint64_t kStreamMask = 3;
inline constexpr uint64_t kStreamUnequalS = 4;
inline constexpr uint64_t kStreamRouteWeights = 5;

// sigma of the lognormal routing under kMasked and kUnequalS (moderate skew, maxvio ~ 1 at usual sizes).
inline constexpr double kAdversarialSigma = 1.0;
// kMasked: a token is fully masked with probability 1/8, otherwise each entry with probability 1/7,
// so 1/8 + 7/8 * 1/7 = 25% of the entries are masked on average.
inline constexpr double kFullMaskProb = 1.0 / 8.0;
inline constexpr double kEntryMaskProb = 1.0 / 7.0;

// target-maxvio bisection (SPEC §7).
inline constexpr double kMinSigma = 1e-5;
inline constexpr double kMaxSigma = 10.0;
inline constexpr int kMaxBisectEvals = 40;

// Lognormal generation runs ranks on up to kMaxThreads threads once sum_r s_r * E reaches kParallelWork.
inline constexpr int64_t kParallelWork = int64_t{1} << 24;
inline constexpr int kMaxThreads = 16;

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tagged_stream(uint64_t tag, uint64_t index) { return (tag << 40) ^ index; }

void check_spec(const RoutingSpec& spec) {
    EVENEP_CHECK(spec.R >= 1, "routing: R = ", spec.R, " must be >= 1");
    EVENEP_CHECK(spec.E >= 1, "routing: E = ", spec.E, " must be >= 1");
    EVENEP_CHECK(spec.E % spec.R == 0, "routing: E = ", spec.E, " is not a multiple of R = ", spec.R,
                 " (E % R = ", spec.E % spec.R, ")");
    EVENEP_CHECK(spec.K >= 1 && spec.K <= detail::kMaxTopK, "routing: K = ", spec.K, " must be in [1, ",
                 detail::kMaxTopK, "]");
    EVENEP_CHECK(spec.K <= spec.E, "routing: K = ", spec.K, " exceeds E = ", spec.E, " (ids of a token are distinct)");
    EVENEP_CHECK(spec.S >= 1, "routing: S = ", spec.S, " must be >= 1");
    EVENEP_CHECK(static_cast<int64_t>(spec.R) * spec.S * spec.K <= INT32_MAX,
                 "routing: R*S*K = ", static_cast<int64_t>(spec.R) * spec.S * spec.K, " overflows int32");
}

// A routing with every rank's s_r and zero-filled ids.
Routing empty_routing(const RoutingSpec& spec, const std::vector<int32_t>& s) {
    Routing out;
    out.R = spec.R;
    out.E = spec.E;
    out.K = spec.K;
    out.S = spec.S;
    out.s = s;
    out.topk_idx.resize(spec.R);
    for (int r = 0; r < spec.R; ++r) out.topk_idx[r].assign(static_cast<size_t>(s[r]) * spec.K, 0);
    return out;
}

Routing empty_routing(const RoutingSpec& spec) { return empty_routing(spec, std::vector<int32_t>(spec.R, spec.S)); }

// Per-expert 1/popularity, popularity_e = exp(sigma * z_e) with z_e ~ N(0,1) from the shared seed. The
// popularity is normalised by the largest one (selection is scale-invariant) and 1/pop clamped to DBL_MAX
// so that 0 * inv_pop is never NaN.
std::vector<double> inverse_popularity(const RoutingSpec& spec, double sigma) {
    const std::vector<double> z = lognormal_scores(spec);
    const double z_max = *std::max_element(z.begin(), z.end());
    std::vector<double> inv_pop(spec.E);
    for (int e = 0; e < spec.E; ++e) {
        const double v = std::exp(sigma * (z_max - z[e]));
        inv_pop[e] = std::isfinite(v) ? v : DBL_MAX;
    }
    return inv_pop;
}

// K distinct experts of one token, proportionally to popularity without replacement (Gumbel-top-k).
// The Gumbel key log(pop_e) - log(-log U_e) is a decreasing function of x_e = -log(U_e) / pop_e, so the K
// largest keys are the K smallest x_e. With V_e = 1 - U_e = rng.uniform() in [0,1): x_e = -log(1 - V_e) *
// inv_pop_e >= V_e * inv_pop_e, so once K candidates are held most experts are rejected without a logarithm
// (about K*(1 + ln(E/K)) logarithms per token instead of E). One uniform per expert in id order; ties keep the
// lower id. O(E + K^2) per token. out[0..K) is written best key (most popular draw) first.
void draw_topk_gumbel(Rng& rng, const double* inv_pop, int E, int K, int32_t* out) {
    double best_x[detail::kMaxTopK];
    int32_t best_e[detail::kMaxTopK];
    int n = 0;
    for (int e = 0; e < E; ++e) {
        const double v = rng.uniform();
        if (n == K && v * inv_pop[e] >= best_x[K - 1]) continue;
        const double x = -std::log(1.0 - v) * inv_pop[e];  // 1 - v is exact: v = m * 2^-53
        if (n == K && !(x < best_x[K - 1])) continue;
        int i = n < K ? n++ : K - 1;
        while (i > 0 && best_x[i - 1] > x) {
            best_x[i] = best_x[i - 1];
            best_e[i] = best_e[i - 1];
            --i;
        }
        best_x[i] = x;
        best_e[i] = e;
    }
    for (int k = 0; k < K; ++k) out[k] = best_e[k];
}

// K distinct experts per token with probability proportional to 1/inv_pop (Gumbel-top-k), per-rank streams.
Routing weighted_with_s(const RoutingSpec& spec, const std::vector<double>& inv_pop, const std::vector<int32_t>& s) {
    Routing out = empty_routing(spec, s);
    // Each rank draws from its own stream, so ranks can be generated in any order or in parallel with the
    // same result. Threads only pay off for large groups (the K3 shapes: R up to 112, E = 896).
    auto generate_rank = [&](int r) {
        Rng rng(derive_seed(spec.seed, tagged_stream(kStreamRankRoute, r)));
        int32_t* ids = out.topk_idx[r].data();
        for (int t = 0; t < s[r]; ++t)
            draw_topk_gumbel(rng, inv_pop.data(), spec.E, spec.K, ids + static_cast<size_t>(t) * spec.K);
    };
    int64_t work = 0;
    for (int r = 0; r < spec.R; ++r) work += static_cast<int64_t>(s[r]) * spec.E;
    const int num_threads =
        work < kParallelWork ? 1
                             : std::min({spec.R, kMaxThreads, static_cast<int>(std::thread::hardware_concurrency())});
    if (num_threads <= 1) {
        for (int r = 0; r < spec.R; ++r) generate_rank(r);
        return out;
    }
    std::vector<std::thread> threads;
    threads.reserve(num_threads);
    for (int i = 0; i < num_threads; ++i)
        threads.emplace_back([&, i] {
            for (int r = i; r < spec.R; r += num_threads) generate_rank(r);
        });
    for (std::thread& t : threads) t.join();
    return out;
}

Routing lognormal_with_s(const RoutingSpec& spec, double sigma, const std::vector<int32_t>& s) {
    EVENEP_CHECK(std::isfinite(sigma) && sigma >= 0, "routing: lognormal sigma = ", sigma, " must be finite and >= 0");
    return weighted_with_s(spec, inverse_popularity(spec, sigma), s);
}

// Takes the first K experts of `order` (a list of distinct expert ids) into token t of rank r.
void take_first_k(Routing& routing, int r, int t, const std::vector<int32_t>& order) {
    int32_t* ids = routing.topk_idx[r].data() + static_cast<size_t>(t) * routing.K;
    for (int k = 0; k < routing.K; ++k) ids[k] = order[k];
}

// --- adversarial kinds ------------------------------------------------------------------------------------

// Every token's first choice is expert 0; the other K-1 choices round-robin over experts 1..E-1.
Routing single_hot_expert(const RoutingSpec& spec) {
    Routing out = empty_routing(spec);
    const int64_t K = spec.K, E = spec.E;
    for (int r = 0; r < spec.R; ++r)
        for (int64_t t = 0; t < spec.S; ++t) {
            int32_t* ids = out.topk_idx[r].data() + t * K;
            ids[0] = 0;
            const int64_t c = (static_cast<int64_t>(r) * spec.S + t) * (K - 1);
            for (int64_t k = 1; k < K; ++k) ids[k] = static_cast<int32_t>(1 + (c + k - 1) % (E - 1));
        }
    return out;
}

// Every entry goes to the experts of rank R-1, round-robin over them. With K > epn each token takes all epn
// of them plus K - epn others (round-robin over experts 0..E-epn-1): the most a token can put on one rank.
Routing one_hot_rank(const RoutingSpec& spec) {
    Routing out = empty_routing(spec);
    const int64_t K = spec.K, E = spec.E, epn = spec.E / spec.R, hot0 = E - epn;
    for (int r = 0; r < spec.R; ++r)
        for (int64_t t = 0; t < spec.S; ++t) {
            int32_t* ids = out.topk_idx[r].data() + t * K;
            const int64_t token = static_cast<int64_t>(r) * spec.S + t;
            if (K <= epn) {
                for (int64_t k = 0; k < K; ++k) ids[k] = static_cast<int32_t>(hot0 + (token * K + k) % epn);
            } else {
                for (int64_t k = 0; k < epn; ++k) ids[k] = static_cast<int32_t>(hot0 + k);
                const int64_t extra = K - epn;
                for (int64_t k = 0; k < extra; ++k) ids[epn + k] = static_cast<int32_t>((token * extra + k) % hot0);
            }
        }
    return out;
}

// No entry on an expert of its own rank: round-robin over the E - epn remote experts. With R = 1 there is no
// remote expert (the routing is round-robin over the rank's own experts); with K > E - epn each token takes
// every remote expert plus K - (E - epn) of its own (as few local entries as possible).
Routing all_remote(const RoutingSpec& spec) {
    Routing out = empty_routing(spec);
    const int64_t K = spec.K, E = spec.E, epn = spec.E / spec.R;
    const int64_t num_remote = E - epn;
    std::vector<int32_t> order(K);
    for (int r = 0; r < spec.R; ++r) {
        const int64_t own0 = static_cast<int64_t>(r) * epn;
        for (int64_t t = 0; t < spec.S; ++t) {
            const int64_t token = static_cast<int64_t>(r) * spec.S + t;
            const int64_t num_far = std::min(K, num_remote);
            for (int64_t k = 0; k < num_far; ++k)
                order[k] = static_cast<int32_t>((own0 + epn + (token * num_far + k) % num_remote) % E);
            for (int64_t k = num_far; k < K; ++k) order[k] = static_cast<int32_t>(own0 + (t + k - num_far) % epn);
            take_first_k(out, r, static_cast<int>(t), order);
        }
    }
    return out;
}

// All K entries of a token on one remote rank u = r + 1 + (t mod) (mod R), i.e. the tokens of a rank
// cycle through every other rank; inside u the entries start at a rotating offset. With K > epn the token
// continues on the next ranks (own rank last): as few destination ranks as possible. With R = 1 the only
// rank is the own one.
Routing same_remote_rank(const RoutingSpec& spec) {
    Routing out = empty_routing(spec);
    const int R = spec.R, K = spec.K, epn = spec.E / spec.R;
    std::vector<int32_t> order;
    order.reserve(spec.E);
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < spec.S; ++t) {
            const int u = R == 1 ? r : (r + 1 + t % (R - 1)) % R;
            const int offset = static_cast<int>((static_cast<int64_t>(t) * K) % epn);
            order.clear();
            for (int i = 0; i < R && static_cast<int>(order.size()) < K; ++i) {
                const int rank = (u + i) % R;
                if (R > 1 && rank == r) continue;  // own rank goes last
                for (int j = 0; j < epn; ++j) order.push_back(rank * epn + (offset + j) % epn);
            }
            if (static_cast<int>(order.size()) < K)
                for (int j = 0; j < epn; ++j) order.push_back(r * epn + (offset + j) % epn);
            take_first_k(out, r, t, order);
        }
    return out;
}

// Theorem 2 (appendix E): rank 0's experts receive nothing; every entry goes round-robin over experts
// epn..E-1 with the counter (r*S + t)*K + k, so each rank spreads its entries evenly (within 1) and the
// group totals are even (exactly when R*S*K is a multiple of E - epn). E=8, R=4, S=3, K=2: every rank
// routes one entry to each of experts 2..7. With R = 1 (no other experts) this is round-robin; with
// K > E - epn each token also takes K - (E - epn) of rank 0's experts.
Routing theorem2(const RoutingSpec& spec) {
    if (spec.R == 1) return make_round_robin(spec);
    Routing out = empty_routing(spec);
    const int64_t K = spec.K, E = spec.E, epn = spec.E / spec.R;
    const int64_t num_hot = E - epn;
    const int64_t num_far = std::min(K, num_hot);
    for (int r = 0; r < spec.R; ++r)
        for (int64_t t = 0; t < spec.S; ++t) {
            int32_t* ids = out.topk_idx[r].data() + t * K;
            const int64_t token = static_cast<int64_t>(r) * spec.S + t;
            for (int64_t k = 0; k < num_far; ++k) ids[k] = static_cast<int32_t>(epn + (token * num_far + k) % num_hot);
            for (int64_t k = num_far; k < K; ++k) ids[k] = static_cast<int32_t>((t + k - num_far) % epn);
        }
    return out;
}

// Lognormal routing (sigma = kAdversarialSigma) with ~25% masked entries: each token is fully masked with
// probability 1/8, otherwise each of its entries with probability 1/7 (independent stream per rank). The last
// token of every rank is always fully masked, except that entry (rank 0, token 0, k 0) always keeps its expert,
// so every rank with s_r >= 2 has a fully masked token and the group has at least one unmasked entry.
Routing masked(const RoutingSpec& spec) {
    const Routing base = lognormal_with_s(spec, kAdversarialSigma, std::vector<int32_t>(spec.R, spec.S));
    Routing out = base;
    const int K = spec.K;
    for (int r = 0; r < spec.R; ++r) {
        Rng rng(derive_seed(spec.seed, tagged_stream(kStreamMask, r)));
        const int s = out.s[r];
        int32_t* ids = out.topk_idx[r].data();
        for (int t = 0; t < s; ++t) {
            const bool full = rng.uniform() < kFullMaskProb;
            for (int k = 0; k < K; ++k) {
                const bool mask_entry = rng.uniform() < kEntryMaskProb;  // drawn for every entry: fixed stream
                if (full || mask_entry) ids[static_cast<size_t>(t) * K + k] = -1;
            }
        }
        for (int k = 0; k < K; ++k) ids[static_cast<size_t>(s - 1) * K + k] = -1;
    }
    out.topk_idx[0][0] = base.topk_idx[0][0];
    return out;
}

// Lognormal routing (sigma = kAdversarialSigma) with s_r uniform in [1, S]; rank 0 always passes S tokens
// and, when R >= 2, rank R-1 exactly one (the two edges).
Routing unequal_s(const RoutingSpec& spec) {
    std::vector<int32_t> s(spec.R);
    Rng rng(derive_seed(spec.seed, tagged_stream(kStreamUnequalS, 0)));
    for (int r = 0; r < spec.R; ++r)
        s[r] = 1 + static_cast<int32_t>(std::min<uint64_t>(spec.S - 1, static_cast<uint64_t>(rng.uniform() * spec.S)));
    s[0] = spec.S;
    if (spec.R >= 2) s[spec.R - 1] = 1;
    return lognormal_with_s(spec, kAdversarialSigma, s);
}

}  // namespace

// --- Rng ----------------------------------------------------------------------------------------------------

uint64_t derive_seed(uint64_t seed, uint64_t stream) {
    uint64_t x = seed;
    uint64_t h = detail::splitmix64_next(x);
    x = h ^ (stream * 0xD1B54A32D192ED03ull);
    h = detail::splitmix64_next(x);
    return h;
}

Rng::Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& v : s_) v = detail::splitmix64_next(x);  // SplitMix64 is a bijection: never an all-zero state
}

uint64_t Rng::next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// --- Routing -------------------------------------------------------------------------------------------------

std::vector<int32_t> Routing::tpe() const {
    EVENEP_CHECK(R >= 1 && E >= 1 && K >= 1, "routing: R = ", R, ", E = ", E, ", K = ", K, " must all be >= 1");
    EVENEP_CHECK(s.size() == static_cast<size_t>(R), "routing: s has ", s.size(), " entries, expected R = ", R);
    EVENEP_CHECK(topk_idx.size() == static_cast<size_t>(R), "routing: topk_idx has ", topk_idx.size(),
                 " ranks, expected R = ", R);
    std::vector<int32_t> out(static_cast<size_t>(R) * E, 0);
    for (int r = 0; r < R; ++r) {
        EVENEP_CHECK(s[r] >= 0 && s[r] <= S, "routing: rank ", r, ": s = ", s[r], " outside [0, S = ", S, "]");
        EVENEP_CHECK(topk_idx[r].size() == static_cast<size_t>(s[r]) * K, "routing: rank ", r, ": topk_idx has ",
                     topk_idx[r].size(), " ids, expected s*K = ", static_cast<int64_t>(s[r]) * K);
        int32_t* row = out.data() + static_cast<size_t>(r) * E;
        for (size_t i = 0; i < topk_idx[r].size(); ++i) {
            const int32_t e = topk_idx[r][i];
            if (e == -1) continue;
            EVENEP_CHECK(e >= 0 && e < E, "routing: rank ", r, ", token ", i / K, ", k ", i % K, ": expert id ", e,
                         " outside [0, E = ", E, ") (use -1 to mask)");
            ++row[e];
        }
    }
    return out;
}

double Routing::maxvio() const {
    const std::vector<int32_t> h = tpe();
    std::vector<int64_t> load(E, 0);
    for (int r = 0; r < R; ++r)
        for (int e = 0; e < E; ++e) load[e] += h[static_cast<size_t>(r) * E + e];
    return maxvio_of(load);
}

int64_t Routing::total_entries() const {
    int64_t n = 0;
    for (const auto& ids : topk_idx) n += std::count_if(ids.begin(), ids.end(), [](int32_t e) { return e != -1; });
    return n;
}

double maxvio_of(const std::vector<int64_t>& expert_load) {
    int64_t total = 0, max_load = 0;
    for (size_t e = 0; e < expert_load.size(); ++e) {
        EVENEP_CHECK(expert_load[e] >= 0, "maxvio: expert ", e, " has negative load ", expert_load[e]);
        total += expert_load[e];
        max_load = std::max(max_load, expert_load[e]);
    }
    if (total == 0) return 0.0;  // no entries: nothing is imbalanced
    const double mean = static_cast<double>(total) / static_cast<double>(expert_load.size());
    return static_cast<double>(max_load) / mean - 1.0;
}

std::string to_string(Adversarial a) {
    switch (a) {
        case Adversarial::kSingleHotExpert:
            return "single_hot_expert";
        case Adversarial::kOneHotRank:
            return "one_hot_rank";
        case Adversarial::kAllRemote:
            return "all_remote";
        case Adversarial::kSameRemoteRank:
            return "same_remote_rank";
        case Adversarial::kTheorem2:
            return "theorem2";
        case Adversarial::kMasked:
            return "masked";
        case Adversarial::kUnequalS:
            return "unequal_s";
    }
    return "unknown";
}

std::vector<Adversarial> all_adversarial() {
    return {Adversarial::kSingleHotExpert, Adversarial::kOneHotRank, Adversarial::kAllRemote,
            Adversarial::kSameRemoteRank,  Adversarial::kTheorem2,   Adversarial::kMasked,
            Adversarial::kUnequalS};
}

// --- generators ------------------------------------------------------------------------------------------------

Routing make_round_robin(const RoutingSpec& spec) {
    check_spec(spec);
    Routing out = empty_routing(spec);
    const int64_t K = spec.K;
    for (int r = 0; r < spec.R; ++r)
        for (int64_t t = 0; t < spec.S; ++t)
            for (int64_t k = 0; k < K; ++k)
                out.topk_idx[r][t * K + k] =
                    static_cast<int32_t>(((static_cast<int64_t>(r) * spec.S + t) * K + k) % spec.E);
    return out;
}

Routing make_lognormal(const RoutingSpec& spec, double sigma) {
    check_spec(spec);
    return lognormal_with_s(spec, sigma, std::vector<int32_t>(spec.R, spec.S));
}

std::vector<double> lognormal_scores(const RoutingSpec& spec) {
    Rng rng(derive_seed(spec.seed, tagged_stream(kStreamPopularity, 0)));
    std::vector<double> z(spec.E);
    for (double& v : z) v = rng.normal();
    return z;
}

Routing make_weighted(const RoutingSpec& spec, std::span<const double> log_popularity) {
    check_spec(spec);
    EVENEP_CHECK(log_popularity.size() == static_cast<size_t>(spec.E), "routing: log_popularity has ",
                 log_popularity.size(), " entries, expected E = ", spec.E);
    double l_max = -std::numeric_limits<double>::infinity();
    for (size_t e = 0; e < log_popularity.size(); ++e) {
        EVENEP_CHECK(std::isfinite(log_popularity[e]), "routing: log_popularity[", e, "] = ", log_popularity[e],
                     " is not finite");
        l_max = std::max(l_max, log_popularity[e]);
    }
    std::vector<double> inv_pop(spec.E);
    for (int e = 0; e < spec.E; ++e) {
        const double v = std::exp(l_max - log_popularity[e]);
        inv_pop[e] = std::isfinite(v) ? v : DBL_MAX;
    }
    return weighted_with_s(spec, inv_pop, std::vector<int32_t>(spec.R, spec.S));
}

Routing make_target_maxvio(const RoutingSpec& spec, double target_maxvio, double* sigma_out) {
    check_spec(spec);
    EVENEP_CHECK(std::isfinite(target_maxvio) && target_maxvio >= 0, "routing: target maxvio = ", target_maxvio,
                 " must be finite and >= 0");
    const double tol = std::max(0.02 * target_maxvio, 0.005);
    const std::vector<int32_t> s(spec.R, spec.S);

    Routing best;
    double best_err = std::numeric_limits<double>::infinity(), best_sigma = kMinSigma;
    int evals = 0;
    // Generates at `sigma`; returns maxvio - target and keeps the closest routing.
    auto eval = [&](double sigma) {
        Routing routing = lognormal_with_s(spec, sigma, s);
        const double diff = routing.maxvio() - target_maxvio;
        ++evals;
        if (std::abs(diff) < best_err) {
            best_err = std::abs(diff);
            best_sigma = sigma;
            best = std::move(routing);
        }
        return diff;
    };
    // maxvio grows with sigma (the per-rank streams are shared by every sigma). If the target lies outside
    // [maxvio(kMinSigma), maxvio(kMaxSigma)], the nearer end is the closest reachable routing.
    if (eval(kMinSigma) < -tol && eval(kMaxSigma) > tol) {
        double lo = std::log(kMinSigma), hi = std::log(kMaxSigma);  // bisect log(sigma)
        while (evals < kMaxBisectEvals && best_err > tol) {
            const double mid = 0.5 * (lo + hi);
            (eval(std::exp(mid)) < 0 ? lo : hi) = mid;
        }
    }
    if (sigma_out) *sigma_out = best_sigma;
    return best;
}

Routing make_adversarial(const RoutingSpec& spec, Adversarial kind) {
    check_spec(spec);
    switch (kind) {
        case Adversarial::kSingleHotExpert:
            return single_hot_expert(spec);
        case Adversarial::kOneHotRank:
            return one_hot_rank(spec);
        case Adversarial::kAllRemote:
            return all_remote(spec);
        case Adversarial::kSameRemoteRank:
            return same_remote_rank(spec);
        case Adversarial::kTheorem2:
            return theorem2(spec);
        case Adversarial::kMasked:
            return masked(spec);
        case Adversarial::kUnequalS:
            return unequal_s(spec);
    }
    EVENEP_CHECK(false, "routing: unknown adversarial kind ", static_cast<int>(kind));
    return {};
}

std::vector<std::vector<float>> make_route_weights(const Routing& routing, uint64_t seed) {
    EVENEP_CHECK(routing.K >= 1 && routing.K <= detail::kMaxTopK, "route weights: K = ", routing.K, " must be in [1, ",
                 detail::kMaxTopK, "]");
    EVENEP_CHECK(
        routing.s.size() == static_cast<size_t>(routing.R) && routing.topk_idx.size() == static_cast<size_t>(routing.R),
        "route weights: routing has ", routing.s.size(), " s and ", routing.topk_idx.size(),
        " topk rows, expected R = ", routing.R);
    const int K = routing.K;
    std::vector<std::vector<float>> out(routing.R);
    double logit[detail::kMaxTopK];
    for (int r = 0; r < routing.R; ++r) {
        const auto& ids = routing.topk_idx[r];
        EVENEP_CHECK(ids.size() == static_cast<size_t>(routing.s[r]) * K, "route weights: rank ", r, ": topk_idx has ",
                     ids.size(), " ids, expected s*K = ", static_cast<int64_t>(routing.s[r]) * K);
        out[r].assign(ids.size(), 0.0f);
        Rng rng(derive_seed(seed, tagged_stream(kStreamRouteWeights, r)));
        for (size_t t = 0; t < static_cast<size_t>(routing.s[r]); ++t) {
            // One logit per entry, masked or not, so the stream does not depend on the mask.
            double max_logit = -std::numeric_limits<double>::infinity();
            for (int k = 0; k < K; ++k) {
                logit[k] = rng.normal();
                if (ids[t * K + k] != -1) max_logit = std::max(max_logit, logit[k]);
            }
            double sum = 0;
            for (int k = 0; k < K; ++k)
                if (ids[t * K + k] != -1) sum += std::exp(logit[k] - max_logit);
            for (int k = 0; k < K; ++k)
                if (ids[t * K + k] != -1) out[r][t * K + k] = static_cast<float>(std::exp(logit[k] - max_logit) / sum);
        }
    }
    return out;
}

}  // namespace evenep
