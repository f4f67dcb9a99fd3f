// The imbalance budget (SPEC §3.6 slack, docs/slack.md): the targets rule of plan_slack_targets, plans with slack
// through the validator and the CPU oracle, the config checks and the CLI.
//
// Cases:
//   SlackConfig.ZeroIsTheSpecFormula          slack 0 (and below half a ppm): slack_ppm 0, NvS = SPEC invariant 4.
//   SlackConfig.BufferSizedForTheLargestTarget NvS and the buffer layout grow to ⌈(1+ε)·S·K⌉ rows, from the config.
//   SlackConfig.BadValuesNamed                 NaN, ±inf, < 0, > 1: evenep::Error naming "slack = <value>".
//   SlackTargets.Rule                          donors keep min(L, c), receivers zeroed smallest deficit first, the
//                                              targets sum to N, each within [min(L, q), c]; ε = 0 leaves q alone.
//   SlackPlans.ZeroSlackIsTodaysPlan           a config with slack 0 plans bit for bit what the default config does.
//   SlackPlans.ValidOverCorpus/<shape>         validate_plan + validate_dst over lognormal, target-maxvio,
//                                              round-robin, every SPEC §7 adversarial routing and random routings
//                                              (skew, masks, unequal s), both modes, ε in {0.01 .. 1}; rows <= c_r.
//   SlackPlans.CopiesNonIncreasingInSlack      over the same corpus (optimized mode): the entries that must leave
//                                              home and the receivers never grow with ε; the corpus's total copies
//                                              fall with every step; per routing copies may rise (bounded, counted).
//   SlackPlans.ValidatorRejectsBrokenTargets   a target above c_r and targets not summing to N are reported.
//   SlackOracle.DispatchCombineBitwise         CPU oracle on slack plans: tagged dispatch rows land where dst says,
//                                              combine equals the SPEC §4.2 formula bit for bit.
//   SlackCli.*                                 `plan --slack` (check OK, bad values exit 2 with one line),
//                                              `slack --quick --json`, a sweep too long for --max-time refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"
#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/detail/plan_core.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace evenep {
namespace {

const std::vector<double> kSlacks = {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0};

Config with_slack(Config cfg, double slack) {
    cfg.slack = slack;
    return cfg;
}

int64_t even_quota(int64_t n, int R, int r) { return n / R + (r < n % R ? 1 : 0); }

// ---- config -----------------------------------------------------------------------------------------------------

TEST(SlackConfig, ZeroIsTheSpecFormula) {
    for (double eps : {0.0, 4e-7}) {
        const Config cfg{.R = 4, .E = 16, .K = 3, .S = 37, .tp = 8, .slack = eps};
        cfg.validate();
        EXPECT_EQ(cfg.slack_ppm(), 0);
        EXPECT_EQ(cfg.recv_rows(), detail::align_up(37 * 3 + 7 * 2 * 4, 8));
    }
}

TEST(SlackConfig, BufferSizedForTheLargestTarget) {
    const Config base{.R = 4, .E = 16, .K = 3, .S = 37, .tp = 8};
    for (double eps : kSlacks) {
        const Config cfg = with_slack(base, eps);
        const int64_t ppm = std::llround(eps * 1e6);
        EXPECT_EQ(cfg.slack_ppm(), ppm);
        const int64_t sk = 37 * 3, cap = sk + (sk * ppm + 999999) / 1000000;
        EXPECT_EQ(cap, static_cast<int64_t>(std::ceil((1 + eps) * sk - 1e-9))) << eps;
        EXPECT_EQ(cfg.recv_rows(), detail::align_up(cap + 7 * 2 * 4, 8)) << eps;
        const BufferConfig bc{.cfg = cfg, .H = 16, .ffn_hidden = 8};
        EXPECT_EQ(bc.layout().num_recv_rows, cfg.recv_rows());
    }
}

TEST(SlackConfig, BadValuesNamed) {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    for (double eps : {nan, inf, -inf, -0.01, 1.5}) {
        const Config cfg{.R = 2, .E = 4, .K = 2, .S = 8, .slack = eps};
        try {
            cfg.validate();
            ADD_FAILURE() << "slack " << eps << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("slack = "), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("[0, 1]"), std::string::npos) << e.what();
        }
        EXPECT_THROW(Planner(cfg, PlannerMode::kOptimized), Error);
    }
}

