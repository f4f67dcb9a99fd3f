// GPU data-path tests: dispatch and combine bit-identical to the CPU oracle (evenep/cpu/oracle.hpp).
//
// Cases:
//   DatapathTest.MatchesOracle/<config>_<routing>  plan, dst, receive rows [0, rows_used), recv_w, recv_next, recv_ret
//   of
//       every rank equal to the oracle's; then an expert placeholder (y = bf16(0.75 x) in place) and combine in both
//       modes (pull, push partials) with and without apply_weights: out and gathered weights equal to the oracle's.
//       Routings: lognormal, round robin and every adversarial kind (masked entries, unequal s_r, all K entries on
//       one remote rank, ...); configs: R=4 E=32 K=4 tp=8, R=8 E=64 K=8 tp=1, R=2 E=8 K=6 (K > R) tp=128, R=1.
//   DatapathFlowTest.Bf16PartialsMatchOracle  precision.bf16_partials (chains of >= 2 entries add a bf16-rounded
//       partial): both combine modes equal the oracle's bf16-partials combine, every routing, three shapes
//   DatapathTest.SmBudgetDoesNotChangeResults  budget 1 and 64 give the same bits
//   DatapathTest.PlanReuse             dispatch twice with one plan (new x): rows and outputs follow the new x
//   DatapathTest.GraphCaptureReplay    plan -> dispatch -> placeholder -> combine captured into one CUDA graph;
//       replays equal the eager run; after new routing and tokens are written into the same device inputs a replay
//       equals the oracle for the new routing (the plan is recomputed inside the graph)
//   DatapathFlowTest.CallerRows        dispatch into caller-owned receive rows (RankIo::rows): those rows equal the
//       oracle's, the buffer's recv_x is not written; combine reading the caller's rows equals the oracle
//   DatapathTest.MoonEpPointMatchesOracle  R=8 E=384 K=8 S=512 H=256 at maxvio 10
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
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

// The expert placeholder: y = bf16(0.75 * x), in place (one rounding: identical on host and device).
__global__ void scale_rows_kernel(uint16_t* y, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] = float_to_bf16(__fmul_rn(bf16_to_float(Bf16{y[i]}), 0.75f)).bits;
}

std::vector<Bf16> scale_rows_host(const std::vector<Bf16>& x) {
    std::vector<Bf16> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(bf16_to_float(x[i]) * 0.75f);
    return y;
}

struct GpuGroup {
    DeviceEp ep;
    GroupIo io;
    EpPlan plan;
    GpuGroup(const Config& cfg, int H, const EpOptions& opt) : ep(cfg, H, opt), io(cfg.R, cfg.S, cfg.K, H) {}
    void upload(const std::vector<cpu::RankTokens>& tokens) {
        for (size_t r = 0; r < tokens.size(); ++r) {
            io.x[r].upload(bits_of(tokens[r].x));
            io.idx[r].upload(tokens[r].topk_idx);
            io.w[r].upload(tokens[r].topk_w);
        }
    }
    void expert_placeholder(cudaStream_t stream) {
        for (int r = 0; r < ep.config().R; ++r)
            scale_rows_kernel<<<64, 256, 0, stream>>>(ep.recv_x(r), ep.layout().nvs * ep.hidden());
        EVENEP_CUDA_CHECK(cudaGetLastError());
    }
};

int64_t s_total_of(const Routing& routing) {
    int64_t total = 0;
    bool equal = true;
    for (int s : routing.s) total += s, equal = equal && s == routing.s[0];
    return equal ? -1 : total;
}

