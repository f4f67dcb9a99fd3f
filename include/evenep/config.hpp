// evenep/config.hpp — the static configuration of an EP group (SPEC §1).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "evenep/detail/layout.hpp"

namespace evenep {

// How each plan's imbalance budget is chosen (docs/auto.md).
enum class PlannerPolicy : int8_t {
    kFixed,  // every plan with the budget Config::slack: exact balance at 0 (the default), `slack ε` above it
    kAuto,   // each plan with the budget in [0, Config::slack] a step-cost model predicts fastest, from the gathered
             // histogram alone (exact balance, a slack budget, or no copies at all); buffers sized for Config::slack
};

// The largest budget the auto policy is given where none is named (`evenep plan --policy auto` without --slack,
// the workload runner's evenep_auto): +8.4% receive rows at the MoonEP point (docs/slack.md).
inline constexpr double kAutoDefaultSlack = 0.1;

// Static shape of one EP group. Every buffer size is a function of these numbers alone.
struct Config {
    int R = 8;     // EP group size (ranks), >= 1
    int E = 64;    // routed experts in the group, E % R == 0
    int K = 4;     // top-k, 1..32
    int S = 512;   // token capacity per rank, >= 1
    int B = -1;    // prefetch slots per rank; -1 means epn (required for training)
    int tp = 128;  // token padding of every non-empty expert segment, >= 1
    // Imbalance budget ε (SPEC §3.6, opt-in): rank r may compute up to c_r = ⌈(1+ε)·q_r⌉ entries (q_r the even
    // quota of invariant 1) when that saves copies; the planner's rule is plan_slack_targets in
    // evenep/detail/plan_core.hpp, the figures are in docs/slack.md. Finite, in [0, 1]; applied in units of 10^-6
    // (slack_ppm). 0 (the default) is exact balance, bit for bit the plans without it.
    double slack = 0.0;
    // kAuto: Config::slack is the largest budget a plan may choose (the buffers' size), not the budget of every plan.
    PlannerPolicy policy = PlannerPolicy::kFixed;

    int epn() const { return E / R; }                     // experts homed on each rank
    int num_slots() const { return B < 0 ? epn() : B; }   // B with the default resolved
    int num_groups() const { return 2 * epn(); }          // receive-buffer groups per rank
    int home(int expert) const { return expert / epn(); } // rank that owns `expert`
    // ε in parts per million, rounded to nearest: what the planner and the buffer sizing use.
    int32_t slack_ppm() const;
    // Receive-buffer rows per rank (SPEC invariant 4), sized for the largest target ⌈(1+ε)·S·K⌉ under slack.
    int64_t recv_rows() const { return detail::recv_rows(S, K, epn(), tp, slack_ppm()); }

    // Throws evenep::Error naming the bad value: R, E, K, S, tp out of range, E % R != 0, B > epn, slack not
    // finite or outside [0, 1], or R * NvS too large for the int32 destination encoding (SPEC §8).
    void validate() const;
    std::string to_string() const;
};

// Planner mode (SPEC §3.1).
enum class PlannerMode {
    kReference,  // the published greedy, reproduced exactly
    kOptimized,  // default: cheapest of several balanced constructions + locality-aware token placement
};

std::string_view to_string(PlannerMode mode);
// "fixed" or "auto".
std::string_view to_string(PlannerPolicy policy);
// Parses "reference" or "optimized"; throws evenep::Error on anything else.
PlannerMode parse_planner_mode(std::string_view name);
// Sets cfg.policy and cfg.slack from a policy named as the CLI's --policy and the Python package's policy= spell it
// (docs/auto.md): "auto" (each plan's budget in [0, slack]; slack < 0, i.e. not given, means kAutoDefaultSlack),
// "exact" (budget 0; a given slack must be 0), "slack" (every plan with the budget slack > 0), or "" (exact when
// slack <= 0, else slack). Throws evenep::Error(kInvalidArgument) naming the bad value, with the arguments called
// policy_name and slack_name (the CLI: "--policy", "--slack"); the budget's range is Config::validate's.
void apply_planner_policy(Config& cfg,
                          std::string_view policy,
                          double slack,
                          std::string_view policy_name = "policy",
                          std::string_view slack_name = "slack");

}  // namespace evenep
