// LocalTeam: R virtual ranks on one GPU (include/evenep/cuda/team.hpp).
#include "evenep/cuda/team.hpp"

#include <cstring>
#include <sstream>

#include "cuda/runtime/team_record.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/detail/bf16.hpp"
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

std::string format_device_error(const DeviceErrorRecord& rec, const char* note) {
    std::ostringstream os;
    const auto kind = static_cast<DeviceErrorKind>(rec.kind);
    const char* phase = to_string(static_cast<Phase>(rec.phase));
    switch (kind) {
        case DeviceErrorKind::kBarrierTimeout:
            if (rec.peer >= 0)
                os << "barrier timeout: rank " << rec.rank << " waited " << rec.waited_ms << " ms at phase '" << phase
                   << "' for peer rank " << rec.peer << ", which never arrived (missing rank " << rec.peer << note
                   << ")";
            else
                os << "barrier timeout: rank " << rec.rank << " waited " << rec.waited_ms << " ms at phase '" << phase
                   << "' for its own blocks (rank-local barrier)";
            break;
        case DeviceErrorKind::kBadExpertId:
            os << "routing: rank " << rec.rank << ", token " << rec.token << ", k " << rec.k << ": expert id "
               << rec.value << " outside [0, E = " << rec.aux << ") (use -1 to mask)";
            break;
        case DeviceErrorKind::kNonFiniteInput:
            os << "dispatch: rank " << rec.rank << ": x[" << rec.token << ", " << rec.k
               << "] = " << bf16_to_float(Bf16{static_cast<uint16_t>(rec.value)}) << " (token " << rec.token
               << ", channel " << rec.k
               << ") is not finite; the FP8 dispatch quantises each 128-channel block by its amax";
            break;
        case DeviceErrorKind::kBadFp8Input:
            os << "dispatch: rank " << rec.rank << ": ";
            if (rec.aux == 0) {
                os << "x_fp8[" << rec.token << ", " << rec.k << "] is NaN (e4m3 code " << (rec.value & 0xFF) << ")";
            } else {
                const float v = bits_as_float(static_cast<uint32_t>(rec.value));
                os << "scales[" << rec.token << ", " << rec.k << "] = " << v << " is not "
                   << (rec.aux == 2 ? "a power of two (the buffer has ue8m0 scales)" : "positive and finite");
            }
            os << " (rows quantised by the caller are moved as given)";
            break;
        case DeviceErrorKind::kInternal:
            os << "internal: rank " << rec.rank << " at phase '" << phase << "': value " << rec.value
               << " breaks a planner invariant (bound " << rec.aux << ")";
            break;
        default:
            os << "device error record with unknown kind " << rec.kind;
            break;
    }
    return os.str();
}

char* Team::peer_base(const Window& window, int peer) const {
    EVENEP_CHECK(peer >= 0 && peer < static_cast<int>(window.peers.size()), "team: peer ", peer, " outside [0, ",
                 window.peers.size(), ")");
    return window.peers[peer];
}

namespace detail_team {

std::string read_record(const DeviceErrorRecord* h_record, const char* note) {
    const volatile DeviceErrorRecord* v = h_record;
    if (v->set == 0) return "";
    DeviceErrorRecord rec{};
    rec.kind = v->kind, rec.rank = v->rank, rec.peer = v->peer, rec.phase = v->phase, rec.token = v->token;
    rec.k = v->k, rec.value = v->value, rec.aux = v->aux, rec.waited_ms = v->waited_ms;
    return format_device_error(rec, note);
}

bool throw_recorded(const DeviceErrorRecord* h_record, cudaError_t sync_err, const char* note) {
    const std::string msg = read_record(h_record, note);
    if (!msg.empty()) {
        const auto kind = static_cast<DeviceErrorKind>(static_cast<const volatile DeviceErrorRecord*>(h_record)->kind);
        const ErrorKind ek = kind == DeviceErrorKind::kBarrierTimeout ? ErrorKind::kTimeout
                             : kind == DeviceErrorKind::kBadExpertId || kind == DeviceErrorKind::kNonFiniteInput ||
                                     kind == DeviceErrorKind::kBadFp8Input
                                 ? ErrorKind::kInvalidArgument
                                 : ErrorKind::kInternal;
        if (sync_err != cudaSuccess) throw Error(ek, msg + " (device trapped: " + cudaGetErrorName(sync_err) + ")");
        throw Error(ek, msg);
    }
    EVENEP_CUDA_CHECK(sync_err);
    return false;
}

}  // namespace detail_team

