// The exact ViT placement (VitPolicy::kOptimal): minimum makespan by a MILP solved with CBC, for small instances.
// The quality reference of the `bubbles` policy (docs/pipeline.md "The exact policy").
//
// The text ops keep their 1F1B order on their ranks; the MILP chooses every start time and, for every ViT piece,
// its rank and its slot between two consecutive text ops of that rank. With n_r text ops o_1..o_n on rank r
// (n = 2mV) and H a horizon no schedule needs to exceed (all costs plus one latency per op):
//   s_o, s_p >= 0 continuous          start of text op o / ViT piece p;  T >= every end  (minimise T)
//   z[p][r][k] in {0,1}, k = 0..n     p runs on rank r after o_k and before o_{k+1};  sum_{r,k} z = 1
//   a[p][r] = sum_k z[p][r][k]        p runs on rank r
//   s_{o_{j+1}} >= s_{o_j} + d        the rank's text order
//   text dependencies with their latency (ranks fixed)
//   s_p >= s_{o_k} + d_{o_k} - H(1 - z),  s_p + d_p <= s_{o_{k+1}} + H(1 - z)
//   VF p of mb i:  s_p + d_p + latency * (1 - a[p][0]) <= s_{F(i,0)}
//   VB p of mb i:  s_p >= s_{B(i,0)} + d + latency * (1 - a[p][0])
//   pieces p < q, every rank r, w[p][q] in {0,1} (1: p first):
//     s_q >= s_p + d_p - H(1 - w) - H(2 - a[p][r] - a[q][r]);  s_p >= s_q + d_q - H w - H(2 - a[p][r] - a[q][r])
//   P * T >= all work (a valid cut that tightens the LP bound)
// The solver starts from the `bubbles` schedule, so the answer is never worse than it. The solution's ranks and
// order are executed by the simulator (never later than the MILP's times), which yields the reported schedule.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/pipeline.hpp"
#include "placement_internal.hpp"

#ifdef EVENEP_HAVE_CBC
#include <coin/Cbc_C_Interface.h>
#endif

namespace evenep::pipeline {

bool optimal_policy_fits(const PipelineConfig& cfg, const VitWork& vit) {
    return 2 * vit.num_pieces() <= kMaxOptimalPieces && 2 * cfg.m * cfg.num_chunks() <= kMaxOptimalTextOps;
}

namespace detail {
namespace {

void check_fits(const PipelineConfig& cfg, const VitWork& vit) {
    EVENEP_CHECK(optimal_policy_fits(cfg, vit), "pipeline: the optimal policy takes at most ", kMaxOptimalPieces,
                 " ViT pieces and ", kMaxOptimalTextOps, " text ops; this instance has ", 2 * vit.num_pieces(),
                 " pieces and ", 2 * cfg.m * cfg.num_chunks(), " text ops (P*m*V = ", cfg.P * cfg.m * cfg.V, ")");
}

}  // namespace
}  // namespace detail

#ifdef EVENEP_HAVE_CBC

bool optimal_policy_available() { return true; }

namespace detail {
namespace {

struct Builder {
    Cbc_Model* model;
    int num = 0;
    int col(const char* kind, int i, int j, int k, double lb, double ub, double obj, bool integer) {
        char name[48];
        std::snprintf(name, sizeof(name), "%s_%d_%d_%d", kind, i, j, k);  // CBC matches MIP starts by name
        Cbc_addCol(model, name, lb, ub, obj, integer ? 1 : 0, 0, nullptr, nullptr);
        return num++;
    }
    void row(std::vector<int> idx, std::vector<double> val, char sense, double rhs) {
        Cbc_addRow(model, "", static_cast<int>(idx.size()), idx.data(), val.data(), sense, rhs);
    }
};

struct Piece {
    Step step;
    double cost;
};

}  // namespace

PolicyResult optimal_policy(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& text,
                            const Schedule& text_schedule, const PolicyOptions& options) {
    check_fits(cfg, vit);
    EVENEP_CHECK(options.time_limit_s > 0, "pipeline: optimal: time limit ", options.time_limit_s, " s must be > 0");
    const int P = cfg.P, m = cfg.m, PV = cfg.num_chunks();
    const Schedule start = bubbles_schedule(cfg, vit, text, text_schedule);

    std::vector<Piece> pieces;
    for (OpKind k : {OpKind::kVitForward, OpKind::kVitBackward}) {
        const auto& rows = k == OpKind::kVitForward ? vit.forward : vit.backward;
        for (int i = 0; i < m; ++i)
            for (int p = 0; p < static_cast<int>(rows[i].size()); ++p) pieces.push_back({{k, i, p}, rows[i][p]});
    }
    const int N = static_cast<int>(pieces.size());
    const auto text_idx = [&](OpKind k, int mb, int chunk) { return ((k == OpKind::kForward ? 0 : 1) * m + mb) * PV + chunk; };
    const auto text_cost = [&](OpKind k, int mb) { return k == OpKind::kForward ? cfg.forward_cost(mb) : cfg.backward_cost(mb); };
    double H = 1.0;
    for (int i = 0; i < m; ++i) H += PV * (cfg.forward_cost(i) + cfg.backward_cost(i));
    for (const Piece& p : pieces) H += p.cost;
    H += cfg.latency * (2.0 * m * PV + N);

    const std::unique_ptr<Cbc_Model, decltype(&Cbc_deleteModel)> holder(Cbc_newModel(), &Cbc_deleteModel);
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, holder != nullptr, "pipeline: CBC: out of memory");
    Builder b{holder.get()};
    std::vector<int> st(2 * static_cast<size_t>(m) * PV), sp(N);
    for (int i = 0; i < m; ++i)
        for (int c = 0; c < PV; ++c)
            for (OpKind k : {OpKind::kForward, OpKind::kBackward})
                st[text_idx(k, i, c)] = b.col("st", static_cast<int>(k), i, c, 0, H, 0, false);
    for (int p = 0; p < N; ++p) sp[p] = b.col("sp", p, 0, 0, 0, H, 0, false);
    const int T = b.col("T", 0, 0, 0, 0, H, 1.0, false);
    std::vector<std::vector<std::vector<int>>> z(N, std::vector<std::vector<int>>(P));
    std::vector<std::vector<int>> a(N, std::vector<int>(P));
    for (int p = 0; p < N; ++p)
        for (int r = 0; r < P; ++r) {
            a[p][r] = b.col("a", p, r, 0, 0, 1, 0, true);
            for (size_t k = 0; k <= text[r].size(); ++k) z[p][r].push_back(b.col("z", p, r, static_cast<int>(k), 0, 1, 0, true));
        }
    std::vector<std::vector<int>> w(N, std::vector<int>(N, -1));
    for (int p = 0; p < N; ++p)
        for (int q = p + 1; q < N; ++q) w[p][q] = b.col("w", p, q, 0, 0, 1, 0, true);
    Cbc_setObjSense(b.model, 1.0);

