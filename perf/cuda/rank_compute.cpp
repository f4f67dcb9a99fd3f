// One rank's expert forward and backward alone on the GPU (perf/cuda/rank_compute.hpp).
//
// NOTE: the elementwise steps use the layer's own launchers (src/cuda/kernels/swiglu.hpp, an internal header of
// evenep::cuda) over a one-rank kernels::MoeKernelParams, so that the timed kernels are the layer's, not a copy.
#include "perf/cuda/rank_compute.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "cuda/kernels/moe_fp8.hpp"
#include "cuda/kernels/swiglu.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/fp8_cast.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"
#include "perf/cuda/timing.hpp"

namespace evenep::perf::cuda {

using ::evenep::cuda::GemmOp;
using ::evenep::cuda::GemmSchedule;
namespace kernels = ::evenep::cuda::kernels;

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Arena regions, in order: weights, grads, x, g, u, h, y, dy, dg, du, recv_x, recv_w, f32a, f32b, workspace; with
// fp8: w8, wt8, w_scales, x8, x_scales, codes_a, scales_a, codes_b, scales_b, dxu (else 0 bytes each).
inline constexpr int kRegions = 25;
struct ArenaPlan {
    size_t off[kRegions] = {};
    size_t total = 0;
};

// Floats of one matrix's 128 x 128 block scales, padded to 16 bytes (cuda::ExpertsShape::scale_stride's rule).
int64_t scale_floats(int H, int F) { return (static_cast<int64_t>(H / 128) * (F / 128) + 3) / 4 * 4; }

ArenaPlan arena_plan(int H, int F, int G, int64_t rows, bool fp8) {
    const size_t elems = static_cast<size_t>(H) * F, n = static_cast<size_t>(rows);
    const size_t wide = static_cast<size_t>(std::max(H, F));
    const size_t gs = static_cast<size_t>(G);
    const size_t sizes[15] = {3 * elems * gs * 2,  // weights [G][3][H*H'] bf16
                              3 * elems * gs * 4,  // gradients fp32
                              n * H * 2,           // x
                              n * F * 2,           // g
                              n * F * 2,           // u
                              n * F * 2,           // h
                              n * H * 2,           // y
                              n * H * 2,           // dy
                              n * F * 2,           // dg
                              n * F * 2,           // du
                              n * H * 2,           // recv_x (grad_out rows in, dx rows out)
                              n * 4,               // recv_w
                              n * wide * 4,        // f32a: dh [rows, H'], then dg·Wg^T [rows, H]
                              n * H * 4,           // f32b: du·Wu^T
                              ::evenep::cuda::grouped_gemm_workspace_bytes(G)};
    const size_t f = fp8 ? 1 : 0, sf = static_cast<size_t>(scale_floats(H, F));
    const size_t fp8_sizes[10] = {f * 3 * elems * gs,   // w8 [G][3][H*H'] e4m3
                                  f * 3 * elems * gs,   // wt8: the forward's transposes, [G][3][H*H']
                                  f * 3 * gs * sf * 4,  // w_scales
                                  f * n * H,            // x8
                                  f * n * H / 32,       // x_scales (H/128 floats a row)
                                  f * n * wide,         // codes_a
                                  f * n * wide / 32,    // scales_a
                                  f * n * F,            // codes_b
                                  f * n * F / 32,       // scales_b
                                  f * n * H * 2};       // dxu
    ArenaPlan p;
    for (int i = 0; i < kRegions; ++i) {
        p.off[i] = p.total;
        p.total += align_up(i < 15 ? sizes[i] : fp8_sizes[i - 15]);
    }
    return p;
}

}  // namespace

// One launch: groups [0, G) with their padded ends, weight and gradient tables (3 projections) and the rank view of
// the elementwise kernels, in one device allocation.
inline constexpr int kFp8Kinds = 4;

