// tools/evenep/commands.hpp — one registration function per subcommand (one file each).
#pragma once

#include <CLI/CLI.hpp>

namespace evenep::cli {

// Each adds its subcommand to `app`; the callback runs the command and may throw evenep::Error
// (main turns it into one line on stderr and exit code 2).
void register_plan(CLI::App& app);
void register_quality(CLI::App& app);
void register_demo(CLI::App& app);
void register_bench(CLI::App& app);
// Adds the GPU benchmarks (dispatch, combine, prefetch, reduce, gpu planner, ...) under `evenep bench`.
// Defined in bench_cuda.cpp; without a CUDA build the subcommands explain that they need one.
void register_bench_cuda(CLI::App& bench);
// `evenep launch -n N -- cmd...`: one process per GPU with an NCCL unique id (launch.cpp).
void register_launch(CLI::App& app);
// `evenep simulate`: the CPU scale model with the conventional-EP and EPLB baselines (simulate.cpp).
void register_simulate(CLI::App& app);
// `evenep workloads`: the step-sequence workloads, and writing one as a router trace (workloads.cpp).
void register_workloads(CLI::App& app);
// Multi-process benchmarks under `evenep bench` (bench_multi.cpp).
void register_bench_multi(CLI::App& bench);
// `evenep bench gemm`: the grouped GEMM against torch._grouped_mm and dense cuBLAS anchors (bench_gemm.cpp).
void register_bench_gemm(CLI::App& bench);
// `evenep bench layer`: one MoE layer step vs conventional EP and EPLB-style replication (bench_layer.cpp).
void register_bench_layer(CLI::App& bench);
// `evenep slack`: copies and copy traffic vs the imbalance budget eps (slack.cpp).
void register_slack(CLI::App& app);
// `evenep pipeline`: interleaved 1F1B with the vision encoder in the bubbles, dynamic CP (pipeline.cpp).
void register_pipeline(CLI::App& app);

}  // namespace evenep::cli
