// Every system over a step sequence (perf/workload_run.hpp).
#include "perf/workload_run.hpp"

#include <algorithm>
#include <cmath>

#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "perf/llep.hpp"

namespace evenep::perf {
namespace {

std::vector<int64_t> loads_of(int R, int E, std::span<const int32_t> tpe) {
    std::vector<int64_t> load(E, 0);
    for (int r = 0; r < R; ++r)
        for (int e = 0; e < E; ++e) load[e] += tpe[static_cast<size_t>(r) * E + e];
    return load;
}

bool power_of_two(int R) { return R >= 1 && (R & (R - 1)) == 0; }

}  // namespace

void WorkloadRunConfig::validate() const {
    model.validate();
    eplb_schedule.validate();
    EVENEP_CHECK(layers >= 1, "layers = ", layers, " must be >= 1");
    EVENEP_CHECK(std::isfinite(plan_us) && plan_us >= 0, "--plan-us = ", plan_us, " must be >= 0");
    EVENEP_CHECK(std::isfinite(auto_slack) && auto_slack >= 0 && auto_slack <= 1, "--slack = ", auto_slack,
                 " (evenep_auto's largest budget) must be in [0, 1]");
    EVENEP_CHECK(cfg.E % cfg.R == 0, "E = ", cfg.E, " is not a multiple of R = ", cfg.R);
    for (int n : eplb_redundant)
        EVENEP_CHECK(n >= -1 && n <= cfg.E, "--eplb-redundant = ", n, " must be -1 (= epn) or in [0, E = ", cfg.E, "]");
    if (lplb_topology != "auto") parse_lplb_topology(lplb_topology, cfg.R);
    EVENEP_CHECK(std::isfinite(llep_threshold) && llep_threshold >= 1, "--llep-threshold = ", llep_threshold,
                 " must be >= 1");
}

void add_replica_sync_moves(const StepModel& model, const std::vector<std::vector<int32_t>>& holders, EplbSync sync,
                            std::vector<Move>& prefetch, std::vector<Move>& reduce_grad) {
    for (const std::vector<int32_t>& h : holders)
        for_each_replica_sync(
            h, sync, model.grad_bytes(), model.weight_bytes(),
            [&](int32_t from, int32_t to, int64_t bytes) { reduce_grad.push_back({from, to, bytes}); },
            [&](int32_t from, int32_t to, int64_t bytes) { prefetch.push_back({from, to, bytes}); });
}

struct WorkloadRunner::State {
    Planner planner;
    Planner auto_planner;  // evenep_auto: the auto policy with the run's step-model coefficients
    Plan plan;
    LplbTopology topology;
    // [layer]: EPLB per redundant value, its window and placement; LPLB's window and edges.
    std::vector<std::vector<EplbWindow>> eplb_window;
    std::vector<std::vector<EplbPlacement>> eplb_placement;
    std::vector<EplbWindow> lplb_window;
    std::vector<std::vector<LplbEdge>> lplb_edges;
    // [layer] evenep_placed: the homes' window and permutation (slot_expert[r*epn + j] = the expert rank r homes).
    std::vector<EplbWindow> placed_window;
    std::vector<EplbPlacement> placed;

