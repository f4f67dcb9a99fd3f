// `evenep bench layer`: one MoE layer step (forward and backward, every phase) of EvenEP against conventional EP and
// EPLB-style replication on the same routing, at the MoonEP point (R=8 E=384 K=8 S=8192 H=7168 H'=2048) and a
// K3-like point (E=896 K=16 H=3584, R in --k3-R), for every --maxvio. R GPUs are emulated on one: each rank's expert
// compute is timed alone on the whole GPU, data movement is modelled from the plan's per-rank link bytes (and
// measured as the library runs it, all virtual ranks per launch). Method: perf/cuda/layer_bench.hpp and
// docs/benchmarks.md, "Layer step". Every flag is checked before anything runs (exit 2, one line); points that
// would not fit the device's memory or --max-seconds are refused up front with their estimate. EvenEP plans under
// --policy (default auto, ε_max = --slack or kAutoDefaultSlack; docs/auto.md).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_layer_workload.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"
#include "evenep/routing.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "perf/cuda/bench.hpp"
#include "perf/cuda/layer_bench.hpp"
#endif

namespace evenep::cli {
namespace {

struct LayerOptions {
    std::vector<std::string> points{"moonep", "k3"};
    std::vector<int> k3_ranks{8, 16, 64};
    std::vector<double> maxvios{0.2, 1, 5, 10, 20};
    bool maxvio_given = false;  // --maxvio on the command line: an unreachable target is refused (as in plan, a
                                // default target that this shape cannot reach is drawn as close as it gets)
    int k3_ffn_hidden = 2048;
    uint64_t seed = 1;
    double drift = 0.1;
    std::string policy = "auto";  // EvenEP's planner policy (--policy; docs/auto.md)
    double slack = 0;             // --slack: the fixed budget, or auto's largest (kAutoDefaultSlack when not given)
    PlannerPolicy planner_policy = PlannerPolicy::kAuto;  // resolved by apply_policy
    std::vector<int> redundant{-1};
    std::vector<std::string> eplb_syncs{"ring", "star"};
    double link_gbps = 367;
    int warmup = 1, iters = 3;
    double warm_seconds = 1;
    double max_seconds = 1800;
    bool quick = false, check = false, no_measure = false;
    bool fp8 = false;       // --fp8: the FP8 layer (evenep_fp8) beside EvenEP's bf16 layer
    int micro_batches = 1;  // --micro-batches with --fp8: micro-batches per optimizer step sharing one home cast
    std::string json_file;
};

struct Point {
    std::string shape;
    int R, E, K, S, H, ffn_hidden;
    double maxvio;
};

// --quick: the MoonEP point at maxvio 1 and 20 (unless --points / --maxvio are given).
void apply_quick(const CLI::App& cmd, LayerOptions& o) {
    if (!o.quick) return;
    if (cmd.count("--points") == 0) o.points = {"moonep"};
    if (cmd.count("--maxvio") == 0) o.maxvios = {1, 20};
}

// The shapes of --points: MoonEP, and the K3-like point at every --k3-R (one name per R: plots.py draws one panel
// per shape name).
std::vector<LayerShape> layer_shapes(const LayerOptions& o) {
    std::vector<LayerShape> out;
    for (const std::string& p : o.points) {
        if (p == "moonep") out.push_back({"moonep", 8, 384, 8, 8192, 7168, 2048});
        if (p == "k3")
            for (int R : o.k3_ranks) out.push_back({fmt::format("k3_R{}", R), R, 896, 16, 8192, 3584, o.k3_ffn_hidden});
    }
    return out;
}

std::vector<Point> make_points(const LayerOptions& o) {
    std::vector<Point> out;
    for (const LayerShape& s : layer_shapes(o))
        for (double mv : o.maxvios) out.push_back({s.shape, s.R, s.E, s.K, s.S, s.H, s.ffn_hidden, mv});
    return out;
}

// --workload / --trace: bench layer's own flags into the workload run, every flag checked (bench_layer_workload.hpp).
void prepare_workload(const CLI::App& cmd, const LayerOptions& o, LayerWorkloadOptions& w) {
    w.shapes = layer_shapes(o);
    w.seed = o.seed;
    w.redundant = o.redundant;
    EVENEP_CHECK(cmd.count("--eplb-sync") == 0 || o.eplb_syncs.size() == 1,
                 "bench layer: --eplb-sync: --workload/--trace runs one replica sync model (got ", o.eplb_syncs.size(),
                 ")");
    w.eplb_sync = cmd.count("--eplb-sync") ? o.eplb_syncs[0] : "ring";
    w.link_gbps = o.link_gbps;
    w.warmup = o.warmup, w.iters = o.iters;
    w.warm_seconds = o.warm_seconds, w.max_seconds = o.max_seconds;
    w.json_file = o.json_file;
    // evenep_auto and evenep_exact run side by side: --slack is evenep_auto's largest budget, no other policy.
    EVENEP_CHECK(o.policy == "auto", "bench layer: --policy ", o.policy,
                 " with --workload/--trace: the run plans evenep_auto and evenep_exact side by side (--policy auto, "
                 "--slack its largest budget)");
    w.auto_slack = o.slack;
    check_layer_workload(cmd, w);
}

// Every flag checked before any work: a bad one fails at once, one line naming it (exit 2).
void validate(const LayerOptions& o) {
    EVENEP_CHECK(!o.points.empty(), "bench layer: --points: give at least one of moonep, k3");
    for (const std::string& p : o.points)
        EVENEP_CHECK(p == "moonep" || p == "k3", "bench layer: --points entry '", p, "' must be moonep or k3");
    EVENEP_CHECK(!o.maxvios.empty(), "bench layer: --maxvio: give at least one value");
    EVENEP_CHECK(!o.k3_ranks.empty(), "bench layer: --k3-R: give at least one group size");
    EVENEP_CHECK(!o.eplb_syncs.empty(), "bench layer: --eplb-sync: give at least one of ring, star, none");
    for (size_t i = 0; i < o.eplb_syncs.size(); ++i)
        for (size_t j = 0; j < i; ++j)
            EVENEP_CHECK(o.eplb_syncs[i] != o.eplb_syncs[j], "bench layer: --eplb-sync: '", o.eplb_syncs[i],
                         "' is given twice");
    for (int R : o.k3_ranks)
        EVENEP_CHECK(R >= 1 && R <= 896 && 896 % R == 0, "bench layer: --k3-R = ", R,
                     " must divide E = 896 (e.g. 8, 16, 32, 56, 64, 112, 128, 224)");
    EVENEP_CHECK(o.k3_ffn_hidden % 8 == 0, "bench layer: --k3-ffn-hidden = ", o.k3_ffn_hidden,
                 " must be a multiple of 8");
    EVENEP_CHECK(!o.redundant.empty(), "bench layer: --redundant: give at least one slot count");
    for (size_t i = 0; i < o.redundant.size(); ++i) {
        EVENEP_CHECK(o.redundant[i] >= -1 && o.redundant[i] <= 896, "bench layer: --redundant = ", o.redundant[i],
                     " must be -1 (= epn) or in [0, 896]");
        for (size_t j = 0; j < i; ++j)
            EVENEP_CHECK(o.redundant[i] != o.redundant[j], "bench layer: --redundant: ", o.redundant[i],
                         " is given twice");
    }
    EVENEP_CHECK(o.micro_batches >= 1, "bench layer: --micro-batches = ", o.micro_batches, " must be >= 1");
    if (o.fp8)
        for (const LayerShape& s : layer_shapes(o))
            EVENEP_CHECK(s.H % 128 == 0 && s.ffn_hidden % 128 == 0,
                         "bench layer: --fp8 needs H and H' multiples of "
                         "128 (the scale block); ",
                         s.shape, " has H = ", s.H, ", H' = ", s.ffn_hidden,
                         s.shape == "moonep" ? "" : " (--k3-ffn-hidden)");
    for (const Point& p : make_points(o)) {
        const Config cfg{
            .R = p.R, .E = p.E, .K = p.K, .S = p.S, .B = -1, .tp = 128, .slack = o.slack, .policy = o.planner_policy};
        cfg.validate();
    }
}

#if defined(EVENEP_HAVE_CUDA)

using perf::cuda::LayerBenchConfig;
using perf::cuda::LayerPointResult;
using perf::cuda::SystemStep;

LayerBenchConfig config_of(const LayerOptions& o, const Point& p) {
    LayerBenchConfig c;
    c.shape = p.shape;
    c.R = p.R, c.E = p.E, c.K = p.K, c.S = p.S, c.H = p.H, c.ffn_hidden = p.ffn_hidden;
    c.target_maxvio = p.maxvio;
    c.seed = o.seed;
    c.drift = o.drift;
    c.slack = o.slack;
    c.policy = o.planner_policy;
    c.redundant = o.redundant;
    c.eplb_syncs.clear();
    for (const std::string& m : o.eplb_syncs) c.eplb_syncs.push_back(perf::parse_eplb_sync(m));
    c.link_gbps = o.link_gbps;
    c.warmup = o.warmup, c.iters = o.iters;
    c.warm_seconds = o.warm_seconds;
    c.measure_data_movement = !o.no_measure;
    c.check = o.check;
    c.fp8 = o.fp8;
    c.micro_batches = o.micro_batches;
    return c;
}

// The FP8 layer over EvenEP's bf16 layer of the same point (evenep_fp8 right after evenep), or null.
const SystemStep* fp8_system(const LayerPointResult& r) {
    return r.systems.size() > 1 && r.systems[1].fp8 ? &r.systems[1] : nullptr;
}

void print_header() {
    fmt::print("{:<7} {:>3} {:>6} {:>6} {:<13} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7}\n", "shape", "R",
               "maxvio", "achvd", "system", "cmp max", "cmp mean", "comm mdl", "imbal", "step", "overlap", "vs evn",
               "s");
}

// "eplb/ring/14" for an EPLB system (sync model, redundant slots per rank), the system's name otherwise.
std::string label_of(const SystemStep& s) {
    return s.replica_sync.empty() ? s.system : fmt::format("{}/{}/{}", s.system, s.replica_sync, s.redundant_slots);
}

void print_point(const LayerPointResult& r) {
    const SystemStep& ev = r.systems.front();
    for (const SystemStep& s : r.systems)
        fmt::print(
            "{:<7} {:>3} {:>6g} {:>6.2f} {:<13} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.3f} {:>8.2f} {:>8.2f} {:>7.2f}x "
            "{:>7.1f}\n",
            r.cfg.shape, r.cfg.R, r.cfg.target_maxvio, r.maxvio, label_of(s), s.compute_max_ms, s.compute_mean_ms,
            s.comm.communication(), s.imbalance, s.step_no_overlap_ms, s.step_overlapped_ms,
            s.step_overlapped_ms / ev.step_overlapped_ms, r.seconds);
    if (!r.measured.empty()) {
        std::string line;
        for (const auto& m : r.measured)
            if (m.op.find("_graph") == std::string::npos && m.op != "plan_rank_warm" && m.op != "plan_rank_serial")
                line += fmt::format(" {} {:.1f}", m.op, m.median_us);
        fmt::print("  measured on one GPU, all {} ranks per launch (us):{}\n", r.cfg.R, line);
    } else {
        fmt::print("  data movement {}\n", r.measured_note);
    }
    if (r.gemm_check_error >= 0)
        fmt::print("  check: GEMM sampled error {:.1e}, data movement {} wrong\n", r.gemm_check_error, r.wrong);
    std::fflush(stdout);
}

nlohmann::json phases_json(const perf::cuda::PhaseMs& m) {
    return {{"plan", m.plan},
            {"dispatch", m.dispatch},
            {"prefetch", m.prefetch},
            {"combine", m.combine},
            {"combine_backward", m.combine_backward},
            {"dispatch_backward", m.dispatch_backward},
            {"reduce_grad", m.reduce_grad}};
}

// --fp8: the FP8 layer's step over the bf16 layer's, per point, and how flat the FP8 step is over maxvio per shape;
// with the home weight cast (median over ranks) and the micro-batches M it is shared by (counted cast / M).
void print_fp8_ratios(const std::vector<LayerPointResult>& results) {
    fmt::print(
        "\nFP8 layer over bf16 layer (EvenEP, same plan, same run): step overlapped, no overlap, compute max; "
        "the FP8 forward counts the home weight cast / M (M micro-batches per optimizer step share it)\n");
    std::vector<std::pair<std::string, std::vector<double>>> per_shape;  // shape -> FP8 overlapped steps
    for (const LayerPointResult& r : results) {
        const SystemStep* f = fp8_system(r);
        if (f == nullptr) continue;
        const SystemStep& ev = r.systems.front();
        fmt::print(
            "  {:<6} R={:<3} maxvio {:>4g}: {:.3f}x  {:.3f}x  {:.3f}x  (FP8 step {:.2f} ms, bf16 {:.2f} ms; home "
            "cast {:.3f} ms median over ranks, M = {})\n",
            r.cfg.shape, r.cfg.R, r.cfg.target_maxvio, f->step_overlapped_ms / ev.step_overlapped_ms,
            f->step_no_overlap_ms / ev.step_no_overlap_ms, f->compute_max_ms / ev.compute_max_ms, f->step_overlapped_ms,
            ev.step_overlapped_ms, f->fp8_home_cast_median_ms, r.cfg.micro_batches);
        const std::string key = fmt::format("{} R={}", r.cfg.shape, r.cfg.R);
        auto it = std::find_if(per_shape.begin(), per_shape.end(), [&](const auto& p) { return p.first == key; });
        if (it == per_shape.end()) it = per_shape.insert(per_shape.end(), {key, {}});
        it->second.push_back(f->step_overlapped_ms);
    }
    for (const auto& [key, v] : per_shape)
        if (v.size() > 1)
            fmt::print("  {}: FP8 step (overlapped) max/min over maxvio {:.3f}\n", key,
                       *std::max_element(v.begin(), v.end()) / *std::min_element(v.begin(), v.end()));
}

// The point's rows in evenep.layer_step/1 (scripts/plots.py): one per system.
void add_json(nlohmann::json& points, const LayerPointResult& r) {
    const SystemStep& ev = r.systems.front();
    nlohmann::json measured = nlohmann::json::array();
    for (const auto& m : r.measured)
        measured.push_back(
            {{"op", m.op}, {"median_us", m.median_us}, {"bytes", m.bytes}, {"wrong", m.wrong}, {"note", m.note}});
    for (const SystemStep& s : r.systems) {
        nlohmann::json j{{"shape", r.cfg.shape},
                         {"R", r.cfg.R},
                         {"E", r.cfg.E},
                         {"K", r.cfg.K},
                         {"S", r.cfg.S},
                         {"H", r.cfg.H},
                         {"ffn_hidden", r.cfg.ffn_hidden},
                         {"system", s.system},
                         {"maxvio", r.cfg.target_maxvio},
                         {"achieved_maxvio", r.maxvio},
                         {"step_ms_overlapped", s.step_overlapped_ms},
                         {"step_ms_no_overlap", s.step_no_overlap_ms},
                         {"per_rank_compute_ms", s.compute_ms},
                         {"per_rank_forward_ms", s.forward_ms},
                         {"per_rank_backward_ms", s.backward_ms},
                         {"timed_ranks", s.timed_ranks},
                         {"compute_max_ms", s.compute_max_ms},
                         {"compute_mean_ms", s.compute_mean_ms},
                         {"rows", s.rows},
                         {"imbalance", s.imbalance},
                         {"comm_ms_modelled", phases_json(s.comm)},
                         {"max_rank_link_bytes", s.max_rank_link_bytes},
                         {"link_gbps", r.cfg.link_gbps},
                         {"speedup_evenep_overlapped", s.step_overlapped_ms / ev.step_overlapped_ms},
                         {"seed", r.cfg.seed}};
        if (s.system == "eplb")
            j["drift"] = r.cfg.drift, j["planned_on_maxvio"] = r.eplb_prev_maxvio, j["replica_sync"] = s.replica_sync,
            j["redundant_slots"] = s.redundant_slots;
        if (s.fp8) {  // the FP8 layer against EvenEP's bf16 layer of the same point and run
            j["fp8"] = true;
            j["fp8_over_bf16_overlapped"] = s.step_overlapped_ms / ev.step_overlapped_ms;
            j["fp8_over_bf16_no_overlap"] = s.step_no_overlap_ms / ev.step_no_overlap_ms;
            j["fp8_over_bf16_compute_max"] = s.compute_max_ms / ev.compute_max_ms;
            // --micro-batches M: the forward (per_rank_forward_ms, so the step) counts the home cast / M
            j["micro_batches"] = r.cfg.micro_batches;
            j["fp8_home_cast_ms"] = s.fp8_home_cast_median_ms;    // median over the timed ranks
            j["per_rank_fp8_home_cast_ms"] = s.fp8_home_cast_ms;  // each timed rank's (median over iterations)
        }
        if (s.system == "evenep") {
            j["policy"] = std::string(to_string(r.cfg.policy));
            j["slack"] = r.cfg.slack;
            j["slack_ppm"] = r.slack_ppm;  // the plan's budget (under auto: the one the policy chose)
            j["warm_up_ms"] = r.warm_up_ms;
            j["measured_data_movement"] = measured;
            j["measured_note"] = r.measured_note;
            if (r.gemm_check_error >= 0) j["gemm_check_error"] = r.gemm_check_error;
        }
        points.push_back(std::move(j));
    }
}

void run(const LayerOptions& o) {
    std::vector<Point> points = make_points(o);
    for (const Point& p : points)  // the rule of every command: refused, never clamped
        if (o.maxvio_given)
            check_maxvio_reachable(RoutingSpec{.R = p.R, .E = p.E, .K = p.K, .S = p.S, .seed = o.seed}, {p.maxvio});
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, !o.fp8 || ::evenep::cuda::grouped_gemm_has_cutlass(),
                      "bench layer: --fp8 needs the CUTLASS FP8 grouped GEMM: a build with EVENEP_CUTLASS=ON "
                      "(CMAKE_CUDA_ARCHITECTURES with 90a) on a compute capability 9.0 device (H100/H200)");
    size_t free_bytes = 0, total_bytes = 0;
    EVENEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double usable = 0.9 * static_cast<double>(free_bytes);
    // Refuse up front what would not fit: the per-rank timer in device memory, the run in --max-seconds.
    std::vector<std::pair<Point, bool>> plan;  // point, measure data movement
    double budget = 0;
    for (const Point& p : points) {
        const auto est = perf::cuda::estimate_layer_point(config_of(o, p));
        const std::string name = fmt::format("{} R={} maxvio {:g}", p.shape, p.R, p.maxvio);
        if (est.compute_bytes > usable) {
            fmt::print("refused {}: the per-rank timer needs {} of device memory, {} free\n", name,
                       human_bytes(est.compute_bytes), human_bytes(static_cast<double>(free_bytes)));
            continue;
        }
        if (budget + est.seconds > o.max_seconds) {
            fmt::print("refused {}: estimated {:.0f} s would pass --max-seconds {:g} ({:.0f} s already planned)\n",
                       name, est.seconds, o.max_seconds, budget);
            continue;
        }
        budget += est.seconds;
        const bool measure = !o.no_measure && est.movement_bytes <= usable;
        if (!o.no_measure && !measure)
            fmt::print(
                "{}: data movement modelled only (one-GPU measurement of {} virtual ranks needs ~{}, {} "
                "free)\n",
                name, p.R, human_bytes(est.movement_bytes), human_bytes(static_cast<double>(free_bytes)));
        plan.push_back({p, measure});
    }
    EVENEP_CHECK(!plan.empty(),
                 "bench layer: every point was refused (see above); lower the grid or raise "
                 "--max-seconds");
    fmt::print(
        "device: {}; {} point(s), estimated {:.0f} s; link {:g} GB/s per direction (modelled); EvenEP policy {} "
        "(slack {:g})\n",
        perf::device_summary(), plan.size(), budget, o.link_gbps, to_string(o.planner_policy), o.slack);
    double copy_gbps = 1;
    if (!o.no_measure) copy_gbps = perf::copy_anchor_gbps(perf::bench_copy(size_t{512} << 20, 3, 10));

