// perf/llep.hpp — an LLEP-like baseline (least-loaded expert parallelism), written from its public description:
// tokens over a rank's fair share spill, together with their expert's weights, to the least-loaded ranks; the
// spilled experts' gradients return home.
//
// Here: every expert starts on its home rank (e / (E/R)); cap = ceil(threshold * N / R) with N the batch's
// entries. Overloaded ranks in decreasing load order (ties: lower rank) spill their experts in decreasing load
// order (ties: lower id): each time min(excess, the expert's rows left at home, the receiver's room) rows go to the
// least-loaded rank (ties: lower rank), until the rank is at the cap. With threshold 1 every rank ends at most at
// ceil(N / R), the min-max optimum; each (expert, receiver) pair is one weight copy and one gradient return.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace evenep::perf {

// alloc [E*R] (entries of expert e computed on rank r) for per-expert loads `expert_load` [E]; threshold >= 1.
std::vector<int64_t> llep_alloc(int R, int E, std::span<const int64_t> expert_load, double threshold = 1.0);

}  // namespace evenep::perf