// ---- the targets rule -------------------------------------------------------------------------------------------

TEST(SlackTargets, Rule) {
    testing::TestRng rng(41);
    for (int round = 0; round < 2000; ++round) {
        const int R = rng.between(1, 12);
        const int32_t ppm = round % 7 == 0 ? 0 : rng.between(1, 1000000);
        std::vector<int64_t> load(R);
        int64_t n = 0;
        for (int r = 0; r < R; ++r) n += load[r] = rng.chance(0.2) ? 0 : rng.between(0, 5000);
        std::vector<int32_t> q(R);
        for (int r = 0; r < R; ++r) q[r] = static_cast<int32_t>(even_quota(n, R, r));
        std::vector<int32_t> t = q;
        const detail::PlanDims d{R, R, 1, 2, 1, 1, true, ppm};
        detail::plan_slack_targets(d, load.data(), t.data());
        int64_t sum = 0, extra = 0;
        for (int r = 0; r < R; ++r) {
            const int64_t cap = detail::slack_cap(q[r], ppm);
            sum += t[r];
            EXPECT_LE(t[r], cap);
            EXPECT_GE(t[r], std::min<int64_t>(load[r], q[r]));
            if (load[r] > q[r]) {
                EXPECT_EQ(t[r], std::min(load[r], cap)) << "donor " << r;
                extra += t[r] - q[r];
            }
            if (load[r] == q[r]) {
                EXPECT_EQ(t[r], q[r]);
            }
        }
        EXPECT_EQ(sum, n);
        if (ppm == 0) {
            EXPECT_EQ(t, q);
        }
        // Receivers: the zeroed ones are a prefix of the (deficit, rank) order, then at most one partial cut.
        std::vector<std::pair<int64_t, int>> order;
        for (int r = 0; r < R; ++r)
            if (load[r] < q[r]) order.push_back({q[r] - load[r], r});
        std::sort(order.begin(), order.end());
        int64_t left = extra;
        for (const auto& [deficit, r] : order) {
            const int64_t cut = std::min(deficit, left);
            EXPECT_EQ(t[r], q[r] - cut) << "receiver " << r << " round " << round;
            left -= cut;
        }
        EXPECT_EQ(left, 0);
    }
}

// ---- plans ------------------------------------------------------------------------------------------------------

TEST(SlackPlans, ZeroSlackIsTodaysPlan) {
    const Config cfg{.R = 8, .E = 32, .K = 4, .S = 64, .tp = 4};
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const Routing routing = make_lognormal(RoutingSpec{8, 32, 4, 64, seed}, 0.3 * seed);
        for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
            const Plan a = make_plan(cfg, mode, routing.tpe(), routing.s);
            const Plan b = make_plan(with_slack(cfg, 0.0), mode, routing.tpe(), routing.s);
            EXPECT_EQ(testing::plan_diff(a, b), "") << "seed " << seed;
            for (int r = 0; r < cfg.R; ++r) EXPECT_EQ(a.q[r], even_quota(a.total_entries(), cfg.R, r));
        }
    }
}

struct NamedCase {
    std::string name;
    Routing routing;
};

// SPEC §7 generators (library) plus the tests' own random routings.
std::vector<NamedCase> corpus(const Config& cfg, uint64_t seed) {
    const RoutingSpec spec{cfg.R, cfg.E, cfg.K, cfg.S, seed};
    std::vector<NamedCase> out;
    for (double sigma : {0.3, 1.0, 2.5}) out.push_back({"lognormal" + std::to_string(sigma), make_lognormal(spec, sigma)});
    for (double mv : {0.2, 1.0, 3.0}) out.push_back({"maxvio" + std::to_string(mv), make_target_maxvio(spec, mv)});
    out.push_back({"round_robin", make_round_robin(spec)});
    for (Adversarial a : all_adversarial()) out.push_back({to_string(a), make_adversarial(spec, a)});
    testing::RoutingOptions o;
    o.skew = 2.0;
    o.mask_prob = 0.1;
    out.push_back({"random_skew_mask", testing::random_routing(cfg, seed, o)});
    o.unequal_s = true;
    out.push_back({"random_unequal_s", testing::random_routing(cfg, seed + 1, o)});
    o = {};
    o.num_hot = std::max(1, cfg.E / 8);
    out.push_back({"random_hot", testing::random_routing(cfg, seed + 2, o)});
    return out;
}

