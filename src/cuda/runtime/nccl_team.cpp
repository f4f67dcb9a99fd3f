// NcclTeam: one rank per process and GPU over NCCL's device API (include/evenep/cuda/nccl_team.hpp).
//
// Main window layout (bytes, every rank the same):
//   [0, user_bytes)                         the caller's symmetric buffer (bytes_per_rank rounded up to 256)
//   [flags_off, flags_off + C*R*4)          barrier flags: channel c, source rank src at (c*R + src)*4 — the
//                                           arrivals of src not yet consumed by this rank (counting semaphores)
// Process-local state (cudaMalloc, never touched by peers): per channel arrive[R] and gen[R] of the rank-local
// barrier (only entry `rank` is used; the arrays keep the local team's indexing), then abort and the error claim.
#include "evenep/cuda/nccl_team.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "cuda/runtime/team_record.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/error.hpp"

#if defined(EVENEP_HAVE_NCCL)
#include <nccl.h>
#include <nccl_device.h>

#include "cuda/runtime/nccl_internal.hpp"
#endif

namespace evenep::cuda {
namespace {

const char* env_first(std::initializer_list<const char*> names, const char** which) {
    for (const char* n : names) {
        const char* v = std::getenv(n);
        if (v != nullptr && *v != '\0') {
            *which = n;
            return v;
        }
    }
    *which = nullptr;
    return nullptr;
}

int env_int(std::initializer_list<const char*> names, int fallback, int min_value) {
    const char* which = nullptr;
    const char* v = env_first(names, &which);
    if (v == nullptr) return fallback;
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    EVENEP_CHECK(errno == 0 && end != v && *end == '\0' && x >= min_value && x <= (1 << 20), "nccl bootstrap: ", which,
                 " = '", v, "' is not an integer >= ", min_value);
    return static_cast<int>(x);
}

bool is_hex_id(const std::string& s) {
    if (s.size() != 2 * static_cast<size_t>(kNcclUniqueIdBytes)) return false;
    for (char ch : s)
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))) return false;
    return true;
}

std::string read_id_file(const std::string& path) {
    std::ifstream in(path);
    std::string s;
    if (in) std::getline(in, s);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    return s;
}

}  // namespace

