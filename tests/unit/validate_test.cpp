// Validator tests (validate_plan, validate_dst, ValidationReport::summary). Valid plans must pass; then each
// mutation corrupts exactly one thing in a valid plan or its dst and the report must name the place.
//
// Cases:
//   ValidatorAccepts.HandComputedPlan           a 2-rank plan whose every array is written out by hand
//   ValidatorAccepts.RandomPlansBothModes       random routings, both modes, B = epn and B < epn
//   ValidatorSummary.ValidAndTruncated          summary text: "valid", error count, truncation
//   PlanMutation.*                              one corruption of the plan each (see the test names): alloc moved
//       between ranks / experts, q, expert_load, load_before, cu_seqlens off by one, last end beyond NvS, group out
//       of order, own groups swapped, group_count, seg_row, copies slot wrong / out of order / dropped with B < epn,
//       group source and slot, every counter and cost, local_keep / rest_prefix / cap_prefix, mode flipped, tpe
//       changed after planning, more than epn remote experts, an array of the wrong size, invalid config;
//       AnySingleValueChangeIsReported: random +-delta on a random element of every plan array and cost
//   DstMutation.*                               one corruption of dst or routing each: entries of two experts swapped,
//       two entries of one segment swapped (order), duplicate marked as payload, payload marked as duplicate,
//       masked entry given a row, unmasked entry masked, row on padding, row hit twice, out of range, reference
//       rank order broken, optimized locality broken, crossing counter wrong, routing that disagrees with tpe,
//       wrong number of ranks; AnySingleCodeChangeIsReported: random single-code corruptions of dst
#include "evenep/validate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/plan_testing.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

using testing::RoutingOptions;

// Passes when some error line contains every needle.
::testing::AssertionResult reported(const ValidationReport& report, const std::vector<std::string>& needles) {
    for (const std::string& line : report.errors) {
        bool all = true;
        for (const std::string& n : needles) all = all && line.find(n) != std::string::npos;
        if (all) return ::testing::AssertionSuccess();
    }
    std::string want;
    for (const std::string& n : needles) want += " '" + n + "'";
    return ::testing::AssertionFailure() << "no error line contains" << want << "; report: " << report.summary(20);
}

// ---------------------------------------------------------------------------------------------------------
// Valid plans.
// ---------------------------------------------------------------------------------------------------------
TEST(ValidatorAccepts, HandComputedPlan) {
    // R=2, E=2 (epn 1), K=1, S=3, tp=2: all six entries go to expert 0. q = 3, 3; rank 0 keeps 3 rows of expert 0,
    // rank 1 computes the other 3 from a prefetched copy. NvS = align_up(3 + 1*2*1, 2) = 6.
    const Config cfg{.R = 2, .E = 2, .K = 1, .S = 3, .B = -1, .tp = 2};
    Routing routing;
    routing.R = 2;
    routing.E = 2;
    routing.K = 1;
    routing.S = 3;
    routing.s = {3, 3};
    routing.topk_idx = {{0, 0, 0}, {0, 0, 0}};
    const std::vector<int32_t> tpe = {3, 0, 3, 0};
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        SCOPED_TRACE(std::string(to_string(mode)));
        const Plan plan = make_plan(cfg, mode, tpe, routing.s);
        EXPECT_EQ(plan.alloc, (std::vector<int32_t>{3, 3, 0, 0}));
        EXPECT_EQ(plan.group_expert, (std::vector<int32_t>{0, -1, -1, 0}));
        EXPECT_EQ(plan.cu_seqlens, (std::vector<int32_t>{4, 4, 0, 4}));
        EXPECT_EQ(plan.copies, (std::vector<int32_t>{-1, 0}));
        EXPECT_EQ(plan.copies_pushed, (std::vector<int32_t>{1, 0}));
        EXPECT_EQ(plan.crossing_out, (std::vector<int64_t>{0, 0}));
        EXPECT_EQ(plan.cost.max_rank_copy_traffic, 1);
        const auto dst = testing::all_dst(plan, routing);
        EXPECT_EQ(dst, (std::vector<std::vector<int32_t>>{{0, 1, 2}, {6, 7, 8}}));
        const ValidationReport report = validate_dst(plan, routing, dst);
        EXPECT_TRUE(report.ok()) << report.summary();
    }
}

TEST(ValidatorAccepts, RandomPlansBothModes) {
    for (int b : {-1, 1})
        for (uint64_t seed = 1; seed <= 20; ++seed) {
            const Config cfg{.R = 4, .E = 16, .K = 3, .S = 15, .B = b, .tp = 4};
            const Routing routing = testing::random_routing(cfg, seed, RoutingOptions{.skew = 2.0, .mask_prob = 0.1});
            for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
                SCOPED_TRACE(cfg.to_string() + " seed=" + std::to_string(seed) + " " + std::string(to_string(mode)));
                const Plan plan = make_plan(cfg, mode, testing::histogram_of(routing), routing.s);
                EXPECT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).summary();
                const ValidationReport report = validate_dst(plan, routing, testing::all_dst(plan, routing));
                EXPECT_TRUE(report.ok()) << report.summary();
            }
        }
}

