// evenep/cuda/team.hpp — the device team, local flavour (SPEC §5): R virtual ranks in one process on one GPU.
//
// Every virtual rank owns one device allocation of the same size (its "symmetric" buffer: the same offset holds
// the same object on every rank) and sees every peer's allocation through a device peer-pointer table, exactly as
// the NCCL team will expose LSA peers. Kernels that synchronise ranks are launched once for all virtual ranks
// (cooperative launch: every block is co-resident, so a block spinning on a peer's flag can never wait for a
// block that is not scheduled); blocks [rank * blocks_per_rank, (rank + 1) * blocks_per_rank) act for `rank`.
//
// The device barrier (src/cuda/device/team.cuh) has release/acquire semantics at GPU scope and a timeout read
// from the GPU's global timer. A rank that waits longer than the timeout prints "rank, peer, phase", records the
// same in a host-mapped error record, raises the team's abort flag (every other wait then returns at once) and,
// with TimeoutAction::kTrap, traps. LocalTeam::check() turns the record into evenep::Error(kTimeout) naming the
// missing rank, and resets the synchronisation state so the team is usable for the next call (SPEC §8).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace evenep::cuda {

inline constexpr int kMaxVirtualRanks = 256;

enum class TimeoutAction : int {
    kReport = 0,  // record + abort flag; kernels return; the host throws from LocalTeam::check()
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

// R virtual ranks on one GPU. Owns R device allocations of `bytes_per_rank` bytes (256-byte aligned, zeroed),
// the device peer table, the barrier state and the host-mapped error record. Not copyable.
class LocalTeam {
  public:
    LocalTeam(int num_ranks, size_t bytes_per_rank, const TeamOptions& options = {});
    ~LocalTeam();
    LocalTeam(const LocalTeam&) = delete;
    LocalTeam& operator=(const LocalTeam&) = delete;

    int size() const { return num_ranks_; }
    int device() const { return options_.device; }
    size_t bytes_per_rank() const { return bytes_per_rank_; }
    const TeamOptions& options() const { return options_; }
    // Device pointer to the start of `rank`'s symmetric allocation.
    char* base(int rank) const;
    const TeamView& view() const { return view_; }

    // Synchronises `stream`, then throws evenep::Error if the device recorded a failure: kTimeout for a barrier
    // timeout (message names the waiting rank, the missing peer and the phase), kInvalidArgument for a bad expert
    // id (rank, token, k, value), kInternal for a broken planner invariant, kRuntime for a CUDA error. Before
    // throwing it resets the barrier state, so the team is usable for the next call.
    void check(cudaStream_t stream) const;
    // Reads the error record without synchronising; returns "" when none is set.
    std::string pending_error() const;
    // Clears the barrier state, the abort flag and the error record (synchronous).
    void reset_sync_state() const;
    // Test hook: from the next launch on, `rank` never arrives at barriers of `phase` (rank -1 disables).
    void inject_fault(int rank, Phase phase);
    void set_timeout_ms(double ms);
    void set_timeout_action(TimeoutAction action);

  private:
    int num_ranks_;
    size_t bytes_per_rank_;
    TeamOptions options_;
    char** bases_ = nullptr;      // host array [R] of device pointers
    char** d_peers_ = nullptr;    // device array [R]
    uint32_t* d_sync_ = nullptr;  // flags, arrive, gen, abort, claim in one allocation
    size_t sync_bytes_ = 0;
    DeviceErrorRecord* h_record_ = nullptr;
    TeamView view_{};
};

}  // namespace evenep::cuda
