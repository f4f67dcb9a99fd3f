// evenep/buffer.hpp — backend-independent sizing and byte accounting of the EP data path (SPEC §4).
//
// BufferConfig is the static shape every buffer is sized from: (S, K, E, R, tp, B) from Config plus the hidden
// size H and the expert intermediate size H'. buffer_sizes() reports the bytes of every buffer of one rank.
//
// The traffic model counts what crosses rank boundaries (a rank writing into, or reading from, another rank's
// memory) for one call of each phase, from the plan and the encoded destinations alone (no data, no GEMMs).
// The CPU backend counts the same figures while it moves data, and the two agree exactly (tested).
//
// Wire formats (bytes per item):
//   dispatch          one bf16 row (2H) per (token, destination rank) + 12 per entry (fp32 weight, int32 chain
//                     link, int32 return address) whose destination is another rank
//   combine           one partial per (token, destination rank): its bf16 row (2H) when the destination holds one
//                     entry of the token, the fp32 sum (4H) of its entries when it holds >= 2
//   gathered weights  4 per entry (fp32) whose row is on another rank
//   histogram gather  (E+2) int32 per (rank, peer) pair: s_r, s_total, tpe[r]
//   prefetch          one bf16 expert per projection (2·H·H' each) per copy in copies[][]
//   reduce_grad       one fp32 expert gradient per projection (4·H·H' each) per copy
// The conventional EP model (no copies: every entry is computed on its expert's home rank, DeepEP-like) sends
// one bf16 row per (token, home rank), 8 bytes per remote entry (expert id + weight) and combines in bf16.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/plan.hpp"

namespace evenep {

// Precision of the data path (docs/fp8.md). Every field false: the bf16 path, bit for bit as without it.
struct DataPrecision {
    // FP8 (e4m3) dispatch rows with one scale per 128 channels, e4m3 copies of the experts' weights with one scale
    // per 128 x 128 block, block-scaled expert GEMMs forward and dgrad (wgrad stays bf16). Needs H and H'
    // multiples of 128 (evenep/detail/fp8.hpp).
    bool fp8 = false;
    bool ue8m0 = false;          // with fp8: every scale a power of two (UE8M0)
    bool bf16_partials = false;  // combine: partials of >= 2 entries cross as bf16 (one more rounding, half the bytes)
    friend bool operator==(const DataPrecision&, const DataPrecision&) = default;
};

struct BufferConfig {
    Config cfg;
    int H = 256;           // hidden size (bf16 elements per token row); H % 8 == 0
    int ffn_hidden = 128;  // H': expert intermediate size (sizes the expert pools)
    // {}: designated initialisers may leave it out without -Wmissing-field-initializers (GCC 12).
    DataPrecision precision{};

