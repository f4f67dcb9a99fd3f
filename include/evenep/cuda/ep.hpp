// evenep/cuda/ep.hpp — the CUDA data path of an EP group over any device team (SPEC §3–§5), written once against
// evenep::cuda::Team: R virtual ranks on one GPU (LocalTeam) or one rank per process and GPU (NcclTeam). An Ep
// acts for the ranks its process serves, [team.rank_begin(), +team.num_local_ranks()): every per-rank argument is a
// span with one entry per served rank, in rank order (the local team: R entries; the NCCL team: one).
//
// plan -> dispatch -> (expert compute on recv_x, in place) -> combine, every step an asynchronous launch on the
// caller's stream with no host synchronisation and no allocation, so the whole sequence captures into one CUDA
// graph and replays with the same results. The results are bit-identical to the CPU backend (evenep::cpu):
// the same plan arrays and encoded destinations, the same receive-buffer rows, weights and chain metadata
// (evenep/detail/buffer_layout.hpp), the same combine output (fp32 summation order in src/cuda/kernels/combine.cu).
//
//   LocalTeam team(cfg.R, 0);                 // or NcclTeam team(nccl_bootstrap_from_env(), 0)
//   Ep ep(team, cfg, H);                      // collective: the rank's buffer is a symmetric window of the team
//   EpPlan p = ep.plan(io, s, stream);        // histogram, all-gather, every rank plans, encoded dst
//   ep.dispatch(p, io, stream);               // rows into ep.recv_x(r) of every rank, in group order
//                                             // (precision.fp8: e4m3 rows + scales into recv_x8 / recv_scale)
//   ... expert compute writes y into ep.recv_x(r) (zero-copy); groups: ep.cu_seqlens(r), the plan's group_expert
//   ep.combine(p, io, apply_weights, mode, stream);
// On the local team a call may name its own receive rows (RankIo::rows, BackwardIo::rows: any device memory of
// [NvS, H] bf16 per rank): dispatch then writes the payload rows there and combine reads them there, while the
// chain metadata and weights stay in the buffer (how the PyTorch ops return rows without copying them). Rows
// outside the plan's groups are not written by the call.
//   ep.check(stream);                         // optional: synchronise and surface device-side errors
// Backward (SPEC §4.3, cpu::Buffer::combine_backward / dispatch_backward bit for bit), with the forward's plan:
//   ep.combine_backward(p, bwd, stream);      // dispatch of grad_out: rows into recv_x(r) (no planning)
//   ... expert backward writes gradient rows into recv_x(r) and, optionally, row-weight gradients into recv_w(r)
//   ep.dispatch_backward(p, bwd, mode, stream);  // unweighted combine of recv_x(r) -> grad_x; recv_w -> grad_topk_w
//
// Plans are values. The plan arrays live in each rank's buffer (the kernels read them there); the buffer holds one
// "resident" plan. A call with another plan first copies the current one out (into memory owned by its EpPlan,
// allocated on the first such copy and recycled) unless it is no longer referenced, then copies the given plan in
// (device-to-device, on the call's stream): so a layer's backward uses that layer's plan even when other layers
// planned in between, and a loop that keeps one plan copies nothing. While a graph is being captured no plan is
// copied out (the copy would run at every replay): a plan replaced then can no longer be used (its calls throw);
// copying a plan in is captured (the replay makes that plan resident again, from its copy, which must stay alive).
// Collective calls (the NCCL team: every rank makes the same calls in the same order): the constructor, plan,
// dispatch, combine, combine_backward, dispatch_backward, and Experts::prefetch_weight / reduce_grad.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/config.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/team.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/detail/ep_layout.hpp"
#include "evenep/plan.hpp"