TEST(ValidatorSummary, ValidAndTruncated) {
    ValidationReport report;
    EXPECT_NE(report.summary().find("valid"), std::string::npos);
    for (int i = 0; i < 15; ++i) report.errors.push_back("error number " + std::to_string(i));
    const std::string text = report.summary(3);
    EXPECT_NE(text.find("15 errors"), std::string::npos) << text;
    EXPECT_NE(text.find("error number 2"), std::string::npos) << text;
    EXPECT_EQ(text.find("error number 3"), std::string::npos) << text;
    EXPECT_NE(text.find("12 more"), std::string::npos) << text;
}

// ---------------------------------------------------------------------------------------------------------
// Plan mutations. The base instance has splits, several remote experts per rank, padding and (with B = 1 < epn)
// peer reads.
// ---------------------------------------------------------------------------------------------------------
class PlanMutation : public ::testing::Test {
  protected:
    void SetUp() override {
        // Experts 5..10 (ranks 1 and 2) take every entry: ranks 0 and 3 fill up with several remote experts.
        routing_ = testing::random_routing(cfg_, 42,
                                           RoutingOptions{.skew = 1.0, .mask_prob = 0.1, .num_hot = 6, .hot_first = 5});
        tpe_ = testing::histogram_of(routing_);
        ref_ = make_plan(cfg_, PlannerMode::kReference, tpe_, routing_.s);
        opt_ = make_plan(cfg_, PlannerMode::kOptimized, tpe_, routing_.s);
        small_b_ = make_plan(cfg_small_b_, PlannerMode::kOptimized, tpe_, routing_.s);
        for (const Plan* p : {&ref_, &opt_, &small_b_}) {
            ASSERT_TRUE(validate_plan(*p).ok()) << validate_plan(*p).summary();
            ASSERT_TRUE(validate_dst(*p, routing_, testing::all_dst(*p, routing_)).ok());
        }
        ASSERT_GT(ref_.cost.total_copies, 4) << "base instance too easy";
        ASSERT_GE(rank_with_remote(ref_, 2), 0) << "base instance too easy";
        int peer_reads = 0;
        for (int v : small_b_.peer_reads) peer_reads += v;
        ASSERT_GT(peer_reads, 0) << "base instance has no peer reads with B = 1";
    }

    // A rank with at least `n` remote groups (prefetched ones when `slots`), or -1.
    static int rank_with_remote(const Plan& p, int n, bool slots = false) {
        for (int r = 0; r < p.R(); ++r) {
            const int have = slots ? p.copies_received[r] : p.remote_experts[r];
            if (have >= n) return r;
        }
        return -1;
    }
    // Lowest expert with rows on rank r, or -1.
    static int first_computed_on(const Plan& p, int r) {
        for (int e = 0; e < p.E(); ++e)
            if (p.alloc_at(e, r) > 0) return e;
        return -1;
    }
    static size_t gi(const Plan& p, int r, int g) { return static_cast<size_t>(r) * p.G() + g; }

    const Config cfg_{.R = 4, .E = 16, .K = 4, .S = 30, .B = -1, .tp = 4};
    const Config cfg_small_b_{.R = 4, .E = 16, .K = 4, .S = 30, .B = 1, .tp = 4};
    Routing routing_;
    std::vector<int32_t> tpe_;
    Plan ref_, opt_, small_b_;
};

TEST_F(PlanMutation, AllocMovedBetweenRanks) {
    Plan p = ref_;
    const int e = first_computed_on(p, 2), from = 2, to = 0;  // an expert with rows on rank 2 moves one to rank 0
    ASSERT_GE(e, 0);
    p.alloc[e * 4 + from] -= 1;
    p.alloc[e * 4 + to] += 1;
    const ValidationReport r = validate_plan(p);
    EXPECT_TRUE(reported(r, {"balance: rank 2:"}));
    EXPECT_TRUE(reported(r, {"balance: rank 0:"}));
    EXPECT_FALSE(reported(r, {"conservation"}));
}

TEST_F(PlanMutation, AllocMovedBetweenExperts) {
    Plan p = ref_;
    const int e = first_computed_on(p, 1);
    ASSERT_GE(e, 0);
    const int other = (e + 1) % cfg_.E;
    p.alloc[e * 4 + 1] -= 1;
    p.alloc[other * 4 + 1] += 1;  // rank 1 still computes q_1 entries, but the two experts are not conserved
    const ValidationReport r = validate_plan(p);
    EXPECT_TRUE(reported(r, {"conservation: expert " + std::to_string(e) + ":"}));
    EXPECT_TRUE(reported(r, {"conservation: expert " + std::to_string(other) + ":"}));
    EXPECT_FALSE(reported(r, {"balance"}));
}

TEST_F(PlanMutation, NegativeAlloc) {
    Plan p = ref_;
    // A remote (expert, rank) pair with no rows gets -1; the home rank computes one more to conserve the expert.
    int e = 0, r = 0;
    while (r == e / cfg_.epn() || p.alloc_at(e, r) != 0) {
        if (++r == cfg_.R) r = 0, ++e;
        ASSERT_LT(e, cfg_.E);
    }
    p.alloc[e * 4 + r] = -1;
    p.alloc[e * 4 + e / cfg_.epn()] += 1;
    EXPECT_TRUE(reported(validate_plan(p), {"expert " + std::to_string(e) + " rank " + std::to_string(r) + ":",
                                            "alloc = -1 is negative"}));
}

