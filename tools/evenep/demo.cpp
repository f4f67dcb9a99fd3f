// `evenep demo`: one MoE layer step (SwiGLU experts, forward + backward) on R virtual ranks through the EvenEP
// data path — CPU threads (evenep::cpu) or one GPU (evenep::cuda, demo_cuda.cpp) — checked against a dense
// single-rank fp32 reference. Prints the balance before/after planning, the copies, the bytes that cross rank
// boundaries (EvenEP vs conventional EP), the buffer sizes, the errors and the per-phase times (GPU: CUDA events).
// Exit code 0 when every check passes, 1 when one fails, 2 on bad input.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "demo_cuda.hpp"
#include "demo_fp8.hpp"
#include "evenep/buffer.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"
#include "evenep/plan.hpp"

namespace evenep::cli {
namespace {

struct DemoOptions {
    RoutingOptions routing;
    int H = 256;
    int ffn_hidden = 128;
    int threads = 2;
    int timeout_ms = 120000;
    bool plan_only = false;
    std::string backend = "auto";  // cpu | cuda | auto
    int warmup = 1;                // cuda: untimed steps before the reported one
    std::string json_file;
    std::string dump_dir;
    DataPrecision precision;  // --fp8, --ue8m0, --bf16-partials: the extra FP8 run (docs/fp8.md)
};

struct Check {
    std::string name;
    cpu::ErrorStats stats;
    double tol = 0;
    bool pass() const { return !stats.nonfinite && stats.rel() <= tol && std::isfinite(stats.rel()); }
};

double maxvio_of_plan(const Plan& plan) {
    double mx = 0, sum = 0;
    for (int64_t t : plan.expert_load) {
        mx = std::max(mx, static_cast<double>(t));
        sum += static_cast<double>(t);
    }
    return sum > 0 ? mx / (sum / plan.cfg.E) - 1 : 0.0;
}

nlohmann::json phase_json(const PhaseTraffic& p) {
    return {{"rows", p.rows},
            {"fp32_rows", p.fp32_rows},
            {"entries", p.entries},
            {"bytes", p.bytes},
            {"max_rank_bytes", p.max_rank_bytes()},
            {"send_bytes", p.send_bytes},
            {"recv_bytes", p.recv_bytes}};
}

struct PhaseRow {
    const char* name;
    const PhaseTraffic* evenep;
    const PhaseTraffic* conventional;
};

std::vector<PhaseRow> phase_rows(const TrafficReport& ev, const TrafficReport& conv) {
    return {{"histogram all-gather", &ev.gather, &conv.gather},
            {"dispatch (fwd)", &ev.dispatch, &conv.dispatch},
            {"combine (fwd)", &ev.combine, &conv.combine},
            {"combine_backward (bwd)", &ev.combine_backward, &conv.combine_backward},
            {"dispatch_backward (bwd)", &ev.dispatch_backward, &conv.dispatch_backward},
            {"prefetch_weight", &ev.prefetch, &conv.prefetch},
            {"reduce_grad", &ev.reduce_grad, &conv.reduce_grad}};
}

void write_npy_f32(const std::string& p, const std::vector<int64_t>& shape, const std::vector<float>& v) {
    write_npy(p, "<f4", shape, v.data(), v.size() * sizeof(float));
}

// [R, S, dim] float32 from per-rank bf16 rows (ranks with s_r < S padded with zeros).
std::vector<float> pad_bf16(const std::vector<std::vector<Bf16>>& v, int S, int dim) {
    std::vector<float> out(v.size() * static_cast<size_t>(S) * dim, 0.0f);
    for (size_t r = 0; r < v.size(); ++r)
        for (size_t i = 0; i < v[r].size(); ++i) out[r * S * dim + i] = bf16_to_float(v[r][i]);
    return out;
}

std::vector<float> pad_f32(const std::vector<std::vector<float>>& v, int S, int dim) {
    std::vector<float> out(v.size() * static_cast<size_t>(S) * dim, 0.0f);
    for (size_t r = 0; r < v.size(); ++r) std::copy(v[r].begin(), v[r].end(), out.begin() + r * S * dim);
    return out;
}

// Into the temporary folder of `dir` (published by dir.close()).
void dump(OutputDir& dir, const cpu::MoeProblem& p, const cpu::MoeResult& ep) {
    const Config& c = p.cfg.cfg;
    const int R = c.R, S = c.S, K = c.K, E = c.E, H = p.cfg.H, F = p.cfg.ffn_hidden;
    std::vector<int32_t> idx(static_cast<size_t>(R) * S * K, -1);
    for (int r = 0; r < R; ++r) std::copy(p.topk_idx[r].begin(), p.topk_idx[r].end(), idx.begin() + r * S * K);
    write_npy(dir.file("topk_idx.npy"), "<i4", {R, S, K}, idx.data(), idx.size() * 4);
    write_npy_f32(dir.file("x.npy"), {R, S, H}, pad_bf16(p.x, S, H));
    write_npy_f32(dir.file("topk_w.npy"), {R, S, K}, pad_f32(p.topk_w, S, K));
    auto widen = [](const std::vector<Bf16>& w) {
        std::vector<float> f(w.size());
        for (size_t i = 0; i < w.size(); ++i) f[i] = bf16_to_float(w[i]);
        return f;
    };
    write_npy_f32(dir.file("w_gate.npy"), {E, H, F}, widen(p.w_gate));
    write_npy_f32(dir.file("w_up.npy"), {E, H, F}, widen(p.w_up));
    write_npy_f32(dir.file("w_down.npy"), {E, F, H}, widen(p.w_down));
    write_npy_f32(dir.file("out.npy"), {R, S, H}, pad_bf16(ep.out, S, H));
    write_npy_f32(dir.file("grad_out.npy"), {R, S, H}, pad_bf16(p.grad_out, S, H));
    write_npy_f32(dir.file("grad_x.npy"), {R, S, H}, pad_bf16(ep.grad_x, S, H));
    write_npy_f32(dir.file("grad_topk_w.npy"), {R, S, K}, pad_f32(ep.grad_topk_w, S, K));
}

// Memory and time of the run past the routing (resolve_routing adds the generator's part). Model of the parts
// alive at the peak: every rank holds its buffers (buffer_sizes; ~76% of them touched), its own plan of the whole
// group (~73 B per (rank, expert) pair: R ranks x R*E, so ~R^3 when E grows with R) and expert activations of
// ~4.5*H + 24*H' bytes per receive row (NvS rows, which grow with --tp); tokens and weights exist in bf16, fp32
// and the dense reference. Time (CPU seconds over all threads): ~1.3 ns per byte of buffers and activations
// touched, every rank's plan of the whole group (R plans), and 36*H*H' flops per entry (forward + backward,
// EvenEP and the dense reference) at ~12 GFLOP/s. Constants fitted on R = 8 ... 64 runs (docs/estimates.md).
// --plan-only: one plan and dst. On the GPU the ranks' buffers live in device memory (the device reports its own
// limit) and only the dense reference runs on the host.
Estimate demo_estimate(const DemoOptions& opt, const BufferConfig& bc, bool on_gpu) {
    const Config& c = bc.cfg;
    const BufferSizes z = buffer_sizes(bc);
    const double R = c.R, pairs = static_cast<double>(c.R) * c.E, entries = R * c.S * c.K;
    Estimate e;
    e.add_bytes(12 * entries + 64 * pairs, fmt::format("plan and dst of R*S*K = {:.3g} entries", entries));
    if (opt.plan_only) return e;
    const double rows = static_cast<double>(c.recv_rows());
    const double buffers =
        static_cast<double>(z.comm_total + z.pool_total + z.layer_weights + z.layer_grads + z.workspace);
    const double act = rows * (4.5 * bc.H + 24.0 * bc.ffn_hidden);
    e.add_bytes(R * c.S * bc.H * 18.0, "tokens (bf16, fp32 and the dense reference)");
    e.add_bytes(static_cast<double>(c.E) * 3 * bc.H * bc.ffn_hidden * 11, "expert weights and gradients");
    e.add_seconds((on_gpu ? 18.0 : 36.0) * bc.H * bc.ffn_hidden * entries / 12e9,
                  fmt::format("{}*H*H' flops for each of R*S*K = {:.3g} entries", on_gpu ? 18 : 36, entries));
    if (opt.precision.fp8)
        e.add_seconds((36.0 / 12e9 + 6.0 / 1e9) * bc.H * bc.ffn_hidden * entries,
                      "--fp8: the FP8 step again and the float64 forward reference (~1 GFLOP/s)");
    if (on_gpu) return e;
    e.add_bytes(0.76 * R * buffers, fmt::format("R={} ranks x {} of buffers", c.R, human_bytes(buffers)));
    e.add_bytes(R * act,
                fmt::format("R={} ranks x {} of expert activations (NvS = {:.0f} rows)", c.R, human_bytes(act), rows));
    e.add_bytes(73 * R * pairs, fmt::format("R={} rank plans of R*E = {:.3g} pairs each", c.R, pairs));
    e.add_seconds(1.3e-9 * R * (buffers + act), "touching every rank's buffers and activations");
    e.add_seconds(R * plan_seconds(c.R, c.E), fmt::format("R={} ranks each planning the whole group", c.R));
    return e;
}

void run_demo(const DemoOptions& opt) {
    // Outputs first: a bad target fails before the run; both are written at its end.
    OutputFile json("--json", opt.json_file);
    OutputDir dump_dir("--dump", opt.dump_dir);
    EVENEP_CHECK(opt.backend == "cpu" || opt.backend == "cuda" || opt.backend == "auto", "--backend '", opt.backend,
                 "': expected cpu, cuda or auto");
    EVENEP_CHECK(opt.warmup >= 0, "--warmup = ", opt.warmup, " must be >= 0");
    const bool fp8 = opt.precision.fp8;
    EVENEP_CHECK(fp8 || (!opt.precision.ue8m0 && !opt.precision.bf16_partials),
                 "--ue8m0 and --bf16-partials apply to the FP8 run: they need --fp8");
    std::string no_cuda;
    // With --fp8, "auto" takes the GPU FP8 layer where the build and device have it (CUTLASS, sm_90a), else the CPU.
    const bool cuda_ok = opt.backend != "cpu" &&
                         demo_cuda_available(&no_cuda) && (!fp8 || demo_cuda_fp8_available(&no_cuda));
    EVENEP_CHECK(opt.backend != "cuda" || cuda_ok, "--backend cuda", fp8 ? " --fp8" : "", ": ", no_cuda);
    const bool on_gpu = cuda_ok;  // "auto" falls back to the CPU
    RoutingInput in = resolve_routing(opt.routing, "demo", [&](const Config& c, bool) {
        const BufferConfig probe{.cfg = c, .H = opt.H, .ffn_hidden = opt.ffn_hidden, .precision = opt.precision};
        probe.validate();
        return demo_estimate(opt, probe, on_gpu);
    });
    EVENEP_CHECK(in.routing.has_value(),
                 "demo: needs every token's expert ids (a generator or --routing FILE.npy), not histograms (--tpe)");
    const Routing& routing = *in.routing;
    BufferConfig bc;
    bc.cfg = in.cfg;
    bc.H = opt.H;
    bc.ffn_hidden = opt.ffn_hidden;
    bc.validate();
    const Config& cfg = bc.cfg;
    const int R = cfg.R, epn = cfg.epn(), B = cfg.num_slots();
    const bool training = B == epn;

    // The plan alone (the same plan every rank computes): balance, copies, the traffic model.
    const double t_plan0 = now_seconds();
    const Plan plan = make_plan(cfg, in.mode, in.tpe, in.s);
    std::vector<std::vector<int32_t>> dst(R);
    for (int r = 0; r < R; ++r) {
        dst[r].resize(routing.topk_idx[r].size());
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
    const double plan_seconds = now_seconds() - t_plan0;
    const TrafficReport ev = evenep_traffic(plan, dst, bc.H, bc.ffn_hidden, training);
    const TrafficReport conv = conventional_traffic(cfg, routing.topk_idx, bc.H, training);
    const BufferSizes sizes = buffer_sizes(bc);
    const int64_t N = plan.total_entries();
    const double mean = static_cast<double>(N) / R;
    int64_t max_before = 0, max_after = 0, min_after = INT64_MAX;
    for (int r = 0; r < R; ++r) {
        max_before = std::max(max_before, plan.load_before[r]);
        max_after = std::max<int64_t>(max_after, plan.q[r]);
        min_after = std::min<int64_t>(min_after, plan.q[r]);
    }
    // Without slack: equal entries (±1). With slack ε: every rank within its bound ⌈(1+ε)·q_r⌉ (docs/slack.md).
    bool balanced = max_after - min_after <= 1;
    if (cfg.slack_ppm() > 0) {
        balanced = true;
        for (int r = 0; r < R; ++r)
            balanced = balanced && plan.q[r] <= detail::slack_cap(N / R + (r < N % R ? 1 : 0), cfg.slack_ppm());
    }

    fmt::print("EvenEP demo — one MoE layer step (SwiGLU experts, forward{}) on {} virtual {}{}\n",
               training ? " + backward" : " only (B < epn: inference)", R, on_gpu ? "ranks on one GPU" : "CPU ranks",
               opt.plan_only ? " — plan only" : "");
    fmt::print("config   {} H={} H'={} planner={}\n", cfg.to_string(), bc.H, bc.ffn_hidden, to_string(in.mode));
    int64_t slots = 0;
    for (int32_t s : plan.s) slots += static_cast<int64_t>(s) * cfg.K;
    fmt::print("routing  {}: maxvio {:.3f}, {} entries ({} masked)\n\n", in.description, maxvio_of_plan(plan), N,
               slots - N);

    constexpr int kBar = 20;
    fmt::print("{:<8} {:>8} {:<{}}  {:>8} {:<{}}  {:>8}  {:>8}  {:>8}\n", "entries", "conv. EP", "", kBar, "EvenEP", "",
               kBar, "remote", "slots", "pushed");
    for (int r = 0; r < R; ++r) {
        fmt::print("rank {:<3} {:>8} {:<{}}  {:>8} {:<{}}  {:>4}/{:<3}  {:>4}/{:<3}  {:>8}\n", r, plan.load_before[r],
                   bar(static_cast<double>(plan.load_before[r]), static_cast<double>(max_before), kBar), kBar,
                   plan.q[r], bar(plan.q[r], static_cast<double>(max_before), kBar), kBar, plan.remote_experts[r], epn,
                   plan.copies_received[r], B, plan.copies_pushed[r]);
    }
    fmt::print("max/mean {:>7.3f}x {:<{}}  {:>7.3f}x {:<{}}  copies {} (bound epn = {} per rank)\n",
               max_before / std::max(1.0, mean), "", kBar, max_after / std::max(1.0, mean), "", kBar,
               plan.cost.total_copies, epn);
    if (cfg.slack_ppm() > 0)
        fmt::print("entries on every rank within ceil((1+slack)*q_r): {}\n\n", balanced ? "yes" : "NO");
    else
        fmt::print("equal entries on every rank: {}\n\n", balanced ? "yes" : "NO");

    fmt::print("bytes across rank boundaries ({}; H={}, H'={})\n",
               training ? "one forward + backward step" : "one forward step", bc.H, bc.ffn_hidden);
    fmt::print("{:<26} {:>12} {:>12}   {:>12} {:>12}\n", "phase", "EvenEP", "busiest rank", "conv. EP", "busiest rank");
    for (const PhaseRow& row : phase_rows(ev, conv)) {
        if (!training && (row.evenep == &ev.combine_backward || row.evenep == &ev.dispatch_backward ||
                          row.evenep == &ev.reduce_grad))
            continue;
        fmt::print("{:<26} {:>12} {:>12}   {:>12} {:>12}\n", row.name, human_bytes(row.evenep->bytes),
                   human_bytes(row.evenep->max_rank_bytes()), human_bytes(row.conventional->bytes),
                   human_bytes(row.conventional->max_rank_bytes()));
    }
    const PhaseTraffic ev_total = ev.total(), conv_total = conv.total();
    fmt::print("{:<26} {:>12} {:>12}   {:>12} {:>12}\n", "total", human_bytes(ev_total.bytes),
               human_bytes(ev_total.max_rank_bytes()), human_bytes(conv_total.bytes),
               human_bytes(conv_total.max_rank_bytes()));
    fmt::print("token rows crossing in dispatch: EvenEP {}, conventional EP {}\n", ev.dispatch.rows,
               conv.dispatch.rows);
    fmt::print(
        "combine partials crossing: {}, of which {} are fp32 sums of >= 2 entries (no extra bf16 rounding, "
        "SPEC 4.2); bf16 partials as upstream would move {} less per combine\n",
        ev.combine.rows, ev.combine.fp32_rows, human_bytes(static_cast<double>(ev.combine.fp32_rows) * bc.H * 2));
    fmt::print("busiest rank computes {} entries with EvenEP, {} with conventional EP ({:.2f}x)\n\n",
               ev.max_rank_entries, conv.max_rank_entries,
               static_cast<double>(conv.max_rank_entries) / std::max<int64_t>(1, ev.max_rank_entries));

    fmt::print(
        "buffers per rank: communication {} (recv_x {} = NvS {} rows x H; DeepEP worst case R*S = {} rows: "
        "{}; combine staging {}); expert pool {} (B = {} slots x 3 projections + fp32 reduce buffer, shared "
        "by all layers); per layer: weights {} + fp32 grads {}\n\n",
        human_bytes(sizes.comm_total), human_bytes(sizes.recv_x), cfg.recv_rows(), static_cast<int64_t>(R) * cfg.S,
        human_bytes(sizes.deepep_recv_x), human_bytes(sizes.stage), human_bytes(sizes.pool_total), B,
        human_bytes(sizes.layer_weights), human_bytes(sizes.layer_grads));

    nlohmann::json j;
    j["config"] = {{"R", R},
                   {"E", cfg.E},
                   {"K", cfg.K},
                   {"S", cfg.S},
                   {"B", B},
                   {"tp", cfg.tp},
                   {"H", bc.H},
                   {"ffn_hidden", bc.ffn_hidden},
                   {"NvS", cfg.recv_rows()},
                   {"planner", std::string(to_string(in.mode))}};
    j["routing"] = {{"description", in.description}, {"maxvio", maxvio_of_plan(plan)}, {"entries", N}, {"s", plan.s}};
    j["balance"] = {{"conventional_entries", plan.load_before},
                    {"evenep_entries", plan.q},
                    {"remote_experts", plan.remote_experts},
                    {"copies_received", plan.copies_received},
                    {"copies_pushed", plan.copies_pushed},
                    {"total_copies", plan.cost.total_copies},
                    {"equal", balanced}};
    nlohmann::json jt;
    for (const PhaseRow& row : phase_rows(ev, conv))
        jt[row.name] = {{"evenep", phase_json(*row.evenep)}, {"conventional", phase_json(*row.conventional)}};
    jt["total"] = {{"evenep", phase_json(ev_total)}, {"conventional", phase_json(conv_total)}};
    j["traffic"] = jt;
    j["max_rank_entries"] = {{"evenep", ev.max_rank_entries}, {"conventional", conv.max_rank_entries}};
    j["buffer_bytes"] = {{"recv_x", sizes.recv_x},
                         {"recv_w", sizes.recv_w},
                         {"recv_meta", sizes.recv_meta},
                         {"gather", sizes.gather},
                         {"stage", sizes.stage},
                         {"comm_total", sizes.comm_total},
                         {"workspace", sizes.workspace},
                         {"pool_slots", sizes.pool_slots},
                         {"pool_reduce", sizes.pool_reduce},
                         {"pool_total", sizes.pool_total},
                         {"layer_weights", sizes.layer_weights},
                         {"layer_grads", sizes.layer_grads},
                         {"deepep_recv_x", sizes.deepep_recv_x}};
    j["plan_seconds"] = plan_seconds;
    j["backend"] = on_gpu ? "cuda" : "cpu";

    bool pass = balanced;
    if (!opt.plan_only) {
        const cpu::MoeProblem problem = cpu::make_moe_problem(bc, routing.topk_idx, routing.s, opt.routing.seed);
        cpu::MoeRunOptions ro;
        ro.mode = in.mode;
        ro.backward = training;
        ro.barrier_timeout = std::chrono::milliseconds(opt.timeout_ms);
        CudaDemoInfo gpu;
        const double t0 = now_seconds();
        const cpu::MoeResult res =
            on_gpu ? run_moe_layer_cuda(problem, ro, opt.warmup, &gpu) : cpu::run_moe_layer(problem, ro);
        // GPU: the reported step alone (the call above also allocates, uploads and warms up).
        const double ep_seconds = on_gpu ? gpu.step_wall_seconds : now_seconds() - t0;
        const double t1 = now_seconds();
        const cpu::DenseResult ref = cpu::dense_moe_reference(problem, training, opt.threads);
        const double dense_seconds = now_seconds() - t1;

        const cpu::Tolerances tol = cpu::default_tolerances();
        std::vector<Check> checks = {{"output", cpu::compare(res.out, ref.out), tol.out}};
        if (training) {
            checks.push_back({"grad x", cpu::compare(res.grad_x, ref.grad_x), tol.grad_x});
            checks.push_back({"grad topk_w", cpu::compare(res.grad_topk_w, ref.grad_topk_w), tol.grad_topk_w});
            checks.push_back(
                {"grad W_gate (all experts)",
                 cpu::compare(std::span<const float>(res.grad_w_gate), std::span<const float>(ref.grad_w_gate)),
                 tol.grad_w});
            checks.push_back(
                {"grad W_up (all experts)",
                 cpu::compare(std::span<const float>(res.grad_w_up), std::span<const float>(ref.grad_w_up)),
                 tol.grad_w});
            checks.push_back(
                {"grad W_down (all experts)",
                 cpu::compare(std::span<const float>(res.grad_w_down), std::span<const float>(ref.grad_w_down)),
                 tol.grad_w});
        }
        const bool same_plan = res.plan.alloc == plan.alloc && res.dst == dst;
        const TrafficReport& m = res.traffic;
        const bool traffic_ok = m.gather == ev.gather && m.dispatch == ev.dispatch && m.combine == ev.combine &&
                                m.combine_backward == ev.combine_backward &&
                                m.dispatch_backward == ev.dispatch_backward && m.prefetch == ev.prefetch &&
                                m.reduce_grad == ev.reduce_grad;

        fmt::print("correctness vs the dense fp32 reference (rel = max|EvenEP - ref| / max|ref|)\n");
        fmt::print("{:<27} {:>11} {:>11} {:>10} {:>10}\n", "", "max abs", "max |ref|", "rel", "tolerance");
        for (const Check& c : checks) {
            fmt::print("{:<27} {:>11.3e} {:>11.3e} {:>10.3e} {:>10.1e}  {}\n", c.name, c.stats.max_abs, c.stats.max_ref,
                       c.stats.rel(), c.tol, c.pass() ? "PASS" : "FAIL");
            pass = pass && c.pass();
        }
        fmt::print("{:<27} {}\n", "ranks' plan = host plan", same_plan ? "PASS" : "FAIL");
        // The GPU kernels do not count bytes: there the model is evaluated on the device's own plan and dst.
        fmt::print("{:<27} {}\n\n", on_gpu ? "device plan bytes = model" : "counted bytes = model",
                   traffic_ok ? "PASS" : "FAIL");
        pass = pass && same_plan && traffic_ok;
        Fp8DemoResult fp8_res;
        if (fp8) {
            const LayerRunner run = [&](const cpu::MoeProblem& p, const cpu::MoeRunOptions& o) {
                return on_gpu ? run_moe_layer_cuda(p, o, opt.warmup, nullptr) : cpu::run_moe_layer(p, o);
            };
            fp8_res = run_fp8_demo(problem, opt.precision, ro, res, ref, run, on_gpu ? "GPU" : "CPU", j);
            pass = pass && fp8_res.pass;
        }

        const cpu::LayerTimes& t = res.times;
        auto ms = [on_gpu](double s) {
            return on_gpu ? fmt::format("{:.3f}", s * 1e3) : fmt::format("{:.1f}", s * 1e3);
        };
        if (on_gpu)
            fmt::print(
                "time, ms (GPU, CUDA events on one stream, all {} ranks per phase; {}; after {} warm-up "
                "step{})\n",
                R, gpu.device, gpu.warmup_steps, gpu.warmup_steps == 1 ? "" : "s");
        else
            fmt::print("time, ms (max over ranks; {} rank threads share this machine's cores)\n", R);
        fmt::print("  forward   plan {} | dispatch {} | prefetch {} | experts {} | combine {}\n", ms(t.plan),
                   ms(t.dispatch), ms(t.prefetch), ms(t.expert_forward), ms(t.combine));
        if (training)
            fmt::print("  backward  combine_backward {} | experts {} | dispatch_backward {} | reduce_grad {}\n",
                       ms(t.combine_backward), ms(t.expert_backward), ms(t.dispatch_backward), ms(t.reduce_grad));
        if (on_gpu)
            fmt::print("  EvenEP step: GPU {} (sum of phases) | wall {} | dense reference on the CPU {} ({} threads)\n",
                       ms(t.total()), ms(ep_seconds), ms(dense_seconds), opt.threads);
        else
            fmt::print("  EvenEP step (wall) {} | dense reference {} ({} threads)\n", ms(ep_seconds), ms(dense_seconds),
                       opt.threads);

        nlohmann::json jc = nlohmann::json::array();
        for (const Check& c : checks)
            jc.push_back({{"name", c.name},
                          {"max_abs", c.stats.max_abs},
                          {"max_ref", c.stats.max_ref},
                          {"rel", c.stats.rel()},
                          {"tolerance", c.tol},
                          {"pass", c.pass()}});
        j["correctness"] = jc;
        j["same_plan"] = same_plan;
        j["traffic_counted_equals_model"] = traffic_ok;
        j["traffic_source"] = on_gpu ? "model on the device plan and dst" : "counted by the ranks";
        j["times_ms"] = {{"plan", t.plan * 1e3},
                         {"dispatch", t.dispatch * 1e3},
                         {"prefetch", t.prefetch * 1e3},
                         {"expert_forward", t.expert_forward * 1e3},
                         {"combine", t.combine * 1e3},
                         {"combine_backward", t.combine_backward * 1e3},
                         {"expert_backward", t.expert_backward * 1e3},
                         {"dispatch_backward", t.dispatch_backward * 1e3},
                         {"reduce_grad", t.reduce_grad * 1e3},
                         {"evenep_step_wall", ep_seconds * 1e3},
                         {"dense_reference", dense_seconds * 1e3}};
        if (on_gpu) {
            j["times_ms"]["gpu_step_sum_of_phases"] = t.total() * 1e3;
            j["gpu"] = {{"device", gpu.device}, {"warmup_steps", gpu.warmup_steps}, {"layer_bytes", gpu.layer_bytes}};
        }
        if (!opt.dump_dir.empty()) {
            dump(dump_dir, problem, res);
            if (fp8) {
                const int S = cfg.S, H = bc.H;
                write_npy_f32(dump_dir.file("out_fp8.npy"), {R, S, H}, pad_bf16(fp8_res.out, S, H));
                write_npy_f32(dump_dir.file("out_f64.npy"), {R, S, H}, pad_f32(fp8_res.ref_f64, S, H));
            }
            dump_dir.close();
            fmt::print(
                "  arrays written to {}/ (x, topk_idx, topk_w, w_gate, w_up, w_down, out, grad_out, grad_x, "
                "grad_topk_w{}: .npy)\n",
                opt.dump_dir, fp8 ? ", out_fp8, out_f64" : "");
        }
    }
    j["pass"] = pass;
    if (json.active()) {
        json.write(j.dump(2) + "\n");
        json.close();
    }
    fmt::print("\nresult: {}\n", pass ? "PASS" : "FAIL");
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, pass, "demo: a check failed (see the report above)");
}

}  // namespace

void register_demo(CLI::App& app) {
    auto opt = std::make_shared<DemoOptions>();
    opt->routing.R = 8;
    opt->routing.E = 64;
    opt->routing.K = 4;
    opt->routing.S = 512;
    opt->routing.maxvio = 5.0;
    CLI::App* cmd = app.add_subcommand(
        "demo",
        "One MoE layer step (SwiGLU experts, forward + backward) on R virtual ranks with skewed routing:\n"
        "per-rank entries before/after balancing, copies, bytes across ranks (EvenEP vs conventional EP),\n"
        "correctness against a dense fp32 reference and per-phase times. The ranks are CPU threads, or all on\n"
        "one GPU with --backend cuda (auto: the GPU when this build has CUDA and a device is present; GPU phase\n"
        "times from CUDA events). Exit 0 = correct, 1 = a check failed, 2 = bad input (including a run whose\n"
        "memory or time estimate passes --max-memory / --max-time). --plan-only prints the plan figures without\n"
        "running the layer. --fp8 runs the step again on the FP8 path (same backend; the GPU needs the CUTLASS\n"
        "FP8 GEMM) and reports both paths against a dense float64 reference (docs/fp8.md).");
    opt->routing.add_to(*cmd);
    add_int(*cmd, "--H", opt->H, "hidden size (multiple of 8)", 8, kMaxHidden);
    add_int(*cmd, "--ffn-hidden", opt->ffn_hidden, "expert FFN intermediate size H'", 1, kMaxHidden);
    add_int(*cmd, "--threads", opt->threads, "threads of the dense reference", 1, 4096);
    add_int(*cmd, "--timeout-ms", opt->timeout_ms, "barrier timeout of the virtual ranks", 1, 86400000);
    add_string(*cmd, "--backend", opt->backend,
               "cpu (threads), cuda (one GPU; exit 2 without one) or auto (cuda when built with CUDA and a "
               "device is present, else cpu)")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
        ->capture_default_str();
    add_int(*cmd, "--warmup", opt->warmup, "cuda: untimed layer steps before the reported one", 0, 1000000);
    cmd->add_flag("--plan-only", opt->plan_only,
                  "plan, balance and byte figures only: no data, no GEMMs (e.g. the MoonEP point "
                  "--E 384 --K 8 --S 8192 --H 7168 --ffn-hidden 2048)");
    cmd->add_flag("--fp8", opt->precision.fp8,
                  "also run the FP8 path (CPU, or the GPU with --backend cuda/auto and a CUTLASS build): e4m3 "
                  "dispatch rows with 1x128 scales, e4m3 weight copies with "
                  "128x128 scales, block-scaled GEMMs; report it and the bf16 path against a float64 reference "
                  "(H and H' multiples of 128; docs/fp8.md)");
    cmd->add_flag("--ue8m0", opt->precision.ue8m0, "with --fp8: power-of-two (UE8M0) scales");
    cmd->add_flag("--bf16-partials", opt->precision.bf16_partials,
                  "with --fp8: the FP8 run's combine sends multi-entry partials as bf16 (one more rounding)");
    add_output_file(*cmd, "--json", opt->json_file,
                    "write the figures as JSON (written whole at the end; the old file stays on any error)");
    add_output_dir(*cmd, "--dump", opt->dump_dir,
                   "write x, topk_idx, topk_w, w_gate, w_up, w_down, out (and grad_out, grad_x, grad_topk_w) as .npy "
                   "(with --fp8 also out_fp8, out_f64) into this directory (created with its parents; written into a "
                   "temporary folder beside it and moved into place at the end)");
    set_run(cmd, [opt] { run_demo(*opt); });
}

}  // namespace evenep::cli
