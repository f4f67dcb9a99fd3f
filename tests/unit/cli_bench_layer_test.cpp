// `evenep bench layer` refuses bad flags before anything runs: exit code 2 and exactly one stderr line
// "evenep: error: ..." naming the flag (the binary built next to the tests, EVENEP_CLI_PATH). Runs on a CPU-only
// machine: every check comes before the device is looked for.
// Cases (BenchLayerRefuses/Flag.OneLineExitTwo/<case>):
//   maxvio_negative, maxvio_nan, k3_R_not_divisor, k3_R_zero, points_unknown, iters_zero, warmup_negative,
//   link_gbps_zero, ffn_hidden_not_multiple_of_8, drift_negative, redundant_below, json_is_dir, eplb_sync_unknown,
//   eplb_sync_twice, warm_seconds_negative, redundant_twice, policy_unknown, policy_exact_with_slack (--policy exact
//   --slack 0.1), policy_slack_without_budget, slack_over_one, micro_batches_zero (--fp8 --micro-batches 0),
//   micro_batches_without_fp8 (--micro-batches 2 on the maxvio grid: it applies to --fp8 or --workload)
//   all_refused   --quick --max-seconds 1: no GPU ("no CUDA device is usable" / "needs a CUDA build") or, on a GPU
//                 machine, every point refused by its time estimate — exit 2 either way, in seconds.
// Cases (BenchLayerWorkloadRefuses/Flag.OneLineExitTwo/<case>), --workload W | --trace F.npy:
//   with_maxvio, with_quick, with_check, steps_zero, two_sync_models, unknown_workload, workload_and_trace,
//   steps_without_workload, timed_ranks_zero, micro_batches_with_trace, trace_missing, trace_R_mismatch (R = 4),
//   trace_E_mismatch (E = 128), trace_float (<f4), trace_2d, trace_count_over_S (9000 > S = 8192),
//   trace_row_over_SK (9 x 8192 > S K = 65536 at MoonEP), trace_k3_R_not_given (a K3 R = 16 trace, --k3-R 8),
//   json_is_dir (--json /tmp: every shape's FILE_<shape>.json checked before the device),
//   all_refused (--workload burst --max-seconds 1: no GPU, or every shape refused by its estimate),
//   policy_exact (--policy exact: the run plans evenep_auto beside evenep_exact), slack_negative
// BenchLayerHelp.PolicyDefaultsToAuto: --help shows --policy (default auto) and --slack.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"
#include "evenep/io.hpp"
#include "evenep/trace.hpp"

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
        {"policy_unknown", "--policy fast", {"--policy", "fast"}},
        {"policy_exact_with_slack", "--policy exact --slack 0.1", {"--policy exact", "--slack = 0.1"}},
        {"policy_slack_without_budget", "--policy slack", {"--policy slack", "--slack"}},
        {"slack_over_one", "--slack 2", {"--slack", "2"}},
        {"all_refused", "--quick --max-seconds 1", {"bench layer"}},
        {"micro_batches_zero", "--fp8 --micro-batches 0", {"--micro-batches", "0"}},
        {"micro_batches_without_fp8", "--micro-batches 2", {"--micro-batches", "--fp8"}},
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

const std::filesystem::path& trace_dir() {
    static const std::filesystem::path dir = testing::temp_dir("cli_bench_layer_test", "traces");
    return dir;
}

