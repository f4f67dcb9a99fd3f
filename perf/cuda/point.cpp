// One GPU benchmark point (perf/cuda/bench.hpp): routing, the device EP over R virtual ranks, the CPU plan; the
// ops themselves are in plan.cpp, data_path.cpp and experts.cpp.
#include "perf/cuda/point.hpp"

#include <algorithm>
#include <sstream>

#include "evenep/cuda/detail/ep_hooks.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"

namespace evenep::perf {

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

std::vector<int> check_columns(int H) { return {0, 1, 2, 3, H / 4, H / 2, H - 2, H - 1}; }

std::vector<Bf16> download_columns(const uint16_t* p, int64_t n, int H, const std::vector<int>& cols) {
    const size_t C = cols.size();
    std::vector<Bf16> out(static_cast<size_t>(n) * C);
    if (n == 0) return out;
    std::vector<uint16_t> col(static_cast<size_t>(n));
    for (size_t j = 0; j < C; ++j) {
        EVENEP_CUDA_CHECK(cudaMemcpy2D(col.data(), 2, p + cols[j], static_cast<size_t>(H) * 2, 2,
                                       static_cast<size_t>(n), cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i) * C + j] = Bf16{col[static_cast<size_t>(i)]};
    }
    return out;
}

Point::Point(const BenchConfig& config, double copy_anchor_gbps) : bc(config), copy_gbps(copy_anchor_gbps) {
    cfg.R = bc.R;
    cfg.E = bc.E;
    cfg.K = bc.K;
    cfg.S = bc.S;
    cfg.tp = bc.tp;
    cfg.slack = bc.slack;
    cfg.policy = bc.policy;
    cfg.validate();
    const detail::AutoCostModel auto_model = detail::make_auto_cost_model(bc.H, bc.ffn_hidden, bc.tp);
    // sigma is bisected on a smaller token count (same popularity vector), then the full routing is drawn once: the
    // achieved maxvio is reported per row.
    RoutingSpec spec{bc.R, bc.E, bc.K, bc.S, bc.seed};
    RoutingSpec probe = spec;
    probe.S = std::min(bc.S, 2048);
    if (bc.routing_in.empty()) {
        double sigma = 0;
        make_target_maxvio(probe, bc.maxvio, &sigma);
        routing = make_lognormal(spec, sigma);
    } else {
        routing = read_routing_npy(bc.routing_in, bc.E);
        EVENEP_CHECK(routing.R == bc.R && routing.K == bc.K && routing.S == bc.S, "--routing '", bc.routing_in,
                     "' holds R=", routing.R, " S=", routing.S, " K=", routing.K, ", the benchmark runs R=", bc.R,
                     " S=", bc.S, " K=", bc.K);
    }
    maxvio = routing.maxvio();
    weights = make_route_weights(routing, bc.seed);
    if (!bc.routing_npy.empty()) {
        Routing one = routing;
        one.R = 1;
        one.s.resize(1);
        one.topk_idx.resize(1);
        write_routing_npy(bc.routing_npy, one);
    }
    std::ostringstream os;
    os << "R" << bc.R << " E" << bc.E << " K" << bc.K << " S" << bc.S << " H" << bc.H;
    shape = os.str();
    const int R = bc.R, K = bc.K, H = bc.H, S = bc.S;

    cuda::EpOptions opt;
    opt.mode = bc.mode;
    opt.sm_budget = bc.sm_budget;
    opt.auto_model = auto_model;
    opt.precision.fp8 = bc.fp8;
    ep = std::make_unique<cuda::DeviceEp>(cfg, H, opt);
    io.resize(R);
    for (int r = 0; r < R; ++r) {
        x.push_back(std::make_unique<DeviceArray<uint16_t>>(static_cast<size_t>(S) * H));
        out.push_back(std::make_unique<DeviceArray<uint16_t>>(static_cast<size_t>(S) * H));
        idx.push_back(std::make_unique<DeviceArray<int32_t>>(static_cast<size_t>(S) * K));
        w.push_back(std::make_unique<DeviceArray<float>>(static_cast<size_t>(S) * K));
        cuda::launch_fill_random_bf16(x[r]->get(), x[r]->size(), bc.seed * 1000 + r, nullptr);
        EVENEP_CUDA_CHECK(cudaMemcpy(idx[r]->get(), routing.topk_idx[r].data(), routing.topk_idx[r].size() * 4,
                                     cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(w[r]->get(), weights[r].data(), weights[r].size() * 4, cudaMemcpyHostToDevice));
        io[r] = cuda::RankIo{x[r]->get(), idx[r]->get(), w[r]->get(), out[r]->get(), nullptr};
    }
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const cuda::EpOptions& o = ep->options();
    fused = cuda::plan_fits_co_resident(ep->view(o.channel), ep->layout(), o.planner_kernel);
    if (fused) {
        ep_plan = ep->plan(io, routing.s, stream);
        ep->check(stream);
    } else {
        ep_plan = cuda::plan_from_tpe(*ep, routing.tpe(), routing.s, stream, 0, R);
    }

    Planner planner(cfg, bc.mode);
    planner.set_auto_model(auto_model);
    planner.plan(routing.tpe(), routing.s, plan);
    dst.resize(R);
    for (int r = 0; r < R; ++r) {
        dst[r].resize(static_cast<size_t>(routing.s[r]) * K);
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
}

Point::~Point() {
    if (stream) cudaStreamDestroy(stream);
}

void Point::add(const std::string& op, const Stats& st, double b, int blocks, int64_t wrong, const std::string& note) {
    rows.push_back(make_row(op, shape, maxvio, st, b, copy_gbps, bc.iters));
    rows.back().blocks_per_rank = blocks;
    rows.back().wrong = wrong;
    rows.back().note = note;
}

std::optional<Stats> Point::graph_stats(const std::function<void()>& op) {
    if (!bc.graph) return std::nullopt;
    return time_graph(op, stream, bc.warmup, bc.iters);
}

void Point::add_graph(const std::string& op,
                      const std::optional<Stats>& st,
                      double b,
                      int blocks,
                      int64_t wrong,
                      const std::string& note) {
    if (!st) return;
    add(op + "_graph", *st, b, blocks, wrong, note + "; CUDA graph replays");
}

BufferConfig Point::oracle_config() const {
    BufferConfig bcfg;
    bcfg.cfg = cfg;
    bcfg.H = kCheckColumns;
    bcfg.ffn_hidden = 8;
    return bcfg;
}

std::vector<cpu::RankTokens> Point::oracle_tokens(const std::vector<int>& cols) const {
    std::vector<cpu::RankTokens> tokens(static_cast<size_t>(cfg.R));
    for (int r = 0; r < cfg.R; ++r) {
        cpu::RankTokens& t = tokens[r];
        t.s = routing.s[r];
        t.x = download_columns(x[r]->get(), t.s, bc.H, cols);
        t.topk_idx = routing.topk_idx[r];
        t.topk_w = weights[r];
    }
    return tokens;
}

std::vector<BenchRow> bench_point(const BenchConfig& bc, const std::vector<std::string>& ops, double copy_gbps) {
    auto want = [&](const char* op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
    Point p(bc, copy_gbps);
    EVENEP_CHECK(p.fused || !(want("dispatch") || want("combine") || want("prefetch") || want("reduce")), "bench: R = ",
                 bc.R, " virtual ranks need ", bc.R, " co-resident blocks of the fused plan kernel, more than this ",
                 "device holds; at this R only the planner's one-rank rows run (bench gpu-plan)");
    if (want("plan")) bench_plan(p);
    if (want("dispatch") || want("combine")) bench_data_path(p, want("dispatch"), want("combine"));
    if (want("prefetch") || want("reduce")) bench_experts(p, want("prefetch"), want("reduce"));
    EVENEP_CUDA_CHECK(cudaStreamDestroy(p.stream));
    p.stream = nullptr;
    return std::move(p.rows);
}

}  // namespace evenep::perf
