// tests/cuda/grouped_gemm_test.cu — the GPU grouped GEMM (include/evenep/cuda/grouped_gemm.hpp) against a plain
// fp32 reference on the host (double accumulation of the same bf16 inputs).
// Cases (GroupedGemmTest.MatchesReference, parameterised over shape x op x output type x schedule):
//   random        12 groups of random sizes (0..300 rows), in/out multiples of the tile
//   ragged        in/out not multiples of the tile (200 x 72, 72 x 200), random sizes
//   empty         most groups empty (0 rows), one group with rows but a null weight pointer
//   one_row       every group one row
//   single_group  all rows in one group (the others empty)
//   tiny          in = out = 8
// Each case poisons y first (NaN bits), checks every row of every non-empty group against the reference
// (|y - ref| <= rel |ref| + 1e-4 sqrt(inner), rel = 2^-7 for bf16 output (rounding is <= 2^-8), 1e-5 for fp32;
// inputs uniform in [-1, 1), reference accumulated in double) and
// that the rows of empty / null-weight groups keep the poison. Seeds are fixed per case and printed on failure.
// kAuto and kCutlass cases then run again with rows_capacity above G x N (CUTLASS walks the tiles N-fastest, the
// raster order grouped_gemm picks for tall groups) and expect the same bytes.
// GroupedWgradTest.MatchesReference (same shapes x schedule): grads start random (accumulation), null-pointer and
// 0-row groups must stay bitwise unchanged, the rest equal init + x_g^T dy_g within 1e-4 of sum |terms| (double
// reference).
// GroupedGemmArgsTest.RejectsBadArguments: in not a multiple of 8, G = 0, a negative rows_capacity, a null gradient
// table -> evenep::Error.
// GroupedGemmArgsTest.GraphCaptureMatchesEagerCall: the forward call captured in a CUDA graph and replayed twice
// gives the eager call's result bitwise (hand-written and CUTLASS kernels).
// Kernels: kAuto (grouped_gemm.hpp: CUTLASS for bf16 output and the fp32 dgrad where built, else the Hopper
// kernel), kWgmma (the hand-written Hopper kernel), kMmaSync, and the CUTLASS kernels kCutlass / kCutlassPingpong
// (bf16 output, and kCutlass's fp32-output dgrad; skipped where not built or not Hopper). Shapes also cover
// Zipf-skewed group sizes ("zipf") and the planner's equal rows per group ("planner").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_testing.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using cuda::GemmOp;
using cuda::GemmSchedule;
using testing::DeviceArray;

struct Shape {
    std::string name;
    int in, out, G;
    std::vector<int> rows;  // per group; empty vector = random 0..300
    int null_group = -1;    // a group with rows but a null weight
};

struct Case {
    Shape shape;
    GemmOp op;
    bool fp32_out;
    GemmSchedule schedule;
    cuda::GemmKernel kernel = cuda::GemmKernel::kAuto;  // kAuto: the library's default choice (grouped_gemm.hpp)
    bool accumulate = true;                             // wgrad: dW += (true) or dW = (false)
};

std::string kernel_suffix(cuda::GemmKernel k) {
    switch (k) {
        case cuda::GemmKernel::kMmaSync:
            return "_mma";
        case cuda::GemmKernel::kWgmma:
            return "_wgmma";
        case cuda::GemmKernel::kCutlass:
            return "_cutlass";
        case cuda::GemmKernel::kCutlassPingpong:
            return "_cutlass_pingpong";
        default:
            return "";
    }
}
bool is_cutlass(cuda::GemmKernel k) {
    return k == cuda::GemmKernel::kCutlass || k == cuda::GemmKernel::kCutlassPingpong;
}
// The CUTLASS kernels run where they are built in (EVENEP_CUTLASS) and the device is an H100/H200; kWgmma on an
// H100/H200.
bool kernel_runs(cuda::GemmKernel k) {
    if (k == cuda::GemmKernel::kCutlassPingpong) return cuda::grouped_gemm_has_candidates();  // a tuning candidate
    if (is_cutlass(k)) return cuda::grouped_gemm_has_cutlass();
    return k != cuda::GemmKernel::kWgmma || cuda::grouped_gemm_has_wgmma();
}
#define EVENEP_SKIP_WITHOUT_KERNEL(kernel)                                                                   \
    do {                                                                                                     \
        if (!kernel_runs(kernel))                                                                            \
            GTEST_SKIP() << "kernel not built (EVENEP_CUTLASS, EVENEP_CUTLASS_CANDIDATES) or not supported " \
                            "by the device (H100/H200 only)";                                                \
    } while (0)

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    const Case& c = info.param;
    return c.shape.name + (c.op == GemmOp::kForward ? "_fwd" : "_dgrad") + (c.fp32_out ? "_f32" : "_bf16") +
           (c.schedule == GemmSchedule::kFixed ? "_fixed" : "_loadaware") + kernel_suffix(c.kernel);
}

