// evenep/cpu/oracle.hpp — group-level wrappers over the per-rank CPU data path: all ranks' inputs in, all ranks'
// outputs out. Each call builds a LocalTeamGroup and a fresh cpu::Buffer per rank, runs the ranks on threads and
// returns every rank's results, so GPU tests can compare their buffers bitwise against these.
//
// Receive buffers are returned whole ([NvS*H] per rank); rows past the rank's last segment
// (plan.rows_used(r)) are undefined by the contract (zero here, fresh buffers) and must not be compared.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/plan.hpp"

namespace evenep::cpu {

// One rank's dispatch input.
struct RankTokens {
    int s = 0;
    std::vector<Bf16> x;            // [s*H]
    std::vector<int32_t> topk_idx;  // [s*K]
    std::vector<float> topk_w;      // [s*K]
};

struct GroupDispatchResult {
    Plan plan;
    std::vector<std::vector<int32_t>> dst;        // [R][s_r*K]
    std::vector<std::vector<Bf16>> recv_x;        // [R][NvS*H]
    std::vector<std::vector<float>> recv_w;       // [R][NvS]
    std::vector<std::vector<int32_t>> recv_next;  // [R][NvS]
    std::vector<std::vector<int32_t>> recv_ret;   // [R][NvS]
    std::vector<std::vector<Fp8E4m3>> recv_x8;    // [R][NvS*H] with precision.fp8 (recv_x then untouched), else empty
    std::vector<std::vector<float>> recv_scale;   // [R][NvS*H/128] with precision.fp8, else empty
    PhaseTraffic traffic;                         // dispatch, summed over ranks
    PhaseTraffic gather_traffic;                  // histogram all-gather
};

struct GroupCombineResult {
    std::vector<std::vector<Bf16>> out;          // [R][s_r*H]
    std::vector<std::vector<float>> gathered_w;  // [R][s_r*K]
    PhaseTraffic traffic;                        // combine, summed over ranks
};

struct OracleOptions {
    PlannerMode mode = PlannerMode::kOptimized;
    int64_t s_total = -1;  // see DispatchArgs::s_total
    std::chrono::milliseconds barrier_timeout = kDefaultBarrierTimeout;
};

// Plans and dispatches every rank's tokens. Throws the lowest failing rank's error.
GroupDispatchResult dispatch_group(const BufferConfig& cfg,
                                   const std::vector<RankTokens>& tokens,
                                   const OracleOptions& options = {});

// Dispatches, then combines y[r] ([NvS*H] expert outputs of rank r; an empty y means: combine the dispatched
// rows themselves, in place). gathered_w holds the gathered route weights.
GroupCombineResult combine_group(const BufferConfig& cfg,
                                 const std::vector<RankTokens>& tokens,
                                 const std::vector<std::vector<Bf16>>& y,
                                 bool apply_weights,
                                 const OracleOptions& options = {});

}  // namespace evenep::cpu
