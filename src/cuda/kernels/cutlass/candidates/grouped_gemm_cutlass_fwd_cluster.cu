// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp, Schedule): fwd, cooperative in clusters of two
// along M.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t instance_workspace_bytes<Op::kForward, Schedule::kCooperativeCluster>(int, int);
template void instance_launch<Op::kForward, Schedule::kCooperativeCluster>(const LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
