// evenep/detail/ep_layout.hpp — the layout of one virtual rank's symmetric allocation, defined once for host and
// device (an implementation detail of evenep/cuda/ep.hpp: the kernels and the plan download address through it).
//
// Every offset is a pure function of (R, E, K, S, tp, B, H, blocks per rank) — never of the
// routing (SPEC invariant 4). Host code sizes the allocation with total_bytes; kernels address objects through
// the same offsets (STYLE: buffer layout defined once, in an EVENEP_HOST_DEVICE struct).
#pragma once

#include <cstddef>
#include <cstdint>

#include "evenep/detail/buffer_layout.hpp"
#include "evenep/detail/host_device.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/detail/plan_core.hpp"
#include "evenep/detail/plan_relay.hpp"
#include "evenep/plan.hpp"

namespace evenep::cuda {

inline constexpr size_t kLayoutAlign = 256;

// The byte offset of one plan array of element type T inside the rank's allocation; converts to size_t.
template <typename T>
struct PlanOffset {
    using value_type = T;
    size_t at = 0;
    EVENEP_HOST_DEVICE constexpr operator size_t() const { return at; }
};

// Byte offsets of a plan's arrays inside the rank's allocation (sizes as in evenep/plan.hpp), plus the planner's
// workspace. Each rank holds its own copy of the whole plan (decentralised planning, SPEC §3). The array members
// carry the names of Plan's arrays: evenep::for_each_array visits them, so the offsets derive from the one list.
struct PlanOffsets {
    PlanOffset<int32_t> s, tpe, q, alloc, local_keep, rest_prefix, cap_prefix, seg_row, group_expert, group_count,
        cu_seqlens, group_slot, copies, relay_src, relay_round, remote_experts, copies_received, copies_pushed, peer_reads;
    PlanOffset<int64_t> expert_load, load_before, crossing_out;
    PlanOffset<int8_t> group_source;  // WeightSource values
    size_t cost;                      // [kPlanCostWords] int64: PlanCost in declaration order, then Plan::slack_ppm
    size_t work64, work32;          // planner workspace (int64 / int32 words)
    size_t num_work64, num_work32;  // their sizes in words
    size_t scratch;                 // PlanScratchLayout bytes (the block planner's state when not in smem)
    size_t timing;                  // [32] int64: phase timestamps and loop counts (benchmark breakdown)
    size_t gate;                    // [1] int32: 1 once the gather launch put the rank's gathered histogram in tpe
};

// int64 words of the device copy of PlanCost (6 words in declaration order), then the plan's budget Plan::slack_ppm.
inline constexpr int kPlanCostWords = 7;
inline constexpr int kPlanCostSlackWord = 6;

// Planner workspace sizes (words of work64 / work32): the serial planner kernel's PlanWork (plan_candidates.hpp
// plan_work64_size / plan_work32_size, within these) and the copy tree post-pass (plan_relay.hpp, in work32). The block
// planner keeps its state in PlanScratchLayout instead.
struct PlanWorkSize {
    EVENEP_HOST_DEVICE static constexpr size_t num_words64(int R, int E) {
        return static_cast<size_t>(R) * R + 5 * static_cast<size_t>(R) + 3 * static_cast<size_t>(E) + 14;
    }
    EVENEP_HOST_DEVICE static constexpr size_t num_words32(int R, int E) {
        // The serial planner kernel (plan_candidates.hpp PlanWork: plan_work32_size = 6*E*R + 3*R);
        // the copy tree post-pass (plan_relay.hpp) at most 2*R*R*B + 2*E + 3*R <= 2*E*R + 2*E + 3*R (B <= epn).
        const size_t planner = 6 * static_cast<size_t>(E) * R + 8 * static_cast<size_t>(R) + 16;
        const size_t relay = static_cast<size_t>(detail::plan_relay_work_size(R, E, E / R));
        return planner > relay ? planner : relay;
    }
};

// The block planner's hot state (plan_block.cuh) as one byte range: in dynamic shared memory when it fits (the
// kernels check against the device's opt-in limit), else carved the same way from the rank's global workspace.
inline constexpr int kPlanMaxWarps = 16;  // warps of the block planner (512 threads)

struct PlanScratchLayout {
    // int64
    size_t balance, expert_load, path_load;
    // int32 (every count and amount here is bounded by the group's entries N < 2^31)
    size_t remaining, excess, deficit, avail, path_left, home, t_home, fill_remote, spread, order, path_q, cost_pushed,
        cost_remote, cross, xfer, npieces, fill_flags, finish, piece_at, piece_amount, held, head, next, warp_area, tpe;
    size_t piece_cap;   // pieces per candidate (a bound, see make)
    size_t held_words;  // words of one receiver's held bitset (max(32, ceil(E / 32)): a word per lane up to E = 1024)
    size_t split_words;   // int32 words of one warp's split area (phase 2: a donor's transfers, 2R)
    size_t group_words;   // int32 words of one layout warp's area (phase 4: 5 x [G] group arrays + 3 x [epn])
    size_t layout_warps;  // warps that build the segment layout (their areas share warp_area with the split's)
    size_t core;        // bytes without the tpe copy
    size_t total;       // bytes with it
    EVENEP_HOST_DEVICE static constexpr PlanScratchLayout make(int R, int E) {
        PlanScratchLayout l{};
        const size_t r = static_cast<size_t>(R), e = static_cast<size_t>(E), epn = e / r, G = 2 * epn;
        // Pieces of one alloc matrix: the reference split makes one per exhausted expert or finished transfer
        // (<= E + R); a fill one per exhausted expert, finished donor or filled receiver, receivers included that
        // an overshoot creates (<= E + 3R); a path at most epn per receiver (<= E).
        l.piece_cap = e + 3 * r;
        l.held_words = (e + 31) / 32 > 32 ? (e + 31) / 32 : 32;
        l.split_words = 2 * r;
        l.group_words = 5 * G + 3 * epn;  // layout: 5 x [G] group arrays + the rank's remote pieces
        // At most 48 KiB of layout areas: large G (few ranks, many experts: R = 8, E = 896 has G = 224) gets fewer
        // layout warps instead of a state that no longer fits in shared memory.
        const size_t fit = (48 * 1024 / 4) / l.group_words;
        l.layout_warps = fit >= static_cast<size_t>(kPlanMaxWarps) ? kPlanMaxWarps : fit < 1 ? 1 : fit;
        size_t o = 0;
        l.balance = o, o += 8 * r;
        l.expert_load = o, o += 8 * e;
        l.path_load = o, o += 8 * 2 * r;      // [2][R] the paths' copies of load_before
        l.remaining = o, o += 4 * e;          // the reference split's home column
        l.excess = o, o += 4 * 4 * r;         // [4][R] per fill (candidates 0-3 of plan_alloc_mode)
        l.deficit = o, o += 4 * 4 * r;
        l.avail = o, o += 4 * 4 * e;          // [4][E] the fills' home columns
        l.path_left = o, o += 4 * 2 * e;      // [2][E] the paths' home columns
        l.home = o, o += 4 * e;               // [E] e / epn (no integer division in the hot loops)
        l.t_home = o, o += 4 * e;             // [E] t[home(e)][e]
        l.fill_remote = o, o += 4 * 6 * r;    // [6][R] remote experts per receiver, per candidate
        l.spread = o, o += 4 * 2 * r;         // [2][R] pushes per donor of fills 2 and 3
        l.order = o, o += 4 * 2 * r;          // [2][R] the paths' rank order
        l.path_q = o, o += 4 * 2 * r;         // [2][R] the paths' copies of q
        l.cost_pushed = o, o += 4 * 7 * r;    // [7][R] reference + six candidates
        l.cost_remote = o, o += 4 * 7 * r;
        l.cross = o, o += 4 * r;              // [R] crossing rows per source rank
        l.xfer = o, o += 4 * 3 * r + 4;       // the reference transfers: [3][R] (donor, receiver, amount) + count
        l.npieces = o, o += 4 * 8;            // [7] pieces per alloc matrix
        l.fill_flags = o, o += 4 * 8;         // [4] whether fill v succeeded (written by the cluster's fill blocks)
        l.finish = o, o += 4 * 8;             // phase 4: [0] the chosen list, [1] moved entries (plan_finish.cuh)
        l.piece_at = o, o += 4 * 7 * l.piece_cap;      // [7][cap] e * R + u
        l.piece_amount = o, o += 4 * 7 * l.piece_cap;  // [7][cap]
        // The fills' held bitsets (phase 2) and the pieces' per-expert lists (phases 3-4) share one range.
        const size_t held = 4 * 4 * r * l.held_words, lists = 4 * 7 * e + 4 * 7 * l.piece_cap;
        l.held = o, l.head = o, l.next = o + 4 * 7 * e, o += held > lists ? held : lists;
        const size_t split_area = static_cast<size_t>(kPlanMaxWarps) * l.split_words;
        const size_t layout_area = l.layout_warps * l.group_words;
        l.warp_area = o, o += 4 * (split_area > layout_area ? split_area : layout_area);
        l.core = detail::align_up(o, 16);
        l.tpe = l.core;
        l.total = detail::align_up(l.core + 4 * r * e, 16);
        return l;
    }
};

// The planner as a thread-block cluster (plan_cluster.cuh): block 0 runs plan_block_parallel without its global
// fills and home route rows; blocks 1-4 run one global fill each and blocks 5-7 write the home route rows. Byte offsets
// of a fill block's dynamic shared memory: its per-thread held bitsets, its pieces, its own expert loads and balances,
// and optionally its copy of the histogram (int32, or uint16 when every entry is < 2^16, else read from global memory).
inline constexpr int kPlanClusterBlocks = 8;
inline constexpr int kPlanClusterFills = 4;      // blocks 1..4
// Phase 4a and 4b (the winner's route rows and layouts) spread over the cluster's blocks from this many ranks on.
// Measured (H200, E = 896): at R = 8 and 16 the layouts already have a warp per rank on block 0 and the hand-off (two
// cluster barriers, the helpers' copies of the winner) costs more than the spread saves; from R = 32 on the spread
// wins (R = 64: 25 -> 10 us).
inline constexpr int kPlanClusterFinishMinRanks = 32;
// Block 0 alone (below kPlanClusterFinishMinRanks, and the one-block planner): the warps that write the moved
// experts' route rows while the layouts run beside them on the top min(layout_warps, R) warps; 0 = one after the
// other on every warp (when the layouts would leave fewer than a quarter of the block's warps for the route rows).
EVENEP_HOST_DEVICE constexpr int plan_finish_route_warps(int R, int layout_warps) {
    const int lw = layout_warps < R ? layout_warps : R;
    return kPlanMaxWarps - lw >= kPlanMaxWarps / 4 ? kPlanMaxWarps - lw : 0;
}
inline constexpr int kPlanFillThreads = 512;     // threads of a fill block that run its fill (the rest wait)
inline constexpr int kPlanFillMaxJ = 1024 / kPlanFillThreads;  // experts per fill thread (E <= 1024)
inline constexpr int kPlanFillRanksPerLane = 4;  // ranks a lane keeps in registers (R <= 128)
struct PlanFillBlockLayout {
    size_t held, at, amount, loads, balance, tpe;
    size_t per_thread;  // experts per thread (J)
    size_t held_words;  // ceil(R / 32): words of one expert's receiver bitset
    size_t core;        // bytes without the histogram copy
    size_t with_tpe32, with_tpe16;
    EVENEP_HOST_DEVICE static constexpr PlanFillBlockLayout make(int R, int E, int threads) {
        PlanFillBlockLayout l{};
        const size_t r = static_cast<size_t>(R), e = static_cast<size_t>(E), t = static_cast<size_t>(threads);
        l.per_thread = (e + t - 1) / t;
        l.held_words = (r + 31) / 32;
        const size_t cap = PlanScratchLayout::make(R, E).piece_cap;  // pieces of one fill
        size_t o = 0;
        l.held = o, o += 4 * l.per_thread * l.held_words * t;
        l.at = o, o += 4 * cap;
        l.amount = o, o += 4 * cap;
        l.loads = o, o += 8 * e;    // int64 [E] the expert loads, from this block's histogram copy
        l.balance = o, o += 8 * r;  // int64 [R] the ranks' balances, the same way
        l.core = detail::align_up(o, 16);
        l.tpe = l.core;
        l.with_tpe32 = detail::align_up(l.core + 4 * r * e, 16);
        l.with_tpe16 = detail::align_up(l.core + 2 * r * e, 16);
        return l;
    }
};

// One virtual rank's allocation: the communication buffer shared with the CPU backend (detail::BufferLayout:
// recv_x, recv_w, recv_next, recv_ret, gather, stage — same offsets, same encodings), followed by what the GPU
// keeps on the device instead of the host: the plan arrays, the planner workspace, the contiguous gathered
// histogram, the per-block histograms and the encoded destinations.
struct EpLayout {
    int R, E, K, S, tp, B, epn, G, H;
    int max_blocks;  // blocks per rank the plan kernel may use (per-block histogram chunks)
    int slack_ppm;   // imbalance budget (Config::slack_ppm): sizes nvs and is passed to the planner
    // Auto policy (Config::policy kAuto; docs/auto.md): each plan chooses its budget in [0, slack_ppm] with these
    // coefficients. Not part of the offsets: set by the Ep after make (Ep::check_and_layout, Ep::set_auto_model).
    bool auto_slack = false;
    detail::AutoCostModel auto_model = {};
    // DataPrecision::bf16_partials (set by the Ep after make, not part of the offsets): combine's partials of chains of
    // >= 2 entries are rounded to bf16 (and cross as bf16 in push mode), as cpu::Buffer's combine.
    bool bf16_partials = false;
    int64_t nvs;     // receive rows per rank (SPEC invariant 4, grown by the slack bound)
    detail::BufferLayout buf;
    size_t plan_begin;  // start of the plan region (hist, dst, the plan arrays; ends at plan.work64)
    size_t tpe;   // [R*E] int32: every rank's histogram, contiguous (the plan's tpe, = plan.tpe)
    size_t hist;  // [max_blocks*E] int32: per-block histograms, then their exclusive prefix over blocks
    size_t dst;   // [S*K] int32: encoded destinations of this rank's entries (SPEC §3.4)
    PlanOffsets plan;
    size_t total_bytes;