uint16_t to_bits(float f) { return float_to_bf16(f).bits; }
float from_bits(uint16_t b) { return bf16_to_float(Bf16{b}); }

// The arguments every test fills the same way (bf16 output, forward, load-aware, kAuto unless changed after).
cuda::GroupedGemmArgs gemm_args(const uint16_t* x, const int32_t* cu, const uint16_t* const* weights, void* y, int G,
                                int in, int out, void* ws) {
    cuda::GroupedGemmArgs a;
    a.x = x;
    a.cu_seqlens = cu;
    a.weights = weights;
    a.y = y;
    a.num_groups = G;
    a.in_dim = in;
    a.out_dim = out;
    a.workspace = ws;
    return a;
}

class GroupedGemmTest : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedGemmTest, MatchesReference) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Case& c = GetParam();
    EVENEP_SKIP_WITHOUT_KERNEL(c.kernel);
    const uint64_t seed = std::hash<std::string>{}(case_name({c, 0})) & 0xFFFF;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int G = c.shape.G;
    std::vector<int> rows = c.shape.rows;
    if (rows.empty()) {
        std::uniform_int_distribution<int> d(0, 300);
        for (int g = 0; g < G; ++g) rows.push_back(d(rng));
    }
    ASSERT_EQ(static_cast<int>(rows.size()), G);
    std::vector<int32_t> cu(G);
    int total = 0;
    for (int g = 0; g < G; ++g) cu[g] = total += rows[g];
    const bool fwd = c.op == GemmOp::kForward;
    const int K = fwd ? c.shape.in : c.shape.out;  // x columns
    const int N = fwd ? c.shape.out : c.shape.in;  // y columns
    const size_t welems = static_cast<size_t>(c.shape.in) * c.shape.out;

    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<uint16_t> hx(static_cast<size_t>(std::max(total, 1)) * K);
    for (auto& v : hx) v = to_bits(u(rng));
    std::vector<std::vector<uint16_t>> hw(G);
    DeviceArray<uint16_t> dx(hx.size());
    dx.upload(hx);
    std::vector<DeviceArray<uint16_t>> dw;
    std::vector<const uint16_t*> table(G, nullptr);
    for (int g = 0; g < G; ++g) {
        if (rows[g] == 0 && g % 2 == 0) continue;  // some empty groups also have null weights
        hw[g].resize(welems);
        for (auto& v : hw[g]) v = to_bits(u(rng));
        dw.emplace_back(welems);
        dw.back().upload(hw[g]);
        if (g != c.shape.null_group) table[g] = dw.back().get();
    }
    DeviceArray<const uint16_t*> dtable(G);
    dtable.upload(table);
    DeviceArray<int32_t> dcu(G);
    dcu.upload(cu);
    const size_t yelems = static_cast<size_t>(std::max(total, 1)) * N;
    DeviceArray<uint8_t> dy(yelems * 4);
    EVENEP_CUDA_CHECK(cudaMemset(dy.get(), 0xFF, yelems * 4));  // NaN in both bf16 and fp32
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));

    cuda::GroupedGemmArgs a = gemm_args(dx.get(), dcu.get(), dtable.get(), dy.get(), G, c.shape.in, c.shape.out, ws.get());
    a.y_fp32 = c.fp32_out;
    a.op = c.op;
    a.schedule = c.schedule;
    a.kernel = c.kernel;
    cuda::grouped_gemm(a, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> hy = dy.download();

    const double tol_rel = c.fp32_out ? 1e-5 : 1.0 / 128;
    const double tol_abs = 1e-4 * std::sqrt(static_cast<double>(K));
    int bad = 0, poisoned_ok = 0;
    std::vector<float> wf(welems);
    for (int g = 0; g < G; ++g) {
        const int begin = g == 0 ? 0 : cu[g - 1];
        const bool empty = table[g] == nullptr || rows[g] == 0;
        if (!empty)
            for (size_t i = 0; i < welems; ++i) wf[i] = from_bits(hw[g][i]);
        for (int r = begin; r < cu[g]; ++r) {
            for (int n = 0; n < N; ++n) {
                const size_t off = static_cast<size_t>(r) * N + n;
                const float got = c.fp32_out ? reinterpret_cast<const float*>(hy.data())[off]
                                             : from_bits(reinterpret_cast<const uint16_t*>(hy.data())[off]);
                if (empty) {
                    poisoned_ok += std::isnan(got);
                    if (!std::isnan(got) && ++bad <= 5)
                        ADD_FAILURE() << "group " << g << " (empty/null) row " << r << " col " << n << " written";
                    continue;
                }
                double ref = 0;
                for (int k = 0; k < K; ++k) {
                    const double wv = fwd ? wf[static_cast<size_t>(k) * N + n] : wf[static_cast<size_t>(n) * K + k];
                    ref += static_cast<double>(from_bits(hx[static_cast<size_t>(r) * K + k])) * wv;
                }
                if (!(std::fabs(got - ref) <= tol_rel * std::fabs(ref) + tol_abs) && ++bad <= 5)
                    ADD_FAILURE() << "group " << g << " row " << r << " col " << n << ": got " << got << " ref " << ref;
            }
        }
    }
    EXPECT_EQ(bad, 0);
    if (c.shape.null_group >= 0) EXPECT_GT(poisoned_ok, 0);

    if (c.kernel == cuda::GemmKernel::kAuto || c.kernel == cuda::GemmKernel::kCutlass) {
        EVENEP_CUDA_CHECK(cudaMemset(dy.get(), 0xFF, yelems * 4));
        a.rows_capacity = static_cast<int64_t>(G) * N + 1;  // N-fastest: the same tiles, another order
        cuda::grouped_gemm(a, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(dy.download() == hy) << "rows_capacity " << a.rows_capacity << " (N-fastest) changed the result";
    }
}

std::vector<Case> all_cases() {
    const std::vector<Shape> shapes = {
        {"random", 256, 384, 12, {}},
        {"ragged_in200_out72", 200, 72, 9, {}},
        {"ragged_in72_out200", 72, 200, 7, {}},
        {"empty", 136, 264, 10, {0, 0, 37, 0, 0, 0, 129, 0, 5, 0}, 6},
        {"one_row", 128, 136, 16, std::vector<int>(16, 1)},
        {"single_group", 320, 256, 6, {0, 0, 0, 700, 0, 0}},
        {"tiny", 8, 8, 5, {3, 0, 130, 1, 17}},
        // Several k-blocks and column tiles, a long group (wgrad splits it into row chunks when load-aware).
        {"skewed_in264_out392", 264, 392, 6, {1100, 3, 0, 150, 64, 1}},
        // Zipf-skewed group sizes (rows_g ~ 1800 / (g + 1)^1.2) and the planner's equal rows per group.
        {"zipf", 256, 384, 10, {1800, 784, 482, 341, 261, 210, 175, 149, 130, 115}},
        {"planner", 256, 384, 8, std::vector<int>(8, 320)},
    };
    std::vector<Case> out;
    for (const Shape& s : shapes)
        for (GemmOp op : {GemmOp::kForward, GemmOp::kDgrad})
            for (bool f32 : {false, true})
                for (GemmSchedule sch : {GemmSchedule::kFixed, GemmSchedule::kLoadAware})
                    for (auto k : {cuda::GemmKernel::kAuto, cuda::GemmKernel::kWgmma, cuda::GemmKernel::kMmaSync,
                                   cuda::GemmKernel::kCutlass, cuda::GemmKernel::kCutlassPingpong}) {
                        // fp32 output: kCutlass runs CUTLASS's fp32 dgrad (the forward: kWgmma, see GemmKernel); the
                        // ping-pong kernel has none.
                        if (f32 && (k == cuda::GemmKernel::kCutlassPingpong ||
                                    (k == cuda::GemmKernel::kCutlass && op == GemmOp::kForward)))
                            continue;
                        out.push_back({s, op, f32, sch, k});
                    }
    return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedGemmTest, ::testing::ValuesIn(all_cases()), case_name);

class GroupedWgradTest : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedWgradTest, MatchesReference) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Case& c = GetParam();
    EVENEP_SKIP_WITHOUT_KERNEL(c.kernel);
    const uint64_t seed = (std::hash<std::string>{}(case_name({c, 0})) & 0xFFFF) + 1000;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int G = c.shape.G, in = c.shape.in, out = c.shape.out;
    std::vector<int> rows = c.shape.rows;
    if (rows.empty()) {
        std::uniform_int_distribution<int> d(0, 300);
        for (int g = 0; g < G; ++g) rows.push_back(d(rng));
    }
    std::vector<int32_t> cu(G);
    int total = 0;
    for (int g = 0; g < G; ++g) cu[g] = total += rows[g];
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<uint16_t> hx(static_cast<size_t>(std::max(total, 1)) * in),
        hdy(static_cast<size_t>(std::max(total, 1)) * out);
    for (auto& v : hx) v = to_bits(u(rng));
    for (auto& v : hdy) v = to_bits(u(rng));
    DeviceArray<uint16_t> dx(hx.size()), ddy(hdy.size());
    dx.upload(hx);
    ddy.upload(hdy);
    const size_t welems = static_cast<size_t>(in) * out;
    std::vector<std::vector<float>> init(G, std::vector<float>(welems));
    std::vector<DeviceArray<float>> dg;
    std::vector<float*> table(G, nullptr);
    for (int g = 0; g < G; ++g) {
        for (auto& v : init[g]) v = u(rng);
        dg.emplace_back(welems);
        dg.back().upload(init[g]);
        if (g != c.shape.null_group && !(rows[g] == 0 && g % 2 == 0)) table[g] = dg.back().get();
    }
    DeviceArray<float*> dtable(G);
    dtable.upload(table);
    DeviceArray<int32_t> dcu(G);
    dcu.upload(cu);
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));
    cuda::GroupedWgradArgs a;
    a.x = dx.get();
    a.dy = ddy.get();
    a.cu_seqlens = dcu.get();
    a.grads = dtable.get();
    a.num_groups = G;
    a.in_dim = in;
    a.out_dim = out;
    a.schedule = c.schedule;
    a.kernel = c.kernel;
    a.accumulate = c.accumulate;
    a.workspace = ws.get();
    cuda::grouped_gemm_wgrad(a, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    int bad = 0;
    for (int g = 0; g < G; ++g) {
        const std::vector<float> got = dg[g].download();
        const int begin = g == 0 ? 0 : cu[g - 1];
        if (table[g] == nullptr || rows[g] == 0) {
            EXPECT_EQ(got, init[g]) << "group " << g << " (skipped) changed";
            continue;
        }
        for (int i = 0; i < in; ++i)
            for (int o = 0; o < out; ++o) {
                double ref = c.accumulate ? init[g][static_cast<size_t>(i) * out + o] : 0.0, mag = std::fabs(ref);
                for (int r = begin; r < cu[g]; ++r) {
                    const double t = static_cast<double>(from_bits(hx[static_cast<size_t>(r) * in + i])) *
                                     from_bits(hdy[static_cast<size_t>(r) * out + o]);
                    ref += t;
                    mag += std::fabs(t);
                }
                const float v = got[static_cast<size_t>(i) * out + o];
                if (!(std::fabs(v - ref) <= 1e-4 * mag + 1e-6) && ++bad <= 5)
                    ADD_FAILURE() << "group " << g << " [" << i << ", " << o << "]: got " << v << " ref " << ref;
            }
    }
    EXPECT_EQ(bad, 0);
}

