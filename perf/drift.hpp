// perf/drift.hpp — a routing whose expert popularity drifts from step to step (a random walk).
//
// Step 0 is exactly make_lognormal(spec, sigma) (evenep/routing.hpp), the routing `evenep plan --sigma` draws.
// Every expert's log-popularity walks: l_0 = sigma * z (lognormal_scores(spec)); l_t = l_{t-1} + drift * n_t for
// t > 0 and l_t = l_{t+1} + drift * n_t for t < 0 (a Gaussian walk read backwards is the same walk), n_t ~ N(0,1)
// per expert from its own stream of (spec.seed, t). The tokens of step t != 0 are drawn by make_weighted(l_t)
// from a seed derived from (spec.seed, t), so steps are independent samples of their popularity.
// Used for EPLB planned from the previous step: place on step -1's load, compute step 0.
#pragma once

#include <vector>

#include "evenep/routing.hpp"

namespace evenep::perf {

struct DriftSpec {
    RoutingSpec spec;    // shape and seed
    double sigma = 1.0;  // skew of the step-0 popularity (lognormal sigma)
    double drift = 0.1;  // standard deviation of each expert's log-popularity step (0: fixed popularity)

    // Throws evenep::Error naming sigma or drift when negative or not finite.
    void validate() const;
};

// Log-popularity [E] of every expert at `step` (any integer).
std::vector<double> drift_log_popularity(const DriftSpec& d, int step);

// The routing of `step`: make_lognormal(spec, sigma) at step 0, else make_weighted with step-derived seed.
Routing drift_routing(const DriftSpec& d, int step);

}  // namespace evenep::perf
