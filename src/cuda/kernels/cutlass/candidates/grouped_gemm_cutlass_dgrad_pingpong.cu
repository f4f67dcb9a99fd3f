// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp): CUTLASS grouped GEMM, dgrad, ping-pong.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t instance_workspace_bytes<Op::kDgrad, Schedule::kPingpong>(int, int);
template void instance_launch<Op::kDgrad, Schedule::kPingpong>(const LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
