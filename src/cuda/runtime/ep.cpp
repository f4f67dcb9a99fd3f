// DeviceEp: R virtual ranks on one GPU (include/evenep/cuda/ep.hpp).
#include "evenep/cuda/ep.hpp"

#include <cstring>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/launchers.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

DeviceEp::DeviceEp(const Config& cfg, int hidden, const EpOptions& options)
    : cfg_(cfg), hidden_(hidden), options_(options) {
    cfg_.validate();
    EVENEP_CHECK(hidden >= detail::kHiddenAlign && hidden % detail::kHiddenAlign == 0,
                 "cuda ep: hidden size H = ", hidden, " must be a positive multiple of ", detail::kHiddenAlign);
    EVENEP_CHECK(cfg_.R <= kMaxVirtualRanks, "cuda ep: R = ", cfg_.R, " exceeds ", kMaxVirtualRanks, " virtual ranks");
    EVENEP_CHECK(options.sm_budget >= 1, "cuda ep: sm_budget = ", options.sm_budget, " must be >= 1");
    EVENEP_CHECK(options.max_plan_blocks >= 1, "cuda ep: max_plan_blocks = ", options.max_plan_blocks);
    layout_ =
        EpLayout::make(cfg_.R, cfg_.E, cfg_.K, cfg_.S, cfg_.tp, cfg_.num_slots(), hidden, options.max_plan_blocks);
    // Return addresses are int32: R * S * U units must fit.
    const int64_t units = static_cast<int64_t>(cfg_.R) * layout_.buf.stage_units();
    EVENEP_CHECK(units < INT32_MAX, "cuda ep: R*S*min(K,2R) = ", units, " staging units overflow int32");
    team_ = std::make_unique<LocalTeam>(cfg_.R, layout_.total_bytes, options.team);
    EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_io_), sizeof(RankIo) * cfg_.R));
    EVENEP_CUDA_CHECK(cudaMemset(d_io_, 0, sizeof(RankIo) * cfg_.R));
    EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_bwd_io_), sizeof(RankIo) * cfg_.R));
    EVENEP_CUDA_CHECK(cudaMemset(d_bwd_io_, 0, sizeof(RankIo) * cfg_.R));
    // Chain metadata starts as padding everywhere (what the CPU backend's buffer holds before any dispatch).
    std::vector<int32_t> next(layout_.nvs, detail::kChainEnd), ret(layout_.nvs, detail::kRetPadding);
    for (int r = 0; r < cfg_.R; ++r) {
        EVENEP_CUDA_CHECK(
            cudaMemcpy(base(r) + layout_.recv_next(), next.data(), next.size() * 4, cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(base(r) + layout_.recv_ret(), ret.data(), ret.size() * 4, cudaMemcpyHostToDevice));
    }
    s_.assign(cfg_.R, 0);
}

DeviceEp::~DeviceEp() {
    cudaFree(d_bwd_io_);
    cudaFree(d_io_);
}

void DeviceEp::set_sm_budget(int sm_budget) {
    EVENEP_CHECK(sm_budget >= 1, "cuda ep: sm_budget = ", sm_budget, " must be >= 1");
    options_.sm_budget = sm_budget;
}

void DeviceEp::bind(std::span<const RankIo> io) {
    EVENEP_CHECK(static_cast<int>(io.size()) == cfg_.R, "cuda ep: bind got ", io.size(),
                 " ranks, expected R = ", cfg_.R);
    for (int r = 0; r < cfg_.R; ++r) {
        EVENEP_CHECK(io[r].x && io[r].topk_idx && io[r].topk_w && io[r].out, "cuda ep: rank ", r,
                     ": x, topk_idx, topk_w and out must be device pointers (out_w may be null)");
        EVENEP_CHECK(reinterpret_cast<uintptr_t>(io[r].x) % 16 == 0 && reinterpret_cast<uintptr_t>(io[r].out) % 16 == 0,
                     "cuda ep: rank ", r, ": x and out must be 16-byte aligned");
    }
    EVENEP_CUDA_CHECK(cudaMemcpy(d_io_, io.data(), sizeof(RankIo) * cfg_.R, cudaMemcpyHostToDevice));
    io_.assign(io.begin(), io.end());
    bound_ = true;
    if (!bwd_.empty()) upload_backward_io();
}

void DeviceEp::bind_backward(std::span<const BackwardIo> io) {
    EVENEP_CHECK(bound_, "cuda ep: bind_backward before bind");
    EVENEP_CHECK(static_cast<int>(io.size()) == cfg_.R, "cuda ep: bind_backward got ", io.size(),
                 " ranks, expected R = ", cfg_.R);
    for (int r = 0; r < cfg_.R; ++r) {
        EVENEP_CHECK(io[r].grad_out && io[r].grad_x, "cuda ep: rank ", r,
                     ": grad_out and grad_x must be device pointers (grad_topk_w, grad_recv_w may be null)");
        EVENEP_CHECK(reinterpret_cast<uintptr_t>(io[r].grad_out) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(io[r].grad_x) % 16 == 0,
                     "cuda ep: rank ", r, ": grad_out and grad_x must be 16-byte aligned");
    }
    bwd_.assign(io.begin(), io.end());
    upload_backward_io();
}

