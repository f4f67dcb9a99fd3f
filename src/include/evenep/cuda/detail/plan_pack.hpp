// evenep/cuda/detail/plan_pack.hpp — the plan tensor's columns (evenep/plan_tensor.hpp) with where each array lies
// in a rank's buffer: what the planner's last phase reads to write RankIo::plan (src/cuda/kernels/plan.cu) and what
// the packing functions of evenep/cuda/expert_ops.hpp read (src/cuda/kernels/expert_ops.cu). Kernels take it by
// value; the copy itself is device::pack_plan_row (src/cuda/device/plan_pack.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "evenep/config.hpp"
#include "evenep/detail/ep_layout.hpp"

namespace evenep::cuda {

inline constexpr int kMaxPlanColumns = 24;  // plan_columns has 16 today

// One plan column: where rank r's share lies in the rank's buffer (src + r*count values), where it goes in the row.
struct PlanPackColumn {
    size_t src;  // byte offset of the array in a rank's buffer
    int64_t dst, count;
    int bytes;  // 1 (int8, sign-extended in the row) or 4
};
struct PlanPackColumns {
    PlanPackColumn c[kMaxPlanColumns];
    int n = 0;  // 0: nothing to pack
    int64_t width = 0;
};

// The columns of `cfg`'s plan tensor over the device plan arrays at `offsets` (evenep::for_each_plan_column).
PlanPackColumns plan_pack_columns(const Config& cfg, const PlanOffsets& offsets, const char* what);

}  // namespace evenep::cuda