    OutputFile("--json", o.json_file);  // checks the target now (writes nothing): a bad one fails before the run
    nlohmann::json doc{
        {"schema", "evenep.layer_step/1"}, {"device", perf::device_summary()}, {"points", nlohmann::json::array()}};
    print_header();
    int64_t wrong = 0;
    double worst_gemm = 0;
    std::vector<LayerPointResult> results;
    for (const auto& [p, measure] : plan) {
        LayerBenchConfig c = config_of(o, p);
        c.measure_data_movement = measure;
        c.copy_gbps = copy_gbps;
        const RoutingSpec spec{.R = p.R, .E = p.E, .K = p.K, .S = p.S, .seed = o.seed};
        const Routing routing = routing_near_maxvio(spec, p.maxvio, &c.sigma);
        results.push_back(perf::cuda::run_layer_point(c, routing));
        const LayerPointResult& r = results.back();
        print_point(r);
        add_json(doc["points"], r);
        wrong += r.wrong;
        worst_gemm = std::max(worst_gemm, r.gemm_check_error);
        if (!o.json_file.empty()) {  // replaced (atomically) after every point: a run cut short keeps what it measured
            OutputFile out("--json", o.json_file);
            out.write(doc.dump(1) + "\n");
            out.close();
        }
    }
    // Ratios of the overlapped estimates, per point: every other system over EvenEP.
    fmt::print("\nstep (overlapped) ratios, each system's step over EvenEP's:\n");
    for (const LayerPointResult& r : results) {
        fmt::print("  {:<6} R={:<3} maxvio {:>4g}:", r.cfg.shape, r.cfg.R, r.cfg.target_maxvio);
        for (size_t s = 1; s < r.systems.size(); ++s)
            fmt::print("  {} {:.2f}x", label_of(r.systems[s]),
                       r.systems[s].step_overlapped_ms / r.systems.front().step_overlapped_ms);
        fmt::print("\n");
    }
    if (o.fp8) print_fp8_ratios(results);
    if (o.check) {
        fmt::print("check: data movement {} wrong, GEMM sampled error {:.1e}\n", wrong, worst_gemm);
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, wrong == 0 && worst_gemm < 1e-2, "bench layer: --check failed: ", wrong,
                          " wrong data-movement results, GEMM sampled error ", worst_gemm);
    }
}

