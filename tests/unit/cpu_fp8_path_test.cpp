// The FP8 data path of the CPU oracle (docs/fp8.md): layout regions, config checks, FP8 dispatch bit for bit, the
// bf16-partials combine knob, the block-scaled grouped GEMM against its derived bound, and the FP8 MoE layer
// against the dense float64 reference on adversarial routings.
//
// Cases:
//   CpuFp8Path.LayoutRegionsAreAdditive   fp8 off: every region and the total as before (0-byte FP8 regions); fp8
//                                         on: bf16 offsets unchanged, recv_x8 = NvS*H, recv_scale = NvS*H/128*4,
//                                         pool/weights e4m3 regions + scales, all aligned; sizes from the config only.
//   CpuFp8Path.ConfigChecks               fp8 with H = 200 / H' = 100 refused naming the value; ue8m0 without fp8.
//   CpuFp8Path.DispatchBitwise/<routing>  every head row = fp8_quantize_act_block of its source token (found by its
//                                         return address), duplicates = their head, padding codes +0 and scale 0;
//                                         recv_w/next/ret and dst as the bf16 dispatch; bytes = rows*(H + H/32) +
//                                         entries*12 (fp32 scales); row payload <= 0.53x the bf16 dispatch's.
//   CpuFp8Path.DispatchRefusesNonFinite   a NaN / an inf in x: every rank throws before a payload moves, the message
//                                         names rank, token and channel.
//   CpuFp8Path.Bf16PartialsCombine        knob on: output = the reference formula with bf16-rounded multi-entry
//                                         partials, bit for bit; no fp32 partial crosses; bytes drop by fp32_rows*2H.
//   CpuFp8Path.PrefetchE4m3/<direct|relay>  hot-expert plan (8 ranks, relay tree off/on): after cast_fp8, every slot
//                                         holds its expert's e4m3 codes and scales = quantize_weight_fp8 of the home's
//                                         master weights, bit for bit (relayed slots via their relay's e4m3 slot);
//                                         bytes = copies*3*(H*H' + scales*4); a second prefetch moves nothing and
//                                         casts nothing; a weight change at one home re-casts and re-copies its
//                                         experts.
//   CpuFp8Path.GemmWithinDerivedBound     grouped_gemm_fp8 (plain, transposed, accumulate; fp32 and UE8M0 scales;
//                                         an outlier block and a zero row) against the float64 product of the
//                                         unquantised operands, element by element within the bound of docs/fp8.md.
//   CpuFp8Path.GemmAccumulationOrder      one element recomputed by the documented order (per 128-K block partial,
//                                         scaled by sa*sw, summed ascending) equals the GEMM bit for bit.
//   CpuFp8Path.LayerAdversarial/<case>    FP8 layer (forward + backward) on hot expert, one-token experts, amax
//                                         outliers in 128-blocks, zero rows: output within the documented tolerance
//                                         of the float64 reference, zero-input tokens give exactly +0, same plan
//                                         as bf16, dispatch and prefetch bytes below bf16's, gradients finite.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/expert_pool.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/error.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

using testing::buffer_config;

BufferConfig fp8_config(BufferConfig c, bool ue8m0 = false) {
    c.precision.fp8 = true;
    c.precision.ue8m0 = ue8m0;
    return c;
}

cpu::OracleOptions options_for(const Routing& routing) {
    cpu::OracleOptions opt;
    opt.s_total = 0;
    for (int v : routing.s) opt.s_total += v;
    return opt;
}

