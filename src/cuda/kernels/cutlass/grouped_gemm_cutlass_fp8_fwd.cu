// One FP8 CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass_fp8.cuh): block-scaled forward.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass_fp8.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseForward>(int, int);
template void fp8_instance_launch<Fp8Kind::kBlockwiseForward>(const Fp8LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
