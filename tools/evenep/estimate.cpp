// tools/evenep/estimate.cpp — limits, estimates and the shared cost models (fits: docs/estimates.md).
#include "estimate.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common.hpp"
#include "evenep/error.hpp"

namespace evenep::cli {

double physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    double bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
    std::ifstream cg("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when unlimited
    double limit = 0;
    if (cg >> limit && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
    return bytes;
}

void ResourceLimits::add_to(CLI::App& cmd) {
    // Bytes, or with a binary suffix K, M, G, T (8G = 8 GiB); rewritten to plain bytes before the range check.
    const auto size = [](std::string& v) -> std::string {
        static const std::string kSuffixes = "KMGT";
        const size_t unit = v.empty() ? std::string::npos : kSuffixes.find(static_cast<char>(std::toupper(v.back())));
        if (unit != std::string::npos) {
            const std::string number = v.substr(0, v.size() - 1);
            char* end = nullptr;
            const double x = std::strtod(number.c_str(), &end);
            if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(x) || x < 0 || x > 1e15)
                return fmt::format("value '{}' is not a size such as 8G", v);
            v = fmt::format("{:.0f}", x * std::ldexp(1.0, 10 * static_cast<int>(unit + 1)));
        }
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x) || x < 0 || x > 1e18)
            return fmt::format("value '{}' is not a size in [0, 1e18] bytes (suffix K/M/G/T allowed)", v);
        return {};
    };
    cmd.add_option("--max-memory", max_bytes,
                   "refuse a run whose estimated peak memory exceeds this many bytes (suffix K/M/G/T allowed; "
                   "default 0: a quarter of the physical memory)")
        ->transform(CLI::Validator(size, "SIZE"));
    add_real(cmd, "--max-time", max_seconds, "refuse a run whose estimated time (CPU seconds on one core) exceeds this",
             1, 1e9)
        ->capture_default_str();
    cmd.add_flag("--estimate-only", estimate_only,
                 "print the run's estimated peak memory and time as one line and exit 0 without running "
                 "(models: docs/estimates.md)");
}

double ResourceLimits::bytes() const {
    if (max_bytes > 0) return max_bytes;
    const double phys = physical_memory_bytes();
    return phys > 0 ? phys / 4 : 4.0 * (1 << 30);
}

Estimate::Estimate() : bytes(kProcessFloorBytes), seconds(kProcessFloorSeconds) {}

void Estimate::add_bytes(double b, const std::string& what) {
    bytes += b;
    if (b > top_bytes) top_bytes = b, bytes_detail = what;
}

void Estimate::add_transient_bytes(double b, const std::string& what) {
    if (bytes + b > transient_peak) transient_peak = bytes + b;
    if (b > top_bytes) top_bytes = b, bytes_detail = what;
}

void Estimate::add_seconds(double s, const std::string& what) {
    seconds += s;
    if (s > top_seconds) top_seconds = s, seconds_detail = what;
}

void Estimate::add(const Estimate& other) {
    if (other.transient_peak > 0) add_transient_bytes(other.transient_peak - kProcessFloorBytes, other.bytes_detail);
    add_bytes(other.bytes - kProcessFloorBytes, other.bytes_detail);
    add_seconds(other.seconds - kProcessFloorSeconds, other.seconds_detail);
}

void Estimate::add_stage(const Estimate& stage) {
    add_seconds(stage.seconds - kProcessFloorSeconds, stage.seconds_detail);
    if (stage.peak_bytes() > peak_bytes()) {
        transient_peak = stage.peak_bytes();
        bytes_detail = stage.bytes_detail;
    }
}

void check_estimate(std::string_view command, const Estimate& e, const ResourceLimits& limits) {
    const std::string bytes_part = e.bytes_detail.empty() ? "process start" : e.bytes_detail;
    const std::string seconds_part = e.seconds_detail.empty() ? "process start" : e.seconds_detail;
    if (limits.estimate_only) {
        // Nothing has been allocated or written yet: the run ends here, as a finished one.
        fmt::print(
            "{}: estimate: peak memory {} ({:.0f} B; largest part: {}), time {:.3g} s (CPU; largest part: "
            "{})\n",
            command, human_bytes(e.peak_bytes()), e.peak_bytes(), bytes_part, e.seconds, seconds_part);
        std::fflush(stdout);
        std::exit(0);
    }
    const double max_bytes = limits.bytes();
    EVENEP_CHECK(e.peak_bytes() <= max_bytes, command, ": estimated memory ", human_bytes(e.peak_bytes()),
                 " (largest part: ", bytes_part, ") exceeds the limit ", human_bytes(max_bytes),
                 limits.max_bytes > 0
                     ? std::string(" (--max-memory)")
                     : fmt::format(" (a quarter of the physical memory {}; raise it with --max-memory)",
                                   human_bytes(physical_memory_bytes())));
    EVENEP_CHECK(e.seconds <= limits.max_seconds, command, ": estimated time ", fmt::format("{:.3g}", e.seconds),
                 " s (largest part: ", seconds_part, ") exceeds the limit ", limits.max_seconds,
                 " s (raise it with --max-time)");
}

