// tools/evenep/demo_fp8.hpp — `evenep demo --fp8` (demo_fp8.cpp): the FP8 layer step on the CPU beside the bf16 one,
// both against the dense float64 reference (docs/fp8.md).
#pragma once

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

// Runs the layer of `problem` again with `precision` (fp8 on) through the CPU oracle, computes the float64
// reference, prints max/mean relative errors of the FP8 and the bf16 (`bf16`, the run already made) outputs
// against it with the FP8 tolerance, the FP8 gradients against `dense` (fp32 reference; empty grads: forward
// only), and the counted bytes of both runs per phase; fills j["fp8"]. pass: within kFp8LayerTolerance, the same
// plan and dst as the bf16 run.
Fp8DemoResult run_fp8_demo(const cpu::MoeProblem& problem,
                           const DataPrecision& precision,
                           const cpu::MoeRunOptions& options,
                           const cpu::MoeResult& bf16,
                           const cpu::DenseResult& dense,
                           nlohmann::json& j);

}  // namespace evenep::cli
