// detail::row_grad (evenep/detail/row_grad.hpp): the weighted combine's row backward in the CUDA kernel's order.
// Cases:
//   RowGrad.LaneOrderAndButterfly  H = 8 .. 1032 (1 to 129 vectors: lanes with 0 to 5 vectors): dw equals the
//       definition written out (32 lane sums of 8-value vectors l, l+32, ..., then the xor butterfly) bit for bit;
//       dy = bf16(w * g) for every value
//   RowGrad.InPlace                dy aliasing g gives the same dw and dy as separate memory
//   RowGrad.OrderIsNotSequential   a row where the sequential fp32 sum differs from the lane order (cancellation):
//       row_grad follows the lane order
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "evenep/detail/bf16.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/detail/row_grad.hpp"

namespace evenep {
namespace {

std::vector<Bf16> random_row(int64_t n, uint64_t seed) {
    std::vector<Bf16> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = detail::random_bf16(detail::hash64(seed * 1000003ull + i), 4.0f);
    return v;
}

float lane_order_dot(const std::vector<Bf16>& g, const std::vector<Bf16>& y) {
    const int64_t vecs = static_cast<int64_t>(g.size()) / 8;
    float lane[32];
    for (int l = 0; l < 32; ++l) {
        float acc = 0.0f;
        for (int64_t c = l; c < vecs; c += 32)
            for (int j = 0; j < 8; ++j) {
                const volatile float p = bf16_to_float(g[c * 8 + j]) * bf16_to_float(y[c * 8 + j]);
                acc = acc + p;
            }
        lane[l] = acc;
    }
    for (int m = 16; m >= 1; m /= 2) {
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ m];
        for (int l = 0; l < 32; ++l) lane[l] = next[l];
    }
    return lane[0];
}

TEST(RowGrad, LaneOrderAndButterfly) {
    for (int64_t H : {8, 64, 256, 264, 520, 1032}) {
        const std::vector<Bf16> g = random_row(H, H), y = random_row(H, H + 1);
        const float w = 0.37f;
        std::vector<Bf16> dy(H);
        const float dw = detail::row_grad(g.data(), y.data(), w, dy.data(), H);
        EXPECT_EQ(dw, lane_order_dot(g, y)) << "H = " << H;
        for (int64_t i = 0; i < H; ++i) ASSERT_EQ(dy[i], float_to_bf16(w * bf16_to_float(g[i]))) << i;
    }
}

TEST(RowGrad, InPlace) {
    const int64_t H = 520;
    const std::vector<Bf16> g = random_row(H, 3), y = random_row(H, 4);
    std::vector<Bf16> dy(H), in_place = g;
    const float dw = detail::row_grad(g.data(), y.data(), -1.5f, dy.data(), H);
    EXPECT_EQ(detail::row_grad(in_place.data(), y.data(), -1.5f, in_place.data(), H), dw);
    EXPECT_EQ(in_place, dy);
}

TEST(RowGrad, OrderIsNotSequential) {
    // Lane 0 holds 2^24 (vector 0), lane 1 holds 1 (vector 1), lane 16 holds -2^24 (vector 16). Sequentially
    // 2^24 + 1 rounds to 2^24 (ties to even) and -2^24 then cancels it: 0. The butterfly adds lanes 0 and 16 first
    // (0), and lane 1's 1 survives: 1.
    const int64_t H = 8 * 33;
    std::vector<Bf16> g(H, Bf16{0}), y(H, float_to_bf16(1.0f));
    g[0] = float_to_bf16(16777216.0f);     // vector 0 -> lane 0
    g[8] = float_to_bf16(1.0f);            // vector 1 -> lane 1
    g[16 * 8] = float_to_bf16(-16777216.0f);  // vector 16 -> lane 16
    std::vector<Bf16> dy(H);
    float sequential = 0.0f;
    for (int64_t i = 0; i < H; ++i) sequential += bf16_to_float(g[i]) * bf16_to_float(y[i]);
    const float dw = detail::row_grad(g.data(), y.data(), 1.0f, dy.data(), H);
    EXPECT_EQ(sequential, 0.0f);  // 2^24 + 1 = 2^24 in fp32, then - 2^24
    EXPECT_EQ(dw, 1.0f);          // lanes 0 and 16 cancel in the butterfly's first step, lane 1's 1 survives
    EXPECT_EQ(dw, lane_order_dot(g, y));
}

}  // namespace
}  // namespace evenep
