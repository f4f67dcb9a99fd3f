// GPU backward tests: cuda::Ep::combine_backward / dispatch_backward bit-identical to the CPU backend's
// cpu::Buffer::combine_backward / dispatch_backward (SPEC §4.3).
//
// Cases:
//   BackwardTest.MatchesCpu/<config>_<routing>  plan + dispatch, then combine_backward(grad_out): receive rows
//       [0, rows_used), recv_w, recv_next, recv_ret equal to the CPU buffer's; then gradient rows and row-weight
//       gradients written (grad_recv_w as a separate device array, and in place in recv_w) and dispatch_backward in
//       both combine modes: grad_x, the gathered grad_topk_w and recv_w equal to the CPU's. Routings: lognormal,
//       round robin and every adversarial kind (masked entries, unequal s_r, all K on one remote rank, ...);
//       configs: R=4 E=32 K=4 tp=8, R=8 E=64 K=8 tp=1, R=2 E=8 K=6 (K > R) tp=128, R=1.
//   BackwardFlowTest.PlanReuseWithoutPlanning  after the dispatch the device topk_idx is overwritten with another
//       routing; two backward rounds with new gradients still follow the first plan (dst unchanged) and equal the
//       CPU's two rounds on one handle.
//   BackwardFlowTest.GraphCaptureReplay  combine_backward + dispatch_backward (with the grad_recv_w copy) captured
//       into one CUDA graph; replays equal the eager run.
//   BackwardFlowTest.RejectsBadBackwardInputs  an empty plan, null gradient pointers or a wrong number of ranks
//       throw evenep::Error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::bits_of;
using testing::DeviceArray;
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

// Random fp32 values in (-3, 3) with bf16 precision, a pure function of (seed, index).
std::vector<float> random_f32(size_t n, uint64_t seed) {
    const std::vector<Bf16> b = testing::random_bf16(n, seed);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = 3.0f * bf16_to_float(b[i]);
    return v;
}

// One backward round's inputs of every rank.
struct Grads {
    std::vector<std::vector<Bf16>> out;      // [R][s_r*H] gradient of the combine output
    std::vector<std::vector<Bf16>> recv_x;   // [R][NvS*H] gradient rows (what the expert backward writes)
    std::vector<std::vector<float>> recv_w;  // [R][NvS] gradient of each row's route weight
};

Grads random_grads(const BufferConfig& bc, const std::vector<cpu::RankTokens>& tokens, uint64_t seed) {
    const int64_t nvs = bc.cfg.recv_rows();
    Grads g;
    for (int r = 0; r < bc.cfg.R; ++r) {
        g.out.push_back(testing::random_bf16(static_cast<size_t>(tokens[r].s) * bc.H, seed * 977 + r));
        g.recv_x.push_back(testing::random_bf16(static_cast<size_t>(nvs * bc.H), seed * 977 + 100 + r));
        g.recv_w.push_back(random_f32(static_cast<size_t>(nvs), seed * 977 + 200 + r));
    }
    return g;
}

// What the CPU backend holds after each backward call of one round.
struct CpuRound {
    std::vector<std::vector<Bf16>> recv_x;         // after combine_backward, [R][NvS*H]
    std::vector<std::vector<float>> recv_w;        // after combine_backward
    std::vector<std::vector<int32_t>> recv_next;   // after combine_backward
    std::vector<std::vector<int32_t>> recv_ret;    // after combine_backward
    std::vector<std::vector<Bf16>> grad_x;         // dispatch_backward, [R][s_r*H]
    std::vector<std::vector<float>> grad_topk_w;   // dispatch_backward, [R][s_r*K]
    std::vector<std::vector<float>> recv_w_after;  // recv_w after dispatch_backward
};

struct CpuBackward {
    Plan plan;
    std::vector<std::vector<int32_t>> dst;
    std::vector<CpuRound> rounds;
};

