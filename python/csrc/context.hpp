// python/csrc/context.hpp — the state behind one evenep.Buffer of the torch binding (python/csrc/ops.cpp): the
// CPU backend's virtual ranks, the plan and handle tensor layouts, and the argument checks shared by every op.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/plan_tensor.hpp"
#include "handle_record.hpp"

namespace evenep::python {

// Plan tensor: int32 [R, plan width], row r = rank r's share of the Plan (evenep::plan_columns: the columns are
// derived from the library's one list of plan arrays and exported by the plan_columns op, from which
// python/evenep/buffer.py builds its PlanLayout). The whole Plan is a pure function of the gathered (s, tpe), SPEC
// invariant 5, and is rebuilt from them.
// Handle tensor: int32 [R, s*K], rank r's encoded destinations dst (SPEC §3.4; tokens past s_r hold kMaskedDst).
// The buffers remember which (plan, handle, topk_weights) they hold, by value, so no op depends on call history.

// Bad input → ValueError (evenep::Error kInvalidArgument); an allocation that failed (std::bad_alloc, a CUDA
// cudaErrorMemoryAllocation) → torch.OutOfMemoryError; everything else → RuntimeError. (torch's own allocator
// raises c10::OutOfMemoryError itself, which passes through.)
template <typename F>
inline auto translate(F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::kInvalidArgument) TORCH_CHECK_VALUE(false, e.what());
        TORCH_CHECK_WITH(OutOfMemoryError, std::string(e.what()).find("cudaErrorMemoryAllocation") == std::string::npos,
                         "evenep: out of device memory: ", e.what());
        TORCH_CHECK(false, e.what());
    } catch (const std::bad_alloc& e) {
        TORCH_CHECK_WITH(OutOfMemoryError, false, "evenep: out of host memory (", e.what(), ")");
    }
}

// The buffer ids of every backend come from one counter; buffer_info of a CUDA buffer is answered by ops_cuda.cpp
// through the hook (returns an empty vector for an unknown id).
int64_t new_buffer_id();
using BufferInfoHook = std::vector<int64_t> (*)(int64_t id);
void set_cuda_buffer_info_hook(BufferInfoHook hook);

inline void check_tensor(const at::Tensor& t,
                         const char* op,
                         const char* name,
                         at::ScalarType dtype,
                         std::initializer_list<int64_t> sizes,
                         c10::DeviceType device = c10::DeviceType::CPU) {
    TORCH_CHECK_VALUE(t.device().type() == device, "evenep.", op, ": ", name, " is on ", t.device(), ", expected ",
                      c10::DeviceTypeName(device, /*lower_case=*/true));
    TORCH_CHECK_VALUE(t.scalar_type() == dtype, "evenep.", op, ": ", name, " has dtype ", t.scalar_type(),
                      ", expected ", dtype);
    TORCH_CHECK_VALUE(t.sizes().equals(sizes), "evenep.", op, ": ", name, " has shape ", t.sizes(), ", expected ",
                      at::IntArrayRef(sizes));
    TORCH_CHECK_VALUE(t.is_contiguous(), "evenep.", op, ": ", name, " is not contiguous");
}

// s_r of every rank: num_tokens when given (each in [1, s_pad] for the ranks served here, [served, + L), and in
// [1, S] for the others: with group= the other processes' tokens), else s_pad for all.
inline std::vector<int32_t> token_counts(const Config& c,
                                         int64_t s_pad,
                                         const std::optional<at::IntArrayRef>& num_tokens,
                                         const char* op,
                                         int served = 0,
                                         int num_served = -1) {
    const int R = c.R;
    if (num_served < 0) num_served = R;
    TORCH_CHECK_VALUE(s_pad >= 1 && s_pad <= c.S, "evenep.", op, ": s = ", s_pad,
                      " tokens per rank, expected 1 <= s <= max_tokens = ", c.S);
    std::vector<int32_t> s(R, static_cast<int32_t>(s_pad));
    if (num_tokens) {
        TORCH_CHECK_VALUE(static_cast<int>(num_tokens->size()) == R, "evenep.", op, ": num_tokens has ",
                          num_tokens->size(), " values, expected R = ", R);
        for (int r = 0; r < R; ++r) {
            const int64_t hi = r >= served && r < served + num_served ? s_pad : c.S;
            TORCH_CHECK_VALUE((*num_tokens)[r] >= 1 && (*num_tokens)[r] <= hi, "evenep.", op, ": num_tokens[", r,
                              "] = ", (*num_tokens)[r], " outside [1, ", hi == s_pad ? "s = " : "max_tokens = ", hi,
                              "]");
            s[r] = static_cast<int32_t>((*num_tokens)[r]);
        }
    }
    return s;
}

