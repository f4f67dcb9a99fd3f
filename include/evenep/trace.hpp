// evenep/trace.hpp — router traces: the per-step histograms a planner sees, recorded from a run or a workload.
//
// File format (docs/traces.md): one NumPy .npy of int32 ('<i4') or int64 ('<i8'), C order, shape [T, R, E] or
// [T, L, R, E] (L MoE layers): entry [t, (l,) r, e] = the (token, expert) entries rank r routes to expert e at step
// t (layer l), masked entries not counted. A valid trace has every count in [0, S] (a token picks an expert at most
// once) and every (step, layer, rank) row summing to at most S * K, for the S (tokens per rank) and K (top-k) the
// replay is told; T, L, R, E >= 1.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace evenep {

struct RouterTrace {
    int T = 0;  // steps
    int L = 1;  // layers (1 for a [T, R, E] file)
    int R = 0;
    int E = 0;
    bool layered = false;         // read from / written as [T, L, R, E]
    std::vector<int32_t> counts;  // [T*L*R*E]

    // The histogram tpe [R*E] of (step, layer).
    std::span<const int32_t> histogram(int step, int layer) const {
        const size_t n = static_cast<size_t>(R) * E;
        return {counts.data() + (static_cast<size_t>(step) * L + layer) * n, n};
    }
};

// Throws evenep::Error (kInvalidArgument) with one line naming `where`, the step, layer, rank, expert and value:
// sizes < 1, counts.size() != T*L*R*E, a count < 0 or > S, a row sum > S * K.
void validate_trace(const RouterTrace& trace, int K, int S, const std::string& where = "trace");

// Reads and validates a trace file (shape, dtype, values as above; int64 counts past int32 are refused).
RouterTrace read_trace(const std::string& path, int K, int S);

// Writes `trace` as int32, [T, R, E] (or [T, L, R, E] when `trace.layered` or L > 1).
void write_trace(const std::string& path, const RouterTrace& trace);

}  // namespace evenep
