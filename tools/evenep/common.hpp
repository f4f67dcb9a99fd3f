// tools/evenep/common.hpp — helpers shared by the CLI subcommands: routing options, bars, timing.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/routing.hpp"

namespace evenep::cli {

// Where the routing of a command comes from: a generated config, a tpe JSON file or a routing .npy file.
struct RoutingOptions {
    int R = 8, E = 384, K = 8, S = 8192;
    int B = -1, tp = 128;
    double maxvio = 1.0;
    double sigma = -1;     // >= 0: use this lognormal sigma instead of a target maxvio
    std::string adversarial;  // one of to_string(Adversarial) names
    uint64_t seed = 1;
    std::string tpe_file;     // --tpe FILE.json
    std::string routing_file; // --routing FILE.npy
    std::string planner = "optimized";

    // Adds --R --E --K --S --B --tp --maxvio --sigma --adversarial --seed --tpe --routing --planner.
    void add_to(CLI::App& cmd);
};

// The resolved input: the configuration, per-rank s and histograms, and the routing when known.
struct RoutingInput {
    Config cfg;
    PlannerMode mode = PlannerMode::kOptimized;
    std::vector<int32_t> s;          // [R]
    std::vector<int32_t> tpe;        // [R*E]
    std::optional<Routing> routing;  // absent with --tpe
    std::string description;         // e.g. "lognormal sigma=0.81 (target maxvio 1), seed 1"
    double sigma_used = -1;
};

// Builds the input; throws evenep::Error (exit 2) naming the bad flag or file content.
RoutingInput resolve_routing(const RoutingOptions& opt);

// Lognormal routing with maxvio close to `target` at the full size: sigma is bisected (make_target_maxvio) on a smaller
// token count with the same popularity vector, keeping ~512K entries, then the routing is drawn once at full size
// (its achieved maxvio differs from the probe's by sampling noise). `sigma_out`, if given, receives sigma, so that
// make_lognormal(spec, sigma) (or `evenep plan --sigma`) reproduces the routing.
Routing routing_near_maxvio(const RoutingSpec& spec, double target, double* sigma_out = nullptr);
// A horizontal bar of `width` cells for value/max with eighth-block resolution.
std::string bar(double value, double max_value, int width);
// Human-readable bytes (KiB, MiB, GiB).
std::string human_bytes(double bytes);
// Monotonic seconds.
double now_seconds();
// Median of a copy of v (0 when empty).
double median(std::vector<double> v);

}  // namespace evenep::cli
