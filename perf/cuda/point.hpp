// perf/cuda/point.hpp — what the per-op files of one benchmark point share (perf/cuda/bench.hpp's bench_point):
// the routing, the device EP with every rank's inputs, the CPU plan and destinations, the row builder. Internal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "perf/cuda/bench.hpp"
#include "perf/cuda/device_buf.hpp"
#include "perf/cuda/timing.hpp"

namespace evenep::perf {

// Builds a BenchRow (bandwidth over the median; fraction of the copy anchor).
BenchRow make_row(const std::string& op,
                  const std::string& shape,
                  double maxvio,
                  const Stats& st,
                  double bytes,
                  double copy_gbps,
                  int iters);

struct Point {
    const BenchConfig& bc;
    Config cfg;
    Routing routing;
    double maxvio = 0;
    std::vector<std::vector<float>> weights;  // [R][s*K] route weights
    std::string shape;
    double copy_gbps = 0;

    std::unique_ptr<cuda::DeviceEp> ep;
    std::vector<std::unique_ptr<DeviceArray<uint16_t>>> x, out;
    std::vector<std::unique_ptr<DeviceArray<int32_t>>> idx;
    std::vector<std::unique_ptr<DeviceArray<float>>> w;
    std::vector<cuda::RankIo> io;
    cudaStream_t stream = nullptr;
    cuda::EpPlan ep_plan;
    // Whether the fused plan kernel runs here (cuda::plan_fits_co_resident: R virtual ranks need R co-resident
    // blocks). Without it ep_plan holds every rank's plan from the planner alone (no destinations): only the
    // planner's one-rank rows are measured.
    bool fused = true;

    Plan plan;                              // the CPU planner's plan of the routing
    std::vector<std::vector<int32_t>> dst;  // [R][s*K] its encoded destinations
    std::vector<BenchRow> rows;

    Point(const BenchConfig& config, double copy_anchor_gbps);
    ~Point();
    Point(const Point&) = delete;
    Point& operator=(const Point&) = delete;

    void add(const std::string& op, const Stats& st, double b, int blocks, int64_t wrong, const std::string& note);
    // --graph: the same op as graph replays, right after its stream timing (before any check, so that a check
    // verifies what the replays left); its row follows the op's own row.
    std::optional<Stats> graph_stats(const std::function<void()>& op);
    void add_graph(const std::string& op,
                   const std::optional<Stats>& st,
                   double b,
                   int blocks,
                   int64_t wrong,
                   const std::string& note);
    // Every rank's inputs on kCheckColumns columns (from the device x) for the CPU oracle.
    std::vector<cpu::RankTokens> oracle_tokens(const std::vector<int>& cols) const;
    BufferConfig oracle_config() const;
};

// The ops of one point (plan.cpp, data_path.cpp, experts.cpp); each appends its rows to p.rows.
void bench_plan(Point& p);
void bench_data_path(Point& p, bool dispatch, bool combine);
void bench_experts(Point& p, bool prefetch, bool reduce);

}  // namespace evenep::perf
