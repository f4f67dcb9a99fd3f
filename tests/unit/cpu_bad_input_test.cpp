// Bad input to the CPU data path (SPEC §8): clear errors on every rank, no hang, buffers usable afterwards.
//
// Each case makes one call with bad input on R = 4 ranks, checks every rank's error (the offending rank names
// the value, the others report "peer rank N"), then runs a correct dispatch + combine in the same buffers and
// compares the output bit for bit with the oracle (a fresh group).
//
// Cases (BadInput/AfterError.BufferStaysUsable/<case>):
//   s_above_S, s_zero, x_too_short, weights_too_short, ids_too_short, id_equals_E, id_minus_two,
//   caller_histogram_wrong, caller_histogram_size          one rank's dispatch input is wrong
//   unequal_s_without_total, s_total_wrong, s_total_differs  group-level inconsistency: every rank names it
//   combine_out_too_short, combine_stale_handle, combine_y_size, reuse_x_too_short   combine/reuse input wrong
// Plus:
//   CpuBadInput.BadConfig            H not a multiple of 8, team size != R: errors before any collective.
//   CpuBadInput.TrainingNeedsFullB   a MoE layer with B < epn refuses backward on every rank (no hang).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using namespace std::chrono_literals;

constexpr int kR = 4, kE = 16, kK = 3, kS = 12;
constexpr int kBad = 2;  // the rank with the bad input

struct Ctx {
    int rank;
    cpu::Buffer& buffer;
    const cpu::RankTokens& tok;
    cpu::DispatchArgs args;  // valid arguments; a case changes a copy
};

struct BadCase {
    std::string name;
    bool every_rank_names_it;  // a group-level inconsistency rather than one rank's bad input
    std::string needle;        // in the message of the offending rank (or of every rank)
    std::function<void(Ctx&)> call;
};

std::vector<BadCase> bad_cases() {
    auto on_bad = [](auto mutate) {
        return [mutate](Ctx& c) {
            cpu::DispatchArgs a = c.args;
            std::vector<int32_t> ids(c.tok.topk_idx);
            std::vector<int32_t> tpe;
            if (c.rank == kBad) mutate(a, ids, tpe);
            a.topk_idx = ids;
            if (!tpe.empty()) a.tpe = tpe;
            (void)c.buffer.dispatch(a);
        };
    };
    using A = cpu::DispatchArgs;
    using V = std::vector<int32_t>;
    return {
        {"s_above_S", false, "s = 13 outside [1, S = 12]", on_bad([](A& a, V&, V&) { a.s = kS + 1; })},
        {"s_zero", false, "s = 0 outside", on_bad([](A& a, V&, V&) { a.s = 0; })},
        {"x_too_short", false, "x has", on_bad([](A& a, V&, V&) { a.x = a.x.first(a.x.size() - 1); })},
        {"weights_too_short", false, "topk_w has",
         on_bad([](A& a, V&, V&) { a.topk_w = a.topk_w.first(a.topk_w.size() - 1); })},
        {"ids_too_short", false, "topk_idx has", on_bad([](A&, V& ids, V&) { ids.pop_back(); })},
        {"id_equals_E", false, "expert id 16", on_bad([](A&, V& ids, V&) { ids[4] = kE; })},
        {"id_minus_two", false, "expert id -2", on_bad([](A&, V& ids, V&) { ids[0] = -2; })},
        {"caller_histogram_wrong", false, "caller histogram says", on_bad([](A&, V& ids, V& tpe) {
             tpe.assign(kE, 0);
             for (int32_t e : ids)
                 if (e >= 0) ++tpe[e];
             tpe[ids[0] >= 0 ? ids[0] : 0] += 1;
         })},
        {"caller_histogram_size", false, "expected E = 16", on_bad([](A&, V&, V& tpe) { tpe.assign(kE - 1, 0); })},
        {"unequal_s_without_total", true, "rank 2 passes s = 11 but rank 0 passes s = 12",
         [](Ctx& c) {
             cpu::DispatchArgs a = c.args;
             if (c.rank == kBad) {
                 a.s = kS - 1;
                 a.x = a.x.first(static_cast<size_t>(a.s) * c.buffer.config().H);
                 a.topk_idx = a.topk_idx.first(static_cast<size_t>(a.s) * kK);
                 a.topk_w = a.topk_w.first(static_cast<size_t>(a.s) * kK);
             }
             (void)c.buffer.dispatch(a);
         }},
        {"s_total_wrong", true, "but s_total = 47",
         [](Ctx& c) {
             cpu::DispatchArgs a = c.args;
             a.s_total = kR * kS - 1;
             (void)c.buffer.dispatch(a);
         }},
        {"s_total_differs", true, "rank 2 passes s_total = 48 but rank 0 passes -1",
         [](Ctx& c) {
             cpu::DispatchArgs a = c.args;
             if (c.rank == kBad) a.s_total = kR * kS;
             (void)c.buffer.dispatch(a);
         }},
        {"combine_out_too_short", false, "out has",
         [](Ctx& c) {
             cpu::DispatchHandle h = c.buffer.dispatch(c.args);
             std::vector<Bf16> out(static_cast<size_t>(h.s) * c.buffer.config().H - (c.rank == kBad ? 1 : 0));
             cpu::CombineArgs ca;
             ca.out = out;
             c.buffer.combine(h, ca);
         }},
        {"combine_stale_handle", false, "not the one of the last dispatch",
         [](Ctx& c) {
             cpu::DispatchHandle h1 = c.buffer.dispatch(c.args);
             cpu::DispatchHandle h2 = c.buffer.dispatch(c.args);
             std::vector<Bf16> out(static_cast<size_t>(h1.s) * c.buffer.config().H);
             cpu::CombineArgs ca;
             ca.out = out;
             c.buffer.combine(c.rank == kBad ? h1 : h2, ca);
         }},
        {"combine_y_size", false, "expert outputs have",
         [](Ctx& c) {
             cpu::DispatchHandle h = c.buffer.dispatch(c.args);
             std::vector<Bf16> out(static_cast<size_t>(h.s) * c.buffer.config().H);
             std::vector<Bf16> y(c.rank == kBad ? 5 : c.buffer.recv_x().size());
             cpu::CombineArgs ca;
             ca.y = y;
             ca.out = out;
             c.buffer.combine(h, ca);
         }},
        {"reuse_x_too_short", false, "x has",
         [](Ctx& c) {
             cpu::DispatchHandle h = c.buffer.dispatch(c.args);
             c.buffer.dispatch(h, c.args.x.first(c.args.x.size() - (c.rank == kBad ? 8 : 0)));
         }},
    };
}

