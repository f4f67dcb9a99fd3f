// python/csrc/cuda_context.hpp — the state behind one CUDA evenep.Buffer (python/csrc/ops_cuda.cpp): a cuda::Team —
// R virtual ranks on one GPU (cuda::LocalTeam) or this process's one rank of a group (cuda::NcclTeam, group=) — with
// one cuda::Ep over it. The ops act for the L ranks the team serves ([rank_begin, rank_begin + L): all R locally,
// one on the NCCL team): their tensors lead with L.
//
// Expert pools (NCCL team): the home weights of the other ranks live in their processes, so prefetch_weight and
// reduce_grad go through the library's cuda::Experts (symmetric windows): one per matrix size and direction,
// created on first use (collective: every rank calls the ops in the same order) and shared by every layer.
//
// Plans. An op given a plan tensor uses that plan: combine, combine_backward, dispatch_backward (and, with group=,
// prefetch_weight / reduce_grad) make it resident from the tensor and the handle (cuda::unpack_plan: no planning,
// no host synchronisation); dispatch, whose kernels need the encoded destinations the tensor lacks, plans again
// from topk_idx (the plan is a pure function of the routing). The one fast path: the plan of the tensor the latest
// plan op returned (or the latest dispatch planned again for) is used as it is while it is still resident
// (LastPlan) — dispatch right after plan does not plan twice. Nothing else is kept: no plan is looked up by its
// tensor among others, no tensor is compared by value.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "context.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/cuda/team.hpp"

namespace evenep::python {

// The plan of the latest plan op (or dispatch that planned again) and its tensor (identity and version).
struct LastPlan {
    TensorKey tensor;
    int64_t version = -1;
    cuda::EpPlan plan;
};

class CudaContext {
  public:
    // boot: the NCCL team's bootstrap (group=), nullptr for R virtual ranks on `device`.
    CudaContext(const BufferConfig& cfg, PlannerMode mode, int device, int num_sms, const cuda::NcclBootstrap* boot);
    ~CudaContext();

    const Config& cfg() const { return cfg_.cfg; }
    const BufferConfig& buffer_config() const { return cfg_; }
    int H() const { return cfg_.H; }
    int ffn_hidden() const { return cfg_.ffn_hidden; }
    int64_t nvs() const { return cfg().recv_rows(); }
    int device() const { return device_; }
    int L() const { return team_->num_local_ranks(); }        // ranks served here: the ops' leading dimension
    int rank_begin() const { return team_->rank_begin(); }    // the first of them
    bool multi_process() const { return nccl_; }              // the NCCL team (group=), also with a group of one
    int num_home() const { return cfg().E / cfg().R * L(); }  // home experts of the served ranks (weights' dim 0)
    int expert_base() const { return cfg().E / cfg().R * rank_begin(); }  // global id of the first of them
    const PlanRowLayout& plan_layout() const { return layout_; }
    // A plan tensor [rows, width] on the device as the library's device functions take it (evenep/cuda/expert_ops.hpp).
    cuda::PlanRows plan_rows(const at::Tensor& plan, int rows) const {
        return {static_cast<const int32_t*>(plan.data_ptr()), rows, layout_};
    }
    std::mutex& mutex() { return mutex_; }
    cuda::Ep& ep() { return *ep_; }
    cuda::Team& team() { return *team_; }
    // The expert pool of `elems` (bf16 units) per matrix: weights + slots (prefetch) or slot gradients + gradients
    // (reduce, fp32 elems); created on first use (collective on the NCCL team, refused during graph capture).
    cuda::Experts& experts(int64_t elems, bool grads, bool capturing);
    // NCCL team: a device barrier of the group on `channel` before this rank overwrites memory its peers read or
    // write in the previous call of that channel (a slow peer may still pull this rank's receive rows from the
    // previous combine, or push into its slots); the local team needs none (one launch serves every rank).
    void peer_barrier(cudaStream_t stream, int channel);
    const at::Tensor& scratch_rows() const { return scratch_; }  // bf16 [L, S, H] (unused pointer slots)

    // Raises (ValueError / RuntimeError, after recovering the team) when the device recorded an error in an earlier
    // call (a bad expert id); `sync`: synchronise the stream first (Buffer.check()).
    void surface_errors(cudaStream_t stream, bool sync);

