// The GPU planner: histogram of topk_idx -> all-gather through the team -> every rank plans from the gathered
// histograms (decentralised, SPEC §3) -> encoded destinations of the rank's own entries (SPEC §3.3, §3.4).
//
// One cooperative launch covers every virtual rank; blocks [r*nb, (r+1)*nb) act for rank r. Phases:
//   1. histogram   block b counts the entries of its token chunk [b*chunk, (b+1)*chunk) into hist[b][E]
//   -- rank barrier (kPlanHistogram)
//   2. gather      per expert: exclusive prefix of hist over blocks (kept for phase 4); the total is stored into
//                  the rank's row (s, s_total, tpe[E]) of every peer's gather area (remote stores)
//   -- team barrier (kPlanGather): every rank holds every rank's histogram
//   3. plan        block 0 of the rank copies the gathered rows into the contiguous tpe[R*E] and plans from it
//   -- rank barrier (kPlanReady)
//   4. dst         block b walks its chunk in (token, k) order: per-warp histograms give each entry its
//                  position among the rank's entries of its expert; plan_entry_dst maps it; then per token the
//                  later entries for an already used destination rank are encoded as duplicates.
// With PlannerKernel::kCluster (where the shape fits the cluster) the same phases run as three launches: phases 1-2
// and the copy of phase 3 (TeamStage::kGather, cooperative), each served rank's plan on a cluster of 8 blocks
// (plan_cluster_kernel, gated on the copy), phase 4 (TeamStage::kDst; it stops when an error was recorded).
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/device/plan_block.cuh"
#include "cuda/device/plan_cluster.cuh"
#include "cuda/device/plan_pack.cuh"
#include "cuda/device/plan_stamps.cuh"
#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/detail/plan_relay.hpp"

