// cuda::run_moe_layer (include/evenep/cuda/moe_layer.hpp): one MoE layer step of a MoeProblem on the ranks a team
// serves, in the CPU runner's result type (evenep/moe.hpp). Used by `evenep demo --backend cuda` and the GPU layer
// tests on both teams.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/moe_layer.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

// Bf16 is its 16 bits (evenep/detail/bf16.hpp); the device arrays hold them as uint16_t.
const uint16_t* bf16_bits(const Bf16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* bf16_bits(Bf16* p) { return reinterpret_cast<uint16_t*>(p); }

struct Stream {
    cudaStream_t s = nullptr;
    Stream() { EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s); }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
};

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

MoeResult run_moe_layer(Team& team, const MoeProblem& p, const MoeRunOptions& opt, int warmup, MoeRunInfo* info) {
    const BufferConfig& bc = p.cfg;
    const Config& c = bc.cfg;
    const int R = c.R, S = c.S, K = c.K, H = bc.H, F = bc.ffn_hidden, E = c.E, epn = c.epn();
    const int first = team.rank_begin(), num_local = team.num_local_ranks();
    const size_t n = static_cast<size_t>(H) * F;
    EVENEP_CHECK(warmup >= 0, "moe run (cuda): warmup = ", warmup, " must be >= 0");
    EVENEP_CHECK(opt.num_layers == 1, "moe run (cuda): one layer per step (num_layers = ", opt.num_layers, ")");
    EVENEP_CHECK(!opt.backward || c.num_slots() == epn, "moe run (cuda): training needs B = epn");
    EVENEP_CHECK(team.size() == R, "moe run (cuda): the team has ", team.size(), " ranks, the problem R = ", R);
    EVENEP_CHECK(p.x.size() == static_cast<size_t>(R) && p.topk_idx.size() == static_cast<size_t>(R) &&
                     p.topk_w.size() == static_cast<size_t>(R) && p.grad_out.size() == static_cast<size_t>(R) &&
                     p.s.size() == static_cast<size_t>(R),
                 "moe run (cuda): the problem must hold R = ", R, " ranks");
    EVENEP_CHECK(p.w_gate.size() == E * n && p.w_up.size() == E * n && p.w_down.size() == E * n,
                 "moe run (cuda): expert weights must hold E*H*H' values each");
    team.set_timeout_ms(static_cast<double>(opt.barrier_timeout.count()));

    EpOptions eo;
    eo.mode = opt.mode;
    eo.precision = bc.precision;  // fp8: e4m3 dispatch, e4m3 weight copies, FP8 GEMMs (docs/fp8.md)
    Ep ep(team, c, H, eo);
    Experts experts(ep, ExpertsShape{3, static_cast<int64_t>(n), true, opt.backward, bc.precision.fp8,
                                     bc.precision.ue8m0, bc.precision.fp8 ? H : 0, bc.precision.fp8 ? F : 0});

    // The served ranks' inputs and outputs, sized for S tokens.
    std::vector<DeviceArray<uint16_t>> x, out, grad_out, grad_x;
    std::vector<DeviceArray<int32_t>> idx;
    std::vector<DeviceArray<float>> w, grad_w;
    std::vector<RankIo> io;
    std::vector<BackwardIo> bio;
    const size_t SH = static_cast<size_t>(S) * H, SK = static_cast<size_t>(S) * K;
    for (int i = 0; i < num_local; ++i) {
        const int r = first + i;
        const size_t s = static_cast<size_t>(p.s[r]);
        x.emplace_back(SH);
        out.emplace_back(SH);
        idx.emplace_back(SK);
        w.emplace_back(SK);
        x[i].upload(bf16_bits(p.x[r].data()), s * H);
        idx[i].upload(p.topk_idx[r].data(), s * K);
        w[i].upload(p.topk_w[r].data(), s * K);
        io.push_back(RankIo{x[i].get(), idx[i].get(), w[i].get(), out[i].get(), nullptr});
        if (opt.backward) {
            grad_out.emplace_back(SH);
            grad_x.emplace_back(SH);
            grad_w.emplace_back(SK);
            grad_out[i].upload(bf16_bits(p.grad_out[r].data()), s * H);
            bio.push_back(BackwardIo{grad_out[i].get(), grad_x[i].get(), grad_w[i].get(), nullptr, nullptr});
        }
    }
    const std::vector<Bf16>* src[3] = {&p.w_gate, &p.w_up, &p.w_down};
    for (int r = first; r < first + num_local; ++r)
        for (int proj = 0; proj < 3; ++proj)
            for (int le = 0; le < epn; ++le)
                EVENEP_CUDA_CHECK(cudaMemcpy(experts.weight(r, proj, le),
                                             src[proj]->data() + static_cast<size_t>(r * epn + le) * n, n * 2,
                                             cudaMemcpyHostToDevice));

    MoeLayerOptions lo;
    lo.timing = true;
    MoeLayer layer(ep, experts, F, lo);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());  // every upload done before the non-blocking stream starts
    Stream stream;
    int64_t s_total = 0;
    bool equal = true;
    for (int32_t v : p.s) s_total += v, equal = equal && v == p.s[0];
    if (equal) s_total = -1;
    MoeForward last;
    auto step = [&] {
        last = layer.forward(io, p.s, s_total, stream.s);
        if (opt.backward) layer.backward(last, bio, stream.s);
    };
    for (int i = 0; i < warmup; ++i) step();
    ep.check(stream.s);
    if (opt.backward && warmup > 0)
        for (int r = first; r < first + num_local; ++r)
            for (int proj = 0; proj < 3; ++proj)
                for (int le = 0; le < epn; ++le)
                    EVENEP_CUDA_CHECK(cudaMemsetAsync(experts.grad(r, proj, le), 0, n * 4, stream.s));
    ep.check(stream.s);
    const double t0 = now_seconds();
    step();
    ep.check(stream.s);
    const double wall = now_seconds() - t0;

    MoeResult res;
    res.out.resize(R);
    res.dst.resize(R);
    if (opt.backward) res.grad_x.resize(R), res.grad_topk_w.resize(R);
    for (int i = 0; i < num_local; ++i) {
        const int r = first + i;
        const size_t s = static_cast<size_t>(p.s[r]);
        res.out[r].resize(s * H);
        out[i].download(bf16_bits(res.out[r].data()), s * H);
        res.dst[r] = ep.download_dst(last.plan, r);
        if (opt.backward) {
            res.grad_x[r].resize(s * H);
            res.grad_topk_w[r].resize(s * K);
            grad_x[i].download(bf16_bits(res.grad_x[r].data()), s * H);
            grad_w[i].download(res.grad_topk_w[r].data(), s * K);
        }
    }
    if (opt.backward) {
        std::vector<float>* dst[3] = {&res.grad_w_gate, &res.grad_w_up, &res.grad_w_down};
        for (int proj = 0; proj < 3; ++proj) {
            dst[proj]->assign(E * n, 0.0f);
            for (int r = first; r < first + num_local; ++r)
                for (int le = 0; le < epn; ++le)
                    EVENEP_CUDA_CHECK(cudaMemcpy(dst[proj]->data() + static_cast<size_t>(r * epn + le) * n,
                                                 experts.grad(r, proj, le), n * 4, cudaMemcpyDeviceToHost));
        }
    }
    res.plan = ep.download_plan(last.plan, first);
    if (num_local == R) {
        res.traffic = evenep_traffic(res.plan, res.dst, H, F, opt.backward, bc.precision.bf16_partials);
        if (bc.precision.fp8) res.traffic = fp8_traffic(res.traffic, res.plan, res.dst, H, F);
    }
    res.sizes = buffer_sizes(bc);
    res.times = layer.times();
    if (info) {
        info->warmup_steps = warmup;
        info->step_wall_seconds = wall;
        info->layer_bytes = layer.allocated_bytes();
    }
    return res;
}

}  // namespace evenep::cuda
