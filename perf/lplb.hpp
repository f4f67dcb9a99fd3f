// perf/lplb.hpp — an LPLB-like baseline, written from its public description (DeepSeek's LPLB README): EPLB's
// redundant experts placed on a static replica graph, and per batch each replicated expert's tokens split between
// its original and its replica by an exact min-max solve on the batch's histogram.
//
// Here: the graph is a topology over the R ranks (hypercube: neighbours r xor 2^d, R a power of two; "cube" is the
// hypercube of R = 8; torus: a x b grid with wrap-around, a the largest divisor of R <= sqrt(R); ring: r +- 1).
// Rank r's d-th neighbour holds a replica of r's d-th heaviest expert by the loads given at placement (ties: lower
// id), at most epn = E/R edges per rank, so every redundant expert is shared by exactly two ranks (its home and
// the neighbour) and no expert has two replicas. Per batch: x_j in [0, T_{e_j}] entries of edge j's expert move
// from the home to the neighbour, minimising the largest rank load base_r - out_r + in_r (base = conventional EP's
// rows). Solved exactly: the smallest integer bound M whose flow network (source -> rank r: base_r; rank -> sink:
// M; home -> neighbour: T_e per edge) carries every entry, by bisection on M with a max-flow (Dinic). The integer
// optimum is the LP optimum rounded up.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace evenep::perf {

enum class LplbTopology { kHypercube, kTorus, kRing };
// "hypercube", "cube" (the hypercube, R = 8 only), "torus", "ring"; throws naming the value.
LplbTopology parse_lplb_topology(const std::string& name, int R);
const char* to_string(LplbTopology t);

// Neighbours of every rank, ascending, without the rank itself; throws naming R when the topology does not fit.
std::vector<std::vector<int32_t>> lplb_neighbours(LplbTopology topology, int R);

struct LplbEdge {
    int32_t home = 0;    // the expert's home rank
    int32_t holder = 0;  // the neighbour holding its replica
    int32_t expert = 0;
};

// The replica graph for per-expert loads `expert_load` [E] (the placement's statistics).
std::vector<LplbEdge> lplb_edges(LplbTopology topology, int R, int E, std::span<const int64_t> expert_load);

struct LplbSplit {
    std::vector<int64_t> moved;      // [edges] entries of the edge's expert computed by the holder
    std::vector<int64_t> rank_load;  // [R] rows per rank after the split
    int64_t max_load = 0;            // the optimum
};

// The exact min-max split of one batch: expert_load [E], edges with distinct experts homed as e / (E/R).
LplbSplit lplb_solve(int R, int E, std::span<const int64_t> expert_load, std::span<const LplbEdge> edges);

// alloc [E*R] of a split: each edge's expert keeps T_e - moved on its home, moved on the holder.
std::vector<int64_t> lplb_alloc(int R, int E, std::span<const int64_t> expert_load, std::span<const LplbEdge> edges,
                                const LplbSplit& split);

}  // namespace evenep::perf
