// The per-step routing -> per-system rows plumbing of `bench layer --workload|--trace` (perf/workload_measure.hpp,
// rank_groups of perf/step_model.hpp), on the CPU with stand-in rank timers (the GPU timer is the only piece left out).
//
// Cases:
//   RankGroups.PaddedPerExpert          a hand-built alloc: one group per expert with rows on the rank, expert order,
//                                       padded to tp; empty rank -> no groups; bad sizes refused
//   MeasuredRun.ModelTimerReproducesModel  a timer answering the model's own compute of the groups it is given:
//                                       every system's measured step == WorkloadRunner's model step (timed_ranks 1
//                                       and R), on hot_rank, rotating and ragged, 2 micro-batches, 4 steps
//   MeasuredRun.ConstantTimerSwapsCompute  a timer answering 1 ms: step = model step - model compute + 1 per unit
//   MeasuredRun.TimesTheBusiestRank     the groups the timer sees with timed_ranks 1 are the model's busiest rank's
//                                       (hot_rank: conventional's rank 0); with timed_ranks R every rank with rows
//   MeasuredRun.MemoAndAutoPolicy       identical group lists timed once (balanced, 3 steps: timed + hits == calls);
//                                       evenep_auto first (the runner's auto-planned series), policy "auto", its
//                                       per-step budgets in [0, auto_slack]; evenep_exact second, policy "exact"
//   MeasuredRun.BadInput                timed_ranks 0 and an empty timer refused
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/workloads.hpp"
#include "perf/step_model.hpp"
#include "perf/workload_measure.hpp"
#include "perf/workload_run.hpp"

