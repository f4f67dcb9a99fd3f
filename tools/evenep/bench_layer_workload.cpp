// `evenep bench layer --workload W | --trace F.npy` (bench_layer_workload.hpp).
#include "bench_layer_workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"
#include "perf/workload_measure.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "evenep/cuda/check.hpp"
#include "perf/cuda/bench.hpp"
#include "perf/cuda/workload_bench.hpp"
#endif

namespace evenep::cli {

void add_layer_workload_options(CLI::App& cmd, LayerWorkloadOptions& o) {
    add_workload_options(cmd, o.wl, /*model_flags=*/false);
    add_int(cmd, "--timed-ranks", o.timed_ranks,
            "workload/trace: ranks timed per unit and system, the busiest by the step model (the step's compute is "
            "their largest time)",
            1, kMaxRanks)
        ->capture_default_str();
}

void check_layer_workload(const CLI::App& cmd, LayerWorkloadOptions& o) {
    for (const char* flag : {"--maxvio", "--drift", "--quick", "--check", "--no-measure"})
        EVENEP_CHECK(cmd.count(flag) == 0, "bench layer: ", flag,
                     " applies to the maxvio grid, not to --workload/--trace");
    EVENEP_CHECK(o.wl.trace.empty() || cmd.count("--micro-batches") == 0,
                 "bench layer: --micro-batches applies to --workload (a trace's steps are its rows)");
    EVENEP_CHECK(!o.wl.workload.empty() || o.wl.steps >= 0, "bench layer: --steps = ", o.wl.steps, " must be >= 0");
    EVENEP_CHECK(o.wl.trace.empty() == !o.wl.workload.empty(), "bench layer: give --workload or --trace, not both");
    if (!o.wl.workload.empty())
        EVENEP_CHECK(o.wl.steps >= 1, "bench layer: --steps = ", o.wl.steps, " must be >= 1 with --workload");
    if (cmd.count("--redundant") == 0) o.redundant.clear();  // EPLB at 1, 2, 4 and epn slots per rank
    for (const LayerShape& s : o.shapes)                     // the runner's own checks, before the device
        workload_run_config(o.wl, Config{.R = s.R, .E = s.E, .K = s.K, .S = s.S, .B = -1, .tp = 128}, s.H, s.ffn_hidden,
                            o.redundant, o.eplb_sync, "optimized", 1, o.auto_slack);
    if (!o.wl.trace.empty()) {
        // The trace's R and E pick the shape; its counts are checked against that shape's K and S.
        o.trace = read_trace(o.wl.trace, 32, std::numeric_limits<int>::max());
        std::vector<LayerShape> match;
        std::string names;
        for (const LayerShape& s : o.shapes) {
            names += fmt::format("{}{} (R={}, E={})", names.empty() ? "" : ", ", s.shape, s.R, s.E);
            if (s.R == o.trace.R && s.E == o.trace.E) match.push_back(s);
        }
        EVENEP_CHECK(!match.empty(), "bench layer: --trace '", o.wl.trace, "' has R = ", o.trace.R, ", E = ", o.trace.E,
                     "; no shape of --points/--k3-R matches: ", names);
        for (const LayerShape& s : match) validate_trace(o.trace, s.K, s.S, "trace '" + o.wl.trace + "'");
        o.shapes = match;
    }
    for (const LayerShape& s : o.shapes)  // checks each target now (writes nothing): a bad one fails before the run
        OutputFile("--json", layer_workload_json_path(o.json_file, s.shape, o.shapes.size()));
}

std::string layer_workload_json_path(const std::string& json_file, const std::string& shape, size_t num_shapes) {
    if (json_file.empty() || num_shapes <= 1) return json_file;
    std::string stem = json_file;
    if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) stem.resize(stem.size() - 5);
    return stem + "_" + shape + ".json";
}

