// Routing generators (SPEC §7). Cases:
//   Rng.SeedingIsSplitMix64          first SplitMix64 outputs of seed 0 seed the state (golden values)
//   Rng.GoldenStream                 xoshiro256** outputs pinned (platform independence)
//   Rng.DeterministicAndSeedSensitive
//   Rng.UniformAndNormalMoments      uniform in [0,1) with mean 1/2; normal mean 0, variance 1
//   Rng.DeriveSeedSeparatesStreams
//   MaxvioOf.KnownValues / NegativeLoadThrows
//   RoutingChecks.TpeCountsAndSkipsMasked / TpeRejectsBadIds / TpeRejectsBadSizes
//   RoutingChecks.SpecValidation     E % R, K > E, K > 32, S = 0 name the value
//   AdversarialNames.DistinctAndComplete
//   Generators/GeneratorTest.*       for every generator x shape (incl. K > epn, R = 1, K = E):
//       ValidShape (sizes, ids in range, distinct per token), Deterministic
//   Generators/SeededGeneratorTest.SeedSensitive/*   lognormal, target, masked, unequal_s: seed changes the routing
//   RoundRobin.ExactlyBalanced       maxvio 0 and even rows when R*S*K % E == 0
//   Lognormal.MaxvioGrowsWithSigma / SharedPopularityAcrossRanks / SigmaZeroIsNearUniform / RejectsBadSigma
//   Lognormal.KEqualsEIsPermutation
//   TargetMaxvio.HitsTarget/*        0.2, 1, 5 within max(2% target, 0.005); sigma_out reproduces the routing
//   TargetMaxvioLimits.UnreachableReturnsClosest   above E/K-1 -> sigma 10; below the noise floor -> sigma 1e-5
//   TargetMaxvioLimits.BenchmarkPoint              R=8 E=384 K=8 S=8192, target 1
//   Adversarial/AdversarialTest.DefiningProperty/*   each kind x shape has its defining property
//   AdversarialFixed.Theorem2SeedExample  E=8 R=4 S=3 K=2: every rank routes one entry to each of experts
//                                         2..7; the planner needs >= ceil(E(R-1)/R^2) = 2 remote experts on rank 0
//   AdversarialFixed.MaskedFractionNearQuarter
//   RouteWeights.SoftmaxPerToken / Deterministic / MaskedAreZero
#include "evenep/routing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/plan.hpp"