struct RankComputeTimer::Launch {
    int G = 0;
    int64_t rows = 0;
    std::vector<int32_t> cu;                  // host copy of the inclusive ends
    std::vector<int> weight;                  // [G] weight index (the rank's group) of each launch group
    ::evenep::cuda::DeviceArray<char> block;  // cu [G] | weight tables [3][G] | gradient tables [3][G] | MoeRankView
    const int32_t* d_cu() const { return reinterpret_cast<const int32_t*>(block.get()); }
    const uint16_t* const* d_weights(int proj) const {
        return reinterpret_cast<const uint16_t* const*>(block.get() + align_up(4 * G)) + static_cast<size_t>(proj) * G;
    }
    float* const* d_grads(int proj) const {
        return reinterpret_cast<float* const*>(block.get() + align_up(4 * G) + align_up(8 * 3 * G)) +
               static_cast<size_t>(proj) * G;
    }
    const kernels::MoeRankView* d_view() const {
        return reinterpret_cast<const kernels::MoeRankView*>(block.get() + align_up(4 * G) + 2 * align_up(8 * 3 * G));
    }
    // FP8 (timer with fp8): the received rows' view, then per kind (codes, scales, transposed codes, slot codes: the
    // layer's kinds, src/cuda/runtime/moe_layer_fp8.cpp) and projection a table of G+1 entries.
    size_t fp8_offset() const {
        return align_up(4 * G) + 2 * align_up(8 * 3 * G) + align_up(sizeof(kernels::MoeRankView));
    }
    static size_t fp8_bytes(int G) { return align_up(sizeof(kernels::MoeFp8RankView)) + 8 * kFp8Kinds * 3 * (G + 1); }
    const kernels::MoeFp8RankView* d_fp8_view() const {
        return reinterpret_cast<const kernels::MoeFp8RankView*>(block.get() + fp8_offset());
    }
    const void** d_fp8_table(int kind, int proj) const {
        return reinterpret_cast<const void**>(block.get() + fp8_offset() + align_up(sizeof(kernels::MoeFp8RankView))) +
               static_cast<size_t>(kind * 3 + proj) * (G + 1);
    }
};

namespace {

// The median of v (the upper one of an even count: Stats::p50_us), v non-empty; any unit.
double median_of(std::vector<double> v) { return stats_of(std::move(v)).p50_us; }

}  // namespace

