// evenep/routing.hpp — deterministic routing generators for tests and benchmarks (SPEC §7).
//
// A Routing holds every rank's top-k expert ids. All generators are pure functions of their arguments
// and seeds (same numbers on every platform: they use their own PRNG, never std:: distributions).
#pragma once

#include <cstdint>
#include <span>
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
// Exact constructions (src/core/routing.cpp) and how each kind degrades where its premise cannot hold:
//   kSingleHotExpert  k = 0 is expert 0; k >= 1 round-robin over experts 1..E-1.
//   kOneHotRank       K <= epn: round-robin over rank R-1's experts. K > epn: every token takes all of rank
//                     R-1's experts plus K - epn others (round-robin over the remaining experts).
//   kAllRemote        round-robin over the E - epn experts not homed on the token's rank. K > E - epn (e.g.
//                     R = 1): all remote experts plus the fewest possible own experts.
//   kSameRemoteRank   token t of rank r goes to rank (r + 1 + t mod) mod R, at a rotating offset inside
//                     it. K > epn: continues on the next ranks (own rank last), i.e. the fewest ranks possible.
//   kTheorem2         entries round-robin over experts epn..E-1 with counter (r*S + t)*K + k, so every rank's
//                     row is even within 1 (exactly even when s*K is a multiple of E - epn). R = 1: round-robin.
//                     K > E - epn: each token also takes K - (E - epn) of rank 0's experts.
//   kMasked           lognormal (sigma = 1); a token is fully masked w.p. 1/8, otherwise each entry w.p. 1/7
//                     (~25% of entries); the last token of every rank is always fully masked, except that
//                     entry (rank 0, token 0, k 0) is never masked (the group keeps >= 1 unmasked entry).
//   kUnequalS         lognormal (sigma = 1) with s_r uniform in [1, S]; s_0 = S and, when R >= 2, s_{R-1} = 1.
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
// Groups with sum_r s_r * E >= 2^24 are generated on up to 16 threads, one rank at a time (same result).
Routing make_lognormal(const RoutingSpec& spec, double sigma);
// The standard normal scores z[E] of make_lognormal's popularity (popularity_e = exp(sigma * z_e)) for spec.seed.
std::vector<double> lognormal_scores(const RoutingSpec& spec);
// The sampler of make_lognormal with a given popularity: each rank draws K distinct experts per token with
// probability proportional to exp(log_popularity[e]) (Gumbel-top-k) from its own stream of (spec.seed, rank).
// log_popularity: [E], finite. Used for drifting routings (perf/drift.hpp). Not bit-identical to make_lognormal
// with log_popularity = sigma * z (the normalisation rounds differently), so use make_lognormal for that case.
Routing make_weighted(const RoutingSpec& spec, std::span<const double> log_popularity);
// Lognormal with sigma bisected on a log scale in [1e-5, 10] until |maxvio - target| <= max(0.02*target, 0.005)
// (or the bracket is exhausted). `sigma_out`, if given, receives the sigma used.
Routing make_target_maxvio(const RoutingSpec& spec, double target_maxvio, double* sigma_out = nullptr);
Routing make_adversarial(const RoutingSpec& spec, Adversarial kind);

// Route weights of every entry: [R][s_r*K] fp32, per token the softmax of N(0,1) logits (one logit drawn per
// entry from a per-rank stream of `seed`) over its unmasked entries, 0 for masked entries. The weights of a
// token with >= 1 unmasked entry are positive and sum to 1 (up to fp32 rounding).
std::vector<std::vector<float>> make_route_weights(const Routing& routing, uint64_t seed);

// Seed of an independent stream `stream` of `seed` (a SplitMix64 hash of both); the generators draw the
// popularity, each rank's routing, masks and weights from distinct streams of the spec's seed.
uint64_t derive_seed(uint64_t seed, uint64_t stream);

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
