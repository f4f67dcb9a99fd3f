// GPU benchmarks (include/evenep/cuda/bench.hpp; method and byte formulas in docs/benchmarks.md).
#include "evenep/cuda/bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep::cuda {
namespace {

struct Stats {
    double min_us = 0, median_us = 0, mean_us = 0, max_us = 0;
};

// Times `op` (one or more launches on `stream`) with an event pair per iteration.
Stats time_op(const std::function<void()>& op, cudaStream_t stream, int warmup, int iters) {
    for (int i = 0; i < warmup; ++i) op();
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(iters));
    for (cudaEvent_t& e : ev) EVENEP_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < iters; ++i) {
        EVENEP_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
        op();
        EVENEP_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
    }
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> us(iters);
    for (int i = 0; i < iters; ++i) {
        float ms = 0;
        EVENEP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        us[i] = 1000.0 * ms;
    }
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
    std::sort(us.begin(), us.end());
    Stats s;
    s.min_us = us.front();
    s.max_us = us.back();
    s.median_us = iters % 2 ? us[iters / 2] : 0.5 * (us[iters / 2 - 1] + us[iters / 2]);
    s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / iters;
    return s;
}

// Captures `op` (launches on `stream`, no synchronisation) into a CUDA graph once and times its replays like
// time_op: one event pair around each cudaGraphLaunch.
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

BenchRow make_row(const std::string& op,
                  const std::string& shape,
                  double maxvio,
                  const Stats& st,
                  double bytes,
                  double copy_gbps,
                  int iters) {
    BenchRow r;
    r.op = op;
    r.shape = shape;
    r.maxvio = maxvio;
    r.min_us = st.min_us;
    r.median_us = st.median_us;
    r.mean_us = st.mean_us;
    r.max_us = st.max_us;
    r.bytes = bytes;
    r.gbps = bytes > 0 && st.median_us > 0 ? bytes / (st.median_us * 1e-6) / 1e9 : 0;
    r.frac_copy = copy_gbps > 0 ? r.gbps / copy_gbps : 0;
    r.iters = iters;
    return r;
}

template <typename T>
class DeviceBuf {
  public:
    explicit DeviceBuf(size_t n) : n_(n) {
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), sizeof(T) * (n ? n : 1)));
    }
    ~DeviceBuf() { cudaFree(p_); }
    DeviceBuf(const DeviceBuf&) = delete;
    DeviceBuf& operator=(const DeviceBuf&) = delete;
    T* get() const { return p_; }
    size_t size() const { return n_; }

  private:
    T* p_ = nullptr;
    size_t n_;
};

template <typename T>
std::vector<T> download(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n) EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Byte counts of the data-path kernels, from the plan and every rank's encoded destinations (docs/benchmarks.md).
struct DataBytes {
    double dispatch = 0, combine_pull = 0, combine_push = 0;
    int64_t entries = 0, heads = 0, multi_heads = 0, multi_entries = 0, padding_rows = 0, tokens = 0;
};

DataBytes count_bytes(const Plan& plan, const std::vector<std::vector<int32_t>>& dst, int H) {
    const int R = plan.R(), K = plan.cfg.K, G = plan.G();
    const int64_t nvs = plan.cfg.recv_rows();
    const double row = 2.0 * H;
    DataBytes b;
    for (int r = 0; r < R; ++r) {
        for (int g = 0; g < G; ++g)
            b.padding_rows +=
                plan.group_end(r, g) - plan.group_begin(r, g) - plan.group_count[static_cast<size_t>(r) * G + g];
        const int s = plan.s[r];
        for (int t = 0; t < s; ++t) {
            const int32_t* c = dst[r].data() + static_cast<size_t>(t) * K;
            int live = 0, heads = 0;
            for (int k = 0; k < K; ++k) {
                if (detail::is_masked(c[k])) continue;
                ++live;
                if (!detail::is_payload(c[k])) continue;
                ++heads;
                int chain = 0;
                const int64_t d = detail::decode_dst(c[k]) / nvs;
                for (int j = 0; j < K; ++j)
                    if (!detail::is_masked(c[j]) && detail::decode_dst(c[j]) / nvs == d) ++chain;
                if (chain >= 2) ++b.multi_heads, b.multi_entries += chain;
            }
            b.tokens += 1;
            b.entries += live;
            b.heads += heads;
            // dispatch: K codes, live weights, 12 B metadata per live entry, x row once (if any head), one row
            // write per head.
            b.dispatch += 4.0 * K + 16.0 * live + (heads ? row : 0) + row * heads;
            // combine pull: K codes + K weights, one y row per live entry, gathered weights are not requested,
            // one out row.
            b.combine_pull += 8.0 * K + row * live + row;
            // combine push, source side: K codes + K weights, partial units, one out row.
            b.combine_push += 8.0 * K + row;
        }
    }
    const int64_t dups = b.entries - b.heads;
    // dispatch, destination side: padding rows (row + weight + next + ret), entry-row metadata scan (ret + next),
    // duplicate fill (one read per multi-entry head, one write per duplicate).
    b.dispatch += b.padding_rows * (row + 12.0) + 8.0 * b.entries + row * b.multi_heads + row * dups;
    // combine push: destination reads every entry row once and its metadata; writes one unit per single head and
    // two per multi head; the source reads the same units back.
    const int64_t single_heads = b.heads - b.multi_heads;
    const double staged = row * single_heads + 2.0 * row * b.multi_heads;
    b.combine_push += row * b.entries + 12.0 * b.entries + 2.0 * staged;
    return b;
}