// Compares the GPU buffers after dispatch with the oracle's.
void expect_dispatch_equal(const Ep& ep,
                           const EpPlan& plan,
                           const cpu::GroupDispatchResult& od,
                           const std::string& what) {
    const Config& cfg = ep.config();
    const int H = ep.hidden();
    for (int r = 0; r < cfg.R; ++r) {
        ASSERT_EQ(testing::plan_diff(ep.download_plan(plan, r), od.plan), "") << what << ": rank " << r;
        ASSERT_EQ(ep.download_dst(plan, r), od.dst[r]) << what << ": dst of rank " << r;
        const int64_t rows = od.plan.rows_used(r);
        const std::vector<uint16_t> x = ep.download_recv_x(r, rows);
        for (int64_t i = 0; i < rows * H; ++i)
            ASSERT_EQ(x[i], od.recv_x[r][i].bits)
                << what << ": rank " << r << " row " << i / H << " col " << i % H << " (expected "
                << testing::describe_row(od.recv_x[r].data() + (i / H) * H) << ")";
        const std::vector<float> w = ep.download_recv_w(r, rows);
        const std::vector<int32_t> next = ep.download_recv_next(r, rows), ret = ep.download_recv_ret(r, rows);
        for (int64_t i = 0; i < rows; ++i) {
            ASSERT_EQ(w[i], od.recv_w[r][i]) << what << ": recv_w rank " << r << " row " << i;
            ASSERT_EQ(next[i], od.recv_next[r][i]) << what << ": recv_next rank " << r << " row " << i;
            ASSERT_EQ(ret[i], od.recv_ret[r][i]) << what << ": recv_ret rank " << r << " row " << i;
        }
    }
}

void expect_combine_equal(GpuGroup& g,
                          const std::vector<cpu::RankTokens>& tokens,
                          const BufferConfig& bc,
                          const std::vector<std::vector<Bf16>>& y,
                          const cpu::OracleOptions& oo,
                          const std::string& what) {
    testing::expect_combine_equal(g.ep, g.io, g.plan, tokens, bc, y, oo, what);
}

// Full check of one (config, routing): dispatch rows, then combine after the expert placeholder.
void check_case(
    const BufferConfig& bc, const Routing& routing, PlannerMode mode, int sm_budget, const std::string& what) {
    const Config& cfg = bc.cfg;
    const auto tokens = testing::random_tokens(bc, routing, 11);
    cpu::OracleOptions oo;
    oo.mode = mode;
    oo.s_total = s_total_of(routing);
    const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens, oo);
    EpOptions opt;
    opt.mode = mode;
    opt.sm_budget = sm_budget;
    opt.precision = bc.precision;
    GpuGroup g(cfg, bc.H, opt);
    g.upload(tokens);
    g.plan = g.ep.plan(g.io.io, routing.s, nullptr, oo.s_total);
    g.ep.dispatch(g.plan, g.io.io, nullptr);
    g.ep.check(nullptr);
    expect_dispatch_equal(g.ep, g.plan, od, what);
    if (::testing::Test::HasFatalFailure()) return;
    g.expert_placeholder(nullptr);
    std::vector<std::vector<Bf16>> y(cfg.R);
    for (int r = 0; r < cfg.R; ++r) y[r] = scale_rows_host(od.recv_x[r]);
    expect_combine_equal(g, tokens, bc, y, oo, what);
}

struct DatapathParam {
    int R, E, K, S, tp, H;
    int routing;  // index into testing::test_routings
};

std::string param_name(const DatapathParam& p) {
    const auto routings = testing::test_routings(testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H).cfg, 3);
    return cat("R", p.R, "E", p.E, "K", p.K, "tp", p.tp, "_", routings[p.routing].name);
}

std::vector<DatapathParam> datapath_params() {
    const DatapathParam shapes[] = {
        {4, 32, 4, 96, 8, 40, 0}, {8, 64, 8, 64, 1, 16, 0}, {2, 8, 6, 48, 128, 24, 0}, {1, 4, 2, 32, 4, 8, 0}};
    return testing::with_each_routing(shapes, 3);
}

class DatapathTest : public ::testing::TestWithParam<DatapathParam> {};