// --- shared models ---

namespace {

// The lognormal generator on one core (Gumbel top-k): per token one uniform and compare per expert, and ~25 ns
// per candidate kept (K*(1 + ln(E/K)) logarithms). The per-expert cost grows once the E popularities (8 B each)
// leave the caches: 1.5 ns up to 1 MiB of them, 6.5 ns from 8 MiB, log-linear between (fit: E = 64 ... 2^20).
inline constexpr double kSecondsPerExpertCached = 1.5e-9;
inline constexpr double kSecondsPerExpertUncached = 6.5e-9;
inline constexpr double kSecondsPerCandidate = 25e-9;

double seconds_per_expert(int E) {
    const double table_bytes = 8.0 * E, lo = 1 << 20, hi = 8 << 20;
    if (table_bytes <= lo) return kSecondsPerExpertCached;
    if (table_bytes >= hi) return kSecondsPerExpertUncached;
    const double f = std::log(table_bytes / lo) / std::log(hi / lo);
    return kSecondsPerExpertCached + f * (kSecondsPerExpertUncached - kSecondsPerExpertCached);
}

}  // namespace

double lognormal_draw_seconds(int R, int E, int K, int S) {
    const double tokens = static_cast<double>(R) * S;
    return tokens * (seconds_per_expert(E) * E + kSecondsPerCandidate * K * (1 + std::log(static_cast<double>(E) / K)));
}

int target_maxvio_draws(int R, int E, int K, int S, double target) {
    // The bisection's first draw is at sigma ~ 0, whose maxvio is the sampling noise of R*S*K entries over E
    // experts: the largest of E Poisson(lambda) counts is ~ lambda + sqrt(2 lambda ln E) + ln E / 3.
    const double lambda = static_cast<double>(R) * S * K / E, lnE = std::log(std::max(2, E));
    const double noise = (std::sqrt(2 * lambda * lnE) + lnE / 3) / lambda;
    const double tol = std::max(0.02 * target, 0.005);
    // Noise above the target: one draw, then `evenep plan` draws both ends of the sigma bracket to say what is
    // reachable (check_maxvio_reached).
    if (noise > target + tol) return 3;
    return kTargetMaxvioDraws;
}

void add_lognormal_estimate(int R, int E, int K, int S, int draws, Estimate& e) {
    const double entries = static_cast<double>(R) * S * K;
    // The routing being drawn and, when bisecting sigma, the best one kept.
    const std::string what = fmt::format("routing R*S*K = {:.3g} ids", entries);
    e.add_bytes(entries * 4 + 8.0 * E, what);
    if (draws > 1) e.add_transient_bytes(entries * 4, what + " (and the best one kept while sigma is bisected)");
    e.add_seconds(
        draws * lognormal_draw_seconds(R, E, K, S),
        fmt::format("{} lognormal draw{} of R*S = {:.3g} tokens over E = {} experts{}", draws, draws > 1 ? "s" : "",
                    static_cast<double>(R) * S, E, draws > 1 ? " to find the sigma of --maxvio" : ""));
}

void add_near_maxvio_estimate(int R, int E, int K, int S, int count, Estimate& e) {
    // routing_near_maxvio: bisection on a probe of ~512K entries, then one draw at full size.
    const int probe_S = std::min(S, std::max(64, 65536 / std::max(1, R * K) * 8));
    const int draws = target_maxvio_draws(R, E, K, probe_S, 1.0);
    const double entries = static_cast<double>(R) * S * K;
    e.add_bytes(entries * 4 + 8.0 * E, fmt::format("routing R*S*K = {:.3g} ids", entries));
    e.add_seconds(count * (draws * lognormal_draw_seconds(R, E, K, probe_S) + lognormal_draw_seconds(R, E, K, S)),
                  fmt::format("{} lognormal routing{} of R*S = {:.3g} tokens over E = {} experts", count,
                              count > 1 ? "s" : "", static_cast<double>(R) * S, E));
}

double plan_seconds(int R, int E) {
    // Fit over R = 8 ... 1024, R*E = 1e6 ... 8e6 (--repeat 1 vs 11): 0.085 ns per pair and rank (the per-rank
    // passes over all experts) plus 51-93 ns per (rank, expert) pair depending on the routing (R = 8, E = 65536,
    // S = 1 ... 4096: not monotonic in S); 70 ns, the middle of that range, keeps every point within 1.5x.
    return static_cast<double>(R) * E * (70e-9 + 0.085e-9 * R);
}

double plan_bytes(int R, int E) {
    // Fit over the same runs: ~70 B per pair (Plan's [E*R] arrays and the planner's work), ~120 B per expert and
    // 8 B per rank pair.
    return 70.0 * R * E + 120.0 * E + 8.0 * R * R;
}

}  // namespace evenep::cli
