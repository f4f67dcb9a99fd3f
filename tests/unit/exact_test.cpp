// The exact optimum (MILP, CBC) of the planning problem and `evenep quality` (SPEC §3.5).
//
// Cases:
//   Exact.Theorem2SeedExample        E=8, R=4, S*K=6, rank 0's experts idle: copies optimum 3 and busiest-rank
//                                    traffic optimum 2 (rank 0 needs >= 2 remote experts, hand-derived plans
//                                    reach both), proved optimal.
//   Exact.Theorem2WholeExperts       R=8, E=64, S=7, K=8: every other expert has 8 entries, rank 0 needs 56:
//                                    optimum 7 copies and traffic 7 (= Theorem 2's bound), one whole expert
//                                    from each rank.
//   Exact.Theorem2BoundHolds         theorem2 routings at several (R, E): both optima >= ceil(E(R-1)/R^2).
//   Exact.BalancedInputNeedsNoCopy   round-robin and a hand-balanced skewed histogram: 0 copies, 0 traffic;
//                                    all-remote balanced routing: 0 copies and every entry crosses.
//   Exact.LocalityKeepsEntries       one copy whose entries are the receiver's own: 0 crossing rows.
//   Exact.BadInput                   R > 8, E > 64, B < epn, wrong sizes, negative tpe, rows above s*K, time
//                                    limit <= 0 -> evenep::Error naming the value.
//   Exact.WithoutSolverThrows        (only in a build without CBC) solve_exact throws, available() is false.
//   ExactCorpus/ExactVsPlanners.*    31 generated instances (R in {2,4,8}, lognormal skews and adversarial
//                                    kinds, fixed seeds in the names): proved optimal, and optimum <= optimized
//                                    <= reference on total copies and on busiest-rank traffic; the secondary
//                                    costs are consistent with the lexicographic order.
//   QualityCli.QuickPasses           `evenep quality --quick --json F`: exit 0, the summary and PASS lines, the
//                                    JSON holds cases and summary. Skipped without the binary or the solver.
//   QualityCli.BadFlagExitsTwo       --cases 0 and --time-limit 0 exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_run.hpp"
#include "evenep/error.hpp"
#include "evenep/exact.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;

// Every primary objective here is proved in well under a second on one core; the limit bounds the secondary
// stage (a quarter of it), which the tests do not need proved.
inline constexpr double kTimeLimit = 8.0;

Config config_of(int R, int E, int K, int S) { return Config{.R = R, .E = E, .K = K, .S = S, .B = -1, .tp = 1}; }

#define EVENEP_REQUIRE_SOLVER() \
    if (!exact_solver_available()) GTEST_SKIP() << "built without CBC: no exact solver"

// E=8, R=4, S=3, K=2: every rank routes one entry to each of experts 2..7 (the SPEC's seed example).
std::vector<int32_t> theorem2_seed_tpe() {
    std::vector<int32_t> tpe(4 * 8, 0);
    for (int r = 0; r < 4; ++r)
        for (int e = 2; e < 8; ++e) tpe[r * 8 + e] = 1;
    return tpe;
}

