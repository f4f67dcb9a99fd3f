// tests/cuda/fp8_cast_test.cu — the FP8 cast kernels (src/cuda/kernels/fp8.cu) against the CPU oracle's casts
// (cpu::quantize_rows_fp8, cpu::quantize_weight_fp8): codes and scales bit for bit (docs/fp8.md).
//
// Cases:
//   Fp8CastTest.RowsBitwise/<scales>    37 rows x 384 (3 blocks): random values, an outlier block, a zero block,
//                                       a block of values around the e4m3 subnormal range, a block of -0: codes and
//                                       scales equal the CPU's; the non-finite flag stays 0. fp32 and UE8M0 scales.
//   Fp8CastTest.WeightBitwise/<scales>  a 256 x 384 matrix (2 x 3 blocks) with an outlier in one block and a zero
//                                       block: codes and scales equal the CPU's.
//   Fp8CastTest.WeightsBatchedTransposed/<scales>  launch_fp8_cast_weights: 3 matrices of 256 x 384 at padded strides
//                                       in one launch, with the transposed codes: each matrix's codes and scales equal
//                                       the CPU's, its transposed codes are the codes' transpose, and the padding
//                                       between matrices is untouched.
//   Fp8CastTest.RowsManyBitwise/<scales>  600 rows x 16384 (76800 blocks: more than one grid-stride round of the
//                                       row cast) and 33 x 640 (a step past the last block): codes and scales equal the
//                                       CPU's.
//   Fp8CastTest.ColsBitwise/<scales>   launch_fp8_cast_cols (the wgrad operands) on 7 groups with starts off 16 rows
//                                       (byte stores) and 5 with starts on them, capacity past the rows: codes and
//                                       scales equal cpu::quantize_cols_fp8's, the code columns past the rows 0.
//   Fp8CastHardware.EveryFloat           device::e4m3x2 (cvt.rn.satfinite.e4m3x2.f32, the casts' rounding) equals
//                                       float_to_e4m3 (the CPU's) on all 2^32 float bit patterns (NaN: a NaN code).
//   Fp8Transpose.GroupsWithRows          launch_fp8_transpose_groups on 4 groups of 256 x 384 codes (rows, no rows, a
//                                       null weight, rows): the groups with rows and a weight get their transpose and
//                                       their table entry, the others a null entry; a bad shape is refused by value.
//   Fp8CastFlags.FlagsNonFinite          a NaN in a row, an inf in a weight: the flag is raised; finite input
//                                       leaves it 0.
//   Fp8CastFlags.RejectsBadShapes        dim 200, weight 128 x 100, a misaligned row: evenep::Error naming the value;
//                                       rows = 0: nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "cuda/device/fp8_vec.cuh"
#include "cuda/gpu_testing.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/cuda/fp8_cast.hpp"
#include "evenep/cuda/fp8_transpose.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using cuda::DeviceArray;

std::vector<Bf16> random_values(size_t n, uint64_t seed, float scale) {
    std::vector<Bf16> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = detail::random_bf16(detail::hash64(seed, i), scale);
    return v;
}

std::vector<uint8_t> bytes_of(const std::vector<Fp8E4m3>& v) {
    std::vector<uint8_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
    return b;
}