TEST(CpuFp8Path, LayoutRegionsAreAdditive) {
    const BufferConfig off = buffer_config(4, 16, 4, 37, 2, 384, 256);
    const BufferConfig on = fp8_config(off);
    const detail::BufferLayout a = off.layout(), b = on.layout();
    EXPECT_EQ(a.recv_x8_bytes(), 0);
    EXPECT_EQ(a.recv_scale_bytes(), 0);
    EXPECT_EQ(a.recv_x8_offset, a.total_bytes);
    EXPECT_EQ(a.total_bytes, detail::BufferLayout::make(4, 16, 4, 37, 2, 384).total_bytes);
    EXPECT_EQ(b.recv_x_offset, a.recv_x_offset);
    EXPECT_EQ(b.stage_offset, a.stage_offset);
    EXPECT_EQ(b.recv_x8_offset, a.total_bytes);
    EXPECT_EQ(b.recv_x8_bytes(), b.num_recv_rows * 384);
    EXPECT_EQ(b.recv_scale_bytes(), b.num_recv_rows * 3 * 4);
    EXPECT_EQ(b.recv_x8_offset % detail::kBufferAlignBytes, 0);
    EXPECT_EQ(b.recv_scale_offset % detail::kBufferAlignBytes, 0);
    EXPECT_EQ(b.total_bytes, b.recv_scale_offset + detail::align_bytes(b.recv_scale_bytes()));

    const detail::ExpertPoolLayout pa = off.pool_layout(), pb = on.pool_layout();
    const detail::ExpertWeightsLayout wa = off.weights_layout(), wb = on.weights_layout();
    EXPECT_EQ(pa.total_bytes, detail::ExpertPoolLayout::make(off.cfg.num_slots(), 384, 256).total_bytes);
    EXPECT_EQ(wa.total_bytes, detail::ExpertWeightsLayout::make(off.cfg.epn(), 384, 256).total_bytes);
    EXPECT_EQ(pb.expert_scales(), 3 * 2);
    for (int p = 0; p < detail::kNumProjections; ++p) {
        EXPECT_EQ(pb.slot_w_offset[p], pa.slot_w_offset[p]);
        EXPECT_EQ(pb.slot_grad_offset[p], pa.slot_grad_offset[p]);
        EXPECT_EQ(wb.w_offset[p], wa.w_offset[p]);
        EXPECT_GE(pb.slot_w8_offset[p], pa.total_bytes);
        EXPECT_EQ(pb.slot_scale(p, 1) - pb.slot_scale(p, 0), 6 * 4);
        EXPECT_EQ(wb.weight8(p, 1) - wb.weight8(p, 0), 384 * 256);
    }
    EXPECT_EQ(wb.total_bytes - wa.total_bytes,
              3 * (detail::align_bytes(wb.epn * 384 * 256) + detail::align_bytes(wb.epn * 6 * 4)));
}

