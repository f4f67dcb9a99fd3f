// `evenep pipeline` end to end (the CLI binary built next to the tests).
//
// Cases:
//   PipelineCli.PoliciesSideBySide   every policy's row; --json (schema evenep.pipeline/1) read back into a Schedule
//                                    passes the validator; --svg writes a picture with ViT work in red
//   PipelineCli.FilesGridAndCpTable  --costs and --images files, --grid and --cp-table print their tables
//   PipelineCli.BadInputExitsTwo     --P 0, m not a multiple of P with V > 1, negative costs, a malformed file, an
//                                    images file with the wrong number of micro-batches, an unknown policy or mix:
//                                    exit 2 and one "evenep: error:" line naming the flag or value
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"
#include "evenep/pipeline.hpp"

namespace evenep::pipeline {
namespace {

namespace fs = std::filesystem;

using testing::run_cli;
using testing::CliRun;

fs::path temp_dir(const std::string& name) { return testing::temp_dir("evenep_pipeline_cli_test", name); }

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string slurp(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

TEST(PipelineCli, PoliciesSideBySide) {
    const fs::path dir = temp_dir("policies");
    const CliRun run = run_cli("pipeline --P 4 --m 8 --V 2 --mix heavy --images-per-mb 2 --json " +
                               (dir / "s.json").string() + " --svg " + (dir / "s.svg").string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    for (const char* row : {"\nnone ", "\nsync ", "\nbubbles ", "\noptimal "})
        EXPECT_NE(run.output.find(row), std::string::npos) << row << "\n" << run.output;

    const nlohmann::json j = nlohmann::json::parse(slurp(dir / "s.json"));
    EXPECT_EQ(j["schema"], "evenep.pipeline/1");
    EXPECT_EQ(j["P"], 4);
    EXPECT_EQ(j["m"], 8);
    EXPECT_EQ(j["V"], 2);
    EXPECT_EQ(j["bubble_fraction"].size(), 4u);
    // Rebuild the schedule and the ViT work from the JSON and validate it independently of the CLI.
    PipelineConfig cfg;
    cfg.P = 4;
    cfg.m = 8;
    cfg.V = 2;
    Schedule s;
    VitWork w{std::vector<std::vector<double>>(8), std::vector<std::vector<double>>(8)};
    s.busy.assign(4, 0);
    for (const auto& o : j["ops"]) {
        const std::string kind = o["kind"];
        Op op;
        op.rank = o["rank"];
        op.mb = o["mb"];
        op.chunk = o["chunk"];
        op.part = o["part"];
        op.start = o["start"];
        op.end = o["end"];
        op.kind = kind == "F" ? OpKind::kForward
                              : kind == "B" ? OpKind::kBackward : kind == "VF" ? OpKind::kVitForward : OpKind::kVitBackward;
        if (op.part >= 0) {
            auto& row = op.kind == OpKind::kVitForward ? w.forward[op.mb] : w.backward[op.mb];
            if (row.size() <= static_cast<size_t>(op.part)) row.resize(op.part + 1, 0);
            row[op.part] = op.end - op.start;
        }
        s.busy[op.rank] += op.end - op.start;
        s.ops.push_back(op);
    }
    s.makespan = j["makespan"];
    s.bubble_fraction = j["bubble_fraction"].get<std::vector<double>>();
    EXPECT_GT(w.num_pieces(), 0);
    const auto errors = validate_schedule(cfg, w, s);
    EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors.front());

    const std::string svg = slurp(dir / "s.svg");
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("#f08080"), std::string::npos);  // ViT forward
    EXPECT_NE(svg.find("#b22222"), std::string::npos);  // ViT backward
}

TEST(PipelineCli, FilesGridAndCpTable) {
    const fs::path dir = temp_dir("files");
    write(dir / "costs.json", R"({"forward": [1, 1.5], "backward": 2, "latency": 0.1})");
    write(dir / "images.json", R"({"patches": [[256, 4096], [1024]]})");
    write(dir / "vit.json", R"({"vit_forward": [[0.5], [0.25, 0.25]]})");
    CliRun run = run_cli("pipeline --P 2 --m 2 --costs " + (dir / "costs.json").string() + " --images " +
                         (dir / "images.json").string());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    run = run_cli("pipeline --P 2 --m 2 --images " + (dir / "vit.json").string() + " --vit-policy sync --json " +
                  (dir / "v.json").string());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_TRUE(fs::exists(dir / "v.json"));
    run = run_cli("pipeline --P 2 --m 4 --images-per-mb 1 --grid --time-limit 5");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("ViT load"), std::string::npos) << run.output;
    run = run_cli("pipeline --cp-table --mix heavy");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("naive comm"), std::string::npos) << run.output;
}

TEST(PipelineCli, BadInputExitsTwo) {
    const fs::path dir = temp_dir("bad");
    write(dir / "neg.json", R"({"forward": [1, -1]})");
    write(dir / "broken.json", R"({"forward": [1, )");
    write(dir / "short.json", R"({"patches": [[256]]})");
    write(dir / "zero.json", R"({"patches": [[256], [0]]})");
    struct Bad {
        std::string args, needle;
    };
    const std::vector<Bad> cases = {
        {"--P 0", "--P: value '0' is outside"},
        {"--P 4 --m 6 --V 2", "--m = 6 must be a multiple of --P = 4"},
        {"--P 2 --m 2 --costs " + (dir / "neg.json").string(), "forward[1] = -1"},
        {"--P 2 --m 2 --costs " + (dir / "broken.json").string(), "parse error"},
        {"--P 2 --m 2 --costs " + (dir / "missing.json").string(), "No such file"},
        {"--P 2 --m 2 --images " + (dir / "short.json").string(), "m = 2 micro-batches"},
        {"--P 2 --m 2 --images " + (dir / "zero.json").string(), "patches[1][0] = 0"},
        {"--vit-policy greedy", "unknown ViT policy 'greedy'"},
        {"--mix huge", "unknown image mix 'huge'"},
        {"--latency -1", "--latency: value '-1' is outside"},
        {"--vit-load -2", "--vit-load: value '-2' is outside"},
        {"--vit-load 0", "--vit-load = 0 must be > 0"},
    };
    for (const Bad& c : cases) {
        const CliRun run = run_cli("pipeline " + c.args);
        EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.output;
        EXPECT_EQ(run.output.rfind("evenep: error: ", 0), 0u) << c.args << "\n" << run.output;
        EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << c.args << "\n" << run.output;
        EXPECT_NE(run.output.find(c.needle), std::string::npos) << c.args << "\n" << run.output;
    }
}

}  // namespace
}  // namespace evenep::pipeline
