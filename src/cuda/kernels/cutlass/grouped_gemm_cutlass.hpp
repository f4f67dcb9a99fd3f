// src/cuda/kernels/cutlass/grouped_gemm_cutlass.hpp — internal: the CUTLASS 3.x (Hopper ptr-array grouped GEMM,
// TMA + warp-specialised wgmma) backend of evenep::cuda::grouped_gemm / grouped_gemm_wgrad
// (GemmKernel::kCutlass, kCutlassPingpong; include/evenep/cuda/grouped_gemm.hpp). Built when EVENEP_CUTLASS is ON
// (the pinned headers of scripts/fetch-cutlass.sh); no CUTLASS header is included here.
//
// Each (op, schedule) pair is one kernel instantiation in its own translation unit
// (grouped_gemm_cutlass_<op>_<schedule>.cu, so that a 2-core build compiles them in parallel; the tuning candidates'
// in candidates/); the templates are in grouped_gemm_cutlass.cuh, the dispatch in grouped_gemm_cutlass.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "evenep/cuda/grouped_gemm.hpp"

namespace evenep::cuda::cutlass_gemm {

enum class Op : int { kForward = 0, kDgrad = 1, kWgrad = 2 };
// kCooperative: both consumer warpgroups on one 128 x 256 tile; kPingpong: each consumer warpgroup on its own
// 128 x 128 tile, one's epilogue overlapping the other's mainloop.
enum class Schedule : int { kCooperative = 0, kPingpong = 1 };
// The tuning candidates (src/cuda/kernels/cutlass/candidates/, built only with EVENEP_CUTLASS_CANDIDATES so that CI
// compiles only the kernels in use): the ping-pong schedule of every op, the unscaled FP8 anchor (Fp8Kind::kUnscaled)
// and the FP8 wgrad (Fp8Kind::kBlockwiseWgrad). Whether they are built in.
bool candidates_built();

struct LaunchArgs {
    Op op = Op::kForward;
    const uint16_t* x = nullptr;        // forward: x [rows][in]; dgrad: dY [rows][out]; wgrad: x [rows][in] (bf16 bits)
    const uint16_t* dy = nullptr;       // wgrad: dY [rows][out]
    const int32_t* cu = nullptr;        // [G] inclusive padded end rows
    const void* const* ptrs = nullptr;  // [G] weights W_g [in][out] bf16, or (wgrad) gradients dW_g [in][out] fp32
    void* y = nullptr;                  // forward [rows][out] / dgrad [rows][in], bf16 bits
    int num_groups = 0;
    int in_dim = 0;
    int out_dim = 0;
    bool load_aware = true;  // groups handed to CUTLASS's group scheduler in the cost model's order (else index order)
    bool accumulate = true;  // wgrad: dW += (beta = 1) or dW = (beta = 0)
    bool raster_along_n = false;  // set by launch (raster_along_n below): a group's tiles N-fastest, else M-fastest
    int64_t rows_capacity = 0;    // the caller's rows hint (GroupedGemmArgs::rows_capacity), 0: unknown
    bool y_fp32 = false;          // dgrad: y is fp32 (the cooperative dgrad_f32 instantiation)
    GemmCostModel cost;      // the calibrated model that orders the groups
    void* workspace = nullptr;
};

// True when the backend is compiled in and the current device runs it (compute capability 9.0).
bool supported();
// Bytes of the grouped GEMM workspace this backend needs for G groups on the current device (its own per-group
// tables, then CUTLASS's workspace), excluding the error word.
size_t workspace_bytes(int num_groups);
// The raster order of a call on weights [in_dim][out_dim]: N-fastest where the rows per group on average outnumber
// the output's columns N (out_dim forward, in_dim dgrad: rows_capacity > G * N; include/evenep/cuda/grouped_gemm.hpp,
// GemmKernel), so that a wave shares a group's row tiles rather than a weight's column tiles; M-fastest for wgrad and
// when rows_capacity is 0. The tuning knob EVENEP_CUTLASS_RASTER=m|n (read once per process) overrides it for every
// CUTLASS grouped GEMM (bf16 and FP8), for `evenep bench gemm` to measure both orders on the same build.
bool raster_along_n(Op op, int64_t rows_capacity, int num_groups, int in_dim, int out_dim);

// Launches the prepare kernel (per-group problem shapes, pointers and strides in the chosen order; the error word)
// and the CUTLASS kernel on `stream`, in the raster order above (args.raster_along_n is ignored). No allocation, no
// host synchronisation.
void launch(Schedule schedule, const LaunchArgs& args, cudaStream_t stream);

// FP8 (evenep::cuda::grouped_gemm_fp8): kBlockwiseForward / kBlockwiseDgrad (1 x 128 activation and 128 x 128
// weight scales; the weight scales' [in/128][out/128] array is N-major in the forward and K-major in dgrad, hence two
// instantiations) and kUnscaled (fast-accumulating, no scales; both ops are the same K-major x K-major kernel).
// kBlockwiseWgrad (a tuning candidate, EVENEP_CUTLASS_CANDIDATES): dW_g (fp32, C = D) += xt_g · dyt_g^T over the
// group's rows, both operands the wgrad cols casts (launch_fp8_cast_cols: [dim][ld] K-major, per-channel scales per
// 128-row block, MN-major [blocks][dim]).
// kBlockwiseForwardOverlap / kBlockwiseDgradOverlap are kBlockwiseForward / kBlockwiseDgrad with EvenEP's consumer
// loop (fp8_overlap_mainloop.cuh: each k-tile's promotion overlaps the next k-tile's wgmma) in place of CUTLASS's
// (Fp8Mainloop::kOverlapped; grouped_gemm_fp8 resolves kAuto). kBlockwiseForwardWide / kBlockwiseDgradWide (tuning
// candidates, Fp8Mainloop::kOverlappedWide): 128 x 256 tiles with EvenEP's piecewise loop (fp8_overlap_mainloop.cuh,
// PiecewisePromotionMainloop).
enum class Fp8Kind : int {
    kBlockwiseForward = 0,
    kBlockwiseDgrad = 1,
    kUnscaled = 2,
    kBlockwiseWgrad = 3,
    kBlockwiseForwardOverlap = 4,
    kBlockwiseDgradOverlap = 5,
    kBlockwiseForwardWide = 6,
    kBlockwiseDgradWide = 7,
};

struct Fp8LaunchArgs {
    Op op = Op::kForward;  // kForward or kDgrad
    bool block_scaled = true;
    Fp8Mainloop mainloop = Fp8Mainloop::kCutlass;  // block-scaled fwd / dgrad: the consumer loop, never kAuto
    const uint8_t* x = nullptr;       // [rows][K] e4m3
    const float* x_scales = nullptr;  // [rows][K / 128]
    const int32_t* cu = nullptr;
    const void* const* ptrs = nullptr;            // [G] e4m3 weights: forward W^T [out][in], dgrad W [in][out]
    const float* const* weight_scales = nullptr;  // [G] [in / 128][out / 128]
    uint16_t* y = nullptr;                        // [rows][N] bf16
    int num_groups = 0;
    int in_dim = 0;
    int out_dim = 0;
    bool load_aware = true;
    bool raster_along_n = false;  // as LaunchArgs'
    int64_t rows_capacity = 0;    // as LaunchArgs'
    GemmCostModel cost;
    void* workspace = nullptr;
    // kWgrad (kBlockwiseWgrad): x / x_scales are x's wgrad cols cast, dy / dy_scales dy's, capacity their buffer's
    // rows; ptrs the fp32 gradients dW_g [in][out]; accumulate: beta = 1.
    const uint8_t* dy = nullptr;
    const float* dy_scales = nullptr;
    int64_t capacity = 0;
    bool accumulate = true;
};
void launch_fp8(const Fp8LaunchArgs& args, cudaStream_t stream);

// One instantiation (defined in grouped_gemm_cutlass.cuh / grouped_gemm_cutlass_fp8.cuh, instantiated in its own .cu).
// kF32: fp32 output (dgrad, cooperative only).
template <Op kOp, Schedule kSchedule, bool kF32 = false>
size_t instance_workspace_bytes(int num_groups, int sm_count);
template <Op kOp, Schedule kSchedule, bool kF32 = false>
void instance_launch(const LaunchArgs& args, int sm_count, cudaStream_t stream);
template <Fp8Kind kKind>
size_t fp8_instance_workspace_bytes(int num_groups, int sm_count);
template <Fp8Kind kKind>
void fp8_instance_launch(const Fp8LaunchArgs& args, int sm_count, cudaStream_t stream);

}  // namespace evenep::cuda::cutlass_gemm
