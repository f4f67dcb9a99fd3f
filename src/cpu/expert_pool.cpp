// Expert weights, prefetch slots and gradient reduction (evenep/cpu/expert_pool.hpp).
//
// Synchronisation (the copy tree of the plan, relay_src; docs/relayed-prefetch.md; level 1 = direct from the home):
//   prefetch_weight  barrier "start" (homes' weights are final); per tree level 1..D each rank pulls its slots of
//                    that level from their sources (the home's weights or the relay's slot); barrier "relay level"
//                    between levels.
//   reduce_grad      barrier "start" (every rank's slot gradients are final); per level D-1..1 each relay adds the
//                    gradients of its children (ascending (rank, slot)) into its own slot gradient and zeroes
//                    theirs, barrier "relay level"; then each home pulls and zeroes its children's slots in
//                    ascending (rank, slot) order; barrier "slots consumed" (no rank writes a slot gradient again
//                    before its parent has read and zeroed it). Without relays (D = 1) this is the home pulling
//                    every copy in (rank, slot) order, as before.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "evenep/cpu/expert_pool.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "evenep/detail/plan_relay.hpp"
#include "evenep/error.hpp"
#include "local_status.hpp"

namespace evenep::cpu {
namespace {

using internal::LocalStatus;
using internal::validated;

void check_plan(const Plan& plan, const BufferConfig& cfg, int rank, const char* call) {
    const Config& a = plan.cfg;
    const Config& b = cfg.cfg;
    EVENEP_CHECK(a.R == b.R && a.E == b.E && a.num_slots() == b.num_slots(), call, ": rank ", rank,
                 ": the plan is for ", a.to_string(), ", the pool for ", b.to_string());
    EVENEP_CHECK(plan.copies.size() == static_cast<size_t>(a.R) * a.num_slots(), call, ": rank ", rank,
                 ": the plan's copies table has ", plan.copies.size(),
                 " slots, expected R*B = ", static_cast<int64_t>(a.R) * a.num_slots());
}

// Tree level of every slot [R*B] (0: empty) and the deepest level; throws on a broken tree.
int relay_levels(const Plan& plan, std::vector<int>& level) {
    const Config& c = plan.cfg;
    const detail::RelayDims d{c.R, c.E, c.epn(), c.num_slots()};
    const size_t n = static_cast<size_t>(c.R) * d.B;
    EVENEP_CHECK(plan.relay_src.size() == n && plan.relay_round.size() == n, "expert pool: the plan's copy tree has ",
                 plan.relay_src.size(), " entries, expected R*B = ", n);
    level.assign(n, 0);
    int deepest = 0;
    for (size_t i = 0; i < n; ++i) {
        if (plan.copies[i] < 0) continue;
        level[i] = detail::relay_level(d, plan.copies.data(), plan.relay_src.data(), static_cast<int>(i));
        EVENEP_CHECK(level[i] > 0, "expert pool: rank ", i / d.B, " slot ", i % d.B, " (expert ", plan.copies[i],
                     "): relay source ", plan.relay_src[i], " does not lead to the home rank");
        deepest = std::max(deepest, level[i]);
    }
    return deepest;
}

void check_layer(const ExpertWeights& layer, const BufferConfig& cfg, int rank, const char* call) {
    const BufferConfig& c = layer.config();
    EVENEP_CHECK(layer.rank() == rank, call, ": rank ", rank, " was given the layer of rank ", layer.rank());
    EVENEP_CHECK(c.cfg.R == cfg.cfg.R && c.cfg.E == cfg.cfg.E && c.H == cfg.H && c.ffn_hidden == cfg.ffn_hidden, call,
                 ": rank ", rank, ": the layer is ", c.to_string(), ", the pool ", cfg.to_string());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// ExpertWeights
// ---------------------------------------------------------------------------------------------------------
ExpertWeights::ExpertWeights(Team& team, const BufferConfig& cfg)
    : team_(team), cfg_(validated(cfg)), layout_(cfg_.weights_layout()), rank_(team.rank()) {
    EVENEP_CHECK(team.size() == cfg_.cfg.R, "expert weights: team size ", team.size(),
                 " differs from R = ", cfg_.cfg.R);
    window_ = team_.alloc_symmetric(static_cast<size_t>(layout_.num_bytes()), "evenep.cpu.expert_weights");
    peers_.resize(cfg_.cfg.R);
    for (int p = 0; p < cfg_.cfg.R; ++p) peers_[p] = team_.peer_base(window_, p);
    version_window_ = team_.alloc_symmetric(sizeof(uint64_t), "evenep.cpu.expert_weights.version");
    versions_.resize(cfg_.cfg.R);
    for (int p = 0; p < cfg_.cfg.R; ++p)
        versions_[p] = reinterpret_cast<uint64_t*>(team_.peer_base(version_window_, p));
    std::atomic_ref<uint64_t>(*versions_[rank_]).store(1, std::memory_order_relaxed);
    grads_.assign(static_cast<size_t>(detail::kNumProjections * layout_.epn * layout_.expert_elems()), 0.0f);
}

ExpertWeights::~ExpertWeights() {
    team_.free_symmetric(version_window_);
    team_.free_symmetric(window_);
}

uint64_t ExpertWeights::version(int peer) const {
    EVENEP_CHECK(peer >= 0 && peer < cfg_.cfg.R, "expert weights: rank ", peer, " out of range");
    // Relaxed: the barriers of the collective calls order it with respect to the weights themselves.
    return std::atomic_ref<uint64_t>(*versions_[peer]).load(std::memory_order_relaxed);
}

std::span<Bf16> ExpertWeights::weight(int proj, int local_expert) {
    EVENEP_CHECK(proj >= 0 && proj < detail::kNumProjections && local_expert >= 0 && local_expert < layout_.epn,
                 "expert weights: projection ", proj, ", local expert ", local_expert, " out of range");
    std::atomic_ref<uint64_t>(*versions_[rank_]).fetch_add(1, std::memory_order_relaxed);
    return {reinterpret_cast<Bf16*>(peers_[rank_] + layout_.weight(proj, local_expert)),
            static_cast<size_t>(layout_.expert_elems())};
}

std::span<const Bf16> ExpertWeights::weight(int proj, int local_expert) const {
    return {peer_weight(proj, rank_, local_expert), static_cast<size_t>(layout_.expert_elems())};
}

const Bf16* ExpertWeights::peer_weight(int proj, int peer, int local_expert) const {
    EVENEP_CHECK(proj >= 0 && proj < detail::kNumProjections && local_expert >= 0 && local_expert < layout_.epn &&
                     peer >= 0 && peer < cfg_.cfg.R,
                 "expert weights: projection ", proj, ", rank ", peer, ", local expert ", local_expert,
                 " out of range");
    return reinterpret_cast<const Bf16*>(peers_[peer] + layout_.weight(proj, local_expert));
}

std::span<float> ExpertWeights::grad(int proj, int local_expert) {
    EVENEP_CHECK(proj >= 0 && proj < detail::kNumProjections && local_expert >= 0 && local_expert < layout_.epn,
                 "expert weights: projection ", proj, ", local expert ", local_expert, " out of range");
    const size_t n = static_cast<size_t>(layout_.expert_elems());
    return {grads_.data() + (static_cast<size_t>(proj) * layout_.epn + local_expert) * n, n};
}

std::span<const float> ExpertWeights::grad(int proj, int local_expert) const {
    return const_cast<ExpertWeights*>(this)->grad(proj, local_expert);
}

void ExpertWeights::cast_fp8() {
    EVENEP_CHECK(layout_.fp8, "expert weights: cast_fp8 needs precision.fp8 (", cfg_.to_string(), ")");
    const uint64_t v = version(rank_);
    if (v == fp8_version_) return;
    for (int p = 0; p < detail::kNumProjections; ++p)
        for (int le = 0; le < layout_.epn; ++le)
            quantize_weight_fp8(peer_weight(p, rank_, le), detail::proj_in_dim(p, layout_.H, layout_.F),
                                detail::proj_out_dim(p, layout_.H, layout_.F), cfg_.precision.ue8m0,
                                reinterpret_cast<Fp8E4m3*>(peers_[rank_] + layout_.weight8(p, le)),
                                reinterpret_cast<float*>(peers_[rank_] + layout_.scale(p, le)));
    fp8_version_ = v;
}

Fp8Weight ExpertWeights::peer_weight_fp8(int proj, int peer, int local_expert) const {
    (void)peer_weight(proj, peer, local_expert);  // range checks
    EVENEP_CHECK(layout_.fp8, "expert weights: no FP8 cast without precision.fp8 (", cfg_.to_string(), ")");
    return {reinterpret_cast<const Fp8E4m3*>(peers_[peer] + layout_.weight8(proj, local_expert)),
            reinterpret_cast<const float*>(peers_[peer] + layout_.scale(proj, local_expert))};
}

void ExpertWeights::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

// ---------------------------------------------------------------------------------------------------------
// ExpertPool
// ---------------------------------------------------------------------------------------------------------
ExpertPool::ExpertPool(Team& team, const BufferConfig& cfg)
    : team_(team), cfg_(validated(cfg)), layout_(cfg_.pool_layout()), rank_(team.rank()), traffic_(cfg_.cfg.R) {
    EVENEP_CHECK(team.size() == cfg_.cfg.R, "expert pool: team size ", team.size(), " differs from R = ", cfg_.cfg.R);
    window_ = team_.alloc_symmetric(static_cast<size_t>(layout_.num_bytes()), "evenep.cpu.expert_pool");
    peers_.resize(cfg_.cfg.R);
    for (int p = 0; p < cfg_.cfg.R; ++p) peers_[p] = team_.peer_base(window_, p);
    slots_.assign(static_cast<size_t>(layout_.B), SlotContent{});
}

ExpertPool::~ExpertPool() { team_.free_symmetric(window_); }

std::span<Bf16> ExpertPool::slot_weight(int proj, int slot) {
    EVENEP_CHECK(proj >= 0 && proj < detail::kNumProjections && slot >= 0 && slot < layout_.B,
                 "expert pool: projection ", proj, ", slot ", slot, " out of range (B = ", layout_.B, ")");
    return {reinterpret_cast<Bf16*>(peers_[rank_] + layout_.slot_w(proj, slot)),
            static_cast<size_t>(layout_.expert_elems())};
}

Fp8Weight ExpertPool::slot_weight_fp8(int proj, int slot) const {
    EVENEP_CHECK(proj >= 0 && proj < detail::kNumProjections && slot >= 0 && slot < layout_.B && layout_.fp8,
                 "expert pool: projection ", proj, ", slot ", slot, " out of range (B = ", layout_.B,
                 ") or no FP8 slots (", cfg_.to_string(), ")");
    return {reinterpret_cast<const Fp8E4m3*>(peers_[rank_] + layout_.slot_w8(proj, slot)),
            reinterpret_cast<const float*>(peers_[rank_] + layout_.slot_scale(proj, slot))};
}

std::span<float> ExpertPool::slot_grad(int proj, int slot) {
    EVENEP_CHECK(proj >= 0 && proj < detail::kNumProjections && slot >= 0 && slot < layout_.B,
                 "expert pool: projection ", proj, ", slot ", slot, " out of range (B = ", layout_.B, ")");
    return {reinterpret_cast<float*>(peers_[rank_] + layout_.slot_grad(proj, slot)),
            static_cast<size_t>(layout_.expert_elems())};
}

std::span<const float> ExpertPool::slot_grad(int proj, int slot) const {
    return const_cast<ExpertPool*>(this)->slot_grad(proj, slot);
}

void ExpertPool::begin_phase(const Plan& plan, const ExpertWeights& layer, const char* call) {
    traffic_ = PhaseTraffic(cfg_.cfg.R);
    LocalStatus status;
    status.run([&] {
        check_plan(plan, cfg_, rank_, call);
        check_layer(layer, cfg_, rank_, call);
        std::vector<int> level;
        (void)relay_levels(plan, level);
    });
    const int bad = team_.barrier(std::string(call) + ": start", status.ok);
    status.throw_if_failed(bad, call, "nothing was moved");
}

void ExpertPool::prefetch_weight(const Plan& plan, const ExpertWeights& layer) {
    const int B = static_cast<int>(layout_.B), epn = cfg_.cfg.epn();
    begin_phase(plan, layer, "prefetch_weight");
    std::vector<int> level;
    const int deepest = relay_levels(plan, level);  // checked in begin_phase: the same answer on every rank
    const int64_t n = layout_.expert_elems();
    for (int lvl = 1; lvl <= deepest; ++lvl) {
        if (lvl > 1) team_.barrier("prefetch_weight: relay level");
        for (int b = 0; b < B; ++b) {
            const size_t i = static_cast<size_t>(rank_) * B + b;
            const int32_t e = plan.copies[i];
            if (e < 0 || level[i] != lvl) continue;
            SlotContent& sc = slots_[b];
            const int home = e / epn, src = plan.relay_src[i];
            const uint64_t version = layer.version(home);
            if (sc.expert == e && sc.layer == &layer && sc.version == version) continue;
            EVENEP_ASSERT(home != rank_, "prefetch_weight: rank ", rank_, " slot ", b, " holds its own expert ", e);
            const int from = src == home ? -1 : detail::relay_slot_of(plan.copies.data(), B, src, e);
            for (int p = 0; p < detail::kNumProjections; ++p) {
                if (layout_.fp8) {  // the home's e4m3 cast (cast_fp8) or the relay's e4m3 slot
                    const Fp8Weight w =
                        from < 0 ? layer.peer_weight_fp8(p, home, e % epn)
                                 : Fp8Weight{reinterpret_cast<const Fp8E4m3*>(peers_[src] + layout_.slot_w8(p, from)),
                                             reinterpret_cast<const float*>(peers_[src] + layout_.slot_scale(p, from))};
                    std::memcpy(peers_[rank_] + layout_.slot_w8(p, b), w.codes, static_cast<size_t>(n));
                    std::memcpy(peers_[rank_] + layout_.slot_scale(p, b), w.scales,
                                static_cast<size_t>(layout_.expert_scales()) * 4);
                    continue;
                }
                const void* w = from < 0 ? static_cast<const void*>(layer.peer_weight(p, home, e % epn))
                                         : static_cast<const void*>(peers_[src] + layout_.slot_w(p, from));
                std::memcpy(slot_weight(p, b).data(), w, static_cast<size_t>(n) * 2);
            }
            sc = SlotContent{e, &layer, version};
            traffic_.rows += 1;
            traffic_.move(src, rank_,
                          detail::kNumProjections * (layout_.fp8 ? n + layout_.expert_scales() * 4 : n * 2));
        }
    }
}

void ExpertPool::reduce_grad(const Plan& plan, ExpertWeights& layer) {
    const int R = cfg_.cfg.R, B = static_cast<int>(layout_.B), epn = cfg_.cfg.epn();
    begin_phase(plan, layer, "reduce_grad");
    std::vector<int> level;
    const int deepest = relay_levels(plan, level);
    const int64_t n = layout_.expert_elems();
    // Adds the slot gradients of expert e's children of this rank (relay_src == rank_) into dst(p), ascending
    // (rank, slot), zeroing them.
    const auto pull_children = [&](int32_t e, auto&& dst) {
        for (int r = 0; r < R; ++r)
            for (int b = 0; b < B; ++b) {
                const size_t i = static_cast<size_t>(r) * B + b;
                if (plan.copies[i] != e || plan.relay_src[i] != rank_) continue;
                for (int p = 0; p < detail::kNumProjections; ++p) {
                    float* src = reinterpret_cast<float*>(peers_[r] + layout_.slot_grad(p, b));
                    float* d = dst(p);
                    for (int64_t k = 0; k < n; ++k) d[k] += src[k];
                    std::fill(src, src + n, 0.0f);
                }
                traffic_.rows += 1;
                traffic_.move(r, rank_, detail::kNumProjections * n * 4);
            }
    };
    for (int lvl = deepest - 1; lvl >= 1; --lvl) {
        for (int b = 0; b < B; ++b) {
            const size_t i = static_cast<size_t>(rank_) * B + b;
            if (plan.copies[i] >= 0 && level[i] == lvl)
                pull_children(plan.copies[i], [&](int p) { return slot_grad(p, b).data(); });
        }
        team_.barrier("reduce_grad: relay level");
    }
    for (int le = 0; le < epn; ++le) pull_children(rank_ * epn + le, [&](int p) { return layer.grad(p, le).data(); });
    team_.barrier("reduce_grad: slots consumed");
}

template <typename T, typename Pick>
void ExpertPool::table(const Plan& plan, const ExpertWeights& layer, std::vector<T>& out, Pick&& pick) const {
    const int G = plan.G(), epn = cfg_.cfg.epn();
    out.assign(G, T{});
    for (int g = 0; g < G; ++g) {
        const size_t i = static_cast<size_t>(rank_) * G + g;
        const int32_t e = plan.group_expert[i];
        switch (plan.group_source[i]) {
            case WeightSource::kEmpty:
                break;
            case WeightSource::kLocal:
                out[g] = pick(WeightSource::kLocal, rank_, e - rank_ * epn);
                break;
            case WeightSource::kSlot: {
                const int b = plan.group_slot[i];
                EVENEP_CHECK(b >= 0 && b < layout_.B, "weight table: rank ", rank_, ", group ", g, ": slot ", b,
                             " out of range");
                const SlotContent& sc = slots_[b];
                EVENEP_CHECK(sc.expert == e && sc.layer == &layer && sc.version == layer.version(e / epn),
                             "weight table: rank ", rank_, ", group ", g, ": slot ", b, " does not hold expert ", e,
                             " of this layer (call prefetch_weight with this plan and layer first)");
                out[g] = pick(WeightSource::kSlot, rank_, b);
                break;
            }
            case WeightSource::kPeer:
                out[g] = pick(WeightSource::kPeer, e / epn, e % epn);
                break;
        }
    }
}

void ExpertPool::weight_table(const Plan& plan,
                              const ExpertWeights& layer,
                              int proj,
                              std::vector<const Bf16*>& out) const {
    table(plan, layer, out, [&](WeightSource src, int rank, int index) -> const Bf16* {
        if (src == WeightSource::kSlot)
            return reinterpret_cast<const Bf16*>(peers_[rank_] + layout_.slot_w(proj, index));
        return rank == rank_ ? layer.weight(proj, index).data() : layer.peer_weight(proj, rank, index);
    });
}

void ExpertPool::weight_table_fp8(const Plan& plan,
                                  const ExpertWeights& layer,
                                  int proj,
                                  std::vector<Fp8Weight>& out) const {
    EVENEP_CHECK(layout_.fp8, "weight_table_fp8: rank ", rank_, ": the pool has no FP8 slots (", cfg_.to_string(), ")");
    table(plan, layer, out, [&](WeightSource src, int rank, int index) -> Fp8Weight {
        if (src == WeightSource::kSlot)
            return {reinterpret_cast<const Fp8E4m3*>(peers_[rank_] + layout_.slot_w8(proj, index)),
                    reinterpret_cast<const float*>(peers_[rank_] + layout_.slot_scale(proj, index))};
        return layer.peer_weight_fp8(proj, rank, index);
    });
}

void ExpertPool::grad_table(const Plan& plan, ExpertWeights& layer, int proj, std::vector<float*>& out) {
    const int G = plan.G(), epn = cfg_.cfg.epn();
    out.assign(G, nullptr);
    for (int g = 0; g < G; ++g) {
        const size_t i = static_cast<size_t>(rank_) * G + g;
        const int32_t e = plan.group_expert[i];
        switch (plan.group_source[i]) {
            case WeightSource::kEmpty:
                break;
            case WeightSource::kLocal:
                out[g] = layer.grad(proj, e - rank_ * epn).data();
                break;
            case WeightSource::kSlot:
                out[g] = slot_grad(proj, plan.group_slot[i]).data();
                break;
            case WeightSource::kPeer:
                EVENEP_CHECK(false, "grad table: rank ", rank_, ", group ", g, ": expert ", e,
                             " is read through the peer mapping (B = ", layout_.B, " < epn = ", epn,
                             "); training needs B = epn");
        }
    }
}

}  // namespace evenep::cpu
