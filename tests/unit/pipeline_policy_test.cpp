// ViT placement policies (include/evenep/pipeline.hpp place_vit).
//
// Cases:
//   PipelinePolicy.EveryScheduleValidates      none, sync, bubbles over P 1..8, V 1..2, latency 0 / 0.3, three mixes,
//                                              ViT loads 0.25..2: the independent validator accepts every schedule
//   PipelinePolicy.BubblesNeverWorseThanSync   200 random instances (seed printed): bubbles makespan <= sync's
//   PipelinePolicy.WithinFivePercentOfOptimum  small random instances (P 2..3, m <= 4, <= 4 pieces a direction):
//                                              bubbles within 5% of the proved MILP optimum (skips without CBC)
//   PipelinePolicy.HidesNinetyPercentAtHalfLoad   P=8 m=32 V=2 and P=16 m=64 V=2, mix "mixed", 16 images per
//                                              micro-batch, ViT load 0.5: bubbles hides >= 90%
//   PipelinePolicy.OptimalLimits               too large an instance throws; without CBC the policy throws kRuntime
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#include "common/pipeline_testing.hpp"
#include "evenep/pipeline.hpp"

namespace evenep::pipeline {
namespace {

using testing::joined;
PipelineConfig cfg_of(int P, int m, int V, double latency = 0) { return testing::pipeline_config(P, m, V, latency); }

VitWork work_for(const PipelineConfig& cfg, const VitWork& vit, VitPolicy p) {
    return p == VitPolicy::kNone ? testing::no_vit_work(cfg.m) : vit;
}

// Random ViT pieces: up to max_pieces per micro-batch, forward costs in [0, 2 * mean], backward 2x.
VitWork random_work(int m, int max_pieces, double mean, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> count(0, max_pieces);
    std::uniform_real_distribution<double> cost(0.0, 2.0 * mean);
    VitWork w;
    for (int i = 0; i < m; ++i) {
        w.forward.emplace_back();
        w.backward.emplace_back();
        for (int p = count(rng); p > 0; --p) {
            w.forward.back().push_back(cost(rng));
            w.backward.back().push_back(2 * w.forward.back().back());
        }
    }
    return w;
}

TEST(PipelinePolicy, EveryScheduleValidates) {
    int checked = 0;
    for (int P : {1, 2, 3, 4, 8})
        for (int V : {1, 2})
            for (double latency : {0.0, 0.3})
                for (const std::string& mix : mix_names())
                    for (double load : {0.25, 1.0, 2.0}) {
                        const PipelineConfig cfg = cfg_of(P, 2 * P, V, latency);
                        const VitWork vit =
                            vit_work_from_images(cfg, make_mix(mix, cfg.m, 3, 7), VitCostModel{}, P > 2 ? 2 : 1, load);
                        for (VitPolicy p : {VitPolicy::kNone, VitPolicy::kSync, VitPolicy::kBubbles}) {
                            SCOPED_TRACE(::testing::Message() << "P=" << P << " V=" << V << " latency=" << latency << " "
                                                            << mix << " load=" << load << " " << to_string(p));
                            const PolicyResult r = place_vit(cfg, vit, p);
                            const auto errors = validate_schedule(cfg, work_for(cfg, vit, p), r.schedule);
                            EXPECT_TRUE(errors.empty()) << joined(errors);
                            EXPECT_GE(r.schedule.makespan, r.text_makespan - 1e-9);
                            ++checked;
                        }
                    }
    EXPECT_EQ(checked, 5 * 2 * 2 * 3 * 3 * 3);
}

TEST(PipelinePolicy, BubblesNeverWorseThanSync) {
    constexpr uint64_t kSeed = 1414;
    std::mt19937_64 rng(kSeed);
    for (int t = 0; t < 200; ++t) {
        const int P = 1 + static_cast<int>(rng() % 6), V = 1 + static_cast<int>(rng() % 2);
        const int m = V > 1 ? P * (1 + static_cast<int>(rng() % 3)) : 1 + static_cast<int>(rng() % 10);
        const PipelineConfig cfg = cfg_of(P, m, V, (rng() % 3) * 0.2);
        const VitWork vit = random_work(m, 4, 0.2 + (rng() % 10) * 0.2, rng);
        const PolicyResult sync = place_vit(cfg, vit, VitPolicy::kSync);
        const PolicyResult bubbles = place_vit(cfg, vit, VitPolicy::kBubbles);
        EXPECT_LE(bubbles.schedule.makespan, sync.schedule.makespan + 1e-9)
            << "seed " << kSeed << " instance " << t << " P=" << P << " m=" << m << " V=" << V;
        EXPECT_TRUE(validate_schedule(cfg, vit, bubbles.schedule).empty()) << "instance " << t;
    }
}

TEST(PipelinePolicy, WithinFivePercentOfOptimum) {
    if (!optimal_policy_available()) GTEST_SKIP() << "built without CBC";
    constexpr uint64_t kSeed = 5;
    std::mt19937_64 rng(kSeed);
    int proved = 0;
    double worst = 1;
    for (int t = 0; t < 12; ++t) {
        const int P = 2 + static_cast<int>(t % 2), V = (t % 4 == 3) ? 2 : 1;
        const int m = V > 1 ? P : 2 + static_cast<int>(rng() % 3);
        const PipelineConfig cfg = cfg_of(P, m, V, (t % 3 == 2) ? 0.25 : 0.0);
        VitWork vit = random_work(m, 1, 0.6, rng);
        while (vit.num_pieces() > 4) {  // keep the MILP small
            for (int i = m - 1; i >= 0; --i)
                if (!vit.forward[i].empty()) {
                    vit.forward[i].clear();
                    vit.backward[i].clear();
                    break;
                }
        }
        const PolicyResult bubbles = place_vit(cfg, vit, VitPolicy::kBubbles);
        const PolicyResult opt = place_vit(cfg, vit, VitPolicy::kOptimal, {.time_limit_s = 20});
        SCOPED_TRACE(::testing::Message() << "seed " << kSeed << " instance " << t << " P=" << P << " m=" << m
                                        << " V=" << V);
        EXPECT_TRUE(validate_schedule(cfg, vit, opt.schedule).empty());
        EXPECT_LE(opt.schedule.makespan, bubbles.schedule.makespan + 1e-9);
        if (!opt.optimal) continue;
        ++proved;
        EXPECT_LE(bubbles.schedule.makespan, 1.05 * opt.schedule.makespan);
        worst = std::max(worst, bubbles.schedule.makespan / opt.schedule.makespan);
    }
    EXPECT_GE(proved, 10);
    std::printf("bubbles / optimum makespan: worst %.4f over %d proved instances\n", worst, proved);
}

TEST(PipelinePolicy, HidesNinetyPercentAtHalfLoad) {
    for (auto [P, m] : {std::pair{8, 32}, std::pair{16, 64}}) {
        const PipelineConfig cfg = cfg_of(P, m, 2);
        const VitWork vit = vit_work_from_images(cfg, make_mix("mixed", m, 16, 1), VitCostModel{}, 1, 0.5);
        const PolicyResult bubbles = place_vit(cfg, vit, VitPolicy::kBubbles);
        const PolicyResult sync = place_vit(cfg, vit, VitPolicy::kSync);
        EXPECT_GE(bubbles.hidden_fraction, 0.90) << "P=" << P << " m=" << m;
        EXPECT_LE(sync.hidden_fraction, 0.05) << "P=" << P << " m=" << m;
        EXPECT_TRUE(validate_schedule(cfg, vit, bubbles.schedule).empty());
    }
}

TEST(PipelinePolicy, OptimalLimits) {
    const PipelineConfig big = cfg_of(8, 32, 2);
    const VitWork vit = vit_work_from_images(big, make_mix("uniform", 32, 1, 1), VitCostModel{}, 1, 0.5);
    EXPECT_FALSE(optimal_policy_fits(big, vit));
    EXPECT_THROW(place_vit(big, vit, VitPolicy::kOptimal), Error);
    const PipelineConfig small = cfg_of(2, 2, 1);
    const VitWork w{{{0.5}, {0.5}}, {{1.0}, {1.0}}};
    EXPECT_TRUE(optimal_policy_fits(small, w));
    if (!optimal_policy_available()) {
        try {
            place_vit(small, w, VitPolicy::kOptimal);
            FAIL() << "expected an error without CBC";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
            EXPECT_NE(std::string(e.what()).find("CBC"), std::string::npos);
        }
    }
}

}  // namespace
}  // namespace evenep::pipeline
