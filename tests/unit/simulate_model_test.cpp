// The scale model's pieces (perf/baselines.hpp, perf/drift.hpp) and `evenep simulate` against `evenep plan`.
//
// Cases:
//   SimulateBaselines.ConventionalRowsAreHistogramSums   conventional_rows == sums of the routing's histogram over
//                                                        each rank's home experts == the plan's load_before
//   SimulateBaselines.EvenEpRowsAllEqual                 the plan's q: all equal when N % R == 0, within 1 otherwise
//                                                        (masked routing), while conventional rows are not
//   SimulateDrift.ReproducibleBySeed                     drift_routing(d, step) twice: identical; another seed differs
//   SimulateDrift.StepZeroIsLognormal                    step 0 == make_lognormal(spec, sigma); its log-popularity
//                                                        is sigma * lognormal_scores
//   SimulateDrift.WalkSteps                              drift 0: every step has step 0's popularity; drift > 0:
//                                                        increments have about the drift's standard deviation, and
//                                                        steps -1 and 1 differ (independent increments)
//   SimulateCli.QuickMatchesPlan                         `simulate --quick --json`: per point, copies and per-rank
//                                                        rows equal `evenep plan --sigma <sigma> --json` for the same
//                                                        inputs, and link bytes equal the traffic model run here on
//                                                        the plan CLI's own dst
//   SimulateCli.BadFlagsExitTwoWithOneLine               E % R, maxvio < 0, repeat 0, H % 8, drift < 0, redundant < -1,
//                                                        a missing --gpu-json: exit 2, one line on stderr
//   SimulateCli.GpuJsonFillsColumn                       a bench gpu-plan style JSON fills plan_ms_gpu of its point
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"
#include "evenep/buffer.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "perf/baselines.hpp"
#include "perf/drift.hpp"