// The configuration of a buffer from create_buffer's arguments (validated: throws evenep::Error naming the value).
inline BufferConfig make_buffer_config(int64_t num_ranks,
                                       int64_t num_experts,
                                       int64_t top_k,
                                       int64_t max_tokens,
                                       int64_t hidden,
                                       int64_t ffn_hidden,
                                       int64_t num_slots,
                                       int64_t token_padding,
                                       const std::string& policy,
                                       double slack,
                                       DataPrecision precision = {}) {
    // The library's sizes are int: a value past int32 is refused as given, never wrapped (the Python package
    // refuses these first, with the argument's name).
    const std::pair<const char*, int64_t> args[] = {{"num_ranks", num_ranks},     {"num_experts", num_experts},
                                                    {"top_k", top_k},             {"max_tokens", max_tokens},
                                                    {"hidden", hidden},           {"ffn_hidden", ffn_hidden},
                                                    {"num_slots", num_slots},     {"token_padding", token_padding}};
    for (const auto& [name, v] : args)
        EVENEP_CHECK(v >= INT32_MIN && v <= INT32_MAX, "evenep.Buffer: ", name, " = ", v, " does not fit in int32");
    BufferConfig cfg;
    cfg.cfg.R = static_cast<int>(num_ranks);
    cfg.cfg.E = static_cast<int>(num_experts);
    cfg.cfg.K = static_cast<int>(top_k);
    cfg.cfg.S = static_cast<int>(max_tokens);
    cfg.cfg.B = static_cast<int>(num_slots);
    cfg.cfg.tp = static_cast<int>(token_padding);
    cfg.H = static_cast<int>(hidden);
    cfg.ffn_hidden = static_cast<int>(ffn_hidden);
    apply_planner_policy(cfg.cfg, policy, slack);
    cfg.precision = precision;
    cfg.validate();
    return cfg;
}

// buffer_info: [R, E, K, S, H, H', B, tp, NvS, G, plan width, L, rank_begin, home experts]: the ops' tensors lead
// with the L ranks served in this process (R with virtual ranks, 1 with group=), ranks [rank_begin, + L), whose
// home experts (the weights' dim 0) are E*L/R.
inline std::vector<int64_t> buffer_info_of(const BufferConfig& b, int local_ranks, int rank_begin) {
    const Config& c = b.cfg;
    return {c.R,           c.E,
            c.K,           c.S,
            b.H,           b.ffn_hidden,
            c.num_slots(), c.tp,
            c.recv_rows(), c.num_groups(),
            plan_row_width(c), local_ranks,
            rank_begin,    c.E / c.R * local_ranks};
}

// The grouped GEMM's weights: weight [E, in, out] and slots [R, B, in, out] of one dtype, contiguous, on `device`.
inline void check_gemm_weights(const Config& c,
                               const char* op,
                               const at::Tensor& w,
                               const at::Tensor& slots,
                               c10::DeviceType device = c10::DeviceType::CPU) {
    TORCH_CHECK_VALUE(w.dim() == 3 && w.size(0) == c.E, "evenep.", op, ": weight has shape ", w.sizes(),
                      ", expected [E = ", c.E, ", in, out]");
    check_tensor(w, op, "weight", w.scalar_type(), {w.size(0), w.size(1), w.size(2)}, device);
    check_tensor(slots, op, "slots", w.scalar_type(), {c.R, c.num_slots(), w.size(1), w.size(2)}, device);
}

// The grouped GEMM's output dtype (out_dtype argument): fp32 (default) or bf16 (one rounding of the fp32 sums).
inline at::ScalarType gemm_out_dtype(std::optional<at::ScalarType> d, const char* op) {
    const at::ScalarType t = d.value_or(at::kFloat);
    TORCH_CHECK_VALUE(t == at::kFloat || t == at::kBFloat16, "evenep.", op, ": out_dtype = ", t,
                      ", expected torch.float32 or torch.bfloat16");
    return t;
}

