// evenep/cpu/buffer.hpp — the CPU reference data path of one rank: dispatch, combine and their backward
// (SPEC §4.1–4.3). It defines what every GPU kernel must produce, bit for bit.
//
// One cpu::Buffer per rank, constructed collectively on a Team (every rank of the group, same BufferConfig).
// It owns the rank's symmetric communication buffer (evenep/detail/buffer_layout.hpp) and a Planner. All
// collective calls (dispatch, combine, ...) must be made by every rank in the same order; each returns when this
// rank's part is complete.
//
// Exact semantics (the contract the CUDA backend reproduces):
//   dispatch   every rank computes tpe from its topk_idx, all-gathers (s_r, tpe) through the buffer, plans
//              redundantly (same Plan on every rank) and computes its encoded destinations dst (compute_dst).
//              For each token, the first entry per destination rank writes the bf16 row into that rank's
//              recv_x; every entry writes its fp32 weight, chain link and return address (buffer_layout.hpp).
//              Destinations then zero their padding rows (payload, weight) and copy each chain head row into
//              the chain's duplicate rows. Rows past cu_seqlens[last] are left untouched.
//   combine    each destination, for each chain head in row order, forms the token's partial over the chain
//              in k-ascending order: p = 0.0f; p += v_k (v_k = w_k * y_k with apply_weights, else y_k, each
//              product rounded to fp32 separately: no FMA). A single-entry chain sends its bf16 row unchanged;
//              a longer chain sends p in fp32 (no bf16 rounding). The source then computes, per token,
//              acc = 0.0f; acc += partial_j for its destinations j in the order of their first k (a bf16 partial
//              is widened exactly and, with apply_weights, multiplied by the entry's weight first),
//              and writes bf16_rn(acc). A token with no unmasked entry gets +0.
//   FP8 (cfg.precision.fp8; docs/fp8.md)   the planning dispatch sends each token row once per destination rank as
//              e4m3 codes + one fp32 scale per 128 channels (evenep/detail/fp8.hpp, quantised once per token at
//              the source) into recv_x8/recv_scale instead of recv_x; padding rows get codes +0 and scale 0,
//              duplicates copy their head's codes and scales; recv_x is not written. A non-finite x is refused
//              before any payload moves (the message names rank, token and channel). The plan-reusing dispatch
//              (combine_backward: gradients) stays bf16 into recv_x.
//   bf16 partials (cfg.precision.bf16_partials)   combine sends a chain of >= 2 entries as bf16_rn(p) in one
//              unit (the same staging address) instead of fp32 p; the source adds it widened, unweighted. One
//              more rounding per such partial; half its bytes.
//   gathered weights   gathered_w[t*K + k] = recv_w[row(t, k)] on the entry's destination; 0 for masked entries.
//   backward   combine_backward(h, g) = dispatch(h, g) (plan reused, no planning);
//              dispatch_backward(h, gx, gw) = combine(h, gx, apply_weights = false) plus the gathered gw.
//
// Errors: bad input on any rank (shape mismatch, s outside [1, S], expert id outside [-1, E), a caller
// histogram that disagrees with topk_idx, inconsistent s without a group total) makes every rank throw
// evenep::Error before any payload moves; the offending rank's message names the value, the others' start
// with "peer rank N". A rank that never arrives makes the others throw Error(kTimeout) naming it. After any
// error the buffer is usable for the next call (a failed dispatch invalidates the handles dispatched before).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/plan.hpp"
#include "evenep/team.hpp"

namespace evenep::cpu {

struct DispatchArgs {
    int s = 0;                          // tokens of this rank, 1..S
    std::span<const Bf16> x;            // [s*H]
    std::span<const int32_t> topk_idx;  // [s*K], -1 = masked
    std::span<const float> topk_w;      // [s*K] route weights (masked entries ignored)
    int64_t s_total = -1;               // sum of s over ranks when they differ; -1: every rank passes the same s
    std::span<const int32_t> tpe = {};  // optional caller histogram [E], checked against topk_idx
};

// What one dispatch decided, owned by the caller and passed to combine and the backward calls (plan reuse).
struct DispatchHandle {
    Plan plan;                  // the group plan (identical on every rank)
    std::vector<int32_t> dst;   // [s*K] encoded destinations of this rank's entries (SPEC §3.4)
    std::vector<float> topk_w;  // [s*K] route weights as dispatched
    int rank = -1;
    int s = 0;
    uint64_t id = 0;  // stamp of the dispatch that last filled the buffer with this handle's rows

    int num_groups() const { return plan.G(); }
    // This rank's receive-buffer groups: [G] inclusive padded end rows, rows holding entries, expert ids.
    std::span<const int32_t> cu_seqlens() const { return group_span(plan.cu_seqlens); }
    std::span<const int32_t> group_count() const { return group_span(plan.group_count); }
    std::span<const int32_t> group_expert() const { return group_span(plan.group_expert); }
    int32_t rows_used() const { return plan.rows_used(rank); }

