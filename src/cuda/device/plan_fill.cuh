// The global fills of the block planner (plan_block.cuh, warps 1-4): plan_candidates.hpp's plan_alloc_global_fill on
// one warp, building the same alloc matrix bit for bit in sparse form (a list of pieces, plan_warp.cuh PieceList).
#pragma once

#include <cstdint>

#include "cuda/device/plan_warp.cuh"
#include "evenep/detail/plan_candidates.hpp"

namespace evenep::cuda::device {

// plan_alloc_global_fill's order of candidates as (primary, local) keys, larger is better, lower expert id on
// ties: best_fit: pieces that fill the receiver first, the smallest of those, else the largest piece;
// otherwise the largest piece; then the receiver's own entries of the expert. primary 0 means no candidate.
__device__ __forceinline__ unsigned fill_primary(int64_t piece, bool fills, bool best_fit) {
    const unsigned p = static_cast<unsigned>(piece);  // 1 <= piece < 2^31
    return best_fit && fills ? 0x80000000u | (0x7fffffffu - p) : p;
}

// The fills' held bitsets: bit j of held[u * W + lane] is expert lane + 32 j (warp_global_fill, E <= 32 * kFillJ);
// bit lane of held[u * W + j] the same expert in the wide version (larger E). W = PlanScratchLayout::held_words.
inline constexpr int kFillJ = 32;  // experts per lane of warp_global_fill_narrow (E <= 1024: one held word per lane)

// Bits j of a lane's live mask (expert lane + 32 j) that fall in the expert range [lo, hi] (a donor's experts).
template <typename Mask>
__device__ __forceinline__ Mask lane_bits_in_range(int lo, int hi, int lane) {
    constexpr int kBits = 8 * sizeof(Mask);
    const int j0 = lo > lane ? (lo - lane + kWarpSize - 1) / kWarpSize : 0;
    const int j1 = hi >= lane ? (hi - lane) / kWarpSize : -1;
    if (j1 < j0) return 0;
    const int width = j1 - j0 + 1;
    return (width >= kBits ? ~Mask{0} : ((Mask{1} << width) - 1)) << j0;
}

// One fill's state (plan_block.cuh carves it per candidate): rank arrays excess, deficit, remote (remote experts per
// receiver), spread_pushed (pushes per donor; nullptr: pushes not spread), and the receivers' held bitsets (W words
// each, PlanScratchLayout::held_words).
struct FillState {
    int32_t *excess, *deficit, *remote, *spread_pushed;
    uint32_t* held;
    int W;
};

// plan_alloc_global_fill on one warp with overshoot (the block planner's candidates), best_fit or not, pushes spread
// (kSpread) or not: the same pieces in the same order. State initialised by the caller (excess/deficit from balance,
// remote and spread 0, the list's home column T_e and no pieces, held all clear); deficit is read once (the warp keeps
// it in registers, it is not written back). held: bit set once receiver u holds a piece of expert e (the dense code's
// alloc[e][u] > 0; a receiver never holds its own experts here: their donor has no excess once it is a receiver).
// Returns the same bool.
// Built for latency (a dependent shared-memory load or warp reduction costs 100-180 SM cycles on the H200, measured):
// each lane scans only its live experts (bit j of `live`: expert lane + 32 j has entries left and its donor has
// excess; both only decrease, so a cleared bit stays clear), eight at a time with their loads in flight together
// and no branches; the first eight go out before the receiver is known; the next receiver comes from this
// iteration's runner-up (reduced while the loads are in flight) instead of two more reductions. Ties on (pushes,
// piece) go to the receiver's own entries (tpe[u][e]: read only when more than one expert ties; its row is
// prefetched into L1 when the histogram is in global memory), then the lower id.
template <bool kSpread>
__device__ __forceinline__ bool warp_global_fill_narrow(const PlanDims& d,
                                                        const FillState& st,
                                                        const PieceList& pl,
                                                        const int32_t* tpe,
                                                        bool best_fit,
                                                        int lane,
                                                        int& iterations) {
    int32_t *excess = st.excess, *remote = st.remote, *spread_pushed = kSpread ? st.spread_pushed : nullptr;
    const int32_t* deficit = st.deficit;
    uint32_t* held = st.held;
    const int W = st.W;
    constexpr int kBatch = 8;  // live experts per lane loaded at once
    const int R = d.R, E = d.E, epn = d.epn, J = (E + kWarpSize - 1) / kWarpSize, RK = (R + kWarpSize - 1) / kWarpSize;
    const int32_t* av_l = pl.home_rem + lane;
    const uint32_t magic = detail::home_magic(epn);  // donor_of(j) = (lane + 32 j) / epn, exact for E <= 1024
    auto donor_of = [&](int j) { return detail::home_by_magic(lane + kWarpSize * j, magic); };
    uint32_t live = 0;
#pragma unroll
    for (int j = 0; j < kFillJ; ++j) {
        if (j >= J) break;
        if (lane + kWarpSize * j < E && av_l[kWarpSize * j] > 0 && excess[donor_of(j)] > 0) live |= 1u << j;
    }
    int32_t def[kMaxRanksPerLane];  // deficit of rank lane + 32 k
#pragma unroll
    for (int k = 0; k < kMaxRanksPerLane; ++k)
        def[k] = k < RK && lane + kWarpSize * k < R ? deficit[lane + kWarpSize * k] : 0;
    // The first rank with the largest deficit, `skip` left out (-1: none); its deficit in `value` (INT_MIN: no rank).
    auto first_max = [&](int skip, int32_t& value) { return regs_first_max(def, R, lane, skip, value); };
    // The next batch of this lane's live experts (taken from m): j (-1: none), entries left, donor excess, pushes.
    struct Batch {
        int j[kBatch];
        int32_t a[kBatch], x[kBatch];
        unsigned p[kBatch];
    };
    auto load_batch = [&](uint32_t& m, Batch& b) {
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            b.j[k] = m ? __ffs(m) - 1 : -1;
            m &= m - 1;
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int j = b.j[k] >= 0 ? b.j[k] : 0, h = donor_of(j);  // (not loaded when j < 0)
            b.a[k] = b.j[k] >= 0 ? av_l[kWarpSize * j] : 0;
            b.x[k] = b.j[k] >= 0 ? excess[h] : 0;
            b.p[k] = kSpread && b.j[k] >= 0 ? static_cast<unsigned>(spread_pushed[h]) : 0u;
        }
    };
    const bool tpe_global = __isGlobal(tpe);
    int n = 0;
    bool result = true;
    int32_t need;
    int u = first_max(-1, need);
    for (;; ++iterations) {
        if (need <= 0) break;
        // The first batch does not depend on the receiver: its loads go out first.
        uint32_t m = live;
        Batch b;
        load_batch(m, b);
        // The runner-up receiver (for the next iteration, see the commit), while the loads are in flight.
        int32_t need2;
        const int u2 = first_max(u, need2);
        const int32_t rem_u = remote[u];
        const uint32_t hm = held[static_cast<int64_t>(u) * W + lane];
        // A candidate's piece must be at least `req`: 1, or the whole need for the last remote expert u may take.
        const int32_t req = rem_u + 1 >= epn ? need : 1;
        const int32_t* tu = tpe + static_cast<int64_t>(u) * E;
        if (tpe_global && kWarpSize * lane < E) asm volatile("prefetch.L1 [%0];" ::"l"(tu + kWarpSize * lane));
        // This lane's best (pushes, primary) key and the experts (bit j) that reach it. Without kSpread the pushes
        // part is constant and the key is the 32-bit primary.
        unsigned long long bk = 0;
        uint32_t tm = 0;
        for (;;) {
#pragma unroll
            for (int k = 0; k < kBatch; ++k) {
                const int32_t piece = b.a[k] < b.x[k] ? b.a[k] : b.x[k];
                const bool fills = piece >= need;
                const bool valid = b.j[k] >= 0 && piece >= req && !((hm >> b.j[k]) & 1u);
                const unsigned prim = best_fit && fills ? 0x80000000u | (0x7fffffffu - static_cast<unsigned>(piece))
                                                        : static_cast<unsigned>(piece);
                const unsigned long long key =
                    valid ? (kSpread ? static_cast<unsigned long long>(0x7fffffffu - b.p[k]) << 32 : 0ull) | prim
                          : 0ull;
                const uint32_t bit = b.j[k] >= 0 ? 1u << b.j[k] : 0u;
                tm = key > bk ? bit : key == bk ? tm | bit : tm;
                bk = key > bk ? key : bk;
            }
            if (!__any_sync(kFullMask, m != 0)) break;
            load_batch(m, b);
        }
        // Among the tied experts (bit j of t on the lanes with `tied`): most of u's own entries, then the lowest id.
        auto pick_tied = [&](bool tied, uint32_t t) {
            const unsigned count = __reduce_add_sync(kFullMask, tied ? static_cast<unsigned>(__popc(t)) : 0u);
            const unsigned first = __reduce_min_sync(
                kFullMask, tied ? static_cast<unsigned>(lane + kWarpSize * (__ffs(t) - 1)) : 0xffffffffu);
            if (count == 1) return static_cast<int>(first);
            unsigned bl = 0;
            int be = -1;
            for (uint32_t mm = tied ? t : 0u; mm;) {
                int e[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    e[k] = mm ? lane + kWarpSize * (__ffs(mm) - 1) : -1;
                    mm &= mm - 1;
                }
                unsigned l[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) l[k] = e[k] >= 0 ? static_cast<unsigned>(tu[e[k]]) : 0u;
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    if (e[k] >= 0 && (be < 0 || l[k] > bl)) bl = l[k], be = e[k];
            }
            const unsigned lmax = __reduce_max_sync(kFullMask, be >= 0 ? bl : 0u);
            return static_cast<int>(
                __reduce_min_sync(kFullMask, be >= 0 && bl == lmax ? static_cast<unsigned>(be) : 0xffffffffu));
        };
        const unsigned hi = kSpread ? __reduce_max_sync(kFullMask, static_cast<unsigned>(bk >> 32)) : 0u;
        const unsigned lo =
            __reduce_max_sync(kFullMask, static_cast<unsigned>(bk >> 32) == hi ? static_cast<unsigned>(bk) : 0u);
        int best = -1;
        bool over = false;
        int32_t moved = 0;
        if (lo != 0) {
            best = pick_tied(bk == ((static_cast<unsigned long long>(hi) << 32) | lo), tm);
            // The winner's piece, from its primary key (see prim).
            const int32_t piece = static_cast<int32_t>((lo & 0x80000000u) ? 0x7fffffffu - (lo & 0x7fffffffu) : lo);
            moved = piece < need ? piece : need;
        } else {
            // Overshoot (plan_alloc_global_fill's second pass): the smallest expert whose entries left cover the need
            // (ties: more of the receiver's own entries, then lower id); its donor becomes a receiver.
            unsigned bk2 = 0;
            uint32_t tm2 = 0;
            for (uint32_t mm = live; mm; mm &= mm - 1) {
                const int j = __ffs(mm) - 1;
                const int32_t a = av_l[kWarpSize * j];
                const bool valid = a >= need && !((hm >> j) & 1u);                         // live: the donor has excess
                const unsigned key = valid ? 0x80000000u - static_cast<unsigned>(a) : 0u;  // smaller is better
                tm2 = key > bk2 ? 1u << j : key == bk2 ? tm2 | (1u << j) : tm2;
                bk2 = key > bk2 ? key : bk2;
            }
            const unsigned kmax2 = __reduce_max_sync(kFullMask, bk2);
            if (kmax2 != 0) {
                best = pick_tied(bk2 == kmax2, tm2);
                over = true;
                moved = need;
            }
        }
        if (best < 0) {
            result = false;
            break;
        }
        // Commit (plan_fill_take): lane 0 the shared state (the list's home column included: no write-back), every
        // lane its live bits and its deficits, lane lb its held word.
        const int jb = best / kWarpSize, lb = best % kWarpSize, hb = best / epn;
        // Read by every lane (broadcast loads, in flight together) before they change.
        const int32_t ex_hb = excess[hb], sp_hb = kSpread ? spread_pushed[hb] : 0, av_b = pl.home_rem[best];
        __syncwarp();
        const int32_t ex_new = over ? 0 : ex_hb - moved;
        const int lo_e = hb * epn;
        if (lane == 0) {
            excess[hb] = ex_new;
            if (kSpread) spread_pushed[hb] = sp_hb + 1;
            pl.home_rem[best] = av_b - moved;
            remote[u] = rem_u + 1;
            pl.at[n] = best * R + u;
            pl.amount[n] = moved;
        }
        if (lane == lb) {
            held[static_cast<int64_t>(u) * W + lane] = hm | (1u << jb);
            if (av_b - moved <= 0) live &= ~(1u << jb);
        }
        // The donor is done: its experts [lo_e, lo_e + epn) leave this lane's live set.
        if (ex_new <= 0) live &= ~lane_bits_in_range<uint32_t>(lo_e, lo_e + epn - 1, lane);
        // Deficits: u's drops by the piece (to 0 on an overshoot); an overshot donor's becomes moved - its excess (it
        // had none: a rank with excess never had a deficit).
        const int32_t du = over ? 0 : need - moved, dh = moved - ex_hb;
#pragma unroll
        for (int k = 0; k < kMaxRanksPerLane; ++k) {
            if (k >= RK) break;
            const int r = lane + kWarpSize * k;
            def[k] = r == u ? du : over && r == hb ? dh : def[k];
        }
        // The next receiver: the first largest of u (new deficit), the runner-up, and an overshot donor.
        int nu = u;
        int32_t nd = du;
        if (u2 >= 0 && (need2 > nd || (need2 == nd && u2 < nu))) nu = u2, nd = need2;
        if (over && (dh > nd || (dh == nd && hb < nu))) nu = hb, nd = dh;
        u = nu;
        need = nd;
        ++n;
        __syncwarp();  // orders the updates before the next iteration's reads
    }
    if (lane == 0) *pl.n = n;
    return result;
}