double amortised_forward_ms(std::span<const double> whole_ms, std::span<const double> cast_ms, int micro_batches) {
    EVENEP_CHECK(micro_batches >= 1, "rank compute: micro_batches = ", micro_batches, " must be >= 1");
    EVENEP_CHECK(!whole_ms.empty() && whole_ms.size() == cast_ms.size(), "rank compute: ", whole_ms.size(),
                 " forward times and ", cast_ms.size(), " cast times");
    // 1 - 1/M, exactly 0 for M = 1: the whole interval as measured, not a sum of two.
    const double shared = static_cast<double>(micro_batches - 1) / micro_batches;
    std::vector<double> v(whole_ms.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = whole_ms[i] - cast_ms[i] * shared;
    return median_of(std::move(v));
}

size_t RankComputeTimer::bytes_needed(int H, int ffn_hidden, int max_groups, int64_t max_rows, bool fp8) {
    return arena_plan(H, ffn_hidden, max_groups, max_rows, fp8).total;
}

RankComputeTimer::RankComputeTimer(int H,
                                   int ffn_hidden,
                                   int max_groups,
                                   int64_t max_rows,
                                   uint64_t seed,
                                   GemmSchedule wgrad_schedule,
                                   bool fp8,
                                   int fp8_home_casts)
    : H_(H),
      F_(ffn_hidden),
      max_groups_(max_groups),
      max_rows_(max_rows),
      wgrad_schedule_(wgrad_schedule),
      fp8_(fp8),
      fp8_home_casts_(std::clamp(fp8_home_casts, 0, max_groups)) {
    EVENEP_CHECK(H >= 8 && H % 8 == 0, "rank compute: H = ", H, " must be a positive multiple of 8");
    EVENEP_CHECK(ffn_hidden >= 8 && ffn_hidden % 8 == 0, "rank compute: H' = ", ffn_hidden,
                 " must be a positive multiple of 8");
    EVENEP_CHECK(max_groups >= 1 && max_groups <= ::evenep::cuda::kMaxGemmGroups,
                 "rank compute: max_groups = ", max_groups, " must be in [1, ", ::evenep::cuda::kMaxGemmGroups, "]");
    EVENEP_CHECK(max_rows >= 1, "rank compute: max_rows = ", max_rows, " must be >= 1");
    EVENEP_CHECK(!fp8 || (H % 128 == 0 && ffn_hidden % 128 == 0), "rank compute: fp8 needs H = ", H,
                 " and H' = ", ffn_hidden, " multiples of 128");
    const ArenaPlan a = arena_plan(H, F_, max_groups, max_rows, fp8);
    bytes_ = a.total;
    arena_ = ::evenep::cuda::DeviceArray<char>(bytes_, ::evenep::cuda::DeviceFill::kNone);
    char* arena = arena_.get();
    auto bf = [&](int i) { return reinterpret_cast<uint16_t*>(arena + a.off[i]); };
    auto f32 = [&](int i) { return reinterpret_cast<float*>(arena + a.off[i]); };
    weights_ = bf(0), grads_ = f32(1), x_ = bf(2), g_ = bf(3), u_ = bf(4), h_ = bf(5), y_ = bf(6), dy_ = bf(7);
    dg_ = bf(8), du_ = bf(9), recv_x_ = bf(10), recv_w_ = f32(11), f32a_ = f32(12), f32b_ = f32(13);
    workspace_ = arena + a.off[14];
    if (fp8_) {
        auto u8 = [&](int i) { return reinterpret_cast<uint8_t*>(arena + a.off[i]); };
        w8_ = u8(15), wt8_ = u8(16), w_scales_ = f32(17), x8_ = u8(18), x_scales_ = f32(19);
        codes_a_ = u8(20), scales_a_ = f32(21), codes_b_ = u8(22), scales_b_ = f32(23), dxu_ = bf(24);
        sstride_ = scale_floats(H, F_);
    }
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : ev_) EVENEP_CUDA_CHECK(cudaEventCreate(&e));
    const size_t elems = static_cast<size_t>(H) * F_, n = static_cast<size_t>(max_rows);
    using ::evenep::cuda::fill_random_bf16;
    fill_random_bf16(weights_, 3 * elems * max_groups, seed, 1.f / 32, stream_);
    fill_random_bf16(x_, n * H, seed + 1, 1.f, stream_);
    fill_random_bf16(recv_x_, n * H, seed + 2, 1.f / 32, stream_);
    fill_random_bf16(reinterpret_cast<uint16_t*>(recv_w_), 2 * n, seed + 3, 1.f, stream_);
    EVENEP_CUDA_CHECK(cudaMemsetAsync(grads_, 0, 3 * elems * max_groups * 4, stream_));
    if (fp8_) {  // random codes; every scale 0x3C3C3C3C (about 0.0115): timing only
        ::evenep::cuda::fill_random_e4m3(w8_, 3 * elems * max_groups, seed + 4, 1.f, stream_);
        ::evenep::cuda::fill_random_e4m3(x8_, n * H, seed + 5, 1.f, stream_);
        EVENEP_CUDA_CHECK(
            cudaMemsetAsync(w_scales_, 0x3C, 3 * static_cast<size_t>(max_groups) * sstride_ * 4, stream_));
        EVENEP_CUDA_CHECK(cudaMemsetAsync(x_scales_, 0x3C, n * H / 32, stream_));
    }
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    int sms = 0;
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // Elementwise launches: about four blocks per SM (the layer's rule for one served rank).
    const int64_t needed = std::max<int64_t>(1, (n * std::max(H, F_) / 8 + 255) / 256);
    blocks_ = static_cast<int>(std::clamp<int64_t>(4 * static_cast<int64_t>(sms), 1, needed));
}

