// evenep/cuda/team.hpp — the device team interface (SPEC §5) and its local flavour: R virtual ranks on one GPU.
//
// Every virtual rank owns one device allocation of the same size (its "symmetric" buffer: the same offset holds
// the same object on every rank) and sees every peer's allocation through a device peer-pointer table, exactly as
// the NCCL team (evenep/cuda/nccl_team.hpp) exposes its LSA peers. Kernels that synchronise ranks are launched once for
// all virtual ranks (cooperative launch: every block is co-resident, so a block spinning on a peer's flag can never
// wait for a block that is not scheduled); blocks [rank * blocks_per_rank, (rank + 1) * blocks_per_rank) act for
// `rank`.
//
// The device barrier (src/cuda/device/team.cuh) has release/acquire semantics at GPU scope and a timeout read
// from the GPU's global timer. A rank that waits longer than the timeout prints "rank, peer, phase", records the
// same in a host-mapped error record, raises the team's abort flag (every other wait then returns at once) and,
// with TimeoutAction::kTrap, traps. Team::check() turns the record into evenep::Error(kTimeout) naming the
// missing rank; Team::recover() clears the state so the team is usable for the next call (SPEC §8).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "evenep/cuda/detail/window_registry.hpp"
#include "evenep/cuda/device_array.hpp"

namespace evenep::cuda {

inline constexpr int kMaxVirtualRanks = 256;

enum class TimeoutAction : int {
    kReport = 0,  // record + abort flag; kernels return; the host throws from Team::check()
    kTrap = 1,    // record + print, then __trap(): the context is lost; the record survives in host memory
};

// Where a kernel was when it failed. Printed by the device and named in the host error.
enum class Phase : int32_t {
    kNone = 0,
    kPlanHistogram = 1,   // rank-local: every block's histogram written
    kPlanGather = 2,      // team: every rank's histogram gathered
    kPlanReady = 3,       // rank-local: the rank's plan written
    kDispatchSent = 4,    // team: every payload row and weight delivered
    kCombineReady = 5,    // team: every rank's expert outputs final
    kCombinePartial = 6,  // team: every pre-summed partial delivered
    kPrefetchDone = 7,    // team: every prefetched weight copy delivered
    kReduceReady = 8,     // team: every slot gradient final
    kReduceDone = 9,      // team: every slot gradient consumed
    kTest = 10,           // barrier tests
    kEntry = 11,          // team, multi-process teams only: every peer entered this call
};
const char* to_string(Phase phase);

// What the device recorded (host-mapped, written once per failure by the first failing thread).
enum class DeviceErrorKind : int32_t {
    kNone = 0,
    kBarrierTimeout = 1,  // rank waited for peer (or, peer == -1, for its own blocks) at `phase`
    kBadExpertId = 2,     // rank's topk_idx[token, k] = value is outside [-1, E)
    kInternal = 3,        // a planner invariant broke on rank (value: remote experts, aux: epn)
    kNonFiniteInput = 4,  // FP8 dispatch: rank's x[token, k = channel] (value: its bf16 bits) is NaN or infinite
    kBadFp8Input = 5,     // FP8 dispatch of caller-quantised rows (RankIo::x8): aux 0: x8[token, k = channel] is a
                          // NaN code (value: the byte); aux 1: x_scales[token, k = block] (value: its fp32 bits) is
                          // not finite and > 0 (aux 2: not a power of two, with ue8m0)
};

struct DeviceErrorRecord {
    int32_t set;  // 1 once the fields below are complete
    int32_t kind;
    int32_t rank;
    int32_t peer;
    int32_t phase;
    int32_t token;
    int32_t k;
    int32_t value;
    int32_t aux;
    uint32_t waited_ms;
};

// The device-side view of a team, passed by value in kernel parameters. Plain pointers; see team.cuh.
struct TeamView {
    int num_ranks;
    char* const* peers;         // [R] device table: base of each rank's symmetric allocation
    uint32_t* flags;            // [R*R] flags[dst*R + src]: barrier arrivals of src not yet consumed by dst
    uint32_t* local_arrive;     // [R] blocks of a rank that arrived at the current rank-local barrier
    uint32_t* local_gen;        // [R] generation of each rank's rank-local barrier
    uint32_t* abort;            // != 0 once any wait failed: every wait returns false at once
    int32_t* error_claim;       // first failing thread sets it to 1 and owns the record
    DeviceErrorRecord* record;  // host-mapped (cudaHostAllocMapped) device alias of the error record
    uint64_t timeout_ns;
    int32_t trap_on_timeout;
    int32_t fault_rank;  // test hook: this rank never arrives at barrier `fault_phase` (-1: none)
    int32_t fault_phase;
    // Which ranks' blocks one launch holds and at which scope ranks synchronise. The local team: every rank
    // (rank_begin 0, launch_ranks R), GPU scope, flags in `flags`. The NCCL team (evenep/cuda/nccl_team.hpp): its
    // own rank only, system scope, inbound flags of rank dst at inbox[dst][0..R) in dst's window.
    int32_t rank_begin;
    int32_t launch_ranks;
    int32_t system_scope;
    uint32_t* const* inbox;  // device table [R] or nullptr (then flags[dst*R + src])
};

struct TeamOptions {
    int device = 0;
    double timeout_ms = 10000.0;  // per barrier wait
    TimeoutAction on_timeout = TimeoutAction::kReport;
};

inline constexpr int kTeamChannels = 2;  // independent barrier states of every team (see Team::view)

// One symmetric window of a team: the same number of bytes for every rank, zeroed at creation, owned by the team.
struct Window {
    char* local = nullptr;           // the first served rank's copy (NCCL team: this rank's; local team: rank 0's)
    char* const* d_peers = nullptr;  // device table [R]: every rank's copy as addressed by this process's kernels
    std::vector<char*> peers;        // host copy of d_peers (device addresses: dereference in kernels only)
    size_t bytes = 0;
};

// The host side of a device team (SPEC §5): what cuda::Ep, cuda::Experts and the tests are written against.
// Implementations: LocalTeam (R virtual ranks on one GPU, every rank served by this process) and NcclTeam
// (evenep/cuda/nccl_team.hpp: one rank per process and GPU). Kernels get the team as a TeamView per channel and
// run the same device code on both (src/cuda/device/team.cuh, lsa_sync.cuh).
//
// Errors, the same on both teams: a kernel that fails (barrier timeout, bad expert id, broken invariant) records
// it in the team's error record and raises the abort flag, so every later wait returns at once. check() throws
// for it and LEAVES that state (every later call keeps failing fast); recover() clears it. On the NCCL team
// recover() is collective (every rank calls it, after its own check() threw or not).
class Team {
  public:
    virtual ~Team() = default;

