// evenep/cuda/ep.hpp — the CUDA data path of one EP group of R virtual ranks on one GPU (SPEC §3–§5).
//
// plan -> dispatch -> (expert compute on recv_x, in place) -> combine, every step an asynchronous launch on the
// caller's stream with no host synchronisation and no allocation, so the whole sequence captures into one CUDA
// graph and replays with the same results. The results are bit-identical to the CPU backend (evenep::cpu):
// the same plan arrays and encoded destinations, the same receive-buffer rows, weights and chain metadata
// (evenep/detail/buffer_layout.hpp), the same combine output (fp32 summation order in src/cuda/kernels/combine.cu).
//
// Usage:
//   DeviceEp ep(cfg, H);
//   ep.bind(io);                       // once: per-rank device pointers of x, topk_idx, topk_w, out, out_w
//   ep.plan(s, stream);                // histogram, all-gather, every rank plans, encoded dst
//   ep.dispatch(stream);               // rows into recv_x(r) of every rank, in group order
//   ... expert compute writes y into recv_x(r) (zero-copy) ...
//   ep.combine(apply_weights, mode, stream);
//   ep.check(stream);                  // optional: synchronise and surface device-side errors as evenep::Error
// dispatch/combine reuse the last plan (plan reuse, SPEC §4.3) until plan() is called again.
//
// Backward (SPEC §4.3, the CPU backend's cpu::Buffer::combine_backward / dispatch_backward bit for bit):
//   ep.bind_backward(bio);             // once: per-rank grad_out, grad_x, grad_topk_w (and optional grad_recv_w)
//   ep.combine_backward(stream);       // dispatch of grad_out with the last plan: rows into recv_x(r) (no planning)
//   ... expert backward writes the gradient rows into recv_x(r) and, optionally, row-weight gradients into recv_w(r)
//   ep.dispatch_backward(mode, stream);  // combine of recv_x(r), unweighted -> grad_x; gathered recv_w -> grad_topk_w
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/cuda/layout.hpp"
#include "evenep/cuda/team.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/plan.hpp"

namespace evenep::cuda {

struct EpOptions {
    PlannerMode mode = PlannerMode::kOptimized;
    PlannerKernel planner_kernel = PlannerKernel::kParallel;
    int sm_budget = 32;        // SMs per virtual rank for the communication kernels (clamped to co-residency)
    int max_plan_blocks = 64;  // blocks per rank of the plan kernel (sizes the per-block histograms)
    TeamOptions team;
};

// Caller-owned device pointers of one virtual rank for the backward calls (DeviceEp::bind_backward).
struct BackwardIo {
    const uint16_t* grad_out = nullptr;  // [S, H] bf16 gradient of the combine output (combine_backward input)
    uint16_t* grad_x = nullptr;          // [S, H] bf16 gradient of the dispatch input (dispatch_backward output)
    float* grad_topk_w = nullptr;        // [S, K] fp32 gathered route-weight gradient; nullptr: not gathered
    const float* grad_recv_w = nullptr;  // [NvS] fp32 gradient of each receive row's weight, copied into recv_w(r)
                                         // by dispatch_backward; nullptr: the caller wrote it into recv_w(r)
};

class DeviceEp {
  public:
    // Allocates every rank's buffer (sized by EpLayout, independent of the routing). Throws evenep::Error on a
    // bad configuration (Config::validate, H % 8 != 0, index overflow of the return addresses) or a CUDA error.
    DeviceEp(const Config& cfg, int hidden, const EpOptions& options = {});
    ~DeviceEp();
    DeviceEp(const DeviceEp&) = delete;
    DeviceEp& operator=(const DeviceEp&) = delete;

    const Config& config() const { return cfg_; }
    int hidden() const { return hidden_; }
    const EpOptions& options() const { return options_; }
    const EpLayout& layout() const { return layout_; }
    LocalTeam& team() { return *team_; }
    const LocalTeam& team() const { return *team_; }
    void set_sm_budget(int sm_budget);

