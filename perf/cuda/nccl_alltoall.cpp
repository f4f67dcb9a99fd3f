// NcclAllToAll: the conventional EP all-to-all over NCCL, the benchmark's baseline (perf/cuda/nccl_alltoall.hpp).
#include "perf/cuda/nccl_alltoall.hpp"

#include "evenep/cuda/check.hpp"
#include "evenep/error.hpp"

#if defined(EVENEP_HAVE_NCCL)
#include <nccl.h>

#include "cuda/runtime/nccl_internal.hpp"
#endif

namespace evenep::perf {

#if defined(EVENEP_HAVE_NCCL)

NcclAllToAll::NcclAllToAll(cuda::NcclTeam& team, const Config& cfg, int hidden)
    : team_(team), cfg_(cfg), hidden_(hidden) {
    cfg_.validate();
    EVENEP_CHECK(cfg_.R == team.size(), "all-to-all: R = ", cfg_.R, " but the team has ", team.size(), " ranks");
    EVENEP_CHECK(hidden > 0 && hidden % 8 == 0, "all-to-all: hidden size H = ", hidden, " must be a multiple of 8");
    const size_t rows = static_cast<size_t>(cfg_.S) * cfg_.K, R = static_cast<size_t>(cfg_.R);
    using ::evenep::cuda::DeviceArray, ::evenep::cuda::DeviceFill;
    send_x_ = DeviceArray<uint16_t>(rows * hidden, DeviceFill::kNone);
    recv_x_ = DeviceArray<uint16_t>(R * rows * hidden, DeviceFill::kNone);
    d_counts_ = DeviceArray<int32_t>(2 * R, DeviceFill::kNone);
    d_pos_ = DeviceArray<int32_t>(rows, DeviceFill::kNone);
    EVENEP_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&h_counts_), 2 * R * sizeof(int32_t), 0));
    h_send_.assign(R, 0);
    h_recv_.assign(R, 0);
}

NcclAllToAll::~NcclAllToAll() { cudaFreeHost(h_counts_); }

void NcclAllToAll::dispatch(const cuda::RankIo& io, int s, cudaStream_t stream) {
    EVENEP_CHECK(s >= 1 && s <= cfg_.S, "all-to-all: s = ", s, " outside [1, S = ", cfg_.S, "]");
    const int R = cfg_.R, K = cfg_.K;
    const int64_t n = static_cast<int64_t>(s) * K;
    auto comm = static_cast<ncclComm_t>(team_.nccl_comm());
    a2a::launch_a2a_count(io.topk_idx, n, cfg_.epn(), R, d_pos_.get(), d_counts_.get(), stream);
    a2a::launch_a2a_permute(io.x, d_pos_.get(), n, K, hidden_, send_x_.get(), stream);
    // Counts first: every rank learns how many rows it receives from each peer (the host sizes the messages).
    EVENEP_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < R; ++p) {
        EVENEP_NCCL_CHECK(ncclSend(d_counts_.get() + p, 1, ncclInt32, p, comm, stream));
        EVENEP_NCCL_CHECK(ncclRecv(d_counts_.get() + R + p, 1, ncclInt32, p, comm, stream));
    }
    EVENEP_NCCL_CHECK(ncclGroupEnd());
    EVENEP_CUDA_CHECK(
        cudaMemcpyAsync(h_counts_, d_counts_.get(), 2 * R * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int p = 0; p < R; ++p) h_send_[p] = h_counts_[p], h_recv_[p] = h_counts_[R + p];
    const size_t H = static_cast<size_t>(hidden_);
    size_t soff = 0, roff = 0;
    EVENEP_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < R; ++p) {
        if (h_send_[p] > 0)
            EVENEP_NCCL_CHECK(ncclSend(send_x_.get() + soff * H, h_send_[p] * H, ncclBfloat16, p, comm, stream));
        if (h_recv_[p] > 0)
            EVENEP_NCCL_CHECK(ncclRecv(recv_x_.get() + roff * H, h_recv_[p] * H, ncclBfloat16, p, comm, stream));
        soff += h_send_[p];
        roff += h_recv_[p];
    }
    EVENEP_NCCL_CHECK(ncclGroupEnd());
    last_s_ = s;
}

void NcclAllToAll::combine(const cuda::RankIo& io, int s, bool apply_weights, cudaStream_t stream) {
    EVENEP_CHECK(s == last_s_, "all-to-all: combine with s = ", s, " after a dispatch of s = ", last_s_);
    const int R = cfg_.R;
    auto comm = static_cast<ncclComm_t>(team_.nccl_comm());
    const size_t H = static_cast<size_t>(hidden_);
    size_t soff = 0, roff = 0;
    EVENEP_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < R; ++p) {
        if (h_recv_[p] > 0)
            EVENEP_NCCL_CHECK(ncclSend(recv_x_.get() + roff * H, h_recv_[p] * H, ncclBfloat16, p, comm, stream));
        if (h_send_[p] > 0)
            EVENEP_NCCL_CHECK(ncclRecv(send_x_.get() + soff * H, h_send_[p] * H, ncclBfloat16, p, comm, stream));
        soff += h_send_[p];
        roff += h_recv_[p];
    }
    EVENEP_NCCL_CHECK(ncclGroupEnd());
    a2a::launch_a2a_unpermute(send_x_.get(), d_pos_.get(), io.topk_w, s, cfg_.K, hidden_, apply_weights, io.out,
                              stream);
}

int64_t NcclAllToAll::rows_sent() const {
    int64_t n = 0;
    for (int32_t c : h_send_) n += c;
    return n;
}
int64_t NcclAllToAll::rows_received() const {
    int64_t n = 0;
    for (int32_t c : h_recv_) n += c;
    return n;
}
int64_t NcclAllToAll::rows_sent_remote() const { return rows_sent() - h_send_[team_.rank()]; }

#else  // !EVENEP_HAVE_NCCL

NcclAllToAll::NcclAllToAll(cuda::NcclTeam& team, const Config& cfg, int hidden)
    : team_(team), cfg_(cfg), hidden_(hidden) {
    throw Error(ErrorKind::kRuntime, "all-to-all baseline: this build has no NCCL team (EVENEP_NCCL=OFF)");
}
NcclAllToAll::~NcclAllToAll() = default;
void NcclAllToAll::dispatch(const cuda::RankIo&, int, cudaStream_t) {}
void NcclAllToAll::combine(const cuda::RankIo&, int, bool, cudaStream_t) {}
int64_t NcclAllToAll::rows_sent() const { return 0; }
int64_t NcclAllToAll::rows_received() const { return 0; }
int64_t NcclAllToAll::rows_sent_remote() const { return 0; }

#endif  // EVENEP_HAVE_NCCL

}  // namespace evenep::perf
