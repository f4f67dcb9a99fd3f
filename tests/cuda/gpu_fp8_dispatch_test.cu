// GPU FP8 dispatch (EpOptions::precision.fp8) bit-identical to the CPU oracle's FP8 dispatch (docs/fp8.md).
//
// Cases:
//   Fp8DispatchTest.MatchesOracle/<config>_<routing>  plan, dst, recv_w / recv_next / recv_ret and the e4m3 codes
//       (recv_x8) and scales (recv_scale) of every row [0, rows_used) of every rank equal to the oracle's, with fp32
//       and with UE8M0 scales; token rows carry outliers, all-zero 128-blocks, tiny blocks (e4m3 subnormals after
//       scaling) and huge blocks; then y rows written into recv_x and combine (pull and push, weighted and not) equal
//       to the oracle's bf16 combine. The same dispatch into caller-owned codes and scales (RankIo::rows8 /
//       row_scales) and from the oracle's own cast of the rows (RankIo::x8 / x_scales, moved as given) equal it too.
//       Configs: R=4 E=16 K=4 H=512 (4 scales per row), R=8 E=64 K=8 H=256, R=2 E=8 K=6 H=384 (K > R; 3 scales, not a
//       multiple of the kernel's 4-block unroll), R=1.
//   Fp8DispatchFlowTest.RefusesNonFinite    a NaN / an inf in one token row (also in a fully masked token): check()
//       throws Error(kInvalidArgument) naming rank, token and channel.
//   Fp8DispatchFlowTest.RefusesBadQuantisedRows  caller-quantised rows (RankIo::x8) with a NaN code, a scale <= 0,
//       inf, or not a power of two under ue8m0: check() names rank, token and channel/block; unpaired pointers and
//       FP8 pointers on a bf16 Ep are refused by the call.
//   Fp8DispatchFlowTest.ConfigChecks        fp8 with H = 200, ue8m0 without fp8: refused naming them; bf16_partials
//                                           accepted (EpLayout::bf16_partials set); the FP8 regions move the plan only.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"
#include "gpu_combine_testing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::bits_of;
using testing::GroupIo;

template <typename... Args>
std::string cat(const Args&... args) {
    std::ostringstream os;
    ((os << args), ...);
    return os.str();
}

int64_t s_total_of(const Routing& routing) {
    int64_t total = 0;
    bool equal = true;
    for (int s : routing.s) total += s, equal = equal && s == routing.s[0];
    return equal ? -1 : total;
}

// Random rows with the blocks the quantiser must get right: per token one block each of an outlier, zeros, tiny
// values (codes in e4m3's subnormal range after scaling by the outlier-free amax) and huge values.
std::vector<cpu::RankTokens> fp8_tokens(const BufferConfig& bc, const Routing& routing, uint64_t seed) {
    auto tokens = testing::random_tokens(bc, routing, seed);
    const int H = bc.H, spr = H / kFp8Block;
    for (int r = 0; r < bc.cfg.R; ++r)
        for (int t = 0; t < tokens[r].s; ++t) {
            Bf16* x = tokens[r].x.data() + static_cast<int64_t>(t) * H;
            const int b = (t + r) % spr;
            switch ((t + 3 * r) % 5) {
                case 0:
                    x[b * kFp8Block + (t * 7) % kFp8Block] = float_to_bf16(-3000.0f);
                    break;
                case 1:
                    for (int i = 0; i < kFp8Block; ++i)
                        x[b * kFp8Block + i] = Bf16{static_cast<uint16_t>(i % 2 ? 0x8000 : 0)};
                    break;
                case 2:
                    for (int i = 0; i < kFp8Block; ++i)
                        x[b * kFp8Block + i] = float_to_bf16(bf16_to_float(x[b * kFp8Block + i]) * 1e-5f);
                    x[b * kFp8Block] = float_to_bf16(1.0f);  // the rest lands in e4m3's subnormals
                    break;
                case 3:
                    for (int i = 0; i < kFp8Block; ++i)
                        x[b * kFp8Block + i] = float_to_bf16(bf16_to_float(x[b * kFp8Block + i]) * 1e30f);
                    break;
                default:
                    break;
            }
        }
    return tokens;
}

