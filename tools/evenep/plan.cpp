// `evenep plan`: balance report for a configuration or a routing file; --json dumps the plan (docs/plan-schema.md).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/buffer.hpp"
#include "evenep/detail/plan_relay.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"
#include "evenep/plan.hpp"
#include "evenep/validate.hpp"

namespace evenep::cli {
namespace {

struct PlanOptions {
    RoutingOptions routing;
    int H = 7168;
    int ffn_hidden = 2048;
    int repeat = 20;
    bool check = false;
    bool quiet = false;
    bool legacy = false;
    bool relay = false;
    std::string json_file;
};

// Memory and time of the run past the input (the generator's and the histograms' part are added by
// resolve_routing). Fitted on the build machine (docs/estimates.md): --repeat plans of the (R, E) planner state
// and ~50 ns per pair to set it up; the report's relay bound ~9 B per pair; with a routing, every rank's dst
// (4 B and ~55 ns per entry) and the report's traffic models (~25 ns per entry); --check (validate_dst) ~16 B and
// ~40 ns per receive row of the group (R*NvS, which grows with --tp); --json ~48 B per dst entry while the JSON
// is built.
Estimate plan_estimate(const PlanOptions& opt, const Config& c, bool has_routing) {
    const double pairs = static_cast<double>(c.R) * c.E;
    const double entries = has_routing ? static_cast<double>(c.R) * c.S * c.K : 0;
    const double rows = static_cast<double>(c.R) * static_cast<double>(c.recv_rows());
    Estimate e;
    e.add_bytes(plan_bytes(c.R, c.E), fmt::format("planner state of R*E = {:.3g} (rank, expert) pairs", pairs));
    e.add_seconds(std::max(1, opt.repeat) * plan_seconds(c.R, c.E) + 50e-9 * pairs,
                  fmt::format("{} plans of R*E = {:.3g} pairs", opt.repeat, pairs));
    e.add_bytes(4 * entries, fmt::format("dst of R*S*K = {:.3g} entries", entries));
    e.add_seconds((opt.quiet ? 55e-9 : 80e-9) * entries,
                  fmt::format("dst and traffic of R*S*K = {:.3g} entries", entries));
    if (!opt.quiet) e.add_bytes(9 * pairs, "the relay lower bound of the report");
    if (opt.check) {
        e.add_bytes(16 * rows + 8 * entries,
                    fmt::format("--check over R*NvS = {:.3g} receive rows (NvS grows with --tp)", rows));
        e.add_seconds(40e-9 * rows + 40e-9 * entries, fmt::format("--check over R*NvS = {:.3g} receive rows", rows));
    }
    if (!opt.json_file.empty()) e.add_bytes(48 * (entries + 4 * pairs), "--json of the plan and dst");
    return e;
}

void run_plan(const PlanOptions& opt) {
    EVENEP_CHECK(!opt.legacy || opt.routing.planner == "optimized",
                 "--legacy-candidates needs --planner optimized (got --planner ", opt.routing.planner, ")");
    OutputFile json("--json", opt.json_file);  // checked now, written atomically at the end
    RoutingInput in = resolve_routing(opt.routing, "plan", [&opt](const Config& c, bool has_routing) {
        return plan_estimate(opt, c, has_routing);
    });
    const Config& cfg = in.cfg;
    Planner planner(cfg, in.mode, !opt.legacy);
    planner.set_relay(opt.relay);
    Plan plan;
    std::vector<double> times;
    for (int i = 0; i < std::max(1, opt.repeat); ++i) {
        const double t0 = now_seconds();
        planner.plan(in.tpe, in.s, plan);
        times.push_back(now_seconds() - t0);
    }
    std::vector<std::vector<int32_t>> dst;
    double dst_seconds = 0;
    if (in.routing) {
        dst.resize(cfg.R);
        const double t0 = now_seconds();
        for (int r = 0; r < cfg.R; ++r) {
            dst[r].resize(static_cast<size_t>(in.s[r]) * cfg.K);
            compute_dst(plan, r, in.routing->topk_idx[r], dst[r]);
        }
        dst_seconds = (now_seconds() - t0) / cfg.R;
    }

    const int64_t N = plan.total_entries();
    const double mean_load = static_cast<double>(N) / cfg.R;
    const int64_t max_before = *std::max_element(plan.load_before.begin(), plan.load_before.end());
    const int32_t max_after = *std::max_element(plan.q.begin(), plan.q.end());
    const double maxvio = [&] {
        double mx = 0, sum = 0;
        for (int64_t t : plan.expert_load) {
            mx = std::max(mx, static_cast<double>(t));
            sum += static_cast<double>(t);
        }
        return sum > 0 ? mx / (sum / cfg.E) - 1 : 0.0;
    }();

    if (!opt.quiet) {
        fmt::print("EvenEP plan — {} planner={}\n", cfg.to_string(), to_string(in.mode));
        fmt::print("routing: {}; N = {} entries, maxvio = {:.3f}\n", in.description, N, maxvio);
        if (cfg.policy == PlannerPolicy::kAuto)  // docs/auto.md
            fmt::print("policy auto: this step's budget slack = {:g} (slack_ppm {}) of at most {:g}\n",
                       plan.slack_ppm * 1e-6, plan.slack_ppm, cfg.slack);
        fmt::print("\n");
        constexpr int kBar = 24;
        fmt::print("{:>4}  {:>9} {:<{}}  {:>9} {:<{}}  {:>9}  {:>7}  {:>9}\n", "rank", "conv. EP", "", kBar, "EvenEP",
                   "", kBar, "remote", "push", "crossing");
        for (int r = 0; r < cfg.R; ++r) {
            fmt::print("{:>4}  {:>9} {:<{}}  {:>9} {:<{}}  {:>4}/{:<4}  {:>7}  {:>9}\n", r, plan.load_before[r],
                       bar(static_cast<double>(plan.load_before[r]), static_cast<double>(max_before), kBar), kBar,
                       plan.q[r], bar(plan.q[r], static_cast<double>(max_before), kBar), kBar, plan.remote_experts[r],
                       cfg.epn(), plan.copies_pushed[r], plan.crossing_out[r]);
        }
        fmt::print("\nbusiest rank: conventional EP {} entries ({:.2f}x mean) -> EvenEP {} ({:.4f}x mean)\n",
                   max_before, max_before / std::max(1.0, mean_load), max_after, max_after / std::max(1.0, mean_load));
        fmt::print("copies: total {}, busiest rank's copy traffic {} (received + pushed), bound per rank epn = {}, "
                   "Theorem-2 worst-case need ceil(E(R-1)/R^2) = {}\n",
                   plan.cost.total_copies, plan.cost.max_rank_copy_traffic, cfg.epn(),
                   theorem2_lower_bound(cfg.E, cfg.R));
        {
            std::vector<int32_t> work(detail::plan_relay_work_size(cfg.R, cfg.E, cfg.num_slots()));
            const int32_t bound = detail::plan_relay_lower_bound(
                detail::RelayDims{cfg.R, cfg.E, cfg.epn(), cfg.num_slots()}, plan.copies.data(), work.data());
            fmt::print("copy critical path: {} rounds {} (direct pushes: {}; lower bound of any relay tree: {})\n",
                       plan.cost.copy_critical_path, opt.relay ? "with relays" : "of direct pushes (--relay plans relays)",
                       plan.cost.direct_critical_path, bound);
        }
        int64_t peer = 0;
        for (int32_t p : plan.peer_reads) peer += p;
        if (peer > 0) fmt::print("peer-read remote experts (B = {} < epn): {}\n", cfg.num_slots(), peer);
        fmt::print("moved entries (computed away from home): {} ({:.2f}%), crossing entries (away from source): {} "
                   "({:.2f}%)\n",
                   plan.cost.moved_entries, 100.0 * plan.cost.moved_entries / std::max<int64_t>(1, N),
                   plan.cost.crossing_rows, 100.0 * plan.cost.crossing_rows / std::max<int64_t>(1, N));
        fmt::print("\nlink bytes of one training step (H = {}, H' = {}; formulas in docs/data-path.md):\n", opt.H,
                   opt.ffn_hidden);
        if (in.routing) {
            const TrafficReport ev = evenep_traffic(plan, dst, opt.H, opt.ffn_hidden, /*training=*/true);
            const TrafficReport cv = conventional_traffic(cfg, in.routing->topk_idx, opt.H, /*training=*/true);
            fmt::print("  {:<18} {:>12} {:>14}   {:>12} {:>14}\n", "phase", "EvenEP", "busiest rank", "conv. EP",
                       "busiest rank");
            const auto row = [](const char* name, const PhaseTraffic& a, const PhaseTraffic& b) {
                fmt::print("  {:<18} {:>12} {:>14}   {:>12} {:>14}\n", name, human_bytes(a.bytes),
                           human_bytes(a.max_rank_bytes()), human_bytes(b.bytes), human_bytes(b.max_rank_bytes()));
            };
            row("dispatch", ev.dispatch, cv.dispatch);
            row("combine", ev.combine, cv.combine);
            row("combine_backward", ev.combine_backward, cv.combine_backward);
            row("dispatch_backward", ev.dispatch_backward, cv.dispatch_backward);
            row("prefetch_weight", ev.prefetch, cv.prefetch);
            row("reduce_grad", ev.reduce_grad, cv.reduce_grad);
            row("total", ev.total(), cv.total());
        } else {
            int64_t prefetched = 0;
            for (int32_t c : plan.copies_received) prefetched += c;
            const double expert_bytes = 3.0 * opt.H * opt.ffn_hidden * 2;
            fmt::print("  dispatch tokens   <= {} (no routing given: {} crossing entries, before dedup)\n",
                       human_bytes(static_cast<double>(plan.cost.crossing_rows) * (opt.H * 2 + 4)),
                       plan.cost.crossing_rows);
            fmt::print("  prefetch weights  {} ({} copies x 3*H*H'*2 B), reduce_grad {} (fp32)\n",
                       human_bytes(prefetched * expert_bytes), prefetched, human_bytes(prefetched * expert_bytes * 2));
        }
        fmt::print("\nplanner time: median {:.1f} us over {} runs (all ranks' plan, one thread)", median(times) * 1e6,
                   times.size());
        if (in.routing) fmt::print("; dst per rank {:.1f} us", dst_seconds * 1e6);
        fmt::print("\n");
    }

    if (json.active()) {
        json.write(plan_to_json(plan, dst) + "\n");
        json.close();
        if (!opt.quiet) fmt::print("plan written to {}\n", opt.json_file);
    }
    if (opt.check) {
        ValidationReport report = validate_plan(plan);
        if (report.ok() && in.routing) report = validate_dst(plan, *in.routing, dst);
        if (!report.ok()) {
            fmt::print(stderr, "check: FAILED\n{}\n", report.summary());
            throw Error(ErrorKind::kInternal, "plan check failed");
        }
        fmt::print("check: OK (validator: balance, conservation, bound, layout, copies, counters{})\n",
                   in.routing ? ", dst" : "");
    }
}

}  // namespace

void register_plan(CLI::App& app) {
    auto opt = std::make_shared<PlanOptions>();
    CLI::App* cmd = app.add_subcommand(
        "plan",
        "Plan one step: per-rank load before/after balancing, copies, crossing rows, link bytes, planner time.\n"
        "Routing comes from a generator (default: the MoonEP benchmark point R=8 E=384 K=8 S=8192, maxvio 1),\n"
        "a histogram file (--tpe) or a routing file (--routing FILE.npy --E N). A run whose memory or time estimate\n"
        "passes --max-memory / --max-time is refused before it starts (exit 2).");
    opt->routing.add_to(*cmd);
    add_int(*cmd, "--H", opt->H, "hidden size, for byte estimates", 1, kMaxHidden);
    add_int(*cmd, "--ffn-hidden", opt->ffn_hidden, "expert FFN intermediate size H', for byte estimates", 1,
            kMaxHidden);
    add_int(*cmd, "--repeat", opt->repeat, "plan this many times and report the median time", 1, 1000000);
    cmd->add_flag("--check", opt->check, "validate the plan (and dst) with the independent validator; exit 1 if bad");
    cmd->add_flag("--legacy-candidates", opt->legacy,
                  "optimized mode: only the first release's candidates (two global fills, no overshoot, push "
                  "spreading or paths; CPU only), to measure what the default set buys; refused with --planner "
                  "reference");
    cmd->add_flag("--relay", opt->relay,
                  "relayed prefetch: ranks that received a copy forward it when that shortens the copy critical path "
                  "(docs/relayed-prefetch.md)");
    cmd->add_flag("--quiet", opt->quiet, "print nothing but errors and the check line");
    add_output_file(*cmd, "--json", opt->json_file,
                    "write the plan as JSON (schema evenep.plan/2, docs/plan-schema.md); written whole at the end");
    set_run(cmd, [opt] { run_plan(*opt); });
}

}  // namespace evenep::cli
