// evenep/cuda/grouped_gemm.hpp — bf16 grouped GEMM over receive-buffer groups on the GPU (SPEC §4.5, issue 5).
//
// A problem is one rank's receive buffer: rows [0, cu_seqlens[G-1]) of `x`, group g holding rows
// [begin_g, end_g) with begin_g = cu_seqlens[g-1] (0 for g = 0), end_g = cu_seqlens[g] (inclusive padded ends,
// device memory). Every row of a group is computed, padding rows included (dispatch zero-fills them). A group
// whose weight pointer is null or whose row count is 0 is empty: no tile, its output rows are not written.
//
//   kForward  y[row, o] = sum_i x[row, i] * W_g[i, o]       x: [rows, in]  bf16, y: [rows, out]
//   kDgrad    y[row, i] = sum_o x[row, o] * W_g[i, o]       x: [rows, out] bf16 (dY), y: [rows, in] (dX)
// W_g = weights[g] (device table of G device pointers, each [in, out] row-major bf16: a local expert, a prefetch
// slot or a peer pointer; 16-byte aligned). fp32 accumulation on the tensor cores, output bf16 (round to nearest
// even) or fp32. in and out must be multiples of 8 (16-byte rows); they need not be multiples of the tile.
// Tolerance against an fp32 reference: bf16 output rounding (2^-8 relative) plus fp32 summation-order differences.
//
// Kernels (GemmKernel): kWgmma is the hand-written Hopper kernel (compute capability 9.0, H100/H200) — TMA tile
// loads, wgmma m64n256k16, a warp-specialised persistent block per SM (one producer warpgroup, two consumer
// warpgroups), 128 x 256 x 64 tiles, per-group tensor maps written on the device; kMmaSync a portable mma.sync
// m16n8k16 + cp.async kernel (128 x 128 x 32 tiles); kCutlass / kCutlassPingpong CUTLASS's grouped GEMM (below, at
// GemmKernel). kAuto picks, per call, the one measured fastest on the H100/H200 (docs/benchmarks.md, "Tuning
// candidates"): CUTLASS's cooperative kernel for forward with bf16 output, for dgrad (bf16 or fp32 output), and for
// wgrad of a gradient with fewer rows than columns (in < out, the down projection's [H', H]), where it is built
// (EVENEP_CUTLASS) and runs; the hand-written Hopper kernel for forward with fp32 output, for the other wgrads
// (gate / up, [H, H']), and where CUTLASS is not built; the portable kernel off Hopper.
//
// Scheduling: the kernels are persistent. A one-block scheduler kernel, launched first on the same stream, reads
// cu_seqlens and the pointer table and writes the work order into `workspace`:
//   kFixed      groups in index order, tiles handed out round-robin (tile t to block t mod grid)
//   kLoadAware  tiles priced by a cost model calibrated on the H200 (GemmCostModel: c_tile + c_kblock per 64 of
//               the inner dimension; `evenep bench gemm --calibrate`), groups ordered by decreasing tile cost,
//               wgrad groups whose tile would exceed a fraction of one SM's share split into row chunks (Hopper
//               kernel), tiles handed out dynamically (atomic counter): the longest start first, short ones fill
//               the tail.
// No host synchronisation, no allocation: graph capturable. The workspace is caller-owned device memory of
// grouped_gemm_workspace_bytes(G) bytes (128-byte aligned, as cudaMalloc returns), not shared between concurrent
// calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace evenep::cuda {

