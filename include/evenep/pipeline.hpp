// evenep/pipeline.hpp — the vision encoder in the pipeline bubbles (seed 000 §5.2.3, issue 14): an interleaved
// 1F1B schedule, an event simulator, ViT placement policies (none | sync | bubbles | optimal), an independent
// validator and dynamic context parallelism for large images. Pure C++, no CUDA. Model and figures:
// docs/pipeline.md.
//
// Units: every cost and time here is in "text units" (the default text forward of one model chunk costs 1),
// except VitCostModel, which is in seconds of one ViT block on the calibration GPU.
//
// Model. P ranks (pipeline stages), m micro-batches, V virtual chunks per rank: model chunk c in [0, P*V) lives
// on rank c mod P. Micro-batch i runs F(i, 0..PV-1) forward, then B(i, PV-1..0) backward. A dependency between
// two different ranks costs `latency`. ViT work of micro-batch i is a list of pieces (images, or CP parts of an
// image); each piece may run on any rank (the encoder is replicated over the stages, as in K2.5's decoupled
// encoder). VF(i, p) must end (plus `latency` when not on rank 0) before F(i, 0) starts; VB(i, p) starts after
// B(i, 0) ends (plus `latency` when not on rank 0).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "evenep/pipeline/vit_calibration.hpp"

namespace evenep::pipeline {

enum class OpKind { kForward, kBackward, kVitForward, kVitBackward };
// "F", "B", "VF", "VB" (the JSON names).
const char* to_string(OpKind kind);

// The text pipeline. Throws evenep::Error (kInvalidArgument) from validate() naming the bad value.
struct PipelineConfig {
    int P = 4;             // ranks (stages), >= 1
    int m = 8;             // micro-batches, >= 1; a multiple of P when V > 1 (Megatron's interleaving rule)
    int V = 1;             // virtual chunks per rank, >= 1; V = 1 is plain 1F1B
    double latency = 0;    // added to every dependency between two different ranks, >= 0
    std::vector<double> forward;   // [m] forward cost of one chunk of micro-batch i; empty: 1 each
    std::vector<double> backward;  // [m] backward cost of one chunk of micro-batch i; empty: 2 each

    void validate() const;
    int num_chunks() const { return P * V; }
    double forward_cost(int mb) const { return forward.empty() ? 1.0 : forward[mb]; }
    double backward_cost(int mb) const { return backward.empty() ? 2.0 : backward[mb]; }
};

// ViT work per micro-batch: forward[i][p] and backward[i][p] are the costs of piece p of micro-batch i (text
// units, >= 0). Both have m rows of the same lengths (a row may be empty: a text-only micro-batch).
struct VitWork {
    std::vector<std::vector<double>> forward;
    std::vector<std::vector<double>> backward;