// launch_fp8_cast_rows of x [rows, dim]: codes and scales equal cpu::quantize_rows_fp8's bit for bit, no flag.
void expect_rows_cast_like_cpu(const std::vector<Bf16>& x, int64_t rows, int dim, bool ue8m0) {
    const int spr = dim / kFp8Block;
    std::vector<Fp8E4m3> want(x.size());
    std::vector<float> want_s(static_cast<size_t>(rows) * spr);
    cpu::quantize_rows_fp8(x, rows, dim, ue8m0, want, want_s);
    DeviceArray<Bf16> d_x(x.size());
    DeviceArray<Fp8E4m3> d_q(x.size());
    DeviceArray<float> d_s(want_s.size());
    DeviceArray<uint32_t> d_flag(1);
    d_x.upload(x.data(), x.size());
    cuda::launch_fp8_cast_rows(d_x.get(), rows, dim, ue8m0, d_q.get(), d_s.get(), d_flag.get(), nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(bytes_of(d_q.download(x.size())), bytes_of(want)) << rows << " x " << dim;
    const auto got_s = d_s.download(want_s.size());
    for (size_t i = 0; i < want_s.size(); ++i)
        ASSERT_EQ(float_as_bits(got_s[i]), float_as_bits(want_s[i])) << rows << " x " << dim << ", scale " << i;
    EXPECT_EQ(d_flag.download(1)[0], 0u);
}

class Fp8CastTest : public ::testing::TestWithParam<bool> {};

TEST_P(Fp8CastTest, RowsBitwise) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const bool ue8m0 = GetParam();
    const int64_t rows = 37;
    const int dim = 384;
    std::vector<Bf16> x = random_values(static_cast<size_t>(rows) * dim, 101, 2.0f);
    x[5 * dim + 7] = float_to_bf16(-5000.0f);                                  // outlier in row 5, block 0
    for (int i = 0; i < kFp8Block; ++i) x[9 * dim + 128 + i] = Bf16{0};        // zero block
    for (int i = 0; i < kFp8Block; ++i) x[11 * dim + 256 + i] = Bf16{0x8000};  // -0 block
    for (int i = 0; i < kFp8Block; ++i)                                        // tiny values
        x[13 * dim + i] = float_to_bf16(std::ldexp(static_cast<float>(i % 17) - 8.0f, -120));
    expect_rows_cast_like_cpu(x, rows, dim, ue8m0);
}

TEST_P(Fp8CastTest, WeightBitwise) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const bool ue8m0 = GetParam();
    const int in = 256, out = 384;
    std::vector<Bf16> w = random_values(static_cast<size_t>(in) * out, 103, 0.05f);
    w[130 * out + 200] = float_to_bf16(30.0f);  // outlier in block (1, 1)
    for (int r = 0; r < kFp8Block; ++r)
        for (int c = 0; c < kFp8Block; ++c) w[r * out + 256 + c] = Bf16{0};  // block (0, 2) zero
    std::vector<Fp8E4m3> want(w.size());
    std::vector<float> want_s(2 * 3);
    cpu::quantize_weight_fp8(w.data(), in, out, ue8m0, want.data(), want_s.data());

    DeviceArray<Bf16> d_w(w.size());
    DeviceArray<Fp8E4m3> d_q(w.size());
    DeviceArray<float> d_s(want_s.size());
    d_w.upload(w.data(), w.size());
    cuda::launch_fp8_cast_weight(d_w.get(), in, out, ue8m0, d_q.get(), d_s.get(), nullptr, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(bytes_of(d_q.download(w.size())), bytes_of(want));
    const auto got_s = d_s.download(want_s.size());
    for (size_t i = 0; i < want_s.size(); ++i)
        ASSERT_EQ(float_as_bits(got_s[i]), float_as_bits(want_s[i])) << "scale " << i;
}

