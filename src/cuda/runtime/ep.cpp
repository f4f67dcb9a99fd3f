// cuda::Ep: the data path over any device team (include/evenep/cuda/ep.hpp), and DeviceEp (a LocalTeam it owns).
#include "evenep/cuda/ep.hpp"

#include <climits>
#include <cstring>
#include <type_traits>
#include <utility>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/nccl_ep.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

// Device copies of plans that are not resident, [num_local][bytes] each; recycled when their plan is released.
struct EpPlanPool {
    size_t bytes = 0;                    // one copy: all served ranks
    std::vector<DeviceArray<char>> all;  // every copy, in use or free
    std::vector<char*> free;
    char* take() {
        if (!free.empty()) {
            char* p = free.back();
            free.pop_back();
            return p;
        }
        // NOTE: no fill: a copy may be taken while a stream is captured (the save is then a captured copy).
        all.emplace_back(bytes, DeviceFill::kNone);
        return all.back().get();
    }
};

struct EpPlanState {
    const Ep* owner = nullptr;
    uint64_t id = 0;
    std::vector<int32_t> s;
    int64_t s_total = -1;
    std::shared_ptr<EpPlanPool> pool;
    char* copy = nullptr;  // the plan region of every served rank once copied out
    bool lost = false;     // replaced while a graph was being captured, without a copy: unusable
    ~EpPlanState() {
        if (copy) pool->free.push_back(copy);
    }
};

namespace {

// The plan region of a rank's buffer: every array a plan leaves for the data path (histograms, per-block prefixes,
// encoded destinations, the plan arrays); the planner's workspace after it is scratch.
size_t plan_begin(const EpLayout& l) { return l.plan_begin; }
size_t plan_bytes(const EpLayout& l) { return l.plan.work64 - l.plan_begin; }

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    EVENEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    return cs != cudaStreamCaptureStatusNone;
}

}  // namespace

uint64_t EpPlan::id() const {
    EVENEP_CHECK(state_ != nullptr, "cuda ep: empty plan");
    return state_->id;
}
std::span<const int32_t> EpPlan::s() const {
    EVENEP_CHECK(state_ != nullptr, "cuda ep: empty plan");
    return state_->s;
}
int64_t EpPlan::s_total() const {
    EVENEP_CHECK(state_ != nullptr, "cuda ep: empty plan");
    return state_->s_total;
}

EpLayout Ep::check_and_layout(const Config& cfg_in, int hidden, const EpOptions& options) {
    Config cfg = cfg_in;
    cfg.validate();
    EVENEP_CHECK(hidden >= detail::kHiddenAlign && hidden % detail::kHiddenAlign == 0,
                 "cuda ep: hidden size H = ", hidden, " must be a positive multiple of ", detail::kHiddenAlign);
    EVENEP_CHECK(cfg.R <= kMaxVirtualRanks, "cuda ep: R = ", cfg.R, " exceeds ", kMaxVirtualRanks, " ranks");
    EVENEP_CHECK(options.sm_budget >= 1, "cuda ep: sm_budget = ", options.sm_budget, " must be >= 1");
    EVENEP_CHECK(options.max_plan_blocks >= 1, "cuda ep: max_plan_blocks = ", options.max_plan_blocks);
    EVENEP_CHECK(options.channel >= 0 && options.channel < kTeamChannels, "cuda ep: channel = ", options.channel,
                 " outside [0, ", kTeamChannels, ")");
    const DataPrecision& pr = options.precision;
    EVENEP_CHECK(!pr.fp8 || hidden % kFp8Block == 0, "cuda ep: fp8 needs the hidden size H = ", hidden,
                 " to be a multiple of ", kFp8Block, " (one scale per 128 channels)");
    EVENEP_CHECK(pr.fp8 || !pr.ue8m0, "cuda ep: precision.ue8m0 needs precision.fp8");
    EpLayout layout = EpLayout::make(cfg.R, cfg.E, cfg.K, cfg.S, cfg.tp, cfg.num_slots(), hidden,
                                     options.max_plan_blocks, cfg.slack_ppm(), options.precision.fp8);
    layout.auto_slack = cfg.policy == PlannerPolicy::kAuto;
    layout.bf16_partials = pr.bf16_partials;
    layout.auto_model = options.auto_model;
    // Return addresses are int32: R * S * U units must fit.
    const int64_t units = static_cast<int64_t>(cfg.R) * layout.buf.stage_units();
    EVENEP_CHECK(units < INT32_MAX, "cuda ep: R*S*min(K,2R) = ", units, " staging units overflow int32");
    return layout;
}