    // Host only (the offsets come from evenep::for_each_array); kernels receive the finished struct. fp8: the buffer
    // gains recv_x8 / recv_scale (BufferConfig::precision.fp8, same offsets as the CPU backend's).
    static EpLayout make(
        int R, int E, int K, int S, int tp, int B, int H, int max_blocks, int slack_ppm, bool fp8 = false) {
        EpLayout l{};
        l.R = R, l.E = E, l.K = K, l.S = S, l.tp = tp, l.B = B, l.epn = E / R, l.G = 2 * (E / R), l.H = H;
        l.max_blocks = max_blocks;
        l.slack_ppm = slack_ppm;
        l.buf = detail::BufferLayout::make(R, E, K, S, tp, H, slack_ppm, fp8);
        l.nvs = l.buf.num_recv_rows;
        size_t o = static_cast<size_t>(l.buf.total_bytes);
        auto take = [&o](size_t bytes) {
            const size_t at = o;
            o = detail::align_up(o + bytes, kLayoutAlign);
            return at;
        };
        l.plan_begin = o;
        l.hist = take(4 * static_cast<size_t>(max_blocks) * E);
        l.dst = take(4 * static_cast<size_t>(S) * K);
        PlanOffsets& p = l.plan;
        p.cost = take(8 * kPlanCostWords);
        Config cfg;
        cfg.R = R, cfg.E = E, cfg.K = K, cfg.S = S, cfg.tp = tp, cfg.B = B;
        for_each_array(p, [&](const char*, PlanExtent x, auto& off) {
            const size_t n = plan_extent_size(cfg, x);
            off.at = take(sizeof(typename std::decay_t<decltype(off)>::value_type) * (n > 0 ? n : 1));
        });
        l.tpe = p.tpe;
        p.num_work64 = PlanWorkSize::num_words64(R, E);
        p.num_work32 = PlanWorkSize::num_words32(R, E);
        p.work64 = take(8 * p.num_work64);
        p.work32 = take(4 * p.num_work32);
        p.scratch = take(PlanScratchLayout::make(R, E).total);
        p.timing = take(8 * 32);
        p.gate = take(4);
        l.total_bytes = o;
        return l;
    }

