// evenep/cpu/expert_pool.hpp — expert weights, prefetch slots and gradient reduction on the CPU (SPEC §4.4).
//
// ExpertWeights: one MoE layer's local experts on one rank: per projection (gate, up, down) epn bf16 matrices
// [in, out] in a symmetric window (peers read them to prefetch, or directly when B < epn), plus their fp32
// gradient accumulators (local). Global expert e = rank*epn + local index.
//
// FP8 (BufferConfig::precision.fp8, docs/fp8.md): ExpertWeights also holds the e4m3 cast of its master weights
// (128 x 128 block scales) in symmetric memory; cast_fp8() makes it, once per weight version, before the step's
// prefetch. prefetch_weight then copies the e4m3 codes and scales (not the bf16 weights) into the pool's e4m3
// slots, and weight_table_fp8 addresses them. The bf16 slots stay unused; gradients stay fp32.
//
// ExpertPool: process-wide, one per rank, shared by every MoE layer: per projection B bf16 prefetch slots and
// the fp32 reduce buffer of the slots' weight gradients ([B, in, out] per rank, [R, B, in, out] group-wide).
//
//   prefetch_weight(plan, layer)  every rank pulls, for each slot b with copies[rank][b] = e >= 0, expert e's
//                                 three matrices from home(e) into slot b. Slots with copies = -1 are untouched.
//                                 A slot that already holds expert e of the same layer at the home rank's current
//                                 weight version
//                                 is not copied again (the backward pass re-prefetches after other layers used
//                                 the shared pool, and copies nothing when none did).
//   reduce_grad(plan, layer)      every home rank h, for each rank r ascending and slot b ascending with
//                                 home(copies[r][b]) == h, adds r's slot-b gradients elementwise into its local
//                                 fp32 gradient of that expert (grad += slot, fp32), then zeroes the consumed slot.
//                                 Unused slots are untouched. The result is deterministic for any data.
//
// The grouped GEMM addresses weights through a per-group table (weight_table): local expert, prefetch slot, or
// the home rank's memory (peer group, inference with B < epn). Weight gradients of slot groups go to the
// reduce buffer (grad_table); peer groups have no gradient (training requires B = epn).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/plan.hpp"
#include "evenep/team.hpp"

namespace evenep::cpu {

class ExpertWeights {
  public:
    // Collective (allocates the symmetric weights). Weights and gradients start at zero.
    ExpertWeights(Team& team, const BufferConfig& cfg);
    ~ExpertWeights();
    ExpertWeights(const ExpertWeights&) = delete;
    ExpertWeights& operator=(const ExpertWeights&) = delete;

    int rank() const { return rank_; }
    int epn() const { return static_cast<int>(layout_.epn); }
    const BufferConfig& config() const { return cfg_; }
    // [in*out] of projection `proj` (detail::kProjGate/Up/Down) of local expert `local_expert`. The mutable
    // overload counts as a modification: prefetched copies of this layer taken before it are copied again.
    std::span<Bf16> weight(int proj, int local_expert);
    std::span<const Bf16> weight(int proj, int local_expert) const;
    // The same matrix on rank `peer` (read-only use: prefetch and peer groups).
    const Bf16* peer_weight(int proj, int peer, int local_expert) const;
    // FP8: local (no communication). Casts every local expert's three matrices to e4m3 unless they were cast at
    // the current weight version. Every rank calls it before the prefetch_weight that reads the casts.
    void cast_fp8();
    // The e4m3 cast of a matrix on rank `peer` (as of that rank's last cast_fp8).
    Fp8Weight peer_weight_fp8(int proj, int peer, int local_expert) const;
    std::span<float> grad(int proj, int local_expert);
    std::span<const float> grad(int proj, int local_expert) const;
    void zero_grad();
    // Weight version of rank `peer`'s experts of this layer: incremented by every mutable weight() access on
    // that rank (kept in symmetric memory so the ranks holding copies can see it; see prefetch_weight).
    uint64_t version(int peer) const;

