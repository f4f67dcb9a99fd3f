// The benchmarks' --check (perf/cuda/data_path.cpp, perf/cuda/multi.cpp) runs the CPU oracle on a slice of 8
// columns instead of all H: dispatch copies whole rows and combine works column by column, so the slice run must
// give exactly those columns of the full run. This test pins that down on the oracle itself.
//
// Cases:
//   OracleSlice.EqualsColumnsOfFullRun/<R>_<K>   dispatch (used receive rows, weights) and combine (with and without
//                                                weights) of an 8-column slice equal the full H = 64 run's columns.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

class OracleSlice : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(OracleSlice, EqualsColumnsOfFullRun) {
    const auto [R, K] = GetParam();
    constexpr int H = 64, C = 8;
    const std::vector<int> cols{0, 1, 2, 3, H / 4, H / 2, H - 2, H - 1};
    const BufferConfig full = testing::buffer_config(R, 8 * R, K, 96, 4, H);
    BufferConfig slice = full;
    slice.H = C;
    const Routing routing = make_lognormal(RoutingSpec{R, full.cfg.E, K, full.cfg.S, 5}, 1.2);
    const std::vector<cpu::RankTokens> tokens = testing::random_tokens(full, routing, 5);
    std::vector<cpu::RankTokens> sliced = tokens;
    for (int r = 0; r < R; ++r) {
        sliced[r].x.assign(static_cast<size_t>(tokens[r].s) * C, Bf16{0});
        for (int t = 0; t < tokens[r].s; ++t)
            for (int j = 0; j < C; ++j)
                sliced[r].x[static_cast<size_t>(t) * C + j] = tokens[r].x[static_cast<size_t>(t) * H + cols[j]];
    }
    auto same_columns = [&](const std::vector<Bf16>& f, const std::vector<Bf16>& s, int64_t rows) {
        int64_t bad = 0;
        for (int64_t i = 0; i < rows; ++i)
            for (int j = 0; j < C; ++j)
                bad += !(f[static_cast<size_t>(i) * H + cols[j]] == s[static_cast<size_t>(i) * C + j]);
        return bad;
    };

    const cpu::GroupDispatchResult df = cpu::dispatch_group(full, tokens);
    const cpu::GroupDispatchResult ds = cpu::dispatch_group(slice, sliced);
    for (int r = 0; r < R; ++r) {
        const int64_t rows = df.plan.rows_used(r);
        EXPECT_EQ(same_columns(df.recv_x[r], ds.recv_x[r], rows), 0) << "dispatch rank " << r;
        for (int64_t i = 0; i < rows; ++i) ASSERT_EQ(df.recv_w[r][i], ds.recv_w[r][i]) << "rank " << r << " row " << i;
    }
    for (bool apply : {false, true}) {
        const cpu::GroupCombineResult cf = cpu::combine_group(full, tokens, {}, apply);
        const cpu::GroupCombineResult cs = cpu::combine_group(slice, sliced, {}, apply);
        for (int r = 0; r < R; ++r)
            EXPECT_EQ(same_columns(cf.out[r], cs.out[r], tokens[r].s), 0) << "combine rank " << r << " apply " << apply;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes,
                         OracleSlice,
                         ::testing::Values(std::make_tuple(2, 2), std::make_tuple(4, 4), std::make_tuple(8, 8)),
                         [](const auto& info) {
                             std::ostringstream os;  // (GCC 12 warns falsely on "R" + std::to_string)
                             os << "R" << std::get<0>(info.param) << "_K" << std::get<1>(info.param);
                             return os.str();
                         });

}  // namespace
}  // namespace evenep
