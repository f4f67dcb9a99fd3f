// One CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass.cuh): dgrad with fp32 output, cooperative (the MoE
// layer's dgrads).
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t instance_workspace_bytes<Op::kDgrad, Schedule::kCooperative, true>(int, int);
template void instance_launch<Op::kDgrad, Schedule::kCooperative, true>(const LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