  private:
    // Entry of prefetch_weight / reduce_grad (`call`): clears the traffic record, checks plan and layer on every
    // rank, then the "start" barrier; throws on every rank if any rank's check failed (nothing moved yet).
    void begin_phase(const Plan& plan, const ExpertWeights& layer, const char* call);

    Team& team_;
    BufferConfig cfg_;
    detail::ExpertWeightsLayout layout_;
    int rank_ = 0;
    SymmetricWindow window_;
    SymmetricWindow version_window_;  // one uint64_t per rank
    std::vector<std::byte*> peers_;
    std::vector<uint64_t*> versions_;  // [R]
    std::vector<float> grads_;         // [3][epn][in*out]
    uint64_t fp8_version_ = 0;         // weight version of the last cast_fp8 (0: none)
};

class ExpertPool {
  public:
    // Collective. Slots and reduce buffers start at zero.
    ExpertPool(Team& team, const BufferConfig& cfg);
    ~ExpertPool();
    ExpertPool(const ExpertPool&) = delete;
    ExpertPool& operator=(const ExpertPool&) = delete;

    int rank() const { return rank_; }
    int num_slots() const { return static_cast<int>(layout_.B); }

    // Collective. `plan` must be for this pool's configuration; `layer` the layer whose experts are copied.
    void prefetch_weight(const Plan& plan, const ExpertWeights& layer);
    // Collective. Adds every copy's slot gradient into its home expert's gradient in `layer`, zeroes the slots.
    void reduce_grad(const Plan& plan, ExpertWeights& layer);

    std::span<Bf16> slot_weight(int proj, int slot);
    // The e4m3 slot (precision.fp8): codes [in*out] and scales [in/128 * out/128] as last prefetched.
    Fp8Weight slot_weight_fp8(int proj, int slot) const;
    std::span<float> slot_grad(int proj, int slot);
    std::span<const float> slot_grad(int proj, int slot) const;

    // Per-group weight table of this rank for `proj`: [G] pointers to [in, out] bf16 matrices (nullptr for empty
    // groups). Slot groups require the last prefetch_weight of this pool to have been for (plan, layer).
    void weight_table(const Plan& plan, const ExpertWeights& layer, int proj, std::vector<const Bf16*>& out) const;
    // The same for the e4m3 weights (precision.fp8): local casts, e4m3 slots, or the home's cast.
    void weight_table_fp8(const Plan& plan, const ExpertWeights& layer, int proj, std::vector<Fp8Weight>& out) const;
    // Per-group fp32 gradient targets: local expert gradient, slot gradient in the reduce buffer; throws
    // evenep::Error for a peer group (training needs B = epn).
    void grad_table(const Plan& plan, ExpertWeights& layer, int proj, std::vector<float*>& out);

    const PhaseTraffic& last_traffic() const { return traffic_; }

  private:
    // Entry of prefetch_weight / reduce_grad (`call`): clears the traffic record, checks plan and layer on every
    // rank, then the "start" barrier; throws on every rank if any rank's check failed (nothing moved yet).
    void begin_phase(const Plan& plan, const ExpertWeights& layer, const char* call);
    // Per group g of this rank: out[g] = pick(source, local expert | slot | (home, local expert)); checks slots.
    template <typename T, typename Pick>
    void table(const Plan& plan, const ExpertWeights& layer, std::vector<T>& out, Pick&& pick) const;

    Team& team_;
    BufferConfig cfg_;
    detail::ExpertPoolLayout layout_;
    int rank_ = 0;
    SymmetricWindow window_;
    std::vector<std::byte*> peers_;
    struct SlotContent {
        int32_t expert = -1;                   // expert last prefetched into the slot, -1 if none
        const ExpertWeights* layer = nullptr;  // its layer
        uint64_t version = 0;                  // the home rank's weight version at the copy
    };
    std::vector<SlotContent> slots_;  // [B]
    PhaseTraffic traffic_;
};

}  // namespace evenep::cpu
