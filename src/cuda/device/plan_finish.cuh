// The block planner's state and its last phase (plan_block.cuh): the scratch carved from shared (or global) memory,
// and phase 4, which writes the winner's plan arrays from its sparse form (evenep/detail/plan_sparse.hpp): the route
// rows of the experts it moves, the segment layout of every rank, the copies pushed and the costs.
#pragma once

#include <cstdint>

#include "cuda/device/cluster.cuh"
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
        *cost_pushed, *cost_remote, *cross, *xfer, *npieces, *fill_flags, *finish, *piece_at, *piece_amount, *head,
        *next, *warp_area, *tpe;
    uint32_t* held;
    int piece_cap, held_words, split_words, group_words, layout_warps;
    // The copy tree without relays (detail::plan_relays with relays off), written by phase 4 when set (global memory,
    // [R*B] each): every slot's source is its expert's home, round 0; cost_out[4] = cost_out[5] = the critical path
    // max_r max(pushed, received). Null: the caller writes the copy tree itself (relays on, or the serial planner).
    int32_t* relay_src = nullptr;
    int32_t* relay_round = nullptr;
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
                       i32(l.finish),
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

// Alloc matrix c of the block planner in sparse form (0: the reference split, 1-4: the global fills, 5-6: the paths):
// its home column and pieces as the warps build them, and with the per-expert lists phase 3 links.
__device__ __forceinline__ PieceList piece_list(const PlanScratch& sc, int c, int E) {
    int32_t* hr = c == 0 ? sc.remaining : c <= 4 ? sc.avail + (c - 1) * E : sc.path_left + (c - 5) * E;
    return PieceList{hr, sc.piece_at + c * sc.piece_cap, sc.piece_amount + c * sc.piece_cap, sc.npieces + c};
}
__device__ __forceinline__ detail::SparseAlloc sparse_alloc(const PlanScratch& sc, int c, int E) {
    const PieceList pl = piece_list(sc, c, E);
    detail::SparseAlloc s{pl.home_rem, pl.at, pl.amount, *pl.n};
    s.head = sc.head + c * E;
    s.next = sc.next + c * sc.piece_cap;
    s.home_t = sc.t_home;
    return s;
}

// P[e][r], the histogram's column prefix, from the home matrix's rest_prefix row (phase 2 writes it for every
// expert; phase 4 rewrites only the moved experts', after reading it here).
__device__ __forceinline__ int32_t
column_prefix(const PlanArrays& a, const PlanScratch& sc, bool locality, int R, int e, int r) {
    return a.rest_prefix[static_cast<int64_t>(e) * (R + 1) + r] + (locality && r > sc.home[e] ? sc.t_home[e] : 0);
}

// Phase 4a and 4b are spread over warps: warp gw of ngw takes the winner's pieces i = gw, gw + ngw, ... (4a: the
// route rows of each piece's expert, once, by the warp holding its first piece) and the ranks r = gw, gw + ngw, ...
// (4b). On the cluster (plan_cluster.cuh) the warps of all eight blocks share them; sc is then block 0's scratch
// (reached through distributed shared memory from the other blocks), whose cost_pushed[R] counts the copies pushed
// per home rank, cost_remote[2R] the remote experts and copies received per rank, cross[R] the crossing rows and
// finish[1] the moved entries (all zero, cross the home matrix's, before phase 4 starts).

// Phase 4a: the route rows of every expert the winner moves (plan_route_entry at every rank r <= R) and the crossing
// rows they change; finish_route_rows gives each of them to one warp (the one holding its first piece).