// Removes the trace files when the tests end.
class TraceDirCleanup : public ::testing::Environment {
  public:
    void TearDown() override { std::filesystem::remove_all(trace_dir()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TraceDirCleanup);

// Trace files of the workload cases, written once per process: name -> path.
std::string trace_file(const std::string& name) {
    const std::filesystem::path& dir = trace_dir();
    const std::string path = (dir / (name + ".npy")).string();
    if (std::filesystem::exists(path)) return path;
    const auto counts = [](int T, int R, int E, int32_t fill) {
        return RouterTrace{.T = T, .L = 1, .R = R, .E = E, .layered = false,
                           .counts = std::vector<int32_t>(static_cast<size_t>(T) * R * E, fill)};
    };
    if (name == "moonep") write_trace(path, counts(2, 8, 384, 100));
    if (name == "r4") write_trace(path, counts(2, 4, 384, 100));
    if (name == "e128") write_trace(path, counts(2, 8, 128, 100));
    if (name == "k3_r16") write_trace(path, counts(2, 16, 896, 10));
    if (name == "over_s") {
        RouterTrace t = counts(2, 8, 384, 100);
        t.counts[5] = 9000;
        write_trace(path, t);
    }
    if (name == "over_sk") {
        RouterTrace t = counts(1, 8, 384, 0);
        for (int e = 0; e < 9; ++e) t.counts[e] = 8192;
        write_trace(path, t);
    }
    if (name == "float") {
        const std::vector<float> v(2 * 8 * 384, 1.0f);
        write_npy(path, "<f4", {2, 8, 384}, v.data(), v.size() * sizeof(float));
    }
    if (name == "2d") {
        const std::vector<int32_t> v(8 * 384, 1);
        write_npy(path, "<i4", {8, 384}, v.data(), v.size() * sizeof(int32_t));
    }
    return path;
}

std::vector<Case> workload_cases() {
    return {
        {"with_maxvio", "--workload rotating --maxvio 1", {"--maxvio", "--workload"}},
        {"with_quick", "--workload rotating --quick", {"--quick"}},
        {"with_check", "--workload rotating --check", {"--check"}},
        {"steps_zero", "--workload burst --steps 0", {"--steps", "0"}},
        {"two_sync_models", "--workload burst --eplb-sync ring star", {"--eplb-sync", "one"}},
        {"unknown_workload", "--workload hot", {"--workload", "hot"}},
        {"workload_and_trace", "--workload burst --trace " + trace_file("moonep"), {"--trace"}},
        {"steps_without_workload", "--steps 4", {"--steps", "--workload"}},
        {"timed_ranks_zero", "--workload burst --timed-ranks 0", {"--timed-ranks"}},
        {"micro_batches_with_trace", "--trace " + trace_file("moonep") + " --micro-batches 2", {"--micro-batches"}},
        {"trace_missing", "--trace /nonexistent/t.npy", {"--trace"}},
        {"trace_R_mismatch", "--trace " + trace_file("r4"), {"R = 4", "E = 384", "no shape"}},
        {"trace_E_mismatch", "--trace " + trace_file("e128"), {"E = 128", "no shape"}},
        {"trace_float", "--trace " + trace_file("float"), {"dtype", "<f4"}},
        {"trace_2d", "--trace " + trace_file("2d"), {"2 dimensions"}},
        {"trace_count_over_S", "--trace " + trace_file("over_s"), {"9000", "S = 8192"}},
        {"trace_row_over_SK", "--trace " + trace_file("over_sk"), {"73728", "S*K = 65536"}},
        {"trace_k3_R_not_given", "--trace " + trace_file("k3_r16") + " --points k3 --k3-R 8", {"R = 16", "k3_R8"}},
        {"json_is_dir", "--workload burst --json /tmp", {"--json"}},
        {"all_refused", "--workload burst --steps 2 --max-seconds 1", {"bench layer"}},
        {"policy_exact", "--workload burst --policy exact", {"--policy exact", "--workload/--trace", "evenep_auto"}},
        {"slack_negative", "--workload burst --slack -0.1", {"--slack"}},
    };
}

INSTANTIATE_TEST_SUITE_P(BenchLayerWorkloadRefuses, Flag, ::testing::ValuesIn(workload_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(BenchLayerHelp, PolicyDefaultsToAuto) {
    const testing::CliRun run = testing::run_cli("bench layer --help", /*merge_stderr=*/true, /*timeout_s=*/60);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const size_t policy = run.output.find("--policy");
    ASSERT_NE(policy, std::string::npos) << run.output;
    EXPECT_NE(run.output.find("auto (default", policy), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("--slack"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace evenep
