// Step-sequence workloads (evenep/workloads.hpp).
#include "evenep/workloads.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

// Parameters of the workloads (documented in workload_list() and workloads.hpp).
inline constexpr double kHeat = 8.0;            // hot experts' popularity multiplier
inline constexpr double kBurstHeat = 32.0;      // a burst step's multiplier
inline constexpr double kBurstProb = 0.1;       // chance of a burst step
inline constexpr double kCalmSigma = 0.3;       // burst: the calm steps' lognormal sigma
inline constexpr double kRaggedSigma = 0.5;     // ragged sources and zero-load: lognormal sigma of the live experts
inline constexpr double kRaggedMinKeep = 0.25;  // the last token of the global order is present w.p. this
inline constexpr double kDriftSigma = 1.0;      // drift: step 0's lognormal sigma
inline constexpr double kDriftStep = 0.1;       // drift: std of each log-popularity increment per step
inline constexpr double kNoiseSigma = 1.0;      // micro-batch noise: lognormal sigma of each micro-batch's draw
inline constexpr int kZeroEvery = 7;            // zero-load: every 7th expert past the zero block is dead too
inline constexpr int kMaxDrawsPerK = 64;        // redraws per id before the deterministic fallback

// Streams of the workload key (distinct from routing.cpp's and drift.cpp's tags by construction: hashed again).
inline constexpr uint64_t kTagStatic = 1;  // popularity that does not change with the step
inline constexpr uint64_t kTagStep = 2;    // per-step popularity draws (hot sets, bursts, walk increments)
inline constexpr uint64_t kTagMicro = 3;   // per-micro-batch popularity draws
inline constexpr uint64_t kTagTokens = 4;  // the tokens of (step, micro-batch)

const WorkloadInfo kWorkloads[] = {
    {Workload::kBalanced, "balanced", "uniform popularity: every expert equally likely"},
    {Workload::kHotExperts, "hot_experts", "a scattered hot set of E/16 experts, each 8x as popular as the others"},
    {Workload::kHotRank, "hot_rank", "the same heat on E/16 contiguous experts (few home ranks carry it)"},
    {Workload::kSpreadHeat, "spread_heat", "the same heat on E/16 experts strided over the ids (spread over ranks)"},
    {Workload::kRagged, "ragged", "unequal tokens per rank: token i of N present w.p. 1 - 0.75 i/N; lognormal 0.5"},
    {Workload::kZeroLoad, "zero_load", "experts [0, E/8) and every 7th other expert never chosen (zero-load ranks)"},
    {Workload::kRotatingHotSpot, "rotating", "a hot block of E/16 contiguous experts (8x) moving by its width each step"},
    {Workload::kBurst, "burst", "calm lognormal 0.3; w.p. 1/10 a step puts 32x on a fresh hot set of E/16 experts"},
    {Workload::kDrift, "drift", "lognormal sigma 1 whose log-popularity walks 0.1 per step (today's drift model)"},
    {Workload::kMicroBatchNoise, "microbatch_noise",
     "balanced on average, each micro-batch a fresh lognormal draw (sigma 1)"},
};

uint64_t workload_key(const WorkloadSpec& spec, uint64_t tag, int64_t step, int micro_batch) {
    uint64_t k = derive_seed(spec.seed, (tag << 8) | static_cast<uint64_t>(spec.kind));
    k = derive_seed(k, static_cast<uint64_t>(step));
    return derive_seed(k, static_cast<uint64_t>(micro_batch));
}

std::vector<double> normals(uint64_t key, int E, double scale) {
    Rng rng(key);
    std::vector<double> z(E);
    for (double& v : z) v = scale * rng.normal();
    return z;
}

// A permutation of [0, E) (Fisher-Yates).
std::vector<int32_t> permutation(uint64_t key, int E) {
    std::vector<int32_t> p(E);
    std::iota(p.begin(), p.end(), 0);
    Rng rng(key);
    for (int i = E - 1; i > 0; --i) {
        const int j = static_cast<int>(rng.next_u64() % static_cast<uint64_t>(i + 1));
        std::swap(p[i], p[j]);
    }
    return p;
}

int hot_count(int E) { return std::max(1, E / 16); }

bool zero_load_dead(int E, int e) {
    const int block = E / 8;
    return e < block || (e - block) % kZeroEvery == kZeroEvery - 1;
}

// Alias table (Vose) over the live experts of a popularity.
struct AliasTable {
    std::vector<double> prob;
    std::vector<int32_t> alias;
    std::vector<int32_t> live;  // ascending
};

