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
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "perf/cuda/timing.hpp"
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
    std::vector<std::string> ops{"fwd", "dgrad", "wgrad", "wgrad_set"};
    std::vector<std::string> kernels{"wgmma", "mma"};
    std::string json_file, offsets_file;
    bool calibrate = false;
    std::string write_model;  // --calibrate: the generated cost-model include to write
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

// Median (element iters/2 of the sorted times) over `iters` CUDA-event-timed calls on the default stream after
// `warmup` untimed ones, each waited for before the next, in µs (perf/cuda/timing.hpp).
double median_call_us(const std::function<void()>& call, int warmup, int iters) {
    perf::TimingOptions o;
    o.warmup = warmup;
    o.iters = std::max(iters, 1);
    o.sync_each = true;
    return perf::time_op(call, nullptr, o).p50_us;
}

struct Variant {
    std::string name;
    cuda::GemmKernel kernel;
    cuda::GemmSchedule schedule;
};

// The scheduler's cost model applied to a whole call (µs): sum of tile costs over the SMs (the Hopper kernel's
// 128 x 256 tiles; wgrad unsplit), i.e. the makespan of a perfectly balanced schedule.
double predict_us(const std::vector<int32_t>& cu, int in, int out, const std::string& op, int sms) {
    const cuda::GemmCostModel m = cuda::grouped_gemm_cost_model();
    const bool wgrad = op.rfind("wgrad", 0) == 0;
    double total = 0;
    int32_t prev = 0;
    for (int32_t e : cu) {
        const int r = e - prev;
        prev = e;
        if (r <= 0) continue;
        total += cuda::grouped_gemm_group_cost_us(m, op == "fwd" ? cuda::GemmOp::kForward : cuda::GemmOp::kDgrad, wgrad,
                                                  r, in, out);
    }
    return total / sms;
}