namespace {

// Layout of the barrier state allocation (uint32 words): per channel flags [R*R], arrive [R], gen [R]; then the
// abort flag and the error claim shared by all channels.
struct SyncLayout {
    size_t channel_words, abort, claim, words;
    explicit SyncLayout(int R) {
        channel_words = static_cast<size_t>(R) * R + 2 * static_cast<size_t>(R);
        abort = channel_words * kTeamChannels;
        claim = abort + 1;
        words = claim + 1;
    }
};

}  // namespace

struct LocalTeam::Copies {
    Window view;                           // what the team hands out; points into the arrays below
    std::vector<DeviceArray<char>> ranks;  // [R] each rank's copy
    DeviceArray<char*> d_peers;            // [R] device table of the copies
};

LocalTeam::LocalTeam(int num_ranks, size_t bytes_per_rank, const TeamOptions& options)
    : num_ranks_(num_ranks), options_(options) {
    EVENEP_CHECK(num_ranks >= 1 && num_ranks <= kMaxVirtualRanks, "team: num_ranks = ", num_ranks, " outside [1, ",
                 kMaxVirtualRanks, "]");
    EVENEP_CHECK(options.timeout_ms > 0, "team: timeout_ms = ", options.timeout_ms, " must be positive");
    EVENEP_CUDA_CHECK(cudaSetDevice(options.device));
    try {
        main_ = &alloc_window(bytes_per_rank);
        const SyncLayout sl(num_ranks);
        sync_bytes_ = sl.words * sizeof(uint32_t);
        d_sync_ = DeviceArray<uint32_t>(sl.words);
        EVENEP_CUDA_CHECK(
            cudaHostAlloc(reinterpret_cast<void**>(&h_record_), sizeof(DeviceErrorRecord), cudaHostAllocMapped));
        std::memset(static_cast<void*>(h_record_), 0, sizeof(DeviceErrorRecord));
        DeviceErrorRecord* d_record = nullptr;
        EVENEP_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_record), h_record_, 0));
        for (int c = 0; c < kTeamChannels; ++c) {
            TeamView& v = views_[c];
            uint32_t* ch = d_sync_.get() + c * sl.channel_words;
            v.num_ranks = num_ranks;
            v.peers = main_->d_peers;
            v.flags = ch;
            v.local_arrive = ch + static_cast<size_t>(num_ranks) * num_ranks;
            v.local_gen = v.local_arrive + num_ranks;
            v.abort = d_sync_.get() + sl.abort;
            v.error_claim = reinterpret_cast<int32_t*>(d_sync_.get() + sl.claim);
            v.record = d_record;
            v.fault_rank = -1;
            v.fault_phase = 0;
            v.rank_begin = 0;
            v.launch_ranks = num_ranks;
            v.system_scope = 0;
            v.inbox = nullptr;
        }
        set_timeout_ms(options.timeout_ms);
        set_timeout_action(options.on_timeout);
    } catch (...) {
        release();
        throw;
    }
}

OwnedWindow& OwnedWindow::operator=(OwnedWindow&& other) noexcept {
    if (this != &other) {
        release_noexcept();
        team_ = other.team_;
        window_ = other.window_;
        other.window_ = nullptr;
    }
    return *this;
}

void OwnedWindow::reset() {
    if (window_ == nullptr) return;
    const Window* w = window_;
    window_ = nullptr;
    team_->free_window(*w);
}

