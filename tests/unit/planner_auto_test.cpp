// The auto planner policy (docs/auto.md): the decision of evenep/detail/plan_auto.hpp, the plans it makes, the CLI.
//
// Cases:
//   AutoDecision.Candidates            ascending, distinct, 0 and the largest budget always in, the no-copy budget in
//                                      exactly when it is within the largest; the no-copy budget's plan has no copy.
//   AutoDecision.BalancedIsExact       every rank already at its quota: budget 0, no copies.
//   AutoDecision.MildSkewNoCopies      loads within 1% of the mean at MoonEP: the model prefers the no-copy budget
//                                      (a copy costs far more than 1% of a rank's rows), plan has 0 copies.
//   AutoDecision.StrongSkewCopies      a rank with 3x the mean load, no-copy budget out of reach: copies stay.
//   AutoDecision.SlackWins             a hand-built case whose predicted costs are worked out below: the chosen budget
//                                      is strictly between 0 and the largest, not the no-copy one.
//   AutoDecision.PredictHandComputed   plan_auto_predict of a 2-rank case against the formula by hand.
//   AutoDecision.PredictFp8DispatchPhase  the same with a dispatch-phase entry price (FP8 rows), and 0 = entry_ps.
//   AutoModel.Fp8Coefficients          make_auto_cost_model_fp8 against the bf16 model term by term (MoonEP layer).
//   AutoDecision.Fp8ModelCopiesLess    over a skew sweep at MoonEP the FP8 model never copies more than the bf16 one,
//                                      and keeps the no-copy budget at 5% where bf16 copies; every plan validates.
//   AutoDecision.SlackTargetsClosedForm  plan_slack_targets' closed form (plan_slack_donor_rise, _receiver_first,
//                                      _target: the GPU's warp form) equals the sequential loop, R up to 256.
//   AutoDecision.PerRankFormIsTheDecision  the decision in per-rank terms (no-copy keys, the donors' sums, rank terms
//                                      reduced by max / sum: src/cuda/device/plan_auto.cuh's steps) gives every
//                                      candidate's cost and the choice of plan_auto_predict / plan_auto_choose.
//   AutoPlans.SameAsSlackPlanner/<n>   random and lognormal routings, both modes: the auto plan equals bit for bit the
//                                      fixed-budget planner's plan at the chosen budget; the budget is the decision
//                                      function's; 0 <= budget <= largest; rows within the buffer; validate_plan and
//                                      validate_dst pass; planning twice gives the same plan.
//   AutoPlans.ValidatorChecksTheBudget a budget above the configured one (or != it under the fixed policy) reported.
//   AutoCli.*                          `plan --policy auto --json` carries slack_ppm and config.policy;
//                                      `--policy exact --slack 0.1` and `--policy slack` without --slack exit 2 with
//                                      one line; `simulate --workload rotating --policy auto` has evenep_auto.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"
#include "common/plan_testing.hpp"
#include "evenep/detail/plan_auto.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace evenep {
namespace {

Config auto_config(Config cfg, double max_slack) {
    cfg.slack = max_slack;
    cfg.policy = PlannerPolicy::kAuto;
    return cfg;
}

// tpe of a routing where rank r's experts together receive load[r] entries (spread over its experts and over the
// source ranks as evenly as possible), s = S on every rank (row sums <= N/R + E: the configs leave that headroom).
struct Built {
    std::vector<int32_t> tpe, s;
};
Built with_loads(const Config& cfg, const std::vector<int64_t>& load) {
    Built b;
    b.tpe.assign(static_cast<size_t>(cfg.R) * cfg.E, 0);
    b.s.assign(cfg.R, cfg.S);
    const int epn = cfg.epn();
    for (int r = 0; r < cfg.R; ++r)
        for (int g = 0; g < epn; ++g) {
            const int e = r * epn + g;
            const int64_t c = load[r] / epn + (g < load[r] % epn ? 1 : 0);
            for (int src = 0; src < cfg.R; ++src)
                b.tpe[static_cast<size_t>(src) * cfg.E + e] =
                    static_cast<int32_t>(c / cfg.R + ((src + e) % cfg.R < c % cfg.R ? 1 : 0));
        }
    return b;
}

// The budget the decision function picks for a plan's loads (the same call the planner makes).
int32_t decide(const Planner& planner, const Plan& p) {
    const Config& c = planner.config();
    const detail::PlanDims d{c.R,  c.E,  c.epn(),       c.num_groups(), c.num_slots(),
                             c.tp, true, c.slack_ppm(), true,           planner.auto_model()};
    std::vector<int32_t> q(c.R), work(detail::plan_auto_work_size(c.R));  // (the planner's statistics, recomputed)
    const int64_t n = p.total_entries();
    for (int r = 0; r < c.R; ++r) q[r] = detail::plan_even_quota(n, c.R, r);
    return detail::plan_auto_slack_ppm(d, p.tpe.data(), p.expert_load.data(), p.load_before.data(), q.data(),
                                       work.data());
}

// The MoonEP shape with S·K = 67584 >= the mean 65536 + E: the hand-built loads below sum to 8 x 65536.
const Config kMoonEp{.R = 8, .E = 384, .K = 8, .S = 8448};

TEST(AutoDecision, Candidates) {
    const Config cfg = auto_config(kMoonEp, 0.1);
    const detail::PlanDims d{cfg.R, cfg.E, cfg.epn(), cfg.num_groups(), cfg.num_slots(), cfg.tp, true, 100000, true};
    const int64_t mean = 65536;
    for (double skew : {0.0, 0.005, 0.05, 0.099, 0.2, 2.0}) {
        std::vector<int64_t> load(8, mean - static_cast<int64_t>(skew * mean) / 7);
        load[0] = mean + static_cast<int64_t>(skew * mean);
        load[7] = 8 * mean - load[0] - 6 * load[1];  // total 8 x mean: every quota is the mean
        std::vector<int32_t> q(8, static_cast<int32_t>(mean));
        int32_t ppm[detail::kAutoMaxCandidates];
        const int n = detail::plan_auto_candidates(d, load.data(), q.data(), ppm);
        ASSERT_GE(n, 1);
        EXPECT_EQ(ppm[0], 0);
        EXPECT_EQ(ppm[n - 1], 100000) << skew;
        for (int i = 1; i < n; ++i) EXPECT_LT(ppm[i - 1], ppm[i]);
        const int64_t nc = detail::plan_auto_no_copy_ppm(8, load.data(), q.data());
        EXPECT_EQ(std::count(ppm, ppm + n, nc) == 1, nc <= 100000) << skew;
        // The no-copy budget's plan (fixed policy, that budget) has no copy.
        if (nc <= 1000000) {
            const Built b = with_loads(kMoonEp, load);
            Config fixed = kMoonEp;
            fixed.slack = static_cast<double>(nc) * 1e-6;
            const Plan p = make_plan(fixed, PlannerMode::kOptimized, b.tpe, b.s);
            EXPECT_EQ(p.cost.total_copies, 0) << skew;
            EXPECT_EQ(p.slack_ppm, nc);
        }
    }
}

TEST(AutoDecision, BalancedIsExact) {
    const Config cfg = auto_config(kMoonEp, 0.1);
    const Built b = with_loads(cfg, std::vector<int64_t>(8, 65536));
    const Plan p = make_plan(cfg, PlannerMode::kOptimized, b.tpe, b.s);
    EXPECT_EQ(p.slack_ppm, 0);
    EXPECT_EQ(p.cost.total_copies, 0);
}

TEST(AutoDecision, MildSkewNoCopies) {
    const Config cfg = auto_config(kMoonEp, 0.1);
    std::vector<int64_t> load{66000, 65000, 65536, 66100, 64972, 65536, 65800, 65344};  // sum 8 x 65536, max +0.86%
    const Built b = with_loads(cfg, load);
    Planner planner(cfg, PlannerMode::kOptimized);
    Plan p;
    planner.plan(b.tpe, b.s, p);
    std::vector<int32_t> q(8, 65536);
    EXPECT_EQ(p.slack_ppm, detail::plan_auto_no_copy_ppm(8, load.data(), q.data()));
    EXPECT_GT(p.slack_ppm, 0);
    EXPECT_EQ(p.cost.total_copies, 0);
    // Exact balance would have copied.
    EXPECT_GT(make_plan(kMoonEp, PlannerMode::kOptimized, b.tpe, b.s).cost.total_copies, 0);
}

TEST(AutoDecision, StrongSkewCopies) {
    const Config cfg = auto_config(kMoonEp, 0.1);
    std::vector<int64_t> load(8, 65536 * 5 / 7);
    load[0] = 3 * 65536;
    int64_t rest = 8 * 65536 - load[0] - 6 * load[1];
    load[7] = rest;
    const Built b = with_loads(cfg, load);
    Planner planner(cfg, PlannerMode::kOptimized);
    Plan p;
    planner.plan(b.tpe, b.s, p);
    EXPECT_LE(p.slack_ppm, cfg.slack_ppm());
    EXPECT_GT(p.cost.total_copies, 0);
    EXPECT_TRUE(validate_plan(p).ok()) << validate_plan(p).summary();
}

// R = 3, epn = 4, N = 300 (q = 100): rank 0 holds 150 entries (3 experts of 50), rank 1 95, rank 2 55. Largest
// budget 0.2 (the no-copy budget 0.5 is out of reach). Model: row 1 ps, plan 100 ps per copy, nothing else. Piece
// P = 50 (rank 0's mean and largest expert). Budget 0: targets 100/100/100, receivers get 1 + 1 copies: 2·100 + 100 = 300. 0.05: cap 105,
// rank 1 (deficit 5) needs nothing, rank 2 one copy: 100 + 105 = 205. 0.1: 100 + 110 = 210; 0.2: 100 + 120 = 220.
TEST(AutoDecision, SlackWins) {
    const Config cfg = auto_config(Config{.R = 3, .E = 12, .K = 1, .S = 100, .tp = 1}, 0.2);
    Built b;
    b.tpe.assign(36, 0);
    b.s.assign(3, 100);
    // Rank 0's experts 0..2 get 50 each, rank 1's expert 4 95, rank 2's expert 8 55; every source row sums to 100.
    b.tpe[1 * 12 + 0] = 50, b.tpe[2 * 12 + 1] = 50, b.tpe[2 * 12 + 2] = 5, b.tpe[0 * 12 + 2] = 45;
    b.tpe[0 * 12 + 4] = 55, b.tpe[1 * 12 + 4] = 40, b.tpe[1 * 12 + 8] = 10, b.tpe[2 * 12 + 8] = 45;
    Planner planner(cfg, PlannerMode::kOptimized);
    detail::AutoCostModel m;
    m.row_ps = 1;
    m.plan_copy_ps = 100;
    planner.set_auto_model(m);
    Plan p;
    planner.plan(b.tpe, b.s, p);
    ASSERT_EQ(p.load_before[0], 150);
    ASSERT_EQ(p.load_before[1], 95);
    ASSERT_EQ(p.load_before[2], 55);
    EXPECT_EQ(p.slack_ppm, 50000);
    EXPECT_EQ(p.q[0], 105);
    EXPECT_EQ(p.q[1], 95);
    EXPECT_EQ(p.q[2], 100);
    EXPECT_TRUE(validate_plan(p).ok()) << validate_plan(p).summary();
}

TEST(AutoDecision, PredictHandComputed) {
    // R = 2, epn = 2. Loads 120 / 80 (q 100 each); rank 0: 2 non-empty experts (the larger 70), own 30, src 100;
    // rank 1: 1 (80), own 20, src 100.
    detail::PlanDims d{2, 4, 2, 4, 2, 1, true, 0, true};
    d.auto_model = detail::AutoCostModel{10, 1000, 7, 300, 600, 50};
    const int64_t load[2] = {120, 80};
    const int32_t q[2] = {100, 100}, nonzero[2] = {2, 1}, own[2] = {30, 20}, src[2] = {100, 100}, top[2] = {70, 80};
    const detail::AutoRankView v{load, q, nonzero, own, src, top};
    const int64_t piece = detail::plan_auto_piece(2, v);
    EXPECT_EQ(piece, 65);  // rank 0 the only donor: (its mean 120 / 2 + its largest 70) / 2
    int32_t t[2];
    // Budget 0: t = 100 / 100; rank 1 gets ⌈20/65⌉ = 1 copy, rank 0 pushes 1. compute max(10·100 + 1000·2,
    // 10·100 + 1000·2) = 3000; tokens max(100-30, 100-30, 100-20, 100-20) = 80 -> 560 ps a phase; copy 1:
    // prefetch 300 < 560; step = 50·1 + 560 + 3000 + 3·560 + 600 = 5890.
    EXPECT_EQ(detail::plan_auto_predict(d, v, piece, 0, t), 5890);
    EXPECT_EQ(t[0], 100);
    // Budget 0.2: t = 120 / 80, no copy: compute max(10·120 + 2000, 10·80 + 1000) = 3200; tokens max(70, 90, 80, 60)
    // = 90 -> 630; step = 630 + 3200 + 1890 = 5720.
    EXPECT_EQ(detail::plan_auto_predict(d, v, piece, 200000, t), 5720);
    EXPECT_EQ(t[0], 120);
    EXPECT_EQ(t[1], 80);
}

// The same case with FP8 dispatch rows: the dispatch phase (the one the prefetch overlaps) prices an entry at
// dispatch_entry_ps, the other three phases at entry_ps; 0 keeps entry_ps (the case above).
TEST(AutoDecision, PredictFp8DispatchPhase) {
    detail::PlanDims d{2, 4, 2, 4, 2, 1, true, 0, true};
    d.auto_model = detail::AutoCostModel{10, 1000, 7, 300, 600, 50, 2};
    const int64_t load[2] = {120, 80};
    const int32_t q[2] = {100, 100}, nonzero[2] = {2, 1}, own[2] = {30, 20}, src[2] = {100, 100}, top[2] = {70, 80};
    const detail::AutoRankView v{load, q, nonzero, own, src, top};
    const int64_t piece = detail::plan_auto_piece(2, v);
    int32_t t[2];
    // Budget 0: tokens 80, dispatch 80·2 = 160 < prefetch 300: step = 50 + 300 + 3000 + 3·560 + 600 = 5630.
    EXPECT_EQ(detail::plan_auto_predict(d, v, piece, 0, t), 5630);
    // Budget 0.2: tokens 90, no copy: step = 180 + 3200 + 3·630 = 5270.
    EXPECT_EQ(detail::plan_auto_predict(d, v, piece, 200000, t), 5270);
    d.auto_model.dispatch_entry_ps = 0;
    EXPECT_EQ(detail::plan_auto_predict(d, v, piece, 0, t), 5890);
}

// make_auto_cost_model_fp8 at the MoonEP layer against the bf16 model: the forward and dgrad (2/3 of the flops) at
// kAutoFp8GemmSpeedup x, the wgrad (and its tile overhead) bf16; dispatch rows of H + H/32 bytes, the other phases
// bf16; copies of 3·H·H'·(1 + 1/4096) bytes; fp32 gradients; plan time unchanged.
TEST(AutoModel, Fp8Coefficients) {
    const int H = 7168, F = 2048, tp = 128;
    const detail::AutoCostModel b = detail::make_auto_cost_model(H, F, tp);
    const detail::AutoCostModel f = detail::make_auto_cost_model_fp8(H, F, tp);
    const double s = detail::kAutoFp8GemmSpeedup;
    EXPECT_EQ(b.dispatch_entry_ps, 0);  // bf16: the dispatch phase prices entries at entry_ps
    EXPECT_NEAR(static_cast<double>(f.row_ps), b.row_ps * (2.0 / 3.0 / s + 1.0 / 3.0), 1.0);
    EXPECT_LT(f.row_ps, b.row_ps);
    EXPECT_EQ(f.entry_ps, b.entry_ps);
    EXPECT_NEAR(static_cast<double>(f.dispatch_entry_ps), b.entry_ps * 33.0 / 64.0, 1.0);
    EXPECT_NEAR(static_cast<double>(f.weight_ps), b.weight_ps * 0.5 * (1.0 + 1.0 / 4096.0), 1.0);
    EXPECT_EQ(f.grad_ps, b.grad_ps);
    EXPECT_EQ(f.plan_copy_ps, b.plan_copy_ps);
    // group_ps = the wgrad tile overhead (unchanged) + half a tile of padding rows at the row cost (the integer
    // row_ps are each rounded, hence up to a picosecond a padding row)
    EXPECT_NEAR(static_cast<double>(b.group_ps - f.group_ps), (b.row_ps - f.row_ps) * (tp - 1) / 2.0,
                (tp - 1) / 2.0 + 1.0);
    // the speedup 1 gives the bf16 GEMM terms back
    const detail::AutoCostModel one = detail::make_auto_cost_model_fp8(H, F, tp, detail::kAutoGemmTflops, 1.0);
    EXPECT_EQ(one.row_ps, b.row_ps);
    EXPECT_EQ(one.group_ps, b.group_ps);
}

// The FP8 layer's model at the MoonEP shape, rank 0 above the mean by `skew` (the others below it evenly): a copy's
// prefetch is cheaper but hides under the dispatch either way, its gradient return and wgrad tiles cost what they did,
// and the imbalance it removes costs 0.79x as much, so the FP8 model never copies more than the bf16 one over the
// sweep, and at 5% it keeps the no-copy budget where the bf16 model copies (the planner's sweep of 2026-12-07).
TEST(AutoDecision, Fp8ModelCopiesLess) {
    const Config cfg = auto_config(kMoonEp, 0.1);
    const int64_t mean = 65536;
    bool differs = false;
    for (int bp = 50; bp <= 800; bp += 25) {
        const double skew = bp * 1e-4;
        std::vector<int64_t> load(8, mean - static_cast<int64_t>(skew * mean) / 7);
        load[0] = mean + static_cast<int64_t>(skew * mean);
        load[7] = 8 * mean - load[0] - 6 * load[1];
        const Built b = with_loads(cfg, load);
        Plan p[2];
        for (int fp8 = 0; fp8 < 2; ++fp8) {
            Planner planner(cfg, PlannerMode::kOptimized);
            planner.set_auto_model(fp8 ? detail::make_auto_cost_model_fp8(7168, 2048, 128)
                                       : detail::make_auto_cost_model(7168, 2048, 128));
            planner.plan(b.tpe, b.s, p[fp8]);
            EXPECT_TRUE(validate_plan(p[fp8]).ok()) << skew << " " << validate_plan(p[fp8]).summary();
        }
        EXPECT_LE(p[1].cost.total_copies, p[0].cost.total_copies) << skew;
        std::vector<int32_t> q(8, static_cast<int32_t>(mean));
        if (bp == 500) {
            EXPECT_GT(p[0].cost.total_copies, 0);
            EXPECT_EQ(p[1].slack_ppm, detail::plan_auto_no_copy_ppm(8, load.data(), q.data()));
            EXPECT_EQ(p[1].cost.total_copies, 0);
        }
        differs = differs || p[0].slack_ppm != p[1].slack_ppm;
    }
    EXPECT_TRUE(differs);
}

// ---- the per-rank form (the GPU's warp-parallel decision, src/cuda/device/plan_auto.cuh) -------------------------

// plan_slack_targets in closed form, rank by rank, as the GPU warp computes it: each receiver's `before` summed over
// the ranks ahead of it, the donors' total rise, then plan_slack_target.
std::vector<int32_t> closed_form_targets(int R, const std::vector<int64_t>& load, const std::vector<int32_t>& q,
                                         int32_t ppm) {
    int64_t extra = 0;
    for (int r = 0; r < R; ++r) extra += detail::plan_slack_donor_rise(load[r], q[r], ppm);
    std::vector<int32_t> t(R);
    for (int r = 0; r < R; ++r) {
        const int64_t def_r = q[r] > load[r] ? q[r] - load[r] : 0;
        int64_t before = 0;
        for (int s = 0; s < R; ++s) {
            const int64_t def_s = q[s] > load[s] ? q[s] - load[s] : 0;
            if (def_s > 0 && detail::plan_slack_receiver_first(def_s, s, def_r, r)) before += def_s;
        }
        t[r] = detail::plan_slack_target(load[r], q[r], ppm, extra, before);
    }
    return t;
}

// Random loads over R ranks (zero loads, a few heavy ranks) with their even quotas.
void random_loads(testing::TestRng& rng, int R, std::vector<int64_t>& load, std::vector<int32_t>& q) {
    load.assign(R, 0);
    q.assign(R, 0);
    int64_t n = 0;
    const int scale = rng.chance(0.2) ? 3 : rng.between(10, 100000);
    for (int r = 0; r < R; ++r) n += load[r] = rng.chance(0.15) ? 0 : rng.between(0, scale) * (rng.chance(0.1) ? 5 : 1);
    for (int r = 0; r < R; ++r) q[r] = detail::plan_even_quota(n, R, r);
}

TEST(AutoDecision, SlackTargetsClosedForm) {
    testing::TestRng rng(20261206);
    for (int round = 0; round < 3000; ++round) {
        const int R = round % 10 == 0 ? rng.between(33, 256) : rng.between(1, 40);
        const int32_t ppm = round % 9 == 0 ? 0 : rng.chance(0.5) ? rng.between(1, 200000) : rng.between(1, 1000000);
        std::vector<int64_t> load;
        std::vector<int32_t> q;
        random_loads(rng, R, load, q);
        std::vector<int32_t> t = q;
        const detail::PlanDims d{R, R, 1, 2, 1, 1, true, ppm};
        detail::plan_slack_targets(d, load.data(), t.data());
        EXPECT_EQ(closed_form_targets(R, load, q, ppm), t) << "round " << round << " R " << R << " ppm " << ppm;
    }
}

// The decision in the per-rank form of plan_auto.cuh: keys, the donors' sums, every candidate's rank terms reduced by
// max / sum. Returns the chosen budget; cost: each candidate's predicted step.
int32_t decide_per_rank(const detail::PlanDims& d, const std::vector<int64_t>& load, const std::vector<int32_t>& q,
                        const detail::AutoRankView& v, std::vector<int64_t>& cost) {
    const int R = d.R;
    const int32_t mx = detail::plan_auto_max_ppm(d);
    uint32_t key = 0;
    int64_t entries = 0, experts = 0, top = 0;
    for (int r = 0; r < R; ++r) {
        key = std::max(key, detail::plan_auto_no_copy_key(load[r], q[r], mx));
        if (load[r] > q[r]) entries += load[r], experts += v.nonzero[r], top = std::max<int64_t>(top, v.top[r]);
    }
    int32_t ppm[detail::kAutoMaxCandidates];
    const int n = detail::plan_auto_candidate_list(mx, detail::plan_auto_no_copy_of_key(key, mx), ppm);
    const int64_t piece = detail::plan_auto_piece_of(entries, experts, top);
    cost.assign(n, 0);
    for (int c = 0; c < n; ++c) {
        const std::vector<int32_t> t = closed_form_targets(R, load, q, ppm[c]);
        int64_t compute = 0, tokens = 0, copy = 0, copies = 0;
        for (int r = 0; r < R; ++r) {
            const detail::AutoRankTerms x = detail::plan_auto_rank_terms(d, piece, load[r], t[r], v.nonzero[r],
                                                                         v.own[r], v.src[r]);
            compute = std::max(compute, x.compute), tokens = std::max(tokens, x.tokens);
            copy = std::max(copy, x.copy), copies += x.recv;
        }
        cost[c] = detail::plan_auto_step(d.auto_model, compute, tokens, copy, copies);
    }
    return ppm[detail::plan_auto_choose(cost.data(), n)];
}

TEST(AutoDecision, PerRankFormIsTheDecision) {
    testing::TestRng rng(32);
    int non_trivial = 0;
    for (int round = 0; round < 2000; ++round) {
        const int R = round % 8 == 0 ? rng.between(33, 256) : rng.between(1, 32);
        const int epn = rng.between(1, 64);
        detail::PlanDims d{R, R * epn, epn, 2 * epn, epn, 1, true, round % 11 == 0 ? 0 : rng.between(1, 1000000), true};
        d.auto_model = rng.chance(0.5) ? detail::default_auto_cost_model()
                                       : detail::make_auto_cost_model(rng.between(16, 8192), rng.between(16, 4096),
                                                                      rng.between(1, 256));
        std::vector<int64_t> load;
        std::vector<int32_t> q;
        random_loads(rng, R, load, q);
        std::vector<int32_t> nonzero(R), own(R), src(R), top(R);
        for (int r = 0; r < R; ++r) {
            nonzero[r] = load[r] == 0 ? 0 : rng.between(1, static_cast<int>(std::min<int64_t>(epn, load[r])));
            top[r] = load[r] == 0 ? 0 : static_cast<int32_t>(rng.between(1, static_cast<int>(load[r])));
            own[r] = static_cast<int32_t>(rng.between(0, static_cast<int>(load[r])));
            src[r] = own[r] + rng.between(0, 2 * static_cast<int>(q[r]) + 1);
        }
        const detail::AutoRankView v{load.data(), q.data(), nonzero.data(), own.data(), src.data(), top.data()};
        std::vector<int64_t> cost;
        const int32_t got = decide_per_rank(d, load, q, v, cost);
        // The sequential decision: candidates, piece, plan_auto_predict each, first cheapest.
        int32_t ppm[detail::kAutoMaxCandidates];
        const int n = detail::plan_auto_candidates(d, load.data(), q.data(), ppm);
        ASSERT_EQ(static_cast<int>(cost.size()), n) << round;
        const int64_t piece = detail::plan_auto_piece(R, v);
        std::vector<int32_t> t(R);
        std::vector<int64_t> want(n);
        for (int c = 0; c < n; ++c) want[c] = detail::plan_auto_predict(d, v, piece, ppm[c], t.data());
        EXPECT_EQ(cost, want) << "round " << round;
        EXPECT_EQ(got, ppm[detail::plan_auto_choose(want.data(), n)]) << "round " << round;
        non_trivial += got != 0 && got != d.slack_ppm ? 1 : 0;
    }
    EXPECT_GT(non_trivial, 0);  // the no-copy or a partial budget chosen somewhere
}

// ---- plans over a corpus ------------------------------------------------------------------------------------------

struct Shape {
    Config cfg;
    double max_slack;
};

class AutoPlans : public ::testing::TestWithParam<int> {};

TEST_P(AutoPlans, SameAsSlackPlanner) {
    const std::vector<Shape> shapes{{Config{.R = 4, .E = 16, .K = 2, .S = 64, .tp = 8}, 0.1},
                                    {Config{.R = 8, .E = 64, .K = 4, .S = 128, .tp = 16}, 0.25},
                                    {Config{.R = 3, .E = 12, .K = 3, .S = 50, .tp = 4}, 1.0},
                                    {Config{.R = 8, .E = 384, .K = 8, .S = 1024}, 0.1}};
    const Shape& sh = shapes[GetParam()];
    const Config cfg = auto_config(sh.cfg, sh.max_slack);
    int distinct_choices = 0;
    std::vector<int32_t> seen;
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference}) {
        Planner planner(cfg, mode);
        planner.set_auto_model(detail::make_auto_cost_model(256, 128, cfg.tp));
        for (uint64_t seed = 1; seed <= 12; ++seed) {
            testing::RoutingOptions ro;
            ro.skew = 0.1 * static_cast<double>(seed % 6);
            ro.mask_prob = seed % 4 == 0 ? 0.1 : 0.0;
            ro.unequal_s = seed % 5 == 0;
            const Routing routing =
                seed % 3 == 0
                    ? make_target_maxvio(RoutingSpec{.R = cfg.R, .E = cfg.E, .K = cfg.K, .S = cfg.S, .seed = seed},
                                         0.05 * static_cast<double>(seed))
                    : testing::random_routing(cfg, seed, ro);
            const std::vector<int32_t> tpe = routing.tpe();
            const std::string what = "shape " + std::to_string(GetParam()) + " seed " + std::to_string(seed) + " " +
                                     std::string(to_string(mode));
            Plan p, again;
            planner.plan(tpe, routing.s, p);
            planner.plan(tpe, routing.s, again);
            EXPECT_EQ(testing::plan_diff(p, again), "") << what;
            EXPECT_EQ(p.slack_ppm, again.slack_ppm) << what;
            EXPECT_GE(p.slack_ppm, 0) << what;
            EXPECT_LE(p.slack_ppm, cfg.slack_ppm()) << what;
            EXPECT_EQ(p.slack_ppm, decide(planner, p)) << what;
            if (std::find(seen.begin(), seen.end(), p.slack_ppm) == seen.end()) seen.push_back(p.slack_ppm);
            // The same plan as the fixed-budget planner at the chosen budget.
            Config fixed = sh.cfg;
            fixed.slack = static_cast<double>(p.slack_ppm) * 1e-6;
            ASSERT_EQ(fixed.slack_ppm(), p.slack_ppm);
            Plan f = make_plan(fixed, mode, tpe, routing.s);
            f.cfg = p.cfg;  // the configurations differ in policy and largest budget only
            EXPECT_EQ(testing::plan_diff(p, f), "") << what;
            for (int r = 0; r < cfg.R; ++r) EXPECT_LE(p.rows_used(r), cfg.recv_rows()) << what << " rank " << r;
            const ValidationReport rep = validate_plan(p);
            EXPECT_TRUE(rep.ok()) << what << "\n" << rep.summary();
            const ValidationReport rd = validate_dst(p, routing, testing::all_dst(p, routing));
            EXPECT_TRUE(rd.ok()) << what << "\n" << rd.summary();
        }
    }
    distinct_choices = static_cast<int>(seen.size());
    EXPECT_GE(distinct_choices, 1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AutoPlans, ::testing::Range(0, 4), [](const ::testing::TestParamInfo<int>& i) {
    return "shape" + std::to_string(i.param);
});