#if defined(EVENEP_HAVE_CUDA)
namespace {

// Runs one shape; false when refused: its time estimate would take the run (`spent` seconds so far) past
// --max-seconds.
bool run_shape(const LayerWorkloadOptions& o, const LayerShape& sh, size_t num_shapes, double spent) {
    const Config cfg{.R = sh.R, .E = sh.E, .K = sh.K, .S = sh.S, .B = -1, .tp = 128};
    WorkloadOptions wl = o.wl;
    wl.link_gbps = o.link_gbps;
    const bool from_trace = !wl.trace.empty();
    const perf::WorkloadRunConfig rc = workload_run_config(wl, cfg, sh.H, sh.ffn_hidden, o.redundant, o.eplb_sync,
                                                           "optimized", from_trace ? o.trace.L : 1, o.auto_slack);
    StepSource source = from_trace ? StepSource(o.trace, wl.steps, sh.K, sh.S)
                                   : StepSource(WorkloadSpec{.kind = parse_workload(wl.workload),
                                                             .E = sh.E,
                                                             .K = sh.K,
                                                             .num_tokens = static_cast<int64_t>(sh.R) * sh.S,
                                                             .seed = o.seed},
                                                sh.R, wl.steps, wl.micro_batches);
    const int epn = cfg.epn();
    const int64_t max_rows = cfg.recv_rows();
    // Groups per launch: every slot EPLB/epn or EvenEP can hold (2 epn) and room for LLEP's spills; fewer when the
    // device's memory cannot hold their weights (a longer list is timed in chunks, summed).
    size_t free_bytes = 0, total_bytes = 0;
    EVENEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double usable = 0.85 * static_cast<double>(free_bytes);
    int max_groups = std::min(sh.E, std::max(3 * epn, 64));
    while (max_groups > epn && static_cast<double>(perf::cuda::GpuRankCompute::bytes_needed(
                                   sh.H, sh.ffn_hidden, max_groups, max_rows)) > usable)
        max_groups = std::max(epn, max_groups * 3 / 4);
    const double bytes =
        static_cast<double>(perf::cuda::GpuRankCompute::bytes_needed(sh.H, sh.ffn_hidden, max_groups, max_rows));
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, bytes <= usable, "bench layer: ", sh.shape, ": the rank timer needs ",
                      human_bytes(bytes), ", ", human_bytes(static_cast<double>(free_bytes)), " free");
    // Estimate: every system's busiest rank(s) of every unit, at ~400 TFLOP/s (memo hits not counted).
    const int num_systems = static_cast<int>(perf::WorkloadRunner(rc).series().size());
    const double rank_s = 18.0 * sh.H * sh.ffn_hidden * static_cast<double>(sh.S) * sh.K / 400e12;
    const double estimate = o.warm_seconds + static_cast<double>(source.steps()) * source.layers() *
                                                 source.micro_batches() * num_systems * o.timed_ranks *
                                                 (o.warmup + o.iters) * rank_s;
    if (spent + estimate > o.max_seconds) {
        fmt::print("refused {}: estimated {:.0f} s would pass --max-seconds {:g} ({:.0f} s spent)\n", sh.shape,
                   estimate, o.max_seconds, spent);
        return false;
    }
    const std::string json_path = layer_workload_json_path(o.json_file, sh.shape, num_shapes);
    OutputFile json("--json", json_path);
    fmt::print(
        "\n=== {} {} on {}: {} steps x {} unit(s); R={} E={} K={} S={} H={} H'={}; EPLB every {} steps on a "
        "window of {}, sync {}; link {:g} GB/s (modelled); {} rank(s) timed per unit and system, warmup {}, "
        "iters {}; groups per launch {}; estimated {:.0f} s\n",
        from_trace ? "trace" : "workload", from_trace ? wl.trace : wl.workload, sh.shape, source.steps(),
        source.layers() * source.micro_batches(), sh.R, sh.E, sh.K, sh.S, sh.H, sh.ffn_hidden, wl.eplb_interval,
        wl.eplb_window, o.eplb_sync, o.link_gbps, o.timed_ranks, o.warmup, o.iters, max_groups, estimate);
    const double t0 = now_seconds();
    perf::cuda::GpuRankCompute gpu(sh.H, sh.ffn_hidden, max_groups, max_rows, o.seed, o.warmup, o.iters);
    {  // clocks out of the idle state: a balanced rank (epn groups of S K / epn rows each)
        const int64_t rows = (static_cast<int64_t>(sh.S) * sh.K / epn + 127) / 128 * 128;
        const std::vector<int64_t> balanced(static_cast<size_t>(std::min(epn, max_groups)), rows);
        gpu.warm_up(balanced, o.warm_seconds);
    }
    perf::MeasuredWorkloadRun run(
        rc, [&gpu](std::span<const int64_t> g) { return gpu(g); }, o.timed_ranks);
    for (int t = 0; t < source.steps(); ++t) run.run_step(t, source.units(t));
    const double seconds = now_seconds() - t0;
    const std::vector<perf::MeasuredSeries> series = run.series();
    std::vector<const perf::SystemSeries*> table;
    for (const perf::MeasuredSeries& m : series) table.push_back(&m.series);
    print_workload_table(table,
                         "step time (overlapped estimate: measured compute of the busiest rank(s), modelled "
                         "link phases and weight moves)");
    fmt::print("{} rank timings, {} answered from the memo; {:.1f} s\n", run.timed(), run.memo_hits(), seconds);
    nlohmann::json systems = nlohmann::json::array();
    for (const perf::MeasuredSeries& m : series) {
        nlohmann::json j = system_json(m.series, rc);
        j["step_ms_model"] = m.step_ms_model;
        j["compute_ms_model"] = m.compute_ms_model;
        j["compute_ms_measured"] = m.compute_ms_measured;
        if (!m.policy.empty()) j["params"]["policy"] = m.policy;
        systems.push_back(std::move(j));
    }
    nlohmann::json doc =
        workload_run_json(wl, source, rc, o.seed, "optimized");
    doc["shape"] = sh.shape;
    doc["device"] = perf::device_summary();
    doc["method"] = fmt::format(
        "bench layer --workload/--trace: per unit and system the {} busiest rank(s) by the step model timed on the "
        "GPU (forward + backward, warmup {}, median of {}); step_ms = model step - model compute + measured compute",
        o.timed_ranks, o.warmup, o.iters);
    doc["timed_ranks"] = o.timed_ranks;
    doc["rank_timings"] = run.timed();
    doc["memo_hits"] = run.memo_hits();
    doc["groups_per_launch"] = max_groups;
    doc["systems"] = systems;
    doc["seconds"] = seconds;
    json.write(doc.dump(1) + "\n");
    json.close();
    if (!json_path.empty()) fmt::print("wrote {}\n", json_path);
    return true;
}

}  // namespace

void run_layer_workload(const LayerWorkloadOptions& o) {
    fmt::print("device: {}\n", perf::device_summary());
    const double t0 = now_seconds();
    int ran = 0;
    for (const LayerShape& sh : o.shapes) ran += run_shape(o, sh, o.shapes.size(), now_seconds() - t0) ? 1 : 0;
    EVENEP_CHECK(ran > 0, "bench layer: every shape was refused by --max-seconds ", o.max_seconds,
                 " (see above); lower --steps or raise --max-seconds");
}

#else

void run_layer_workload(const LayerWorkloadOptions&) {
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "bench layer: needs a CUDA build");
}

#endif  // EVENEP_HAVE_CUDA

}  // namespace evenep::cli
