// evenep/workloads.hpp — step-sequence workloads: routings that move between steps and micro-batches.
//
// A workload is a sequence of routings, one per (step, micro-batch), each a pure function of
// (workload, seed, step, micro-batch) and of the shape (E, K, global token count) only: it does not depend on R
// or on the EP layout. The global routing of a micro-batch is `num_tokens` tokens, each with K distinct experts
// (or absent: ragged sources); a rank's tokens are a contiguous block of `num_tokens / R` of them, absent ones
// removed (so the same global routing split over R = 4 or R = 8 gives the same tokens in the same order).
//
// Every token draws from its own counter-based stream, derive_seed(key, token) with key a hash of
// (workload, seed, step, micro-batch), so any step is generated directly, without the steps before it (the drift
// workload's popularity is a walk: step t sums t increments, O(t * E)). Experts are drawn proportionally to the
// step's popularity without replacement: draws from an alias table, a repeated expert redrawn; after 64 * K
// draws a token takes the lowest unused live experts (a bound that the workloads' popularities never reach).
// The list with each workload's parameters: workload_list() and `evenep workloads`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "evenep/routing.hpp"

namespace evenep {

enum class Workload {
    kBalanced,         // uniform popularity
    kHotExperts,       // a scattered hot set of max(1, E/16) experts, 8x the others' popularity
    kHotRank,          // the same heat on max(1, E/16) contiguous experts (they share few home ranks)
    kSpreadHeat,       // the same heat on max(1, E/16) experts strided over the id space (spread over ranks)
    kRagged,           // lognormal popularity (sigma 0.5); token i of N present w.p. 1 - 0.75 i/N (SPEC §8)
    kZeroLoad,         // the first E/8 experts (whole ranks for R <= 8) and every 7th other expert never chosen
    kRotatingHotSpot,  // a contiguous hot block of max(1, E/16) experts (8x) moving by its width every step
    kBurst,            // calm lognormal (sigma 0.3); w.p. 1/10 a step puts 32x on a random hot set of E/16
    kDrift,            // lognormal sigma 1, every expert's log-popularity walks 0.1 per step (perf/drift.hpp)
    kMicroBatchNoise,  // balanced on average; each micro-batch a fresh lognormal draw (sigma 1) around it
};

struct WorkloadInfo {
    Workload kind;
    const char* name;
    const char* summary;
};

// Every workload in enum order, with its CLI name and one line.
std::span<const WorkloadInfo> workload_list();
const char* to_string(Workload w);
// Throws evenep::Error (kInvalidArgument) naming the value and the known names.
Workload parse_workload(const std::string& name);

struct WorkloadSpec {
    Workload kind = Workload::kBalanced;
    int E = 64;
    int K = 4;
    int64_t num_tokens = 4096;  // global tokens of one micro-batch (before ragged sources remove some)
    uint64_t seed = 1;

    // Throws evenep::Error naming the value: E < 1, K outside [1, min(E, kMaxTopK)], num_tokens < 1, fewer live
    // experts than K (zero-load), num_tokens * K past int32.
    void validate() const;
};

// Log-popularity [E] of (step, micro_batch); -infinity for an expert never chosen. step, micro_batch >= 0.
std::vector<double> workload_log_popularity(const WorkloadSpec& spec, int64_t step, int micro_batch);

// The global routing of (step, micro_batch): [num_tokens * K] expert ids, token-major; an absent token (ragged
// sources) has all K ids -1.
std::vector<int32_t> workload_global_routing(const WorkloadSpec& spec, int64_t step, int micro_batch);

// The global routing split over R ranks (num_tokens % R == 0, S = num_tokens / R): rank r holds the present tokens
// of [r*S, (r+1)*S) in order; a rank whose block has none holds one fully masked token (s_r >= 1).
Routing workload_routing(const WorkloadSpec& spec, int R, int64_t step, int micro_batch);

// Histograms of workload_routing without materialising it: tpe [R*E] and s [R].
struct WorkloadHistogram {
    std::vector<int32_t> tpe;
    std::vector<int32_t> s;
};
WorkloadHistogram workload_histogram(const WorkloadSpec& spec, int R, int64_t step, int micro_batch);

}  // namespace evenep
