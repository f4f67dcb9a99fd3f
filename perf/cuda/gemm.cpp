// The grouped GEMM benchmark and the cost-model calibration (perf/cuda/gemm.hpp).
#include "perf/cuda/gemm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "evenep/config.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "perf/cuda/device_buf.hpp"
#include "perf/cuda/timing.hpp"

namespace evenep::perf {
namespace {

float host_bf16(uint16_t b) { return bf16_to_float(Bf16{b}); }

std::string format_g(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

std::string format_e1(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1e", v);
    return buf;
}

// Median (element iters/2 of the sorted times) over `iters` CUDA-event-timed calls on the default stream after
// `warmup` untimed ones, each waited for before the next, in µs.
double median_call_us(const std::function<void()>& call, int warmup, int iters) {
    TimingOptions o;
    o.warmup = warmup;
    o.iters = std::max(iters, 1);
    o.sync_each = true;
    return time_op(call, nullptr, o).p50_us;
}

struct Variant {
    std::string name;
    cuda::GemmKernel kernel;
    cuda::GemmSchedule schedule;
    cuda::Fp8Mainloop fp8_mainloop = cuda::Fp8Mainloop::kCutlass;  // the fp8 ops' block-scaled kernel
    bool fp8_scaled = true;                                        // false: CUTLASS's unscaled FP8 anchor
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
double check_wgrad(
    const cuda::GroupedWgradArgs& wa, const std::vector<int32_t>& cu, int in, int out, float* grads, uint64_t seed) {
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

// 16 sampled elements of the call's output (`h`, [rows, ndim] on the host) against a host dot product; returns the
// largest error relative to the sum of magnitudes.
double sample_error(const std::vector<uint16_t>& h,
                    const std::vector<int32_t>& cu,
                    const uint16_t* x,
                    const std::vector<const uint16_t*>& table,
                    cuda::GemmOp op,
                    int out_dim,
                    int kdim,
                    int ndim,
                    uint64_t seed) {
    const int64_t rows = cu.back();
    std::mt19937_64 rng(seed + rows);
    double max_rel = 0;
    for (int s = 0; s < 16; ++s) {
        const int64_t r = static_cast<int64_t>(rng() % rows);
        const int n = static_cast<int>(rng() % ndim);
        const int g = static_cast<int>(std::upper_bound(cu.begin(), cu.end(), r) - cu.begin());
        std::vector<uint16_t> xr(kdim), wc(kdim);
        EVENEP_CUDA_CHECK(cudaMemcpy(xr.data(), x + r * kdim, kdim * 2, cudaMemcpyDeviceToHost));
        if (op == cuda::GemmOp::kForward)  // column n of W_g [in][out]
            EVENEP_CUDA_CHECK(cudaMemcpy2D(wc.data(), 2, table[g] + n, static_cast<size_t>(out_dim) * 2, 2, kdim,
                                           cudaMemcpyDeviceToHost));
        else  // row n of W_g [in][out]
            EVENEP_CUDA_CHECK(
                cudaMemcpy(wc.data(), table[g] + static_cast<size_t>(n) * out_dim, kdim * 2, cudaMemcpyDeviceToHost));
        double ref = 0, mag = 0;
        for (int k = 0; k < kdim; ++k) {
            ref += static_cast<double>(host_bf16(xr[k])) * host_bf16(wc[k]);
            mag += std::fabs(static_cast<double>(host_bf16(xr[k])) * host_bf16(wc[k]));
        }
        const double got = host_bf16(h[static_cast<size_t>(r) * ndim + n]);
        max_rel = std::max(max_rel, std::fabs(got - ref) / std::max(mag, 1e-30));
    }
    return max_rel;
}

// Least-squares line y = a + b x.
std::pair<double, double> fit_line(const std::vector<double>& xs, const std::vector<double>& ys) {
    const double n = static_cast<double>(xs.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < xs.size(); ++i) sx += xs[i], sy += ys[i], sxx += xs[i] * xs[i], sxy += xs[i] * ys[i];
    const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    return {(sy - b * sx) / n, b};
}

// The largest relative residual of the fitted line a + b x over the points.
double max_residual(const std::vector<double>& xs, const std::vector<double>& ys, double a, double b) {
    double res = 0;
    for (size_t i = 0; i < xs.size(); ++i) res = std::max(res, std::fabs(a + b * xs[i] - ys[i]) / ys[i]);
    return res;
}

}  // namespace

std::vector<GemmDistribution> gemm_distributions(const GemmBenchConfig& o) {
    const Config cfg{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .B = -1, .tp = o.tp};
    cfg.validate();
    const int G = cfg.num_groups();
    std::vector<GemmDistribution> out;
    for (double mv : o.maxvios) {
        const RoutingSpec spec{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .seed = o.seed};
        const Routing routing = make_target_maxvio(spec, mv);
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
        out.push_back({"planner_maxvio" + format_g(mv),
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
        out.push_back({"zipf" + format_g(o.zipf), cu});
    }
    return out;
}

std::vector<GemmBenchRow> bench_gemm(const GemmBenchConfig& o,
                                     const std::vector<GemmDistribution>& dists,
                                     const std::function<void(const GemmBenchInfo&)>& on_start,
                                     const std::function<void(const GemmBenchRow&)>& on_row) {
    EVENEP_CHECK(!dists.empty(), "bench gemm: no row distribution (give --maxvio values or --zipf > 0)");
    const int G = static_cast<int>(dists.front().cu.size());
    int64_t max_rows = 0;
    for (const auto& d : dists) max_rows = std::max<int64_t>(max_rows, d.cu.back());
    const int wide = std::max(o.H, o.ffn_hidden);
    const size_t welems = static_cast<size_t>(o.H) * o.ffn_hidden;

    cudaDeviceProp prop{};
    EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const cuda::GemmCostModel model = cuda::grouped_gemm_cost_model();
    GemmBenchInfo info;
    info.device = prop.name;
    info.sms = prop.multiProcessorCount;
    info.G = G;
    info.grid_fwd = cuda::grouped_gemm_grid_blocks(cuda::GemmOp::kForward);
    info.grid_dgrad = cuda::grouped_gemm_grid_blocks(cuda::GemmOp::kDgrad);
    info.model_source = model.source;
    info.c_tile = model.c_tile, info.c_tile_wgrad = model.c_tile_wgrad;
    info.c_kblock = model.c_kblock, info.c_kblock_wgrad = model.c_kblock_wgrad;

    const size_t xy_elems = static_cast<size_t>(max_rows) * wide;
    // dgrad_f32 writes fp32 rows: y and y2 twice the bf16 size.
    const bool with_f32 = std::find(o.ops.begin(), o.ops.end(), "dgrad_f32") != o.ops.end();
    DeviceArray<uint16_t> x(xy_elems), y(xy_elems * (with_f32 ? 2 : 1)), y2(xy_elems * (with_f32 ? 2 : 1));
    DeviceArray<uint16_t> w(welems * G);
    cuda::fill_random_bf16(x.get(), xy_elems, o.seed, 1.f, nullptr);
    cuda::fill_random_bf16(w.get(), welems * G, o.seed + 1, 1.f / 32, nullptr);
    DeviceArray<uint16_t> dyw(xy_elems);  // dY of wgrad (its own buffer: the forward runs overwrite y and y2)
    cuda::fill_random_bf16(dyw.get(), xy_elems, o.seed + 2, 1.f / 32, nullptr);
    // wgrad: fp32 gradients [G][in * out] (accumulated over all runs; values stay finite).
    const bool with_wgrad = std::any_of(o.ops.begin(), o.ops.end(), [](const std::string& op) {
        return op.rfind("wgrad", 0) == 0 || op == "fp8_wgrad";
    });
    DeviceArray<float> grads(with_wgrad ? welems * G : 1);
    DeviceArray<float*> dgtable(G);
    if (with_wgrad) {
        std::vector<float*> gt(G);
        for (int g = 0; g < G; ++g) gt[g] = grads.get() + welems * g;
        EVENEP_CUDA_CHECK(cudaMemcpy(dgtable.get(), gt.data(), sizeof(float*) * G, cudaMemcpyHostToDevice));
    }
    std::vector<const uint16_t*> table(G);
    for (int g = 0; g < G; ++g) table[g] = w.get() + welems * g;
    DeviceArray<const uint16_t*> dtable(G);
    DeviceArray<int32_t> dcu(G);
    DeviceArray<char> ws(cuda::grouped_gemm_workspace_bytes(G));
    EVENEP_CUDA_CHECK(cudaMemcpy(dtable.get(), table.data(), sizeof(void*) * G, cudaMemcpyHostToDevice));

    std::vector<Variant> variants;
    bool have_fixed = false;
    for (const std::string& k : o.kernels) {
        if (k == "wgmma" && cuda::grouped_gemm_has_wgmma()) {
            variants.push_back({"wgmma/fixed", cuda::GemmKernel::kWgmma, cuda::GemmSchedule::kFixed});
            variants.push_back({"wgmma/load_aware", cuda::GemmKernel::kWgmma, cuda::GemmSchedule::kLoadAware});
            have_fixed = true;
        } else if (k == "mma") {
            variants.push_back({"mma/load_aware", cuda::GemmKernel::kMmaSync, cuda::GemmSchedule::kLoadAware});
        } else if (k == "cutlass" && cuda::grouped_gemm_has_cutlass()) {
            // fixed first: load_aware's y2 is compared with its y bitwise (same tiles, only the order differs).
            variants.push_back({"cutlass/fixed", cuda::GemmKernel::kCutlass, cuda::GemmSchedule::kFixed});
            variants.push_back({"cutlass/load_aware", cuda::GemmKernel::kCutlass, cuda::GemmSchedule::kLoadAware});
            have_fixed = true;
        } else if (k == "cutlass_pingpong" && cuda::grouped_gemm_has_candidates()) {
            variants.push_back(
                {"cutlass_pingpong/load_aware", cuda::GemmKernel::kCutlassPingpong, cuda::GemmSchedule::kLoadAware});
        }
    }
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, !variants.empty(), "bench gemm: no kernel to run on this device");
    // FP8 ops (fp8_fwd, fp8_dgrad): CUTLASS's block-scaled FP8 grouped GEMM and the candidates below, whatever
    // --kernels says; e4m3 operands from fill_random_e4m3, every scale 2^-4 (timing only: no
    // --check; grouped_gemm_fp8_test checks them).
    const bool with_fp8 =
        std::any_of(o.ops.begin(), o.ops.end(), [](const std::string& op) { return op.rfind("fp8_", 0) == 0; });
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, !with_fp8 || cuda::grouped_gemm_has_cutlass(),
                      "bench gemm: the fp8 ops need the CUTLASS kernels (EVENEP_CUTLASS) on a Hopper device");
    // The block-scaled kernel with CUTLASS's consumer loop and with EvenEP's (GroupedGemmFp8Args::mainloop kCutlass,
    // kOverlapped: kAuto runs one of the two, by the output's width), then the tuning candidates (EVENEP_CUTLASS_
    // CANDIDATES, left out where not built): the 128 x 256 tile (kOverlappedWide) and CUTLASS's unscaled FP8 grouped
    // GEMM (the anchor).
    const auto la = cuda::GemmSchedule::kLoadAware;
    std::vector<Variant> fp8_variants = {
        {"cutlass_fp8/load_aware", cuda::GemmKernel::kCutlass, la, cuda::Fp8Mainloop::kCutlass},
        {"cutlass_fp8_overlap/load_aware", cuda::GemmKernel::kCutlass, la, cuda::Fp8Mainloop::kOverlapped}};
    if (cuda::grouped_gemm_has_candidates()) {
        fp8_variants.push_back(
            {"cutlass_fp8_wide/load_aware", cuda::GemmKernel::kCutlass, la, cuda::Fp8Mainloop::kOverlappedWide});
        fp8_variants.push_back(
            {"cutlass_fp8_unscaled/load_aware", cuda::GemmKernel::kCutlass, la, cuda::Fp8Mainloop::kCutlass, false});
    }
    const size_t fp8_x = with_fp8 ? xy_elems : 1, fp8_w = with_fp8 ? welems * G : 1;
    DeviceArray<uint8_t> x8(fp8_x), w8(fp8_w);
    DeviceArray<float> x8_scales(fp8_x / 128 + 1), w8_scales(fp8_w / (128 * 128) + 1);
    DeviceArray<const uint8_t*> d8table(G);
    DeviceArray<const float*> d8scales(G);
    // fp8_wgrad (a tuning candidate): the wgrad cols casts of x and dy ([dim][ld] random codes, every scale 2^-4).
    const std::vector<Variant> wgrad8_variants = {
        {"cutlass_fp8/load_aware", cuda::GemmKernel::kCutlass, cuda::GemmSchedule::kLoadAware}};
    const bool with_fp8_wgrad = std::find(o.ops.begin(), o.ops.end(), "fp8_wgrad") != o.ops.end();
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, !with_fp8_wgrad || cuda::grouped_gemm_has_candidates(),
                      "bench gemm: fp8_wgrad needs the CUTLASS tuning candidates (EVENEP_CUTLASS_CANDIDATES)");
    const int64_t cols_ld = fp8_cols_ld(max_rows), cols_sr = fp8_cols_scale_rows(max_rows, G);
    const size_t cols_n = with_fp8_wgrad ? static_cast<size_t>(wide) * cols_ld : 1;
    const size_t cols_s = with_fp8_wgrad ? static_cast<size_t>(wide) * cols_sr : 1;
    DeviceArray<uint8_t> xc8(cols_n), dyc8(cols_n);
    DeviceArray<float> xc8_scales(cols_s), dyc8_scales(cols_s);
    if (with_fp8_wgrad) {
        cuda::fill_random_e4m3(xc8.get(), cols_n, o.seed + 5, 448.f, nullptr);
        cuda::fill_random_e4m3(dyc8.get(), cols_n, o.seed + 6, 448.f, nullptr);
        const std::vector<float> sc(cols_s, 1.f / 16);
        EVENEP_CUDA_CHECK(cudaMemcpy(xc8_scales.get(), sc.data(), sizeof(float) * cols_s, cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(dyc8_scales.get(), sc.data(), sizeof(float) * cols_s, cudaMemcpyHostToDevice));
    }
    if (with_fp8) {
        cuda::fill_random_e4m3(x8.get(), fp8_x, o.seed + 3, 448.f, nullptr);
        cuda::fill_random_e4m3(w8.get(), fp8_w, o.seed + 4, 448.f, nullptr);
        const std::vector<float> xs(x8_scales.size(), 1.f / 16), wsc(w8_scales.size(), 1.f / 16);
        EVENEP_CUDA_CHECK(cudaMemcpy(x8_scales.get(), xs.data(), sizeof(float) * xs.size(), cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(w8_scales.get(), wsc.data(), sizeof(float) * wsc.size(), cudaMemcpyHostToDevice));
        std::vector<const uint8_t*> t8(G);
        std::vector<const float*> s8(G);
        for (int g = 0; g < G; ++g) {
            t8[g] = w8.get() + welems * g;
            s8[g] = w8_scales.get() + welems / (128 * 128) * g;
        }
        EVENEP_CUDA_CHECK(cudaMemcpy(d8table.get(), t8.data(), sizeof(void*) * G, cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(d8scales.get(), s8.data(), sizeof(void*) * G, cudaMemcpyHostToDevice));
    }
    if (on_start) on_start(info);
    std::vector<GemmBenchRow> rows_out;
    bool warmed = false;  // the GPU is warmed once, before the first timed call
    for (const GemmDistribution& d : dists) {
        EVENEP_CUDA_CHECK(cudaMemcpy(dcu.get(), d.cu.data(), sizeof(int32_t) * G, cudaMemcpyHostToDevice));
        const int64_t rows = d.cu.back();
        struct Proj {
            const char* name;
            int in, out;
        };
        for (const Proj& p : {Proj{"gate_up", o.H, o.ffn_hidden}, Proj{"down", o.ffn_hidden, o.H}}) {
            for (const std::string& op_name : o.ops) {
                const bool fp8 = op_name.rfind("fp8_", 0) == 0;
                const bool f32 = op_name == "dgrad_f32";
                const cuda::GemmOp op =
                    op_name == "dgrad" || op_name == "fp8_dgrad" || f32 ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
                const bool fp8_wgrad = op_name == "fp8_wgrad";
                const std::vector<Variant>& op_variants = fp8_wgrad ? wgrad8_variants : fp8 ? fp8_variants : variants;
                const int kdim = op == cuda::GemmOp::kForward ? p.in : p.out;
                const int ndim = op == cuda::GemmOp::kForward ? p.out : p.in;
                // Every variant's arguments and its --check first (in variant order), then the variants timed
                // interleaved (perf/cuda/timing.hpp) after one warm-up of the GPU before the first timed row.
                struct Call {
                    cuda::GroupedGemmArgs a;
                    cuda::GroupedWgradArgs wa;
                    cuda::GroupedGemmFp8Args fa;
                    cuda::GroupedWgradFp8Args fwa;
                    bool into_y2 = false;
                    double wgrad_err = -1;
                    double check_err = -1;  // forward/dgrad --check
                    std::string check;
                };
                const bool wgrad = op_name.rfind("wgrad", 0) == 0;
                std::vector<Call> calls(op_variants.size());
                std::vector<std::function<void()>> timed;
                for (size_t v = 0; v < op_variants.size(); ++v) {
                    const Variant& var = op_variants[v];
                    const cuda::GemmSchedule sch = var.schedule;
                    Call& c = calls[v];
                    // A kernel's fixed schedule writes y, its load_aware y2 (compared bitwise); the mma.sync and
                    // the CUTLASS ping-pong kernels (one schedule each here) write y (sampled only).
                    c.into_y2 = sch == cuda::GemmSchedule::kLoadAware && var.kernel != cuda::GemmKernel::kMmaSync &&
                                var.kernel != cuda::GemmKernel::kCutlassPingpong;
                    c.a.x = x.get(), c.a.cu_seqlens = dcu.get(), c.a.weights = dtable.get();
                    c.a.y = c.into_y2 ? y2.get() : y.get();
                    c.a.num_groups = G, c.a.in_dim = p.in, c.a.out_dim = p.out, c.a.op = op, c.a.schedule = sch;
                    c.a.kernel = var.kernel;
                    c.a.y_fp32 = f32;
                    c.a.workspace = ws.get();
                    c.a.rows_capacity = rows;  // the raster order's hint: this row set's buffer
                    c.wa.x = x.get(), c.wa.dy = dyw.get(), c.wa.cu_seqlens = dcu.get(), c.wa.grads = dgtable.get();
                    c.wa.num_groups = G, c.wa.in_dim = p.in, c.wa.out_dim = p.out, c.wa.schedule = sch;
                    c.wa.workspace = ws.get();
                    c.wa.kernel = var.kernel;
                    c.wa.accumulate = op_name != "wgrad_set";
                    c.fa.x = x8.get(), c.fa.x_scales = x8_scales.get(), c.fa.cu_seqlens = dcu.get();
                    c.fa.weights = d8table.get(), c.fa.weight_scales = d8scales.get(), c.fa.y = y.get();
                    c.fa.num_groups = G, c.fa.in_dim = p.in, c.fa.out_dim = p.out, c.fa.op = op, c.fa.schedule = sch;
                    c.fa.block_scaled = var.fp8_scaled;
                    c.fa.mainloop = var.fp8_mainloop;
                    c.fa.rows_capacity = rows;
                    c.fwa.x_cols = xc8.get(), c.fwa.x_col_scales = xc8_scales.get(), c.fwa.dy_cols = dyc8.get();
                    c.fwa.dy_col_scales = dyc8_scales.get(), c.fwa.cu_seqlens = dcu.get(), c.fwa.grads = dgtable.get();
                    c.fwa.num_groups = G, c.fwa.in_dim = p.in, c.fwa.out_dim = p.out, c.fwa.capacity = max_rows;
                    c.fwa.schedule = sch, c.fwa.workspace = ws.get();
                    c.fa.workspace = ws.get();
                    if (wgrad && o.check) c.wgrad_err = check_wgrad(c.wa, d.cu, p.in, p.out, grads.get(), o.seed);
                    if (o.check && !wgrad && !fp8 && !f32) {  // dgrad_f32: timing only (grouped_gemm_test)
                        // One call, then its output: the Hopper kernel's schedules share tiles and the order inside
                        // a tile, so load_aware's y2 must equal fixed's y (written just before) bitwise.
                        cuda::grouped_gemm(c.a, nullptr);
                        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
                        const std::vector<uint16_t> h1 = download(y.get(), static_cast<size_t>(rows) * ndim);
                        const std::vector<uint16_t> h2 =
                            c.into_y2 ? download(y2.get(), static_cast<size_t>(rows) * ndim) : h1;
                        const bool same = !c.into_y2 || !have_fixed || h1 == h2;
                        c.check_err = sample_error(h2, d.cu, x.get(), table, op, p.out, kdim, ndim, o.seed);
                        c.check = (c.into_y2 && have_fixed ? (same ? "=" : "DIFF ") : "") + format_e1(c.check_err);
                        EVENEP_CHECK_KIND(ErrorKind::kRuntime, same && c.check_err < 1e-2, "bench gemm: ", d.name, " ",
                                          p.name, " ", op_name, " ", var.name, ": schedules differ or sampled error ",
                                          c.check_err);
                    }
                    timed.push_back([&c, wgrad, fp8, fp8_wgrad] {
                        if (fp8_wgrad)
                            cuda::grouped_gemm_wgrad_fp8(c.fwa, nullptr);
                        else if (fp8)
                            cuda::grouped_gemm_fp8(c.fa, nullptr);
                        else if (wgrad)
                            cuda::grouped_gemm_wgrad(c.wa, nullptr);
                        else
                            cuda::grouped_gemm(c.a, nullptr);
                    });
                }
                if (!warmed) {
                    warm_gpu(timed.front(), nullptr, o.warm_seconds);
                    warmed = true;
                }
                const std::vector<Stats> stats = time_interleaved(timed, nullptr, o.warmup, std::max(o.iters, 1));
                for (size_t v = 0; v < op_variants.size(); ++v) {
                    const Variant& var = op_variants[v];
                    const Call& c = calls[v];
                    GemmBenchRow row;
                    row.dist = d.name, row.proj = p.name, row.op = op_name, row.schedule = var.name;
                    row.kernel = var.name.substr(0, var.name.find('/'));
                    row.rows = rows, row.in = p.in, row.out = p.out;
                    row.median_us = stats[v].p50_us;
                    row.tflops = 2.0 * rows * p.in * p.out / (row.median_us * 1e-6) / 1e12;
                    if (c.wgrad_err >= 0) {
                        row.check = format_e1(c.wgrad_err);
                        row.max_rel_err = c.wgrad_err;
                        EVENEP_CHECK_KIND(ErrorKind::kRuntime, c.wgrad_err < 1e-3, "bench gemm: ", d.name, " ", p.name,
                                          " wgrad ", var.name, ": sampled error ", c.wgrad_err);
                    }
                    if (c.check_err >= 0) row.max_rel_err = c.check_err, row.check = c.check;
                    row.model_us = fp8 ? 0.0 : predict_us(d.cu, p.in, p.out, op_name, info.sms);  // bf16 model
                    if (on_row) on_row(row);
                    rows_out.push_back(std::move(row));
                }
            }
        }
    }
    return rows_out;
}

GemmCalibration calibrate_gemm(int warmup,
                               int iters,
                               const std::function<void(const GemmCalibrationPoint&)>& on_point) {
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, cuda::grouped_gemm_has_wgmma(),
                      "bench gemm --calibrate: the cost model belongs to the Hopper kernel (compute capability 9.0)");
    cudaDeviceProp prop{};
    EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    GemmCalibration cal;
    cal.device = prop.name;
    cal.sms = prop.multiProcessorCount;
    const int sms = cal.sms;
    const int small = 16, big = 48;  // tiles per SM of the two calls
    auto time_us = [&](const std::function<void()>& call) { return median_call_us(call, warmup, std::max(iters, 5)); };
    auto add_point = [&](const char* op, int kb, int groups, double us, double per) {
        cal.points.push_back({op, kb, groups, us, per});
        if (on_point) on_point(cal.points.back());
    };

    // Forward: 64 tiles per group.
    const std::vector<int> fwd_kb = {2, 4, 8, 16, 32, 64, 112};
    std::vector<double> fx, fy;
    {
        const int out = 2048, rows_per_group = 1024, Gf = sms * big / 64;
        const int max_in = 64 * fwd_kb.back();
        DeviceArray<uint16_t> x(static_cast<size_t>(Gf) * rows_per_group * max_in);
        DeviceArray<uint16_t> y(static_cast<size_t>(Gf) * rows_per_group * out);
        DeviceArray<uint16_t> w(static_cast<size_t>(Gf) * max_in * out);
        cuda::fill_random_bf16(x.get(), x.size(), 1, 1.f, nullptr);
        cuda::fill_random_bf16(w.get(), w.size(), 2, 1.f / 32, nullptr);
        std::vector<int32_t> cu(Gf);
        for (int g = 0; g < Gf; ++g) cu[g] = (g + 1) * rows_per_group;
        DeviceArray<int32_t> dcu(Gf);
        DeviceArray<const uint16_t*> dtab(Gf);
        DeviceArray<char> ws(cuda::grouped_gemm_workspace_bytes(Gf));
        EVENEP_CUDA_CHECK(cudaMemcpy(dcu.get(), cu.data(), sizeof(int32_t) * Gf, cudaMemcpyHostToDevice));
        for (int kb : fwd_kb) {
            const int in = 64 * kb;
            std::vector<const uint16_t*> tab(Gf);
            for (int g = 0; g < Gf; ++g) tab[g] = w.get() + static_cast<size_t>(g) * in * out;
            EVENEP_CUDA_CHECK(cudaMemcpy(dtab.get(), tab.data(), sizeof(void*) * Gf, cudaMemcpyHostToDevice));
            cuda::GroupedGemmArgs a;
            a.x = x.get(), a.cu_seqlens = dcu.get(), a.weights = dtab.get(), a.y = y.get();
            a.num_groups = Gf, a.in_dim = in, a.out_dim = out, a.op = cuda::GemmOp::kForward;
            a.schedule = cuda::GemmSchedule::kFixed, a.kernel = cuda::GemmKernel::kWgmma, a.workspace = ws.get();
            const double us = time_us([&] { cuda::grouped_gemm(a, nullptr); });
            a.num_groups = sms * small / 64;
            const double us_small = time_us([&] { cuda::grouped_gemm(a, nullptr); });
            const double per = (us - us_small) / (big - small);
            fx.push_back(kb), fy.push_back(per);
            add_point("fwd", kb, Gf, us, per);
        }
    }

    // Wgrad: 32 tiles per group.
    const std::vector<int> wg_kb = {1, 2, 4, 8, 16, 32, 64};
    std::vector<double> wx, wy;
    {
        const int wdim = 1024, Gw = sms * big / 32;
        const int max_rows = 64 * wg_kb.back();
        DeviceArray<uint16_t> x(static_cast<size_t>(Gw) * max_rows * wdim);
        DeviceArray<uint16_t> dy(static_cast<size_t>(Gw) * max_rows * wdim);
        DeviceArray<float> grads(static_cast<size_t>(Gw) * wdim * wdim);
        cuda::fill_random_bf16(x.get(), x.size(), 3, 1.f, nullptr);
        cuda::fill_random_bf16(dy.get(), dy.size(), 4, 1.f / 32, nullptr);
        std::vector<float*> gtab(Gw);
        for (int g = 0; g < Gw; ++g) gtab[g] = grads.get() + static_cast<size_t>(g) * wdim * wdim;
        DeviceArray<float*> dgtab(Gw);
        DeviceArray<int32_t> dcu(Gw);
        DeviceArray<char> ws(cuda::grouped_gemm_workspace_bytes(Gw));
        EVENEP_CUDA_CHECK(cudaMemcpy(dgtab.get(), gtab.data(), sizeof(float*) * Gw, cudaMemcpyHostToDevice));
        for (int kb : wg_kb) {
            std::vector<int32_t> wcu(Gw);
            for (int g = 0; g < Gw; ++g) wcu[g] = (g + 1) * 64 * kb;
            EVENEP_CUDA_CHECK(cudaMemcpy(dcu.get(), wcu.data(), sizeof(int32_t) * Gw, cudaMemcpyHostToDevice));
            cuda::GroupedWgradArgs a;
            a.x = x.get(), a.dy = dy.get(), a.cu_seqlens = dcu.get(), a.grads = dgtab.get(), a.num_groups = Gw;
            a.in_dim = wdim, a.out_dim = wdim, a.schedule = cuda::GemmSchedule::kFixed;
            a.kernel = cuda::GemmKernel::kWgmma, a.workspace = ws.get();
            const double us = time_us([&] { cuda::grouped_gemm_wgrad(a, nullptr); });
            a.num_groups = sms * small / 32;
            const double us_small = time_us([&] { cuda::grouped_gemm_wgrad(a, nullptr); });
            const double per = (us - us_small) / (big - small);
            wx.push_back(kb), wy.push_back(per);
            add_point("wgrad", kb, Gw, us, per);
        }
    }
    std::tie(cal.fwd_c_tile, cal.fwd_c_kblock) = fit_line(fx, fy);
    std::tie(cal.wgrad_c_tile, cal.wgrad_c_kblock) = fit_line(wx, wy);
    cal.fwd_residual = max_residual(fx, fy, cal.fwd_c_tile, cal.fwd_c_kblock);
    cal.wgrad_residual = max_residual(wx, wy, cal.wgrad_c_tile, cal.wgrad_c_kblock);
    cal.split_fraction = cuda::grouped_gemm_cost_model().split_fraction;
    return cal;
}

}  // namespace evenep::perf
