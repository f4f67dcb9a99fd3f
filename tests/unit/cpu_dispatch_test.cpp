// CPU dispatch (SPEC §4.1, §3.4) on virtual ranks.
//
// Cases:
//   Dispatch/TaggedPayloads.EveryEntryAndPadding/<config>_<mode>_<routing>
//       tagged rows (rank, token, column) land in every entry's row, duplicates included; weights per entry;
//       every row of every segment is hit exactly once; padding rows zero (payload and weight); chain metadata
//       (head return address names the source, duplicates reachable from their head); traffic equals the model.
//   Dispatch/RepeatedRuns.Bitwise/<config>_<mode>          two group dispatches: identical plan, dst and buffers.
//   CpuDispatch.PlanReuseBitwise                          dispatch(h, x) reproduces the rows of dispatch(args)
//                                                          bit for bit; with new x, the new rows.
//   CpuDispatch.StaleRowsAndPaddingAfterSecondDispatch     a second routing in the same buffer: padding zero.
//   CpuDispatch.UnequalSWithGroupTotal                     unequal s_r with s_total; every entry placed.
//   CpuDispatch.CallerHistogramAccepted                    a correct caller histogram changes nothing.
//   CpuDispatch.AllEntriesMasked                           N = 0: empty segments, nothing sent.
//   CpuDispatch.SingleRank                                 R = 1: everything local, no traffic.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

using testing::buffer_config;
using testing::tag;

struct DispatchCase {
    std::string name;
    BufferConfig cfg;
};

std::vector<DispatchCase> dispatch_cases() {
    // clang-format off
    return {
        {"R4_E8_K2_tp1", buffer_config(4, 8, 2, 6, 1)},
        {"R4_E16_K4_tp4", buffer_config(4, 16, 4, 23, 4)},
        {"R8_E32_K6_tp8", buffer_config(8, 32, 6, 13, 8, 24)},
        {"R2_E8_K6_tp3_dups", buffer_config(2, 8, 6, 9, 3)},
        {"R2_E4_K4_allExperts", buffer_config(2, 4, 4, 5, 2)},
        {"R1_E4_K2", buffer_config(1, 4, 2, 7, 2)},
        {"R2_E32_K32_maxK", buffer_config(2, 32, 32, 3, 2)},
    };
    // clang-format on
}
const int kNumDispatchCases = static_cast<int>(dispatch_cases().size());

using Param = std::tuple<int, PlannerMode, int>;  // case index, mode, routing index (of test_routings)

void check_dispatch(const BufferConfig& cfg,
                    const Routing& routing,
                    const std::vector<cpu::RankTokens>& tokens,
                    const cpu::GroupDispatchResult& res) {
    const int R = cfg.cfg.R, K = cfg.cfg.K, H = cfg.H;
    const int64_t nvs = cfg.cfg.recv_rows();
    const auto kinds = testing::row_kinds(res.plan);
    std::vector<std::vector<int>> hits(R, std::vector<int>(nvs, 0));
    for (int r = 0; r < R; ++r) {
        ASSERT_EQ(res.dst[r].size(), static_cast<size_t>(routing.s[r]) * K);
        for (int t = 0; t < routing.s[r]; ++t)
            for (int k = 0; k < K; ++k) {
                const size_t i = static_cast<size_t>(t) * K + k;
                const int32_t code = res.dst[r][i];
                if (routing.topk_idx[r][i] < 0) {
                    EXPECT_EQ(code, detail::kMaskedDst) << "rank " << r << " token " << t << " k " << k;
                    continue;
                }
                const int32_t flat = detail::decode_dst(code);
                const int d = static_cast<int>(flat / nvs);
                const int64_t row = flat % nvs;
                ASSERT_EQ(kinds[d][row], 1) << "rank " << r << " token " << t << " k " << k << " -> rank " << d
                                            << " row " << row << " which holds no entry";
                ++hits[d][row];
                const Bf16* got = res.recv_x[d].data() + row * H;
                for (int c = 0; c < H; ++c)
                    ASSERT_EQ(got[c], tag(r, t, c))
                        << "rank " << d << " row " << row << " column " << c << " holds " << testing::describe_row(got)
                        << ", expected rank " << r << " token " << t << " (k " << k << ")";
                EXPECT_EQ(res.recv_w[d][row], tokens[r].topk_w[i]) << "weight of rank " << r << " token " << t;
                const int32_t ret = res.recv_ret[d][row];
                if (detail::is_payload(code)) {
                    ASSERT_GE(ret, 0);
                    EXPECT_EQ(detail::ret_rank(ret, cfg.layout().stage_units()), r);
                } else {
                    EXPECT_EQ(ret, detail::kRetDuplicate);
                }
            }
    }
    for (int d = 0; d < R; ++d)
        for (int64_t row = 0; row < nvs; ++row) {
            if (kinds[d][row] == 1) {
                EXPECT_EQ(hits[d][row], 1) << "rank " << d << " row " << row;
            } else if (kinds[d][row] == 2) {
                for (int c = 0; c < H; ++c)
                    ASSERT_EQ(res.recv_x[d][row * H + c].bits, 0) << "padding rank " << d << " row " << row;
                EXPECT_EQ(res.recv_w[d][row], 0.0f) << "padding weight rank " << d << " row " << row;
                EXPECT_EQ(res.recv_ret[d][row], detail::kRetPadding);
            }
        }
    // The traffic the ranks counted equals the model from the plan alone.
    const TrafficReport model = evenep_traffic(res.plan, res.dst, H, cfg.ffn_hidden, false);
    EXPECT_EQ(res.traffic, model.dispatch);
    EXPECT_EQ(res.gather_traffic, model.gather);
}