// Runs wgrad once into zeroed gradients and compares 8 sampled elements with host sums; returns the largest error
// relative to the sum of magnitudes.
double check_wgrad(const cuda::GroupedWgradArgs& wa, const std::vector<int32_t>& cu, int in, int out, float* grads,
                   uint64_t seed) {
    const int G = static_cast<int>(cu.size());
    const size_t welems = static_cast<size_t>(in) * out;
    EVENEP_CUDA_CHECK(cudaMemset(grads, 0, welems * G * sizeof(float)));
    cuda::grouped_gemm_wgrad(wa, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    std::mt19937_64 rng(seed + 77);
    double worst = 0;
    for (int s = 0; s < 8; ++s) {
        int g = static_cast<int>(rng() % G);
        while ((g == 0 ? cu[0] : cu[g] - cu[g - 1]) == 0) g = (g + 1) % G;
        const int begin = g == 0 ? 0 : cu[g - 1], r = cu[g] - begin;
        const int i = static_cast<int>(rng() % in), oc = static_cast<int>(rng() % out);
        std::vector<uint16_t> xc(r), dc(r);
        EVENEP_CUDA_CHECK(cudaMemcpy2D(xc.data(), 2, wa.x + static_cast<size_t>(begin) * in + i,
                                       static_cast<size_t>(in) * 2, 2, r, cudaMemcpyDeviceToHost));
        EVENEP_CUDA_CHECK(cudaMemcpy2D(dc.data(), 2, wa.dy + static_cast<size_t>(begin) * out + oc,
                                       static_cast<size_t>(out) * 2, 2, r, cudaMemcpyDeviceToHost));
        double ref = 0, mag = 0;
        for (int k = 0; k < r; ++k) {
            const double t = static_cast<double>(host_bf16(xc[k])) * host_bf16(dc[k]);
            ref += t;
            mag += std::fabs(t);
        }
        float got = 0;
        EVENEP_CUDA_CHECK(cudaMemcpy(&got, grads + welems * g + static_cast<size_t>(i) * out + oc, sizeof(float),
                                     cudaMemcpyDeviceToHost));
        worst = std::max(worst, std::fabs(got - ref) / std::max(mag, 1e-30));
    }
    return worst;
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
    uint16_t* dyw = nullptr;  // dY of wgrad (its own buffer: the forward runs overwrite y and y2)
    device_alloc(&dyw, xy_elems * 2);
    cuda::fill_random_bf16(dyw, xy_elems, o.seed + 2, 1.f / 32, nullptr);
    // wgrad: fp32 gradients [G][in * out] (accumulated over all runs; values stay finite).
    float* grads = nullptr;
    float** dgtable = nullptr;
    const bool with_wgrad = std::any_of(o.ops.begin(), o.ops.end(), [](const std::string& op) {
        return op.rfind("wgrad", 0) == 0;
    });
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

    nlohmann::json out{{"device", prop.name}, {"G", G}, {"rows", nlohmann::json::array()}};
    nlohmann::json offsets = nlohmann::json::object();
    fmt::print("cost model ({}): c_tile {} us, c_tile_wgrad {} us, c_kblock {} us, c_kblock_wgrad {} us\n",
               cuda::grouped_gemm_cost_model().source, cuda::grouped_gemm_cost_model().c_tile,
               cuda::grouped_gemm_cost_model().c_tile_wgrad, cuda::grouped_gemm_cost_model().c_kblock,
               cuda::grouped_gemm_cost_model().c_kblock_wgrad);
    std::vector<Variant> variants;
    bool have_fixed = false;
    for (const std::string& k : o.kernels) {
        if (k == "wgmma" && cuda::grouped_gemm_has_wgmma()) {
            variants.push_back({"wgmma/fixed", cuda::GemmKernel::kWgmma, cuda::GemmSchedule::kFixed});
            variants.push_back({"wgmma/load_aware", cuda::GemmKernel::kWgmma, cuda::GemmSchedule::kLoadAware});
            have_fixed = true;
        } else if (k == "mma") {
            variants.push_back({"mma/load_aware", cuda::GemmKernel::kMmaSync, cuda::GemmSchedule::kLoadAware});
        }
    }
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, !variants.empty(), "bench gemm: no kernel to run on this device");
    const int grid_wgmma = prop.multiProcessorCount;
    fmt::print("{:<20} {:<8} {:<6} {:<17} {:>8} {:>10} {:>9} {:>9} {:>10}\n", "dist", "proj", "op", "kernel/schedule",
               "rows", "p50 us", "TFLOP/s", "model us", "check");
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
                for (const Variant& var : variants) {
                    const cuda::GemmSchedule sch = var.schedule;
                    // fixed writes y, load_aware y2 (compared bitwise); the mma.sync kernel writes y (sampled only).
                    const bool into_y2 = sch == cuda::GemmSchedule::kLoadAware && var.kernel != cuda::GemmKernel::kMmaSync;
                    cuda::GroupedGemmArgs a;
                    a.x = x, a.cu_seqlens = dcu, a.weights = dtable;
                    a.y = into_y2 ? y2 : y;
                    a.num_groups = G, a.in_dim = p.in, a.out_dim = p.out, a.op = op, a.schedule = sch;
                    a.kernel = var.kernel;
                    a.workspace = ws;
                    cuda::GroupedWgradArgs wa;
                    wa.x = x, wa.dy = dyw, wa.cu_seqlens = dcu, wa.grads = dgtable;
                    wa.num_groups = G, wa.in_dim = p.in, wa.out_dim = p.out, wa.schedule = sch, wa.workspace = ws;
                    wa.kernel = var.kernel;
                    wa.accumulate = op_name != "wgrad_set";
                    const bool wgrad = op_name.rfind("wgrad", 0) == 0;
                    double wgrad_err = -1;
                    if (wgrad && o.check) wgrad_err = check_wgrad(wa, d.cu, p.in, p.out, grads, o.seed);
                    auto call = [&] {
                        if (wgrad)
                            cuda::grouped_gemm_wgrad(wa, nullptr);
                        else
                            cuda::grouped_gemm(a, nullptr);
                    };
                    const double med_us = median_call_us(call, o.warmup, o.iters);
                    const double tflops = 2.0 * rows * p.in * p.out / (med_us * 1e-6) / 1e12;
                    std::string check = "-";
                    double max_rel = -1;
                    if (wgrad_err >= 0) {
                        check = fmt::format("{:.1e}", wgrad_err);
                        max_rel = wgrad_err;
                        EVENEP_CHECK_KIND(ErrorKind::kRuntime, wgrad_err < 1e-3, "bench gemm: ", d.name, " ", p.name,
                                          " wgrad ", var.name, ": sampled error ", wgrad_err);
                    }
                    if (o.check && !wgrad) {
                        // The Hopper kernel's schedules share tiles and the order inside a tile: bitwise equal.
                        std::vector<uint16_t> h1(static_cast<size_t>(rows) * ndim), h2(h1.size());
                        EVENEP_CUDA_CHECK(cudaMemcpy(h1.data(), y, h1.size() * 2, cudaMemcpyDeviceToHost));
                        EVENEP_CUDA_CHECK(cudaMemcpy(h2.data(), into_y2 ? y2 : y, h2.size() * 2, cudaMemcpyDeviceToHost));
                        const bool same = !into_y2 || !have_fixed || h1 == h2;
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
                        check = fmt::format("{}{:.1e}", into_y2 && have_fixed ? (same ? "=" : "DIFF ") : "", max_rel);
                        EVENEP_CHECK_KIND(ErrorKind::kRuntime, same && max_rel < 1e-2, "bench gemm: ", d.name, " ",
                                          p.name, " ", op_name, ": schedules differ or sampled error ", max_rel);
                    }
                    const std::string sch_name = var.name;
                    const double model_us = predict_us(d.cu, p.in, p.out, op_name, grid_wgmma);
                    fmt::print("{:<20} {:<8} {:<6} {:<17} {:>8} {:>10.1f} {:>9.1f} {:>9.1f} {:>10}\n", d.name, p.name,
                               op_name, sch_name, rows, med_us, tflops, var.kernel == cuda::GemmKernel::kMmaSync ? 0.0 : model_us,
                               check);
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
                                           {"max_rel_err", max_rel},
                                           {"kernel", var.kernel == cuda::GemmKernel::kMmaSync ? "mma" : "wgmma"},
                                           {"model_us", model_us}});
                }
            }
        }
    }
    cudaFree(x), cudaFree(y), cudaFree(y2), cudaFree(w), cudaFree(dtable), cudaFree(dcu), cudaFree(ws), cudaFree(grads),
        cudaFree(dgtable), cudaFree(dyw);
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