// A backend's grouped GEMM kernel Impl(op, x, w, slots, plan, buffer, out_dtype, transposed) as the kernels of the
// two ops of one schema: grouped_gemm (kTransposed false) and grouped_gemm_dgrad (true).
using GroupedGemmImpl = at::Tensor (*)(const char*,
                                       const at::Tensor&,
                                       const at::Tensor&,
                                       const at::Tensor&,
                                       const at::Tensor&,
                                       int64_t,
                                       std::optional<at::ScalarType>,
                                       bool);
template <GroupedGemmImpl Impl, bool kTransposed>
at::Tensor grouped_gemm_kernel(const at::Tensor& x,
                               const at::Tensor& w,
                               const at::Tensor& slots,
                               const at::Tensor& plan,
                               int64_t buffer,
                               std::optional<at::ScalarType> out_dtype) {
    return Impl(kTransposed ? "grouped_gemm_dgrad" : "grouped_gemm", x, w, slots, plan, buffer, out_dtype, kTransposed);
}

// The group total of unequal token counts (SPEC §1), -1 when every rank has the same count.
inline int64_t group_total(const std::vector<int32_t>& s) {
    if (std::all_of(s.begin(), s.end(), [&](int32_t v) { return v == s[0]; })) return -1;
    int64_t total = 0;
    for (int32_t v : s) total += v;
    return total;
}

class Context {
  public:
    Context(const BufferConfig& cfg, PlannerMode mode)
        : cfg_(cfg),
          layout_(PlanRowLayout::make(cfg.cfg)),
          group_(cfg.cfg.R),
          planner_(cfg.cfg, mode),
          buffers_(cfg.cfg.R),
          cur_(cfg.cfg.R) {
        cpu::run_ranks_or_throw(group_,
                                [&](Team& t) { buffers_[t.rank()] = std::make_unique<cpu::Buffer>(t, cfg_, mode); });
        // The auto policy's step-cost coefficients for this buffer's layer shape (docs/auto.md), as cuda::MoeLayer's;
        // the Context's planner and the buffers' (FP8 dispatch plans again) plan the same plans.
        if (cfg.cfg.policy == PlannerPolicy::kAuto) {
            const detail::AutoCostModel model = layer_auto_cost_model(cfg);
            planner_.set_auto_model(model);
            for (auto& b : buffers_) b->set_auto_model(model);
        }
    }

    const Config& cfg() const { return cfg_.cfg; }
    const BufferConfig& buffer_config() const { return cfg_; }
    int H() const { return cfg_.H; }
    int ffn_hidden() const { return cfg_.ffn_hidden; }
    int64_t nvs() const { return cfg_.cfg.recv_rows(); }
    const PlanRowLayout& plan_layout() const { return layout_; }
    std::mutex& mutex() { return mutex_; }

    // Plans from every rank's topk_idx (int32 [R, s, K]) with s_r tokens each; returns the plan tensor.
    at::Tensor plan(const at::Tensor& topk_idx, const std::vector<int32_t>& s) {
        const Config& c = cfg();
        const int R = c.R, E = c.E, K = c.K;
        const int64_t s_pad = topk_idx.size(1);
        std::vector<int32_t> tpe(static_cast<size_t>(R) * E);
        const int32_t* idx = topk_idx.data_ptr<int32_t>();
        for (int r = 0; r < R; ++r)
            compute_tpe(c, r, {idx + r * s_pad * K, static_cast<size_t>(s[r]) * K}, s[r],
                        std::span(tpe).subspan(static_cast<size_t>(r) * E, E));
        check_group_tokens(c, s, group_total(s));
        const Plan& p = full_plan(s, tpe);
        const int64_t W = plan_layout().width;
        at::Tensor out = at::empty({R, W}, at::kInt);
        for (int r = 0; r < R; ++r) pack_plan_row(p, r, {out.data_ptr<int32_t>() + r * W, static_cast<size_t>(W)});
        return out;
    }

    // The Plan a plan tensor stands for (checked: [R, width], s_r in [1, S]).
    const Plan& plan_of(const at::Tensor& plan, const char* op) {
        const PlanRowLayout& L = plan_layout();
        check_tensor(plan, op, "plan", at::kInt, {cfg().R, L.width});
        std::vector<int32_t> s(cfg().R), tpe(static_cast<size_t>(cfg().R) * cfg().E);
        for (int r = 0; r < cfg().R; ++r) {
            const int32_t* row = plan.data_ptr<int32_t>() + static_cast<int64_t>(r) * L.width;
            s[r] = row[L.s];
            std::copy_n(row + L.tpe, cfg().E, tpe.begin() + static_cast<int64_t>(r) * cfg().E);
        }
        check_group_tokens(cfg(), s, group_total(s));
        return full_plan(s, tpe);
    }

