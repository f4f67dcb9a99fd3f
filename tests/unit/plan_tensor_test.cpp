// The plan tensor's columns (evenep::plan_columns) and the CPU packing of a row (pack_plan_row). Cases:
//   Columns.FromTheArrayList     every per-rank array of at most 4-byte values, in for_each_array's order, contiguous;
//                                the int64 statistics and the other extents left out; counts 1 / E / G / B
//   Columns.RowLayoutByName      PlanRowLayout's offsets are the named columns'; width = plan_row_width
//   Columns.RowLayoutWithoutSlots B = 0: no `copies` column (no values), the layout still builds, copies = width
//   Pack.RowsHoldEachRanksShare  a real plan (R = 4, E = 8, B = 1 and B = epn): every column of row r equals the
//                                array's values at r*count (group_source widened), for every rank
//   Pack.BadRowSize              a row of the wrong size is refused with the sizes named
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/plan_tensor.hpp"

namespace evenep {
namespace {

Config small_config(int B) { return Config{.R = 4, .E = 8, .K = 2, .S = 6, .B = B, .tp = 1}; }

TEST(Columns, FromTheArrayList) {
    const Config cfg = small_config(-1);
    const std::vector<PlanColumn> cols = plan_columns(cfg);
    std::vector<std::string> expected;
    Plan p;
    for_each_array(p, [&](const char* name, PlanExtent x, const auto& v) {
        const bool per_rank =
            x == PlanExtent::kR || x == PlanExtent::kRE || x == PlanExtent::kRG || x == PlanExtent::kRB;
        if (per_rank && sizeof(typename std::decay_t<decltype(v)>::value_type) <= 4) expected.emplace_back(name);
    });
    ASSERT_EQ(cols.size(), expected.size());
    int64_t at = 0;
    for (size_t i = 0; i < cols.size(); ++i) {
        EXPECT_EQ(cols[i].name, expected[i]);
        EXPECT_EQ(cols[i].offset, at) << cols[i].name;
        const int64_t want = cols[i].extent == PlanExtent::kR    ? 1
                             : cols[i].extent == PlanExtent::kRE ? cfg.E
                             : cols[i].extent == PlanExtent::kRG ? cfg.num_groups()
                                                                 : cfg.num_slots();
        EXPECT_EQ(cols[i].count, want) << cols[i].name;
        at += cols[i].count;
    }
    EXPECT_EQ(plan_row_width(cfg), at);
    for (const char* absent : {"load_before", "crossing_out", "alloc", "expert_load"})
        for (const PlanColumn& c : cols) EXPECT_STRNE(c.name, absent);
    EXPECT_EQ(plan_column(cfg, "group_source").value_bytes, 1);
    EXPECT_THROW(plan_column(cfg, "alloc"), Error);
}

TEST(Columns, RowLayoutByName) {
    const Config cfg = small_config(1);
    const PlanRowLayout l = PlanRowLayout::make(cfg);
    EXPECT_EQ(l.width, plan_row_width(cfg));
    EXPECT_EQ(l.s, plan_column(cfg, "s").offset);
    EXPECT_EQ(l.tpe, plan_column(cfg, "tpe").offset);
    EXPECT_EQ(l.cu_seqlens, plan_column(cfg, "cu_seqlens").offset);
    EXPECT_EQ(l.group_count, plan_column(cfg, "group_count").offset);
    EXPECT_EQ(l.group_expert, plan_column(cfg, "group_expert").offset);
    EXPECT_EQ(l.group_source, plan_column(cfg, "group_source").offset);
    EXPECT_EQ(l.group_slot, plan_column(cfg, "group_slot").offset);
    EXPECT_EQ(l.copies, plan_column(cfg, "copies").offset);
    EXPECT_EQ(l.E, 8);
    EXPECT_EQ(l.G, 4);
    EXPECT_EQ(l.B, 1);
}

TEST(Columns, RowLayoutWithoutSlots) {
    const Config cfg = small_config(0);
    for (const PlanColumn& c : plan_columns(cfg)) EXPECT_STRNE(c.name, "copies");
    const PlanRowLayout l = PlanRowLayout::make(cfg);
    EXPECT_EQ(l.B, 0);
    EXPECT_EQ(l.copies, l.width);
    EXPECT_EQ(l.group_slot, plan_column(cfg, "group_slot").offset);
    EXPECT_THROW(plan_column(cfg, "copies"), Error);
}

TEST(Pack, RowsHoldEachRanksShare) {
    for (int B : {1, -1}) {
        const Config cfg = small_config(B);
        // Skewed routing: rank 0's experts get most entries, so the plan has copies.
        std::vector<int32_t> tpe(cfg.R * cfg.E, 0), s(cfg.R, 6);
        for (int r = 0; r < cfg.R; ++r) tpe[r * cfg.E + 0] = 5, tpe[r * cfg.E + 1] = 4, tpe[r * cfg.E + 2 + r] = 3;
        const Plan p = make_plan(cfg, PlannerMode::kOptimized, tpe, s);
        const int64_t W = plan_row_width(cfg);
        for (int r = 0; r < cfg.R; ++r) {
            std::vector<int32_t> row(W, -7);
            pack_plan_row(p, r, row);
            EXPECT_EQ(row[PlanRowLayout::make(cfg).s], 6);
            for_each_array(p, [&](const char* name, PlanExtent, const auto& v) {
                for (const PlanColumn& c : plan_columns(cfg)) {
                    if (std::strcmp(c.name, name) != 0) continue;
                    for (int64_t j = 0; j < c.count; ++j)
                        EXPECT_EQ(row[c.offset + j], static_cast<int32_t>(v[r * c.count + j]))
                            << name << "[" << r << "][" << j << "], B = " << B;
                }
            });
        }
    }
}

TEST(Pack, BadRowSize) {
    const Config cfg = small_config(-1);
    std::vector<int32_t> tpe(cfg.R * cfg.E, 1), s(cfg.R, 6);
    const Plan p = make_plan(cfg, PlannerMode::kOptimized, tpe, s);
    std::vector<int32_t> row(plan_row_width(cfg) + 1);
    try {
        pack_plan_row(p, 0, row);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::to_string(row.size())), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace evenep
