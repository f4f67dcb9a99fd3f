// The GPU planner's timing stamps on the device; evenep/detail/plan_stamps.hpp names the words and holds the
// switch. Without EVENEP_PLANNER_STAMPS, plan_stamps gives nullptr and every stamp site tests that pointer (or is
// reached only through it), so the compiler drops them all.
#pragma once

#include <cstdint>

#include "cuda/device/team.cuh"
#include "evenep/detail/ep_layout.hpp"
#include "evenep/detail/plan_stamps.hpp"

namespace evenep::cuda::device {

// The stamp words of the rank whose buffer is `base` (EpLayout::plan.timing), or nullptr without stamps.
__device__ __forceinline__ int64_t* plan_stamps(char* base, const EpLayout& L) {
    if constexpr (detail::kPlannerStamps) {
        return EpLayout::at<int64_t>(base, L.plan.timing);
    } else {
        (void)base, (void)L;
        return nullptr;
    }
}

// timing[word] = the global timer (ns).
__device__ __forceinline__ void stamp_time(int64_t* timing, int word) {
    timing[word] = static_cast<int64_t>(global_timer_ns());
}

// timing[word] = max(timing[word], v), for stamps several warps write.
__device__ __forceinline__ void stamp_max(int64_t* timing, int word, uint64_t v) {
    atomicMax(reinterpret_cast<unsigned long long*>(timing + word), static_cast<unsigned long long>(v));
}

// timing[word] = max(timing[word], the global timer).
__device__ __forceinline__ void stamp_max_time(int64_t* timing, int word) { stamp_max(timing, word, global_timer_ns()); }

}  // namespace evenep::cuda::device