    // The plan of plan tensor `t` when `t` is the tensor the latest plan op returned (or the latest dispatch planned
    // again for), unchanged, and that plan is still resident (its arrays, dst included, are in the buffers); else
    // an empty plan.
    cuda::EpPlan last_plan(const at::Tensor& t) const;
    void set_last_plan(const at::Tensor& t, cuda::EpPlan plan);
    // Released before another plan becomes resident (so the Ep never copies it out: no plan outlives residency).
    void drop_last_plan() { last_ = {}; }
    // Plan tensor `plan` ([L, W] int32, checked by the caller) made resident (cuda::unpack_plan) with the handle's
    // destinations (handle [L, s_pad*K] int32). handle null: for cuda::Experts (group=), which reads every rank's
    // copies table — the latest plan op's plan when it is still resident (the planner wrote every share), else the
    // rows written into every rank's buffer (every_rank; the caller has passed a peer barrier).
    cuda::EpPlan unpack(const at::Tensor& plan, const int32_t* handle, int64_t s_pad, cudaStream_t stream);
    // The handles dispatch made (recognised by identity and version counter, copies by value outside capture).
    HandleRecords& handles() { return handles_; }

  private:
    BufferConfig cfg_;
    int device_;
    bool nccl_ = false;
    std::unique_ptr<cuda::Team> team_;  // before ep_: the Ep's window belongs to the team
    std::unique_ptr<cuda::Ep> ep_;
    std::map<std::pair<int64_t, bool>, std::unique_ptr<cuda::Experts>> experts_;  // after ep_: windows of the team
    PlanRowLayout layout_;
    at::Tensor scratch_;
    LastPlan last_;
    HandleRecords handles_{false};
    std::mutex mutex_;
};

bool stream_capturing(cudaStream_t stream);

// What every CUDA op starts with: its buffer's context (locked for the call), a guard of the buffer's device, the
// current torch stream of that device and whether it is capturing a graph; raises errors the device recorded in
// an earlier call (CudaContext::surface_errors).
struct OpScope {
    std::shared_ptr<CudaContext> ctx;
    std::unique_lock<std::mutex> lock;
    c10::cuda::CUDAGuard guard;
    cudaStream_t stream;
    bool capturing;
    OpScope(int64_t id, const char* op);
};

// check_tensor on the buffer's CUDA device.
void check_cuda(const CudaContext& ctx,
                const at::Tensor& t,
                const char* op,
                const char* name,
                at::ScalarType dtype,
                std::initializer_list<int64_t> sizes);
// Home weights [E*L/R, in, out] of dtype on the buffer's device: every expert with virtual ranks, this rank's E/R
// with group=.
void check_home(const CudaContext& ctx, const at::Tensor& w, const char* op, const char* name, at::ScalarType dtype);
// topk_idx ([L, s, K] int32 or int64 on the device) as int32 (int64 ids past int32 clamped to its range).
at::Tensor topk_int32(const CudaContext& ctx, const at::Tensor& topk_idx, const char* op);

template <typename T>
T* ptr(const at::Tensor& t) {
    return reinterpret_cast<T*>(t.data_ptr());
}

inline at::TensorOptions on(const CudaContext& ctx, at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA, ctx.device());
}

// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.fill_uninitialized_memory: what an op
// leaves unwritten is zero (torch.empty itself then fills NaN; these ops promise zero, as on the CPU).
inline bool unwritten_zero() {
    return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}

// An output whose unwritten parts are unspecified (zero under unwritten_zero()).
inline at::Tensor output(const CudaContext& ctx, at::IntArrayRef shape, at::ScalarType dtype) {
    return unwritten_zero() ? at::zeros(shape, on(ctx, dtype)) : at::empty(shape, on(ctx, dtype));
}

// Rank i's rows of an [L, NvS, row_elems] tensor of elements of type T as the kernels' caller-owned receive rows
// (virtual ranks only: nullptr on the NCCL team, whose rows live in its window).
template <typename T = uint16_t>
T* rows_of(const CudaContext& ctx, const at::Tensor& t, int i, int64_t row_elems) {
    return ctx.multi_process() ? nullptr : static_cast<T*>(t.data_ptr()) + i * ctx.nvs() * row_elems;
}
inline uint16_t* rows_of(const CudaContext& ctx, const at::Tensor& t, int i) { return rows_of(ctx, t, i, ctx.H()); }

// ---- the grouped GEMM ops' per-call scratch and tables (ops_cuda.cpp: bf16; ops_fp8_cuda.cpp: FP8) ----