    explicit State(const WorkloadRunConfig& c)
        : planner(c.cfg, c.mode),
          auto_planner(auto_config(c), c.mode),
          topology(c.lplb_topology == "auto" ? (power_of_two(c.cfg.R) ? LplbTopology::kHypercube : LplbTopology::kTorus)
                                             : parse_lplb_topology(c.lplb_topology, c.cfg.R)) {
        auto_planner.set_auto_model(c.model.auto_cost_model());
    }
    static Config auto_config(const WorkloadRunConfig& c) {
        Config a = c.cfg;
        a.slack = c.auto_slack;
        a.policy = PlannerPolicy::kAuto;
        return a;
    }
};

WorkloadRunner::WorkloadRunner(const WorkloadRunConfig& cfg) : cfg_(cfg) {
    cfg_.validate();
    state_ = std::make_unique<State>(cfg_);
    const int R = cfg_.cfg.R, E = cfg_.cfg.E, epn = E / R;
    {  // one EPLB per distinct slot count (4 and -1 are the same when epn = 4)
        std::vector<int> distinct;
        for (int n : cfg_.eplb_redundant) {
            const int red = n < 0 ? epn : n;
            if (std::find(distinct.begin(), distinct.end(), red) == distinct.end()) distinct.push_back(red);
        }
        cfg_.eplb_redundant = distinct;
    }
    const auto add = [this](std::string name, std::string label, int redundant, std::string topology) {
        SystemSeries s;
        s.name = std::move(name);
        s.label = std::move(label);
        s.num_redundant = redundant;
        s.topology = std::move(topology);
        series_.push_back(std::move(s));
    };
    add("evenep_auto", "evenep_auto", 0, "");
    add("evenep_exact", "evenep_exact", 0, "");
    add("conventional", "conventional", 0, "");
    state_->eplb_window.resize(cfg_.layers);
    state_->eplb_placement.resize(cfg_.layers);
    for (int red : cfg_.eplb_redundant) {
        add("eplb", red == epn ? "eplb/epn" : "eplb/" + std::to_string(red), red, "");
        const EplbConfig ecfg{.num_ranks = R, .num_experts = E, .slots_per_rank = epn + red};
        for (int l = 0; l < cfg_.layers; ++l) state_->eplb_window[l].emplace_back(ecfg, cfg_.eplb_schedule);
    }
    add("lplb", "lplb", 0, to_string(state_->topology));
    add("llep", "llep", 0, "");
    const EplbConfig lcfg{.num_ranks = R, .num_experts = E, .slots_per_rank = epn};
    for (int l = 0; l < cfg_.layers; ++l) state_->lplb_window.emplace_back(lcfg, cfg_.eplb_schedule);
    state_->lplb_edges.resize(cfg_.layers);
    if (cfg_.placed) {
        add("evenep_placed", "evenep_placed", 0, "");
        for (int l = 0; l < cfg_.layers; ++l) state_->placed_window.emplace_back(lcfg, cfg_.eplb_schedule);
        state_->placed.resize(cfg_.layers);
    }
}

WorkloadRunner::~WorkloadRunner() = default;

void WorkloadRunner::run_step(int64_t step, std::span<const StepUnit> units) {
    const int R = cfg_.cfg.R, E = cfg_.cfg.E, epn = E / R;
    const StepModel& model = cfg_.model;
    State& st = *state_;
    const size_t num_eplb = cfg_.eplb_redundant.size();
    for (const StepUnit& u : units)
        EVENEP_CHECK(u.layer >= 0 && u.layer < cfg_.layers && u.tpe.size() == static_cast<size_t>(R) * E &&
                         u.s.size() == static_cast<size_t>(R),
                     "workload run: a unit of layer ", u.layer, " has ", u.tpe.size(), " counts, expected R*E = ",
                     static_cast<size_t>(R) * E);

    // Re-placements due this step: their weight moves go to each layer's first unit.
    std::vector<std::vector<std::vector<Move>>> replace_moves(cfg_.layers,
                                                              std::vector<std::vector<Move>>(num_eplb + 1));
    std::vector<std::vector<Move>> placed_moves(cfg_.layers);
    for (int l = 0; l < cfg_.layers; ++l) {
        for (size_t i = 0; i < num_eplb; ++i) {
            EplbWindow& w = st.eplb_window[l][i];
            if (!w.due(step) && step != 0) continue;
            EplbPlacement next = w.place();
            if (step != 0)  // the initial placement is loaded with the model, not during a step
                for (size_t slot = 0; slot < next.slot_expert.size(); ++slot) {
                    const int32_t e = next.slot_expert[slot];
                    const int r = next.rank_of_slot(static_cast<int>(slot));
                    if (e != st.eplb_placement[l][i].slot_expert[slot] && r != e / epn)
                        replace_moves[l][i].push_back({e / epn, r, model.weight_bytes()});
                }
            if (st.eplb_placement[l].size() <= i) st.eplb_placement[l].resize(i + 1);
            st.eplb_placement[l][i] = std::move(next);
        }
        if (step == 0 || st.lplb_window[l].due(step)) {
            std::vector<LplbEdge> next = lplb_edges(st.topology, R, E, st.lplb_window[l].window_load());
            if (step != 0)
                for (size_t j = 0; j < next.size(); ++j)
                    if (j >= st.lplb_edges[l].size() || next[j].expert != st.lplb_edges[l][j].expert)
                        replace_moves[l][num_eplb].push_back({next[j].home, next[j].holder, model.weight_bytes()});
            st.lplb_edges[l] = std::move(next);
        }
        if (cfg_.placed && (step == 0 || st.placed_window[l].due(step))) {
            EplbPlacement next = st.placed_window[l].place();
            if (step != 0) {
                std::vector<int32_t> old_home(E), new_home(E);
                for (int i = 0; i < E; ++i) {
                    old_home[st.placed[l].slot_expert[i]] = i / epn;
                    new_home[next.slot_expert[i]] = i / epn;
                }
                for (int e = 0; e < E; ++e)
                    if (old_home[e] != new_home[e])
                        placed_moves[l].push_back({old_home[e], new_home[e], model.weight_bytes()});
            }
            st.placed[l] = std::move(next);
        }
    }

    const size_t num_systems = series_.size();
    std::vector<double> step_ms(num_systems, 0.0), imb(num_systems, 0.0);
    std::vector<std::vector<int64_t>> rows(num_systems, std::vector<int64_t>(R, 0));
    std::vector<int64_t> tok(num_systems, 0), wgt(num_systems, 0), grd(num_systems, 0);
    double auto_ppm = 0;  // evenep_auto's budgets summed over the units
    std::vector<std::vector<int64_t>> layer_load(cfg_.layers, std::vector<int64_t>(E, 0));
    std::vector<int> first_unit(cfg_.layers, -1), last_unit(cfg_.layers, -1);
    for (size_t k = 0; k < units.size(); ++k) {
        if (first_unit[units[k].layer] < 0) first_unit[units[k].layer] = static_cast<int>(k);
        last_unit[units[k].layer] = static_cast<int>(k);
    }
    for (size_t k = 0; k < units.size(); ++k) {
        const StepUnit& u = units[k];
        const int l = u.layer;
        const bool first = first_unit[l] == static_cast<int>(k), last = last_unit[l] == static_cast<int>(k);
        const std::vector<int64_t> load = loads_of(R, E, u.tpe);
        for (int e = 0; e < E; ++e) layer_load[l][e] += load[e];
        std::vector<SystemStep> sys(num_systems);
        // evenep_auto, evenep_exact
        st.auto_planner.plan(u.tpe, u.s, st.plan);
        auto_ppm += st.plan.slack_ppm;
        sys[0].alloc.assign(st.plan.alloc.begin(), st.plan.alloc.end());
        st.planner.plan(u.tpe, u.s, st.plan);
        sys[1].alloc.assign(st.plan.alloc.begin(), st.plan.alloc.end());
        for (int i = 0; i < 2; ++i) {
            add_copy_moves(model, R, E, sys[i]);
            sys[i].plan_us = cfg_.plan_us;
        }
        // conventional
        sys[2].alloc.assign(static_cast<size_t>(E) * R, 0);
        for (int e = 0; e < E; ++e) sys[2].alloc[static_cast<size_t>(e) * R + e / epn] = load[e];
        // eplb
        for (size_t i = 0; i < num_eplb; ++i) {
            SystemStep& s = sys[3 + i];
            const EplbPlacement& p = st.eplb_placement[l][i];
            s.alloc = eplb_alloc(p, load);
            if (first) s.prefetch = replace_moves[l][i];
            if (last) add_replica_sync_moves(model, eplb_holders(p), cfg_.eplb_sync, s.prefetch, s.reduce_grad);
        }
        // lplb
        {
            SystemStep& s = sys[3 + num_eplb];
            const std::vector<LplbEdge>& edges = st.lplb_edges[l];
            s.alloc = lplb_alloc(R, E, load, edges, lplb_solve(R, E, load, edges));
            s.plan_us = cfg_.plan_us;
            if (first) s.prefetch = replace_moves[l][num_eplb];
            if (last) {
                std::vector<std::vector<int32_t>> holders;
                for (const LplbEdge& ed : edges) holders.push_back({ed.home, ed.holder});
                add_replica_sync_moves(model, holders, cfg_.eplb_sync, s.prefetch, s.reduce_grad);
            }
        }
        // llep
        {
            SystemStep& s = sys[4 + num_eplb];
            s.alloc = llep_alloc(R, E, load, cfg_.llep_threshold);
            add_copy_moves(model, R, E, s);
            s.plan_us = cfg_.plan_us;
        }
        // evenep_placed: the histogram relabelled by the homes' permutation, planned as evenep_auto's
        std::vector<int32_t> placed_tpe;
        if (cfg_.placed) {
            SystemStep& s = sys[5 + num_eplb];
            const std::vector<int32_t>& perm = st.placed[l].slot_expert;
            placed_tpe.resize(u.tpe.size());
            for (int r = 0; r < R; ++r)
                for (int e = 0; e < E; ++e)
                    placed_tpe[static_cast<size_t>(r) * E + e] = u.tpe[static_cast<size_t>(r) * E + perm[e]];
            st.auto_planner.plan(placed_tpe, u.s, st.plan);
            s.alloc.assign(st.plan.alloc.begin(), st.plan.alloc.end());
            add_copy_moves(model, R, E, s);
            s.plan_us = cfg_.plan_us;
            if (first) s.prefetch.insert(s.prefetch.end(), placed_moves[l].begin(), placed_moves[l].end());
        }
        for (size_t i = 0; i < num_systems; ++i) {
            const bool relabelled = cfg_.placed && i == 5 + num_eplb;
            const StepCost c = evaluate_step(model, R, E, relabelled ? std::span<const int32_t>(placed_tpe) : u.tpe,
                                             sys[i]);
            if (observer_) observer_(k, i, sys[i], c);
            step_ms[i] += c.step_ms;
            imb[i] += c.rows_max_over_mean;
            for (int r = 0; r < R; ++r) rows[i][r] += c.rows[r];
            tok[i] += c.token_bytes;
            wgt[i] += c.weight_bytes;
            grd[i] += c.grad_bytes;
        }
    }
    for (int l = 0; l < cfg_.layers; ++l) {
        for (EplbWindow& w : st.eplb_window[l]) w.record(layer_load[l]);
        st.lplb_window[l].record(layer_load[l]);
        if (cfg_.placed) st.placed_window[l].record(layer_load[l]);
    }
    for (size_t i = 0; i < num_systems; ++i) {
        SystemSeries& s = series_[i];
        s.step_ms.push_back(step_ms[i]);
        s.rows_max_over_mean.push_back(units.empty() ? 1.0 : imb[i] / static_cast<double>(units.size()));
        s.rows.push_back(std::move(rows[i]));
        s.token_bytes.push_back(tok[i]);
        s.weight_bytes.push_back(wgt[i]);
        s.grad_bytes.push_back(grd[i]);
    }
    series_[0].slack_ppm.push_back(units.empty() ? 0.0 : auto_ppm / static_cast<double>(units.size()));
}

}  // namespace evenep::perf