// The CPU backend: one dispatch, then for each of `grads` combine_backward and dispatch_backward on its handle.
CpuBackward cpu_backward(const BufferConfig& bc,
                         const std::vector<cpu::RankTokens>& tokens,
                         const std::vector<Grads>& grads,
                         const cpu::OracleOptions& oo) {
    const int R = bc.cfg.R, K = bc.cfg.K;
    CpuBackward res;
    res.dst.resize(R);
    res.rounds.resize(grads.size());
    for (CpuRound& c : res.rounds) {
        c.recv_x.resize(R), c.recv_w.resize(R), c.recv_next.resize(R), c.recv_ret.resize(R);
        c.grad_x.resize(R), c.grad_topk_w.resize(R), c.recv_w_after.resize(R);
    }
    cpu::LocalTeamGroup group(R, oo.barrier_timeout);
    cpu::run_ranks_or_throw(group, [&](evenep::Team& team) {
        const int r = team.rank();
        cpu::Buffer buffer(team, bc, oo.mode);
        cpu::DispatchArgs a;
        a.s = tokens[r].s;
        a.x = tokens[r].x;
        a.topk_idx = tokens[r].topk_idx;
        a.topk_w = tokens[r].topk_w;
        a.s_total = oo.s_total;
        cpu::DispatchHandle h = buffer.dispatch(a);
        res.dst[r] = h.dst;
        if (r == 0) res.plan = h.plan;
        for (size_t i = 0; i < grads.size(); ++i) {
            CpuRound& c = res.rounds[i];
            buffer.combine_backward(h, grads[i].out[r]);
            c.recv_x[r].assign(buffer.recv_x().begin(), buffer.recv_x().end());
            c.recv_w[r].assign(buffer.recv_w().begin(), buffer.recv_w().end());
            c.recv_next[r].assign(buffer.recv_next().begin(), buffer.recv_next().end());
            c.recv_ret[r].assign(buffer.recv_ret().begin(), buffer.recv_ret().end());
            c.grad_x[r].assign(static_cast<size_t>(h.s) * bc.H, Bf16{0});
            c.grad_topk_w[r].assign(static_cast<size_t>(h.s) * K, 0.0f);
            buffer.dispatch_backward(h, grads[i].recv_x[r], grads[i].recv_w[r], c.grad_x[r], c.grad_topk_w[r]);
            c.recv_w_after[r].assign(buffer.recv_w().begin(), buffer.recv_w().end());
        }
    });
    return res;
}

// Device side of the backward: per-rank gradient arrays, passed to every backward call.
struct GpuBackward {
    DeviceEp ep;
    GroupIo io;
    std::vector<DeviceArray<uint16_t>> grad_out, grad_x;
    std::vector<DeviceArray<float>> grad_topk_w, grad_recv_w;
    std::vector<BackwardIo> bio;
    EpPlan plan;

    GpuBackward(const Config& cfg, int H, const EpOptions& opt) : ep(cfg, H, opt), io(cfg.R, cfg.S, cfg.K, H) {
        for (int r = 0; r < cfg.R; ++r) {
            grad_out.emplace_back(static_cast<size_t>(cfg.S) * H);
            grad_x.emplace_back(static_cast<size_t>(cfg.S) * H);
            grad_topk_w.emplace_back(static_cast<size_t>(cfg.S) * cfg.K);
            grad_recv_w.emplace_back(static_cast<size_t>(ep.layout().nvs));
        }
        bind(true);
    }
    // with_copy: grad_recv_w is the separate array (copied by dispatch_backward); else the caller writes recv_w.
    void bind(bool with_copy) {
        bio.clear();
        for (int r = 0; r < ep.config().R; ++r)
            bio.push_back(BackwardIo{grad_out[r].get(), grad_x[r].get(), grad_topk_w[r].get(),
                                     with_copy ? grad_recv_w[r].get() : nullptr, io.w[r].get()});
    }
    void upload_tokens(const std::vector<cpu::RankTokens>& tokens) {
        for (size_t r = 0; r < tokens.size(); ++r) {
            io.x[r].upload(bits_of(tokens[r].x));
            io.idx[r].upload(tokens[r].topk_idx);
            io.w[r].upload(tokens[r].topk_w);
        }
    }
    void upload_grad_out(const Grads& g) {
        for (int r = 0; r < ep.config().R; ++r) grad_out[r].upload(bits_of(g.out[r]));
    }
    // The expert backward's results: gradient rows into recv_x(r) in place; row-weight gradients into the separate
    // array (with_copy) or into recv_w(r).
    void upload_grad_recv(const Grads& g, bool with_copy) {
        for (int r = 0; r < ep.config().R; ++r) {
            const std::vector<uint16_t> b = bits_of(g.recv_x[r]);
            EVENEP_CUDA_CHECK(cudaMemcpy(ep.recv_x(r), b.data(), b.size() * 2, cudaMemcpyHostToDevice));
            if (with_copy)
                grad_recv_w[r].upload(g.recv_w[r]);
            else
                EVENEP_CUDA_CHECK(
                    cudaMemcpy(ep.recv_w(r), g.recv_w[r].data(), g.recv_w[r].size() * 4, cudaMemcpyHostToDevice));
        }
    }
    void poison_outputs() {
        for (int r = 0; r < ep.config().R; ++r) {
            EVENEP_CUDA_CHECK(cudaMemset(grad_x[r].get(), 0xff, grad_x[r].size() * 2));
            EVENEP_CUDA_CHECK(cudaMemset(grad_topk_w[r].get(), 0xff, grad_topk_w[r].size() * 4));
        }
    }
};