struct Shape {
    int R, E, K, S, tp;
};
const Shape kShapes[] = {{1, 4, 2, 8, 2},  {2, 8, 2, 16, 1},  {4, 16, 4, 32, 4},
                         {8, 32, 4, 48, 8}, {8, 64, 8, 32, 2}, {4, 64, 6, 40, 3}};

class SlackCorpus : public ::testing::TestWithParam<int> {};

TEST_P(SlackCorpus, ValidOverCorpus) {
    const Shape sh = kShapes[GetParam()];
    const Config base{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .tp = sh.tp};
    for (uint64_t seed : {11u, 12u}) {
        for (const NamedCase& c : corpus(base, seed)) {
            const std::vector<int32_t> tpe = c.routing.tpe();
            for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized})
                for (double eps : kSlacks) {
                    const Config cfg = with_slack(base, eps);
                    SCOPED_TRACE(c.name + " seed " + std::to_string(seed) + " " + cfg.to_string() + " " +
                                 std::string(to_string(mode)));
                    const Plan plan = make_plan(cfg, mode, tpe, c.routing.s);
                    const ValidationReport rep = validate_dst(plan, c.routing, testing::all_dst(plan, c.routing));
                    ASSERT_TRUE(rep.ok()) << rep.summary();
                    const int64_t n = plan.total_entries();
                    for (int r = 0; r < cfg.R; ++r) {
                        EXPECT_LE(plan.q[r], detail::slack_cap(even_quota(n, cfg.R, r), cfg.slack_ppm()));
                        EXPECT_LE(plan.rows_used(r), cfg.recv_rows());
                    }
                }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SlackCorpus, ::testing::Range(0, static_cast<int>(std::size(kShapes))),
                         [](const ::testing::TestParamInfo<int>& info) {
                             const Shape s = kShapes[info.param];
                             return "R" + std::to_string(s.R) + "_E" + std::to_string(s.E) + "_K" +
                                    std::to_string(s.K) + "_S" + std::to_string(s.S);
                         });

// What slack guarantees, exactly: the entries that must leave their home ranks (Σ_r max(0, L_r - t_r)) and the
// number of receivers (ranks with t_r > L_r, each needing >= 1 copy) never grow with ε — both follow from the
// targets rule. Total copies of a single routing are NOT monotone: the greedy constructions run on different
// targets and can split differently (measured below: a few per cent of the steps of this corpus, never more than
// kMaxStepIncrease copies); summed over the corpus they fall with every step of ε. The largest step is on the
// Theorem-2 routings (R=8, epn=8) since the default candidate set includes the overshooting fills: 7 copies at
// ε = 0.02, 14 at ε = 0.05 (the changed targets defeat the overshoot) — less than one rank's epn, the bound asserted.
// (Known limitation, docs/slack.md: planning with the exact quotas as one more candidate would remove it.)
constexpr int kMaxStepIncrease = 8;
TEST(SlackPlans, CopiesNonIncreasingInSlack) {
    const std::vector<double> eps_steps = {0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0};
    std::vector<int64_t> corpus_copies(eps_steps.size(), 0);
    int steps = 0, increases = 0;
    for (const Shape& sh : kShapes) {
        const Config base{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .tp = sh.tp};
        for (uint64_t seed : {11u, 12u, 13u})
            for (const NamedCase& c : corpus(base, seed)) {
                const std::vector<int32_t> tpe = c.routing.tpe();
                int64_t prev_copies = -1, prev_flow = -1, prev_receivers = -1;
                for (size_t i = 0; i < eps_steps.size(); ++i) {
                    const Plan plan =
                        make_plan(with_slack(base, eps_steps[i]), PlannerMode::kOptimized, tpe, c.routing.s);
                    int64_t flow = 0, receivers = 0;
                    for (int r = 0; r < base.R; ++r) {
                        flow += std::max<int64_t>(0, plan.load_before[r] - plan.q[r]);
                        receivers += plan.q[r] > plan.load_before[r];
                    }
                    EXPECT_LE(receivers, plan.cost.total_copies);
                    corpus_copies[i] += plan.cost.total_copies;
                    if (prev_copies >= 0) {
                        const std::string what = c.name + " seed " + std::to_string(seed) + " " + base.to_string() +
                                                 " eps " + std::to_string(eps_steps[i]);
                        EXPECT_LE(flow, prev_flow) << what;
                        EXPECT_LE(receivers, prev_receivers) << what;
                        EXPECT_LE(plan.cost.total_copies, prev_copies + kMaxStepIncrease) << what;
                        ++steps;
                        increases += plan.cost.total_copies > prev_copies;
                    }
                    prev_copies = plan.cost.total_copies;
                    prev_flow = flow;
                    prev_receivers = receivers;
                }
            }
    }
    for (size_t i = 1; i < eps_steps.size(); ++i)
        EXPECT_LE(corpus_copies[i], corpus_copies[i - 1]) << "corpus copies, eps " << eps_steps[i];
    std::printf("[ slack    ] corpus copies by eps:");
    for (int64_t c : corpus_copies) std::printf(" %lld", static_cast<long long>(c));
    std::printf("; per-routing increases: %d of %d steps\n", increases, steps);
    EXPECT_GT(steps, 500);
    EXPECT_LE(increases * 10, steps) << "more than 10% of the steps add copies";
}