AliasTable build_alias(const std::vector<double>& log_pop) {
    AliasTable t;
    double mx = -std::numeric_limits<double>::infinity();
    for (double v : log_pop) mx = std::max(mx, v);
    std::vector<double> w;
    for (size_t e = 0; e < log_pop.size(); ++e)
        if (std::isfinite(log_pop[e])) {
            t.live.push_back(static_cast<int32_t>(e));
            w.push_back(std::exp(log_pop[e] - mx));
        }
    const int n = static_cast<int>(w.size());
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    t.prob.assign(n, 1.0);
    t.alias.resize(n);
    std::iota(t.alias.begin(), t.alias.end(), 0);
    std::vector<int32_t> small, large;
    std::vector<double> scaled(n);
    for (int i = 0; i < n; ++i) {
        scaled[i] = w[i] * n / total;
        (scaled[i] < 1.0 ? small : large).push_back(i);
    }
    while (!small.empty() && !large.empty()) {
        const int32_t s = small.back(), l = large.back();
        small.pop_back();
        t.prob[s] = scaled[s];
        t.alias[s] = l;
        scaled[l] -= 1.0 - scaled[s];
        if (scaled[l] < 1.0) {
            large.pop_back();
            small.push_back(l);
        }
    }
    return t;  // leftovers keep prob 1 (rounding)
}

int32_t draw(const AliasTable& t, Rng& rng) {
    const int n = static_cast<int>(t.live.size());
    const int i = std::min(n - 1, static_cast<int>(rng.uniform() * n));
    return t.live[rng.uniform() < t.prob[i] ? i : t.alias[i]];
}

// Draws one token into out[0..K): false when the token is absent (ragged sources).
bool draw_token(const WorkloadSpec& spec, const AliasTable& t, uint64_t key, int64_t token, int32_t* out) {
    Rng rng(derive_seed(key, static_cast<uint64_t>(token)));
    const double u = rng.uniform();  // drawn for every workload: one stream layout
    if (spec.kind == Workload::kRagged) {
        const double x = static_cast<double>(token) / static_cast<double>(spec.num_tokens);
        if (u >= 1.0 - (1.0 - kRaggedMinKeep) * x) return false;
    }
    int draws = 0;
    for (int k = 0; k < spec.K; ++k) {
        int32_t e = -1;
        while (e < 0 && draws < kMaxDrawsPerK * spec.K) {
            ++draws;
            e = draw(t, rng);
            if (std::find(out, out + k, e) != out + k) e = -1;
        }
        for (size_t i = 0; e < 0 && i < t.live.size(); ++i)  // fallback: the lowest unused live expert
            if (std::find(out, out + k, t.live[i]) == out + k) e = t.live[i];
        out[k] = e;
    }
    return true;
}

void check_split(const WorkloadSpec& spec, int R) {
    EVENEP_CHECK(R >= 1, "workload: R = ", R, " must be >= 1");
    EVENEP_CHECK(spec.num_tokens % R == 0, "workload: the global token count ", spec.num_tokens,
                 " is not a multiple of R = ", R);
    EVENEP_CHECK(spec.E % R == 0, "workload: E = ", spec.E, " is not a multiple of R = ", R);
    EVENEP_CHECK(spec.num_tokens / R <= INT32_MAX, "workload: tokens per rank ", spec.num_tokens / R,
                 " overflow int32");
}

}  // namespace

std::span<const WorkloadInfo> workload_list() { return kWorkloads; }

const char* to_string(Workload w) {
    for (const WorkloadInfo& i : kWorkloads)
        if (i.kind == w) return i.name;
    return "?";
}

Workload parse_workload(const std::string& name) {
    std::string names;
    for (const WorkloadInfo& i : kWorkloads) {
        if (name == i.name) return i.kind;
        names += (names.empty() ? "" : ", ") + std::string(i.name);
    }
    EVENEP_CHECK(false, "workload '", name, "' is not one of: ", names);
    return Workload::kBalanced;
}

void WorkloadSpec::validate() const {
    EVENEP_CHECK(E >= 1, "workload: E = ", E, " must be >= 1");
    EVENEP_CHECK(K >= 1 && K <= detail::kMaxTopK, "workload: K = ", K, " must be in [1, ", detail::kMaxTopK, "]");
    EVENEP_CHECK(K <= E, "workload: K = ", K, " exceeds E = ", E, " (ids of a token are distinct)");
    EVENEP_CHECK(num_tokens >= 1, "workload: the global token count ", num_tokens, " must be >= 1");
    EVENEP_CHECK(num_tokens * K <= INT32_MAX, "workload: tokens * K = ", num_tokens * K, " overflows int32");
    if (kind == Workload::kZeroLoad) {
        int live = 0;
        for (int e = 0; e < E; ++e) live += zero_load_dead(E, e) ? 0 : 1;
        EVENEP_CHECK(live >= K, "workload zero_load: ", live, " live experts of E = ", E, " cannot give K = ", K,
                     " distinct ids");
    }
}