Ep::Ep(Team& team, const Config& cfg, int hidden, const EpOptions& options)
    : team_(team), cfg_(cfg), hidden_(hidden), options_(options) {
    layout_ = check_and_layout(cfg, hidden, options);
    EVENEP_CHECK(team.size() == cfg.R, "cuda ep: R = ", cfg.R, " but the team has ", team.size(), " ranks");
    window_ = OwnedWindow(team, layout_.total_bytes);
    d_tables_ = DeviceArray<RankIo>(4 * static_cast<size_t>(cfg.R));
    fwd_.eager = d_tables_.get();
    fwd_.graph = d_tables_.get() + cfg.R;
    bwd_.eager = d_tables_.get() + 2 * cfg.R;
    bwd_.graph = d_tables_.get() + 3 * cfg.R;
    // Chain metadata starts as padding everywhere (what the CPU backend's buffer holds before any dispatch).
    std::vector<int32_t> next(layout_.nvs, detail::kChainEnd), ret(layout_.nvs, detail::kRetPadding);
    for (int r = rank_begin(); r < rank_begin() + num_local_ranks(); ++r) {
        EVENEP_CUDA_CHECK(
            cudaMemcpy(base(r) + layout_.recv_next(), next.data(), next.size() * 4, cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(base(r) + layout_.recv_ret(), ret.data(), ret.size() * 4, cudaMemcpyHostToDevice));
    }
    pool_ = std::make_shared<EpPlanPool>();
    pool_->bytes = plan_bytes(layout_) * num_local_ranks();
}

Ep::~Ep() = default;

void Ep::set_sm_budget(int sm_budget) {
    EVENEP_CHECK(sm_budget >= 1, "cuda ep: sm_budget = ", sm_budget, " must be >= 1");
    options_.sm_budget = sm_budget;
}

TeamView Ep::view(int channel) const {
    TeamView v = team_.view(channel);
    v.peers = window_->d_peers;
    return v;
}

int Ep::local_index(int rank) const {
    EVENEP_CHECK(team_.serves(rank), "cuda ep: rank ", rank, " is not served by this process (ranks [", rank_begin(),
                 ", ", rank_begin() + num_local_ranks(), "))");
    return rank - rank_begin();
}

// The served rank's own copy: the first one is Window::local (on the NCCL team the allocation itself; peers[] holds
// its LSA mapping), the local team's others are its peers[] entries (the allocations).
char* Ep::base(int rank) const {
    const int i = local_index(rank);
    return i == 0 ? window_->local : window_->peers[rank];
}

void Ep::check_io(std::span<const RankIo> io, bool need_x, const char* call) const {
    EVENEP_CHECK(static_cast<int>(io.size()) == num_local_ranks(), "cuda ep: ", call, " got ", io.size(),
                 " rank inputs, expected ", num_local_ranks(), " (the ranks this process serves)");
    for (int i = 0; i < num_local_ranks(); ++i) {
        const int r = rank_begin() + i;
        const RankIo& v = io[i];
        if (need_x) {
            const void* x = v.x8 != nullptr ? static_cast<const void*>(v.x8) : v.x;
            EVENEP_CHECK(x && v.topk_w, "cuda ep: ", call, ": rank ", r,
                         ": x (or x8 and x_scales) and topk_w must be device pointers");
            EVENEP_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "cuda ep: ", call, ": rank ", r,
                         ": x must be 16-byte aligned");
        } else {
            EVENEP_CHECK(v.topk_w && v.out, "cuda ep: ", call, ": rank ", r,
                         ": topk_w and out must be device pointers (out_w may be null)");
            EVENEP_CHECK(reinterpret_cast<uintptr_t>(v.out) % 16 == 0, "cuda ep: ", call, ": rank ", r,
                         ": out must be 16-byte aligned");
        }
        check_rows(v.rows, r, call);
    }
}

