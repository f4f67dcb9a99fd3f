// perf/cuda/rank_compute.hpp — one rank's SwiGLU expert forward and backward timed alone on the whole GPU: the
// per-rank expert compute of `evenep bench layer` (docs/benchmarks.md, "Layer step").
//
// A rank's work is a list of groups (one expert's rows each, padding included: every row is computed, as the
// grouped GEMM does). time() runs, on one stream, exactly the kernels cuda::MoeLayer runs for one served rank:
//   forward   gate = x·Wg, up = x·Wu (grouped_gemm kForward, bf16), h = swiglu(gate, up), y = h·Wd, then the
//             layer's place-output pass (the received rows saved, y into the receive buffer)
//   backward  dy rows (grad_rows), dWd += h^T·dy (wgrad), dh = dy·Wd^T (kDgrad, fp32), swiglu backward,
//             dWg += x^T·dg, dWu += x^T·du (wgrad), dg·Wg^T and du·Wu^T (kDgrad, fp32), dx = sum (bf16)
// with the layer's schedules (forward/dgrad kLoadAware, wgrad kFixed by default). Every group has its own weight and
// gradient matrices (no cache sharing between groups). Rows beyond the timer's capacity (max_rows) are run as
// several launches of at most max_rows rows each (a long group is split between launches; its wgrad accumulates),
// and the launches' times are summed: a rank with more rows than the EvenEP bound (conventional EP under skew) is
// timed without allocating its worst case. Data is random bf16 (fill_random_bf16), timing only.
//
// FP8 (constructed with fp8, time(..., fp8 = true)): the kernels of cuda::MoeLayer's FP8 path for one rank
// (src/cuda/runtime/moe_layer_fp8.cpp; docs/fp8.md):
//   forward   the home's weight cast (launch_fp8_cast_weights of `fp8_home_casts` experts, one launch per projection
//             writing the codes and their transposes, as the layer's prefetch_weight; timed on its own too, and
//             counted once per `micro_batches` forwards, see time()), the transposes of the groups
//             marked as copies (slot_group: the prefetched slots, transposed per step by the layer), gate/up FP8
//             block-scaled GEMMs (grouped_gemm_fp8) on e4m3 rows, swiglu, h cast 1 x 128, down FP8, x dequantised
//   backward  grad_rows, dWd (bf16 wgrad), dy cast, dh = FP8 dgrad (bf16) widened, swiglu backward, dWg and dWu
//             (bf16 wgrad), dg and du cast, two FP8 dgrads (bf16), dx = their sum (launch_moe_fp8_sum_dx)
// on random e4m3 codes (fill_random_e4m3) with constant scales.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/grouped_gemm.hpp"

namespace evenep::perf::cuda {

struct RankComputeTime {
    // Median over iterations. FP8: of (the forward without the home cast) + (the home cast) / micro_batches, per
    // iteration (amortised_forward_ms); with micro_batches = 1 the median of the whole forward, cast included.
    double forward_ms = 0;
    double backward_ms = 0;             // median over iterations
    double fp8_home_cast_ms = 0;        // FP8: median over iterations of the home's weight cast alone (else 0)
    double fp8_forward_no_cast_ms = 0;  // FP8: median over iterations of the forward without the home cast (else 0)
    int micro_batches = 1;              // FP8: micro-batches per optimizer step sharing one home cast
    int64_t rows = 0;                   // rows computed (sum of group rows)
    int launches = 0;                   // launches of at most max_rows rows the work was split into (0: no rows)
    double total_ms() const { return forward_ms + backward_ms; }
};

// One micro-batch's FP8 forward when `micro_batches` forwards share the home cast: per iteration i,
// whole_ms[i] - cast_ms[i] * (1 - 1/micro_batches) (whole_ms: the forward with the cast, one interval; cast_ms: the
// cast alone), then the median over iterations (the upper one of an even count, as every median of time()). With
// micro_batches = 1 it is exactly the median of whole_ms. Sizes equal and non-zero, micro_batches >= 1, else
// evenep::Error (kInvalidArgument). Host only.
double amortised_forward_ms(std::span<const double> whole_ms, std::span<const double> cast_ms, int micro_batches);

class RankComputeTimer {
  public:
    // Device memory for up to `max_groups` groups (weights bf16 and gradients fp32, 3 projections of H*H' each) and
    // `max_rows` rows per launch. H and ffn_hidden: positive multiples of 8. Throws evenep::Error (kInvalidArgument
    // for bad sizes, kRuntime when the allocation fails).
    // fp8: also allocate the FP8 path's buffers (H and ffn_hidden multiples of 128; needs the CUTLASS FP8 GEMM to
    // time it); fp8_home_casts: experts whose weights the FP8 forward casts (the rank's home experts, epn).
    RankComputeTimer(int H,
                     int ffn_hidden,
                     int max_groups,
                     int64_t max_rows,
                     uint64_t seed = 1,
                     ::evenep::cuda::GemmSchedule wgrad_schedule = ::evenep::cuda::GemmSchedule::kFixed,
                     bool fp8 = false,
                     int fp8_home_casts = 0);
    ~RankComputeTimer();
    RankComputeTimer(const RankComputeTimer&) = delete;
    RankComputeTimer& operator=(const RankComputeTimer&) = delete;

