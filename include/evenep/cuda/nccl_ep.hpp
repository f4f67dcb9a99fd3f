// evenep/cuda/nccl_ep.hpp — the CUDA data path of one rank of a multi-process EP group (one process per GPU,
// NCCL team: evenep/cuda/nccl_team.hpp), and the conventional NCCL all-to-all it is benchmarked against.
//
// NcclEp is DeviceEp (evenep/cuda/ep.hpp) for one rank: the same kernels, layout and results bit for bit (the plan
// arrays, encoded destinations, receive rows, combine output), launched with only this rank's blocks. Every rank of
// the group constructs its NcclEp with the same configuration and makes the same calls in the same order (plan,
// dispatch, combine, prefetch_weight and reduce_grad are collective). Asynchronous on the caller's stream, no host
// synchronisation and no allocation per call (graph capturable per rank).
//
//   NcclEp ep(cfg, H, nccl_bootstrap_from_env());
//   ep.bind(io);                        // this rank's x, topk_idx, topk_w, out, out_w
//   ep.plan(s, stream);                 // s: [R] tokens of every rank, the same array on every rank
//   ep.dispatch(stream);
//   ... expert compute writes y into ep.recv_x() in place ...
//   ep.combine(apply_weights, CombineMode::kPull, stream);
//   ep.check(stream);                   // synchronise and surface device-side errors (barrier timeouts name ranks)
// Backward (SPEC §4.3; DeviceEp's contract, collective): ep.bind_backward(bio); ep.combine_backward(stream);
// ... gradient rows into recv_x() ...; ep.dispatch_backward(mode, stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/layout.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/plan.hpp"

namespace evenep::cuda {

class NcclEp {
  public:
    // Collective. Checks the configuration like DeviceEp (throws evenep::Error naming the value), requires
    // cfg.R == boot.world_size, then creates the NCCL team with the rank's buffer (EpLayout) in its main window.
    NcclEp(const Config& cfg, int hidden, const NcclBootstrap& boot, const EpOptions& options = {});
    ~NcclEp();
    NcclEp(const NcclEp&) = delete;
    NcclEp& operator=(const NcclEp&) = delete;

    const Config& config() const { return cfg_; }
    int hidden() const { return hidden_; }
    int rank() const { return team_->rank(); }
    const EpOptions& options() const { return options_; }
    const EpLayout& layout() const { return layout_; }
    NcclTeam& team() { return *team_; }
    const NcclTeam& team() const { return *team_; }
    void set_sm_budget(int sm_budget);

    // This rank's device pointers (synchronous, not part of the hot path).
    void bind(const RankIo& io);
    // s: [R] tokens of every rank (1..S), identical on every rank; when they differ, s_total is their sum.
    void plan(std::span<const int32_t> s, cudaStream_t stream, int64_t s_total = -1);
    void dispatch(cudaStream_t stream);
    void combine(bool apply_weights, CombineMode mode, cudaStream_t stream);
    // The backward calls of DeviceEp (evenep/cuda/ep.hpp) for this rank: bind_backward after bind (synchronous);
    // combine_backward = dispatch of grad_out with the last plan; dispatch_backward = copy grad_recv_w (if set)
    // over recv_w(), then an unweighted combine of recv_x() into grad_x with the gathered weights in grad_topk_w.
    void bind_backward(const BackwardIo& io);
    void combine_backward(cudaStream_t stream);
    void dispatch_backward(CombineMode mode, cudaStream_t stream);
    // Synchronises `stream` and throws for anything the device recorded (NcclTeam::check; after a timeout every
    // rank calls team().recover() before the next call).
    void check(cudaStream_t stream) const { team_->check(stream); }

    std::span<const int32_t> s() const { return s_; }
    int last_blocks_per_rank() const { return last_blocks_; }

    // Device views of this rank's buffer.
    char* base() const { return team_->base(); }
    uint16_t* recv_x() const;           // [NvS, H] bf16
    float* recv_w() const;              // [NvS]
    const int32_t* cu_seqlens() const;  // [G] this rank's groups
    const int32_t* copies() const;      // [R*B]

    // Host read-back of this rank's state (synchronous; tests and checks). The plan as this rank computed it.
    Plan download_plan() const;
    std::vector<int32_t> download_dst() const;                  // [s_rank*K]
    std::vector<uint16_t> download_recv_x(int64_t rows) const;  // [rows*H]
    std::vector<float> download_recv_w(int64_t rows) const;
    std::vector<int32_t> download_recv_next(int64_t rows) const;
    std::vector<int32_t> download_recv_ret(int64_t rows) const;

  private:
    template <typename T>
    std::vector<T> download(size_t offset, size_t count) const;