TEST_F(PlanMutation, QuotaWrong) {
    Plan p = ref_;
    p.q[2] += 1;
    EXPECT_TRUE(reported(validate_plan(p), {"balance: rank 2: q = " + std::to_string(ref_.q[2] + 1)}));
}

TEST_F(PlanMutation, ExpertLoadWrong) {
    Plan p = ref_;
    p.expert_load[7] += 3;
    EXPECT_TRUE(reported(validate_plan(p), {"expert 7", "expert_load"}));
}

TEST_F(PlanMutation, LoadBeforeWrong) {
    Plan p = ref_;
    p.load_before[3] -= 1;
    EXPECT_TRUE(reported(validate_plan(p), {"rank 3", "load_before"}));
}

TEST_F(PlanMutation, CuSeqlensOffByOne) {
    Plan p = ref_;
    int g = 0;
    while (g < p.G() - 1 && p.group_count[gi(p, 2, g)] == 0) ++g;
    ASSERT_LT(g, p.G() - 1);
    p.cu_seqlens[gi(p, 2, g)] += 1;
    const ValidationReport r = validate_plan(p);
    EXPECT_TRUE(reported(r, {"rank 2 group " + std::to_string(g) + ":", "cu_seqlens"}));
    EXPECT_TRUE(reported(r, {"rank 2 group " + std::to_string(g + 1) + ":", "cu_seqlens"}));
}

TEST_F(PlanMutation, LastEndBeyondNvS) {
    Plan p = ref_;
    const int64_t nvs = cfg_.recv_rows();
    p.cu_seqlens[gi(p, 1, p.G() - 1)] = static_cast<int32_t>(nvs + cfg_.tp);
    EXPECT_TRUE(reported(validate_plan(p), {"rank 1", "exceeds NvS = " + std::to_string(nvs)}));
}

TEST_F(PlanMutation, RemoteGroupsOutOfOrder) {
    Plan p = ref_;
    const int r = rank_with_remote(p, 2);
    ASSERT_GE(r, 0);
    const int epn = cfg_.epn();
    std::swap(p.group_expert[gi(p, r, epn)], p.group_expert[gi(p, r, epn + 1)]);
    const ValidationReport report = validate_plan(p);
    EXPECT_TRUE(reported(report, {"layout: rank " + std::to_string(r) + " group " + std::to_string(epn) + ":",
                                  "expert = " + std::to_string(ref_.group_expert[gi(p, r, epn + 1)]), "ascending"}));
}

TEST_F(PlanMutation, OwnGroupsSwapped) {
    Plan p = ref_;
    int r = 0;
    while (r < 4 && (p.group_expert[gi(p, r, 0)] < 0 || p.group_expert[gi(p, r, 1)] < 0)) ++r;
    ASSERT_LT(r, 4);
    std::swap(p.group_expert[gi(p, r, 0)], p.group_expert[gi(p, r, 1)]);
    EXPECT_TRUE(reported(validate_plan(p), {"rank " + std::to_string(r) + " group 0", "own expert"}));
}

TEST_F(PlanMutation, GroupCountWrong) {
    Plan p = ref_;
    int g = 0;
    while (p.group_count[gi(p, 0, g)] == 0) ++g;
    p.group_count[gi(p, 0, g)] -= 1;
    EXPECT_TRUE(reported(validate_plan(p), {"rank 0 group " + std::to_string(g), "group_count"}));
}

TEST_F(PlanMutation, SegRowWrong) {
    Plan p = ref_;
    const int e = first_computed_on(p, 3);
    ASSERT_GE(e, 0);
    p.seg_row[3 * 16 + e] += 1;
    EXPECT_TRUE(reported(validate_plan(p), {"rank 3 expert " + std::to_string(e) + ":", "seg_row"}));
}

TEST_F(PlanMutation, CopiesSlotHoldsWrongExpert) {
    Plan p = ref_;
    const int r = rank_with_remote(p, 1, true);
    ASSERT_GE(r, 0);
    const int B = cfg_.num_slots();
    p.copies[r * B + 0] = r * cfg_.epn();  // one of the rank's own experts
    const ValidationReport report = validate_plan(p);
    EXPECT_TRUE(reported(report, {"copies: rank " + std::to_string(r) + " slot 0", "homed on this rank"}));
}

TEST_F(PlanMutation, CopiesOutOfOrder) {
    Plan p = ref_;
    const int r = rank_with_remote(p, 2, true);
    ASSERT_GE(r, 0);
    const int B = cfg_.num_slots();
    std::swap(p.copies[r * B + 0], p.copies[r * B + 1]);
    EXPECT_TRUE(reported(validate_plan(p), {"copies: rank " + std::to_string(r) + " slot 1", "ascending"}));
}

