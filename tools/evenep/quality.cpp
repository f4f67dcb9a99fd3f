// `evenep quality`: the planners against the exact optimum (SPEC §3.5) over a generated corpus of small
// instances. Method, figures and the MILP: docs/quality.md.
//
// Exit code: 0 when the corpus meets the bar (optimized within 10% of the optimum on total copies on average,
// and never above the reference on the busiest rank's copy traffic), 1 when it does not (a finding), 2 on bad
// flags or a build without the exact solver.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/error.hpp"
#include "evenep/exact.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep::cli {
namespace {

inline constexpr double kCopiesBar = 1.10;  // mean optimized / optimum total copies must not exceed this
inline constexpr int kDefaultCases = 180;
inline constexpr int kQuickCases = 12;
inline constexpr int kPlanTimingReps = 20;

struct QualityOptions {
    int cases = kDefaultCases;
    uint64_t seed = 1;
    double time_limit = 5.0;  // seconds per exact solve
    std::string json_file;
    bool quick = false;
    bool legacy = false;  // optimized planner with the first release's candidate set (CPU only)
    int only = -1;  // run only this case index of the corpus
    ResourceLimits limits;
};

// Measured over the corpus (docs/estimates.md): ~0.11 s per case of the full corpus (R up to 8; the two exact
// solves dominate, each bounded by --time-limit) and ~0.025 s per --quick case; the solver's libraries and
// models ~32 MiB (--quick ~16 MiB) above the floor.
Estimate quality_estimate(const QualityOptions& opt) {
    Estimate e;
    const double cases = opt.only >= 0 ? 1 : (opt.quick ? kQuickCases : opt.cases);
    e.add_seconds(cases * std::min(opt.quick ? 0.025 : 0.11, 2 * opt.time_limit),
                  fmt::format("{:.0f} cases, two exact solves each", cases));
    e.add_bytes((opt.quick ? 16.0 : 32.0) * (1 << 20), "the exact solver");
    return e;
}

// One kind of routing in the corpus: a lognormal skew (target maxvio) or an adversarial pattern.
struct CaseKind {
    std::string name;
    double target_maxvio = -1;             // >= 0: lognormal at this target
    std::optional<Adversarial> adversarial;  // else this adversarial kind, else round-robin
};

std::vector<CaseKind> corpus_kinds() {
    std::vector<CaseKind> kinds = {{"mv0.2", 0.2, {}}, {"mv1", 1.0, {}}, {"mv3", 3.0, {}}, {"mv10", 10.0, {}},
                                   {"round_robin", -1, {}}};
    for (Adversarial a : all_adversarial()) kinds.push_back({to_string(a), -1, a});
    return kinds;
}

struct Case {
    int index = 0;
    std::string name;
    RoutingSpec spec;
    CaseKind kind;
};

// Case i: kind i mod #kinds; R cycles over {2, 4, 8} once per pass over the kinds; E, K, S drawn from the
// case's own stream of the corpus seed. --quick keeps R <= 4 (and E <= 16, S <= 64).
std::vector<Case> make_corpus(const QualityOptions& opt) {
    const std::vector<CaseKind> kinds = corpus_kinds();
    const int num_kinds = static_cast<int>(kinds.size());
    const int n = opt.quick ? kQuickCases : opt.cases;
    constexpr std::array<int, 3> kRanks = {2, 4, 8};
    constexpr std::array<int, 4> kExperts = {8, 16, 32, 64};
    constexpr std::array<int, 4> kTopK = {1, 2, 4, 8};
    constexpr std::array<int, 5> kTokens = {16, 32, 64, 128, 256};
    std::vector<Case> out;
    for (int i = 0; i < n; ++i) {
        Rng rng(derive_seed(opt.seed, static_cast<uint64_t>(i)));
        const auto pick = [&rng](int count) { return static_cast<int>(rng.next_u64() % static_cast<uint64_t>(count)); };
        Case c;
        c.index = i;
        c.kind = kinds[i % num_kinds];
        c.spec.seed = opt.seed * 100000 + static_cast<uint64_t>(i);  // readable, to reproduce one case
        if (opt.quick) {
            c.spec.R = (i % 2 == 0) ? 2 : 4;
            c.spec.E = kExperts[pick(2)];
            c.spec.K = kTopK[pick(3)];
            c.spec.S = kTokens[pick(3)];
        } else {
            c.spec.R = kRanks[(i / num_kinds) % kRanks.size()];
            c.spec.E = kExperts[pick(kExperts.size())];
            c.spec.K = kTopK[pick(kTopK.size())];
            c.spec.S = kTokens[pick(kTokens.size())];
        }
        c.name = c.kind.name;
        out.push_back(c);
    }
    return out;
}

Routing make_case_routing(const Case& c, double* sigma_out) {
    if (c.kind.target_maxvio >= 0) return make_target_maxvio(c.spec, c.kind.target_maxvio, sigma_out);
    if (c.kind.adversarial) return make_adversarial(c.spec, *c.kind.adversarial);
    return make_round_robin(c.spec);
}

struct PlannerFigures {
    int64_t copies = 0, traffic = 0, crossing = 0;
    double plan_us = 0;  // median wall time of one Planner::plan (all ranks' plan on one CPU thread)
};

struct CaseResult {
    Case c;
    double maxvio = 0, sigma = -1;
    int64_t entries = 0;
    ExactResult copies_opt, traffic_opt;
    PlannerFigures optimized, reference;
};

PlannerFigures run_planner(const Config& cfg, PlannerMode mode, const std::vector<int32_t>& tpe,
                           const std::vector<int32_t>& s, bool extended = true) {
    Planner planner(cfg, mode, extended);
    Plan plan;
    planner.plan(tpe, s, plan);
    std::vector<double> t;
    for (int i = 0; i < kPlanTimingReps; ++i) {
        const double t0 = now_seconds();
        planner.plan(tpe, s, plan);
        t.push_back(now_seconds() - t0);
    }
    return {plan.cost.total_copies, plan.cost.max_rank_copy_traffic, plan.cost.crossing_rows, median(t) * 1e6};
}

CaseResult run_case(const Case& c, double time_limit, bool legacy) {
    CaseResult r;
    r.c = c;
    const Routing routing = make_case_routing(c, &r.sigma);
    const std::vector<int32_t> tpe = routing.tpe();
    r.maxvio = routing.maxvio();
    r.entries = routing.total_entries();
    // tp does not enter any cost; 1 keeps the receive buffer small.
    const Config cfg{.R = c.spec.R, .E = c.spec.E, .K = c.spec.K, .S = c.spec.S, .B = -1, .tp = 1};
    r.optimized = run_planner(cfg, PlannerMode::kOptimized, tpe, routing.s, !legacy);
    r.reference = run_planner(cfg, PlannerMode::kReference, tpe, routing.s);
    r.copies_opt = solve_exact(cfg, tpe, routing.s, ExactObjective::kTotalCopies, time_limit);
    r.traffic_opt = solve_exact(cfg, tpe, routing.s, ExactObjective::kMaxRankCopyTraffic, time_limit);
    return r;
}

// Mean and max of a ratio over the cases where the optimum is positive; `zero` counts the others.
struct RatioStats {
    double sum = 0, max = 0;
    int count = 0, zero = 0, zero_miss = 0;  // zero_miss: optimum 0 but the planner made copies
    void add(int64_t planner, int64_t optimum) {
        if (optimum <= 0) {
            ++zero;
            if (planner > 0) ++zero_miss;
            return;
        }
        const double ratio = static_cast<double>(planner) / static_cast<double>(optimum);
        sum += ratio;
        max = std::max(max, ratio);
        ++count;
    }
    double mean() const { return count > 0 ? sum / count : 1.0; }
    nlohmann::json to_json() const {
        return {{"mean", mean()}, {"max", count > 0 ? max : 1.0}, {"cases", count}, {"optimum_zero", zero},
                {"optimum_zero_but_copies", zero_miss}};
    }
};

nlohmann::json case_json(const CaseResult& r) {
    const auto exact = [](const ExactResult& e) {
        return nlohmann::json{{"total_copies", e.total_copies},
                              {"max_rank_copy_traffic", e.max_rank_copy_traffic},
                              {"crossing_rows", e.crossing_rows},
                              {"optimal", e.optimal},
                              {"seconds", e.seconds}};
    };
    const auto planner = [](const PlannerFigures& p) {
        return nlohmann::json{{"total_copies", p.copies},
                              {"max_rank_copy_traffic", p.traffic},
                              {"crossing_rows", p.crossing},
                              {"plan_us", p.plan_us}};
    };
    return {{"index", r.c.index},
            {"name", r.c.name},
            {"R", r.c.spec.R},
            {"E", r.c.spec.E},
            {"K", r.c.spec.K},
            {"S", r.c.spec.S},
            {"seed", r.c.spec.seed},
            {"target_maxvio", r.c.kind.target_maxvio},
            {"sigma", r.sigma},
            {"maxvio", r.maxvio},
            {"entries", r.entries},
            {"optimum_copies", exact(r.copies_opt)},
            {"optimum_traffic", exact(r.traffic_opt)},
            {"optimized", planner(r.optimized)},
            {"reference", planner(r.reference)}};
}

void run_quality(const QualityOptions& opt) {
    EVENEP_CHECK(exact_solver_available(),
                 "quality: this build has no exact solver (configure with CBC: coinor-libcbc-dev, pkg-config cbc)");
    OutputFile json("--json", opt.json_file);  // checked now, written atomically at the end
    std::vector<Case> corpus = make_corpus(opt);
    if (opt.only >= 0) {
        EVENEP_CHECK(opt.only < static_cast<int>(corpus.size()), "quality: --only = ", opt.only,
                     " outside the corpus of ", corpus.size(), " cases");
        corpus = {corpus[opt.only]};
    }
    fmt::print("evenep quality: {} cases, corpus seed {}, solver time limit {} s per objective{}\n", corpus.size(),
               opt.seed, opt.time_limit, opt.quick ? " (quick corpus)" : "");
    fmt::print("copies = total copies (sum of remote experts); traffic = busiest rank's copies received + pushed;\n"
               "opt* = exact optimum (MILP, CBC) of that objective; optd = optimized planner; ref = reference.\n");
    fmt::print("{:>3} {:<18} {:>2} {:>3} {:>2} {:>4} {:>7} | {:>5} {:>5} {:>5} | {:>5} {:>5} {:>5} | {:>6} {:>7} "
               "{:>8} {:>8}\n",
               "#", "name", "R", "E", "K", "S", "maxvio", "opt*", "optd", "ref", "opt*", "optd", "ref", "proved",
               "solve_s", "plan_us", "seed");

    std::vector<CaseResult> results;
    RatioStats copies_optd, copies_ref, traffic_optd, traffic_ref;
    int traffic_worse = 0, copies_worse = 0, unproved_copies = 0, unproved_traffic = 0;
    double solve_total = 0, plan_optd_us = 0, plan_ref_us = 0;
    const double t_start = now_seconds();
    for (const Case& c : corpus) {
        const CaseResult r = run_case(c, opt.time_limit, opt.legacy);
        const bool proved = r.copies_opt.optimal && r.traffic_opt.optimal;
        fmt::print("{:>3} {:<18} {:>2} {:>3} {:>2} {:>4} {:>7.3f} | {:>5} {:>5} {:>5} | {:>5} {:>5} {:>5} | {:>6} "
                   "{:>7.2f} {:>8.1f} {:>8}\n",
                   c.index, c.name, c.spec.R, c.spec.E, c.spec.K, c.spec.S, r.maxvio, r.copies_opt.total_copies,
                   r.optimized.copies, r.reference.copies, r.traffic_opt.max_rank_copy_traffic, r.optimized.traffic,
                   r.reference.traffic,
                   proved ? "yes" : (r.copies_opt.optimal ? "no(t)" : (r.traffic_opt.optimal ? "no(c)" : "no")),
                   r.copies_opt.seconds + r.traffic_opt.seconds, r.optimized.plan_us, c.spec.seed);
        std::fflush(stdout);
        copies_optd.add(r.optimized.copies, r.copies_opt.total_copies);
        copies_ref.add(r.reference.copies, r.copies_opt.total_copies);
        traffic_optd.add(r.optimized.traffic, r.traffic_opt.max_rank_copy_traffic);
        traffic_ref.add(r.reference.traffic, r.traffic_opt.max_rank_copy_traffic);
        if (r.optimized.traffic > r.reference.traffic) ++traffic_worse;
        if (r.optimized.copies > r.reference.copies) ++copies_worse;
        if (!r.copies_opt.optimal) ++unproved_copies;
        if (!r.traffic_opt.optimal) ++unproved_traffic;
        solve_total += r.copies_opt.seconds + r.traffic_opt.seconds;
        plan_optd_us += r.optimized.plan_us;
        plan_ref_us += r.reference.plan_us;
        results.push_back(r);
    }
    const double n = static_cast<double>(results.size());
    const bool pass = copies_optd.mean() <= kCopiesBar && traffic_worse == 0 && copies_optd.zero_miss == 0;

    fmt::print("\nsummary over {} cases ({:.1f} s; solver {:.1f} s):\n", results.size(), now_seconds() - t_start,
               solve_total);
    fmt::print("  proved optimal: total copies {}/{}, traffic {}/{} (unproved cases compare against the best "
               "solution found)\n",
               results.size() - unproved_copies, results.size(), results.size() - unproved_traffic, results.size());
    const auto line = [](const char* what, const RatioStats& optd, const RatioStats& ref) {
        fmt::print("  {:<22} optimized/optimum mean {:.3f} max {:.3f} | reference/optimum mean {:.3f} max {:.3f} | "
                   "{} cases with optimum > 0, {} with optimum 0 ({} with planner copies)\n",
                   what, optd.mean(), optd.count > 0 ? optd.max : 1.0, ref.mean(), ref.count > 0 ? ref.max : 1.0,
                   optd.count, optd.zero, optd.zero_miss);
    };
    line("total copies:", copies_optd, copies_ref);
    line("busiest-rank traffic:", traffic_optd, traffic_ref);
    fmt::print("  cases with optimized traffic > reference traffic: {} (must be 0)\n", traffic_worse);
    fmt::print("  cases with optimized copies > reference copies: {}\n", copies_worse);
    fmt::print("  planner wall time per plan (median of {} runs, mean over cases): optimized {:.1f} us, reference "
               "{:.1f} us\n",
               kPlanTimingReps, plan_optd_us / n, plan_ref_us / n);
    fmt::print("{}: optimized/optimum total copies mean {:.3f} (bar <= {:.2f}), traffic above reference in {} cases "
               "(bar 0){}\n",
               pass ? "PASS" : "FAIL", copies_optd.mean(), kCopiesBar, traffic_worse,
               copies_optd.zero_miss > 0 ? fmt::format(", copies where the optimum is 0 in {} cases",
                                                       copies_optd.zero_miss)
                                         : "");
    std::fflush(stdout);

    if (!opt.json_file.empty()) {
        nlohmann::json cases = nlohmann::json::array();
        for (const CaseResult& r : results) cases.push_back(case_json(r));
        const nlohmann::json summary = {{"cases", results.size()},
                                        {"unproved_copies", unproved_copies},
                                        {"unproved_traffic", unproved_traffic},
                                        {"total_copies_optimized", copies_optd.to_json()},
                                        {"total_copies_reference", copies_ref.to_json()},
                                        {"traffic_optimized", traffic_optd.to_json()},
                                        {"traffic_reference", traffic_ref.to_json()},
                                        {"traffic_optimized_above_reference", traffic_worse},
                                        {"copies_optimized_above_reference", copies_worse},
                                        {"plan_us_optimized_mean", plan_optd_us / n},
                                        {"plan_us_reference_mean", plan_ref_us / n},
                                        {"solver_seconds", solve_total},
                                        {"copies_bar", kCopiesBar},
                                        {"pass", pass}};
        const nlohmann::json corpus = {{"seed", opt.seed}, {"quick", opt.quick}, {"time_limit_s", opt.time_limit}};
        json.write(
            nlohmann::json{{"command", "quality"}, {"corpus", corpus}, {"cases", cases}, {"summary", summary}}.dump(2) +
            "\n");
        json.close();
    }
    // A miss of the bar is a finding, not a crash: exit code 1 (main maps a non-argument Error to 1).
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, pass, "quality: FAIL (see the summary above)");
}

}  // namespace