enum class GemmOp : int { kForward = 0, kDgrad = 1 };
enum class GemmSchedule : int { kFixed = 0, kLoadAware = 1 };
// kWgmma, kCutlass and kCutlassPingpong throw where unsupported (grouped_gemm_has_wgmma / grouped_gemm_has_cutlass;
// kCutlassPingpong is a tuning candidate, measured slower than kCutlass on every row: grouped_gemm_has_candidates).
// kCutlass / kCutlassPingpong: CUTLASS 3.x's Hopper ptr-array grouped GEMM (TMA, warp-specialised wgmma, TMA
// epilogue; cooperative 128 x 256 tiles, or ping-pong 128 x 128 tiles whose epilogue overlaps the other warpgroup's
// mainloop), built when EVENEP_CUTLASS is ON (the pinned headers of scripts/fetch-cutlass.sh). kLoadAware hands the
// groups to CUTLASS's group scheduler (tiles dealt round-robin in list order) permuted by the cost model; kFixed in
// index order; wgrad groups are never split (deterministic either way). Dgrad with fp32 output (y_fp32) runs
// CUTLASS's cooperative kernel with an fp32 epilogue (kCutlassPingpong: kWgmma); forward with fp32 output always
// runs kWgmma. The group
// scheduler walks a group's tiles M-fastest (a weight column tile shared by the row tiles running together), or
// N-fastest (a row tile shared by the column tiles) where the rows per group on average outnumber the output's
// columns (GroupedGemmArgs::rows_capacity / G > N): then a group's rows, not its weight, are the operand that
// outgrows the L2 (measured: docs/benchmarks.md, "Raster order"; EVENEP_CUTLASS_RASTER=m|n overrides it).
enum class GemmKernel : int { kAuto = 0, kWgmma = 1, kMmaSync = 2, kCutlass = 3, kCutlassPingpong = 4 };

// The scheduler's cost model (µs per 128 x 256 tile on one SM = c_tile + c_kblock * k-blocks of 64).
struct GemmCostModel {
    float c_tile = 0;          // forward / dgrad tile overhead (prologue, epilogue stores)
    float c_tile_wgrad = 0;    // wgrad tile overhead (fp32 reduction of the tile into the gradient)
    float c_kblock = 0;        // one 128 x 256 x 64 k-block of wgmma (forward / dgrad: K-major A)
    float c_kblock_wgrad = 0;  // the same in wgrad (both operands MN-major)
    float split_fraction = 0;
    const char* source = "";  // where the coefficients come from (calibration run or estimate)
};
GemmCostModel grouped_gemm_cost_model();
// Modelled time (µs on one SM) of one group of `rows` rows under `m`, unsplit: forward / dgrad (`op`) on weights
// [in, out], or wgrad (`wgrad` true, `op` ignored) of the gradient [in, out]. The formula the kLoadAware scheduler
// balances (evenep/detail/gemm_cost.hpp); a call's balanced makespan is the sum over its groups / SMs.
float grouped_gemm_group_cost_us(const GemmCostModel& m, GemmOp op, bool wgrad, int rows, int in, int out);
// True when the hand-written Hopper kernel (kWgmma) runs on the current device.
bool grouped_gemm_has_wgmma();
// True when the CUTLASS kernels (kCutlass, the FP8 block-scaled grouped GEMM) are built in and run on the current
// device (compute capability 9.0).
bool grouped_gemm_has_cutlass();
// True when, in addition, the CUTLASS tuning candidates are built in (EVENEP_CUTLASS_CANDIDATES; not in the default
// build, so that CI compiles only the kernels in use; docs/benchmarks.md "Tuning candidates"): kCutlassPingpong, the
// unscaled FP8 anchor (GroupedGemmFp8Args::block_scaled false), the wide FP8 tile (Fp8Mainloop::kOverlappedWide)
// and grouped_gemm_wgrad_fp8.
bool grouped_gemm_has_candidates();