TEST_F(PlanMutation, PrefetchDroppedWithSmallB) {
    // Turn one prefetched group into a peer read and keep every counter consistent: only the "min(remote, B)
    // prefetched" rule is broken.
    Plan p = small_b_;
    const int r = rank_with_remote(p, 1, true);
    ASSERT_GE(r, 0);
    const int B = cfg_small_b_.num_slots();
    const int last = p.copies_received[r] - 1;
    const int e = p.copies[r * B + last];
    p.copies[r * B + last] = -1;
    for (int g = cfg_.epn(); g < p.G(); ++g)
        if (p.group_expert[gi(p, r, g)] == e) {
            p.group_source[gi(p, r, g)] = WeightSource::kPeer;
            p.group_slot[gi(p, r, g)] = -1;
        }
    p.copies_received[r] -= 1;
    p.peer_reads[r] += 1;
    p.copies_pushed[e / cfg_.epn()] -= 1;
    const ValidationReport report = validate_plan(p);
    EXPECT_TRUE(reported(report, {"copies: rank " + std::to_string(r), "expected min(remote"}));
    EXPECT_FALSE(reported(report, {"counters"}));
}

TEST_F(PlanMutation, SlotGroupReadFromPeer) {
    Plan p = ref_;
    const int r = rank_with_remote(p, 1, true);
    ASSERT_GE(r, 0);
    const size_t at = gi(p, r, cfg_.epn());
    p.group_source[at] = WeightSource::kPeer;
    p.group_slot[at] = -1;
    EXPECT_TRUE(
        reported(validate_plan(p), {"rank " + std::to_string(r) + " group " + std::to_string(cfg_.epn()), "peer"}));
}

TEST_F(PlanMutation, GroupSlotWrong) {
    Plan p = ref_;
    const int r = rank_with_remote(p, 2, true);
    ASSERT_GE(r, 0);
    p.group_slot[gi(p, r, cfg_.epn())] = 1;
    EXPECT_TRUE(reported(validate_plan(p),
                         {"sources: rank " + std::to_string(r) + " group " + std::to_string(cfg_.epn()), "slot 1"}));
}

TEST_F(PlanMutation, LocalGroupMarkedAsSlot) {
    Plan p = ref_;
    int g = 0;
    while (p.group_expert[gi(p, 1, g)] < 0) ++g;
    ASSERT_LT(g, cfg_.epn());
    p.group_source[gi(p, 1, g)] = WeightSource::kSlot;
    EXPECT_TRUE(reported(validate_plan(p), {"sources: rank 1 group " + std::to_string(g), "expected local"}));
}

// Each counter, bumped by one, is reported under its own name and rank.
TEST_F(PlanMutation, EveryCounterWrong) {
    struct Case {
        const char* name;
        std::function<void(Plan&)> mutate;
        std::vector<std::string> needles;
    };
    const std::vector<Case> cases = {
        {"remote_experts", [](Plan& p) { p.remote_experts[2] += 1; }, {"rank 2", "remote_experts"}},
        {"copies_received", [](Plan& p) { p.copies_received[1] += 1; }, {"rank 1", "copies_received"}},
        {"copies_pushed", [](Plan& p) { p.copies_pushed[3] += 1; }, {"rank 3", "copies_pushed"}},
        {"peer_reads", [](Plan& p) { p.peer_reads[0] += 1; }, {"rank 0", "peer_reads"}},
        {"crossing_out", [](Plan& p) { p.crossing_out[2] -= 1; }, {"rank 2", "crossing_out"}},
        {"max_rank_copy_traffic", [](Plan& p) { p.cost.max_rank_copy_traffic += 1; }, {"max_rank_copy_traffic"}},
        {"total_copies", [](Plan& p) { p.cost.total_copies -= 1; }, {"total_copies"}},
        {"crossing_rows", [](Plan& p) { p.cost.crossing_rows += 1; }, {"crossing_rows"}},
        {"moved_entries", [](Plan& p) { p.cost.moved_entries += 1; }, {"moved_entries"}},
    };
    for (const Plan* base : {&ref_, &opt_, &small_b_})
        for (const Case& c : cases) {
            SCOPED_TRACE(std::string(c.name) + " " + std::string(to_string(base->mode)) +
                         " B=" + std::to_string(base->cfg.num_slots()));
            Plan p = *base;
            c.mutate(p);
            const ValidationReport report = validate_plan(p);
            EXPECT_TRUE(reported(report, c.needles));
            EXPECT_EQ(report.errors.size(), 1u) << report.summary();
        }
}

TEST_F(PlanMutation, LocalKeepWrong) {
    Plan p = opt_;
    size_t at = 0;
    while (at < p.local_keep.size() && p.local_keep[at] == 0) ++at;
    ASSERT_LT(at, p.local_keep.size());
    p.local_keep[at] -= 1;
    const int e = static_cast<int>(at / 4), r = static_cast<int>(at % 4);
    EXPECT_TRUE(reported(validate_plan(p),
                         {"locality: expert " + std::to_string(e) + " rank " + std::to_string(r), "local_keep"}));
}

