// evenep/detail/plan_stamps.hpp — the GPU planner's timing stamps: the words of EpLayout::plan.timing
// ([kNumPlanStamps] int64) that the planner kernels write and `evenep bench gpu-plan` (perf/cuda/plan.cpp) reads
// for its phase breakdown. Compiled in only on request: the CMake option EVENEP_PLANNER_STAMPS (OFF by default)
// defines EVENEP_PLANNER_STAMPS=1; without it the kernels hold no stamp code and the words are never written.
//
// All %globaltimer ns unless said. A stamp right after a block barrier is taken behind a shared-memory load (see
// plan_block.cuh), so that it reads the time the barrier released, not the time the warp arrived.
#pragma once

namespace evenep::detail {

#if defined(EVENEP_PLANNER_STAMPS) && EVENEP_PLANNER_STAMPS
inline constexpr bool kPlannerStamps = true;
#else
inline constexpr bool kPlannerStamps = false;
#endif

enum PlanStamp : int {
    // The block planner (plan_block.cuh), thread 0 of the planning block.
    kStampPhase = 0,           // [0, 9): boundary i of phases 0..7 at kStampPhase + i (8: the plan's end)
    kStampFillIterations = 9,  // [9, 11): greedy-step iterations of fills 0 and 1 (counts)
    kStampSplitPieces = 11,    // the most pieces one donor was split into (count)
    kStampClockBegin = 12,     // clock64 at the start and the end (the SM clock of the run, with the timer words)
    kStampClockEnd = 13,
    kStampTimerBegin = 14,  // %globaltimer at the start and the end
    kStampTimerEnd = 15,
    // The fused team kernel (src/cuda/kernels/plan.cu), rank 0's block 0.
    kStampFusedBegin = 16,          // histogram starts
    kStampFusedHistogramDone = 17,  // all-gather starts
    kStampFusedGatherDone = 18,     // planning starts
    kStampFusedPlanDone = 19,       // destinations start
    kStampFusedEnd = 20,            // destinations done (dedup included)
    kStampFusedStagingDone = 21,    // route rows staged
    kStampFusedWalkDone = 22,       // entries walked (dedup follows)
    // Phase 2's roles of the block planner: when each finished.
    kStampRolesDone = 23,      // the latest fill or path
    kStampTransfersDone = 24,  // the transfers
    kStampSplitDone = 25,      // the reference split
    kStampHomeRowsDone = 26,   // the home route rows
    kStampFillDone = 27,       // [27, 31): fill v at kStampFillDone + v
    kStampPathsDone = 31,      // the later path
    kNumPlanStamps = 32,
};

}  // namespace evenep::detail
