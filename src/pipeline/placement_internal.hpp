// Shared by the placement policies (placement.cpp) and the exact policy (optimal.cpp); not a public contract.
#pragma once

#include <vector>

#include "evenep/pipeline.hpp"

namespace evenep::pipeline::detail {

// A ViT piece placed on a rank at a planned start time.
struct PlacedPiece {
    int rank = 0;
    double start = 0;
    Step step;
};

// m empty rows.
VitWork no_vit(int m);

// The text order of every rank with the placed pieces inserted by planned start (text ops keep their start in
// `text_schedule`, the text-only simulation of `text`).
RankOrders merge_orders(const PipelineConfig& cfg, const RankOrders& text, const Schedule& text_schedule,
                        const std::vector<PlacedPiece>& pieces);

// The `bubbles` policy's schedule (the best of its candidate placements, never worse than `sync`).
Schedule bubbles_schedule(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& text,
                          const Schedule& text_schedule);

// The `optimal` policy (optimal.cpp): MILP with CBC, started from the bubbles schedule.
PolicyResult optimal_policy(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& text,
                            const Schedule& text_schedule, const PolicyOptions& options);

}  // namespace evenep::pipeline::detail
