// evenep/plan.hpp — the balanced plan (SPEC §3) and the planner that builds it.
//
// A Plan is a pure function of (tpe of all ranks, s of all ranks, Config, PlannerMode) (SPEC invariant 5).
// Every rank computes the same Plan from the all-gathered histograms; each rank then computes the encoded
// destinations of its own entries with compute_dst() from its own topk_idx, with no further communication.
//
// Array conventions: row-major, sizes in brackets; G = 2*epn groups per rank, B = cfg.num_slots().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/detail/plan_auto_model.hpp"

namespace evenep {

// Where the expert weights of one receive-buffer group are read from by the expert GEMM.
enum class WeightSource : int8_t {
    kEmpty = 0,  // group holds no rows
    kLocal = 1,  // one of this rank's own experts
    kSlot = 2,   // a prefetched copy in prefetch slot group_slot
    kPeer = 3,   // inference with B < epn: read through the peer mapping from the home rank
};

// The three costs of SPEC §3.1 plus moved entries. Copy counts are in expert-weight units.
struct PlanCost {
    int64_t max_rank_copy_traffic = 0;  // max_r (copies received by r + copies of r's experts placed elsewhere)
    int64_t total_copies = 0;           // sum_r remote experts on r (prefetched + peer-read)
    int64_t crossing_rows = 0;          // entries computed on a rank other than their source rank
    int64_t moved_entries = 0;          // entries computed on a rank other than their expert's home
    // Copy critical path (docs/relayed-prefetch.md): rounds of the plan's copy schedule, every rank
    // sending at most one expert weight and receiving at most one per round. Without relays it equals
    // direct_critical_path = max_r max(copies pushed by r, copies received by r).
    int64_t copy_critical_path = 0;    // of the plan's copy tree (relay_src, relay_round)
    int64_t direct_critical_path = 0;  // of direct pushes from the home ranks
};

struct Plan {
    Config cfg;
    PlannerMode mode = PlannerMode::kOptimized;
    // The imbalance budget (ppm) this plan was made with: cfg.slack_ppm() under the fixed policy, the step's choice in
    // [0, cfg.slack_ppm()] under auto (docs/auto.md). The plan is the slack planner's plan for this budget.
    int32_t slack_ppm = 0;

    std::vector<int32_t> s;    // [R] tokens each rank passes
    std::vector<int32_t> tpe;  // [R*E] tpe[r*E + e]: unmasked entries of rank r routed to expert e
    std::vector<int64_t> expert_load;  // [E] T_e = sum_r tpe[r][e]
    std::vector<int64_t> load_before;  // [R] entries homed on r: sum of T_e over r's experts
    std::vector<int32_t> q;            // [R] entries computed on r (SPEC invariant 1)

    std::vector<int32_t> alloc;       // [E*R] alloc[e*R + r]: entries of expert e computed on rank r
    std::vector<int32_t> local_keep;  // [E*R] entries of e whose source rank r also computes them (0 in reference)
    std::vector<int32_t> rest_prefix; // [E*(R+1)] prefix over source ranks of tpe - local_keep
    std::vector<int32_t> cap_prefix;  // [E*(R+1)] prefix over destination ranks of alloc - local_keep
    std::vector<int32_t> seg_row;     // [R*E] first row of expert e's segment on rank r, -1 if none

    std::vector<int32_t> group_expert;  // [R*G] expert id of each group, -1 if empty
    std::vector<int32_t> group_count;   // [R*G] rows holding entries (unpadded)
    std::vector<int32_t> cu_seqlens;    // [R*G] inclusive padded end offset of each group
    std::vector<WeightSource> group_source;  // [R*G]
    std::vector<int32_t> group_slot;    // [R*G] prefetch slot of a kSlot group, else -1

    std::vector<int32_t> copies;          // [R*B] expert id held in each prefetch slot, -1 if empty
    std::vector<int32_t> relay_src;       // [R*B] rank the slot's copy comes from (the home: a direct push), -1 empty
    std::vector<int32_t> relay_round;     // [R*B] round of the copy schedule it arrives in (1-based), 0 if empty
    std::vector<int32_t> remote_experts;  // [R] non-home experts computed on r (<= epn)
    std::vector<int32_t> copies_received; // [R] prefetched copies held by r (<= B)
    std::vector<int32_t> copies_pushed;   // [R] prefetched copies of r's experts held elsewhere
    std::vector<int32_t> peer_reads;      // [R] remote experts read through the peer mapping (B < epn)
    std::vector<int64_t> crossing_out;    // [R] entries of source rank r computed elsewhere
    PlanCost cost;

