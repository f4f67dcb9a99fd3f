// Step-sequence workloads (evenep/workloads.hpp), router traces (evenep/trace.hpp), `evenep workloads` and
// `evenep simulate --workload|--trace`.
//
// Cases:
//   Workloads.KDistinctAndInRange            every workload, two steps, two micro-batches: each present token has K
//                                            distinct ids in [0, E); absent tokens (ragged only) all -1
//   Workloads.Deterministic                  the same (workload, seed, step, mb) twice: identical; another seed,
//                                            step or (micro-batch noise) micro-batch differs
//   Workloads.IndependentOfR                 the same global token count split over R = 2, 4, 8: the ranks' tokens
//                                            concatenated are the same global routing
//   Workloads.HistogramMatchesRouting        workload_histogram == workload_routing(...).tpe() and its s
//   Workloads.Shapes                         ragged: s_r decreasing in r on average (first rank > last); zero_load:
//                                            dead experts and rank 0 (E/8 >= epn at R = 8) get 0; rotating: the hot
//                                            block moves every step; burst: some step of 40 is a burst, most not;
//                                            hot_rank: the hot block carries ~8/23 of the entries
//   Workloads.BadSpec                        K > E, K = 0, tokens 0, zero_load with too few live experts, an
//                                            unknown name: evenep::Error naming the value
//   Trace.RoundTrip                          write_trace then read_trace: same counts ([T, R, E] and [T, L, R, E])
//   Trace.RefusesMalformed                   negative count, count > S, row past S*K, 2-D, float dtype, int64 past
//                                            int32: Error, one line naming the value
//   WorkloadsCli.ListsEveryWorkload          `evenep workloads`: one line per workload
//   WorkloadsCli.TraceRoundTripThroughSimulate  `workloads --write-trace` then `simulate --trace --json`: schema
//                                            evenep.workload_run/1, T steps, every system with T step_ms and rows
//                                            summing to the trace's entries; `simulate --workload` on the same
//                                            workload gives the same step_ms; with --placed the same systems'
//                                            step_ms plus evenep_placed last (its rows summing to the entries)
//   WorkloadsCli.BadInputExitsTwo            a malformed trace, an unknown workload, --R 3 against a trace of R 2,
//                                            two R with --workload, a grid flag with --workload, a workload flag
//                                            without it (--steps, --placed), --micro-batches with --trace: exit 2,
//                                            one line
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/cli_testing.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"
#include "evenep/trace.hpp"
#include "evenep/workloads.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;

WorkloadSpec spec_of(Workload w, uint64_t seed = 7) {
    return WorkloadSpec{.kind = w, .E = 64, .K = 4, .num_tokens = 1024, .seed = seed};
}

TEST(Workloads, KDistinctAndInRange) {
    for (const WorkloadInfo& info : workload_list())
        for (int step : {0, 3})
            for (int mb : {0, 1}) {
                const WorkloadSpec spec = spec_of(info.kind);
                const std::vector<int32_t> ids = workload_global_routing(spec, step, mb);
                ASSERT_EQ(ids.size(), 1024u * 4);
                int absent = 0;
                for (int64_t t = 0; t < spec.num_tokens; ++t) {
                    const int32_t* tok = ids.data() + t * spec.K;
                    if (tok[0] < 0) {
                        ++absent;
                        for (int k = 0; k < spec.K; ++k) EXPECT_EQ(tok[k], -1) << info.name << " token " << t;
                        continue;
                    }
                    std::set<int32_t> seen(tok, tok + spec.K);
                    EXPECT_EQ(seen.size(), static_cast<size_t>(spec.K)) << info.name << " token " << t;
                    for (int k = 0; k < spec.K; ++k) EXPECT_TRUE(tok[k] >= 0 && tok[k] < spec.E) << info.name;
                }
                if (info.kind == Workload::kRagged)
                    EXPECT_GT(absent, 100) << "ragged sources remove tokens";
                else
                    EXPECT_EQ(absent, 0) << info.name;
            }
}