namespace evenep {
namespace {

constexpr uint64_t kSeed = 20240917;

// Runs `f` and returns the evenep::Error message ("" if nothing was thrown).
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::vector<int64_t> expert_loads(const Routing& r) {
    const std::vector<int32_t> tpe = r.tpe();
    std::vector<int64_t> load(r.E, 0);
    for (int rank = 0; rank < r.R; ++rank)
        for (int e = 0; e < r.E; ++e) load[e] += tpe[static_cast<size_t>(rank) * r.E + e];
    return load;
}

// Sizes consistent, ids in [-1, E), unmasked ids of a token distinct.
void expect_valid(const Routing& r, const RoutingSpec& spec) {
    ASSERT_EQ(r.R, spec.R);
    ASSERT_EQ(r.E, spec.E);
    ASSERT_EQ(r.K, spec.K);
    ASSERT_EQ(r.S, spec.S);
    ASSERT_EQ(r.s.size(), static_cast<size_t>(spec.R));
    ASSERT_EQ(r.topk_idx.size(), static_cast<size_t>(spec.R));
    for (int rank = 0; rank < r.R; ++rank) {
        ASSERT_GE(r.s[rank], 1) << "rank " << rank;
        ASSERT_LE(r.s[rank], r.S) << "rank " << rank;
        ASSERT_EQ(r.topk_idx[rank].size(), static_cast<size_t>(r.s[rank]) * r.K) << "rank " << rank;
        for (int t = 0; t < r.s[rank]; ++t) {
            std::set<int32_t> seen;
            for (int k = 0; k < r.K; ++k) {
                const int32_t e = r.topk_idx[rank][static_cast<size_t>(t) * r.K + k];
                ASSERT_TRUE(e == -1 || (e >= 0 && e < r.E))
                    << "rank " << rank << " token " << t << " k " << k << ": " << e;
                if (e != -1) {
                    ASSERT_TRUE(seen.insert(e).second) << "rank " << rank << " token " << t << ": duplicate " << e;
                }
            }
        }
    }
}

// --- Rng ----------------------------------------------------------------------------------------------------------

TEST(Rng, SeedingIsSplitMix64) {
    // SplitMix64(0)'s first output is 0xE220A8397B1DCDAF (reference value of the published generator). xoshiro256**
    // returns rotl(s1 * 5, 7) * 9 first, so the first output is a function of the second SplitMix64 output
    // 0x6E789E6AA1B965F4.
    constexpr uint64_t s1 = 0x6E789E6AA1B965F4ull;
    const uint64_t expected = ((s1 * 5) << 7 | (s1 * 5) >> 57) * 9;
    Rng rng(0);
    EXPECT_EQ(rng.next_u64(), expected);
}

TEST(Rng, GoldenStream) {
    // Pinned so a change of the generator (or of its seeding) is noticed: every platform must produce these.
    // Values from an independent Python implementation of SplitMix64 seeding + xoshiro256**.
    Rng rng(12345);
    for (uint64_t expected :
         {0xbe6a36374160d49bull, 0x214aaa0637a688c6ull, 0xf69d16de9954d388ull, 0x0c60048c4e96e033ull})
        EXPECT_EQ(rng.next_u64(), expected);
    Rng zero(0);
    EXPECT_EQ(zero.next_u64(), 0x99ec5f36cb75f2b4ull);
    EXPECT_EQ(zero.next_u64(), 0xbf6e1f784956452aull);
    // uniform() is the top 53 bits scaled by 2^-53.
    Rng a(99), b(99);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(a.uniform(), static_cast<double>(b.next_u64() >> 11) * 0x1.0p-53);
}

TEST(Rng, DeterministicAndSeedSensitive) {
    Rng a(kSeed), b(kSeed), c(kSeed + 1);
    int differ = 0;
    for (int i = 0; i < 64; ++i) {
        const uint64_t x = a.next_u64();
        EXPECT_EQ(x, b.next_u64());
        differ += x != c.next_u64();
    }
    EXPECT_EQ(differ, 64);
}

TEST(Rng, UniformAndNormalMoments) {
    Rng rng(kSeed);
    constexpr int n = 200000;
    double sum = 0, nsum = 0, nsq = 0;
    for (int i = 0; i < n; ++i) {
        const double u = rng.uniform();
        ASSERT_GE(u, 0.0);
        ASSERT_LT(u, 1.0);
        sum += u;
        const double z = rng.normal();
        ASSERT_TRUE(std::isfinite(z));
        nsum += z;
        nsq += z * z;
    }
    EXPECT_NEAR(sum / n, 0.5, 0.005);
    EXPECT_NEAR(nsum / n, 0.0, 0.01);
    EXPECT_NEAR(nsq / n, 1.0, 0.02);
}

TEST(Rng, DeriveSeedSeparatesStreams) {
    std::set<uint64_t> seeds;
    for (uint64_t seed : {0ull, 1ull, 2ull})
        for (uint64_t stream = 0; stream < 16; ++stream) seeds.insert(derive_seed(seed, stream));
    EXPECT_EQ(seeds.size(), 48u);
    EXPECT_EQ(derive_seed(7, 3), derive_seed(7, 3));
}

// --- maxvio and Routing checks ------------------------------------------------------------------------------------

TEST(MaxvioOf, KnownValues) {
    EXPECT_DOUBLE_EQ(maxvio_of({5, 5, 5, 5}), 0.0);
    EXPECT_DOUBLE_EQ(maxvio_of({4, 0, 0, 0}), 3.0);
    EXPECT_DOUBLE_EQ(maxvio_of({3, 1}), 0.5);
    EXPECT_DOUBLE_EQ(maxvio_of({0, 0, 0}), 0.0);
    EXPECT_DOUBLE_EQ(maxvio_of({}), 0.0);
}

TEST(MaxvioOf, NegativeLoadThrows) {
    const std::string msg = error_of([] { maxvio_of({1, -2, 3}); });
    EXPECT_NE(msg.find("expert 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-2"), std::string::npos) << msg;
}

TEST(RoutingChecks, TpeCountsAndSkipsMasked) {
    Routing r;
    r.R = 2;
    r.E = 4;
    r.K = 2;
    r.S = 2;
    r.s = {2, 1};
    r.topk_idx = {{0, 3, -1, 3}, {-1, -1}};
    EXPECT_EQ(r.tpe(), (std::vector<int32_t>{1, 0, 0, 2, 0, 0, 0, 0}));
    EXPECT_EQ(r.total_entries(), 3);
    EXPECT_DOUBLE_EQ(r.maxvio(), 2.0 / 0.75 - 1.0);
}

TEST(RoutingChecks, TpeRejectsBadIds) {
    Routing r;
    r.R = 2;
    r.E = 4;
    r.K = 2;
    r.S = 2;
    r.s = {2, 2};
    r.topk_idx = {{0, 1, 2, 3}, {0, 1, 4, 1}};
    const std::string msg = error_of([&] { r.tpe(); });
    EXPECT_NE(msg.find("rank 1, token 1, k 0: expert id 4 outside [0, E = 4)"), std::string::npos) << msg;
    r.topk_idx[1][2] = -7;
    EXPECT_NE(error_of([&] { r.tpe(); }).find("expert id -7"), std::string::npos);
}

TEST(RoutingChecks, TpeRejectsBadSizes) {
    Routing r;
    r.R = 2;
    r.E = 4;
    r.K = 2;
    r.S = 2;
    r.s = {2, 2};
    r.topk_idx = {{0, 1, 2, 3}, {0, 1, 2}};
    std::string msg = error_of([&] { r.tpe(); });
    EXPECT_NE(msg.find("rank 1: topk_idx has 3 ids, expected s*K = 4"), std::string::npos) << msg;
    r.s = {2, 3};
    msg = error_of([&] { r.tpe(); });
    EXPECT_NE(msg.find("rank 1: s = 3 outside [0, S = 2]"), std::string::npos) << msg;
}

TEST(RoutingChecks, SpecValidation) {
    EXPECT_NE(
        error_of([] { make_round_robin({.R = 4, .E = 10, .K = 2, .S = 4}); }).find("E = 10 is not a multiple of R = 4"),
        std::string::npos);
    EXPECT_NE(error_of([] { make_lognormal({.R = 2, .E = 4, .K = 5, .S = 4}, 1.0); }).find("K = 5 exceeds E = 4"),
              std::string::npos);
    EXPECT_NE(error_of([] { make_round_robin({.R = 1, .E = 64, .K = 33, .S = 4}); }).find("K = 33"), std::string::npos);
    EXPECT_NE(error_of([] { make_adversarial({.R = 2, .E = 4, .K = 2, .S = 0}, Adversarial::kMasked); }).find("S = 0"),
              std::string::npos);
    EXPECT_NE(error_of([] { make_target_maxvio({.R = 2, .E = 4, .K = 2, .S = 4}, -1.0); }).find("target maxvio = -1"),
              std::string::npos);
}

TEST(AdversarialNames, DistinctAndComplete) {
    std::set<std::string> names;
    for (Adversarial a : all_adversarial()) names.insert(to_string(a));
    EXPECT_EQ(names.size(), 7u);
    EXPECT_TRUE(names.count("theorem2"));
    EXPECT_TRUE(names.count("same_remote_rank"));
}

// --- every generator x shape ------------------------------------------------------------------------------------

struct Shape {
    const char* name;
    int R, E, K, S;
};
const Shape kShapes[] = {
    {"R4_E16_K4_S64", 4, 16, 4, 64},  // K == epn
    {"R8_E64_K6_S33", 8, 64, 6, 33},  // K <= epn, odd S
    {"R4_E8_K5_S17", 4, 8, 5, 17},    // K > epn
    {"R1_E8_K3_S20", 1, 8, 3, 20},    // a single rank
    {"R2_E4_K4_S9", 2, 4, 4, 9},      // K == E
    {"R8_E8_K1_S1", 8, 8, 1, 1},      // one token, one expert per rank
};

using Generator = std::pair<std::string, Routing (*)(const RoutingSpec&)>;
Routing gen_round_robin(const RoutingSpec& s) { return make_round_robin(s); }
Routing gen_lognormal(const RoutingSpec& s) { return make_lognormal(s, 0.8); }
Routing gen_target(const RoutingSpec& s) { return make_target_maxvio(s, 0.5); }
template <Adversarial A>
Routing gen_adv(const RoutingSpec& s) {
    return make_adversarial(s, A);
}
const Generator kGenerators[] = {
    {"round_robin", gen_round_robin},
    {"lognormal", gen_lognormal},
    {"target_maxvio", gen_target},
    {"single_hot_expert", gen_adv<Adversarial::kSingleHotExpert>},
    {"one_hot_rank", gen_adv<Adversarial::kOneHotRank>},
    {"all_remote", gen_adv<Adversarial::kAllRemote>},
    {"same_remote_rank", gen_adv<Adversarial::kSameRemoteRank>},
    {"theorem2", gen_adv<Adversarial::kTheorem2>},
    {"masked", gen_adv<Adversarial::kMasked>},
    {"unequal_s", gen_adv<Adversarial::kUnequalS>},
};

class GeneratorTest : public ::testing::TestWithParam<std::tuple<int, int>> {
  protected:
    const Generator& gen() const { return kGenerators[std::get<0>(GetParam())]; }
    RoutingSpec spec(uint64_t seed = kSeed) const {
        const Shape& sh = kShapes[std::get<1>(GetParam())];
        return RoutingSpec{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .seed = seed};
    }
};

TEST_P(GeneratorTest, ValidShape) {
    SCOPED_TRACE("seed " + std::to_string(kSeed));
    expect_valid(gen().second(spec()), spec());
}

TEST_P(GeneratorTest, Deterministic) {
    const Routing a = gen().second(spec()), b = gen().second(spec());
    EXPECT_EQ(a.s, b.s);
    EXPECT_EQ(a.topk_idx, b.topk_idx);
}

INSTANTIATE_TEST_SUITE_P(Generators,
                         GeneratorTest,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kGenerators))),
                                            ::testing::Range(0, static_cast<int>(std::size(kShapes)))),
                         [](const auto& info) {
                             return kGenerators[std::get<0>(info.param)].first + "_" +
                                    kShapes[std::get<1>(info.param)].name;
                         });