    // Text: rank order, dependencies, makespan.
    for (int r = 0; r < P; ++r)
        for (size_t j = 0; j < text[r].size(); ++j) {
            const Step& o = text[r][j];
            const int so = st[text_idx(o.kind, o.mb, o.index)];
            const double d = text_cost(o.kind, o.mb);
            if (j + 1 < text[r].size()) {
                const Step& n = text[r][j + 1];
                b.row({st[text_idx(n.kind, n.mb, n.index)], so}, {1, -1}, 'G', d);
            }
            b.row({T, so}, {1, -1}, 'G', d);
        }
    const double cross = P > 1 ? cfg.latency : 0.0;  // consecutive chunks are on different ranks when P > 1
    for (int i = 0; i < m; ++i) {
        for (int c = 1; c < PV; ++c)
            b.row({st[text_idx(OpKind::kForward, i, c)], st[text_idx(OpKind::kForward, i, c - 1)]}, {1, -1}, 'G',
                  cfg.forward_cost(i) + cross);
        b.row({st[text_idx(OpKind::kBackward, i, PV - 1)], st[text_idx(OpKind::kForward, i, PV - 1)]}, {1, -1}, 'G',
              cfg.forward_cost(i));
        for (int c = PV - 2; c >= 0; --c)
            b.row({st[text_idx(OpKind::kBackward, i, c)], st[text_idx(OpKind::kBackward, i, c + 1)]}, {1, -1}, 'G',
                  cfg.backward_cost(i) + cross);
    }
    // Pieces: one slot, slot bounds, dependencies, makespan.
    for (int p = 0; p < N; ++p) {
        const Piece& pc = pieces[p];
        std::vector<int> all;
        for (int r = 0; r < P; ++r) {
            std::vector<int> idx{a[p][r]};
            std::vector<double> val{1};
            for (size_t k = 0; k <= text[r].size(); ++k) {
                const int zc = z[p][r][k];
                all.push_back(zc);
                idx.push_back(zc);
                val.push_back(-1);
                if (k >= 1) {  // after o_k
                    const Step& o = text[r][k - 1];
                    b.row({sp[p], st[text_idx(o.kind, o.mb, o.index)], zc}, {1, -1, -H}, 'G',
                          text_cost(o.kind, o.mb) - H);
                }
                if (k < text[r].size()) {  // before o_{k+1}
                    const Step& o = text[r][k];
                    b.row({sp[p], st[text_idx(o.kind, o.mb, o.index)], zc}, {1, -1, H}, 'L', H - pc.cost);
                }
            }
            b.row(idx, val, 'E', 0);
        }
        b.row(all, std::vector<double>(all.size(), 1.0), 'E', 1);
        const int mb = pc.step.mb;
        if (pc.step.kind == OpKind::kVitForward)
            b.row({sp[p], st[text_idx(OpKind::kForward, mb, 0)], a[p][0]}, {1, -1, -cfg.latency}, 'L',
                  -pc.cost - cfg.latency);
        else
            b.row({sp[p], st[text_idx(OpKind::kBackward, mb, 0)], a[p][0]}, {1, -1, cfg.latency}, 'G',
                  cfg.backward_cost(mb) + cfg.latency);
        b.row({T, sp[p]}, {1, -1}, 'G', pc.cost);
    }
    // Valid cut: no rank is busy longer than T, so P * T >= all work.
    b.row({T}, {static_cast<double>(P)}, 'G', H - 1.0 - cfg.latency * (2.0 * m * PV + N));
    for (int p = 0; p < N; ++p)
        for (int q = p + 1; q < N; ++q)
            for (int r = 0; r < P; ++r) {
                b.row({sp[q], sp[p], w[p][q], a[p][r], a[q][r]}, {1, -1, -H, -H, -H}, 'G', pieces[p].cost - 3 * H);
                b.row({sp[p], sp[q], w[p][q], a[p][r], a[q][r]}, {1, -1, H, -H, -H}, 'G', pieces[q].cost - 2 * H);
            }

