// evenep/exact.hpp — exact optimum of the planning problem with a MILP solver (CBC), for small instances
// (R <= 8, E <= 64). Used by `evenep quality` and tests to measure the planners (SPEC §3.5).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "evenep/config.hpp"

namespace evenep {

enum class ExactObjective {
    kTotalCopies,         // min sum of copies, then max locally kept entries (min crossing rows)
    kMaxRankCopyTraffic,  // min max_r(copies received by r + copies pushed by r), then min total copies
};

struct ExactResult {
    bool optimal = false;          // solver proved the primary objective optimal within the time limit
                                   // (the secondary cost, e.g. crossing rows, is best effort)
    int64_t objective = 0;         // primary objective value of the best solution found
    int64_t total_copies = 0;
    int64_t max_rank_copy_traffic = 0;
    int64_t crossing_rows = 0;
    double seconds = 0;
};

bool exact_solver_available();  // false when built without CBC
// Throws evenep::Error when R > 8 or E > 64 or the solver is unavailable. B = epn is assumed.
ExactResult solve_exact(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s,
                        ExactObjective objective, double time_limit_s = 20.0);

}  // namespace evenep