// The backward calls run the forward kernels on a second RankIo table: dispatch reads x (= grad_out) and topk_w,
// combine writes out (= grad_x) and out_w (= grad_topk_w).
void DeviceEp::upload_backward_io() {
    std::vector<RankIo> t(io_);
    for (int r = 0; r < cfg_.R; ++r) {
        t[r].x = bwd_[r].grad_out;
        t[r].out = bwd_[r].grad_x;
        t[r].out_w = bwd_[r].grad_topk_w;
    }
    EVENEP_CUDA_CHECK(cudaMemcpy(d_bwd_io_, t.data(), sizeof(RankIo) * cfg_.R, cudaMemcpyHostToDevice));
}

void DeviceEp::plan(std::span<const int32_t> s, cudaStream_t stream, int64_t s_total) {
    EVENEP_CHECK(bound_, "cuda ep: plan before bind");
    EVENEP_CHECK(static_cast<int>(s.size()) == cfg_.R, "cuda ep: s has ", s.size(), " values, expected R = ", cfg_.R);
    check_group_tokens(cfg_, s, s_total);
    last_blocks_ = launch_plan(team_->view(), layout_, d_io_, s, s_total, options_.mode == PlannerMode::kOptimized,
                               options_.planner_kernel, options_.sm_budget, stream);
    s_.assign(s.begin(), s.end());
    planned_ = true;
}

void DeviceEp::plan_from_tpe(
    std::span<const int32_t> tpe, std::span<const int32_t> s, cudaStream_t stream, int rank_begin, int num_ranks) {
    const size_t RE = static_cast<size_t>(cfg_.R) * cfg_.E;
    EVENEP_CHECK(tpe.size() == RE, "plan: tpe has ", tpe.size(), " values, expected R*E = ", RE);
    EVENEP_CHECK(static_cast<int>(s.size()) == cfg_.R, "plan: s has ", s.size(), " values, expected R = ", cfg_.R);
    for (int r = 0; r < cfg_.R; ++r) {
        int64_t row = 0;
        for (int e = 0; e < cfg_.E; ++e) {
            const int32_t v = tpe[static_cast<size_t>(r) * cfg_.E + e];
            EVENEP_CHECK(v >= 0, "plan: rank ", r, ": tpe[", e, "] = ", v, " is negative");
            row += v;
        }
        EVENEP_CHECK(s[r] >= 1 && s[r] <= cfg_.S, "plan: rank ", r, ": s = ", s[r], " outside [1, S = ", cfg_.S, "]");
        EVENEP_CHECK(row <= static_cast<int64_t>(s[r]) * cfg_.K, "plan: rank ", r, ": ", row,
                     " routed entries exceed s*K = ", static_cast<int64_t>(s[r]) * cfg_.K);
    }
    if (num_ranks < 0) num_ranks = cfg_.R - rank_begin;
    for (int r = rank_begin; r < rank_begin + num_ranks; ++r)
        EVENEP_CUDA_CHECK(cudaMemcpy(base(r) + layout_.tpe, tpe.data(), RE * 4, cudaMemcpyHostToDevice));
    launch_plan_only(team_->view(), layout_, s, options_.mode == PlannerMode::kOptimized, options_.planner_kernel,
                     rank_begin, num_ranks, stream);
    s_.assign(s.begin(), s.end());
    planned_ = true;
}

void DeviceEp::dispatch(cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "cuda ep: dispatch before plan");
    last_blocks_ = launch_dispatch(team_->view(), layout_, d_io_, s_, options_.sm_budget, stream);
}

void DeviceEp::combine(bool apply_weights, CombineMode mode, cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "cuda ep: combine before plan");
    last_blocks_ = launch_combine(team_->view(), layout_, d_io_, s_, apply_weights, mode, options_.sm_budget, stream);
}

void DeviceEp::combine_backward(cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "cuda ep: combine_backward before plan");
    EVENEP_CHECK(!bwd_.empty(), "cuda ep: combine_backward before bind_backward");
    last_blocks_ = launch_dispatch(team_->view(), layout_, d_bwd_io_, s_, options_.sm_budget, stream);
}