void expect_fp8_dispatch_equal(const Ep& ep,
                               const EpPlan& plan,
                               const cpu::GroupDispatchResult& od,
                               const std::string& what) {
    const Config& cfg = ep.config();
    const int H = ep.hidden(), spr = H / kFp8Block;
    for (int r = 0; r < cfg.R; ++r) {
        ASSERT_EQ(testing::plan_diff(ep.download_plan(plan, r), od.plan), "") << what << ": rank " << r;
        ASSERT_EQ(ep.download_dst(plan, r), od.dst[r]) << what << ": dst of rank " << r;
        const int64_t rows = od.plan.rows_used(r);
        const std::vector<uint8_t> x8 = ep.download_recv_x8(r, rows);
        const std::vector<float> sc = ep.download_recv_scale(r, rows);
        for (int64_t i = 0; i < rows * spr; ++i)
            ASSERT_EQ(float_as_bits(sc[i]), float_as_bits(od.recv_scale[r][i]))
                << what << ": recv_scale rank " << r << " row " << i / spr << " block " << i % spr << " (got " << sc[i]
                << ", expected " << od.recv_scale[r][i] << ")";
        for (int64_t i = 0; i < rows * H; ++i)
            ASSERT_EQ(x8[i], od.recv_x8[r][i].bits)
                << what << ": recv_x8 rank " << r << " row " << i / H << " col " << i % H;
        const std::vector<float> w = ep.download_recv_w(r, rows);
        const std::vector<int32_t> next = ep.download_recv_next(r, rows), ret = ep.download_recv_ret(r, rows);
        for (int64_t i = 0; i < rows; ++i) {
            ASSERT_EQ(w[i], od.recv_w[r][i]) << what << ": recv_w rank " << r << " row " << i;
            ASSERT_EQ(next[i], od.recv_next[r][i]) << what << ": recv_next rank " << r << " row " << i;
            ASSERT_EQ(ret[i], od.recv_ret[r][i]) << what << ": recv_ret rank " << r << " row " << i;
        }
    }
}

// The caller's tensors (RankIo): the bf16 rows dispatched into caller-owned codes and scales (rows8 / row_scales),
// and the oracle's own cast of the rows (cpu::quantize_rows_fp8, as DeepEP's x_fp8) dispatched as given (x8 /
// x_scales) into the buffer: both equal the oracle's FP8 dispatch bit for bit, and neither touches the other side
// (the buffer's codes stay poisoned in the first, the caller's in the second is not given).
void expect_caller_io_equal(Ep& ep,
                            GroupIo& io,
                            const EpPlan& plan,
                            const std::vector<cpu::RankTokens>& tokens,
                            const cpu::GroupDispatchResult& od,
                            const std::string& what) {
    const Config& cfg = ep.config();
    const int R = cfg.R, H = ep.hidden(), spr = H / kFp8Block;
    const int64_t nvs = ep.layout().nvs;
    std::vector<DeviceArray<uint8_t>> rows8, x8;
    std::vector<DeviceArray<float>> scales, xs;
    std::vector<RankIo> caller = io.io;
    for (int r = 0; r < R; ++r) {
        rows8.emplace_back(static_cast<size_t>(nvs * H));
        scales.emplace_back(static_cast<size_t>(nvs * spr));
        EVENEP_CUDA_CHECK(cudaMemset(rows8[r].get(), 0x5a, nvs * H));
        EVENEP_CUDA_CHECK(cudaMemset(scales[r].get(), 0x5a, nvs * spr * 4));
        EVENEP_CUDA_CHECK(cudaMemset(ep.recv_x8(r), 0x5a, ep.layout().buf.recv_x8_bytes()));
        caller[r].rows8 = rows8[r].get();
        caller[r].row_scales = scales[r].get();
    }
    ep.dispatch(plan, caller, nullptr);
    ep.check(nullptr);
    for (int r = 0; r < R; ++r) {
        const int64_t rows = od.plan.rows_used(r);
        const std::vector<uint8_t> got = rows8[r].download(static_cast<size_t>(rows * H));
        const std::vector<float> sc = scales[r].download(static_cast<size_t>(rows * spr));
        for (int64_t i = 0; i < rows * H; ++i)
            ASSERT_EQ(got[i], od.recv_x8[r][i].bits) << what << ": caller rows8 rank " << r << " row " << i / H;
        for (int64_t i = 0; i < rows * spr; ++i)
            ASSERT_EQ(float_as_bits(sc[i]), float_as_bits(od.recv_scale[r][i]))
                << what << ": caller row_scales rank " << r << " row " << i / spr;
        const std::vector<uint8_t> window = ep.download_recv_x8(r, 1);
        ASSERT_EQ(window[0], 0x5a) << what << ": rows8 given, but the buffer's recv_x8 of rank " << r << " changed";
    }
    // The same rows quantised by the caller: moved as given into the buffer.
    const bool ue8m0 = ep.options().precision.ue8m0;
    caller = io.io;
    for (int r = 0; r < R; ++r) {
        const int64_t n = static_cast<int64_t>(tokens[r].x.size()) / H;
        std::vector<Fp8E4m3> codes(static_cast<size_t>(n * H));
        std::vector<float> sc(static_cast<size_t>(n * spr));
        cpu::quantize_rows_fp8(tokens[r].x, n, H, ue8m0, codes, sc);
        std::vector<uint8_t> bytes(codes.size());
        for (size_t i = 0; i < codes.size(); ++i) bytes[i] = codes[i].bits;
        x8.emplace_back(bytes.size());
        xs.emplace_back(sc.size());
        x8[r].upload(std::span<const uint8_t>(bytes));
        xs[r].upload(std::span<const float>(sc));
        caller[r].x = nullptr;
        caller[r].x8 = x8[r].get();
        caller[r].x_scales = xs[r].get();
        EVENEP_CUDA_CHECK(cudaMemset(ep.recv_x8(r), 0x5a, ep.layout().buf.recv_x8_bytes()));
        EVENEP_CUDA_CHECK(cudaMemset(ep.recv_scale(r), 0x5a, ep.layout().buf.recv_scale_bytes()));
    }
    ep.dispatch(plan, caller, nullptr);
    ep.check(nullptr);
    expect_fp8_dispatch_equal(ep, plan, od, what + " (x8 given)");
}