    int R() const { return cfg.R; }
    int E() const { return cfg.E; }
    int G() const { return cfg.num_groups(); }
    int64_t total_entries() const;  // N
    int32_t alloc_at(int expert, int rank) const { return alloc[static_cast<size_t>(expert) * cfg.R + rank]; }
    int32_t tpe_at(int rank, int expert) const { return tpe[static_cast<size_t>(rank) * cfg.E + expert]; }
    // First row of group g on rank r (exclusive prefix of cu_seqlens).
    int32_t group_begin(int rank, int g) const { return g == 0 ? 0 : cu_seqlens[static_cast<size_t>(rank) * G() + g - 1]; }
    int32_t group_end(int rank, int g) const { return cu_seqlens[static_cast<size_t>(rank) * G() + g]; }
    // Padding rows of group g on rank r: [group_begin + group_count, group_end); zero-filled by dispatch.
    int32_t rows_used(int rank) const { return group_end(rank, G() - 1); }
};

// Extent of a plan array: its shape as a function of the configuration.
enum class PlanExtent : int8_t {
    kR,        // [R]
    kE,        // [E]
    kRE,       // [R*E] (row-major by rank)
    kER,       // [E*R] (row-major by expert)
    kEPrefix,  // [E*(R+1)] (a prefix over ranks per expert)
    kRG,       // [R*G]
    kRB,       // [R*B]
};

// Number of values of an array of extent `x` under `cfg`.
inline size_t plan_extent_size(const Config& cfg, PlanExtent x) {
    const size_t R = cfg.R, E = cfg.E, G = cfg.num_groups(), B = cfg.num_slots();
    switch (x) {
        case PlanExtent::kR: return R;
        case PlanExtent::kE: return E;
        case PlanExtent::kRE:
        case PlanExtent::kER: return R * E;
        case PlanExtent::kEPrefix: return E * (R + 1);
        case PlanExtent::kRG: return R * G;
        case PlanExtent::kRB: return R * B;
    }
    return 0;
}

// Where an array goes in the plan JSON (docs/plan-schema.md): a top-level key, a key of "per_rank", or not written.
enum class PlanJson : int8_t { kNone, kTop, kPerRank };

namespace detail {
template <typename F, typename V>
void visit_plan_array(F& f, const char* name, PlanExtent x, PlanJson j, V& v) {
    if constexpr (std::is_invocable_v<F&, const char*, PlanExtent, V&, PlanJson>)
        f(name, x, v, j);
    else
        f(name, x, v);
}
}  // namespace detail

// The plan's arrays, listed once: calls f(name, extent, array) — or f(name, extent, array, json) when f takes four
// arguments — for each array of `plan`, in this order. `plan` is a Plan (const or not) or any struct with members of
// the same names (the device offsets, cuda::PlanOffsets). Sizing (the planner), validation, the device offsets, the
// device plan download and the plan JSON (keys in this order within their section) all derive from this list:
// adding an array is one line here plus its member.
template <typename PlanT, typename F>
void for_each_array(PlanT& plan, F&& f) {
    using J = PlanJson;
    detail::visit_plan_array(f, "s", PlanExtent::kR, J::kTop, plan.s);
    detail::visit_plan_array(f, "tpe", PlanExtent::kRE, J::kTop, plan.tpe);
    detail::visit_plan_array(f, "expert_load", PlanExtent::kE, J::kNone, plan.expert_load);
    detail::visit_plan_array(f, "load_before", PlanExtent::kR, J::kPerRank, plan.load_before);
    detail::visit_plan_array(f, "q", PlanExtent::kR, J::kTop, plan.q);
    detail::visit_plan_array(f, "alloc", PlanExtent::kER, J::kTop, plan.alloc);
    detail::visit_plan_array(f, "local_keep", PlanExtent::kER, J::kNone, plan.local_keep);
    detail::visit_plan_array(f, "rest_prefix", PlanExtent::kEPrefix, J::kNone, plan.rest_prefix);
    detail::visit_plan_array(f, "cap_prefix", PlanExtent::kEPrefix, J::kNone, plan.cap_prefix);
    detail::visit_plan_array(f, "seg_row", PlanExtent::kRE, J::kNone, plan.seg_row);
    detail::visit_plan_array(f, "group_expert", PlanExtent::kRG, J::kTop, plan.group_expert);
    detail::visit_plan_array(f, "cu_seqlens", PlanExtent::kRG, J::kTop, plan.cu_seqlens);
    detail::visit_plan_array(f, "group_count", PlanExtent::kRG, J::kTop, plan.group_count);
    detail::visit_plan_array(f, "group_source", PlanExtent::kRG, J::kTop, plan.group_source);
    detail::visit_plan_array(f, "group_slot", PlanExtent::kRG, J::kNone, plan.group_slot);
    detail::visit_plan_array(f, "copies", PlanExtent::kRB, J::kTop, plan.copies);
    detail::visit_plan_array(f, "relay_src", PlanExtent::kRB, J::kTop, plan.relay_src);
    detail::visit_plan_array(f, "relay_round", PlanExtent::kRB, J::kTop, plan.relay_round);
    detail::visit_plan_array(f, "remote_experts", PlanExtent::kR, J::kPerRank, plan.remote_experts);
    detail::visit_plan_array(f, "copies_received", PlanExtent::kR, J::kPerRank, plan.copies_received);
    detail::visit_plan_array(f, "copies_pushed", PlanExtent::kR, J::kPerRank, plan.copies_pushed);
    detail::visit_plan_array(f, "peer_reads", PlanExtent::kR, J::kPerRank, plan.peer_reads);
    detail::visit_plan_array(f, "crossing_out", PlanExtent::kR, J::kPerRank, plan.crossing_out);
}

// Builds plans for one configuration and mode. Construction sizes all workspace; plan() does not allocate
// once `out` has been used for the same configuration (its vectors are reused).
class Planner {
public:
    // `extended_candidates` (optimized mode only; the default): also try the overshooting, push-spreading and path
    // candidates of plan_core.hpp (plan_alloc_mode). It lowers copies and the busiest rank's copy traffic
    // (docs/quality.md); the GPU planner mirrors it. false = the two global fills of the first release (`legacy`),
    // kept only to measure what the extension buys; the GPU planner does not implement it.
    Planner(const Config& cfg, PlannerMode mode, bool extended_candidates = true);

