// The plan tensor's columns (evenep/plan.hpp plan_columns), derived from the one list of plan arrays
// (evenep::for_each_array), and the CPU packing of one rank's row.
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/plan_tensor.hpp"

namespace evenep {

std::vector<PlanColumn> plan_columns(const Config& cfg) {
    std::vector<PlanColumn> cols;
    const Plan shape;  // for_each_array needs an object; only the names, extents and value types are read
    for_each_plan_column(cfg, shape, [&](const PlanColumn& c, const auto&) { cols.push_back(c); });
    return cols;
}

int64_t plan_row_width(const Config& cfg) {
    const std::vector<PlanColumn> cols = plan_columns(cfg);
    return cols.empty() ? 0 : cols.back().offset + cols.back().count;
}

PlanColumn plan_column(const Config& cfg, const char* name) {
    for (const PlanColumn& c : plan_columns(cfg))
        if (std::strcmp(c.name, name) == 0) return c;
    EVENEP_CHECK_KIND(ErrorKind::kInternal, false, "plan tensor: no column ", name);
    return {};
}

PlanRowLayout PlanRowLayout::make(const Config& cfg) {
    PlanRowLayout l{};
    l.width = plan_row_width(cfg);
    l.E = cfg.E, l.G = cfg.num_groups(), l.B = cfg.num_slots();
    const std::pair<const char*, int64_t*> named[] = {
        {"s", &l.s},
        {"tpe", &l.tpe},
        {"group_expert", &l.group_expert},
        {"cu_seqlens", &l.cu_seqlens},
        {"group_count", &l.group_count},
        {"group_source", &l.group_source},
        {"group_slot", &l.group_slot},
        {"copies", &l.copies},
    };
    // NOTE: without slots (B = 0) `copies` has no values and so no column: its offset points past the row and nothing
    // reads it (every reader loops over B of them).
    for (const auto& [name, at] : named)
        *at = l.B == 0 && std::strcmp(name, "copies") == 0 ? l.width : plan_column(cfg, name).offset;
    return l;
}

void pack_plan_row(const Plan& plan, int rank, std::span<int32_t> row) {
    const Config& cfg = plan.cfg;
    EVENEP_CHECK(rank >= 0 && rank < cfg.R, "pack_plan_row: rank ", rank, " outside [0, R = ", cfg.R, ")");
    EVENEP_CHECK(static_cast<int64_t>(row.size()) == plan_row_width(cfg), "pack_plan_row: row of ", row.size(),
                 " values, expected ", plan_row_width(cfg));
    for_each_plan_column(cfg, plan, [&](const PlanColumn& c, const auto& v) {
        EVENEP_CHECK_KIND(ErrorKind::kInternal, static_cast<int64_t>(v.size()) == c.count * cfg.R,
                          "pack_plan_row: plan array ", c.name, " has ", v.size(), " values, expected ",
                          c.count * cfg.R);
        for (int64_t j = 0; j < c.count; ++j)
            row[c.offset + j] = static_cast<int32_t>(v[static_cast<size_t>(rank * c.count + j)]);
    });
}

}  // namespace evenep
