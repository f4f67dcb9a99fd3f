// tests/cuda/grouped_gemm_fp8_test.cu — the FP8 grouped GEMM (evenep::cuda::grouped_gemm_fp8, CUTLASS) against a
// float64 reference on the host computed from the same e4m3 codes and fp32 scales.
// Cases (GroupedGemmFp8Test.MatchesReference, parameterised over shape x op x scaling x schedule):
//   planner   8 groups of 320 rows (the planner's equal rows)
//   zipf      10 groups, rows ~ 1800 / (g + 1)^1.2
//   edges     empty groups (one with a null weight), one-row groups, a group of 129 rows (a partial tile)
//   deep      in 640, out 512: 5 k-tiles forward, 4 in dgrad (the overlapped consumer loop's pairs and both tails)
//   many_tiles 3 groups of 1200 rows, 640 x 640: 150 tiles, so that persistent blocks run more than one tile
//              (every 13th row checked, every row position of a tile over the groups)
// ops: forward (weights given as W^T [out][in]) and dgrad (W [in][out]); block_scaled (1 x 128 activation scales,
// 128 x 128 weight scales, random in [2^-4, 2^4)) and unscaled (scales ignored; the reference takes them as 1);
// schedules fixed and load-aware. Each case poisons y (NaN bits), then checks every row of every group with rows
// and a weight: |y - ref| <= 2^-7 |ref| + 2^-9 sum_k |terms| (bf16 output rounding, fp32 accumulation with the
// per-k-block promotion; the unscaled kernel's fast accumulation keeps fewer bits, within the same bound), and that
// rows of empty / null-weight groups keep the poison. Seeds fixed per case, printed on failure. The block-scaled
// cases run CUTLASS's consumer loop (Fp8Mainloop::kCutlass), then EvenEP's (kOverlapped) and CUTLASS's loop with the
// tiles walked N-fastest (rows_capacity above G x N: the raster order grouped_gemm picks for tall groups), and
// expect the same output, element by element; where the tuning candidates are built, the 128 x 256 tile
// (Fp8Mainloop::kOverlappedWide) is checked against the reference too.
// GroupedGemmFp8Wgrad.MatchesCpuReference: the FP8 wgrad (a tuning candidate) against the CPU reference (below).
// GroupedGemmFp8Test.RejectsBadArguments: in not a multiple of 128, null scales with block_scaled, a negative
// rows_capacity, a mainloop out of range -> evenep::Error.
// Skipped without a device, or where the CUTLASS kernels are not built (EVENEP_CUTLASS) or the device is not Hopper.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "cuda/gpu_testing.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using cuda::GemmOp;
using cuda::GemmSchedule;
using testing::DeviceArray;

#define EVENEP_SKIP_WITHOUT_CUTLASS()                                                                 \
    do {                                                                                              \
        EVENEP_SKIP_WITHOUT_DEVICE();                                                                 \
        if (!cuda::grouped_gemm_has_cutlass())                                                        \
            GTEST_SKIP() << "CUTLASS grouped GEMM not built (EVENEP_CUTLASS) or not a Hopper device"; \
    } while (0)

struct Fp8Case {
    std::string name;
    int in, out;
    std::vector<int> rows;
    int null_group = -1;
    int row_stride = 1;  // rows checked: every row_stride-th of each group (and its first); 1 = all
    GemmOp op = GemmOp::kForward;
    bool scaled = true;
    GemmSchedule schedule = GemmSchedule::kLoadAware;
};

std::string fp8_name(const ::testing::TestParamInfo<Fp8Case>& info) {
    const Fp8Case& c = info.param;
    return c.name + (c.op == GemmOp::kForward ? "_fwd" : "_dgrad") + (c.scaled ? "_scaled" : "_unscaled") +
           (c.schedule == GemmSchedule::kFixed ? "_fixed" : "_loadaware");
}

// e4m3 encode (round to nearest even, saturating) and exact decode: CUDA's host conversions (cuda_fp8.h).
uint8_t to_e4m3(float f) { return __nv_fp8_e4m3(f).__x; }
float from_e4m3(uint8_t b) {
    __nv_fp8_e4m3 v;
    v.__x = b;
    return static_cast<float>(v);
}

