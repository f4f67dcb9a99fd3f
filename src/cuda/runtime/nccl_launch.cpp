// launch_local_group: one process per GPU on this host (include/evenep/cuda/nccl_team.hpp), over launch_processes
// (src/core/launch.cpp) with the NCCL unique id and NVLink multicast off.
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/error.hpp"
#include "evenep/launch.hpp"

namespace evenep::cuda {

LaunchResult launch_local_group(const LaunchOptions& options) {
    EVENEP_CHECK(options.num_ranks >= 1 && options.num_ranks <= kMaxVirtualRanks, "launch: number of ranks ",
                 options.num_ranks, " outside [1, ", kMaxVirtualRanks, "]");
    LaunchOptions with_id = options;
    with_id.env.emplace_back("EVENEP_NCCL_ID", nccl_new_unique_id());
    with_id.env_defaults.insert(
        with_id.env_defaults.end(),
        {{"NCCL_NVLS_ENABLE", "0"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}, {"NVSHMEM_DISABLE_NVLS", "1"}});
    return launch_processes(with_id);
}

}  // namespace evenep::cuda