TEST(Exact, Theorem2SeedExample) {
    EVENEP_REQUIRE_SOLVER();
    const Config cfg = config_of(4, 8, 2, 3);
    const std::vector<int32_t> tpe = theorem2_seed_tpe(), s(4, 3);
    // Loads: rank 0 has 0, ranks 1..3 have 8; q = 6. Rank 0 needs 6 entries from experts of 4 entries: >= 2
    // remote experts (Theorem 2: ceil(8*3/16) = 2). Each donor must hand out exactly 2 entries, so all three
    // donors need a copy out: with only two copies one donor keeps 8. Three copies suffice (2 from each donor
    // to rank 0), so the copies optimum is 3.
    const ExactResult copies = solve_exact(cfg, tpe, s, ExactObjective::kTotalCopies, kTimeLimit);
    EXPECT_TRUE(copies.optimal);
    EXPECT_EQ(copies.total_copies, 3);
    EXPECT_EQ(copies.objective, 3);
    // Traffic: rank 0 receives >= 2, so >= 2. Plan with 2: rank 0 takes all 4 of expert 2 (rank 1) and 2 of
    // expert 4 (rank 2); rank 1 takes 2 of expert 6 (rank 3). Per rank received + pushed: 2, 2, 1, 1.
    const ExactResult traffic = solve_exact(cfg, tpe, s, ExactObjective::kMaxRankCopyTraffic, kTimeLimit);
    EXPECT_TRUE(traffic.optimal);
    EXPECT_EQ(traffic.max_rank_copy_traffic, 2);
    EXPECT_EQ(traffic.objective, 2);
    EXPECT_GE(traffic.max_rank_copy_traffic, theorem2_lower_bound(8, 4));
    EXPECT_EQ(traffic.total_copies, 3);  // secondary: no 2-copy plan exists at all
    // The planners can do no better than the optimum.
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        const Plan plan = make_plan(cfg, mode, tpe, s);
        EXPECT_GE(plan.cost.total_copies, copies.total_copies) << to_string(mode);
        EXPECT_GE(plan.cost.max_rank_copy_traffic, traffic.max_rank_copy_traffic) << to_string(mode);
        EXPECT_GE(plan.remote_experts[0], 2) << to_string(mode);
    }
}

TEST(Exact, Theorem2WholeExperts) {
    EVENEP_REQUIRE_SOLVER();
    // R*S*K = 448 entries round-robin over the 56 experts of ranks 1..7: each rank routes exactly one entry to
    // each of them, T_e = 8, q = 56. Rank 0 needs 56 = 7 whole experts (>= 7 copies, and >= 7 received);
    // one whole expert from each of ranks 1..7 leaves each of them 56: 7 copies, traffic 7.
    const RoutingSpec spec{.R = 8, .E = 64, .K = 8, .S = 7, .seed = 1};
    const Routing routing = make_adversarial(spec, Adversarial::kTheorem2);
    const std::vector<int32_t> tpe = routing.tpe();
    for (int r = 0; r < 8; ++r)
        for (int e = 0; e < 64; ++e) ASSERT_EQ(tpe[r * 64 + e], e < 8 ? 0 : 1) << "rank " << r << " expert " << e;
    const Config cfg = config_of(8, 64, 8, 7);
    const ExactResult copies = solve_exact(cfg, tpe, routing.s, ExactObjective::kTotalCopies, kTimeLimit);
    EXPECT_TRUE(copies.optimal);
    EXPECT_EQ(copies.total_copies, 7);
    const ExactResult traffic = solve_exact(cfg, tpe, routing.s, ExactObjective::kMaxRankCopyTraffic, kTimeLimit);
    EXPECT_TRUE(traffic.optimal);
    EXPECT_EQ(traffic.max_rank_copy_traffic, 7);
    EXPECT_EQ(traffic.total_copies, 7);
    EXPECT_EQ(theorem2_lower_bound(64, 8), 7);
}

TEST(Exact, Theorem2BoundHolds) {
    EVENEP_REQUIRE_SOLVER();
    struct Shape {
        int R, E, K, S;
    };
    for (const Shape& sh : {Shape{4, 8, 2, 3}, Shape{4, 16, 2, 32}, Shape{8, 16, 4, 16}, Shape{8, 32, 2, 64},
                            Shape{2, 8, 4, 16}}) {
        const RoutingSpec spec{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .seed = 3};
        const Routing routing = make_adversarial(spec, Adversarial::kTheorem2);
        const std::vector<int32_t> tpe = routing.tpe();
        const Config cfg = config_of(sh.R, sh.E, sh.K, sh.S);
        const int bound = theorem2_lower_bound(sh.E, sh.R);
        const ExactResult copies = solve_exact(cfg, tpe, routing.s, ExactObjective::kTotalCopies, kTimeLimit);
        const ExactResult traffic = solve_exact(cfg, tpe, routing.s, ExactObjective::kMaxRankCopyTraffic, kTimeLimit);
        SCOPED_TRACE(cfg.to_string());
        EXPECT_TRUE(copies.optimal);
        EXPECT_TRUE(traffic.optimal);
        EXPECT_GE(copies.total_copies, bound);
        EXPECT_GE(traffic.max_rank_copy_traffic, bound);  // rank 0's received copies alone
    }
}