namespace evenep::cuda {

struct EpOptions {
    PlannerMode mode = PlannerMode::kOptimized;
    PlannerKernel planner_kernel = PlannerKernel::kCluster;  // (falls back to kParallel where the shape does not fit)
    int sm_budget = 32;        // SMs per virtual rank for the communication kernels (clamped to co-residency)
    int max_plan_blocks = 64;  // blocks per rank of the plan kernel (sizes the per-block histograms)
    int channel = 0;           // the team channel of the data-path kernels (Experts default to channel 1)
    bool relay = false;        // plans carry the relayed copy tree (Planner::set_relay; docs/relayed-prefetch.md)
    // The auto policy's step-cost coefficients (Config::policy kAuto; Planner::set_auto_model; docs/auto.md): by
    // default the MoonEP layer's (H = 7168, H' = 2048, tp = 128); MoeLayer sets its own layer's (set_auto_model).
    detail::AutoCostModel auto_model = detail::default_auto_cost_model();
    TeamOptions team;          // for the convenience constructors that create their team (DeviceEp, NcclEp)
    // precision.fp8: dispatch sends e4m3 rows + 1x128 scales into recv_x8 / recv_scale (or the caller's
    // RankIo::rows8 / row_scales) instead of bf16 rows into recv_x (bit-identical to cpu::Buffer's FP8 dispatch;
    // H % 128 == 0; ue8m0: power-of-two scales); rows the caller quantised (RankIo::x8 / x_scales) are moved as
    // given. Combine and the backward calls stay bf16; dispatch refuses RankIo::rows. bf16_partials: combine (and
    // dispatch_backward) round the partial of each chain of >= 2 entries to bf16 (push mode sends it as a bf16 row),
    // bit-identical to cpu::Buffer's (docs/fp8.md).
    DataPrecision precision{};
};

// Caller-owned device pointers of one rank for the backward calls.
struct BackwardIo {
    const uint16_t* grad_out = nullptr;  // [S, H] bf16 gradient of the combine output (combine_backward input)
    uint16_t* grad_x = nullptr;          // [S, H] bf16 gradient of the dispatch input (dispatch_backward output)
    float* grad_topk_w = nullptr;        // [S, K] fp32 gathered route-weight gradient; nullptr: not gathered
    const float* grad_recv_w = nullptr;  // [NvS] fp32 gradient of each receive row's weight, copied into recv_w(r)
                                         // by dispatch_backward; nullptr: the caller wrote it into recv_w(r)
    const float* topk_w = nullptr;       // [S, K] fp32 route weights of the forward (recv_w = topk_w)
    uint16_t* rows = nullptr;            // [NvS, H] bf16 receive rows for this call instead of recv_x(r): written
                                         // by combine_backward, read by dispatch_backward (RankIo::rows)
};

struct EpPlanState;  // src/cuda/runtime/ep.cpp
struct EpPlanPool;

// One plan of an Ep (a shared handle: copies refer to the same plan). Empty when default-constructed.
class EpPlan {
  public:
    EpPlan() = default;
    bool valid() const { return state_ != nullptr; }
    uint64_t id() const;                 // unique among the plans of its Ep (1, 2, ...)
    std::span<const int32_t> s() const;  // [R] tokens of every rank
    int64_t s_total() const;             // the group total given to plan(), -1 when the s were equal

  private:
    friend class Ep;
    explicit EpPlan(std::shared_ptr<EpPlanState> state) : state_(std::move(state)) {}
    std::shared_ptr<EpPlanState> state_;
};

class Ep {
  public:
    // Checks the configuration (Config::validate, H % 8, R <= kMaxVirtualRanks, index overflow of the return
    // addresses; throws evenep::Error naming the value) and the team (team.size() == cfg.R).
    static EpLayout check_and_layout(const Config& cfg, int hidden, const EpOptions& options);

    // Collective: allocates every rank's buffer (EpLayout, independent of the routing) as a window of `team`, which
    // must outlive the Ep; the destructor frees it (collective too). Throws evenep::Error on a bad configuration or a
    // CUDA error.
    Ep(Team& team, const Config& cfg, int hidden, const EpOptions& options = {});
    virtual ~Ep();
    Ep(const Ep&) = delete;
    Ep& operator=(const Ep&) = delete;

