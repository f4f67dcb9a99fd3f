// The GPU path of `evenep demo` (demo_cuda.hpp). Without a CUDA build both functions exist: one says so, the other
// throws.
#include "demo_cuda.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "common.hpp"
#include "evenep/error.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/moe_layer.hpp"
#endif

namespace evenep::cli {

#if defined(EVENEP_HAVE_CUDA)
namespace {

// A device array of n T (zero-filled), freed on scope exit.
template <typename T>
class DeviceVector {
  public:
    explicit DeviceVector(size_t n) : n_(std::max<size_t>(n, 1)) {
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
        EVENEP_CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T)));
    }
    ~DeviceVector() { cudaFree(p_); }
    DeviceVector(DeviceVector&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
    DeviceVector(const DeviceVector&) = delete;
    DeviceVector& operator=(const DeviceVector&) = delete;
    T* get() const { return p_; }
    void upload(const T* src, size_t n) {
        if (n) EVENEP_CUDA_CHECK(cudaMemcpy(p_, src, n * sizeof(T), cudaMemcpyHostToDevice));
    }
    void download(T* dst, size_t n) const {
        if (n) EVENEP_CUDA_CHECK(cudaMemcpy(dst, p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    }

  private:
    T* p_ = nullptr;
    size_t n_;
};

// RAII stream.
struct Stream {
    cudaStream_t s = nullptr;
    Stream() { EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s); }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
};

}  // namespace

bool demo_cuda_available(std::string* why) {
    if (!cuda::device_available()) {
        if (why) *why = "no CUDA device is usable (cudaGetDeviceCount found none)";
        return false;
    }
    return true;
}

