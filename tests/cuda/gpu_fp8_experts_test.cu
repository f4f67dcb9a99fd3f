// GPU FP8 weight prefetch (ExpertsShape::fp8, evenep/cuda/experts.hpp) bit-identical to the CPU pool's cast.
//
// Cases:
//   Fp8ExpertsTest.PrefetchE4m3/<direct|relay|ue8m0>  R = 8, E = 32, H = 256, H' = 128, three projections (gate/up
//       [H, H'], down [H', H]); weights random with an outlier block, an all-zero block and a tiny block. After
//       prefetch_weight every home's weights8 / weight_scale equal cpu::quantize_weight_fp8 of its bf16 master
//       weights (the function cpu::ExpertWeights::cast_fp8 calls) and its weights8t their transpose, and every slot
//       holding expert e holds e's e4m3 codes and scales bit for bit (relay: a copy tree deeper than one level,
//       asserted); the bf16 slots are not written (sentinel kept: the FP8 GEMMs read codes only); unused slots keep
//       their sentinel bytes.
//   Fp8ExpertsReuse.CastOncePerWeightChange  R = 2, E = 4: by default every prefetch_weight casts the current bf16
//       weights; with reuse_fp8_cast(true) a prefetch after a write without weights_changed() keeps the previous
//       cast (as documented: stale), and the first after weights_changed() casts the new weights.
//   Fp8ExpertsTest.ShapeChecks   fp8 with H = 200, elems != H*H', ue8m0 without fp8: refused naming the values.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/error.hpp"
#include "evenep/routing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::get;
using testing::GroupIo;
using testing::put;

struct Case {
    const char* name;
    bool relay, ue8m0;
};