TEST(CpuFp8Path, ConfigChecks) {
    auto message = [](const BufferConfig& c) {
        try {
            c.validate();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(message(fp8_config(buffer_config(2, 4, 2, 4, 1, 200, 128))).find("H = 200"), std::string::npos);
    EXPECT_NE(message(fp8_config(buffer_config(2, 4, 2, 4, 1, 128, 100))).find("H' = 100"), std::string::npos);
    BufferConfig c = buffer_config(2, 4, 2, 4, 1, 128, 128);
    c.precision.ue8m0 = true;
    EXPECT_NE(message(c).find("ue8m0"), std::string::npos);
    EXPECT_EQ(message(fp8_config(buffer_config(2, 4, 2, 4, 1, 128, 128), true)), "");
    EXPECT_EQ(message(buffer_config(2, 4, 2, 4, 1, 200, 100)), "");  // bf16: any multiple of 8
}

class DispatchBitwise : public ::testing::TestWithParam<int> {};

TEST_P(DispatchBitwise, RowsAreTheSourceCast) {
    const BufferConfig bf = buffer_config(4, 16, 4, 24, 3, 512, 128);
    const uint64_t seed = 61;
    const auto routings = testing::test_routings(bf.cfg, seed);
    const Routing& routing = routings[static_cast<size_t>(GetParam())].routing;
    SCOPED_TRACE(routings[static_cast<size_t>(GetParam())].name);
    auto tokens = testing::random_tokens(bf, routing, seed);
    tokens[1].x[5 * 512 + 130] = float_to_bf16(-3000.0f);  // an outlier in block 1 of token 5
    for (bool ue8m0 : {false, true}) {
        const BufferConfig cfg = fp8_config(bf, ue8m0);
        const auto got = cpu::dispatch_group(cfg, tokens, options_for(routing));
        const auto ref = cpu::dispatch_group(bf, tokens, options_for(routing));
        EXPECT_EQ(got.dst, ref.dst);
        EXPECT_EQ(got.recv_w, ref.recv_w);
        EXPECT_EQ(got.recv_next, ref.recv_next);
        EXPECT_EQ(got.recv_ret, ref.recv_ret);
        const int64_t H = 512, spr = 4, U = cfg.layout().units_per_token, upr = cfg.layout().stage_units();
        const auto kinds = testing::row_kinds(got.plan);
        std::vector<Fp8E4m3> q(kFp8Block);
        for (int d = 0; d < 4; ++d)
            for (size_t row = 0; row < kinds[d].size(); ++row) {
                const Fp8E4m3* codes = got.recv_x8[d].data() + row * H;
                const float* sc = got.recv_scale[d].data() + row * spr;
                if (kinds[d][row] == 2) {
                    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(codes[i].bits, 0) << "padding row " << row;
                    for (int64_t b = 0; b < spr; ++b) ASSERT_EQ(sc[b], 0.0f);
                    continue;
                }
                const int32_t ret = got.recv_ret[d][row];
                if (kinds[d][row] != 1 || ret < 0) continue;
                const int src = detail::ret_rank(ret, upr);
                const int64_t t = detail::ret_unit(ret, upr) / U;
                for (int64_t b = 0; b < spr; ++b) {
                    const float s =
                        fp8_quantize_act_block(tokens[src].x.data() + t * H + b * kFp8Block, q.data(), ue8m0);
                    ASSERT_EQ(sc[b], s) << "rank " << d << " row " << row << " block " << b;
                    for (int i = 0; i < kFp8Block; ++i) ASSERT_EQ(codes[b * kFp8Block + i].bits, q[i].bits);
                }
                for (int32_t n = got.recv_next[d][row]; n != detail::kChainEnd; n = got.recv_next[d][n]) {
                    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(got.recv_x8[d][n * H + i].bits, codes[i].bits);
                    for (int64_t b = 0; b < spr; ++b) ASSERT_EQ(got.recv_scale[d][n * spr + b], sc[b]);
                }
            }
        EXPECT_EQ(got.traffic.rows, ref.traffic.rows);
        EXPECT_EQ(got.traffic.entries, ref.traffic.entries);
        EXPECT_EQ(got.traffic.bytes, got.traffic.rows * (H + spr * 4) + got.traffic.entries * 12);
        // Row payload: (H + H/32) / 2H = 0.516 of bf16's (the 12-byte entry records are the same in both).
        const int64_t meta = got.traffic.entries * 12;
        EXPECT_LE(got.traffic.bytes - meta, 0.53 * static_cast<double>(ref.traffic.bytes - meta));
    }
}

INSTANTIATE_TEST_SUITE_P(
    CpuFp8Path,
    DispatchBitwise,
    ::testing::Range(0, static_cast<int>(testing::test_routings(buffer_config(4, 16, 4, 24, 3).cfg, 61).size())),
    [](const ::testing::TestParamInfo<int>& info) {
        std::string n = testing::test_routings(buffer_config(4, 16, 4, 24, 3).cfg, 61)[info.param].name;
        for (char& ch : n)
            if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return n;
    });

TEST(CpuFp8Path, DispatchRefusesNonFinite) {
    const BufferConfig cfg = fp8_config(buffer_config(2, 4, 2, 6, 1, 128, 128));
    const Routing routing = make_lognormal({2, 4, 2, 6, 5}, 1.0);
    for (float bad : {std::nanf(""), INFINITY}) {
        auto tokens = testing::random_tokens(cfg, routing, 5);
        tokens[1].x[3 * 128 + 77] = float_to_bf16(bad);
        try {
            cpu::dispatch_group(cfg, tokens, options_for(routing));
            ADD_FAILURE() << "accepted " << bad;
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
            EXPECT_NE(m.find("token 3, channel 77"), std::string::npos) << m;
            EXPECT_NE(m.find("not finite"), std::string::npos) << m;
        }
    }
}

TEST(CpuFp8Path, Bf16PartialsCombine) {
    BufferConfig cfg = buffer_config(4, 16, 4, 30, 2, 64, 8);
    const Routing routing = make_lognormal({4, 16, 4, 30, 9}, 1.5);
    const auto tokens = testing::random_tokens(cfg, routing, 9);
    const int64_t nvs = cfg.cfg.recv_rows();
    std::vector<std::vector<Bf16>> y(4);
    for (int r = 0; r < 4; ++r) y[r] = testing::random_bf16(static_cast<size_t>(nvs) * cfg.H, 90 + r);
    const auto wide = cpu::combine_group(cfg, tokens, y, true, options_for(routing));
    cfg.precision.bf16_partials = true;
    const auto disp = cpu::dispatch_group(cfg, tokens, options_for(routing));
    const auto got = cpu::combine_group(cfg, tokens, y, true, options_for(routing));
    std::vector<std::vector<float>> w(4);
    for (int r = 0; r < 4; ++r) w[r] = tokens[r].topk_w;
    EXPECT_EQ(got.out, testing::reference_combine(disp.plan, disp.dst, y, w, cfg.H, true, true));
    ASSERT_GT(wide.traffic.fp32_rows, 0);
    EXPECT_EQ(got.traffic.fp32_rows, 0);
    EXPECT_EQ(got.traffic.rows, wide.traffic.rows);
    EXPECT_EQ(wide.traffic.bytes - got.traffic.bytes, wide.traffic.fp32_rows * cfg.H * 2);
    // The byte model with bf16 partials (what the GPU demo reports) counts what the ranks moved: the partials and
    // the gathered weights, as it counts them for dispatch_backward (cpu_combine_test's comparison).
    const TrafficReport model = evenep_traffic(disp.plan, disp.dst, cfg.H, cfg.ffn_hidden, true, true);
    EXPECT_EQ(got.traffic, model.dispatch_backward);
    EXPECT_EQ(model.combine.fp32_rows, 0);
    EXPECT_EQ(model.combine.rows, got.traffic.rows);
}

// ---- weight prefetch -----------------------------------------------------------------------------------
class PrefetchE4m3 : public ::testing::TestWithParam<bool> {};

TEST_P(PrefetchE4m3, SlotsHoldTheHomeCast) {
    using namespace std::chrono_literals;
    const bool relay = GetParam();
    const BufferConfig cfg = fp8_config(buffer_config(8, 32, 4, 64, 4, 128, 128));
    const Config& c = cfg.cfg;
    const Routing routing = make_adversarial({c.R, c.E, c.K, c.S, 3}, Adversarial::kSingleHotExpert);
    Planner planner(c, PlannerMode::kReference);
    planner.set_relay(relay);
    Plan plan;
    planner.plan(routing.tpe(), routing.s, plan);
    const int B = c.num_slots(), epn = c.epn();
    int64_t copies = 0, relayed = 0;
    for (size_t i = 0; i < plan.copies.size(); ++i)
        if (plan.copies[i] >= 0) {
            ++copies;
            relayed += plan.relay_src[i] != plan.copies[i] / epn ? 1 : 0;
        }
    ASSERT_GT(copies, 0);
    if (relay) {
        ASSERT_GT(relayed, 0) << "the plan has no relayed copy: the test would not cover the relay path";
    }
    const int64_t n = 128 * 128, per_copy = 3 * (n + 1 * 4);
    const auto master = [](int e, int p, int64_t i, int salt) {
        return detail::random_bf16(detail::hash64(static_cast<uint64_t>(e * 3 + p) * 7919 + salt, i), 0.1f);
    };
    std::vector<int64_t> bytes(3 * 8, 0);
    cpu::LocalTeamGroup group(8, 20000ms);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        cpu::ExpertWeights layer(team, cfg);
        cpu::ExpertPool pool(team, cfg);
        const auto fill = [&](int salt) {
            for (int p = 0; p < 3; ++p)
                for (int le = 0; le < epn; ++le) {
                    auto w = layer.weight(p, le);
                    for (size_t i = 0; i < w.size(); ++i) w[i] = master(r * epn + le, p, static_cast<int64_t>(i), salt);
                }
        };
        fill(0);
        int step = 0;
        const auto check_slots = [&](int salt_of_home0) {
            std::vector<Bf16> w(n);
            std::vector<Fp8E4m3> q(n);
            float s = 0;
            for (int b = 0; b < B; ++b) {
                const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
                if (e < 0) continue;
                const int salt = e / epn == 0 ? salt_of_home0 : 0;
                for (int p = 0; p < 3; ++p) {
                    for (int64_t i = 0; i < n; ++i) w[i] = master(e, p, i, salt);
                    cpu::quantize_weight_fp8(w.data(), 128, 128, cfg.precision.ue8m0, q.data(), &s);
                    const cpu::Fp8Weight got = pool.slot_weight_fp8(p, b);
                    ASSERT_EQ(got.scales[0], s) << "rank " << r << " slot " << b << " expert " << e << " proj " << p;
                    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got.codes[i].bits, q[i].bits) << i;
                }
            }
        };
        layer.cast_fp8();
        pool.prefetch_weight(plan, layer);
        bytes[step++ * 8 + r] = pool.last_traffic().recv_bytes[r];
        check_slots(0);
        layer.cast_fp8();  // nothing changed: no cast, no copy
        pool.prefetch_weight(plan, layer);
        bytes[step++ * 8 + r] = pool.last_traffic().recv_bytes[r];
        team.barrier("before the update");
        if (r == 0) fill(1);  // home 0 changes its weights
        team.barrier("updated");
        layer.cast_fp8();
        pool.prefetch_weight(plan, layer);
        bytes[step++ * 8 + r] = pool.last_traffic().recv_bytes[r];
        check_slots(1);
        team.barrier("checked");
    });
    int64_t first = 0, second = 0, third = 0;
    for (int r = 0; r < 8; ++r) first += bytes[r], second += bytes[8 + r], third += bytes[16 + r];
    int64_t remote = 0, of_home0 = 0;
    for (size_t i = 0; i < plan.copies.size(); ++i)
        if (plan.copies[i] >= 0) {
            remote += 1;
            of_home0 += plan.copies[i] / epn == 0 ? 1 : 0;
        }
    EXPECT_EQ(first, remote * per_copy);
    EXPECT_EQ(second, 0);
    EXPECT_EQ(third, of_home0 * per_copy);
}