TEST_P(Fp8CastTest, WeightsBatchedTransposed) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const bool ue8m0 = GetParam();
    const int in = 256, out = 384, count = 3;
    const size_t elems = static_cast<size_t>(in) * out, w_stride = elems + 64, c_stride = elems + 256;
    const size_t s_stride = 8;  // 6 scales, padded
    std::vector<Bf16> w = random_values(w_stride * count, 107, 0.05f);
    w[w_stride + 130 * out + 200] = float_to_bf16(-30.0f);  // matrix 1: outlier in block (1, 1)
    for (int r = 0; r < kFp8Block; ++r)
        for (int c = 0; c < kFp8Block; ++c) w[2 * w_stride + r * out + 256 + c] = Bf16{0};  // matrix 2: zero block
    DeviceArray<Bf16> d_w(w.size());
    DeviceArray<Fp8E4m3> d_q(c_stride * count), d_t(c_stride * count);
    DeviceArray<float> d_s(s_stride * count);
    d_w.upload(w.data(), w.size());
    EVENEP_CUDA_CHECK(cudaMemset(d_q.get(), 0x5A, c_stride * count));
    EVENEP_CUDA_CHECK(cudaMemset(d_t.get(), 0x5A, c_stride * count));
    cuda::Fp8WeightCast c;
    c.w = d_w.get(), c.w_stride = static_cast<int64_t>(w_stride), c.count = count, c.in = in, c.out = out;
    c.ue8m0 = ue8m0, c.codes = d_q.get(), c.transposed = d_t.get(), c.codes_stride = static_cast<int64_t>(c_stride);
    c.scales = d_s.get(), c.scale_stride = static_cast<int64_t>(s_stride);
    cuda::launch_fp8_cast_weights(c, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> q = bytes_of(d_q.download(c_stride * count));
    const std::vector<uint8_t> t = bytes_of(d_t.download(c_stride * count));
    const std::vector<float> s = d_s.download(s_stride * count);
    for (int m = 0; m < count; ++m) {
        std::vector<Fp8E4m3> want(elems);
        std::vector<float> want_s(6);
        cpu::quantize_weight_fp8(w.data() + m * w_stride, in, out, ue8m0, want.data(), want_s.data());
        for (size_t i = 0; i < 6; ++i)
            ASSERT_EQ(float_as_bits(s[m * s_stride + i]), float_as_bits(want_s[i])) << "matrix " << m << " scale " << i;
        for (int r = 0; r < in; ++r)
            for (int col = 0; col < out; ++col) {
                const size_t i = static_cast<size_t>(r) * out + col;
                ASSERT_EQ(q[m * c_stride + i], want[i].bits) << "matrix " << m << " code (" << r << ", " << col << ")";
                ASSERT_EQ(t[m * c_stride + static_cast<size_t>(col) * in + r], want[i].bits)
                    << "matrix " << m << " transposed code (" << col << ", " << r << ")";
            }
        for (size_t i = elems; i < c_stride; ++i) {
            ASSERT_EQ(q[m * c_stride + i], 0x5A) << "matrix " << m << " padding " << i;
            ASSERT_EQ(t[m * c_stride + i], 0x5A) << "matrix " << m << " transposed padding " << i;
        }
    }
}

TEST_P(Fp8CastTest, RowsManyBitwise) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const bool ue8m0 = GetParam();
    for (const auto& [rows, dim] : {std::pair<int64_t, int>{600, 16384}, {33, 640}}) {
        std::vector<Bf16> x = random_values(static_cast<size_t>(rows) * dim, 113 + dim, 3.0f);
        x[static_cast<size_t>(rows - 1) * dim + dim - 1] = float_to_bf16(-900.0f);  // outlier in the last block
        expect_rows_cast_like_cpu(x, rows, dim, ue8m0);
    }
}