    virtual int size() const = 0;             // R
    virtual int rank_begin() const = 0;       // first rank served by this process
    virtual int num_local_ranks() const = 0;  // ranks [rank_begin, rank_begin + num_local_ranks) served here
    virtual int device() const = 0;           // CUDA device ordinal
    virtual const TeamOptions& options() const = 0;
    bool serves(int rank) const { return rank >= rank_begin() && rank < rank_begin() + num_local_ranks(); }

    // The main window (bytes_per_rank bytes per rank, given at construction; may be tiny) and rank `rank`'s copy
    // of it (`rank` served by this process).
    virtual size_t bytes_per_rank() const = 0;
    virtual const Window& main_window() const = 0;
    virtual char* base(int rank) const = 0;

    // Device view of channel `channel` (0 <= channel < kTeamChannels): peers = the main window's table. Channels
    // have separate barrier state, so kernels on different channels may run at the same time (prefetch_weight
    // beside dispatch); kernels on one channel run one at a time, in the same order on every rank. Callers whose
    // data lives in another window copy the view and set TeamView::peers to that window's d_peers.
    virtual const TeamView& view(int channel = 0) const = 0;

    // Collective: a further symmetric window of `bytes` per rank (zeroed), valid until free_window(it) or the team's
    // destruction. Owners hold it as an OwnedWindow (below), which frees it with them.
    virtual const Window& alloc_window(size_t bytes) = 0;
    // Collective: frees `window` (one of this team's alloc_window results, not the main window): waits for the
    // device (on the NCCL team: every rank's, then a host barrier, so no peer still reads or writes any copy), then
    // releases every rank's copy. The reference, its device pointers and graphs that captured kernels using them
    // are invalid afterwards. Throws evenep::Error (kInvalidArgument) for the main window or a window this team does
    // not hold (freed already, or another team's). Every rank frees its windows in the same order.
    virtual void free_window(const Window& window) = 0;
    // Windows held besides the main window (what alloc_window added and free_window has not removed).
    virtual size_t num_windows() const = 0;
    // `peer`'s copy of `window` (device address).
    char* peer_base(const Window& window, int peer) const;