INSTANTIATE_TEST_SUITE_P(CpuFp8Path, PrefetchE4m3, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& info) {
    return std::string(info.param ? "relay" : "direct");
});

// ---- GEMM ----------------------------------------------------------------------------------------------
struct GemmCase {
    int in_dim, out_dim;
    bool transposed, ue8m0;
};

// Bound of docs/fp8.md for one output element: sum over i of the quantisation terms plus the fp32 accumulation
// term gamma * sum |a_hat w_hat|. u = 2^-4 (e4m3 relative, normal range) plus the fp32 rounding of x / s; tau =
// 2^-10 (half the subnormal step, relative to the block scale).
double element_bound(const std::vector<double>& a,
                     const std::vector<double>& sa,
                     const std::vector<double>& w,
                     const std::vector<double>& sw,
                     int kin) {
    const double u = std::ldexp(1.0, -4) + std::ldexp(1.0, -23),
                 tau = std::ldexp(1.0, -10) * (1 + std::ldexp(1.0, -20));
    const int nkb = kin / kFp8Block;
    const double gamma = (kFp8Block + nkb + 2) * std::ldexp(1.0, -24) * 1.01;
    double q = 0, mag = 0;
    for (int i = 0; i < kin; ++i) {
        const double x = std::fabs(a[i]), y = std::fabs(w[i]), s1 = sa[i], s2 = sw[i];
        q += (2 * u + u * u) * x * y + tau * (s1 * (1 + u) * y + s2 * (1 + u) * x) + tau * tau * s1 * s2;
        mag += ((1 + u) * x + tau * s1) * ((1 + u) * y + tau * s2);
    }
    return q + gamma * mag;
}

