// Buffer sizing and the traffic model (evenep/buffer.hpp): what crosses rank boundaries, from the plan alone.
#include <algorithm>
#include <sstream>

#include "evenep/buffer.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

// Bytes of the per-entry dispatch record: fp32 weight + int32 chain link + int32 return address.
constexpr int64_t kDispatchEntryBytes = 12;
// Conventional EP per remote entry: int32 expert id + fp32 weight.
constexpr int64_t kConventionalEntryBytes = 8;
// A gathered route weight (or its gradient).
constexpr int64_t kGatheredWeightBytes = 4;

void add_gather(const Config& cfg, PhaseTraffic& t) {
    for (int r = 0; r < cfg.R; ++r)
        for (int p = 0; p < cfg.R; ++p)
            t.move(r, p, static_cast<int64_t>(cfg.E + 2) * 4);  // BufferLayout::gather_row_ints
}

}  // namespace

void BufferConfig::validate() const {
    cfg.validate();
    EVENEP_CHECK(H >= detail::kHiddenAlign && H % detail::kHiddenAlign == 0, "buffer: H = ", H,
                 " must be a positive multiple of ", detail::kHiddenAlign, " (16-byte rows)");
    EVENEP_CHECK(ffn_hidden >= 1, "buffer: ffn_hidden (H') = ", ffn_hidden, " must be >= 1");
    if (precision.fp8) {
        EVENEP_CHECK(H % kFp8Block == 0, "buffer: fp8 needs H a multiple of ", kFp8Block, " (one scale per ", kFp8Block,
                     " channels), got H = ", H);
        EVENEP_CHECK(ffn_hidden % kFp8Block == 0, "buffer: fp8 needs H' a multiple of ", kFp8Block, " (one scale per ",
                     kFp8Block, " channels), got H' = ", ffn_hidden);
    }
    EVENEP_CHECK(!precision.ue8m0 || precision.fp8, "buffer: ue8m0 scales need fp8");
}

detail::BufferLayout BufferConfig::layout() const {
    return detail::BufferLayout::make(cfg.R, cfg.E, cfg.K, cfg.S, cfg.tp, H, cfg.slack_ppm(), precision.fp8);
}

detail::ExpertPoolLayout BufferConfig::pool_layout() const {
    return detail::ExpertPoolLayout::make(cfg.num_slots(), H, ffn_hidden, precision.fp8);
}

detail::ExpertWeightsLayout BufferConfig::weights_layout() const {
    return detail::ExpertWeightsLayout::make(cfg.epn(), H, ffn_hidden, precision.fp8);
}

std::string BufferConfig::to_string() const {
    std::ostringstream os;
    os << cfg.to_string() << " H=" << H << " H'=" << ffn_hidden;
    if (precision.fp8) os << (precision.ue8m0 ? " fp8(ue8m0)" : " fp8");
    if (precision.bf16_partials) os << " bf16-partials";
    return os.str();
}

BufferSizes buffer_sizes(const BufferConfig& c) {
    const detail::BufferLayout l = c.layout();
    const detail::ExpertPoolLayout pl = c.pool_layout();
    const detail::ExpertWeightsLayout wl = c.weights_layout();
    const int64_t expert = static_cast<int64_t>(detail::kNumProjections) * c.H * c.ffn_hidden;  // elements
    BufferSizes s;
    s.recv_x = l.recv_x_bytes();
    s.recv_w = l.recv_w_bytes();
    s.recv_meta = l.recv_next_bytes() + l.recv_ret_bytes();
    s.gather = l.gather_bytes();
    s.stage = l.stage_bytes();
    s.comm_total = l.num_bytes();
    s.workspace = static_cast<int64_t>(c.cfg.S) * c.cfg.K * 8;
    s.pool_slots = static_cast<int64_t>(c.cfg.num_slots()) * expert * 2;
    s.pool_reduce = static_cast<int64_t>(c.cfg.num_slots()) * expert * 4;
    s.pool_total = pl.num_bytes();
    s.layer_weights = wl.num_bytes();
    s.layer_grads = static_cast<int64_t>(c.cfg.epn()) * expert * 4;
    s.deepep_recv_x = static_cast<int64_t>(c.cfg.R) * c.cfg.S * c.H * 2;
    return s;
}