    // Regions of the communication buffer, as byte offsets.
    EVENEP_HOST_DEVICE size_t recv_x() const { return static_cast<size_t>(buf.recv_x_offset); }
    EVENEP_HOST_DEVICE size_t recv_w() const { return static_cast<size_t>(buf.recv_w_offset); }
    EVENEP_HOST_DEVICE size_t recv_next() const { return static_cast<size_t>(buf.recv_next_offset); }
    EVENEP_HOST_DEVICE size_t recv_ret() const { return static_cast<size_t>(buf.recv_ret_offset); }
    EVENEP_HOST_DEVICE size_t gather() const { return static_cast<size_t>(buf.gather_offset); }
    EVENEP_HOST_DEVICE size_t stage() const { return static_cast<size_t>(buf.stage_offset); }
    EVENEP_HOST_DEVICE size_t recv_x8() const { return static_cast<size_t>(buf.recv_x8_offset); }        // fp8 only
    EVENEP_HOST_DEVICE size_t recv_scale() const { return static_cast<size_t>(buf.recv_scale_offset); }  // fp8 only

    EVENEP_HOST_DEVICE detail::PlanDims dims(bool locality) const {
        return detail::PlanDims{R, E, epn, G, B, tp, locality, slack_ppm, auto_slack, auto_model};
    }