void Ep::check_rows(const void* rows, int rank, const char* call) const {
    if (rows == nullptr) return;
    EVENEP_CHECK(num_local_ranks() == team_.size(), "cuda ep: ", call, ": rank ", rank,
                 ": caller-owned receive rows need every rank in this process (the local team); this team serves ",
                 num_local_ranks(), " of ", team_.size(), " ranks");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(rows) % 16 == 0, "cuda ep: ", call, ": rank ", rank,
                 ": receive rows must be 16-byte aligned");
}

// The kernels read their pointers from a device table [R]. An eager call stores the served ranks' entries on its
// stream when the table does not hold them already; a call being captured into a graph always stores them, into
// a second table that only graphs use (so a replay never changes what the eager table holds, and each replay
// stores its own pointers right before its kernel). Returns the table the kernel reads.
const RankIo* Ep::store_io(Tables& t, std::span<const RankIo> io, cudaStream_t stream) {
    if (capturing(stream)) {
        launch_store_rank_io(t.graph, rank_begin(), io, stream);
        return t.graph;
    }
    if (t.mirror.size() != io.size() || std::memcmp(t.mirror.data(), io.data(), io.size_bytes()) != 0) {
        launch_store_rank_io(t.eager, rank_begin(), io, stream);
        t.mirror.assign(io.begin(), io.end());
    }
    return t.eager;
}

// Copies the resident plan out before another one replaces it. Not while capturing a graph: a captured copy
// would run at every replay, when the buffer holds whatever plan is resident then; the plan is marked lost instead.
void Ep::save(EpPlanState& st, cudaStream_t stream) {
    if (capturing(stream)) {
        st.lost = true;
        return;
    }
    if (st.copy == nullptr) st.copy = pool_->take();
    const size_t n = plan_bytes(layout_);
    for (int i = 0; i < num_local_ranks(); ++i)
        EVENEP_CUDA_CHECK(cudaMemcpyAsync(st.copy + i * n, base(rank_begin() + i) + plan_begin(layout_), n,
                                          cudaMemcpyDeviceToDevice, stream));
}

void Ep::use(const EpPlan& plan, cudaStream_t stream) {
    EVENEP_CHECK(plan.state_ != nullptr, "cuda ep: empty plan (use the value returned by plan())");
    EVENEP_CHECK(plan.state_->owner == this, "cuda ep: the plan belongs to another Ep");
    const std::shared_ptr<EpPlanState> cur = resident_.lock();
    if (cur == plan.state_) return;
    if (cur && cur->copy == nullptr && !cur->lost) save(*cur, stream);
    const EpPlanState& st = *plan.state_;
    EVENEP_CHECK(!st.lost, "cuda ep: plan ", st.id,
                 " was replaced by a plan made while capturing a graph (no copy is taken then); plan again");
    EVENEP_CHECK_KIND(ErrorKind::kInternal, st.copy != nullptr, "cuda ep: plan ", st.id,
                      " is neither resident nor copied out");
    const size_t n = plan_bytes(layout_);
    for (int i = 0; i < num_local_ranks(); ++i)
        EVENEP_CUDA_CHECK(cudaMemcpyAsync(base(rank_begin() + i) + plan_begin(layout_), st.copy + i * n, n,
                                          cudaMemcpyDeviceToDevice, stream));
    resident_ = plan.state_;
}

bool Ep::is_resident(const EpPlan& plan) const {
    return plan.state_ != nullptr && plan.state_->owner == this && resident_.lock() == plan.state_;
}