// The generators that draw random numbers give a different routing for a different seed.
class SeededGeneratorTest : public GeneratorTest {};

TEST_P(SeededGeneratorTest, SeedSensitive) {
    const Routing a = gen().second(spec(kSeed)), b = gen().second(spec(kSeed + 1));
    EXPECT_TRUE(a.topk_idx != b.topk_idx || a.s != b.s) << "seeds " << kSeed << " and " << kSeed + 1;
}

INSTANTIATE_TEST_SUITE_P(Generators,
                         SeededGeneratorTest,
                         ::testing::Combine(::testing::Values(1, 2, 8, 9),
                                            ::testing::Range(0, static_cast<int>(std::size(kShapes)))),
                         [](const auto& info) {
                             return kGenerators[std::get<0>(info.param)].first + "_" +
                                    kShapes[std::get<1>(info.param)].name;
                         });

// --- round-robin and lognormal --------------------------------------------------------------------------------------

TEST(RoundRobin, ExactlyBalanced) {
    for (const RoutingSpec& sp :
         {RoutingSpec{.R = 4, .E = 16, .K = 4, .S = 64}, RoutingSpec{.R = 8, .E = 24, .K = 3, .S = 8},
          RoutingSpec{.R = 2, .E = 6, .K = 5, .S = 3}}) {
        ASSERT_EQ(static_cast<int64_t>(sp.R) * sp.S * sp.K % sp.E, 0);
        const Routing r = make_round_robin(sp);
        EXPECT_DOUBLE_EQ(r.maxvio(), 0.0);
        for (int64_t load : expert_loads(r)) EXPECT_EQ(load, static_cast<int64_t>(sp.R) * sp.S * sp.K / sp.E);
    }
    // Not divisible: loads differ by at most one.
    const std::vector<int64_t> load = expert_loads(make_round_robin({.R = 3, .E = 9, .K = 2, .S = 5}));
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), 1);
}