std::string shape_of(const BenchConfig& c) {
    std::ostringstream os;
    os << "R" << c.R << " E" << c.E << " K" << c.K << " S" << c.S << " H" << c.H;
    return os.str();
}

// Host reference of one token's combine (evenep/cpu/buffer.hpp contract) from downloaded rows.
std::vector<uint16_t> reference_token(const Ep& ep, const int32_t* codes, const float* w, bool apply) {
    const int K = ep.config().K, H = ep.hidden();
    const int64_t nvs = ep.layout().nvs;
    std::vector<float> acc(H, 0.0f);
    auto row_of = [&](int32_t code) {
        const int32_t flat = detail::decode_dst(code);
        return download(ep.recv_x(static_cast<int>(flat / nvs)) + (flat % nvs) * H, static_cast<size_t>(H));
    };
    for (int k = 0; k < K; ++k) {
        if (!detail::is_payload(codes[k])) continue;
        const int64_t d = codes[k] / nvs;
        std::vector<int> chain;
        for (int j = 0; j < K; ++j)
            if (!detail::is_masked(codes[j]) && detail::decode_dst(codes[j]) / nvs == d) chain.push_back(j);
        if (chain.size() == 1) {
            const std::vector<uint16_t> y = row_of(codes[k]);
            for (int i = 0; i < H; ++i) {
                const float v = bf16_to_float(Bf16{y[i]});
                acc[i] += apply ? w[k] * v : v;
            }
        } else {
            std::vector<float> p(H, 0.0f);
            for (int j : chain) {
                const std::vector<uint16_t> y = row_of(codes[j]);
                for (int i = 0; i < H; ++i) {
                    const float v = bf16_to_float(Bf16{y[i]});
                    p[i] += apply ? w[j] * v : v;
                }
            }
            for (int i = 0; i < H; ++i) acc[i] += p[i];
        }
    }
    std::vector<uint16_t> out(H);
    for (int i = 0; i < H; ++i) out[i] = float_to_bf16(acc[i]).bits;
    return out;
}

constexpr int kCheckStride = 97;  // --check samples every 97th token of every rank

}  // namespace

std::string device_summary() {
    int dev = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p{};
    EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    int clock_khz = 0, mem_clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
    cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    std::ostringstream os;
    os << p.name << ", sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
       << p.totalGlobalMem / (1 << 20) << " MiB, L2 " << p.l2CacheSize / (1 << 20) << " MiB, SM clock "
       << clock_khz / 1000 << " MHz, memory " << mem_clock_khz / 1000 << " MHz x " << bus_bits << " bit";
    return os.str();
}