EpPlan Ep::adopt_plan(std::span<const int32_t> s, cudaStream_t stream) {
    EVENEP_CHECK(static_cast<int>(s.size()) == cfg_.R, "cuda ep: adopt_plan: s has ", s.size(),
                 " values, expected R = ", cfg_.R);
    for (int r = 0; r < cfg_.R; ++r)
        EVENEP_CHECK(s[r] >= 1 && s[r] <= cfg_.S, "cuda ep: adopt_plan: rank ", r, ": s = ", s[r],
                     " outside [1, S = ", cfg_.S, "]");
    return new_resident_plan(s, -1, stream);
}

std::span<const int32_t> Ep::checked_s(const EpPlan& plan, const char* call) const {
    EVENEP_CHECK(plan.state_ != nullptr, "cuda ep: ", call, " with an empty plan (use the value returned by plan())");
    return plan.state_->s;
}

PlanOptions plan_options(const EpOptions& options) {
    return {
        .locality = options.mode == PlannerMode::kOptimized, .kernel = options.planner_kernel, .relay = options.relay};
}

EpPlan Ep::plan(std::span<const RankIo> io, std::span<const int32_t> s, cudaStream_t stream, int64_t s_total) {
    EVENEP_CHECK(static_cast<int>(io.size()) == num_local_ranks(), "cuda ep: plan got ", io.size(),
                 " rank inputs, expected ", num_local_ranks());
    for (int i = 0; i < num_local_ranks(); ++i)
        EVENEP_CHECK(io[i].topk_idx != nullptr, "cuda ep: plan: rank ", rank_begin() + i,
                     ": topk_idx must be a device pointer");
    EVENEP_CHECK(static_cast<int>(s.size()) == cfg_.R, "cuda ep: s has ", s.size(), " values, expected R = ", cfg_.R);
    check_group_tokens(cfg_, s, s_total);
    PlanOptions po = plan_options(options_);
    for (int i = 0; i < num_local_ranks(); ++i) {
        if (io[i].plan == nullptr) continue;
        EVENEP_CHECK(reinterpret_cast<uintptr_t>(io[i].plan) % alignof(int32_t) == 0, "cuda ep: plan: rank ",
                     rank_begin() + i, ": RankIo::plan must be 4-byte aligned");
        if (po.pack.n == 0) po.pack = plan_pack_columns(cfg_, layout_.plan, "cuda ep: plan");
    }
    EpPlan plan = new_resident_plan(s, s_total, stream);
    const RankIo* d_io = store_io(fwd_, io, stream);
    last_blocks_ = launch_plan(view(options_.channel), layout_, d_io, s, s_total, po, options_.sm_budget, stream);
    return plan;
}

EpPlan Ep::new_resident_plan(std::span<const int32_t> s, int64_t s_total, cudaStream_t stream) {
    const std::shared_ptr<EpPlanState> cur = resident_.lock();
    if (cur && cur->copy == nullptr && !cur->lost) save(*cur, stream);  // the new plan overwrites the region
    auto st = std::make_shared<EpPlanState>();
    st->owner = this;
    st->id = next_plan_id_++;
    st->s.assign(s.begin(), s.end());
    st->s_total = s_total;
    st->pool = pool_;
    resident_ = st;
    return EpPlan(std::move(st));
}