class GroupedGemmFp8Test : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GroupedGemmFp8Test, MatchesReference) {
    EVENEP_SKIP_WITHOUT_CUTLASS();
    const Fp8Case& c = GetParam();
    if (!c.scaled && !cuda::grouped_gemm_has_candidates())
        GTEST_SKIP() << "the unscaled anchor is a tuning candidate (EVENEP_CUTLASS_CANDIDATES)";
    const uint64_t seed = std::hash<std::string>{}(fp8_name({c, 0})) & 0xFFFF;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int G = static_cast<int>(c.rows.size()), in = c.in, out = c.out;
    const bool fwd = c.op == GemmOp::kForward;
    const int K = fwd ? in : out, N = fwd ? out : in;
    std::vector<int32_t> cu(G);
    int total = 0;
    for (int g = 0; g < G; ++g) cu[g] = total += c.rows[g];
    const int rows_alloc = std::max(total, 1);

    std::uniform_real_distribution<float> u(-1.f, 1.f), e(-4.f, 4.f);
    auto scale = [&] { return std::exp2(e(rng)); };
    std::vector<uint8_t> hx(static_cast<size_t>(rows_alloc) * K);
    for (auto& v : hx) v = to_e4m3(u(rng) * 448.f);
    std::vector<float> hxs(static_cast<size_t>(rows_alloc) * (K / 128));
    for (auto& v : hxs) v = scale();
    const size_t welems = static_cast<size_t>(in) * out, selems = welems / (128 * 128);
    std::vector<std::vector<uint8_t>> hw(G);  // logical W_g [in][out]
    std::vector<std::vector<float>> hws(G);   // [in/128][out/128]
    std::vector<DeviceArray<uint8_t>> dw;
    std::vector<DeviceArray<float>> dws;
    std::vector<const uint8_t*> wtab(G, nullptr);
    std::vector<const float*> stab(G, nullptr);
    for (int g = 0; g < G; ++g) {
        hw[g].resize(welems);
        for (auto& v : hw[g]) v = to_e4m3(u(rng) * 448.f);
        hws[g].resize(selems);
        for (auto& v : hws[g]) v = scale();
        std::vector<uint8_t> dev = hw[g];
        if (fwd)  // W^T [out][in]
            for (int i = 0; i < in; ++i)
                for (int o = 0; o < out; ++o)
                    dev[static_cast<size_t>(o) * in + i] = hw[g][static_cast<size_t>(i) * out + o];
        dw.emplace_back(welems);
        dw.back().upload(dev);
        dws.emplace_back(selems);
        dws.back().upload(hws[g]);
        if (g != c.null_group) wtab[g] = dw.back().get();
        stab[g] = dws.back().get();
    }
    DeviceArray<uint8_t> dx(hx.size());
    dx.upload(hx);
    DeviceArray<float> dxs(hxs.size());
    dxs.upload(hxs);
    DeviceArray<const uint8_t*> dwtab(G);
    dwtab.upload(wtab);
    DeviceArray<const float*> dstab(G);
    dstab.upload(stab);
    DeviceArray<int32_t> dcu(G);
    dcu.upload(cu);
    DeviceArray<uint16_t> dy(static_cast<size_t>(rows_alloc) * N);
    EVENEP_CUDA_CHECK(cudaMemset(dy.get(), 0xFF, dy.size() * 2));
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));

    const cuda::GroupedGemmFp8Args a{.x = dx.get(),
                                     .x_scales = dxs.get(),
                                     .cu_seqlens = dcu.get(),
                                     .weights = dwtab.get(),
                                     .weight_scales = dstab.get(),
                                     .y = dy.get(),
                                     .num_groups = G,
                                     .in_dim = in,
                                     .out_dim = out,
                                     .op = c.op,
                                     .schedule = c.schedule,
                                     .block_scaled = c.scaled,
                                     .mainloop = cuda::Fp8Mainloop::kCutlass,
                                     .workspace = ws.get()};
    cuda::grouped_gemm_fp8(a, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> hy = dy.download();

    // Every row of every group with rows and a weight within the bound of the reference; empty / null-weight
    // groups' rows keep the poison.
    auto check = [&](const std::vector<uint16_t>& y_host, const char* what) {
        int bad = 0, poisoned = 0;
        for (int g = 0; g < G; ++g) {
            const int begin = g == 0 ? 0 : cu[g - 1];
            const bool empty = wtab[g] == nullptr;
            for (int r = begin; r < cu[g]; r += r == begin ? 1 : c.row_stride)
                for (int n = 0; n < N; ++n) {
                    const float got = bf16_to_float(Bf16{y_host[static_cast<size_t>(r) * N + n]});
                    if (empty) {
                        poisoned += std::isnan(got);
                        if (!std::isnan(got) && ++bad <= 5)
                            ADD_FAILURE()
                                << what << ": group " << g << " (null weight) row " << r << " col " << n << " written";
                        continue;
                    }
                    double ref = 0, mag = 0;
                    for (int k = 0; k < K; ++k) {
                        const int i = fwd ? k : n, o = fwd ? n : k;  // W index [i][o]
                        double xv = from_e4m3(hx[static_cast<size_t>(r) * K + k]);
                        double wv = from_e4m3(hw[g][static_cast<size_t>(i) * out + o]);
                        if (c.scaled) {
                            xv *= hxs[static_cast<size_t>(r) * (K / 128) + k / 128];
                            wv *= hws[g][static_cast<size_t>(i / 128) * (out / 128) + o / 128];
                        }
                        ref += xv * wv;
                        mag += std::fabs(xv * wv);
                    }
                    if (!(std::fabs(got - ref) <= std::fabs(ref) / 128 + mag / 512) && ++bad <= 5)
                        ADD_FAILURE() << what << ": group " << g << " row " << r << " col " << n << ": got " << got
                                      << " ref " << ref << " (sum |terms| " << mag << ")";
                }
        }
        EXPECT_EQ(bad, 0) << what;
        if (c.null_group >= 0 && c.rows[c.null_group] > 0) EXPECT_GT(poisoned, 0) << what;
    };
    check(hy, "CUTLASS's loop");

    // EvenEP's consumer loop adds the same partial sums in the same order as CUTLASS's, and the raster order only
    // changes which tiles run together: the outputs are equal, element by element.
    if (!c.scaled) return;
    // The 128 x 256 tile (a tuning candidate): the same sums through n64 wgmma, checked against the reference.
    if (cuda::grouped_gemm_has_candidates()) {
        cuda::GroupedGemmFp8Args wide = a;
        wide.mainloop = cuda::Fp8Mainloop::kOverlappedWide;
        EVENEP_CUDA_CHECK(cudaMemset(dy.get(), 0xFF, dy.size() * 2));
        cuda::grouped_gemm_fp8(wide, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        check(dy.download(), "the 128 x 256 tile");
    }
    cuda::GroupedGemmFp8Args overlapped = a, along_n = a;
    overlapped.mainloop = cuda::Fp8Mainloop::kOverlapped;
    along_n.rows_capacity = static_cast<int64_t>(G) * N + 1;
    for (const auto& [what, v] : {std::pair{"EvenEP's consumer loop", overlapped}, std::pair{"N-fastest", along_n}}) {
        EVENEP_CUDA_CHECK(cudaMemset(dy.get(), 0xFF, dy.size() * 2));
        cuda::grouped_gemm_fp8(v, nullptr);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> hy2 = dy.download();
        int differ = 0;
        for (size_t i = 0; i < hy.size(); ++i) {
            const float x1 = bf16_to_float(Bf16{hy[i]}), x2 = bf16_to_float(Bf16{hy2[i]});
            if (!(x1 == x2 || (std::isnan(x1) && std::isnan(x2))) && ++differ <= 5)
                ADD_FAILURE() << "element " << i << ": " << what << " " << x2 << ", CUTLASS's loop " << x1;
        }
        EXPECT_EQ(differ, 0) << what;
    }
}

std::vector<Fp8Case> fp8_cases() {
    const std::vector<Fp8Case> shapes = {
        {"planner", 256, 384, std::vector<int>(8, 320)},
        {"zipf", 384, 256, {1800, 784, 482, 341, 261, 210, 175, 149, 130, 115}},
        {"edges", 256, 256, {0, 1, 129, 0, 1, 40, 0}, 5},
        // 5 k-tiles forward, 4 in dgrad: the consumer loop's paired steady state and both of its tails
        {"deep", 640, 512, {200, 0, 333, 64}},
        // 150 tiles of 128 x 128 in each op, more than an H100's / H200's 132 SMs: persistent blocks run a second
        // tile, whose accumulator must start from zero again
        {"many_tiles", 640, 640, {1200, 1200, 1200}, -1, /*row_stride=*/13},
    };
    std::vector<Fp8Case> out;
    for (const Fp8Case& s : shapes)
        for (GemmOp op : {GemmOp::kForward, GemmOp::kDgrad})
            for (bool scaled : {true, false})
                for (GemmSchedule sch : {GemmSchedule::kFixed, GemmSchedule::kLoadAware}) {
                    Fp8Case c = s;
                    c.op = op, c.scaled = scaled, c.schedule = sch;
                    out.push_back(c);
                }
    return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedGemmFp8Test, ::testing::ValuesIn(fp8_cases()), fp8_name);

TEST(GroupedGemmFp8ArgsTest, RejectsBadArguments) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    DeviceArray<uint8_t> buf(1 << 16);
    DeviceArray<int32_t> cu(1);
    DeviceArray<const uint8_t*> tab(1);
    DeviceArray<const float*> stab(1);
    DeviceArray<float> xs(64);
    DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(1));
    cuda::GroupedGemmFp8Args a{.x = buf.get(),
                               .x_scales = xs.get(),
                               .cu_seqlens = cu.get(),
                               .weights = tab.get(),
                               .weight_scales = stab.get(),
                               .y = reinterpret_cast<uint16_t*>(buf.get()),
                               .num_groups = 1,
                               .in_dim = 192 /*not a multiple of 128*/,
                               .out_dim = 128,
                               .workspace = ws.get()};
    EXPECT_THROW(cuda::grouped_gemm_fp8(a, nullptr), Error);
    a.in_dim = 128;
    a.x_scales = nullptr;
    EXPECT_THROW(cuda::grouped_gemm_fp8(a, nullptr), Error);
    a.x_scales = xs.get();
    a.rows_capacity = -1;
    EXPECT_THROW(cuda::grouped_gemm_fp8(a, nullptr), Error);
    a.rows_capacity = 0;
    a.mainloop = static_cast<cuda::Fp8Mainloop>(7);
    EXPECT_THROW(cuda::grouped_gemm_fp8(a, nullptr), Error);
}

