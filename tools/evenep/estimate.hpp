// tools/evenep/estimate.hpp — what a run will use, known before it allocates: the limits --max-memory /
// --max-time, the estimate of a run (peak resident memory and CPU seconds, built from named parts) and the
// cost models shared by several subcommands. Every model is fitted on measurements of a Release build on the
// build machine (2-core x86-64); fits, and the estimate-vs-measured table: docs/estimates.md.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

namespace evenep::cli {

// What a run may use: --max-memory (default: a quarter of the physical memory, or of the cgroup limit when
// lower: the machine is often shared) and --max-time (default 60 s). A run whose estimate passes either is
// refused before it allocates. --estimate-only prints the estimate (one line on stdout) and exits 0 without
// running.
struct ResourceLimits {
    double max_bytes = 0;  // 0: the default
    double max_seconds = 60;
    bool estimate_only = false;
    void add_to(CLI::App& cmd);
    double bytes() const;  // the limit in effect
};

// A run's estimate: peak resident bytes (the parts alive together at the peak, plus the process floor) and
// CPU seconds on one core (user + sys; the wall time of the single-threaded commands), built up from named
// parts so that a refusal says what dominates. A default-constructed estimate holds the process floor.
struct Estimate {
    Estimate();
    double bytes = 0, seconds = 0;             // bytes: the parts alive to the end, with the floor
    double transient_peak = 0;                 // the highest bytes + transient part seen (add_transient_bytes)
    std::string bytes_detail, seconds_detail;  // the largest part of each, e.g. "R=512 rank plans of ..."
    double top_bytes = 0, top_seconds = 0;
    void add_bytes(double b, const std::string& what);
    // Bytes alive only next to the parts added so far (e.g. the second routing while sigma is bisected), freed
    // before the next part is allocated.
    void add_transient_bytes(double b, const std::string& what);
    void add_seconds(double s, const std::string& what);
    void add(const Estimate& other);  // the parts of `other` (its floor not counted twice)
    // A stage run after the others and freed before the next (a point of a sweep): its seconds add up, its peak
    // memory counts only where it is the highest.
    void add_stage(const Estimate& stage);
    double peak_bytes() const { return bytes > transient_peak ? bytes : transient_peak; }
};

// The fixed cost of any run: process start, the loaded libraries and the CLI (measured: 8.8-9.3 MiB, < 10 ms).
inline constexpr double kProcessFloorBytes = 9.0 * (1 << 20);
inline constexpr double kProcessFloorSeconds = 0.005;

// With limits.estimate_only: prints "<command>: estimate: peak memory ... (N B), time ... s (CPU)" on stdout
// and exits 0. Otherwise throws Error(kInvalidArgument) naming the estimate, its largest part and the limit when
// the estimate passes the limit, e.g. "demo: estimated memory 12.5 GiB (largest part: ...) exceeds the limit
// 5.9 GiB (a quarter of the physical memory 23.5 GiB; raise it with --max-memory)".
void check_estimate(std::string_view command, const Estimate& e, const ResourceLimits& limits);

// One lognormal draw of R*S tokens over E experts (CPU seconds).
double lognormal_draw_seconds(int R, int E, int K, int S);
// How many draws make_target_maxvio (and `evenep plan`'s reachability check) take for `target`: 3 when the
// sampling noise of R*S*K entries over E experts already passes it, else kTargetMaxvioDraws (the two ends of the
// sigma bracket, then bisection to the tolerance; measured 9-12).
inline constexpr int kTargetMaxvioDraws = 12;
int target_maxvio_draws(int R, int E, int K, int S, double target);
// The lognormal generator (make_lognormal / make_target_maxvio): `draws` draws, with the routing being drawn and
// the best one kept alive together when draws > 1.
void add_lognormal_estimate(int R, int E, int K, int S, int draws, Estimate& e);
// `count` routings of routing_near_maxvio (a bisection on a small probe, then one draw at full size), one alive
// at a time.
void add_near_maxvio_estimate(int R, int E, int K, int S, int count, Estimate& e);

// One Planner::plan of R ranks and E experts (CPU seconds) and the plan's and planner's state (bytes).
double plan_seconds(int R, int E);
double plan_bytes(int R, int E);

// Physical memory of this machine in bytes (the cgroup limit when it is lower); 0 when unknown.
double physical_memory_bytes();

}  // namespace evenep::cli