class AfterError : public ::testing::TestWithParam<int> {};

TEST_P(AfterError, BufferStaysUsable) {
    const BadCase bc = bad_cases()[GetParam()];
    const BufferConfig cfg = testing::buffer_config(kR, kE, kK, kS, 4);
    const uint64_t seed = 71;
    const Routing routing = make_lognormal({kR, kE, kK, kS, seed}, 1.0);
    const auto tokens = testing::random_tokens(cfg, routing, seed);
    const auto expected = cpu::combine_group(cfg, tokens, {}, true);
    cpu::LocalTeamGroup group(kR, 20000ms);
    std::vector<std::string> msg(kR);
    std::vector<ErrorKind> kind(kR, ErrorKind::kInternal);
    std::vector<std::vector<Bf16>> out(kR);
    const auto errors = cpu::run_ranks(group, [&](Team& team) {
        const int r = team.rank();
        cpu::Buffer buffer(team, cfg);
        cpu::DispatchArgs a;
        a.s = tokens[r].s;
        a.x = tokens[r].x;
        a.topk_idx = tokens[r].topk_idx;
        a.topk_w = tokens[r].topk_w;
        Ctx ctx{r, buffer, tokens[r], a};
        try {
            bc.call(ctx);
        } catch (const Error& e) {
            msg[r] = e.what();
            kind[r] = e.kind();
        }
        cpu::DispatchHandle h = buffer.dispatch(a);
        out[r].resize(static_cast<size_t>(h.s) * cfg.H);
        cpu::CombineArgs ca;
        ca.apply_weights = true;
        ca.out = out[r];
        buffer.combine(h, ca);
    });
    for (int r = 0; r < kR; ++r) {
        ASSERT_FALSE(errors[r]) << "rank " << r << " failed after the bad call";
        ASSERT_FALSE(msg[r].empty()) << "rank " << r << " did not report the bad input";
        EXPECT_EQ(kind[r], ErrorKind::kInvalidArgument) << msg[r];
        if (bc.every_rank_names_it || r == kBad) {
            EXPECT_NE(msg[r].find(bc.needle), std::string::npos) << "rank " << r << ": " << msg[r];
            if (!bc.every_rank_names_it) {
                EXPECT_NE(msg[r].find("rank 2"), std::string::npos) << msg[r];
            }
        } else {
            EXPECT_EQ(msg[r].rfind("peer rank 2", 0), 0u) << "rank " << r << ": " << msg[r];
        }
    }
    EXPECT_EQ(out, expected.out);
}

INSTANTIATE_TEST_SUITE_P(BadInput,
                         AfterError,
                         ::testing::Range(0, static_cast<int>(bad_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return bad_cases()[info.param].name; });

TEST(CpuBadInput, BadConfig) {
    cpu::LocalTeamGroup group(4, 2000ms);
    BufferConfig bad_h = testing::buffer_config(4, 8, 2, 4, 4, 12);
    BufferConfig bad_r = testing::buffer_config(2, 8, 2, 4, 4);
    const auto errors = cpu::run_ranks(group, [&](Team& team) {
        try {
            cpu::Buffer b(team, bad_h);
            ADD_FAILURE() << "H = 12 accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("H = 12"), std::string::npos) << e.what();
        }
        try {
            cpu::Buffer b(team, bad_r);
            ADD_FAILURE() << "team of 4 accepted for R = 2";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("team size 4 differs from R = 2"), std::string::npos) << e.what();
        }
    });
    for (const auto& e : errors) EXPECT_FALSE(e);
}

TEST(CpuBadInput, TrainingNeedsFullB) {
    BufferConfig cfg = testing::buffer_config(4, 16, 2, 8, 2, 16, 8, /*B=*/1);
    const Routing routing = make_adversarial({4, 16, 2, 8, 3}, Adversarial::kSingleHotExpert);
    const auto problem = cpu::make_moe_problem(cfg, routing.topk_idx, routing.s, 3);
    cpu::MoeRunOptions opt;
    opt.barrier_timeout = 20000ms;
    try {
        (void)cpu::run_moe_layer(problem, opt);
        ADD_FAILURE() << "backward with B < epn accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("training needs B = epn"), std::string::npos) << e.what();
    }
    opt.backward = false;  // inference with B < epn is fine
    const auto res = cpu::run_moe_layer(problem, opt);
    EXPECT_EQ(res.out.size(), 4u);
}

}  // namespace
}  // namespace evenep
