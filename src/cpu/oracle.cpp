// Group-level wrappers over the per-rank CPU data path (evenep/cpu/oracle.hpp).
#include "evenep/cpu/oracle.hpp"

#include <algorithm>

#include "evenep/cpu/buffer.hpp"
#include "evenep/error.hpp"

namespace evenep::cpu {
namespace {

DispatchArgs args_of(const RankTokens& t, const OracleOptions& o) {
    DispatchArgs a;
    a.s = t.s;
    a.x = t.x;
    a.topk_idx = t.topk_idx;
    a.topk_w = t.topk_w;
    a.s_total = o.s_total;
    return a;
}

void check_tokens(const BufferConfig& cfg, const std::vector<RankTokens>& tokens) {
    cfg.validate();
    EVENEP_CHECK(tokens.size() == static_cast<size_t>(cfg.cfg.R), "oracle: ", tokens.size(),
                 " ranks of tokens, expected R = ", cfg.cfg.R);
}

}  // namespace

GroupDispatchResult dispatch_group(const BufferConfig& cfg,
                                   const std::vector<RankTokens>& tokens,
                                   const OracleOptions& options) {
    check_tokens(cfg, tokens);
    const int R = cfg.cfg.R;
    GroupDispatchResult res;
    res.dst.resize(R);
    res.recv_x.resize(R);
    res.recv_w.resize(R);
    res.recv_next.resize(R);
    res.recv_ret.resize(R);
    res.recv_x8.resize(R);
    res.recv_scale.resize(R);
    std::vector<PhaseTraffic> traffic(R), gather(R);
    LocalTeamGroup group(R, options.barrier_timeout);
    run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        Buffer buffer(team, cfg, options.mode);
        DispatchHandle h = buffer.dispatch(args_of(tokens[r], options));
        res.dst[r] = h.dst;
        res.recv_x[r].assign(buffer.recv_x().begin(), buffer.recv_x().end());
        res.recv_w[r].assign(buffer.recv_w().begin(), buffer.recv_w().end());
        res.recv_next[r].assign(buffer.recv_next().begin(), buffer.recv_next().end());
        res.recv_ret[r].assign(buffer.recv_ret().begin(), buffer.recv_ret().end());
        res.recv_x8[r].assign(buffer.recv_x8().begin(), buffer.recv_x8().end());
        res.recv_scale[r].assign(buffer.recv_scale().begin(), buffer.recv_scale().end());
        traffic[r] = buffer.last_traffic();
        gather[r] = buffer.last_gather_traffic();
        if (r == 0) res.plan = std::move(h.plan);
    });
    res.traffic = PhaseTraffic(R);
    res.gather_traffic = PhaseTraffic(R);
    for (int r = 0; r < R; ++r) {
        res.traffic.add(traffic[r]);
        res.gather_traffic.add(gather[r]);
    }
    return res;
}

GroupCombineResult combine_group(const BufferConfig& cfg,
                                 const std::vector<RankTokens>& tokens,
                                 const std::vector<std::vector<Bf16>>& y,
                                 bool apply_weights,
                                 const OracleOptions& options) {
    check_tokens(cfg, tokens);
    const int R = cfg.cfg.R, K = cfg.cfg.K;
    EVENEP_CHECK(y.empty() || y.size() == static_cast<size_t>(R), "oracle: y has ", y.size(),
                 " ranks, expected 0 or R = ", R);
    GroupCombineResult res;
    res.out.resize(R);
    res.gathered_w.resize(R);
    std::vector<PhaseTraffic> traffic(R);
    LocalTeamGroup group(R, options.barrier_timeout);
    run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        Buffer buffer(team, cfg, options.mode);
        DispatchHandle h = buffer.dispatch(args_of(tokens[r], options));
        res.out[r].resize(static_cast<size_t>(h.s) * cfg.H);
        res.gathered_w[r].resize(static_cast<size_t>(h.s) * K);
        CombineArgs a;
        if (!y.empty()) a.y = y[r];
        a.apply_weights = apply_weights;
        a.out = res.out[r];
        a.gathered_w = res.gathered_w[r];
        buffer.combine(h, a);
        traffic[r] = buffer.last_traffic();
    });
    res.traffic = PhaseTraffic(R);
    for (int r = 0; r < R; ++r) res.traffic.add(traffic[r]);
    return res;
}

}  // namespace evenep::cpu