  private:
    std::span<const int32_t> group_span(const std::vector<int32_t>& v) const {
        return std::span<const int32_t>(v).subspan(static_cast<size_t>(rank) * plan.G(), plan.G());
    }
};

struct CombineArgs {
    std::span<const Bf16> y = {};      // [NvS*H] expert outputs on this rank; empty: the buffer's recv_x
    bool apply_weights = false;        // multiply each entry by its route weight
    std::span<Bf16> out;               // [s*H]
    std::span<float> gathered_w = {};  // optional [s*K]: recv_w of each entry's row, 0 for masked entries
};

class Buffer {
  public:
    // Collective. Throws evenep::Error on a bad config or a team whose size differs from cfg.R.
    Buffer(Team& team, const BufferConfig& cfg, PlannerMode mode = PlannerMode::kOptimized);
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    int rank() const { return rank_; }
    const BufferConfig& config() const { return cfg_; }
    const detail::BufferLayout& layout() const { return layout_; }
    BufferSizes sizes() const { return buffer_sizes(cfg_); }
    PlannerMode mode() const { return planner_.mode(); }
    // The auto policy's step-cost coefficients of this buffer's planner (Planner::set_auto_model; docs/auto.md): set
    // them as the caller's other planners of the same group (all of a group's planners must plan the same plan).
    void set_auto_model(const detail::AutoCostModel& model) { planner_.set_auto_model(model); }
    Team& team() const { return team_; }

    // Plans and dispatches (collective). The returned handle's rows are in recv_x()/recv_w() until the next
    // dispatch into this buffer.
    DispatchHandle dispatch(const DispatchArgs& args);
    // Dispatches x ([s*H]) again with h's plan and weights, no planning (collective). Used by combine_backward.
    void dispatch(DispatchHandle& h, std::span<const Bf16> x);
    // Collective. `h` must be the handle of the last dispatch into this buffer.
    void combine(const DispatchHandle& h, const CombineArgs& args);
    // SPEC §4.3.
    void combine_backward(DispatchHandle& h, std::span<const Bf16> grad_out) { dispatch(h, grad_out); }
    // grad_recv_x: [NvS*H] gradient rows on this rank (empty: the buffer's recv_x); grad_recv_w: [NvS] gradient
    // of each row's route weight (empty: the buffer's recv_w as it is). grad_x: [s*H]; grad_topk_w: [s*K] or
    // empty.
    void dispatch_backward(const DispatchHandle& h,
                           std::span<const Bf16> grad_recv_x,
                           std::span<const float> grad_recv_w,
                           std::span<Bf16> grad_x,
                           std::span<float> grad_topk_w);

    // Zero-copy views of this rank's receive buffer: [NvS*H] rows and [NvS] weights in group order.
    std::span<Bf16> recv_x();
    std::span<float> recv_w();
    // FP8 receive rows: [NvS*H] e4m3 codes and [NvS*H/128] scales (empty spans without precision.fp8).
    std::span<Fp8E4m3> recv_x8();
    std::span<float> recv_scale();
    // Chain metadata (for tests and backend ports): [NvS] each, see buffer_layout.hpp.
    std::span<const int32_t> recv_next() const;
    std::span<const int32_t> recv_ret() const;

    // Transfers this rank performed in its last collective call (from/to every rank; sum over ranks for the
    // group figure). The all-gather of the last dispatch is reported separately.
    const PhaseTraffic& last_traffic() const { return traffic_; }
    const PhaseTraffic& last_gather_traffic() const { return gather_traffic_; }
    // Seconds spent planning (checks of the gathered (s, tpe), plan, dst) in the last planning dispatch, without
    // the all-gather itself.
    double last_plan_seconds() const { return plan_seconds_; }

  private:
    template <typename T>
    T* at(int peer, int64_t offset) const {
        return reinterpret_cast<T*>(peers_[static_cast<size_t>(peer)] + offset);
    }
    void plan_from_gather(const DispatchArgs& a, DispatchHandle& h);
    // fp8: the rows go as e4m3 + scales (the planning dispatch with precision.fp8), else bf16.
    void write_payloads(const DispatchHandle& h, std::span<const Bf16> x, bool fp8);
    void fill_local_rows(const DispatchHandle& h, bool fp8);
    // combine; with new_recv_w non-empty, first replaces this rank's recv_w rows (dispatch_backward).
    void combine_impl(const DispatchHandle& h,
                      const CombineArgs& a,
                      std::span<const float> new_recv_w,
                      const char* call);

    Team& team_;
    BufferConfig cfg_;
    detail::BufferLayout layout_;
    int rank_ = 0;
    Planner planner_;
    SymmetricWindow window_;
    std::vector<std::byte*> peers_;  // [R] base of every rank's copy
    uint64_t next_id_ = 1;
    uint64_t filled_id_ = 0;  // id of the handle whose rows are in the buffer (0: none)
    PhaseTraffic traffic_;
    PhaseTraffic gather_traffic_;
    double plan_seconds_ = 0;
    std::vector<int32_t> tpe_scratch_;  // [R*E]
    std::vector<int32_t> s_scratch_;    // [R]
    std::vector<float> acc_scratch_;    // [H]
    std::vector<Fp8E4m3> x8_scratch_;   // [H] one token row in e4m3 (fp8)
    std::vector<float> scale_scratch_;  // [H/128] its scales (fp8)
};

}  // namespace evenep::cpu
