// prefetch_weight and reduce_grad (SPEC §4.4; contract in evenep/cuda/experts.hpp).
//
// Both kernels cover every virtual rank in one cooperative launch and deal work items out over all blocks:
// an item is (expert with at least one copy, projection, tile of kTileVec 16-byte vectors). Each block first
// derives, from its rank's copy of copies[R][B], the list of distinct copied experts (the first slot entry of each
// expert, in (rank, slot) order) into shared memory; per item it lists the expert's slot entries in ascending
// (rank, slot) order, then every thread moves kUnroll vectors with all loads in flight before the stores.
//   prefetch: load the home rank's weight tile once, store it into every slot that holds the expert.
//   reduce:   acc = home gradient tile; acc += each slot gradient tile in (rank, slot) order; store acc; zero the
//             consumed slot tiles.
// NOTE: in the local flavour the items of one expert are spread over all ranks' blocks (the GPU is shared); with
// one GPU per rank the same items would run on the owner's blocks (owner push) or the holder's (pull).
//
// Relayed copy trees (plan relay_src; docs/relayed-prefetch.md): when some copy comes from a relay (tree depth D > 1)
// the same launch walks the tree level by level with a team barrier between levels (one kernel, device-side level
// barrier):
//   prefetch: level 1..D, item = (slot of that level, projection, tile): the sender (relay_src) copies the tile
//             from the home's weights or from its own slot into the receiver's slot.
//   reduce:   level D-1..1, item = (relay slot of that level, projection, tile): acc = the relay's slot gradient,
//             += each child's slot gradient in ascending (rank, slot) order (children zeroed); then level 0: the
//             homes, acc = home gradient += each direct child's in ascending (rank, slot) order. The same order as
//             the CPU backend (src/cpu/expert_pool.cpp), so the sums are bitwise equal. Without relays (D = 1) the
//             direct code path above runs unchanged.
#include <cuda_runtime.h>

#include <climits>

#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/detail/plan_relay.hpp"