struct GroupedGemmArgs {
    const uint16_t* x = nullptr;               // [rows, in] (kForward) or [rows, out] (kDgrad), bf16 bits
    const int32_t* cu_seqlens = nullptr;       // [G] device, inclusive padded end rows, non-decreasing
    const uint16_t* const* weights = nullptr;  // [G] device table of device pointers W_g [in, out] bf16
    void* y = nullptr;                         // [rows, out] (kForward) or [rows, in] (kDgrad): bf16 or fp32
    bool y_fp32 = false;                       // y is fp32 (else bf16 bits)
    int num_groups = 0;                        // G, 1..kMaxGemmGroups
    int in_dim = 0;                            // in (multiple of 8)
    int out_dim = 0;                           // out (multiple of 8)
    GemmOp op = GemmOp::kForward;
    GemmSchedule schedule = GemmSchedule::kLoadAware;
    void* workspace = nullptr;  // grouped_gemm_workspace_bytes(G) bytes of device memory
    GemmKernel kernel = GemmKernel::kAuto;
    // Optional: the rows x and y hold (>= cu_seqlens[G-1]; the receive buffer's rows), 0 when unknown. Only the
    // CUTLASS kernels read it, to pick their raster order (GemmKernel); it changes no result.
    int64_t rows_capacity = 0;
};

inline constexpr int kMaxGemmGroups = 8192;

// Device workspace bytes one grouped_gemm call with G groups needs.
size_t grouped_gemm_workspace_bytes(int num_groups);

// Launches the scheduler and the persistent GEMM on `stream` (asynchronous). Throws evenep::Error(kInvalidArgument)
// naming the field for a null pointer, G outside 1..kMaxGemmGroups, or in/out not positive multiples of 8.
void grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

// Weight gradient: grads[g][i, o] += sum over the rows r of group g of x[r, i] * dy[r, o] (fp32, into the
// gradient; a slot group's pointer is its row of the reduce buffer; 16-byte aligned). Groups with 0 rows or a null
// gradient pointer are skipped (their gradient is untouched). Hopper kernel: a tile per 128 x 256 block of
// [in, out] and row chunk, added into the gradient by fp32 bulk reductions in the memory system, tiles handed out
// longest group first with either schedule. kFixed never splits a group and is deterministic; kLoadAware splits a
// group into row chunks when its tiles are too few to keep the SMs busy (a unit above a quarter of an SM's share),
// and the chunks' partial sums are then added in an unspecified order (results may differ in the last bits from
// run to run). CUTLASS (kCutlass, kCutlassPingpong, and kAuto where in < out): never split, deterministic.
// mma.sync kernel: one tile per 128 x 128 block over all the group's rows, deterministic. Same
// workspace as grouped_gemm.
struct GroupedWgradArgs {
    const uint16_t* x = nullptr;          // [rows, in] bf16: the forward input
    const uint16_t* dy = nullptr;         // [rows, out] bf16: the output gradient
    const int32_t* cu_seqlens = nullptr;  // [G] device, inclusive padded end rows
    float* const* grads = nullptr;        // [G] device table of device pointers dW_g [in, out] fp32
    int num_groups = 0;
    int in_dim = 0;   // multiple of 8
    int out_dim = 0;  // multiple of 8
    GemmSchedule schedule = GemmSchedule::kLoadAware;
    void* workspace = nullptr;  // grouped_gemm_workspace_bytes(G) bytes
    GemmKernel kernel = GemmKernel::kAuto;
    // false: overwrite instead of accumulate (dW_g = x_g^T dy_g, e.g. the first micro-batch after the gradients were
    // released): the gradient is written without being read, half the memory traffic; groups are never split
    // (deterministic). Skipped groups are untouched either way.
    bool accumulate = true;
};
void grouped_gemm_wgrad(const GroupedWgradArgs& args, cudaStream_t stream);