TEST_P(DatapathTest, MatchesOracle) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const DatapathParam p = GetParam();
    const BufferConfig bc = testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H);
    const auto routings = testing::test_routings(bc.cfg, 3);
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference}) {
        check_case(bc, routings[p.routing].routing, mode, 32, cat(param_name(p), " ", to_string(mode)));
        if (HasFatalFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(Routings, DatapathTest, ::testing::ValuesIn(datapath_params()), [](const auto& info) {
    return param_name(info.param);
});

TEST(DatapathFlowTest, Bf16PartialsMatchOracle) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const DatapathParam shapes[] = {{4, 32, 4, 96, 8, 40, 0}, {8, 64, 8, 64, 1, 16, 0}, {2, 8, 6, 48, 128, 24, 0}};
    for (const DatapathParam& p : shapes) {
        BufferConfig bc = testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H);
        bc.precision.bf16_partials = true;
        for (const auto& r : testing::test_routings(bc.cfg, 3)) {
            check_case(bc, r.routing, PlannerMode::kOptimized, 32, cat(param_name(p), " bf16 partials ", r.name));
            if (HasFatalFailure()) return;
        }
    }
}

TEST(DatapathFlowTest, SmBudgetDoesNotChangeResults) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 200, 4, 64);
    const Routing routing = make_lognormal(RoutingSpec{4, 16, 4, 200, 9}, 1.5);
    for (int budget : {1, 64}) {
        check_case(bc, routing, PlannerMode::kOptimized, budget, cat("budget ", budget));
        if (HasFatalFailure()) return;
    }
}

TEST(DatapathFlowTest, PlanReuse) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 64, 8, 32);
    const Config& cfg = bc.cfg;
    const Routing routing = make_lognormal(RoutingSpec{4, 16, 4, 64, 21}, 1.0);
    auto tokens = testing::random_tokens(bc, routing, 1);
    GpuGroup g(cfg, bc.H, EpOptions{});
    g.upload(tokens);
    g.plan = g.ep.plan(g.io.io, routing.s, nullptr);
    g.ep.dispatch(g.plan, g.io.io, nullptr);
    // New token rows, same routing and weights: dispatch again without planning.
    for (int r = 0; r < cfg.R; ++r) tokens[r].x = testing::random_bf16(tokens[r].x.size(), 1000 + r);
    g.upload(tokens);
    g.ep.dispatch(g.plan, g.io.io, nullptr);
    g.ep.check(nullptr);
    const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens);
    expect_dispatch_equal(g.ep, g.plan, od, "plan reuse");
    if (HasFatalFailure()) return;
    g.expert_placeholder(nullptr);
    std::vector<std::vector<Bf16>> y(cfg.R);
    for (int r = 0; r < cfg.R; ++r) y[r] = scale_rows_host(od.recv_x[r]);
    expect_combine_equal(g, tokens, bc, y, cpu::OracleOptions{}, "plan reuse");
}

TEST(DatapathFlowTest, CallerRows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 96, 8, 40);
    const Config& cfg = bc.cfg;
    const Routing routing = make_lognormal(RoutingSpec{4, 16, 4, 96, 5}, 1.5);
    const auto tokens = testing::random_tokens(bc, routing, 3);
    const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens);
    GpuGroup g(cfg, bc.H, EpOptions{});
    g.upload(tokens);
    const int64_t nvs = g.ep.layout().nvs, H = bc.H;
    std::vector<testing::DeviceArray<uint16_t>> rows;
    for (int r = 0; r < cfg.R; ++r) {
        rows.emplace_back(static_cast<size_t>(nvs * H));
        EVENEP_CUDA_CHECK(cudaMemset(rows[r].get(), 0xff, rows[r].size() * 2));
        EVENEP_CUDA_CHECK(cudaMemset(g.ep.recv_x(r), 0x5a, rows[r].size() * 2));  // must stay untouched
        g.io.io[r].rows = rows[r].get();
    }
    g.plan = g.ep.plan(g.io.io, routing.s, nullptr);
    g.ep.dispatch(g.plan, g.io.io, nullptr);
    g.ep.check(nullptr);
    for (int r = 0; r < cfg.R; ++r) {
        const int64_t used = od.plan.rows_used(r);
        const std::vector<uint16_t> got = rows[r].download(static_cast<size_t>(used * H));
        for (int64_t i = 0; i < used * H; ++i)
            ASSERT_EQ(got[i], od.recv_x[r][i].bits) << "caller rows: rank " << r << " row " << i / H;
        for (uint16_t v : g.ep.download_recv_x(r, nvs)) ASSERT_EQ(v, 0x5a5a) << "the buffer's recv_x was written";
        scale_rows_kernel<<<64, 256>>>(rows[r].get(), used * H);
    }
    EVENEP_CUDA_CHECK(cudaGetLastError());
    std::vector<std::vector<Bf16>> y(cfg.R);
    for (int r = 0; r < cfg.R; ++r) y[r] = scale_rows_host(od.recv_x[r]);
    expect_combine_equal(g, tokens, bc, y, cpu::OracleOptions{}, "caller rows");
}

