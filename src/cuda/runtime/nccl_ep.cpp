// NcclEp and NcclExperts: one rank of a multi-process EP group (include/evenep/cuda/nccl_ep.hpp). The kernels are
// the local team's (src/cuda/kernels); only the team view differs (this rank's blocks, LSA peers, system scope).
#include "evenep/cuda/nccl_ep.hpp"

#include <climits>
#include <cstring>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/launchers.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

NcclEp::NcclEp(const Config& cfg, int hidden, const NcclBootstrap& boot, const EpOptions& options)
    : cfg_(cfg), hidden_(hidden), options_(options) {
    cfg_.validate();
    EVENEP_CHECK(cfg_.R == boot.world_size, "nccl ep: R = ", cfg_.R, " but the group has ", boot.world_size,
                 " processes (WORLD_SIZE)");
    EVENEP_CHECK(hidden >= detail::kHiddenAlign && hidden % detail::kHiddenAlign == 0,
                 "nccl ep: hidden size H = ", hidden, " must be a positive multiple of ", detail::kHiddenAlign);
    EVENEP_CHECK(cfg_.R <= kMaxVirtualRanks, "nccl ep: R = ", cfg_.R, " exceeds ", kMaxVirtualRanks, " ranks");
    EVENEP_CHECK(options.sm_budget >= 1, "nccl ep: sm_budget = ", options.sm_budget, " must be >= 1");
    EVENEP_CHECK(options.max_plan_blocks >= 1, "nccl ep: max_plan_blocks = ", options.max_plan_blocks);
    layout_ =
        EpLayout::make(cfg_.R, cfg_.E, cfg_.K, cfg_.S, cfg_.tp, cfg_.num_slots(), hidden, options.max_plan_blocks);
    const int64_t units = static_cast<int64_t>(cfg_.R) * layout_.buf.stage_units();
    EVENEP_CHECK(units < INT32_MAX, "nccl ep: R*S*min(K,2R) = ", units, " staging units overflow int32");
    team_ = std::make_unique<NcclTeam>(boot, layout_.total_bytes, options.team);
    EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_io_), sizeof(RankIo) * cfg_.R));
    EVENEP_CUDA_CHECK(cudaMemset(d_io_, 0, sizeof(RankIo) * cfg_.R));
    EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_bwd_io_), sizeof(RankIo) * cfg_.R));
    EVENEP_CUDA_CHECK(cudaMemset(d_bwd_io_, 0, sizeof(RankIo) * cfg_.R));
    // Chain metadata starts as padding everywhere (what the CPU backend's buffer holds before any dispatch).
    std::vector<int32_t> next(layout_.nvs, detail::kChainEnd), ret(layout_.nvs, detail::kRetPadding);
    EVENEP_CUDA_CHECK(cudaMemcpy(base() + layout_.recv_next(), next.data(), next.size() * 4, cudaMemcpyHostToDevice));
    EVENEP_CUDA_CHECK(cudaMemcpy(base() + layout_.recv_ret(), ret.data(), ret.size() * 4, cudaMemcpyHostToDevice));
    s_.assign(cfg_.R, 0);
}

NcclEp::~NcclEp() {
    cudaFree(d_bwd_io_);
    cudaFree(d_io_);
}

void NcclEp::set_sm_budget(int sm_budget) {
    EVENEP_CHECK(sm_budget >= 1, "nccl ep: sm_budget = ", sm_budget, " must be >= 1");
    options_.sm_budget = sm_budget;
}

void NcclEp::bind(const RankIo& io) {
    EVENEP_CHECK(io.x && io.topk_idx && io.topk_w && io.out, "nccl ep: rank ", rank(),
                 ": x, topk_idx, topk_w and out must be device pointers (out_w may be null)");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(io.x) % 16 == 0 && reinterpret_cast<uintptr_t>(io.out) % 16 == 0,
                 "nccl ep: rank ", rank(), ": x and out must be 16-byte aligned");
    EVENEP_CUDA_CHECK(cudaMemcpy(d_io_ + rank(), &io, sizeof(RankIo), cudaMemcpyHostToDevice));
    io_ = io;
    bound_ = true;
    if (bwd_bound_) upload_backward_io();
}