TEST(Exact, BalancedInputNeedsNoCopy) {
    EVENEP_REQUIRE_SOLVER();
    for (ExactObjective obj : {ExactObjective::kTotalCopies, ExactObjective::kMaxRankCopyTraffic}) {
        const Routing rr = make_round_robin(RoutingSpec{.R = 8, .E = 64, .K = 4, .S = 32, .seed = 1});
        const ExactResult a = solve_exact(config_of(8, 64, 4, 32), rr.tpe(), rr.s, obj, kTimeLimit);
        EXPECT_TRUE(a.optimal);
        EXPECT_EQ(a.total_copies, 0);
        EXPECT_EQ(a.max_rank_copy_traffic, 0);
        EXPECT_EQ(a.objective, 0);
        // Skewed inside each rank's experts, equal rank loads: T = {3, 1, 2, 2}, 4 entries homed on each rank.
        const std::vector<int32_t> tpe = {3, 0, 0, 1, 0, 1, 2, 1}, s = {4, 4};
        const ExactResult b = solve_exact(config_of(2, 4, 1, 4), tpe, s, obj, kTimeLimit);
        EXPECT_TRUE(b.optimal);
        EXPECT_EQ(b.total_copies, 0);
        EXPECT_EQ(b.max_rank_copy_traffic, 0);
        // Balanced but every entry on the other rank: nothing to copy, every entry crosses.
        const std::vector<int32_t> swap = {0, 4, 4, 0}, s4 = {4, 4};
        const ExactResult c = solve_exact(config_of(2, 2, 1, 4), swap, s4, obj, kTimeLimit);
        EXPECT_TRUE(c.optimal);
        EXPECT_EQ(c.total_copies, 0);
        EXPECT_EQ(c.crossing_rows, 8);
    }
}

TEST(Exact, LocalityKeepsEntries) {
    EVENEP_REQUIRE_SOLVER();
    // R=2, E=2: both ranks route all 4 tokens to expert 1 (home rank 1): T_1 = 8, q = 4. One copy of expert 1 on
    // rank 0 computing exactly rank 0's own 4 entries: 0 crossing rows.
    const std::vector<int32_t> tpe = {0, 4, 0, 4}, s = {4, 4};
    const ExactResult r = solve_exact(config_of(2, 2, 1, 4), tpe, s, ExactObjective::kTotalCopies, kTimeLimit);
    EXPECT_TRUE(r.optimal);
    EXPECT_EQ(r.total_copies, 1);
    EXPECT_EQ(r.max_rank_copy_traffic, 1);
    EXPECT_EQ(r.crossing_rows, 0);
}

