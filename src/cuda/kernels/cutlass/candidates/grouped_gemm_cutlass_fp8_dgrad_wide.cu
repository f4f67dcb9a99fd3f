// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp): FP8 block-scaled dgrad on 128 x 256 tiles
// with EvenEP's piecewise consumer loop (fp8_overlap_mainloop.cuh, PiecewisePromotionMainloop).
#include "cuda/kernels/cutlass/grouped_gemm_cutlass_fp8.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseDgradWide>(int, int);
template void fp8_instance_launch<Fp8Kind::kBlockwiseDgradWide>(const Fp8LaunchArgs&, int, cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