NcclBootstrap nccl_bootstrap_from_env(std::chrono::milliseconds id_wait) {
    NcclBootstrap b;
    b.rank = env_int({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, 0, 0);
    b.world_size = env_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1, 1);
    b.local_rank = env_int({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, b.rank, 0);
    EVENEP_CHECK(b.rank < b.world_size, "nccl bootstrap: rank ", b.rank, " outside [0, world size ", b.world_size, ")");
    if (const char* id = std::getenv("EVENEP_NCCL_ID"); id != nullptr && *id != '\0') {
        b.unique_id = id;
        EVENEP_CHECK(is_hex_id(b.unique_id), "nccl bootstrap: EVENEP_NCCL_ID must hold ", 2 * kNcclUniqueIdBytes,
                     " hex digits (it holds ", b.unique_id.size(), " characters)");
        return b;
    }
    const char* file = std::getenv("EVENEP_NCCL_ID_FILE");
    if (file == nullptr || *file == '\0') {
        EVENEP_CHECK(b.world_size == 1, "nccl bootstrap: rank ", b.rank, " of ", b.world_size,
                     " has no NCCL unique id: set EVENEP_NCCL_ID (hex) or EVENEP_NCCL_ID_FILE (a fresh path that "
                     "rank 0 writes), or start the ranks with `evenep launch -n N -- ...`");
        b.unique_id = nccl_new_unique_id();
        return b;
    }
    const std::string path = file;
    if (b.rank == 0) {
        b.unique_id = nccl_new_unique_id();
        const std::string tmp = path + ".tmp." + std::to_string(::getpid());
        {
            std::ofstream out(tmp, std::ios::trunc);
            EVENEP_CHECK(static_cast<bool>(out), "nccl bootstrap: cannot write EVENEP_NCCL_ID_FILE '", tmp, "'");
            out << b.unique_id << "\n";
        }
        EVENEP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "nccl bootstrap: cannot rename '", tmp, "' to '",
                     path, "': ", std::strerror(errno));
        return b;
    }
    const auto deadline = std::chrono::steady_clock::now() + id_wait;
    for (;;) {
        std::string s = read_id_file(path);
        if (is_hex_id(s)) {
            b.unique_id = std::move(s);
            return b;
        }
        EVENEP_CHECK_KIND(ErrorKind::kTimeout, std::chrono::steady_clock::now() < deadline, "nccl bootstrap: rank ",
                          b.rank, " waited ", id_wait.count(),
                          " ms for rank 0 to write the NCCL unique id into "
                          "EVENEP_NCCL_ID_FILE '",
                          path, "'");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

#if defined(EVENEP_HAVE_NCCL)

namespace {

std::string to_hex(const ncclUniqueId& id) {
    static const char* kDigits = "0123456789abcdef";
    std::string s(2 * kNcclUniqueIdBytes, '0');
    for (int i = 0; i < kNcclUniqueIdBytes; ++i) {
        const auto byte = static_cast<unsigned char>(id.internal[i]);
        s[2 * i] = kDigits[byte >> 4];
        s[2 * i + 1] = kDigits[byte & 15];
    }
    return s;
}

ncclUniqueId from_hex(const std::string& s) {
    EVENEP_CHECK(is_hex_id(s), "nccl team: the unique id must be ", 2 * kNcclUniqueIdBytes, " hex digits");
    auto nibble = [](char ch) { return ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10; };
    ncclUniqueId id;
    for (int i = 0; i < kNcclUniqueIdBytes; ++i)
        id.internal[i] = static_cast<char>((nibble(s[2 * i]) << 4) | nibble(s[2 * i + 1]));
    return id;
}

std::string version_string(int v) {
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// NVLink multicast stays off (SPEC §3; the device machines require it): NCCL reads the variable at its first init.
void disable_multicast_if_unset() { ::setenv("NCCL_NVLS_ENABLE", "0", 0); }

constexpr size_t kWindowAlign = NCCL_WIN_REQUIRED_ALIGNMENT;

// The group's root communicator, one per (unique id, rank) and process: an NCCL unique id bootstraps exactly one
// communicator, so every team of the process is split from it (ncclCommSplit, collective over the group in
// construction order). Created by the first team, kept until the process exits (NOTE: deliberately never
// destroyed: teardown at static-destruction time would race the CUDA runtime's own).
ncclComm_t root_comm(const NcclBootstrap& boot) {
    static std::mutex mutex;
    static std::map<std::string, ncclComm_t> roots;
    std::lock_guard<std::mutex> lock(mutex);
    const std::string key = boot.unique_id + "/" + std::to_string(boot.rank) + "/" + std::to_string(boot.world_size);
    auto it = roots.find(key);
    if (it != roots.end()) return it->second;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    config.collnetEnable = 0;
    ncclComm_t comm = nullptr;
    EVENEP_NCCL_CHECK(ncclCommInitRankConfig(&comm, boot.world_size, from_hex(boot.unique_id), boot.rank, &config));
    roots.emplace(key, comm);
    return comm;
}

struct NcclWindow {
    void* mem = nullptr;
    ncclWindow_t win = nullptr;
    DeviceArray<char*> d_peers;  // [R] device table
    Window view;
};

}  // namespace

bool nccl_team_built() { return true; }

int nccl_runtime_version() {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

std::string nccl_new_unique_id() {
    disable_multicast_if_unset();
    ncclUniqueId id;
    EVENEP_NCCL_CHECK(ncclGetUniqueId(&id));
    return to_hex(id);
}

struct NcclTeam::Impl {
    NcclBootstrap boot;
    TeamOptions options;
    size_t bytes_per_rank = 0;
    ncclComm_t comm = nullptr;
    // NOTE: NCCL fills the device communicator by its own version's layout; the slack keeps a newer 2.28.x library
    // from writing past it (the fields read here, rank/nRanks/lsaRank/lsaSize, lead the struct in every 2.28).
    ncclDevComm devcomm{};
    unsigned char devcomm_slack[4096] = {};
    bool devcomm_made = false;
    cudaStream_t stream = nullptr;
    detail::WindowRegistry<NcclWindow> windows;  // [0]: the main window
    size_t flags_off = 0;
    DeviceArray<uint32_t> d_local;  // [C][2R] arrive, gen; then abort, claim
    size_t local_words = 0;
    DeviceArray<uint32_t*> d_inbox;  // [C][R] device tables
    DeviceArray<int32_t> d_word;     // host barrier scratch
    DeviceErrorRecord* h_record = nullptr;
    DeviceErrorRecord* d_record = nullptr;
    TeamView views[kNcclTeamChannels]{};
    bool broken = false;  // a failure left the peers in an unknown state: skip collective teardown

    const NcclWindow& main() const { return windows.front(); }

    const NcclWindow& add_window(size_t bytes) {
        const size_t size = detail::align_up(bytes > 0 ? bytes : 1, kWindowAlign);
        auto w = std::make_unique<NcclWindow>();
        const ncclResult_t alloc = ncclMemAlloc(&w->mem, size);
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, alloc == ncclSuccess, "nccl team: rank ", boot.rank,
                          ": ncclMemAlloc of ", size, " bytes failed: ", ncclGetErrorString(alloc), " (",
                          ncclGetLastError(comm), ")");
        try {
            EVENEP_CUDA_CHECK(cudaMemset(w->mem, 0, size));
            EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
            const ncclResult_t reg = ncclCommWindowRegister(comm, w->mem, size, &w->win, NCCL_WIN_COLL_SYMMETRIC);
            EVENEP_CHECK_KIND(ErrorKind::kRuntime, reg == ncclSuccess && w->win != nullptr, "nccl team: rank ",
                              boot.rank, ": window registration failed (ncclCommWindowRegister of ", size,
                              " bytes, NCCL_WIN_COLL_SYMMETRIC): ", ncclGetErrorString(reg), " (",
                              ncclGetLastError(comm),
                              "); symmetric windows need CUDA VMM (NCCL_CUMEM_ENABLE=1) "
                              "and the same size on every rank");
            const int R = boot.world_size;
            w->d_peers = DeviceArray<char*>(static_cast<size_t>(R), DeviceFill::kNone);
            nccl_detail::launch_lsa_peer_table(w->win, boot.rank, devcomm.lsaRank, R, w->d_peers.get(), stream);
            w->view.peers.assign(R, nullptr);
            EVENEP_CUDA_CHECK(cudaMemcpyAsync(w->view.peers.data(), w->d_peers.get(), sizeof(char*) * R,
                                              cudaMemcpyDeviceToHost, stream));
            EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
            for (int p = 0; p < R; ++p)
                EVENEP_CHECK_KIND(ErrorKind::kRuntime, w->view.peers[p] != nullptr, "nccl team: rank ", boot.rank,
                                  ": ncclGetLsaPointer gave no mapping of rank ", p, "'s window");
        } catch (...) {
            release(*w);
            throw;
        }
        w->view.local = static_cast<char*>(w->mem);
        w->view.d_peers = w->d_peers.get();
        w->view.bytes = size;
        return windows.add(std::move(w));
    }

    // Collective (free_window): every rank's kernels have ended and no peer touches the window any more (host barrier)
    // before the registration and the memory go. A team whose peers are in an unknown state (broken) skips the
    // barrier and leaves the registration to ncclCommAbort (release).
    void remove_window(const Window& window) {
        std::unique_ptr<NcclWindow> w = windows.take(
            &window, [](const NcclWindow& e) { return &e.view; }, "nccl team");
        try {
            EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
            if (!broken) host_barrier();
        } catch (...) {
            broken = true;
            release(*w);
            throw;
        }
        release(*w);
    }

    void release(NcclWindow& w) noexcept {
        if (w.win && !broken) ncclCommWindowDeregister(comm, w.win);
        if (w.mem && !broken) ncclMemFree(w.mem);
        w = NcclWindow{};  // frees d_peers
    }

    void host_barrier() {
        EVENEP_NCCL_CHECK(ncclAllReduce(d_word.get(), d_word.get(), 1, ncclInt32, ncclSum, comm, stream));
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    void build_views() {
        const int R = boot.world_size;
        std::vector<uint32_t*> inbox(static_cast<size_t>(kNcclTeamChannels) * R);
        for (int c = 0; c < kNcclTeamChannels; ++c)
            for (int p = 0; p < R; ++p)
                inbox[static_cast<size_t>(c) * R + p] =
                    reinterpret_cast<uint32_t*>(main().view.peers[p] + flags_off) + static_cast<size_t>(c) * R;
        EVENEP_CUDA_CHECK(
            cudaMemcpy(d_inbox.get(), inbox.data(), inbox.size() * sizeof(uint32_t*), cudaMemcpyHostToDevice));
        uint32_t* abort = d_local.get() + static_cast<size_t>(kNcclTeamChannels) * 2 * R;
        for (int c = 0; c < kNcclTeamChannels; ++c) {
            TeamView& v = views[c];
            v = TeamView{};
            v.num_ranks = R;
            v.peers = main().d_peers.get();
            v.flags = nullptr;
            v.local_arrive = d_local.get() + static_cast<size_t>(c) * 2 * R;
            v.local_gen = v.local_arrive + R;
            v.abort = abort;
            v.error_claim = reinterpret_cast<int32_t*>(abort + 1);
            v.record = d_record;
            v.fault_rank = -1;
            v.fault_phase = 0;
            v.rank_begin = boot.rank;
            v.launch_ranks = 1;
            v.system_scope = 1;
            v.inbox = d_inbox.get() + static_cast<size_t>(c) * R;
        }
        set_timeout_ms(options.timeout_ms);
        set_timeout_action(options.on_timeout);
    }

    void set_timeout_ms(double ms) {
        EVENEP_CHECK(ms > 0, "nccl team: timeout_ms = ", ms, " must be positive");
        options.timeout_ms = ms;
        for (TeamView& v : views) v.timeout_ns = static_cast<uint64_t>(ms * 1e6);
    }

    void set_timeout_action(TimeoutAction action) {
        options.on_timeout = action;
        for (TeamView& v : views) v.trap_on_timeout = action == TimeoutAction::kTrap ? 1 : 0;
    }

    void teardown() {
        if (stream) cudaStreamSynchronize(stream);
        if (cudaDeviceSynchronize() != cudaSuccess) broken = true;
        windows.release_all([this](NcclWindow& w) { release(w); });
        if (devcomm_made && !broken) ncclDevCommDestroy(comm, &devcomm);
        if (comm) {
            if (broken) {
                ncclCommAbort(comm);
            } else {
                ncclCommFinalize(comm);
                ncclCommDestroy(comm);
            }
        }
        d_local = DeviceArray<uint32_t>(), d_inbox = DeviceArray<uint32_t*>(), d_word = DeviceArray<int32_t>();
        if (h_record) cudaFreeHost(h_record);
        if (stream) cudaStreamDestroy(stream);
    }
};

NcclTeam::NcclTeam(const NcclBootstrap& boot, size_t bytes_per_rank, const TeamOptions& options)
    : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.boot = boot;
    m.options = options;
    const int R = boot.world_size;
    EVENEP_CHECK(R >= 1 && R <= kMaxVirtualRanks, "nccl team: world size ", R, " outside [1, ", kMaxVirtualRanks, "]");
    EVENEP_CHECK(boot.rank >= 0 && boot.rank < R, "nccl team: rank ", boot.rank, " outside [0, ", R, ")");
    EVENEP_CHECK(options.timeout_ms > 0, "nccl team: timeout_ms = ", options.timeout_ms, " must be positive");
    const int version = nccl_runtime_version();
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, version >= kMinNcclVersion, "nccl team: NCCL too old: the loaded NCCL is ",
                      version_string(version),
                      " but the NCCL team needs NCCL >= 2.28 (device API: ncclDevCommCreate, "
                      "symmetric windows, LSA pointers); put a newer libnccl.so.2 first on LD_LIBRARY_PATH (e.g. "
                      "PyTorch's nvidia/nccl/lib)");
    int num_devices = 0;
    EVENEP_CUDA_CHECK(cudaGetDeviceCount(&num_devices));
    EVENEP_CHECK(boot.local_rank >= 0 && boot.local_rank < num_devices, "nccl team: rank ", boot.rank,
                 ": LOCAL_RANK = ", boot.local_rank, " but this process sees ", num_devices, " CUDA device(s)");
    EVENEP_CUDA_CHECK(cudaSetDevice(boot.local_rank));
    disable_multicast_if_unset();
    try {
        EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 1;
        config.collnetEnable = 0;
        EVENEP_NCCL_CHECK(ncclCommSplit(root_comm(boot), 0, boot.rank, &m.comm, &config));
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, m.comm != nullptr, "nccl team: rank ", boot.rank,
                          ": ncclCommSplit gave no communicator");
        // Device communicator: no multimem (NVLink multicast off), no NCCL barriers (EvenEP brings its own).
        struct {
            ncclDevCommRequirements reqs;
            unsigned char slack[4096];  // zeroed fields a newer 2.28.x library may read past our struct
        } req_storage{};
        req_storage.reqs.lsaMultimem = false;
        const ncclResult_t dc = ncclDevCommCreate(m.comm, &req_storage.reqs, &m.devcomm);
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, dc == ncclSuccess, "nccl team: rank ", boot.rank,
                          ": ncclDevCommCreate failed: ", ncclGetErrorString(dc), " (", ncclGetLastError(m.comm),
                          "); the device API needs NCCL >= 2.28 with symmetric memory support (CUDA VMM, "
                          "NCCL_CUMEM_ENABLE=1) and GPU peer access between all ranks");
        m.devcomm_made = true;
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, m.devcomm.lsaSize == R && m.devcomm.nRanks == R,
                          "nccl team: no GPU peer access: only ", m.devcomm.lsaSize, " of ", R,
                          " ranks are load/store accessible (LSA team) from rank ", boot.rank,
                          "; the NCCL team needs every rank of the EP group on NVLink or PCIe P2P with this GPU");
        m.d_word = DeviceArray<int32_t>(1);
        // Main window: the caller's bytes, then the barrier flags of every channel.
        m.bytes_per_rank = detail::align_up(bytes_per_rank > 0 ? bytes_per_rank : 1, 256);
        m.flags_off = m.bytes_per_rank;
        m.add_window(m.flags_off + sizeof(uint32_t) * kNcclTeamChannels * R);
        m.local_words = static_cast<size_t>(kNcclTeamChannels) * 2 * R + 2;
        m.d_local = DeviceArray<uint32_t>(m.local_words);
        m.d_inbox = DeviceArray<uint32_t*>(static_cast<size_t>(kNcclTeamChannels) * R, DeviceFill::kNone);
        EVENEP_CUDA_CHECK(
            cudaHostAlloc(reinterpret_cast<void**>(&m.h_record), sizeof(DeviceErrorRecord), cudaHostAllocMapped));
        std::memset(static_cast<void*>(m.h_record), 0, sizeof(DeviceErrorRecord));
        EVENEP_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.d_record), m.h_record, 0));
        m.build_views();
        m.host_barrier();  // every rank's window is zeroed before any peer writes into it
    } catch (...) {
        m.broken = true;
        m.teardown();
        throw;
    }
}