TEST_F(PlanMutation, PrefixArraysWrong) {
    Plan p = ref_;
    p.rest_prefix[3 * 5 + 2] += 1;
    EXPECT_TRUE(reported(validate_plan(p), {"expert 3 rank 2", "rest_prefix"}));
    Plan c = ref_;
    c.cap_prefix[9 * 5 + 4] -= 1;
    EXPECT_TRUE(reported(validate_plan(c), {"expert 9", "cap_prefix[R]"}));
}

TEST_F(PlanMutation, ModeFlipped) {
    Plan p = opt_;
    p.mode = PlannerMode::kReference;
    EXPECT_TRUE(reported(validate_plan(p), {"locality", "reference mode keeps nothing"}));
}

TEST_F(PlanMutation, TpeChangedAfterPlanning) {
    Plan p = ref_;
    int e = 0;
    while (p.tpe[1 * 16 + e] == 0) ++e;
    p.tpe[1 * 16 + e] -= 1;
    const ValidationReport report = validate_plan(p);
    EXPECT_TRUE(reported(report, {"expert " + std::to_string(e), "expert_load"}));
    EXPECT_TRUE(reported(report, {"conservation", "expert " + std::to_string(e)}));
}

TEST_F(PlanMutation, MoreThanEpnRemoteExperts) {
    // R=3, E=3 (epn 1): rank 2 computes pieces of experts 0 and 1 while staying balanced and conserving.
    const Config cfg{.R = 3, .E = 3, .K = 1, .S = 4, .B = -1, .tp = 1};
    const std::vector<int32_t> tpe = {4, 0, 0, 0, 4, 0, 0, 0, 4};
    const std::vector<int32_t> s = {4, 4, 4};
    Plan p = make_plan(cfg, PlannerMode::kReference, tpe, s);
    ASSERT_TRUE(validate_plan(p).ok());
    auto at = [&](int e, int r) -> int32_t& { return p.alloc[e * 3 + r]; };
    at(0, 0) -= 1, at(0, 2) += 1;
    at(1, 1) -= 1, at(1, 2) += 1;
    at(2, 2) -= 2, at(2, 0) += 1, at(2, 1) += 1;
    const ValidationReport report = validate_plan(p);
    EXPECT_TRUE(reported(report, {"redundancy: rank 2", "2 remote experts > epn = 1"}));
    EXPECT_FALSE(reported(report, {"balance"}));
    EXPECT_FALSE(reported(report, {"conservation"}));
}

TEST_F(PlanMutation, ArrayOfWrongSize) {
    Plan p = ref_;
    p.cu_seqlens.pop_back();
    const ValidationReport report = validate_plan(p);
    EXPECT_TRUE(reported(report, {"cu_seqlens has 31 values, expected 32"}));
    EXPECT_EQ(report.errors.size(), 1u);
}

TEST_F(PlanMutation, InvalidConfig) {
    Plan p = ref_;
    p.cfg.E = 15;
    EXPECT_TRUE(reported(validate_plan(p), {"invalid config", "E = 15"}));
}

// Every array of the plan except s (an input that only bounds tpe) is fully determined by the inputs, so any
// single-value change anywhere must be reported (and must never crash the validator).
struct PlanField {
    std::string name;
    std::function<size_t(const Plan&)> size;
    std::function<void(Plan&, size_t, int64_t)> add;
};

template <typename T>
PlanField array_field(const char* name, std::vector<T> Plan::*member) {
    return {name, [member](const Plan& p) { return (p.*member).size(); },
            [member](Plan& p, size_t i, int64_t delta) {
                T& v = (p.*member)[i];
                v = static_cast<T>(static_cast<int64_t>(v) + delta);
            }};
}

PlanField cost_field(const char* name, int64_t PlanCost::*member) {
    return {name, [](const Plan&) { return size_t{1}; },
            [member](Plan& p, size_t, int64_t delta) { p.cost.*member += delta; }};
}

TEST_F(PlanMutation, AnySingleValueChangeIsReported) {
    const std::vector<PlanField> fields = {
        array_field("tpe", &Plan::tpe),
        array_field("expert_load", &Plan::expert_load),
        array_field("load_before", &Plan::load_before),
        array_field("q", &Plan::q),
        array_field("alloc", &Plan::alloc),
        array_field("local_keep", &Plan::local_keep),
        array_field("rest_prefix", &Plan::rest_prefix),
        array_field("cap_prefix", &Plan::cap_prefix),
        array_field("seg_row", &Plan::seg_row),
        array_field("group_expert", &Plan::group_expert),
        array_field("group_count", &Plan::group_count),
        array_field("cu_seqlens", &Plan::cu_seqlens),
        array_field("group_source", &Plan::group_source),
        array_field("group_slot", &Plan::group_slot),
        array_field("copies", &Plan::copies),
        array_field("remote_experts", &Plan::remote_experts),
        array_field("copies_received", &Plan::copies_received),
        array_field("copies_pushed", &Plan::copies_pushed),
        array_field("peer_reads", &Plan::peer_reads),
        array_field("crossing_out", &Plan::crossing_out),
        cost_field("cost.max_rank_copy_traffic", &PlanCost::max_rank_copy_traffic),
        cost_field("cost.total_copies", &PlanCost::total_copies),
        cost_field("cost.crossing_rows", &PlanCost::crossing_rows),
        cost_field("cost.moved_entries", &PlanCost::moved_entries),
    };
    testing::TestRng rng(2024);
    const int64_t deltas[] = {-3, -2, -1, 1, 2, 3, 1000, -1000};
    int trials = 0;
    for (const Plan* base : {&ref_, &opt_, &small_b_})
        for (const PlanField& f : fields)
            for (int n = 0; n < 40; ++n) {
                Plan p = *base;
                const size_t i = rng.below(static_cast<int>(f.size(p)));
                const int64_t delta = deltas[rng.below(8)];
                f.add(p, i, delta);
                SCOPED_TRACE(f.name + "[" + std::to_string(i) + "] += " + std::to_string(delta) + " in " +
                             std::string(to_string(base->mode)) + " B=" + std::to_string(base->cfg.num_slots()));
                EXPECT_FALSE(validate_plan(p).ok());
                ++trials;
            }
    EXPECT_EQ(trials, 3 * 24 * 40);
}