TEST(Workloads, Deterministic) {
    for (const WorkloadInfo& info : workload_list()) {
        const WorkloadSpec a = spec_of(info.kind, 7), b = spec_of(info.kind, 8);
        EXPECT_EQ(workload_global_routing(a, 5, 1), workload_global_routing(a, 5, 1)) << info.name;
        EXPECT_NE(workload_global_routing(a, 5, 1), workload_global_routing(b, 5, 1)) << info.name;
        EXPECT_NE(workload_global_routing(a, 5, 1), workload_global_routing(a, 6, 1)) << info.name;
    }
    const WorkloadSpec n = spec_of(Workload::kMicroBatchNoise);
    EXPECT_NE(workload_log_popularity(n, 2, 0), workload_log_popularity(n, 2, 1));
    const WorkloadSpec d = spec_of(Workload::kDrift);
    EXPECT_EQ(workload_log_popularity(d, 2, 0), workload_log_popularity(d, 2, 1)) << "drift: per step, not per mb";
}

TEST(Workloads, IndependentOfR) {
    for (const WorkloadInfo& info : workload_list()) {
        const WorkloadSpec spec = spec_of(info.kind);
        const std::vector<int32_t> global = workload_global_routing(spec, 4, 0);
        std::vector<int32_t> present;
        for (size_t i = 0; i < global.size(); i += spec.K)
            if (global[i] >= 0) present.insert(present.end(), global.begin() + i, global.begin() + i + spec.K);
        for (int R : {2, 4, 8}) {
            const Routing r = workload_routing(spec, R, 4, 0);
            std::vector<int32_t> cat;
            for (int q = 0; q < R; ++q)
                for (size_t i = 0; i < r.topk_idx[q].size(); i += spec.K)
                    if (r.topk_idx[q][i] >= 0)  // a rank without tokens holds one fully masked token
                        cat.insert(cat.end(), r.topk_idx[q].begin() + i, r.topk_idx[q].begin() + i + spec.K);
            EXPECT_EQ(cat, present) << info.name << " R = " << R;
        }
    }
}

TEST(Workloads, HistogramMatchesRouting) {
    for (const WorkloadInfo& info : workload_list()) {
        const WorkloadSpec spec = spec_of(info.kind);
        const Routing r = workload_routing(spec, 8, 2, 1);
        const WorkloadHistogram h = workload_histogram(spec, 8, 2, 1);
        EXPECT_EQ(h.tpe, r.tpe()) << info.name;
        EXPECT_EQ(h.s, r.s) << info.name;
    }
}

std::vector<int64_t> expert_totals(const WorkloadSpec& spec, int step) {
    const WorkloadHistogram h = workload_histogram(spec, 8, step, 0);
    std::vector<int64_t> load(spec.E, 0);
    for (int r = 0; r < 8; ++r)
        for (int e = 0; e < spec.E; ++e) load[e] += h.tpe[static_cast<size_t>(r) * spec.E + e];
    return load;
}