namespace evenep::cuda {
namespace {

using device::kWarpSize;

inline constexpr int kExpertThreads = 512;
inline constexpr int kExpertUnroll = 4;
inline constexpr int kTileVec = kExpertThreads * kExpertUnroll;  // 16-byte vectors per item (32 KiB)
inline constexpr int kReduceUnroll = 4;                          // reduce: vectors per thread per item ...
inline constexpr int kReduceDestBatch = 2;                       // ... times slot gradients loaded at once
inline constexpr int kMaxSlotEntries = 2048;                     // R*B handled per block (shared memory)
inline constexpr int kMaxExperts = 4096;

struct ExpertParams {
    TeamView team;
    EpLayout lay;
    ExpertsView ex;
    int blocks_per_rank;
};

// Shared-memory lists: the copied experts (their first slot entry) and, per item, the slot entries of one expert.
struct SlotLists {
    int num_experts;
    int first_entry[kMaxSlotEntries];  // slot entry (r*B + b) of each distinct copied expert, ascending
    int num_dests;
    int dests[kMaxSlotEntries];
    int first_of[kMaxExperts];  // lowest slot entry holding each expert (INT_MAX: none)
    int16_t level[kMaxSlotEntries];  // copy tree level of each slot entry (0: empty)
    int deepest;
};

// Builds lists.first_entry from the copies table (ascending entry order): the lowest entry of every expert by an
// atomicMin per entry, then a warp compaction. Ends with __syncthreads.
// Only experts homed on ranks [home_begin, home_end) are listed.
__device__ void build_expert_list(
    const int32_t* copies, int num_entries, int num_experts, int epn, int home_begin, int home_end, SlotLists& lists) {
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) lists.first_of[e] = INT_MAX;
    __syncthreads();
    for (int i = threadIdx.x; i < num_entries; i += blockDim.x) {
        const int32_t e = copies[i];
        if (e >= 0 && e / epn >= home_begin && e / epn < home_end) atomicMin(&lists.first_of[e], i);
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {
        const int lane = threadIdx.x;
        int n = 0;
        for (int i0 = 0; i0 < num_entries; i0 += kWarpSize) {
            const int i = i0 + lane;
            const int32_t e = i < num_entries ? copies[i] : -1;
            const bool first = e >= 0 && e / epn >= home_begin && e / epn < home_end && lists.first_of[e] == i;
            const unsigned m = __ballot_sync(0xffffffffu, first);
            if (first) lists.first_entry[n + __popc(m & device::lanemask_lt())] = i;
            n += __popc(m);
        }
        if (lane == 0) lists.num_experts = n;
    }
    __syncthreads();
}

// Lists the slot entries holding expert e, ascending (warp 0); with relay_src, only those whose copy comes from
// rank `parent` (its children in the copy tree).
__device__ void build_dest_list(const int32_t* copies,
                                int num_entries,
                                int32_t e,
                                SlotLists& lists,
                                const int32_t* relay_src = nullptr,
                                int parent = -1) {
    if (threadIdx.x >= kWarpSize) return;
    const int lane = threadIdx.x;
    int n = 0;
    for (int i0 = 0; i0 < num_entries; i0 += kWarpSize) {
        const int i = i0 + lane;
        const bool hit = i < num_entries && copies[i] == e && (relay_src == nullptr || relay_src[i] == parent);
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (hit) lists.dests[n + __popc(m & device::lanemask_lt())] = i;
        n += __popc(m);
    }
    if (lane == 0) lists.num_dests = n;
}


// The copy tree level of every slot entry into lists.level and the deepest into lists.deepest. Ends with
// __syncthreads.
__device__ void build_levels(const EpLayout& L, const int32_t* copies, const int32_t* relay_src, SlotLists& lists) {
    const detail::RelayDims d{L.R, L.E, L.epn, L.B};
    if (threadIdx.x == 0) lists.deepest = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < L.R * L.B; i += blockDim.x) {
        const int lv = detail::relay_level(d, copies, relay_src, i);
        lists.level[i] = static_cast<int16_t>(lv);
        if (lv > 0) atomicMax(&lists.deepest, lv);
    }
    __syncthreads();
}

// Lists, ascending into lists.first_entry / lists.num_experts, the slot entries of tree level `level` whose executing
// rank (the sender relay_src when `by_sender`, else the holder) is one of this launch's ranks (warp 0). The caller
// brackets it with __syncthreads.
__device__ void build_level_list(const int32_t* copies,
                                 const int32_t* relay_src,
                                 int num_entries,
                                 int B,
                                 int level,
                                 bool by_sender,
                                 int rank_begin,
                                 int rank_end,
                                 SlotLists& lists) {
    if (threadIdx.x >= kWarpSize) return;
    const int lane = threadIdx.x;
    int n = 0;
    for (int i0 = 0; i0 < num_entries; i0 += kWarpSize) {
        const int i = i0 + lane;
        const int who = i < num_entries ? (by_sender ? relay_src[i] : i / B) : -1;
        const bool hit = i < num_entries && copies[i] >= 0 && lists.level[i] == level && who >= rank_begin &&
                         who < rank_end;
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (hit) lists.first_entry[n + __popc(m & device::lanemask_lt())] = i;
        n += __popc(m);
    }
    if (lane == 0) lists.num_experts = n;
}

// One reduce item: acc = grad tile; += each tile of lists.dests' slot gradients in list order (kReduceDestBatch in
// flight), zeroing them; store acc.
__device__ void reduce_tile(float4* grad, const ExpertsView& X, int B, int proj, int64_t tile, int64_t num_vec,
                            const SlotLists& lists) {
    const int n = lists.num_dests;
    for (int64_t pass = 0; pass < kExpertUnroll / kReduceUnroll; ++pass) {
        const int64_t vb = tile * kTileVec + pass * kExpertThreads * kReduceUnroll + threadIdx.x;
        float4 acc[kReduceUnroll];
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
            const int64_t v = vb + u * kExpertThreads;
            if (v < num_vec) acc[u] = grad[v];
        }
        for (int d0 = 0; d0 < n; d0 += kReduceDestBatch) {
            float4* sg[kReduceDestBatch];
            float4 in[kReduceDestBatch][kReduceUnroll];
#pragma unroll
            for (int j = 0; j < kReduceDestBatch; ++j) {
                sg[j] = nullptr;
                if (d0 + j >= n) continue;
                const int entry = lists.dests[d0 + j], r = entry / B, b = entry % B;
                sg[j] = reinterpret_cast<float4*>(X.pool_bases[r] + X.slot_grads +
                                                  (static_cast<int64_t>(proj) * B + b) * X.elems * 4);
#pragma unroll
                for (int u = 0; u < kReduceUnroll; ++u) {
                    const int64_t v = vb + u * kExpertThreads;
                    if (v < num_vec) in[j][u] = sg[j][v];
                }
            }
#pragma unroll
            for (int j = 0; j < kReduceDestBatch; ++j) {
                if (sg[j] == nullptr) continue;
#pragma unroll
                for (int u = 0; u < kReduceUnroll; ++u) {
                    const int64_t v = vb + u * kExpertThreads;
                    if (v >= num_vec) continue;
                    acc[u].x = __fadd_rn(acc[u].x, in[j][u].x);
                    acc[u].y = __fadd_rn(acc[u].y, in[j][u].y);
                    acc[u].z = __fadd_rn(acc[u].z, in[j][u].z);
                    acc[u].w = __fadd_rn(acc[u].w, in[j][u].w);
                    sg[j][v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
            const int64_t v = vb + u * kExpertThreads;
            if (v < num_vec) grad[v] = acc[u];
        }
    }
}

// The relayed walk (D = lists.deepest > 1), after the kernel's entry barrier; returns false when a barrier failed.
template <bool kPrefetch>
__device__ bool relay_walk(const ExpertParams& p, const device::RankCtx& c, const int32_t* copies,
                           const int32_t* relay_src, SlotLists& lists) {
    const EpLayout& L = p.lay;
    const ExpertsView& X = p.ex;
    const int B = L.B, epn = L.epn, num_entries = L.R * B, D = lists.deepest;
    const int rank_begin = p.team.rank_begin, rank_end = p.team.rank_begin + p.team.launch_ranks;
    const int64_t num_vec = X.elems * (kPrefetch ? 2 : 4) / 16;
    const int64_t tiles = (num_vec + kTileVec - 1) / kTileVec;
    const int64_t num_blocks = static_cast<int64_t>(gridDim.x);
    for (int step = 0; step < D; ++step) {  // D levels either way
        const int level = kPrefetch ? step + 1 : D - 1 - step;  // prefetch 1..D; reduce D-1..0 (0: the homes)
        __syncthreads();
        if (kPrefetch || level > 0)
            build_level_list(copies, relay_src, num_entries, B, level, kPrefetch, rank_begin, rank_end, lists);
        else
            build_expert_list(copies, num_entries, L.E, epn, rank_begin, rank_end, lists);
        __syncthreads();
        const int64_t num_items = static_cast<int64_t>(lists.num_experts) * X.num_projections * tiles;
        [[maybe_unused]] int listed = -1;  // reduce: the parent entry whose children lists.dests holds
        for (int64_t item = blockIdx.x; item < num_items; item += num_blocks) {
            const int k = static_cast<int>(item / (X.num_projections * tiles));
            const int proj = static_cast<int>(item / tiles % X.num_projections);
            const int64_t tile = item % tiles;
            const int entry = lists.first_entry[k];
            const int32_t e = copies[entry];
            const int home = e / epn, local = e % epn;
            if constexpr (kPrefetch) {
                const int r = entry / B, b = entry % B, src = relay_src[entry];
                const uint4* from;
                if (src == home) {
                    from = reinterpret_cast<const uint4*>(X.bases[home] + X.weights +
                                                          (static_cast<int64_t>(proj) * epn + local) * X.elems * 2);
                } else {
                    const int sb = detail::relay_slot_of(copies, B, src, e);
                    from = reinterpret_cast<const uint4*>(X.pool_bases[src] + X.slots +
                                                          (static_cast<int64_t>(proj) * B + sb) * X.elems * 2);
                }
                uint4* to = reinterpret_cast<uint4*>(X.pool_bases[r] + X.slots +
                                                     (static_cast<int64_t>(proj) * B + b) * X.elems * 2);
                // NOTE: plain loads: a relay's slot was written earlier in this launch (published by the barrier).
#pragma unroll
                for (int u = 0; u < kExpertUnroll; ++u) {
                    const int64_t v = tile * kTileVec + threadIdx.x + u * kExpertThreads;
                    if (v < num_vec) device::st_v4(to + v, from[v]);
                }
            } else {
                const int parent = level > 0 ? entry / B : home;
                if (entry != listed) {
                    __syncthreads();
                    build_dest_list(copies, num_entries, e, lists, relay_src, parent);
                    __syncthreads();
                    listed = entry;
                }
                float4* acc = level > 0
                                  ? reinterpret_cast<float4*>(X.pool_bases[parent] + X.slot_grads +
                                                              (static_cast<int64_t>(proj) * B + entry % B) * X.elems * 4)
                                  : reinterpret_cast<float4*>(X.bases[home] + X.grads +
                                                              (static_cast<int64_t>(proj) * epn + local) * X.elems * 4);
                reduce_tile(acc, X, B, proj, tile, num_vec, lists);
            }
        }
        const bool last = step + 1 == D;
        if (!last && !device::barrier(p.team, c, kPrefetch ? Phase::kPrefetchDone : Phase::kReduceReady, true))
            return false;
    }
    return true;
}

template <bool kPrefetch>
__global__ void __launch_bounds__(kExpertThreads) experts_kernel(const ExpertParams p) {
    __shared__ SlotLists lists;
    const device::RankCtx c = device::rank_ctx(p.team, p.blocks_per_rank);
    const EpLayout& L = p.lay;
    const ExpertsView& X = p.ex;
    const int B = L.B, epn = L.epn, num_entries = L.R * B;
    const int32_t* copies = EpLayout::at<int32_t>(p.team.peers[c.rank], L.plan.copies);
    if constexpr (!kPrefetch) {
        if (!device::barrier(p.team, c, Phase::kReduceReady, true)) return;
    } else {
        // Ranks in other processes may still compute with their slots: every peer must enter this call first.
        if (device::multi_process(p.team) && !device::barrier(p.team, c, Phase::kEntry, true)) return;
    }
    const int32_t* relay_src = EpLayout::at<int32_t>(p.team.peers[c.rank], L.plan.relay_src);
    build_levels(L, copies, relay_src, lists);
    if (lists.deepest > 1) {
        if (!relay_walk<kPrefetch>(p, c, copies, relay_src, lists)) return;
        (void)device::barrier(p.team, c, kPrefetch ? Phase::kPrefetchDone : Phase::kReduceDone, true);
        return;
    }
    // The launch moves the experts homed on its ranks (all of them in the local team; its own in the NCCL team:
    // the owner pushes its weight tiles and pulls its experts' slot gradients).
    build_expert_list(copies, num_entries, L.E, epn, p.team.rank_begin, p.team.rank_begin + p.team.launch_ranks, lists);
    const int elem_bytes = kPrefetch ? 2 : 4;
    const int64_t num_vec = X.elems * elem_bytes / 16;  // host checks elems*elem_bytes % 16 == 0
    const int64_t tiles = (num_vec + kTileVec - 1) / kTileVec;
    const int64_t num_items = static_cast<int64_t>(lists.num_experts) * X.num_projections * tiles;
    const int64_t num_blocks = static_cast<int64_t>(gridDim.x);
    int32_t listed = -1;  // expert whose slot entries lists.dests holds (uniform over the block)
    for (int64_t item = blockIdx.x; item < num_items; item += num_blocks) {
        const int ei = static_cast<int>(item / (X.num_projections * tiles));
        const int proj = static_cast<int>(item / tiles % X.num_projections);
        const int64_t tile = item % tiles;
        const int32_t e = copies[lists.first_entry[ei]];
        if (e != listed) {
            __syncthreads();  // the previous item's readers of lists.dests are done
            build_dest_list(copies, num_entries, e, lists);
            __syncthreads();
            listed = e;
        }
        const int home = e / epn, local = e % epn;
        if constexpr (kPrefetch) {
            const int n = lists.num_dests;
            const int64_t v0 = tile * kTileVec + threadIdx.x;
            const uint4* src = reinterpret_cast<const uint4*>(X.bases[home] + X.weights +
                                                              (static_cast<int64_t>(proj) * epn + local) * X.elems * 2);
            uint4 buf[kExpertUnroll];
#pragma unroll
            for (int u = 0; u < kExpertUnroll; ++u) {
                const int64_t v = v0 + u * kExpertThreads;
                if (v < num_vec) buf[u] = device::ld_nc_v4(src + v);
            }
            for (int d = 0; d < n; ++d) {
                const int entry = lists.dests[d], r = entry / B, b = entry % B;
                uint4* dst = reinterpret_cast<uint4*>(X.pool_bases[r] + X.slots +
                                                      (static_cast<int64_t>(proj) * B + b) * X.elems * 2);
#pragma unroll
                for (int u = 0; u < kExpertUnroll; ++u) {
                    const int64_t v = v0 + u * kExpertThreads;
                    if (v < num_vec) device::st_v4(dst + v, buf[u]);
                }
            }
        } else {
            // fp32 tiles: kTileVec vectors per item, kReduceUnroll per thread per pass, kReduceDestBatch slot
            // gradients in flight before their adds (in ascending (rank, slot) order).
            float4* grad = reinterpret_cast<float4*>(X.bases[home] + X.grads +
                                                     (static_cast<int64_t>(proj) * epn + local) * X.elems * 4);
            reduce_tile(grad, X, B, proj, tile, num_vec, lists);
        }
    }
    (void)device::barrier(p.team, c, kPrefetch ? Phase::kPrefetchDone : Phase::kReduceDone, true);
}

template <bool kPrefetch>
int launch_experts(
    const TeamView& team, const EpLayout& layout, const ExpertsView& experts, int sm_budget, cudaStream_t stream) {
    const char* name = kPrefetch ? "prefetch_weight" : "reduce_grad";
    EVENEP_CHECK(layout.R * layout.B <= kMaxSlotEntries, name, ": R*B = ", layout.R * layout.B, " slot entries exceed ",
                 kMaxSlotEntries);
    EVENEP_CHECK(layout.E <= kMaxExperts, name, ": E = ", layout.E, " exceeds ", kMaxExperts);
    EVENEP_CHECK(experts.num_projections >= 1 && experts.num_projections <= 3, name,
                 ": num_projections = ", experts.num_projections);
    EVENEP_CHECK(experts.elems > 0 && experts.elems % 8 == 0, name, ": elements per expert matrix = ", experts.elems,
                 " must be a positive multiple of 8 (16-byte vectors)");
    EVENEP_CHECK(experts.bases != nullptr && experts.pool_bases != nullptr, name,
                 ": the layer's and the pool's peer tables must be set");
    ExpertParams p{};
    p.team = team;
    p.lay = layout;
    p.ex = experts;
    auto kernel = experts_kernel<kPrefetch>;
    const int nb = clamp_co_resident(kernel, kExpertThreads, 0, team.launch_ranks, sm_budget);
    p.blocks_per_rank = nb;
    launch_cooperative(kernel, team.launch_ranks * nb, kExpertThreads, 0, stream, p);
    return nb;
}

}  // namespace

int launch_prefetch_weight(
    const TeamView& team, const EpLayout& layout, const ExpertsView& experts, int sm_budget, cudaStream_t stream) {
    return launch_experts<true>(team, layout, experts, sm_budget, stream);
}

int launch_reduce_grad(
    const TeamView& team, const EpLayout& layout, const ExpertsView& experts, int sm_budget, cudaStream_t stream) {
    return launch_experts<false>(team, layout, experts, sm_budget, stream);
}

}  // namespace evenep::cuda
