// Shared by `simulate --workload|--trace` and `bench layer --workload|--trace` (workload_common.hpp).
#include "workload_common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"

namespace evenep::cli {
namespace {

double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

StepSource::StepSource(const WorkloadSpec& spec, int R, int steps, int micro_batches)
    : spec_(spec), R_(R), steps_(steps), micro_batches_(micro_batches) {
    spec_.validate();
    EVENEP_CHECK(steps >= 1, "--steps = ", steps, " must be >= 1 with --workload");
}

StepSource::StepSource(RouterTrace trace, int steps, int K, int S)
    : from_trace_(true), trace_(std::move(trace)), K_(K), S_(S) {
    R_ = trace_.R;
    steps_ = steps > 0 ? std::min(steps, trace_.T) : trace_.T;
}

const std::vector<perf::StepUnit>& StepSource::units(int t) {
    s_store_.clear();
    tpe_store_.clear();
    units_.clear();
    if (from_trace_) {
        const int E = trace_.E;
        for (int l = 0; l < trace_.L; ++l) {
            const std::span<const int32_t> h = trace_.histogram(t, l);
            tpe_store_.emplace_back(h.begin(), h.end());
            std::vector<int32_t> s(R_);
            for (int r = 0; r < R_; ++r) {  // docs/traces.md: ceil(row sum / K), in [1, S]
                int64_t sum = 0;
                for (int e = 0; e < E; ++e) sum += h[static_cast<size_t>(r) * E + e];
                s[r] = static_cast<int32_t>(std::clamp<int64_t>((sum + K_ - 1) / K_, 1, S_));
            }
            s_store_.push_back(std::move(s));
        }
    } else {
        for (int mb = 0; mb < micro_batches_; ++mb) {
            WorkloadHistogram h = workload_histogram(spec_, R_, t, mb);
            tpe_store_.push_back(std::move(h.tpe));
            s_store_.push_back(std::move(h.s));
        }
    }
    for (size_t u = 0; u < tpe_store_.size(); ++u)
        units_.push_back({.layer = from_trace_ ? static_cast<int>(u) : 0, .tpe = tpe_store_[u], .s = s_store_[u]});
    return units_;
}

nlohmann::json system_json(const perf::SystemSeries& s, const perf::WorkloadRunConfig& rc) {
    nlohmann::json params = nlohmann::json::object();
    if (s.name == "eplb" || s.name == "lplb" || s.name == "evenep_placed") {
        params["step_interval"] = rc.eplb_schedule.step_interval;
        params["window"] = rc.eplb_schedule.window;
        if (s.name != "evenep_placed") params["replica_sync"] = perf::to_string(rc.eplb_sync);
    }
    if (s.name == "eplb") params["num_redundant"] = s.num_redundant;
    if (s.name == "lplb") params["topology"] = s.topology;
    if (s.name == "llep") params["threshold"] = rc.llep_threshold;
    if (s.name == "evenep_auto" || s.name == "evenep_placed") params["max_slack"] = rc.auto_slack;
    if (s.name != "conventional" && s.name != "eplb") params["plan_us"] = rc.plan_us;
    nlohmann::json j{
        {"name", s.name},
        {"label", s.label},
        {"params", params},
        {"step_ms", s.step_ms},
        {"rows_max_over_mean", s.rows_max_over_mean},
        {"summary",
         {{"median_ms", median(s.step_ms)}, {"p90_ms", quantile(s.step_ms, 0.9)}, {"max_ms", quantile(s.step_ms, 1)}}},
        {"token_bytes", s.token_bytes},
        {"weight_bytes", s.weight_bytes},
        {"grad_bytes", s.grad_bytes},
        {"rows", s.rows}};
    if (s.name == "evenep_auto") j["slack_ppm"] = s.slack_ppm;  // per step: the mean budget its units chose
    return j;
}

void print_workload_table(const std::vector<const perf::SystemSeries*>& series, const std::string& what) {
    const perf::SystemSeries* ev = series.front();
    for (const perf::SystemSeries* s : series)
        if (s->name == "evenep_exact") ev = s;
    const double ev_med = median(ev->step_ms), ev_p90 = quantile(ev->step_ms, 0.9);
    fmt::print("{:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "system", "median ms", "p90 ms", "max ms",
               "rows imb", "med/evn", "p90/evn");
    const perf::SystemSeries *best_med = nullptr, *best_p90 = nullptr;
    for (const perf::SystemSeries* s : series) {
        const double med = median(s->step_ms), p90 = quantile(s->step_ms, 0.9);
        fmt::print("{:<14} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.4f} {:>9.3f}x {:>9.3f}x\n", s->label, med, p90,
                   quantile(s->step_ms, 1), mean(s->rows_max_over_mean), med / ev_med, p90 / ev_p90);
        if (s->name.rfind("evenep", 0) == 0) continue;
        if (best_med == nullptr || med < median(best_med->step_ms)) best_med = s;
        if (best_p90 == nullptr || p90 < quantile(best_p90->step_ms, 0.9)) best_p90 = s;
    }
    fmt::print(
        "columns: median, p90 and max over the steps of the {}; rows imb = mean over steps of max/mean "
        "per-rank rows; med/evn, p90/evn = the system's median (p90) over evenep_exact's (> 1: EvenEP "
        "faster)\n",
        what);
    for (const perf::SystemSeries* s : series)
        if (s->name == "evenep_auto")
            fmt::print("evenep_auto = the auto planner policy (docs/auto.md): mean budget {:.4f}\n",
                       mean(s->slack_ppm) * 1e-6);
    if (best_med == nullptr) return;
    const double bm = median(best_med->step_ms), bp = quantile(best_p90->step_ms, 0.9);
    for (const perf::SystemSeries* s : series)
        if (s->name.rfind("evenep", 0) == 0)
            fmt::print("best baseline vs {}: median {} {:.3f} ms = {:.3f}x, p90 {} {:.3f} ms = {:.3f}x\n", s->label,
                       best_med->label, bm, bm / median(s->step_ms), best_p90->label, bp,
                       bp / quantile(s->step_ms, 0.9));
}

void add_workload_options(CLI::App& cmd, WorkloadOptions& o, bool model_flags) {
    std::string names;
    for (const WorkloadInfo& w : workload_list()) names += (names.empty() ? "" : ", ") + std::string(w.name);
    cmd.add_option("--workload", o.workload,
                   "run every system (evenep_auto, evenep_exact, conventional, eplb, lplb, llep) over --steps steps of this "
                   "workload (`evenep workloads`): " +
                       names)
        ->check(CLI::IsMember([] {
            std::vector<std::string> v;
            for (const WorkloadInfo& w : workload_list()) v.emplace_back(w.name);
            return v;
        }()));
    add_input_file(cmd, "--trace", o.trace,
                   "replay a router trace .npy [T, R, E] or [T, L, R, E] through every system (docs/traces.md)");
    cmd.get_option("--workload")->excludes(cmd.get_option("--trace"));
    add_int(cmd, "--steps", o.steps, "workload: steps; trace: the first steps (0 = all)", 0, 1000000)
        ->capture_default_str();
    add_int(cmd, "--micro-batches", o.micro_batches, "workload: micro-batches per step (each planned on its own)", 1,
            1024)
        ->capture_default_str();
    add_int(cmd, "--eplb-interval", o.eplb_interval, "workload/trace: EPLB (and LPLB) re-placed every this many steps",
            1, 1000000)
        ->capture_default_str();
    add_int(cmd, "--eplb-window", o.eplb_window, "workload/trace: from the loads of this many past steps", 1, 1000000)
        ->capture_default_str();
    cmd.add_option("--lplb-topology", o.lplb_topology,
                   "workload/trace: LPLB's replica graph (auto: hypercube for R a power of two, else torus)")
        ->check(CLI::IsMember({"auto", "hypercube", "cube", "torus", "ring"}))
        ->capture_default_str();
    add_real(cmd, "--llep-threshold", o.llep_threshold, "workload/trace: LLEP spills above threshold x the fair share",
             1, 1e6)
        ->capture_default_str();
    cmd.add_flag("--placed", o.placed,
                 "workload/trace: also evenep_placed, evenep_auto over homes re-placed on EPLB's schedule (a "
                 "permutation, no spare slot; a modelled design study, docs/benchmarks.md)");
    add_real(cmd, "--plan-us", o.plan_us,
             "workload/trace: per-unit planning time of evenep_auto, evenep_exact, lplb and llep", 0, 1e9)
        ->capture_default_str();
    if (!model_flags) return;  // bench layer: measured compute, its own --link-gbps
    add_real(cmd, "--gemm-tflops", o.gemm_tflops, "workload/trace: step model's grouped-GEMM TFLOP/s", 1e-6, 1e9)
        ->capture_default_str();
    add_real(cmd, "--group-us", o.group_us, "workload/trace: step model's per-group cost (-1: wgrad tile overhead)", -1,
             1e9)
        ->capture_default_str();
    add_real(cmd, "--link-gbps", o.link_gbps, "workload/trace: step model's link GB/s per direction", 1e-6, 1e9)
        ->capture_default_str();
}

perf::WorkloadRunConfig workload_run_config(const WorkloadOptions& o,
                                            const Config& cfg,
                                            int H,
                                            int ffn_hidden,
                                            const std::vector<int>& redundant,
                                            const std::string& eplb_sync,
                                            const std::string& planner,
                                            int layers,
                                            double auto_slack) {
    perf::WorkloadRunConfig rc;
    rc.cfg = cfg;
    rc.cfg.validate();
    rc.mode = parse_planner_mode(planner);
    rc.model = perf::StepModel{.H = H,
                               .ffn_hidden = ffn_hidden,
                               .tp = cfg.tp,
                               .gemm_tflops = o.gemm_tflops,
                               .group_us = o.group_us,
                               .link_gbps = o.link_gbps};
    rc.layers = layers;
    rc.plan_us = o.plan_us;
    rc.auto_slack = auto_slack;
    if (!redundant.empty()) rc.eplb_redundant = redundant;
    rc.eplb_schedule = perf::EplbSchedule{.step_interval = o.eplb_interval, .window = o.eplb_window};
    rc.eplb_sync = perf::parse_eplb_sync(eplb_sync);
    rc.lplb_topology = o.lplb_topology;
    rc.llep_threshold = o.llep_threshold;
    rc.placed = o.placed;
    rc.validate();
    return rc;
}

nlohmann::json workload_run_json(const WorkloadOptions& o,
                                 const StepSource& source,
                                 const perf::WorkloadRunConfig& rc,
                                 uint64_t seed,
                                 const std::string& planner) {
    const bool from_trace = !o.trace.empty();
    return {{"schema", "evenep.workload_run/1"},
            {"workload", from_trace ? nlohmann::json(nullptr) : nlohmann::json(o.workload)},
            {"trace", from_trace ? nlohmann::json(o.trace) : nlohmann::json(nullptr)},
            {"steps", source.steps()},
            {"micro_batches", source.micro_batches()},
            {"layers", rc.layers},
            {"R", rc.cfg.R},
            {"E", rc.cfg.E},
            {"K", rc.cfg.K},
            {"S", rc.cfg.S},
            {"H", rc.model.H},
            {"ffn_hidden", rc.model.ffn_hidden},
            {"tp", rc.cfg.tp},
            {"seed", seed},
            {"planner", planner},
            {"model",
             {{"gemm_tflops", rc.model.gemm_tflops},
              {"group_us", rc.model.group_cost_us()},
              {"link_gbps", rc.model.link_gbps},
              {"plan_us", rc.plan_us}}},
            {"evenep_auto", {{"policy", "auto"}, {"max_slack", rc.auto_slack}}}};
}

}  // namespace evenep::cli