class TaggedPayloads : public ::testing::TestWithParam<Param> {};

TEST_P(TaggedPayloads, EveryEntryAndPadding) {
    const auto [ci, mode, ri] = GetParam();
    const DispatchCase dc = dispatch_cases()[ci];
    const uint64_t seed = 1000 + ci;
    const auto named = testing::test_routings(dc.cfg.cfg, seed)[ri];
    SCOPED_TRACE("seed " + std::to_string(seed) + " routing " + named.name + " " + dc.cfg.to_string());
    const auto tokens = testing::tagged_tokens(dc.cfg, named.routing, seed);
    cpu::OracleOptions opt;
    opt.mode = mode;
    for (int v : named.routing.s) opt.s_total = (opt.s_total < 0 ? 0 : opt.s_total) + v;
    const auto res = cpu::dispatch_group(dc.cfg, tokens, opt);
    // Perfect balance: q_r entries per rank.
    for (int r = 0; r < dc.cfg.cfg.R; ++r) {
        int64_t used = 0;
        for (int g = 0; g < res.plan.G(); ++g) used += res.plan.group_count[static_cast<size_t>(r) * res.plan.G() + g];
        EXPECT_EQ(used, res.plan.q[r]) << "rank " << r;
    }
    check_dispatch(dc.cfg, named.routing, tokens, res);
}

class RepeatedRuns : public ::testing::TestWithParam<std::tuple<int, PlannerMode>> {};

TEST_P(RepeatedRuns, Bitwise) {
    const auto [ci, mode] = GetParam();
    const DispatchCase dc = dispatch_cases()[ci];
    const uint64_t seed = 2000 + ci;
    const auto named = testing::test_routings(dc.cfg.cfg, seed)[0];
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + dc.cfg.to_string());
    const auto tokens = testing::random_tokens(dc.cfg, named.routing, seed);
    cpu::OracleOptions opt;
    opt.mode = mode;
    opt.s_total = 0;
    for (int v : named.routing.s) opt.s_total += v;
    const auto a = cpu::dispatch_group(dc.cfg, tokens, opt);
    const auto b = cpu::dispatch_group(dc.cfg, tokens, opt);
    EXPECT_EQ(a.dst, b.dst);
    EXPECT_EQ(a.recv_x, b.recv_x);
    EXPECT_EQ(a.recv_w, b.recv_w);
    EXPECT_EQ(a.recv_next, b.recv_next);
    EXPECT_EQ(a.recv_ret, b.recv_ret);
    EXPECT_EQ(a.plan.alloc, b.plan.alloc);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    const auto [ci, mode, ri] = info.param;
    const DispatchCase dc = dispatch_cases()[ci];
    std::string routing = testing::test_routings(dc.cfg.cfg, 1)[ri].name;
    for (char& ch : routing)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return dc.name + "_" + std::string(to_string(mode)) + "_" + routing;
}

INSTANTIATE_TEST_SUITE_P(Dispatch,
                         TaggedPayloads,
                         ::testing::Combine(::testing::Range(0, kNumDispatchCases),
                                            ::testing::Values(PlannerMode::kReference, PlannerMode::kOptimized),
                                            ::testing::Range(0, 9)),
                         param_name);

