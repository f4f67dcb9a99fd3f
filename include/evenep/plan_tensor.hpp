// evenep/plan_tensor.hpp — the plan as a tensor: the columns of one rank's row, derived from the one list of plan
// arrays (evenep::for_each_array), and the CPU packing of a row. Used by the PyTorch ops (python/csrc, exported to
// python/evenep/buffer.py by the plan_columns op) and the CUDA packing (evenep/cuda/expert_ops.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/plan.hpp"

namespace evenep {

// The plan as a tensor (the PyTorch ops' plan, python/evenep): int32 [R, plan_row_width(cfg)], row r = rank r's
// share of every per-rank array of the Plan with values of at most 4 bytes (extent kR: 1 value, kRE: E, kRG: G,
// kRB: B, from index r*count), in for_each_array's order; the int64 statistics (load_before, crossing_out) and
// the arrays of other extents are not in it. The whole Plan is a pure function of the gathered (s, tpe) (SPEC
// invariant 5), both of which the rows hold. plan_columns derives the columns from for_each_array, so the CPU
// packing (pack_plan_row), the CUDA packing (cuda::pack_plan) and the Python PlanLayout share one definition.
struct PlanColumn {
    const char* name;    // the Plan array's name (for_each_array)
    PlanExtent extent;   // kR, kRE, kRG or kRB
    int64_t offset;      // first column of the array's range in a row
    int64_t count;       // values of one rank: 1, E, G or B
    int value_bytes;     // bytes of one value in the Plan (and in the device plan): 1 (WeightSource) or 4
};
std::vector<PlanColumn> plan_columns(const Config& cfg);
// Values of one rank's share of an array of extent x; 0 when the array is not per rank.
inline int64_t plan_rank_count(const Config& cfg, PlanExtent x) {
    switch (x) {
        case PlanExtent::kR: return 1;
        case PlanExtent::kRE: return cfg.E;
        case PlanExtent::kRG: return cfg.num_groups();
        case PlanExtent::kRB: return cfg.num_slots();
        default: return 0;
    }
}

// Calls f(column, array) for each array of `plan` the tensor holds, in list order (`plan`: a Plan, or the device
// offsets cuda::PlanOffsets, as for for_each_array). plan_columns and both packings derive from it.
template <typename PlanT, typename F>
void for_each_plan_column(const Config& cfg, PlanT& plan, F&& f) {
    int64_t offset = 0;
    for_each_array(plan, [&](const char* name, PlanExtent x, auto& v) {
        constexpr int kBytes = sizeof(typename std::decay_t<decltype(v)>::value_type);
        const int64_t count = plan_rank_count(cfg, x);
        if (kBytes > 4 || count == 0) return;  // the int64 statistics, the arrays that are not per rank
        f(PlanColumn{name, x, offset, count, kBytes}, v);
        offset += count;
    });
}

int64_t plan_row_width(const Config& cfg);
// The column range of array `name`; throws evenep::Error (kInternal) for a name the tensor does not hold.
PlanColumn plan_column(const Config& cfg, const char* name);
// Rank `rank`'s row of the plan tensor: row [plan_row_width(plan.cfg)] int32 (int8 values sign-extended).
void pack_plan_row(const Plan& plan, int rank, std::span<int32_t> row);

// The columns of the plan tensor that the ops and the device functions read (evenep::cuda expert_ops.hpp), as
// offsets into a row: looked up by name in plan_columns, never written out. A plain struct (kernels take it by value).
struct PlanRowLayout {
    int64_t width;  // plan_row_width
    int64_t s, tpe, group_expert, cu_seqlens, group_count, group_source, group_slot, copies;  // first columns
    int E, G, B;
    static PlanRowLayout make(const Config& cfg);
};

}  // namespace evenep