std::vector<Case> wgrad_cases() {
    std::vector<Case> out;
    for (const Case& c : all_cases())
        if (c.op == GemmOp::kForward && (c.fp32_out || is_cutlass(c.kernel))) {  // one per shape x schedule x
                                                                                 // kernel, both wgrad modes
            out.push_back(c);
            Case set = c;
            set.accumulate = false;
            out.push_back(set);
        }
    return out;
}

std::string wgrad_name(const ::testing::TestParamInfo<Case>& info) {
    return info.param.shape.name + (info.param.schedule == GemmSchedule::kFixed ? "_fixed" : "_loadaware") +
           kernel_suffix(info.param.kernel) + (info.param.accumulate ? "" : "_overwrite");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedWgradTest, ::testing::ValuesIn(wgrad_cases()), wgrad_name);

TEST(GroupedGemmArgsTest, RejectsBadArguments) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    DeviceArray<uint16_t> buf(64);
    DeviceArray<int32_t> cu(1);
    DeviceArray<const uint16_t*> tab(1);
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(1));
    cuda::GroupedGemmArgs a = gemm_args(buf.get(), cu.get(), tab.get(), buf.get(), 1, 12 /*not a multiple of 8*/, 8,
                                        ws.get());
    EXPECT_THROW(cuda::grouped_gemm(a, nullptr), Error);
    a.in_dim = 8;
    a.num_groups = 0;
    EXPECT_THROW(cuda::grouped_gemm(a, nullptr), Error);
    a.num_groups = 1;
    a.rows_capacity = -1;
    EXPECT_THROW(cuda::grouped_gemm(a, nullptr), Error);
    a.rows_capacity = 0;
    cuda::GroupedWgradArgs wa;
    wa.x = buf.get();
    wa.dy = buf.get();
    wa.cu_seqlens = cu.get();
    wa.num_groups = 1;
    wa.in_dim = 8;
    wa.out_dim = 8;
    wa.workspace = ws.get();
    EXPECT_THROW(cuda::grouped_gemm_wgrad(wa, nullptr), Error);  // null gradient table
}

