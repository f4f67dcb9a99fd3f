// The planner as a thread-block cluster of kPlanClusterBlocks blocks (one rank's plan on eight SMs):
//   block 0      plan_block_parallel (plan_block.cuh) without its global fills and home route rows;
//   blocks 1-4   one global fill each (block_global_fill: plan_alloc_global_fill with overshoot on 512 threads);
//   blocks 5-7   the home matrix's route rows (plan_home.cuh).
// Cluster barriers order them: A (block 0 has its phase 1: expert loads and balances) and B (every fill's list,
// flag and home column, and the home rows, are in place; block 0 goes on with phase 3); then all eight blocks write
// the winner's route rows and layouts (phase 4a and 4b, plan_finish.cuh) between C (block 0 has chosen) and D, from
// kPlanClusterFinishMinRanks ranks on. The helpers read block 0's phase-1 arrays and write their results through
// distributed shared memory (cluster.cuh cluster_map). A fill block with its own copy of the histogram sums its expert
// loads and balances itself and waits at A only after its fill, which so runs beside block 0's phase 1.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/device/cluster.cuh"
#include "cuda/device/plan_finish.cuh"
#include "cuda/device/plan_home.cuh"
#include "cuda/device/plan_stamps.cuh"
#include "cuda/device/plan_warp.cuh"
#include "evenep/detail/ep_layout.hpp"

