// evenep/cuda/nccl_ep.hpp — one rank of a multi-process EP group (one process per GPU, NCCL team:
// evenep/cuda/nccl_team.hpp). The conventional NCCL all-to-all it is benchmarked against lives in the benchmarks
// (perf/cuda/nccl_alltoall.hpp).
//
// NcclEp is cuda::Ep (evenep/cuda/ep.hpp) over an NcclTeam it owns: the same kernels, layout and results bit for bit
// as on the local team, launched with only this rank's blocks; every per-rank span has one entry (this rank's).
// Every rank of the group constructs its NcclEp with the same configuration and makes the same calls in the same
// order (collective calls: see ep.hpp).
//
//   NcclEp ep(cfg, H, nccl_bootstrap_from_env());
//   EpPlan p = ep.plan({&io, 1}, s, stream);    // s: [R] tokens of every rank, the same array on every rank
//   ep.dispatch(p, {&io, 1}, stream);
//   ... expert compute writes y into ep.recv_x(ep.rank()) in place ...
//   ep.combine(p, {&io, 1}, apply_weights, CombineMode::kPull, stream);
//   ep.check(stream);                           // synchronise and surface device-side errors
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/cuda/types.hpp"

namespace evenep::cuda {

class NcclEp : private OwnedTeam<NcclTeam>, public Ep {
  public:
    // Collective. Checks the configuration (throws evenep::Error naming the value), requires cfg.R ==
    // boot.world_size, then creates the NCCL team (options.team) and the rank's buffer in a window of it.
    NcclEp(const Config& cfg, int hidden, const NcclBootstrap& boot, const EpOptions& options = {});
    int rank() const { return owned_team->rank(); }
    NcclTeam& team() { return *owned_team; }
    const NcclTeam& team() const { return *owned_team; }

  private:
    NcclEp(std::unique_ptr<NcclTeam> team, const Config& cfg, int hidden, const EpOptions& options);
};

}  // namespace evenep::cuda