    Config cfg_;
    int hidden_;
    EpOptions options_;
    EpLayout layout_;
    std::unique_ptr<NcclTeam> team_;
    RankIo* d_io_ = nullptr;  // [R]: only this rank's entry is set
    bool bound_ = false;
    RankIo io_;       // host copy of this rank's bound pointers
    BackwardIo bwd_;  // bound backward pointers
    bool bwd_bound_ = false;
    RankIo* d_bwd_io_ = nullptr;  // [R]: this rank's backward view (x = grad_out, out = grad_x, out_w = grad_topk_w)
    void upload_backward_io();
    std::vector<int32_t> s_;
    bool planned_ = false;
    int last_blocks_ = 0;
};

// Expert weights, prefetch slots and gradients of this rank in a symmetric window of the team (SPEC §4.4): the
// regions and the contract of DeviceExperts (evenep/cuda/experts.hpp). prefetch_weight: each rank pushes the tiles
// of its own experts into the holders' slots; reduce_grad: each home rank pulls its experts' slot gradients from
// the holders in ascending (rank, slot) order and zeroes them. Both collective, on the team's channel `channel`
// (default 1, so that prefetch_weight may run beside dispatch on another stream).
class NcclExperts {
  public:
    NcclExperts(NcclEp& ep, const ExpertsShape& shape);  // collective
    ~NcclExperts() = default;
    NcclExperts(const NcclExperts&) = delete;
    NcclExperts& operator=(const NcclExperts&) = delete;

    const ExpertsShape& shape() const { return shape_; }
    // This rank's [elems] matrices (device pointers).
    uint16_t* weight(int proj, int local_expert) const;
    uint16_t* slot(int proj, int slot) const;
    float* slot_grad(int proj, int slot) const;
    float* grad(int proj, int local_expert) const;

    void prefetch_weight(NcclEp& ep, cudaStream_t stream, int channel = 1);
    void reduce_grad(NcclEp& ep, cudaStream_t stream, int channel = 1);
    int last_blocks_per_rank() const { return last_blocks_; }
    const DeviceExperts::Offsets& offsets() const { return off_; }
    const NcclWindowView& window() const { return *window_; }  // every rank's regions (peers) and this rank's

  private:
    char* at(size_t region, int n, int proj, int index, size_t elem_bytes) const;

    ExpertsShape shape_;
    int R_, epn_, B_;
    DeviceExperts::Offsets off_{};
    const NcclWindowView* window_ = nullptr;
    int last_blocks_ = 0;
};

// The conventional EP all-to-all over NCCL (Megatron-style dispatcher), the benchmark's baseline (SPEC §7's
// anchor (b)). One row per routed (token, k) entry, no deduplication, no balancing: rank d receives every entry of
// its experts.
//   dispatch  counts per destination rank on the device -> exchanged first (ncclSend/ncclRecv of R ints) and
//             copied to the host, which needs them for the message sizes (one host synchronisation, as in
//             Megatron) -> tokens permuted into destination-rank order (stable: token, k ascending) -> one
//             ncclGroupStart / ncclSend + ncclRecv per peer / ncclGroupEnd. recv_x() holds the rows in (source
//             rank, token, k) order.
//   combine   the reverse exchange (expert outputs in recv_x(), in place), then out[t] = bf16(sum_k w_k * y_k) in
//             fp32, k ascending (masked entries skipped).
// Collective; the caller's stream; dispatch blocks the host once for the counts.
class NcclAllToAll {
  public:
    NcclAllToAll(NcclTeam& team, const Config& cfg, int hidden);
    ~NcclAllToAll();
    NcclAllToAll(const NcclAllToAll&) = delete;
    NcclAllToAll& operator=(const NcclAllToAll&) = delete;

    void dispatch(const RankIo& io, int s, cudaStream_t stream);
    void combine(const RankIo& io, int s, bool apply_weights, cudaStream_t stream);

    uint16_t* recv_x() const { return recv_x_; }  // [R*S*K, H] capacity
    int64_t rows_sent() const;                    // entries sent by the last dispatch (self included)
    int64_t rows_received() const;                // rows received by the last dispatch (self included)
    int64_t rows_sent_remote() const;             // sent to other ranks
    const std::vector<int32_t>& send_counts() const { return h_send_; }  // [R] of the last dispatch
    const std::vector<int32_t>& recv_counts() const { return h_recv_; }  // [R]

  private:
    NcclTeam& team_;
    Config cfg_;
    int hidden_;
    uint16_t* send_x_ = nullptr;   // [S*K, H]
    uint16_t* recv_x_ = nullptr;   // [R*S*K, H]
    int32_t* d_counts_ = nullptr;  // [2R]: send counts, receive counts
    int32_t* d_pos_ = nullptr;     // [S*K]: row of entry (t, k) in send_x (-1 masked)
    int32_t* h_counts_ = nullptr;  // pinned [2R]
    std::vector<int32_t> h_send_, h_recv_;
    int last_s_ = 0;
};

}  // namespace evenep::cuda
