// GPU tests of the device API over the plan tensor (evenep/cuda/expert_ops.hpp) against its host definitions.
//
// Cases:
//   ExpertOpsTest.PackPlanMatchesHostRows/<routing>  cuda::pack_plan of the resident plan equals
//       evenep::pack_plan_row of every rank's downloaded plan, bit for bit (every column of plan_columns, int8
//       group_source widened); routings: lognormal (sigma 1.5: copies) and round robin; R=4 E=16 K=4 tp=8, B = E/R.
//   ExpertOpsTest.PlannerWritesPlanRows/<routing>  Ep::plan with RankIo::plan: the planner's last phase writes the
//       rows pack_plan gives, bit for bit, with each planner kernel (cluster, parallel, serial), nothing past them.
//   ExpertOpsTest.UnpackPlanCombinesLikeThePlan/<routing>  cuda::unpack_plan of the packed plan and handle (s = 32,
//       20, 32, 9; s_pad = S for every rank), after another plan replaced it: combine equals the plan's combine bit
//       for bit (zero rows past s_r), pack_plan gives the tensor back, every_rank: every buffer's copies table whole.
//   ExpertOpsFlowTest.WeightRowsMatchHostRowGrad  cuda::weight_rows over the packed plan: rows = bf16(w * rows) and
//       grad_w = <rows, y> equal detail::row_grad on the host bit for bit (H = 520: 65 vectors, lanes with 3 and 2
//       vectors), grad_w = 0 and rows untouched past each rank's groups.
//   ExpertOpsFlowTest.GroupTableFromPlan  cuda::build_group_table: cu = i*NvS + cu_seqlens, the gap group ends at
//       (i+1)*NvS, pointers of kLocal groups into home, kSlot into slots (rank, slot), null for empty groups and the
//       gap.
//   ExpertCopiesArgs.RefusedNamingTheValue  ExpertCopies::of_tensors, prefetch_copies and reduce_copies throw on the
//       host (plan rows that are not every rank, null copies, a matrix that is not fp32 words, no home base), naming
//       the value; of_tensors' strides (no device needed).
//   ExpertOpsFlowTest.GroupTablePerRowSources  the same with separate allocations per rank (cuda::MoeLayer's use):
//       homes[i] for the row's own experts, row_slots[i], peers[e / epn] for experts outside the row's range, cu null;
//       with gradient sources (no peers) kPeer groups get null.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/row_grad.hpp"
#include "evenep/plan_tensor.hpp"
#include "evenep/routing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::DeviceArray;
using testing::GroupIo;

struct Planned {
    BufferConfig bc;
    DeviceEp ep;
    GroupIo io;
    EpPlan plan;
    Planned(const BufferConfig& b, const Routing& routing, const EpOptions& options = {})
        : bc(b), ep(b.cfg, b.H, options), io(b.cfg.R, b.cfg.S, b.cfg.K, b.H) {
        const auto tokens = testing::random_tokens(bc, routing, 7);
        for (int r = 0; r < bc.cfg.R; ++r) {
            io.idx[r].upload(tokens[r].topk_idx);
            io.w[r].upload(tokens[r].topk_w);
            io.x[r].upload(testing::bits_of(tokens[r].x));
        }
        plan = ep.plan(io.io, routing.s, nullptr);
        ep.dispatch(plan, io.io, nullptr);
    }
    std::vector<int32_t> packed() {
        DeviceArray<int32_t> d(static_cast<size_t>(bc.cfg.R) * plan_row_width(bc.cfg));
        pack_plan(ep, d.get(), nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        return d.download();
    }
};

class ExpertOpsTest : public ::testing::TestWithParam<const char*> {};

Routing routing_of(const std::string& kind, const RoutingSpec& spec) {
    return kind == "lognormal" ? make_lognormal(spec, 1.5) : make_round_robin(spec);
}

TEST_P(ExpertOpsTest, PackPlanMatchesHostRows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 16);
    Planned p(bc, routing_of(GetParam(), RoutingSpec{4, 16, 4, 32, 3}));
    const std::vector<int32_t> got = p.packed();
    const int64_t W = plan_row_width(bc.cfg);
    for (int r = 0; r < bc.cfg.R; ++r) {
        std::vector<int32_t> want(W);
        pack_plan_row(p.ep.download_plan(p.plan, r), r, want);
        for (const PlanColumn& c : plan_columns(bc.cfg))
            for (int64_t j = 0; j < c.count; ++j)
                ASSERT_EQ(got[r * W + c.offset + j], want[c.offset + j]) << c.name << "[" << r << "][" << j << "]";
    }
}