TEST(AutoPlansValidator, ChecksTheBudget) {
    const Config cfg = auto_config(Config{.R = 4, .E = 16, .K = 2, .S = 64, .tp = 8}, 0.1);
    const Routing routing = testing::random_routing(cfg, 3, testing::RoutingOptions{.skew = 1.0});
    Plan p = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
    ASSERT_TRUE(validate_plan(p).ok());
    p.slack_ppm = cfg.slack_ppm() + 1;
    const ValidationReport rep = validate_plan(p);
    EXPECT_FALSE(rep.ok());
    EXPECT_NE(rep.summary().find("slack_ppm"), std::string::npos) << rep.summary();
    // Under the fixed policy the plan's budget is the configured one.
    Config fixed = cfg;
    fixed.policy = PlannerPolicy::kFixed;
    Plan f = make_plan(fixed, PlannerMode::kOptimized, routing.tpe(), routing.s);
    EXPECT_EQ(f.slack_ppm, fixed.slack_ppm());
    f.slack_ppm = 0;
    EXPECT_FALSE(validate_plan(f).ok());
}

// ---- CLI ----------------------------------------------------------------------------------------------------------

TEST(AutoCli, PlanJsonCarriesTheBudget) {
    const auto dir = testing::temp_dir("auto_cli", "plan");
    const std::string path = (dir / "plan.json").string();
    const testing::CliRun run =
        testing::run_cli("plan --R 4 --E 16 --K 2 --S 64 --maxvio 0.5 --policy auto --check --json " + path);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("policy auto: this step's budget"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("check: OK"), std::string::npos) << run.output;
    std::ifstream f(path);
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("config").at("policy"), "auto");
    EXPECT_DOUBLE_EQ(j.at("config").at("slack").get<double>(), kAutoDefaultSlack);
    const int64_t ppm = j.at("slack_ppm").get<int64_t>();
    EXPECT_GE(ppm, 0);
    EXPECT_LE(ppm, 100000);
}