TEST(Workloads, Shapes) {
    WorkloadSpec ragged = spec_of(Workload::kRagged);
    ragged.num_tokens = 8192;
    const WorkloadHistogram rh = workload_histogram(ragged, 8, 0, 0);
    EXPECT_GT(rh.s[0], rh.s[7] + 300) << "ragged: the first rank keeps ~97%, the last ~34%";

    const WorkloadSpec zero = spec_of(Workload::kZeroLoad);
    const std::vector<int64_t> zl = expert_totals(zero, 1);
    for (int e = 0; e < 8; ++e) EXPECT_EQ(zl[e], 0) << "zero_load: rank 0's experts (E/8 = epn at R = 8)";
    EXPECT_EQ(zl[8 + 6], 0) << "every 7th expert past the block";
    EXPECT_GT(zl[8], 0);

    const WorkloadSpec rot = spec_of(Workload::kRotatingHotSpot);
    const auto hottest = [](const std::vector<int64_t>& l) {
        return static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
    };
    std::set<int> hot_blocks;
    for (int step = 0; step < 4; ++step) {
        const std::vector<double> lp = workload_log_popularity(rot, step, 0);
        int first_hot = -1;
        for (int e = 0; e < rot.E; ++e)
            if (lp[e] > 0 && (first_hot < 0 || lp[(e + rot.E - 1) % rot.E] == 0)) first_hot = e;
        hot_blocks.insert(first_hot);
        EXPECT_GT(lp[hottest(expert_totals(rot, step))], 0) << "the hottest expert is in the hot block";
    }
    EXPECT_EQ(hot_blocks.size(), 4u) << "the hot block moves every step";

    const WorkloadSpec burst = spec_of(Workload::kBurst);
    int bursts = 0;
    for (int step = 0; step < 40; ++step) {
        const std::vector<double> lp = workload_log_popularity(burst, step, 0);
        bursts += *std::max_element(lp.begin(), lp.end()) > std::log(32.0) - 2.0 ? 1 : 0;
    }
    EXPECT_GE(bursts, 1);
    EXPECT_LE(bursts, 12);

    WorkloadSpec hot = spec_of(Workload::kHotRank);
    hot.num_tokens = 8192;
    const std::vector<double> lp = workload_log_popularity(hot, 0, 0);
    const std::vector<int64_t> hl = expert_totals(hot, 0);
    int64_t in_hot = 0, total = 0;
    for (int e = 0; e < hot.E; ++e) {
        total += hl[e];
        in_hot += lp[e] > 0 ? hl[e] : 0;
    }
    // 4 hot experts of 64 at 8x: 32 / (32 + 60) of the popularity (K distinct flattens it a little).
    EXPECT_NEAR(static_cast<double>(in_hot) / total, 32.0 / 92.0, 0.05);
}