void NcclEp::bind_backward(const BackwardIo& io) {
    EVENEP_CHECK(bound_, "nccl ep: rank ", rank(), ": bind_backward before bind");
    EVENEP_CHECK(io.grad_out && io.grad_x, "nccl ep: rank ", rank(),
                 ": grad_out and grad_x must be device pointers (grad_topk_w, grad_recv_w may be null)");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(io.grad_out) % 16 == 0 && reinterpret_cast<uintptr_t>(io.grad_x) % 16 == 0,
                 "nccl ep: rank ", rank(), ": grad_out and grad_x must be 16-byte aligned");
    bwd_ = io;
    bwd_bound_ = true;
    upload_backward_io();
}

void NcclEp::upload_backward_io() {
    RankIo t = io_;
    t.x = bwd_.grad_out;
    t.out = bwd_.grad_x;
    t.out_w = bwd_.grad_topk_w;
    EVENEP_CUDA_CHECK(cudaMemcpy(d_bwd_io_ + rank(), &t, sizeof(RankIo), cudaMemcpyHostToDevice));
}

void NcclEp::plan(std::span<const int32_t> s, cudaStream_t stream, int64_t s_total) {
    EVENEP_CHECK(bound_, "nccl ep: plan before bind");
    EVENEP_CHECK(static_cast<int>(s.size()) == cfg_.R, "nccl ep: s has ", s.size(), " values, expected R = ", cfg_.R);
    check_group_tokens(cfg_, s, s_total);
    last_blocks_ = launch_plan(team_->view(), layout_, d_io_, s, s_total, options_.mode == PlannerMode::kOptimized,
                               options_.planner_kernel, options_.sm_budget, stream);
    s_.assign(s.begin(), s.end());
    planned_ = true;
}

void NcclEp::dispatch(cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "nccl ep: dispatch before plan");
    last_blocks_ = launch_dispatch(team_->view(), layout_, d_io_, s_, options_.sm_budget, stream);
}

void NcclEp::combine(bool apply_weights, CombineMode mode, cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "nccl ep: combine before plan");
    last_blocks_ = launch_combine(team_->view(), layout_, d_io_, s_, apply_weights, mode, options_.sm_budget, stream);
}

void NcclEp::combine_backward(cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "nccl ep: combine_backward before plan");
    EVENEP_CHECK(bwd_bound_, "nccl ep: rank ", rank(), ": combine_backward before bind_backward");
    last_blocks_ = launch_dispatch(team_->view(), layout_, d_bwd_io_, s_, options_.sm_budget, stream);
}

// The copy into this rank's recv_w: peers read it (gathered weights) only after the combine kernel's entry barrier,
// and in the intended order (combine_backward, then dispatch_backward) every peer has finished its previous
// combine before the dispatch kernel's barriers. Two combine-type calls in a row with grad_recv_w set are not
// protected (a slow peer may still gather from the previous call): write the gradient into recv_w() instead.
void NcclEp::dispatch_backward(CombineMode mode, cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "nccl ep: dispatch_backward before plan");
    EVENEP_CHECK(bwd_bound_, "nccl ep: rank ", rank(), ": dispatch_backward before bind_backward");
    if (bwd_.grad_recv_w != nullptr && bwd_.grad_recv_w != recv_w())
        EVENEP_CUDA_CHECK(cudaMemcpyAsync(recv_w(), bwd_.grad_recv_w, static_cast<size_t>(layout_.nvs) * 4,
                                          cudaMemcpyDeviceToDevice, stream));
    last_blocks_ = launch_combine(team_->view(), layout_, d_bwd_io_, s_, false, mode, options_.sm_budget, stream);
}