    // MIP start: the bubbles schedule.
    std::vector<double> v(static_cast<size_t>(b.num), 0.0);
    std::vector<int> rank_of(N, 0), slot_of(N, 0);
    std::vector<double> start_of(N, 0);
    for (const Op& op : start.ops) {
        if (op.kind == OpKind::kForward || op.kind == OpKind::kBackward) {
            v[st[text_idx(op.kind, op.mb, op.chunk)]] = op.start;
            continue;
        }
        for (int p = 0; p < N; ++p)
            if (pieces[p].step.kind == op.kind && pieces[p].step.mb == op.mb && pieces[p].step.index == op.part) {
                rank_of[p] = op.rank;
                start_of[p] = op.start;
                v[sp[p]] = op.start;
            }
    }
    for (int p = 0; p < N; ++p) {
        for (const Op& op : start.ops)  // text ops of its rank that start before it
            if (op.rank == rank_of[p] && (op.kind == OpKind::kForward || op.kind == OpKind::kBackward) &&
                op.end <= start_of[p] + 1e-9)
                ++slot_of[p];
        v[a[p][rank_of[p]]] = 1;
        v[z[p][rank_of[p]][slot_of[p]]] = 1;
        for (int q = p + 1; q < N; ++q) v[w[p][q]] = start_of[p] <= start_of[q] ? 1 : 0;
    }
    v[T] = start.makespan;
    std::vector<int> all_cols(static_cast<size_t>(b.num));
    for (int j = 0; j < b.num; ++j) all_cols[j] = j;
    Cbc_setMIPStartI(b.model, b.num, all_cols.data(), v.data());

    Cbc_setLogLevel(b.model, 0);
    Cbc_setParameter(b.model, "log", "0");
    Cbc_setParameter(b.model, "slog", "0");
    Cbc_setParameter(b.model, "timeMode", "elapsed");
    Cbc_setMaximumSeconds(b.model, options.time_limit_s);
    Cbc_solve(b.model);

    PolicyResult res;
    res.schedule = start;
    res.bound = Cbc_getBestPossibleObjValue(b.model);
    const double* sol = Cbc_bestSolution(b.model);
    if (sol != nullptr) {
        std::vector<PlacedPiece> placed;
        for (int p = 0; p < N; ++p) {
            int r = 0;
            for (int q = 1; q < P; ++q)
                if (sol[a[p][q]] > sol[a[p][r]]) r = q;
            placed.push_back({r, sol[sp[p]], pieces[p].step});
        }
        // The solver's text start times order the merge (they may differ from the text-only schedule's).
        Schedule solver_times = text_schedule;
        for (Op& op : solver_times.ops) op.start = sol[st[text_idx(op.kind, op.mb, op.chunk)]];
        Schedule s = simulate(cfg, vit, merge_orders(cfg, text, solver_times, placed));
        if (s.makespan < res.schedule.makespan) res.schedule = std::move(s);
    }
    res.optimal = Cbc_isProvenOptimal(b.model) != 0;
    if (res.optimal) res.bound = std::min(res.bound, res.schedule.makespan);
    return res;
}

}  // namespace detail

#else  // !EVENEP_HAVE_CBC

bool optimal_policy_available() { return false; }

namespace detail {

PolicyResult optimal_policy(const PipelineConfig& cfg, const VitWork& vit, const RankOrders&, const Schedule&,
                            const PolicyOptions&) {
    check_fits(cfg, vit);
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, false,
                      "pipeline: the optimal policy needs CBC; EvenEP was built without it (coinor-libcbc-dev)");
}

}  // namespace detail

#endif  // EVENEP_HAVE_CBC

}  // namespace evenep::pipeline