TEST(Workloads, BadSpec) {
    const auto fails = [](WorkloadSpec s, const std::string& needle) {
        try {
            s.validate();
            ADD_FAILURE() << "accepted: " << needle;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    fails({.kind = Workload::kBalanced, .E = 4, .K = 5, .num_tokens = 8}, "K = 5");
    fails({.kind = Workload::kBalanced, .E = 4, .K = 0, .num_tokens = 8}, "K = 0");
    fails({.kind = Workload::kBalanced, .E = 4, .K = 2, .num_tokens = 0}, "token count 0");
    fails({.kind = Workload::kZeroLoad, .E = 16, .K = 14, .num_tokens = 8}, "live experts");
    EXPECT_THROW(parse_workload("hot"), Error);
    EXPECT_THROW(workload_routing(spec_of(Workload::kBalanced), 3, 0, 0), Error);  // 1024 % 3
}

fs::path temp_dir(const std::string& name) { return testing::temp_dir("evenep_workloads_test", name); }

TEST(Trace, RoundTrip) {
    const fs::path dir = temp_dir("roundtrip");
    RouterTrace t{.T = 3, .L = 1, .R = 2, .E = 4, .layered = false, .counts = {}};
    for (int i = 0; i < 3 * 2 * 4; ++i) t.counts.push_back(i % 5);
    write_trace((dir / "t.npy").string(), t);
    const RouterTrace back = read_trace((dir / "t.npy").string(), 4, 4);
    EXPECT_EQ(back.T, 3);
    EXPECT_EQ(back.L, 1);
    EXPECT_EQ(back.R, 2);
    EXPECT_EQ(back.E, 4);
    EXPECT_FALSE(back.layered);
    EXPECT_EQ(back.counts, t.counts);
    RouterTrace l = t;
    l.T = 1;
    l.L = 3;
    write_trace((dir / "l.npy").string(), l);
    const RouterTrace lb = read_trace((dir / "l.npy").string(), 4, 4);
    EXPECT_TRUE(lb.layered);
    EXPECT_EQ(lb.L, 3);
    EXPECT_EQ(lb.counts, l.counts);
    EXPECT_EQ(std::vector<int32_t>(lb.histogram(0, 2).begin(), lb.histogram(0, 2).end()),
              std::vector<int32_t>(l.counts.begin() + 16, l.counts.end()));
    fs::remove_all(dir);
}

TEST(Trace, RefusesMalformed) {
    const fs::path dir = temp_dir("malformed");
    const auto refused = [&](const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
                             size_t bytes, int K, int S, const std::string& needle) {
        const std::string p = (dir / "bad.npy").string();
        write_npy(p, dtype, shape, data, bytes);
        try {
            read_trace(p, K, S);
            ADD_FAILURE() << "accepted: " << needle;
        } catch (const Error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find(needle), std::string::npos) << what;
            EXPECT_EQ(what.find('\n'), std::string::npos) << what;
        }
    };
    const int32_t neg[4] = {1, -1, 0, 0};
    refused("<i4", {1, 1, 4}, neg, sizeof(neg), 2, 4, "count -1");
    const int32_t big[4] = {5, 0, 0, 0};
    refused("<i4", {1, 1, 4}, big, sizeof(big), 2, 4, "count 5");
    const int32_t row[4] = {3, 3, 3, 0};
    refused("<i4", {1, 1, 4}, row, sizeof(row), 2, 4, "exceed S*K = 8");
    refused("<i4", {1, 4}, row, sizeof(row), 2, 4, "2 dimensions");
    const float f[4] = {0, 0, 0, 0};
    refused("<f4", {1, 1, 4}, f, sizeof(f), 2, 4, "dtype <f4");
    const int64_t wide[4] = {int64_t{1} << 40, 0, 0, 0};
    refused("<i8", {1, 1, 4}, wide, sizeof(wide), 2, 4, "does not fit int32");
    fs::remove_all(dir);
}

TEST(WorkloadsCli, ListsEveryWorkload) {
    const CliRun run = run_cli("workloads");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    for (const WorkloadInfo& info : workload_list())
        EXPECT_NE(run.output.find(std::string(info.name) + " "), std::string::npos) << info.name;
    EXPECT_EQ(static_cast<size_t>(std::count(run.output.begin(), run.output.end(), '\n')), workload_list().size());
}

TEST(WorkloadsCli, TraceRoundTripThroughSimulate) {
    const fs::path dir = temp_dir("cli");
    const std::string shape = " --R 4 --E 32 --K 4 --S 128 ";
    const CliRun w = run_cli("workloads --write-trace " + (dir / "t.npy").string() + " --workload rotating --steps 6" +
                             shape + "--seed 3");
    ASSERT_EQ(w.exit_code, 0) << w.output;
    const RouterTrace t = read_trace((dir / "t.npy").string(), 4, 128);
    ASSERT_EQ(t.T, 6);
    const std::string model = " --H 256 --ffn-hidden 128 --eplb-sync ring --eplb-interval 2 --eplb-window 2 ";
    const CliRun s = run_cli("simulate --trace " + (dir / "t.npy").string() + shape + model + "--json " +
                             (dir / "tr.json").string());
    ASSERT_EQ(s.exit_code, 0) << s.output;
    std::ifstream f(dir / "tr.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j["schema"], "evenep.workload_run/1");
    EXPECT_EQ(j["steps"], 6);
    std::set<std::string> names;
    for (const nlohmann::json& sys : j["systems"]) {
        names.insert(sys["name"].get<std::string>());
        ASSERT_EQ(sys["step_ms"].size(), 6u) << sys["label"];
        ASSERT_EQ(sys["rows_max_over_mean"].size(), 6u) << sys["label"];
        for (int step = 0; step < 6; ++step) {
            int64_t rows = 0, entries = 0;
            for (const nlohmann::json& v : sys["rows"][step]) rows += v.get<int64_t>();
            for (int32_t c : t.histogram(step, 0)) entries += c;
            EXPECT_EQ(rows, entries) << sys["label"] << " step " << step;
        }
    }
    EXPECT_EQ(names, (std::set<std::string>{"evenep_auto", "evenep_exact", "conventional", "eplb", "lplb", "llep"}));
    EXPECT_EQ(j["systems"][1]["name"], "evenep_exact");
    EXPECT_EQ(j["systems"][1]["rows_max_over_mean"][0].get<double>(), 1.0) << "evenep_exact: exact balance";
    EXPECT_LE(j["systems"][0]["rows_max_over_mean"][0].get<double>(), 1.11) << "evenep_auto: within its budget 0.1";
    // The same workload generated in place: the same step times.
    const CliRun g = run_cli("simulate --workload rotating --steps 6 --seed 3" + shape + model + "--json " +
                             (dir / "wl.json").string());
    ASSERT_EQ(g.exit_code, 0) << g.output;
    std::ifstream f2(dir / "wl.json");
    const nlohmann::json k = nlohmann::json::parse(f2);
    EXPECT_EQ(k["workload"], "rotating");
    for (size_t i = 0; i < j["systems"].size(); ++i)
        EXPECT_EQ(k["systems"][i]["step_ms"], j["systems"][i]["step_ms"]) << j["systems"][i]["label"];
    // --placed: one more system, last; the others unchanged.
    const CliRun p = run_cli("simulate --trace " + (dir / "t.npy").string() + shape + model + "--placed --json " +
                             (dir / "pl.json").string());
    ASSERT_EQ(p.exit_code, 0) << p.output;
    std::ifstream f3(dir / "pl.json");
    const nlohmann::json q = nlohmann::json::parse(f3);
    ASSERT_EQ(q["systems"].size(), j["systems"].size() + 1);
    for (size_t i = 0; i < j["systems"].size(); ++i)
        EXPECT_EQ(q["systems"][i]["step_ms"], j["systems"][i]["step_ms"]) << j["systems"][i]["label"];
    const nlohmann::json& placed = q["systems"].back();
    EXPECT_EQ(placed["name"], "evenep_placed");
    EXPECT_EQ(placed["params"]["step_interval"], 2);
    for (int step = 0; step < 6; ++step) {
        int64_t rows = 0, entries = 0;
        for (const nlohmann::json& v : placed["rows"][step]) rows += v.get<int64_t>();
        for (int32_t c : t.histogram(step, 0)) entries += c;
        EXPECT_EQ(rows, entries) << "evenep_placed step " << step;
    }
    fs::remove_all(dir);
}

TEST(WorkloadsCli, BadInputExitsTwo) {
    const fs::path dir = temp_dir("bad");
    const int32_t neg[8] = {1, -1, 0, 0, 0, 0, 0, 0};
    write_npy((dir / "neg.npy").string(), "<i4", {1, 2, 4}, neg, sizeof(neg));
    const int32_t ok[8] = {1, 1, 0, 0, 0, 0, 1, 1};
    write_npy((dir / "ok.npy").string(), "<i4", {1, 2, 4}, ok, sizeof(ok));
    const std::string neg_npy = (dir / "neg.npy").string(), ok_npy = (dir / "ok.npy").string();
    const std::vector<std::string> cases{
        "simulate --trace " + neg_npy + " --K 2 --S 4",
        "simulate --trace " + ok_npy + " --K 2 --S 4 --R 3",
        "simulate --workload nope",
        "simulate --quick --workload balanced --R 4 8",
        "simulate --quick --workload balanced --maxvio 1",
        "simulate --quick --steps 3",
        "simulate --quick --placed",
        "simulate --trace " + ok_npy + " --K 2 --S 4 --micro-batches 2",
        "workloads --write-trace " + (dir / "x.npy").string() + " --workload nope"};
    for (const std::string& args : cases) {
        const CliRun run = run_cli(args);
        EXPECT_EQ(run.exit_code, 2) << args << ": " << run.output;
        EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << args << ": " << run.output;
    }
    fs::remove_all(dir);
}

}  // namespace
}  // namespace evenep
