// LocalTeam: R virtual ranks on one GPU (include/evenep/cuda/team.hpp).
#include "evenep/cuda/team.hpp"

#include <cstring>
#include <sstream>

#include "evenep/cuda/check.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

const char* to_string(Phase phase) {
    switch (phase) {
        case Phase::kNone:
            return "none";
        case Phase::kPlanHistogram:
            return "plan/histogram";
        case Phase::kPlanGather:
            return "plan/gather";
        case Phase::kPlanReady:
            return "plan/ready";
        case Phase::kDispatchSent:
            return "dispatch/sent";
        case Phase::kCombineReady:
            return "combine/ready";
        case Phase::kCombinePartial:
            return "combine/partial";
        case Phase::kPrefetchDone:
            return "prefetch/done";
        case Phase::kReduceReady:
            return "reduce/ready";
        case Phase::kReduceDone:
            return "reduce/done";
        case Phase::kTest:
            return "test";
        case Phase::kEntry:
            return "entry";
    }
    return "unknown";
}

namespace {

// Layout of the barrier state allocation (uint32 words).
struct SyncLayout {
    size_t flags, arrive, gen, abort, claim, words;
    explicit SyncLayout(int R) {
        flags = 0;
        arrive = flags + static_cast<size_t>(R) * R;
        gen = arrive + R;
        abort = gen + R;
        claim = abort + 1;
        words = claim + 1;
    }
};

}  // namespace

LocalTeam::LocalTeam(int num_ranks, size_t bytes_per_rank, const TeamOptions& options)
    : num_ranks_(num_ranks), bytes_per_rank_(bytes_per_rank), options_(options) {
    EVENEP_CHECK(num_ranks >= 1 && num_ranks <= kMaxVirtualRanks, "team: num_ranks = ", num_ranks, " outside [1, ",
                 kMaxVirtualRanks, "]");
    EVENEP_CHECK(options.timeout_ms > 0, "team: timeout_ms = ", options.timeout_ms, " must be positive");
    EVENEP_CUDA_CHECK(cudaSetDevice(options.device));
    bytes_per_rank_ = (bytes_per_rank + 255) / 256 * 256;
    if (bytes_per_rank_ == 0) bytes_per_rank_ = 256;
    bases_ = new char*[num_ranks]();
    try {
        for (int r = 0; r < num_ranks; ++r) {
            void* p = nullptr;
            EVENEP_CUDA_CHECK(cudaMalloc(&p, bytes_per_rank_));
            bases_[r] = static_cast<char*>(p);
            EVENEP_CUDA_CHECK(cudaMemset(p, 0, bytes_per_rank_));
        }
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_peers_), sizeof(char*) * num_ranks));
        EVENEP_CUDA_CHECK(cudaMemcpy(d_peers_, bases_, sizeof(char*) * num_ranks, cudaMemcpyHostToDevice));
        const SyncLayout sl(num_ranks);
        sync_bytes_ = sl.words * sizeof(uint32_t);
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_sync_), sync_bytes_));
        EVENEP_CUDA_CHECK(cudaMemset(d_sync_, 0, sync_bytes_));
        EVENEP_CUDA_CHECK(
            cudaHostAlloc(reinterpret_cast<void**>(&h_record_), sizeof(DeviceErrorRecord), cudaHostAllocMapped));
        std::memset(static_cast<void*>(h_record_), 0, sizeof(DeviceErrorRecord));
        DeviceErrorRecord* d_record = nullptr;
        EVENEP_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_record), h_record_, 0));

        view_.num_ranks = num_ranks;
        view_.peers = d_peers_;
        view_.flags = d_sync_ + sl.flags;
        view_.local_arrive = d_sync_ + sl.arrive;
        view_.local_gen = d_sync_ + sl.gen;
        view_.abort = d_sync_ + sl.abort;
        view_.error_claim = reinterpret_cast<int32_t*>(d_sync_ + sl.claim);
        view_.record = d_record;
        view_.fault_rank = -1;
        view_.fault_phase = 0;
        view_.rank_begin = 0;
        view_.launch_ranks = num_ranks;
        view_.system_scope = 0;
        view_.inbox = nullptr;
        set_timeout_ms(options.timeout_ms);
        set_timeout_action(options.on_timeout);
    } catch (...) {
        for (int r = 0; r < num_ranks; ++r)
            if (bases_[r]) cudaFree(bases_[r]);
        delete[] bases_;
        if (d_peers_) cudaFree(d_peers_);
        if (d_sync_) cudaFree(d_sync_);
        if (h_record_) cudaFreeHost(h_record_);
        throw;
    }
}

