// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp): FP8 block-scaled forward on 128 x 256 tiles
// with EvenEP's piecewise consumer loop (fp8_overlap_mainloop.cuh, PiecewisePromotionMainloop).
#include "cuda/kernels/cutlass/grouped_gemm_cutlass_fp8.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseForwardWide>(int, int);
template void fp8_instance_launch<Fp8Kind::kBlockwiseForwardWide>(const Fp8LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