namespace evenep::perf {
namespace {

WorkloadRunConfig tiny_config() {
    WorkloadRunConfig rc;
    rc.cfg = Config{.R = 4, .E = 16, .K = 2, .S = 64, .B = -1, .tp = 8};
    rc.model = StepModel{.H = 64, .ffn_hidden = 64, .tp = 8};
    rc.eplb_schedule = EplbSchedule{.step_interval = 2, .window = 2};
    return rc;
}

// The step model's compute of one rank's groups (what evaluate_step adds per rank), milliseconds.
double model_compute_ms(const StepModel& m, std::span<const int64_t> groups) {
    const double row_us = 18.0 * m.H * m.ffn_hidden / (m.gemm_tflops * 1e12) * 1e6;
    double us = 0;
    for (int64_t g : groups) us += static_cast<double>(g) * row_us + m.group_cost_us();
    return us * 1e-3;
}

// Runs `steps` steps of `kind` (2 micro-batches) through both runners.
void run_both(Workload kind, int steps, WorkloadRunner& model, MeasuredWorkloadRun& measured) {
    const WorkloadSpec spec{.kind = kind, .E = 16, .K = 2, .num_tokens = 256, .seed = 7};
    for (int t = 0; t < steps; ++t) {
        std::vector<WorkloadHistogram> h;
        for (int mb = 0; mb < 2; ++mb) h.push_back(workload_histogram(spec, 4, t, mb));
        std::vector<StepUnit> units;
        for (const WorkloadHistogram& x : h) units.push_back({.layer = 0, .tpe = x.tpe, .s = x.s});
        model.run_step(t, units);
        measured.run_step(t, units);
    }
}

TEST(RankGroups, PaddedPerExpert) {
    const StepModel m{.H = 64, .ffn_hidden = 64, .tp = 8};
    // R = 2, E = 3: alloc[e*R + r]
    const std::vector<int64_t> alloc{5, 0, 9, 16, 0, 0};
    EXPECT_EQ(rank_groups(m, 2, 3, alloc, 0), (std::vector<int64_t>{8, 16}));
    EXPECT_EQ(rank_groups(m, 2, 3, alloc, 1), (std::vector<int64_t>{16}));
    const std::vector<int64_t> none(6, 0);
    EXPECT_TRUE(rank_groups(m, 2, 3, none, 1).empty());
    EXPECT_THROW(rank_groups(m, 2, 4, alloc, 0), Error);
    EXPECT_THROW(rank_groups(m, 2, 3, alloc, 2), Error);
}

TEST(MeasuredRun, ModelTimerReproducesModel) {
    const WorkloadRunConfig rc = tiny_config();
    for (Workload kind : {Workload::kHotRank, Workload::kRotatingHotSpot, Workload::kRagged})
        for (int timed : {1, 4}) {
            WorkloadRunner model(rc);
            MeasuredWorkloadRun measured(
                rc, [&](std::span<const int64_t> g) { return model_compute_ms(rc.model, g); }, timed);
            run_both(kind, 4, model, measured);
            const std::vector<MeasuredSeries> ms = measured.series();
            ASSERT_EQ(ms.size(), model.series().size());  // evenep_auto is the runner's own series
            for (size_t i = 0; i < model.series().size(); ++i) {
                const SystemSeries& a = model.series()[i];
                const MeasuredSeries& b = ms[i];
                ASSERT_EQ(b.series.label, a.label);
                ASSERT_EQ(b.series.step_ms.size(), 4u);
                for (size_t t = 0; t < 4; ++t) {
                    EXPECT_NEAR(b.series.step_ms[t], a.step_ms[t], 1e-9)
                        << a.label << " step " << t << " timed " << timed;
                    EXPECT_NEAR(b.step_ms_model[t], a.step_ms[t], 1e-12) << a.label;
                    EXPECT_NEAR(b.compute_ms_measured[t], b.compute_ms_model[t], 1e-9) << a.label;
                    EXPECT_EQ(b.series.rows[t], a.rows[t]) << a.label;
                }
            }
        }
}

TEST(MeasuredRun, ConstantTimerSwapsCompute) {
    const WorkloadRunConfig rc = tiny_config();
    WorkloadRunner model(rc);
    MeasuredWorkloadRun measured(
        rc, [](std::span<const int64_t>) { return 1.0; }, 2);
    run_both(Workload::kBurst, 3, model, measured);
    for (const MeasuredSeries& m : measured.series())
        for (size_t t = 0; t < 3; ++t) {
            EXPECT_DOUBLE_EQ(m.compute_ms_measured[t], 2.0) << m.series.label << ": 2 units of 1 ms";
            EXPECT_NEAR(m.series.step_ms[t], m.step_ms_model[t] - m.compute_ms_model[t] + 2.0, 1e-12);
        }
}

TEST(MeasuredRun, TimesTheBusiestRank) {
    WorkloadRunConfig rc = tiny_config();
    WorkloadRunner model(rc);
    std::vector<std::vector<int64_t>> seen;
    MeasuredWorkloadRun measured(
        rc,
        [&](std::span<const int64_t> g) {
            seen.emplace_back(g.begin(), g.end());
            return model_compute_ms(rc.model, g);
        },
        1);
    // One unit of hot_rank: conventional EP computes everything of rank 0's experts on rank 0.
    const WorkloadSpec spec{.kind = Workload::kHotRank, .E = 16, .K = 2, .num_tokens = 256, .seed = 3};
    const WorkloadHistogram h = workload_histogram(spec, 4, 0, 0);
    std::vector<int64_t> load(16, 0);
    for (int r = 0; r < 4; ++r)
        for (int e = 0; e < 16; ++e) load[e] += h.tpe[static_cast<size_t>(r) * 16 + e];
    std::vector<int64_t> busiest_conv;
    int busiest = 0;
    int64_t most = -1;
    for (int r = 0; r < 4; ++r) {
        const int64_t rows = std::accumulate(load.begin() + 4 * r, load.begin() + 4 * r + 4, int64_t{0});
        if (rows > most) most = rows, busiest = r;
    }
    for (int e = 4 * busiest; e < 4 * busiest + 4; ++e)
        if (load[e] > 0) busiest_conv.push_back((load[e] + 7) / 8 * 8);
    const std::vector<StepUnit> units{{.layer = 0, .tpe = h.tpe, .s = h.s}};
    measured.run_step(0, units);
    // the runner's systems in order: evenep_auto, evenep_exact, conventional, ...; at most one timing each (memo aside)
    EXPECT_LE(static_cast<size_t>(measured.timed()), model.series().size()) << "one rank per system at most";
    EXPECT_NE(std::find(seen.begin(), seen.end(), busiest_conv), seen.end())
        << "conventional's busiest rank " << busiest << " was not timed";
    // With every rank timed, the measured compute is the model's max (the model timer).
    WorkloadRunner model_all(rc);
    MeasuredWorkloadRun all(
        rc, [&](std::span<const int64_t> g) { return model_compute_ms(rc.model, g); }, 4);
    model_all.run_step(0, units);
    all.run_step(0, units);
    for (size_t i = 0; i < model_all.series().size(); ++i)
        EXPECT_NEAR(all.series()[i].series.step_ms[0], model_all.series()[i].step_ms[0], 1e-9);
}

TEST(MeasuredRun, MemoAndAutoPolicy) {
    const WorkloadRunConfig rc = tiny_config();
    WorkloadRunner model(rc);
    int64_t calls = 0;
    MeasuredWorkloadRun measured(
        rc,
        [&](std::span<const int64_t> g) {
            ++calls;
            return static_cast<double>(std::accumulate(g.begin(), g.end(), int64_t{0}));
        },
        4);
    run_both(Workload::kBalanced, 3, model, measured);
    EXPECT_EQ(measured.timed(), calls);
    EXPECT_GT(measured.memo_hits(), 0) << "conventional and the EPLB placements share home groups";
    const std::vector<MeasuredSeries> s = measured.series();
    ASSERT_GE(s.size(), 2u);
    EXPECT_EQ(s[0].series.name, "evenep_auto");
    EXPECT_EQ(s[1].series.name, "evenep_exact");
    EXPECT_EQ(s[0].policy, "auto");
    EXPECT_EQ(s[1].policy, "exact");
    // evenep_auto is the runner's own auto-planned series (not a copy of evenep_exact's): its budgets are recorded
    // per step, each within [0, auto_slack].
    ASSERT_EQ(s[0].series.slack_ppm.size(), s[0].series.step_ms.size());
    for (double ppm : s[0].series.slack_ppm) {
        EXPECT_GE(ppm, 0);
        EXPECT_LE(ppm, rc.auto_slack * 1e6 + 1e-6);
    }
    EXPECT_TRUE(s[1].series.slack_ppm.empty());
}

TEST(MeasuredRun, BadInput) {
    const WorkloadRunConfig rc = tiny_config();
    EXPECT_THROW(MeasuredWorkloadRun(
                     rc, [](std::span<const int64_t>) { return 1.0; }, 0),
                 Error);
    EXPECT_THROW(MeasuredWorkloadRun(rc, RankComputeFn{}, 1), Error);
}

}  // namespace
}  // namespace evenep::perf
