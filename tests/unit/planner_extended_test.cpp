// Planner's extended candidate set (overshoot, push spreading, paths; the optimized default) against the legacy set.
// Cases, over lognormal routings of many skews and every adversarial kind on several shapes (seeds printed in names):
//   - the plan and every rank's dst pass the independent validator;
//   - never worse than the reference planner on costs 1 and 2 (SPEC §3.1);
//   - never worse than the legacy candidate set in the lexicographic cost order (it is a superset of it);
//   - the Theorem-2 instance E=8, R=4, S*K=6 still needs its 2 remote experts on rank 0.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <tuple>

#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace {

using evenep::Config;
using evenep::Plan;
using evenep::Planner;
using evenep::PlannerMode;
using evenep::Routing;

bool lex_le(const evenep::PlanCost& a, const evenep::PlanCost& b) {
    return std::tie(a.max_rank_copy_traffic, a.total_copies, a.crossing_rows) <=
           std::tie(b.max_rank_copy_traffic, b.total_copies, b.crossing_rows);
}

void check_routing(const Routing& routing, int tp, const std::string& what) {
    const Config cfg{.R = routing.R, .E = routing.E, .K = routing.K, .S = routing.S, .B = -1, .tp = tp};
    const std::vector<int32_t> tpe = routing.tpe();
    Plan ext, opt, ref;
    Planner(cfg, PlannerMode::kOptimized, true).plan(tpe, routing.s, ext);
    Planner(cfg, PlannerMode::kOptimized, false).plan(tpe, routing.s, opt);
    Planner(cfg, PlannerMode::kReference).plan(tpe, routing.s, ref);
    std::vector<std::vector<int32_t>> dst(cfg.R);
    for (int r = 0; r < cfg.R; ++r) {
        dst[r].resize(static_cast<size_t>(routing.s[r]) * cfg.K);
        evenep::compute_dst(ext, r, routing.topk_idx[r], dst[r]);
    }
    const auto report = evenep::validate_dst(ext, routing, dst);
    ASSERT_TRUE(report.ok()) << what << "\n" << report.summary();
    EXPECT_LE(ext.cost.max_rank_copy_traffic, ref.cost.max_rank_copy_traffic) << what;
    EXPECT_LE(ext.cost.total_copies, ref.cost.total_copies) << what;
    EXPECT_TRUE(lex_le(ext.cost, opt.cost)) << what << ": extended (" << ext.cost.max_rank_copy_traffic << ", "
                                            << ext.cost.total_copies << ") vs legacy (" << opt.cost.max_rank_copy_traffic
                                            << ", " << opt.cost.total_copies << ")";
}

struct Shape {
    int R, E, K, S;
};

class ExtendedCandidates : public ::testing::TestWithParam<Shape> {};

TEST_P(ExtendedCandidates, ValidAndNeverWorse) {
    const Shape sh = GetParam();
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        const evenep::RoutingSpec spec{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .seed = seed};
        for (double sigma : {0.05, 0.3, 1.0, 2.0, 3.5})
            check_routing(evenep::make_lognormal(spec, sigma), 1 + static_cast<int>(seed % 3) * 63,
                          (std::ostringstream() << "lognormal sigma " << sigma << " seed " << seed).str());
        for (evenep::Adversarial a : evenep::all_adversarial())
            check_routing(evenep::make_adversarial(spec, a), 4,
                          (std::ostringstream() << evenep::to_string(a) << " seed " << seed).str());
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExtendedCandidates,
                         ::testing::Values(Shape{2, 8, 2, 64}, Shape{4, 16, 4, 64}, Shape{8, 16, 1, 64},
                                           Shape{8, 64, 4, 32}, Shape{8, 64, 8, 16}, Shape{16, 64, 6, 32},
                                           Shape{8, 384, 8, 128}),
                         [](const auto& info) {
                             const Shape s = info.param;
                             std::ostringstream os;  // (GCC 12 warns falsely on chained std::string +)
                             os << "R" << s.R << "_E" << s.E << "_K" << s.K << "_S" << s.S;
                             return os.str();
                         });

TEST(ExtendedCandidatesTheorem2, SeedExampleNeedsTwo) {
    const Config cfg{.R = 4, .E = 8, .K = 2, .S = 3, .B = -1, .tp = 1};
    std::vector<int32_t> tpe(4 * 8, 0);
    for (int r = 0; r < 4; ++r)
        for (int e = 2; e < 8; ++e) tpe[r * 8 + e] = 1;
    Plan plan;
    Planner(cfg, PlannerMode::kOptimized, true).plan(tpe, std::vector<int32_t>(4, 3), plan);
    EXPECT_EQ(plan.remote_experts[0], 2);
    EXPECT_TRUE(evenep::validate_plan(plan).ok());
}

}  // namespace