std::vector<BenchRow> bench_copy(size_t bytes, int warmup, int iters) {
    bytes = bytes / 16 * 16;
    DeviceBuf<char> a(bytes), b(bytes);
    EVENEP_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
    EVENEP_CUDA_CHECK(cudaMemset(b.get(), 2, bytes));
    cudaStream_t stream;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int dev = 0, sms = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    std::ostringstream shape;
    shape << bytes / (1 << 20) << " MiB";
    std::vector<BenchRow> rows;
    const Stats m =
        time_op([&] { EVENEP_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream)); },
                stream, warmup, iters);
    rows.push_back(make_row("copy_memcpy", shape.str(), 0, m, 2.0 * bytes, 0, iters));
    const Stats k =
        time_op([&] { launch_copy_vec16(b.get(), a.get(), bytes, 4 * sms, stream); }, stream, warmup, iters);
    rows.push_back(make_row("copy_kernel", shape.str(), 0, k, 2.0 * bytes, 0, iters));
    rows.back().note = "16-byte vectors, 4 loads in flight per thread, 4 blocks of 512 per SM";
    EVENEP_CUDA_CHECK(cudaStreamDestroy(stream));
    const double best = copy_anchor_gbps(rows);
    for (BenchRow& r : rows) r.frac_copy = r.gbps / best;
    return rows;
}

double copy_anchor_gbps(const std::vector<BenchRow>& anchors) {
    double best = 0;
    for (const BenchRow& r : anchors)
        if (r.op.rfind("copy_", 0) == 0) best = std::max(best, r.gbps);
    return best;
}