TEST(CpuFp8Path, GemmWithinDerivedBound) {
    for (const GemmCase gc : {GemmCase{256, 128, false, false}, GemmCase{384, 256, true, false},
                              GemmCase{256, 128, false, true}, GemmCase{128, 384, true, true}}) {
        SCOPED_TRACE(::testing::Message()
                     << gc.in_dim << "x" << gc.out_dim << " t=" << gc.transposed << " ue8m0=" << gc.ue8m0);
        const int kin = gc.in_dim, kout = gc.out_dim;
        // Two groups (5 and 0 rows) of a padded layout: rows 0..4 used, 5..7 padding, group 1 empty.
        const std::vector<int32_t> cu = {8, 8}, count = {5, 0};
        const int rows = 8;
        std::vector<Bf16> a(static_cast<size_t>(rows) * kin), w(static_cast<size_t>(kin) * kout);
        for (size_t i = 0; i < a.size(); ++i) a[i] = detail::random_bf16(detail::hash64(71, i), 1.0f);
        for (size_t i = 0; i < w.size(); ++i) w[i] = detail::random_bf16(detail::hash64(72, i), 0.05f);
        a[1 * kin + 3] = float_to_bf16(900.0f);  // outlier: the rest of row 1's block 0 falls to e4m3 subnormals
        for (int i = 0; i < kin; ++i) a[2 * kin + i] = Bf16{0};  // a zero row
        w[5] = float_to_bf16(40.0f);                             // weight outlier in block (0, 0) as stored
        std::vector<Fp8E4m3> a8(a.size()), w8(w.size());
        std::vector<float> as(static_cast<size_t>(rows) * kin / kFp8Block);
        std::vector<float> ws(static_cast<size_t>(kin / kFp8Block) * (kout / kFp8Block));
        cpu::quantize_rows_fp8(a, rows, kin, gc.ue8m0, a8, as);
        // Stored as the product uses it: [in, out], or [out, in] when transposed.
        const int sr = gc.transposed ? kout : kin, scol = gc.transposed ? kin : kout;
        cpu::quantize_weight_fp8(w.data(), sr, scol, gc.ue8m0, w8.data(), ws.data());
        const std::vector<cpu::Fp8Weight> table = {{w8.data(), ws.data()}, {}};
        std::vector<float> out(static_cast<size_t>(rows) * kout, 7.0f);
        const cpu::GroupedGemmShape shape{cu, count, kin, kout};
        cpu::grouped_gemm_fp8(shape, table, gc.transposed, a8, as, out, false);
        for (int r = 5; r < rows; ++r)
            for (int o = 0; o < kout; ++o) ASSERT_EQ(out[r * kout + o], 7.0f) << "padding row written";
        for (int r = 0; r < 5; ++r)
            for (int o = 0; o < kout; ++o) {
                std::vector<double> av(kin), sav(kin), wv(kin), swv(kin);
                double ref = 0;
                for (int i = 0; i < kin; ++i) {
                    const int64_t wi =
                        gc.transposed ? static_cast<int64_t>(o) * kin + i : static_cast<int64_t>(i) * kout + o;
                    const int64_t si = gc.transposed ? (o / kFp8Block) * (kin / kFp8Block) + i / kFp8Block
                                                     : (i / kFp8Block) * (kout / kFp8Block) + o / kFp8Block;
                    av[i] = bf16_to_float(a[r * kin + i]);
                    sav[i] = as[r * (kin / kFp8Block) + i / kFp8Block];
                    wv[i] = bf16_to_float(w[wi]);
                    swv[i] = ws[si];
                    ref += av[i] * wv[i];
                }
                const double got = out[r * kout + o];
                if (r == 2) {
                    ASSERT_EQ(got, 0.0) << "zero row";
                }
                ASSERT_LE(std::fabs(got - ref), element_bound(av, sav, wv, swv, kin)) << "row " << r << " col " << o;
            }
        // accumulate: adds onto what is there.
        std::vector<float> twice = out;
        cpu::grouped_gemm_fp8(shape, table, gc.transposed, a8, as, twice, true);
        // (acc starts at out and each block's term is added in turn: near 2*out, not bitwise)
        for (int o = 0; o < kout; ++o) EXPECT_NEAR(twice[o], 2 * out[o], 1e-5 * (1 + std::fabs(out[o])));
    }
}

