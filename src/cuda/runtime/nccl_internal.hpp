// Private helpers of the NCCL team's sources: the NCCL error check and the launchers of the nccl_*.cu kernels.
// The parts that need nccl.h exist only in builds with the NCCL team (EVENEP_HAVE_NCCL).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "evenep/cuda/team.hpp"
#include "evenep/error.hpp"

#if defined(EVENEP_HAVE_NCCL)
#include <nccl.h>

// EVENEP_NCCL_CHECK(expr): evaluates an ncclResult_t expression once; throws evenep::Error(kRuntime) naming the
// expression, NCCL's error string and its last error message when it is not ncclSuccess.
#define EVENEP_NCCL_CHECK(expr)                                                                                    \
    do {                                                                                                           \
        const ncclResult_t evenep_nccl_res_ = (expr);                                                              \
        if (evenep_nccl_res_ != ncclSuccess)                                                                       \
            ::evenep::detail::throw_error(::evenep::ErrorKind::kRuntime, __FILE__, __LINE__, #expr, "NCCL error ", \
                                          ncclGetErrorString(evenep_nccl_res_), " (", ncclGetLastError(nullptr),   \
                                          ") in ", #expr);                                                         \
    } while (0)
#endif

namespace evenep::cuda::nccl_detail {

#if defined(EVENEP_HAVE_NCCL)
// One team barrier (Phase::kTest) on `stream`: one block per rank of the launch.
void launch_team_sync(const TeamView& team, cudaStream_t stream);

// Fills d_out[peer] (device table [num_ranks]) with ncclGetLsaPointer(window, 0, lsa_rank + peer - rank): every
// rank's copy of `window` as mapped into this process. `window` is the ncclWindow_t of a registered window.
void launch_lsa_peer_table(
    ncclWindow_t window, int rank, int lsa_rank, int num_ranks, char** d_out, cudaStream_t stream);
#endif

}  // namespace evenep::cuda::nccl_detail