TEST(SlackPlans, ValidatorRejectsBrokenTargets) {
    const Config cfg{.R = 4, .E = 16, .K = 4, .S = 32, .tp = 2, .slack = 0.05};
    const Routing routing = make_adversarial(RoutingSpec{4, 16, 4, 32, 3}, Adversarial::kOneHotRank);
    const Plan good = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
    ASSERT_TRUE(validate_plan(good).ok()) << validate_plan(good).summary();
    int donor = 0;
    for (int r = 1; r < cfg.R; ++r)
        if (good.q[r] > good.q[donor]) donor = r;
    ASSERT_GT(good.q[donor], even_quota(good.total_entries(), 4, donor)) << "the slack is in use";
    Plan p = good;
    p.q[donor] += static_cast<int32_t>(cfg.S * cfg.K);
    ValidationReport rep = validate_plan(p);
    ASSERT_FALSE(rep.ok());
    EXPECT_NE(rep.summary().find("ceil((1+slack)*q_r)"), std::string::npos) << rep.summary();
    EXPECT_NE(rep.summary().find("targets sum to"), std::string::npos) << rep.summary();
    // The same plan under slack 0 is held to the even quotas.
    p = good;
    p.cfg.slack = 0;
    rep = validate_plan(p);
    ASSERT_FALSE(rep.ok());
    EXPECT_NE(rep.summary().find("expected floor(N/R) + (r < N mod R)"), std::string::npos) << rep.summary();
}

// ---- the CPU oracle ---------------------------------------------------------------------------------------------

