// The host planner: input checks, candidate selection for optimized mode, and the per-rank token -> slot map.
// The algorithm itself lives in evenep/detail/plan_core.hpp and plan_candidates.hpp, shared with the GPU planner.
#include <algorithm>
#include <cstdint>

#include "evenep/detail/plan_candidates.hpp"
#include "evenep/detail/plan_relay.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"

namespace evenep {
namespace {

template <typename T>
void resize_fill(std::vector<T>& v, size_t n, T value = T{}) {
    v.assign(n, value);
}

detail::PlanDims dims_of(const Config& cfg, PlannerMode mode, const detail::AutoCostModel& auto_model) {
    return detail::PlanDims{cfg.R,
                            cfg.E,
                            cfg.epn(),
                            cfg.num_groups(),
                            cfg.num_slots(),
                            cfg.tp,
                            mode == PlannerMode::kOptimized,
                            cfg.slack_ppm(),
                            cfg.policy == PlannerPolicy::kAuto,
                            auto_model};
}

void size_plan(Plan& p, const Config& cfg) {
    for_each_array(p, [&](const char*, PlanExtent x, auto& v) { v.resize(plan_extent_size(cfg, x)); });
}

detail::PlanArrays arrays_of(Plan& p) {
    return detail::PlanArrays{p.expert_load.data(),
                              p.load_before.data(),
                              p.q.data(),
                              p.alloc.data(),
                              p.local_keep.data(),
                              p.rest_prefix.data(),
                              p.cap_prefix.data(),
                              p.seg_row.data(),
                              p.group_expert.data(),
                              p.group_count.data(),
                              p.cu_seqlens.data(),
                              reinterpret_cast<int8_t*>(p.group_source.data()),
                              p.group_slot.data(),
                              p.copies.data(),
                              p.remote_experts.data(),
                              p.copies_received.data(),
                              p.copies_pushed.data(),
                              p.peer_reads.data(),
                              p.crossing_out.data()};
}

}  // namespace

void check_plan_inputs(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s, const char* who) {
    const int R = cfg.R, E = cfg.E;
    EVENEP_CHECK(tpe.size() == static_cast<size_t>(R) * E, who, ": tpe has ", tpe.size(), " values, expected R*E = ",
                 static_cast<int64_t>(R) * E);
    EVENEP_CHECK(s.size() == static_cast<size_t>(R), who, ": s has ", s.size(), " values, expected R = ", R);
    for (int r = 0; r < R; ++r) {
        EVENEP_CHECK(s[r] >= 1 && s[r] <= cfg.S, who, ": rank ", r, ": s = ", s[r], " outside [1, S = ", cfg.S, "]");
        int64_t row = 0;
        for (int e = 0; e < E; ++e) {
            const int32_t v = tpe[static_cast<size_t>(r) * E + e];
            EVENEP_CHECK(v >= 0, who, ": rank ", r, ": tpe[", e, "] = ", v, " is negative");
            row += v;
        }
        EVENEP_CHECK(row <= static_cast<int64_t>(s[r]) * cfg.K, who, ": rank ", r, ": ", row,
                     " routed entries exceed s*K = ", static_cast<int64_t>(s[r]) * cfg.K);
    }
}

int64_t Plan::total_entries() const {
    int64_t n = 0;
    for (int64_t t : expert_load) n += t;
    return n;
}

Planner::Planner(const Config& cfg, PlannerMode mode, bool extended_candidates)
    : cfg_(cfg), mode_(mode), extended_(extended_candidates), auto_model_(detail::default_auto_cost_model()) {
    cfg_.validate();
    work64_.resize(detail::plan_work64_size(cfg_.R, cfg_.E));
    work32_.resize(std::max<int64_t>(detail::plan_work32_size(cfg_.R, cfg_.E),
                                     detail::plan_relay_work_size(cfg_.R, cfg_.E, cfg_.num_slots())));
    size_plan(scratch_, cfg_);
}

void Planner::plan(std::span<const int32_t> tpe, std::span<const int32_t> s, Plan& out) {
    check_plan_inputs(cfg_, tpe, s, "plan");
    const int R = cfg_.R;
    size_plan(out, cfg_);
    out.cfg = cfg_;
    out.mode = mode_;
    std::copy(s.begin(), s.end(), out.s.begin());
    std::copy(tpe.begin(), tpe.end(), out.tpe.begin());
    detail::PlanDims d = dims_of(cfg_, mode_, auto_model_);
    detail::PlanArrays a = arrays_of(out);
    detail::PlanCostValues cost{};
    out.slack_ppm = detail::plan_sequential(d, tpe.data(), a, detail::PlanWork{work64_.data(), work32_.data()},
                                            /*legacy=*/!extended_, cost);
    for (int r = 0; r < R; ++r)
        EVENEP_ASSERT(out.remote_experts[r] <= cfg_.epn(), "plan: rank ", r, " holds ", out.remote_experts[r],
                      " remote experts > epn = ", cfg_.epn());
    const detail::RelayPaths paths =
        detail::plan_relays(detail::RelayDims{R, cfg_.E, cfg_.epn(), cfg_.num_slots()}, out.copies.data(),
                            out.relay_src.data(), out.relay_round.data(), work32_.data(), relay_);
    out.cost = PlanCost{cost.max_rank_copy_traffic, cost.total_copies, cost.crossing_rows, cost.moved_entries,
                        paths.critical_path, paths.direct_critical_path};
}

Plan make_plan(const Config& cfg, PlannerMode mode, std::span<const int32_t> tpe, std::span<const int32_t> s) {
    Planner planner(cfg, mode);
    Plan plan;
    planner.plan(tpe, s, plan);
    return plan;
}

void compute_tpe(const Config& cfg, int rank, std::span<const int32_t> topk_idx, int s, std::span<int32_t> tpe_out) {
    EVENEP_CHECK(s >= 0 && s <= cfg.S, "routing: rank ", rank, ": s = ", s, " outside [0, S = ", cfg.S, "]");
    EVENEP_CHECK(topk_idx.size() >= static_cast<size_t>(s) * cfg.K, "routing: rank ", rank, ": topk_idx has ",
                 topk_idx.size(), " ids, expected s*K = ", static_cast<int64_t>(s) * cfg.K);
    EVENEP_CHECK(tpe_out.size() == static_cast<size_t>(cfg.E), "routing: tpe_out has ", tpe_out.size(),
                 " slots, expected E = ", cfg.E);
    std::fill(tpe_out.begin(), tpe_out.end(), 0);
    for (int t = 0; t < s; ++t)
        for (int k = 0; k < cfg.K; ++k) {
            const int32_t e = topk_idx[static_cast<size_t>(t) * cfg.K + k];
            if (e == -1) continue;
            EVENEP_CHECK(e >= 0 && e < cfg.E, "routing: rank ", rank, ", token ", t, ", k ", k, ": expert id ", e,
                         " outside [0, E = ", cfg.E, ") (use -1 to mask)");
            ++tpe_out[e];
        }
}

void compute_dst(const Plan& plan, int rank, std::span<const int32_t> topk_idx, std::span<int32_t> dst_out) {
    const Config& cfg = plan.cfg;
    const int R = cfg.R, E = cfg.E, K = cfg.K;
    EVENEP_CHECK(rank >= 0 && rank < R, "dst: rank ", rank, " outside [0, R = ", R, ")");
    const int s = plan.s[rank];
    EVENEP_CHECK(dst_out.size() >= static_cast<size_t>(s) * K, "dst: rank ", rank, ": output has ", dst_out.size(),
                 " slots, expected s*K = ", static_cast<int64_t>(s) * K);
    std::vector<int32_t> pos(E, 0);
    compute_tpe(cfg, rank, topk_idx, s, pos);
    for (int e = 0; e < E; ++e)
        EVENEP_CHECK(pos[e] == plan.tpe_at(rank, e), "dst: rank ", rank, ": topk_idx routes ", pos[e],
                     " entries to expert ", e, " but the plan's histogram says ", plan.tpe_at(rank, e));
    std::fill(pos.begin(), pos.end(), 0);
    const detail::PlanRouteView v{R, E, cfg.recv_rows(), plan.local_keep.data(), plan.rest_prefix.data(),
                                  plan.cap_prefix.data(), plan.seg_row.data()};
    int32_t seen[detail::kMaxTopK];
    for (int t = 0; t < s; ++t) {
        int num_seen = 0;
        for (int k = 0; k < K; ++k) {
            const size_t i = static_cast<size_t>(t) * K + k;
            const int32_t e = topk_idx[i];
            if (e < 0) {
                dst_out[i] = detail::kMaskedDst;
                continue;
            }
            const int32_t dst = detail::plan_entry_dst(v, rank, e, pos[e]++);
            const int32_t dst_rank = static_cast<int32_t>(dst / cfg.recv_rows());
            bool dup = false;
            for (int j = 0; j < num_seen; ++j) dup = dup || seen[j] == dst_rank;
            if (!dup) seen[num_seen++] = dst_rank;
            dst_out[i] = dup ? detail::encode_duplicate(dst) : dst;
        }
    }
}

void check_group_tokens(const Config& cfg, std::span<const int32_t> s, int64_t s_total) {
    EVENEP_CHECK(static_cast<int>(s.size()) == cfg.R, "dispatch: s has ", s.size(), " values, expected R = ", cfg.R);
    int64_t sum = 0;
    for (int r = 0; r < cfg.R; ++r) {
        EVENEP_CHECK(s[r] >= 1 && s[r] <= cfg.S, "dispatch: rank ", r, ": s = ", s[r], " outside [1, S = ", cfg.S,
                     "]");
        sum += s[r];
    }
    if (s_total < 0) {
        for (int r = 1; r < cfg.R; ++r)
            EVENEP_CHECK(s[r] == s[0], "dispatch: rank ", r, " passes s = ", s[r], " but rank 0 passes s = ", s[0],
                         "; pass s_total (the group total) when ranks have different token counts");
    } else {
        EVENEP_CHECK(sum == s_total, "dispatch: the ranks pass ", sum, " tokens in total but s_total = ", s_total);
    }
}

int theorem2_lower_bound(int E, int R) {
    const int64_t num = static_cast<int64_t>(E) * (R - 1), den = static_cast<int64_t>(R) * R;
    return static_cast<int>((num + den - 1) / den);
}

}  // namespace evenep