    // Binds the caller's per-rank device pointers ([R] entries; synchronous, not part of the hot path).
    void bind(std::span<const RankIo> io);
    // Plans from every rank's topk_idx. s: [R] tokens per rank (1..S); when they differ, s_total must be their
    // sum (SPEC §1). Checked on the host (throws, nothing launched); bad expert ids are found on the device and
    // reported by check() as Error(kInvalidArgument) naming rank, token, k and value.
    void plan(std::span<const int32_t> s, cudaStream_t stream, int64_t s_total = -1);
    // Plans from given histograms (tpe: [R*E], host), skipping the histogram and all-gather: for tests and the
    // planner benchmark. Uploads tpe synchronously, then launches one block per rank of [rank_begin, +num).
    void plan_from_tpe(std::span<const int32_t> tpe,
                       std::span<const int32_t> s,
                       cudaStream_t stream,
                       int rank_begin = 0,
                       int num_ranks = -1);
    void dispatch(cudaStream_t stream);
    void combine(bool apply_weights, CombineMode mode, cudaStream_t stream);

    // Binds the backward pointers ([R] entries; synchronous, after bind(); bind() again keeps them). The route
    // weights and expert ids stay those of bind().
    void bind_backward(std::span<const BackwardIo> io);
    // combine_backward(grad_out) = dispatch(grad_out) with the last plan (no planning): every rank's grad_out rows
    // into recv_x of their destinations, recv_w = topk_w (the bound route weights: unchanged since the dispatch),
    // padding zeroed, duplicates filled: cpu::Buffer::combine_backward.
    void combine_backward(cudaStream_t stream);
    // dispatch_backward(grad_recv) = combine(recv_x(r) as the gradient rows, apply_weights = false, mode) into
    // grad_x, plus grad_topk_w[t*K + k] = the row weight gradient of entry (t, k) (0 for masked entries): first
    // copies grad_recv_w (when bound) over recv_w(r) [all NvS rows; the CPU backend copies rows [0, rows_used),
    // the rest is never read], then one combine launch: cpu::Buffer::dispatch_backward bit for bit.
    void dispatch_backward(CombineMode mode, cudaStream_t stream);

    // Synchronises `stream` and throws evenep::Error for anything the device recorded (see LocalTeam::check).
    void check(cudaStream_t stream) const { team_->check(stream); }

    std::span<const int32_t> s() const { return s_; }
    // Blocks per rank the last launch of each kind used.
    int last_blocks_per_rank() const { return last_blocks_; }

    // Device views of rank `rank`'s buffer.
    uint16_t* recv_x(int rank) const;           // [NvS, H] bf16
    float* recv_w(int rank) const;              // [NvS]
    const int32_t* cu_seqlens(int rank) const;  // [G] inclusive padded ends of the rank's groups (its plan copy)
    const int32_t* copies(int rank) const;      // [R*B] the plan's copies table (rank's copy)
    char* base(int rank) const { return team_->base(rank); }

    // Host read-back (synchronous; tests and checks). The plan as rank `rank` computed it.
    Plan download_plan(int rank) const;
    std::vector<int32_t> download_dst(int rank) const;                    // [s_r*K]
    std::vector<uint16_t> download_recv_x(int rank, int64_t rows) const;  // [rows*H]
    std::vector<float> download_recv_w(int rank, int64_t rows) const;
    std::vector<int32_t> download_recv_next(int rank, int64_t rows) const;
    std::vector<int32_t> download_recv_ret(int rank, int64_t rows) const;

  private:
    template <typename T>
    std::vector<T> download(int rank, size_t offset, size_t count) const;

    Config cfg_;
    int hidden_;
    EpOptions options_;
    EpLayout layout_;
    std::unique_ptr<LocalTeam> team_;
    RankIo* d_io_ = nullptr;  // [R]
    bool bound_ = false;
    std::vector<RankIo> io_;       // [R] host copy of the bound forward pointers
    std::vector<BackwardIo> bwd_;  // [R] bound backward pointers (empty: none)
    RankIo* d_bwd_io_ = nullptr;   // [R] the kernels' view of the backward: x = grad_out, out = grad_x, ...
    void upload_backward_io();
    std::vector<int32_t> s_;
    bool planned_ = false;
    int last_blocks_ = 0;
};

}  // namespace evenep::cuda
