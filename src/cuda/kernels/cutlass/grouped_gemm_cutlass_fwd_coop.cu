// One CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass.cuh): fwd, cooperative schedule.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t instance_workspace_bytes<Op::kForward, Schedule::kCooperative>(int, int);
template void instance_launch<Op::kForward, Schedule::kCooperative>(const LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