// Ep::plan with RankIo::plan set writes every rank's row in the planner's last phase: the rows pack_plan gives, bit
// for bit, with each planner form (the cluster planner's three launches, the fused one-block and serial launches),
// and nothing outside the rows.
TEST_P(ExpertOpsTest, PlannerWritesPlanRows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 16);
    const Routing routing = routing_of(GetParam(), RoutingSpec{4, 16, 4, 32, 3});
    const int64_t W = plan_row_width(bc.cfg), R = bc.cfg.R;
    for (PlannerKernel kernel : {PlannerKernel::kCluster, PlannerKernel::kParallel, PlannerKernel::kSerial}) {
        EpOptions o;
        o.planner_kernel = kernel;
        Planned p(bc, routing, o);
        const std::vector<int32_t> want = p.packed();
        DeviceArray<int32_t> rows(static_cast<size_t>(R * W + 1));
        const std::vector<int32_t> fill(R * W + 1, -7);
        rows.upload(fill);
        std::vector<RankIo> io = p.io.io;
        for (int r = 0; r < R; ++r) io[r].plan = rows.get() + r * W;
        p.ep.plan(io, routing.s, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<int32_t> got = rows.download();
        for (int64_t i = 0; i < R * W; ++i)
            ASSERT_EQ(got[i], want[i]) << "planner kernel " << static_cast<int>(kernel) << ", rank " << i / W
                                       << ", column " << i % W;
        EXPECT_EQ(got[R * W], -7) << "written past the rows";
    }
}

// The plan made resident again from its tensor and handle (unequal s: the handle masks the entries past s_r) after
// another plan replaced it: combine gives the original plan's rows (zero rows past s_r), pack_plan gives the tensor
// back, and with every_rank every rank's copies table is the whole plan's.
TEST_P(ExpertOpsTest, UnpackPlanCombinesLikeThePlan) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 16);
    const int R = bc.cfg.R, K = bc.cfg.K, S = bc.cfg.S, H = bc.H, B = bc.cfg.num_slots();
    const int64_t W = plan_row_width(bc.cfg);
    const PlanRowLayout L = PlanRowLayout::make(bc.cfg);
    Routing routing = routing_of(GetParam(), RoutingSpec{4, 16, 4, 32, 3});
    const std::vector<int32_t> s = {32, 20, 32, 9};
    for (int r = 0; r < R; ++r) {
        routing.s[r] = s[r];
        routing.topk_idx[r].resize(static_cast<size_t>(s[r]) * K);
    }
    DeviceEp ep(bc.cfg, H, EpOptions{});
    GroupIo io(R, S, K, H);
    const auto tokens = testing::random_tokens(bc, routing, 7);
    for (int r = 0; r < R; ++r) {
        io.idx[r].upload(tokens[r].topk_idx);
        io.w[r].upload(tokens[r].topk_w);
        io.x[r].upload(testing::bits_of(tokens[r].x));
    }
    EpPlan plan = ep.plan(io.io, s, nullptr, 32 + 20 + 32 + 9);
    ep.dispatch(plan, io.io, nullptr);
    ep.combine(plan, io.io, true, CombineMode::kPull, nullptr);
    DeviceArray<int32_t> packed(static_cast<size_t>(R) * W), handle(static_cast<size_t>(R) * S * K);
    pack_plan(ep, packed.get(), nullptr);
    pack_handle(ep, handle.get(), S, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::vector<uint16_t>> want(R);
    for (int r = 0; r < R; ++r) want[r] = io.out[r].download();
    const std::vector<int32_t> host_packed = packed.download();

    // Another plan (released, so nothing is copied out) overwrites the plan arrays; the receive rows stay.
    plan = EpPlan{};
    const Routing other = make_lognormal(RoutingSpec{4, 16, 4, 32, 9}, 0.5);
    for (int r = 0; r < R; ++r) io.idx[r].upload(other.topk_idx[r]);
    (void)ep.plan(io.io, other.s, nullptr);

    UnpackPlanArgs a;
    a.plan = PlanRows{packed.get(), R, L};
    a.handle = handle.get();
    a.s_pad = S;
    a.every_rank = true;
    const EpPlan u = unpack_plan(ep, a, nullptr);
    ASSERT_TRUE(ep.is_resident(u));
    for (int r = 0; r < R; ++r) io.out[r].upload(std::vector<uint16_t>(static_cast<size_t>(S) * H, 0x7fc0));
    ep.combine(u, io.io, true, CombineMode::kPull, nullptr);
    DeviceArray<int32_t> again(static_cast<size_t>(R) * W);
    pack_plan(ep, again.get(), nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < R; ++r) {
        const std::vector<uint16_t> got = io.out[r].download();
        for (int64_t i = 0; i < static_cast<int64_t>(S) * H; ++i)
            ASSERT_EQ(got[i], i / H < s[r] ? want[r][i] : uint16_t{0}) << "rank " << r << " token " << i / H;
    }
    ASSERT_EQ(again.download(), host_packed);
    for (int q = 0; q < R; ++q) {
        const std::vector<int32_t> copies = testing::get(ep.copies(q), static_cast<size_t>(R) * B);
        for (int r = 0; r < R; ++r)
            for (int b = 0; b < B; ++b)
                ASSERT_EQ(copies[r * B + b], host_packed[r * W + L.copies + b]) << "buffer " << q << " rank " << r;
    }
}