TEST(GroupedGemmArgsTest, GraphCaptureMatchesEagerCall) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const int G = 4, in = 64, out = 136;
    const std::vector<int32_t> cu = {100, 100, 260, 263};
    const int rows = cu.back();
    DeviceArray<uint16_t> x(static_cast<size_t>(rows) * in), w(static_cast<size_t>(G) * in * out);
    cuda::fill_random_bf16(x.get(), x.size(), 7, 1.f, nullptr);
    cuda::fill_random_bf16(w.get(), w.size(), 8, 1.f, nullptr);
    std::vector<const uint16_t*> table(G);
    for (int g = 0; g < G; ++g) table[g] = w.get() + static_cast<size_t>(g) * in * out;
    DeviceArray<const uint16_t*> dtab(G);
    dtab.upload(table);
    DeviceArray<int32_t> dcu(G);
    dcu.upload(cu);
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));
    for (auto kernel : {cuda::GemmKernel::kAuto, cuda::GemmKernel::kWgmma, cuda::GemmKernel::kCutlass,
                        cuda::GemmKernel::kCutlassPingpong}) {
        SCOPED_TRACE(kernel_suffix(kernel));
        if (!kernel_runs(kernel)) continue;
        DeviceArray<uint16_t> y1(static_cast<size_t>(rows) * out), y2(static_cast<size_t>(rows) * out);
        cuda::GroupedGemmArgs a = gemm_args(x.get(), dcu.get(), dtab.get(), y1.get(), G, in, out, ws.get());
        a.kernel = kernel;
        cuda::grouped_gemm(a, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        cudaStream_t s;
        EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        a.y = y2.get();
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        EVENEP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        cuda::grouped_gemm(a, s);
        EVENEP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        EVENEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, s));
        EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, s));
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_EQ(y1.download(), y2.download());  // same tile decomposition: bitwise equal
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
    }
}

