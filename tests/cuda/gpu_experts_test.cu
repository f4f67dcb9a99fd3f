// GPU tests of prefetch_weight and reduce_grad (evenep/cuda/experts.hpp) against their definition, bit for bit.
//
// Cases:
//   ExpertsTest.PrefetchAndReduce/<shape>  a skewed routing's plan (copies on several ranks); every slot holding an
//       expert equals its home weights, unused slots keep their sentinel; every home gradient equals
//       g + slot(r0,b0) + slot(r1,b1) + ... in ascending (rank, slot) fp32 order, consumed slots are zero, unused
//       slot gradients and gradients of uncopied experts are untouched. Shapes: 3 projections x 64 elements,
//       1 projection x 40008 elements (several 32 KiB tiles and a partial one), B < epn (inference), R = 8.
//       *_relay: EpOptions::relay on a hot-expert routing (a copy tree deeper than one level, asserted): slots
//       still equal their home weights; the gradients follow the tree (a relay's slot + its children ascending
//       (rank, slot), then the home + its children ascending), the order of the CPU backend.
//   ExpertsTest.ReduceTwiceIsDeterministic  the same inputs reduced twice give the same bits
//   ExpertPoolTest.LayersShareSlots  two layers on one ExpertPool: each prefetch fills the shared slots with that
//       layer's home weights; ExpertPool::holds names the last layer and plan
//   ExpertPoolTest.LayersFreeTheirWindows  20 rounds of a layer with its own pool (a quarter of the free device
//       memory) plus a layer on the shared pool: each round's windows go back to the team (num_windows), the free
//       memory is back to where it started
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/routing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::GroupIo;

struct Shape {
    int R, E, B, P;
    int64_t elems;
    const char* name;
    bool relay = false;  // EpOptions::relay on a hot-expert routing
};

struct Fixture {
    Config cfg;
    std::unique_ptr<DeviceEp> ep;
    std::unique_ptr<GroupIo> io;
    std::unique_ptr<Experts> ex;
    EpPlan ep_plan;
    Plan plan;
};

std::vector<float> host_floats(size_t n, uint64_t seed) { return testing::random_floats(n, seed); }
std::vector<uint16_t> host_bf16(size_t n, uint64_t seed) { return testing::random_bf16_bits(n, seed); }

using testing::get;
using testing::put;

Fixture make_fixture(const Shape& sh) {
    Fixture f;
    f.cfg.R = sh.R;
    f.cfg.E = sh.E;
    f.cfg.K = 4;
    f.cfg.S = 64;
    f.cfg.tp = 8;
    f.cfg.B = sh.B;
    EpOptions options;
    options.relay = sh.relay;
    f.ep = std::make_unique<DeviceEp>(f.cfg, 8, options);
    f.io = std::make_unique<GroupIo>(sh.R, f.cfg.S, f.cfg.K, 8);
    testing::RoutingOptions ro;
    ro.skew = 3.0;
    const Routing routing =
        sh.relay ? make_adversarial({sh.R, sh.E, f.cfg.K, f.cfg.S, 3}, Adversarial::kSingleHotExpert)
                 : testing::random_routing(f.cfg, 99, ro);
    for (int r = 0; r < sh.R; ++r) f.io->idx[r].upload(routing.topk_idx[r]);
    f.ep_plan = f.ep->plan(f.io->io, routing.s, nullptr);
    f.ep->check(nullptr);
    f.plan = f.ep->download_plan(f.ep_plan, 0);
    ExpertsShape es;
    es.num_projections = sh.P;
    es.elems = sh.elems;
    f.ex = std::make_unique<Experts>(*f.ep, es);
    return f;
}

class ExpertsTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ExpertsTest, PrefetchAndReduce) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Shape sh = GetParam();
    Fixture f = make_fixture(sh);
    const int R = sh.R, epn = f.cfg.epn(), B = f.cfg.num_slots();
    const size_t n = static_cast<size_t>(sh.elems);
    int num_copies = 0;
    for (int32_t e : f.plan.copies) num_copies += e >= 0;
    ASSERT_GT(num_copies, 0) << "the routing must produce copies";
    int relayed = 0;
    for (size_t i = 0; i < f.plan.copies.size(); ++i)
        relayed += f.plan.copies[i] >= 0 && f.plan.relay_src[i] != f.plan.copies[i] / epn;
    if (sh.relay) {
        ASSERT_GT(relayed, 0) << "the relay cases must forward some copy";
    }
    // Inputs: random weights and gradients, sentinel slots.
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < sh.P; ++p) {
            for (int g = 0; g < epn; ++g) {
                put(f.ex->weight(r, p, g), host_bf16(n, 1000 + (r * 3 + p) * 97 + g));
                put(f.ex->grad(r, p, g), host_floats(n, 5000 + (r * 3 + p) * 97 + g));
            }
            for (int b = 0; b < B; ++b) {
                put(f.ex->slot(r, p, b), std::vector<uint16_t>(n, 0x7FC1));
                put(f.ex->slot_grad(r, p, b), host_floats(n, 9000 + (r * 3 + p) * 97 + b));
            }
        }
    f.ex->prefetch_weight(*f.ep, f.ep_plan, nullptr);
    f.ep->check(nullptr);
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) {
            const int32_t e = f.plan.copies[static_cast<size_t>(r) * B + b];
            for (int p = 0; p < sh.P; ++p) {
                const std::vector<uint16_t> got = get(f.ex->slot(r, p, b), n);
                const std::vector<uint16_t> want =
                    e >= 0 ? get(f.ex->weight(e / epn, p, e % epn), n) : std::vector<uint16_t>(n, 0x7FC1);
                ASSERT_EQ(got, want) << sh.name << ": slot " << b << " of rank " << r << " (expert " << e
                                     << ") projection " << p;
            }
        }
    // Expected gradients on the host, in the contract's order.
    std::vector<std::vector<float>> want_grad(static_cast<size_t>(R) * sh.P * epn);
    std::vector<std::vector<float>> want_slot(static_cast<size_t>(R) * sh.P * B);
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < sh.P; ++p) {
            for (int g = 0; g < epn; ++g) want_grad[(r * sh.P + p) * epn + g] = get(f.ex->grad(r, p, g), n);
            for (int b = 0; b < B; ++b) want_slot[(r * sh.P + p) * B + b] = get(f.ex->slot_grad(r, p, b), n);
        }
    // The copy tree (direct: every copy's parent is its home): acc(parent) += subtree sum of each child, children in
    // ascending (rank, slot) order, a child's subtree sum being its own slot gradient plus its children's.
    const std::function<void(int, int32_t, int, std::vector<float>&)> add_children =
        [&](int parent, int32_t e, int p, std::vector<float>& acc) {
            for (int q = 0; q < R; ++q)
                for (int b = 0; b < B; ++b) {
                    const size_t k = static_cast<size_t>(q) * B + b;
                    if (f.plan.copies[k] != e || f.plan.relay_src[k] != parent) continue;
                    std::vector<float>& s = want_slot[(q * sh.P + p) * B + b];
                    add_children(q, e, p, s);
                    for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + s[i];
                    std::fill(s.begin(), s.end(), 0.0f);
                }
        };
    for (int32_t e = 0; e < f.cfg.E; ++e)
        for (int p = 0; p < sh.P; ++p) add_children(e / epn, e, p, want_grad[((e / epn) * sh.P + p) * epn + e % epn]);
    f.ex->reduce_grad(*f.ep, f.ep_plan, nullptr);
    f.ep->check(nullptr);
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < sh.P; ++p) {
            for (int g = 0; g < epn; ++g) {
                const std::vector<float> got = get(f.ex->grad(r, p, g), n);
                ASSERT_EQ(std::memcmp(got.data(), want_grad[(r * sh.P + p) * epn + g].data(), n * 4), 0)
                    << sh.name << ": gradient of expert " << r * epn + g << " projection " << p;
            }
            for (int b = 0; b < B; ++b) {
                const std::vector<float> got = get(f.ex->slot_grad(r, p, b), n);
                ASSERT_EQ(std::memcmp(got.data(), want_slot[(r * sh.P + p) * B + b].data(), n * 4), 0)
                    << sh.name << ": slot gradient " << b << " of rank " << r << " projection " << p;
            }
        }
}

