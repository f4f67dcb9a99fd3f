// CPU combine and the backward calls (SPEC §4.2, §4.3) on virtual ranks.
//
// Cases:
//   Combine/SpecFormula.Bitwise/<config>_<mode>_<routing>_<weights>
//       random expert outputs y on every rank; combine output equals, bit for bit, the formula of SPEC §4.2
//       written out independently (tests/common/cpu_testing.hpp); gathered weights equal topk_w (0 masked);
//       counted traffic equals the model (one partial per (token, remote destination), bf16 or fp32).
//   CpuCombine.RoundTripIdentity            combine of the dispatched rows themselves: out = bf16(n_t * x_t).
//   CpuCombine.PartialsStayFp32             every token has >= 2 entries on one remote rank: the output equals the
//                                           fp32-partial formula and differs from a bf16-rounded-partial variant.
//   CpuCombine.FullyMaskedTokensAreZero     tokens without an unmasked entry get +0 and gathered weight 0.
//   CpuCombine.RepeatedRunsBitwise          two group combines give identical bits.
//   CpuCombine.BackwardCalls                combine_backward = dispatch with the plan reused; dispatch_backward
//                                           gathers the per-row weight gradient to [s, K] and combines grad rows.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

using testing::buffer_config;

struct CombineCase {
    std::string name;
    BufferConfig cfg;
};

std::vector<CombineCase> combine_cases() {
    // clang-format off
    return {
        {"R4_E8_K2_tp1", buffer_config(4, 8, 2, 6, 1)},
        {"R4_E16_K4_tp4", buffer_config(4, 16, 4, 23, 4)},
        {"R8_E32_K6_tp8", buffer_config(8, 32, 6, 13, 8, 24)},
        {"R2_E8_K6_tp3_dups", buffer_config(2, 8, 6, 9, 3)},
        {"R1_E4_K2", buffer_config(1, 4, 2, 7, 2)},
        {"R2_E32_K32_maxK", buffer_config(2, 32, 32, 3, 2)},
    };
    // clang-format on
}
const int kNumCombineCases = static_cast<int>(combine_cases().size());

cpu::OracleOptions options_for(const Routing& routing, PlannerMode mode) {
    cpu::OracleOptions opt;
    opt.mode = mode;
    opt.s_total = 0;
    for (int v : routing.s) opt.s_total += v;
    return opt;
}

std::vector<std::vector<float>> weights_of(const std::vector<cpu::RankTokens>& tokens) {
    std::vector<std::vector<float>> w;
    for (const auto& t : tokens) w.push_back(t.topk_w);
    return w;
}

using Param = std::tuple<int, PlannerMode, int, bool>;

class SpecFormula : public ::testing::TestWithParam<Param> {};

TEST_P(SpecFormula, Bitwise) {
    const auto [ci, mode, ri, apply] = GetParam();
    const CombineCase cc = combine_cases()[ci];
    const uint64_t seed = 3000 + 17 * ci + ri;
    const auto named = testing::test_routings(cc.cfg.cfg, seed)[ri];
    SCOPED_TRACE("seed " + std::to_string(seed) + " routing " + named.name + " " + cc.cfg.to_string());
    const auto tokens = testing::random_tokens(cc.cfg, named.routing, seed);
    const auto opt = options_for(named.routing, mode);
    const int R = cc.cfg.cfg.R, H = cc.cfg.H;
    std::vector<std::vector<Bf16>> y(R);
    for (int r = 0; r < R; ++r) y[r] = testing::random_bf16(static_cast<size_t>(cc.cfg.cfg.recv_rows()) * H, seed + r);
    const auto disp = cpu::dispatch_group(cc.cfg, tokens, opt);
    const auto res = cpu::combine_group(cc.cfg, tokens, y, apply, opt);
    const auto expected = testing::reference_combine(disp.plan, disp.dst, y, weights_of(tokens), H, apply);
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < named.routing.s[r]; ++t)
            for (int c = 0; c < H; ++c) {
                const size_t i = static_cast<size_t>(t) * H + c;
                ASSERT_EQ(res.out[r][i].bits, expected[r][i].bits)
                    << "rank " << r << " token " << t << " column " << c << ": got " << bf16_to_float(res.out[r][i])
                    << ", expected " << bf16_to_float(expected[r][i]);
            }
    for (int r = 0; r < R; ++r)
        for (size_t i = 0; i < res.gathered_w[r].size(); ++i) {
            const float expect = named.routing.topk_idx[r][i] < 0 ? 0.0f : tokens[r].topk_w[i];
            ASSERT_EQ(res.gathered_w[r][i], expect) << "rank " << r << " entry " << i;
        }
    // Traffic: combine partials plus the gathered weights, as the model counts them for dispatch_backward.
    const TrafficReport model = evenep_traffic(disp.plan, disp.dst, H, cc.cfg.ffn_hidden, true);
    EXPECT_EQ(res.traffic, model.dispatch_backward);
    PhaseTraffic partials_only = model.combine;
    EXPECT_EQ(res.traffic.rows, partials_only.rows);
    EXPECT_EQ(res.traffic.fp32_rows, partials_only.fp32_rows);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    const auto [ci, mode, ri, apply] = info.param;
    const CombineCase cc = combine_cases()[ci];
    std::string routing = testing::test_routings(cc.cfg.cfg, 1)[ri].name;
    for (char& ch : routing)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return cc.name + "_" + std::string(to_string(mode)) + "_" + routing + (apply ? "_weighted" : "_unweighted");
}