// Writes expert e's route entry at rank r (row = e * (R + 1)) and adds the crossing rows it changes: the home matrix
// counted t[h][e] as staying on h; a holder (r == h or a_er > 0) keeps plan_stay_of of its t = t_of() instead.
template <typename TOf>
__device__ __forceinline__ void write_route_entry(const PlanDims& d,
                                                  const PlanArrays& a,
                                                  const PlanScratch& sc,
                                                  int e,
                                                  int r,
                                                  int h,
                                                  int32_t th,
                                                  int32_t a_er,
                                                  const detail::PlanRouteEntry& x,
                                                  const TOf& t_of) {
    const int R = d.R;
    const int64_t pr = static_cast<int64_t>(e) * (R + 1) + r;
    a.rest_prefix[pr] = x.rest_prefix;
    a.cap_prefix[pr] = x.cap_prefix;
    if (r < R) {
        a.local_keep[static_cast<int64_t>(e) * R + r] = x.keep;
        a.alloc[static_cast<int64_t>(e) * R + r] = a_er;
        if (r == h || a_er > 0) {
            const int32_t stay = detail::plan_stay_of(t_of(), a_er, x.keep, x.rest_prefix, x.cap_prefix);
            const int32_t corr = (r == h ? th : 0) - stay;
            if (corr) atomicAdd(sc.cross + r, corr);
        }
    }
}

// Expert e's route rows written rank by rank (lanes over ranks, each summing the holders below it itself).
__device__ __forceinline__ void expert_route_rows_by_rank(const PlanDims& d,
                                                          const int32_t* tpe,
                                                          const PlanArrays& a,
                                                          const PlanScratch& sc,
                                                          const detail::SparseAlloc& sw,
                                                          int e,
                                                          int lane) {
    const int R = d.R, E = d.E, h = sc.home[e];
    const int32_t th = sc.t_home[e];
    for (int r = lane; r <= R; r += kWarpSize) {
        int32_t a_er = r == h ? sw.home_rem[e] : 0;
        if (r != h && r < R)
            detail::plan_for_each_piece_of(sw, R, e, [&](int j) {
                if (sw.piece_at[j] - e * R == r) a_er = sw.piece_amount[j];
            });
        const detail::PlanRouteEntry x =
            detail::plan_route_entry(d, tpe, sw, e, r, a_er, column_prefix(a, sc, d.locality, R, e, r));
        write_route_entry(d, a, sc, e, r, h, th, a_er, x,
                          [&] { return r == h ? th : tpe[static_cast<int64_t>(r) * E + e]; });
    }
}

// The same rows with the expert's holders (its home rank, then its pieces: nh of them) one per lane, their histogram
// entries read together; every lane then sums the holders below each of its ranks from shuffles (plan_holders_below),
// the column prefixes of all its ranks already loaded: two memory round trips per expert instead of a few per rank.
// More than 32 holders: rank by rank. kChunks >= R / 32 + 1 covers the lane's ranks r = lane + 32 c <= R (the caller
// picks the smallest of a few: every chunk costs instructions and registers on every lane).
template <int kChunks>
__device__ __forceinline__ void expert_route_rows_by_holders(const PlanDims& d,
                                                             const int32_t* tpe,
                                                             const PlanArrays& a,
                                                             const PlanScratch& sc,
                                                             const detail::SparseAlloc& sw,
                                                             int e,
                                                             int lane) {
    const int R = d.R, E = d.E, RC = R / kWarpSize + 1, h = sc.home[e];
    const int32_t th = sc.t_home[e];
    // The column prefixes P[e][r] of the lane's ranks (phase 2 wrote them; read before they are rewritten).
    int32_t P[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int r = lane + kWarpSize * c;
        P[c] = c < RC && r <= R ? column_prefix(a, sc, d.locality, R, e, r) : 0;
    }
    // Holder k on lane k: rank hu, entries ha, histogram entry ht, kept entries hk.
    int hu = lane == 0 ? h : -1;
    int32_t ha = lane == 0 ? sw.home_rem[e] : 0;
    int nh = 1;
    detail::plan_for_each_piece_of(sw, R, e, [&](int j) {
        if (lane == nh) hu = sw.piece_at[j] - e * R, ha = sw.piece_amount[j];
        ++nh;
    });
    if (nh > kWarpSize) {  // (warp-uniform) rare
        expert_route_rows_by_rank(d, tpe, a, sc, sw, e, lane);
        return;
    }
    const int32_t ht = lane == 0 ? th : lane < nh ? tpe[static_cast<int64_t>(hu) * E + e] : 0;
    const int32_t hk = lane < nh ? detail::plan_keep_of(d.locality, ht, ha) : 0;
    int32_t kb[kChunks], cb[kChunks], aer[kChunks], tr[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) kb[c] = cb[c] = aer[c] = tr[c] = 0;
    for (int k = 0; k < nh; ++k) {
        const int u = __shfl_sync(kFullMask, hu, k);
        const int32_t au = __shfl_sync(kFullMask, ha, k), ku = __shfl_sync(kFullMask, hk, k),
                      tu = __shfl_sync(kFullMask, ht, k);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            const int r = lane + kWarpSize * c;
            if (u < r) kb[c] += ku, cb[c] += au - ku;
            if (u == r && (k == 0 || u != h)) aer[c] = au, tr[c] = tu;  // at r == h the home's own count
        }
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int r = lane + kWarpSize * c;
        if (c >= RC || r > R) continue;
        const int32_t keep = r < R && aer[c] > 0 ? detail::plan_keep_of(d.locality, tr[c], aer[c]) : 0;
        write_route_entry(d, a, sc, e, r, h, th, aer[c], detail::PlanRouteEntry{keep, P[c] - kb[c], cb[c]},
                          [&] { return tr[c]; });
    }
}