// ---------------------------------------------------------------------------------------------------------
// dst mutations.
// ---------------------------------------------------------------------------------------------------------
struct EntryRef {
    int rank = -1, index = -1;  // source rank, t*K + k
};

class DstMutation : public PlanMutation {
  protected:
    void SetUp() override {
        PlanMutation::SetUp();
        if (HasFatalFailure()) return;
        nvs_ = cfg_.recv_rows();
    }

    // Flat destinations (-1 for masked) of every entry.
    std::vector<std::vector<int64_t>> flats(const Plan& p) const {
        const auto dst = testing::all_dst(p, routing_);
        std::vector<std::vector<int64_t>> f(dst.size());
        for (size_t r = 0; r < dst.size(); ++r)
            for (int32_t c : dst[r]) f[r].push_back(detail::is_masked(c) ? -1 : detail::decode_dst(c));
        return f;
    }

    // Encodes flats with the SPEC §3.4 dedup rule (first entry per token and destination rank is the payload).
    std::vector<std::vector<int32_t>> encode(const std::vector<std::vector<int64_t>>& f) const {
        std::vector<std::vector<int32_t>> dst(f.size());
        for (size_t r = 0; r < f.size(); ++r)
            for (size_t t = 0; t * cfg_.K < f[r].size(); ++t) {
                std::vector<int64_t> seen;
                for (int k = 0; k < cfg_.K; ++k) {
                    const int64_t flat = f[r][t * cfg_.K + k];
                    if (flat < 0) {
                        dst[r].push_back(detail::kMaskedDst);
                        continue;
                    }
                    const bool dup = std::find(seen.begin(), seen.end(), flat / nvs_) != seen.end();
                    if (!dup) seen.push_back(flat / nvs_);
                    dst[r].push_back(dup ? detail::encode_duplicate(static_cast<int32_t>(flat))
                                         : static_cast<int32_t>(flat));
                }
            }
        return dst;
    }

    int expert_of(EntryRef x) const { return routing_.topk_idx[x.rank][x.index]; }

    // First pair of unmasked entries (a, b) with pred(a, b), scanning in (rank, index) order.
    template <typename Pred>
    std::pair<EntryRef, EntryRef> find_pair(const std::vector<std::vector<int64_t>>& f, Pred pred) const {
        std::vector<EntryRef> all;
        for (int r = 0; r < cfg_.R; ++r)
            for (int i = 0; i < static_cast<int>(f[r].size()); ++i)
                if (f[r][i] >= 0) all.push_back({r, i});
        for (size_t a = 0; a < all.size(); ++a)
            for (size_t b = a + 1; b < all.size(); ++b)
                if (pred(all[a], all[b])) return {all[a], all[b]};
        return {};
    }

    static std::string where(EntryRef x, int K) {
        return "(rank " + std::to_string(x.rank) + ", token " + std::to_string(x.index / K) + ", k " +
               std::to_string(x.index % K) + ")";
    }

    int64_t nvs_ = 0;
};

TEST_F(DstMutation, EntriesOfTwoExpertsSwapped) {
    auto f = flats(opt_);
    const auto [a, b] = find_pair(f, [&](EntryRef x, EntryRef y) { return expert_of(x) != expert_of(y); });
    ASSERT_GE(a.rank, 0);
    std::swap(f[a.rank][a.index], f[b.rank][b.index]);
    const ValidationReport report = validate_dst(opt_, routing_, encode(f));
    EXPECT_TRUE(reported(report, {where(a, cfg_.K), "segment of expert " + std::to_string(expert_of(b))}));
}

TEST_F(DstMutation, EntriesOfOneSegmentSwapped) {
    auto f = flats(ref_);
    const auto [a, b] = find_pair(f, [&](EntryRef x, EntryRef y) {
        return expert_of(x) == expert_of(y) && f[x.rank][x.index] / nvs_ == f[y.rank][y.index] / nvs_;
    });
    ASSERT_GE(a.rank, 0);
    std::swap(f[a.rank][a.index], f[b.rank][b.index]);
    const ValidationReport report = validate_dst(ref_, routing_, encode(f));
    EXPECT_TRUE(reported(report, {"not in (source rank, token, k) order"}));
    EXPECT_TRUE(reported(report, {"reference mode", where(a, cfg_.K)}));
}