// Per-call device scratch (torch's allocator: the graph's private pool during capture): `num_tables` pointer tables
// of `groups` groups and their shifted cu_seqlens (cuda::build_group_table), then `calls` GEMM workspaces, then
// `extra_bytes` for the op (the FP8 forward's transposed weights). Every region 256-byte aligned.
struct GemmScratch {
    at::Tensor bytes;
    size_t table_bytes = 0, cu_off = 0, ws_off = 0, ws_bytes = 0, extra_off = 0;
    GemmScratch(const CudaContext& ctx, int groups, int calls, int num_tables = 1, size_t extra_bytes = 0) {
        auto align = [](size_t v) { return (v + 255) / 256 * 256; };
        ws_bytes = align(cuda::grouped_gemm_workspace_bytes(groups));
        table_bytes = align(static_cast<size_t>(groups) * sizeof(void*));
        cu_off = num_tables * table_bytes;
        ws_off = cu_off + align(static_cast<size_t>(groups) * sizeof(int32_t));
        extra_off = ws_off + calls * ws_bytes;
        bytes = at::empty({static_cast<int64_t>(extra_off + align(extra_bytes))}, on(ctx, at::kByte));
    }
    char* base() const { return static_cast<char*>(bytes.data_ptr()); }
    const void** table(int t = 0) const { return reinterpret_cast<const void**>(base() + t * table_bytes); }
    // Table t from its entry `first` on, as the GEMM arguments' pointer type.
    template <typename T>
    T* const* table_as(int64_t first, int t = 0) const {
        return reinterpret_cast<T* const*>(base() + t * table_bytes) + first;
    }
    int32_t* cu() const { return reinterpret_cast<int32_t*>(base() + cu_off); }
    void* workspace(int i) const { return base() + ws_off + i * ws_bytes; }
    void* extra() const { return base() + extra_off; }
};

// A pointer table (and, where cu is non-null, the shifted cu_seqlens) of one grouped GEMM over every served rank's
// groups (cuda::build_group_table): home = the served ranks' home matrices, slots = their slots, mat_bytes each.
inline void group_table(const CudaContext& ctx,
                        const at::Tensor& plan,
                        const at::Tensor& home,
                        const at::Tensor& slots,
                        int64_t mat_bytes,
                        const void** table,
                        int32_t* cu,
                        cudaStream_t stream) {
    cuda::GroupTableArgs t;
    t.plan = ctx.plan_rows(plan, ctx.L());
    t.nvs = ctx.nvs();
    t.expert_base = ctx.expert_base();
    t.num_home = ctx.num_home();
    t.home = home.data_ptr();
    t.slots = slots.data_ptr();
    t.mat_bytes = mat_bytes;
    t.table = table;
    t.cu = cu;
    cuda::build_group_table(t, stream);
}
// The scratch's first table and its cu_seqlens.
inline void group_table(const CudaContext& ctx,
                        const at::Tensor& plan,
                        const at::Tensor& home,
                        const at::Tensor& slots,
                        int64_t mat_bytes,
                        const GemmScratch& scratch,
                        cudaStream_t stream) {
    group_table(ctx, plan, home, slots, mat_bytes, scratch.table(), scratch.cu(), stream);
}

// The dispatch ops (ops_cuda.cpp, ops_fp8_cuda.cpp), after checking their rows x: topk_idx, topk_weights and plan
// checked for s_pad tokens per rank, and the plan the kernels use for plan tensor `plan` (the latest plan op's while
// resident, else planned again from topk_idx with s_r tokens per rank, num_tokens or s_pad; refused when made for
// other token counts); then what follows the data movement: recv_w [L, NvS] gathered from the buffers (and recv_x
// when given: the NCCL team's rows, copied out of its window), cu_seqlens (the plan's column) and the handle
// (recorded).
cuda::EpPlan dispatch_plan(OpScope& sc,
                           const at::Tensor& topk_idx,
                           const at::Tensor& topk_weights,
                           const at::Tensor& plan,
                           int64_t s_pad,
                           std::optional<at::IntArrayRef> num_tokens);
std::tuple<at::Tensor, at::Tensor, at::Tensor> dispatch_results(OpScope& sc,
                                                                const at::Tensor& plan,
                                                                int64_t s_pad,
                                                                const at::Tensor* recv_x);

}  // namespace evenep::python
