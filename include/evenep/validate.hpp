// evenep/validate.hpp — an independent checker of every plan invariant (SPEC §2, §3).
//
// Written as a separate code path from the planner: it recomputes what it needs from the plan's inputs
// (tpe, s, config) and the plan's own arrays, never calling planner internals. Used by tests and by
// `evenep plan --check`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep {

struct ValidationReport {
    std::vector<std::string> errors;  // empty when the plan is valid; each names the rank/expert/value
    bool ok() const { return errors.empty(); }
    std::string summary(size_t max_lines = 10) const;
};

// Checks a plan against its own inputs: balance (q_r), conservation (alloc sums), bounded redundancy
// (remote <= epn, prefetched <= B), segment layout (group order, padding to tp, cu_seqlens, NvS bound),
// copies table, weight sources, seg_row, cost counters.
ValidationReport validate_plan(const Plan& plan);

// Additionally checks the encoded destinations of every rank for a concrete routing: every unmasked entry
// maps to a row of a segment of its own expert, every row of every segment is hit exactly once, the rows
// of a segment hold entries in (source rank, token, k) order, payload dedup encoding (SPEC §3.4), masked
// entries encoded as kMaskedDst. dst: [R][s_r*K] as produced by compute_dst.
ValidationReport validate_dst(const Plan& plan, const Routing& routing, const std::vector<std::vector<int32_t>>& dst);

}  // namespace evenep