NcclTeam::~NcclTeam() {
    // NOTE: destructors never throw; errors (a context lost to a trap, a dead peer) make the teardown local.
    if (impl_) impl_->teardown();
}

int NcclTeam::rank() const { return impl_->boot.rank; }
int NcclTeam::size() const { return impl_->boot.world_size; }
int NcclTeam::device() const { return impl_->boot.local_rank; }
size_t NcclTeam::bytes_per_rank() const { return impl_->bytes_per_rank; }
const TeamOptions& NcclTeam::options() const { return impl_->options; }
char* NcclTeam::base() const { return impl_->main().view.local; }
const Window& NcclTeam::main_window() const { return impl_->main().view; }
void* NcclTeam::nccl_comm() const { return impl_->comm; }

char* NcclTeam::base(int rank) const {
    EVENEP_CHECK(rank == this->rank(), "nccl team: rank ", rank, " is not served by this process (rank ", this->rank(),
                 ")");
    return base();
}

char* NcclTeam::peer_base(int peer) const {
    EVENEP_CHECK(peer >= 0 && peer < size(), "nccl team: peer ", peer, " outside [0, ", size(), ")");
    return impl_->main().view.peers[peer];
}

const TeamView& NcclTeam::view(int channel) const {
    EVENEP_CHECK(channel >= 0 && channel < kNcclTeamChannels, "nccl team: channel ", channel, " outside [0, ",
                 kNcclTeamChannels, ")");
    return impl_->views[channel];
}