namespace evenep::cuda {
namespace {

using device::kFullMask;
using device::kWarpSize;

inline constexpr int kPlanThreads = 512;

struct PlanParams {
    TeamView team;
    EpLayout lay;
    const RankIo* io;
    int32_t s[kMaxVirtualRanks];
    int blocks_per_rank;
    int locality;
    int rank_begin;       // plan_only: first planning rank
    int32_t s_total;      // group total when the ranks' s differ, else -1 (stored in the gather rows)
    int scratch_in_smem;  // the block planner's state lives in dynamic shared memory (else the global workspace)
    int tpe_in_smem;      // ... and so does its copy of the histogram tpe (else it is read from global memory)
    int route_in_smem;    // phase 4 reads the route tables from shared memory
    int repeat;           // plan_only: plans per launch (1; more only to measure warm-cache phase times)
    int relay;            // plan the relayed copy tree (detail/plan_relay.hpp), else direct pushes
    int fill_tpe;         // plan_cluster_kernel: where its fill blocks read the histogram (device::FillTpe)
    int gated;            // plan_cluster_kernel: plan only the ranks whose gate (EpLayout::plan.gate) is open
    PlanPackColumns pack;  // phase 4: the plan tensor's columns, packed into RankIo::plan where set (pack.n > 0)
};

// What one plan_team_kernel launch runs: all four phases (the one-block planner on each rank's block 0 in phase 3), or
// the phases before and after plan_cluster_kernel when Ep::plan plans on clusters: kGather (phases 1 and 2; then block
// 0 copies the gathered rows into tpe and opens the rank's gate) and kDst (phase 4).
enum class TeamStage : int { kFused, kGather, kDst };

// Dynamic shared memory of both plan kernels (one declaration: the two kernels share this translation unit).
extern __shared__ __align__(16) unsigned char plan_smem[];

// kCluster: this block is block 0 of plan_cluster_kernel's cluster (its other blocks run the fills and the home rows);
// a template parameter, so that each kernel holds only its own variant of the block planner.
template <int kThreads, bool kParallel, bool kCluster = false>
__device__ void plan_rank(const PlanParams& p, int rank) {
    const EpLayout& L = p.lay;
    char* base = p.team.peers[rank];
    const detail::PlanDims d = L.dims(p.locality != 0);
    const detail::PlanArrays a = L.plan_arrays(base);
    const int32_t* tpe = EpLayout::at<int32_t>(base, L.tpe);
    int32_t* s_out = EpLayout::at<int32_t>(base, L.plan.s);
    for (int r = threadIdx.x; r < L.R; r += blockDim.x) s_out[r] = p.s[r];
    __syncthreads();
    int64_t* cost = EpLayout::at<int64_t>(base, L.plan.cost);
    int64_t* w64 = EpLayout::at<int64_t>(base, L.plan.work64);
    int32_t* w32 = EpLayout::at<int32_t>(base, L.plan.work32);
    int32_t* relay_src = EpLayout::at<int32_t>(base, L.plan.relay_src);
    int32_t* relay_round = EpLayout::at<int32_t>(base, L.plan.relay_round);
    if constexpr (kParallel) {
        int64_t* timing = device::plan_stamps(base, L);
        // Relays off (the default): phase 4 writes the copy tree as it writes the slots (PlanScratch::relay_src).
        auto with_tree = [&](device::PlanScratch sc) {
            if (!p.relay) sc.relay_src = relay_src, sc.relay_round = relay_round;
            return sc;
        };
        // NOTE: separate call sites on purpose. In the first two every scratch pointer derives from plan_smem alone,
        // so once the planner is inlined the compiler knows they address shared memory and emits LDS/STS; a pointer
        // that may be either (a select) stays generic, and generic accesses to shared memory are far slower on sm_90
        // (they resolve through the cluster shared window).
        if (p.scratch_in_smem) {
            device::PlanScratch sc = with_tree(device::carve_scratch(reinterpret_cast<char*>(plan_smem), L.R, L.E));
            // NOTE: a third call site, not a select of sc.tpe: with the histogram's copy in shared memory every read
            // of it is LDS; with the histogram read in place (global memory) they are plain global loads. A select
            // would make every histogram read generic (resolved through the shared window) at every shape.
            if (p.tpe_in_smem) {
                device::plan_block_parallel<kThreads, kCluster>(d, tpe, a, cost, sc, p.team, rank, timing);
            } else {
                sc.tpe = const_cast<int32_t*>(tpe);  // read in place (global memory)
                device::plan_block_parallel<kThreads, kCluster>(d, tpe, a, cost, sc, p.team, rank, timing);
            }
        } else if constexpr (!kCluster) {  // (the cluster needs the state in shared memory: cluster_smem)
            device::PlanScratch sc = with_tree(device::carve_scratch(base + L.plan.scratch, L.R, L.E));
            sc.tpe = const_cast<int32_t*>(tpe);  // already in place: no copy
            device::plan_block_parallel<kThreads, false>(d, tpe, a, cost, sc, p.team, rank, timing);
        }
        (void)w64;
    } else {
        device::plan_block_serial(d, tpe, a, cost, w64, w32);
        __syncthreads();
        if (threadIdx.x == 0)
            for (int r = 0; r < L.R; ++r)
                if (a.remote_experts[r] > L.epn)
                    device::record_error(p.team, DeviceErrorKind::kInternal, rank, -1, Phase::kPlanReady, -1, -1,
                                         a.remote_experts[r], L.epn, 0);
    }
    // The copy tree: the same post-pass as the CPU planner's (detail::plan_relays), on the finished copies table.
    // Relays on: one thread (the planner workspace w32 is free again here). Off (the default): what plan_relays
    // writes then — direct sources, round 0, critical path Delta = max_r max(pushed, received), both counts already
    // in the plan (copies_pushed, copies_received) — written by the parallel planner's phase 4 with the slots, and
    // here, spread over the block, after the serial one.
    if (p.relay || !kParallel) __syncthreads();
    if (p.relay) {
        if (threadIdx.x == 0) {
            const detail::RelayPaths paths = detail::plan_relays(detail::RelayDims{L.R, L.E, L.epn, L.B}, a.copies,
                                                                 relay_src, relay_round, w32, true);
            cost[4] = paths.critical_path;
            cost[5] = paths.direct_critical_path;
        }
    } else if constexpr (!kParallel) {
        __shared__ int s_delta;
        if (threadIdx.x == 0) s_delta = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < L.R * L.B; i += blockDim.x) {
            const int32_t c = a.copies[i];
            relay_src[i] = c >= 0 ? c / L.epn : -1;
            relay_round[i] = 0;
        }
        int delta = 0;
        for (int r = threadIdx.x; r < L.R; r += blockDim.x)
            delta = max(delta, max(a.copies_pushed[r], a.copies_received[r]));
        if (delta) atomicMax(&s_delta, delta);
        __syncthreads();
        if (threadIdx.x == 0) cost[4] = cost[5] = s_delta;
    }
    __syncthreads();
}

template <int kThreads, bool kParallel>
__global__ void __launch_bounds__(kThreads) plan_only_kernel(const __grid_constant__ PlanParams p) {
    // repeat > 1 (benchmark only): plan again in the same launch; the timing stamps then show warm caches.
    for (int i = 0; i < p.repeat; ++i) {
        plan_rank<kThreads, kParallel>(p, p.rank_begin + static_cast<int>(blockIdx.x));
        __syncthreads();
    }
}

// One rank's plan on a cluster of kPlanClusterBlocks blocks (plan_cluster.cuh): cluster c plans rank rank_begin + c.
// Needs the planner's state in shared memory (p.scratch_in_smem).
template <int kThreads>
__global__ void __launch_bounds__(kThreads) plan_cluster_kernel(const __grid_constant__ PlanParams p) {
    const int role = device::cluster_block();
    const int rank = p.rank_begin + static_cast<int>(blockIdx.x) / kPlanClusterBlocks;
    const EpLayout& L = p.lay;
    char* base = p.team.peers[rank];
    const detail::PlanDims d = L.dims(p.locality != 0);
    const int32_t* tpe = EpLayout::at<int32_t>(base, L.tpe);
    int64_t* timing = device::plan_stamps(base, L);
    char* smem = reinterpret_cast<char*>(plan_smem);
    device::wait_previous_kernel();  // an early launch (launch_config): nothing is read or written before this
    device::allow_next_kernel();
    // The gather launch failed for this rank (a recorded error; its tpe is incomplete): no plan. Every block of the
    // cluster reads the same gate (written by the previous launch), so they all leave together.
    if (p.gated && *EpLayout::at<const int32_t>(base, L.plan.gate) == 0) return;
    // Block 0's scratch as the other blocks see it (same dynamic shared memory offsets in every block).
    char* base0 = device::cluster_map(smem, 0);
    for (int i = 0; i < p.repeat; ++i) {
        if (role == 0) {
            plan_rank<kThreads, true, true>(p, rank);
        } else if (role <= kPlanClusterFills) {
            device::plan_cluster_fill<kThreads>(d, tpe, base0, smem, static_cast<device::FillTpe>(p.fill_tpe), role - 1,
                                                timing);
        } else {
            device::plan_cluster_home<kThreads>(d, tpe, L.plan_arrays(base), base0, smem, role - 1 - kPlanClusterFills,
                                                kPlanClusterBlocks - 1 - kPlanClusterFills, timing);
        }
        if (role != 0) {
            device::CopyTreeOut tree{};  // relays off: phase 4 writes the copy tree (PlanScratch::relay_src)
            if (!p.relay)
                tree = {EpLayout::at<int32_t>(base, L.plan.relay_src), EpLayout::at<int32_t>(base, L.plan.relay_round)};
            device::plan_cluster_finish<kThreads>(d, tpe, L.plan_arrays(base), base0, smem, role, tree);
        }
        __syncthreads();
    }
}

// Dynamic shared memory: hist[E] + per-warp hist[kWarps][E] (int32) in phases 1 and 4; block 0's planner state
// (PlanScratchLayout) in phase 3 when it fits.
template <int kThreads, bool kParallel, TeamStage kStage = TeamStage::kFused>
__global__ void __launch_bounds__(kThreads) plan_team_kernel(const __grid_constant__ PlanParams p) {
    constexpr int kWarps = kThreads / kWarpSize;
    int32_t* smem = reinterpret_cast<int32_t*>(plan_smem);
    const device::RankCtx c = device::rank_ctx(p.team, p.blocks_per_rank);
    const EpLayout& L = p.lay;
    const int E = L.E, K = L.K, R = L.R;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    char* const* peers = p.team.peers;
    char* base = peers[c.rank];
    const int s = p.s[c.rank];
    const int32_t* idx = p.io[c.rank].topk_idx;
    int32_t* hist = EpLayout::at<int32_t>(base, L.hist);
    const int64_t row_ints = L.buf.gather_row_ints();
    const int chunk = (s + c.num_blocks - 1) / c.num_blocks;
    const int t0 = min(s, c.block * chunk), t1 = min(s, t0 + chunk);
    // Rank 0's block 0 stamps the phases (kStampFused*; benchmark breakdown, one store each) when stamps are compiled in.
    int64_t* timing = device::plan_stamps(base, L);
    const bool stamps = timing != nullptr && c.rank == 0 && c.block == 0 && tid == 0;
    if constexpr (kStage == TeamStage::kDst) {
        // A recorded error (a bad expert id, a missing peer, the planner's check) ends the call here, as the fused
        // kernel's barriers do. No barrier follows in this launch, so a block that reads the flag late is harmless.
        device::wait_previous_kernel();  // an early launch: the plans are complete past this
        device::allow_next_kernel();
        __shared__ int s_go;
        if (tid == 0) s_go = device::aborted(p.team) ? 0 : 1;
        __syncthreads();
        if (s_go == 0) return;
        if (stamps) device::stamp_time(timing, detail::kStampFusedPlanDone);
    } else {
        if (stamps) device::stamp_time(timing, detail::kStampFusedBegin);
        if (kStage == TeamStage::kGather && c.block == 0 && tid == 0) *EpLayout::at<int32_t>(base, L.plan.gate) = 0;

        // ---- Phase 1: histogram of the block's chunk. ----
        int32_t* bh = smem;
        for (int e = tid; e < E; e += kThreads) bh[e] = 0;
        __syncthreads();
        for (int64_t i = static_cast<int64_t>(t0) * K + tid; i < static_cast<int64_t>(t1) * K; i += kThreads) {
            const int32_t e = idx[i];
            if (e == -1) continue;
            if (e < -1 || e >= E) {
                device::record_error(p.team, DeviceErrorKind::kBadExpertId, c.rank, -1, Phase::kPlanHistogram,
                                     static_cast<int>(i / K), static_cast<int>(i % K), e, E, 0);
                continue;
            }
            atomicAdd(bh + e, 1);
        }
        __syncthreads();
        for (int e = tid; e < E; e += kThreads) hist[static_cast<int64_t>(c.block) * E + e] = bh[e];
        // With ranks in other processes this is a team barrier: a peer may still read its gathered rows of the previous
        // plan (phase 3) when this rank's phase 2 writes into them.
        if (!device::barrier(p.team, c, Phase::kPlanHistogram, device::multi_process(p.team))) return;
        if (stamps) device::stamp_time(timing, detail::kStampFusedHistogramDone);

        // ---- Phase 2: prefix over blocks; the rank's total goes to every peer's gathered table. ----
        for (int e = c.block * kThreads + tid; e < E; e += c.num_blocks * kThreads) {
            int32_t run = 0;
            constexpr int kBatch = 8;  // loads in flight before the prefix stores
            for (int b0 = 0; b0 < c.num_blocks; b0 += kBatch) {
                int32_t v[kBatch];
#pragma unroll
                for (int j = 0; j < kBatch; ++j)
                    v[j] = b0 + j < c.num_blocks ? hist[static_cast<int64_t>(b0 + j) * E + e] : 0;
#pragma unroll
                for (int j = 0; j < kBatch; ++j) {
                    if (b0 + j < c.num_blocks) hist[static_cast<int64_t>(b0 + j) * E + e] = run;
                    run += v[j];
                }
            }
            for (int q = 0; q < R; ++q) EpLayout::at<int32_t>(peers[q], L.gather())[c.rank * row_ints + 2 + e] = run;
        }
        if (c.block == 0 && tid < R) {
            int32_t* row = EpLayout::at<int32_t>(peers[tid], L.gather()) + c.rank * row_ints;
            row[0] = s;
            row[1] = p.s_total;
        }
        if (!device::barrier(p.team, c, Phase::kPlanGather, true)) return;
        if (stamps) device::stamp_time(timing, detail::kStampFusedGatherDone);
        if constexpr (kStage == TeamStage::kGather) device::allow_next_kernel();  // the plan launch may be scheduled

        // ---- Phase 3: the rank's plan, on its block 0, from its copy of the gathered rows (kGather: the copy, then
        // the gate opens for plan_cluster_kernel, which plans in the next launch). ----
        if (c.block == 0) {
            const int32_t* gathered = EpLayout::at<const int32_t>(base, L.gather());
            int32_t* tpe = EpLayout::at<int32_t>(base, L.tpe);
            device::block_copy_batched<kThreads>(tpe, static_cast<int64_t>(R) * E,
                                                 [&](int64_t i) { return gathered[(i / E) * row_ints + 2 + i % E]; });
            __syncthreads();
            if constexpr (kStage == TeamStage::kGather) {
                if (tid == 0)
                    *EpLayout::at<int32_t>(base, L.plan.gate) = 1;  // the launch boundary publishes tpe with it
            } else {
                plan_rank<kThreads, kParallel>(p, c.rank);
            }
        }
        if constexpr (kStage == TeamStage::kGather) return;
        if (!device::barrier(p.team, c, Phase::kPlanReady, false)) return;
        if (stamps) device::stamp_time(timing, detail::kStampFusedPlanDone);
    }  // kStage != kDst

    // ---- Phase 4: encoded destinations of the chunk. ----
    const detail::PlanRouteView view = L.route_view(base);
    detail::PlanRouteView view_smem = view;
    if (p.route_in_smem) {
        // The route tables plan_entry_dst walks (keep, both prefixes, seg_row), staged after the histograms.
        int32_t* keep = smem + E * (1 + kWarps);
        int32_t* rp = keep + E * R;
        int32_t* cp = rp + E * (R + 1);
        int32_t* seg = cp + E * (R + 1);
        for (int i = tid; i < E * R; i += kThreads) keep[i] = view.local_keep[i], seg[i] = view.seg_row[i];
        for (int i = tid; i < E * (R + 1); i += kThreads) rp[i] = view.rest_prefix[i], cp[i] = view.cap_prefix[i];
        view_smem.local_keep = keep, view_smem.rest_prefix = rp, view_smem.cap_prefix = cp, view_smem.seg_row = seg;
        __syncthreads();
    }
    if (stamps) device::stamp_time(timing, detail::kStampFusedStagingDone);
    // The plan tensor's row (RankIo::plan): the plan arrays are final here; the blocks of the rank share the copy.
    if (p.pack.n > 0 && p.io != nullptr) {
        int32_t* row = p.io[c.rank].plan;
        if (row != nullptr)
            device::pack_plan_row(base, c.rank, p.pack, row, static_cast<int64_t>(c.block) * kThreads + tid,
                                  static_cast<int64_t>(c.num_blocks) * kThreads);
    }
    int32_t* dst = EpLayout::at<int32_t>(base, L.dst);
    int32_t* wh = smem + E + warp * E;  // this warp's running position per expert
    const int wchunk = (t1 - t0 + kWarps - 1) / kWarps;
    const int wt0 = min(t1, t0 + warp * wchunk), wt1 = min(t1, wt0 + wchunk);
    for (int e = lane; e < E; e += kWarpSize) wh[e] = 0;
    __syncwarp();
    for (int64_t i = static_cast<int64_t>(wt0) * K + lane; i < static_cast<int64_t>(wt1) * K; i += kWarpSize) {
        const int32_t e = idx[i];
        if (e >= 0) atomicAdd(wh + e, 1);
    }
    __syncthreads();
    for (int e = tid; e < E; e += kThreads) {
        int32_t run = hist[static_cast<int64_t>(c.block) * E + e];
        for (int w = 0; w < kWarps; ++w) {
            int32_t* slot = smem + E + w * E + e;
            const int32_t v = *slot;
            *slot = run;
            run += v;
        }
    }
    __syncthreads();
    const int64_t i_end = static_cast<int64_t>(wt1) * K;
    // Two call sites (shared-memory tables or global ones) so that the table accesses keep a known address space.
    auto walk = [&](const detail::PlanRouteView& v) {
        for (int64_t i0 = static_cast<int64_t>(wt0) * K; i0 < i_end; i0 += kWarpSize) {
            const int64_t i = i0 + lane;
            const int32_t e = i < i_end ? idx[i] : -1;
            const unsigned group = __match_any_sync(kFullMask, e >= 0 ? e : -2 - lane);
            int32_t pos = 0;
            if (e >= 0) pos = wh[e] + __popc(group & device::lanemask_lt());
            __syncwarp();
            if (e >= 0 && (group & device::lanemask_lt()) == 0) wh[e] += __popc(group);
            __syncwarp();
            if (i < i_end) dst[i] = e >= 0 ? detail::plan_entry_dst(v, c.rank, e, pos) : detail::kMaskedDst;
        }
    };
    if (p.route_in_smem)
        walk(view_smem);
    else
        walk(view);
    __syncwarp();
    if (stamps) device::stamp_time(timing, detail::kStampFusedWalkDone);
    // Dedup (SPEC §3.4): per token, the first entry per destination rank keeps dst, later ones store -dst-1.
    for (int t = wt0 + lane; t < wt1; t += kWarpSize) {
        int32_t* row = dst + static_cast<int64_t>(t) * K;
        for (int k = 1; k < K; ++k) {
            const int32_t code = row[k];
            if (detail::is_masked(code)) continue;
            const int64_t rk = code / L.nvs;
            bool dup = false;
            for (int j = 0; j < k && !dup; ++j) {
                const int32_t cj = row[j];
                dup = !detail::is_masked(cj) && detail::decode_dst(cj) / L.nvs == rk;
            }
            if (dup) row[k] = detail::encode_duplicate(code);
        }
    }
    if (stamps) device::stamp_time(timing, detail::kStampFusedEnd);
}

static_assert(sizeof(PlanParams) <= 4096, "PlanParams must stay within the classic 4 KiB kernel parameter block");

PlanParams make_params(const TeamView& team,
                       const EpLayout& layout,
                       const RankIo* d_io,
                       std::span<const int32_t> s,
                       int64_t s_total,
                       bool locality) {
    EVENEP_CHECK(static_cast<int>(s.size()) == layout.R, "plan: s has ", s.size(), " values, expected R = ", layout.R);
    EVENEP_CHECK(team.num_ranks == layout.R, "plan: team has ", team.num_ranks, " ranks, layout ", layout.R);
    PlanParams p{};
    p.team = team;
    p.lay = layout;
    p.io = d_io;
    for (int r = 0; r < layout.R; ++r) {
        EVENEP_CHECK(s[r] >= 1 && s[r] <= layout.S, "plan: rank ", r, ": s = ", s[r], " outside [1, S = ", layout.S,
                     "]");
        p.s[r] = s[r];
    }
    p.locality = locality ? 1 : 0;
    p.s_total = static_cast<int32_t>(s_total);
    p.repeat = 1;
    return p;
}

// Whether the block planner's state fits in dynamic shared memory (with 2 KiB left for static shared memory).
int max_dynamic_smem() {
    static int optin = -1;  // per process (single device)
    if (optin < 0) {
        int device = 0;
        EVENEP_CUDA_CHECK(cudaGetDevice(&device));
        EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    }
    return optin;
}

// Dynamic shared memory of the block planner: its state and, when that fits too, its copy of the histogram
// (0: neither fits, the state lives in the rank's global workspace). Static shared memory needs the last 4 KiB.
size_t planner_smem(const EpLayout& L, int& scratch_in_smem, int& tpe_in_smem) {
    const PlanScratchLayout l = PlanScratchLayout::make(L.R, L.E);
    const size_t limit = static_cast<size_t>(max_dynamic_smem()) - 4096;
    scratch_in_smem = l.core <= limit ? 1 : 0;
    tpe_in_smem = l.total <= limit ? 1 : 0;
    return tpe_in_smem ? l.total : scratch_in_smem ? l.core : 0;
}

// Dynamic shared memory of plan_cluster_kernel (the largest of its three roles' needs; sets where block 0's state and
// the fill blocks' histogram copies live), or 0 when the shape does not fit it: block 0's state must fit in shared
// memory, a fill block's thread owns at most kPlanFillMaxJ experts and a lane at most kPlanFillRanksPerLane ranks.
size_t cluster_smem(PlanParams& p) {
    const int R = p.lay.R, E = p.lay.E;
    const size_t block0 = planner_smem(p.lay, p.scratch_in_smem, p.tpe_in_smem);
    if (!p.scratch_in_smem || E > kPlanFillThreads * kPlanFillMaxJ || R > kWarpSize * kPlanFillRanksPerLane) return 0;
    const size_t limit = static_cast<size_t>(max_dynamic_smem()) - 4096;
    const PlanFillBlockLayout fl = PlanFillBlockLayout::make(R, E, kPlanFillThreads);
    size_t fill = fl.core;
    p.fill_tpe = static_cast<int>(device::FillTpe::kGlobal);
    if (fl.with_tpe32 <= limit) {
        fill = fl.with_tpe32, p.fill_tpe = static_cast<int>(device::FillTpe::kShared32);
    } else if (fl.with_tpe16 <= limit) {
        fill = fl.with_tpe16, p.fill_tpe = static_cast<int>(device::FillTpe::kShared16);
    }
    const size_t home = 16 * static_cast<size_t>(E);  // expert_load (int64), home, t_home
    return std::max({block0, fill, home});
}

// Whether plan_cluster_kernel runs with `smem` bytes (cluster_smem; 0: the shape does not fit) on this device.
bool cluster_runs(size_t smem) {
    return smem > 0 &&
           max_active_clusters(plan_cluster_kernel<kPlanThreads>, kPlanClusterBlocks, kPlanThreads, smem) >= 1;
}

// Whether Ep::plan plans its `ranks` served ranks on clusters (three launches, launch_plan_clustered): the shape fits
// the cluster and every rank's cluster runs at once. Else the one fused launch plans each rank on one block: measured
// on an H200 with 64 virtual ranks (R = 64, E = 896), the 64 clusters ran in four waves (plan phase 559 us against 262
// us on 64 blocks at once); one rank per GPU (the NCCL team) or 8 virtual ranks take the clusters.
bool clusters_in_one_wave(size_t smem, int ranks) {
    return cluster_runs(smem) &&
           max_active_clusters(plan_cluster_kernel<kPlanThreads>, kPlanClusterBlocks, kPlanThreads, smem) >= ranks;
}

// Dynamic shared memory of plan_team_kernel; sets where phase 4's route tables and the planner's state live.
template <bool kParallel>
size_t team_kernel_smem(PlanParams& p) {
    const size_t E = p.lay.E, R = p.lay.R;
    size_t smem = sizeof(int32_t) * E * (1 + kPlanThreads / kWarpSize);
    const size_t route = sizeof(int32_t) * E * (4 * R + 2);
    p.route_in_smem = smem + route + 2048 <= static_cast<size_t>(max_dynamic_smem()) ? 1 : 0;
    if (p.route_in_smem) smem += route;
    if (kParallel) smem = std::max(smem, planner_smem(p.lay, p.scratch_in_smem, p.tpe_in_smem));
    return smem;
}

template <bool kParallel>
int launch_plan_impl(PlanParams p, int sm_budget, cudaStream_t stream) {
    auto kernel = plan_team_kernel<kPlanThreads, kParallel>;
    const size_t smem = team_kernel_smem<kParallel>(p);
    const int nb = clamp_co_resident(kernel, kPlanThreads, smem, p.team.launch_ranks, sm_budget, p.lay.max_blocks);
    p.blocks_per_rank = nb;
    launch_cooperative(kernel, p.team.launch_ranks * nb, kPlanThreads, smem, stream, p);
    return nb;
}

// The kernels of Ep::plan on clusters: the histogram and the all-gather (cooperative, team barriers), every served
// rank's plan on a cluster of its own, then the destinations (the same blocks per rank as the gather launch: phase 4
// reads the per-block prefixes of phase 2).
auto* const kGatherKernel = plan_team_kernel<kPlanThreads, false, TeamStage::kGather>;
auto* const kDstKernel = plan_team_kernel<kPlanThreads, false, TeamStage::kDst>;

// pc: p with cluster_smem's choices (cluster_bytes), for the plan launch.
int launch_plan_clustered(PlanParams p, PlanParams pc, size_t cluster_bytes, int sm_budget, cudaStream_t stream) {
    const size_t smem = team_kernel_smem<false>(p);
    const int nb =
        clamp_co_resident(kGatherKernel, kPlanThreads, smem, p.team.launch_ranks, sm_budget, p.lay.max_blocks);
    p.blocks_per_rank = nb;
    launch_cooperative(kGatherKernel, p.team.launch_ranks * nb, kPlanThreads, smem, stream, p);
    pc.rank_begin = p.team.rank_begin;
    pc.gated = 1;
    // Both later launches early (programmatic dependent launch): each is scheduled while its predecessor runs and waits
    // for it in its first instruction, so the launch latency between the three stays off the path.
    launch_clustered(plan_cluster_kernel<kPlanThreads>, p.team.launch_ranks * kPlanClusterBlocks, kPlanClusterBlocks,
                     kPlanThreads, cluster_bytes, stream, true, pc);
    allow_dynamic_smem(kDstKernel, smem);
    launch_clustered(kDstKernel, p.team.launch_ranks * nb, 1, kPlanThreads, smem, stream, true, p);
    return nb;
}

}  // namespace

