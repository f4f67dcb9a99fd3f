// One MoE layer step of EvenEP, conventional EP and EPLB-style replication on one GPU (perf/cuda/layer_bench.hpp).
#include "perf/cuda/layer_bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "evenep/buffer.hpp"
#include "evenep/config.hpp"
#include "evenep/cuda/moe_layer.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "perf/baselines.hpp"
#include "perf/cuda/bench.hpp"
#include "perf/cuda/rank_compute.hpp"
#include "perf/cuda/timing.hpp"
#include "perf/drift.hpp"
#include "perf/eplb.hpp"

namespace evenep::perf::cuda {
namespace {

using ::evenep::cuda::GemmSchedule;

Config config_of(const LayerBenchConfig& c) {
    const Config cfg{.R = c.R, .E = c.E, .K = c.K, .S = c.S, .B = -1, .tp = c.tp, .slack = c.slack, .policy = c.policy};
    BufferConfig{.cfg = cfg, .H = c.H, .ffn_hidden = c.ffn_hidden}.validate();
    return cfg;
}

int64_t padded(int64_t rows, int tp) { return (rows + tp - 1) / tp * tp; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Phases of `t` at the link bandwidth: the busiest rank's max(send, receive) bytes, milliseconds.
PhaseMs modelled(const TrafficReport& t, double link_gbps) {
    auto ms = [&](const PhaseTraffic& p) { return static_cast<double>(p.max_rank_bytes()) / (link_gbps * 1e9) * 1e3; };
    PhaseMs m;
    m.plan = ms(t.gather);
    m.dispatch = ms(t.dispatch);
    m.prefetch = ms(t.prefetch);
    m.combine = ms(t.combine);
    m.combine_backward = ms(t.combine_backward);
    m.dispatch_backward = ms(t.dispatch_backward);
    m.reduce_grad = ms(t.reduce_grad);
    return m;
}

// A system's compute figures and step estimates from its per-rank times.
void finish_system(SystemStep& s) {
    s.compute_max_ms = s.compute_ms.empty() ? 0 : *std::max_element(s.compute_ms.begin(), s.compute_ms.end());
    s.compute_mean_ms = s.compute_ms.empty() ? 0
                                             : std::accumulate(s.compute_ms.begin(), s.compute_ms.end(), 0.0) /
                                                   static_cast<double>(s.compute_ms.size());
    // The median over ranks (of an even count: the two middle values' mean; stats_of is unit-free).
    if (!s.fp8_home_cast_ms.empty()) s.fp8_home_cast_median_ms = stats_of(s.fp8_home_cast_ms).median_us;
    s.imbalance = imbalance(s.rows);
    s.step_no_overlap_ms = s.compute_max_ms + s.comm.communication();
    s.step_overlapped_ms = s.step_no_overlap_ms - std::min(s.comm.dispatch, s.comm.prefetch);
}

// Times every system's ranks interleaved (the i-th timed rank of each system, then the next), so that a drift of
// the GPU's clocks during the point is shared by the systems; systems with compute_as >= 0 copy that system's times.
void time_systems(LayerPointWork& w, RankComputeTimer& timer, const LayerBenchConfig& cfg) {
    size_t most = 0;
    for (const auto& r : w.timed_ranks) most = std::max(most, r.size());
    for (size_t i = 0; i < most; ++i)
        for (size_t s = 0; s < w.systems.size(); ++s) {
            if (w.compute_as[s] >= 0 || i >= w.timed_ranks[s].size()) continue;
            const bool fp8 = w.systems[s].fp8;
            const RankComputeTime t =
                timer.time(w.groups[s][i], cfg.warmup, cfg.iters, fp8,
                           fp8 ? std::span<const char>(w.slot_groups[w.timed_ranks[s][i]]) : std::span<const char>{},
                           fp8 ? cfg.micro_batches : 1);
            SystemStep& st = w.systems[s];
            st.timed_ranks.push_back(w.timed_ranks[s][i]);
            st.forward_ms.push_back(t.forward_ms);
            st.backward_ms.push_back(t.backward_ms);
            st.compute_ms.push_back(t.total_ms());
            if (fp8) st.fp8_home_cast_ms.push_back(t.fp8_home_cast_ms);
        }
    for (size_t s = 0; s < w.systems.size(); ++s) {
        SystemStep& st = w.systems[s];
        if (w.compute_as[s] >= 0) {
            const SystemStep& from = w.systems[static_cast<size_t>(w.compute_as[s])];
            st.timed_ranks = from.timed_ranks;
            st.forward_ms = from.forward_ms, st.backward_ms = from.backward_ms, st.compute_ms = from.compute_ms;
            st.fp8_home_cast_ms = from.fp8_home_cast_ms;
        }
        finish_system(st);
    }
}

std::vector<int> all_ranks(int R) {
    std::vector<int> v(R);
    std::iota(v.begin(), v.end(), 0);
    return v;
}

// Data movement of EvenEP as the library runs it on one GPU (all virtual ranks per launch).
void measure_movement(const LayerBenchConfig& cfg, LayerPointResult& out) {
    ::evenep::perf::BenchConfig bc;
    bc.R = cfg.R, bc.E = cfg.E, bc.K = cfg.K, bc.S = cfg.S, bc.H = cfg.H, bc.ffn_hidden = cfg.ffn_hidden,
    bc.tp = cfg.tp;
    bc.maxvio = cfg.target_maxvio;
    bc.slack = cfg.slack;
    bc.policy = cfg.policy;
    bc.seed = cfg.seed;
    bc.warmup = 3, bc.iters = 10;
    bc.check = cfg.check;
    bc.expert_projections = 3;
    try {
        const auto rows =
            ::evenep::perf::bench_point(bc, {"plan", "dispatch", "combine", "prefetch", "reduce"}, cfg.copy_gbps);
        for (const auto& r : rows) {
            out.measured.push_back({r.op, r.median_us, r.bytes, r.wrong, r.note});
            if (r.wrong > 0) out.wrong += r.wrong;
        }
        out.measured_note =
            "all R virtual ranks per launch on one GPU (bench_point; its own routing at the same "
            "target maxvio and seed)";
    } catch (const Error& e) {
        (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
        out.measured.clear();
        out.measured_note = std::string("not measured: ") + e.what();
    }
}

}  // namespace

LayerPointEstimate estimate_layer_point(const LayerBenchConfig& c, double tflops) {
    const Config cfg = config_of(c);
    LayerPointEstimate e;
    e.compute_bytes = static_cast<double>(
        RankComputeTimer::bytes_needed(c.H, c.ffn_hidden, cfg.num_groups(), cfg.recv_rows(), c.fp8));
    const BufferSizes b = buffer_sizes(BufferConfig{.cfg = cfg, .H = c.H, .ffn_hidden = c.ffn_hidden});
    const double expert = static_cast<double>(c.H) * c.ffn_hidden;
    // Per virtual rank: its communication buffer, x and out [S, H], the routing, and one projection of its experts
    // and slots (bench_point drops projections that do not fit, down to one).
    e.movement_bytes = static_cast<double>(c.R) * (static_cast<double>(b.comm_total) + 4.0 * c.S * c.H +
                                                   8.0 * c.S * c.K + (cfg.epn() + cfg.num_slots()) * expert * 4);
    // GEMM flops of one row, forward (3 projections) and backward (dgrad + wgrad of each): 18 H H'.
    const double row_flops = 18.0 * expert;
    const double rows = static_cast<double>(c.S) * c.K;  // per rank on average
    // every rank of EvenEP, conventional EP and each EPLB placement
    // (the FP8 layer's ranks: about half the GEMM time of a bf16 rank)
    const double timed_rows = (2.0 + (c.fp8 ? 0.5 : 0.0) + static_cast<double>(c.redundant.size())) * c.R * rows;
    e.seconds = timed_rows * row_flops * (c.warmup + c.iters) / (tflops * 1e12) + c.warm_seconds +
                (c.measure_data_movement ? 5.0 : 0.0) + 2.0 + 2e-6 * c.R * rows;  // + routing, plan, baselines (host)
    return e;
}

LayerPointWork prepare_layer_point(const LayerBenchConfig& c, const Routing& routing) {
    const Config cfg = config_of(c);
    EVENEP_CHECK(routing.R == c.R && routing.E == c.E && routing.K == c.K, "bench layer: routing R/E/K ", routing.R,
                 "/", routing.E, "/", routing.K, " differ from the point's ", c.R, "/", c.E, "/", c.K);
    EVENEP_CHECK(c.link_gbps > 0, "bench layer: link bandwidth ", c.link_gbps, " GB/s must be positive");
    EVENEP_CHECK(c.micro_batches >= 1, "bench layer: micro_batches = ", c.micro_batches,
                 " must be >= 1 (micro-batches per optimizer step sharing the FP8 home cast)");
    LayerPointWork w;
    w.maxvio = routing.maxvio();
    const int R = c.R, G = cfg.num_groups(), epn = cfg.epn();
    const std::vector<int32_t> tpe = routing.tpe();

    // EvenEP: the plan, every rank's groups, the traffic model.
    // Under auto the step-cost model of this layer's shape (as MoeLayer sets it).
    Planner planner(cfg, PlannerMode::kOptimized);
    planner.set_auto_model(detail::make_auto_cost_model(c.H, c.ffn_hidden, c.tp));
    Plan plan;
    planner.plan(tpe, routing.s, plan);
    w.slack_ppm = plan.slack_ppm;
    TrafficReport ev_traffic, ev8_traffic;
    {
        std::vector<std::vector<int32_t>> dst(R);
        for (int r = 0; r < R; ++r) {
            dst[r].resize(static_cast<size_t>(routing.s[r]) * c.K);
            compute_dst(plan, r, routing.topk_idx[r], dst[r]);
        }
        ev_traffic = evenep_traffic(plan, dst, c.H, c.ffn_hidden, /*training=*/true);
        if (c.fp8) ev8_traffic = ::evenep::cuda::fp8_traffic(ev_traffic, plan, dst, c.H, c.ffn_hidden);
    }
    std::vector<std::vector<int64_t>> ev_groups(R, std::vector<int64_t>(G));
    w.slot_groups.assign(R, std::vector<char>(G, 0));
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) {
            ev_groups[r][g] = plan.group_end(r, g) - plan.group_begin(r, g);
            w.slot_groups[r][g] = plan.group_source[static_cast<size_t>(r) * G + g] == WeightSource::kSlot;
        }

    // Conventional EP: every rank its home experts, all their rows.
    const std::vector<int64_t> load = expert_loads(cfg, tpe);
    std::vector<std::vector<int64_t>> cv_groups(R, std::vector<int64_t>(epn));
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < epn; ++j) cv_groups[r][j] = padded(load[static_cast<size_t>(r) * epn + j], c.tp);
    const TrafficReport cv_traffic = conventional_traffic(cfg, routing.topk_idx, c.H, /*training=*/true);