std::vector<double> workload_log_popularity(const WorkloadSpec& spec, int64_t step, int micro_batch) {
    spec.validate();
    EVENEP_CHECK(step >= 0 && micro_batch >= 0, "workload: step ", step, " and micro-batch ", micro_batch,
                 " must be >= 0");
    const int E = spec.E, h = hot_count(E);
    const uint64_t key_static = workload_key(spec, kTagStatic, 0, 0);
    const uint64_t key_step = workload_key(spec, kTagStep, step, 0);
    std::vector<double> l(E, 0.0);
    switch (spec.kind) {
        case Workload::kBalanced: break;
        case Workload::kHotExperts: {
            const std::vector<int32_t> p = permutation(key_static, E);
            for (int j = 0; j < h; ++j) l[p[j]] = std::log(kHeat);
            break;
        }
        case Workload::kHotRank: {
            const int off = static_cast<int>(key_static % static_cast<uint64_t>(E));
            for (int j = 0; j < h; ++j) l[(off + j) % E] = std::log(kHeat);
            break;
        }
        case Workload::kSpreadHeat: {
            const int stride = E / h;
            const int off = static_cast<int>(key_static % static_cast<uint64_t>(stride));
            for (int j = 0; j < h; ++j) l[(off + j * stride) % E] = std::log(kHeat);
            break;
        }
        case Workload::kRagged: l = normals(key_static, E, kRaggedSigma); break;
        case Workload::kZeroLoad:
            l = normals(key_static, E, kRaggedSigma);
            for (int e = 0; e < E; ++e)
                if (zero_load_dead(E, e)) l[e] = -std::numeric_limits<double>::infinity();
            break;
        case Workload::kRotatingHotSpot: {
            const uint64_t off = key_static % static_cast<uint64_t>(E) + static_cast<uint64_t>(step) * h;
            for (int j = 0; j < h; ++j) l[(off + j) % static_cast<uint64_t>(E)] = std::log(kHeat);
            break;
        }
        case Workload::kBurst: {
            l = normals(key_static, E, kCalmSigma);
            if (Rng(key_step).uniform() < kBurstProb) {
                const std::vector<int32_t> p = permutation(derive_seed(key_step, 1), E);
                for (int j = 0; j < h; ++j) l[p[j]] += std::log(kBurstHeat);
            }
            break;
        }
        case Workload::kDrift:
            l = normals(key_static, E, kDriftSigma);
            for (int64_t t = 1; t <= step; ++t) {
                const std::vector<double> n = normals(workload_key(spec, kTagStep, t, 0), E, kDriftStep);
                for (int e = 0; e < E; ++e) l[e] += n[e];
            }
            break;
        case Workload::kMicroBatchNoise:
            l = normals(workload_key(spec, kTagMicro, step, micro_batch), E, kNoiseSigma);
            break;
    }
    return l;
}

std::vector<int32_t> workload_global_routing(const WorkloadSpec& spec, int64_t step, int micro_batch) {
    const AliasTable t = build_alias(workload_log_popularity(spec, step, micro_batch));
    const uint64_t key = workload_key(spec, kTagTokens, step, micro_batch);
    std::vector<int32_t> ids(static_cast<size_t>(spec.num_tokens) * spec.K, -1);
    for (int64_t i = 0; i < spec.num_tokens; ++i) draw_token(spec, t, key, i, ids.data() + i * spec.K);
    return ids;
}

Routing workload_routing(const WorkloadSpec& spec, int R, int64_t step, int micro_batch) {
    spec.validate();
    check_split(spec, R);
    const std::vector<int32_t> ids = workload_global_routing(spec, step, micro_batch);
    const int64_t S = spec.num_tokens / R;
    Routing out;
    out.R = R;
    out.E = spec.E;
    out.K = spec.K;
    out.S = static_cast<int>(S);
    out.s.assign(R, 0);
    out.topk_idx.resize(R);
    for (int r = 0; r < R; ++r) {
        std::vector<int32_t>& row = out.topk_idx[r];
        for (int64_t i = r * S; i < (r + 1) * S; ++i) {
            const int32_t* tok = ids.data() + i * spec.K;
            if (tok[0] < 0) continue;  // absent
            row.insert(row.end(), tok, tok + spec.K);
        }
        out.s[r] = static_cast<int32_t>(row.size() / spec.K);
        if (out.s[r] == 0) {
            out.s[r] = 1;
            row.assign(spec.K, -1);
        }
    }
    return out;
}

WorkloadHistogram workload_histogram(const WorkloadSpec& spec, int R, int64_t step, int micro_batch) {
    spec.validate();
    check_split(spec, R);
    const AliasTable t = build_alias(workload_log_popularity(spec, step, micro_batch));
    const uint64_t key = workload_key(spec, kTagTokens, step, micro_batch);
    const int64_t S = spec.num_tokens / R;
    WorkloadHistogram h{std::vector<int32_t>(static_cast<size_t>(R) * spec.E, 0), std::vector<int32_t>(R, 0)};
    std::vector<int32_t> tok(spec.K);
    for (int64_t i = 0; i < spec.num_tokens; ++i) {
        const int r = static_cast<int>(i / S);
        if (!draw_token(spec, t, key, i, tok.data())) continue;
        ++h.s[r];
        for (int32_t e : tok) ++h.tpe[static_cast<size_t>(r) * spec.E + e];
    }
    for (int32_t& s : h.s) s = std::max(s, 1);
    return h;
}

}  // namespace evenep
