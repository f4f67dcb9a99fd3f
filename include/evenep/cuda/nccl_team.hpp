// evenep/cuda/nccl_team.hpp — the device team, NCCL flavour (SPEC §5): one process per GPU.
//
// Where the local team (evenep/cuda/team.hpp) runs R virtual ranks on one GPU, the NCCL team runs one rank per
// process and GPU and reaches its peers through NCCL's device API (NCCL >= 2.28):
//   symmetric memory   every window is ncclMemAlloc'd (the same size on every rank) and registered with
//                      ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC);
//   device comm        ncclDevCommCreate (no multimem: NVLink multicast stays off) gives the LSA team; every rank of
//                      the group must be load/store accessible (NVLink or PCIe P2P), else construction fails;
//   peer pointers      a kernel resolves every peer's copy of a window with ncclGetLsaPointer into a device table;
//   barrier            the local team's protocol (src/cuda/device/team.cuh) with each rank's inbound flags in its
//                      own window and flag operations and fences at system scope (src/cuda/device/lsa_sync.cuh);
//                      a rank that does not arrive within the timeout is named in the error (no hang).
// The kernels are the local team's, unchanged: a launch holds only this rank's blocks (TeamView::rank_begin =
// rank, launch_ranks = 1).
//
// Bootstrap: nccl_bootstrap_from_env() reads a torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK; Open MPI,
// MPICH/Hydra and Slurm names too) and the NCCL unique id from EVENEP_NCCL_ID (hex) or EVENEP_NCCL_ID_FILE (rank 0
// creates the id and writes the file; the others wait for it). `evenep launch -n N -- cmd` sets all of them.
//
// Every entry point throws evenep::Error when the build has no NCCL team (nccl_team_built() == false).
// Threading: one NcclTeam per process and group, used from one host thread.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "evenep/cuda/team.hpp"
#include "evenep/launch.hpp"

namespace evenep::cuda {

inline constexpr int kNcclUniqueIdBytes = 128;           // NCCL_UNIQUE_ID_BYTES
inline constexpr int kMinNcclVersion = 22800;            // 2.28.0: ncclDevCommCreate, symmetric windows, LSA pointers
inline constexpr int kNcclTeamChannels = kTeamChannels;  // independent barrier states (see Team::view)

// True when this build contains the NCCL team (CMake option EVENEP_NCCL).
bool nccl_team_built();
// ncclGetVersion() of the NCCL library loaded at run time (e.g. 22809 for 2.28.9); 0 without the NCCL team.
int nccl_runtime_version();

// Who this process is in its group and how it reaches the others.
struct NcclBootstrap {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;     // CUDA device ordinal of this process
    std::string unique_id;  // NCCL unique id, 2*kNcclUniqueIdBytes hex digits (same on every rank)
};

// A fresh NCCL unique id (ncclGetUniqueId) as hex. The process that creates it must stay alive until every rank
// has joined (the id names a bootstrap socket of this process).
std::string nccl_new_unique_id();
// Reads the bootstrap from the environment:
//   rank        RANK | OMPI_COMM_WORLD_RANK | PMI_RANK | SLURM_PROCID                  (default 0)
//   world size  WORLD_SIZE | OMPI_COMM_WORLD_SIZE | PMI_SIZE | SLURM_NTASKS              (default 1)
//   local rank  LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_RANK | MPI_LOCALRANKID | SLURM_LOCALID (default: rank)
//   unique id   EVENEP_NCCL_ID (hex), else EVENEP_NCCL_ID_FILE: rank 0 writes a new id there (atomically, by
//               rename), the other ranks poll the file for up to `id_wait`; a fresh path per job is the caller's
//               duty. A group of one creates its own id.
// Throws evenep::Error naming the variable on a malformed or missing value.
NcclBootstrap nccl_bootstrap_from_env(std::chrono::milliseconds id_wait = std::chrono::seconds(120));

// Starting one process per GPU on this host (`evenep launch`, the multi-GPU tests): evenep/launch.hpp.
using evenep::LaunchOptions;
using evenep::LaunchResult;

// Creates an NCCL unique id, then runs launch_processes (evenep/launch.hpp: every rank in its own process group,
// all of them stopped on the first failure, the timeout, SIGINT or SIGTERM) with EVENEP_NCCL_ID added and, where
// unset, NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (NVLink multicast off).
// The calling process must not be needed by the children beyond the NCCL bootstrap (it stays in this call until
// they end). Throws evenep::Error for bad options (num_ranks outside [1, kMaxVirtualRanks]) or when the build has
// no NCCL team.
LaunchResult launch_local_group(const LaunchOptions& options);

using NcclWindowView = Window;  // one symmetric window (evenep/cuda/team.hpp)

class NcclTeam final : public Team {
  public:
    // Collective over the group (every rank constructs its team with the same bytes_per_rank and options):
    // cudaSetDevice(boot.local_rank); the team's communicator, split (ncclCommSplit) from the group's root
    // communicator, which the process's first team creates from the unique id (ncclCommInitRankConfig; an id
    // bootstraps one communicator) and keeps until exit; the main window of bytes_per_rank bytes (plus the barrier
    // flags) and the device communicator. options.device is ignored (the device is boot.local_rank).
    // Sets NCCL_NVLS_ENABLE=0 in the environment when it is unset (no NVLink multicast). Throws evenep::Error with
    // one clear message when NCCL is older than 2.28, a window cannot be registered, or some rank is not load/store
    // accessible from this one (no GPU peer access).
    NcclTeam(const NcclBootstrap& boot, size_t bytes_per_rank, const TeamOptions& options = {});
    ~NcclTeam() override;
    NcclTeam(const NcclTeam&) = delete;
    NcclTeam& operator=(const NcclTeam&) = delete;