// Combine stays bf16: expert outputs y written into recv_x, then combine equals the oracle's.
void expect_combine_equal(Ep& ep,
                          GroupIo& io,
                          const EpPlan& plan,
                          const std::vector<cpu::RankTokens>& tokens,
                          const BufferConfig& bc,
                          const cpu::OracleOptions& oo,
                          const std::string& what) {
    std::vector<std::vector<Bf16>> y(bc.cfg.R);
    for (int r = 0; r < bc.cfg.R; ++r) {
        y[r] = testing::random_bf16(static_cast<size_t>(ep.layout().nvs) * bc.H, 300 + r);
        testing::put(ep.recv_x(r), bits_of(y[r]));
    }
    testing::expect_combine_equal(ep, io, plan, tokens, bc, y, oo, what);
}

struct Fp8Param {
    int R, E, K, S, tp, H;
    int routing;  // index into testing::test_routings
};

std::string param_name(const Fp8Param& p) {
    const auto routings = testing::test_routings(testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H).cfg, 5);
    std::string n = cat("R", p.R, "E", p.E, "K", p.K, "H", p.H, "_", routings[p.routing].name);
    for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return n;
}

std::vector<Fp8Param> fp8_params() {
    const Fp8Param shapes[] = {
        {4, 16, 4, 48, 3, 512, 0}, {8, 64, 8, 64, 1, 256, 0}, {2, 8, 6, 48, 128, 384, 0}, {1, 4, 2, 24, 4, 128, 0}};
    return testing::with_each_routing(shapes, 5);
}

class Fp8DispatchTest : public ::testing::TestWithParam<Fp8Param> {};