void Ep::dispatch(const EpPlan& plan, std::span<const RankIo> io, cudaStream_t stream) {
    const std::span<const int32_t> s = checked_s(plan, "dispatch");
    check_io(io, true, "dispatch");
    for (size_t i = 0; i < io.size(); ++i) {
        const RankIo& v = io[i];
        const int r = rank_begin() + static_cast<int>(i);
        const bool fp8_io = v.x8 || v.x_scales || v.rows8 || v.row_scales;
        if (!options_.precision.fp8) {
            EVENEP_CHECK(!fp8_io, "cuda ep: dispatch: rank ", r,
                         ": RankIo::x8 / x_scales / rows8 / row_scales are set but the Ep has no precision.fp8");
            continue;
        }
        EVENEP_CHECK(v.rows == nullptr, "cuda ep: dispatch: rank ", r,
                     ": RankIo::rows is set but precision.fp8 sends e4m3 rows (give rows8 and row_scales instead)");
        EVENEP_CHECK((v.x8 == nullptr) == (v.x_scales == nullptr), "cuda ep: dispatch: rank ", r,
                     ": RankIo::x8 and x_scales are set together or not at all");
        EVENEP_CHECK((v.rows8 == nullptr) == (v.row_scales == nullptr), "cuda ep: dispatch: rank ", r,
                     ": RankIo::rows8 and row_scales are set together or not at all");
        EVENEP_CHECK(
            reinterpret_cast<uintptr_t>(v.x_scales) % 4 == 0 && reinterpret_cast<uintptr_t>(v.row_scales) % 4 == 0,
            "cuda ep: dispatch: rank ", r, ": x_scales and row_scales must be 4-byte aligned");
        check_rows(v.rows8, r, "dispatch");
    }
    use(plan, stream);
    const RankIo* d_io = store_io(fwd_, io, stream);
    last_blocks_ =
        launch_dispatch(view(options_.channel), layout_, d_io, s, options_.sm_budget, stream, options_.precision);
}

void Ep::combine(
    const EpPlan& plan, std::span<const RankIo> io, bool apply_weights, CombineMode mode, cudaStream_t stream) {
    const std::span<const int32_t> s = checked_s(plan, "combine");
    check_io(io, false, "combine");
    use(plan, stream);
    const RankIo* d_io = store_io(fwd_, io, stream);
    last_blocks_ =
        launch_combine(view(options_.channel), layout_, d_io, s, apply_weights, mode, options_.sm_budget, stream);
}

namespace {

// The backward calls run the forward kernels on a second RankIo table: dispatch reads x (= grad_out) and topk_w,
// combine writes out (= grad_x) and out_w (= grad_topk_w).
std::vector<RankIo> backward_table(std::span<const BackwardIo> io, int first) {
    std::vector<RankIo> t(io.size());
    for (size_t i = 0; i < io.size(); ++i) {
        EVENEP_CHECK(io[i].grad_out && io[i].grad_x && io[i].topk_w, "cuda ep: rank ", first + static_cast<int>(i),
                     ": grad_out, grad_x and topk_w must be device pointers (grad_topk_w, grad_recv_w may be null)");
        EVENEP_CHECK(reinterpret_cast<uintptr_t>(io[i].grad_out) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(io[i].grad_x) % 16 == 0,
                     "cuda ep: rank ", first + static_cast<int>(i), ": grad_out and grad_x must be 16-byte aligned");
        t[i].x = io[i].grad_out;
        t[i].topk_w = io[i].topk_w;
        t[i].out = io[i].grad_x;
        t[i].out_w = io[i].grad_topk_w;
        t[i].rows = io[i].rows;
    }
    return t;
}

}  // namespace

void Ep::combine_backward(const EpPlan& plan, std::span<const BackwardIo> io, cudaStream_t stream) {
    const std::span<const int32_t> s = checked_s(plan, "combine_backward");
    EVENEP_CHECK(static_cast<int>(io.size()) == num_local_ranks(), "cuda ep: combine_backward got ", io.size(),
                 " rank inputs, expected ", num_local_ranks());
    const std::vector<RankIo> t = backward_table(io, rank_begin());
    for (size_t i = 0; i < t.size(); ++i) check_rows(t[i].rows, rank_begin() + static_cast<int>(i), "combine_backward");
    use(plan, stream);
    const RankIo* d_io = store_io(bwd_, t, stream);
    last_blocks_ = launch_dispatch(view(options_.channel), layout_, d_io, s, options_.sm_budget, stream);
}