    // tpe: [R*E] all ranks' histograms; s: [R] tokens per rank (1 <= s_r <= S, tpe row sums <= s_r*K).
    // Throws evenep::Error naming the rank and value on inconsistent input.
    void plan(std::span<const int32_t> tpe, std::span<const int32_t> s, Plan& out);

    // Relayed prefetch (docs/relayed-prefetch.md): let ranks that received a copy forward it when that shortens the copy
    // critical path. Off by default (every copy pushed by its home, as the published planner); the GPU planner
    // takes the same switch (cuda::EpOptions::relay) and fills the same arrays.
    void set_relay(bool relay) { relay_ = relay; }
    bool relay() const { return relay_; }

    // The auto policy's step-cost coefficients (docs/auto.md; used only when config().policy is kAuto). Default:
    // detail::default_auto_cost_model() (the MoonEP layer, H = 7168, H' = 2048, tp = 128), as cuda::EpOptions'.
    void set_auto_model(const detail::AutoCostModel& model) { auto_model_ = model; }
    const detail::AutoCostModel& auto_model() const { return auto_model_; }

    const Config& config() const { return cfg_; }
    PlannerMode mode() const { return mode_; }

private:
    Config cfg_;
    PlannerMode mode_;
    bool extended_;
    bool relay_ = false;
    detail::AutoCostModel auto_model_;
    std::vector<int64_t> work64_;
    std::vector<int32_t> work32_;
    Plan scratch_;
};

// Convenience: one plan, allocating.
Plan make_plan(const Config& cfg, PlannerMode mode, std::span<const int32_t> tpe, std::span<const int32_t> s);

// Histogram of one rank's routing. topk_idx: [s*K], -1 masked. tpe_out: [E], overwritten.
// Throws evenep::Error naming rank, token, k and value for an id outside [-1, E).
void compute_tpe(const Config& cfg, int rank, std::span<const int32_t> topk_idx, int s, std::span<int32_t> tpe_out);

// Encoded flat destinations (SPEC §3.4) of rank `rank`'s entries. topk_idx: [s_rank*K]; dst_out: [s_rank*K].
// Checks that topk_idx's histogram equals plan.tpe's row for `rank` (throws naming the expert otherwise).
void compute_dst(const Plan& plan, int rank, std::span<const int32_t> topk_idx, std::span<int32_t> dst_out);

// The group's token counts (SPEC §1, §8): every s_r in [1, S]; without a group total (s_total < 0) all ranks pass the
// same s, otherwise the s_r add up to s_total. Throws evenep::Error naming the rank and values.
void check_group_tokens(const Config& cfg, std::span<const int32_t> s, int64_t s_total);

// The planners' input check (Planner::plan, the exact solver): tpe [R*E] non-negative with row r summing to at most
// s_r*K, s [R] in [1, S]. Throws evenep::Error whose message starts with `who` and names the rank and value.
void check_plan_inputs(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s, const char* who);

// Theorem 2 (appendix E): with rank 0's experts receiving nothing and all other experts sharing all tokens
// evenly, rank 0 needs at least ceil(E*(R-1)/R^2) remote experts.
int theorem2_lower_bound(int E, int R);

}  // namespace evenep