RankComputeTimer::~RankComputeTimer() {
    for (cudaEvent_t e : ev_)
        if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
}

std::vector<RankComputeTimer::Launch> RankComputeTimer::split(std::span<const int64_t> group_rows,
                                                              std::span<const char> slot_group) const {
    EVENEP_CHECK(static_cast<int64_t>(group_rows.size()) <= max_groups_, "rank compute: ", group_rows.size(),
                 " groups exceed max_groups = ", max_groups_);
    EVENEP_CHECK(slot_group.empty() || slot_group.size() == group_rows.size(), "rank compute: ", slot_group.size(),
                 " slot marks for ", group_rows.size(), " groups");
    std::vector<Launch> out;
    Launch cur;
    for (size_t g = 0; g < group_rows.size(); ++g) {
        EVENEP_CHECK(group_rows[g] >= 0, "rank compute: group ", g, " has ", group_rows[g], " rows");
        int64_t left = group_rows[g];
        while (left > 0) {
            const int64_t take = std::min(left, max_rows_ - cur.rows);
            cur.rows += take;
            cur.cu.push_back(static_cast<int32_t>(cur.rows));
            cur.weight.push_back(static_cast<int>(g));
            left -= take;
            if (cur.rows == max_rows_) out.push_back(std::move(cur)), cur = Launch{};
        }
    }
    if (cur.rows > 0) out.push_back(std::move(cur));
    const size_t elems = static_cast<size_t>(H_) * F_;
    for (Launch& l : out) {
        l.G = static_cast<int>(l.cu.size());
        const size_t table = align_up(8 * 3 * l.G);
        const size_t bytes = align_up(4 * l.G) + 2 * table + align_up(sizeof(kernels::MoeRankView)) +
                             (fp8_ ? Launch::fp8_bytes(l.G) : 0);
        std::vector<char> host(bytes, 0);
        std::copy_n(reinterpret_cast<const char*>(l.cu.data()), 4 * l.G, host.data());
        auto* wt = reinterpret_cast<const uint16_t**>(host.data() + align_up(4 * l.G));
        auto* gt = reinterpret_cast<float**>(host.data() + align_up(4 * l.G) + table);
        for (int p = 0; p < 3; ++p)
            for (int j = 0; j < l.G; ++j) {
                const size_t m = (static_cast<size_t>(l.weight[j]) * 3 + p) * elems;
                wt[p * l.G + j] = weights_ + m;
                gt[p * l.G + j] = grads_ + m;
            }
        l.block = ::evenep::cuda::DeviceArray<char>(bytes, ::evenep::cuda::DeviceFill::kNone);
        kernels::MoeRankView view{};
        view.recv_x = recv_x_;
        view.recv_w = recv_w_;
        view.cu_seqlens = l.d_cu();
        std::copy_n(reinterpret_cast<const char*>(&view), sizeof(view), host.data() + align_up(4 * l.G) + 2 * table);
        if (fp8_) {
            const kernels::MoeFp8RankView v8{x8_, x_scales_};
            char* f = host.data() + l.fp8_offset();
            std::copy_n(reinterpret_cast<const char*>(&v8), sizeof(v8), f);
            auto* t = reinterpret_cast<const void**>(f + align_up(sizeof(v8)));
            for (int p = 0; p < 3; ++p)
                for (int j = 0; j < l.G; ++j) {
                    const size_t m = static_cast<size_t>(l.weight[j]) * 3 + p;
                    const bool slot = !slot_group.empty() && slot_group[static_cast<size_t>(l.weight[j])] != 0;
                    auto at = [&](int kind) -> const void*& { return t[(kind * 3 + p) * (l.G + 1) + j]; };
                    at(0) = w8_ + m * elems;                                // codes
                    at(1) = w_scales_ + m * static_cast<size_t>(sstride_);  // scales
                    at(2) = wt8_ + m * elems;                               // transposed codes
                    if (slot) at(3) = w8_ + m * elems;                      // transposed per step (into at(2))
                }
        }
        l.block.upload(host.data(), bytes);
    }
    return out;
}

