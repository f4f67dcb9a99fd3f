// evenep/routing.hpp — deterministic routing generators for tests and benchmarks (SPEC §7).
//
// A Routing holds every rank's top-k expert ids. All generators are pure functions of their arguments
// and seeds (same numbers on every platform: they use their own PRNG, never std:: distributions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evenep/config.hpp"

namespace evenep {

struct Routing {
    int R = 0, E = 0, K = 0, S = 0;
    std::vector<int32_t> s;                      // [R] tokens of each rank (1..S)
    std::vector<std::vector<int32_t>> topk_idx;  // [R][s_r*K], -1 = masked

    // [R*E] histograms (masked entries not counted). Throws evenep::Error on ids out of range.
    std::vector<int32_t> tpe() const;
    // max_e T_e / mean_e T_e - 1 over the whole group (0 = perfectly balanced).
    double maxvio() const;
    int64_t total_entries() const;  // unmasked entries
};

// SPEC §1 maxvio of a global per-expert load vector T[E].
double maxvio_of(const std::vector<int64_t>& expert_load);

enum class Adversarial {
    kSingleHotExpert,  // every token's first choice is expert 0; the rest spread evenly
    kOneHotRank,       // all tokens go to experts of rank R-1 (when K <= epn) or as much as possible
    kAllRemote,        // no token picks an expert homed on its own rank
    kSameRemoteRank,   // all K entries of a token land on one remote rank (needs K <= epn)
    kTheorem2,         // rank 0's experts receive nothing; all others share all tokens evenly
    kMasked,           // lognormal routing with ~25% of entries masked (-1), some tokens fully masked
    kUnequalS,         // lognormal routing with s_r drawn in [1, S]
};
std::string to_string(Adversarial a);
std::vector<Adversarial> all_adversarial();

struct RoutingSpec {
    int R = 8, E = 64, K = 4, S = 512;
    uint64_t seed = 1;
};

// Balanced round-robin: token t of rank r picks experts (r*S + t)*K + k mod E (distinct when K <= E).
Routing make_round_robin(const RoutingSpec& spec);
// Lognormal popularity: popularity_e = exp(sigma * N(0,1)) from `seed`; each rank draws K distinct experts
// per token proportionally to popularity (Gumbel-top-k) from its own stream derived from (seed, rank).
Routing make_lognormal(const RoutingSpec& spec, double sigma);
// Lognormal with sigma bisected on a log scale in [1e-5, 10] until |maxvio - target| <= max(0.02*target, 0.005)
// (or the bracket is exhausted). `sigma_out`, if given, receives the sigma used.
Routing make_target_maxvio(const RoutingSpec& spec, double target_maxvio, double* sigma_out = nullptr);
Routing make_adversarial(const RoutingSpec& spec, Adversarial kind);

// Deterministic PRNG (SplitMix64 seeding a xoshiro256**), exposed so tests and the data path draw
// the same numbers everywhere.
class Rng {
public:
    explicit Rng(uint64_t seed);
    uint64_t next_u64();
    double uniform();  // [0, 1)
    double normal();   // N(0, 1), Box-Muller
private:
    uint64_t s_[4];
};

}  // namespace evenep