// FP8 grouped GEMM (issue 34; DeepSeek-V3 style: e4m3 inputs with fp32 block scales, fp32 accumulation, bf16
// output), forward and dgrad, on CUTLASS (EVENEP_CUTLASS, compute capability 9.0; grouped_gemm_has_cutlass()).
// The formats are those of evenep/detail/fp8.hpp: OCP e4m3, x' = e4m3 * scale.
//   block_scaled (default)  y[row, n] = sum_k (x[row, k] * sx[row, k / 128]) * (W[k, n] * sw[k / 128, n / 128]),
//                           the scales applied per 128-deep k-block to the fp32 partial sums (CUTLASS's blockwise
//                           scaling); activations 1 x 128, weights 128 x 128 blocks.
//                           mainloop (Fp8Mainloop): CUTLASS's consumer loop, or EvenEP's (each k-block's promotion
//                           overlaps the next k-block's wgmma; the same sums in the same order, so the same bits).
//   !block_scaled           y = x W with every scale taken as 1 (the scales are not read): CUTLASS's unscaled FP8
//                           grouped GEMM (fast accumulation), the in-run speed anchor of the scaled kernel; a tuning
//                           candidate (grouped_gemm_has_candidates(); elsewhere it throws).
// Operands (K = in, N = out for kForward; K = out, N = in for kDgrad), all 16-byte aligned:
//   x              [rows, K] e4m3 bytes: the dispatched rows (kForward) or dY (kDgrad)
//   x_scales       [rows, K / 128] fp32, row-major
//   weights        [G] device table: kForward reads W_g^T [out][in] e4m3 (K-major: fp8 wgmma reads only K-major
//                  operands, so the forward needs the transposed copy the FP8 weight cast writes); kDgrad reads W_g
//                  [in][out] e4m3 as it is
//   weight_scales  [G] device table of fp32 [in / 128][out / 128] row-major (the same array for both ops)
//   y              [rows, N] bf16 (round to nearest even)
// in and out must be multiples of 128. Groups are scheduled as in grouped_gemm with kernel = kCutlass, raster order
// (rows_capacity) included (empty, null or misaligned weight pointers: no tile; grouped_gemm_check reports misaligned
// ones). Same workspace.
//
// The block-scaled kernel's consumer loop. CUTLASS's waits for each k-block's wgmma before it scales the partial sums
// into the accumulator, so the tensor cores idle through every promotion; EvenEP's (kOverlapped,
// src/cuda/kernels/cutlass/fp8_overlap_mainloop.cuh) keeps two partial accumulators and issues k-block t+1 before it
// promotes k-block t. kAuto takes EvenEP's where the output has more columns than the inner dimension (N > K),
// CUTLASS's elsewhere: measured on the H100 (docs/benchmarks.md, "Ninth session"), EvenEP's loop was 3-9% faster on
// 9 of the 10 rows with N > K (N = 7168 or 3584, K = 2048) and 0.94-1.02x CUTLASS's on the rows with N < K.
// kOverlappedWide (a tuning candidate: grouped_gemm_has_candidates(), elsewhere it throws): 128 x 256 tiles with
// EvenEP's loop promoting a quarter of the tile at a time (two 64-column partials), so that the accumulator and the
// partials fit the registers; each element's sums are the same as the other loops', the tensor cores' n64 wgmma in
// place of n128.
enum class Fp8Mainloop : int { kAuto = 0, kCutlass = 1, kOverlapped = 2, kOverlappedWide = 3 };
struct GroupedGemmFp8Args {
    const uint8_t* x = nullptr;
    const float* x_scales = nullptr;
    const int32_t* cu_seqlens = nullptr;
    const uint8_t* const* weights = nullptr;
    const float* const* weight_scales = nullptr;
    uint16_t* y = nullptr;
    int num_groups = 0;
    int in_dim = 0;   // multiple of 128
    int out_dim = 0;  // multiple of 128
    GemmOp op = GemmOp::kForward;
    GemmSchedule schedule = GemmSchedule::kLoadAware;
    bool block_scaled = true;
    Fp8Mainloop mainloop = Fp8Mainloop::kAuto;  // block-scaled only
    void* workspace = nullptr;                  // grouped_gemm_workspace_bytes(G) bytes
    int64_t rows_capacity = 0;                  // as GroupedGemmArgs'
};
// Throws evenep::Error(kInvalidArgument) naming the field for a null pointer, G outside 1..kMaxGemmGroups, or in/out
// not positive multiples of 128; without the CUTLASS kernels (grouped_gemm_has_cutlass() false) it throws too.
void grouped_gemm_fp8(const GroupedGemmFp8Args& args, cudaStream_t stream);