class Fp8ExpertsTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8ExpertsTest, PrefetchE4m3) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Case c = GetParam();
    constexpr int R = 8, E = 32, H = 256, F = 128, P = 3;  // the relay tree of gpu_experts_test's R8_E32 case
    Config cfg;
    cfg.R = R, cfg.E = E, cfg.K = 4, cfg.S = 64, cfg.tp = 8;
    EpOptions options;
    options.relay = c.relay;
    DeviceEp ep(cfg, H, options);
    GroupIo io(R, cfg.S, cfg.K, H);
    const Routing routing = c.relay ? make_adversarial({R, E, cfg.K, cfg.S, 3}, Adversarial::kSingleHotExpert)
                                    : make_adversarial({R, E, cfg.K, cfg.S, 7}, Adversarial::kSingleHotExpert);
    for (int r = 0; r < R; ++r) io.idx[r].upload(routing.topk_idx[r]);
    const EpPlan ep_plan = ep.plan(io.io, routing.s, nullptr);
    ep.check(nullptr);
    const Plan plan = ep.download_plan(ep_plan, 0);
    const int epn = cfg.epn(), B = cfg.num_slots();
    int copies = 0, relayed = 0;
    for (size_t i = 0; i < plan.copies.size(); ++i) {
        copies += plan.copies[i] >= 0;
        relayed += plan.copies[i] >= 0 && plan.relay_src[i] != plan.copies[i] / epn;
    }
    ASSERT_GT(copies, 0) << "the routing must produce copies";
    if (c.relay) ASSERT_GT(relayed, 0) << "the relay case must forward some copy";

    ExpertsShape es;
    es.num_projections = P;
    es.elems = static_cast<int64_t>(H) * F;
    es.with_grads = false;
    es.fp8 = true;
    es.ue8m0 = c.ue8m0;
    es.hidden = H;
    es.ffn = F;
    Experts ex(ep, es);
    const size_t n = static_cast<size_t>(es.elems), ns = static_cast<size_t>(detail::fp8_weight_scales(H, F));
    std::vector<std::vector<std::vector<Bf16>>> w(R * epn, std::vector<std::vector<Bf16>>(P));
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < P; ++p)
            for (int g = 0; g < epn; ++g) {
                std::vector<Bf16> v = testing::random_bf16(n, 700 + (r * 3 + p) * 97 + g);
                const size_t in = static_cast<size_t>(detail::proj_in_dim(p, H, F));
                const size_t out = static_cast<size_t>(detail::proj_out_dim(p, H, F));
                for (size_t i = in - kFp8Block; i < in; ++i)  // the last block all zero
                    for (size_t j = out - kFp8Block; j < out; ++j) v[i * out + j] = Bf16{0};
                for (size_t i = 0; i < kFp8Block; ++i)  // the first block tiny (e4m3 subnormals)
                    for (size_t j = 0; j < kFp8Block; ++j)
                        v[i * out + j] = float_to_bf16(bf16_to_float(v[i * out + j]) * 1e-6f);
                // An outlier: in the tiny first block for even g, in the second row block for odd g where there is
                // one (the down projection has in = F = 128: one row block only).
                const size_t outlier_row = g % 2 && in > static_cast<size_t>(kFp8Block) ? kFp8Block : 0;
                v[outlier_row * out + 5] = float_to_bf16(-900.0f);
                w[r * epn + g][p] = v;
                put(ex.weight(r, p, g), testing::bits_of(v));
            }
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < P; ++p)
            for (int b = 0; b < B; ++b) {
                EVENEP_CUDA_CHECK(cudaMemset(ex.slot(r, p, b), 0x77, n * 2));
                EVENEP_CUDA_CHECK(cudaMemset(ex.slot8(r, p, b), 0x77, n));
                EVENEP_CUDA_CHECK(cudaMemset(ex.slot_scale(r, p, b), 0x77, ns * 4));
            }
    ex.prefetch_weight(ep, ep_plan, nullptr);
    ep.check(nullptr);

    // The host cast of every expert (cpu::ExpertWeights::cast_fp8's function).
    std::vector<std::vector<std::vector<Fp8E4m3>>> q(R * epn, std::vector<std::vector<Fp8E4m3>>(P));
    std::vector<std::vector<std::vector<float>>> s(R * epn, std::vector<std::vector<float>>(P));
    for (int e = 0; e < E; ++e)
        for (int p = 0; p < P; ++p) {
            q[e][p].resize(n);
            s[e][p].resize(ns);
            cpu::quantize_weight_fp8(w[e][p].data(), detail::proj_in_dim(p, H, F), detail::proj_out_dim(p, H, F),
                                     c.ue8m0, q[e][p].data(), s[e][p].data());
            const int r = e / epn, g = e % epn;
            const std::vector<uint8_t> hq = get(ex.weight8(r, p, g), n);
            const std::vector<float> hs = get(ex.weight_scale(r, p, g), ns);
            for (size_t i = 0; i < ns; ++i)
                ASSERT_EQ(float_as_bits(hs[i]), float_as_bits(s[e][p][i]))
                    << "home scale e " << e << " p " << p << " " << i;
            for (size_t i = 0; i < n; ++i)
                ASSERT_EQ(hq[i], q[e][p][i].bits) << "home code e " << e << " p " << p << " " << i;
            const std::vector<uint8_t> ht = get(ex.weight8t(r, p, g), n);
            const size_t in = static_cast<size_t>(detail::proj_in_dim(p, H, F));
            const size_t out = static_cast<size_t>(detail::proj_out_dim(p, H, F));
            for (size_t i = 0; i < in; ++i)
                for (size_t j = 0; j < out; ++j)
                    ASSERT_EQ(ht[j * in + i], q[e][p][i * out + j].bits)
                        << "home transposed code e " << e << " p " << p << " (" << j << ", " << i << ")";
        }
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) {
            const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
            for (int p = 0; p < P; ++p) {
                const std::vector<uint16_t> sw = get(ex.slot(r, p, b), n);
                const std::vector<uint8_t> sq = get(ex.slot8(r, p, b), n);
                const std::vector<float> ss = get(ex.slot_scale(r, p, b), ns);
                const std::string at = "rank " + std::to_string(r) + " slot " + std::to_string(b) + " proj " +
                                       std::to_string(p) + " expert " + std::to_string(e);
                if (e < 0) {
                    for (size_t i = 0; i < n; ++i) ASSERT_EQ(sq[i], 0x77) << at << " (unused slot) " << i;
                    for (size_t i = 0; i < n; ++i) ASSERT_EQ(sw[i], 0x7777) << at << " (unused slot) " << i;
                    continue;
                }
                for (size_t i = 0; i < n; ++i) ASSERT_EQ(sw[i], 0x7777) << at << " bf16 (not prefetched) " << i;
                for (size_t i = 0; i < n; ++i) ASSERT_EQ(sq[i], q[e][p][i].bits) << at << " code " << i;
                for (size_t i = 0; i < ns; ++i)
                    ASSERT_EQ(float_as_bits(ss[i]), float_as_bits(s[e][p][i])) << at << " scale " << i;
            }
        }
}