namespace evenep::cuda::device {

// Where a fill block reads the histogram: its own copy in shared memory (int32 or uint16) or global memory.
enum class FillTpe : int { kGlobal = 0, kShared32 = 1, kShared16 = 2 };

__device__ __forceinline__ int bit_width32(uint32_t x) { return 32 - __clz(static_cast<int>(x)); }
__device__ __forceinline__ uint64_t low_mask(int bits) { return bits >= 64 ? ~0ull : (1ull << bits) - 1; }

// The barrier of a block's first kN threads (kN == kBlock: the whole block, __syncthreads).
template <int kN, int kBlock>
__device__ __forceinline__ void group_barrier() {
    static_assert(kN % kWarpSize == 0 && kN <= kBlock, "group_barrier: whole warps of the block");
    if constexpr (kN == kBlock) {
        __syncthreads();
    } else {
        asm volatile("bar.sync 2, %0;" ::"r"(kN) : "memory");
    }
}

// The maximum of a 64-bit key over the block's first kWarps warps (kBlock threads in the block; every thread of those
// warps passes one and gets the maximum): warp maxima into slots[parity][warp], one barrier, every warp reduces the
// slots. Two slot sets alternate (parity), so the next call's stores cannot overwrite slots a slower warp still reads.
// NOTE: measured slower, a lot: every thread reading all kWarps slots and taking their maximum as a tree in registers
// (R = 64: 82 -> 218 us: the 16 values live at once made the fill spill, the cluster kernel 529 -> 929 LDL/STL); and
// as one running maximum over the slots, without spills (R = 64 fills 50 -> 70 us: 15 dependent 64-bit compare-selects
// on every thread of the 16 warps cost more issue slots than two warp reductions); and (fifteenth session) with the
// second stage as lane 0's 64-bit atomicMax into one of three turning shared slots, every thread reading the slot after
// the barrier (R = 64 77.4 -> 82.9 us, R = 128 143.9 -> 155.4, MoonEP 25.4 -> 25.8; bit-exact, racecheck clean): a
// 64-bit shared-memory max is slower than the warp reduction it replaces.
template <int kWarps, int kBlock>
__device__ __forceinline__ uint64_t block_max_key(uint64_t k, uint64_t* slots, int& parity, int lane, int warp) {
    auto warp_max = [](uint64_t v) {
        const unsigned hi = __reduce_max_sync(kFullMask, static_cast<unsigned>(v >> 32));
        const unsigned lo =
            __reduce_max_sync(kFullMask, static_cast<unsigned>(v >> 32) == hi ? static_cast<unsigned>(v) : 0u);
        return (static_cast<uint64_t>(hi) << 32) | lo;
    };
    const uint64_t w = warp_max(k);
    uint64_t* s = slots + parity * kWarps;
    if (lane == 0) s[warp] = w;
    group_barrier<kWarps * kWarpSize, kBlock>();
    parity ^= 1;
    return warp_max(lane < kWarps ? s[lane] : 0ull);
}

// The bit fields of a fill's candidate key, a pair (hi, lo) of words W compared lexicographically: hi = valid (top
// bit), fewer pushes of the donor (spread fills), fills the receiver (best fit), the piece (best fit and filling:
// smaller is better, so stored as mask - piece; otherwise larger is better); lo = the receiver's own entries of the
// expert, then lower expert id (stored as mask - e). Every comparison of plan_alloc_global_fill is then one unsigned
// comparison. W = uint32_t when both fit 32 bits (the usual case: the pair is one 64-bit key, one block maximum per
// step), else uint64_t (two block maxima per step: hi, then lo among the experts tied on hi).
struct FillKeyBits {
    int id, local, piece, push, fbit;
    __device__ bool fits32() const { return 1 + push + fbit + piece <= 32 && local + id <= 32; }
};

// plan_alloc_global_fill with overshoot on the first kThreads threads of a block of kBlock: the same pieces in the same
// order as plan_fill.cuh's one-warp version. Thread t owns experts t + kThreads j (j < kJ) and keeps their entries
// left, their donor's excess and pushes in registers; the last warp (whose threads own the fewest experts) keeps the
// ranks' deficits and remote counts in registers (lane r % 32, slot r / 32; R <= 32 * kPlanFillRanksPerLane) and, while
// the keys are reduced, finds the runner-up receiver, which it publishes with its key (info[2][3], alternating). Each
// step is one block-wide key maximum (one barrier; two with 64-bit words) after which every thread applies the winner
// to its own copy of the state (the last warp to the ranks'). held (shared memory, per thread) has bit u of expert j's
// word set once receiver u holds a piece of it. The pieces go to at/amount (thread 0), the final entries left to
// home_rem. Returns plan_alloc_global_fill's bool.
template <int kThreads, int kJ, int kBlock, typename W, typename TpeT>
__device__ __forceinline__ bool block_global_fill(const PlanDims& d,
                                                  const FillKeyBits& kb,
                                                  bool spread,
                                                  const int64_t* expert_load,
                                                  const int64_t* balance,
                                                  const TpeT* tpe,
                                                  uint32_t* held,
                                                  int32_t* bcast,
                                                  int32_t* info,
                                                  uint64_t* slots,
                                                  int32_t* at,
                                                  int32_t* amount,
                                                  int32_t* home_rem,
                                                  int& n_out,
                                                  int& iterations) {
    constexpr int kWarps = kThreads / kWarpSize;
    constexpr int kBits = 8 * sizeof(W);
    constexpr int kRankWarp = kWarps - 1;  // keeps the ranks' state
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, E = d.E, epn = d.epn, HW = (R + kWarpSize - 1) / kWarpSize;
    const uint32_t magic = detail::home_magic(epn);  // e / epn, exact for E <= 1024 (kJ <= 2)
    int h_[kJ];
    int32_t av[kJ], exd[kJ], spd[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
        const int e = tid + kThreads * j;
        const bool in = e < E;
        h_[j] = in ? detail::home_by_magic(e, magic) : -1;
        av[j] = in ? static_cast<int32_t>(expert_load[e]) : 0;
        const int64_t b = in ? balance[h_[j]] : 0;
        exd[j] = static_cast<int32_t>(b > 0 ? b : 0);
        spd[j] = 0;
        if (in)
            for (int w = 0; w < HW; ++w) held[(j * HW + w) * kThreads + tid] = 0;
    }
    int32_t def[kPlanFillRanksPerLane], rem[kPlanFillRanksPerLane];
#pragma unroll
    for (int k = 0; k < kPlanFillRanksPerLane; ++k) {
        const int r = lane + kWarpSize * k;
        const int64_t b = r < R ? balance[r] : 0;
        def[k] = static_cast<int32_t>(b < 0 ? -b : 0);
        rem[k] = 0;
    }
    const W top = W{1} << (kBits - 1);
    const W id_mask = static_cast<W>((W{1} << kb.id) - 1), piece_mask = static_cast<W>(low_mask(kb.piece));
    const W push_mask = static_cast<W>(low_mask(kb.push));
    const int fsh = kb.piece, psh = kb.piece + kb.fbit;  // where the fills bit and the pushes start in hi
    int parity = 0;
    // The block maximum of the threads' (hi, lo) pairs.
    auto block_best = [&](W hi, W lo, W& best_lo) -> W {
        if constexpr (sizeof(W) == 4) {
            const uint64_t m =
                block_max_key<kWarps, kBlock>((static_cast<uint64_t>(hi) << 32) | lo, slots, parity, lane, warp);
            best_lo = static_cast<W>(m);
            return static_cast<W>(m >> 32);
        } else {
            const W mh = block_max_key<kWarps, kBlock>(hi, slots, parity, lane, warp);
            best_lo = mh != 0 ? block_max_key<kWarps, kBlock>(hi == mh ? lo : W{0}, slots, parity, lane, warp) : W{0};
            return mh;
        }
    };
    int32_t need;
    int u = regs_first_max(def, R, lane, -1, need);
    // The runner-up in one reduction (regs_first_max_small) when the largest deficit is below 2^24: no deficit grows
    // past it (a receiver's shrinks; an overshot donor's new one is below the need of the receiver it filled).
    const bool small_def = need < (1 << 24);
    int32_t rem_u = 0;
    int n = 0;
    bool result = true;
    // NOTE: the next receiver's row is loaded here, after the step's commit. Measured slower (R = 64 82.0 -> 84.2 us,
    // MoonEP the same): prefetching the runner-up's row right after the block maximum (carried rows, the commit's held
    // bit patched into the prefetched word): the extra loads and selects on all 16 warps cost more than the one
    // dependent load they take off the chain.
    for (;; ++iterations) {
        if (need <= 0) break;
        const int uw = u / kWarpSize;
        const uint32_t ub = 1u << (u % kWarpSize);
        const TpeT* tu = tpe + static_cast<int64_t>(u) * E;
        uint32_t hw[kJ], loc[kJ];
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            const int e = tid + kThreads * j;
            hw[j] = e < E ? held[(j * HW + uw) * kThreads + tid] : 0u;
            loc[j] = e < E ? static_cast<uint32_t>(tu[e]) : 0u;
        }
        int32_t* inf = info + 3 * (iterations & 1);
        if (warp == kRankWarp) {  // the runner-up receiver (for the next one), published with this step's key
            int32_t need2;
            const int u2 =
                small_def ? regs_first_max_small(def, R, lane, u, need2) : regs_first_max(def, R, lane, u, need2);
            const int32_t rem_u2 = u2 >= 0 ? regs_get(rem, u2) : 0;
            if (lane == 0) inf[0] = u2, inf[1] = need2, inf[2] = rem_u2;
        }
        const int32_t req = rem_u + 1 >= epn ? need : 1;  // u's last remote slot: the piece must fill it
        // This thread's best (hi, lo) pair.
        W bh = 0, bl = 0;
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            const int e = tid + kThreads * j;
            const int32_t piece = av[j] < exd[j] ? av[j] : exd[j];
            const bool valid = e < E && av[j] > 0 && exd[j] > 0 && piece >= req && !(hw[j] & ub);
            const bool fb = kb.fbit && piece >= need;
            const W penc = fb ? piece_mask - static_cast<W>(piece) : static_cast<W>(piece);
            const W hi =
                valid ? top | ((push_mask - static_cast<W>(spd[j])) << psh) | (static_cast<W>(fb) << fsh) | penc : W{0};
            const W lo = (static_cast<W>(loc[j]) << kb.id) | (id_mask - static_cast<W>(e));
            if (hi > bh || (hi == bh && lo > bl)) bh = hi, bl = lo;
        }
        W ml;
        W mh = block_best(bh, bl, ml);
        const int u2 = inf[0];
        const int32_t need2 = inf[1], rem_u2 = inf[2];
        int best = -1;
        bool over = false;
        int32_t moved = 0, ex_hb = 0, rem_hb = 0;
        if (mh != 0) {
            best = static_cast<int>(id_mask - (ml & id_mask));
            const W penc = mh & piece_mask;
            const bool fb = kb.fbit && ((mh >> fsh) & 1);
            const int32_t piece = static_cast<int32_t>(fb ? piece_mask - penc : penc);
            moved = piece < need ? piece : need;
        } else {
            // Overshoot (plan_alloc_global_fill's second pass): the smallest expert whose entries left cover the need
            // (ties: more of the receiver's own entries, then lower id); its donor becomes a receiver.
            bh = bl = 0;
#pragma unroll
            for (int j = 0; j < kJ; ++j) {
                const int e = tid + kThreads * j;
                const bool valid = e < E && exd[j] > 0 && av[j] >= need && !(hw[j] & ub);
                const W hi = valid ? top | (piece_mask - static_cast<W>(av[j])) : W{0};
                const W lo = (static_cast<W>(loc[j]) << kb.id) | (id_mask - static_cast<W>(e < E ? e : 0));
                if (hi > bh || (hi == bh && lo > bl)) bh = hi, bl = lo;
            }
            mh = block_best(bh, bl, ml);
            if (mh != 0) {
                best = static_cast<int>(id_mask - (ml & id_mask));
                over = true;
                moved = need;
                // The donor's excess (its new deficit below) from the thread that owns the expert, its remote count
                // from the ranks' warp.
#pragma unroll
                for (int j = 0; j < kJ; ++j)
                    if (tid + kThreads * j == best) bcast[0] = exd[j];
                if (warp == kRankWarp) {
                    const int32_t r_hb = regs_get(rem, detail::home_by_magic(best, magic));
                    if (lane == 0) bcast[1] = r_hb;
                }
                group_barrier<kThreads, kBlock>();
                ex_hb = bcast[0], rem_hb = bcast[1];
            }
        }
        if (best < 0) {
            result = false;
            break;
        }
        // Commit (plan_fill_take), every thread on its own copy of the state.
        const int hb = detail::home_by_magic(best, magic);
        const int32_t du = over ? 0 : need - moved;
        const int32_t dh = over ? moved - ex_hb : 0;  // an overshot donor's new deficit
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
            if (h_[j] == hb) {
                exd[j] = over ? 0 : exd[j] - moved;
                spd[j] += spread ? 1 : 0;
            }
            if (tid + kThreads * j == best) {
                av[j] -= moved;
                held[(j * HW + uw) * kThreads + tid] = hw[j] | ub;
            }
        }
        if (warp == kRankWarp) {
#pragma unroll
            for (int k = 0; k < kPlanFillRanksPerLane; ++k) {
                const int r = lane + kWarpSize * k;
                if (over && r == hb) def[k] = dh;
                if (r == u) def[k] = du, rem[k] += 1;
            }
        }
        if (tid == 0) at[n] = best * R + u, amount[n] = moved;
        ++n;
        // The next receiver: the first largest of u (new deficit), the runner-up, and an overshot donor.
        int nu = u;
        int32_t nd = du, nr = rem_u + 1;
        if (u2 >= 0 && (need2 > nd || (need2 == nd && u2 < nu))) nu = u2, nd = need2, nr = rem_u2;
        if (over && (dh > nd || (dh == nd && hb < nu))) nu = hb, nd = dh, nr = rem_hb;
        u = nu;
        need = nd;
        rem_u = nr;
    }
    // home_rem may alias expert_load (plan_cluster_fill stages it there, in other threads' words): every step's block
    // maximum orders the reads of expert_load above before these writes; a fill of no step (no rank short) has had no
    // barrier yet. (compute-sanitizer racecheck found it: a balanced histogram, cluster_optimized.)
    if (n == 0) group_barrier<kThreads, kBlock>();
