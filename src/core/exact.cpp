// The exact optimum of the planning problem (SPEC §3.5) as a mixed-integer program solved with CBC.
// Formulation, lower-bound rows and the meaning of the figures: docs/quality.md.
//
// Model (B = epn, so every remote expert of a rank is a prefetched copy). For expert e with load T_e > 0 and
// rank d, with ub[e][d] = min(T_e, q_d):
//   x[e][d] in [0, ub[e][d]] integer         entries of e computed on d
//   y[e][d] in {0, 1}, d != home(e)          d holds a copy of e;  x[e][d] <= ub[e][d] * y[e][d]
//   sum_d x[e][d] = T_e                      (conservation)
//   sum_e x[e][d] = q_d                      (perfect balance, SPEC invariant 1)
//   sum_{e not homed on d} y[e][d] <= epn    (bounded redundancy, SPEC invariant 3)
// Costs (the planner's, evenep/detail/plan_core.hpp plan_cost_of):
//   total copies          sum y
//   busiest rank traffic  t >= received_d + pushed_d, received_d = sum_{e not home d} y[e][d],
//                         pushed_h = sum_{e home h, d != h} y[e][d]
//   crossing rows         N - sum m, m[e][d] <= tpe[d][e], m[e][d] <= x[e][d] (locality-aware placement keeps
//                         min(tpe, x) entries on their source rank)
// Each objective is lexicographic and solved in two stages, each stage a fresh model:
//   kTotalCopies          1: min sum y                   2: max sum m  s.t. sum y <= stage-1 copies
//   kMaxRankCopyTraffic   1: min t                       2: min sum y  s.t. t <= stage-1 traffic
// Stage 1 gets the whole (wall-clock) time limit, stage 2 what is left of it, at most kSecondaryShare of it.
// ExactResult::optimal reports whether stage 1 (the primary objective, ExactResult::objective) was proved
// optimal; stage 2 only ever improves the secondary cost.
// Both stages start from a known plan (stage 1: the cheaper of the two planners'; stage 2: stage 1's), so the
// answer is never worse than the planners even when the limit stops the search.
// Valid lower-bound rows (they cut no integer solution, they only tighten the LP relaxation) make most
// instances provable at the root: see compute_bounds.
// Every reported figure is recomputed from the solver's x with plan_cost_of after checking balance,
// conservation and the epn bound, so a solver or model error cannot produce a wrong figure silently.
#include "evenep/exact.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "evenep/detail/plan_core.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"

#ifdef EVENEP_HAVE_CBC
#include <coin/Cbc_C_Interface.h>
#endif

namespace evenep {
namespace {

inline constexpr int kMaxExactRanks = 8;
inline constexpr int kMaxExactExperts = 64;
// Stage 2 (the secondary objective) runs for at most this share of the time limit: the secondary cost is
// reported, the primary one is what the quality figures measure.
inline constexpr double kSecondaryShare = 0.25;

void check_exact_inputs(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s) {
    cfg.validate();
    EVENEP_CHECK(cfg.R <= kMaxExactRanks, "exact: R = ", cfg.R, " exceeds the exact solver's limit of ",
                 kMaxExactRanks, " ranks");
    EVENEP_CHECK(cfg.E <= kMaxExactExperts, "exact: E = ", cfg.E, " exceeds the exact solver's limit of ",
                 kMaxExactExperts, " experts");
    EVENEP_CHECK(cfg.num_slots() == cfg.epn(), "exact: B = ", cfg.B, " but the exact model assumes B = epn = ",
                 cfg.epn());
    check_plan_inputs(cfg, tpe, s, "exact");
}

#ifdef EVENEP_HAVE_CBC

// A lower bound on the copies leaving one side of a cut of the ranks, as a row over the y columns that cross
// it in that direction.
struct CutBound {
    int side = 0;        // bit mask of the ranks on the exporting side
    int64_t copies = 0;  // at least this many copies of experts homed on `side` are computed outside it
};

// The instance in the planner's terms plus the valid lower bounds.
struct Instance {
    int R = 0, E = 0, epn = 0;
    int64_t N = 0;
    std::vector<int64_t> load;  // [E] T_e
    std::vector<int32_t> q;     // [R]
    std::vector<int32_t> tpe;   // [R*E]
    std::vector<int64_t> imbalance;  // [R] (sum of T_e over the rank's experts) - q_r
    int64_t min_copies = 0;          // see tree_lower_bound
    std::vector<CutBound> cuts;      // see compute_bounds