namespace {

kernels::MoeKernelParams elementwise_params(
    const kernels::MoeRankView* view, int G, int H, int F, int64_t rows, int blocks) {
    kernels::MoeKernelParams p;
    p.ranks = view;
    p.R = 1, p.G = G, p.epn = 1, p.B = 0, p.rank_begin = 0, p.num_local = 1;
    p.H = H, p.F = F, p.nvs = rows, p.elems = static_cast<int64_t>(H) * F;
    p.f32a_dim = std::max(H, F), p.f32b_dim = H;
    p.blocks_per_rank = blocks;
    return p;
}

}  // namespace

void RankComputeTimer::forward(const Launch& l) {
    auto gemm = [&](int proj, const uint16_t* x, uint16_t* y, int in, int out) {
        ::evenep::cuda::GroupedGemmArgs a;
        a.x = x, a.cu_seqlens = l.d_cu(), a.weights = l.d_weights(proj), a.y = y;
        a.num_groups = l.G, a.in_dim = in, a.out_dim = out, a.op = GemmOp::kForward;
        a.schedule = GemmSchedule::kLoadAware, a.workspace = workspace_, a.rows_capacity = max_rows_;
        ::evenep::cuda::grouped_gemm(a, stream_);
    };
    gemm(0, x_, g_, H_, F_);
    gemm(1, x_, u_, H_, F_);
    kernels::MoeKernelParams p = elementwise_params(l.d_view(), l.G, H_, F_, max_rows_, blocks_);
    p.g = g_, p.u = u_, p.h = h_;
    kernels::launch_swiglu_forward(p, stream_);
    gemm(2, h_, y_, F_, H_);
    // The layer's last forward pass (launch_moe_place_output): the received rows saved for the wgrads, y into the
    // receive buffer. The saved copy goes to f32a (free until the backward; rows x max(H, H') fp32 hold rows x H
    // bf16) so that x, the GEMMs' input, stays the same random data from iteration to iteration.
    p.x = reinterpret_cast<uint16_t*>(f32a_), p.y = y_;
    kernels::launch_moe_place_output(p, stream_);
}

void RankComputeTimer::wgrad_of(const Launch& l, int proj, const uint16_t* x, const uint16_t* dy, int in, int out) {
    ::evenep::cuda::GroupedWgradArgs a;
    a.x = x, a.dy = dy, a.cu_seqlens = l.d_cu(), a.grads = l.d_grads(proj);
    a.num_groups = l.G, a.in_dim = in, a.out_dim = out, a.schedule = wgrad_schedule_, a.workspace = workspace_;
    ::evenep::cuda::grouped_gemm_wgrad(a, stream_);
}

void RankComputeTimer::backward(const Launch& l) {
    kernels::MoeKernelParams p = elementwise_params(l.d_view(), l.G, H_, F_, max_rows_, blocks_);
    p.x = x_, p.g = g_, p.u = u_, p.h = h_, p.y = y_, p.dy = dy_, p.dg = dg_, p.du = du_, p.f32a = f32a_,
    p.f32b = f32b_;
    auto dgrad = [&](int proj, const uint16_t* dy, float* dx, int in, int out) {
        ::evenep::cuda::GroupedGemmArgs a;
        a.x = dy, a.cu_seqlens = l.d_cu(), a.weights = l.d_weights(proj), a.y = dx, a.y_fp32 = true;
        a.num_groups = l.G, a.in_dim = in, a.out_dim = out, a.op = GemmOp::kDgrad;
        a.schedule = GemmSchedule::kLoadAware, a.workspace = workspace_, a.rows_capacity = max_rows_;
        ::evenep::cuda::grouped_gemm(a, stream_);
    };
    auto wgrad = [&](int proj, const uint16_t* x, const uint16_t* dy, int in, int out) {
        wgrad_of(l, proj, x, dy, in, out);
    };
    kernels::launch_moe_grad_rows(p, stream_);
    wgrad(2, h_, dy_, F_, H_);
    dgrad(2, dy_, f32a_, F_, H_);
    kernels::launch_swiglu_backward(p, stream_);
    wgrad(0, x_, dg_, H_, F_);
    wgrad(1, x_, du_, H_, F_);
    dgrad(0, dg_, f32a_, H_, F_);
    dgrad(1, du_, f32b_, H_, F_);
    kernels::launch_moe_sum_dx(p, stream_);
}

