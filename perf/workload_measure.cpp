// Every system over a step sequence with measured compute (perf/workload_measure.hpp).
#include "perf/workload_measure.hpp"

#include <algorithm>
#include <numeric>

#include "evenep/error.hpp"

namespace evenep::perf {

MeasuredWorkloadRun::MeasuredWorkloadRun(const WorkloadRunConfig& cfg, RankComputeFn time_rank, int timed_ranks)
    : cfg_(cfg), runner_(cfg), time_rank_(std::move(time_rank)), timed_ranks_(timed_ranks) {
    EVENEP_CHECK(timed_ranks >= 1, "--timed-ranks = ", timed_ranks, " must be >= 1");
    EVENEP_CHECK(static_cast<bool>(time_rank_), "MeasuredWorkloadRun: no rank timer");
    const size_t n = runner_.series().size();
    step_model_.resize(n), compute_model_.resize(n), compute_measured_.resize(n);
    runner_.set_unit_observer([this](size_t, size_t system, const SystemStep& step, const StepCost& cost) {
        const int R = cfg_.cfg.R, E = cfg_.cfg.E;
        std::vector<int> order(R);
        std::iota(order.begin(), order.end(), 0);
        // busiest first by the model; ties by rank (deterministic)
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return cost.rank_compute_ms[a] > cost.rank_compute_ms[b]; });
        double measured = 0;
        for (int i = 0; i < std::min(timed_ranks_, R); ++i) {
            std::vector<int64_t> groups = rank_groups(cfg_.model, R, E, step.alloc, order[i]);
            if (groups.empty()) continue;  // no rows: nothing to time
            auto it = memo_.find(groups);
            if (it == memo_.end()) {
                const double ms = time_rank_(groups);
                ++timed_;
                it = memo_.emplace(std::move(groups), ms).first;
            } else {
                ++hits_;
            }
            measured = std::max(measured, it->second);
        }
        unit_model_[system] += cost.step_ms;
        unit_compute_model_[system] += cost.compute_ms;
        unit_measured_[system] += measured;
    });
}

void MeasuredWorkloadRun::run_step(int64_t step, std::span<const StepUnit> units) {
    const size_t n = runner_.series().size();
    unit_model_.assign(n, 0.0), unit_compute_model_.assign(n, 0.0), unit_measured_.assign(n, 0.0);
    runner_.run_step(step, units);
    for (size_t i = 0; i < n; ++i) {
        step_model_[i].push_back(unit_model_[i]);
        compute_model_[i].push_back(unit_compute_model_[i]);
        compute_measured_[i].push_back(unit_measured_[i]);
    }
}

std::vector<MeasuredSeries> MeasuredWorkloadRun::series() const {
    std::vector<MeasuredSeries> out;
    const std::vector<SystemSeries>& model = runner_.series();
    for (size_t i = 0; i < model.size(); ++i) {
        MeasuredSeries m;
        m.series = model[i];
        m.step_ms_model = step_model_[i];
        m.compute_ms_model = compute_model_[i];
        m.compute_ms_measured = compute_measured_[i];
        for (size_t t = 0; t < m.series.step_ms.size(); ++t)
            m.series.step_ms[t] = step_model_[i][t] - compute_model_[i][t] + compute_measured_[i][t];
        if (m.series.name == "evenep_exact") m.policy = "exact";
        if (m.series.name == "evenep_auto") m.policy = "auto";
        out.push_back(std::move(m));
    }
    return out;
}

}  // namespace evenep::perf