int launch_plan(const TeamView& team,
                const EpLayout& layout,
                const RankIo* d_io,
                std::span<const int32_t> s,
                int64_t s_total,
                const PlanOptions& options,
                int sm_budget,
                cudaStream_t stream) {
    const PlannerKernel kernel = options.kernel;
    PlanParams p = make_params(team, layout, d_io, s, s_total, options.locality);
    p.relay = options.relay ? 1 : 0;
    p.pack = options.pack;
    if (kernel == PlannerKernel::kCluster) {
        PlanParams pc = p;
        const size_t cluster_bytes = cluster_smem(pc);
        if (clusters_in_one_wave(cluster_bytes, team.launch_ranks))
            return launch_plan_clustered(p, pc, cluster_bytes, sm_budget, stream);
    }
    return kernel != PlannerKernel::kSerial ? launch_plan_impl<true>(p, sm_budget, stream)
                                            : launch_plan_impl<false>(p, sm_budget, stream);
}

bool plan_cluster_fits(const EpLayout& layout) {
    PlanParams p{};
    p.lay = layout;
    return cluster_runs(cluster_smem(p));
}

bool plan_on_clusters(const TeamView& team, const EpLayout& layout) {
    PlanParams p{};
    p.lay = layout;
    return clusters_in_one_wave(cluster_smem(p), team.launch_ranks);
}

