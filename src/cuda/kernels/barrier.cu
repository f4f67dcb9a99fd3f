// A kernel that exercises the team barrier: every round each rank writes the round number into its word of every
// peer's board, passes a team barrier, and checks that every peer's word for it holds that round. Used by the
// barrier tests (ordering, co-residency, timeout reporting with an injected missing rank).
#include <cuda_runtime.h>

#include "cuda/device/team.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"

namespace evenep::cuda {
namespace {

inline constexpr int kBarrierThreads = 128;

__global__ void __launch_bounds__(kBarrierThreads)
    barrier_test_kernel(const TeamView team, size_t board_off, int rounds, int blocks_per_rank, int32_t* errors) {
    const device::RankCtx c = device::rank_ctx(team, blocks_per_rank);
    const int R = team.num_ranks;
    const int tid = threadIdx.x + c.block * kBarrierThreads;
    for (int round = 1; round <= rounds; ++round) {
        // Each block of the rank writes a part of the rank's words: word [me] of board [p] holds the round.
        for (int q = tid; q < R; q += c.num_blocks * kBarrierThreads) {
            volatile int32_t* board = reinterpret_cast<int32_t*>(team.peers[q] + board_off);
            board[c.rank] = round;
        }
        if (!device::barrier(team, c, Phase::kTest, true)) return;
        const int32_t* mine = reinterpret_cast<const int32_t*>(team.peers[c.rank] + board_off);
        for (int q = tid; q < R; q += c.num_blocks * kBarrierThreads) {
            const int32_t seen = *reinterpret_cast<const volatile int32_t*>(mine + q);
            if (seen != round) atomicAdd(errors + c.rank, 1);
        }
        // Second barrier: nobody overwrites a board before every rank has checked it.
        if (!device::barrier(team, c, Phase::kTest, true)) return;
    }
}

}  // namespace

int launch_barrier_test(
    const TeamView& team, size_t board_off, int rounds, int sm_budget, int32_t* d_errors, cudaStream_t stream) {
    EVENEP_CHECK(rounds >= 1, "barrier test: rounds = ", rounds, " must be >= 1");
    const int nb = clamp_co_resident(barrier_test_kernel, kBarrierThreads, 0, team.launch_ranks, sm_budget);
    launch_cooperative(barrier_test_kernel, team.launch_ranks * nb, kBarrierThreads, 0, stream, team, board_off, rounds,
                       nb, d_errors);
    return nb;
}

}  // namespace evenep::cuda