    template <typename T>
    EVENEP_HOST_DEVICE static T* at(char* base, size_t off) {
        return reinterpret_cast<T*>(base + off);
    }

    EVENEP_HOST_DEVICE detail::PlanArrays plan_arrays(char* base) const {
        const PlanOffsets& p = plan;
        return detail::PlanArrays{at<int64_t>(base, p.expert_load),
                                  at<int64_t>(base, p.load_before),
                                  at<int32_t>(base, p.q),
                                  at<int32_t>(base, p.alloc),
                                  at<int32_t>(base, p.local_keep),
                                  at<int32_t>(base, p.rest_prefix),
                                  at<int32_t>(base, p.cap_prefix),
                                  at<int32_t>(base, p.seg_row),
                                  at<int32_t>(base, p.group_expert),
                                  at<int32_t>(base, p.group_count),
                                  at<int32_t>(base, p.cu_seqlens),
                                  at<int8_t>(base, p.group_source),
                                  at<int32_t>(base, p.group_slot),
                                  at<int32_t>(base, p.copies),
                                  at<int32_t>(base, p.remote_experts),
                                  at<int32_t>(base, p.copies_received),
                                  at<int32_t>(base, p.copies_pushed),
                                  at<int32_t>(base, p.peer_reads),
                                  at<int64_t>(base, p.crossing_out)};
    }

    EVENEP_HOST_DEVICE detail::PlanRouteView route_view(char* base) const {
        return detail::PlanRouteView{R,
                                     E,
                                     nvs,
                                     at<int32_t>(base, plan.local_keep),
                                     at<int32_t>(base, plan.rest_prefix),
                                     at<int32_t>(base, plan.cap_prefix),
                                     at<int32_t>(base, plan.seg_row)};
    }
};

}  // namespace evenep::cuda
