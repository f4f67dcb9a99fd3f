// The plan tensor's row of one rank, packed from the rank's buffer (evenep/cuda/detail/plan_pack.hpp): used by the
// planner's last phase (plan.cu) and cuda::pack_plan (expert_ops.cu), so both write the same bits as
// evenep::pack_plan_row.
#pragma once

#include <cstdint>

#include "evenep/cuda/detail/plan_pack.hpp"

namespace evenep::cuda::device {

// row[col.dst + j] = rank r's share of each column in `base` (int8 values sign-extended); thread `tid` of `step`
// threads writes every step-th value of each column.
__device__ __forceinline__ void pack_plan_row(
    const char* base, int r, const PlanPackColumns& cols, int32_t* row, int64_t tid, int64_t step) {
    for (int k = 0; k < cols.n; ++k) {
        const PlanPackColumn& c = cols.c[k];
        for (int64_t j = tid; j < c.count; j += step) {
            const int64_t at = static_cast<int64_t>(r) * c.count + j;
            row[c.dst + j] = c.bytes == 1 ? static_cast<int32_t>(reinterpret_cast<const int8_t*>(base + c.src)[at])
                                          : reinterpret_cast<const int32_t*>(base + c.src)[at];
        }
    }
}

}  // namespace evenep::cuda::device