// The FP8 path of cuda::MoeLayer for one rank (src/cuda/runtime/moe_layer_fp8.cpp), launch by launch.
void RankComputeTimer::forward_fp8(const Launch& l) {
    kernels::MoeKernelParams p = elementwise_params(l.d_view(), l.G, H_, F_, max_rows_, blocks_);
    p.x = x_, p.g = g_, p.u = u_, p.h = h_, p.y = y_;
    auto gemm = [&](int proj, const uint8_t* x, const float* xs, uint16_t* y, int in, int out) {
        ::evenep::cuda::GroupedGemmFp8Args a;
        a.x = x, a.x_scales = xs, a.cu_seqlens = l.d_cu(), a.y = y;
        a.weights = reinterpret_cast<const uint8_t* const*>(l.d_fp8_table(2, proj));  // W^T
        a.weight_scales = reinterpret_cast<const float* const*>(l.d_fp8_table(1, proj));
        a.num_groups = l.G, a.in_dim = in, a.out_dim = out, a.op = GemmOp::kForward;
        a.schedule = GemmSchedule::kLoadAware, a.workspace = workspace_, a.rows_capacity = max_rows_;
        ::evenep::cuda::grouped_gemm_fp8(a, stream_);
    };
    for (int proj = 0; proj < 3; ++proj)  // the copies' transposes (the homes' come from the cast)
        kernels::launch_moe_fp8_transpose_groups(p, reinterpret_cast<const uint8_t* const*>(l.d_fp8_table(3, proj)),
                                                 reinterpret_cast<const uint8_t* const*>(l.d_fp8_table(2, proj)),
                                                 proj == 2 ? F_ : H_, proj == 2 ? H_ : F_, stream_);
    gemm(0, x8_, x_scales_, g_, H_, F_);
    gemm(1, x8_, x_scales_, u_, H_, F_);
    kernels::launch_swiglu_forward(p, stream_);
    kernels::launch_moe_fp8_cast_rows(p, h_, F_, false, codes_a_, scales_a_, stream_);
    gemm(2, codes_a_, scales_a_, y_, F_, H_);
    kernels::launch_moe_fp8_place_output(p, l.d_fp8_view(), stream_);
}