#pragma unroll
    for (int j = 0; j < kJ; ++j)
        if (tid + kThreads * j < E) home_rem[tid + kThreads * j] = av[j];
    n_out = n;
    return result;
}

// Block 1 + v of the cluster: fill v (0: largest piece, 1: best fit, 2 and 3: the same with pushes spread). base0 is
// block 0's scratch (PlanScratchLayout, through distributed shared memory; carved only where used, so that its
// pointers do not stay live across the fill); smem this block's dynamic shared memory (PlanFillBlockLayout).
// NOTE: measured slower (twelfth session, same run): the fill on one warp kept per donor — lane r % 32 holds donor r's
// excess, pushes and largest expert in registers, a step reduces R donor keys (one reduction), scans the winning
// donor's experts lanes-over-experts for the tie-break (a second) and rescans the donor's largest expert (a third);
// the entries left in shared memory. R = 64 fills 50 -> 62.5 (largest piece) / 80 us (best fit: the smallest filling
// piece per donor is a scan every step), MoonEP 7.2 -> 9.8 / 14.4 us; bit-exact. Fewer keys do not help: the step is
// a chain of about seven dependent warp operations either way (reductions, ballot, shuffle, shared loads at ~100-180
// cycles each), as many as this block's two-stage maximum with its barrier.
// NOTE: not inlined on purpose: inlined into the cluster kernel (block 0's planner and the home rows in the same
// function), the fill's loop shared the kernel's 128 registers with values live across the roles and reloaded spilled
// values every step, from L2 when the 220 KiB of shared memory leaves L1 small; on its own it needs 96, no spills.
template <int kThreads>
__device__ __noinline__ void plan_cluster_fill(
    const PlanDims d, const int32_t* tpe_g, char* base0, char* smem, FillTpe tpe_mode, int v, int64_t* timing) {
    if constexpr (!detail::kPlannerStamps) timing = nullptr;
    constexpr int kWarps = kThreads / kWarpSize;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int R = d.R, E = d.E;
    const PlanFillBlockLayout fl = PlanFillBlockLayout::make(R, E, kPlanFillThreads);
    __shared__ uint64_t s_slots[2 * kWarps];
    __shared__ int s_n;
    __shared__ int32_t s_bcast[2], s_info[6];
    __shared__ unsigned long long s_total;
    int parity = 0;  // block_max_key's slot set (two calls here: the fill starts on set 0 again)
    // A: this block arrives at once and waits only where it first needs block 0's shared memory: with its own expert
    // loads and balances (below) that is after its fill, which then starts while block 0 still sums the histogram.
    cluster_arrive();
    bool waited_a = false;
    auto wait_a = [&] {
        if (!waited_a) cluster_wait(), waited_a = true;
    };
    // The histogram's copy and its largest entry (the keys' field width).
    const int64_t RE = static_cast<int64_t>(R) * E;
    if (tid == 0) s_total = 0;
    unsigned mx = 0;
    if (tpe_mode == FillTpe::kShared32) {
        int32_t* t = reinterpret_cast<int32_t*>(smem + fl.tpe);
        block_copy_batched<kThreads>(t, RE, [&](int64_t i) {
            const int32_t x = tpe_g[i];
            mx = max(mx, static_cast<unsigned>(x));
            return x;
        });
    } else if (tpe_mode == FillTpe::kShared16) {
        uint16_t* t = reinterpret_cast<uint16_t*>(smem + fl.tpe);
        block_copy_batched<kThreads>(t, RE, [&](int64_t i) {
            const int32_t x = tpe_g[i];
            mx = max(mx, static_cast<unsigned>(x));
            return static_cast<uint16_t>(x);
        });
    } else {
        for (int64_t i = tid; i < RE; i += kThreads) mx = max(mx, static_cast<unsigned>(tpe_g[i]));
    }
    const unsigned local_max = static_cast<unsigned>(block_max_key<kWarps, kThreads>(mx, s_slots, parity, lane, warp));
    // An entry >= 2^16 does not fit the uint16 copy: read the histogram in place instead.
    if (tpe_mode == FillTpe::kShared16 && local_max > 0xffffu) tpe_mode = FillTpe::kGlobal;
    if (d.locality) {
        const PlanScratchLayout l0 = PlanScratchLayout::make(R, E);
        const int cap = static_cast<int>(l0.piece_cap);
        uint32_t* held = reinterpret_cast<uint32_t*>(smem + fl.held);
        int32_t* at = reinterpret_cast<int32_t*>(smem + fl.at);
        int32_t* amount = reinterpret_cast<int32_t*>(smem + fl.amount);
        const bool best_fit = v % 2 == 1, spread = v >= 2;
        // The expert loads and balances (block 0's phase 1): summed from this block's histogram copy when it has one
        // (and without slack, whose targets come from block 0's sequential pass), else read from block 0 after A.
        const int64_t* load0;
        const int64_t* balance0;
        unsigned lm = 0;  // the largest expert load (bounds every piece: the keys' piece field)
        auto own_sums = [&](const auto* t) {
            int64_t* loads = reinterpret_cast<int64_t*>(smem + fl.loads);
            int64_t* bal = reinterpret_cast<int64_t*>(smem + fl.balance);
            unsigned long long part = 0;
            for (int e = tid; e < E; e += kThreads) {
                int32_t s = 0;
#pragma unroll 8
                for (int r = 0; r < R; ++r) s += t[static_cast<int64_t>(r) * E + e];
                loads[e] = s;
                lm = max(lm, static_cast<unsigned>(s));
                part += static_cast<unsigned long long>(s);
            }
            part = __reduce_add_sync(kFullMask, static_cast<unsigned>(part));  // < N < 2^31
            if (lane == 0 && part) atomicAdd(&s_total, part);
            __syncthreads();
            const int64_t total = static_cast<int64_t>(s_total);
            for (int r = warp; r < R; r += kWarps) {  // a warp per rank, as plan_block_parallel's phase 1
                const int64_t l = warp_rank_load(loads, r, d.epn, lane);
                if (lane == 0) bal[r] = l - detail::plan_even_quota(total, R, r);
            }
            __syncthreads();
            load0 = loads, balance0 = bal;
        };
        if (d.slack_ppm <= 0 && tpe_mode == FillTpe::kShared32) {
            own_sums(reinterpret_cast<const int32_t*>(smem + fl.tpe));
        } else if (d.slack_ppm <= 0 && tpe_mode == FillTpe::kShared16) {
            own_sums(reinterpret_cast<const uint16_t*>(smem + fl.tpe));
        } else {
            wait_a();  // block 0's expert_load and balance are complete
            load0 = reinterpret_cast<const int64_t*>(base0 + l0.expert_load);
            balance0 = reinterpret_cast<const int64_t*>(base0 + l0.balance);
            for (int e = tid; e < E; e += kThreads) lm = max(lm, static_cast<unsigned>(load0[e]));
        }
        const unsigned load_max =
            static_cast<unsigned>(block_max_key<kWarps, kThreads>(lm, s_slots, parity, lane, warp));
        FillKeyBits kb{};
        kb.id = max(1, bit_width32(static_cast<uint32_t>(E - 1)));
        kb.local = bit_width32(local_max);
        kb.piece = max(1, bit_width32(load_max));
        kb.push = spread ? bit_width32(static_cast<uint32_t>(cap)) : 0;  // pushes <= pieces <= cap
        kb.fbit = best_fit ? 1 : 0;
        // The fill's final entries left go to block 0 (list 1 + v's home column), staged in this block's loads (read
        // only before the fill's first step) while A is still to be waited for.
        int32_t* home_rem0 = reinterpret_cast<int32_t*>(base0 + l0.avail) + v * E;
        const bool staged = !waited_a;
        int32_t* home_rem = staged ? reinterpret_cast<int32_t*>(smem + fl.loads) : home_rem0;
        int iterations = 0, n = 0;
        auto run = [&](auto w_tag, const auto* tpe) {
            using W = decltype(w_tag);
            return block_global_fill<kPlanFillThreads, kPlanFillMaxJ, kThreads, W>(d, kb, spread, load0, balance0, tpe,
                                                                                   held, s_bcast, s_info, s_slots, at,
                                                                                   amount, home_rem, n, iterations);
        };
        // The fill runs on the first kPlanFillThreads threads (ep_layout.hpp); the others go to its end.
        auto run_w = [&](const auto* tpe) {
            if (tid >= kPlanFillThreads) return true;
            return kb.fits32() ? run(uint32_t{}, tpe) : run(uint64_t{}, tpe);
        };
        bool ok;
        // NOTE: one call site per histogram source, so that a shared-memory copy is read with shared loads.
        if (tpe_mode == FillTpe::kShared32) {
            ok = run_w(reinterpret_cast<const int32_t*>(smem + fl.tpe));
        } else if (tpe_mode == FillTpe::kShared16) {
            ok = run_w(reinterpret_cast<const uint16_t*>(smem + fl.tpe));
        } else {
            ok = run_w(tpe_g);
        }
        if (tid == 0) s_n = n;
        __syncthreads();
        n = s_n;
        wait_a();  // A: block 0 runs, and its phase 2 no longer touches what this block writes there
        if (staged)
            for (int e = tid; e < E; e += kThreads) home_rem0[e] = home_rem[e];
        const PlanScratch sc0 = carve_scratch(base0, R, E);
        int32_t* at0 = sc0.piece_at + (1 + v) * cap;
        int32_t* amount0 = sc0.piece_amount + (1 + v) * cap;
        for (int i = tid; i < n; i += kThreads) at0[i] = at[i], amount0[i] = amount[i];
        if (tid == 0) {
            sc0.npieces[1 + v] = n;
            sc0.fill_flags[v] = ok ? 1 : 0;
            if (timing != nullptr) {
                if (v < 2) timing[detail::kStampFillIterations + v] = iterations;
                stamp_time(timing, detail::kStampFillDone + v);
                stamp_max_time(timing, detail::kStampRolesDone);
            }
        }
    }
    wait_a();
    cluster_arrive();
    cluster_wait();  // B
}

