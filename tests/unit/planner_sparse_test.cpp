// The sparse form of an alloc matrix (evenep/detail/plan_sparse.hpp) against plan_core.hpp's dense code, on every
// alloc matrix the planner builds (the reference split and the six optimized-mode candidates) over lognormal and
// adversarial routings of several shapes, training (B = epn) and inference (B < epn) slots, with and without
// locality:
//   - plan_sparse_cost returns plan_cost_of's four values and its verdict (the GPU block planner ranks candidates
//     with it);
//   - plan_route_entry gives plan_finalize's local_keep, rest_prefix and cap_prefix at every (e, r) of the plan;
//   - pieces in any order give the same costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "evenep/detail/ep_layout.hpp"
#include "evenep/detail/plan_candidates.hpp"
#include "evenep/detail/plan_sparse.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace {

namespace d = evenep::detail;

struct Sparse {
    std::vector<int32_t> home_rem, at, amount;
    d::SparseAlloc view() const { return d::SparseAlloc{home_rem.data(), at.data(), amount.data(), static_cast<int>(at.size())}; }
};

Sparse to_sparse(const d::PlanDims& dims, const int32_t* alloc) {
    Sparse s;
    s.home_rem.resize(dims.E);
    for (int e = 0; e < dims.E; ++e)
        for (int r = 0; r < dims.R; ++r) {
            const int32_t a = alloc[static_cast<int64_t>(e) * dims.R + r];
            if (r == e / dims.epn) {
                s.home_rem[e] = a;
            } else if (a > 0) {
                s.at.push_back(e * dims.R + r);
                s.amount.push_back(a);
            }
        }
    return s;
}

struct ColPrefix {
    const std::vector<int32_t>* tpe;
    int R, E;
    int32_t operator()(int e, int r) const {
        int32_t p = 0;
        for (int q = 0; q < r; ++q) p += (*tpe)[static_cast<size_t>(q) * E + e];
        return p;
    }
};

void expect_same_cost(const d::PlanDims& dims, const std::vector<int32_t>& tpe, const int32_t* alloc,
                      int64_t base_crossing, const std::string& what) {
    // The GPU planner sizes every piece list by PlanScratchLayout::piece_cap (E + 3R).
    EXPECT_LE(to_sparse(dims, alloc).at.size(), evenep::cuda::PlanScratchLayout::make(dims.R, dims.E).piece_cap) << what;
    std::vector<int32_t> w1(dims.R), w2(dims.R), w3(dims.R);
    d::PlanCostValues dense{}, sparse{};
    const bool ok_dense = d::plan_cost_of(dims, tpe.data(), alloc, w1.data(), w2.data(), w3.data(), dense);
    Sparse s = to_sparse(dims, alloc);
    const ColPrefix cp{&tpe, dims.R, dims.E};
    const bool ok_sparse =
        d::plan_sparse_cost(dims, tpe.data(), s.view(), cp, base_crossing, w1.data(), w2.data(), w3.data(), sparse);
    ASSERT_EQ(ok_dense, ok_sparse) << what;
    EXPECT_EQ(dense.max_rank_copy_traffic, sparse.max_rank_copy_traffic) << what;
    EXPECT_EQ(dense.total_copies, sparse.total_copies) << what;
    EXPECT_EQ(dense.crossing_rows, sparse.crossing_rows) << what;
    EXPECT_EQ(dense.moved_entries, sparse.moved_entries) << what;
    // Pieces in reverse order (the GPU's reference split appends them from several warps at once).
    std::reverse(s.at.begin(), s.at.end());
    std::reverse(s.amount.begin(), s.amount.end());
    d::PlanCostValues rev{};
    d::plan_sparse_cost(dims, tpe.data(), s.view(), cp, base_crossing, w1.data(), w2.data(), w3.data(), rev);
    EXPECT_EQ(rev.crossing_rows, dense.crossing_rows) << what << " (pieces reversed)";
    EXPECT_EQ(rev.max_rank_copy_traffic, dense.max_rank_copy_traffic) << what << " (pieces reversed)";
}