INSTANTIATE_TEST_SUITE_P(Dispatch,
                         RepeatedRuns,
                         ::testing::Combine(::testing::Range(0, kNumDispatchCases),
                                            ::testing::Values(PlannerMode::kReference, PlannerMode::kOptimized)),
                         [](const ::testing::TestParamInfo<std::tuple<int, PlannerMode>>& info) {
                             return dispatch_cases()[std::get<0>(info.param)].name + "_" +
                                    std::string(to_string(std::get<1>(info.param)));
                         });

// Runs fn(rank, buffer) on R threads with one Buffer per rank.
template <typename F>
void with_buffers(const BufferConfig& cfg, F&& fn, PlannerMode mode = PlannerMode::kOptimized) {
    cpu::LocalTeamGroup group(cfg.cfg.R, std::chrono::milliseconds(20000));
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        cpu::Buffer buffer(team, cfg, mode);
        fn(team.rank(), buffer);
    });
}

cpu::DispatchArgs args_of(const cpu::RankTokens& t, int64_t s_total = -1) {
    cpu::DispatchArgs a;
    a.s = t.s;
    a.x = t.x;
    a.topk_idx = t.topk_idx;
    a.topk_w = t.topk_w;
    a.s_total = s_total;
    return a;
}

TEST(CpuDispatch, PlanReuseBitwise) {
    const BufferConfig cfg = buffer_config(4, 16, 4, 19, 4);
    const uint64_t seed = 31;
    const Routing routing = make_lognormal({4, 16, 4, 19, seed}, 1.5);
    const auto tokens = testing::tagged_tokens(cfg, routing, seed);
    const auto other = testing::random_tokens(cfg, routing, seed + 1);
    with_buffers(cfg, [&](int r, cpu::Buffer& buffer) {
        cpu::DispatchHandle h = buffer.dispatch(args_of(tokens[r]));
        const int64_t used = h.rows_used() * cfg.H;
        const std::vector<Bf16> first(buffer.recv_x().begin(), buffer.recv_x().begin() + used);
        const std::vector<float> first_w(buffer.recv_w().begin(), buffer.recv_w().begin() + h.rows_used());
        // Scribble over the used rows, then dispatch the same x with the plan reused.
        std::fill(buffer.recv_x().begin(), buffer.recv_x().end(), Bf16{0x1234});
        std::fill(buffer.recv_w().begin(), buffer.recv_w().end(), -7.0f);
        buffer.dispatch(h, tokens[r].x);
        EXPECT_TRUE(std::equal(first.begin(), first.end(), buffer.recv_x().begin())) << "rank " << r;
        EXPECT_TRUE(std::equal(first_w.begin(), first_w.end(), buffer.recv_w().begin())) << "rank " << r;
    });
    // New rows with the plan reused equal a fresh dispatch of the new rows (same routing, same plan).
    const auto fresh = cpu::dispatch_group(cfg, other);
    std::vector<std::vector<Bf16>> reused(4);
    with_buffers(cfg, [&](int r, cpu::Buffer& buffer) {
        cpu::DispatchHandle h = buffer.dispatch(args_of(tokens[r]));
        buffer.dispatch(h, other[r].x);
        reused[r].assign(buffer.recv_x().begin(), buffer.recv_x().end());
    });
    for (int r = 0; r < 4; ++r) {
        const int64_t used = fresh.plan.rows_used(r) * cfg.H;
        EXPECT_TRUE(std::equal(reused[r].begin(), reused[r].begin() + used, fresh.recv_x[r].begin())) << "rank " << r;
    }
}

