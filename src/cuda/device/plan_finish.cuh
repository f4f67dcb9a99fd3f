// The block planner's state and its last phase (plan_block.cuh): the scratch carved from shared (or global) memory,
// and phase 4, which writes the winner's plan arrays from its sparse form (evenep/detail/plan_sparse.hpp): the route
// rows of the experts it moves, the segment layout of every rank, the copies pushed and the costs.
#pragma once

#include <cstdint>

#include "cuda/device/plan_warp.cuh"
#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "evenep/detail/ep_layout.hpp"
#include "evenep/detail/plan_sparse.hpp"

namespace evenep::cuda::device {

// The block planner's state (PlanScratchLayout) carved from `base` (shared or global memory).
struct PlanScratch {
    int64_t *balance, *expert_load, *path_load;
    int32_t *remaining, *excess, *deficit, *avail, *path_left, *home, *t_home, *fill_remote, *spread, *order, *path_q,
        *cost_pushed, *cost_remote, *cross, *xfer, *npieces, *fill_flags, *piece_at, *piece_amount, *head, *next,
        *warp_area, *tpe;
    uint32_t* held;
    int piece_cap, held_words, split_words, group_words, layout_warps;
};

__device__ inline PlanScratch carve_scratch(char* base, int R, int E) {
    const PlanScratchLayout l = PlanScratchLayout::make(R, E);
    auto i64 = [&](size_t o) { return reinterpret_cast<int64_t*>(base + o); };
    auto i32 = [&](size_t o) { return reinterpret_cast<int32_t*>(base + o); };
    return PlanScratch{i64(l.balance),
                       i64(l.expert_load),
                       i64(l.path_load),
                       i32(l.remaining),
                       i32(l.excess),
                       i32(l.deficit),
                       i32(l.avail),
                       i32(l.path_left),
                       i32(l.home),
                       i32(l.t_home),
                       i32(l.fill_remote),
                       i32(l.spread),
                       i32(l.order),
                       i32(l.path_q),
                       i32(l.cost_pushed),
                       i32(l.cost_remote),
                       i32(l.cross),
                       i32(l.xfer),
                       i32(l.npieces),
                       i32(l.fill_flags),
                       i32(l.piece_at),
                       i32(l.piece_amount),
                       i32(l.head),
                       i32(l.next),
                       i32(l.warp_area),
                       i32(l.tpe),
                       reinterpret_cast<uint32_t*>(base + l.held),
                       static_cast<int>(l.piece_cap),
                       static_cast<int>(l.held_words),
                       static_cast<int>(l.split_words),
                       static_cast<int>(l.group_words),
                       static_cast<int>(l.layout_warps)};
}

// P[e][r], the histogram's column prefix, from the home matrix's rest_prefix row (phase 2 writes it for every
// expert; phase 4 rewrites only the moved experts', after reading it here).
__device__ __forceinline__ int32_t column_prefix(const PlanArrays& a, const PlanScratch& sc, bool locality, int R, int e,
                                                 int r) {
    return a.rest_prefix[static_cast<int64_t>(e) * (R + 1) + r] + (locality && r > sc.home[e] ? sc.t_home[e] : 0);
}

// Phase 4 on all kThreads threads, after the block has chosen the allocation sw (its lists linked). stamp(i) stores
// the phase boundaries 6 and 7 (plan_block.cuh's timing words).
template <int kThreads, typename Stamp>
__device__ __forceinline__ void plan_block_finish(const PlanDims& d, const int32_t* tpe, const PlanArrays& a,
                                                  int64_t* cost_out, const PlanScratch& sc, const detail::SparseAlloc& sw,
                                                  const TeamView& team, int rank, const Stamp& stamp) {
    constexpr int kWarps = kThreads / kWarpSize;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, E = d.E, epn = d.epn, G = d.G, B = d.B;
    const int32_t* home = sc.home;
    const int32_t* t_home = sc.t_home;
    auto colprefix = [&](int e, int r) { return column_prefix(a, sc, d.locality, R, e, r); };

    // ---- Phase 4a: the route rows of every expert the winner moves (plan_route_entry; a warp per expert, lanes
    // over ranks), and the crossing rows they change. ----
    __shared__ unsigned s_moved_final;
    if (tid == 0) s_moved_final = 0;
    int32_t* pushed = sc.cost_pushed;  // [R] copies pushed per home rank (the costs' arrays are free again)
    int32_t* remote_n = sc.cost_remote;  // [R] remote experts, then [R] copies received, per rank
    for (int r = tid; r < R; r += kThreads) pushed[r] = 0;
    for (int i = warp; i < sw.n; i += kWarps) {
        if (!detail::plan_piece_first_of_expert(sw, R, i)) continue;  // warp-uniform
        const int e = sw.piece_at[i] / R, h = home[e];
        const int32_t th = t_home[e];
        for (int r = lane; r <= R; r += kWarpSize) {
            int32_t a_er = r == h ? sw.home_rem[e] : 0;
            if (r != h && r < R)
                detail::plan_for_each_piece_of(sw, R, e, [&](int j) {
                    if (sw.piece_at[j] - e * R == r) a_er = sw.piece_amount[j];
                });
            const int64_t pr = static_cast<int64_t>(e) * (R + 1) + r;
            const detail::PlanRouteEntry x = detail::plan_route_entry(d, tpe, sw, e, r, a_er, colprefix(e, r));
            a.rest_prefix[pr] = x.rest_prefix;
            a.cap_prefix[pr] = x.cap_prefix;
            if (r < R) {
                a.local_keep[static_cast<int64_t>(e) * R + r] = x.keep;
                a.alloc[static_cast<int64_t>(e) * R + r] = a_er;
                if (r == h || a_er > 0) {
                    const int32_t t = r == h ? th : tpe[static_cast<int64_t>(r) * E + e];
                    const int32_t stay = detail::plan_stay_of(t, a_er, x.keep, x.rest_prefix, x.cap_prefix);
                    const int32_t corr = (r == h ? th : 0) - stay;  // the home matrix counted t[h][e] as staying
                    if (corr) atomicAdd(sc.cross + r, corr);
                }
            }
        }
    }
    __syncthreads();
    for (int r = tid; r < R; r += kThreads) a.crossing_out[r] = static_cast<int64_t>(sc.cross[r]);
    stamp(6);

    // ---- Phase 4b: segment layout, weight sources, slots, cu_seqlens, seg_row; one warp per rank. ----
    // The group arrays are built in the warp's area (shared memory when the scratch is), then copied out.
    const int layout_warps = sc.layout_warps;  // PlanScratchLayout: fewer when the group arrays are large
    for (int r = warp; r < R && warp < layout_warps; r += layout_warps) {
        int32_t* ge = sc.warp_area + static_cast<size_t>(warp) * sc.group_words;
        int32_t* gc = ge + G;
        int32_t* gs = ge + 2 * G;
        int32_t* gsl = ge + 3 * G;
        int32_t* cu = ge + 4 * G;
        int32_t* pe = ge + 5 * G;  // the rank's remote pieces: expert, amount, index (up to epn of them)
        int32_t* pa = pe + epn;
        int32_t* pi = pa + epn;
        int32_t* seg = a.seg_row + static_cast<int64_t>(r) * E;
        int32_t* cs = a.copies + static_cast<int64_t>(r) * B;
        for (int g = lane; g < G; g += kWarpSize) ge[g] = -1, gc[g] = 0, gs[g] = detail::kSourceEmpty, gsl[g] = -1;
        for (int b = lane; b < B; b += kWarpSize) cs[b] = -1;
        __syncwarp();
        for (int g = lane; g < epn; g += kWarpSize) {
            const int e = r * epn + g;
            const int32_t cnt = sw.home_rem[e];
            if (cnt > 0) ge[g] = e, gc[g] = cnt, gs[g] = detail::kSourceLocal;
        }
        // The rank's pieces (any order in the list), then ascending expert id: each one's place is the number of
        // the rank's pieces with a lower id.
        int m = 0;
        unsigned moved = 0;
        for (int i0 = 0; i0 < sw.n; i0 += kWarpSize) {
            const int i = i0 + lane;
            const bool in = i < sw.n && sw.piece_at[i] % R == r;
            const unsigned bits = __ballot_sync(kFullMask, in);
            if (in) {
                const int k = m + __popc(bits & lanemask_lt());
                if (k < epn) pe[k] = sw.piece_at[i] / R, pa[k] = sw.piece_amount[i], pi[k] = i;
                moved += static_cast<unsigned>(sw.piece_amount[i]);
            }
            m += __popc(bits);
        }
        __syncwarp();
        const int mm = m < epn ? m : epn;  // more than epn: a broken plan, reported below
        for (int k = lane; k < mm; k += kWarpSize) {
            int place = 0;
            for (int k2 = 0; k2 < mm; ++k2) place += pe[k2] < pe[k];
            const int g = epn + place;
            ge[g] = pe[k], gc[g] = pa[k];
            gs[g] = detail::plan_piece_prefetched(d, sw, pi[k]) ? detail::kSourceSlot : detail::kSourcePeer;
        }
        const unsigned wm = __reduce_add_sync(kFullMask, moved);
        if (lane == 0 && wm) atomicAdd(&s_moved_final, wm);
        __syncwarp();
        // Slots in ascending group (= expert) order among the prefetched groups.
        int slot = 0, peer = 0;
        for (int g0 = epn; g0 < G; g0 += kWarpSize) {
            const int g = g0 + lane;
            const int32_t src = g < G ? gs[g] : detail::kSourceEmpty;
            const unsigned ms = __ballot_sync(kFullMask, src == detail::kSourceSlot);
            const unsigned mp = __ballot_sync(kFullMask, src == detail::kSourcePeer);
            if (src == detail::kSourceSlot) {
                const int s = slot + __popc(ms & lanemask_lt());
                cs[s] = ge[g];
                gsl[g] = s;
                atomicAdd(pushed + home[ge[g]], 1);
            }
            slot += __popc(ms);
            peer += __popc(mp);
        }
        // cu_seqlens: inclusive prefix of the padded group sizes (warp scan per 32 groups).
        int32_t end = 0;
        for (int g0 = 0; g0 < G; g0 += kWarpSize) {
            const int g = g0 + lane;
            int32_t v = g < G ? static_cast<int32_t>(detail::align_up(gc[g], d.tp)) : 0;
#pragma unroll
            for (int off = 1; off < kWarpSize; off <<= 1) {
                const int32_t n = __shfl_up_sync(kFullMask, v, off);
                if (lane >= off) v += n;
            }
            if (g < G) cu[g] = end + v;
            end += __shfl_sync(kFullMask, v, kWarpSize - 1);
        }
        __syncwarp();
        for (int g = lane; g < G; g += kWarpSize) {
            if (ge[g] >= 0) seg[ge[g]] = g == 0 ? 0 : cu[g - 1];
            const int64_t o = static_cast<int64_t>(r) * G + g;
            a.group_expert[o] = ge[g];
            a.group_count[o] = gc[g];
            a.group_source[o] = static_cast<int8_t>(gs[g]);
            a.group_slot[o] = gsl[g];
            a.cu_seqlens[o] = cu[g];
        }
        __syncwarp();  // the temporaries are rebuilt for the warp's next rank
        if (lane == 0) {
            a.remote_experts[r] = m;
            a.copies_received[r] = slot;
            a.peer_reads[r] = peer;
            remote_n[r] = m;
            remote_n[R + r] = slot;
        }
    }
    __syncthreads();
    stamp(7);

    // ---- Phase 4c: copies pushed per home rank, then the costs (warp 0, from the block's copies). ----
    if (warp == 0) {
        int traffic = 0, copies = 0, crossing = 0;  // each < N < 2^31
        for (int r = lane; r < R; r += kWarpSize) {
            a.copies_pushed[r] = pushed[r];
            traffic = max(traffic, remote_n[R + r] + pushed[r]);
            copies += remote_n[r];
            crossing += sc.cross[r];
            if (remote_n[r] > epn)
                record_error(team, DeviceErrorKind::kInternal, rank, -1, Phase::kPlanReady, -1, -1, remote_n[r], epn, 0);
        }
        traffic = static_cast<int>(__reduce_max_sync(kFullMask, static_cast<unsigned>(traffic)));
        copies = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(copies)));
        crossing = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(crossing)));
        if (lane == 0) {
            cost_out[0] = traffic;
            cost_out[1] = copies;
            cost_out[2] = crossing;
            cost_out[3] = static_cast<int64_t>(s_moved_final);
        }
    }
    __syncthreads();
}

}  // namespace evenep::cuda::device
