// The home matrix's route rows (plan_sparse.hpp with no pieces), written while the block planner's fills run: by the
// split warps of plan_block_parallel, or by blocks 5-7 of the planner's thread-block cluster (plan_cluster.cuh).
#pragma once

#include <cstdint>

#include "cuda/device/plan_warp.cuh"
#include "evenep/detail/plan_core.hpp"

namespace evenep::cuda::device {

// Warp gw of nw warps writes its share of the home matrix's route rows (a.rest_prefix, cap_prefix, local_keep, alloc,
// seg_row = -1) and adds each rank's crossing rows into cross_out[R] (atomically: several warps add to one rank).
// expert_load, home and t_home are the planner's per-expert arrays (plan_block.cuh phase 1). few_warps: the split
// warps of one block (up to 16 ranks a lane then takes an expert, see below), not the cluster's three blocks (which
// have enough warps for the coalesced lanes-over-ranks form at every R).
__device__ __forceinline__ void warp_home_rows(const PlanDims& d,
                                               const int32_t* tpe,
                                               const detail::PlanArrays& a,
                                               const int64_t* expert_load,
                                               const int32_t* home,
                                               const int32_t* t_home,
                                               int32_t* cross_out,
                                               int gw,
                                               int nw,
                                               int lane,
                                               bool few_warps) {
    const int R = d.R, E = d.E;
    const bool loc = d.locality;
    // Route rows of the home matrix (plan_sparse.hpp with no pieces): per expert e with home h and t_h = t[h][e],
    // keep = t_h at h (0 without locality), rest_prefix = P[e][r] - keep below r, cap_prefix = (T_e - keep) past
    // h; alloc = T_e at h; seg_row = -1 (phase 4 fills in the groups); crossing rows of r += t[r][e] off the home.
    // A warp takes 8 experts at a time, lanes over ranks (coalesced stores); the histogram's rows are read as
    // two 16-byte vectors per lane when E % 8 == 0.
    // Up to 16 ranks: a lane per expert walks the ranks instead (coalesced histogram reads and seg_row stores; its
    // route-row stores are R + 1 words apart, so past 16 ranks each lane's store is a separate line and the
    // lanes-over-ranks form below is faster: R = 32, E = 896 took 107 us this way).
    const bool lane_per_expert = few_warps && R <= kWarpSize / 2;
    if (lane_per_expert) {
        for (int e0 = gw * kWarpSize; e0 < E; e0 += nw * kWarpSize) {  // warp-uniform
            const int e = e0 + lane;
            const bool in = e < E;
            const int h = in ? home[e] : -1;
            const int32_t T = in ? static_cast<int32_t>(expert_load[e]) : 0;
            const int32_t kh = in && loc ? t_home[e] : 0;
            // The expert's column first (every load in flight at once: the stores below may alias the histogram,
            // so the compiler would not move a load above them).
            constexpr int kMaxR = kWarpSize / 2;
            int32_t col[kMaxR];
#pragma unroll
            for (int r = 0; r < kMaxR; ++r) col[r] = in && r < R ? tpe[static_cast<int64_t>(r) * E + e] : 0;
            int32_t P = 0;
#pragma unroll
            for (int r = 0; r < kMaxR; ++r) {
                if (r >= R) break;
                const int32_t t = col[r];
                if (in) {
                    a.rest_prefix[static_cast<int64_t>(e) * (R + 1) + r] = P - (r > h ? kh : 0);
                    a.cap_prefix[static_cast<int64_t>(e) * (R + 1) + r] = r > h ? T - kh : 0;
                    a.local_keep[static_cast<int64_t>(e) * R + r] = r == h ? kh : 0;
                    a.alloc[static_cast<int64_t>(e) * R + r] = r == h ? T : 0;
                    a.seg_row[static_cast<int64_t>(r) * E + e] = -1;
                }
                const unsigned cross = __reduce_add_sync(kFullMask, static_cast<unsigned>(r != h ? t : 0));
                if (lane == 0 && cross) atomicAdd(cross_out + r, static_cast<int32_t>(cross));
                P += t;
            }
            if (in) {
                a.rest_prefix[static_cast<int64_t>(e) * (R + 1) + R] = T - kh;
                a.cap_prefix[static_cast<int64_t>(e) * (R + 1) + R] = T - kh;
            }
        }
    }
    const bool vec = E % 8 == 0;
    const int groups8 = lane_per_expert ? 0 : (E + 7) / 8;
    for (int g8 = gw; g8 < groups8; g8 += nw) {
        const int e0 = 8 * g8;
        int32_t carry[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) carry[j] = 0;
        for (int r0 = 0; r0 < R; r0 += kWarpSize) {
            const int r = r0 + lane;
            int32_t t[8];
            if (r < R && vec) {
                const int4 x = *reinterpret_cast<const int4*>(tpe + static_cast<int64_t>(r) * E + e0);
                const int4 y = *reinterpret_cast<const int4*>(tpe + static_cast<int64_t>(r) * E + e0 + 4);
                t[0] = x.x, t[1] = x.y, t[2] = x.z, t[3] = x.w, t[4] = y.x, t[5] = y.y, t[6] = y.z, t[7] = y.w;
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) t[j] = r < R && e0 + j < E ? tpe[static_cast<int64_t>(r) * E + e0 + j] : 0;
            }
            // Inclusive scans over the lanes, the eight experts' shuffles side by side (independent: one
            // shuffle latency per level, not eight).
            int32_t incl[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) incl[j] = t[j];
#pragma unroll
            for (int off = 1; off < kWarpSize; off <<= 1) {
                int32_t v[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = __shfl_up_sync(kFullMask, incl[j], off);
#pragma unroll
                for (int j = 0; j < 8; ++j) incl[j] += lane >= off ? v[j] : 0;
            }
            int32_t last[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) last[j] = __shfl_sync(kFullMask, incl[j], kWarpSize - 1);
            int32_t cross = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int e = e0 + j;
                const int32_t P = carry[j] + incl[j] - t[j];
                carry[j] += last[j];
                if (e < E && r < R) {
                    const int h = home[e];
                    const int32_t T = static_cast<int32_t>(expert_load[e]);
                    const int32_t kh = loc ? t_home[e] : 0;
                    a.rest_prefix[static_cast<int64_t>(e) * (R + 1) + r] = P - (r > h ? kh : 0);
                    a.cap_prefix[static_cast<int64_t>(e) * (R + 1) + r] = r > h ? T - kh : 0;
                    a.local_keep[static_cast<int64_t>(e) * R + r] = r == h ? kh : 0;
                    a.alloc[static_cast<int64_t>(e) * R + r] = r == h ? T : 0;
                    if (r != h) cross += t[j];
                }
            }
            if (r < R) {
                int32_t* seg = a.seg_row + static_cast<int64_t>(r) * E + e0;
                if (vec) {
                    reinterpret_cast<int4*>(seg)[0] = make_int4(-1, -1, -1, -1);
                    reinterpret_cast<int4*>(seg)[1] = make_int4(-1, -1, -1, -1);
                } else {
                    for (int j = 0; j < 8 && e0 + j < E; ++j) seg[j] = -1;
                }
                if (cross) atomicAdd(cross_out + r, cross);
            }
        }
        if (lane < 8 && e0 + lane < E) {  // r = R: the prefixes' totals
            const int e = e0 + lane;
            const int32_t v = static_cast<int32_t>(expert_load[e]) - (loc ? t_home[e] : 0);
            a.rest_prefix[static_cast<int64_t>(e) * (R + 1) + R] = v;
            a.cap_prefix[static_cast<int64_t>(e) * (R + 1) + R] = v;
        }
    }
}

}  // namespace evenep::cuda::device