LocalTeam::~LocalTeam() {
    // NOTE: destructors never throw; errors here (e.g. a context lost to a trap) are ignored.
    for (int r = 0; r < num_ranks_; ++r)
        if (bases_[r]) cudaFree(bases_[r]);
    delete[] bases_;
    cudaFree(d_peers_);
    cudaFree(d_sync_);
    cudaFreeHost(h_record_);
}

char* LocalTeam::base(int rank) const {
    EVENEP_CHECK(rank >= 0 && rank < num_ranks_, "team: rank ", rank, " outside [0, ", num_ranks_, ")");
    return bases_[rank];
}

void LocalTeam::set_timeout_ms(double ms) {
    EVENEP_CHECK(ms > 0, "team: timeout_ms = ", ms, " must be positive");
    options_.timeout_ms = ms;
    view_.timeout_ns = static_cast<uint64_t>(ms * 1e6);
}

void LocalTeam::set_timeout_action(TimeoutAction action) {
    options_.on_timeout = action;
    view_.trap_on_timeout = action == TimeoutAction::kTrap ? 1 : 0;
}

void LocalTeam::inject_fault(int rank, Phase phase) {
    EVENEP_CHECK(rank >= -1 && rank < num_ranks_, "team: fault rank ", rank, " outside [-1, ", num_ranks_, ")");
    view_.fault_rank = rank;
    view_.fault_phase = static_cast<int32_t>(phase);
}

std::string LocalTeam::pending_error() const {
    const volatile DeviceErrorRecord* rec = h_record_;
    if (rec->set == 0) return "";
    std::ostringstream os;
    const auto kind = static_cast<DeviceErrorKind>(rec->kind);
    const char* phase = to_string(static_cast<Phase>(rec->phase));
    switch (kind) {
        case DeviceErrorKind::kBarrierTimeout:
            if (rec->peer >= 0)
                os << "barrier timeout: rank " << rec->rank << " waited " << rec->waited_ms << " ms at phase '" << phase
                   << "' for peer rank " << rec->peer << ", which never arrived (missing rank " << rec->peer << ")";
            else
                os << "barrier timeout: rank " << rec->rank << " waited " << rec->waited_ms << " ms at phase '" << phase
                   << "' for its own blocks (rank-local barrier)";
            break;
        case DeviceErrorKind::kBadExpertId:
            os << "routing: rank " << rec->rank << ", token " << rec->token << ", k " << rec->k << ": expert id "
               << rec->value << " outside [0, E = " << rec->aux << ") (use -1 to mask)";
            break;
        case DeviceErrorKind::kInternal:
            os << "internal: rank " << rec->rank << " at phase '" << phase << "': value " << rec->value
               << " breaks a planner invariant (bound " << rec->aux << ")";
            break;
        default:
            os << "device error record with unknown kind " << rec->kind;
            break;
    }
    return os.str();
}

void LocalTeam::reset_sync_state() const {
    EVENEP_CUDA_CHECK(cudaMemset(d_sync_, 0, sync_bytes_));
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    std::memset(static_cast<void*>(h_record_), 0, sizeof(DeviceErrorRecord));
}

void LocalTeam::check(cudaStream_t stream) const {
    const cudaError_t sync_err = cudaStreamSynchronize(stream);
    const std::string msg = pending_error();
    const auto kind = static_cast<DeviceErrorKind>(static_cast<const volatile DeviceErrorRecord*>(h_record_)->kind);
    if (!msg.empty()) {
        if (sync_err == cudaSuccess) reset_sync_state();  // after a trap the context is gone: nothing to reset
        const ErrorKind ek = kind == DeviceErrorKind::kBarrierTimeout ? ErrorKind::kTimeout
                             : kind == DeviceErrorKind::kBadExpertId  ? ErrorKind::kInvalidArgument
                                                                      : ErrorKind::kInternal;
        if (sync_err != cudaSuccess) throw Error(ek, msg + " (device trapped: " + cudaGetErrorName(sync_err) + ")");
        throw Error(ek, msg);
    }
    EVENEP_CUDA_CHECK(sync_err);
}

}  // namespace evenep::cuda
