// Device side of the local team: memory-order primitives, bounded waits, rank-local and team barriers.
//
// Memory model (PTX ISA, GPU scope — every virtual rank lives on this GPU):
//   arrive: __syncthreads() gathers the block's writes at thread 0 (CTA barrier), whose fence.acq_rel.gpu is
//           cumulative over them; the arrival itself is a relaxed atomic after that fence (a release pattern).
//   wait:   ld.acquire.gpu of the counter, then __syncthreads() hands the acquired view to the block.
// What each flag publishes is stated where it is written.
#pragma once

#include <cstdint>
#include <cstdio>

#include "cuda/device/lsa_sync.cuh"
#include "evenep/cuda/team.hpp"

namespace evenep::cuda::device {

__device__ __forceinline__ uint64_t global_timer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Programmatic dependent launch (launch.cuh launch_config `early`): wait_previous_kernel returns once the stream's
// previous kernel has completed and its writes are visible (at once in a kernel launched without it);
// allow_next_kernel lets the stream's next early kernel be scheduled (it still waits for this one to end).
// (sm_90 and later; an older device has no early launch, and the launch attribute is then ignored.)
__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Identity of the calling block inside a launch that covers every virtual rank.
struct RankCtx {
    int rank;        // virtual rank this block acts for
    int block;       // block index inside the rank, [0, num_blocks)
    int num_blocks;  // blocks per rank
};

// The launch holds the blocks of ranks [t.rank_begin, t.rank_begin + t.launch_ranks), blocks_per_rank each.
__device__ __forceinline__ RankCtx rank_ctx(const TeamView& t, int blocks_per_rank) {
    return RankCtx{t.rank_begin + static_cast<int>(blockIdx.x) / blocks_per_rank,
                   static_cast<int>(blockIdx.x) % blocks_per_rank, blocks_per_rank};
}

// True when ranks of the team run in other processes (NCCL team): a kernel that writes into peers' buffers then
// first passes a team barrier (Phase::kEntry), since stream order no longer separates its call from the peers'
// previous one.
__device__ __forceinline__ bool multi_process(const TeamView& t) { return t.launch_ranks < t.num_ranks; }

// Records a failure once (first caller wins), then raises the abort flag. Any thread may call it.
__device__ inline void record_error(const TeamView& t,
                                    DeviceErrorKind kind,
                                    int rank,
                                    int peer,
                                    Phase phase,
                                    int token,
                                    int k,
                                    int value,
                                    int aux,
                                    uint32_t waited_ms) {
    if (atomicCAS(t.error_claim, 0, 1) == 0) {
        volatile DeviceErrorRecord* rec = t.record;
        rec->kind = static_cast<int32_t>(kind);
        rec->rank = rank;
        rec->peer = peer;
        rec->phase = static_cast<int32_t>(phase);
        rec->token = token;
        rec->k = k;
        rec->value = value;
        rec->aux = aux;
        rec->waited_ms = waited_ms;
        __threadfence_system();
        rec->set = 1;  // publishes the fields above to the host
        __threadfence_system();
    }
    // Publishes "stop waiting" to every spinning thread; no data rides on it.
    atomicExch(t.abort, 1u);
}

__device__ __forceinline__ bool aborted(const TeamView& t) { return ld_relaxed_gpu(t.abort) != 0; }

// Spins until ld.acquire(*p) satisfies `ready`; false on abort or timeout (a timeout is recorded and printed, and
// traps with TimeoutAction::kTrap). `peer` names whom the caller waits for (-1: its own rank's blocks).
// `timeout_ns` is t.timeout_ns for waits on peers and twice that for waits on the rank's own leader block, so
// that a missing peer is always reported by the leader that waits for it, never by a block waiting on its leader.
template <typename Ready>
__device__ bool wait_acquire(
    const TeamView& t, const uint32_t* p, Ready ready, int rank, int peer, Phase phase, uint64_t timeout_ns) {
    const uint64_t start = global_timer_ns();
    uint32_t backoff = 16;
    for (;;) {
        const uint32_t v = peer >= 0 ? team_flag_load(t, p) : ld_acquire_gpu(p);
        if (ready(v)) return true;
        if (aborted(t)) return false;
        const uint64_t waited = global_timer_ns() - start;
        if (waited > timeout_ns) {
            const uint32_t ms = static_cast<uint32_t>(waited / 1000000ull);
            printf("evenep: barrier timeout: rank %d waited %u ms at phase %d for %s %d (seen %u)\n", rank, ms,
                   static_cast<int>(phase), peer >= 0 ? "peer rank" : "own blocks of rank", peer >= 0 ? peer : rank, v);
            record_error(t, DeviceErrorKind::kBarrierTimeout, rank, peer, phase, -1, -1, static_cast<int>(v), 0, ms);
            if (t.trap_on_timeout) __trap();
            return false;
        }
        __nanosleep(backoff);
        if (backoff < 256) backoff *= 2;
    }
}

// Barrier of all blocks of `c.rank`, and with `team` also of all ranks of the team. Called by every thread of
// every block of the rank (uniform control flow); returns false (in every thread) when the team aborted or this
// rank is the injected fault. Publishes every global write made before the call by any participating block to
// every participating block after it.
__device__ inline bool barrier(const TeamView& t, const RankCtx& c, Phase phase, bool team) {
    __shared__ int s_ok;
    __syncthreads();
    if (threadIdx.x == 0) {
        bool ok = true;
        if (t.fault_rank == c.rank && t.fault_phase == static_cast<int32_t>(phase)) {
            ok = false;  // injected fault: this rank never arrives
        } else {
            const int R = t.num_ranks;
            uint32_t* gen_p = t.local_gen + c.rank;
            const uint32_t gen = ld_acquire_gpu(gen_p);
            __threadfence();  // cumulative over the block's writes gathered by __syncthreads
            const uint32_t arrived = atomicAdd(t.local_arrive + c.rank, 1u);
            if (arrived == static_cast<uint32_t>(c.num_blocks - 1)) {
                // Last block of the rank: every block's writes are visible here (their fences precede their adds).
                t.local_arrive[c.rank] = 0;  // nobody adds again before gen moves (ordered by the release below)
                if (team) {
                    team_fence(t);
                    // flag (p <- me): one arrival of `me` for `p`; publishes everything this rank wrote so far.
                    for (int p = 0; p < R; ++p) team_flag_arrive(t, team_flag(t, p, c.rank));
                    for (int p = 0; p < R && ok; ++p) {
                        uint32_t* f = team_flag(t, c.rank, p);
                        ok = wait_acquire(
                            t, f, [](uint32_t v) { return v != 0; }, c.rank, p, phase, t.timeout_ns);
                        if (ok) team_flag_consume(t, f);  // consume one arrival of p (a counting semaphore)
                    }
                    team_fence(t);
                }
                __threadfence();
                st_release_gpu(gen_p, gen + 1);  // releases the rank's blocks; publishes the team's writes to them
            } else {
                ok = wait_acquire(
                    t, gen_p, [gen](uint32_t v) { return v != gen; }, c.rank, -1, phase, 2 * t.timeout_ns + 1000000ull);
            }
            ok = ok && !aborted(t);
            __threadfence();
        }
        s_ok = ok ? 1 : 0;
    }
    __syncthreads();
    return s_ok != 0;
}

}  // namespace evenep::cuda::device
