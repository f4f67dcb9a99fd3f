// evenep/cuda/types.hpp — small value types of the CUDA backend's interface.
#pragma once

#include <cstdint>

namespace evenep::cuda {

// Caller-owned device pointers of one virtual rank, given to every Ep call (plan, dispatch, combine and their
// backwards); the call stores them into the Ep's device table on its stream, where the kernels read them.
struct RankIo {
    const uint16_t* x = nullptr;        // [S, H] bf16 dispatch input (rows >= s_r unused)
    const int32_t* topk_idx = nullptr;  // [S, K] expert ids, -1 masked
    const float* topk_w = nullptr;      // [S, K] fp32 route weights
    uint16_t* out = nullptr;            // [S, H] bf16 combine output
    float* out_w = nullptr;             // [S, K] fp32 gathered route weights (nullptr: not gathered)
    uint16_t* rows = nullptr;           // [NvS, H] bf16 this rank's receive rows for this call, 16-byte aligned:
                                        // dispatch writes them and combine reads them there instead of recv_x of
                                        // the rank's buffer (nullptr: the buffer's). Local team only (every rank's
                                        // rows in this process); the metadata (recv_w, chains) stays in the buffer
    int32_t* plan = nullptr;            // Ep::plan: [plan_row_width] int32, this rank's row of the plan tensor
                                        // (evenep/plan_tensor.hpp), written by the planner's last phase: the bits of
                                        // cuda::pack_plan without its launch (nullptr: not written)
    // The FP8 dispatch (EpOptions::precision.fp8; docs/fp8.md); codes 16-byte aligned; each pair set together:
    const uint8_t* x8 = nullptr;      // [S, H] e4m3 codes quantised by the caller (DeepEP's x_fp8), with x_scales
    const float* x_scales = nullptr;  // [S, H/128] their fp32 scales (4-byte aligned): moved as given, x unread;
                                      // a NaN code or a scale not finite and > 0 (a power of two with ue8m0) is
                                      // recorded as DeviceErrorKind::kBadFp8Input
    uint8_t* rows8 = nullptr;         // [NvS, H] e4m3 receive codes and [NvS, H/128] scales of this rank for this
    float* row_scales = nullptr;      // call instead of the buffer's recv_x8 / recv_scale (local team only, as rows;
                                      // scales 4-byte aligned)
};

enum class PlannerKernel : int {
    kParallel = 0,  // the warp-specialised block planner (src/cuda/device/plan_block.cuh)
    kSerial = 1,    // plan_core.hpp's sequential functions on one thread (the bit-exactness reference; slow)
    kCluster = 2,   // the block planner on a cluster of 8 blocks (src/cuda/device/plan_cluster.cuh): its four global
                    // fills and the home route rows on blocks of their own. Ep::plan then runs three launches
                    // (histogram + all-gather, every served rank's plan on a cluster, destinations) instead of the
                    // one fused launch; shapes whose state does not fit the cluster, or whose served ranks' clusters
                    // do not all fit the device at once (64 virtual ranks), plan as kParallel does
};

enum class CombineMode : int {
    kPull = 0,          // each source rank reads its entries' rows through the peer pointers, one pass
    kPushPartials = 1,  // each destination pre-sums a token's duplicates in fp32 and writes one fp32 partial per
                        // (token, destination rank) to the source, which adds the partials (SPEC §4.2 Beyond)
};

}  // namespace evenep::cuda