INSTANTIATE_TEST_SUITE_P(Fp8,
                         Fp8ExpertsTest,
                         ::testing::Values(Case{"direct", false, false},
                                           Case{"relay", true, false},
                                           Case{"ue8m0", false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Fp8ExpertsReuse, CastOncePerWeightChange) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    constexpr int H = 128, F = 128;
    Config cfg;
    cfg.R = 2, cfg.E = 4, cfg.K = 2, cfg.S = 8, cfg.tp = 1;
    DeviceEp ep(cfg, H, EpOptions{});
    GroupIo io(cfg.R, cfg.S, cfg.K, H);
    const Routing routing = make_adversarial({cfg.R, cfg.E, cfg.K, cfg.S, 3}, Adversarial::kSingleHotExpert);
    for (int r = 0; r < cfg.R; ++r) io.idx[r].upload(routing.topk_idx[r]);
    const EpPlan ep_plan = ep.plan(io.io, routing.s, nullptr);
    ExpertsShape es;
    es.num_projections = 1;
    es.elems = static_cast<int64_t>(H) * F;
    es.with_grads = false;
    es.fp8 = true;
    es.hidden = H;
    es.ffn = F;
    Experts ex(ep, es);
    const size_t n = static_cast<size_t>(es.elems);
    // Writes weights seeded `seed` to expert 0 and returns their host cast.
    auto write = [&](uint64_t seed) {
        const std::vector<Bf16> v = testing::random_bf16(n, seed);
        put(ex.weight(0, 0, 0), testing::bits_of(v));
        std::vector<Fp8E4m3> q(n);
        std::vector<float> sc(static_cast<size_t>(detail::fp8_weight_scales(H, F)));
        cpu::quantize_weight_fp8(v.data(), H, F, false, q.data(), sc.data());
        std::vector<uint8_t> b(n);
        for (size_t i = 0; i < n; ++i) b[i] = q[i].bits;
        return b;
    };
    auto prefetch_gives = [&](const std::vector<uint8_t>& want) {
        ex.prefetch_weight(ep, ep_plan, nullptr);
        ep.check(nullptr);
        return get(ex.weight8(0, 0, 0), n) == want;
    };
    const std::vector<uint8_t> a = write(11);
    EXPECT_TRUE(prefetch_gives(a));  // default: every prefetch casts
    const std::vector<uint8_t> b = write(12);
    EXPECT_TRUE(prefetch_gives(b));
    ex.reuse_fp8_cast(true);
    EXPECT_TRUE(ex.fp8_cast_current());
    const std::vector<uint8_t> c = write(13);
    EXPECT_TRUE(prefetch_gives(b)) << "reuse: no weights_changed(), the previous cast stays";
    ex.weights_changed();
    EXPECT_FALSE(ex.fp8_cast_current());
    EXPECT_TRUE(prefetch_gives(c)) << "reuse: the first prefetch after weights_changed() casts";
    EXPECT_TRUE(ex.fp8_cast_current());
}

TEST(Fp8ExpertsShapeTest, ShapeChecks) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    Config cfg;
    cfg.R = 2, cfg.E = 4, cfg.K = 2, cfg.S = 8, cfg.tp = 1;
    DeviceEp ep(cfg, 256, EpOptions{});
    auto refused = [&](ExpertsShape es, const char* needle) {
        try {
            Experts ex(ep, es);
            ADD_FAILURE() << "accepted " << needle;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    ExpertsShape es;
    es.elems = 200 * 128;
    es.fp8 = true;
    es.hidden = 200;
    es.ffn = 128;
    refused(es, "H = 200");
    es.hidden = 256;
    refused(es, "H*H' = 32768");
    es.fp8 = false;
    es.ue8m0 = true;
    refused(es, "ue8m0");
}

}  // namespace
}  // namespace evenep::cuda