    const Config& config() const { return cfg_; }
    int hidden() const { return hidden_; }
    const EpOptions& options() const { return options_; }
    // The auto policy's coefficients for the plans launched after this call (CUDA graphs keep the coefficients they
    // were captured with). MoeLayer sets its layer's shape (detail::make_auto_cost_model(H, H', tp)). No sync.
    void set_auto_model(const detail::AutoCostModel& model) {
        options_.auto_model = model;
        layout_.auto_model = model;
    }
    const EpLayout& layout() const { return layout_; }
    Team& team() { return team_; }
    const Team& team() const { return team_; }
    int rank_begin() const { return team_.rank_begin(); }
    int num_local_ranks() const { return team_.num_local_ranks(); }
    void set_sm_budget(int sm_budget);
    // The team view of channel `channel` with peers = this Ep's buffers (for launchers called directly).
    TeamView view(int channel) const;

    // Plans from every served rank's topk_idx (io[i].topk_idx; where io[i].plan is set the planner also writes the
    // rank's row of the plan tensor there, in its last phase; the other pointers are not read). s: [R] tokens of
    // every rank (1..S), the same array on every rank; when they differ, s_total must be their sum (SPEC §1).
    // Checked on the host (throws, nothing launched); bad expert ids are found on the device and reported by
    // check() as Error(kInvalidArgument) naming rank, token, k and value.
    EpPlan plan(std::span<const RankIo> io, std::span<const int32_t> s, cudaStream_t stream, int64_t s_total = -1);
    // io: x and topk_w of every served rank (16-byte aligned x).
    void dispatch(const EpPlan& plan, std::span<const RankIo> io, cudaStream_t stream);
    // io: topk_w, out and out_w (optional) of every served rank.
    void combine(
        const EpPlan& plan, std::span<const RankIo> io, bool apply_weights, CombineMode mode, cudaStream_t stream);
    // combine_backward(grad_out) = dispatch(grad_out) with the plan (no planning): every rank's grad_out rows into
    // recv_x of their destinations, recv_w = topk_w, padding zeroed, duplicates filled.
    void combine_backward(const EpPlan& plan, std::span<const BackwardIo> io, cudaStream_t stream);
    // dispatch_backward(grad_recv) = combine(recv_x(r) as the gradient rows, apply_weights = false, mode) into
    // grad_x, plus grad_topk_w[t*K + k] = the row weight gradient of entry (t, k) (0 for masked entries): first
    // copies grad_recv_w (when set) over recv_w(r) [all NvS rows], then one combine launch. On the NCCL team two
    // combine-type calls in a row with grad_recv_w set are not protected (a slow peer may still gather from the
    // previous call): write the gradient into recv_w(r) instead.
    void dispatch_backward(const EpPlan& plan, std::span<const BackwardIo> io, CombineMode mode, cudaStream_t stream);

    // Makes `plan` the resident plan (copies on `stream` when it is not; see the file comment). The calls above do
    // it themselves; the views below show the resident plan.
    void use(const EpPlan& plan, cudaStream_t stream);
    // Whether `plan` is the resident plan (its arrays are in the buffers; nothing is copied to use it).
    bool is_resident(const EpPlan& plan) const;
    // A new resident plan of `s` (every rank's token count, 1..S) whose arrays the caller writes into the served
    // ranks' plan regions (cuda::unpack_plan, evenep/cuda/expert_ops.hpp): the resident plan is saved first when it
    // is still referenced, as by plan(); nothing is launched. The data-path calls use s as loop bounds only, so a
    // plan adopted with s_pad >= s_r for every rank and dst masked (detail::kMaskedDst) past s_r moves the same rows.
    EpPlan adopt_plan(std::span<const int32_t> s, cudaStream_t stream);

    // Synchronises `stream` and throws evenep::Error for anything the device recorded (Team::check).
    void check(cudaStream_t stream) const { team_.check(stream); }
    int last_blocks_per_rank() const { return last_blocks_; }