void DeviceEp::dispatch_backward(CombineMode mode, cudaStream_t stream) {
    EVENEP_CHECK(planned_ && bound_, "cuda ep: dispatch_backward before plan");
    EVENEP_CHECK(!bwd_.empty(), "cuda ep: dispatch_backward before bind_backward");
    for (int r = 0; r < cfg_.R; ++r)
        if (bwd_[r].grad_recv_w != nullptr && bwd_[r].grad_recv_w != recv_w(r))
            EVENEP_CUDA_CHECK(cudaMemcpyAsync(recv_w(r), bwd_[r].grad_recv_w, static_cast<size_t>(layout_.nvs) * 4,
                                              cudaMemcpyDeviceToDevice, stream));
    last_blocks_ = launch_combine(team_->view(), layout_, d_bwd_io_, s_, false, mode, options_.sm_budget, stream);
}

uint16_t* DeviceEp::recv_x(int rank) const { return reinterpret_cast<uint16_t*>(base(rank) + layout_.recv_x()); }
float* DeviceEp::recv_w(int rank) const { return reinterpret_cast<float*>(base(rank) + layout_.recv_w()); }
const int32_t* DeviceEp::cu_seqlens(int rank) const {
    return reinterpret_cast<const int32_t*>(base(rank) + layout_.plan.cu_seqlens) +
           static_cast<size_t>(rank) * layout_.G;
}
const int32_t* DeviceEp::copies(int rank) const {
    return reinterpret_cast<const int32_t*>(base(rank) + layout_.plan.copies);
}

template <typename T>
std::vector<T> DeviceEp::download(int rank, size_t offset, size_t count) const {
    std::vector<T> v(count);
    if (count) EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), base(rank) + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

Plan DeviceEp::download_plan(int rank) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const int R = cfg_.R, E = cfg_.E, G = cfg_.num_groups(), B = cfg_.num_slots();
    const PlanOffsets& o = layout_.plan;
    Plan p;
    p.cfg = cfg_;
    p.mode = options_.mode;
    p.s = download<int32_t>(rank, o.s, R);
    p.tpe = download<int32_t>(rank, layout_.tpe, static_cast<size_t>(R) * E);
    p.expert_load = download<int64_t>(rank, o.expert_load, E);
    p.load_before = download<int64_t>(rank, o.load_before, R);
    p.q = download<int32_t>(rank, o.q, R);
    p.alloc = download<int32_t>(rank, o.alloc, static_cast<size_t>(E) * R);
    p.local_keep = download<int32_t>(rank, o.local_keep, static_cast<size_t>(E) * R);
    p.rest_prefix = download<int32_t>(rank, o.rest_prefix, static_cast<size_t>(E) * (R + 1));
    p.cap_prefix = download<int32_t>(rank, o.cap_prefix, static_cast<size_t>(E) * (R + 1));
    p.seg_row = download<int32_t>(rank, o.seg_row, static_cast<size_t>(R) * E);
    p.group_expert = download<int32_t>(rank, o.group_expert, static_cast<size_t>(R) * G);
    p.group_count = download<int32_t>(rank, o.group_count, static_cast<size_t>(R) * G);
    p.cu_seqlens = download<int32_t>(rank, o.cu_seqlens, static_cast<size_t>(R) * G);
    const std::vector<int8_t> src = download<int8_t>(rank, o.group_source, static_cast<size_t>(R) * G);
    p.group_source.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) p.group_source[i] = static_cast<WeightSource>(src[i]);
    p.group_slot = download<int32_t>(rank, o.group_slot, static_cast<size_t>(R) * G);
    p.copies = download<int32_t>(rank, o.copies, static_cast<size_t>(R) * B);
    p.remote_experts = download<int32_t>(rank, o.remote_experts, R);
    p.copies_received = download<int32_t>(rank, o.copies_received, R);
    p.copies_pushed = download<int32_t>(rank, o.copies_pushed, R);
    p.peer_reads = download<int32_t>(rank, o.peer_reads, R);
    p.crossing_out = download<int64_t>(rank, o.crossing_out, R);
    const std::vector<int64_t> cost = download<int64_t>(rank, o.cost, 4);
    p.cost = PlanCost{cost[0], cost[1], cost[2], cost[3]};
    return p;
}

std::vector<int32_t> DeviceEp::download_dst(int rank) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(rank, layout_.dst, static_cast<size_t>(s_.at(rank)) * cfg_.K);
}

std::vector<uint16_t> DeviceEp::download_recv_x(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<uint16_t>(rank, layout_.recv_x(), static_cast<size_t>(rows) * hidden_);
}
std::vector<float> DeviceEp::download_recv_w(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<float>(rank, layout_.recv_w(), static_cast<size_t>(rows));
}
std::vector<int32_t> DeviceEp::download_recv_next(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(rank, layout_.recv_next(), static_cast<size_t>(rows));
}
std::vector<int32_t> DeviceEp::download_recv_ret(int rank, int64_t rows) const {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    return download<int32_t>(rank, layout_.recv_ret(), static_cast<size_t>(rows));
}

}  // namespace evenep::cuda