// Block 5 + i of the cluster (i < nh): its share of the home route rows (plan_home.cuh), the crossing rows added into
// block 0's cross[R] (base0: block 0's scratch, as in plan_cluster_fill). smem: expert_load [E] int64, home [E], t_home
// [E] (this block's copies).
template <int kThreads>
__device__ __forceinline__ void plan_cluster_home(const PlanDims& d,
                                                  const int32_t* tpe_g,
                                                  const detail::PlanArrays& a,
                                                  char* base0,
                                                  char* smem,
                                                  int i,
                                                  int nh,
                                                  int64_t* timing) {
    if constexpr (!detail::kPlannerStamps) timing = nullptr;
    constexpr int kWarps = kThreads / kWarpSize;
    const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int E = d.E, epn = d.epn;
    int64_t* load = reinterpret_cast<int64_t*>(smem);
    int32_t* home = reinterpret_cast<int32_t*>(load + E);
    int32_t* t_home = home + E;
    for (int e = tid; e < E; e += kThreads) {
        const int h = e / epn;
        home[e] = h;
        t_home[e] = tpe_g[static_cast<int64_t>(h) * E + e];
    }
    cluster_arrive();
    cluster_wait();  // A
    const PlanScratch sc0 = carve_scratch(base0, d.R, E);
    for (int e = tid; e < E; e += kThreads) load[e] = sc0.expert_load[e];
    __syncthreads();
    warp_home_rows(d, tpe_g, a, load, home, t_home, sc0.cross, i * kWarps + warp, nh * kWarps, lane, false);
    if (lane == 0 && timing != nullptr) stamp_max_time(timing, detail::kStampHomeRowsDone);
    cluster_arrive();
    cluster_wait();  // B
}