INSTANTIATE_TEST_SUITE_P(Routings, ExpertOpsTest, ::testing::Values("lognormal", "round_robin"),
                         [](const auto& info) { return std::string(info.param); });

TEST(ExpertOpsFlowTest, WeightRowsMatchHostRowGrad) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 520);
    Planned p(bc, make_lognormal(RoutingSpec{4, 16, 4, 32, 5}, 1.0));
    const int R = bc.cfg.R, H = bc.H;
    const int64_t nvs = bc.cfg.recv_rows(), W = plan_row_width(bc.cfg);
    const std::vector<int32_t> host_plan = p.packed();
    DeviceArray<int32_t> plan(host_plan.size());
    plan.upload(host_plan);
    const size_t n = static_cast<size_t>(R) * nvs * H;
    const std::vector<Bf16> rows0 = testing::random_bf16(n, 11), y = testing::random_bf16(n, 12);
    const std::vector<Bf16> wb = testing::random_bf16(static_cast<size_t>(R) * nvs, 13);
    std::vector<float> w(wb.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_float(wb[i]);
    DeviceArray<uint16_t> d_rows(n), d_y(n);
    DeviceArray<float> d_w(w.size()), d_gw(w.size());
    d_rows.upload(testing::bits_of(rows0));
    d_y.upload(testing::bits_of(y));
    d_w.upload(w);
    WeightRowsArgs a;
    a.plan = PlanRows{plan.get(), R, PlanRowLayout::make(bc.cfg)};
    a.nvs = nvs;
    a.H = H;
    a.rows = d_rows.get();
    a.y = d_y.get();
    a.recv_w = d_w.get();
    a.grad_w = d_gw.get();
    weight_rows(a, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got_rows = d_rows.download();
    const std::vector<float> got_w = d_gw.download();
    const PlanRowLayout L = PlanRowLayout::make(bc.cfg);
    for (int r = 0; r < R; ++r) {
        const int64_t used = host_plan[r * W + L.cu_seqlens + L.G - 1];
        ASSERT_GT(used, 0);
        for (int64_t k = 0; k < nvs; ++k) {
            const int64_t row = r * nvs + k;
            std::vector<Bf16> dy(H);
            const float dw = k < used ? detail::row_grad(rows0.data() + row * H, y.data() + row * H, w[row],
                                                         dy.data(), H)
                                      : 0.0f;
            ASSERT_EQ(got_w[row], dw) << "rank " << r << " row " << k;
            for (int h = 0; h < H; ++h)
                ASSERT_EQ(got_rows[row * H + h], k < used ? dy[h].bits : rows0[row * H + h].bits)
                    << "rank " << r << " row " << k << " col " << h;
        }
    }
}

TEST(ExpertOpsFlowTest, GroupTableFromPlan) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 16);
    Planned p(bc, make_lognormal(RoutingSpec{4, 16, 4, 32, 3}, 1.5));
    const int R = bc.cfg.R, E = bc.cfg.E, B = bc.cfg.num_slots();
    const int64_t nvs = bc.cfg.recv_rows(), W = plan_row_width(bc.cfg), mat = 64;
    const std::vector<int32_t> host_plan = p.packed();
    DeviceArray<int32_t> plan(host_plan.size());
    plan.upload(host_plan);
    const PlanRowLayout L = PlanRowLayout::make(bc.cfg);
    DeviceArray<char> home(static_cast<size_t>(E) * mat), slots(static_cast<size_t>(R) * B * mat);
    const int groups = R * (L.G + 1);
    DeviceArray<const void*> table(groups);
    DeviceArray<int32_t> cu(groups);
    GroupTableArgs a;
    a.plan = PlanRows{plan.get(), R, L};
    a.nvs = nvs;
    a.num_home = E;
    a.home = home.get();
    a.slots = slots.get();
    a.mat_bytes = mat;
    a.table = table.get();
    a.cu = cu.get();
    build_group_table(a, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<const void*> t = table.download();
    const std::vector<int32_t> c = cu.download();
    for (int r = 0; r < R; ++r) {
        const int32_t* row = host_plan.data() + r * W;
        for (int g = 0; g < L.G; ++g) {
            const int i = r * (L.G + 1) + g;
            EXPECT_EQ(c[i], r * nvs + row[L.cu_seqlens + g]);
            const auto src = static_cast<WeightSource>(row[L.group_source + g]);
            const char* want = src == WeightSource::kLocal || src == WeightSource::kPeer
                                   ? home.get() + row[L.group_expert + g] * mat
                               : src == WeightSource::kSlot ? slots.get() + (r * B + row[L.group_slot + g]) * mat
                                                            : nullptr;
            EXPECT_EQ(t[i], want) << "rank " << r << " group " << g;
        }
        EXPECT_EQ(c[r * (L.G + 1) + L.G], (r + 1) * nvs);
        EXPECT_EQ(t[r * (L.G + 1) + L.G], nullptr);
    }
}