    // Synchronises `stream`, then throws evenep::Error if the device recorded a failure: kTimeout for a barrier
    // timeout (names the waiting rank, the missing peer and the phase), kInvalidArgument for a bad expert id (rank,
    // token, k, value), kInternal for a broken planner invariant, kRuntime for a CUDA error. Leaves the error state
    // as it is: call recover() before the team is used again.
    virtual void check(cudaStream_t stream) const = 0;
    // The error record as one line, without synchronising; "" when none is set.
    virtual std::string pending_error() const = 0;
    // Waits for the device, clears the barrier state of every channel, the abort flag and the error record
    // (synchronous; collective on the NCCL team). Not possible after a trap (the CUDA context is lost).
    virtual void recover() = 0;

    // Test hooks, applied to every channel: `rank` never arrives at barriers of `phase` (rank -1 disables); the
    // timeout per wait; the action on timeout.
    virtual void inject_fault(int rank, Phase phase) = 0;
    virtual void set_timeout_ms(double ms) = 0;
    virtual void set_timeout_action(TimeoutAction action) = 0;
};

// A window its holder owns (RAII over Team::alloc_window / free_window): Ep, Experts and ExpertPool hold theirs so
// that a temporary engine object (a benchmark point, a test, run_moe_layer) gives its device memory back. Moving
// transfers the ownership; destruction frees (collective on the NCCL team, like construction; errors are ignored
// there: a context lost to a trap). The team must outlive it.
class OwnedWindow {
  public:
    OwnedWindow() = default;
    OwnedWindow(Team& team, size_t bytes) : team_(&team), window_(&team.alloc_window(bytes)) {}
    ~OwnedWindow() { release_noexcept(); }
    OwnedWindow(OwnedWindow&& other) noexcept : team_(other.team_), window_(other.window_) { other.window_ = nullptr; }
    OwnedWindow& operator=(OwnedWindow&& other) noexcept;
    OwnedWindow(const OwnedWindow&) = delete;
    OwnedWindow& operator=(const OwnedWindow&) = delete;

    explicit operator bool() const { return window_ != nullptr; }
    const Window& operator*() const { return *window_; }
    const Window* operator->() const { return window_; }
    const Window* get() const { return window_; }
    // Frees the window now (collective; throws what Team::free_window throws); empty afterwards.
    void reset();

  private:
    void release_noexcept() noexcept;
    Team* team_ = nullptr;
    const Window* window_ = nullptr;
};

// The device error record as one line (the formatter of both teams; `note` is appended to a peer timeout).
std::string format_device_error(const DeviceErrorRecord& record, const char* note = "");

// R virtual ranks on one GPU, all served by this process. The main window is R device allocations of
// `bytes_per_rank` bytes (256-byte aligned, zeroed). Not copyable.
class LocalTeam final : public Team {
  public:
    LocalTeam(int num_ranks, size_t bytes_per_rank, const TeamOptions& options = {});
    ~LocalTeam() override;
    LocalTeam(const LocalTeam&) = delete;
    LocalTeam& operator=(const LocalTeam&) = delete;

    int size() const override { return num_ranks_; }
    int rank_begin() const override { return 0; }
    int num_local_ranks() const override { return num_ranks_; }
    int device() const override { return options_.device; }
    const TeamOptions& options() const override { return options_; }
    size_t bytes_per_rank() const override { return main_->bytes; }
    const Window& main_window() const override { return *main_; }
    char* base(int rank) const override;
    const TeamView& view(int channel = 0) const override;
    const Window& alloc_window(size_t bytes) override;
    void free_window(const Window& window) override;
    size_t num_windows() const override;
    void check(cudaStream_t stream) const override;
    std::string pending_error() const override;
    void recover() override;
    void inject_fault(int rank, Phase phase) override;
    void set_timeout_ms(double ms) override;
    void set_timeout_action(TimeoutAction action) override;

  private:
    void release() noexcept;
    struct Copies;  // one window: the Window handed out and the device arrays it points to (team.cpp)

    int num_ranks_;
    TeamOptions options_;
    detail::WindowRegistry<Copies> windows_;  // [0]: the main window
    const Window* main_ = nullptr;
    DeviceArray<uint32_t> d_sync_;  // per channel flags, arrive, gen; then abort, claim (one allocation)
    size_t sync_bytes_ = 0;
    DeviceErrorRecord* h_record_ = nullptr;
    TeamView views_[kTeamChannels]{};
};

}  // namespace evenep::cuda