// The copy into this rank's recv_w: peers read it (gathered weights) only after the combine kernel's entry barrier,
// and in the intended order (combine_backward, then dispatch_backward) every peer has finished its previous
// combine before the dispatch kernel's barriers.
void Ep::dispatch_backward(const EpPlan& plan, std::span<const BackwardIo> io, CombineMode mode, cudaStream_t stream) {
    const std::span<const int32_t> s = checked_s(plan, "dispatch_backward");
    EVENEP_CHECK(static_cast<int>(io.size()) == num_local_ranks(), "cuda ep: dispatch_backward got ", io.size(),
                 " rank inputs, expected ", num_local_ranks());
    const std::vector<RankIo> t = backward_table(io, rank_begin());
    for (size_t i = 0; i < t.size(); ++i) check_rows(t[i].rows, rank_begin() + static_cast<int>(i), "dispatch_backward");
    use(plan, stream);
    for (int i = 0; i < num_local_ranks(); ++i) {
        float* rw = recv_w(rank_begin() + i);
        if (io[i].grad_recv_w != nullptr && io[i].grad_recv_w != rw)
            EVENEP_CUDA_CHECK(cudaMemcpyAsync(rw, io[i].grad_recv_w, static_cast<size_t>(layout_.nvs) * 4,
                                              cudaMemcpyDeviceToDevice, stream));
    }
    const RankIo* d_io = store_io(bwd_, t, stream);
    last_blocks_ = launch_combine(view(options_.channel), layout_, d_io, s, false, mode, options_.sm_budget, stream);
}

uint16_t* Ep::recv_x(int rank) const { return reinterpret_cast<uint16_t*>(base(rank) + layout_.recv_x()); }
float* Ep::recv_w(int rank) const { return reinterpret_cast<float*>(base(rank) + layout_.recv_w()); }
uint8_t* Ep::recv_x8(int rank) const { return reinterpret_cast<uint8_t*>(base(rank) + layout_.recv_x8()); }
float* Ep::recv_scale(int rank) const { return reinterpret_cast<float*>(base(rank) + layout_.recv_scale()); }
const int32_t* Ep::cu_seqlens(int rank) const {
    return reinterpret_cast<const int32_t*>(base(rank) + layout_.plan.cu_seqlens) +
           static_cast<size_t>(rank) * layout_.G;
}
const int32_t* Ep::group_expert(int rank) const {
    return reinterpret_cast<const int32_t*>(base(rank) + layout_.plan.group_expert) +
           static_cast<size_t>(rank) * layout_.G;
}
const int32_t* Ep::copies(int rank) const { return reinterpret_cast<const int32_t*>(base(rank) + layout_.plan.copies); }

template <typename T>
std::vector<T> Ep::download(const char* src, size_t offset, size_t count) const {
    std::vector<T> v(count);
    if (count) EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), src + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Where rank `rank`'s copy of the plan region starts, offset so that `src + offset` addresses the array at the
// layout offset `offset`: the buffer when the plan is resident, else its copy.
const char* Ep::plan_source(const EpPlan& plan, int rank, size_t) const {
    EVENEP_CHECK(plan.state_ != nullptr && plan.state_->owner == this, "cuda ep: download of an empty or foreign plan");
    const int i = local_index(rank);
    if (resident_.lock() == plan.state_) return base(rank);
    EVENEP_CHECK(!plan.state_->lost, "cuda ep: download of a plan replaced while capturing a graph");
    EVENEP_CHECK_KIND(ErrorKind::kInternal, plan.state_->copy != nullptr,
                      "cuda ep: plan is neither resident nor saved");
    return plan.state_->copy + static_cast<size_t>(i) * plan_bytes(layout_) - plan_begin(layout_);
}

