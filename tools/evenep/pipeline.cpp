// `evenep pipeline`: the interleaved 1F1B pipeline with the vision encoder placed by every policy side by side;
// --grid sweeps the ViT load, --cp-table reports dynamic context parallelism. Model and figures: docs/pipeline.md.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/error.hpp"
#include "evenep/pipeline.hpp"

namespace evenep::cli {
namespace {

namespace pl = evenep::pipeline;

inline constexpr double kGridLoads[] = {0.25, 0.5, 0.75, 1.0, 1.5, 2.0};
inline constexpr int kCpSizes[] = {1, 2, 4, 8, 16, 32};

struct PipelineOptions {
    int P = 4, m = 8, V = 1;
    double latency = 0;
    std::string costs_file;
    std::string policy = "bubbles";
    std::string images_file;
    std::string mix = "mixed";
    int images_per_mb = 4;
    uint64_t seed = 1;
    double vit_load = 0.5;
    int cp = 1;
    double time_limit = 10;
    std::string json_file, svg_file;
    bool grid = false;
    bool cp_table = false;
    int world = 32;
    int images_per_rank = 4;
    ResourceLimits limits;
};

pl::PipelineConfig make_config(const PipelineOptions& opt) {
    EVENEP_CHECK(opt.P >= 1, "pipeline: --P = ", opt.P, " must be >= 1");
    EVENEP_CHECK(opt.m >= 1, "pipeline: --m = ", opt.m, " must be >= 1");
    EVENEP_CHECK(opt.V >= 1, "pipeline: --V = ", opt.V, " must be >= 1");
    EVENEP_CHECK(opt.V == 1 || opt.m % opt.P == 0, "pipeline: --m = ", opt.m, " must be a multiple of --P = ", opt.P,
                 " when --V = ", opt.V, " > 1");
    EVENEP_CHECK(opt.latency >= 0, "pipeline: --latency = ", opt.latency, " must be >= 0");
    EVENEP_CHECK(opt.images_per_mb >= 1, "pipeline: --images-per-mb = ", opt.images_per_mb, " must be >= 1");
    EVENEP_CHECK(opt.vit_load > 0, "pipeline: --vit-load = ", opt.vit_load,
                 " must be > 0 (a load of 0 is no ViT work: the 'none' row of every run shows that schedule)");
    EVENEP_CHECK(opt.cp >= 1, "pipeline: --cp = ", opt.cp, " must be >= 1");
    EVENEP_CHECK(opt.time_limit > 0, "pipeline: --time-limit = ", opt.time_limit, " must be > 0");
    pl::PipelineConfig cfg{.P = opt.P, .m = opt.m, .V = opt.V, .latency = opt.latency, .forward = {}, .backward = {}};
    if (!opt.costs_file.empty()) pl::read_costs_file(opt.costs_file, cfg);
    cfg.validate();
    return cfg;
}

// Fitted on the build machine (docs/estimates.md). Every policy run: ~3.5 us and ~355 B per text op (2*P*m*V)
// and ~7.7 us and ~790 B per ViT piece (an image; a --images file counted as one piece per 2 bytes), for the
// three heuristic policies together; --grid runs them at 6 loads (3.3x, measured), one at a time. The optimal
// policy's MILP (only on instances within kMaxOptimalPieces / kMaxOptimalTextOps) is bounded by --time-limit per
// solve, counted whole. --cp-table: ~0.2 us per (image pair of a CP group), i.e. W * ipr^2 * sum of the C used.
Estimate pipeline_estimate(const PipelineOptions& opt) {
    Estimate e;
    if (opt.cp_table) {
        double sum_c = 0;
        for (int C : kCpSizes) sum_c += opt.world % C == 0 ? C : 0;
        const double ipr = opt.images_per_rank;
        e.add_seconds(2e-7 * opt.world * ipr * ipr * sum_c,
                      fmt::format("--cp-table over W = {} ranks x {} images", opt.world, opt.images_per_rank));
        e.add_bytes(64.0 * opt.world * ipr, "the images");
        return e;
    }
    const double ops = 2.0 * opt.P * opt.m * opt.V;
    double pieces = static_cast<double>(opt.m) * opt.images_per_mb;
    if (!opt.images_file.empty()) {
        std::error_code ec;
        pieces = static_cast<double>(std::filesystem::file_size(opt.images_file, ec)) / 2;
    }
    const double runs = opt.grid ? 3.3 : 1.0;
    e.add_bytes(355 * ops, fmt::format("schedules of 2*P*m*V = {:.3g} text ops", ops));
    e.add_bytes(790 * pieces, fmt::format("{:.3g} ViT pieces", pieces));
    e.add_seconds(runs * 3.5e-6 * ops, fmt::format("policies over 2*P*m*V = {:.3g} text ops", ops));
    e.add_seconds(runs * 7.7e-6 * pieces, fmt::format("policies over {:.3g} ViT pieces", pieces));
    if (pl::optimal_policy_available() && pieces <= pl::kMaxOptimalPieces && ops / 2 <= pl::kMaxOptimalTextOps)
        e.add_seconds((opt.grid ? 6 : 1) * opt.time_limit, "the optimal policy's MILP (--time-limit per solve)");
    return e;
}

// The ViT pieces at a given load (relative to the bubble) from the images file or the mix.
pl::VitWork make_work(const PipelineOptions& opt, const pl::PipelineConfig& cfg, double vit_load,
                      std::string* description) {
    if (!opt.images_file.empty()) {
        const pl::ImagesFile f = pl::read_images_file(opt.images_file, cfg.m);
        if (!f.vit_forward.empty()) {
            if (description) *description = fmt::format("ViT costs from {} (text units, backward = 2x)", opt.images_file);
            pl::VitWork w;
            w.forward = f.vit_forward;
            for (const auto& row : f.vit_forward) {
                w.backward.emplace_back();
                for (double c : row) w.backward.back().push_back(c * pl::kVitBackwardRatio);
            }
            return w;
        }
        if (description)
            *description = fmt::format("images from {}, cp {}, ViT load {} of the bubble", opt.images_file, opt.cp,
                                       vit_load);
        return pl::vit_work_from_images(cfg, f.patches, pl::VitCostModel{}, opt.cp, vit_load);
    }
    const auto patches = pl::make_mix(opt.mix, cfg.m, opt.images_per_mb, opt.seed);
    if (description)
        *description = fmt::format("mix {} ({} images per micro-batch, seed {}), cp {}, ViT load {} of the bubble",
                                   opt.mix, opt.images_per_mb, opt.seed, opt.cp, vit_load);
    return pl::vit_work_from_images(cfg, patches, pl::VitCostModel{}, opt.cp, vit_load);
}

// Runs one policy and checks its schedule with the independent validator (a violation is an internal error).
std::optional<pl::PolicyResult> run_policy(const pl::PipelineConfig& cfg, const pl::VitWork& work, pl::VitPolicy p,
                                           double time_limit) {
    if (p == pl::VitPolicy::kOptimal && (!pl::optimal_policy_available() || !pl::optimal_policy_fits(cfg, work)))
        return std::nullopt;
    pl::PolicyResult r = pl::place_vit(cfg, work, p, {.time_limit_s = time_limit});
    const pl::VitWork& checked = p == pl::VitPolicy::kNone ? pl::VitWork{std::vector<std::vector<double>>(cfg.m),
                                                                         std::vector<std::vector<double>>(cfg.m)}
                                                           : work;
    const std::vector<std::string> errors = pl::validate_schedule(cfg, checked, r.schedule);
    EVENEP_CHECK_KIND(ErrorKind::kInternal, errors.empty(), "pipeline: the ", pl::to_string(p),
                      " schedule fails validation: ", errors.empty() ? "" : errors.front());
    return r;
}

std::string optimal_absent(const pl::PipelineConfig& cfg, const pl::VitWork& work) {
    if (!pl::optimal_policy_available()) return "built without CBC";
    if (!pl::optimal_policy_fits(cfg, work))
        return fmt::format("too large for the MILP (<= {} pieces, <= {} text ops)", pl::kMaxOptimalPieces,
                           pl::kMaxOptimalTextOps);
    return "";
}

void print_policies(const PipelineOptions& opt) {
    // Opened before the run: a target that cannot be written fails at once, a failed write at close.
    OutputFile json("--json", opt.json_file), svg("--svg", opt.svg_file);
    const pl::PipelineConfig cfg = make_config(opt);
    const pl::VitPolicy chosen = pl::parse_vit_policy(opt.policy);
    std::string description;
    const pl::VitWork work = make_work(opt, cfg, opt.vit_load, &description);
    fmt::print("evenep pipeline — P={} m={} V={} latency {}{}; interleaved 1F1B (Megatron order)\n", cfg.P, cfg.m,
               cfg.V, cfg.latency, opt.costs_file.empty() ? ", costs F=1 B=2 per chunk" : ", costs from " + opt.costs_file);
    fmt::print("ViT: {}; {} pieces per direction, total ViT work {:.3f} (text units); ViT cost model: {}\n",
               description, work.num_pieces(), work.total(), pl::kVitCalibrationSource);
    fmt::print("uniform-cost rank-0 bubble (P-1)/(mV+P-1) = {:.4f}\n\n", double(cfg.P - 1) / (cfg.m * cfg.V + cfg.P - 1));
    fmt::print("{:<8} {:>9} {:>9} {:>8} {:>7} {:>8}  {}\n", "policy", "makespan", "ViT total", "exposed", "hidden",
               "seconds", "bubble fraction per rank");
    std::optional<pl::PolicyResult> chosen_result;
    for (pl::VitPolicy p : {pl::VitPolicy::kNone, pl::VitPolicy::kSync, pl::VitPolicy::kBubbles, pl::VitPolicy::kOptimal}) {
        const auto r = run_policy(cfg, work, p, opt.time_limit);
        if (!r) {
            fmt::print("{:<8} {:>9}  ({})\n", pl::to_string(p), "-", optimal_absent(cfg, work));
            continue;
        }
        std::string fractions;
        for (double f : r->schedule.bubble_fraction) fractions += fmt::format(" {:.3f}", f);
        if (p == pl::VitPolicy::kNone)
            fmt::print("{:<8} {:>9.3f} {:>9} {:>8} {:>7} {:>8.3f} {}\n", "none", r->schedule.makespan, "-", "-", "-",
                       r->seconds, fractions);
        else
            fmt::print("{:<8} {:>9.3f} {:>9.3f} {:>8.3f} {:>6.1f}% {:>8.3f} {}{}\n", pl::to_string(p),
                       r->schedule.makespan, r->vit_total, r->exposed, 100 * r->hidden_fraction, r->seconds, fractions,
                       p == pl::VitPolicy::kOptimal ? (r->optimal ? "  (proved optimal)"
                                                                 : fmt::format("  (not proved; bound {:.3f})", r->bound))
                                                    : "");
        if (p == chosen) chosen_result = r;
    }
    fmt::print("hidden = 1 - exposed / (ViT total / P); exposed = makespan - text-only makespan; every schedule passed "
               "the independent validator\n");
    if (opt.json_file.empty() && opt.svg_file.empty()) return;
    EVENEP_CHECK(chosen_result.has_value(), "pipeline: --vit-policy ", opt.policy,
                      " is unavailable here (", optimal_absent(cfg, work), ")");
    if (json.active()) {
        json.write(pl::schedule_json(cfg, chosen_result->schedule, opt.policy));
        json.close();
        fmt::print("wrote {} ({} policy)\n", opt.json_file, opt.policy);
    }
    if (svg.active()) {
        const std::string title = fmt::format("P={} m={} V={}, ViT {} ({}), makespan {:.2f}, hidden {:.0f}%", cfg.P,
                                              cfg.m, cfg.V, opt.policy, opt.images_file.empty() ? opt.mix : "file",
                                              chosen_result->schedule.makespan, 100 * chosen_result->hidden_fraction);
        svg.write(pl::schedule_svg(cfg, chosen_result->schedule, title));
        svg.close();
        fmt::print("wrote {} ({} policy)\n", opt.svg_file, opt.policy);
    }
}

void print_grid(const PipelineOptions& opt) {
    const pl::PipelineConfig cfg = make_config(opt);
    EVENEP_CHECK(opt.images_file.empty() || !pl::read_images_file(opt.images_file, cfg.m).patches.empty(),
                 "pipeline: --grid scales the ViT load, so --images must give patches, not vit_forward costs");
    fmt::print("evenep pipeline --grid — P={} m={} V={} latency {}; mix {}, {} images per micro-batch, seed {}, cp {}\n",
               cfg.P, cfg.m, cfg.V, cfg.latency, opt.images_file.empty() ? opt.mix : opt.images_file, opt.images_per_mb,
               opt.seed, opt.cp);
    fmt::print("ViT load = ViT work per rank / mean bubble per rank of the text-only schedule; hidden = 1 - exposed / "
               "(ViT / P)\n\n");
    fmt::print("{:>8} | {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8} {:>6}\n", "ViT load", "sync", "exposed", "bubbles",
               "exposed", "optimal", "exposed", "proved");
    for (double load : kGridLoads) {
        const pl::VitWork work = make_work(opt, cfg, load, nullptr);
        const auto sync = run_policy(cfg, work, pl::VitPolicy::kSync, opt.time_limit);
        const auto bubbles = run_policy(cfg, work, pl::VitPolicy::kBubbles, opt.time_limit);
        const auto optimal = run_policy(cfg, work, pl::VitPolicy::kOptimal, opt.time_limit);
        fmt::print("{:>8.2f} | {:>7.1f}% {:>8.3f} | {:>7.1f}% {:>8.3f} | ", load, 100 * sync->hidden_fraction,
                   sync->exposed, 100 * bubbles->hidden_fraction, bubbles->exposed);
        if (optimal)
            fmt::print("{:>7.1f}% {:>8.3f} {:>6}\n", 100 * optimal->hidden_fraction, optimal->exposed,
                       optimal->optimal ? "yes" : "no");
        else
            fmt::print("{:>8} {:>8} {:>6}\n", "-", "-", "-");
    }
    const std::string why = optimal_absent(cfg, make_work(opt, cfg, 1.0, nullptr));
    if (!why.empty()) fmt::print("optimal: - ({})\n", why);
}

void print_cp_table(const PipelineOptions& opt) {
    EVENEP_CHECK(opt.world >= 1, "pipeline: --world = ", opt.world, " must be >= 1");
    EVENEP_CHECK(opt.images_per_rank >= 1, "pipeline: --images-per-rank = ", opt.images_per_rank, " must be >= 1");
    const auto rows = pl::make_mix(opt.mix, opt.world, opt.images_per_rank, opt.seed);
    std::vector<int64_t> patches;
    for (const auto& row : rows) patches.insert(patches.end(), row.begin(), row.end());
    const pl::VitCostModel model;
    fmt::print("evenep pipeline --cp-table — W={} ranks, {} images (mix {}, {} per rank, seed {})\n", opt.world,
               patches.size(), opt.mix, opt.images_per_rank, opt.seed);
    fmt::print("cost per image a*n + c*n^2 + k (a={:.3g} s, c={:.3g} s, k={:.3g} s; {}), KV gather {:.3g} s per patch\n",
               model.a, model.c, model.k, pl::kVitCalibrationSource, model.kv_s_per_patch);
    fmt::print("dynamic: sub-group size g chosen per CP group and step, images LPT over sub-groups; "
               "naive: every image split over all C ranks\n\n");
    fmt::print("{:>3} | {:>12} {:>11} {:>12} | {:>12} {:>11}\n", "C", "dyn max/mean", "dyn comm", "g used",
               "naive max/mn", "naive comm");
    for (int C : kCpSizes) {
        if (opt.world % C != 0) continue;
        const pl::CpStepResult dyn = pl::dynamic_cp_step(model, patches, opt.world, C);
        const pl::CpStepResult naive = pl::dynamic_cp_step(model, patches, opt.world, C, C);
        int gmin = dyn.g_of_group.front(), gmax = gmin;
        for (int g : dyn.g_of_group) {
            gmin = std::min(gmin, g);
            gmax = std::max(gmax, g);
        }
        fmt::print("{:>3} | {:>12.3f} {:>10.2f}% {:>12} | {:>12.3f} {:>10.2f}%\n", C, dyn.max_over_mean,
                   100 * dyn.comm_share, gmin == gmax ? std::to_string(gmin) : fmt::format("{}..{}", gmin, gmax),
                   naive.max_over_mean, 100 * naive.comm_share);
    }
}

}  // namespace

void register_pipeline(CLI::App& app) {
    auto opt = std::make_shared<PipelineOptions>();
    CLI::App* cmd = app.add_subcommand(
        "pipeline", "Interleaved 1F1B with the vision encoder in the bubbles: every ViT policy side by side, "
                    "--grid over the ViT load, --cp-table for dynamic context parallelism (docs/pipeline.md)");
    add_int(*cmd, "--P", opt->P, "Pipeline ranks (stages)", 1, kMaxRanks);
    add_int(*cmd, "--m", opt->m, "Micro-batches (a multiple of P when V > 1)", 1, 1 << 20);
    add_int(*cmd, "--V", opt->V, "Virtual chunks per rank (1: plain 1F1B)", 1, 1 << 10);
    add_real(*cmd, "--latency", opt->latency, "Stage-to-stage latency (text units)", 0, 1e12)->capture_default_str();
    add_input_file(*cmd, "--costs", opt->costs_file, "JSON {forward, backward: number or [m], latency} per chunk");
    add_string(*cmd, "--vit-policy", opt->policy, "Policy written by --json / --svg: none|sync|bubbles|optimal")
        ->capture_default_str();
    add_input_file(*cmd, "--images", opt->images_file, "JSON {patches: [[n...] per micro-batch]} or {vit_forward: ...}");
    add_string(*cmd, "--mix", opt->mix, "Generated image mix: uniform|mixed|heavy")->capture_default_str();
    add_int(*cmd, "--images-per-mb", opt->images_per_mb, "Images per micro-batch of the mix", 1, 1 << 20);
    add_u64(*cmd, "--seed", opt->seed, "Seed of the mix");
    add_real(*cmd, "--vit-load", opt->vit_load,
             "ViT work per rank / mean bubble per rank, > 0 (no ViT work is the 'none' row of every run)", 0, 1e6)
        ->capture_default_str();
    add_int(*cmd, "--cp", opt->cp, "CP group size for the images of a micro-batch (dynamic CP)", 1, kMaxRanks);
    add_real(*cmd, "--time-limit", opt->time_limit, "Seconds for the optimal policy's MILP (> 0)", 0, 1e9)
        ->capture_default_str();
    add_output_file(*cmd, "--json", opt->json_file, "Write the chosen policy's schedule (schema evenep.pipeline/1)");
    add_output_file(*cmd, "--svg", opt->svg_file, "Draw the chosen policy's timeline");
    cmd->add_flag("--grid", opt->grid, "Hidden fraction of sync, bubbles, optimal over ViT loads 0.25..2");
    cmd->add_flag("--cp-table", opt->cp_table, "Dynamic CP over C = 1..32: per-rank max/mean and communication share");
    add_int(*cmd, "--world", opt->world, "--cp-table: ranks W", 1, 1 << 20);
    add_int(*cmd, "--images-per-rank", opt->images_per_rank, "--cp-table: images per rank", 1, 1 << 20);
    opt->limits.add_to(*cmd);
    set_run(cmd, [opt] {
        check_estimate("pipeline", pipeline_estimate(*opt), opt->limits);
        if (opt->cp_table)
            print_cp_table(*opt);
        else if (opt->grid)
            print_grid(*opt);
        else
            print_policies(*opt);
        std::fflush(stdout);
    });
}

}  // namespace evenep::cli
