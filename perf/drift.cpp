// Drifting routing (perf/drift.hpp).
#include "perf/drift.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "evenep/error.hpp"

namespace evenep::perf {
namespace {

// derive_seed streams of the walk increments and of the tokens; distinct from the generators' own streams
// (src/core/routing.cpp uses tags 1..5 in the same position).
inline constexpr uint64_t kStreamWalk = 16;
inline constexpr uint64_t kStreamTokens = 17;

uint64_t step_stream(uint64_t tag, int step) {
    const uint64_t magnitude = static_cast<uint64_t>(std::abs(static_cast<int64_t>(step)));
    const uint64_t index = step > 0 ? magnitude : (uint64_t{1} << 32) | magnitude;  // backward steps apart
    return (tag << 40) ^ index;
}

}  // namespace

void DriftSpec::validate() const {
    EVENEP_CHECK(std::isfinite(sigma) && sigma >= 0, "drift: sigma = ", sigma, " must be finite and >= 0");
    EVENEP_CHECK(std::isfinite(drift) && drift >= 0, "drift: drift = ", drift, " must be finite and >= 0");
}

std::vector<double> drift_log_popularity(const DriftSpec& d, int step) {
    d.validate();
    std::vector<double> l = lognormal_scores(d.spec);
    for (double& v : l) v *= d.sigma;
    for (int i = 1; i <= std::abs(step); ++i) {
        const int t = step > 0 ? i : -i;
        Rng rng(derive_seed(d.spec.seed, step_stream(kStreamWalk, t)));
        for (double& v : l) v += d.drift * rng.normal();
    }
    return l;
}

Routing drift_routing(const DriftSpec& d, int step) {
    d.validate();
    if (step == 0) return make_lognormal(d.spec, d.sigma);
    RoutingSpec spec = d.spec;
    spec.seed = derive_seed(d.spec.seed, step_stream(kStreamTokens, step));
    return make_weighted(spec, drift_log_popularity(d, step));
}

}  // namespace evenep::perf
