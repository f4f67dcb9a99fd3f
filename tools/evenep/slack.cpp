// `evenep slack`: the imbalance budget trade (SPEC §3.6, docs/slack.md). For each routing skew of the grid and each
// ε: total copies, the most copies one rank holds, the busiest rank's copy traffic (received + pushed), moved and
// crossing entries, and the compute imbalance the budget costs (largest target / mean). Every plan is checked by
// the independent validator first (exit 1 if one fails). A run whose estimate passes --max-memory / --max-time is
// refused before it starts (exit 2).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace evenep::cli {
namespace {

struct SlackOptions {
    int R = 8, E = 384, K = 8, S = 8192, tp = 128;
    std::vector<double> maxvios{0.2, 1, 10, 20};
    std::vector<double> slacks{0, 0.01, 0.02, 0.05, 0.1};
    uint64_t seed = 1;
    std::string planner = "optimized";
    bool quick = false;
    bool maxvio_given = false;  // --maxvio on the command line: an unreachable target is refused (as in plan, a
                                // default target that this shape cannot reach is drawn as close as it gets)
    std::string json_file;
    ResourceLimits limits;
};

// One lognormal routing per maxvio (routing_near_maxvio: a small probe, then one full draw; one alive at a time)
// and one plan plus one validation per (maxvio, eps): the plan model of `evenep plan` (estimate.hpp), the
// validator ~16 B and ~40 ns per (rank, expert) pair (docs/estimates.md).
Estimate slack_estimate(const SlackOptions& o) {
    Estimate e;
    add_near_maxvio_estimate(o.R, o.E, o.K, o.S, static_cast<int>(o.maxvios.size()), e);
    const double pairs = static_cast<double>(o.R) * o.E;
    const double plans = static_cast<double>(o.maxvios.size() * o.slacks.size());
    e.add_bytes(plan_bytes(o.R, o.E) + 4 * pairs + 16 * pairs,
                fmt::format("histograms, planner and validator state of R*E = {:.3g} pairs", pairs));
    e.add_seconds(plans * (plan_seconds(o.R, o.E) + 90e-9 * pairs),
                  fmt::format("{:.0f} plans and validations of R*E = {:.3g} pairs", plans, pairs));
    return e;
}

// The small grid of --quick (tests): applied to every option not given on the command line.
void apply_quick(const CLI::App& cmd, SlackOptions& o) {
    if (!o.quick) return;
    if (cmd.count("--R") == 0) o.R = 4;
    if (cmd.count("--E") == 0) o.E = 32;
    if (cmd.count("--K") == 0) o.K = 4;
    if (cmd.count("--S") == 0) o.S = 256;
    if (cmd.count("--maxvio") == 0) o.maxvios = {1, 10};
}

nlohmann::json slack_row(const Plan& plan, double target, double maxvio, double slack, int64_t copies_at_zero) {
    const Config& cfg = plan.cfg;
    const int64_t N = plan.total_entries();
    const double mean = static_cast<double>(N) / cfg.R;
    const int32_t max_rows = *std::max_element(plan.q.begin(), plan.q.end());
    const int max_remote = *std::max_element(plan.remote_experts.begin(), plan.remote_experts.end());
    const double imbalance = mean > 0 ? max_rows / mean : 1.0;
    fmt::print("{:>7} {:>7.3f} {:>6.3f} {:>7} {:>8} {:>7} {:>4}/{:<4} {:>5} {:>10} {:>10} {:>8} {:>8.5f}\n",
               fmt::format("{:g}", target), maxvio, slack, plan.cost.total_copies,
               copies_at_zero > 0
                   ? fmt::format("{:+.1f}%", 100.0 * (plan.cost.total_copies - copies_at_zero) / copies_at_zero)
                   : std::string("-"),
               plan.cost.max_rank_copy_traffic, max_remote, cfg.epn(), "", plan.cost.moved_entries,
               plan.cost.crossing_rows, max_rows, imbalance);
    return {{"target_maxvio", target},
            {"maxvio", maxvio},
            {"slack", slack},
            {"slack_ppm", cfg.slack_ppm()},
            {"NvS", cfg.recv_rows()},
            {"total_entries", N},
            {"total_copies", plan.cost.total_copies},
            {"max_rank_copies", max_remote},
            {"max_rank_copy_traffic", plan.cost.max_rank_copy_traffic},
            {"moved_entries", plan.cost.moved_entries},
            {"crossing_rows", plan.cost.crossing_rows},
            {"max_rank_rows", max_rows},
            {"imbalance", imbalance}};
}

void run_slack(const SlackOptions& o) {
    OutputFile json("--json", o.json_file);  // checked now, written atomically at the end
    EVENEP_CHECK(!o.maxvios.empty(), "--maxvio: give at least one value");
    EVENEP_CHECK(!o.slacks.empty(), "--slack: give at least one value");
    const PlannerMode mode = parse_planner_mode(o.planner);
    for (double eps : o.slacks) Config{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .tp = o.tp, .slack = eps}.validate();
    check_estimate("slack", slack_estimate(o), o.limits);
    if (o.maxvio_given)  // the rule of every command: refused, never clamped
        check_maxvio_reachable(RoutingSpec{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .seed = o.seed}, o.maxvios);
    const double t0 = now_seconds();
    fmt::print("EvenEP imbalance budget — R={} E={} K={} S={} tp={} planner={} seed={}\n", o.R, o.E, o.K, o.S, o.tp,
               o.planner, o.seed);
    fmt::print("{:>7} {:>7} {:>6} {:>7} {:>8} {:>7} {:>9} {:>5} {:>10} {:>10} {:>8} {:>8}\n", "target", "maxvio",
               "slack", "copies", "vs eps=0", "traffic", "max/epn", "", "moved", "crossing", "max rows", "max/mean");
    nlohmann::json rows = nlohmann::json::array();
    bool all_valid = true;
    for (double target : o.maxvios) {
        const RoutingSpec spec{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .seed = o.seed};
        const Routing routing = routing_near_maxvio(spec, target);
        const std::vector<int32_t> tpe = routing.tpe();
        const double maxvio = routing.maxvio();
        int64_t copies_at_zero = -1;
        for (double eps : o.slacks) {
            const Config cfg{.R = o.R, .E = o.E, .K = o.K, .S = o.S, .tp = o.tp, .slack = eps};
            Plan plan;
            Planner(cfg, mode).plan(tpe, routing.s, plan);
            const ValidationReport report = validate_plan(plan);
            if (!report.ok()) {
                all_valid = false;
                fmt::print(stderr, "check: maxvio {:g} slack {:g}: FAILED\n{}\n", target, eps, report.summary());
            }
            if (eps == 0) copies_at_zero = plan.cost.total_copies;
            nlohmann::json row = slack_row(plan, target, maxvio, eps, copies_at_zero);
            row["valid"] = report.ok();
            rows.push_back(std::move(row));
        }
        std::fflush(stdout);
    }
    const double seconds = now_seconds() - t0;
    fmt::print(
        "columns: copies = total remote experts (vs eps=0: change against the slack-0 row of the same routing); "
        "traffic = busiest rank's copies received + pushed (expert weights); max/epn = most remote experts on one "
        "rank / bound; moved = entries computed away from home; crossing = entries computed away from their source "
        "rank; max rows = largest target, max/mean = that over N/R (<= ceil((1+eps)q)/mean). Every plan passed the "
        "validator: {}. {:.1f} s\n",
        all_valid ? "yes" : "NO", seconds);
    if (json.active()) {
        const nlohmann::json j{{"schema", "evenep.slack/1"},
                               {"config", {{"R", o.R}, {"E", o.E}, {"K", o.K}, {"S", o.S}, {"tp", o.tp}}},
                               {"planner", o.planner},
                               {"seed", o.seed},
                               {"rows", rows}};
        json.write(j.dump(1) + "\n");
        json.close();
    }
    if (!all_valid) throw Error(ErrorKind::kInternal, "slack: a plan failed the validator");
}

}  // namespace