void register_quality(CLI::App& app) {
    auto opt = std::make_shared<QualityOptions>();
    CLI::App* cmd = app.add_subcommand(
        "quality", "Planners vs the exact optimum (MILP, CBC) over a generated corpus of small instances "
                   "(docs/quality.md). Exit 0: PASS, 1: FAIL, 2: bad input.");
    CLI::Option* cases = add_int(*cmd, "--cases", opt->cases, "Number of generated cases", 1, 1000000);
    add_u64(*cmd, "--seed", opt->seed, "Corpus seed (every case derives its own)");
    add_real(*cmd, "--time-limit", opt->time_limit, "Solver time limit per objective and case, seconds", 1e-3, 1e6)
        ->capture_default_str();
    add_output_file(*cmd, "--json", opt->json_file,
                    "Write per-case and summary figures to FILE (written whole at the end; the old file stays on any error)");
    cmd->add_flag("--quick", opt->quick, "A tiny corpus (R <= 4) for smoke tests; excludes --cases")->excludes(cases);
    cmd->add_flag("--legacy-candidates", opt->legacy,
                  "Optimized planner with the first release's candidate set (two global fills, no overshoot, push "
                  "spreading or paths; CPU only), to measure what the default set buys");
    add_int(*cmd, "--only", opt->only, "Run only case INDEX of the corpus (to reproduce one row)", -1, 1000000);
    opt->limits.add_to(*cmd);
    set_run(cmd, [opt] {
        check_estimate("quality", quality_estimate(*opt), opt->limits);
        run_quality(*opt);
    });
}

}  // namespace evenep::cli