TEST(Lognormal, MaxvioGrowsWithSigma) {
    SCOPED_TRACE("seed " + std::to_string(kSeed));
    const RoutingSpec sp{.R = 8, .E = 64, .K = 4, .S = 1024, .seed = kSeed};
    double prev = -1;
    for (double sigma : {0.0, 0.25, 0.5, 1.0, 2.0}) {
        const double v = make_lognormal(sp, sigma).maxvio();
        EXPECT_GT(v, prev) << "sigma " << sigma;
        prev = v;
    }
    EXPECT_GT(prev, 3.0);  // sigma = 2 concentrates the load
}

TEST(Lognormal, SigmaZeroIsNearUniform) {
    // E = 32, 32768 entries: mean load 1024, binomial std ~32, so maxvio ~ 0.1 and surely < 0.25.
    const Routing r = make_lognormal({.R = 4, .E = 32, .K = 4, .S = 2048, .seed = kSeed}, 0.0);
    EXPECT_LT(r.maxvio(), 0.25);
    EXPECT_EQ(r.total_entries(), 4 * 2048 * 4);
}

TEST(Lognormal, SharedPopularityAcrossRanks) {
    // Every rank draws from the same popularity: the most loaded experts of rank 0 are loaded on every rank.
    const Routing r = make_lognormal({.R = 4, .E = 32, .K = 2, .S = 4096, .seed = kSeed}, 1.0);
    const std::vector<int32_t> tpe = r.tpe();
    const int top = static_cast<int>(std::max_element(tpe.begin(), tpe.begin() + 32) - tpe.begin());
    for (int rank = 1; rank < 4; ++rank) {
        const auto row = tpe.begin() + rank * 32;
        const int32_t mx = *std::max_element(row, row + 32);
        EXPECT_GT(row[top], mx / 2) << "rank " << rank;
    }
    // ... but the per-rank streams differ.
    EXPECT_NE(r.topk_idx[0], r.topk_idx[1]);
}