// Warp gw of ngw: the experts of pieces gw, gw + ngw, ... that are their expert's first. by_holders (the cluster's
// spread, plan_cluster.cuh) writes each expert's rows from its holders; block 0 alone writes them rank by rank
// (measured faster there at R = 8 and 16: MoonEP 2.1 against 3.7 us, fewer instructions per expert at few ranks).
__device__ __forceinline__ void finish_route_rows(const PlanDims& d,
                                                  const int32_t* tpe,
                                                  const PlanArrays& a,
                                                  const PlanScratch& sc,
                                                  const detail::SparseAlloc& sw,
                                                  int gw,
                                                  int ngw,
                                                  int lane,
                                                  bool by_holders) {
    static_assert(kMaxRanksPerLane + 1 <= 9, "finish_route_rows: up to 9 chunks of ranks");
    const int R = d.R, RC = R / kWarpSize + 1;
    for (int i = gw; i < sw.n; i += ngw) {
        if (!detail::plan_piece_first_of_expert(sw, R, i)) continue;  // warp-uniform
        const int e = sw.piece_at[i] / R;
        if (!by_holders) {
            expert_route_rows_by_rank(d, tpe, a, sc, sw, e, lane);
        } else if (RC <= 3) {
            expert_route_rows_by_holders<3>(d, tpe, a, sc, sw, e, lane);
        } else if (RC <= 5) {
            expert_route_rows_by_holders<5>(d, tpe, a, sc, sw, e, lane);
        } else {
            expert_route_rows_by_holders<kMaxRanksPerLane + 1>(d, tpe, a, sc, sw, e, lane);
        }
    }
}