TEST(AutoCli, BadPolicyExitsTwoWithOneLine) {
    for (const std::string args : {"--policy exact --slack 0.1", "--policy slack", "--policy fastest"}) {
        for (const std::string cmd : {"plan --R 4 --E 16 --K 2 --S 64 ", "simulate --quick "}) {
            const testing::CliRun run = testing::run_cli(cmd + args, /*merge_stderr=*/false, 60);
            EXPECT_EQ(run.exit_code, 2) << cmd << args << "\n" << run.output << run.error;
            EXPECT_NE(run.error.find("--policy"), std::string::npos) << run.error;
            EXPECT_EQ(std::count(run.error.begin(), run.error.end(), '\n'), 1) << run.error;
        }
    }
    const testing::CliRun run =
        testing::run_cli("simulate --workload balanced --R 4 --E 16 --K 2 --S 64 --steps 2 --policy exact", false, 60);
    EXPECT_EQ(run.exit_code, 2) << run.output << run.error;
    EXPECT_NE(run.error.find("--policy"), std::string::npos) << run.error;
}

TEST(AutoCli, SimulateWorkloadHasEvenepAuto) {
    const auto dir = testing::temp_dir("auto_cli", "simulate");
    const std::string path = (dir / "run.json").string();
    const testing::CliRun run = testing::run_cli(
        "simulate --workload rotating --R 4 --E 16 --K 2 --S 64 --H 64 --ffn-hidden 64 --steps 4 --policy auto "
        "--slack 0.2 --json " +
            path,
        true, 120);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("evenep_auto"), std::string::npos) << run.output;
    std::ifstream f(path);
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("schema"), "evenep.workload_run/1");
    const nlohmann::json& sys = j.at("systems");
    ASSERT_GE(sys.size(), 2u);
    EXPECT_EQ(sys[0].at("name"), "evenep_auto");
    EXPECT_EQ(sys[1].at("name"), "evenep_exact");
    EXPECT_EQ(sys[0].at("step_ms").size(), 4u);
    EXPECT_EQ(sys[0].at("slack_ppm").size(), 4u);
    EXPECT_DOUBLE_EQ(sys[0].at("params").at("max_slack").get<double>(), 0.2);
    for (const auto& v : sys[0].at("slack_ppm")) EXPECT_LE(v.get<double>(), 200000.0);
}

}  // namespace
}  // namespace evenep