INSTANTIATE_TEST_SUITE_P(Shapes,
                         ExpertsTest,
                         ::testing::Values(Shape{4, 16, -1, 3, 64, "R4_E16_P3_small"},
                                           Shape{4, 16, -1, 1, 40008, "R4_E16_P1_multitile"},
                                           Shape{4, 32, 3, 2, 136, "R4_E32_B3_inference"},
                                           Shape{8, 64, -1, 1, 1024, "R8_E64_P1"},
                                           Shape{8, 32, -1, 2, 136, "R8_E32_P2_relay", true},
                                           Shape{8, 64, -1, 1, 40008, "R8_E64_P1_multitile_relay", true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ExpertsDeterminismTest, ReduceTwiceIsDeterministic) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Shape sh{4, 16, -1, 1, 4096, "determinism"};
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
        Fixture f = make_fixture(sh);
        const int epn = f.cfg.epn(), B = f.cfg.num_slots();
        for (int r = 0; r < sh.R; ++r) {
            for (int g = 0; g < epn; ++g) put(f.ex->grad(r, 0, g), host_floats(4096, 11 + r * 31 + g));
            for (int b = 0; b < B; ++b) put(f.ex->slot_grad(r, 0, b), host_floats(4096, 77 + r * 31 + b));
        }
        f.ex->reduce_grad(*f.ep, f.ep_plan, nullptr);
        f.ep->check(nullptr);
        std::vector<std::vector<float>> grads;
        for (int r = 0; r < sh.R; ++r)
            for (int g = 0; g < epn; ++g) grads.push_back(get(f.ex->grad(r, 0, g), 4096));
        if (run == 0)
            first = grads;
        else
            for (size_t i = 0; i < grads.size(); ++i)
                ASSERT_EQ(std::memcmp(grads[i].data(), first[i].data(), 4096 * 4), 0) << "gradient " << i;
    }
}

// Two layers share one ExpertPool: each prefetch fills the shared slots with its own layer's weights, and the pool
// records whose weights (and which plan) it holds.
TEST(ExpertPoolTest, LayersShareSlots) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Shape sh{4, 16, -1, 2, 64, "R4_E16_P2_shared"};
    Fixture f = make_fixture(sh);
    Experts second(*f.ep, f.ex->pool(), f.ex->shape());
    const int R = sh.R, epn = f.cfg.epn(), B = f.cfg.num_slots();
    const size_t n = static_cast<size_t>(sh.elems);
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < sh.P; ++p)
            for (int g = 0; g < epn; ++g) {
                put(f.ex->weight(r, p, g), host_bf16(n, 100 + (r * 3 + p) * 97 + g));
                put(second.weight(r, p, g), host_bf16(n, 200 + (r * 3 + p) * 97 + g));
            }
    EXPECT_FALSE(f.ex->pool().holds(*f.ex, f.ep_plan));
    for (Experts* layer : {f.ex.get(), &second, f.ex.get()}) {
        layer->prefetch_weight(*f.ep, f.ep_plan, nullptr);
        f.ep->check(nullptr);
        EXPECT_TRUE(f.ex->pool().holds(*layer, f.ep_plan));
        EXPECT_FALSE(f.ex->pool().holds(layer == &second ? *f.ex : second, f.ep_plan));
        for (int r = 0; r < R; ++r)
            for (int b = 0; b < B; ++b) {
                const int32_t e = f.plan.copies[static_cast<size_t>(r) * B + b];
                if (e < 0) continue;
                for (int p = 0; p < sh.P; ++p)
                    ASSERT_EQ(get(layer->slot(r, p, b), n), get(layer->weight(e / epn, p, e % epn), n))
                        << "slot " << b << " of rank " << r << " (expert " << e << ") projection " << p;
            }
    }
    EXPECT_EQ(second.slot(1, 0, 0), f.ex->slot(1, 0, 0)) << "the layers' slots are the pool's";
}

TEST(ExpertPoolTest, LayersFreeTheirWindows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Shape sh{4, 16, -1, 1, 64, "R4_E16_P1_loop"};
    Fixture f = make_fixture(sh);
    const Team& team = f.ep->team();
    const size_t held = team.num_windows();  // the Ep's, the fixture layer's and its pool's
    EXPECT_EQ(held, 3u);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    size_t before = 0, total = 0;
    EVENEP_CUDA_CHECK(cudaMemGetInfo(&before, &total));
    // One layer with its own pool: R ranks x (epn + B) matrices x (2 + 4) bytes per element (weights and gradients).
    const int64_t per_elem = int64_t{sh.R} * (f.cfg.epn() + f.cfg.num_slots()) * 6;
    ExpertsShape es;
    es.num_projections = 1;
    es.elems = static_cast<int64_t>(before / 4) / per_elem / 8 * 8;
    for (int i = 0; i < 20; ++i) {
        Experts own(*f.ep, es);
        Experts shared(*f.ep, f.ex->pool(), f.ex->shape());
        ASSERT_EQ(team.num_windows(), held + 3) << "round " << i;
    }
    EXPECT_EQ(team.num_windows(), held);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    size_t after = 0;
    EVENEP_CUDA_CHECK(cudaMemGetInfo(&after, &total));
    EXPECT_LE(before - std::min(before, after), size_t{64} << 20) << "free before " << before << ", after " << after;
}

}  // namespace
}  // namespace evenep::cuda