    // Device bytes a timer of these sizes allocates (for estimates before constructing one).
    static size_t bytes_needed(int H, int ffn_hidden, int max_groups, int64_t max_rows, bool fp8 = false);

    // Times `warmup` untimed and `iters` timed runs of the forward and backward of groups with `group_rows[g]` rows
    // (0: an empty group; at most max_groups entries). CUDA events on the timer's stream; synchronises.
    // fp8: the FP8 path (the timer must have been built with fp8); slot_group (empty or one mark per group): the
    // groups that are prefetched copies, whose e4m3 codes the FP8 forward transposes each step. micro_batches (>= 1,
    // FP8 only): the micro-batches of one optimizer step, which share one home cast under Experts::reuse_fp8_cast
    // (gradient accumulation): every iteration still runs the cast where the layer runs it (first in the forward),
    // with an event after it, and forward_ms counts it 1/micro_batches times (amortised_forward_ms).
    RankComputeTime time(std::span<const int64_t> group_rows,
                         int warmup,
                         int iters,
                         bool fp8 = false,
                         std::span<const char> slot_group = {},
                         int micro_batches = 1);

    // Runs the forward and backward of `group_rows` back to back until `min_seconds` of GPU time have passed (at
    // least once) and returns each run's milliseconds: brings the GPU's clocks from an idle state to the sustained
    // state every timed rank should see (the first ~0.3 s after host-side work run ~10% slower on an H200).
    std::vector<double> warm_up(std::span<const int64_t> group_rows, double min_seconds);

    // Runs the forward of `group_rows` once and compares sampled elements of the gate projection (x·Wg, every
    // launch, first and last row of every non-empty group) with host fp64 sums of the same bf16 inputs; returns the
    // largest error relative to the sum of magnitudes (bf16 output rounding: < 2^-8 expected).
    double check_forward(std::span<const int64_t> group_rows);

    size_t allocated_bytes() const { return bytes_; }

  private:
    struct Launch;  // one launch's groups: device cu_seqlens and weight / gradient tables
    std::vector<Launch> split(std::span<const int64_t> group_rows, std::span<const char> slot_group = {}) const;
    void forward(const Launch& l);
    void backward(const Launch& l);
    void wgrad_of(const Launch& l, int proj, const uint16_t* x, const uint16_t* dy, int in, int out);
    void forward_fp8(const Launch& l);
    void backward_fp8(const Launch& l);

    int H_, F_, max_groups_;
    int64_t max_rows_;
    ::evenep::cuda::GemmSchedule wgrad_schedule_;
    size_t bytes_ = 0;
    ::evenep::cuda::DeviceArray<char> arena_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t ev_[4] = {nullptr, nullptr, nullptr, nullptr};  // start, home cast done (FP8), forward, backward
    // Regions of the arena.
    uint16_t *weights_ = nullptr, *x_ = nullptr, *g_ = nullptr, *u_ = nullptr, *h_ = nullptr, *y_ = nullptr;
    uint16_t *dy_ = nullptr, *dg_ = nullptr, *du_ = nullptr, *recv_x_ = nullptr;
    float *grads_ = nullptr, *recv_w_ = nullptr, *f32a_ = nullptr, *f32b_ = nullptr;
    void* workspace_ = nullptr;
    int blocks_ = 1;  // grid.x of the elementwise launches
    // FP8 regions (fp8_): e4m3 weights and their transposes [G][3][H*H'], weight scales [G][3][sstride] fp32, the
    // received rows' codes and scales, the layer's casts (a: [rows, max(H, H')], b: [rows, H']), du·Wu^T bf16.
    bool fp8_ = false;
    int fp8_home_casts_ = 0;
    uint8_t *w8_ = nullptr, *wt8_ = nullptr, *x8_ = nullptr, *codes_a_ = nullptr, *codes_b_ = nullptr;
    float *w_scales_ = nullptr, *x_scales_ = nullptr, *scales_a_ = nullptr, *scales_b_ = nullptr;
    uint16_t* dxu_ = nullptr;
    int64_t sstride_ = 0;  // floats per matrix's scales (padded to 16 bytes)
};

}  // namespace evenep::perf::cuda