namespace evenep::perf {
namespace {

namespace fs = std::filesystem;

using testing::CliRun;

using testing::run_cli;

fs::path temp_dir(const std::string& name) { return testing::temp_dir("evenep_simulate_test", name); }

nlohmann::json read_json(const fs::path& p) {
    std::ifstream f(p);
    return nlohmann::json::parse(f);
}

TEST(SimulateBaselines, ConventionalRowsAreHistogramSums) {
    const RoutingSpec spec{.R = 4, .E = 32, .K = 4, .S = 200, .seed = 11};
    const Routing routing = make_lognormal(spec, 1.5);
    const Config cfg{.R = 4, .E = 32, .K = 4, .S = 200};
    const std::vector<int32_t> tpe = routing.tpe();
    std::vector<int64_t> expect(4, 0);
    for (int r = 0; r < 4; ++r)
        for (int e = 0; e < 32; ++e) expect[e / 8] += tpe[static_cast<size_t>(r) * 32 + e];
    const std::vector<int64_t> rows = conventional_rows(cfg, expert_loads(cfg, tpe));
    EXPECT_EQ(rows, expect);
    const Plan plan = make_plan(cfg, PlannerMode::kOptimized, tpe, routing.s);
    EXPECT_EQ(rows, plan.load_before);
}

TEST(SimulateBaselines, EvenEpRowsAllEqual) {
    for (const bool masked : {false, true}) {
        SCOPED_TRACE(masked ? "masked" : "lognormal");
        const RoutingSpec spec{.R = 8, .E = 64, .K = 4, .S = 256, .seed = 2};
        const Routing routing = masked ? make_adversarial(spec, Adversarial::kMasked) : make_lognormal(spec, 2.0);
        const Config cfg{.R = 8, .E = 64, .K = 4, .S = 256};
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
        const std::vector<int64_t> rows(plan.q.begin(), plan.q.end());
        const int64_t mx = *std::max_element(rows.begin(), rows.end()),
                      mn = *std::min_element(rows.begin(), rows.end());
        if (plan.total_entries() % 8 == 0)
            EXPECT_EQ(mx, mn);
        else
            EXPECT_EQ(mx - mn, 1);
        EXPECT_LE(imbalance(rows), 1.0 + 8.0 / static_cast<double>(plan.total_entries()));
        EXPECT_GT(imbalance(conventional_rows(cfg, expert_loads(cfg, routing.tpe()))), 1.05);
    }
}

TEST(SimulateDrift, ReproducibleBySeed) {
    const DriftSpec d{.spec = {.R = 2, .E = 16, .K = 2, .S = 64, .seed = 9}, .sigma = 1.0, .drift = 0.3};
    for (int step : {-2, -1, 1, 3}) {
        EXPECT_EQ(drift_routing(d, step).topk_idx, drift_routing(d, step).topk_idx) << "step " << step;
        EXPECT_EQ(drift_log_popularity(d, step), drift_log_popularity(d, step)) << "step " << step;
    }
    DriftSpec other = d;
    other.spec.seed = 10;
    EXPECT_NE(drift_routing(d, -1).topk_idx, drift_routing(other, -1).topk_idx);
    EXPECT_NE(drift_routing(d, -1).topk_idx, drift_routing(d, 1).topk_idx);
}

TEST(SimulateDrift, StepZeroIsLognormal) {
    const DriftSpec d{.spec = {.R = 2, .E = 16, .K = 2, .S = 64, .seed = 4}, .sigma = 0.7, .drift = 0.5};
    EXPECT_EQ(drift_routing(d, 0).topk_idx, make_lognormal(d.spec, 0.7).topk_idx);
    const std::vector<double> z = lognormal_scores(d.spec);
    const std::vector<double> l = drift_log_popularity(d, 0);
    for (size_t e = 0; e < z.size(); ++e) EXPECT_EQ(l[e], 0.7 * z[e]);
}

TEST(SimulateDrift, WalkSteps) {
    DriftSpec d{.spec = {.R = 1, .E = 4000, .K = 1, .S = 1, .seed = 5}, .sigma = 1.0, .drift = 0.0};
    EXPECT_EQ(drift_log_popularity(d, 3), drift_log_popularity(d, 0));
    EXPECT_EQ(drift_log_popularity(d, -2), drift_log_popularity(d, 0));
    d.drift = 0.2;
    const std::vector<double> l0 = drift_log_popularity(d, 0), l1 = drift_log_popularity(d, 1),
                              l2 = drift_log_popularity(d, 2), lm1 = drift_log_popularity(d, -1);
    double sq = 0, sq2 = 0;
    for (size_t e = 0; e < l0.size(); ++e) {
        sq += (l1[e] - l0[e]) * (l1[e] - l0[e]);
        sq2 += (l2[e] - l1[e]) * (l2[e] - l1[e]);
    }
    // 4000 samples: the sample std is within ~5% of 0.2 (about 4.5 sigma).
    EXPECT_NEAR(std::sqrt(sq / 4000), 0.2, 0.01);
    EXPECT_NEAR(std::sqrt(sq2 / 4000), 0.2, 0.01);
    EXPECT_NE(l1, lm1);
}

TEST(SimulateCli, QuickMatchesPlan) {
    const fs::path dir = temp_dir("quick");
    const CliRun sim = run_cli("simulate --quick --json " + (dir / "sim.json").string());
    ASSERT_EQ(sim.exit_code, 0) << sim.output;
    const nlohmann::json j = read_json(dir / "sim.json");
    ASSERT_EQ(j["schema"], "evenep.simulate/1");
    ASSERT_EQ(j["points"].size(), 4u);  // R 4 8 x maxvio 1 10
    for (const nlohmann::json& pt : j["points"]) {
        const int R = pt["R"], E = pt["E"], K = pt["K"], S = pt["S"], H = pt["H"], ffn = pt["ffn_hidden"];
        const double sigma = pt["sigma"];
        const uint64_t seed = pt["seed"];
        SCOPED_TRACE(::testing::Message() << "R=" << R << " sigma=" << sigma);
        char sigma_str[64];
        std::snprintf(sigma_str, sizeof(sigma_str), "%.17g", sigma);
        const fs::path plan_json =
            dir / ("plan_R" + std::to_string(R) + "_" + std::to_string(pt["target_maxvio"].get<double>()) + ".json");
        const CliRun plan_run =
            run_cli("plan --quiet --repeat 1 --R " + std::to_string(R) + " --E " + std::to_string(E) + " --K " +
                    std::to_string(K) + " --S " + std::to_string(S) + " --sigma " + sigma_str + " --seed " +
                    std::to_string(seed) + " --json " + plan_json.string());
        ASSERT_EQ(plan_run.exit_code, 0) << plan_run.output;
        const nlohmann::json pj = read_json(plan_json);
        // Copies.
        EXPECT_EQ(pt["copies"]["total"], pj["cost"]["total_copies"]);
        EXPECT_EQ(pt["copies"]["max_rank_copy_traffic"], pj["cost"]["max_rank_copy_traffic"]);
        const std::vector<int32_t> remote = pj["per_rank"]["remote_experts"];
        EXPECT_EQ(pt["copies"]["max_rank"], *std::max_element(remote.begin(), remote.end()));
        // Rows: EvenEP's q and conventional EP's load_before.
        EXPECT_EQ(pt["rows"]["evenep"], pj["q"]);
        EXPECT_EQ(pt["rows"]["conventional"], pj["per_rank"]["load_before"]);
        // Traffic: the model over the plan CLI's plan (rebuilt from its histograms; its copies and dst must match).
        const Routing routing = make_lognormal({.R = R, .E = E, .K = K, .S = S, .seed = seed}, sigma);
        const Config cfg{.R = R, .E = E, .K = K, .S = S};
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
        const std::vector<std::vector<int32_t>> dst = pj["dst"];
        const std::vector<std::vector<int32_t>> copies = pj["copies"];
        for (int r = 0; r < R; ++r)
            EXPECT_EQ(copies[r],
                      std::vector<int32_t>(plan.copies.begin() + static_cast<size_t>(r) * cfg.num_slots(),
                                           plan.copies.begin() + static_cast<size_t>(r + 1) * cfg.num_slots()));
        const TrafficReport ev = evenep_traffic(plan, dst, H, ffn, /*training=*/true);
        EXPECT_EQ(pt["link_bytes"]["evenep"]["total_bytes"], ev.total().bytes);
        EXPECT_EQ(pt["link_bytes"]["evenep"]["max_rank_bytes"], ev.total().max_rank_bytes());
        EXPECT_EQ(pt["link_bytes"]["evenep"]["phases"]["prefetch"]["bytes"], ev.prefetch.bytes);
        const TrafficReport cv = conventional_traffic(cfg, routing.topk_idx, H, /*training=*/true);
        EXPECT_EQ(pt["link_bytes"]["conventional"]["total_bytes"], cv.total().bytes);
        // Imbalance: EvenEP flat, the baselines not better than flat.
        EXPECT_DOUBLE_EQ(pt["imbalance"]["evenep"].get<double>(), 1.0);
        EXPECT_GE(pt["imbalance"]["eplb"].get<double>(), 1.0);
        EXPECT_GE(pt["imbalance"]["conventional"].get<double>(), 1.0);
    }
    fs::remove_all(dir);
}

TEST(SimulateCli, BadFlagsExitTwoWithOneLine) {
    for (const std::string flags : {"--R 5", "--maxvio -1", "--repeat 0", "--H 12", "--drift -1", "--redundant -2",
                                    "--gpu-json /nonexistent/gpu.json"}) {
        const CliRun run = run_cli("simulate --quick " + flags);
        EXPECT_EQ(run.exit_code, 2) << flags << ": " << run.output;
        EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << flags << ": " << run.output;
    }
}

TEST(SimulateCli, GpuJsonFillsColumn) {
    const fs::path dir = temp_dir("gpu");
    const nlohmann::json gpu{
        {"rows",
         {{{"op", "plan_rank"}, {"shape", "R4 E64 K4 S512 H256"}, {"target_maxvio", 1.0}, {"median_us", 42.0}},
          {{"op", "plan_fused"}, {"shape", "R4 E64 K4 S512 H256"}, {"target_maxvio", 1.0}, {"median_us", 99.0}}}}};
    std::ofstream(dir / "gpu.json") << gpu.dump();
    const CliRun run = run_cli("simulate --quick --R 4 --gpu-json " + (dir / "gpu.json").string() + " --json " +
                               (dir / "sim.json").string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const nlohmann::json j = read_json(dir / "sim.json");
    ASSERT_EQ(j["points"].size(), 2u);
    EXPECT_DOUBLE_EQ(j["points"][0]["plan_ms_gpu"].get<double>(), 0.042);
    EXPECT_TRUE(j["points"][1]["plan_ms_gpu"].is_null());
    fs::remove_all(dir);
}

}  // namespace
}  // namespace evenep::perf
