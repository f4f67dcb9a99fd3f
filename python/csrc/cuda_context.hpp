// python/csrc/cuda_context.hpp — the state behind one CUDA evenep.Buffer (python/csrc/ops_cuda.cpp): a cuda::Team —
// R virtual ranks on one GPU (cuda::LocalTeam) or this process's one rank of a group (cuda::NcclTeam, group=) — with
// one cuda::Ep over it, the plans it made (keyed by their plan tensors) and which dispatch its receive buffers hold.
// The ops act for the L ranks the team serves ([rank_begin, rank_begin + L): all R locally, one on the NCCL team):
// their tensors lead with L.
//
// Expert pools (NCCL team): the home weights of the other ranks live in their processes, so prefetch_weight and
// reduce_grad go through the library's cuda::Experts (symmetric windows): one per matrix size and direction,
// created on first use (collective: every rank calls the ops in the same order) and shared by every layer.
//
// Plans. cuda::Ep plans are values (EpPlan) whose arrays live on the device; the op's plan tensor is a packed copy
// of them (bit-identical to the CPU op's). Ops find the EpPlan of a plan tensor by the tensor's storage (a weak
// reference: the entry dies with the last tensor sharing that storage, which releases the EpPlan), never by reading
// the tensor on the host. A plan tensor the buffer did not make (a copy, e.g. by opcheck) is matched by value
// against the live plans — a host synchronisation, refused while a CUDA graph is being captured.
//
// Holding. combine and dispatch_backward need the receive buffers to hold the rows and chains of the dispatch of
// their (plan, handle, topk_weights); the Context records which (by storage identity) the last dispatch or
// combine_backward left there. Another one is dispatched again first (zero rows, the handle's plan and weights: no
// planning, no host synchronisation), so no op depends on the call history.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "context.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/cuda/team.hpp"

namespace evenep::python {

struct PlanEntry {
    TensorKey key;      // the plan tensor
    at::Tensor value;   // its packed content (for matching copies by value outside capture)
    cuda::EpPlan plan;  // the device plan
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
    const at::Tensor& zero_rows() const { return zero_rows_; }   // bf16 [L, S, H] zeros (re-dispatch input)
    const at::Tensor& scratch_rows() const { return scratch_; }  // bf16 [L, S, H] (unused pointer slots)

    // Raises (ValueError / RuntimeError, after recovering the team) when the device recorded an error in an earlier
    // call (a bad expert id); `sync`: synchronise the stream first (Buffer.check()).
    void surface_errors(cudaStream_t stream, bool sync);

    // Drops the entries whose plan tensors died (releasing their EpPlans: the Ep then need not copy a dead plan out
    // when the next plan replaces it).
    void prune_plans();
    // Registers the plan tensor `t` of `plan`.
    std::shared_ptr<PlanEntry> add_plan(const at::Tensor& t, cuda::EpPlan plan);
    // The entry of plan tensor `t` (checked [R, W] int32 on the device); nullptr when none matches. Copies are
    // matched by value outside graph capture only.
    std::shared_ptr<PlanEntry> find_plan(const at::Tensor& t, bool capturing);
    std::shared_ptr<PlanEntry> plan_of(const at::Tensor& t, bool capturing, const char* op);

    // What the receive buffers hold (set by dispatch and combine_backward, cleared by dispatch_backward).
    bool holds(const PlanEntry& p, const at::Tensor& handle, const at::Tensor& topk_w) const;
    void set_held(const std::shared_ptr<PlanEntry>& p, const at::Tensor& handle, const at::Tensor& topk_w);
    void invalidate() { held_plan_.reset(); }
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
    at::Tensor zero_rows_, scratch_;
    std::vector<std::shared_ptr<PlanEntry>> plans_;
    std::weak_ptr<PlanEntry> held_plan_;
    TensorKey held_handle_, held_topk_w_;
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
// topk_idx ([L, s, K] int32 or int64 on the device) as int32 (int64 ids past int32 clamped to its range).
at::Tensor topk_int32(const CudaContext& ctx, const at::Tensor& topk_idx, const char* op);

}  // namespace evenep::python