    // Throws evenep::Error naming the bad value (Config::validate plus H, H'; with fp8 both multiples of 128).
    void validate() const;
    detail::BufferLayout layout() const;
    detail::ExpertPoolLayout pool_layout() const;
    detail::ExpertWeightsLayout weights_layout() const;
    std::string to_string() const;
};

// The auto policy's step-cost model of a layer of this buffer's shape and precision (detail::layer_auto_cost_model):
// what cpu::MoeLayer and the Python buffers set on their planners, as cuda::MoeLayer does on its Ep.
inline detail::AutoCostModel layer_auto_cost_model(const BufferConfig& b) {
    return detail::layer_auto_cost_model(b.H, b.ffn_hidden, b.cfg.tp, b.precision.fp8);
}

// Bytes of every buffer of one rank.
struct BufferSizes {
    // Communication buffer (symmetric), one per EP group, independent of the routing (SPEC invariant 4).
    int64_t recv_x = 0;      // NvS * H * 2
    int64_t recv_w = 0;      // NvS * 4
    int64_t recv_meta = 0;   // NvS * 8 (chain link + return address)
    int64_t gather = 0;      // R * (E+2) * 4
    int64_t stage = 0;       // S * min(K, 2R) * H * 2 (combine partials)
    int64_t comm_total = 0;  // the whole aligned buffer (BufferLayout::num_bytes)
    int64_t workspace = 0;   // local, per dispatch handle: dst + saved route weights, S * K * 8
    // Process-wide expert pool (symmetric), shared by all MoE layers.
    int64_t pool_slots = 0;   // B * 3 * H * H' * 2 (bf16 prefetch slots)
    int64_t pool_reduce = 0;  // B * 3 * H * H' * 4 (fp32 slot gradients)
    int64_t pool_total = 0;   // with fp8 also the e4m3 slots and their scales
    // Per MoE layer.
    int64_t layer_weights = 0;  // epn * 3 * H * H' * 2 (bf16, symmetric; with fp8 plus the e4m3 cast and scales)
    int64_t layer_grads = 0;    // epn * 3 * H * H' * 4 (fp32, local)
    // DeepEP-style worst-case receive buffer: any rank may receive all R*S tokens, R * S * H * 2.
    int64_t deepep_recv_x = 0;
};
BufferSizes buffer_sizes(const BufferConfig& cfg);

// Traffic of one phase across rank boundaries (sums over ranks; per-rank send/receive in bytes).
struct PhaseTraffic {
    int64_t rows = 0;       // bulk rows: token rows (dispatch), partials (combine), expert copies (prefetch/reduce)
    int64_t fp32_rows = 0;  // of `rows`: combine partials sent as fp32 sums (>= 2 entries of a token)
    int64_t entries = 0;    // per-entry records: dispatch metadata or gathered weights
    int64_t bytes = 0;      // everything that crossed
    std::vector<int64_t> send_bytes;  // [R] bytes leaving each rank
    std::vector<int64_t> recv_bytes;  // [R] bytes arriving at each rank

    explicit PhaseTraffic(int R = 0) : send_bytes(R, 0), recv_bytes(R, 0) {}
    // Records `bytes` moving from rank `from` to rank `to` (ignored when from == to).
    void move(int from, int to, int64_t num_bytes) {
        if (from == to) return;
        bytes += num_bytes;
        send_bytes[from] += num_bytes;
        recv_bytes[to] += num_bytes;
    }
    void add(const PhaseTraffic& o);
    // max over ranks of max(send, receive): the busiest rank's link time in a full-duplex fabric.
    int64_t max_rank_bytes() const;
    friend bool operator==(const PhaseTraffic&, const PhaseTraffic&) = default;
};

// One MoE layer step: forward (dispatch, combine) and optionally backward (combine_backward = dispatch of the
// output gradient with the plan reused, dispatch_backward = combine of the input gradient plus the gathered
// route-weight gradient), with the expert-weight phases.
struct TrafficReport {
    PhaseTraffic gather;             // histogram all-gather (planning input)
    PhaseTraffic dispatch;           // forward dispatch
    PhaseTraffic combine;            // forward combine
    PhaseTraffic combine_backward;   // backward: dispatch of grad_out
    PhaseTraffic dispatch_backward;  // backward: combine of grad_x + gathered weight gradient
    PhaseTraffic prefetch;           // prefetch_weight
    PhaseTraffic reduce_grad;        // reduce_grad (training)
    int64_t max_rank_entries = 0;    // entries computed by the busiest rank
    int64_t total_entries = 0;       // unmasked entries in the group

    explicit TrafficReport(int R = 0)
        : gather(R), dispatch(R), combine(R), combine_backward(R), dispatch_backward(R), prefetch(R), reduce_grad(R) {}
    int64_t total_bytes() const;
    PhaseTraffic total() const;  // every phase summed
};

// EvenEP traffic from the plan and every rank's encoded destinations dst[r] ([s_r*K], compute_dst).
// `training` adds the backward phases and reduce_grad; `bf16_partials` (DataPrecision::bf16_partials): the combine
// and dispatch_backward partials of >= 2 entries cross as bf16 rows (no fp32 rows).
TrafficReport evenep_traffic(const Plan& plan,
                             const std::vector<std::vector<int32_t>>& dst,
                             int H,
                             int ffn_hidden,
                             bool training,
                             bool bf16_partials = false);

// Conventional EP (no copies) for the same routing: topk_idx[r] is [s_r*K], -1 masked.
TrafficReport conventional_traffic(const Config& cfg,
                                   const std::vector<std::vector<int32_t>>& topk_idx,
                                   int H,
                                   bool training);

}  // namespace evenep