// Phase 4b, rank r's segment layout, weight sources, slots, cu_seqlens and seg_row for r = gw, gw + ngw, ...; the
// group arrays are built in `area` (group_words int32, this warp's alone), then copied out.
__device__ __forceinline__ void finish_layout(const PlanDims& d,
                                              const PlanArrays& a,
                                              const PlanScratch& sc,
                                              const detail::SparseAlloc& sw,
                                              int32_t* area,
                                              int gw,
                                              int ngw,
                                              int lane) {
    const int R = d.R, E = d.E, epn = d.epn, G = d.G, B = d.B;
    int32_t* pushed = sc.cost_pushed;
    int32_t* remote_n = sc.cost_remote;
    unsigned moved_warp = 0;
    for (int r = gw; r < R; r += ngw) {
        int32_t* ge = area;
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
        if (sc.relay_src != nullptr)
            for (int b = lane; b < B; b += kWarpSize)
                sc.relay_src[static_cast<int64_t>(r) * B + b] = -1, sc.relay_round[static_cast<int64_t>(r) * B + b] = 0;
        __syncwarp();
        for (int g = lane; g < epn; g += kWarpSize) {
            const int e = r * epn + g;
            const int32_t cnt = sw.home_rem[e];
            if (cnt > 0) ge[g] = e, gc[g] = cnt, gs[g] = detail::kSourceLocal;
        }
        // The rank's pieces (any order in the list), then ascending expert id: each one's place is the number of
        // the rank's pieces with a lower id.
        int m = 0;
        for (int i0 = 0; i0 < sw.n; i0 += kWarpSize) {
            const int i = i0 + lane;
            const bool in = i < sw.n && sw.piece_at[i] % R == r;
            const unsigned bits = __ballot_sync(kFullMask, in);
            if (in) {
                const int k = m + __popc(bits & lanemask_lt());
                if (k < epn) pe[k] = sw.piece_at[i] / R, pa[k] = sw.piece_amount[i], pi[k] = i;
                moved_warp += static_cast<unsigned>(sw.piece_amount[i]);
            }
            m += __popc(bits);
        }
        __syncwarp();
        const int mm = m < epn ? m : epn;  // more than epn: a broken plan, reported in phase 4c
        for (int k = lane; k < mm; k += kWarpSize) {
            int place = 0;
            for (int k2 = 0; k2 < mm; ++k2) place += pe[k2] < pe[k];
            const int g = epn + place;
            ge[g] = pe[k], gc[g] = pa[k];
            // plan_piece_prefetched: fewer than B of the rank's pieces before it (more entries, then lower id); all
            // of them are in pe/pa unless the plan is broken (m > epn, reported in phase 4c).
            bool prefetched = d.B >= epn;
            if (!prefetched && m <= epn) {
                int before = 0;
                for (int k2 = 0; k2 < mm; ++k2) before += pa[k2] > pa[k] || (pa[k2] == pa[k] && pe[k2] < pe[k]);
                prefetched = before < d.B;
            } else if (!prefetched) {
                prefetched = detail::plan_piece_prefetched(d, sw, pi[k]);
            }
            gs[g] = prefetched ? detail::kSourceSlot : detail::kSourcePeer;
        }
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
                const int h = sc.home[ge[g]];
                atomicAdd(pushed + h, 1);
                if (sc.relay_src != nullptr) sc.relay_src[static_cast<int64_t>(r) * B + s] = h;
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
    const unsigned wm = __reduce_add_sync(kFullMask, moved_warp);
    if (lane == 0 && wm) atomicAdd(reinterpret_cast<unsigned*>(sc.finish + 1), wm);
}

// Whether phase 4a and 4b spread over the cluster's blocks (ep_layout.hpp kPlanClusterFinishMinRanks).
__device__ __forceinline__ bool finish_spread(const PlanDims& d, bool cluster) {
    return cluster && d.R >= kPlanClusterFinishMinRanks;
}

// The warps of phase 4 on one block of the cluster: the route rows from the lowest warps up (gw = warp * blocks +
// block: consecutive pieces on different SMs), the layouts from the highest warps down (the top sc.layout_warps, their
// group arrays in area0), so that the two meet on one warp only when there is much of both.
template <int kThreads>
__device__ __forceinline__ void finish_warps(const PlanDims& d,
                                             const int32_t* tpe,
                                             const PlanArrays& a,
                                             const PlanScratch& sc,
                                             const detail::SparseAlloc& sw,
                                             int32_t* area0,
                                             int block,
                                             int blocks) {
    constexpr int kWarps = kThreads / kWarpSize;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    finish_route_rows(d, tpe, a, sc, sw, warp * blocks + block, kWarps * blocks, lane, true);
    const int lw = kWarps - 1 - warp;
    if (lw < sc.layout_warps)
        finish_layout(d, a, sc, sw, area0 + static_cast<size_t>(lw) * sc.group_words, lw * blocks + block,
                      sc.layout_warps * blocks, lane);
}

// Phase 4 on all kThreads threads, after the block has chosen the allocation sw (its lists linked; sc.finish[0] = its
// index). stamp(i) stores the phase boundaries 6 and 7 (plan_block.cuh's timing words). With kCluster (from
// kPlanClusterFinishMinRanks ranks on) the cluster's other blocks (plan_cluster.cuh plan_cluster_finish) take their
// share of 4a and 4b between two cluster barriers (C, D); stamp 6 is then when C releases (4a and 4b run together, 6 to
// 7).
template <int kThreads, bool kCluster, typename Stamp>
__device__ __forceinline__ void plan_block_finish(const PlanDims& d,
                                                  const int32_t* tpe,
                                                  const PlanArrays& a,
                                                  int64_t* cost_out,
                                                  const PlanScratch& sc,
                                                  const detail::SparseAlloc& sw,
                                                  const TeamView& team,
                                                  int rank,
                                                  const Stamp& stamp) {
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, epn = d.epn;
    int32_t* pushed = sc.cost_pushed;    // [R] copies pushed per home rank (the costs' arrays are free again)
    int32_t* remote_n = sc.cost_remote;  // [R] remote experts, then [R] copies received, per rank
    for (int r = tid; r < R; r += kThreads) pushed[r] = 0;
    if (tid == 0) sc.finish[1] = 0;
    __syncthreads();
    if (finish_spread(d, kCluster)) {
        cluster_arrive();
        cluster_wait();  // C: the other blocks see the winner and the zeroed counters
        stamp(6);
        finish_warps<kThreads>(d, tpe, a, sc, sw, sc.warp_area, 0, kPlanClusterBlocks);
        __syncthreads();
        cluster_arrive();
        cluster_wait();  // D: every block's route rows and layouts are written
    } else if (const int rw = plan_finish_route_warps(R, sc.layout_warps); rw > 0) {
        // 4a and 4b side by side (they write disjoint arrays; the counters are atomics): the route rows on the low rw
        // warps, one rank's layout on each warp above. Stamp 6 marks the start of both (5 to 6 is empty).
        static_assert(kThreads / kWarpSize == kPlanMaxWarps, "plan_finish_route_warps counts kPlanMaxWarps warps");
        stamp(6);
        if (warp < rw)
            finish_route_rows(d, tpe, a, sc, sw, warp, rw, lane, false);
        else
            finish_layout(d, a, sc, sw, sc.warp_area + static_cast<size_t>(warp - rw) * sc.group_words, warp - rw,
                          kPlanMaxWarps - rw, lane);
        __syncthreads();
    } else {
        // ---- Phase 4a: the route rows of every expert the winner moves, and the crossing rows they change. ----
        finish_route_rows(d, tpe, a, sc, sw, warp, kThreads / kWarpSize, lane, false);
        __syncthreads();
        stamp(6);
        // ---- Phase 4b: segment layout, weight sources, slots, cu_seqlens, seg_row; one warp per rank. ----
        if (warp < sc.layout_warps)  // PlanScratchLayout: fewer when the group arrays are large
            finish_layout(d, a, sc, sw, sc.warp_area + static_cast<size_t>(warp) * sc.group_words, warp,
                          sc.layout_warps, lane);
        __syncthreads();
    }
    for (int r = tid; r < R; r += kThreads) a.crossing_out[r] = static_cast<int64_t>(sc.cross[r]);
    stamp(7);

    // ---- Phase 4c: copies pushed per home rank, then the costs (warp 0, from the block's copies). ----
    if (warp == 0) {
        int traffic = 0, copies = 0, crossing = 0, delta = 0;  // each < N < 2^31
        for (int r = lane; r < R; r += kWarpSize) {
            a.copies_pushed[r] = pushed[r];
            traffic = max(traffic, remote_n[R + r] + pushed[r]);
            delta = max(delta, max(remote_n[R + r], pushed[r]));
            copies += remote_n[r];
            crossing += sc.cross[r];
            if (remote_n[r] > epn)
                record_error(team, DeviceErrorKind::kInternal, rank, -1, Phase::kPlanReady, -1, -1, remote_n[r], epn,
                             0);
        }
        traffic = static_cast<int>(__reduce_max_sync(kFullMask, static_cast<unsigned>(traffic)));
        copies = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(copies)));
        crossing = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(crossing)));
        delta = static_cast<int>(__reduce_max_sync(kFullMask, static_cast<unsigned>(delta)));
        if (lane == 0) {
            if (sc.relay_src != nullptr) cost_out[4] = cost_out[5] = delta;
            cost_out[0] = traffic;
            cost_out[1] = copies;
            cost_out[2] = crossing;
            cost_out[3] = static_cast<int64_t>(static_cast<unsigned>(sc.finish[1]));
        }
    }
    __syncthreads();
}

}  // namespace evenep::cuda::device
