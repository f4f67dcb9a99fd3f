// `evenep bench gemm`: the GPU grouped GEMM (include/evenep/cuda/grouped_gemm.hpp) on one rank's receive buffer.
// Row distributions: the planner's cu_seqlens of rank 0 at each --maxvio (lognormal routing bisected to that
// maxvio, optimized planner) and a Zipf split of S*K rows over the G = 2*epn groups (each padded to tp). For each
// distribution, projection (gate/up: H -> H', down: H' -> H), op (forward, dgrad) and schedule (fixed,
// load-aware) it reports the median time and TFLOP/s = 2 * rows * in * out / t (rows = padded rows computed).
// --offsets-json writes each distribution's cu_seqlens for scripts/device/gemm_anchor.py (torch anchors).
// Without a CUDA build the subcommand says that it needs one.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#endif

namespace evenep::cli {
namespace {

struct GemmBenchOptions {
    int R = 8, E = 384, K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    std::vector<double> maxvios{0.2, 1, 10, 20};
    double zipf = 1.0;  // exponent; <= 0 skips the Zipf split
    uint64_t seed = 1;
    int warmup = 3, iters = 10;
    bool check = false;
    std::vector<std::string> ops{"fwd", "dgrad", "wgrad"};
    std::string json_file, offsets_file;
};

struct Distribution {
    std::string name;
    std::vector<int32_t> cu;  // [G]
};

std::vector<Distribution> make_distributions(const GemmBenchOptions& o) {
    const Config cfg{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .B = -1, .tp = o.tp};
    cfg.validate();
    const int G = cfg.num_groups();
    std::vector<Distribution> out;
    for (double mv : o.maxvios) {
        const RoutingSpec spec{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .seed = o.seed};
        const Routing routing = make_target_maxvio(spec, mv);
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
        out.push_back({fmt::format("planner_maxvio{:g}", mv),
                       std::vector<int32_t>(plan.cu_seqlens.begin(), plan.cu_seqlens.begin() + G)});
    }
    if (o.zipf > 0) {
        const int64_t total = static_cast<int64_t>(o.S) * o.K;
        std::vector<double> wts(G);
        for (int g = 0; g < G; ++g) wts[g] = 1.0 / std::pow(g + 1.0, o.zipf);
        const double sum = std::accumulate(wts.begin(), wts.end(), 0.0);
        std::vector<int64_t> rows(G);
        int64_t assigned = 0;
        for (int g = 0; g < G; ++g) assigned += rows[g] = static_cast<int64_t>(std::floor(total * wts[g] / sum));
        rows[0] += total - assigned;
        std::mt19937_64 rng(o.seed);
        std::shuffle(rows.begin(), rows.end(), rng);
        std::vector<int32_t> cu(G);
        int64_t end = 0;
        for (int g = 0; g < G; ++g) {
            end += (rows[g] + o.tp - 1) / o.tp * o.tp;
            cu[g] = static_cast<int32_t>(end);
        }
        out.push_back({fmt::format("zipf{:g}", o.zipf), cu});
    }
    return out;
}

#if defined(EVENEP_HAVE_CUDA)

float host_bf16(uint16_t b) { return bf16_to_float(Bf16{b}); }

// cudaMalloc of `bytes` bytes into a typed pointer.
template <typename T>
void device_alloc(T** p, size_t bytes) {
    void* v = nullptr;
    EVENEP_CUDA_CHECK(cudaMalloc(&v, bytes));
    *p = static_cast<T*>(v);
}

void run_gemm_bench(const GemmBenchOptions& o) {
    const std::vector<Distribution> dists = make_distributions(o);
    const int G = static_cast<int>(dists.front().cu.size());
    int64_t max_rows = 0;
    for (const auto& d : dists) max_rows = std::max<int64_t>(max_rows, d.cu.back());
    const int wide = std::max(o.H, o.ffn_hidden);
    const size_t welems = static_cast<size_t>(o.H) * o.ffn_hidden;

    cudaDeviceProp prop{};
    EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    fmt::print("device: {} ({} SMs), G = {}, H = {}, H' = {}, grid fwd {} dgrad {}\n", prop.name,
               prop.multiProcessorCount, G, o.H, o.ffn_hidden, cuda::grouped_gemm_grid_blocks(cuda::GemmOp::kForward),
               cuda::grouped_gemm_grid_blocks(cuda::GemmOp::kDgrad));

    uint16_t *x = nullptr, *y = nullptr, *y2 = nullptr, *w = nullptr;
    const size_t xy_elems = static_cast<size_t>(max_rows) * wide;
    device_alloc(&x, xy_elems * 2);
    device_alloc(&y, xy_elems * 2);
    device_alloc(&y2, xy_elems * 2);
    device_alloc(&w, welems * G * 2);
    cuda::fill_random_bf16(x, xy_elems, o.seed, 1.f, nullptr);
    cuda::fill_random_bf16(w, welems * G, o.seed + 1, 1.f / 32, nullptr);
    cuda::fill_random_bf16(y2, xy_elems, o.seed + 2, 1.f / 32, nullptr);  // dy of wgrad until a run overwrites it
    // wgrad: fp32 gradients [G][in * out] (accumulated over all runs; values stay finite).
    float* grads = nullptr;
    float** dgtable = nullptr;
    const bool with_wgrad = std::find(o.ops.begin(), o.ops.end(), "wgrad") != o.ops.end();
    if (with_wgrad) {
        device_alloc(&grads, welems * G * sizeof(float));
        EVENEP_CUDA_CHECK(cudaMemset(grads, 0, welems * G * sizeof(float)));
        std::vector<float*> gt(G);
        for (int g = 0; g < G; ++g) gt[g] = grads + welems * g;
        device_alloc(&dgtable, sizeof(float*) * G);
        EVENEP_CUDA_CHECK(cudaMemcpy(dgtable, gt.data(), sizeof(float*) * G, cudaMemcpyHostToDevice));
    }
    std::vector<const uint16_t*> table(G);
    for (int g = 0; g < G; ++g) table[g] = w + welems * g;
    const uint16_t** dtable = nullptr;
    int32_t* dcu = nullptr;
    void* ws = nullptr;
    device_alloc(&dtable, sizeof(void*) * G);
    device_alloc(&dcu, sizeof(int32_t) * G);
    device_alloc(&ws, cuda::grouped_gemm_workspace_bytes(G));
    EVENEP_CUDA_CHECK(cudaMemcpy(dtable, table.data(), sizeof(void*) * G, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    EVENEP_CUDA_CHECK(cudaEventCreate(&e0));
    EVENEP_CUDA_CHECK(cudaEventCreate(&e1));

    nlohmann::json out{{"device", prop.name}, {"G", G}, {"rows", nlohmann::json::array()}};
    nlohmann::json offsets = nlohmann::json::object();
    fmt::print("{:<20} {:<8} {:<6} {:<10} {:>8} {:>10} {:>9} {:>10}\n", "dist", "proj", "op", "schedule", "rows",
               "p50 us", "TFLOP/s", "check");
    for (const Distribution& d : dists) {
        int32_t prev = 0, biggest = 0, smallest = d.cu.back();
        for (int32_t e : d.cu) biggest = std::max(biggest, e - prev), smallest = std::min(smallest, e - prev), prev = e;
        fmt::print("# {}: {} padded rows, group rows min {} max {}\n", d.name, d.cu.back(), smallest, biggest);
    }
    for (const Distribution& d : dists) {
        offsets[d.name] = d.cu;
        EVENEP_CUDA_CHECK(cudaMemcpy(dcu, d.cu.data(), sizeof(int32_t) * G, cudaMemcpyHostToDevice));
        const int64_t rows = d.cu.back();
        struct Proj {
            const char* name;
            int in, out;
        };
        for (const Proj& p : {Proj{"gate_up", o.H, o.ffn_hidden}, Proj{"down", o.ffn_hidden, o.H}}) {
            for (const std::string& op_name : o.ops) {
                const cuda::GemmOp op = op_name == "dgrad" ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
                const int kdim = op == cuda::GemmOp::kForward ? p.in : p.out;
                const int ndim = op == cuda::GemmOp::kForward ? p.out : p.in;
                for (cuda::GemmSchedule sch : {cuda::GemmSchedule::kFixed, cuda::GemmSchedule::kLoadAware}) {
                    cuda::GroupedGemmArgs a;
                    a.x = x, a.cu_seqlens = dcu, a.weights = dtable;
                    a.y = sch == cuda::GemmSchedule::kFixed ? y : y2;
                    a.num_groups = G, a.in_dim = p.in, a.out_dim = p.out, a.op = op, a.schedule = sch;
                    a.workspace = ws;
                    cuda::GroupedWgradArgs wa;
                    wa.x = x, wa.dy = y2, wa.cu_seqlens = dcu, wa.grads = dgtable;
                    wa.num_groups = G, wa.in_dim = p.in, wa.out_dim = p.out, wa.schedule = sch, wa.workspace = ws;
                    const bool wgrad = op_name == "wgrad";
                    auto call = [&] {
                        if (wgrad)
                            cuda::grouped_gemm_wgrad(wa, nullptr);
                        else
                            cuda::grouped_gemm(a, nullptr);
                    };
                    for (int i = 0; i < o.warmup; ++i) call();
                    std::vector<float> ms;
                    for (int i = 0; i < o.iters; ++i) {
                        EVENEP_CUDA_CHECK(cudaEventRecord(e0, nullptr));
                        call();
                        EVENEP_CUDA_CHECK(cudaEventRecord(e1, nullptr));
                        EVENEP_CUDA_CHECK(cudaEventSynchronize(e1));
                        float t = 0;
                        EVENEP_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
                        ms.push_back(t);
                    }
                    std::sort(ms.begin(), ms.end());
                    const double med_us = 1e3 * ms[ms.size() / 2];
                    const double tflops = 2.0 * rows * p.in * p.out / (med_us * 1e-6) / 1e12;
                    std::string check = "-";
                    double max_rel = -1;
                    if (o.check && !wgrad && sch == cuda::GemmSchedule::kLoadAware) {
                        // Same tiles, same order inside a tile: both schedules must agree bitwise.
                        std::vector<uint16_t> h1(static_cast<size_t>(rows) * ndim), h2(h1.size());
                        EVENEP_CUDA_CHECK(cudaMemcpy(h1.data(), y, h1.size() * 2, cudaMemcpyDeviceToHost));
                        EVENEP_CUDA_CHECK(cudaMemcpy(h2.data(), y2, h2.size() * 2, cudaMemcpyDeviceToHost));
                        const bool same = h1 == h2;
                        // 16 sampled elements against a host dot product.
                        std::mt19937_64 rng(o.seed + rows);
                        max_rel = 0;
                        for (int s = 0; s < 16; ++s) {
                            const int64_t r = static_cast<int64_t>(rng() % rows);
                            const int n = static_cast<int>(rng() % ndim);
                            const int g =
                                static_cast<int>(std::upper_bound(d.cu.begin(), d.cu.end(), r) - d.cu.begin());
                            std::vector<uint16_t> xr(kdim), wc(kdim);
                            EVENEP_CUDA_CHECK(cudaMemcpy(xr.data(), x + r * kdim, kdim * 2, cudaMemcpyDeviceToHost));
                            if (op == cuda::GemmOp::kForward)  // column n of W_g [in][out]
                                EVENEP_CUDA_CHECK(cudaMemcpy2D(wc.data(), 2, table[g] + n,
                                                               static_cast<size_t>(p.out) * 2, 2, kdim,
                                                               cudaMemcpyDeviceToHost));
                            else  // row n of W_g [in][out]
                                EVENEP_CUDA_CHECK(cudaMemcpy(wc.data(), table[g] + static_cast<size_t>(n) * p.out,
                                                             kdim * 2, cudaMemcpyDeviceToHost));
                            double ref = 0, mag = 0;
                            for (int k = 0; k < kdim; ++k) {
                                ref += static_cast<double>(host_bf16(xr[k])) * host_bf16(wc[k]);
                                mag += std::fabs(static_cast<double>(host_bf16(xr[k])) * host_bf16(wc[k]));
                            }
                            const double got = host_bf16(h2[static_cast<size_t>(r) * ndim + n]);
                            max_rel = std::max(max_rel, std::fabs(got - ref) / std::max(mag, 1e-30));
                        }
                        check = fmt::format("{}{:.1e}", same ? "=" : "DIFF ", max_rel);
                        EVENEP_CHECK_KIND(ErrorKind::kRuntime, same && max_rel < 1e-2, "bench gemm: ", d.name, " ",
                                          p.name, " ", op_name, ": schedules differ or sampled error ", max_rel);
                    }
                    const char* sch_name = sch == cuda::GemmSchedule::kFixed ? "fixed" : "load_aware";
                    fmt::print("{:<20} {:<8} {:<6} {:<10} {:>8} {:>10.1f} {:>9.1f} {:>10}\n", d.name, p.name, op_name,
                               sch_name, rows, med_us, tflops, check);
                    std::fflush(stdout);
                    out["rows"].push_back({{"dist", d.name},
                                           {"proj", p.name},
                                           {"op", op_name},
                                           {"schedule", sch_name},
                                           {"rows", rows},
                                           {"in", p.in},
                                           {"out", p.out},
                                           {"median_us", med_us},
                                           {"tflops", tflops},
                                           {"max_rel_err", max_rel}});
                }
            }
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(x), cudaFree(y), cudaFree(y2), cudaFree(w), cudaFree(dtable), cudaFree(dcu), cudaFree(ws), cudaFree(grads),
        cudaFree(dgtable);
    if (!o.json_file.empty()) {
        std::ofstream f(o.json_file);
        EVENEP_CHECK(f.good(), "bench gemm: cannot write --json ", o.json_file);
        f << out.dump(1) << "\n";
    }
    if (!o.offsets_file.empty()) {
        std::ofstream f(o.offsets_file);
        EVENEP_CHECK(f.good(), "bench gemm: cannot write --offsets-json ", o.offsets_file);
        f << nlohmann::json{{"G", G}, {"H", o.H}, {"ffn_hidden", o.ffn_hidden}, {"offsets", offsets}}.dump() << "\n";
    }
}

#endif

}  // namespace

void register_bench_gemm(CLI::App& bench) {
    auto o = std::make_shared<GemmBenchOptions>();
    CLI::App* cmd = bench.add_subcommand("gemm", "GPU grouped GEMM of the expert FFN (fixed vs load-aware schedule)");
    cmd->add_option("--R", o->R, "ranks (for the planner's row counts)")->capture_default_str();
    cmd->add_option("--E", o->E, "routed experts")->capture_default_str();
    cmd->add_option("--K", o->K, "top-k")->capture_default_str();
    cmd->add_option("--S", o->S, "tokens per rank")->capture_default_str();
    cmd->add_option("--H", o->H, "hidden size")->capture_default_str();
    cmd->add_option("--ffn-hidden", o->ffn_hidden, "expert intermediate size H'")->capture_default_str();
    cmd->add_option("--tp", o->tp, "token padding")->capture_default_str();
    cmd->add_option("--maxvio", o->maxvios, "target maxvio values (planner rows of rank 0)")->capture_default_str();
    cmd->add_option("--zipf", o->zipf, "Zipf exponent of the extra split (<= 0: none)")->capture_default_str();
    cmd->add_option("--seed", o->seed, "routing and data seed")->capture_default_str();
    cmd->add_option("--ops", o->ops, "any of fwd, dgrad, wgrad (wgrad is timed only; the GPU test checks it)")
        ->capture_default_str();
    cmd->add_option("--warmup", o->warmup, "untimed runs")->capture_default_str();
    cmd->add_option("--iters", o->iters, "timed runs (median reported)")->capture_default_str();
    cmd->add_flag("--check", o->check, "compare schedules bitwise and sample 16 elements against the host");
    cmd->add_option("--json", o->json_file, "write all rows as JSON");
    cmd->add_option("--offsets-json", o->offsets_file, "write each distribution's cu_seqlens (for gemm_anchor.py)");
    cmd->callback([o]() {
        for (const std::string& op : o->ops)
            EVENEP_CHECK(op == "fwd" || op == "dgrad" || op == "wgrad", "bench gemm: --ops entry '", op,
                         "' must be fwd, dgrad or wgrad");
#if defined(EVENEP_HAVE_CUDA)
        run_gemm_bench(*o);
#else
        (void)make_distributions;
        EVENEP_CHECK(false, "bench gemm needs a CUDA build (configure with EVENEP_CUDA=ON on a machine with nvcc)");
#endif
    });
}

}  // namespace evenep::cli