TEST(Lognormal, KEqualsEIsPermutation) {
    const Routing r = make_lognormal({.R = 2, .E = 6, .K = 6, .S = 50, .seed = kSeed}, 3.0);
    for (const auto& ids : r.topk_idx)
        for (size_t t = 0; t < ids.size() / 6; ++t) {
            std::vector<int32_t> tok(ids.begin() + t * 6, ids.begin() + (t + 1) * 6);
            std::sort(tok.begin(), tok.end());
            EXPECT_EQ(tok, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
        }
}

TEST(Lognormal, RejectsBadSigma) {
    EXPECT_NE(error_of([] { make_lognormal({.R = 2, .E = 4, .K = 2, .S = 4}, -0.5); }).find("sigma = -0.5"),
              std::string::npos);
    EXPECT_NE(error_of([] { make_lognormal({.R = 2, .E = 4, .K = 2, .S = 4}, NAN); }).find("sigma"), std::string::npos);
}

// --- target maxvio
// ----------------------------------------------------------------------------------------------------

class TargetMaxvio : public ::testing::TestWithParam<double> {};

TEST_P(TargetMaxvio, HitsTarget) {
    const double target = GetParam();
    const RoutingSpec sp{.R = 8, .E = 64, .K = 4, .S = 2048, .seed = kSeed};
    SCOPED_TRACE("seed " + std::to_string(kSeed));
    double sigma = -1;
    const Routing r = make_target_maxvio(sp, target, &sigma);
    EXPECT_LE(std::abs(r.maxvio() - target), std::max(0.02 * target, 0.005)) << "maxvio " << r.maxvio();
    EXPECT_GE(sigma, 1e-5);
    EXPECT_LE(sigma, 10.0);
    EXPECT_EQ(make_lognormal(sp, sigma).topk_idx, r.topk_idx);  // sigma_out reproduces the routing
}

INSTANTIATE_TEST_SUITE_P(Targets, TargetMaxvio, ::testing::Values(0.2, 1.0, 5.0), [](const auto& info) {
    std::string n = "maxvio_" + std::to_string(info.param);
    std::replace(n.begin(), n.end(), '.', '_');
    return n;
});

TEST(TargetMaxvioLimits, UnreachableReturnsClosest) {
    const RoutingSpec sp{.R = 4, .E = 16, .K = 4, .S = 256, .seed = kSeed};
    // K distinct experts per token: one expert holds at most 1/K of the entries, maxvio <= E/K - 1 = 3.
    double sigma = 0;
    const Routing hi = make_target_maxvio(sp, 100.0, &sigma);
    EXPECT_DOUBLE_EQ(sigma, 10.0);
    EXPECT_LE(hi.maxvio(), 3.0);
    EXPECT_GT(hi.maxvio(), 2.5);
    // Below the sampling noise floor: the smallest sigma is the closest.
    const Routing lo = make_target_maxvio(sp, 0.0, &sigma);
    EXPECT_DOUBLE_EQ(sigma, 1e-5);
    EXPECT_LT(lo.maxvio(), 0.5);
}

TEST(TargetMaxvioLimits, BenchmarkPoint) {
    // The MoonEP benchmark shape (SPEC §7); a few seconds at most in a Release build.
    const RoutingSpec sp{.R = 8, .E = 384, .K = 8, .S = 8192, .seed = kSeed};
    const Routing r = make_target_maxvio(sp, 1.0);
    EXPECT_LE(std::abs(r.maxvio() - 1.0), 0.02);
}

// --- adversarial ----------------------------------------------------------------------------------------------------

class AdversarialTest : public ::testing::TestWithParam<std::tuple<Adversarial, int>> {};

TEST_P(AdversarialTest, DefiningProperty) {
    const Adversarial kind = std::get<0>(GetParam());
    const Shape& sh = kShapes[std::get<1>(GetParam())];
    const RoutingSpec sp{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .seed = kSeed};
    SCOPED_TRACE(to_string(kind) + " " + sh.name + " seed " + std::to_string(kSeed));
    const Routing r = make_adversarial(sp, kind);
    expect_valid(r, sp);
    const int R = sp.R, E = sp.E, K = sp.K, S = sp.S, epn = E / R;
    const std::vector<int32_t> tpe = r.tpe();
    const std::vector<int64_t> load = expert_loads(r);
    auto home = [&](int32_t e) { return e / epn; };
    switch (kind) {
        case Adversarial::kSingleHotExpert:
            for (int rank = 0; rank < R; ++rank)
                for (int t = 0; t < S; ++t) EXPECT_EQ(r.topk_idx[rank][static_cast<size_t>(t) * K], 0);
            EXPECT_EQ(load[0], static_cast<int64_t>(R) * S);
            break;
        case Adversarial::kOneHotRank:
            for (int rank = 0; rank < R; ++rank)
                for (int t = 0; t < S; ++t) {
                    int hot = 0;
                    for (int k = 0; k < K; ++k) hot += home(r.topk_idx[rank][static_cast<size_t>(t) * K + k]) == R - 1;
                    EXPECT_EQ(hot, std::min(K, epn)) << "rank " << rank << " token " << t;
                }
            break;
        case Adversarial::kAllRemote:
            for (int rank = 0; rank < R; ++rank)
                for (int t = 0; t < S; ++t) {
                    int local = 0;
                    for (int k = 0; k < K; ++k) local += home(r.topk_idx[rank][static_cast<size_t>(t) * K + k]) == rank;
                    EXPECT_EQ(local, std::max(0, K - (E - epn))) << "rank " << rank << " token " << t;
                }
            break;
        case Adversarial::kSameRemoteRank:
            for (int rank = 0; rank < R; ++rank)
                for (int t = 0; t < S; ++t) {
                    std::set<int> ranks;
                    bool own = false;
                    for (int k = 0; k < K; ++k) {
                        const int h = home(r.topk_idx[rank][static_cast<size_t>(t) * K + k]);
                        ranks.insert(h);
                        own = own || h == rank;
                    }
                    EXPECT_EQ(static_cast<int>(ranks.size()), (K + epn - 1) / epn) << "rank " << rank << " token " << t;
                    if (R > 1 && K <= E - epn) {
                        EXPECT_FALSE(own) << "rank " << rank << " token " << t;
                    }
                }
            break;
        case Adversarial::kTheorem2:
            if (R == 1 || K > E - epn) {
                EXPECT_EQ(r.total_entries(), static_cast<int64_t>(R) * S * K);
                break;
            }
            for (int rank = 0; rank < R; ++rank) {
                for (int e = 0; e < epn; ++e) EXPECT_EQ(tpe[static_cast<size_t>(rank) * E + e], 0) << "rank " << rank;
                const auto row = tpe.begin() + static_cast<ptrdiff_t>(rank) * E + epn;
                EXPECT_LE(*std::max_element(row, row + (E - epn)) - *std::min_element(row, row + (E - epn)), 1)
                    << "rank " << rank;
            }
            EXPECT_LE(
                *std::max_element(load.begin() + epn, load.end()) - *std::min_element(load.begin() + epn, load.end()),
                1);
            break;
        case Adversarial::kMasked: {
            int64_t masked = 0, full = 0;
            for (int rank = 0; rank < R; ++rank) {
                bool rank_full = false;
                for (int t = 0; t < S; ++t) {
                    int m = 0;
                    for (int k = 0; k < K; ++k) m += r.topk_idx[rank][static_cast<size_t>(t) * K + k] == -1;
                    masked += m;
                    full += m == K;
                    rank_full = rank_full || m == K;
                }
                if (rank > 0 || S >= 2) {
                    EXPECT_TRUE(rank_full) << "rank " << rank;
                }
            }
            EXPECT_NE(r.topk_idx[0][0], -1);
            if (R > 1 || S > 1) {
                EXPECT_GT(masked, 0);
                EXPECT_GT(full, 0);
            }
            break;
        }
        case Adversarial::kUnequalS:
            EXPECT_EQ(r.s[0], S);
            if (R >= 2) {
                EXPECT_EQ(r.s[R - 1], 1);
                if (S >= 2) {
                    EXPECT_NE(*std::max_element(r.s.begin(), r.s.end()), *std::min_element(r.s.begin(), r.s.end()));
                }
            }
            break;
    }
}

INSTANTIATE_TEST_SUITE_P(Adversarial,
                         AdversarialTest,
                         ::testing::Combine(::testing::ValuesIn(all_adversarial()),
                                            ::testing::Range(0, static_cast<int>(std::size(kShapes)))),
                         [](const auto& info) {
                             return to_string(std::get<0>(info.param)) + "_" + kShapes[std::get<1>(info.param)].name;
                         });

TEST(AdversarialFixed, Theorem2SeedExample) {
    const Routing r = make_adversarial({.R = 4, .E = 8, .K = 2, .S = 3, .seed = kSeed}, Adversarial::kTheorem2);
    const std::vector<int32_t> tpe = r.tpe();
    for (int rank = 0; rank < 4; ++rank)
        for (int e = 0; e < 8; ++e) EXPECT_EQ(tpe[rank * 8 + e], e < 2 ? 0 : 1) << "rank " << rank << " expert " << e;
    const Config cfg{.R = 4, .E = 8, .K = 2, .S = 3, .B = -1, .tp = 1};
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        const Plan plan = make_plan(cfg, mode, tpe, r.s);
        EXPECT_GE(plan.remote_experts[0], theorem2_lower_bound(8, 4)) << to_string(mode);
        EXPECT_EQ(theorem2_lower_bound(8, 4), 2);
    }
}