// FP8 wgrad (grouped_gemm_wgrad_fp8, a tuning candidate) against cpu::grouped_gemm_wgrad_fp8 on the same wgrad cols
// casts (cpu::quantize_cols_fp8). Groups of {128, 0, 256, 48, 208, 16} rows (starts multiples of 16, partial last
// blocks, an empty group with a null gradient) in a buffer of 720 rows, then {8, 120, 64}, whose group 1 starts at
// row 8 (rejected: skipped, its gradient untouched, grouped_gemm_check names it). accumulate (from 0.25) and
// overwrite: |got - ref| <= 2^-7 |ref| + 2^-9 (sum over the rows of |x' dy'| + |init|) per element, x' dy' the
// dequantised operands (the forward's bound: Hopper's FP8 tensor cores accumulate a block in reduced precision).
TEST(GroupedGemmFp8Wgrad, MatchesCpuReference) {
    EVENEP_SKIP_WITHOUT_CUTLASS();
    if (!cuda::grouped_gemm_has_candidates()) GTEST_SKIP() << "tuning candidates not built (EVENEP_CUTLASS_CANDIDATES)";
    const int in = 256, out = 384;
    const int64_t capacity = 720;
    for (const std::vector<int32_t>& group_rows :
         {std::vector<int32_t>{128, 0, 256, 48, 208, 16}, std::vector<int32_t>{8, 120, 64}}) {
        const bool misaligned = group_rows[0] == 8;  // group 1 starts at row 8
        const testing::GroupRows groups = testing::group_rows(group_rows);
        const std::vector<int32_t>&cu = groups.cu, &count = groups.count;
        const int64_t rows = groups.rows;
        const int G = static_cast<int>(cu.size());
        auto values = [&](int dim, uint64_t seed) {
            std::vector<Bf16> v(static_cast<size_t>(capacity) * dim);
            for (size_t i = 0; i < v.size(); ++i) v[i] = detail::random_bf16(detail::hash64(seed, i), 1.0f);
            for (int64_t r = 0; r < rows; r += 53) v[static_cast<size_t>(r * dim + 9)] = float_to_bf16(60.0f);
            return v;
        };
        const std::vector<Bf16> x = values(in, 71), dy = values(out, 72);
        const int64_t ld = fp8_cols_ld(capacity), nsr = fp8_cols_scale_rows(capacity, G);
        std::vector<Fp8E4m3> xc(static_cast<size_t>(in * ld)), dyc(static_cast<size_t>(out * ld));
        std::vector<float> xs(static_cast<size_t>(nsr * in)), dys(static_cast<size_t>(nsr * out));
        cpu::quantize_cols_fp8(cpu::GroupedGemmShape{cu, count, in, in}, capacity, x, false, xc, xs);
        cpu::quantize_cols_fp8(cpu::GroupedGemmShape{cu, count, out, out}, capacity, dy, false, dyc, dys);
        DeviceArray<Fp8E4m3> d_xc(xc.size()), d_dyc(dyc.size());
        DeviceArray<float> d_xs(xs.size()), d_dys(dys.size());
        DeviceArray<int32_t> d_cu(cu.size());
        d_xc.upload(xc);
        d_dyc.upload(dyc);
        d_xs.upload(xs);
        d_dys.upload(dys);
        d_cu.upload(cu);
        DeviceArray<uint8_t> ws(cuda::grouped_gemm_workspace_bytes(G));
        for (bool accumulate : {true, false}) {
            SCOPED_TRACE(std::string(accumulate ? "accumulate" : "overwrite") + (misaligned ? ", misaligned" : ""));
            const float init = 0.25f;
            std::vector<std::vector<float>> want(G, std::vector<float>(static_cast<size_t>(in) * out, init));
            std::vector<float*> want_ptr(G), table(G);
            std::vector<DeviceArray<float>> dgrad;
            for (int g = 0; g < G; ++g) {
                want_ptr[g] = group_rows[g] == 0 ? nullptr : want[g].data();
                dgrad.emplace_back(static_cast<size_t>(in) * out);
                dgrad.back().upload(want[g]);
                table[g] = group_rows[g] == 0 ? nullptr : dgrad.back().get();
            }
            cpu::grouped_gemm_wgrad_fp8(cpu::GroupedGemmShape{cu, count, in, out}, capacity, xc, xs, dyc, dys, want_ptr,
                                        accumulate);
            DeviceArray<float*> d_table(G);
            d_table.upload(table);
            cuda::GroupedWgradFp8Args a;
            a.x_cols = reinterpret_cast<const uint8_t*>(d_xc.get()), a.x_col_scales = d_xs.get();
            a.dy_cols = reinterpret_cast<const uint8_t*>(d_dyc.get()), a.dy_col_scales = d_dys.get();
            a.cu_seqlens = d_cu.get(), a.grads = d_table.get(), a.num_groups = G, a.in_dim = in, a.out_dim = out;
            a.capacity = capacity, a.accumulate = accumulate, a.workspace = ws.get();
            cuda::grouped_gemm_wgrad_fp8(a, nullptr);
            EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
            if (misaligned) {
                EXPECT_THROW(cuda::grouped_gemm_check(ws.get(), G, nullptr), Error);
            } else {
                EXPECT_NO_THROW(cuda::grouped_gemm_check(ws.get(), G, nullptr));
            }
            int bad = 0;
            for (int g = 0; g < G; ++g) {
                if (group_rows[g] == 0) continue;
                const std::vector<float> got = dgrad[g].download(static_cast<size_t>(in) * out);
                if (misaligned && g == 1) {  // skipped: untouched
                    EXPECT_EQ(got, std::vector<float>(got.size(), init));
                    continue;
                }
                const int64_t begin = g == 0 ? 0 : cu[g - 1];
                for (int i = 0; i < in; ++i)
                    for (int o = 0; o < out; ++o) {
                        double mag = std::fabs(init);
                        for (int64_t r = begin; r < cu[g]; ++r) {
                            const int64_t sr = fp8_cols_block(begin, g) + (r - begin) / kFp8Block;
                            mag += std::fabs(static_cast<double>(e4m3_to_float(xc[i * ld + r])) * xs[sr * in + i] *
                                             e4m3_to_float(dyc[o * ld + r]) * dys[sr * out + o]);
                        }
                        const float w = want[g][static_cast<size_t>(i) * out + o];
                        const float v = got[static_cast<size_t>(i) * out + o];
                        if (!(std::fabs(v - w) <= std::fabs(w) / 128 + mag / 512) && ++bad <= 5)
                            ADD_FAILURE() << "group " << g << " [" << i << ", " << o << "]: got " << v << " want " << w
                                          << " (sum |terms| " << mag << ")";
                    }
            }
            EXPECT_EQ(bad, 0);
        }
    }
}

}  // namespace
}  // namespace evenep