cpu::MoeResult run_moe_layer_cuda(const cpu::MoeProblem& p,
                                  const cpu::MoeRunOptions& opt,
                                  int warmup,
                                  CudaDemoInfo* info) {
    const BufferConfig& bc = p.cfg;
    const Config& c = bc.cfg;
    const int R = c.R, S = c.S, K = c.K, H = bc.H, F = bc.ffn_hidden, E = c.E, epn = c.epn();
    const size_t n = static_cast<size_t>(H) * F;
    EVENEP_CHECK(warmup >= 0, "--warmup = ", warmup, " must be >= 0");
    EVENEP_CHECK(opt.num_layers == 1, "demo (cuda): one layer per step");
    EVENEP_CHECK(!opt.backward || c.num_slots() == epn, "demo (cuda): training needs B = epn");
    EVENEP_CHECK(p.x.size() == static_cast<size_t>(R) && p.topk_idx.size() == static_cast<size_t>(R) &&
                     p.topk_w.size() == static_cast<size_t>(R) && p.grad_out.size() == static_cast<size_t>(R) &&
                     p.s.size() == static_cast<size_t>(R),
                 "demo (cuda): the problem must hold R = ", R, " ranks");
    EVENEP_CHECK(p.w_gate.size() == E * n && p.w_up.size() == E * n && p.w_down.size() == E * n,
                 "demo (cuda): expert weights must hold E*H*H' values each");

    cuda::EpOptions eo;
    eo.mode = opt.mode;
    eo.team.timeout_ms = static_cast<double>(opt.barrier_timeout.count());
    cuda::DeviceEp ep(c, H, eo);
    cuda::DeviceExperts experts(ep, cuda::ExpertsShape{3, static_cast<int64_t>(n), true, opt.backward});

    // Every rank's inputs and outputs, sized for S tokens.
    std::vector<DeviceVector<uint16_t>> x, out, grad_out, grad_x;
    std::vector<DeviceVector<int32_t>> idx;
    std::vector<DeviceVector<float>> w, grad_w;
    std::vector<cuda::RankIo> io;
    std::vector<cuda::BackwardIo> bio;
    const size_t SH = static_cast<size_t>(S) * H, SK = static_cast<size_t>(S) * K;
    for (int r = 0; r < R; ++r) {
        const size_t s = static_cast<size_t>(p.s[r]);
        x.emplace_back(SH);
        out.emplace_back(SH);
        idx.emplace_back(SK);
        w.emplace_back(SK);
        x[r].upload(reinterpret_cast<const uint16_t*>(p.x[r].data()), s * H);
        idx[r].upload(p.topk_idx[r].data(), s * K);
        w[r].upload(p.topk_w[r].data(), s * K);
        io.push_back(cuda::RankIo{x[r].get(), idx[r].get(), w[r].get(), out[r].get(), nullptr});
        if (opt.backward) {
            grad_out.emplace_back(SH);
            grad_x.emplace_back(SH);
            grad_w.emplace_back(SK);
            grad_out[r].upload(reinterpret_cast<const uint16_t*>(p.grad_out[r].data()), s * H);
            bio.push_back(cuda::BackwardIo{grad_out[r].get(), grad_x[r].get(), grad_w[r].get(), nullptr});
        }
    }
    const std::vector<Bf16>* src[3] = {&p.w_gate, &p.w_up, &p.w_down};
    for (int r = 0; r < R; ++r)
        for (int proj = 0; proj < 3; ++proj)
            for (int le = 0; le < epn; ++le)
                EVENEP_CUDA_CHECK(cudaMemcpy(experts.weight(r, proj, le),
                                             src[proj]->data() + static_cast<size_t>(r * epn + le) * n, n * 2,
                                             cudaMemcpyHostToDevice));

    cuda::MoeLayerOptions lo;
    lo.timing = true;
    cuda::DeviceMoeLayer layer(ep, experts, F, lo);
    layer.bind(io, bio);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());  // every upload done before the non-blocking stream starts
    Stream stream;
    int64_t s_total = 0;
    bool equal = true;
    for (int32_t v : p.s) s_total += v, equal = equal && v == p.s[0];
    if (equal) s_total = -1;
    auto step = [&] {
        layer.forward(p.s, s_total, stream.s);
        if (opt.backward) layer.backward(stream.s);
    };
    for (int i = 0; i < warmup; ++i) step();
    ep.check(stream.s);
    if (opt.backward && warmup > 0)
        for (int r = 0; r < R; ++r)
            for (int proj = 0; proj < 3; ++proj)
                for (int le = 0; le < epn; ++le)
                    EVENEP_CUDA_CHECK(cudaMemsetAsync(experts.grad(r, proj, le), 0, n * 4, stream.s));
    ep.check(stream.s);
    const double t0 = now_seconds();
    step();
    ep.check(stream.s);
    const double wall = now_seconds() - t0;
    const cuda::MoeLayerTimes t = layer.times();

    cpu::MoeResult res;
    res.out.resize(R);
    res.dst.resize(R);
    for (int r = 0; r < R; ++r) {
        const size_t s = static_cast<size_t>(p.s[r]);
        res.out[r].resize(s * H);
        out[r].download(reinterpret_cast<uint16_t*>(res.out[r].data()), s * H);
        res.dst[r] = ep.download_dst(r);
    }
    if (opt.backward) {
        res.grad_x.resize(R);
        res.grad_topk_w.resize(R);
        for (int r = 0; r < R; ++r) {
            const size_t s = static_cast<size_t>(p.s[r]);
            res.grad_x[r].resize(s * H);
            res.grad_topk_w[r].resize(s * K);
            grad_x[r].download(reinterpret_cast<uint16_t*>(res.grad_x[r].data()), s * H);
            grad_w[r].download(res.grad_topk_w[r].data(), s * K);
        }
        std::vector<float>* dst[3] = {&res.grad_w_gate, &res.grad_w_up, &res.grad_w_down};
        for (int proj = 0; proj < 3; ++proj) {
            dst[proj]->resize(E * n);
            for (int r = 0; r < R; ++r)
                for (int le = 0; le < epn; ++le)
                    EVENEP_CUDA_CHECK(cudaMemcpy(dst[proj]->data() + static_cast<size_t>(r * epn + le) * n,
                                                 experts.grad(r, proj, le), n * 4, cudaMemcpyDeviceToHost));
        }
    }
    res.plan = ep.download_plan(0);
    res.traffic = evenep_traffic(res.plan, res.dst, H, F, opt.backward);
    res.sizes = buffer_sizes(bc);
    res.times.plan = t.plan;
    res.times.dispatch = t.dispatch;
    res.times.prefetch = t.prefetch;
    res.times.expert_forward = t.expert_forward;
    res.times.combine = t.combine;
    res.times.combine_backward = t.combine_backward;
    res.times.expert_backward = t.expert_backward;
    res.times.dispatch_backward = t.dispatch_backward;
    res.times.reduce_grad = t.reduce_grad;
    if (info) {
        int dev = 0;
        cudaDeviceProp prop{};
        EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
        EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
        info->device = fmt::format("{} ({} SMs)", prop.name, prop.multiProcessorCount);
        info->warmup_steps = warmup;
        info->step_wall_seconds = wall;
        info->layer_bytes = layer.allocated_bytes();
    }
    return res;
}

#else  // !EVENEP_HAVE_CUDA

bool demo_cuda_available(std::string* why) {
    if (why) *why = "this evenep was built without the CUDA backend";
    return false;
}

cpu::MoeResult run_moe_layer_cuda(const cpu::MoeProblem&, const cpu::MoeRunOptions&, int, CudaDemoInfo*) {
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "demo --backend cuda: needs a CUDA build");
    cpu::MoeResult unreachable;
    return unreachable;
}

#endif  // EVENEP_HAVE_CUDA

}  // namespace evenep::cli