TEST(AdversarialFixed, MaskedFractionNearQuarter) {
    const Routing r = make_adversarial({.R = 4, .E = 32, .K = 8, .S = 2048, .seed = kSeed}, Adversarial::kMasked);
    const double masked = 1.0 - static_cast<double>(r.total_entries()) / (4.0 * 2048 * 8);
    EXPECT_GT(masked, 0.22);
    EXPECT_LT(masked, 0.28);
}

// --- route weights --------------------------------------------------------------------------------------------------

TEST(RouteWeights, SoftmaxPerToken) {
    const Routing r = make_adversarial({.R = 4, .E = 32, .K = 6, .S = 300, .seed = kSeed}, Adversarial::kMasked);
    const auto w = make_route_weights(r, kSeed);
    ASSERT_EQ(w.size(), 4u);
    for (int rank = 0; rank < 4; ++rank) {
        ASSERT_EQ(w[rank].size(), r.topk_idx[rank].size());
        for (int t = 0; t < r.s[rank]; ++t) {
            float sum = 0;
            int unmasked = 0;
            for (int k = 0; k < 6; ++k) {
                const size_t i = static_cast<size_t>(t) * 6 + k;
                if (r.topk_idx[rank][i] == -1) {
                    EXPECT_EQ(w[rank][i], 0.0f);
                } else {
                    EXPECT_GT(w[rank][i], 0.0f);
                    ++unmasked;
                }
                sum += w[rank][i];
            }
            if (unmasked > 0) {
                EXPECT_NEAR(sum, 1.0f, 1e-5f) << "rank " << rank << " token " << t;
            } else {
                EXPECT_EQ(sum, 0.0f);
            }
        }
    }
}

TEST(RouteWeights, Deterministic) {
    const Routing r = make_lognormal({.R = 2, .E = 16, .K = 4, .S = 64, .seed = kSeed}, 1.0);
    EXPECT_EQ(make_route_weights(r, 5), make_route_weights(r, 5));
    EXPECT_NE(make_route_weights(r, 5), make_route_weights(r, 6));
}

TEST(RouteWeights, MaskedAreZero) {
    Routing r = make_round_robin({.R = 2, .E = 4, .K = 2, .S = 2});
    r.topk_idx[1] = {-1, -1, 3, -1};
    const auto w = make_route_weights(r, 1);
    EXPECT_EQ(w[1][0], 0.0f);
    EXPECT_EQ(w[1][1], 0.0f);
    EXPECT_EQ(w[1][2], 1.0f);  // the only unmasked entry of its token
    EXPECT_EQ(w[1][3], 0.0f);
}

}  // namespace
}  // namespace evenep