TEST(SlackOracle, DispatchCombineBitwise) {
    for (double eps : {0.05, 0.5}) {
        BufferConfig bc = testing::buffer_config(4, 16, 4, 29, 4);
        bc.cfg.slack = eps;
        const int R = bc.cfg.R, K = bc.cfg.K, H = bc.H;
        const int64_t nvs = bc.cfg.recv_rows();
        for (Adversarial kind : {Adversarial::kOneHotRank, Adversarial::kSingleHotExpert, Adversarial::kUnequalS}) {
            const Routing routing = make_adversarial(RoutingSpec{R, bc.cfg.E, K, bc.cfg.S, 7}, kind);
            SCOPED_TRACE(std::string(to_string(kind)) + " " + bc.to_string());
            cpu::OracleOptions opt;
            opt.s_total = 0;
            for (int v : routing.s) opt.s_total += v;
            const auto tokens = testing::tagged_tokens(bc, routing, 7);
            const cpu::GroupDispatchResult res = cpu::dispatch_group(bc, tokens, opt);
            bool slack_used = false;
            for (int r = 0; r < R; ++r)
                slack_used |= res.plan.q[r] > even_quota(res.plan.total_entries(), R, r);
            EXPECT_TRUE(slack_used || kind == Adversarial::kUnequalS);
            ASSERT_TRUE(validate_dst(res.plan, routing, res.dst).ok());
            for (int r = 0; r < R; ++r)
                for (int t = 0; t < routing.s[r]; ++t)
                    for (int k = 0; k < K; ++k) {
                        const size_t i = static_cast<size_t>(t) * K + k;
                        if (routing.topk_idx[r][i] < 0) continue;
                        const int32_t flat = detail::decode_dst(res.dst[r][i]);
                        const int d = static_cast<int>(flat / nvs);
                        const int64_t row = flat % nvs;
                        for (int c = 0; c < H; ++c)
                            ASSERT_EQ(res.recv_x[d][row * H + c], testing::tag(r, t, c))
                                << "rank " << r << " token " << t << " k " << k << " -> rank " << d << " row " << row;
                        ASSERT_EQ(res.recv_w[d][row], tokens[r].topk_w[i]);
                    }
            std::vector<std::vector<Bf16>> y(R);
            for (int r = 0; r < R; ++r) y[r] = testing::random_bf16(static_cast<size_t>(nvs) * H, 90 + r);
            std::vector<std::vector<float>> w;
            for (const auto& t : tokens) w.push_back(t.topk_w);
            for (bool apply : {false, true}) {
                const cpu::GroupCombineResult out = cpu::combine_group(bc, tokens, y, apply, opt);
                const auto expected = testing::reference_combine(res.plan, res.dst, y, w, H, apply);
                for (int r = 0; r < R; ++r)
                    for (size_t i = 0; i < expected[r].size(); ++i)
                        ASSERT_EQ(out.out[r][i].bits, expected[r][i].bits) << "rank " << r << " value " << i;
            }
        }
    }
}

// ---- CLI --------------------------------------------------------------------------------------------------------

TEST(SlackCli, PlanWithSlackChecks) {
    const testing::CliRun run = testing::run_cli("plan --R 4 --E 16 --K 2 --S 64 --maxvio 3 --slack 0.05 --check");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("slack=0.05"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("check: OK"), std::string::npos) << run.output;
}

TEST(SlackCli, BadValuesExitTwoWithOneLine) {
    for (const std::string v : {"-0.1", "1.5", "nan", "inf", "x", "''"}) {
        for (const std::string cmd : {"plan --R 4 --E 16 --K 2 --S 64 --slack ", "slack --quick --slack 0 "}) {
            const testing::CliRun run = testing::run_cli(cmd + v, /*merge_stderr=*/false, 60);
            EXPECT_EQ(run.exit_code, 2) << cmd << v << "\n" << run.output << run.error;
            EXPECT_NE(run.error.find("--slack"), std::string::npos) << run.error;
            EXPECT_EQ(std::count(run.error.begin(), run.error.end(), '\n'), 1) << run.error;
        }
    }
}

TEST(SlackCli, LongSweepRefusedBeforeItStarts) {
    const testing::CliRun run = testing::run_cli("slack --R 64 --E 896 --K 16 --S 100000 --max-time 10", false, 60);
    EXPECT_EQ(run.exit_code, 2) << run.output << run.error;
    EXPECT_NE(run.error.find("estimated time"), std::string::npos) << run.error;
    EXPECT_LT(run.seconds, 10);
}

TEST(SlackCli, SweepJson) {
    const auto dir = testing::temp_dir("slack_cli", "sweep");
    const std::string path = (dir / "slack.json").string();
    const testing::CliRun run = testing::run_cli("slack --quick --slack 0 0.05 0.5 --json " + path, true, 120);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("Every plan passed the validator: yes"), std::string::npos) << run.output;
    std::ifstream f(path);
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("schema"), "evenep.slack/1");
    ASSERT_EQ(j.at("rows").size(), 6u);  // 2 maxvio x 3 slacks
    for (const auto& row : j.at("rows")) {
        EXPECT_TRUE(row.at("valid").get<bool>());
        EXPECT_LE(row.at("imbalance").get<double>(), 1.0 + row.at("slack").get<double>() + 0.01);
    }
    EXPECT_LE(j["rows"][2]["total_copies"].get<int64_t>(), j["rows"][0]["total_copies"].get<int64_t>());
}

}  // namespace
}  // namespace evenep
