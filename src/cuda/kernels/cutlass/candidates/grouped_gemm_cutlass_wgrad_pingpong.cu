// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp): CUTLASS grouped GEMM, wgrad, ping-pong.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t instance_workspace_bytes<Op::kWgrad, Schedule::kPingpong>(int, int);
template void instance_launch<Op::kWgrad, Schedule::kPingpong>(const LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