void PhaseTraffic::add(const PhaseTraffic& o) {
    if (send_bytes.size() < o.send_bytes.size()) {
        send_bytes.resize(o.send_bytes.size(), 0);
        recv_bytes.resize(o.recv_bytes.size(), 0);
    }
    rows += o.rows;
    fp32_rows += o.fp32_rows;
    entries += o.entries;
    bytes += o.bytes;
    for (size_t r = 0; r < o.send_bytes.size(); ++r) {
        send_bytes[r] += o.send_bytes[r];
        recv_bytes[r] += o.recv_bytes[r];
    }
}

int64_t PhaseTraffic::max_rank_bytes() const {
    int64_t m = 0;
    for (size_t r = 0; r < send_bytes.size(); ++r) m = std::max({m, send_bytes[r], recv_bytes[r]});
    return m;
}

PhaseTraffic TrafficReport::total() const {
    PhaseTraffic t(static_cast<int>(gather.send_bytes.size()));
    for (const PhaseTraffic* p :
         {&gather, &dispatch, &combine, &combine_backward, &dispatch_backward, &prefetch, &reduce_grad})
        t.add(*p);
    return t;
}

int64_t TrafficReport::total_bytes() const { return total().bytes; }

TrafficReport evenep_traffic(const Plan& plan,
                             const std::vector<std::vector<int32_t>>& dst,
                             int H,
                             int ffn_hidden,
                             bool training,
                             bool bf16_partials) {
    const Config& cfg = plan.cfg;
    const int R = cfg.R, K = cfg.K, B = cfg.num_slots(), epn = cfg.epn();
    const int64_t nvs = cfg.recv_rows();
    const int64_t row_bytes = static_cast<int64_t>(H) * 2;
    EVENEP_CHECK(dst.size() == static_cast<size_t>(R), "traffic: dst has ", dst.size(), " ranks, expected R = ", R);
    TrafficReport rep(R);
    add_gather(cfg, rep.gather);
    for (int r = 0; r < R; ++r) {
        const int s = plan.s[r];
        EVENEP_CHECK(dst[r].size() >= static_cast<size_t>(s) * K, "traffic: rank ", r, ": dst has ", dst[r].size(),
                     " codes, expected s*K = ", static_cast<int64_t>(s) * K);
        int dests[detail::kMaxTopK], counts[detail::kMaxTopK];
        for (int t = 0; t < s; ++t) {
            int n = 0;
            for (int k = 0; k < K; ++k) {
                const int32_t code = dst[r][static_cast<size_t>(t) * K + k];
                if (detail::is_masked(code)) continue;
                const int d = static_cast<int>(detail::decode_dst(code) / nvs);
                if (detail::is_payload(code)) {
                    dests[n] = d;
                    counts[n++] = 1;
                    if (d != r) {
                        rep.dispatch.rows += 1;
                        rep.dispatch.move(r, d, row_bytes);
                    }
                } else {
                    for (int j = 0; j < n; ++j)
                        if (dests[j] == d) ++counts[j];
                }
                if (d != r) {
                    rep.dispatch.entries += 1;
                    rep.dispatch.move(r, d, kDispatchEntryBytes);
                    if (training) {
                        rep.dispatch_backward.entries += 1;
                        rep.dispatch_backward.move(d, r, kGatheredWeightBytes);
                    }
                }
            }
            for (int j = 0; j < n; ++j) {
                if (dests[j] == r) continue;
                const bool fp32 = counts[j] >= 2 && !bf16_partials;
                rep.combine.rows += 1;
                rep.combine.fp32_rows += fp32 ? 1 : 0;
                rep.combine.move(dests[j], r, fp32 ? 2 * row_bytes : row_bytes);
                if (training) {
                    rep.dispatch_backward.rows += 1;
                    rep.dispatch_backward.fp32_rows += fp32 ? 1 : 0;
                    rep.dispatch_backward.move(dests[j], r, fp32 ? 2 * row_bytes : row_bytes);
                }
            }
        }
    }
    if (training) rep.combine_backward = rep.dispatch;
    const int64_t expert_elems = static_cast<int64_t>(detail::kNumProjections) * H * ffn_hidden;
    for (int d = 0; d < R; ++d)
        for (int b = 0; b < B; ++b) {
            const int32_t e = plan.copies[static_cast<size_t>(d) * B + b];
            if (e < 0) continue;
            const int home = e / epn;
            rep.prefetch.rows += 1;
            rep.prefetch.move(home, d, expert_elems * 2);
            if (training) {
                rep.reduce_grad.rows += 1;
                rep.reduce_grad.move(d, home, expert_elems * 4);
            }
        }
    rep.total_entries = plan.total_entries();
    for (int r = 0; r < R; ++r) rep.max_rank_entries = std::max<int64_t>(rep.max_rank_entries, plan.q[r]);
    return rep;
}

