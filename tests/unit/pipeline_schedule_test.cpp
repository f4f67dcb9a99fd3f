// The interleaved 1F1B order, the event simulator and the independent validator (include/evenep/pipeline.hpp).
//
// Cases:
//   PipelineSchedule.BubbleFormulaUniformCosts   rank 0's bubble fraction is (P-1)/(mV+P-1) exactly and the
//                                                makespan 3(mV+P-1), for P 1..8, V 1..4, m up to 4 groups; every
//                                                schedule passes the validator
//   PipelineSchedule.OrderShape                  2mV steps per rank, V = 1 warm-up P-r-1, each chunk on its rank
//   PipelineSchedule.LatencyAndPerMicroBatchCosts  latency and per-micro-batch costs: valid; latency lengthens it
//   PipelineSchedule.ValidatorCatchesViolations  early start, wrong rank, wrong duration, missing op, overlap
//   PipelineSchedule.SimulatorRejectsBadOrders   missing, duplicate, misplaced op and a deadlocking order
//   PipelineSchedule.BadConfig                   P < 1, m not a multiple of P with V > 1, negative costs/latency
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#include "common/pipeline_testing.hpp"
#include "evenep/pipeline.hpp"

namespace evenep::pipeline {
namespace {

using testing::joined;
PipelineConfig cfg_of(int P, int m, int V, double latency = 0) { return testing::pipeline_config(P, m, V, latency); }
VitWork empty_work(int m) { return testing::no_vit_work(m); }

Schedule text_only(const PipelineConfig& cfg) { return simulate(cfg, empty_work(cfg.m), interleaved_1f1b_order(cfg)); }

TEST(PipelineSchedule, BubbleFormulaUniformCosts) {
    int cases = 0;
    for (int P = 1; P <= 8; ++P)
        for (int V = 1; V <= 4; ++V)
            for (int m = 1; m <= 4 * P; ++m) {
                if (V > 1 && m % P != 0) continue;
                const PipelineConfig cfg = cfg_of(P, m, V);
                const Schedule s = text_only(cfg);
                SCOPED_TRACE(::testing::Message() << "P=" << P << " m=" << m << " V=" << V);
                const double expected = static_cast<double>(P - 1) / (m * V + P - 1);
                EXPECT_NEAR(s.bubble_fraction[0], expected, 1e-12);
                EXPECT_NEAR(s.makespan, 3.0 * (m * V + P - 1), 1e-9);
                const auto errors = validate_schedule(cfg, empty_work(m), s);
                EXPECT_TRUE(errors.empty()) << joined(errors);
                ++cases;
            }
    EXPECT_EQ(cases, 240);
}

TEST(PipelineSchedule, OrderShape) {
    for (int V : {1, 2, 3}) {
        const PipelineConfig cfg = cfg_of(4, 8, V);
        const RankOrders o = interleaved_1f1b_order(cfg);
        ASSERT_EQ(o.size(), 4u);
        for (int r = 0; r < 4; ++r) {
            EXPECT_EQ(o[r].size(), static_cast<size_t>(2 * 8 * V));
            for (const Step& s : o[r]) EXPECT_EQ(s.index % 4, r);
            int warmup = 0;
            while (o[r][warmup].kind == OpKind::kForward) ++warmup;
            if (V == 1) {
                EXPECT_EQ(warmup, 4 - r - 1 + 1);  // the warm-up plus the first steady forward
            }
        }
    }
}

TEST(PipelineSchedule, LatencyAndPerMicroBatchCosts) {
    PipelineConfig cfg = cfg_of(4, 8, 2);
    const double base = text_only(cfg).makespan;
    cfg.latency = 0.25;
    const Schedule with_latency = text_only(cfg);
    EXPECT_GT(with_latency.makespan, base);
    EXPECT_TRUE(validate_schedule(cfg, empty_work(cfg.m), with_latency).empty());
    cfg.forward = {1, 0.5, 2, 1, 1.5, 0.25, 1, 3};
    cfg.backward = {2, 1, 4, 2, 3, 0.5, 2, 6};
    const Schedule varied = text_only(cfg);
    const auto errors = validate_schedule(cfg, empty_work(cfg.m), varied);
    EXPECT_TRUE(errors.empty()) << joined(errors);
}

TEST(PipelineSchedule, ValidatorCatchesViolations) {
    const PipelineConfig cfg = cfg_of(3, 3, 1);
    VitWork w{{{0.5}, {0.5}, {0.5}}, {{1.0}, {1.0}, {1.0}}};
    RankOrders o = interleaved_1f1b_order(cfg);
    for (int i = 0; i < 3; ++i) {
        o[1].insert(o[1].begin(), Step{OpKind::kVitForward, i, 0});
        o[2].push_back(Step{OpKind::kVitBackward, i, 0});
    }
    const Schedule good = simulate(cfg, w, o);
    ASSERT_TRUE(validate_schedule(cfg, w, good).empty()) << joined(validate_schedule(cfg, w, good));
    const auto find = [&](Schedule& s, OpKind k, int mb, int idx) -> Op& {
        return *std::find_if(s.ops.begin(), s.ops.end(), [&](const Op& op) {
            return op.kind == k && op.mb == mb && (op.chunk == idx || op.part == idx);
        });
    };
    {  // a dependency broken: F(1, 1) moved before F(1, 0) ends
        Schedule s = good;
        Op& op = find(s, OpKind::kForward, 1, 1);
        const double d = op.end - op.start;
        op.start = find(s, OpKind::kForward, 1, 0).start;
        op.end = op.start + d;
        EXPECT_FALSE(validate_schedule(cfg, w, s).empty());
    }
    {  // a text op on the wrong rank
        Schedule s = good;
        find(s, OpKind::kBackward, 2, 2).rank = 0;
        EXPECT_FALSE(validate_schedule(cfg, w, s).empty());
    }
    {  // a wrong duration
        Schedule s = good;
        find(s, OpKind::kVitBackward, 0, 0).end += 0.5;
        EXPECT_FALSE(validate_schedule(cfg, w, s).empty());
    }
    {  // a missing op
        Schedule s = good;
        s.ops.pop_back();
        EXPECT_FALSE(validate_schedule(cfg, w, s).empty());
    }
    {  // a ViT forward overlapping a text op on its rank (moved onto rank 0 at time 0, over F(0, 0))
        Schedule s = good;
        Op& vf = find(s, OpKind::kVitForward, 2, 0);
        vf.rank = 0;
        vf.start = 0;
        vf.end = 0.5;
        EXPECT_FALSE(validate_schedule(cfg, w, s).empty());
    }
    {  // a ViT backward before its micro-batch's last text backward
        Schedule s = good;
        Op& vb = find(s, OpKind::kVitBackward, 2, 0);
        vb.start = 0;
        vb.end = 1;
        EXPECT_FALSE(validate_schedule(cfg, w, s).empty());
    }
}

TEST(PipelineSchedule, SimulatorRejectsBadOrders) {
    const PipelineConfig cfg = cfg_of(2, 2, 1);
    const VitWork w = empty_work(2);
    const RankOrders good = interleaved_1f1b_order(cfg);
    RankOrders missing = good;
    missing[1].pop_back();
    EXPECT_THROW(simulate(cfg, w, missing), Error);
    RankOrders dup = good;
    dup[0].push_back(dup[0].front());
    EXPECT_THROW(simulate(cfg, w, dup), Error);
    RankOrders misplaced = good;
    std::swap(misplaced[0].front(), misplaced[1].front());
    EXPECT_THROW(simulate(cfg, w, misplaced), Error);
    RankOrders deadlock = good;
    std::reverse(deadlock[0].begin(), deadlock[0].end());  // B(1, 0) first: waits forever
    try {
        simulate(cfg, w, deadlock);
        FAIL() << "deadlock not detected";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("deadlocks"), std::string::npos) << e.what();
    }
}

TEST(PipelineSchedule, BadConfig) {
    const auto message = [](const PipelineConfig& cfg) {
        try {
            cfg.validate();
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message(cfg_of(0, 2, 1)).find("P = 0"), std::string::npos);
    EXPECT_NE(message(cfg_of(4, 6, 2)).find("multiple of P = 4"), std::string::npos);
    EXPECT_NE(message(cfg_of(2, 2, 1, -1)).find("latency = -1"), std::string::npos);
    PipelineConfig neg = cfg_of(2, 2, 1);
    neg.forward = {1, -2};
    EXPECT_NE(message(neg).find("= -2"), std::string::npos);
    PipelineConfig short_costs = cfg_of(2, 2, 1);
    short_costs.backward = {1};
    EXPECT_NE(message(short_costs).find("expected m = 2"), std::string::npos);
    const PipelineConfig ok = cfg_of(2, 2, 1);
    VitWork bad{{{1.0}, {-1.0}}, {{2.0}, {2.0}}};
    EXPECT_THROW(place_vit(ok, bad, VitPolicy::kBubbles), Error);
    EXPECT_THROW(parse_vit_policy("greedy"), Error);
}

}  // namespace
}  // namespace evenep::pipeline