// A weight (or gradient) pointer that is not 16-byte aligned is rejected on the device: the group is skipped, the
// other groups are computed, and grouped_gemm_check names the first rejected group.
TEST(GroupedGemmArgsTest, MisalignedPointerIsReportedAndSkipped) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const int G = 4, in = 64, out = 128;
    const std::vector<int32_t> cu = {50, 120, 120, 200};  // group 2 is empty
    const int rows = cu.back();
    DeviceArray<uint16_t> x(static_cast<size_t>(rows) * out), w(static_cast<size_t>(G) * in * out + 8);
    cuda::fill_random_bf16(x.get(), x.size(), 21, 1.f, nullptr);
    cuda::fill_random_bf16(w.get(), w.size(), 22, 1.f, nullptr);
    DeviceArray<int32_t> dcu(G);
    dcu.upload(cu);
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));
    for (auto kernel :
         {cuda::GemmKernel::kAuto, cuda::GemmKernel::kWgmma, cuda::GemmKernel::kMmaSync, cuda::GemmKernel::kCutlass}) {
        SCOPED_TRACE(kernel_suffix(kernel));
        if (!kernel_runs(kernel)) continue;
        std::vector<const uint16_t*> table(G);
        for (int g = 0; g < G; ++g) table[g] = w.get() + static_cast<size_t>(g) * in * out;
        table[1] += 1;  // 2 bytes off: rejected
        table[2] += 3;  // misaligned but empty: not an error
        DeviceArray<const uint16_t*> dtab(G);
        dtab.upload(table);
        DeviceArray<uint16_t> y(static_cast<size_t>(rows) * out);
        EVENEP_CUDA_CHECK(cudaMemset(y.get(), 0xFF, y.size() * 2));
        cuda::GroupedGemmArgs a = gemm_args(x.get(), dcu.get(), dtab.get(), y.get(), G, in, out, ws.get());
        a.kernel = kernel;
        cuda::grouped_gemm(a, nullptr);
        try {
            cuda::grouped_gemm_check(ws.get(), G, nullptr);
            ADD_FAILURE() << "no error for a misaligned weight pointer";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("group 1 "), std::string::npos) << e.what();
        }
        const std::vector<uint16_t> hy = y.download();
        for (int r = 0; r < rows; ++r) {
            const bool skipped = r >= cu[0] && r < cu[1];
            const uint16_t v = hy[static_cast<size_t>(r) * out + 5];
            EXPECT_EQ(v == 0xFFFF, skipped) << "row " << r;
        }
        // A clean call clears the report.
        table[1] -= 1;
        dtab.upload(table);
        cuda::grouped_gemm(a, nullptr);
        EXPECT_NO_THROW(cuda::grouped_gemm_check(ws.get(), G, nullptr));
    }
}