const Window& NcclTeam::alloc_window(size_t bytes) {
    const Window& v = impl_->add_window(bytes).view;
    impl_->host_barrier();
    return v;
}

void NcclTeam::free_window(const Window& window) { impl_->remove_window(window); }

size_t NcclTeam::num_windows() const { return impl_->windows.empty() ? 0 : impl_->windows.size() - 1; }

void NcclTeam::host_barrier() { impl_->host_barrier(); }

void NcclTeam::device_barrier(cudaStream_t stream, int channel) {
    nccl_detail::launch_team_sync(view(channel), stream);
}

std::vector<int64_t> NcclTeam::all_gather(std::span<const int64_t> mine) {
    Impl& m = *impl_;
    const size_t n = mine.size(), R = static_cast<size_t>(size());
    std::vector<int64_t> all(n * R);
    if (n == 0) return all;
    const DeviceArray<int64_t> buf(n * (R + 1), DeviceFill::kNone);
    int64_t* d = buf.get();
    EVENEP_CUDA_CHECK(cudaMemcpyAsync(d, mine.data(), sizeof(int64_t) * n, cudaMemcpyHostToDevice, m.stream));
    EVENEP_NCCL_CHECK(ncclAllGather(d, d + n, n, ncclInt64, m.comm, m.stream));
    EVENEP_CUDA_CHECK(cudaMemcpyAsync(all.data(), d + n, sizeof(int64_t) * n * R, cudaMemcpyDeviceToHost, m.stream));
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    return all;
}