void expect_combine_backward_equal(const GpuBackward& g,
                                   const CpuBackward& cpu,
                                   const CpuRound& c,
                                   const std::string& what) {
    const Config& cfg = g.ep.config();
    const int H = g.ep.hidden();
    for (int r = 0; r < cfg.R; ++r) {
        ASSERT_EQ(g.ep.download_dst(g.plan, r), cpu.dst[r]) << what << ": dst of rank " << r;
        const int64_t rows = cpu.plan.rows_used(r);
        const std::vector<uint16_t> x = g.ep.download_recv_x(r, rows);
        for (int64_t i = 0; i < rows * H; ++i)
            ASSERT_EQ(x[i], c.recv_x[r][i].bits)
                << what << ": recv_x rank " << r << " row " << i / H << " col " << i % H;
        const std::vector<float> w = g.ep.download_recv_w(r, rows);
        const std::vector<int32_t> next = g.ep.download_recv_next(r, rows), ret = g.ep.download_recv_ret(r, rows);
        for (int64_t i = 0; i < rows; ++i) {
            ASSERT_EQ(w[i], c.recv_w[r][i]) << what << ": recv_w rank " << r << " row " << i;
            ASSERT_EQ(next[i], c.recv_next[r][i]) << what << ": recv_next rank " << r << " row " << i;
            ASSERT_EQ(ret[i], c.recv_ret[r][i]) << what << ": recv_ret rank " << r << " row " << i;
        }
    }
}

void expect_dispatch_backward_equal(const GpuBackward& g,
                                    const CpuBackward& cpu,
                                    const CpuRound& c,
                                    const std::vector<cpu::RankTokens>& tokens,
                                    const std::string& what) {
    const Config& cfg = g.ep.config();
    const int H = g.ep.hidden();
    for (int r = 0; r < cfg.R; ++r) {
        const int s = tokens[r].s;
        const std::vector<uint16_t> gx = g.grad_x[r].download(static_cast<size_t>(s) * H);
        for (size_t i = 0; i < gx.size(); ++i)
            ASSERT_EQ(gx[i], c.grad_x[r][i].bits)
                << what << ": grad_x rank " << r << " token " << i / H << " col " << i % H;
        const std::vector<float> gw = g.grad_topk_w[r].download(static_cast<size_t>(s) * cfg.K);
        for (size_t i = 0; i < gw.size(); ++i)
            ASSERT_EQ(float_as_bits(gw[i]), float_as_bits(c.grad_topk_w[r][i]))
                << what << ": grad_topk_w rank " << r << " entry " << i << " (" << gw[i] << " vs "
                << c.grad_topk_w[r][i] << ")";
        const int64_t rows = cpu.plan.rows_used(r);
        const std::vector<float> w = g.ep.download_recv_w(r, rows);
        for (int64_t i = 0; i < rows; ++i)
            ASSERT_EQ(w[i], c.recv_w_after[r][i]) << what << ": recv_w after, rank " << r << " row " << i;
    }
}