    // Device views of rank `rank`'s buffer (`rank` served by this process); plan arrays are the resident plan's.
    char* base(int rank) const;
    uint16_t* recv_x(int rank) const;             // [NvS, H] bf16
    float* recv_w(int rank) const;                // [NvS]
    uint8_t* recv_x8(int rank) const;             // [NvS, H] e4m3 codes (precision.fp8; else no bytes)
    float* recv_scale(int rank) const;            // [NvS, H/128] fp32 scales (precision.fp8; else no bytes)
    const int32_t* cu_seqlens(int rank) const;    // [G] inclusive padded ends of the rank's groups
    const int32_t* group_expert(int rank) const;  // [G] expert of each of the rank's groups
    const int32_t* copies(int rank) const;        // [R*B] the plan's copies table (rank's copy)
    const Window& window() const { return *window_; }

    // Host read-back (synchronous; tests and checks). The plan as rank `rank` computed it.
    Plan download_plan(const EpPlan& plan, int rank) const;
    std::vector<int32_t> download_dst(const EpPlan& plan, int rank) const;  // [s_r*K]
    std::vector<uint16_t> download_recv_x(int rank, int64_t rows) const;    // [rows*H]
    std::vector<float> download_recv_w(int rank, int64_t rows) const;
    std::vector<uint8_t> download_recv_x8(int rank, int64_t rows) const;   // [rows*H] (precision.fp8)
    std::vector<float> download_recv_scale(int rank, int64_t rows) const;  // [rows*H/128] (precision.fp8)
    std::vector<int32_t> download_recv_next(int rank, int64_t rows) const;
    std::vector<int32_t> download_recv_ret(int rank, int64_t rows) const;

  private:
    friend struct EpHooks;  // test and benchmark hooks (evenep/cuda/detail/ep_hooks.hpp)
    template <typename T>
    std::vector<T> download(const char* src, size_t offset, size_t count) const;
    const char* plan_source(const EpPlan& plan, int rank, size_t offset) const;
    int local_index(int rank) const;
    void check_io(std::span<const RankIo> io, bool need_x, const char* call) const;
    void check_rows(const void* rows, int rank, const char* call) const;  // caller-owned receive rows (bf16 or e4m3)
    struct Tables {
        RankIo* eager = nullptr;     // [R] device table of eager calls
        RankIo* graph = nullptr;     // [R] device table of captured calls
        std::vector<RankIo> mirror;  // [num_local] what `eager` holds (empty: nothing yet)
    };
    const RankIo* store_io(Tables& t, std::span<const RankIo> io, cudaStream_t stream);
    void save(EpPlanState& st, cudaStream_t stream);
    std::span<const int32_t> checked_s(const EpPlan& plan, const char* call) const;
    // Saves the resident plan (when referenced) and makes a new plan of `s` resident: what the planner launches
    // write into the buffer.
    EpPlan new_resident_plan(std::span<const int32_t> s, int64_t s_total, cudaStream_t stream);

    Team& team_;
    Config cfg_;
    int hidden_;
    EpOptions options_;
    EpLayout layout_;
    OwnedWindow window_;
    DeviceArray<RankIo> d_tables_;      // one allocation: the four tables below
    Tables fwd_;                        // forward pointers (served entries set by each call)
    Tables bwd_;                        // backward view: x = grad_out, out = grad_x, out_w = grad_topk_w
    std::shared_ptr<EpPlanPool> pool_;  // recycled device copies of plans
    std::weak_ptr<EpPlanState> resident_;
    uint64_t next_plan_id_ = 1;
    int last_blocks_ = 0;
};

// The team of an Ep that owns it, as a base constructed before the Ep and destroyed after it (the Ep frees its
// window into the team).
template <typename T>
struct OwnedTeam {
    std::unique_ptr<T> owned_team;
};

// R virtual ranks on one GPU: an Ep over a LocalTeam it owns (options.team).
class DeviceEp : private OwnedTeam<LocalTeam>, public Ep {
  public:
    DeviceEp(const Config& cfg, int hidden, const EpOptions& options = {});
    LocalTeam& team() { return *owned_team; }
    const LocalTeam& team() const { return *owned_team; }

  private:
    DeviceEp(std::unique_ptr<LocalTeam> team, const Config& cfg, int hidden, const EpOptions& options);
};

}  // namespace evenep::cuda