    int64_t ub(int e, int d) const { return std::min<int64_t>(load[e], q[d]); }
};

// Copies form a graph on the ranks (home -> computing rank). In each connected component the loads must add up
// to the quotas, and a component of c ranks has at least c-1 copies, so copies >= R - (the most blocks of a
// partition of the ranks into blocks of zero total imbalance). R <= 8: a DP over the 2^R subsets.
int64_t tree_lower_bound(const std::vector<int64_t>& imbalance) {
    const int R = static_cast<int>(imbalance.size());
    const int full = (1 << R) - 1;
    std::vector<int64_t> sum(full + 1, 0);
    std::vector<int> blocks(full + 1, -1);  // -1: mask cannot be split into zero-sum blocks
    for (int mask = 1; mask <= full; ++mask) {
        const int low = mask & -mask;
        sum[mask] = sum[mask ^ low] + imbalance[std::countr_zero(static_cast<unsigned>(low))];
    }
    blocks[0] = 0;
    for (int mask = 1; mask <= full; ++mask) {
        if (sum[mask] != 0) continue;
        const int low = mask & -mask;
        // The block holding the lowest rank of `mask`, then the best split of the rest.
        for (int sub = mask; sub != 0; sub = (sub - 1) & mask)
            if ((sub & low) != 0 && sum[sub] == 0 && blocks[mask ^ sub] >= 0)
                blocks[mask] = std::max(blocks[mask], 1 + blocks[mask ^ sub]);
    }
    return R - blocks[full];
}

// Fewest pieces, piece i at most caps[i], that add up to `need` (0 if need <= 0; all of them if they fall short).
int64_t cover_count(std::vector<int64_t> caps, int64_t need) {
    std::sort(caps.begin(), caps.end(), std::greater<>());
    int64_t count = 0;
    for (int64_t c : caps) {
        if (need <= 0) break;
        need -= c;
        ++count;
    }
    return count;
}

// Cut bounds: a set S of ranks with total imbalance b(S) > 0 must export b(S) entries to ranks outside S, only
// through copies of experts homed in S. An expert e exports at most min(T_e, q(outside)) entries (each of its
// exporting copies counts at least once), and one copy to d carries at most min(T_e, q_d); so at least
// max(cover over experts, ceil(b(S) / largest single copy)) copies leave S. One row per side S with b(S) > 0
// (the other side of the same cut gives no row); for single ranks this is the receiver's / donor's own bound.
void compute_bounds(Instance& in) {
    const int R = in.R, E = in.E;
    in.imbalance.assign(R, 0);
    for (int e = 0; e < E; ++e) in.imbalance[e / in.epn] += in.load[e];
    for (int r = 0; r < R; ++r) in.imbalance[r] -= in.q[r];
    in.min_copies = tree_lower_bound(in.imbalance);
    in.cuts.clear();
    const int full = (1 << R) - 1;
    for (int side = 1; side < full; ++side) {
        int64_t b = 0, q_out = 0;
        for (int r = 0; r < R; ++r) {
            if ((side >> r) & 1)
                b += in.imbalance[r];
            else
                q_out += in.q[r];
        }
        if (b <= 0) continue;
        std::vector<int64_t> expert_caps;
        int64_t max_piece = 0;
        for (int e = 0; e < E; ++e) {
            if (((side >> (e / in.epn)) & 1) == 0 || in.load[e] == 0) continue;
            expert_caps.push_back(std::min(in.load[e], q_out));
            for (int d = 0; d < R; ++d)
                if (((side >> d) & 1) == 0) max_piece = std::max(max_piece, in.ub(e, d));
        }
        const int64_t by_expert = cover_count(expert_caps, b);
        const int64_t by_piece = max_piece > 0 ? (b + max_piece - 1) / max_piece : 0;
        in.cuts.push_back({side, std::max(by_expert, by_piece)});
    }
}

struct Columns {
    std::vector<int> x;  // [E*R], -1 for empty experts
    std::vector<int> y;  // [E*R], -1 on the home rank, for empty experts and where ub = 0
    std::vector<int> m;  // [E*R], -1 unless the crossing stage and tpe[d][e] > 0
    int t = -1;
    int num = 0;
};

// Owns one CBC model.
class CbcModel {
public:
    CbcModel() : m_(Cbc_newModel()) { EVENEP_CHECK_KIND(ErrorKind::kRuntime, m_ != nullptr, "exact: CBC: out of memory"); }
    ~CbcModel() { Cbc_deleteModel(m_); }
    CbcModel(const CbcModel&) = delete;
    CbcModel& operator=(const CbcModel&) = delete;
    Cbc_Model* get() const { return m_; }

private:
    Cbc_Model* m_;
};

enum class Stage {
    kCopies,         // min sum y
    kCrossing,       // max sum m subject to sum y <= bound
    kTraffic,        // min t
    kTrafficCopies,  // min sum y subject to t <= bound
};

// CBC matches MIP-start values to columns by name, so every column gets a distinct one.
int add_col(Cbc_Model* model, Columns& cols, const char* kind, int e, int d, double lb, double ub, double obj) {
    char name[32];
    std::snprintf(name, sizeof(name), "%s_%d_%d", kind, e, d);
    Cbc_addCol(model, name, lb, ub, obj, 1, 0, nullptr, nullptr);  // all columns integer
    return cols.num++;
}

struct Row {
    std::vector<int> idx;
    std::vector<double> val;
    void add(int col, double v) {
        idx.push_back(col);
        val.push_back(v);
    }
    void clear() {
        idx.clear();
        val.clear();
    }
};

void add_row(Cbc_Model* model, const Row& row, char sense, double rhs) {
    if (row.idx.empty()) return;
    Cbc_addRow(model, "", static_cast<int>(row.idx.size()), row.idx.data(), row.val.data(), sense, rhs);
}

Columns build_model(Cbc_Model* model, const Instance& in, Stage stage, int64_t bound) {
    const int R = in.R, E = in.E;
    const bool traffic = stage == Stage::kTraffic || stage == Stage::kTrafficCopies;
    Columns c;
    c.x.assign(static_cast<size_t>(E) * R, -1);
    c.y.assign(static_cast<size_t>(E) * R, -1);
    c.m.assign(static_cast<size_t>(E) * R, -1);
    const double y_cost = (stage == Stage::kCopies || stage == Stage::kTrafficCopies) ? 1.0 : 0.0;
    for (int e = 0; e < E; ++e) {
        if (in.load[e] == 0) continue;
        for (int d = 0; d < R; ++d) {
            const size_t i = static_cast<size_t>(e) * R + d;
            const double ub = static_cast<double>(in.ub(e, d));
            c.x[i] = add_col(model, c, "x", e, d, 0.0, ub, 0.0);
            if (d != e / in.epn && ub > 0) c.y[i] = add_col(model, c, "y", e, d, 0.0, 1.0, y_cost);
            const int32_t t_de = in.tpe[static_cast<size_t>(d) * E + e];
            // m is integral at every optimum (x and tpe are); integer lets CBC round the objective bound.
            if (stage == Stage::kCrossing && t_de > 0 && ub > 0)
                c.m[i] = add_col(model, c, "m", e, d, 0.0, std::min<double>(t_de, ub), -1.0);
        }
    }
    if (traffic) {
        const double t_ub = stage == Stage::kTrafficCopies ? static_cast<double>(bound) : 2.0 * E;
        c.t = add_col(model, c, "t", 0, 0, 0.0, t_ub, stage == Stage::kTraffic ? 1.0 : 0.0);
    }
    Cbc_setObjSense(model, 1.0);  // minimise

    Row row;
    for (int e = 0; e < E; ++e) {  // conservation
        if (in.load[e] == 0) continue;
        row.clear();
        for (int d = 0; d < R; ++d) row.add(c.x[static_cast<size_t>(e) * R + d], 1.0);
        add_row(model, row, 'E', static_cast<double>(in.load[e]));
    }
    for (int d = 0; d < R; ++d) {  // balance
        row.clear();
        for (int e = 0; e < E; ++e)
            if (c.x[static_cast<size_t>(e) * R + d] >= 0) row.add(c.x[static_cast<size_t>(e) * R + d], 1.0);
        add_row(model, row, 'E', static_cast<double>(in.q[d]));
    }
    for (int e = 0; e < E; ++e)
        for (int d = 0; d < R; ++d) {
            const size_t i = static_cast<size_t>(e) * R + d;
            if (c.x[i] < 0) continue;
            if (d != e / in.epn && c.y[i] >= 0) {  // copy indicator: x <= ub * y (ub = 0 already pins x)
                row.clear();
                row.add(c.x[i], 1.0);
                row.add(c.y[i], -static_cast<double>(in.ub(e, d)));
                add_row(model, row, 'L', 0.0);
            }
            if (c.m[i] >= 0) {  // m <= x
                row.clear();
                row.add(c.m[i], 1.0);
                row.add(c.x[i], -1.0);
                add_row(model, row, 'L', 0.0);
            }
        }
    for (int d = 0; d < R; ++d) {  // remote experts <= epn; busiest-rank traffic
        Row recv, load;
        for (int e = 0; e < E; ++e) {
            if (e / in.epn == d) {
                for (int d2 = 0; d2 < R; ++d2)
                    if (const int yc = c.y[static_cast<size_t>(e) * R + d2]; yc >= 0) load.add(yc, 1.0);
            } else if (const int yc = c.y[static_cast<size_t>(e) * R + d]; yc >= 0) {
                recv.add(yc, 1.0);
                load.add(yc, 1.0);
            }
        }
        add_row(model, recv, 'L', static_cast<double>(in.epn));
        if (traffic && !load.idx.empty()) {
            load.add(c.t, -1.0);
            add_row(model, load, 'L', 0.0);
        }
    }
    // Lower-bound rows.
    row.clear();
    for (int yc : c.y)
        if (yc >= 0) row.add(yc, 1.0);
    if (in.min_copies > 0) add_row(model, row, 'G', static_cast<double>(in.min_copies));
    if (stage == Stage::kCrossing) add_row(model, row, 'L', static_cast<double>(bound));
    for (const CutBound& cut : in.cuts) {
        if (cut.copies <= 0) continue;
        row.clear();
        for (int e = 0; e < E; ++e) {
            if (((cut.side >> (e / in.epn)) & 1) == 0) continue;
            for (int d = 0; d < R; ++d)
                if (const int yc = c.y[static_cast<size_t>(e) * R + d]; yc >= 0 && ((cut.side >> d) & 1) == 0)
                    row.add(yc, 1.0);
        }
        add_row(model, row, 'G', static_cast<double>(cut.copies));
    }
    return c;
}

// A feasible start from an alloc matrix [E*R]: x = alloc, y = [x > 0], m = min(tpe, x), t = its traffic.
std::vector<double> start_values(const Instance& in, const Columns& c, const std::vector<int32_t>& alloc) {
    const int R = in.R, E = in.E;
    std::vector<double> v(static_cast<size_t>(c.num), 0.0);
    std::vector<int64_t> traffic(R, 0);
    for (int e = 0; e < E; ++e)
        for (int d = 0; d < R; ++d) {
            const size_t i = static_cast<size_t>(e) * R + d;
            const int32_t a = alloc[i];
            if (c.x[i] >= 0) v[c.x[i]] = a;
            if (c.y[i] >= 0 && a > 0) {
                v[c.y[i]] = 1.0;
                traffic[d] += 1;
                traffic[e / in.epn] += 1;
            }
            if (c.m[i] >= 0) v[c.m[i]] = std::min(a, in.tpe[static_cast<size_t>(d) * E + e]);
        }
    if (c.t >= 0) v[c.t] = static_cast<double>(*std::max_element(traffic.begin(), traffic.end()));
    return v;
}

struct StageResult {
    bool found = false;
    bool optimal = false;
    double objective = 0;        // the stage's objective value of the solution
    std::vector<int32_t> alloc;  // [E*R]
};

StageResult solve_stage(const Instance& in, Stage stage, int64_t bound, const std::vector<int32_t>& start,
                        double seconds) {
    CbcModel holder;
    Cbc_Model* model = holder.get();
    const Columns c = build_model(model, in, stage, bound);
    Cbc_setLogLevel(model, 0);
    Cbc_setParameter(model, "log", "0");
    Cbc_setParameter(model, "slog", "0");
    Cbc_setParameter(model, "timeMode", "elapsed");  // the limit is wall-clock time (CBC's default is CPU time)
    Cbc_setMaximumSeconds(model, seconds);
    // Every objective is integral (integer columns, integer coefficients): a gap below 1 proves optimality.
    Cbc_setAllowableGap(model, 0.5);
    // Proximity search (local branching around the incumbent) finds the spanning-tree-like plans that reach the
    // lower bound far sooner than the default heuristics (measured: 4x less time on R = 8 instances).
    Cbc_setParameter(model, "proximity", "on");
    const std::vector<double> values = start_values(in, c, start);
    std::vector<int> idx(static_cast<size_t>(c.num));
    for (int j = 0; j < c.num; ++j) idx[j] = j;
    Cbc_setMIPStartI(model, c.num, idx.data(), values.data());
    Cbc_solve(model);
    StageResult out;
    const double* sol = Cbc_bestSolution(model);
    if (sol == nullptr) return out;
    out.found = true;
    out.optimal = Cbc_isProvenOptimal(model) != 0;
    out.objective = Cbc_getObjValue(model);
    out.alloc.assign(static_cast<size_t>(in.E) * in.R, 0);
    for (size_t i = 0; i < out.alloc.size(); ++i)
        if (c.x[i] >= 0) out.alloc[i] = static_cast<int32_t>(std::llround(sol[c.x[i]]));
    return out;
}

// Checks a plan against the invariants (a wrong answer from the solver or the model must not turn into a wrong
// figure) and returns the planner's costs of it.
detail::PlanCostValues cost_of_alloc(const Instance& in, const std::vector<int32_t>& alloc) {
    const int R = in.R, E = in.E;
    for (int e = 0; e < E; ++e) {
        int64_t sum = 0;
        for (int d = 0; d < R; ++d) {
            EVENEP_ASSERT(alloc[static_cast<size_t>(e) * R + d] >= 0, "exact: negative alloc of expert ", e);
            sum += alloc[static_cast<size_t>(e) * R + d];
        }
        EVENEP_ASSERT(sum == in.load[e], "exact: expert ", e, " places ", sum, " entries, its load is ", in.load[e]);
    }
    for (int d = 0; d < R; ++d) {
        int64_t sum = 0;
        for (int e = 0; e < E; ++e) sum += alloc[static_cast<size_t>(e) * R + d];
        EVENEP_ASSERT(sum == in.q[d], "exact: rank ", d, " computes ", sum, " entries, its quota is ", in.q[d]);
    }
    const detail::PlanDims dims{R, E, in.epn, 2 * in.epn, in.epn, 1, true, /*slack_ppm=*/0};
    std::vector<int32_t> pushed(R), recv(R), remote(R);
    detail::PlanCostValues cost{};
    const bool ok =
        detail::plan_cost_of(dims, in.tpe.data(), alloc.data(), pushed.data(), recv.data(), remote.data(), cost);
    EVENEP_ASSERT(ok, "exact: a plan holds more than epn = ", in.epn, " remote experts on some rank");
    return cost;
}

// The planners' cheaper alloc for the objective (lexicographic): stage 1's MIP start.
std::vector<int32_t> planner_start(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s,
                                   ExactObjective objective) {
    std::vector<int32_t> best;
    PlanCost best_cost{};
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        const Plan p = make_plan(cfg, mode, tpe, s);
        const PlanCost& c = p.cost;
        bool better = best.empty();
        if (!better && objective == ExactObjective::kTotalCopies)
            better = c.total_copies < best_cost.total_copies ||
                     (c.total_copies == best_cost.total_copies && c.crossing_rows < best_cost.crossing_rows);
        else if (!better)
            better = c.max_rank_copy_traffic < best_cost.max_rank_copy_traffic ||
                     (c.max_rank_copy_traffic == best_cost.max_rank_copy_traffic &&
                      c.total_copies < best_cost.total_copies);
        if (better) {
            best = p.alloc;
            best_cost = c;
        }
    }
    return best;
}

int64_t primary_of(const detail::PlanCostValues& c, ExactObjective objective) {
    return objective == ExactObjective::kTotalCopies ? c.total_copies : c.max_rank_copy_traffic;
}

int64_t secondary_of(const detail::PlanCostValues& c, ExactObjective objective) {
    return objective == ExactObjective::kTotalCopies ? c.crossing_rows : c.total_copies;
}

#endif  // EVENEP_HAVE_CBC

}  // namespace

