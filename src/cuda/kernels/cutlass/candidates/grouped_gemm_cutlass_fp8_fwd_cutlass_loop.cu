// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp): FP8 block-scaled fwd with CUTLASS's own
// consumer loop (the in-run anchor of fp8_overlap_mainloop.cuh).
#include "cuda/kernels/cutlass/grouped_gemm_cutlass_fp8.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseForwardCutlass>(int, int);
template void fp8_instance_launch<Fp8Kind::kBlockwiseForwardCutlass>(const Fp8LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
