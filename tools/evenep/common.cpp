#include "common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "evenep/error.hpp"
#include "evenep/io.hpp"

namespace evenep::cli {

void RoutingOptions::add_to(CLI::App& cmd) {
    cmd.add_option("--R", R, "EP group size (ranks)")->capture_default_str();
    cmd.add_option("--E", E, "routed experts in the group (E % R == 0)")->capture_default_str();
    cmd.add_option("--K", K, "top-k experts per token (<= 32)")->capture_default_str();
    cmd.add_option("--S", S, "token capacity per rank (every rank passes S tokens)")->capture_default_str();
    cmd.add_option("--B", B, "prefetch slots per rank (-1 = epn; < epn only for inference)")->capture_default_str();
    cmd.add_option("--tp", tp, "token padding of every non-empty expert segment")->capture_default_str();
    cmd.add_option("--maxvio", maxvio, "generate lognormal routing with this max violation (max/mean - 1)")
        ->capture_default_str();
    cmd.add_option("--sigma", sigma, "generate lognormal routing with this popularity sigma instead of --maxvio");
    std::vector<std::string> names;
    for (Adversarial a : all_adversarial()) names.push_back(to_string(a));
    cmd.add_option("--adversarial", adversarial, "generate an adversarial routing")
        ->check(CLI::IsMember(names));
    cmd.add_option("--seed", seed, "seed of the routing generator")->capture_default_str();
    cmd.add_option("--tpe", tpe_file, "read histograms from a JSON file {R,E,K,S,s,tpe} instead of generating");
    cmd.add_option("--routing", routing_file, "read topk_idx from an int32 [R,S,K] .npy (-1 = masked); needs --E");
    cmd.add_option("--planner", planner, "planner mode")
        ->check(CLI::IsMember({"reference", "optimized"}))
        ->capture_default_str();
}

RoutingInput resolve_routing(const RoutingOptions& opt) {
    RoutingInput in;
    in.mode = parse_planner_mode(opt.planner);
    EVENEP_CHECK(opt.tpe_file.empty() || opt.routing_file.empty(), "--tpe and --routing are mutually exclusive");
    if (!opt.tpe_file.empty()) {
        TpeFile f = read_tpe_json(opt.tpe_file);
        in.cfg = Config{.R = f.R, .E = f.E, .K = f.K, .S = f.S, .B = opt.B, .tp = opt.tp};
        in.cfg.validate();
        in.s = f.s;
        in.tpe = f.tpe;
        in.description = fmt::format("histograms from {}", opt.tpe_file);
        return in;
    }
    Routing routing;
    if (!opt.routing_file.empty()) {
        routing = read_routing_npy(opt.routing_file, opt.E);
        in.description = fmt::format("routing from {}", opt.routing_file);
    } else {
        Config probe{.R = opt.R, .E = opt.E, .K = opt.K, .S = opt.S, .B = opt.B, .tp = opt.tp};
        probe.validate();
        RoutingSpec spec{.R = opt.R, .E = opt.E, .K = opt.K, .S = opt.S, .seed = opt.seed};
        if (!opt.adversarial.empty()) {
            Adversarial kind = Adversarial::kSingleHotExpert;
            for (Adversarial a : all_adversarial())
                if (to_string(a) == opt.adversarial) kind = a;
            routing = make_adversarial(spec, kind);
            in.description = fmt::format("adversarial '{}', seed {}", opt.adversarial, opt.seed);
        } else if (opt.sigma >= 0) {
            routing = make_lognormal(spec, opt.sigma);
            in.sigma_used = opt.sigma;
            in.description = fmt::format("lognormal sigma={:.4g}, seed {}", opt.sigma, opt.seed);
        } else {
            EVENEP_CHECK(opt.maxvio >= 0, "--maxvio = ", opt.maxvio, " must be >= 0");
            routing = make_target_maxvio(spec, opt.maxvio, &in.sigma_used);
            in.description =
                fmt::format("lognormal sigma={:.4g} (target maxvio {:g}), seed {}", in.sigma_used, opt.maxvio, opt.seed);
        }
    }
    in.cfg = Config{.R = routing.R, .E = routing.E, .K = routing.K, .S = routing.S, .B = opt.B, .tp = opt.tp};
    in.cfg.validate();
    in.s = routing.s;
    in.tpe = routing.tpe();
    in.routing = std::move(routing);
    return in;
}

Routing routing_near_maxvio(const RoutingSpec& spec, double target, double* sigma_out) {
    RoutingSpec probe = spec;
    probe.S = std::min(spec.S, std::max(64, 65536 / std::max(1, spec.R * spec.K) * 8));
    double sigma = 0;
    make_target_maxvio(probe, target, &sigma);
    if (sigma_out) *sigma_out = sigma;
    return make_lognormal(spec, sigma);
}

std::string bar(double value, double max_value, int width) {
    static const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
    if (max_value <= 0 || value <= 0) return std::string();
    const double cells = std::min(1.0, value / max_value) * width;
    const int full = static_cast<int>(cells);
    const int frac = static_cast<int>((cells - full) * 8);
    std::string out;
    for (int i = 0; i < full; ++i) out += "█";
    out += kEighths[frac];
    return out;
}

std::string human_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        ++u;
    }
    return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace evenep::cli