// One backward round on the device (combine_backward, then dispatch_backward in both modes and both grad_recv_w
// paths), each step compared with the CPU round.
void device_round(GpuBackward& g,
                  const CpuBackward& cpu,
                  const CpuRound& c,
                  const Grads& grads,
                  const std::vector<cpu::RankTokens>& tokens,
                  const std::string& what) {
    g.upload_grad_out(grads);
    g.ep.combine_backward(g.plan, g.bio, nullptr);
    g.ep.check(nullptr);
    expect_combine_backward_equal(g, cpu, c, what + " combine_backward");
    if (::testing::Test::HasFatalFailure()) return;
    for (CombineMode mode : {CombineMode::kPull, CombineMode::kPushPartials})
        for (bool with_copy : {true, false}) {
            g.bind(with_copy);
            g.upload_grad_recv(grads, with_copy);
            g.poison_outputs();
            g.ep.dispatch_backward(g.plan, g.bio, mode, nullptr);
            g.ep.check(nullptr);
            expect_dispatch_backward_equal(
                g, cpu, c, tokens,
                cat(what, " dispatch_backward ", mode == CombineMode::kPull ? "pull" : "push",
                    with_copy ? " grad_recv_w copied" : " grad_recv_w in place"));
            if (::testing::Test::HasFatalFailure()) return;
        }
}

struct BackwardParam {
    int R, E, K, S, tp, H;
    int routing;  // index into testing::test_routings
};

std::string param_name(const BackwardParam& p) {
    const auto routings = testing::test_routings(testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H).cfg, 3);
    return cat("R", p.R, "E", p.E, "K", p.K, "tp", p.tp, "_", routings[p.routing].name);
}

std::vector<BackwardParam> backward_params() {
    const BackwardParam shapes[] = {
        {4, 32, 4, 96, 8, 40, 0}, {8, 64, 8, 64, 1, 16, 0}, {2, 8, 6, 48, 128, 24, 0}, {1, 4, 2, 32, 4, 8, 0}};
    return testing::with_each_routing(shapes, 3);
}

class BackwardTest : public ::testing::TestWithParam<BackwardParam> {};

TEST_P(BackwardTest, MatchesCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BackwardParam p = GetParam();
    const BufferConfig bc = testing::buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H);
    const Routing routing = testing::test_routings(bc.cfg, 3)[p.routing].routing;
    const auto tokens = testing::random_tokens(bc, routing, 17);
    const std::vector<Grads> grads{random_grads(bc, tokens, 5)};
    cpu::OracleOptions oo;
    oo.s_total = s_total_of(routing);
    const CpuBackward cpu = cpu_backward(bc, tokens, grads, oo);
    GpuBackward g(bc.cfg, bc.H, EpOptions{});
    g.upload_tokens(tokens);
    g.plan = g.ep.plan(g.io.io, routing.s, nullptr, oo.s_total);
    g.ep.dispatch(g.plan, g.io.io, nullptr);
    device_round(g, cpu, cpu.rounds[0], grads[0], tokens, param_name(p));
}

INSTANTIATE_TEST_SUITE_P(Routings, BackwardTest, ::testing::ValuesIn(backward_params()), [](const auto& info) {
    return param_name(info.param);
});

TEST(BackwardFlowTest, PlanReuseWithoutPlanning) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 16, 4, 64, 8, 32);
    const Routing routing = make_lognormal(RoutingSpec{4, 16, 4, 64, 21}, 1.5);
    const auto tokens = testing::random_tokens(bc, routing, 1);
    const std::vector<Grads> grads{random_grads(bc, tokens, 8), random_grads(bc, tokens, 9)};
    const CpuBackward cpu = cpu_backward(bc, tokens, grads, cpu::OracleOptions{});
    GpuBackward g(bc.cfg, bc.H, EpOptions{});
    g.upload_tokens(tokens);
    g.plan = g.ep.plan(g.io.io, routing.s, nullptr);
    g.ep.dispatch(g.plan, g.io.io, nullptr);
    g.ep.combine(g.plan, g.io.io, true, CombineMode::kPushPartials, nullptr);
    // Another routing in the device topk_idx: a backward call that planned again would follow it.
    const Routing other = make_round_robin(RoutingSpec{4, 16, 4, 64, 22});
    for (int r = 0; r < bc.cfg.R; ++r) g.io.idx[r].upload(other.topk_idx[r]);
    for (size_t i = 0; i < grads.size(); ++i) {
        device_round(g, cpu, cpu.rounds[i], grads[i], tokens, cat("round ", i));
        if (HasFatalFailure()) return;
    }
}