// Peer-pointer groups: the weight table points into another GPU's memory (peer access over NVLink), as it does
// for a copy read straight from its owner. The result must equal, bit for bit, the same call with the weights
// copied to the local GPU. Needs two GPUs with peer access (skips otherwise).
TEST(GroupedGemmPeerTest, PeerWeightsMatchLocalWeights) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    int n = 0;
    EVENEP_CUDA_CHECK(cudaGetDeviceCount(&n));
    int can = 0;
    if (n >= 2) EVENEP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
    if (n < 2 || !can) GTEST_SKIP() << "needs two GPUs with peer access";
    const int G = 5, in = 384, out = 520;
    const std::vector<int32_t> cu = {300, 300, 813, 814, 1000};
    const int rows = cu.back();
    EVENEP_CUDA_CHECK(cudaSetDevice(1));
    DeviceArray<uint16_t> w_peer(static_cast<size_t>(G) * in * out);
    cuda::fill_random_bf16(w_peer.get(), w_peer.size(), 11, 1.f, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EVENEP_CUDA_CHECK(cudaSetDevice(0));
    const cudaError_t pe = cudaDeviceEnablePeerAccess(1, 0);
    if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) EVENEP_CUDA_CHECK(pe);
    (void)cudaGetLastError();
    DeviceArray<uint16_t> x(static_cast<size_t>(rows) * in), w_local(w_peer.size());
    cuda::fill_random_bf16(x.get(), x.size(), 12, 1.f, nullptr);
    EVENEP_CUDA_CHECK(cudaMemcpyPeer(w_local.get(), 0, w_peer.get(), 1, w_peer.size() * 2));
    DeviceArray<int32_t> dcu(G);
    dcu.upload(cu);
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));
    auto run = [&](const uint16_t* w, GemmOp op, cuda::GemmKernel kernel) {
        std::vector<const uint16_t*> table(G);
        for (int g = 0; g < G; ++g) table[g] = w + static_cast<size_t>(g) * in * out;
        DeviceArray<const uint16_t*> dtab(G);
        dtab.upload(table);
        const int ycols = op == GemmOp::kForward ? out : in;
        DeviceArray<uint16_t> y(static_cast<size_t>(rows) * ycols);
        DeviceArray<uint16_t> xin(static_cast<size_t>(rows) * (op == GemmOp::kForward ? in : out));
        cuda::fill_random_bf16(xin.get(), xin.size(), 13, 1.f, nullptr);
        cuda::GroupedGemmArgs a = gemm_args(xin.get(), dcu.get(), dtab.get(), y.get(), G, in, out, ws.get());
        a.op = op;
        a.kernel = kernel;
        cuda::grouped_gemm(a, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        return y.download();
    };
    for (GemmOp op : {GemmOp::kForward, GemmOp::kDgrad})
        for (auto kernel : {cuda::GemmKernel::kAuto, cuda::GemmKernel::kWgmma, cuda::GemmKernel::kMmaSync}) {
            if (!kernel_runs(kernel)) continue;
            SCOPED_TRACE(std::string(op == GemmOp::kForward ? "forward" : "dgrad") + kernel_suffix(kernel));
            const auto peer = run(w_peer.get(), op, kernel);
            const auto local = run(w_local.get(), op, kernel);
            EXPECT_EQ(peer, local);
            size_t nonzero = 0;
            for (uint16_t v : local) nonzero += (v & 0x7FFF) != 0;
            EXPECT_GT(nonzero, local.size() / 2);
        }
}

}  // namespace
}  // namespace evenep