Plan Ep::download_plan(const EpPlan& plan, int rank) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const char* src = plan_source(plan, rank, 0);
    // The arrays' offsets in list order (evenep::for_each_array over PlanOffsets), then every array of the Plan.
    std::vector<std::pair<size_t, size_t>> offsets;  // (byte offset, element bytes)
    PlanOffsets o = layout_.plan;
    for_each_array(o, [&](const char*, PlanExtent, auto& off) {
        offsets.emplace_back(off.at, sizeof(typename std::decay_t<decltype(off)>::value_type));
    });
    Plan p;
    p.cfg = cfg_;
    p.mode = options_.mode;
    size_t i = 0;
    for_each_array(p, [&](const char* name, PlanExtent x, auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        EVENEP_CHECK_KIND(ErrorKind::kInternal, offsets[i].second == sizeof(T), "cuda ep: plan array ", name,
                          " has ", sizeof(T), "-byte values on the host, ", offsets[i].second, " on the device");
        v.resize(plan_extent_size(cfg_, x));
        if (!v.empty())
            EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), src + offsets[i].first, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
        ++i;
    });
    const std::vector<int64_t> cost = download<int64_t>(src, o.cost, kPlanCostWords);
    p.cost = PlanCost{cost[0], cost[1], cost[2], cost[3], cost[4], cost[5]};
    p.slack_ppm = static_cast<int32_t>(cost[kPlanCostSlackWord]);
    return p;
}

std::vector<int32_t> Ep::download_dst(const EpPlan& plan, int rank) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(plan_source(plan, rank, 0), layout_.dst, static_cast<size_t>(plan.s()[rank]) * cfg_.K);
}
std::vector<uint16_t> Ep::download_recv_x(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<uint16_t>(base(rank), layout_.recv_x(), static_cast<size_t>(rows) * hidden_);
}
std::vector<uint8_t> Ep::download_recv_x8(int rank, int64_t rows) const {
    EVENEP_CHECK(layout_.buf.fp8, "cuda ep: download_recv_x8 needs precision.fp8");
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<uint8_t>(base(rank), layout_.recv_x8(), static_cast<size_t>(rows) * hidden_);
}
std::vector<float> Ep::download_recv_scale(int rank, int64_t rows) const {
    EVENEP_CHECK(layout_.buf.fp8, "cuda ep: download_recv_scale needs precision.fp8");
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<float>(base(rank), layout_.recv_scale(), static_cast<size_t>(rows * layout_.buf.scales_per_row()));
}
std::vector<float> Ep::download_recv_w(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<float>(base(rank), layout_.recv_w(), static_cast<size_t>(rows));
}
std::vector<int32_t> Ep::download_recv_next(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(base(rank), layout_.recv_next(), static_cast<size_t>(rows));
}
std::vector<int32_t> Ep::download_recv_ret(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(base(rank), layout_.recv_ret(), static_cast<size_t>(rows));
}

// ---- DeviceEp ----

DeviceEp::DeviceEp(const Config& cfg, int hidden, const EpOptions& options)
    : DeviceEp((check_and_layout(cfg, hidden, options), std::make_unique<LocalTeam>(cfg.R, 0, options.team)),
               cfg,
               hidden,
               options) {}

DeviceEp::DeviceEp(std::unique_ptr<LocalTeam> team, const Config& cfg, int hidden, const EpOptions& options)
    : OwnedTeam<LocalTeam>{std::move(team)}, Ep(*owned_team, cfg, hidden, options) {}

// ---- NcclEp ----

namespace {
std::unique_ptr<NcclTeam> make_nccl_team(const Config& cfg,
                                         int hidden,
                                         const NcclBootstrap& boot,
                                         const EpOptions& options) {
    Ep::check_and_layout(cfg, hidden, options);
    EVENEP_CHECK(cfg.R == boot.world_size, "nccl ep: R = ", cfg.R, " but the group has ", boot.world_size,
                 " processes (WORLD_SIZE)");
    return std::make_unique<NcclTeam>(boot, 0, options.team);
}
}  // namespace

NcclEp::NcclEp(const Config& cfg, int hidden, const NcclBootstrap& boot, const EpOptions& options)
    : NcclEp(make_nccl_team(cfg, hidden, boot, options), cfg, hidden, options) {}

NcclEp::NcclEp(std::unique_ptr<NcclTeam> team, const Config& cfg, int hidden, const EpOptions& options)
    : OwnedTeam<NcclTeam>{std::move(team)}, Ep(*owned_team, cfg, hidden, options) {}

}  // namespace evenep::cuda