    // EPLB-style: placed on the previous step of the drifting routing, computing this one.
    const DriftSpec drift{
        .spec = {.R = R, .E = c.E, .K = c.K, .S = c.S, .seed = c.seed}, .sigma = c.sigma, .drift = c.drift};
    std::vector<int64_t> prev_load;
    {
        const Routing prev = drift_routing(drift, -1);
        w.eplb_prev_maxvio = prev.maxvio();
        prev_load = expert_loads(cfg, prev.tpe());
    }
    EVENEP_CHECK(!c.eplb_syncs.empty(), "bench layer: give at least one EPLB replica sync model");
    EVENEP_CHECK(!c.redundant.empty(), "bench layer: give at least one EPLB redundant slot count");
    SystemStep ev, cv;
    ev.system = "evenep", cv.system = "conventional";
    ev.rows.assign(plan.q.begin(), plan.q.end());
    cv.rows = conventional_rows(cfg, load);
    ev.comm = modelled(ev_traffic, c.link_gbps);
    cv.comm = modelled(cv_traffic, c.link_gbps);
    ev.max_rank_link_bytes = ev_traffic.total().max_rank_bytes();
    cv.max_rank_link_bytes = cv_traffic.total().max_rank_bytes();
    w.systems.push_back(std::move(ev));
    w.timed_ranks.push_back(all_ranks(R));
    w.groups.push_back(ev_groups);
    if (c.fp8) {  // the same plan and groups on the FP8 path
        SystemStep ev8 = w.systems.front();
        ev8.system = "evenep_fp8";
        ev8.fp8 = true;
        ev8.comm = modelled(ev8_traffic, c.link_gbps);
        ev8.max_rank_link_bytes = ev8_traffic.total().max_rank_bytes();
        w.systems.push_back(std::move(ev8));
        w.timed_ranks.push_back(all_ranks(R));
        w.groups.push_back(ev_groups);
    }
    w.systems.push_back(std::move(cv));
    w.timed_ranks.push_back(all_ranks(R));
    w.groups.push_back(std::move(cv_groups));
    w.compute_as.assign(w.systems.size(), -1);
    int most_slots = 0;
    for (const int requested : c.redundant) {
        const int redundant = requested < 0 ? cfg.num_slots() : requested;
        const EplbPlacement placement =
            eplb_place(EplbConfig{.num_ranks = R, .num_experts = c.E, .slots_per_rank = epn + redundant}, prev_load);
        const std::vector<int64_t> ep_rows = eplb_rows(placement, load);
        const int spr = placement.slots_per_rank;
        most_slots = std::max(most_slots, spr);
        std::vector<std::vector<int64_t>> ep_groups(R, std::vector<int64_t>(spr, 0));  // every rank's slots
        {
            const std::vector<std::vector<int32_t>> slots = eplb_slot_routing(placement, routing);
            for (const auto& rank_slots : slots)
                for (int32_t slot : rank_slots)
                    if (slot >= 0) ++ep_groups[slot / spr][slot % spr];
            for (auto& rank : ep_groups)
                for (int64_t& x : rank) x = padded(x, c.tp);
        }
        const int timed = static_cast<int>(w.systems.size());  // this placement's first system
        for (size_t i = 0; i < c.eplb_syncs.size(); ++i) {
            const TrafficReport ep_traffic =
                eplb_traffic(placement, routing, c.H, c.ffn_hidden, /*training=*/true, c.eplb_syncs[i]);
            SystemStep ep;
            ep.system = "eplb";
            ep.replica_sync = to_string(c.eplb_syncs[i]);
            ep.redundant_slots = redundant;
            ep.rows = ep_rows;
            ep.comm = modelled(ep_traffic, c.link_gbps);
            ep.max_rank_link_bytes = ep_traffic.total().max_rank_bytes();
            w.systems.push_back(std::move(ep));
            w.timed_ranks.push_back(i == 0 ? all_ranks(R) : std::vector<int>{});
            w.groups.push_back(i == 0 ? ep_groups : std::vector<std::vector<int64_t>>{});
            w.compute_as.push_back(i == 0 ? -1 : timed);
        }
    }
    w.max_groups = std::max(G, most_slots);
    w.max_rows = cfg.recv_rows();
    for (int r = 0; r < R; ++r) w.max_rows = std::max<int64_t>(w.max_rows, plan.rows_used(r));
    return w;
}

LayerPointResult run_layer_point(const LayerBenchConfig& c, const Routing& routing) {
    const auto t0 = std::chrono::steady_clock::now();
    LayerPointWork w = prepare_layer_point(c, routing);
    LayerPointResult out;
    out.cfg = c;
    out.maxvio = w.maxvio;
    out.eplb_prev_maxvio = w.eplb_prev_maxvio;
    out.slack_ppm = w.slack_ppm;
    if (c.measure_data_movement) measure_movement(c, out);
    // The GPU planner of one rank as Ep::plan runs it (EpOptions::planner_kernel's default, kCluster:
    // plan_rank_cluster; the one-block planner under that name where the shape does not fit the cluster).
    for (const MeasuredOp& m : out.measured)
        if (m.op == "plan_rank_cluster")
            for (SystemStep& st : w.systems)
                if (st.system == "evenep" || st.system == "evenep_fp8") st.comm.plan += m.median_us * 1e-3;
    {
        // With fp8, the FP8 forward casts the rank's epn home experts (prefetch_weight's cast; counted once per
        // c.micro_batches forwards, time_systems).
        RankComputeTimer timer(c.H, c.ffn_hidden, w.max_groups, w.max_rows, c.seed, GemmSchedule::kFixed, c.fp8,
                               config_of(c).epn());
        if (c.check) out.gemm_check_error = timer.check_forward(w.groups[0][0]);
        out.warm_up_ms = timer.warm_up(w.groups[0][0], c.warm_seconds);
        time_systems(w, timer, c);
    }
    out.systems = std::move(w.systems);
    out.seconds = seconds_since(t0);
    return out;
}

}  // namespace evenep::perf::cuda