    // Handles of a dispatch of the plan with every rank's topk_idx and weights ([R, s, K]); no data moves.
    std::vector<cpu::DispatchHandle> make_handles(const Plan& p, const at::Tensor& topk_idx, const at::Tensor& topk_w) {
        const int R = cfg().R, K = cfg().K;
        const int64_t s_pad = topk_w.size(1);
        std::vector<cpu::DispatchHandle> hs(R);
        for (int r = 0; r < R; ++r) {
            cpu::DispatchHandle& h = hs[r];
            h.plan = p;
            h.rank = r;
            h.s = p.s[r];
            const size_t n = static_cast<size_t>(h.s) * K;
            h.dst.resize(n);
            h.topk_w.assign(topk_w.data_ptr<float>() + r * s_pad * K, topk_w.data_ptr<float>() + r * s_pad * K + n);
            if (topk_idx.defined()) compute_dst(p, r, {topk_idx.data_ptr<int32_t>() + r * s_pad * K, n}, h.dst);
        }
        return hs;
    }

    // Dispatches x ([R, s, H] bf16) with the handles (collective over the virtual ranks); the buffer then holds them.
    std::vector<cpu::DispatchHandle>& dispatch(std::vector<cpu::DispatchHandle> hs,
                                               const at::Tensor& x,
                                               const at::Tensor& plan,
                                               const at::Tensor& handle,
                                               const at::Tensor& topk_w) {
        invalidate();
        const int64_t s_pad = x.size(1);
        cpu::run_ranks_or_throw(group_, [&](Team& t) {
            const int r = t.rank();
            const Bf16* xr = reinterpret_cast<const Bf16*>(x.data_ptr()) + r * s_pad * H();
            buffers_[r]->dispatch(hs[r], {xr, static_cast<size_t>(hs[r].s) * H()});
        });
        cur_ = std::move(hs);
        cur_plan_ = plan.clone();
        cur_handle_ = handle.clone();
        cur_topk_w_ = topk_w.clone();
        return cur_;
    }

    // The FP8 dispatch of the library (BufferConfig::precision.fp8, docs/fp8.md): every rank's planning dispatch of
    // its bf16 rows x ([R, s, H]), each token quantised once at the source into e4m3 + 1x128 scales, which land in
    // every rank's recv_x8/recv_scale. The library plans again from the gathered histograms: the same plan as `plan`
    // (SPEC invariant 5); its destinations must equal the handles' (checked). The buffer then holds the dispatch.
    std::vector<cpu::DispatchHandle>& dispatch_fp8(const std::vector<cpu::DispatchHandle>& hs,
                                                   const at::Tensor& x,
                                                   const at::Tensor& topk_idx,
                                                   const at::Tensor& plan,
                                                   const at::Tensor& handle,
                                                   const at::Tensor& topk_w) {
        invalidate();
        const int R = cfg().R, K = cfg().K;
        const int64_t s_pad = x.size(1);
        std::vector<int32_t> s(R);
        for (int r = 0; r < R; ++r) s[r] = hs[r].s;
        const int64_t s_total = group_total(s);
        std::vector<cpu::DispatchHandle> out(R);
        cpu::run_ranks_or_throw(group_, [&](Team& t) {
            const int r = t.rank();
            cpu::DispatchArgs a;
            a.s = hs[r].s;
            a.x = {reinterpret_cast<const Bf16*>(x.data_ptr()) + r * s_pad * H(), static_cast<size_t>(a.s) * H()};
            a.topk_idx = {topk_idx.data_ptr<int32_t>() + r * s_pad * K, static_cast<size_t>(a.s) * K};
            a.topk_w = {topk_w.data_ptr<float>() + r * s_pad * K, static_cast<size_t>(a.s) * K};
            a.s_total = s_total;
            out[r] = buffers_[r]->dispatch(a);
        });
        for (int r = 0; r < R; ++r)
            TORCH_CHECK(out[r].dst == hs[r].dst, "evenep.dispatch (fp8): rank ", r,
                        ": the library's destinations differ from the plan tensor's (internal error)");
        cur_ = std::move(out);
        cur_plan_ = plan.clone();
        cur_handle_ = handle.clone();
        cur_topk_w_ = topk_w.clone();
        return cur_;
    }