TEST(ExpertOpsFlowTest, GroupTablePerRowSources) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 16);
    Planned p(bc, make_lognormal(RoutingSpec{4, 16, 4, 32, 3}, 1.5));
    const int R = bc.cfg.R, epn = bc.cfg.epn(), B = bc.cfg.num_slots();
    const int64_t W = plan_row_width(bc.cfg), mat = 64;
    const std::vector<int32_t> host_plan = p.packed();
    DeviceArray<int32_t> plan(host_plan.size());
    plan.upload(host_plan);
    const PlanRowLayout L = PlanRowLayout::make(bc.cfg);
    DeviceArray<char> mem(static_cast<size_t>(R) * (epn + B) * mat);
    std::vector<const void*> src(3 * static_cast<size_t>(R));  // homes | slots | peers (= homes)
    for (int r = 0; r < R; ++r) {
        src[r] = src[2 * R + r] = mem.get() + static_cast<int64_t>(r) * (epn + B) * mat;
        src[R + r] = mem.get() + (static_cast<int64_t>(r) * (epn + B) + epn) * mat;
    }
    DeviceArray<const void*> d_src(src.size());
    d_src.upload(src);
    const int groups = R * (L.G + 1);
    for (const bool with_peers : {true, false}) {
        DeviceArray<const void*> table(groups);
        GroupTableArgs a;
        a.plan = PlanRows{plan.get(), R, L};
        a.nvs = bc.cfg.recv_rows();
        a.num_home = epn;
        a.mat_bytes = mat;
        a.table = table.get();
        a.homes = d_src.get();
        a.row_slots = d_src.get() + R;
        a.peers = with_peers ? d_src.get() + 2 * R : nullptr;
        a.num_peers = with_peers ? R : 0;
        build_group_table(a, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<const void*> t = table.download();
        for (int r = 0; r < R; ++r) {
            const int32_t* row = host_plan.data() + r * W;
            for (int g = 0; g < L.G; ++g) {
                const int32_t e = row[L.group_expert + g];
                const auto s = static_cast<WeightSource>(row[L.group_source + g]);
                const char* want = nullptr;
                if ((s == WeightSource::kLocal || s == WeightSource::kPeer) && (e / epn == r || with_peers))
                    want = static_cast<const char*>(src[e / epn]) + (e % epn) * mat;
                else if (s == WeightSource::kSlot)
                    want = static_cast<const char*>(src[R + r]) + row[L.group_slot + g] * mat;
                EXPECT_EQ(t[r * (L.G + 1) + g], want) << "rank " << r << " group " << g << " peers " << with_peers;
            }
            EXPECT_EQ(t[r * (L.G + 1) + L.G], nullptr);
        }
    }
}

// The copies functions refuse bad arguments on the host, naming the value, before anything is launched (no device
// needed: these run in CI too).
TEST(ExpertCopiesArgs, RefusedNamingTheValue) {
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 8, 16);
    const PlanRowLayout layout = PlanRowLayout::make(bc.cfg);
    const int32_t fake = 0;  // never dereferenced: every call below throws first
    auto message = [](const auto& call) {
        try {
            call();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    char home[16], slots[16];
    EXPECT_NE(message([&] { ExpertCopies::of_tensors(PlanRows{&fake, 3, layout}, home, slots, 16); })
                  .find("3 plan rows for E = 16"),
              std::string::npos);
    ExpertCopies c = ExpertCopies::of_tensors(PlanRows{&fake, 4, layout}, home, slots, 16);
    EXPECT_EQ(c.epn, 4);
    EXPECT_EQ(c.home.rank_stride, 4 * 16);
    EXPECT_EQ(c.slots.rank_stride, layout.B * 16);
    ExpertCopies bad = c;
    bad.copies = nullptr;
    EXPECT_NE(message([&] { prefetch_copies(bad, false, nullptr); }).find("prefetch_copies: copies null"),
              std::string::npos);
    bad = c;
    bad.mat_bytes = 6;
    EXPECT_NE(message([&] { reduce_copies(bad, true, false, nullptr); }).find("6 bytes per matrix"),
              std::string::npos);
    bad = c;
    bad.home.base = nullptr;
    EXPECT_NE(message([&] { reduce_copies(bad, true, false, nullptr); }).find("home and slots need a base"),
              std::string::npos);
}

}  // namespace
}  // namespace evenep::cuda