// launch_fp8_cast_cols against cpu::quantize_cols_fp8: every code byte (both buffers start poisoned 0x55) and every
// scale (both start -1: the rows of no block stay so), bit for bit; the flag stays 0.
void expect_cols_cast_like_cpu(const std::vector<int32_t>& group_rows, int64_t capacity, int dim, bool ue8m0) {
    const testing::GroupRows groups = testing::group_rows(group_rows);
    const std::vector<int32_t>&cu = groups.cu, &count = groups.count;
    const int64_t rows = groups.rows;
    const int G = static_cast<int>(cu.size());
    std::vector<Bf16> x = random_values(static_cast<size_t>(capacity) * dim, 303, 2.0f);
    for (int64_t r = 0; r < rows; r += 61) x[static_cast<size_t>(r * dim + 3)] = float_to_bf16(-900.0f);  // outliers
    for (int64_t r = 0; r < std::min<int64_t>(rows, 40); ++r) x[static_cast<size_t>(r * dim + 70)] = Bf16{0x8000};
    for (int64_t r = 0; r < rows; ++r)  // a channel of tiny values
        x[static_cast<size_t>(r * dim + 200)] = float_to_bf16(std::ldexp(static_cast<float>(r % 17) - 8.0f, -120));
    const size_t ncodes = static_cast<size_t>(dim * fp8_cols_ld(capacity));
    const size_t nscales = static_cast<size_t>(fp8_cols_scale_rows(capacity, G) * dim);
    std::vector<Fp8E4m3> want(ncodes, Fp8E4m3{0x55});
    std::vector<float> want_s(nscales, -1.0f);
    cpu::quantize_cols_fp8(cpu::GroupedGemmShape{cu, count, dim, dim}, capacity, x, ue8m0, want, want_s);
    DeviceArray<Bf16> d_x(x.size());
    DeviceArray<int32_t> d_cu(cu.size());
    DeviceArray<Fp8E4m3> d_q(ncodes);
    DeviceArray<float> d_s(nscales);
    DeviceArray<uint32_t> d_flag(1);
    d_x.upload(x.data(), x.size());
    d_cu.upload(cu);
    d_q.upload(std::vector<Fp8E4m3>(ncodes, Fp8E4m3{0x55}));
    d_s.upload(std::vector<float>(nscales, -1.0f));
    EVENEP_CUDA_CHECK(cudaMemset(d_flag.get(), 0, 4));
    cuda::Fp8ColsCast c;
    c.in = d_x.get(), c.cu_seqlens = d_cu.get(), c.num_groups = G, c.capacity = capacity, c.dim = dim;
    c.ue8m0 = ue8m0, c.codes = d_q.get(), c.scales = d_s.get(), c.nonfinite = d_flag.get();
    cuda::launch_fp8_cast_cols(c, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = bytes_of(d_q.download(ncodes)), exp = bytes_of(want);
    const int64_t ld = fp8_cols_ld(capacity);
    int bad = 0;
    for (size_t i = 0; i < ncodes && bad < 5; ++i)
        if (got[i] != exp[i])
            ADD_FAILURE() << "code [" << i / ld << "][" << i % ld << "]: got " << int(got[i]) << " want " << int(exp[i])
                          << (++bad, "");
    const auto got_s = d_s.download(nscales);
    for (size_t i = 0; i < nscales; ++i)
        ASSERT_EQ(float_as_bits(got_s[i]), float_as_bits(want_s[i])) << "scale [" << i / dim << "][" << i % dim << "]";
    EXPECT_EQ(d_flag.download(1)[0], 0u);
}

TEST_P(Fp8CastTest, ColsBitwise) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    // Group starts not multiples of 16 (byte stores), an empty first and middle group, partial blocks; then starts
    // that are multiples of 16 (16-byte stores), capacity past the groups' rows.
    expect_cols_cast_like_cpu({0, 1, 129, 0, 300, 16, 384}, 850, 256, GetParam());
    expect_cols_cast_like_cpu({128, 0, 256, 64, 200}, 700, 384, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Scales, Fp8CastTest, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& info) {
    return std::string(info.param ? "ue8m0" : "fp32");
});

TEST(Fp8CastFlags, FlagsNonFinite) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    std::vector<Bf16> x = random_values(2 * 128, 107, 1.0f);
    x[200] = float_to_bf16(std::nanf(""));
    DeviceArray<Bf16> d_x(x.size());
    DeviceArray<Fp8E4m3> d_q(x.size());
    DeviceArray<float> d_s(2);
    DeviceArray<uint32_t> d_flag(1);
    d_x.upload(x.data(), x.size());
    cuda::launch_fp8_cast_rows(d_x.get(), 2, 128, false, d_q.get(), d_s.get(), d_flag.get(), nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_flag.download(1)[0], 1u);

    std::vector<Bf16> w = random_values(128 * 128, 109, 1.0f);
    w[77] = float_to_bf16(INFINITY);
    DeviceArray<Bf16> d_w(w.size());
    DeviceArray<Fp8E4m3> d_wq(w.size());
    DeviceArray<float> d_ws(1);
    DeviceArray<uint32_t> d_wflag(1);
    d_w.upload(w.data(), w.size());
    cuda::launch_fp8_cast_weight(d_w.get(), 128, 128, false, d_wq.get(), d_ws.get(), d_wflag.get(), nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_wflag.download(1)[0], 1u);
}

// Pairs (i, i + 1) of float bit patterns through device::e4m3x2 against float_to_e4m3; counts the mismatches and
// keeps the smallest mismatching pattern.
__global__ void e4m3_cvt_mismatches(unsigned long long* bad, unsigned* first) {
    const uint64_t stride = 2ull * gridDim.x * blockDim.x;
    for (uint64_t i = 2ull * (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x); i < (1ull << 32);
         i += stride) {
        const float a = bits_as_float(static_cast<uint32_t>(i)), b = bits_as_float(static_cast<uint32_t>(i + 1));
        const uint32_t hw = cuda::device::e4m3x2(a, b);
        for (int h = 0; h < 2; ++h) {
            const float f = h ? b : a;
            const uint32_t got = (hw >> (8 * h)) & 0xFFu, want = float_to_e4m3(f).bits;
            const bool same = isnan(f) ? (got & 0x7Fu) == 0x7Fu : got == want;
            if (!same) {
                atomicAdd(bad, 1ull);
                atomicMin(first, static_cast<unsigned>(i + h));
            }
        }
    }
}

