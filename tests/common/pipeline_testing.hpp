// tests/common/pipeline_testing.hpp — small helpers shared by the pipeline tests (tests/unit/pipeline_*_test.cpp).
#pragma once

#include <string>
#include <vector>

#include "evenep/pipeline.hpp"

namespace evenep::testing {

inline pipeline::PipelineConfig pipeline_config(int P, int m, int V, double latency = 0) {
    pipeline::PipelineConfig cfg;
    cfg.P = P;
    cfg.m = m;
    cfg.V = V;
    cfg.latency = latency;
    return cfg;
}

// m micro-batches without ViT work.
inline pipeline::VitWork no_vit_work(int m) {
    return pipeline::VitWork{std::vector<std::vector<double>>(m), std::vector<std::vector<double>>(m)};
}

// Validator messages, one per line (for failure output).
inline std::string joined(const std::vector<std::string>& lines) {
    std::string s;
    for (const std::string& x : lines) s += x + "\n";
    return s;
}

}  // namespace evenep::testing