template <typename F>
void expect_error_mentioning(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no evenep::Error (expected one mentioning '" << needle << "')";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(Exact, BadInput) {
    // Checked before the solver is needed, so these hold with and without CBC.
    const std::vector<int32_t> s16(16, 1), tpe16(16 * 16, 0);
    expect_error_mentioning([&] { solve_exact(config_of(16, 16, 1, 1), tpe16, s16, ExactObjective::kTotalCopies); },
                            "R = 16");
    const std::vector<int32_t> s8(8, 1), tpe8(8 * 128, 0);
    expect_error_mentioning([&] { solve_exact(config_of(8, 128, 1, 1), tpe8, s8, ExactObjective::kTotalCopies); },
                            "E = 128");
    Config b_small = config_of(4, 8, 2, 3);
    b_small.B = 1;
    const std::vector<int32_t> tpe = theorem2_seed_tpe(), s(4, 3);
    expect_error_mentioning([&] { solve_exact(b_small, tpe, s, ExactObjective::kTotalCopies); }, "B = 1");
    const Config cfg = config_of(4, 8, 2, 3);
    const std::vector<int32_t> short_tpe(31, 0);
    expect_error_mentioning([&] { solve_exact(cfg, short_tpe, s, ExactObjective::kTotalCopies); }, "31");
    const std::vector<int32_t> short_s(3, 3);
    expect_error_mentioning([&] { solve_exact(cfg, tpe, short_s, ExactObjective::kTotalCopies); }, "s has 3");
    std::vector<int32_t> negative = tpe;
    negative[2 * 8 + 5] = -1;
    expect_error_mentioning([&] { solve_exact(cfg, negative, s, ExactObjective::kTotalCopies); }, "rank 2");
    std::vector<int32_t> too_many = tpe;
    too_many[1 * 8 + 3] = 5;  // row sum 10 > s*K = 6
    expect_error_mentioning([&] { solve_exact(cfg, too_many, s, ExactObjective::kTotalCopies); }, "rank 1");
    const std::vector<int32_t> s_zero = {3, 0, 3, 3};
    expect_error_mentioning([&] { solve_exact(cfg, tpe, s_zero, ExactObjective::kTotalCopies); }, "s = 0");
    if (exact_solver_available())
        expect_error_mentioning([&] { solve_exact(cfg, tpe, s, ExactObjective::kTotalCopies, 0.0); }, "time limit");
}

TEST(Exact, WithoutSolverThrows) {
    if (exact_solver_available()) GTEST_SKIP() << "built with CBC";
    const std::vector<int32_t> tpe = theorem2_seed_tpe(), s(4, 3);
    EXPECT_THROW(solve_exact(config_of(4, 8, 2, 3), tpe, s, ExactObjective::kTotalCopies), Error);
}

// --- corpus: optimum <= optimized <= reference ---------------------------------------------------------------

struct CorpusCase {
    int R, E, K, S;
    double maxvio;  // >= 0: lognormal at this target
    int adversarial;  // index into all_adversarial() when maxvio < 0
    uint64_t seed;
};

std::string case_name(const CorpusCase& c);

void PrintTo(const CorpusCase& c, std::ostream* os) { *os << case_name(c); }

std::string case_name(const CorpusCase& c) {
    std::ostringstream os;
    os << "R" << c.R << "_E" << c.E << "_K" << c.K << "_S" << c.S << "_";
    if (c.maxvio >= 0)
        os << "mv" << static_cast<int>(c.maxvio * 10) << "tenths";
    else
        os << to_string(all_adversarial()[c.adversarial]);
    os << "_seed" << c.seed;
    return os.str();
}

std::vector<CorpusCase> corpus() {
    std::vector<CorpusCase> out;
    const int shapes[][4] = {{2, 8, 2, 32},  {2, 32, 4, 64},  {4, 8, 1, 64},  {4, 16, 2, 32},
                             {4, 32, 4, 16}, {8, 8, 1, 32},   {8, 16, 2, 16}, {8, 32, 2, 32}};
    const double maxvios[] = {0.3, 1.0, 4.0};
    uint64_t seed = 11;
    for (const auto& sh : shapes)
        for (double mv : maxvios) {
            out.push_back({sh[0], sh[1], sh[2], sh[3], mv, -1, seed++});
        }
    const int num_adv = static_cast<int>(all_adversarial().size());
    for (int a = 0; a < num_adv; ++a) {
        const auto& sh = shapes[(3 * a + 2) % 8];
        out.push_back({sh[0], sh[1], sh[2], sh[3], -1, a, seed++});
    }
    return out;
}