// Least-squares line y = a + b x.
std::pair<double, double> fit_line(const std::vector<double>& xs, const std::vector<double>& ys) {
    const double n = static_cast<double>(xs.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < xs.size(); ++i) sx += xs[i], sy += ys[i], sxx += xs[i] * xs[i], sxy += xs[i] * ys[i];
    const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    return {(sy - b * sx) / n, b};
}

// `evenep bench gemm --calibrate`: times the Hopper kernel on problems whose tiles all cost the same and give every
// SM exactly 16 and then 48 tiles, for several k-block counts; the difference of the two times over 32 is the
// time one SM spends per tile, free of the call's fixed costs (launch, scheduler, first and last wave). It is
// fitted as c_tile + c_kblock * k-blocks. Forward: in = 64 kb, out = 2048, 1024 rows per group (8 x 8 tiles per
// group, as at the MoonEP point where ~700 rows share an expert); wgrad: in = out = 1024 (32 tiles per group),
// 64 kb rows per group, fixed schedule (no group split).
void run_calibration(const GemmBenchOptions& o) {
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, cuda::grouped_gemm_has_wgmma(),
                      "bench gemm --calibrate: the cost model belongs to the Hopper kernel (compute capability 9.0)");
    cudaDeviceProp prop{};
    EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const int small = 16, big = 48;  // tiles per SM of the two calls
    auto time_us = [&](const std::function<void()>& call) { return median_call_us(call, o.warmup, std::max(o.iters, 5)); };
    nlohmann::json points = nlohmann::json::array();
    fmt::print("{:<6} {:>4} {:>8} {:>10} {:>12}\n", "op", "kb", "groups", "call us", "us per tile");  // call: 48/SM

    // Forward.
    const std::vector<int> fwd_kb = {2, 4, 8, 16, 32, 64, 112};
    const int out = 2048, rows_per_group = 1024, Gf = sms * big / 64;  // 64 tiles per group
    const int max_in = 64 * fwd_kb.back();
    uint16_t *x = nullptr, *y = nullptr, *w = nullptr;
    device_alloc(&x, static_cast<size_t>(Gf) * rows_per_group * max_in * 2);
    device_alloc(&y, static_cast<size_t>(Gf) * rows_per_group * out * 2);
    device_alloc(&w, static_cast<size_t>(Gf) * max_in * out * 2);
    cuda::fill_random_bf16(x, static_cast<size_t>(Gf) * rows_per_group * max_in, 1, 1.f, nullptr);
    cuda::fill_random_bf16(w, static_cast<size_t>(Gf) * max_in * out, 2, 1.f / 32, nullptr);
    std::vector<int32_t> cu(Gf);
    for (int g = 0; g < Gf; ++g) cu[g] = (g + 1) * rows_per_group;
    int32_t* dcu = nullptr;
    const void** dtab = nullptr;
    void* ws = nullptr;
    device_alloc(&dcu, sizeof(int32_t) * Gf);
    device_alloc(&dtab, sizeof(void*) * Gf);
    device_alloc(&ws, cuda::grouped_gemm_workspace_bytes(Gf));
    EVENEP_CUDA_CHECK(cudaMemcpy(dcu, cu.data(), sizeof(int32_t) * Gf, cudaMemcpyHostToDevice));
    std::vector<double> fx, fy;
    for (int kb : fwd_kb) {
        const int in = 64 * kb;
        std::vector<const void*> tab(Gf);
        for (int g = 0; g < Gf; ++g) tab[g] = w + static_cast<size_t>(g) * in * out;
        EVENEP_CUDA_CHECK(cudaMemcpy(dtab, tab.data(), sizeof(void*) * Gf, cudaMemcpyHostToDevice));
        cuda::GroupedGemmArgs a;
        a.x = x, a.cu_seqlens = dcu, a.weights = reinterpret_cast<const uint16_t* const*>(dtab), a.y = y;
        a.num_groups = Gf, a.in_dim = in, a.out_dim = out, a.op = cuda::GemmOp::kForward;
        a.schedule = cuda::GemmSchedule::kFixed, a.kernel = cuda::GemmKernel::kWgmma, a.workspace = ws;
        const double us = time_us([&] { cuda::grouped_gemm(a, nullptr); });
        a.num_groups = sms * small / 64;
        const double us_small = time_us([&] { cuda::grouped_gemm(a, nullptr); });
        const double per = (us - us_small) / (big - small);
        fx.push_back(kb), fy.push_back(per);
        fmt::print("{:<6} {:>4} {:>8} {:>10.1f} {:>12.3f}\n", "fwd", kb, Gf, us, per);
        points.push_back({{"op", "fwd"}, {"kblocks", kb}, {"call_us", us}, {"tile_us", per}});
    }
    cudaFree(x), cudaFree(y), cudaFree(w), cudaFree(dcu), cudaFree(dtab), cudaFree(ws);

    // Wgrad.
    const std::vector<int> wg_kb = {1, 2, 4, 8, 16, 32, 64};
    const int wdim = 1024, Gw = sms * big / 32;  // 32 tiles per group
    const int max_rows = 64 * wg_kb.back();
    uint16_t *wx = nullptr, *wdy = nullptr;
    float* grads = nullptr;
    device_alloc(&wx, static_cast<size_t>(Gw) * max_rows * wdim * 2);
    device_alloc(&wdy, static_cast<size_t>(Gw) * max_rows * wdim * 2);
    device_alloc(&grads, static_cast<size_t>(Gw) * wdim * wdim * 4);
    cuda::fill_random_bf16(wx, static_cast<size_t>(Gw) * max_rows * wdim, 3, 1.f, nullptr);
    cuda::fill_random_bf16(wdy, static_cast<size_t>(Gw) * max_rows * wdim, 4, 1.f / 32, nullptr);
    EVENEP_CUDA_CHECK(cudaMemset(grads, 0, static_cast<size_t>(Gw) * wdim * wdim * 4));
    std::vector<float*> gtab(Gw);
    for (int g = 0; g < Gw; ++g) gtab[g] = grads + static_cast<size_t>(g) * wdim * wdim;
    float** dgtab = nullptr;
    device_alloc(&dgtab, sizeof(float*) * Gw);
    device_alloc(&dcu, sizeof(int32_t) * Gw);
    device_alloc(&ws, cuda::grouped_gemm_workspace_bytes(Gw));
    EVENEP_CUDA_CHECK(cudaMemcpy(dgtab, gtab.data(), sizeof(float*) * Gw, cudaMemcpyHostToDevice));
    std::vector<double> wx_, wy_;
    for (int kb : wg_kb) {
        std::vector<int32_t> wcu(Gw);
        for (int g = 0; g < Gw; ++g) wcu[g] = (g + 1) * 64 * kb;
        EVENEP_CUDA_CHECK(cudaMemcpy(dcu, wcu.data(), sizeof(int32_t) * Gw, cudaMemcpyHostToDevice));
        cuda::GroupedWgradArgs a;
        a.x = wx, a.dy = wdy, a.cu_seqlens = dcu, a.grads = dgtab, a.num_groups = Gw, a.in_dim = wdim,
        a.out_dim = wdim, a.schedule = cuda::GemmSchedule::kFixed, a.kernel = cuda::GemmKernel::kWgmma, a.workspace = ws;
        const double us = time_us([&] { cuda::grouped_gemm_wgrad(a, nullptr); });
        a.num_groups = sms * small / 32;
        const double us_small = time_us([&] { cuda::grouped_gemm_wgrad(a, nullptr); });
        const double per = (us - us_small) / (big - small);
        wx_.push_back(kb), wy_.push_back(per);
        fmt::print("{:<6} {:>4} {:>8} {:>10.1f} {:>12.3f}\n", "wgrad", kb, Gw, us, per);
        points.push_back({{"op", "wgrad"}, {"kblocks", kb}, {"call_us", us}, {"tile_us", per}});
    }
    cudaFree(wx), cudaFree(wdy), cudaFree(grads), cudaFree(dgtab), cudaFree(dcu), cudaFree(ws);
    const auto [ft, fk] = fit_line(fx, fy);
    const auto [wt, wk] = fit_line(wx_, wy_);
    double fres = 0, wres = 0;
    for (size_t i = 0; i < fx.size(); ++i) fres = std::max(fres, std::fabs(ft + fk * fx[i] - fy[i]) / fy[i]);
    for (size_t i = 0; i < wx_.size(); ++i) wres = std::max(wres, std::fabs(wt + wk * wx_[i] - wy_[i]) / wy_[i]);
    fmt::print("fit forward: c_tile {:.3f} us + c_kblock {:.4f} us x kb (max residual {:.1f}%)\n", ft, fk, 100 * fres);
    fmt::print("fit wgrad:   c_tile {:.3f} us + c_kblock {:.4f} us x kb (max residual {:.1f}%)\n", wt, wk, 100 * wres);
    const float split = cuda::grouped_gemm_cost_model().split_fraction;
    if (!o.write_model.empty()) {
        std::ofstream f(o.write_model);
        EVENEP_CHECK(f.good(), "bench gemm: cannot write --write-model ", o.write_model);
        f << "// Cost model of the Hopper grouped GEMM's scheduler (src/cuda/kernels/grouped_gemm_sm90.cu): the time one "
             "SM spends\n// on a 128 x 256 output tile is c_tile + c_kblock * (k-blocks of 64). GENERATED by `evenep "
             "bench gemm --calibrate\n// --write-model <this file>` (docs/benchmarks.md, \"Grouped GEMM cost "
             "model\"); do not edit by hand.\n"
          << fmt::format("// Device: {} ({} SMs). Max fit residual: forward {:.1f}%, wgrad {:.1f}%.\n", prop.name, sms,
                         100 * fres, 100 * wres)
          << fmt::format("constexpr float kCostKBlockUs = {:.5f}f;\n", fk)
          << fmt::format("constexpr float kCostKBlockWgradUs = {:.5f}f;\n", wk)
          << fmt::format("constexpr float kCostTileUs = {:.4f}f;\n", std::max(ft, 0.0))
          << fmt::format("constexpr float kCostTileWgradUs = {:.4f}f;\n", std::max(wt, 0.0))
          << "// A wgrad unit may cost at most this fraction of one SM's share of the whole GEMM before its group is "
             "split.\n"
          << fmt::format("constexpr float kSplitFraction = {:.3f}f;\n", split)
          << fmt::format("constexpr const char* kCostModelSource = \"calibrated on {} by evenep bench gemm "
                         "--calibrate\";\n",
                         prop.name);
        fmt::print("wrote {}\n", o.write_model);
    }
    if (!o.json_file.empty()) {
        std::ofstream f(o.json_file);
        EVENEP_CHECK(f.good(), "bench gemm: cannot write --json ", o.json_file);
        f << nlohmann::json{{"device", prop.name},
                            {"points", points},
                            {"fwd", {{"c_tile", ft}, {"c_kblock", fk}, {"max_residual", fres}}},
                            {"wgrad", {{"c_tile", wt}, {"c_kblock", wk}, {"max_residual", wres}}}}
                 .dump(1)
          << "\n";
    }
}