// FP8 wgrad (DeepSeek-V3 does its wgrad in FP8 too; a tuning candidate, EVENEP_CUTLASS_CANDIDATES, not used by the
// MoE layer; grouped_gemm_has_candidates()): dW_g [in][out] fp32 (+)= sum over the group's rows r of x[r, i] dy[r, o],
// computed from the wgrad cols casts of x and dy (cuda::launch_fp8_cast_cols of the same cu_seqlens and capacity;
// evenep/detail/fp8.hpp): per 128-row block of the group the e4m3 partial sums scaled by sx[block][i] * sdy[block][o]
// (CUTLASS's blockwise scaling with one scale per channel), fp32 accumulation; cpu::grouped_gemm_wgrad_fp8 is the
// reference (within the tolerance of docs/fp8.md). A group's first row must be a multiple of 16 (its operand columns
// start 16-byte aligned, as TMA needs): a group with rows that starts elsewhere, or whose gradient pointer is not
// 16-byte aligned, is skipped and reported by grouped_gemm_check. Groups are ordered as grouped_gemm_wgrad's kCutlass
// ones.
struct GroupedWgradFp8Args {
    const uint8_t* x_cols = nullptr;       // [in][fp8_cols_ld(capacity)] e4m3
    const float* x_col_scales = nullptr;   // [fp8_cols_scale_rows(capacity, G)][in]
    const uint8_t* dy_cols = nullptr;      // [out][fp8_cols_ld(capacity)] e4m3
    const float* dy_col_scales = nullptr;  // [fp8_cols_scale_rows(capacity, G)][out]
    const int32_t* cu_seqlens = nullptr;   // [G] device, inclusive padded end rows, cu_seqlens[G-1] <= capacity
    float* const* grads = nullptr;         // [G] device table of dW_g [in, out] fp32
    int num_groups = 0;
    int in_dim = 0;   // multiple of 128
    int out_dim = 0;  // multiple of 128
    int64_t capacity = 0;
    GemmSchedule schedule = GemmSchedule::kLoadAware;
    bool accumulate = true;     // false: dW_g = (the gradient is not read)
    void* workspace = nullptr;  // grouped_gemm_workspace_bytes(G) bytes
};
void grouped_gemm_wgrad_fp8(const GroupedWgradFp8Args& args, cudaStream_t stream);

// Synchronises `stream` and throws evenep::Error(kInvalidArgument) naming the first group of the last call on
// `workspace` whose pointer (weight or gradient) was rejected: a group with rows and a non-null pointer that is not
// 16-byte aligned (TMA and cp.async need it). A rejected group is skipped by the GEMM (its output rows or gradient
// are not written). Optional, like DeviceEp::check: call it where a host synchronisation is acceptable.
void grouped_gemm_check(const void* workspace, int num_groups, cudaStream_t stream);

// Persistent blocks the GEMM launches on the current device (multiprocessors x co-resident blocks) for kAuto.
int grouped_gemm_grid_blocks(GemmOp op);

// Fills p[0, n) with bf16 values uniform in [-scale, scale): element i is
// detail::random_bf16(detail::hash64(seed, i), scale) (evenep/detail/hash.hpp), deterministic (benchmarks, tests).
void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);
// The same values (element i: detail::random_bf16(detail::hash64(seed, i), scale)) rounded to e4m3 (nearest even,
// saturating at 448: CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE): FP8 operands of benchmarks and tests.
void fill_random_e4m3(uint8_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace evenep::cuda
