// `evenep simulate`: the scale model on the CPU (no GPU). For every R and maxvio of the grid: planner time (CPU;
// GPU from a device run's JSON), copies, the busiest rank's copy traffic, per-rank buffer bytes (EvenEP vs a
// DeepEP-style worst case), link bytes of one training step and the compute imbalance of conventional EP,
// EPLB-style replication (planned on the previous step of a drifting routing) and EvenEP. Method and columns:
// docs/benchmarks.md, "Scale model" and "Baselines".
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/buffer.hpp"
#include "evenep/detail/json_input.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "perf/baselines.hpp"
#include "perf/drift.hpp"
#include "perf/eplb.hpp"
#include "simulate_workload.hpp"

namespace evenep::cli {
namespace {

struct SimulateOptions {
    std::vector<int> ranks{8, 16, 32, 56, 64, 112, 128, 224};
    std::vector<double> maxvios{0.2, 1, 10, 20};
    int E = 896, K = 16, S = 8192, H = 3584, ffn_hidden = 2048, tp = 128;
    int redundant = -1;  // EPLB redundant slots per rank; -1: EvenEP's prefetch slots B = epn
    double drift = 0.1;
    std::string eplb_sync = "star";  // how EPLB's replicas are kept in sync (perf::EplbSync)
    double slack = 0;  // imbalance budget ε of EvenEP's planner (docs/slack.md)
    std::string policy;                                    // --policy (apply_policy; docs/auto.md)
    PlannerPolicy planner_policy = PlannerPolicy::kFixed;  // resolved
    uint64_t seed = 1;
    std::string planner = "optimized";
    int repeat = 5;
    bool quick = false;
    bool maxvio_given = false;  // --maxvio on the command line: an unreachable target is refused (as in plan, a
                                // default target that this shape cannot reach is drawn as close as it gets)
    std::vector<std::string> gpu_json;
    std::string json_file;
    ResourceLimits limits;
};

// The small grid of --quick (tests): applied to every option not given on the command line.
void apply_quick(const CLI::App& cmd, SimulateOptions& o) {
    if (!o.quick) return;
    if (cmd.count("--R") == 0) o.ranks = {4, 8};
    if (cmd.count("--maxvio") == 0) o.maxvios = {1, 10};
    if (cmd.count("--E") == 0) o.E = 64;
    if (cmd.count("--K") == 0) o.K = 4;
    if (cmd.count("--S") == 0) o.S = 512;
    if (cmd.count("--H") == 0) o.H = 256;
    if (cmd.count("--ffn-hidden") == 0) o.ffn_hidden = 128;
    if (cmd.count("--repeat") == 0) o.repeat = 3;
}

// Every flag checked before any work, so a bad one fails at once with one line naming it.
void validate(const SimulateOptions& o) {
    EVENEP_CHECK(!o.ranks.empty(), "--R: give at least one group size");
    EVENEP_CHECK(!o.maxvios.empty(), "--maxvio: give at least one value");
    for (double m : o.maxvios) EVENEP_CHECK(m >= 0 && m <= 1e6, "--maxvio = ", m, " must be in [0, 1e6]");
    EVENEP_CHECK(o.repeat >= 1, "--repeat = ", o.repeat, " must be >= 1");
    EVENEP_CHECK(o.drift >= 0 && o.drift <= 100, "--drift = ", o.drift, " must be in [0, 100]");
    for (int R : o.ranks) {
        const Config cfg{
            .R = R, .E = o.E, .K = o.K, .S = o.S, .B = -1, .tp = o.tp, .slack = o.slack, .policy = o.planner_policy};
        BufferConfig{.cfg = cfg, .H = o.H, .ffn_hidden = o.ffn_hidden}.validate();
    }
    EVENEP_CHECK(o.redundant >= -1 && o.redundant <= o.E, "--redundant = ", o.redundant,
                 " must be -1 (= epn) or in [0, E = ", o.E, "]");
    parse_planner_mode(o.planner);
    for (int R : o.ranks)  // the rule of every command: refused, never clamped
        if (o.maxvio_given) check_maxvio_reachable(RoutingSpec{.R = R, .E = o.E, .K = o.K, .S = o.S, .seed = o.seed}, o.maxvios);
}

// Per point (R, maxvio): the routing (routing_near_maxvio) and the previous step's (one more full draw, alive
// next to the routing until EPLB is placed), --repeat + 1 plans (the model of `evenep plan`), every rank's dst
// and the three traffic models (~4 B and ~150 ns per entry), EPLB's placement and the baselines (~800 ns per
// (rank, expert) pair; fitted: docs/estimates.md). One point alive at a time.
Estimate simulate_estimate(const SimulateOptions& o) {
    Estimate e;
    const double count = static_cast<double>(o.maxvios.size());
    for (int R : o.ranks) {
        const double pairs = static_cast<double>(R) * o.E, entries = static_cast<double>(R) * o.S * o.K;
        Estimate point;
        add_near_maxvio_estimate(R, o.E, o.K, o.S, static_cast<int>(o.maxvios.size()), point);
        point.add_bytes(plan_bytes(R, o.E) + 4 * pairs, fmt::format("R={}: histograms and planner state", R));
        point.add_bytes(4 * entries, fmt::format("R={}: dst (then the previous step's routing)", R));
        point.add_seconds(count * (lognormal_draw_seconds(R, o.E, o.K, o.S) + 150e-9 * entries),
                          fmt::format("R={}: the previous step's routing, dst and three traffic models", R));
        point.add_seconds(count * ((o.repeat + 1) * plan_seconds(R, o.E) + 800e-9 * pairs),
                          fmt::format("R={}: plans, EPLB placement and the baselines' loads", R));
        e.add_stage(point);
    }
    return e;
}

// GPU planner figures of device runs (`evenep bench gpu-plan --json`, one file per R): median us by (R, E, K, S, target
// maxvio) of the planner Ep::plan uses, plan_rank_cluster (EpOptions::planner_kernel's default), else plan_rank (the
// one-block planner; files from before the cluster planner).
using GpuKey = std::tuple<int, int, int, int, double>;
void read_gpu_plan(const std::string& path, std::map<GpuKey, double>& out) {
    const nlohmann::json j = detail::read_json_file(path, "--gpu-json");
    EVENEP_CHECK(j.contains("rows") && j["rows"].is_array(), "--gpu-json: '", path,
                 "' has no \"rows\" array (expected `evenep bench gpu-plan --json` output)");
    for (const auto& row : j["rows"]) {
        EVENEP_CHECK(row.is_object(), "--gpu-json: '", path, "': every entry of \"rows\" must be an object, got ",
                     row.dump().substr(0, 40));
        for (const char* key : {"op", "shape"})
            EVENEP_CHECK(!row.contains(key) || row[key].is_string(), "--gpu-json: '", path, "': \"", key,
                         "\" must be a string");
        for (const char* key : {"target_maxvio", "median_us"})
            EVENEP_CHECK(!row.contains(key) || row[key].is_number(), "--gpu-json: '", path, "': \"", key,
                         "\" must be a number");
        const std::string op = row.value("op", "");
        if ((op != "plan_rank" && op != "plan_rank_cluster") || !row.contains("target_maxvio")) continue;
        int R = 0, E = 0, K = 0, S = 0;
        if (std::sscanf(row.value("shape", "").c_str(), "R%d E%d K%d S%d", &R, &E, &K, &S) != 4) continue;
        const GpuKey key{R, E, K, S, row["target_maxvio"].get<double>()};
        if (op == "plan_rank_cluster")
            out[key] = row.value("median_us", 0.0);
        else
            out.emplace(key, row.value("median_us", 0.0));  // only where no cluster row is (or comes)
    }
}

nlohmann::json traffic_json(const TrafficReport& t) {
    nlohmann::json phases;
    const std::pair<const char*, const PhaseTraffic*> named[] = {{"gather", &t.gather},
                                                                 {"dispatch", &t.dispatch},
                                                                 {"combine", &t.combine},
                                                                 {"combine_backward", &t.combine_backward},
                                                                 {"dispatch_backward", &t.dispatch_backward},
                                                                 {"prefetch", &t.prefetch},
                                                                 {"reduce_grad", &t.reduce_grad}};
    for (const auto& [name, p] : named) phases[name] = {{"bytes", p->bytes}, {"max_rank_bytes", p->max_rank_bytes()}};
    const PhaseTraffic total = t.total();
    return {{"total_bytes", total.bytes}, {"max_rank_bytes", total.max_rank_bytes()}, {"phases", phases}};
}

// One point of the grid: prints its row and returns its JSON.
nlohmann::json simulate_point(const SimulateOptions& o, int R, double target, const std::map<GpuKey, double>& gpu) {
    const double t_start = now_seconds();
    const Config cfg{
        .R = R, .E = o.E, .K = o.K, .S = o.S, .B = -1, .tp = o.tp, .slack = o.slack, .policy = o.planner_policy};
    const RoutingSpec spec{.R = R, .E = o.E, .K = o.K, .S = o.S, .seed = o.seed};
    double sigma = 0;
    const Routing routing = routing_near_maxvio(spec, target, &sigma);
    const std::vector<int32_t> tpe = routing.tpe();
    const double maxvio = routing.maxvio();

    // EvenEP: the planner (timed), every rank's destinations, the traffic model.
    const PlannerMode mode = parse_planner_mode(o.planner);
    Planner planner(cfg, mode);
    planner.set_auto_model(detail::make_auto_cost_model(o.H, o.ffn_hidden, o.tp));
    Plan plan;
    std::vector<double> times;
    for (int i = 0; i < o.repeat; ++i) {
        const double t0 = now_seconds();
        planner.plan(tpe, routing.s, plan);
        times.push_back(now_seconds() - t0);
    }
    std::vector<std::vector<int32_t>> dst(R);
    for (int r = 0; r < R; ++r) {
        dst[r].resize(static_cast<size_t>(routing.s[r]) * cfg.K);
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
    const TrafficReport ev = evenep_traffic(plan, dst, o.H, o.ffn_hidden, /*training=*/true);
    dst.clear();
    dst.shrink_to_fit();

    // Conventional EP.
    const std::vector<int64_t> load = perf::expert_loads(cfg, tpe);
    const std::vector<int64_t> conv_rows = perf::conventional_rows(cfg, load);
    const TrafficReport cv = conventional_traffic(cfg, routing.topk_idx, o.H, /*training=*/true);

    // EPLB-style: placed on the previous step's load of the drifting routing, computing this step.
    const perf::DriftSpec drift{.spec = spec, .sigma = sigma, .drift = o.drift};
    double prev_maxvio = 0;
    std::vector<int64_t> prev_load;
    {
        const Routing prev = perf::drift_routing(drift, -1);
        prev_maxvio = prev.maxvio();
        prev_load = perf::expert_loads(cfg, prev.tpe());
    }
    const int redundant = o.redundant < 0 ? cfg.num_slots() : o.redundant;
    const perf::EplbConfig ecfg{.num_ranks = R, .num_experts = o.E, .slots_per_rank = cfg.epn() + redundant};
    const perf::EplbPlacement placement = perf::eplb_place(ecfg, prev_load);
    const std::vector<int64_t> eplb_rows = perf::eplb_rows(placement, load);
    const TrafficReport ep = perf::eplb_traffic(placement, routing, o.H, o.ffn_hidden, /*training=*/true,
                                                perf::parse_eplb_sync(o.eplb_sync));

    const std::vector<int64_t> ev_rows(plan.q.begin(), plan.q.end());
    const double imb_cv = perf::imbalance(conv_rows), imb_ep = perf::imbalance(eplb_rows),
                 imb_ev = perf::imbalance(ev_rows);
    const BufferSizes buf = buffer_sizes(BufferConfig{.cfg = cfg, .H = o.H, .ffn_hidden = o.ffn_hidden});
    const int64_t expert_bytes = int64_t{3} * o.H * o.ffn_hidden * 2;  // bf16, 3 projections
    const int max_remote = *std::max_element(plan.remote_experts.begin(), plan.remote_experts.end());
    const int max_pushed = *std::max_element(plan.copies_pushed.begin(), plan.copies_pushed.end());
    const double plan_ms = median(times) * 1e3;
    const auto gpu_it = gpu.find({R, o.E, o.K, o.S, target});
    const double gpu_ms = gpu_it == gpu.end() ? -1.0 : gpu_it->second * 1e-3;  // -1: no device figure
    const double seconds = now_seconds() - t_start;

    const auto hb = [](int64_t bytes) { return human_bytes(static_cast<double>(bytes)); };
    fmt::print(
        "{:>4} {:>7.3f} {:>8.3f} {:>7} {:>6} {:>3}/{:<3} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} "
        "{:>6.3f} {:>6.3f} {:>6.4f} {:>6.1f}\n",
        R, maxvio, plan_ms, gpu_ms >= 0 ? fmt::format("{:.3f}", gpu_ms) : std::string("-"), plan.cost.total_copies,
        max_remote, cfg.epn(), plan.cost.max_rank_copy_traffic, hb(plan.cost.max_rank_copy_traffic * expert_bytes),
        hb(buf.comm_total), hb(buf.deepep_recv_x), hb(ev.total().max_rank_bytes()), hb(cv.total().max_rank_bytes()),
        hb(ep.total().max_rank_bytes()), imb_cv, imb_ep, imb_ev, seconds);
    std::fflush(stdout);

    nlohmann::json j{{"R", R},
                     {"E", o.E},
                     {"K", o.K},
                     {"S", o.S},
                     {"H", o.H},
                     {"ffn_hidden", o.ffn_hidden},
                     {"tp", o.tp},
                     {"epn", cfg.epn()},
                     {"B", cfg.num_slots()},
                     {"seed", o.seed},
                     {"target_maxvio", target},
                     {"maxvio", maxvio},
                     {"sigma", sigma},
                     {"planner", o.planner},
                     {"slack", o.slack},
                     {"policy", std::string(to_string(o.planner_policy))},
                     {"slack_ppm", plan.slack_ppm},
                     {"plan_ms_cpu", plan_ms},
                     {"plan_ms_gpu", gpu_ms >= 0 ? nlohmann::json(gpu_ms) : nlohmann::json(nullptr)},
                     {"total_entries", plan.total_entries()}};
    j["copies"] = {{"total", plan.cost.total_copies},
                   {"max_rank", max_remote},
                   {"bound", cfg.epn()},
                   {"theorem2_need", theorem2_lower_bound(cfg.E, cfg.R)},
                   {"max_rank_copy_traffic", plan.cost.max_rank_copy_traffic},
                   {"max_rank_copy_traffic_bytes", plan.cost.max_rank_copy_traffic * expert_bytes},
                   {"max_rank_pushed", max_pushed},
                   {"expert_bytes", expert_bytes},
                   {"crossing_rows", plan.cost.crossing_rows},
                   {"moved_entries", plan.cost.moved_entries}};
    j["buffers"] = {{"evenep_comm_total", buf.comm_total},
                    {"evenep_recv_x", buf.recv_x},
                    {"evenep_pool_total", buf.pool_total},
                    {"evenep_layer_weights", buf.layer_weights},
                    {"deepep_recv_x", buf.deepep_recv_x}};
    j["link_bytes"] = {{"evenep", traffic_json(ev)}, {"conventional", traffic_json(cv)}, {"eplb", traffic_json(ep)}};
    j["rows"] = {{"conventional", conv_rows}, {"eplb", eplb_rows}, {"evenep", ev_rows}};
    j["imbalance"] = {{"conventional", imb_cv}, {"eplb", imb_ep}, {"evenep", imb_ev}};
    j["eplb"] = {{"slots_per_rank", ecfg.slots_per_rank},
                 {"redundant_per_rank", redundant},
                 {"drift", o.drift},
                 {"replica_sync", o.eplb_sync},
                 {"planned_on_step", -1},
                 {"planned_on_maxvio", prev_maxvio}};
    j["seconds"] = seconds;
    return j;
}

void run_simulate(const SimulateOptions& o) {
    OutputFile json("--json", o.json_file);  // checked now, written atomically at the end
    validate(o);
    check_estimate("simulate", simulate_estimate(o), o.limits);
    std::map<GpuKey, double> gpu;
    for (const std::string& path : o.gpu_json) read_gpu_plan(path, gpu);
    const double t0 = now_seconds();
    fmt::print(
        "EvenEP scale model: E={} K={} S={} H={} H'={} tp={} planner={}{} seed={}; EPLB: {} redundant slots per "
        "rank, planned on the previous step, drift {}, replica sync {}\n",
        o.E, o.K, o.S, o.H, o.ffn_hidden, o.tp, o.planner,
        o.slack > 0 || o.planner_policy == PlannerPolicy::kAuto
            ? fmt::format(" slack={:g}{}", o.slack, o.planner_policy == PlannerPolicy::kAuto ? " policy=auto" : "")
            : "",
        o.seed, o.redundant < 0 ? std::string("epn") : std::to_string(o.redundant), o.drift, o.eplb_sync);
    fmt::print(
        "{:>4} {:>7} {:>8} {:>7} {:>6} {:>7} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>6} {:>6} "
        "{:>6}\n",
        "R", "maxvio", "plan ms", "gpu ms", "copies", "max/bnd", "traf", "traf bytes", "buf EvenEP", "buf DeepEP",
        "link ev", "link conv", "link eplb", "conv", "eplb", "evenep", "sec");
    nlohmann::json points = nlohmann::json::array();
    for (int R : o.ranks)
        for (double target : o.maxvios) points.push_back(simulate_point(o, R, target, gpu));
    const double seconds = now_seconds() - t0;
    fmt::print(
        "columns: plan ms = CPU planner median over {} runs (all ranks, one thread); gpu ms = plan_rank_cluster "
        "(else plan_rank) of --gpu-json; copies = total remote experts; max/bnd = most on one rank / bound epn; traf = "
        "busiest rank's "
        "copies received + pushed (experts) and their bf16 bytes; buf EvenEP = communication buffer per rank; "
        "buf DeepEP = worst-case receive buffer R*S*H*2; link = busiest rank's link bytes of one training step; "
        "conv/eplb/evenep = max/mean of per-rank rows.\n",
        o.repeat);
    fmt::print("total {:.1f} s\n", seconds);
    json.write(nlohmann::json{{"schema", "evenep.simulate/1"}, {"seconds", seconds}, {"points", points}}.dump(1) + "\n");
    json.close();
}

}  // namespace

void register_simulate(CLI::App& app) {
    auto opt = std::make_shared<SimulateOptions>();
    CLI::App* cmd = app.add_subcommand(
        "simulate",
        "Scale model on the CPU: planner time, copies, copy traffic, buffer bytes, link bytes and compute imbalance\n"
        "(conventional EP, EPLB-style replication under drift, EvenEP) for each R and maxvio (docs/benchmarks.md).\n"
        "With --workload W or --trace F.npy: every system (evenep_auto, evenep_exact, conventional, eplb, lplb, llep;\n"
        "evenep_placed with --placed) over a step sequence on the same histograms, per-step time of the CPU step\n"
        "model (docs/benchmarks.md, docs/traces.md).");
    add_ints(*cmd, "--R", opt->ranks, "EP group sizes", 1, kMaxRanks);
    add_reals(*cmd, "--maxvio", opt->maxvios, "routing skews (target max/mean - 1); refused when unreachable", 0, 1e6);
    add_int(*cmd, "--E", opt->E, "routed experts", 1, kMaxExperts);
    add_int(*cmd, "--K", opt->K, "top-k", 1, 32);
    add_int(*cmd, "--S", opt->S, "tokens per rank", 1, std::numeric_limits<int>::max());
    add_int(*cmd, "--H", opt->H, "hidden size", 1, kMaxHidden);
    add_int(*cmd, "--ffn-hidden", opt->ffn_hidden, "expert intermediate size H'", 1, kMaxHidden);
    add_int(*cmd, "--tp", opt->tp, "token padding of every expert segment", 1, kMaxTokenPad);
    add_int(*cmd, "--redundant", opt->redundant,
            "EPLB redundant slots per rank (-1: epn, EvenEP's bound); with --workload/--trace only this value "
            "(default there: 1 2 4 epn)",
            -1, kMaxExperts);
    add_real(*cmd, "--drift", opt->drift, "per-step std of each expert's log-popularity (EPLB's staleness)", 0, 100)
        ->capture_default_str();
    add_string(*cmd, "--eplb-sync", opt->eplb_sync,
                    "how a training step keeps EPLB's replicas in sync: star (gradients to the first replica, "
                    "weights back, as EvenEP's copies), ring (all-reduce), none (token traffic only)")
        ->check(CLI::IsMember({"star", "ring", "none"}))
        ->capture_default_str();
    add_u64(*cmd, "--seed", opt->seed, "routing seed");
    add_real(*cmd, "--slack", opt->slack,
             "EvenEP's imbalance budget eps (0 = exact balance; docs/slack.md); with --policy auto, and with "
             "--workload/--trace (evenep_auto's), the largest budget",
             0, 1)
        ->capture_default_str();
    add_policy_option(*cmd, opt->policy);
    add_string(*cmd, "--planner", opt->planner, "planner mode")
        ->check(CLI::IsMember({"reference", "optimized"}))
        ->capture_default_str();
    add_int(*cmd, "--repeat", opt->repeat, "planner runs per point (median reported)", 1, 1000000);
    cmd->add_flag("--quick", opt->quick, "small grid for tests: R 4 8, E 64, K 4, S 512, H 256, H' 128, maxvio 1 10");
    add_input_files(*cmd, "--gpu-json", opt->gpu_json,
                    "GPU planner times: JSON files of `evenep bench gpu-plan --json` (plan_rank_cluster rows, else "
                    "plan_rank)");
    add_output_file(*cmd, "--json", opt->json_file,
                    "write every point as JSON (schema evenep.simulate/1; evenep.workload_run/1 with --workload|--trace)");
    opt->limits.add_to(*cmd);
    auto wl = std::make_shared<WorkloadOptions>();
    add_workload_options(*cmd, *wl, /*model_flags=*/true);
    set_run(cmd, [opt, wl, cmd] {
        opt->maxvio_given = cmd->count("--maxvio") > 0;
        apply_quick(*cmd, *opt);
        check_workload_flags(*cmd, *wl);
        const bool slack_given = cmd->count("--slack") > 0;
        if (!wl->active()) opt->planner_policy = apply_policy(opt->policy, slack_given, opt->slack);
        if (wl->active())  // every system over a step sequence (simulate_workload.cpp)
            return run_simulate_workload(*wl, WorkloadShape{.ranks = opt->ranks,
                                                            .ranks_given = cmd->count("--R") > 0,
                                                            .experts_given = cmd->count("--E") > 0,
                                                            .E = opt->E,
                                                            .K = opt->K,
                                                            .S = opt->S,
                                                            .H = opt->H,
                                                            .ffn_hidden = opt->ffn_hidden,
                                                            .tp = opt->tp,
                                                            .redundant = opt->redundant,
                                                            .redundant_given = cmd->count("--redundant") > 0,
                                                            .eplb_sync = opt->eplb_sync,
                                                            .planner = opt->planner,
                                                            .slack = opt->slack,
                                                            .slack_given = slack_given,
                                                            .seed = opt->seed,
                                                            .json_file = opt->json_file});
        run_simulate(*opt);
    });
}

}  // namespace evenep::cli