TEST_F(DstMutation, DuplicateMarkedAsPayload) {
    auto dst = testing::all_dst(ref_, routing_);
    for (int r = 0; r < cfg_.R; ++r)
        for (size_t i = 0; i < dst[r].size(); ++i)
            if (!detail::is_masked(dst[r][i]) && dst[r][i] < 0) {
                dst[r][i] = detail::decode_dst(dst[r][i]);
                const EntryRef x{r, static_cast<int>(i)};
                const ValidationReport report = validate_dst(ref_, routing_, dst);
                EXPECT_TRUE(reported(report, {where(x, cfg_.K), "encoded as a payload"}));
                EXPECT_EQ(report.errors.size(), 1u) << report.summary();
                return;
            }
    FAIL() << "base instance has no duplicate entry";
}

TEST_F(DstMutation, PayloadMarkedAsDuplicate) {
    auto dst = testing::all_dst(opt_, routing_);
    const int r = 2;
    int i = 0;
    while (dst[r][i] < 0) ++i;  // skip masked entries and duplicates
    dst[r][i] = detail::encode_duplicate(dst[r][i]);
    EXPECT_TRUE(reported(validate_dst(opt_, routing_, dst), {where({r, i}, cfg_.K), "encoded as a duplicate"}));
}

TEST_F(DstMutation, MaskedEntryGivenARow) {
    auto dst = testing::all_dst(ref_, routing_);
    for (int r = 0; r < cfg_.R; ++r)
        for (size_t i = 0; i < dst[r].size(); ++i)
            if (routing_.topk_idx[r][i] == -1) {
                dst[r][i] = 0;
                EXPECT_TRUE(reported(validate_dst(ref_, routing_, dst),
                                     {where({r, static_cast<int>(i)}, cfg_.K), "masked entry"}));
                return;
            }
    FAIL() << "base instance has no masked entry";
}

TEST_F(DstMutation, UnmaskedEntryMasked) {
    auto dst = testing::all_dst(ref_, routing_);
    int i = 0;
    while (routing_.topk_idx[1][i] == -1) ++i;
    dst[1][i] = detail::kMaskedDst;
    const ValidationReport report = validate_dst(ref_, routing_, dst);
    EXPECT_TRUE(reported(report, {where({1, i}, cfg_.K), "encoded as kMaskedDst"}));
    EXPECT_TRUE(reported(report, {"never written"}));
}

TEST_F(DstMutation, RowOnPadding) {
    auto f = flats(opt_);
    // A group with padding: count not a multiple of tp.
    for (int r = 0; r < cfg_.R; ++r)
        for (int g = 0; g < opt_.G(); ++g) {
            const int32_t cnt = opt_.group_count[gi(opt_, r, g)];
            if (cnt == 0 || cnt % cfg_.tp == 0) continue;
            const int64_t pad_row = opt_.group_begin(r, g) + cnt;
            for (int src = 0; src < cfg_.R; ++src)
                for (size_t i = 0; i < f[src].size(); ++i)
                    if (f[src][i] >= 0) {
                        f[src][i] = r * nvs_ + pad_row;
                        const ValidationReport report = validate_dst(opt_, routing_, encode(f));
                        EXPECT_TRUE(reported(report, {where({src, static_cast<int>(i)}, cfg_.K),
                                                      "row " + std::to_string(pad_row), "padding"}));
                        return;
                    }
        }
    FAIL() << "base instance has no padded group";
}

TEST_F(DstMutation, RowHitTwice) {
    auto f = flats(ref_);
    const auto [a, b] = find_pair(f, [&](EntryRef x, EntryRef y) { return expert_of(x) == expert_of(y); });
    ASSERT_GE(a.rank, 0);
    f[b.rank][b.index] = f[a.rank][a.index];
    const ValidationReport report = validate_dst(ref_, routing_, encode(f));
    EXPECT_TRUE(reported(report, {"hit twice", where(a, cfg_.K), where(b, cfg_.K)}));
    EXPECT_TRUE(reported(report, {"never written"}));
}

TEST_F(DstMutation, DestinationOutOfRange) {
    auto dst = testing::all_dst(opt_, routing_);
    int i = 0;
    while (dst[3][i] < 0) ++i;
    dst[3][i] = static_cast<int32_t>(cfg_.R * nvs_ + 7);
    EXPECT_TRUE(reported(validate_dst(opt_, routing_, dst), {where({3, i}, cfg_.K), "outside [0, R*NvS"}));
}

TEST_F(DstMutation, ReferenceRankOrderBroken) {
    // Two entries of one expert from different source ranks, computed on different ranks, trade places. The
    // swap may also break the row order of a segment; the reference-order error must name both moved entries.
    auto f = flats(ref_);
    const auto [a, b] = find_pair(f, [&](EntryRef x, EntryRef y) {
        return expert_of(x) == expert_of(y) && x.rank != y.rank &&
               f[x.rank][x.index] / nvs_ != f[y.rank][y.index] / nvs_;
    });
    ASSERT_GE(a.rank, 0);
    std::swap(f[a.rank][a.index], f[b.rank][b.index]);
    const ValidationReport report = validate_dst(ref_, routing_, encode(f));
    EXPECT_TRUE(reported(report, {"reference mode", where(a, cfg_.K)}));
    EXPECT_TRUE(reported(report, {"reference mode", where(b, cfg_.K)}));
}

