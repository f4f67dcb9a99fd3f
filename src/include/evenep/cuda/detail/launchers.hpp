// evenep/cuda/detail/launchers.hpp — the kernel launchers of the CUDA backend (one .cu per family under
// src/cuda/kernels): not a contract of the library; for its runtime, its benchmarks and the tests.
//
// Every launcher validates its arguments, derives the grid from the team and the SM budget, launches on `stream`
// (last parameter) and checks cudaGetLastError(). None allocates or synchronises, so each is graph capturable.
// Kernels that synchronise virtual ranks are cooperative launches covering every rank (co-residency).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "evenep/buffer.hpp"
#include "evenep/cuda/detail/plan_pack.hpp"
#include "evenep/cuda/team.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/detail/ep_layout.hpp"

namespace evenep::cuda {

// Launchers of rank-synchronising kernels take an SM budget (SMs per virtual rank; MoonEP's benchmark uses 32) and
// return the blocks per rank they used: budget * blocks-per-SM, clamped so that all R * blocks blocks are
// co-resident on the device (one launch covers every virtual rank; a block spinning on a flag never waits for an
// unscheduled block). They throw when not even one block per rank fits.

// How the planner plans (both planner launchers).
struct PlanOptions {
    bool locality = true;                             // PlannerMode::kOptimized (false: kReference)
    PlannerKernel kernel = PlannerKernel::kParallel;  // the planner's form (evenep/cuda/types.hpp)
    bool relay = false;                               // plan the relayed copy tree (EpOptions::relay)
    PlanPackColumns pack{};  // launch_plan: the plan tensor's columns, for the ranks whose RankIo::plan is set
};

struct EpOptions;
// An Ep's planner options (mode, planner kernel, relay of its EpOptions); src/cuda/runtime/ep.cpp.
PlanOptions plan_options(const EpOptions& options);

// Histogram -> all-gather -> every rank plans -> encoded dst of each rank's entries, in one cooperative launch; with
// PlannerKernel::kCluster where plan_on_clusters, in three (histogram and all-gather, cooperative; each served rank's
// plan on a cluster of 8 blocks; the destinations). Returns the blocks per rank of the histogram and dst phases. d_io:
// device table [R] (topk_idx is read); s: [R] host ints; s_total: the group total when s differ, else -1 (stored in the
// gather rows, like the CPU backend). Bad expert ids are recorded in the team's error record.
int launch_plan(const TeamView& team,
                const EpLayout& layout,
                const RankIo* d_io,
                std::span<const int32_t> s,
                int64_t s_total,
                const PlanOptions& options,
                int sm_budget,
                cudaStream_t stream);

// Whether launch_plan with PlannerKernel::kCluster plans on clusters (three launches) for `team`: the shape fits the
// cluster (plan_cluster_fits) and the team's launching ranks' clusters all run at once; else it makes the one fused
// launch of kParallel.
bool plan_on_clusters(const TeamView& team, const EpLayout& layout);

// Whether launch_plan can run `team` on this device: its cooperative launch needs one block per launching rank at
// once (R virtual ranks on one GPU need R co-resident blocks; R = 224 at E = 896 does not fit an H200 with the
// planner's shared memory; with kCluster the cooperative launch holds no planner and the clusters run in waves).
bool plan_fits_co_resident(const TeamView& team, const EpLayout& layout, PlannerKernel kernel);

// What launch_plan_only plans and how it launches.
struct PlanOnlyOptions {
    PlanOptions plan;
    int rank_begin = 0;  // the planning ranks [rank_begin, rank_begin + num_ranks)
    int num_ranks = 1;
    int repeat = 1;     // > 1: plan again inside the launch (the phase stamps then show warm caches)
    bool early = true;  // the cluster launch is a programmatic dependent launch (scheduled while the stream's
                        // previous kernel runs; it waits for it before reading anything), as in launch_plan
};

// Planning only, from the histograms already in each rank's contiguous tpe array (EpLayout::tpe): one block per
// planning rank, or a cluster of 8 with PlannerKernel::kCluster where plan_cluster_fits. For tests and the planner
// benchmark.
void launch_plan_only(const TeamView& team,
                      const EpLayout& layout,
                      std::span<const int32_t> s,
                      const PlanOnlyOptions& options,
                      cudaStream_t stream);

// Whether launch_plan_only plans `layout`'s ranks on a cluster with PlannerKernel::kCluster on this device (block 0's
// state fits shared memory, E <= 1024, R <= 128, and the device runs such a cluster); else it uses one block.
bool plan_cluster_fits(const EpLayout& layout);

// precision.fp8 (forward dispatch only; layout.buf.fp8 must be set): each token row is quantised once (1x128
// blocks, fp8.hpp) and its e4m3 codes + scales go to recv_x8 / recv_scale instead of bf16 rows to recv_x; a NaN/Inf
// in any token row is recorded as DeviceErrorKind::kNonFiniteInput.
int launch_dispatch(const TeamView& team,
                    const EpLayout& layout,
                    const RankIo* d_io,
                    std::span<const int32_t> s,
                    int sm_budget,
                    cudaStream_t stream,
                    const DataPrecision& precision = {});

int launch_combine(const TeamView& team,
                   const EpLayout& layout,
                   const RankIo* d_io,
                   std::span<const int32_t> s,
                   bool apply_weights,
                   CombineMode mode,
                   int sm_budget,
                   cudaStream_t stream);

// Expert regions of every rank (see evenep/cuda/experts.hpp): bases and pool_bases are device tables [R] of the
// layer's window (weights, grads) and of the shared pool's window (slots, slot_grads).
struct ExpertsView {
    char* const* bases;
    char* const* pool_bases;
    size_t weights, slots, slot_grads, grads;  // byte offsets of [P][n][elems] regions
    int num_projections;
    int64_t elems;
};

// prefetch_weight and reduce_grad (experts.hpp); the copies table is read from each rank's plan copy.
int launch_prefetch_weight(
    const TeamView& team, const EpLayout& layout, const ExpertsView& experts, int sm_budget, cudaStream_t stream);
int launch_reduce_grad(
    const TeamView& team, const EpLayout& layout, const ExpertsView& experts, int sm_budget, cudaStream_t stream);

// Barrier test kernel: `rounds` team barriers at Phase::kTest; each round every rank writes its round number
// into every peer's word [rank] of `board` ([R][R] int32 per rank at offset `board_off`) and, after the barrier,
// checks what its peers wrote; mismatches are counted into errors[rank] (device [R]).
int launch_barrier_test(
    const TeamView& team, size_t board_off, int rounds, int sm_budget, int32_t* d_errors, cudaStream_t stream);

// Stores entries[i] into d_table[first + i] on `stream` (a small kernel taking the entries by value: graph
// capturable, and the host span need not outlive the call).
void launch_store_rank_io(RankIo* d_table, int first, std::span<const RankIo> entries, cudaStream_t stream);

// fill_random_bf16(dst, n, seed, 1.0f, stream) (evenep/cuda/grouped_gemm.hpp): the name the benchmarks use.
void launch_fill_random_bf16(uint16_t* dst, size_t n, uint64_t seed, cudaStream_t stream);

// Device-to-device copy with 16-byte vectors (the copy-bandwidth anchor); bytes % 16 == 0.
void launch_copy_vec16(void* dst, const void* src, size_t bytes, int num_blocks, cudaStream_t stream);

}  // namespace evenep::cuda