void NcclTeam::inject_fault(int rank, Phase phase) {
    EVENEP_CHECK(rank >= -1 && rank < size(), "nccl team: fault rank ", rank, " outside [-1, ", size(), ")");
    for (TeamView& v : impl_->views) {
        v.fault_rank = rank;
        v.fault_phase = static_cast<int32_t>(phase);
    }
}

void NcclTeam::set_timeout_ms(double ms) { impl_->set_timeout_ms(ms); }
void NcclTeam::set_timeout_action(TimeoutAction action) { impl_->set_timeout_action(action); }

std::string NcclTeam::pending_error() const {
    return detail_team::read_record(impl_->h_record, "; NCCL team, one process per GPU");
}

void NcclTeam::check(cudaStream_t stream) const {
    const cudaError_t sync_err = cudaStreamSynchronize(stream);
    if (sync_err != cudaSuccess) impl_->broken = true;  // a trap or a lost context: no collective teardown
    detail_team::throw_recorded(impl_->h_record, sync_err, "; NCCL team, one process per GPU");
}

void NcclTeam::recover() {
    Impl& m = *impl_;
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    m.host_barrier();  // every rank's kernels have ended: no arrival is in flight
    const int R = size();
    EVENEP_CUDA_CHECK(cudaMemset(m.main().view.local + m.flags_off, 0, sizeof(uint32_t) * kNcclTeamChannels * R));
    EVENEP_CUDA_CHECK(cudaMemset(m.d_local.get(), 0, m.local_words * sizeof(uint32_t)));
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    std::memset(static_cast<void*>(m.h_record), 0, sizeof(DeviceErrorRecord));
    m.host_barrier();  // nobody arrives before every rank has cleared its flags
}