uint16_t* NcclEp::recv_x() const { return reinterpret_cast<uint16_t*>(base() + layout_.recv_x()); }
float* NcclEp::recv_w() const { return reinterpret_cast<float*>(base() + layout_.recv_w()); }
const int32_t* NcclEp::cu_seqlens() const {
    return reinterpret_cast<const int32_t*>(base() + layout_.plan.cu_seqlens) + static_cast<size_t>(rank()) * layout_.G;
}
const int32_t* NcclEp::copies() const { return reinterpret_cast<const int32_t*>(base() + layout_.plan.copies); }

template <typename T>
std::vector<T> NcclEp::download(size_t offset, size_t count) const {
    std::vector<T> v(count);
    if (count) EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), base() + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

Plan NcclEp::download_plan() const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const int R = cfg_.R, E = cfg_.E, G = cfg_.num_groups(), B = cfg_.num_slots();
    const PlanOffsets& o = layout_.plan;
    Plan p;
    p.cfg = cfg_;
    p.mode = options_.mode;
    p.s = download<int32_t>(o.s, R);
    p.tpe = download<int32_t>(layout_.tpe, static_cast<size_t>(R) * E);
    p.expert_load = download<int64_t>(o.expert_load, E);
    p.load_before = download<int64_t>(o.load_before, R);
    p.q = download<int32_t>(o.q, R);
    p.alloc = download<int32_t>(o.alloc, static_cast<size_t>(E) * R);
    p.local_keep = download<int32_t>(o.local_keep, static_cast<size_t>(E) * R);
    p.rest_prefix = download<int32_t>(o.rest_prefix, static_cast<size_t>(E) * (R + 1));
    p.cap_prefix = download<int32_t>(o.cap_prefix, static_cast<size_t>(E) * (R + 1));
    p.seg_row = download<int32_t>(o.seg_row, static_cast<size_t>(R) * E);
    p.group_expert = download<int32_t>(o.group_expert, static_cast<size_t>(R) * G);
    p.group_count = download<int32_t>(o.group_count, static_cast<size_t>(R) * G);
    p.cu_seqlens = download<int32_t>(o.cu_seqlens, static_cast<size_t>(R) * G);
    const std::vector<int8_t> src = download<int8_t>(o.group_source, static_cast<size_t>(R) * G);
    p.group_source.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) p.group_source[i] = static_cast<WeightSource>(src[i]);
    p.group_slot = download<int32_t>(o.group_slot, static_cast<size_t>(R) * G);
    p.copies = download<int32_t>(o.copies, static_cast<size_t>(R) * B);
    p.remote_experts = download<int32_t>(o.remote_experts, R);
    p.copies_received = download<int32_t>(o.copies_received, R);
    p.copies_pushed = download<int32_t>(o.copies_pushed, R);
    p.peer_reads = download<int32_t>(o.peer_reads, R);
    p.crossing_out = download<int64_t>(o.crossing_out, R);
    const std::vector<int64_t> cost = download<int64_t>(o.cost, 4);
    p.cost = PlanCost{cost[0], cost[1], cost[2], cost[3]};
    return p;
}

std::vector<int32_t> NcclEp::download_dst() const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(layout_.dst, static_cast<size_t>(s_.at(rank())) * cfg_.K);
}
std::vector<uint16_t> NcclEp::download_recv_x(int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<uint16_t>(layout_.recv_x(), static_cast<size_t>(rows) * hidden_);
}
std::vector<float> NcclEp::download_recv_w(int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<float>(layout_.recv_w(), static_cast<size_t>(rows));
}
std::vector<int32_t> NcclEp::download_recv_next(int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(layout_.recv_next(), static_cast<size_t>(rows));
}
std::vector<int32_t> NcclEp::download_recv_ret(int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(layout_.recv_ret(), static_cast<size_t>(rows));
}

// ---- NcclExperts ----