TEST_P(Fp8DispatchTest, MatchesOracle) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Fp8Param p = GetParam();
    const auto routings = testing::test_routings(testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H).cfg, 5);
    const Routing& routing = routings[p.routing].routing;
    for (bool ue8m0 : {false, true}) {
        BufferConfig bc = testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H, 128);
        bc.precision.fp8 = true;
        bc.precision.ue8m0 = ue8m0;
        const std::string what = cat(param_name(p), ue8m0 ? " ue8m0" : " fp32 scales");
        const auto tokens = fp8_tokens(bc, routing, 17);
        cpu::OracleOptions oo;
        oo.s_total = s_total_of(routing);
        const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens, oo);
        EpOptions opt;
        opt.precision = bc.precision;
        DeviceEp ep(bc.cfg, bc.H, opt);
        ASSERT_EQ(ep.layout().buf.recv_x8_offset, bc.layout().recv_x8_offset) << what;
        ASSERT_EQ(ep.layout().buf.recv_scale_offset, bc.layout().recv_scale_offset) << what;
        GroupIo io(bc.cfg.R, bc.cfg.S, bc.cfg.K, bc.H);
        for (int r = 0; r < bc.cfg.R; ++r) {
            io.x[r].upload(bits_of(tokens[r].x));
            io.idx[r].upload(tokens[r].topk_idx);
            io.w[r].upload(tokens[r].topk_w);
        }
        // Stale bytes must not survive: every used row is written by the call (payload, duplicate or padding).
        for (int r = 0; r < bc.cfg.R; ++r) {
            EVENEP_CUDA_CHECK(cudaMemset(ep.recv_x8(r), 0x5a, ep.layout().buf.recv_x8_bytes()));
            EVENEP_CUDA_CHECK(cudaMemset(ep.recv_scale(r), 0x5a, ep.layout().buf.recv_scale_bytes()));
        }
        const EpPlan plan = ep.plan(io.io, routing.s, nullptr, oo.s_total);
        ep.dispatch(plan, io.io, nullptr);
        ep.check(nullptr);
        expect_fp8_dispatch_equal(ep, plan, od, what);
        if (HasFatalFailure()) return;
        expect_caller_io_equal(ep, io, plan, tokens, od, what);
        if (HasFatalFailure()) return;
        expect_combine_equal(ep, io, plan, tokens, bc, oo, what);
        if (HasFatalFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(Routings, Fp8DispatchTest, ::testing::ValuesIn(fp8_params()), [](const auto& info) {
    return param_name(info.param);
});

TEST(Fp8DispatchFlowTest, RefusesNonFinite) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    BufferConfig bc = testing::buffer_config(2, 4, 2, 6, 1, 128, 128);
    bc.precision.fp8 = true;
    const Routing base = make_lognormal({2, 4, 2, 6, 5}, 1.0);
    for (bool masked : {false, true})
        for (float bad : {std::nanf(""), INFINITY}) {
            Routing routing = base;
            if (masked)
                for (int k = 0; k < 2; ++k) routing.topk_idx[1][3 * 2 + k] = -1;  // token 3 of rank 1 sends nothing
            auto tokens = testing::random_tokens(bc, routing, 5);
            tokens[1].x[3 * 128 + 77] = float_to_bf16(bad);
            EpOptions opt;
            opt.precision = bc.precision;
            DeviceEp ep(bc.cfg, bc.H, opt);
            GroupIo io(2, bc.cfg.S, bc.cfg.K, bc.H);
            for (int r = 0; r < 2; ++r) {
                io.x[r].upload(bits_of(tokens[r].x));
                io.idx[r].upload(routing.topk_idx[r]);
                io.w[r].upload(tokens[r].topk_w);
            }
            const EpPlan plan = ep.plan(io.io, routing.s, nullptr, s_total_of(routing));
            ep.dispatch(plan, io.io, nullptr);
            try {
                ep.check(nullptr);
                ADD_FAILURE() << "accepted " << bad << (masked ? " in a masked token" : "");
            } catch (const Error& e) {
                const std::string m = e.what();
                EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << m;
                EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
                EXPECT_NE(m.find("token 3, channel 77"), std::string::npos) << m;
                EXPECT_NE(m.find("not finite"), std::string::npos) << m;
            }
        }
}