// Where phase 4 writes the copy tree without relays (PlanScratch::relay_src, relay_round); null: not in phase 4.
struct CopyTreeOut {
    int32_t* src;
    int32_t* round;
};

// Blocks 1-7 of the cluster after barrier B: their share of phase 4a and 4b (plan_finish.cuh finish_warps) once
// block 0 has chosen the winner (barrier C), the group arrays in this block's own dynamic shared memory (its fill or
// home-row state is dead by then; the kernel's dynamic size holds block 0's layout areas). tpe_g: the histogram in
// global memory; tree: block 0's PlanScratch::relay_src and relay_round.
template <int kThreads>
__device__ __forceinline__ void plan_cluster_finish(const PlanDims& d,
                                                    const int32_t* tpe_g,
                                                    const detail::PlanArrays& a,
                                                    char* base0,
                                                    char* smem,
                                                    int block,
                                                    const CopyTreeOut& tree) {
    if (!finish_spread(d, true)) return;  // block 0 writes them alone
    const int E = d.E;
    cluster_arrive();
    cluster_wait();  // C
    const PlanScratch sc0 = carve_scratch(base0, d.R, E);
    const detail::SparseAlloc s0 = sparse_alloc(sc0, sc0.finish[0], E);
    // What 4a and 4b read, copied from block 0 (distributed shared memory, many loads in flight) into this block's
    // shared memory after the layout areas: the winner's home column, pieces and per-expert lists, home and t_home.
    // (Block 0's total holds the layout areas, 4 [E] and 3 [piece_cap] arrays, so the kernel's dynamic size does.)
    int32_t* area = reinterpret_cast<int32_t*>(smem);
    int32_t* home_rem = area + static_cast<size_t>(sc0.layout_warps) * sc0.group_words;
    int32_t* head = home_rem + E;
    int32_t* home = head + E;
    int32_t* t_home = home + E;
    int32_t* at = t_home + E;
    int32_t* amount = at + s0.n;
    int32_t* next = amount + s0.n;
    for (int e = threadIdx.x; e < E; e += kThreads) {
        const int32_t x0 = s0.home_rem[e], x1 = s0.head[e], x2 = sc0.home[e], x3 = sc0.t_home[e];
        home_rem[e] = x0, head[e] = x1, home[e] = x2, t_home[e] = x3;
    }
    for (int i = threadIdx.x; i < s0.n; i += kThreads) {
        const int32_t x0 = s0.piece_at[i], x1 = s0.piece_amount[i], x2 = s0.next[i];
        at[i] = x0, amount[i] = x1, next[i] = x2;
    }
    __syncthreads();
    PlanScratch sc = sc0;  // the counters (cross, cost_pushed, cost_remote, finish) stay block 0's
    sc.relay_src = tree.src;
    sc.relay_round = tree.round;
    sc.home = home;
    sc.t_home = t_home;
    detail::SparseAlloc sw{home_rem, at, amount, s0.n};
    sw.head = head;
    sw.next = next;
    sw.home_t = t_home;
    finish_warps<kThreads>(d, tpe_g, a, sc, sw, area, block, kPlanClusterBlocks);
    cluster_arrive();
    cluster_wait();  // D
}

}  // namespace evenep::cuda::device