INSTANTIATE_TEST_SUITE_P(Combine,
                         SpecFormula,
                         ::testing::Combine(::testing::Range(0, kNumCombineCases),
                                            ::testing::Values(PlannerMode::kReference, PlannerMode::kOptimized),
                                            ::testing::Range(0, 9),
                                            ::testing::Bool()),
                         param_name);

TEST(CpuCombine, RoundTripIdentity) {
    const BufferConfig cfg = buffer_config(4, 16, 5, 29, 4);
    const uint64_t seed = 41;
    const Routing routing = make_adversarial({4, 16, 5, 29, seed}, Adversarial::kMasked);
    const auto tokens = testing::random_tokens(cfg, routing, seed);
    const auto res = cpu::combine_group(cfg, tokens, {}, false);  // y = the dispatched rows, in place
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < routing.s[r]; ++t) {
            int n = 0;
            for (int k = 0; k < 5; ++k) n += routing.topk_idx[r][static_cast<size_t>(t) * 5 + k] >= 0 ? 1 : 0;
            for (int c = 0; c < cfg.H; ++c) {
                const size_t i = static_cast<size_t>(t) * cfg.H + c;
                const Bf16 expect =
                    n == 0 ? Bf16{0} : float_to_bf16(static_cast<float>(n) * bf16_to_float(tokens[r].x[i]));
                ASSERT_EQ(res.out[r][i].bits, expect.bits) << "rank " << r << " token " << t << " (n = " << n << ")";
            }
        }
}

TEST(CpuCombine, PartialsStayFp32) {
    const BufferConfig cfg = buffer_config(4, 16, 4, 40, 2);
    const uint64_t seed = 43;
    // Token t of rank r: two experts on rank r+1 and two on rank r+2 (mod 4), so each token has two fp32
    // partials and rounding the first to bf16 before adding the second would show.
    Routing routing;
    routing.R = 4;
    routing.E = 16;
    routing.K = 4;
    routing.S = 40;
    routing.s.assign(4, 40);
    routing.topk_idx.resize(4);
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < 40; ++t)
            for (int k = 0; k < 4; ++k) {
                const int d = (r + 1 + k / 2) % 4;
                routing.topk_idx[r].push_back(d * 4 + (t + k % 2) % 4);
            }
    const auto tokens = testing::random_tokens(cfg, routing, seed);
    const int64_t nvs = cfg.cfg.recv_rows();
    std::vector<std::vector<Bf16>> y(4);
    for (int r = 0; r < 4; ++r) y[r] = testing::random_bf16(static_cast<size_t>(nvs) * cfg.H, seed + 10 + r);
    const auto disp = cpu::dispatch_group(cfg, tokens, {PlannerMode::kReference});
    const auto res = cpu::combine_group(cfg, tokens, y, true, {PlannerMode::kReference});
    const auto exact = testing::reference_combine(disp.plan, disp.dst, y, weights_of(tokens), cfg.H, true);
    EXPECT_EQ(res.out, exact);
    EXPECT_GT(res.traffic.fp32_rows, 0);
    // The upstream variant: each destination's partial rounded to bf16 before it crosses.
    int64_t differ = 0;
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < routing.s[r]; ++t) {
            std::vector<int> order;
            for (int k = 0; k < 4; ++k) {
                const int d = static_cast<int>(detail::decode_dst(disp.dst[r][t * 4 + k]) / nvs);
                if (std::find(order.begin(), order.end(), d) == order.end()) order.push_back(d);
            }
            for (int c = 0; c < cfg.H; ++c) {
                float acc = 0.0f;
                for (int d : order) {
                    float p = 0.0f;
                    for (int k = 0; k < 4; ++k) {
                        const int32_t flat = detail::decode_dst(disp.dst[r][t * 4 + k]);
                        if (flat / nvs != d) continue;
                        p += tokens[r].topk_w[t * 4 + k] * bf16_to_float(y[d][(flat % nvs) * cfg.H + c]);
                    }
                    acc += round_to_bf16(p);
                }
                differ += float_to_bf16(acc).bits != res.out[r][static_cast<size_t>(t) * cfg.H + c].bits ? 1 : 0;
            }
        }
    EXPECT_GT(differ, 0) << "rounding partials to bf16 never changed the result: the test does not discriminate";
}

