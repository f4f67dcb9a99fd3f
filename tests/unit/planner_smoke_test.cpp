// Smoke: a tiny plan balances exactly. (The property tests live in planner_test.cpp.)
#include <gtest/gtest.h>

#include "evenep/plan.hpp"

TEST(PlannerSmoke, TinyBalanced) {
    evenep::Config cfg{.R = 4, .E = 8, .K = 2, .S = 3, .B = -1, .tp = 1};
    // rank 0's experts (0, 1) get nothing; everything else shares evenly (Theorem 2 example).
    std::vector<int32_t> tpe(4 * 8, 0);
    for (int r = 0; r < 4; ++r)
        for (int e = 2; e < 8; ++e) tpe[r * 8 + e] = 1;
    std::vector<int32_t> s(4, 3);
    for (auto mode : {evenep::PlannerMode::kReference, evenep::PlannerMode::kOptimized}) {
        auto plan = evenep::make_plan(cfg, mode, tpe, s);
        for (int r = 0; r < 4; ++r) EXPECT_EQ(plan.q[r], 6);
        EXPECT_GE(plan.remote_experts[0], evenep::theorem2_lower_bound(8, 4));
    }
}