#else  // !EVENEP_HAVE_NCCL

namespace {
[[noreturn]] void not_built() {
    throw Error(ErrorKind::kRuntime,
                "nccl team: this build has no NCCL team (configure with -DEVENEP_NCCL=ON and NCCL >= 2.28 found, "
                "e.g. -DEVENEP_NCCL_ROOT=<prefix with include/nccl_device.h and lib/libnccl.so.2>)");
}
}  // namespace

struct NcclTeam::Impl {};

bool nccl_team_built() { return false; }
int nccl_runtime_version() { return 0; }
std::string nccl_new_unique_id() { not_built(); }
NcclTeam::NcclTeam(const NcclBootstrap&, size_t, const TeamOptions&) { not_built(); }
NcclTeam::~NcclTeam() = default;
int NcclTeam::rank() const { not_built(); }
int NcclTeam::size() const { not_built(); }
int NcclTeam::device() const { not_built(); }
size_t NcclTeam::bytes_per_rank() const { not_built(); }
const TeamOptions& NcclTeam::options() const { not_built(); }
char* NcclTeam::base() const { not_built(); }
char* NcclTeam::peer_base(int) const { not_built(); }
char* NcclTeam::base(int) const { not_built(); }
const Window& NcclTeam::main_window() const { not_built(); }
const TeamView& NcclTeam::view(int) const { not_built(); }
const Window& NcclTeam::alloc_window(size_t) { not_built(); }
void NcclTeam::free_window(const Window&) { not_built(); }
size_t NcclTeam::num_windows() const { not_built(); }
void NcclTeam::check(cudaStream_t) const { not_built(); }
std::string NcclTeam::pending_error() const { not_built(); }
void NcclTeam::recover() { not_built(); }
void NcclTeam::host_barrier() { not_built(); }
void NcclTeam::device_barrier(cudaStream_t, int) { not_built(); }
std::vector<int64_t> NcclTeam::all_gather(std::span<const int64_t>) { not_built(); }
void NcclTeam::inject_fault(int, Phase) { not_built(); }
void NcclTeam::set_timeout_ms(double) { not_built(); }
void NcclTeam::set_timeout_action(TimeoutAction) { not_built(); }
void* NcclTeam::nccl_comm() const { not_built(); }

#endif  // EVENEP_HAVE_NCCL

}  // namespace evenep::cuda