std::vector<BenchRow> bench_point(const BenchConfig& bc, const std::vector<std::string>& ops, double copy_gbps) {
    auto want = [&](const char* op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
    Config cfg;
    cfg.R = bc.R;
    cfg.E = bc.E;
    cfg.K = bc.K;
    cfg.S = bc.S;
    cfg.tp = bc.tp;
    cfg.validate();
    // sigma is bisected on a smaller token count (same popularity vector), then the full routing is drawn once: the
    // achieved maxvio is reported per row.
    RoutingSpec spec{bc.R, bc.E, bc.K, bc.S, bc.seed};
    RoutingSpec probe = spec;
    probe.S = std::min(bc.S, 2048);
    double sigma = 0;
    make_target_maxvio(probe, bc.maxvio, &sigma);
    const Routing routing = make_lognormal(spec, sigma);
    const double maxvio = routing.maxvio();
    const auto weights = make_route_weights(routing, bc.seed);
    if (!bc.routing_npy.empty()) {
        Routing one = routing;
        one.R = 1;
        one.s.resize(1);
        one.topk_idx.resize(1);
        write_routing_npy(bc.routing_npy, one);
    }
    const std::string shape = shape_of(bc);
    const int R = bc.R, K = bc.K, H = bc.H, S = bc.S;

    EpOptions opt;
    opt.mode = bc.mode;
    opt.sm_budget = bc.sm_budget;
    DeviceEp ep(cfg, H, opt);
    std::vector<std::unique_ptr<DeviceBuf<uint16_t>>> x, out;
    std::vector<std::unique_ptr<DeviceBuf<int32_t>>> idx;
    std::vector<std::unique_ptr<DeviceBuf<float>>> w;
    std::vector<RankIo> io(R);
    for (int r = 0; r < R; ++r) {
        x.push_back(std::make_unique<DeviceBuf<uint16_t>>(static_cast<size_t>(S) * H));
        out.push_back(std::make_unique<DeviceBuf<uint16_t>>(static_cast<size_t>(S) * H));
        idx.push_back(std::make_unique<DeviceBuf<int32_t>>(static_cast<size_t>(S) * K));
        w.push_back(std::make_unique<DeviceBuf<float>>(static_cast<size_t>(S) * K));
        launch_fill_random_bf16(x[r]->get(), x[r]->size(), bc.seed * 1000 + r, nullptr);
        EVENEP_CUDA_CHECK(cudaMemcpy(idx[r]->get(), routing.topk_idx[r].data(), routing.topk_idx[r].size() * 4,
                                     cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(w[r]->get(), weights[r].data(), weights[r].size() * 4, cudaMemcpyHostToDevice));
        io[r] = RankIo{x[r]->get(), idx[r]->get(), w[r]->get(), out[r]->get(), nullptr};
    }
    cudaStream_t stream;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    EpPlan ep_plan = ep.plan(io, routing.s, stream);
    ep.check(stream);

    const Plan plan = make_plan(cfg, bc.mode, routing.tpe(), routing.s);
    std::vector<std::vector<int32_t>> dst(R);
    for (int r = 0; r < R; ++r) {
        dst[r].resize(static_cast<size_t>(routing.s[r]) * K);
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
    const DataBytes bytes = count_bytes(plan, dst, H);
    std::vector<BenchRow> rows;
    auto add = [&](const std::string& op, const Stats& st, double b, int blocks, int64_t wrong,
                   const std::string& note) {
        rows.push_back(make_row(op, shape, maxvio, st, b, copy_gbps, bc.iters));
        rows.back().blocks_per_rank = blocks;
        rows.back().wrong = wrong;
        rows.back().note = note;
    };
    // --graph: the same op as graph replays, right after its stream timing (before any check, so that a check
    // verifies what the replays left); its row follows the op's own row.
    auto graph_stats = [&](const std::function<void()>& op) -> std::optional<Stats> {
        if (!bc.graph) return std::nullopt;
        return time_graph(op, stream, bc.warmup, bc.iters);
    };
    auto add_graph = [&](const std::string& op, const std::optional<Stats>& st, double b, int blocks, int64_t wrong,
                         const std::string& note) {
        if (!st) return;
        add(op + "_graph", *st, b, blocks, wrong, note + "; CUDA graph replays");
    };

    if (want("plan")) {
        // The planner occupies one SM for tens of microseconds: right after the host-side routing generation the
        // GPU is idle and its clocks are low. A few milliseconds of copies first bring the clocks up, as they are
        // in a training step (the planner runs between the router and the dispatch).
        {
            const size_t warm_bytes = size_t{256} << 20;
            DeviceBuf<char> a(warm_bytes), b(warm_bytes);
            for (int i = 0; i < 40; ++i) launch_copy_vec16(b.get(), a.get(), warm_bytes, 4 * 132, stream);
        }
        int64_t wrong = -1;
        if (bc.check) {
            wrong = 0;
            for (int r = 0; r < R; ++r) {
                const Plan gp = ep.download_plan(ep_plan, r);
                wrong += gp.alloc != plan.alloc || gp.cu_seqlens != plan.cu_seqlens || gp.copies != plan.copies ||
                         gp.seg_row != plan.seg_row || gp.group_expert != plan.group_expert ||
                         gp.cost.crossing_rows != plan.cost.crossing_rows;
                const std::vector<int32_t> gd = ep.download_dst(ep_plan, r);
                for (size_t i = 0; i < gd.size(); ++i) wrong += gd[i] != dst[r][i];
            }
        }
        const Stats fused = time_op([&] { ep.plan(io, routing.s, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> fused_graph = graph_stats([&] { ep.plan(io, routing.s, stream); });
        const std::vector<int64_t> tf =
            download(reinterpret_cast<const int64_t*>(ep.base(0) + ep.layout().plan.timing), 24);
        std::ostringstream fused_note;
        fused_note << "histogram + all-gather + plan + dst, all ranks, one launch; rank 0 block 0 us: histogram "
                   << (tf[17] - tf[16]) / 1e3 << ", gather " << (tf[18] - tf[17]) / 1e3 << ", plan "
                   << (tf[19] - tf[18]) / 1e3 << ", dst " << (tf[20] - tf[19]) / 1e3 << " (route staging "
                   << (tf[21] - tf[19]) / 1e3 << ", walk " << (tf[22] - tf[21]) / 1e3 << ", dedup "
                   << (tf[20] - tf[22]) / 1e3 << ")";
        add("plan_fused", fused, 0, ep.last_blocks_per_rank(), wrong, fused_note.str());
        add_graph("plan_fused", fused_graph, 0, ep.last_blocks_per_rank(), -1, "histogram + all-gather + plan + dst");
        // One rank's planner alone: gathered histogram -> its plan (rank 0's copy).
        const std::vector<int32_t> tpe = routing.tpe();
        EVENEP_CUDA_CHECK(cudaMemcpy(ep.base(0) + ep.layout().tpe, tpe.data(), tpe.size() * 4, cudaMemcpyHostToDevice));
        const bool locality = bc.mode == PlannerMode::kOptimized;
        // kBatch back-to-back launches per timed iteration (divided by kBatch): launch latency stays out.
        constexpr int kBatch = 10;
        Stats one = time_op(
            [&] {
                for (int i = 0; i < kBatch; ++i)
                    launch_plan_only(ep.view(0), ep.layout(), routing.s, locality, PlannerKernel::kParallel, 0, 1,
                                     stream);
            },
            stream, bc.warmup, bc.iters);
        one.min_us /= kBatch, one.median_us /= kBatch, one.mean_us /= kBatch, one.max_us /= kBatch;
        const std::vector<int64_t> ts =
            download(reinterpret_cast<const int64_t*>(ep.base(0) + ep.layout().plan.timing), 24);
        auto us = [&](int a, int b) { return (ts[b] - ts[a]) / 1e3; };
        std::ostringstream phases;
        phases << "one rank: gathered tpe -> plan, one block of 512 threads (mean of " << kBatch
               << " back-to-back launches); phases us: loads " << us(0, 1) << ", init " << us(1, 2)
               << ", transfers+fills " << us(2, 3) << ", split " << us(3, 4) << ", costs " << us(4, 5) << ", prefixes "
               << us(5, 6) << ", layout " << us(6, 7) << ", copies+costs " << us(7, 8) << "; fill iterations " << ts[9]
               << "/" << ts[10] << ", split pieces (max donor) " << ts[11] << "; SM clock during the plan "
               << static_cast<double>(ts[13] - ts[12]) / static_cast<double>(ts[8] - ts[0]) << " GHz";
        int64_t wrong_one = -1;
        if (bc.check) {
            const EpPlan one_rank = ep.plan_from_tpe(routing.tpe(), routing.s, stream, 0, 1);
            const Plan gp = ep.download_plan(one_rank, 0);
            wrong_one = (gp.alloc != plan.alloc) + (gp.cu_seqlens != plan.cu_seqlens) + (gp.copies != plan.copies) +
                        (gp.rest_prefix != plan.rest_prefix) + (gp.cap_prefix != plan.cap_prefix);
        }
        add("plan_rank", one, 0, 1, wrong_one, phases.str());
        {
            // The same plan twice in one launch: the second pass's stamps (warm instruction and data caches).
            launch_plan_only(ep.view(0), ep.layout(), routing.s, locality, PlannerKernel::kParallel, 0, 1, stream, 2);
            EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
            const std::vector<int64_t> tw =
                download(reinterpret_cast<const int64_t*>(ep.base(0) + ep.layout().plan.timing), 24);
            auto wus = [&](int a, int b) { return (tw[b] - tw[a]) / 1e3; };
            Stats warm;
            warm.min_us = warm.median_us = warm.mean_us = warm.max_us = wus(0, 8);
            std::ostringstream wn;
            wn << "second plan in one launch (warm caches), from its stamps; phases us: loads " << wus(0, 1)
               << ", init " << wus(1, 2) << ", transfers+fills " << wus(2, 3) << ", split " << wus(3, 4) << ", costs "
               << wus(4, 5) << ", prefixes " << wus(5, 6) << ", layout " << wus(6, 7) << ", copies+costs " << wus(7, 8)
               << "; SM clock " << static_cast<double>(tw[13] - tw[12]) / static_cast<double>(tw[8] - tw[0]) << " GHz";
            add("plan_rank_warm", warm, 0, 1, -1, wn.str());
        }
        if (static_cast<int64_t>(R) * bc.E <= 8 * 1024) {  // the sequential reference is slow on one GPU thread
            const Stats serial = time_op(
                [&] {
                    launch_plan_only(ep.view(0), ep.layout(), routing.s, locality, PlannerKernel::kSerial, 0, 1,
                                     stream);
                },
                stream, 1, std::min(bc.iters, 3));
            add("plan_rank_serial", serial, 0, 1, -1, "plan_core.hpp's sequential code on one GPU thread (reference)");
        }
        ep_plan = ep.plan(io, routing.s, stream);  // restore every rank's plan and dst
        ep.check(stream);
    }

    if (want("dispatch") || want("combine")) {
        const Stats st = time_op([&] { ep.dispatch(ep_plan, io, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = graph_stats([&] { ep.dispatch(ep_plan, io, stream); });
        ep.check(stream);
        int64_t wrong = -1;
        if (bc.check) {
            wrong = 0;
            const int64_t nvs = ep.layout().nvs;
            for (int r = 0; r < R; ++r)
                for (int t = 0; t < routing.s[r]; t += kCheckStride) {
                    const std::vector<uint16_t> xr = download(x[r]->get() + static_cast<size_t>(t) * H, H);
                    for (int k = 0; k < K; ++k) {
                        const int32_t code = dst[r][static_cast<size_t>(t) * K + k];
                        if (detail::is_masked(code)) continue;
                        const int32_t flat = detail::decode_dst(code);
                        const int d = static_cast<int>(flat / nvs);
                        const std::vector<uint16_t> got = download(ep.recv_x(d) + (flat % nvs) * H, H);
                        const std::vector<float> gw = download(ep.recv_w(d) + flat % nvs, 1);
                        wrong += got != xr || gw[0] != weights[r][static_cast<size_t>(t) * K + k];
                    }
                }
            for (int r = 0; r < R; ++r)
                for (int g = 0; g < plan.G(); ++g) {
                    const int32_t row =
                        plan.group_begin(r, g) + plan.group_count[static_cast<size_t>(r) * plan.G() + g];
                    if (row >= plan.group_end(r, g)) continue;
                    const std::vector<uint16_t> got = download(ep.recv_x(r) + static_cast<int64_t>(row) * H, H);
                    wrong += std::any_of(got.begin(), got.end(), [](uint16_t v) { return v != 0; });
                }
        }
        std::ostringstream note;
        note << bytes.entries << " entries, " << bytes.heads << " rows sent, " << bytes.entries - bytes.heads
             << " filled on the destination, " << bytes.padding_rows << " padding rows";
        if (want("dispatch")) {
            add("dispatch", st, bytes.dispatch, ep.last_blocks_per_rank(), wrong, note.str());
            add_graph("dispatch", stg, bytes.dispatch, ep.last_blocks_per_rank(), wrong, note.str());
        }
    }

    if (want("combine")) {
        struct Variant {
            const char* name;
            CombineMode mode;
            bool apply;
            double bytes;
        };
        const Variant variants[] = {{"combine_pull", CombineMode::kPull, false, bytes.combine_pull},
                                    {"combine_push", CombineMode::kPushPartials, false, bytes.combine_push},
                                    {"combine_pull_weighted", CombineMode::kPull, true, bytes.combine_pull}};
        for (const Variant& v : variants) {
            const Stats st =
                time_op([&] { ep.combine(ep_plan, io, v.apply, v.mode, stream); }, stream, bc.warmup, bc.iters);
            const std::optional<Stats> stg = graph_stats([&] { ep.combine(ep_plan, io, v.apply, v.mode, stream); });
            ep.check(stream);
            int64_t wrong = -1;
            if (bc.check) {
                wrong = 0;
                for (int r = 0; r < R; ++r)
                    for (int t = 0; t < routing.s[r]; t += kCheckStride * 4) {
                        const std::vector<uint16_t> want_row =
                            reference_token(ep, dst[r].data() + static_cast<size_t>(t) * K,
                                            weights[r].data() + static_cast<size_t>(t) * K, v.apply);
                        wrong += download(out[r]->get() + static_cast<size_t>(t) * H, H) != want_row;
                    }
            }
            std::ostringstream note;
            note << bytes.heads << " partials (" << bytes.multi_heads << " fp32), y = dispatched rows";
            add(v.name, st, v.bytes, ep.last_blocks_per_rank(), wrong, note.str());
            add_graph(v.name, stg, v.bytes, ep.last_blocks_per_rank(), wrong, note.str());
        }
    }

    int64_t copies = 0, distinct = 0;
    for (size_t i = 0; i < plan.copies.size(); ++i) {
        const int32_t e = plan.copies[i];
        if (e < 0) continue;
        ++copies;
        bool first = true;
        for (size_t j = 0; j < i; ++j) first = first && plan.copies[j] != e;
        distinct += first;
    }
    const int epn = cfg.epn(), B = cfg.num_slots();
    const size_t n = static_cast<size_t>(H) * bc.ffn_hidden;
    // Projections moved per copy: the requested number, fewer if the pool would not fit in free device memory
    // (every rank holds epn local experts and B slots per projection).
    auto projections_that_fit = [&](bool grads) {
        size_t free_bytes = 0, total_bytes = 0;
        EVENEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        const double per_projection = static_cast<double>(R) * (epn + B) * n * (grads ? 4 : 2);
        int P = bc.expert_projections;
        while (P > 1 && P * per_projection > 0.9 * static_cast<double>(free_bytes)) --P;
        return P;
    };
    auto experts_note = [&](int P) {
        std::ostringstream note;
        note << copies << " copies of " << distinct << " experts, " << P << " projection(s) of " << H << "x"
             << bc.ffn_hidden;
        return note.str();
    };
    if (want("prefetch")) {
        ExpertsShape es;
        es.num_projections = projections_that_fit(false);
        es.elems = static_cast<int64_t>(n);
        es.with_grads = false;
        Experts ex(ep, es);
        const int P = es.num_projections;
        for (int r = 0; r < R; ++r)
            for (int p = 0; p < P; ++p)
                for (int g = 0; g < epn; ++g)
                    launch_fill_random_bf16(ex.weight(r, p, g), n, 7 + r * 131 + p * 17 + g, stream);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        const Stats st = time_op([&] { ex.prefetch_weight(ep, ep_plan, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = graph_stats([&] { ex.prefetch_weight(ep, ep_plan, stream); });
        ep.check(stream);
        int64_t wrong = -1;
        if (bc.check) {
            wrong = 0;
            const size_t m = std::min<size_t>(n, 4096);
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b) {
                    const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
                    if (e < 0) continue;
                    for (int p = 0; p < P; ++p)
                        for (size_t off : {size_t{0}, n / 2, n - m})
                            wrong += download(ex.slot(r, p, b) + off, m) !=
                                     download(ex.weight(e / epn, p, e % epn) + off, m);
                }
        }
        add("prefetch", st, 2.0 * n * P * static_cast<double>(distinct + copies), ex.last_blocks_per_rank(), wrong,
            experts_note(P));
        add_graph("prefetch", stg, 2.0 * n * P * static_cast<double>(distinct + copies), ex.last_blocks_per_rank(),
                  wrong, experts_note(P));
    }
    if (want("reduce")) {
        ExpertsShape es;
        es.num_projections = projections_that_fit(true);
        es.elems = static_cast<int64_t>(n);
        es.with_weights = false;
        Experts ex(ep, es);
        const int P = es.num_projections;
        // fp32 data: two random bf16 halves make a finite float in (-1, 1) with random low bits.
        for (int r = 0; r < R; ++r)
            for (int p = 0; p < P; ++p) {
                for (int g = 0; g < epn; ++g)
                    launch_fill_random_bf16(reinterpret_cast<uint16_t*>(ex.grad(r, p, g)), 2 * n, 9 + r * 131 + g,
                                            stream);
                for (int b = 0; b < B; ++b)
                    launch_fill_random_bf16(reinterpret_cast<uint16_t*>(ex.slot_grad(r, p, b)), 2 * n, 11 + r * 131 + b,
                                            stream);
            }
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        int64_t wrong = -1;
        if (bc.check) {
            // One reduction checked on a sample of elements: g + slots in ascending (rank, slot) order.
            const size_t m = std::min<size_t>(n, 1024);
            std::vector<std::vector<float>> want_g(static_cast<size_t>(R) * epn * P);
            for (int h = 0; h < R; ++h)
                for (int p = 0; p < P; ++p)
                    for (int g = 0; g < epn; ++g) want_g[(h * P + p) * epn + g] = download(ex.grad(h, p, g), m);
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b) {
                    const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
                    if (e < 0) continue;
                    for (int p = 0; p < P; ++p) {
                        const std::vector<float> sg = download(ex.slot_grad(r, p, b), m);
                        std::vector<float>& g = want_g[((e / epn) * P + p) * epn + e % epn];
                        for (size_t i = 0; i < m; ++i) g[i] = g[i] + sg[i];
                    }
                }
            ex.reduce_grad(ep, ep_plan, stream);
            ep.check(stream);
            wrong = 0;
            for (int h = 0; h < R; ++h)
                for (int p = 0; p < P; ++p)
                    for (int g = 0; g < epn; ++g) {
                        const std::vector<float> got = download(ex.grad(h, p, g), m);
                        wrong += std::memcmp(got.data(), want_g[(h * P + p) * epn + g].data(), m * 4) != 0;
                    }
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b)
                    if (plan.copies[static_cast<size_t>(r) * B + b] >= 0)
                        for (float v : download(ex.slot_grad(r, 0, b), m)) wrong += v != 0.0f;
        }
        const Stats st = time_op([&] { ex.reduce_grad(ep, ep_plan, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = graph_stats([&] { ex.reduce_grad(ep, ep_plan, stream); });
        ep.check(stream);
        add("reduce", st, 8.0 * n * P * static_cast<double>(distinct + copies), ex.last_blocks_per_rank(), wrong,
            experts_note(P) + (bc.check ? " (timed runs after the checked one add zeroed slots)" : ""));
        add_graph("reduce", stg, 8.0 * n * P * static_cast<double>(distinct + copies), ex.last_blocks_per_rank(), -1,
                  experts_note(P));
    }
    EVENEP_CUDA_CHECK(cudaStreamDestroy(stream));
    return rows;
}

}  // namespace evenep::cuda
