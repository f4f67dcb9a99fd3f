// evenep/cuda/nccl_ep.hpp — one rank of a multi-process EP group (one process per GPU, NCCL team:
// evenep/cuda/nccl_team.hpp), and the conventional NCCL all-to-all it is benchmarked against.
//
// NcclEp is cuda::Ep (evenep/cuda/ep.hpp) over an NcclTeam it owns: the same kernels, layout and results bit for bit
// as on the local team, launched with only this rank's blocks; every per-rank span has one entry (this rank's).
// Every rank of the group constructs its NcclEp with the same configuration and makes the same calls in the same
// order (collective calls: see ep.hpp).
//
//   NcclEp ep(cfg, H, nccl_bootstrap_from_env());
//   EpPlan p = ep.plan({&io, 1}, s, stream);    // s: [R] tokens of every rank, the same array on every rank
//   ep.dispatch(p, {&io, 1}, stream);
//   ... expert compute writes y into ep.recv_x(ep.rank()) in place ...
//   ep.combine(p, {&io, 1}, apply_weights, CombineMode::kPull, stream);
//   ep.check(stream);                           // synchronise and surface device-side errors
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/cuda/types.hpp"

namespace evenep::cuda {

class NcclEp : public Ep {
  public:
    // Collective. Checks the configuration (throws evenep::Error naming the value), requires cfg.R ==
    // boot.world_size, then creates the NCCL team (options.team) and the rank's buffer in a window of it.
    NcclEp(const Config& cfg, int hidden, const NcclBootstrap& boot, const EpOptions& options = {});
    int rank() const { return owned_->rank(); }
    NcclTeam& team() { return *owned_; }
    const NcclTeam& team() const { return *owned_; }

  private:
    NcclEp(std::unique_ptr<NcclTeam> team, const Config& cfg, int hidden, const EpOptions& options);
    std::unique_ptr<NcclTeam> owned_;
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
