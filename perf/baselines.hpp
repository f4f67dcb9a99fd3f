// perf/baselines.hpp — per-rank rows and link bytes of the systems EvenEP is compared with, on one routing:
//   conventional EP  every entry is computed on its expert's home rank (rank e / epn);
//   EPLB-style       static replicas placed by eplb_place() (perf/eplb.hpp), tokens split evenly over an expert's
//                    replicas;
//   EvenEP           the plan's q[r] (equal within one entry by construction).
// Link bytes reuse the traffic model of evenep/buffer.hpp (conventional_traffic, evenep_traffic); EPLB is modelled
// as conventional EP over its physical experts, plus (training) the per-step synchronisation of its replicas.
// "Rows" are (token, expert) entries, unpadded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/config.hpp"
#include "evenep/routing.hpp"
#include "perf/eplb.hpp"

namespace evenep::perf {

// T_e = sum_r tpe[r*E + e]. tpe: [R*E].
std::vector<int64_t> expert_loads(const Config& cfg, std::span<const int32_t> tpe);

// Conventional EP: rows[r] = sum of T_e over rank r's home experts (the plan's load_before). expert_load: [E].
std::vector<int64_t> conventional_rows(const Config& cfg, std::span<const int64_t> expert_load);

// EPLB: replica j (in slot order) of expert e computes floor(T_e / c_e) + (j < T_e mod c_e) entries; rows[r] sums
// the replicas in rank r's slots. expert_load: [E], the step being computed (not the one the placement came from).
std::vector<int64_t> eplb_rows(const EplbPlacement& placement, std::span<const int64_t> expert_load);

// The physical slot of every entry of `routing` under `placement` ([R][s_r*K], -1 masked): the entries of expert e,
// in (source rank, token, k) order, fill its replicas in slot order with the shares of eplb_rows (contiguous runs,
// so a source rank's entries of e stay together).
std::vector<std::vector<int32_t>> eplb_slot_routing(const EplbPlacement& placement, const Routing& routing);

// How a training step keeps an expert's replicas (the ranks holding it) in sync, 3 projections of [H, ffn_hidden]:
//   kStar  as EvenEP's copies: the expert's first slot is its primary; every other rank holding it sends its summed
//          fp32 gradient there (the reduce_grad phase) and gets the updated bf16 weights back (the prefetch phase);
//   kRing  a ring all-reduce of the fp32 gradient over the n ranks holding it (each sends 2(n-1)/n of it to the next
//          rank in rank order; reduce_grad phase), every replica then steps its own optimizer: no weight traffic;
//   kNone  not counted (token traffic only: the model of the earlier runs, favouring EPLB).
enum class EplbSync { kStar, kRing, kNone };
EplbSync parse_eplb_sync(const std::string& name);  // "star", "ring", "none"; throws naming the value
const char* to_string(EplbSync sync);

// The ranks holding each expert of `placement` [E], each rank once, in slot order (several replicas on one rank sum
// locally first).
std::vector<std::vector<int32_t>> eplb_holders(const EplbPlacement& placement);

// The transfers that keep one expert's replicas on `holders` (distinct ranks) in sync under `sync`, as the rule above
// says: calls reduce_grad(from, to, bytes) and prefetch(from, to, bytes) once per transfer (nothing for fewer than
// two holders or kNone). grad_bytes: one expert's fp32 gradient; weight_bytes: its bf16 weights.
template <class ReduceGrad, class Prefetch>
void for_each_replica_sync(std::vector<int32_t> holders,
                           EplbSync sync,
                           int64_t grad_bytes,
                           int64_t weight_bytes,
                           ReduceGrad&& reduce_grad,
                           Prefetch&& prefetch) {
    const int64_t n = static_cast<int64_t>(holders.size());
    if (n < 2 || sync == EplbSync::kNone) return;
    if (sync == EplbSync::kStar) {  // holders[0] (the first slot's rank) is the primary
        for (int64_t i = 1; i < n; ++i) {
            reduce_grad(holders[i], holders[0], grad_bytes);
            prefetch(holders[0], holders[i], weight_bytes);
        }
        return;
    }
    std::sort(holders.begin(), holders.end());
    const int64_t share = 2 * (n - 1) * grad_bytes / n;  // reduce-scatter + all-gather
    for (int64_t i = 0; i < n; ++i) reduce_grad(holders[i], holders[(i + 1) % n], share);
}

// EPLB link bytes: conventional_traffic over the physical slots (rank r holds slots [r*spr, (r+1)*spr)), plus with
// `training` the replicas' synchronisation (`sync`).
TrafficReport eplb_traffic(const EplbPlacement& placement,
                           const Routing& routing,
                           int H,
                           int ffn_hidden,
                           bool training,
                           EplbSync sync = EplbSync::kStar);

// max(rows) / mean(rows); 1 for an empty or all-zero input.
double imbalance(std::span<const int64_t> rows);

}  // namespace evenep::perf