#endif  // EVENEP_HAVE_CUDA

}  // namespace

void register_bench_layer(CLI::App& bench) {
    auto o = std::make_shared<LayerOptions>();
    auto wo = std::make_shared<LayerWorkloadOptions>();
    CLI::App* cmd = bench.add_subcommand(
        "layer",
        "one MoE layer step (fwd+bwd) of EvenEP (planner policy --policy, default auto) vs conventional EP and "
        "EPLB-style replication, R GPUs emulated on "
        "one: per-rank expert compute alone on the GPU, modelled link time. With --workload W or --trace F.npy: "
        "every system (evenep_auto, evenep_exact, conventional, eplb at 1, 2, 4, epn slots, lplb, llep) over "
        "--steps steps of those routings, each unit's busiest rank(s) timed on the GPU (--json: "
        "evenep.workload_run/1, one file per shape)");
    cmd->add_option("--points", o->points, "any of moonep (R=8 E=384 K=8 H=7168 H'=2048), k3 (E=896 K=16 H=3584)")
        ->capture_default_str();
    cmd->add_option("--k3-R", o->k3_ranks, "group sizes of the K3-like point")->capture_default_str();
    add_reals(*cmd, "--maxvio", o->maxvios, "target maxvio values of the routing", 0, 1e6);
    add_int(*cmd, "--k3-ffn-hidden", o->k3_ffn_hidden,
            "expert intermediate size H' of the K3-like point (multiple "
            "of 8)",
            8, kMaxHidden);
    add_u64(*cmd, "--seed", o->seed, "routing and data seed");
    add_real(*cmd, "--drift", o->drift, "EPLB: per-step log-popularity drift (random walk)", 0, 100)
        ->capture_default_str();
    add_policy_option(*cmd, o->policy)
        ->description(
            "EvenEP's planner policy: auto (default: each plan's budget in [0, --slack] by the step-cost model; "
            "docs/auto.md), exact, or slack (the fixed budget --slack); with --workload/--trace only auto "
            "(evenep_exact runs beside it)");
    add_real(*cmd, "--slack", o->slack,
             fmt::format("EvenEP's imbalance budget: auto's largest (default {:g}) or --policy slack's fixed one",
                         kAutoDefaultSlack),
             0, 1);
    cmd->add_option("--redundant", o->redundant,
                    "EPLB redundant slots per rank, one EPLB placement per value given (-1: EvenEP's B = epn)")
        ->capture_default_str();
    cmd->add_option("--eplb-sync", o->eplb_syncs,
                    "how a training step keeps EPLB's replicas in sync, one EPLB row per model given (same compute): "
                    "ring (all-reduce), star (as EvenEP's copies), none (token traffic only)")
        ->check(CLI::IsMember({"star", "ring", "none"}))
        ->capture_default_str();
    add_real(*cmd, "--link-gbps", o->link_gbps, "modelled link bandwidth per direction, GB/s", 1e-3, 1e6)
        ->capture_default_str();
    add_int(*cmd, "--warmup", o->warmup, "untimed runs per rank", 0, 1000);
    add_int(*cmd, "--iters", o->iters, "timed runs per rank (median)", 1, 1000);
    add_real(*cmd, "--warm-seconds", o->warm_seconds,
             "GPU warm-up before each point's first timed rank (EvenEP rank 0 run back to back)", 0, 600)
        ->capture_default_str();
    add_real(*cmd, "--max-seconds", o->max_seconds, "refuse points whose estimated time would pass this", 1, 1e6)
        ->capture_default_str();
    cmd->add_flag("--quick", o->quick, "the MoonEP point at maxvio 1 and 20 only");
    cmd->add_flag("--check", o->check, "verify the data movement (bitwise) and sample the timed GEMMs");
    cmd->add_flag("--no-measure", o->no_measure, "skip the one-GPU data-movement measurement (modelled only)");
    cmd->add_flag("--fp8", o->fp8,
                  "also the FP8 layer (system evenep_fp8: e4m3 dispatch and weight copies, FP8 forward and dgrad "
                  "GEMMs, bf16 wgrad; docs/fp8.md) beside EvenEP's bf16 layer, with their ratio (CUTLASS build, "
                  "H100/H200); its home weight cast is counted / --micro-batches");
    add_output_file(*cmd, "--json", o->json_file,
                    "write evenep.layer_step/1 JSON (scripts/plots.py --layer); with --workload/--trace "
                    "evenep.workload_run/1 (scripts/plots.py --workload-run), FILE_<shape>.json for several shapes");
    add_layer_workload_options(*cmd, *wo);
    // --micro-batches is shared: the workload's micro-batches per step, or with --fp8 on the maxvio grid the
    // micro-batches per optimizer step that share the FP8 home cast (Experts::reuse_fp8_cast).
    cmd->get_option("--micro-batches")
        ->description(
            "micro-batches per step M: with --workload each planned on its own; with --fp8 (maxvio grid) "
            "the micro-batches of one optimizer step sharing the FP8 home weight cast (gradient "
            "accumulation, Experts::reuse_fp8_cast): evenep_fp8's forward = forward without the cast + "
            "cast / M");
    set_run(cmd, [o, wo, cmd] {
        o->planner_policy = apply_policy(o->policy, cmd->count("--slack") > 0, o->slack);
        if (wo->wl.active()) {  // every system over a step sequence (bench_layer_workload.cpp)
            EVENEP_CHECK(!o->fp8, "bench layer: --fp8 applies to the maxvio grid, not to --workload or --trace");
            validate(*o);
            prepare_workload(*cmd, *o, *wo);
            require_cuda_device("bench layer");
            return run_layer_workload(*wo);
        }
        for (const char* flag : {"--steps", "--eplb-interval", "--eplb-window", "--lplb-topology", "--llep-threshold",
                                 "--placed", "--plan-us", "--timed-ranks"})
            EVENEP_CHECK(cmd->count(flag) == 0, "bench layer: ", flag, " applies to --workload or --trace");
        EVENEP_CHECK(cmd->count("--micro-batches") == 0 || o->fp8,
                     "bench layer: --micro-batches applies to --fp8 (micro-batches per optimizer step sharing the FP8 "
                     "home cast) or to --workload");
        o->micro_batches = wo->wl.micro_batches;
        o->maxvio_given = cmd->count("--maxvio") > 0;
        apply_quick(*cmd, *o);
        validate(*o);
        require_cuda_device("bench layer");
#if defined(EVENEP_HAVE_CUDA)
        run(*o);
#else
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "bench layer: needs a CUDA build");
#endif
    });
}

}  // namespace evenep::cli
