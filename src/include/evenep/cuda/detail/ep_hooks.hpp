// evenep/cuda/detail/ep_hooks.hpp — test and benchmark hooks of cuda::Ep (not a contract of the library): entry
// points the GPU planner test and `evenep bench gpu-plan` (perf/cuda/plan.cpp) need and a training step does not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <span>

#include "evenep/cuda/ep.hpp"

namespace evenep::cuda {

// Plans from given histograms (tpe: [R*E], host), skipping the histogram and the all-gather. Checks tpe and s
// (throws evenep::Error naming the rank and value), saves the resident plan, uploads tpe synchronously into the
// planning ranks' buffers, then launches one block per rank of [rank_begin, +num_ranks) (served ranks; rank_begin
// -1: the first served rank; num_ranks -1: every served rank from rank_begin on) on ep's channel, with ep's planner
// kernel unless `kernel` names another. The result has no
// encoded destinations: dispatch needs Ep::plan(). The planner's phase stamps (EpLayout::plan.timing) are read by
// the caller; launch_plan_only (evenep/cuda/detail/launchers.hpp) plans again on the resident plan.
EpPlan plan_from_tpe(Ep& ep,
                     std::span<const int32_t> tpe,
                     std::span<const int32_t> s,
                     cudaStream_t stream,
                     int rank_begin = -1,
                     int num_ranks = -1,
                     std::optional<PlannerKernel> kernel = std::nullopt);

// Ep::plan with `kernel` instead of ep's planner kernel (the benchmark's fused rows, side by side).
EpPlan plan_with_kernel(
    Ep& ep, std::span<const RankIo> io, std::span<const int32_t> s, cudaStream_t stream, PlannerKernel kernel);

}  // namespace evenep::cuda
