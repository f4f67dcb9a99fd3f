#include "evenep/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "evenep/error.hpp"

namespace evenep {

void Config::validate() const {
    EVENEP_CHECK(R >= 1, "config: R = ", R, " must be >= 1");
    EVENEP_CHECK(E >= 1, "config: E = ", E, " must be >= 1");
    EVENEP_CHECK(E % R == 0, "config: E = ", E, " is not a multiple of R = ", R, " (E % R = ", E % R, ")");
    EVENEP_CHECK(K >= 1 && K <= detail::kMaxTopK, "config: K = ", K, " must be in [1, ", detail::kMaxTopK, "]");
    EVENEP_CHECK(K <= E, "config: K = ", K, " exceeds E = ", E);
    EVENEP_CHECK(S >= 1, "config: S = ", S, " must be >= 1");
    EVENEP_CHECK(tp >= 1, "config: tp = ", tp, " must be >= 1");
    EVENEP_CHECK(B >= -1 && B <= epn(), "config: B = ", B, " must be in [0, epn = ", epn(), "] (or -1 for epn)");
    EVENEP_CHECK(std::isfinite(slack) && slack >= 0 && slack <= 1, "config: slack = ", slack,
                 " must be a finite value in [0, 1]");
    // Entry counts (S*K per rank, R*S*K per group) and flat destinations (R*NvS) are int32.
    const int64_t rows = recv_rows();
    EVENEP_CHECK(static_cast<int64_t>(R) * S * K < INT32_MAX, "config: R*S*K = ",
                 static_cast<int64_t>(R) * S * K, " overflows the int32 entry count");
    EVENEP_CHECK(static_cast<int64_t>(R) * rows < INT32_MAX, "config: R*NvS = ", static_cast<int64_t>(R) * rows,
                 " (NvS = ", rows, ") overflows the int32 destination encoding");
}

int32_t Config::slack_ppm() const {
    // Out-of-range values are refused by validate(); clamped here so an unvalidated config cannot overflow.
    const double ppm = std::nearbyint((std::isfinite(slack) ? slack : 0.0) * static_cast<double>(detail::kSlackPpmOne));
    return static_cast<int32_t>(std::clamp(ppm, 0.0, static_cast<double>(detail::kSlackPpmOne)));
}

std::string Config::to_string() const {
    std::ostringstream os;
    os << "R=" << R << " E=" << E << " K=" << K << " S=" << S << " epn=" << (R > 0 ? epn() : 0)
       << " B=" << (R > 0 ? num_slots() : B) << " tp=" << tp;
    if (slack != 0) os << " slack=" << slack;
    if (policy == PlannerPolicy::kAuto) os << " policy=auto";
    if (R > 0 && E % R == 0) os << " NvS=" << recv_rows();
    return os.str();
}

std::string_view to_string(PlannerMode mode) {
    return mode == PlannerMode::kReference ? "reference" : "optimized";
}

std::string_view to_string(PlannerPolicy policy) { return policy == PlannerPolicy::kAuto ? "auto" : "fixed"; }

PlannerMode parse_planner_mode(std::string_view name) {
    if (name == "reference") return PlannerMode::kReference;
    if (name == "optimized") return PlannerMode::kOptimized;
    EVENEP_CHECK(false, "planner: unknown mode '", name, "' (expected 'reference' or 'optimized')");
}

void apply_planner_policy(Config& cfg, std::string_view policy, double slack, std::string_view policy_name,
                          std::string_view slack_name) {
    const bool given = !(slack < 0);  // NaN counts as given: validate() names it
    if (policy == "auto") {
        cfg.policy = PlannerPolicy::kAuto;
        cfg.slack = given ? slack : kAutoDefaultSlack;
        return;
    }
    EVENEP_CHECK(policy.empty() || policy == "exact" || policy == "slack", policy_name, " '", policy,
                 "' is not one of auto, exact, slack");
    if (policy == "exact")
        EVENEP_CHECK(!given || slack == 0, policy_name, " exact plans with budget 0 but ", slack_name, " = ", slack,
                     " (use ", policy_name, " slack or auto)");
    if (policy == "slack") {
        EVENEP_CHECK(given, policy_name, " slack needs a budget ", slack_name, " > 0 (none given)");
        EVENEP_CHECK(slack > 0, policy_name, " slack needs a budget ", slack_name, " > 0 (got ", slack_name, " = ",
                     slack, ")");
    }
    cfg.policy = PlannerPolicy::kFixed;
    cfg.slack = given ? slack : 0.0;
}

}  // namespace evenep