// The wide version (E > kWarpSize * kFillJ): the state in shared memory, held[u * W + j] bit `lane` for expert
// lane + 32 j. The receiver's own entries (the last tie-break key, a read of the histogram) are read only for the
// experts tied on the first two keys.
__device__ __forceinline__ bool warp_global_fill_wide(const PlanDims& d,
                                                      const int32_t* tpe,
                                                      bool best_fit,
                                                      const FillState& st,
                                                      const PieceList& pl,
                                                      const int32_t* home,
                                                      int lane,
                                                      int& iterations) {
    int32_t *excess = st.excess, *deficit = st.deficit, *remote = st.remote, *spread_pushed = st.spread_pushed;
    uint32_t* held = st.held;
    const int W = st.W;
    const int R = d.R, E = d.E, J = (E + kWarpSize - 1) / kWarpSize;
    int32_t* avail = pl.home_rem;
    int n = 0;  // pieces so far (lane 0 writes them)
    // lean (E <= 2048): bit j of `live` is set while expert lane + 32 j has entries left and its donor has excess.
    // Both only ever decrease (a donor's excess drops to 0 for good: plan_fill_take never raises it), so the experts
    // outside the mask are never candidates again, and each scan skips them.
    const bool lean = J <= 64;
    unsigned long long live = 0;
    if (lean)
        for (int j = 0; j < J; ++j) {
            const int e = lane + kWarpSize * j;
            if (e < E && avail[e] > 0 && excess[home[e]] > 0) live |= 1ull << j;
        }
    bool result = true;
    for (;; ++iterations) {
        const int u = warp_first_max(deficit, R, lane);
        const int32_t need = deficit[u];
        if (need <= 0) break;
        const bool must_fill = remote[u] + 1 >= d.epn;
        const uint32_t* hu = held + static_cast<int64_t>(u) * W;
        // Pass 1: this lane's best (spread, primary) key and which of its experts (j: e = lane + 32 j) reach it.
        // spread: fewer pushes of the donor so far is better (compared first), 0 when not spreading.
        unsigned long long bk = 0, mask = 0;
        bool any = false, beyond = false;  // beyond: a tied expert with j >= 64 (rescanned in pass 2)
        // One expert's (spread, primary) key; 0: not a candidate.
        auto key_of = [&](int j, int e) -> unsigned long long {
            const int h = home[e];
            const int32_t ex = excess[h], av = avail[e];
            const int32_t piece = av < ex ? av : ex;
            const bool fills = piece >= need;
            const bool valid = ex > 0 && av > 0 && !((hu[j] >> lane) & 1u) && (!must_fill || fills);
            const unsigned cs = spread_pushed ? 0x7fffffffu - static_cast<unsigned>(spread_pushed[h]) : 0u;
            return valid ? (static_cast<unsigned long long>(cs) << 32) | fill_primary(piece, fills, best_fit) : 0ull;
        };
        auto consider = [&](int j, unsigned long long key) {
            if (key > bk) bk = key, mask = 0, beyond = false;
            if (key != 0 && key == bk) {
                if (j < 64)
                    mask |= 1ull << j;
                else
                    beyond = true;
            }
        };
        if (lean) {
            // Only experts with entries left and a donor with excess; four per step so their loads overlap.
            auto key_or_0 = [&](int j) { return j >= 0 ? key_of(j, lane + kWarpSize * j) : 0ull; };
            for (unsigned long long m = live; m;) {
                int j[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    j[k] = m ? __ffsll(static_cast<long long>(m)) - 1 : -1;
                    m &= m - 1;
                }
                unsigned long long key[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) key[k] = key_or_0(j[k]);
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    if (j[k] >= 0) consider(j[k], key[k]);
            }
        } else {
#pragma unroll 4
            for (int j = 0; j < J; ++j) {
                const int e = lane + kWarpSize * j;
                if (e < E) consider(j, key_of(j, e));
            }
        }
        any = bk != 0;
        int best = -1;
        if (__any_sync(kFullMask, any)) {
            const unsigned hi = __reduce_max_sync(kFullMask, any ? static_cast<unsigned>(bk >> 32) : 0u);
            const unsigned lo = __reduce_max_sync(
                kFullMask, any && static_cast<unsigned>(bk >> 32) == hi ? static_cast<unsigned>(bk) : 0u);
            const unsigned long long kmax = (static_cast<unsigned long long>(hi) << 32) | lo;
            // Pass 2: among the tied experts, the most of the receiver's own entries, then the lowest id.
            unsigned bl = 0;
            int be = -1;
            if (any && bk == kmax) {
                for (unsigned long long m = mask; m; m &= m - 1) {
                    const int e = lane + kWarpSize * (__ffsll(static_cast<long long>(m)) - 1);
                    const unsigned l = static_cast<unsigned>(tpe[static_cast<int64_t>(u) * E + e]);
                    if (be < 0 || l > bl) bl = l, be = e;
                }
                if (beyond)
                    for (int j = 64, e = lane + 64 * kWarpSize; e < E; ++j, e += kWarpSize) {
                        const int h = home[e];
                        const int32_t ex = excess[h], av = avail[e];
                        if (ex <= 0 || av <= 0 || ((hu[j] >> lane) & 1u)) continue;
                        const int32_t piece = av < ex ? av : ex;
                        const bool fills = piece >= need;
                        if (must_fill && !fills) continue;
                        const unsigned cs = spread_pushed ? 0x7fffffffu - static_cast<unsigned>(spread_pushed[h]) : 0u;
                        if (((static_cast<unsigned long long>(cs) << 32) | fill_primary(piece, fills, best_fit)) !=
                            kmax)
                            continue;
                        const unsigned l = static_cast<unsigned>(tpe[static_cast<int64_t>(u) * E + e]);
                        if (be < 0 || l > bl) bl = l, be = e;
                    }
            }
            const unsigned lmax = __reduce_max_sync(kFullMask, be >= 0 ? bl : 0u);
            best = static_cast<int>(
                __reduce_min_sync(kFullMask, be >= 0 && bl == lmax ? static_cast<unsigned>(be) : 0xffffffffu));
        }
        bool over = false;
        int64_t moved = 0;
        if (best < 0) {
            // Overshoot (plan_alloc_global_fill's second pass): the smallest expert whose avail covers the need
            // (ties: more of the receiver's own entries, then lower id); its donor becomes a receiver.
            unsigned ba = 0, bl2 = 0;
            int be2 = -1;
            for (int j = 0, e = lane; e < E; ++j, e += kWarpSize) {
                if (lean && !((live >> j) & 1ull)) continue;
                const int h = home[e];
                if (excess[h] <= 0 || avail[e] < need) continue;
                if ((hu[j] >> lane) & 1u) continue;
                const unsigned ka = 0x7fffffffu - static_cast<unsigned>(avail[e]);  // smaller avail is better
                const unsigned kl = static_cast<unsigned>(tpe[static_cast<int64_t>(u) * E + e]);
                if (be2 < 0 || ka > ba || (ka == ba && kl > bl2)) ba = ka, bl2 = kl, be2 = e;
            }
            if (__any_sync(kFullMask, be2 >= 0)) {
                const unsigned amax = __reduce_max_sync(kFullMask, be2 >= 0 ? ba : 0u);
                const bool a_ok = be2 >= 0 && ba == amax;
                const unsigned lmax = __reduce_max_sync(kFullMask, a_ok ? bl2 : 0u);
                best = static_cast<int>(
                    __reduce_min_sync(kFullMask, a_ok && bl2 == lmax ? static_cast<unsigned>(be2) : 0xffffffffu));
                over = true;
                moved = need;
            }
        }
        if (best < 0) {
            result = false;
            break;
        }
        if (!over) {
            const int32_t av = avail[best], ex = excess[home[best]];
            moved = detail::imin64(av < ex ? av : ex, need);
        }
        __syncwarp();  // every lane has read the state before lane 0 changes it
        if (lane == 0) {
            detail::plan_fill_take<int32_t>(d, best, u, moved, over, excess, deficit, avail, remote, spread_pushed,
                                            nullptr);
            held[static_cast<int64_t>(u) * W + best / kWarpSize] |= 1u << (best % kWarpSize);
            pl.at[n] = best * R + u;
            pl.amount[n] = static_cast<int32_t>(moved);
        }
        ++n;
        __syncwarp();  // orders lane 0's updates before the next iteration's reads
        if (lean) {
            const int hb = best / d.epn;
            // The donor is done: drop its experts [hb*epn, (hb+1)*epn) from this lane's mask.
            if (excess[hb] <= 0)
                live &= ~lane_bits_in_range<unsigned long long>(hb * d.epn, hb * d.epn + d.epn - 1, lane);
            if (avail[best] <= 0 && best % kWarpSize == lane) live &= ~(1ull << (best / kWarpSize));
        }
    }
    if (lane == 0) *pl.n = n;
    return result;
}

// plan_alloc_global_fill on one warp with overshoot (the block planner's candidates 1-4; best_fit: 2 and 4, pushes
// spread: 3 and 4): warp_global_fill_narrow up to E = 32 * kFillJ, the wide version beyond.
__device__ __forceinline__ bool warp_global_fill(const PlanDims& d,
                                                 const FillState& st,
                                                 const PieceList& pl,
                                                 const int32_t* tpe,
                                                 const int32_t* home,
                                                 bool best_fit,
                                                 int lane,
                                                 int& iterations) {
    if (d.E <= kWarpSize * kFillJ)
        return st.spread_pushed != nullptr ? warp_global_fill_narrow<true>(d, st, pl, tpe, best_fit, lane, iterations)
                                           : warp_global_fill_narrow<false>(d, st, pl, tpe, best_fit, lane, iterations);
    return warp_global_fill_wide(d, tpe, best_fit, st, pl, home, lane, iterations);
}

}  // namespace evenep::cuda::device