TEST(CpuCombine, FullyMaskedTokensAreZero) {
    const BufferConfig cfg = buffer_config(4, 8, 3, 9, 2);
    const uint64_t seed = 47;
    Routing routing = make_lognormal({4, 8, 3, 9, seed}, 1.0);
    for (int r = 0; r < 4; ++r)
        for (int k = 0; k < 3; ++k) routing.topk_idx[r][static_cast<size_t>(r) * 3 + k] = -1;  // token r masked
    const auto tokens = testing::random_tokens(cfg, routing, seed);
    const auto res = cpu::combine_group(cfg, tokens, {}, true);
    for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < cfg.H; ++c) EXPECT_EQ(res.out[r][static_cast<size_t>(r) * cfg.H + c].bits, 0);
        for (int k = 0; k < 3; ++k) EXPECT_EQ(res.gathered_w[r][static_cast<size_t>(r) * 3 + k], 0.0f);
    }
}

TEST(CpuCombine, RepeatedRunsBitwise) {
    const BufferConfig cfg = buffer_config(8, 32, 6, 31, 8);
    const uint64_t seed = 53;
    const Routing routing = make_lognormal({8, 32, 6, 31, seed}, 2.0);
    const auto tokens = testing::random_tokens(cfg, routing, seed);
    const auto a = cpu::combine_group(cfg, tokens, {}, true);
    const auto b = cpu::combine_group(cfg, tokens, {}, true);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.gathered_w, b.gathered_w);
    EXPECT_EQ(a.traffic, b.traffic);
}

TEST(CpuCombine, BackwardCalls) {
    const BufferConfig cfg = buffer_config(4, 16, 4, 21, 4);
    const uint64_t seed = 59;
    const Routing routing = make_lognormal({4, 16, 4, 21, seed}, 1.5);
    const auto tokens = testing::random_tokens(cfg, routing, seed);
    const auto grads = testing::random_tokens(cfg, routing, seed + 1);  // grad_out rows
    const int64_t nvs = cfg.cfg.recv_rows();
    const auto fresh = cpu::dispatch_group(cfg, grads);  // same routing, so the same plan
    cpu::LocalTeamGroup group(4, std::chrono::milliseconds(20000));
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        cpu::Buffer buffer(team, cfg);
        cpu::DispatchArgs a;
        a.s = tokens[r].s;
        a.x = tokens[r].x;
        a.topk_idx = tokens[r].topk_idx;
        a.topk_w = tokens[r].topk_w;
        cpu::DispatchHandle h = buffer.dispatch(a);
        std::vector<Bf16> out(static_cast<size_t>(h.s) * cfg.H);
        cpu::CombineArgs ca;
        ca.apply_weights = true;
        ca.out = out;
        buffer.combine(h, ca);
        // combine_backward: the gradient rows land where a fresh dispatch would put them.
        buffer.combine_backward(h, grads[r].x);
        const int64_t used = static_cast<int64_t>(h.rows_used()) * cfg.H;
        EXPECT_TRUE(std::equal(buffer.recv_x().begin(), buffer.recv_x().begin() + used, fresh.recv_x[r].begin()))
            << "rank " << r;
        // dispatch_backward: per-row weight gradient = the row index, so the gathered value names the row.
        std::vector<float> grad_w_rows(static_cast<size_t>(nvs));
        for (int64_t row = 0; row < nvs; ++row) grad_w_rows[row] = static_cast<float>(row);
        std::vector<Bf16> grad_x(static_cast<size_t>(h.s) * cfg.H);
        std::vector<float> grad_topk_w(static_cast<size_t>(h.s) * cfg.cfg.K);
        buffer.dispatch_backward(h, {}, grad_w_rows, grad_x, grad_topk_w);
        for (int t = 0; t < h.s; ++t) {
            int n = 0;
            for (int k = 0; k < cfg.cfg.K; ++k) {
                const size_t i = static_cast<size_t>(t) * cfg.cfg.K + k;
                if (detail::is_masked(h.dst[i])) {
                    EXPECT_EQ(grad_topk_w[i], 0.0f);
                    continue;
                }
                ++n;
                EXPECT_EQ(grad_topk_w[i], static_cast<float>(detail::decode_dst(h.dst[i]) % nvs))
                    << "rank " << r << " token " << t << " k " << k;
            }
            for (int c = 0; c < cfg.H; ++c) {
                const size_t i = static_cast<size_t>(t) * cfg.H + c;
                EXPECT_EQ(grad_x[i].bits, float_to_bf16(n * bf16_to_float(grads[r].x[i])).bits);
            }
        }
    });
}

}  // namespace
}  // namespace evenep
