// The GPU path of `evenep demo` (demo_cuda.hpp). Without a CUDA build both functions exist: one says so, the other
// throws.
#include "demo_cuda.hpp"

#include <fmt/format.h>

#include "common.hpp"
#include "evenep/error.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/cuda/moe_layer.hpp"
#include "evenep/cuda/team.hpp"
#endif

namespace evenep::cli {

#if defined(EVENEP_HAVE_CUDA)

bool demo_cuda_available(std::string* why) {
    if (!cuda::device_available()) {
        if (why) *why = "no CUDA device is usable (cudaGetDeviceCount found none)";
        return false;
    }
    return true;
}

bool demo_cuda_fp8_available(std::string* why) {
    if (cuda::grouped_gemm_has_cutlass()) return true;
    if (why)
        *why =
            "the FP8 layer needs the CUTLASS FP8 grouped GEMM: a build with EVENEP_CUTLASS=ON "
            "(CMAKE_CUDA_ARCHITECTURES with 90a) on a compute capability 9.0 device (H100/H200)";
    return false;
}

cpu::MoeResult run_moe_layer_cuda(const cpu::MoeProblem& p,
                                  const cpu::MoeRunOptions& opt,
                                  int warmup,
                                  CudaDemoInfo* info) {
    EVENEP_CHECK(warmup >= 0, "--warmup = ", warmup, " must be >= 0");
    EVENEP_CHECK(opt.num_layers == 1, "demo (cuda): one layer per step");
    cuda::TeamOptions to;
    to.timeout_ms = static_cast<double>(opt.barrier_timeout.count());
    cuda::LocalTeam team(p.cfg.cfg.R, 0, to);
    cuda::MoeRunInfo run{};
    cpu::MoeResult res = cuda::run_moe_layer(team, p, opt, warmup, &run);
    if (info) {
        int dev = 0;
        cudaDeviceProp prop{};
        EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
        EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
        info->device = fmt::format("{} ({} SMs)", prop.name, prop.multiProcessorCount);
        info->warmup_steps = run.warmup_steps;
        info->step_wall_seconds = run.step_wall_seconds;
        info->layer_bytes = run.layer_bytes;
    }
    return res;
}

#else  // !EVENEP_HAVE_CUDA

bool demo_cuda_available(std::string* why) {
    if (why) *why = "this evenep was built without the CUDA backend";
    return false;
}

bool demo_cuda_fp8_available(std::string* why) {
    if (why) *why = "this evenep was built without the CUDA backend";
    return false;
}

cpu::MoeResult run_moe_layer_cuda(const cpu::MoeProblem&, const cpu::MoeRunOptions&, int, CudaDemoInfo*) {
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "demo --backend cuda: needs a CUDA build");
    cpu::MoeResult unreachable;
    return unreachable;
}

#endif  // EVENEP_HAVE_CUDA

}  // namespace evenep::cli
