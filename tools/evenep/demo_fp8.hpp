// tools/evenep/demo_fp8.hpp — `evenep demo --fp8` (demo_fp8.cpp): the FP8 layer step beside the bf16 one on the same
// backend (CPU oracle or the GPU layer), both against the dense float64 reference (docs/fp8.md).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/moe_layer.hpp"

namespace evenep::cli {

struct Fp8DemoResult {
    bool pass = false;
    std::vector<std::vector<Bf16>> out;       // [R][s_r*H] the FP8 layer's output
    std::vector<std::vector<float>> ref_f64;  // [R][s_r*H] the float64 reference (rounded to fp32)
};

// The layer step of a problem on the demo's backend (cpu::run_moe_layer, or the GPU runner of demo_cuda.hpp).
using LayerRunner = std::function<cpu::MoeResult(const cpu::MoeProblem&, const cpu::MoeRunOptions&)>;

// Runs the layer of `problem` again with `precision` (fp8 on) through `run` (`backend` names it), computes the float64
// reference, prints max/mean relative errors of the FP8 and the bf16 (`bf16`, the run already made) outputs
// against it with the FP8 tolerance, the FP8 gradients against `dense` (fp32 reference; empty grads: forward
// only), and the counted bytes of both runs per phase; fills j["fp8"]. pass: within kFp8LayerTolerance, the same
// plan and dst as the bf16 run.
Fp8DemoResult run_fp8_demo(const cpu::MoeProblem& problem,
                           const DataPrecision& precision,
                           const cpu::MoeRunOptions& options,
                           const cpu::MoeResult& bf16,
                           const cpu::DenseResult& dense,
                           const LayerRunner& run,
                           const char* backend,
                           nlohmann::json& j);

}  // namespace evenep::cli