class ExactVsPlanners : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(ExactVsPlanners, OptimumBoundsPlanners) {
    EVENEP_REQUIRE_SOLVER();
    const CorpusCase& c = GetParam();
    const RoutingSpec spec{.R = c.R, .E = c.E, .K = c.K, .S = c.S, .seed = c.seed};
    const Routing routing = c.maxvio >= 0 ? make_target_maxvio(spec, c.maxvio)
                                          : make_adversarial(spec, all_adversarial()[c.adversarial]);
    const std::vector<int32_t> tpe = routing.tpe();
    const Config cfg = config_of(c.R, c.E, c.K, c.S);
    const Plan ref = make_plan(cfg, PlannerMode::kReference, tpe, routing.s);
    const Plan optd = make_plan(cfg, PlannerMode::kOptimized, tpe, routing.s);
    const ExactResult copies = solve_exact(cfg, tpe, routing.s, ExactObjective::kTotalCopies, kTimeLimit);
    const ExactResult traffic = solve_exact(cfg, tpe, routing.s, ExactObjective::kMaxRankCopyTraffic, kTimeLimit);
    EXPECT_TRUE(copies.optimal);
    EXPECT_TRUE(traffic.optimal);
    EXPECT_EQ(copies.objective, copies.total_copies);
    EXPECT_EQ(traffic.objective, traffic.max_rank_copy_traffic);
    // Total copies: optimum <= optimized <= reference.
    EXPECT_LE(copies.total_copies, optd.cost.total_copies);
    EXPECT_LE(optd.cost.total_copies, ref.cost.total_copies);
    // Busiest rank's copy traffic: optimum <= optimized <= reference.
    EXPECT_LE(traffic.max_rank_copy_traffic, optd.cost.max_rank_copy_traffic);
    EXPECT_LE(optd.cost.max_rank_copy_traffic, ref.cost.max_rank_copy_traffic);
    // Lexicographic consistency: each optimum's plan is feasible for the other objective.
    EXPECT_GE(copies.max_rank_copy_traffic, traffic.max_rank_copy_traffic);
    EXPECT_GE(traffic.total_copies, copies.total_copies);
    // Copies zero <=> traffic zero <=> already balanced.
    EXPECT_EQ(copies.total_copies == 0, traffic.max_rank_copy_traffic == 0);
    // Crossing rows: with the optimized planner's copy count equal to the optimum, the optimum keeps at least
    // as many entries on their source rank (the planner's plan is a candidate of the second stage).
    if (copies.total_copies == optd.cost.total_copies) {
        EXPECT_LE(copies.crossing_rows, optd.cost.crossing_rows);
    }
}

INSTANTIATE_TEST_SUITE_P(ExactCorpus, ExactVsPlanners, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<CorpusCase>& info) { return case_name(info.param); });

// --- the CLI --------------------------------------------------------------------------------------------------

using cli_test::CliRun;
using cli_test::run_cli;

#define EVENEP_REQUIRE_CLI()                                                                  \
    if (!fs::exists(EVENEP_CLI_PATH)) GTEST_SKIP() << "no CLI binary at " << EVENEP_CLI_PATH; \
    EVENEP_REQUIRE_SOLVER()

TEST(QualityCli, QuickPasses) {
    EVENEP_REQUIRE_CLI();
    const fs::path json = fs::temp_directory_path() / ("evenep_exact_test_" + std::to_string(getpid()) + ".json");
    const CliRun run = run_cli("quality --quick --json " + json.string());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    for (const char* line : {"summary over 12 cases", "proved optimal:", "total copies:", "busiest-rank traffic:",
                             "optimized traffic > reference traffic: 0", "planner wall time", "\nPASS: "})
        EXPECT_NE(run.output.find(line), std::string::npos) << "missing '" << line << "' in:\n" << run.output;
    std::ifstream f(json);
    ASSERT_TRUE(f.good()) << json;
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (const char* key : {"\"cases\"", "\"summary\"", "\"optimum_copies\"", "\"traffic_optimized\"", "\"pass\""})
        EXPECT_NE(text.find(key), std::string::npos) << key;
    fs::remove(json);
}

TEST(QualityCli, BadFlagExitsTwo) {
    EVENEP_REQUIRE_CLI();
    EXPECT_EQ(run_cli("quality --cases 0").exit_code, 2);
    EXPECT_EQ(run_cli("quality --quick --time-limit 0").exit_code, 2);
}

}  // namespace
}  // namespace evenep