TEST_F(DstMutation, OptimizedLocalityBroken) {
    // An entry kept on its source rank swapped with an entry of the same expert from another source that is
    // computed on a third rank: the kept count of (expert, source) drops below min(tpe, alloc).
    auto f = flats(opt_);
    const auto [a, b] = find_pair(f, [&](EntryRef x, EntryRef y) {
        const int64_t dx = f[x.rank][x.index] / nvs_, dy = f[y.rank][y.index] / nvs_;
        return expert_of(x) == expert_of(y) && x.rank != y.rank && dx == x.rank && dy != y.rank && dy != x.rank;
    });
    ASSERT_GE(a.rank, 0);
    std::swap(f[a.rank][a.index], f[b.rank][b.index]);
    const ValidationReport report = validate_dst(opt_, routing_, encode(f));
    EXPECT_TRUE(reported(report, {"expert " + std::to_string(expert_of(a)) + " rank " + std::to_string(a.rank),
                                  "stay on their source rank"}));
}

TEST_F(DstMutation, CrossingCounterWrong) {
    Plan p = opt_;
    const auto dst = testing::all_dst(p, routing_);
    p.crossing_out[1] += 1;
    const ValidationReport report = validate_dst(p, routing_, dst);
    EXPECT_TRUE(reported(report, {"dst: rank 1", "plan crossing_out = " + std::to_string(opt_.crossing_out[1] + 1)}));
    EXPECT_TRUE(reported(report, {"counters: rank 1", "crossing_out"}));
}

TEST_F(DstMutation, RoutingDisagreesWithTpe) {
    Routing other = routing_;
    int i = 0;
    while (other.topk_idx[2][i] == -1) ++i;
    const int32_t before = other.topk_idx[2][i];
    // Move the entry to an expert the token does not use yet.
    int32_t after = 0;
    const int t = i / cfg_.K;
    auto used = [&](int32_t e) {
        for (int k = 0; k < cfg_.K; ++k)
            if (other.topk_idx[2][t * cfg_.K + k] == e) return true;
        return false;
    };
    while (used(after)) ++after;
    other.topk_idx[2][i] = after;
    const ValidationReport report = validate_dst(ref_, other, testing::all_dst(ref_, routing_));
    EXPECT_TRUE(reported(report, {"routing: rank 2 expert " + std::to_string(before)}));
    EXPECT_TRUE(reported(report, {"routing: rank 2 expert " + std::to_string(after)}));
}

TEST_F(DstMutation, AnySingleCodeChangeIsReported) {
    // Every code is determined by the plan and the routing, so changing any one of them must be reported.
    testing::TestRng rng(77);
    const int32_t deltas[] = {-2, -1, 1, 2, 1000};
    for (const Plan* base : {&ref_, &opt_, &small_b_}) {
        const auto good = testing::all_dst(*base, routing_);
        for (int n = 0; n < 300; ++n) {
            auto dst = good;
            const int r = rng.below(cfg_.R);
            const int i = rng.below(static_cast<int>(dst[r].size()));
            int32_t& c = dst[r][i];
            switch (rng.below(4)) {
                case 0:  // nudge the (decoded) destination, keeping the payload/duplicate form
                    if (detail::is_masked(c)) {
                        c = 0;
                    } else {
                        const int32_t flat = std::max(0, detail::decode_dst(c) + deltas[rng.below(5)]);
                        c = c >= 0 ? flat : detail::encode_duplicate(flat);
                    }
                    break;
                case 1:  // flip payload <-> duplicate
                    if (detail::is_masked(c))
                        c = -1;
                    else
                        c = c >= 0 ? detail::encode_duplicate(c) : detail::decode_dst(c);
                    break;
                case 2:  // mask / unmask
                    c = detail::is_masked(c) ? 5 : detail::kMaskedDst;
                    break;
                case 3: {  // another entry's code
                    const int other = rng.below(cfg_.R);
                    c = good[other][rng.below(static_cast<int>(good[other].size()))];
                    break;
                }
            }
            if (c == good[r][i]) continue;
            SCOPED_TRACE("rank " + std::to_string(r) + " entry " + std::to_string(i) + ": " +
                         std::to_string(good[r][i]) + " -> " + std::to_string(c) + " in " +
                         std::string(to_string(base->mode)));
            EXPECT_FALSE(validate_dst(*base, routing_, dst).ok());
        }
    }
}

TEST_F(DstMutation, WrongNumberOfRanks) {
    auto dst = testing::all_dst(ref_, routing_);
    dst.pop_back();
    EXPECT_TRUE(reported(validate_dst(ref_, routing_, dst), {"expected R = 4"}));
}

}  // namespace
}  // namespace evenep
