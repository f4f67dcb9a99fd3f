// Kernels of the NCCL team (include/evenep/cuda/nccl_team.hpp): resolving the LSA peer pointers of a window, and a
// bare team barrier (NcclTeam::device_barrier).
//
// ncclGetLsaPointer reads the window's device-side descriptor (flat LSA base and per-rank stride), so the table is
// built on the device once per window and read by the data-path kernels as TeamView::peers.
#if defined(EVENEP_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include "cuda/device/team.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/runtime/nccl_internal.hpp"

namespace evenep::cuda::nccl_detail {
namespace {

__global__ void lsa_peer_table_kernel(ncclWindow_t window, int rank, int lsa_rank, int num_ranks, char** out) {
    for (int peer = static_cast<int>(threadIdx.x); peer < num_ranks; peer += static_cast<int>(blockDim.x))
        out[peer] = static_cast<char*>(ncclGetLsaPointer(window, 0, lsa_rank + peer - rank));
}

// One team barrier: a block per rank of the launch (the team's own barrier protocol and timeout).
__global__ void team_sync_kernel(const TeamView team) {
    const device::RankCtx c = device::rank_ctx(team, 1);
    (void)device::barrier(team, c, Phase::kTest, true);
}

}  // namespace

void launch_team_sync(const TeamView& team, cudaStream_t stream) {
    launch_cooperative(team_sync_kernel, team.launch_ranks, 128, 0, stream, team);
}

void launch_lsa_peer_table(
    ncclWindow_t window, int rank, int lsa_rank, int num_ranks, char** d_out, cudaStream_t stream) {
    EVENEP_CHECK(window != nullptr && d_out != nullptr && num_ranks >= 1, "nccl team: bad peer-table arguments");
    lsa_peer_table_kernel<<<1, 128, 0, stream>>>(window, rank, lsa_rank, num_ranks, d_out);
    check_launch(stream);
}

}  // namespace evenep::cuda::nccl_detail

#endif  // EVENEP_HAVE_NCCL