#endif

}  // namespace

void register_bench_gemm(CLI::App& bench) {
    auto o = std::make_shared<GemmBenchOptions>();
    CLI::App* cmd = bench.add_subcommand("gemm", "GPU grouped GEMM of the expert FFN (fixed vs load-aware schedule)");
    add_int(*cmd, "--R", o->R, "ranks (for the planner's row counts)", 1, kMaxRanks);
    add_int(*cmd, "--E", o->E, "routed experts", 1, kMaxExperts);
    add_int(*cmd, "--K", o->K, "top-k", 1, 32);
    add_int(*cmd, "--S", o->S, "tokens per rank", 1, std::numeric_limits<int>::max());
    add_int(*cmd, "--H", o->H, "hidden size", 1, kMaxHidden);
    add_int(*cmd, "--ffn-hidden", o->ffn_hidden, "expert intermediate size H'", 1, kMaxHidden);
    add_int(*cmd, "--tp", o->tp, "token padding", 1, kMaxTokenPad);
    add_reals(*cmd, "--maxvio", o->maxvios, "target maxvio values (planner rows of rank 0)", 0,
              std::numeric_limits<double>::infinity());
    add_real(*cmd, "--zipf", o->zipf, "Zipf exponent of the extra split (<= 0: none)", -1000, 1000)
        ->capture_default_str();
    add_u64(*cmd, "--seed", o->seed, "routing and data seed");
    cmd->add_option("--ops", o->ops, "any of fwd, dgrad, wgrad (dW += x^T dy into fp32), wgrad_set (dW = x^T dy, no read); wgrad --check: 8 sampled elements")
        ->capture_default_str();
    add_int(*cmd, "--warmup", o->warmup, "untimed runs", 0, 1000000);
    add_int(*cmd, "--iters", o->iters, "timed runs (median reported)", 1, 1000000);
    cmd->add_flag("--check", o->check, "compare schedules bitwise and sample 16 elements against the host");
    add_output_file(*cmd, "--json", o->json_file, "write all rows as JSON");
    add_output_file(*cmd, "--offsets-json", o->offsets_file,
                    "write each distribution's cu_seqlens (for gemm_anchor.py)");
    cmd->add_option("--kernels", o->kernels,
                    "any of wgmma (Hopper kernel, fixed and load-aware schedules), mma (portable kernel)")
        ->capture_default_str();
    cmd->add_flag("--calibrate", o->calibrate,
                  "fit the scheduler's cost model (us per tile = c_tile + c_kblock * k-blocks) on this GPU");
    cmd->add_option("--write-model", o->write_model,
                    "with --calibrate: write the fitted model as a C++ include (src/cuda/kernels/gemm_cost_model.inc)");
    cmd->callback([o]() {
        for (const std::string& op : o->ops)
            EVENEP_CHECK(op == "fwd" || op == "dgrad" || op == "wgrad" || op == "wgrad_set", "bench gemm: --ops entry '",
                         op, "' must be fwd, dgrad, wgrad or wgrad_set");
        for (const std::string& k : o->kernels)
            EVENEP_CHECK(k == "wgmma" || k == "mma", "bench gemm: --kernels entry '", k, "' must be wgmma or mma");
        require_cuda_device("bench gemm");
#if defined(EVENEP_HAVE_CUDA)
        if (o->calibrate)
            run_calibration(*o);
        else
            run_gemm_bench(*o);
#else
        (void)make_distributions;
        EVENEP_CHECK(false, "bench gemm needs a CUDA build (configure with EVENEP_CUDA=ON on a machine with nvcc)");
#endif
    });
}

}  // namespace evenep::cli