    void validate(int m) const;  // throws evenep::Error naming micro-batch, piece and value
    double total() const;        // all forward + backward work
    int num_pieces() const;      // pieces per direction, over all micro-batches
};

// One op of a schedule. chunk: model chunk for F/B, -1 for ViT ops; part: piece index for VF/VB, -1 for F/B.
struct Op {
    int rank = 0;
    OpKind kind = OpKind::kForward;
    int mb = 0;
    int chunk = -1;
    int part = -1;
    double start = 0;
    double end = 0;
};

// A timed schedule: ops sorted by (rank, start). busy and bubble_fraction are per rank over [0, makespan].
struct Schedule {
    std::vector<Op> ops;
    double makespan = 0;
    std::vector<double> busy;             // [P] sum of op durations on the rank
    std::vector<double> bubble_fraction;  // [P] 1 - busy / makespan (0 when makespan = 0)
};

// One entry of a rank's execution order (no times): kind, micro-batch and chunk (F/B) or part (VF/VB).
struct Step {
    OpKind kind = OpKind::kForward;
    int mb = 0;
    int index = 0;  // chunk for F/B, part for VF/VB
};
using RankOrders = std::vector<std::vector<Step>>;  // [P][steps in execution order]

// The Megatron interleaved 1F1B order of the text ops on every rank: warm-up forwards
// (V = 1: min(P - r - 1, m); V > 1: min((P - r - 1) * 2 + (V - 1) * P, m*V), all m*V when m = P), then
// alternating one forward / one backward, then the cool-down backwards. Forward k of a rank runs micro-batch
// (k / PV) * P + k mod P on its virtual chunk (k mod PV) / P; backward k the same micro-batch on virtual chunk
// V - 1 - (k mod PV) / P. Calls cfg.validate().
RankOrders interleaved_1f1b_order(const PipelineConfig& cfg);

// Extra ordering the `sync` baseline imposes on top of the dependencies.
enum class Barrier {
    kNone,
    kVitOutside,  // every text op starts after all VF ops end; every VB op starts after all text ops end
};

// Executes `orders` (each rank runs its steps in the given order, each as soon as its rank is free and its
// dependencies are met) and returns the timed schedule. Every (mb, chunk) text op must appear exactly once on
// rank chunk mod P and every ViT piece exactly once on any rank; throws evenep::Error on a missing, duplicate or
// misplaced op and on an order that deadlocks (names the first stuck op of every rank).
Schedule simulate(const PipelineConfig& cfg, const VitWork& vit, const RankOrders& orders,
                  Barrier barrier = Barrier::kNone);

// The independent check of a schedule against the model's rules (not against the simulator): every op present
// once, on an allowed rank, end - start equal to its cost, no two ops of a rank overlapping, every dependency
// (with latency), makespan and per-rank figures consistent. Returns the violations, one line each (empty: valid),
// at most `max_messages`.
std::vector<std::string> validate_schedule(const PipelineConfig& cfg, const VitWork& vit, const Schedule& s,
                                           int max_messages = 20);

// ---------------------------------------------------------------------------------------------------------------
// ViT placement policies.

enum class VitPolicy {
    kNone,     // text only: the ViT work is left out (the reference makespan)
    kSync,     // all ViT forward before the pipeline and all ViT backward after it, LPT over the ranks
    kBubbles,  // K3: ViT forwards placed as late as possible before their deadline into the warm-up bubbles of
               // whichever rank is idle (what does not fit runs up front), ViT backwards as early as possible
               // after their release into the cool-down bubbles (what does not fit runs after the pipeline)
    kOptimal,  // exact optimum of the makespan by MILP (CBC), small cases only
};
const char* to_string(VitPolicy policy);                // "none", "sync", "bubbles", "optimal"
VitPolicy parse_vit_policy(const std::string& name);    // throws evenep::Error naming the value

struct PolicyOptions {
    double time_limit_s = 10.0;  // kOptimal: wall-clock limit of the solver
};

struct PolicyResult {
    Schedule schedule;
    double text_makespan = 0;  // makespan of the text-only schedule (kNone)
    double vit_total = 0;      // all ViT work (0 for kNone)
    double exposed = 0;        // makespan - text_makespan
    double hidden_fraction = 1;  // 1 - exposed / (vit_total / P); 1 when there is no ViT work
    bool optimal = false;      // kOptimal: the solver proved the makespan optimal
    double bound = 0;          // kOptimal: the solver's lower bound on the makespan
    double seconds = 0;        // wall time of the policy
};

// Limits of the exact policy: at most this many ViT pieces (forward + backward) and text ops over all ranks.
inline constexpr int kMaxOptimalPieces = 16;
inline constexpr int kMaxOptimalTextOps = 96;
bool optimal_policy_available();  // false when built without CBC
// Whether kOptimal accepts this instance (sizes within the limits above); the CLI shows "-" otherwise.
bool optimal_policy_fits(const PipelineConfig& cfg, const VitWork& vit);

// Places the ViT work by `policy` and simulates the result. Throws evenep::Error on invalid input, and for
// kOptimal when the instance exceeds the limits or the build has no CBC (kRuntime).
PolicyResult place_vit(const PipelineConfig& cfg, const VitWork& vit, VitPolicy policy,
                       const PolicyOptions& options = {});

// ---------------------------------------------------------------------------------------------------------------
// Images, the ViT cost model and dynamic context parallelism.

// Cost of one ViT block on one image of n patches, forward, in seconds: a*n + c*n^2 + k (attention is the n^2
// term). Gathering the KV of an image split over g CP ranks costs kv_s_per_patch * n * (g - 1) / g per rank.
// Backward = kVitBackwardRatio * forward (compute and communication alike).
struct VitCostModel {
    double a = kVitCostA;
    double c = kVitCostC;
    double k = kVitCostK;
    double kv_s_per_patch = kVitKvSecondsPerPatch;