void register_slack(CLI::App& app) {
    auto opt = std::make_shared<SlackOptions>();
    CLI::App* cmd = app.add_subcommand(
        "slack",
        "Imbalance budget: copies, the busiest rank's copy traffic and the compute imbalance vs slack eps for each\n"
        "routing skew (default: the MoonEP point R=8 E=384 K=8 S=8192, maxvio 0.2 1 10 20, eps 0 .. 0.1;\n"
        "docs/slack.md). Every plan is validated; exit 1 if one fails.");
    add_int(*cmd, "--R", opt->R, "EP group size (ranks)", 1, kMaxRanks);
    add_int(*cmd, "--E", opt->E, "routed experts in the group (E % R == 0)", 1, kMaxExperts);
    add_int(*cmd, "--K", opt->K, "top-k experts per token", 1, 32);
    add_int(*cmd, "--S", opt->S, "tokens per rank", 1, std::numeric_limits<int>::max());
    add_int(*cmd, "--tp", opt->tp, "token padding of every non-empty expert segment", 1, kMaxTokenPad);
    add_reals(*cmd, "--maxvio", opt->maxvios, "routing skews (target max/mean - 1)", 0, 1e6);
    add_reals(*cmd, "--slack", opt->slacks, "imbalance budgets eps", 0, 1);
    add_u64(*cmd, "--seed", opt->seed, "routing seed");
    add_string(*cmd, "--planner", opt->planner, "planner mode")
        ->check(CLI::IsMember({"reference", "optimized"}))
        ->capture_default_str();
    cmd->add_flag("--quick", opt->quick, "small grid for tests: R 4, E 32, K 4, S 256, maxvio 1 10");
    add_output_file(*cmd, "--json", opt->json_file, "write every row as JSON (schema evenep.slack/1)");
    opt->limits.add_to(*cmd);
    set_run(cmd, [opt, cmd] {
        opt->maxvio_given = cmd->count("--maxvio") > 0;
        apply_quick(*cmd, *opt);
        run_slack(*opt);
    });
}

}  // namespace evenep::cli