void RankComputeTimer::backward_fp8(const Launch& l) {
    kernels::MoeKernelParams p = elementwise_params(l.d_view(), l.G, H_, F_, max_rows_, blocks_);
    p.x = x_, p.g = g_, p.u = u_, p.h = h_, p.y = y_, p.dy = dy_, p.dg = dg_, p.du = du_, p.f32a = f32a_,
    p.f32b = f32b_;
    auto dgrad = [&](int proj, const uint8_t* x, const float* xs, uint16_t* y, int in, int out) {
        ::evenep::cuda::GroupedGemmFp8Args a;
        a.x = x, a.x_scales = xs, a.cu_seqlens = l.d_cu(), a.y = y;
        a.weights = reinterpret_cast<const uint8_t* const*>(l.d_fp8_table(0, proj));  // W
        a.weight_scales = reinterpret_cast<const float* const*>(l.d_fp8_table(1, proj));
        a.num_groups = l.G, a.in_dim = in, a.out_dim = out, a.op = GemmOp::kDgrad;
        a.schedule = GemmSchedule::kLoadAware, a.workspace = workspace_, a.rows_capacity = max_rows_;
        ::evenep::cuda::grouped_gemm_fp8(a, stream_);
    };
    auto wgrad = [&](int proj, const uint16_t* x, const uint16_t* dy, int in, int out) {
        wgrad_of(l, proj, x, dy, in, out);
    };
    kernels::launch_moe_grad_rows(p, stream_);
    wgrad(2, h_, dy_, F_, H_);
    kernels::launch_moe_fp8_cast_rows(p, dy_, H_, false, codes_a_, scales_a_, stream_);
    dgrad(2, codes_a_, scales_a_, dg_, F_, H_);
    kernels::launch_moe_widen(p, dg_, F_, f32a_, p.f32a_dim, stream_);
    kernels::launch_swiglu_backward(p, stream_);
    wgrad(0, x_, dg_, H_, F_);
    wgrad(1, x_, du_, H_, F_);
    kernels::launch_moe_fp8_cast_rows(p, dg_, F_, false, codes_a_, scales_a_, stream_);
    kernels::launch_moe_fp8_cast_rows(p, du_, F_, false, codes_b_, scales_b_, stream_);
    dgrad(0, codes_a_, scales_a_, dy_, H_, F_);
    dgrad(1, codes_b_, scales_b_, dxu_, H_, F_);
    kernels::launch_moe_fp8_sum_dx(p, dy_, dxu_, stream_);
}

RankComputeTime RankComputeTimer::time(std::span<const int64_t> group_rows,
                                       int warmup,
                                       int iters,
                                       bool fp8,
                                       std::span<const char> slot_group,
                                       int micro_batches) {
    EVENEP_CHECK(warmup >= 0 && iters >= 1, "rank compute: warmup = ", warmup, ", iters = ", iters);
    EVENEP_CHECK(!fp8 || fp8_, "rank compute: time(fp8) needs a timer constructed with fp8");
    EVENEP_CHECK(micro_batches >= 1, "rank compute: micro_batches = ", micro_batches, " must be >= 1");
    const size_t elems = static_cast<size_t>(H_) * F_;
    // The FP8 forward starts with the home's weight cast (prefetch_weight's, once per step, not per launch; with
    // Experts::reuse_fp8_cast once per optimizer step, so forward_ms counts it / micro_batches): one batched launch
    // per projection, with the transposed codes.
    auto home_casts = [&] {
        for (int proj = 0; proj < 3; ++proj) {
            ::evenep::cuda::Fp8WeightCast c;
            c.w = reinterpret_cast<const Bf16*>(weights_ + proj * elems);
            c.w_stride = c.codes_stride = static_cast<int64_t>(3 * elems);
            c.count = fp8_home_casts_;
            c.in = proj == 2 ? F_ : H_;
            c.out = proj == 2 ? H_ : F_;
            c.codes = reinterpret_cast<Fp8E4m3*>(w8_ + proj * elems);
            c.transposed = reinterpret_cast<Fp8E4m3*>(wt8_ + proj * elems);
            c.scales = w_scales_ + proj * sstride_;
            c.scale_stride = 3 * sstride_;
            ::evenep::cuda::launch_fp8_cast_weights(c, stream_);
        }
    };
    std::vector<Launch> ls = split(group_rows, fp8 ? slot_group : std::span<const char>{});
    RankComputeTime t;
    t.launches = static_cast<int>(ls.size());
    t.micro_batches = fp8 ? micro_batches : 1;
    for (const Launch& l : ls) t.rows += l.rows;
    if (ls.empty()) return t;
    // Events: start, the home cast done (FP8 only), the forward done, the backward done. The forward's interval
    // stays start -> forward done (the cast included), as it was before the cast had an event of its own.
    std::vector<double> fwd, bwd, cast, no_cast;
    for (int i = 0; i < warmup + iters; ++i) {
        EVENEP_CUDA_CHECK(cudaEventRecord(ev_[0], stream_));
        if (fp8) {
            home_casts();
            EVENEP_CUDA_CHECK(cudaEventRecord(ev_[1], stream_));
        }
        for (const Launch& l : ls) fp8 ? forward_fp8(l) : forward(l);
        EVENEP_CUDA_CHECK(cudaEventRecord(ev_[2], stream_));
        for (const Launch& l : ls) fp8 ? backward_fp8(l) : backward(l);
        EVENEP_CUDA_CHECK(cudaEventRecord(ev_[3], stream_));
        EVENEP_CUDA_CHECK(cudaEventSynchronize(ev_[3]));
        float a = 0, b = 0, c = 0, d = 0;
        EVENEP_CUDA_CHECK(cudaEventElapsedTime(&a, ev_[0], ev_[2]));
        EVENEP_CUDA_CHECK(cudaEventElapsedTime(&b, ev_[2], ev_[3]));
        if (fp8) {
            EVENEP_CUDA_CHECK(cudaEventElapsedTime(&c, ev_[0], ev_[1]));
            EVENEP_CUDA_CHECK(cudaEventElapsedTime(&d, ev_[1], ev_[2]));
        }
        if (i >= warmup) fwd.push_back(a), bwd.push_back(b), cast.push_back(c), no_cast.push_back(d);
    }
    t.forward_ms = fp8 ? amortised_forward_ms(fwd, cast, micro_batches) : median_of(fwd);
    t.backward_ms = median_of(bwd);
    if (fp8) t.fp8_home_cast_ms = median_of(cast), t.fp8_forward_no_cast_ms = median_of(no_cast);
    return t;
}