    int rank() const;
    int size() const override;
    int rank_begin() const override { return rank(); }
    int num_local_ranks() const override { return 1; }
    int device() const override;
    size_t bytes_per_rank() const override;
    const TeamOptions& options() const override;
    // This rank's copy of the main window (device pointer, 256-byte aligned, zeroed at construction).
    char* base() const;
    char* base(int rank) const override;  // rank == rank(): base()
    // `peer`'s copy of the main window, mapped into this process (peer == rank() gives the self mapping, an alias
    // of base()). Device address: dereference in kernels only.
    char* peer_base(int peer) const;
    using Team::peer_base;
    const Window& main_window() const override;

    // The device-side view of channel `channel` (0 <= channel < kNcclTeamChannels): peers = the main window's
    // peer table; every channel has its own barrier flags and rank-local state, so kernels on different channels
    // may run at the same time (e.g. prefetch_weight beside dispatch); kernels on one channel run one at a time.
    const TeamView& view(int channel = 0) const override;

    // Collective: a further symmetric window of `bytes` on every rank (zeroed). Owned by the team; the reference
    // stays valid until free_window(it) or the team's destruction (Team::alloc_window, OwnedWindow).
    const Window& alloc_window(size_t bytes) override;
    // Collective (Team::free_window): waits for this GPU, host barrier (no peer still uses the window), then
    // deregisters and frees this rank's copy.
    void free_window(const Window& window) override;
    size_t num_windows() const override;

    // Synchronises `stream` and throws evenep::Error if the device recorded a failure: kTimeout for a barrier
    // timeout (names this rank, the missing peer and the phase), kInvalidArgument for a bad expert id, kInternal
    // for a broken planner invariant, kRuntime for a CUDA error. Leaves the state (Team::check): the peers' flags
    // are only consistent again after recover().
    void check(cudaStream_t stream) const override;
    // The error record as text, without synchronising; "" when none is set.
    std::string pending_error() const override;
    // Collective: every rank waits for its GPU, zeroes its barrier flags, abort flag and error record, and waits
    // for the others (host barriers before and after), so the team is usable again after a timeout.
    void recover() override;

    // Collective: one team barrier on the device, on `stream` (the kernels' protocol and timeout; e.g. to start
    // every rank's timed region together). Asynchronous.
    void device_barrier(cudaStream_t stream, int channel = 0);
    // Collective host barrier through NCCL (an all-reduce of one word), then a device synchronisation.
    void host_barrier();
    // Collective: every rank's `mine` ([n] values, n equal on every rank), concatenated in rank order ([R*n]).
    std::vector<int64_t> all_gather(std::span<const int64_t> mine);

    // Test hooks, applied to every channel's view: `rank` never arrives at barriers of `phase` (-1 disables);
    // the timeout per wait; the action on timeout.
    void inject_fault(int rank, Phase phase) override;
    void set_timeout_ms(double ms) override;
    void set_timeout_action(TimeoutAction action) override;

    // The ncclComm_t (as void*) for host-side NCCL calls of the caller (e.g. the all-to-all baseline); the
    // communicator stays owned by the team.
    void* nccl_comm() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace evenep::cuda