    // Makes the buffer hold the dispatch `handle` (int32 [R, s*K]) of `plan` with weights topk_w: nothing to do when
    // it already does (same plan, destinations and weights); otherwise dispatches it again (zero rows, the
    // handle's weights and chains).
    std::vector<cpu::DispatchHandle>& hold(const at::Tensor& plan,
                                           const at::Tensor& handle,
                                           const at::Tensor& topk_w,
                                           const char* op) {
        const int R = cfg().R, K = cfg().K;
        check_tensor(handle, op, "handle", at::kInt, {R, handle.dim() == 2 ? handle.size(1) : -1});
        TORCH_CHECK_VALUE(handle.size(1) >= K && handle.size(1) % K == 0, "evenep.", op, ": handle has ",
                          handle.size(1), " columns, expected s*K");
        const int64_t s_pad = handle.size(1) / K;
        check_tensor(topk_w, op, "topk_weights", at::kFloat, {R, s_pad, K});
        check_tensor(plan, op, "plan", at::kInt, {R, plan_layout().width});
        handles_.check(handle, plan, false, op);  // never a destination dispatch did not make (handle_record.hpp)
        if (holds(plan, handle, topk_w)) return cur_;
        const Plan& p = plan_of(plan, op);
        std::vector<cpu::DispatchHandle> hs = make_handles(p, {}, topk_w);
        for (int r = 0; r < R; ++r) {
            TORCH_CHECK_VALUE(hs[r].s <= s_pad, "evenep.", op, ": the plan gives rank ", r, " ", hs[r].s,
                              " tokens but the handle holds ", s_pad);
            std::copy_n(handle.data_ptr<int32_t>() + r * handle.size(1), hs[r].dst.size(), hs[r].dst.begin());
        }
        // NOTE: the destinations are the plan's: handles_ recognised them as a handle dispatch made with this plan.
        return dispatch(std::move(hs), at::zeros({R, s_pad, H()}, at::kBFloat16), plan, handle, topk_w);
    }

    // Records the handle a dispatch of `plan` just made (the handles hold() accepts).
    void record_handle(const at::Tensor& handle, const at::Tensor& plan) { handles_.add(handle, plan, plan); }

    // After dispatch_backward replaced the row weights with their gradients: the buffer no longer holds a dispatch.
    void invalidate() { cur_plan_ = at::Tensor(); }
    // Whether the buffers hold the dispatch (plan, handle, topk_w) (compared by value).
    bool holds(const at::Tensor& plan, const at::Tensor& handle, const at::Tensor& topk_w) const {
        return cur_plan_.defined() && cur_handle_.sizes() == handle.sizes() && at::equal(cur_plan_, plan) &&
               at::equal(cur_handle_, handle) && at::equal(cur_topk_w_, topk_w);
    }

    cpu::Buffer& buffer(int r) { return *buffers_[r]; }
    cpu::LocalTeamGroup& group() { return group_; }

  private:
    const Plan& full_plan(const std::vector<int32_t>& s, const std::vector<int32_t>& tpe) {
        if (s != last_s_ || tpe != last_tpe_) {
            last_s_.clear();  // a failed plan leaves no cache entry
            planner_.plan(tpe, s, last_plan_);
            last_s_ = s;
            last_tpe_ = tpe;
        }
        return last_plan_;
    }

    BufferConfig cfg_;
    PlanRowLayout layout_;
    cpu::LocalTeamGroup group_;
    Planner planner_;
    std::vector<std::unique_ptr<cpu::Buffer>> buffers_;
    std::vector<cpu::DispatchHandle> cur_;           // the dispatch the buffers hold, valid when cur_plan_ is defined
    at::Tensor cur_plan_, cur_handle_, cur_topk_w_;  // its tensors
    HandleRecords handles_{true};                    // the handles dispatch made, recognised by value
    std::vector<int32_t> last_s_, last_tpe_;
    Plan last_plan_;
    std::mutex mutex_;
};

// Per-group pointers of rank r into the home weights w [E, a, b] or the slots [R, B, a, b] (by group source).
template <typename T>
std::vector<T*> group_table(const Context& ctx, const at::Tensor& plan, int r, T* w, T* slots, int64_t mat) {
    const PlanRowLayout& L = ctx.plan_layout();
    const int32_t* row = plan.data_ptr<int32_t>() + static_cast<int64_t>(r) * L.width;
    std::vector<T*> table(L.G, nullptr);
    for (int g = 0; g < L.G; ++g) {
        const auto src = static_cast<WeightSource>(row[L.group_source + g]);
        if (src == WeightSource::kLocal || src == WeightSource::kPeer)
            table[g] = w + static_cast<int64_t>(row[L.group_expert + g]) * mat;
        else if (src == WeightSource::kSlot)
            table[g] = slots + (static_cast<int64_t>(r) * L.B + row[L.group_slot + g]) * mat;
    }
    return table;
}