TEST(CpuFp8Path, GemmAccumulationOrder) {
    const int kin = 384, kout = 128, rows = 3;
    const std::vector<int32_t> cu = {rows}, count = {rows};
    std::vector<Bf16> a(static_cast<size_t>(rows) * kin), w(static_cast<size_t>(kin) * kout);
    for (size_t i = 0; i < a.size(); ++i) a[i] = detail::random_bf16(detail::hash64(81, i), 2.0f);
    for (size_t i = 0; i < w.size(); ++i) w[i] = detail::random_bf16(detail::hash64(82, i), 0.1f);
    std::vector<Fp8E4m3> a8(a.size()), w8(w.size());
    std::vector<float> as(rows * 3), ws(3), out(static_cast<size_t>(rows) * kout);
    cpu::quantize_rows_fp8(a, rows, kin, false, a8, as);
    cpu::quantize_weight_fp8(w.data(), kin, kout, false, w8.data(), ws.data());
    const std::vector<cpu::Fp8Weight> table = {{w8.data(), ws.data()}};
    cpu::grouped_gemm_fp8({cu, count, kin, kout}, table, false, a8, as, out, false);
    for (int r = 0; r < rows; ++r)
        for (int o : {0, 77, 127}) {
            volatile float acc = 0.0f;  // volatile: each operation rounded to fp32, no contraction
            for (int kb = 0; kb < 3; ++kb) {
                volatile float p = 0.0f;
                for (int i = kb * kFp8Block; i < (kb + 1) * kFp8Block; ++i) {
                    const volatile float prod = e4m3_to_float(a8[r * kin + i]) * e4m3_to_float(w8[i * kout + o]);
                    p = p + prod;
                }
                const volatile float s = as[r * 3 + kb] * ws[kb];
                const volatile float term = p * s;
                acc = acc + term;
            }
            EXPECT_EQ(out[r * kout + o], acc) << "row " << r << " col " << o;
        }
}

