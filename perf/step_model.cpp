// The step-time model of `simulate --workload|--trace` (perf/step_model.hpp).
#include "perf/step_model.hpp"

#include <algorithm>
#include <cmath>

#include "evenep/error.hpp"
#include "perf/baselines.hpp"

namespace evenep::perf {
namespace {

// The checked-in wgrad tile overhead (src/cuda/kernels/gemm_cost_model.inc, H200) and the H200's SM count: the auto
// policy's figures (evenep/detail/plan_auto_model.hpp).
inline constexpr double kWgradTileUs = detail::kAutoWgradTileUs;
inline constexpr double kNumSms = detail::kAutoNumSms;
inline constexpr double kFlopsPerRowPerHH = 18;  // forward 3 GEMMs of 2*H*H', backward 2x

// The busiest rank's max(sent, received) bytes of `moves`, and the sent total.
std::pair<int64_t, int64_t> busiest(int R, const std::vector<Move>& moves) {
    std::vector<int64_t> sent(R, 0), recv(R, 0);
    int64_t total = 0;
    for (const Move& m : moves) {
        if (m.from == m.to) continue;
        sent[m.from] += m.bytes;
        recv[m.to] += m.bytes;
        total += m.bytes;
    }
    int64_t mx = 0;
    for (int r = 0; r < R; ++r) mx = std::max({mx, sent[r], recv[r]});
    return {mx, total};
}

}  // namespace

void StepModel::validate() const {
    EVENEP_CHECK(H >= 1 && ffn_hidden >= 1 && tp >= 1, "step model: H = ", H, ", H' = ", ffn_hidden, ", tp = ", tp,
                 " must be >= 1");
    EVENEP_CHECK(std::isfinite(gemm_tflops) && gemm_tflops > 0, "--gemm-tflops = ", gemm_tflops, " must be > 0");
    EVENEP_CHECK(std::isfinite(link_gbps) && link_gbps > 0, "--link-gbps = ", link_gbps, " must be > 0");
    EVENEP_CHECK(std::isfinite(group_us) && group_us >= -1, "--group-us = ", group_us, " must be >= 0 (or -1)");
}

double StepModel::group_cost_us() const {
    if (group_us >= 0) return group_us;
    return 3.0 * (H / 128.0) * (ffn_hidden / 256.0) * kWgradTileUs / kNumSms;
}

StepCost evaluate_step(const StepModel& model, int R, int E, std::span<const int32_t> tpe, const SystemStep& step) {
    const size_t n = static_cast<size_t>(R) * E;
    EVENEP_CHECK(tpe.size() == n && step.alloc.size() == n, "step model: tpe has ", tpe.size(), " and alloc ",
                 step.alloc.size(), " values, expected R*E = ", n);
    StepCost c;
    c.rows.assign(R, 0);
    std::vector<double> compute_us(R, 0.0);
    std::vector<int64_t> sent(R, 0), recv(R, 0);
    const double row_us = kFlopsPerRowPerHH * model.H * model.ffn_hidden / (model.gemm_tflops * 1e12) * 1e6;
    const double group_us = model.group_cost_us();
    for (int e = 0; e < E; ++e) {
        int64_t load = 0, placed = 0;
        for (int r = 0; r < R; ++r) {
            const int64_t src = tpe[static_cast<size_t>(r) * E + e], a = step.alloc[static_cast<size_t>(e) * R + r];
            EVENEP_CHECK(a >= 0, "step model: alloc of expert ", e, " on rank ", r, " is negative (", a, ")");
            load += src;
            placed += a;
            const int64_t keep = std::min(src, a);
            sent[r] += src - keep;
            recv[r] += a - keep;
            c.rows[r] += a;
            if (a > 0) {
                const int64_t padded = (a + model.tp - 1) / model.tp * model.tp;
                compute_us[r] += static_cast<double>(padded) * row_us + group_us;
            }
        }
        EVENEP_CHECK(load == placed, "step model: expert ", e, " has ", load, " entries but ", placed, " placed");
    }
    int64_t token_max = 0, token_total = 0;
    for (int r = 0; r < R; ++r) {
        token_max = std::max({token_max, sent[r], recv[r]});
        token_total += sent[r];
    }
    const double row_bytes = 2.0 * model.H;
    const double bytes_per_ms = model.link_gbps * 1e6;
    const auto [pre_max, pre_total] = busiest(R, step.prefetch);
    const auto [red_max, red_total] = busiest(R, step.reduce_grad);
    c.rows_max_over_mean = imbalance(c.rows);
    c.compute_ms = *std::max_element(compute_us.begin(), compute_us.end()) * 1e-3;
    c.rank_compute_ms.resize(R);
    for (int r = 0; r < R; ++r) c.rank_compute_ms[r] = compute_us[r] * 1e-3;
    c.token_phase_ms = static_cast<double>(token_max) * row_bytes / bytes_per_ms;
    c.prefetch_ms = static_cast<double>(pre_max) / bytes_per_ms;
    c.reduce_ms = static_cast<double>(red_max) / bytes_per_ms;
    c.plan_ms = step.plan_us * 1e-3;
    c.step_ms = c.plan_ms + std::max(c.token_phase_ms, c.prefetch_ms) + c.compute_ms + 3 * c.token_phase_ms +
                c.reduce_ms;
    c.token_bytes = 4 * token_total * static_cast<int64_t>(row_bytes);
    c.weight_bytes = pre_total;
    c.grad_bytes = red_total;
    return c;
}

std::vector<int64_t> rank_groups(const StepModel& model, int R, int E, std::span<const int64_t> alloc, int r) {
    EVENEP_CHECK(alloc.size() == static_cast<size_t>(R) * E && r >= 0 && r < R, "rank_groups: alloc has ",
                 alloc.size(), " values (R*E = ", static_cast<size_t>(R) * E, "), rank ", r);
    std::vector<int64_t> groups;
    for (int e = 0; e < E; ++e) {
        const int64_t a = alloc[static_cast<size_t>(e) * R + r];
        if (a > 0) groups.push_back((a + model.tp - 1) / model.tp * model.tp);
    }
    return groups;
}

void add_copy_moves(const StepModel& model, int R, int E, SystemStep& step) {
    const int epn = E / R;
    for (int e = 0; e < E; ++e)
        for (int r = 0; r < R; ++r)
            if (r != e / epn && step.alloc[static_cast<size_t>(e) * R + r] > 0) {
                step.prefetch.push_back({e / epn, r, model.weight_bytes()});
                step.reduce_grad.push_back({r, e / epn, model.grad_bytes()});
            }
}

}  // namespace evenep::perf
