// The benchmarks' timing loop (perf/cuda/timing.hpp).
#include "perf/cuda/timing.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/error.hpp"

namespace evenep::perf {

Stats stats_of(std::vector<double> us) {
    EVENEP_CHECK(!us.empty(), "timing: no timed iteration");
    std::sort(us.begin(), us.end());
    const size_t n = us.size();
    Stats s;
    s.min_us = us.front();
    s.max_us = us.back();
    s.median_us = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
    s.p50_us = us[n / 2];
    s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(n);
    return s;
}

Stats per_call(Stats s, double k) {
    s.min_us /= k, s.median_us /= k, s.mean_us /= k, s.max_us /= k, s.p50_us /= k;
    return s;
}

Stats time_op(const std::function<void()>& op, cudaStream_t stream, const TimingOptions& o) {
    EVENEP_CHECK(o.iters >= 1 && o.warmup >= 0, "timing: iters = ", o.iters, ", warmup = ", o.warmup);
    for (int i = 0; i < o.warmup; ++i) {
        if (o.before_each) o.before_each();
        op();
    }
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(o.iters), nullptr);
    auto destroy = [&ev] {
        for (cudaEvent_t& e : ev)
            if (e) cudaEventDestroy(e);
    };
    std::vector<double> us(static_cast<size_t>(o.iters));
    try {
        for (cudaEvent_t& e : ev) EVENEP_CUDA_CHECK(cudaEventCreate(&e));
        for (int i = 0; i < o.iters; ++i) {
            if (o.before_each) o.before_each();
            EVENEP_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
            op();
            EVENEP_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
            if (o.sync_each) EVENEP_CUDA_CHECK(cudaEventSynchronize(ev[2 * i + 1]));
        }
        if (o.finish)
            o.finish();
        else
            EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int i = 0; i < o.iters; ++i) {
            float ms = 0;
            EVENEP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
            us[i] = 1000.0 * ms;
        }
    } catch (...) {
        destroy();
        throw;
    }
    destroy();
    return stats_of(std::move(us));
}

Stats time_op(const std::function<void()>& op, cudaStream_t stream, int warmup, int iters) {
    TimingOptions o;
    o.warmup = warmup;
    o.iters = iters;
    return time_op(op, stream, o);
}

namespace {

// One event pair that times one call at a time, each waited for (time_interleaved, warm_gpu); destroyed with it.
class CallTimer {
  public:
    CallTimer() {
        for (cudaEvent_t& e : ev_) {
            const cudaError_t rc = cudaEventCreate(&e);
            if (rc != cudaSuccess) {
                destroy();
                EVENEP_CUDA_CHECK(rc);
            }
        }
    }
    ~CallTimer() { destroy(); }
    CallTimer(const CallTimer&) = delete;
    CallTimer& operator=(const CallTimer&) = delete;

    // µs of one call of `op` on `stream`, waited for.
    double us(const std::function<void()>& op, cudaStream_t stream) {
        EVENEP_CUDA_CHECK(cudaEventRecord(ev_[0], stream));
        op();
        EVENEP_CUDA_CHECK(cudaEventRecord(ev_[1], stream));
        EVENEP_CUDA_CHECK(cudaEventSynchronize(ev_[1]));
        float ms = 0;
        EVENEP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
        return 1000.0 * ms;
    }

  private:
    void destroy() {
        for (cudaEvent_t& e : ev_)
            if (e) cudaEventDestroy(e), e = nullptr;
    }
    cudaEvent_t ev_[2] = {nullptr, nullptr};
};

}  // namespace

std::vector<Stats> time_interleaved(const std::vector<std::function<void()>>& ops, cudaStream_t stream, int warmup,
                                    int iters) {
    EVENEP_CHECK(iters >= 1 && warmup >= 0 && !ops.empty(), "timing: iters = ", iters, ", warmup = ", warmup,
                 ", ops = ", ops.size());
    for (int i = 0; i < warmup; ++i)
        for (const auto& op : ops) op();
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    CallTimer timer;
    std::vector<std::vector<double>> us(ops.size());
    for (int i = 0; i < iters; ++i)
        for (size_t k = 0; k < ops.size(); ++k) us[k].push_back(timer.us(ops[k], stream));
    std::vector<Stats> out;
    for (auto& v : us) out.push_back(stats_of(std::move(v)));
    return out;
}

std::vector<double> warm_gpu(const std::function<void()>& op, cudaStream_t stream, double seconds) {
    EVENEP_CHECK(seconds >= 0 && seconds <= 600, "timing: warm-up of ", seconds, " s must be in [0, 600]");
    CallTimer timer;
    std::vector<double> us;
    double total = 0;
    do {
        us.push_back(timer.us(op, stream));
        total += us.back();
    } while (total < 1e6 * seconds);
    return us;
}

Stats time_graph(const std::function<void()>& op, cudaStream_t stream, int warmup, int iters) {
    EVENEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
        op();
    } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream, &broken);
        if (broken) cudaGraphDestroy(broken);
        throw;
    }
    cudaGraph_t graph = nullptr;
    EVENEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    EVENEP_CUDA_CHECK(err);
    Stats st;
    try {
        st = time_op([&] { EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, stream, warmup, iters);
    } catch (...) {
        cudaGraphExecDestroy(exec);
        throw;
    }
    EVENEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return st;
}

Stats time_team(cuda::NcclTeam& team, const std::function<void()>& op, cudaStream_t stream, int warmup, int iters) {
    TimingOptions o;
    o.warmup = warmup;
    o.iters = iters;
    o.before_each = [&] { team.device_barrier(stream); };
    o.finish = [&] { team.check(stream); };
    const Stats mine = time_op(op, stream, o);
    // Nanoseconds, truncated, through the team's host all-gather.
    const std::vector<int64_t> all = team.all_gather(
        std::vector<int64_t>{static_cast<int64_t>(mine.median_us * 1000), static_cast<int64_t>(mine.min_us * 1000),
                             static_cast<int64_t>(mine.max_us * 1000), static_cast<int64_t>(mine.mean_us * 1000)});
    Stats s;
    s.min_us = 1e300;
    for (size_t r = 0; r < all.size() / 4; ++r) {
        s.median_us = std::max(s.median_us, all[4 * r] / 1000.0);
        s.min_us = std::min(s.min_us, all[4 * r + 1] / 1000.0);
        s.max_us = std::max(s.max_us, all[4 * r + 2] / 1000.0);
        s.mean_us = std::max(s.mean_us, all[4 * r + 3] / 1000.0);
    }
    s.p50_us = s.median_us;
    return s;
}

double team_max(cuda::NcclTeam& team, double v) {
    const std::vector<int64_t> all = team.all_gather(std::vector<int64_t>{static_cast<int64_t>(v)});
    return static_cast<double>(*std::max_element(all.begin(), all.end()));
}

int64_t team_sum(cuda::NcclTeam& team, int64_t v) {
    const std::vector<int64_t> all = team.all_gather(std::vector<int64_t>{v});
    return std::accumulate(all.begin(), all.end(), int64_t{0});
}

}  // namespace evenep::perf
