// tools/evenep/demo_cuda.hpp — the GPU path of `evenep demo` (demo_cuda.cpp): the same MoE layer step on the
// GPU layer (evenep/cuda/moe_layer.hpp), returned in the CPU runner's result type so demo.cpp reports it alike.
#pragma once

#include <cstddef>
#include <string>

#include "evenep/cpu/moe_layer.hpp"

namespace evenep::cli {

// True when this evenep was built with the CUDA backend and a CUDA device is usable; else false, with the reason
// in *why (when not null).
bool demo_cuda_available(std::string* why);

// True when the GPU layer can run the FP8 path here (the CUTLASS FP8 grouped GEMM is built in and runs on this
// device); else false, with the reason in *why.
bool demo_cuda_fp8_available(std::string* why);

struct CudaDemoInfo {
    std::string device;            // e.g. "NVIDIA H200 (132 SMs)"
    int warmup_steps = 0;          // untimed steps before the reported one
    double step_wall_seconds = 0;  // host wall time of the reported step (launches + synchronisation)
    size_t layer_bytes = 0;        // device bytes of the layer's activations and scratch
};

// One MoE layer step of every virtual rank on one GPU (cuda::run_moe_layer over a LocalTeam): `warmup`
// untimed steps (weight gradients zeroed after them), then the reported step with CUDA events at every phase
// boundary. Fills out, grad_x, grad_topk_w, grad_w_* (at home after reduce_grad), plan (rank 0's device copy),
// dst (every rank's device copy), times (GPU seconds per phase, all ranks together) and sizes. The GPU kernels
// do not count bytes: traffic is the byte model evaluated on the device's own plan and dst (what the data path
// moves, since it moves exactly what dst encodes). options.barrier_timeout bounds every device barrier wait.
// Throws evenep::Error when the build has no CUDA backend or the device fails.
cpu::MoeResult run_moe_layer_cuda(const cpu::MoeProblem& problem,
                                  const cpu::MoeRunOptions& options,
                                  int warmup,
                                  CudaDemoInfo* info);

}  // namespace evenep::cli