TEST(DatapathFlowTest, GraphCaptureReplay) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 32, 4, 128, 8, 64);
    const Config& cfg = bc.cfg;
    const Routing routing = make_lognormal(RoutingSpec{4, 32, 4, 128, 31}, 2.0);
    const auto tokens = testing::random_tokens(bc, routing, 5);
    GpuGroup g(cfg, bc.H, EpOptions{});
    g.upload(tokens);
    cudaStream_t stream;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto step = [&] {
        g.plan = g.ep.plan(g.io.io, routing.s, stream);
        g.ep.dispatch(g.plan, g.io.io, stream);
        g.expert_placeholder(stream);
        g.ep.combine(g.plan, g.io.io, true, CombineMode::kPushPartials, stream);
    };
    step();
    g.ep.check(stream);
    std::vector<std::vector<uint16_t>> eager(cfg.R);
    for (int r = 0; r < cfg.R; ++r) eager[r] = g.io.out[r].download();

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EVENEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    EVENEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    EVENEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
        for (int r = 0; r < cfg.R; ++r) EVENEP_CUDA_CHECK(cudaMemset(g.io.out[r].get(), 0, g.io.out[r].size() * 2));
        EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        g.ep.check(stream);
        for (int r = 0; r < cfg.R; ++r)
            ASSERT_EQ(g.io.out[r].download(), eager[r]) << "replay " << rep << " rank " << r;
    }
    // New routing and tokens in the same device buffers (same s): the replay plans again on the device.
    const Routing routing2 = make_lognormal(RoutingSpec{4, 32, 4, 128, 32}, 0.5);
    const auto tokens2 = testing::random_tokens(bc, routing2, 6);
    g.upload(tokens2);
    EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    g.ep.check(stream);
    const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens2);
    std::vector<std::vector<Bf16>> y(cfg.R);
    for (int r = 0; r < cfg.R; ++r) y[r] = scale_rows_host(od.recv_x[r]);
    const cpu::GroupCombineResult oc = cpu::combine_group(bc, tokens2, y, true);
    for (int r = 0; r < cfg.R; ++r) {
        ASSERT_EQ(testing::plan_diff(g.ep.download_plan(g.plan, r), od.plan), "")
            << "graph replay, new routing, rank " << r;
        ASSERT_EQ(g.io.out[r].download(), bits_of(oc.out[r])) << "graph replay, new routing, rank " << r;
    }
    EVENEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EVENEP_CUDA_CHECK(cudaGraphDestroy(graph));
    EVENEP_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(DatapathFlowTest, MoonEpPointMatchesOracle) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(8, 384, 8, 512, 128, 256);
    const Routing routing = make_target_maxvio(RoutingSpec{8, 384, 8, 512, 2}, 10.0);
    check_case(bc, routing, PlannerMode::kOptimized, 32, "moonep point maxvio 10");
}

}  // namespace
}  // namespace evenep::cuda