TEST(CpuDispatch, StaleRowsAndPaddingAfterSecondDispatch) {
    const BufferConfig cfg = buffer_config(4, 8, 3, 17, 8);
    const uint64_t seed = 77;
    const Routing first = make_lognormal({4, 8, 3, 17, seed}, 0.5);
    const Routing second = make_adversarial({4, 8, 3, 17, seed}, Adversarial::kSingleHotExpert);
    const auto t1 = testing::random_tokens(cfg, first, seed);
    const auto t2 = testing::tagged_tokens(cfg, second, seed);
    const auto expected = cpu::dispatch_group(cfg, t2);
    std::vector<std::vector<Bf16>> got(4);
    std::vector<std::vector<float>> got_w(4);
    with_buffers(cfg, [&](int r, cpu::Buffer& buffer) {
        (void)buffer.dispatch(args_of(t1[r]));
        std::fill(buffer.recv_x().begin(), buffer.recv_x().end(), Bf16{0x4242});  // stale garbage everywhere
        std::fill(buffer.recv_w().begin(), buffer.recv_w().end(), 3.0f);
        (void)buffer.dispatch(args_of(t2[r]));
        got[r].assign(buffer.recv_x().begin(), buffer.recv_x().end());
        got_w[r].assign(buffer.recv_w().begin(), buffer.recv_w().end());
    });
    const auto kinds = testing::row_kinds(expected.plan);
    for (int r = 0; r < 4; ++r)
        for (int64_t row = 0; row < cfg.cfg.recv_rows(); ++row) {
            if (kinds[r][row] == 0) continue;  // past the last segment: undefined
            for (int c = 0; c < cfg.H; ++c)
                ASSERT_EQ(got[r][row * cfg.H + c], expected.recv_x[r][row * cfg.H + c])
                    << "rank " << r << " row " << row << (kinds[r][row] == 2 ? " (padding)" : "");
            ASSERT_EQ(got_w[r][row], expected.recv_w[r][row]) << "rank " << r << " row " << row;
        }
}

TEST(CpuDispatch, UnequalSWithGroupTotal) {
    const BufferConfig cfg = buffer_config(4, 16, 4, 21, 4);
    const uint64_t seed = 5;
    const Routing routing = make_adversarial({4, 16, 4, 21, seed}, Adversarial::kUnequalS);
    ASSERT_NE(routing.s[0], routing.s[3]);
    const auto tokens = testing::tagged_tokens(cfg, routing, seed);
    cpu::OracleOptions opt;
    opt.s_total = 0;
    for (int v : routing.s) opt.s_total += v;
    const auto res = cpu::dispatch_group(cfg, tokens, opt);
    EXPECT_EQ(res.plan.s, routing.s);
    check_dispatch(cfg, routing, tokens, res);
}

TEST(CpuDispatch, CallerHistogramAccepted) {
    const BufferConfig cfg = buffer_config(4, 8, 2, 11, 2);
    const Routing routing = make_lognormal({4, 8, 2, 11, 9}, 1.0);
    const auto tokens = testing::tagged_tokens(cfg, routing, 9);
    const auto tpe = routing.tpe();
    const auto expected = cpu::dispatch_group(cfg, tokens);
    std::vector<std::vector<Bf16>> got(4);
    with_buffers(cfg, [&](int r, cpu::Buffer& buffer) {
        auto a = args_of(tokens[r]);
        a.tpe = std::span<const int32_t>(tpe).subspan(static_cast<size_t>(r) * 8, 8);
        (void)buffer.dispatch(a);
        got[r].assign(buffer.recv_x().begin(), buffer.recv_x().end());
    });
    EXPECT_EQ(got, expected.recv_x);
}

TEST(CpuDispatch, AllEntriesMasked) {
    const BufferConfig cfg = buffer_config(4, 8, 2, 3, 4);
    Routing routing;
    routing.R = 4;
    routing.E = 8;
    routing.K = 2;
    routing.S = 3;
    routing.s.assign(4, 3);
    routing.topk_idx.assign(4, std::vector<int32_t>(6, -1));
    const auto tokens = testing::tagged_tokens(cfg, routing, 1);
    const auto res = cpu::dispatch_group(cfg, tokens);
    for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(res.plan.rows_used(r), 0);
        for (int32_t code : res.dst[r]) EXPECT_EQ(code, detail::kMaskedDst);
    }
    EXPECT_EQ(res.traffic.bytes, 0);
    const auto comb = cpu::combine_group(cfg, tokens, {}, true);
    for (int r = 0; r < 4; ++r) {
        for (Bf16 v : comb.out[r]) EXPECT_EQ(v.bits, 0);
        for (float w : comb.gathered_w[r]) EXPECT_EQ(w, 0.0f);
    }
}

TEST(CpuDispatch, SingleRank) {
    const BufferConfig cfg = buffer_config(1, 4, 3, 9, 2);
    const Routing routing = make_lognormal({1, 4, 3, 9, 3}, 1.0);
    const auto tokens = testing::tagged_tokens(cfg, routing, 3);
    const auto res = cpu::dispatch_group(cfg, tokens);
    check_dispatch(cfg, routing, tokens, res);
    EXPECT_EQ(res.traffic.bytes, 0);
    EXPECT_EQ(res.gather_traffic.bytes, 0);
}

}  // namespace
}  // namespace evenep