// ---- layer ---------------------------------------------------------------------------------------------
struct LayerCase {
    std::string name;
    int R, E, K, S;
    std::vector<std::vector<int32_t>> topk;  // empty: lognormal
};

std::vector<LayerCase> layer_cases() {
    std::vector<LayerCase> out;
    {
        LayerCase c{"hot_expert", 4, 8, 2, 16, {}};
        c.topk.resize(4);
        for (int r = 0; r < 4; ++r)
            for (int t = 0; t < 16; ++t) {
                c.topk[r].push_back(0);                // every token to expert 0
                c.topk[r].push_back(1 + (t + r) % 7);  // and one other
            }
        out.push_back(c);
    }
    {
        LayerCase c{"one_token_experts", 4, 32, 1, 8, {}};  // 32 tokens, each alone on its expert
        c.topk.resize(4);
        for (int r = 0; r < 4; ++r)
            for (int t = 0; t < 8; ++t) c.topk[r].push_back((r * 8 + t) * 5 % 32);
        out.push_back(c);
    }
    out.push_back({"outliers_and_zero_rows", 4, 8, 3, 16, {}});
    return out;
}

class LayerAdversarial : public ::testing::TestWithParam<int> {};

TEST_P(LayerAdversarial, WithinToleranceOfFloat64) {
    const LayerCase lc = layer_cases()[static_cast<size_t>(GetParam())];
    BufferConfig bf = buffer_config(lc.R, lc.E, lc.K, lc.S, 1, 256, 128);
    std::vector<std::vector<int32_t>> topk = lc.topk;
    if (topk.empty()) topk = make_lognormal({lc.R, lc.E, lc.K, lc.S, 17}, 1.0).topk_idx;
    const std::vector<int32_t> s(lc.R, lc.S);
    cpu::MoeProblem problem = cpu::make_moe_problem(bf, topk, s, 19);
    // Outliers: one channel of block 1 at 60x the others on every third token; zero rows: token 2 of each rank.
    for (int r = 0; r < lc.R; ++r)
        for (int t = 0; t < lc.S; ++t) {
            if (t % 3 == 0) problem.x[r][t * 256 + 128 + (t % 128)] = float_to_bf16(t % 2 ? 60.0f : -60.0f);
            if (t == 2)
                for (int i = 0; i < 256; ++i) problem.x[r][t * 256 + i] = Bf16{0};
        }
    const auto ref = cpu::dense_moe_forward_f64(problem);
    const cpu::MoeResult b16 = cpu::run_moe_layer(problem);
    const cpu::DenseResult dense = cpu::dense_moe_reference(problem, true);
    for (bool ue8m0 : {false, true}) {
        SCOPED_TRACE(ue8m0 ? "ue8m0" : "fp32 scales");
        cpu::MoeProblem p8 = problem;
        p8.cfg = fp8_config(bf, ue8m0);
        p8.cfg.precision.bf16_partials = ue8m0;  // exercise the knob in the layer too
        const cpu::MoeResult f8 = cpu::run_moe_layer(p8);
        const cpu::ErrorStats e8 = cpu::compare(f8.out, ref), e16 = cpu::compare(b16.out, ref);
        std::printf("%s %s: fp8 max rel %.3e mean rel %.3e | bf16 max rel %.3e mean rel %.3e\n", lc.name.c_str(),
                    ue8m0 ? "ue8m0" : "fp32", e8.rel(), e8.mean_rel(), e16.rel(), e16.mean_rel());
        EXPECT_FALSE(e8.nonfinite);
        EXPECT_LE(e8.rel(), cpu::kFp8LayerTolerance.max_rel);
        EXPECT_LE(e8.mean_rel(), cpu::kFp8LayerTolerance.mean_rel);
        EXPECT_LT(e16.rel(), e8.rel());
        for (int r = 0; r < lc.R; ++r)
            for (int i = 0; i < 256; ++i) ASSERT_EQ(f8.out[r][2 * 256 + i].bits, 0) << "zero-input token, rank " << r;
        EXPECT_EQ(f8.plan.alloc, b16.plan.alloc);
        EXPECT_EQ(f8.dst, b16.dst);
        EXPECT_LT(f8.traffic.dispatch.bytes, b16.traffic.dispatch.bytes);
        EXPECT_LE(f8.traffic.prefetch.bytes, b16.traffic.prefetch.bytes);
        if (b16.traffic.prefetch.bytes > 0) {
            EXPECT_LT(f8.traffic.prefetch.bytes, b16.traffic.prefetch.bytes);
        }
        // Backward: FP8 dgrad GEMMs, bf16 wgrad; checked against the dense fp32 reference (no float64 backward).
        const cpu::ErrorStats gx = cpu::compare(f8.grad_x, dense.grad_x),
                              gw = cpu::compare(f8.grad_w_down, dense.grad_w_down);
        std::printf("  backward: grad_x rel %.3e, grad W_down rel %.3e\n", gx.rel(), gw.rel());
        EXPECT_FALSE(gx.nonfinite);
        EXPECT_LE(gx.rel(), cpu::kFp8LayerTolerance.max_rel);
        EXPECT_LE(gw.rel(), cpu::kFp8LayerTolerance.max_rel);
    }
}

INSTANTIATE_TEST_SUITE_P(CpuFp8Path,
                         LayerAdversarial,
                         ::testing::Range(0, static_cast<int>(layer_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return layer_cases()[info.param].name; });

}  // namespace
}  // namespace evenep