// Caller-quantised rows: a NaN code, a scale <= 0 or not finite, and (ue8m0) a scale not a power of two are refused
// by check() naming rank, token and channel / block; the calls' own refusals name the pointers.
TEST(Fp8DispatchFlowTest, RefusesBadQuantisedRows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Routing routing = make_lognormal({2, 4, 2, 6, 5}, 1.0);
    struct Bad {
        int what;  // 0: code, 1: scale
        float scale;
        bool ue8m0;
        const char* needle;
    };
    const Bad cases[] = {{0, 1.0f, false, "x_fp8[3, 77] is NaN (e4m3 code 255)"},
                         {1, 0.0f, false, "scales[3, 1] = 0 is not positive and finite"},
                         {1, -2.0f, false, "scales[3, 1] = -2 is not positive and finite"},
                         {1, INFINITY, false, "is not positive and finite"},
                         {1, 0.75f, true, "scales[3, 1] = 0.75 is not a power of two"}};
    for (const Bad& c : cases) {
        BufferConfig bc = testing::buffer_config(2, 4, 2, 6, 1, 256, 128);
        bc.precision.fp8 = true;
        bc.precision.ue8m0 = c.ue8m0;
        EpOptions opt;
        opt.precision = bc.precision;
        DeviceEp ep(bc.cfg, bc.H, opt);
        GroupIo io(2, bc.cfg.S, bc.cfg.K, bc.H);
        std::vector<DeviceArray<uint8_t>> x8;
        std::vector<DeviceArray<float>> xs;
        std::vector<RankIo> caller = io.io;
        for (int r = 0; r < 2; ++r) {
            io.idx[r].upload(routing.topk_idx[r]);
            io.w[r].upload(std::vector<float>(static_cast<size_t>(bc.cfg.S * bc.cfg.K), 0.5f));
            std::vector<uint8_t> codes(static_cast<size_t>(bc.cfg.S * bc.H), 0x38);  // 1.0
            std::vector<float> sc(static_cast<size_t>(bc.cfg.S * 2), 1.0f);
            if (r == 1 && c.what == 0) codes[3 * 256 + 77] = 0xFF;
            if (r == 1 && c.what == 1) sc[3 * 2 + 1] = c.scale;
            x8.emplace_back(codes.size());
            xs.emplace_back(sc.size());
            x8[r].upload(std::span<const uint8_t>(codes));
            xs[r].upload(std::span<const float>(sc));
            caller[r].x = nullptr;
            caller[r].x8 = x8[r].get();
            caller[r].x_scales = xs[r].get();
        }
        const EpPlan plan = ep.plan(io.io, routing.s, nullptr, s_total_of(routing));
        ep.dispatch(plan, caller, nullptr);
        try {
            ep.check(nullptr);
            ADD_FAILURE() << "accepted: " << c.needle;
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << m;
            EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
            EXPECT_NE(m.find(c.needle), std::string::npos) << m;
        }
        ep.team().recover();
        // Pointers: x8 without x_scales, rows8 without row_scales, fp8 pointers on a bf16 Ep are refused by name.
        std::vector<RankIo> half = caller;
        half[0].x_scales = nullptr;
        EXPECT_THROW(ep.dispatch(plan, half, nullptr), Error);
        half = caller;
        half[1].rows8 = x8[1].get();
        EXPECT_THROW(ep.dispatch(plan, half, nullptr), Error);
    }
    DeviceEp bf16(testing::buffer_config(2, 4, 2, 6, 1, 256, 128).cfg, 256, EpOptions{});
    GroupIo io(2, 6, 2, 256);
    DeviceArray<uint8_t> rows8(static_cast<size_t>(bf16.layout().nvs * 256));
    DeviceArray<float> scales(static_cast<size_t>(bf16.layout().nvs * 2));
    for (int r = 0; r < 2; ++r) io.idx[r].upload(routing.topk_idx[r]);
    const EpPlan plan = bf16.plan(io.io, routing.s, nullptr, s_total_of(routing));
    std::vector<RankIo> caller = io.io;
    caller[0].rows8 = rows8.get();
    caller[0].row_scales = scales.get();
    try {
        bf16.dispatch(plan, caller, nullptr);
        ADD_FAILURE() << "a bf16 Ep accepted rows8";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no precision.fp8"), std::string::npos) << e.what();
    }
}

TEST(Fp8DispatchFlowTest, ConfigChecks) {
    const Config cfg = testing::buffer_config(2, 4, 2, 6, 1).cfg;
    auto refused = [&](int H, DataPrecision pr, const char* needle) {
        EpOptions opt;
        opt.precision = pr;
        try {
            Ep::check_and_layout(cfg, H, opt);
            ADD_FAILURE() << "accepted " << needle;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    refused(200, DataPrecision{true, false, false}, "H = 200");
    refused(256, DataPrecision{false, true, false}, "ue8m0");
    EpOptions partials;
    partials.precision = DataPrecision{true, false, true};
    const EpLayout p = Ep::check_and_layout(cfg, 256, partials);  // accepted: the flag rides in the layout
    EXPECT_TRUE(p.bf16_partials);
    EpOptions fp8;
    fp8.precision.fp8 = true;
    const EpLayout on = Ep::check_and_layout(cfg, 256, fp8);
    const EpLayout off = Ep::check_and_layout(cfg, 256, EpOptions{});
    EXPECT_EQ(on.buf.recv_x_offset, off.buf.recv_x_offset);
    EXPECT_EQ(on.buf.stage_offset, off.buf.stage_offset);
    EXPECT_EQ(on.buf.recv_x8_bytes(), on.nvs * 256);
    EXPECT_FALSE(on.bf16_partials);
    EXPECT_EQ(on.plan_begin - off.plan_begin,
              static_cast<size_t>(on.buf.total_bytes - off.buf.total_bytes));  // the plan region moves, nothing else
}

}  // namespace
}  // namespace evenep::cuda