std::vector<double> RankComputeTimer::warm_up(std::span<const int64_t> group_rows, double min_seconds) {
    std::vector<Launch> ls = split(group_rows);
    std::vector<double> ms;
    if (ls.empty()) return ms;
    ms = warm_gpu(
        [&] {
            for (const Launch& l : ls) forward(l);
            for (const Launch& l : ls) backward(l);
        },
        stream_, min_seconds);
    for (double& v : ms) v *= 1e-3;
    return ms;
}

double RankComputeTimer::check_forward(std::span<const int64_t> group_rows) {
    std::vector<Launch> ls = split(group_rows);
    const size_t elems = static_cast<size_t>(H_) * F_;
    double worst = 0;
    std::mt19937_64 rng(12345);
    for (const Launch& l : ls) {
        forward(l);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int j = 0; j < l.G; ++j) {
            const int32_t begin = j == 0 ? 0 : l.cu[j - 1];
            for (const int32_t row : {begin, l.cu[j] - 1}) {
                const int col = static_cast<int>(rng() % static_cast<uint64_t>(F_));
                std::vector<uint16_t> xr(H_), wc(H_);
                uint16_t got = 0;
                EVENEP_CUDA_CHECK(
                    cudaMemcpy(xr.data(), x_ + static_cast<size_t>(row) * H_, 2 * H_, cudaMemcpyDeviceToHost));
                const uint16_t* w = weights_ + static_cast<size_t>(l.weight[j]) * 3 * elems;  // gate
                EVENEP_CUDA_CHECK(
                    cudaMemcpy2D(wc.data(), 2, w + col, 2 * static_cast<size_t>(F_), 2, H_, cudaMemcpyDeviceToHost));
                EVENEP_CUDA_CHECK(
                    cudaMemcpy(&got, g_ + static_cast<size_t>(row) * F_ + col, 2, cudaMemcpyDeviceToHost));
                double ref = 0, mag = 0;
                for (int i = 0; i < H_; ++i) {
                    const double v = static_cast<double>(bf16_to_float(Bf16{xr[i]})) * bf16_to_float(Bf16{wc[i]});
                    ref += v;
                    mag += std::fabs(v);
                }
                worst = std::max(worst, std::fabs(bf16_to_float(Bf16{got}) - ref) / std::max(mag, 1e-30));
            }
        }
    }
    return worst;
}

}  // namespace evenep::perf::cuda