#ifdef EVENEP_HAVE_CBC

bool exact_solver_available() { return true; }

ExactResult solve_exact(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s,
                        ExactObjective objective, double time_limit_s) {
    check_exact_inputs(cfg, tpe, s);
    EVENEP_CHECK(time_limit_s > 0, "exact: time limit ", time_limit_s, " s must be positive");
    const auto t0 = std::chrono::steady_clock::now();
    const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

    Instance in;
    in.R = cfg.R;
    in.E = cfg.E;
    in.epn = cfg.epn();
    in.tpe.assign(tpe.begin(), tpe.end());
    in.load.assign(cfg.E, 0);
    for (int r = 0; r < cfg.R; ++r)
        for (int e = 0; e < cfg.E; ++e) in.load[e] += tpe[static_cast<size_t>(r) * cfg.E + e];
    for (int64_t t : in.load) in.N += t;
    in.q.resize(cfg.R);
    for (int r = 0; r < cfg.R; ++r) in.q[r] = static_cast<int32_t>(in.N / cfg.R + (r < in.N % cfg.R ? 1 : 0));
    compute_bounds(in);

    ExactResult result;
    std::vector<int32_t> best = planner_start(cfg, tpe, s, objective);
    detail::PlanCostValues best_cost = cost_of_alloc(in, best);
    const bool copies_first = objective == ExactObjective::kTotalCopies;
    if (best_cost.total_copies == 0) {
        // Already balanced (or empty): with no copy every expert is computed whole on its home rank, so the plan
        // is the only one with zero copies and zero traffic, and its crossing rows are forced. Optimal.
        result.optimal = true;
    } else {
        // Stage 1: the primary objective.
        const StageResult first =
            solve_stage(in, copies_first ? Stage::kCopies : Stage::kTraffic, 0, best, time_limit_s);
        if (first.found) {
            const detail::PlanCostValues c = cost_of_alloc(in, first.alloc);
            // Costs counted from x never exceed those counted from y (the stage's objective): y >= [x > 0].
            EVENEP_ASSERT(primary_of(c, objective) <= std::llround(first.objective), "exact: solution has ",
                          primary_of(c, objective), " in its primary cost, the solver claims ", first.objective);
            if (primary_of(c, objective) < primary_of(best_cost, objective) ||
                (primary_of(c, objective) == primary_of(best_cost, objective) &&
                 secondary_of(c, objective) <= secondary_of(best_cost, objective))) {
                best = first.alloc;
                best_cost = c;
            }
            result.optimal = first.optimal;
        }
        // Stage 2: the secondary objective with the primary held at its value.
        const double left = std::min(time_limit_s - elapsed(), kSecondaryShare * time_limit_s);
        if (left > 0.01) {
            const Stage stage = copies_first ? Stage::kCrossing : Stage::kTrafficCopies;
            const StageResult second = solve_stage(in, stage, primary_of(best_cost, objective), best, left);
            if (second.found) {
                const detail::PlanCostValues c = cost_of_alloc(in, second.alloc);
                if (primary_of(c, objective) <= primary_of(best_cost, objective) &&
                    secondary_of(c, objective) < secondary_of(best_cost, objective)) {
                    best = second.alloc;
                    best_cost = c;
                }
            }
        }
    }
    result.total_copies = best_cost.total_copies;
    result.max_rank_copy_traffic = best_cost.max_rank_copy_traffic;
    result.crossing_rows = best_cost.crossing_rows;
    result.objective = primary_of(best_cost, objective);
    result.seconds = elapsed();
    return result;
}

#else  // !EVENEP_HAVE_CBC

bool exact_solver_available() { return false; }

ExactResult solve_exact(const Config& cfg, std::span<const int32_t> tpe, std::span<const int32_t> s,
                        ExactObjective objective, double time_limit_s) {
    check_exact_inputs(cfg, tpe, s);
    (void)objective;
    (void)time_limit_s;
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, false,
                      "exact: EvenEP was built without CBC (coinor-libcbc-dev); the exact solver is unavailable");
}

#endif  // EVENEP_HAVE_CBC

}  // namespace evenep