TEST(BackwardFlowTest, GraphCaptureReplay) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(4, 32, 4, 128, 8, 64);
    const Routing routing = make_adversarial(RoutingSpec{4, 32, 4, 128, 31}, Adversarial::kMasked);
    const auto tokens = testing::random_tokens(bc, routing, 5);
    const std::vector<Grads> grads{random_grads(bc, tokens, 3)};
    cpu::OracleOptions oo;
    oo.s_total = s_total_of(routing);
    const CpuBackward cpu = cpu_backward(bc, tokens, grads, oo);
    GpuBackward g(bc.cfg, bc.H, EpOptions{});
    g.upload_tokens(tokens);
    cudaStream_t stream;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    g.plan = g.ep.plan(g.io.io, routing.s, stream, oo.s_total);
    g.ep.dispatch(g.plan, g.io.io, stream);
    g.ep.check(stream);
    g.upload_grad_out(grads[0]);
    // The graph: combine_backward, then (as the expert backward would) the gradient rows into recv_x, then
    // dispatch_backward with the grad_recv_w copy.
    std::vector<DeviceArray<uint16_t>> rows;
    for (int r = 0; r < bc.cfg.R; ++r) {
        rows.emplace_back(grads[0].recv_x[r].size());
        rows.back().upload(bits_of(grads[0].recv_x[r]));
        g.grad_recv_w[r].upload(grads[0].recv_w[r]);
    }
    auto step = [&] {
        g.ep.combine_backward(g.plan, g.bio, stream);
        for (int r = 0; r < bc.cfg.R; ++r)
            EVENEP_CUDA_CHECK(
                cudaMemcpyAsync(g.ep.recv_x(r), rows[r].get(), rows[r].size() * 2, cudaMemcpyDeviceToDevice, stream));
        g.ep.dispatch_backward(g.plan, g.bio, CombineMode::kPushPartials, stream);
    };
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EVENEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    EVENEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    EVENEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
        g.poison_outputs();
        EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        g.ep.check(stream);
        expect_dispatch_backward_equal(g, cpu, cpu.rounds[0], tokens, cat("graph replay ", rep));
        if (HasFatalFailure()) break;
    }
    EVENEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EVENEP_CUDA_CHECK(cudaGraphDestroy(graph));
    EVENEP_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(BackwardFlowTest, RejectsBadBackwardInputs) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(2, 8, 2, 16, 4, 16);
    const Routing routing = make_round_robin(RoutingSpec{2, 8, 2, 16, 1});
    const auto tokens = testing::random_tokens(bc, routing, 1);
    DeviceEp ep(bc.cfg, bc.H, EpOptions{});
    GroupIo io(bc.cfg.R, bc.cfg.S, bc.cfg.K, bc.H);
    const std::vector<BackwardIo> empty(bc.cfg.R);
    EXPECT_THROW(ep.combine_backward(EpPlan{}, empty, nullptr), Error);  // no plan
    for (int r = 0; r < bc.cfg.R; ++r) io.idx[r].upload(tokens[r].topk_idx);
    const EpPlan plan = ep.plan(io.io, routing.s, nullptr);
    ep.dispatch(plan, io.io, nullptr);
    EXPECT_THROW(ep.combine_backward(plan, empty, nullptr), Error);  // null gradient pointers
    EXPECT_THROW(ep.dispatch_backward(plan, empty, CombineMode::kPull, nullptr), Error);
    EXPECT_THROW(ep.combine_backward(plan, std::span<const BackwardIo>(empty).first(1), nullptr), Error);  // one rank
    ep.check(nullptr);
}

}  // namespace
}  // namespace evenep::cuda