    double compute(int64_t n) const { return a * n + c * static_cast<double>(n) * n + k; }
    // Per-rank compute of an image split over g ranks: each holds n/g queries against all n keys.
    double compute_split(int64_t n, int g) const { return g == 1 ? compute(n) : compute(n) / g; }
    double comm_split(int64_t n, int g) const { return kv_s_per_patch * static_cast<double>(n) * (g - 1) / g; }
};
inline constexpr double kVitBackwardRatio = 2.0;

// Named image-size mixes (patches per image): "uniform" (all 1024), "mixed" (log-uniform in [256, 4096]),
// "heavy" ("mixed" with 5% very large images of 16384 patches). Throws evenep::Error on an unknown name.
std::vector<std::vector<int64_t>> make_mix(const std::string& name, int m, int images_per_mb, uint64_t seed);
std::vector<std::string> mix_names();

// How assign_images distributes images over bins.
enum class AssignMethod {
    kLpt,    // longest processing time first onto the least-loaded bin
    kExact,  // optimal (minimum max bin load) by branch and bound; at most kMaxExactImages images
};
inline constexpr int kMaxExactImages = 16;
// bin_of[i] for cost[i] over num_bins bins; throws evenep::Error on kExact above the limit.
std::vector<int> assign_images(std::span<const double> cost, int num_bins, AssignMethod method);

// One CP group of C ranks processing a set of images, split into C/g sub-groups of g ranks (g dividing C, chosen
// here: the smallest max per-rank time, ties to less communication). Every image runs either whole on one rank or
// split over all g ranks of one sub-group (each holds n/g patches and gathers the KV of the others); a sub-group
// runs its split images first, all its ranks together, so per-rank sums are finish times. Images are placed
// largest first onto the choice that finishes earliest (kLpt) or optimally (kExact, branch and bound).
// fixed_g > 0: naive CP for comparison, g = fixed_g and every image split.
struct CpGroupResult {
    int C = 1;
    int g = 1;                      // sub-group size used
    std::vector<double> compute;    // [C] per-rank compute seconds (forward)
    std::vector<double> comm;       // [C] per-rank KV-gather seconds (forward)
    std::vector<int> sub_group_of;  // [images] the sub-group of every image
    std::vector<int> rank_of;       // [images] the rank of a whole image, -1 for a split one
};
CpGroupResult dynamic_cp_group(const VitCostModel& model, std::span<const int64_t> patches, int C,
                               AssignMethod method = AssignMethod::kLpt, int fixed_g = 0);

// A step over W ranks: images assigned to the W/C CP groups by LPT on their unsplit cost, then dynamic CP in each
// group. max_over_mean and comm_share are over all W ranks (comm_share = comm / (compute + comm)).
struct CpStepResult {
    int W = 0, C = 1;
    std::vector<int> g_of_group;  // [W/C]
    std::vector<double> rank_time;  // [W] compute + comm
    double max_over_mean = 1;
    double comm_share = 0;
};
CpStepResult dynamic_cp_step(const VitCostModel& model, std::span<const int64_t> patches, int W, int C,
                             int fixed_g = 0);

// ViT pieces of the micro-batches from their images: cost in seconds by `model`, every image of micro-batch i
// split by dynamic CP with group size cp (cp = 1: whole images), then scaled so the total ViT work per rank is
// vit_load times the mean per-rank bubble of the text-only schedule of cfg. Throws evenep::Error naming a bad
// patch count, cp or vit_load.
VitWork vit_work_from_images(const PipelineConfig& cfg, const std::vector<std::vector<int64_t>>& patches,
                             const VitCostModel& model, int cp, double vit_load);

// ---------------------------------------------------------------------------------------------------------------
// Files and pictures.

// --costs FILE: {"forward": number | [m numbers], "backward": ..., "latency": number}; every key optional.
// --images FILE: {"patches": [[n, ...] per micro-batch]} or {"vit_forward": [[cost, ...] per micro-batch]}
// (text units; backward = kVitBackwardRatio * forward). Both throw evenep::Error naming the file and the entry.
void read_costs_file(const std::string& path, PipelineConfig& cfg);
struct ImagesFile {
    std::vector<std::vector<int64_t>> patches;   // when the file gives patches
    std::vector<std::vector<double>> vit_forward;  // when it gives costs
};
ImagesFile read_images_file(const std::string& path, int m);

// The schedule as JSON text, schema "evenep.pipeline/1" (docs/pipeline.md).
std::string schedule_json(const PipelineConfig& cfg, const Schedule& s, const std::string& policy);
// The timeline as SVG: ranks as rows, F light / B dark shaded by micro-batch, ViT work red, bubbles empty.
std::string schedule_svg(const PipelineConfig& cfg, const Schedule& s, const std::string& title);

}  // namespace evenep::pipeline