// The Context of buffer `id` (ops.cpp's registry; ValueError when there is none).
std::shared_ptr<Context> context(int64_t id);

// topk_idx ([R, s, K] int32 or int64, ids in [-1, E)) as int32.
inline at::Tensor topk_int32(const Context& ctx, const at::Tensor& topk_idx, const char* op) {
    const int64_t s = topk_idx.dim() == 3 ? topk_idx.size(1) : -1;
    TORCH_CHECK_VALUE(topk_idx.scalar_type() == at::kInt || topk_idx.scalar_type() == at::kLong, "evenep.", op,
                      ": topk_idx has dtype ", topk_idx.scalar_type(), ", expected int32 or int64");
    check_tensor(topk_idx, op, "topk_idx", topk_idx.scalar_type(), {ctx.cfg().R, s, ctx.cfg().K});
    if (topk_idx.scalar_type() == at::kLong && topk_idx.numel() > 0) {
        const int64_t lo = topk_idx.min().item<int64_t>(), hi = topk_idx.max().item<int64_t>();
        TORCH_CHECK_VALUE(lo >= -1 && hi < ctx.cfg().E, "evenep.", op, ": topk_idx holds expert id ", lo < -1 ? lo : hi,
                          " outside [-1, E = ", ctx.cfg().E, ")");
    }
    return topk_idx.to(at::kInt);
}

// What every dispatch op checks and decides before moving rows: topk_idx as int32, the token counts, the Plan of
// `plan` (its s_r checked against the call's), every rank's handle and the handle tensor (int32 [R, s*K]).
struct DispatchSetup {
    at::Tensor idx;
    std::vector<int32_t> s;
    const Plan* plan = nullptr;
    std::vector<cpu::DispatchHandle> hs;
    at::Tensor handle;
};

inline DispatchSetup dispatch_setup(Context& ctx,
                                    const at::Tensor& topk_idx,
                                    const at::Tensor& topk_weights,
                                    const at::Tensor& plan,
                                    int64_t s_pad,
                                    const std::optional<at::IntArrayRef>& num_tokens) {
    const int R = ctx.cfg().R, K = ctx.cfg().K;
    DispatchSetup d;
    d.idx = topk_int32(ctx, topk_idx, "dispatch");
    check_tensor(topk_weights, "dispatch", "topk_weights", at::kFloat, {R, s_pad, K});
    d.s = token_counts(ctx.cfg(), s_pad, num_tokens, "dispatch");
    d.plan = &ctx.plan_of(plan, "dispatch");
    for (int r = 0; r < R; ++r)
        TORCH_CHECK_VALUE(d.plan->s[r] == d.s[r], "evenep.dispatch: the plan was made for ", d.plan->s[r],
                          " tokens on rank ", r, " but x holds ", d.s[r]);
    d.hs = ctx.make_handles(*d.plan, d.idx, topk_weights);
    d.handle = at::full({R, s_pad * K}, detail::kMaskedDst, at::kInt);
    for (int r = 0; r < R; ++r)
        std::copy(d.hs[r].dst.begin(), d.hs[r].dst.end(), d.handle.data_ptr<int32_t>() + r * d.handle.size(1));
    return d;
}

// After a dispatch of plan p: every rank's row weights recv_w (fp32 [R, NvS], 0 past its rows) and cu_seqlens
// (int32 [R, G]).
inline std::pair<at::Tensor, at::Tensor> dispatch_weights(Context& ctx, const Plan& p) {
    const int R = ctx.cfg().R, G = ctx.cfg().num_groups();
    const int64_t nvs = ctx.nvs();
    at::Tensor recv_w = at::zeros({R, nvs}, at::kFloat);
    at::Tensor cu = at::empty({R, G}, at::kInt);
    for (int r = 0; r < R; ++r) {
        std::copy_n(ctx.buffer(r).recv_w().data(), p.rows_used(r), recv_w.data_ptr<float>() + r * nvs);
        std::copy_n(p.cu_seqlens.begin() + r * G, G, cu.data_ptr<int32_t>() + r * G);
    }
    return {recv_w, cu};
}

}  // namespace evenep::python
