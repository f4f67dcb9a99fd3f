// `evenep bench layer` refuses bad flags before anything runs: exit code 2 and exactly one stderr line
// "evenep: error: ..." naming the flag (the binary built next to the tests, EVENEP_CLI_PATH). Runs on a CPU-only
// machine: every check comes before the device is looked for.
// Cases (BenchLayerRefuses/Flag.OneLineExitTwo/<case>):
//   maxvio_negative, maxvio_nan, k3_R_not_divisor, k3_R_zero, points_unknown, iters_zero, warmup_negative,
//   link_gbps_zero, ffn_hidden_not_multiple_of_8, drift_negative, redundant_below, json_is_dir, eplb_sync_unknown,
//   eplb_sync_twice, warm_seconds_negative, redundant_twice
//   all_refused   --quick --max-seconds 1: no GPU ("no CUDA device is usable" / "needs a CUDA build") or, on a GPU
//                 machine, every point refused by its time estimate — exit 2 either way, in seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"

namespace evenep {
namespace {

struct Case {
    std::string name, args;
    std::vector<std::string> needles;  // each must appear in the error line
};

std::vector<Case> cases() {
    return {
        {"maxvio_negative", "--maxvio -1", {"--maxvio"}},
        {"maxvio_nan", "--maxvio nan", {"--maxvio"}},
        {"k3_R_not_divisor", "--k3-R 5", {"--k3-R", "5"}},
        {"k3_R_zero", "--k3-R 0", {"--k3-R", "0"}},
        {"points_unknown", "--points moon", {"--points", "'moon'"}},
        {"iters_zero", "--iters 0", {"--iters"}},
        {"warmup_negative", "--warmup -2", {"--warmup"}},
        {"link_gbps_zero", "--link-gbps 0", {"--link-gbps"}},
        {"ffn_hidden_not_multiple_of_8", "--k3-ffn-hidden 100", {"--k3-ffn-hidden", "100"}},
        {"drift_negative", "--drift -0.5", {"--drift"}},
        {"redundant_below", "--redundant -2", {"--redundant"}},
        {"json_is_dir", "--json /tmp", {"--json"}},
        {"eplb_sync_unknown", "--eplb-sync mesh", {"--eplb-sync", "mesh"}},
        {"eplb_sync_twice", "--eplb-sync ring ring", {"--eplb-sync", "'ring'", "twice"}},
        {"warm_seconds_negative", "--warm-seconds -1", {"--warm-seconds"}},
        {"redundant_twice", "--redundant 2 2", {"--redundant", "2", "twice"}},
        {"all_refused", "--quick --max-seconds 1", {"bench layer"}},
    };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Flag : public ::testing::TestWithParam<Case> {};

TEST_P(Flag, OneLineExitTwo) {
    const Case& c = GetParam();
    const testing::CliRun run = testing::run_cli("bench layer " + c.args, /*merge_stderr=*/false, /*timeout_s=*/60);
    EXPECT_EQ(run.exit_code, 2) << c.args << "\nstderr: " << run.error;
    EXPECT_LT(run.seconds, 30) << c.args;
    ASSERT_FALSE(run.error.empty()) << c.args;
    EXPECT_EQ(run.error.rfind("evenep: error: ", 0), 0u) << run.error;
    EXPECT_EQ(std::count(run.error.begin(), run.error.end(), '\n'), 1) << "not one line: " << run.error;
    for (const std::string& n : c.needles) EXPECT_NE(run.error.find(n), std::string::npos) << n << " in: " << run.error;
}

INSTANTIATE_TEST_SUITE_P(BenchLayerRefuses, Flag, ::testing::ValuesIn(cases()), [](const auto& info) {
    return info.param.name;
});

}  // namespace
}  // namespace evenep