void check_routing(const evenep::Routing& routing, int B, const std::string& what) {
    const evenep::Config cfg{.R = routing.R, .E = routing.E, .K = routing.K, .S = routing.S, .B = B, .tp = 1};
    const std::vector<int32_t> tpe = routing.tpe();
    for (bool locality : {true, false}) {
        evenep::Plan plan;
        evenep::Planner(cfg, locality ? evenep::PlannerMode::kOptimized : evenep::PlannerMode::kReference)
            .plan(tpe, routing.s, plan);
        const d::PlanDims dims{cfg.R, cfg.E, cfg.epn(), 2 * cfg.epn(), cfg.num_slots(), 1, locality, 0};
        const std::string w = what + (locality ? " optimized" : " reference");
        // Every alloc the planner ranks: the reference split and the six candidates.
        std::vector<int64_t> load(cfg.E), before(cfg.R);
        std::vector<int32_t> q(cfg.R), alloc(static_cast<size_t>(cfg.E) * cfg.R);
        d::PlanArrays a{};
        a.expert_load = load.data(), a.load_before = before.data(), a.q = q.data(), a.alloc = alloc.data();
        d::plan_loads_and_quotas(dims, tpe.data(), a);
        int64_t base_crossing = 0;
        for (int e = 0; e < cfg.E; ++e)
            base_crossing += load[e] - tpe[static_cast<size_t>(e / cfg.epn()) * cfg.E + e];
        std::vector<int64_t> w64(d::plan_work64_size(cfg.R, cfg.E));
        std::vector<int32_t> w32(d::plan_work32_size(cfg.R, cfg.E));
        d::plan_alloc_reference(dims, a, w64.data(), w64.data() + cfg.R, w64.data() + cfg.R + cfg.R * cfg.R,
                                alloc.data());
        expect_same_cost(dims, tpe, alloc.data(), base_crossing, w + " reference split");
        if (locality)
            for (int c = 0; c < d::kNumOptimizedCandidates; ++c) {
                std::vector<int32_t> cand(alloc.size());
                if (!d::plan_alloc_candidate(dims, a, tpe.data(), c, d::PlanWork{w64.data(), w32.data()}, cand.data()))
                    continue;
                expect_same_cost(dims, tpe, cand.data(), base_crossing, w + " candidate " + std::to_string(c));
            }
        // The chosen plan's route rows.
        const Sparse s = to_sparse(dims, plan.alloc.data());
        const ColPrefix cp{&tpe, cfg.R, cfg.E};
        int wrong = 0;
        for (int e = 0; e < cfg.E; ++e)
            for (int r = 0; r <= cfg.R; ++r) {
                const int32_t a_er = r < cfg.R ? plan.alloc[static_cast<size_t>(e) * cfg.R + r] : 0;
                const d::PlanRouteEntry x = d::plan_route_entry(dims, tpe.data(), s.view(), e, r, a_er, cp(e, r));
                const size_t p = static_cast<size_t>(e) * (cfg.R + 1) + r;
                wrong += x.rest_prefix != plan.rest_prefix[p] || x.cap_prefix != plan.cap_prefix[p];
                if (r < cfg.R) wrong += x.keep != plan.local_keep[static_cast<size_t>(e) * cfg.R + r];
            }
        EXPECT_EQ(wrong, 0) << w << ": route rows";
    }
}

struct Shape {
    int R, E, K, S;
};

class SparseAllocForm : public ::testing::TestWithParam<Shape> {};

TEST_P(SparseAllocForm, CostsAndRouteRowsMatchTheDenseCode) {
    const Shape sh = GetParam();
    const int epn = sh.E / sh.R;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        const evenep::RoutingSpec spec{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .seed = seed};
        for (int B : {-1, std::max(1, epn / 3)}) {
            for (double sigma : {0.05, 1.0, 3.5})
                check_routing(evenep::make_lognormal(spec, sigma), B,
                              (std::ostringstream() << "lognormal sigma " << sigma << " seed " << seed << " B " << B).str());
            for (evenep::Adversarial a : evenep::all_adversarial())
                check_routing(evenep::make_adversarial(spec, a), B,
                              (std::ostringstream() << evenep::to_string(a) << " seed " << seed << " B " << B).str());
        }
    }
}

// The block planner keeps its state in shared memory when PlanScratchLayout::core fits the opt-in limit less 4 KiB
// (227 KiB on sm_90: plan.cu planner_smem). The shapes issue 13 reports must fit: MoonEP with the histogram copy
// too, E = 896 up to R = 128 without it (R = 8 at E = 896 through fewer layout warps: G = 224).
TEST(SparseAllocForm, PlannerStateFitsSharedMemoryAtTheReportedShapes) {
    constexpr size_t kLimit = 227 * 1024 - 4096;
    using evenep::cuda::PlanScratchLayout;
    EXPECT_LE(PlanScratchLayout::make(8, 384).total, kLimit);
    for (int R : {8, 16, 32, 56, 64, 112, 128}) EXPECT_LE(PlanScratchLayout::make(R, 896).core, kLimit) << "R = " << R;
}

// The GPU fill's expert -> home rank as a multiply (plan_core.hpp home_by_magic) is exact wherever it is used
// (E <= 1024, so e < 1024 and epn <= 1024).
TEST(SparseAllocForm, HomeByMagicIsExactUpToE1024) {
    for (int epn = 1; epn <= 1024; ++epn) {
        const uint32_t m = evenep::detail::home_magic(epn);
        for (int e = 0; e < 1024; ++e) ASSERT_EQ(evenep::detail::home_by_magic(e, m), e / epn) << e << " / " << epn;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseAllocForm,
                         ::testing::Values(Shape{2, 8, 2, 64}, Shape{4, 16, 4, 64}, Shape{8, 64, 8, 16},
                                           Shape{16, 64, 6, 32}, Shape{8, 384, 8, 128}, Shape{32, 128, 8, 64}),
                         [](const auto& info) {
                             const Shape s = info.param;
                             std::ostringstream os;
                             os << "R" << s.R << "_E" << s.E << "_K" << s.K << "_S" << s.S;
                             return os.str();
                         });

}  // namespace
