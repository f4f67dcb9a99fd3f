// perf/cuda/nccl_alltoall.hpp — the conventional EP all-to-all over NCCL, the benchmark's baseline (SPEC §7's
// anchor (b); `evenep bench multi`, rows a2a_*). Part of evenep::perf, not of the library.
//
// Megatron-style dispatcher: one row per routed (token, k) entry, no deduplication, no balancing: rank d receives
// every entry of its experts.
//   dispatch  counts per destination rank on the device -> exchanged first (ncclSend/ncclRecv of R ints) and
//             copied to the host, which needs them for the message sizes (one host synchronisation, as in
//             Megatron) -> tokens permuted into destination-rank order (stable: token, k ascending) -> one
//             ncclGroupStart / ncclSend + ncclRecv per peer / ncclGroupEnd. recv_x() holds the rows in (source
//             rank, token, k) order.
//   combine   the reverse exchange (expert outputs in recv_x(), in place), then out[t] = bf16(sum_k w_k * y_k) in
//             fp32, k ascending (masked entries skipped).
// Collective; the caller's stream; dispatch blocks the host once for the counts.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/nccl_team.hpp"

namespace evenep::perf {

class NcclAllToAll {
  public:
    NcclAllToAll(cuda::NcclTeam& team, const Config& cfg, int hidden);
    ~NcclAllToAll();
    NcclAllToAll(const NcclAllToAll&) = delete;
    NcclAllToAll& operator=(const NcclAllToAll&) = delete;

    void dispatch(const cuda::RankIo& io, int s, cudaStream_t stream);
    void combine(const cuda::RankIo& io, int s, bool apply_weights, cudaStream_t stream);

    uint16_t* recv_x() const { return recv_x_.get(); }  // [R*S*K, H] capacity
    int64_t rows_sent() const;                    // entries sent by the last dispatch (self included)
    int64_t rows_received() const;                // rows received by the last dispatch (self included)
    int64_t rows_sent_remote() const;             // sent to other ranks
    const std::vector<int32_t>& send_counts() const { return h_send_; }  // [R] of the last dispatch
    const std::vector<int32_t>& recv_counts() const { return h_recv_; }  // [R]

  private:
    cuda::NcclTeam& team_;
    Config cfg_;
    int hidden_;
    cuda::DeviceArray<uint16_t> send_x_;   // [S*K, H]
    cuda::DeviceArray<uint16_t> recv_x_;   // [R*S*K, H]
    cuda::DeviceArray<int32_t> d_counts_;  // [2R]: send counts, receive counts
    cuda::DeviceArray<int32_t> d_pos_;     // [S*K]: row of entry (t, k) in send_x (-1 masked)
    int32_t* h_counts_ = nullptr;  // pinned [2R]
    std::vector<int32_t> h_send_, h_recv_;
    int last_s_ = 0;
};

// Kernels of the baseline (nccl_alltoall.cu). count: pos[i] = send row of entry i (-1 masked), rows grouped by
// destination rank (home of the expert) in entry order; counts[d] = entries for rank d ([R]). permute: send_x[pos[i]]
// = x[i / K]. unpermute: out[t] = bf16(sum_k (w_{t,k} *) y[pos[t*K + k]]), fp32, k ascending.
namespace a2a {
void launch_a2a_count(const int32_t* topk_idx,
                      int64_t num_entries,
                      int epn,
                      int num_ranks,
                      int32_t* pos,
                      int32_t* counts,
                      cudaStream_t stream);
void launch_a2a_permute(
    const uint16_t* x, const int32_t* pos, int64_t num_entries, int K, int H, uint16_t* send_x, cudaStream_t stream);
void launch_a2a_unpermute(const uint16_t* y,
                          const int32_t* pos,
                          const float* topk_w,
                          int s,
                          int K,
                          int H,
                          bool apply_weights,
                          uint16_t* out,
                          cudaStream_t stream);
}  // namespace a2a

}  // namespace evenep::perf