bool plan_fits_co_resident(const TeamView& team, const EpLayout& layout, PlannerKernel kernel) {
    PlanParams p{};
    p.team = team;
    p.lay = layout;
    auto blocks = [&](auto k, size_t smem) {
        const std::pair<int, int> occ = co_resident_capacity(k, kPlanThreads, smem);
        return static_cast<long long>(occ.first) * occ.second;
    };
    const bool clustered = kernel == PlannerKernel::kCluster && plan_on_clusters(team, layout);
    const long long capacity = clustered ? blocks(kGatherKernel, team_kernel_smem<false>(p))
                               : kernel != PlannerKernel::kSerial
                                   ? blocks(plan_team_kernel<kPlanThreads, true>, team_kernel_smem<true>(p))
                                   : blocks(plan_team_kernel<kPlanThreads, false>, team_kernel_smem<false>(p));
    return capacity >= team.launch_ranks;
}

void launch_plan_only(const TeamView& team,
                      const EpLayout& layout,
                      std::span<const int32_t> s,
                      const PlanOnlyOptions& options,
                      cudaStream_t stream) {
    const int repeat = options.repeat, rank_begin = options.rank_begin, num_ranks = options.num_ranks;
    PlannerKernel kernel = options.plan.kernel;
    PlanParams p = make_params(team, layout, nullptr, s, -1, options.plan.locality);
    p.relay = options.plan.relay ? 1 : 0;
    EVENEP_CHECK(repeat >= 1, "plan: repeat = ", repeat);
    p.repeat = repeat;
    EVENEP_CHECK(rank_begin >= 0 && num_ranks >= 1 && rank_begin + num_ranks <= layout.R, "plan: ranks [", rank_begin,
                 ", ", rank_begin + num_ranks, ") outside [0, R = ", layout.R, ")");
    p.rank_begin = rank_begin;
    if (kernel == PlannerKernel::kCluster) {
        const size_t smem = cluster_smem(p);
        if (cluster_runs(smem)) {
            launch_clustered(plan_cluster_kernel<kPlanThreads>, num_ranks * kPlanClusterBlocks, kPlanClusterBlocks,
                             kPlanThreads, smem, stream, options.early, p);
            return;
        }
        kernel = PlannerKernel::kParallel;  // the shape does not fit the cluster: the one-block planner
    }
    if (kernel == PlannerKernel::kParallel) {
        const size_t smem = planner_smem(layout, p.scratch_in_smem, p.tpe_in_smem);
        auto k = plan_only_kernel<kPlanThreads, true>;
        allow_dynamic_smem(k, smem);
        k<<<num_ranks, kPlanThreads, smem, stream>>>(p);
    } else {
        plan_only_kernel<kPlanThreads, false><<<num_ranks, kPlanThreads, 0, stream>>>(p);
    }
    check_launch(stream);
}

}  // namespace evenep::cuda