NcclExperts::NcclExperts(NcclEp& ep, const ExpertsShape& shape)
    : shape_(shape), R_(ep.config().R), epn_(ep.config().epn()), B_(ep.config().num_slots()) {
    EVENEP_CHECK(shape.num_projections >= 1 && shape.num_projections <= 3,
                 "experts: num_projections = ", shape.num_projections, " outside [1, 3]");
    EVENEP_CHECK(shape.elems > 0 && shape.elems % 8 == 0, "experts: elements per matrix = ", shape.elems,
                 " must be a positive multiple of 8");
    // The regions of DeviceExperts (evenep/cuda/experts.hpp), in one symmetric window.
    const size_t P = shape.num_projections, n = static_cast<size_t>(shape.elems);
    auto region = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    size_t o = 0;
    off_.weights = o;
    if (shape.with_weights) o += region(P * epn_ * n * 2);
    off_.slots = o;
    if (shape.with_weights) o += region(P * B_ * n * 2);
    off_.slot_grads = o;
    if (shape.with_grads) o += region(P * B_ * n * 4);
    off_.grads = o;
    if (shape.with_grads) o += region(P * epn_ * n * 4);
    off_.total = o > 0 ? o : 256;
    window_ = &ep.team().alloc_window(off_.total);
}

char* NcclExperts::at(size_t region, int n, int proj, int index, size_t elem_bytes) const {
    EVENEP_CHECK(proj >= 0 && proj < shape_.num_projections && index >= 0 && index < n, "experts: (projection ", proj,
                 ", index ", index, ") out of range");
    return window_->local + region + (static_cast<size_t>(proj) * n + index) * shape_.elems * elem_bytes;
}

uint16_t* NcclExperts::weight(int proj, int local_expert) const {
    EVENEP_CHECK(shape_.with_weights, "experts: allocated without weights");
    return reinterpret_cast<uint16_t*>(at(off_.weights, epn_, proj, local_expert, 2));
}
uint16_t* NcclExperts::slot(int proj, int slot) const {
    EVENEP_CHECK(shape_.with_weights, "experts: allocated without weights");
    return reinterpret_cast<uint16_t*>(at(off_.slots, B_, proj, slot, 2));
}
float* NcclExperts::slot_grad(int proj, int slot) const {
    EVENEP_CHECK(shape_.with_grads, "experts: allocated without gradients");
    return reinterpret_cast<float*>(at(off_.slot_grads, B_, proj, slot, 4));
}
float* NcclExperts::grad(int proj, int local_expert) const {
    EVENEP_CHECK(shape_.with_grads, "experts: allocated without gradients");
    return reinterpret_cast<float*>(at(off_.grads, epn_, proj, local_expert, 4));
}

void NcclExperts::prefetch_weight(NcclEp& ep, cudaStream_t stream, int channel) {
    EVENEP_CHECK(shape_.with_weights, "prefetch_weight: experts allocated without weights");
    EVENEP_CHECK(ep.config().R == R_ && ep.config().num_slots() == B_,
                 "prefetch_weight: experts sized for another group");
    const ExpertsView v{window_->d_peers, off_.weights,           off_.slots,  off_.slot_grads,
                        off_.grads,       shape_.num_projections, shape_.elems};
    last_blocks_ = launch_prefetch_weight(ep.team().view(channel), ep.layout(), v, ep.options().sm_budget, stream);
}

void NcclExperts::reduce_grad(NcclEp& ep, cudaStream_t stream, int channel) {
    EVENEP_CHECK(shape_.with_grads, "reduce_grad: experts allocated without gradients");
    EVENEP_CHECK(ep.config().R == R_ && ep.config().num_slots() == B_, "reduce_grad: experts sized for another group");
    const ExpertsView v{window_->d_peers, off_.weights,           off_.slots,  off_.slot_grads,
                        off_.grads,       shape_.num_projections, shape_.elems};
    last_blocks_ = launch_reduce_grad(ep.team().view(channel), ep.layout(), v, ep.options().sm_budget, stream);
}

}  // namespace evenep::cuda