void OwnedWindow::release_noexcept() noexcept {
    try {
        reset();
    } catch (...) {
        // NOTE: a destructor never throws; the window stays with the team, which frees it at its destruction.
    }
}

void LocalTeam::release() noexcept {
    // NOTE: never throws; errors freeing (e.g. a context lost to a trap) are ignored.
    windows_.release_all([](Copies& w) { w = Copies{}; });
    d_sync_ = DeviceArray<uint32_t>();
    if (h_record_) cudaFreeHost(h_record_);
    h_record_ = nullptr;
}

LocalTeam::~LocalTeam() { release(); }

const Window& LocalTeam::alloc_window(size_t bytes) {
    Copies& c = windows_.add(std::make_unique<Copies>());  // owned from here on: release() frees what was allocated
    Window& ref = c.view;
    ref.bytes = detail::align_up(bytes, 256);
    if (ref.bytes == 0) ref.bytes = 256;
    ref.peers.assign(num_ranks_, nullptr);
    c.ranks.reserve(num_ranks_);
    for (int r = 0; r < num_ranks_; ++r) {
        c.ranks.emplace_back(ref.bytes);  // zeroed
        ref.peers[r] = c.ranks.back().get();
    }
    c.d_peers = DeviceArray<char*>(static_cast<size_t>(num_ranks_), DeviceFill::kNone);
    c.d_peers.upload(ref.peers.data(), ref.peers.size());
    ref.d_peers = c.d_peers.get();
    ref.local = ref.peers[0];
    return ref;
}

void LocalTeam::free_window(const Window& window) {
    std::unique_ptr<Copies> w = windows_.take(
        &window, [](const Copies& e) { return &e.view; }, "team");
    // Every kernel that may still use a copy has ended before the memory goes (cudaFree alone may not wait for
    // work on other streams of a non-blocking kind).
    const cudaError_t sync = cudaDeviceSynchronize();
    w.reset();
    EVENEP_CUDA_CHECK(sync);
}

size_t LocalTeam::num_windows() const { return windows_.empty() ? 0 : windows_.size() - 1; }

char* LocalTeam::base(int rank) const {
    EVENEP_CHECK(rank >= 0 && rank < num_ranks_, "team: rank ", rank, " outside [0, ", num_ranks_, ")");
    return main_->peers[rank];
}

const TeamView& LocalTeam::view(int channel) const {
    EVENEP_CHECK(channel >= 0 && channel < kTeamChannels, "team: channel ", channel, " outside [0, ", kTeamChannels,
                 ")");
    return views_[channel];
}

void LocalTeam::set_timeout_ms(double ms) {
    EVENEP_CHECK(ms > 0, "team: timeout_ms = ", ms, " must be positive");
    options_.timeout_ms = ms;
    for (TeamView& v : views_) v.timeout_ns = static_cast<uint64_t>(ms * 1e6);
}

void LocalTeam::set_timeout_action(TimeoutAction action) {
    options_.on_timeout = action;
    for (TeamView& v : views_) v.trap_on_timeout = action == TimeoutAction::kTrap ? 1 : 0;
}

void LocalTeam::inject_fault(int rank, Phase phase) {
    EVENEP_CHECK(rank >= -1 && rank < num_ranks_, "team: fault rank ", rank, " outside [-1, ", num_ranks_, ")");
    for (TeamView& v : views_) {
        v.fault_rank = rank;
        v.fault_phase = static_cast<int32_t>(phase);
    }
}

std::string LocalTeam::pending_error() const { return detail_team::read_record(h_record_, ""); }

void LocalTeam::recover() {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EVENEP_CUDA_CHECK(cudaMemset(d_sync_.get(), 0, sync_bytes_));
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    std::memset(static_cast<void*>(h_record_), 0, sizeof(DeviceErrorRecord));
}

void LocalTeam::check(cudaStream_t stream) const {
    detail_team::throw_recorded(h_record_, cudaStreamSynchronize(stream), "");
}

}  // namespace evenep::cuda
