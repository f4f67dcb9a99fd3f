// `evenep bench multi`: the multi-process benchmark, one process per GPU over the NCCL team (run it under
// `evenep launch -n R -- evenep bench multi ...`). Every rank runs it; rank 0 prints the table and writes the JSON.
// Method and formulas: docs/multi-gpu.md. Registered by register_bench_multi(bench) (called from main.cpp).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include "perf/cuda/multi.hpp"
#include "evenep/cuda/nccl_team.hpp"
#endif

namespace evenep::cli {
namespace {

struct MultiCliOptions {
    int experts_per_rank = 48, K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    std::vector<double> maxvios{0.2, 1, 10, 20};
    uint64_t seed = 1;
    int sm_budget = 32, warmup = 5, iters = 20, projections = 1;
    bool check = false;
    std::string planner = "optimized";
    double copy_mib = 1024;
    std::vector<std::string> ops;
    std::string json_file;
};

#if defined(EVENEP_HAVE_CUDA)

nlohmann::json to_json(const perf::MultiBenchRow& r) {
    return nlohmann::json{{"op", r.op},
                          {"shape", r.shape},
                          {"maxvio", r.maxvio},
                          {"median_us", r.median_us},
                          {"min_us", r.min_us},
                          {"max_us", r.max_us},
                          {"bytes", r.bytes},
                          {"link_bytes", r.link_bytes},
                          {"gbps", r.gbps},
                          {"link_gbps", r.link_gbps},
                          {"frac_p2p", r.frac_p2p},
                          {"wrong", r.wrong},
                          {"blocks_per_rank", r.blocks_per_rank},
                          {"iters", r.iters},
                          {"note", r.note}};
}

void print_table(const perf::MultiBenchResult& res) {
    fmt::print("device: {}\nranks: {}, NCCL {}, p2p copy anchor {:.0f} GB/s, HBM copy anchor {:.0f} GB/s\n", res.device,
               res.R, res.nccl_version, res.p2p_gbps, res.hbm_gbps);
    fmt::print("{:<30} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>6} {:>6} {:>5}\n", "op", "maxvio", "p50 us",
               "min us", "max us", "MB", "GB/s", "link MB", "link GB/s", "%p2p", "wrong", "blk/r");
    for (const perf::MultiBenchRow& r : res.rows)
        fmt::print(
            "{:<30} {:>6.2f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>8.0f} {:>9.1f} {:>8.0f} {:>6.1f} {:>6} {:>5}\n",
            r.op, r.maxvio, r.median_us, r.min_us, r.max_us, r.bytes / 1e6, r.gbps, r.link_bytes / 1e6, r.link_gbps,
            100.0 * r.frac_p2p, r.wrong < 0 ? std::string("-") : std::to_string(r.wrong), r.blocks_per_rank);
    // Flatness across maxvio and the comparison with the baseline.
    std::map<std::string, std::pair<double, double>> range;  // op -> (min, max) of the median over maxvio
    std::map<double, std::map<std::string, double>> at;      // maxvio -> op -> median
    for (const perf::MultiBenchRow& r : res.rows) {
        if (r.maxvio <= 0) continue;
        auto [it, fresh] = range.emplace(r.op, std::make_pair(r.median_us, r.median_us));
        if (!fresh) it->second = {std::min(it->second.first, r.median_us), std::max(it->second.second, r.median_us)};
        at[r.maxvio][r.op] = r.median_us;
    }
    fmt::print("\ntime across maxvio (max/min of the median; target <= 1.05 for EvenEP):\n");
    for (const auto& [op, mm] : range) fmt::print("  {:<30} {:.3f}\n", op, mm.second / std::max(mm.first, 1e-9));
    fmt::print("\nEvenEP vs the NCCL all-to-all baseline (baseline time / EvenEP time; > 1: EvenEP faster):\n");
    for (const auto& [mv, ops] : at) {
        auto get = [&ops](const char* k) {
            const auto it = ops.find(k);
            return it == ops.end() ? 0.0 : it->second;
        };
        const double base = get("a2a_dispatch"), total = get("total_plan_dispatch_prefetch"), disp = get("dispatch");
        const double cbase = get("a2a_combine"), comb = get("combine_push");
        fmt::print("  maxvio {:>6.2f}: dispatch {:.2f}x, plan+dispatch+prefetch {:.2f}x, combine(push) {:.2f}x\n", mv,
                   disp > 0 ? base / disp : 0.0, total > 0 ? base / total : 0.0, comb > 0 ? cbase / comb : 0.0);
    }
}

#endif  // EVENEP_HAVE_CUDA

}  // namespace

void register_bench_multi(CLI::App& bench) {
    auto o = std::make_shared<MultiCliOptions>();
    CLI::App* cmd = bench.add_subcommand(
        "multi",
        "Multi-GPU benchmark, one process per GPU over the NCCL team (run under `evenep launch -n R --`): plan, "
        "dispatch, combine, prefetch, reduce and plan+dispatch+prefetch vs the NVLink copy anchor and an NCCL "
        "all-to-all baseline on the same routing; MoonEP point scaled to R (E = 48 R, S=8192 K=8 H=7168 H'=2048)");
    add_int(*cmd, "--experts-per-rank", o->experts_per_rank, "E / R", 1, kMaxExperts);
    add_int(*cmd, "--K", o->K, "top-k", 1, 32);
    add_int(*cmd, "--S", o->S, "tokens per rank", 1, std::numeric_limits<int>::max());
    add_int(*cmd, "--H", o->H, "hidden size", 1, kMaxHidden);
    add_int(*cmd, "--ffn-hidden", o->ffn_hidden, "expert intermediate size H'", 1, kMaxHidden);
    add_int(*cmd, "--tp", o->tp, "token padding", 1, kMaxTokenPad);
    add_reals(*cmd, "--maxvio", o->maxvios, "target maxvio values", 0, std::numeric_limits<double>::infinity());
    add_u64(*cmd, "--seed", o->seed, "routing seed");
    add_int(*cmd, "--sm-budget", o->sm_budget, "SMs per rank of the communication kernels", 1, 1 << 16);
    add_int(*cmd, "--warmup", o->warmup, "untimed runs", 0, 1000000);
    add_int(*cmd, "--iters", o->iters, "timed runs (median reported)", 1, 1000000);
    add_int(*cmd, "--projections", o->projections, "prefetch/reduce: projections per copy (1..3)", 1, 3);
    add_string(*cmd, "--planner", o->planner, "reference or optimized")
        ->check(CLI::IsMember({"reference", "optimized"}))
        ->capture_default_str();
    add_real(*cmd, "--copy-mib", o->copy_mib, "size of the copy anchors", 1, 1 << 20)->capture_default_str();
    cmd->add_option("--ops", o->ops, "subset of: plan dispatch combine prefetch reduce total a2a (default: all)");
    cmd->add_flag("--check", o->check, "verify plan, dst, dispatch rows, sampled combine and prefetch first");
    add_output_file(*cmd, "--json", o->json_file, "rank 0 writes all rows as JSON");
    set_run(cmd, [o] {
        require_cuda_device("bench multi");
#if defined(EVENEP_HAVE_CUDA)
        const cuda::NcclBootstrap boot = cuda::nccl_bootstrap_from_env();
        // Rank 0's JSON target, checked before the run (a bad path fails in seconds) and written atomically at the end.
        OutputFile json("--json", boot.rank == 0 ? o->json_file : std::string());
        perf::MultiBenchConfig mc;
        mc.experts_per_rank = o->experts_per_rank, mc.K = o->K, mc.S = o->S, mc.H = o->H;
        mc.ffn_hidden = o->ffn_hidden, mc.tp = o->tp, mc.maxvios = o->maxvios, mc.seed = o->seed;
        mc.sm_budget = o->sm_budget, mc.warmup = o->warmup, mc.iters = o->iters, mc.check = o->check;
        mc.mode = parse_planner_mode(o->planner), mc.projections = o->projections, mc.copy_mib = o->copy_mib;
        mc.ops = o->ops;
        const perf::MultiBenchResult res = perf::bench_multi(boot, mc);
        int64_t wrong = 0;
        for (const perf::MultiBenchRow& r : res.rows) wrong += r.wrong > 0 ? r.wrong : 0;
        if (boot.rank == 0) {
            print_table(res);
            if (json.active()) {
                nlohmann::json out{
                    {"device", res.device},     {"ranks", res.R},           {"nccl_version", res.nccl_version},
                    {"p2p_gbps", res.p2p_gbps}, {"hbm_gbps", res.hbm_gbps}, {"rows", nlohmann::json::array()}};
                for (const perf::MultiBenchRow& r : res.rows) out["rows"].push_back(to_json(r));
                json.write(out.dump(2) + "\n");
                json.close();
            }
            if (o->check) fmt::print("check: {} wrong\n", wrong);
        }
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, wrong == 0, "bench multi: --check found ", wrong, " wrong results");
#else
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "bench multi: needs a CUDA build with the NCCL team");
#endif
    });
}

}  // namespace evenep::cli