TrafficReport conventional_traffic(const Config& cfg,
                                   const std::vector<std::vector<int32_t>>& topk_idx,
                                   int H,
                                   bool training) {
    cfg.validate();
    const int R = cfg.R, K = cfg.K, epn = cfg.epn();
    const int64_t row_bytes = static_cast<int64_t>(H) * 2;
    EVENEP_CHECK(topk_idx.size() == static_cast<size_t>(R), "traffic: topk_idx has ", topk_idx.size(),
                 " ranks, expected R = ", R);
    TrafficReport rep(R);
    add_gather(cfg, rep.gather);
    std::vector<int64_t> load(R, 0);
    for (int r = 0; r < R; ++r) {
        EVENEP_CHECK(topk_idx[r].size() % K == 0, "traffic: rank ", r, ": topk_idx size ", topk_idx[r].size(),
                     " is not a multiple of K = ", K);
        const size_t s = topk_idx[r].size() / K;
        int homes[detail::kMaxTopK];
        for (size_t t = 0; t < s; ++t) {
            int n = 0;
            for (int k = 0; k < K; ++k) {
                const int32_t e = topk_idx[r][t * K + k];
                if (e < 0) continue;
                EVENEP_CHECK(e < cfg.E, "traffic: rank ", r, ", token ", t, ", k ", k, ": expert id ", e,
                             " outside [0, E = ", cfg.E, ")");
                const int h = e / epn;
                ++load[h];
                bool seen = false;
                for (int j = 0; j < n; ++j) seen = seen || homes[j] == h;
                if (!seen) homes[n++] = h;
                if (h != r) {
                    rep.dispatch.entries += 1;
                    rep.dispatch.move(r, h, kConventionalEntryBytes);
                    if (training) {
                        rep.dispatch_backward.entries += 1;
                        rep.dispatch_backward.move(h, r, kGatheredWeightBytes);
                    }
                }
            }
            for (int j = 0; j < n; ++j) {
                if (homes[j] == r) continue;
                rep.dispatch.rows += 1;
                rep.dispatch.move(r, homes[j], row_bytes);
                rep.combine.rows += 1;
                rep.combine.move(homes[j], r, row_bytes);
                if (training) {
                    rep.combine_backward.rows += 1;
                    rep.combine_backward.move(r, homes[j], row_bytes);
                    rep.dispatch_backward.rows += 1;
                    rep.dispatch_backward.move(homes[j], r, row_bytes);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        rep.total_entries += load[r];
        rep.max_rank_entries = std::max(rep.max_rank_entries, load[r]);
    }
    return rep;
}

}  // namespace evenep