TEST(Fp8CastHardware, EveryFloat) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    DeviceArray<unsigned long long> bad(1);
    DeviceArray<unsigned> first(1);
    const unsigned none = 0xFFFFFFFFu;
    first.upload(&none, 1);
    e4m3_cvt_mismatches<<<1024, 256>>>(bad.get(), first.get());
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(bad.download(1)[0], 0ull) << "first mismatching float bits 0x" << std::hex << first.download(1)[0];
}

TEST(Fp8Transpose, GroupsWithRows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const int G = 4, in = 256, out = 384;
    const size_t mat = static_cast<size_t>(in) * out;
    std::vector<uint8_t> codes(G * mat);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(detail::hash64(7, i));
    DeviceArray<uint8_t> d_codes(codes.size()), d_t(G * mat);
    d_codes.upload(codes.data(), codes.size());
    const std::vector<int32_t> cu = {5, 5, 9, 12};  // group 1 has no rows
    std::vector<const uint8_t*> table(G);
    for (int g = 0; g < G; ++g) table[g] = g == 2 ? nullptr : d_codes.get() + g * mat;  // group 2: no weight
    DeviceArray<int32_t> d_cu(G);
    DeviceArray<const uint8_t*> d_table(G), d_out(G);
    d_cu.upload(cu.data(), G);
    d_table.upload(table.data(), G);
    const std::vector<uint8_t> fill(G * mat, 0xAB);
    d_t.upload(fill.data(), fill.size());
    cuda::Fp8GroupTranspose t;
    t.weights = d_table.get(), t.cu_seqlens = d_cu.get(), t.num_groups = G, t.in_dim = in, t.out_dim = out;
    t.transposed = d_t.get(), t.transposed_table = d_out.get();
    cuda::launch_fp8_transpose_groups(t, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<const uint8_t*> got_table = d_out.download(G);
    const std::vector<uint8_t> got = d_t.download(G * mat);
    for (int g = 0; g < G; ++g) {
        const bool copied = g == 0 || g == 3;
        EXPECT_EQ(got_table[g], copied ? d_t.get() + g * mat : nullptr) << "group " << g;
        int64_t wrong = 0;
        for (int r = 0; r < in; ++r)
            for (int c = 0; c < out; ++c) {
                const uint8_t want = copied ? codes[g * mat + static_cast<size_t>(r) * out + c] : 0xAB;
                wrong += got[g * mat + static_cast<size_t>(c) * in + r] != want;
            }
        EXPECT_EQ(wrong, 0) << "group " << g;
    }
    t.out_dim = 200;
    try {
        cuda::launch_fp8_transpose_groups(t, nullptr);
        ADD_FAILURE() << "out 200 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("256 x 200"), std::string::npos) << e.what();
    }
}

TEST(Fp8CastFlags, RejectsBadShapes) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    DeviceArray<Bf16> d(128 * 256);
    DeviceArray<Fp8E4m3> q(128 * 256);
    DeviceArray<float> s(4);
    try {
        cuda::launch_fp8_cast_rows(d.get(), 1, 200, false, q.get(), s.get(), nullptr, nullptr);
        ADD_FAILURE() << "dim 200 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dim = 200"), std::string::npos) << e.what();
    }
    EXPECT_THROW(cuda::launch_fp8_cast_weight(d.get(), 128, 100, false, q.get(), s.get(), nullptr, nullptr), Error);
    try {  // the row cast loads 16-byte vectors
        cuda::launch_fp8_cast_rows(d.get() + 1, 1, 128, false, q.get(), s.get(), nullptr, nullptr);
        ADD_FAILURE() << "a misaligned row accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
    }
    cuda::launch_fp8_cast_rows(nullptr, 0, 128, false, nullptr, nullptr, nullptr, nullptr);  // nothing to do
}

}  // namespace
}  // namespace evenep
