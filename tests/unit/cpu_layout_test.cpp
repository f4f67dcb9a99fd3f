// Buffer layouts (include/evenep/detail/buffer_layout.hpp) and buffer_sizes (include/evenep/buffer.hpp).
//
// Cases:
//   CpuLayout.DemoDefaultSizes          R=8 E=64 K=4 S=512 tp=128 H=256 H'=128: every region's bytes by formula.
//   CpuLayout.RegionsAlignedDisjoint    several configs: regions 256-byte aligned, in order, non-overlapping,
//                                       num_bytes covers the last one; the layout is usable in constexpr.
//   CpuLayout.StageUnits                U = min(K, 2R); return addresses round-trip (rank, unit).
//   CpuLayout.ExpertPoolAndWeights      slot/gradient offsets per projection and slot; totals.
//   CpuLayout.SizesMatchLayout          buffer_sizes agrees with the layouts; DeepEP worst case R*S*H*2.
//   CpuLayout.ConfigValidation          H not a multiple of 8, H' < 1, bad Config: errors naming the value.
#include <gtest/gtest.h>

#include <string>

#include "evenep/buffer.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using detail::BufferLayout;

BufferConfig make_cfg(int R, int E, int K, int S, int tp, int H, int F, int B = -1) {
    BufferConfig c;
    c.cfg = Config{.R = R, .E = E, .K = K, .S = S, .B = B, .tp = tp};
    c.H = H;
    c.ffn_hidden = F;
    return c;
}

TEST(CpuLayout, DemoDefaultSizes) {
    const BufferConfig c = make_cfg(8, 64, 4, 512, 128, 256, 128);
    const BufferLayout l = c.layout();
    const int64_t nvs = detail::align_up(512 * 4 + 127 * 2 * 8, 128);  // 2048 + 2032 -> 4096
    EXPECT_EQ(nvs, 4096);
    EXPECT_EQ(l.num_recv_rows, nvs);
    EXPECT_EQ(l.recv_x_bytes(), nvs * 256 * 2);
    EXPECT_EQ(l.recv_w_bytes(), nvs * 4);
    EXPECT_EQ(l.gather_bytes(), 8 * 66 * 4);
    EXPECT_EQ(l.units_per_token, 4);
    EXPECT_EQ(l.stage_bytes(), 512 * 4 * 256 * 2);
    EXPECT_EQ(l.num_bytes(), nvs * 256 * 2 + 3 * nvs * 4 + detail::align_up(8 * 66 * 4, 256) + 512 * 4 * 256 * 2);
}

TEST(CpuLayout, RegionsAlignedDisjoint) {
    for (const BufferConfig& c : {make_cfg(8, 64, 4, 512, 128, 256, 128), make_cfg(3, 9, 5, 7, 3, 8, 3),
                                  make_cfg(8, 384, 8, 8192, 128, 7168, 2048), make_cfg(1, 1, 1, 1, 1, 8, 1)}) {
        const BufferLayout l = c.layout();
        const int64_t off[] = {l.recv_x_offset, l.recv_w_offset, l.recv_next_offset, l.recv_ret_offset,
                               l.gather_offset, l.stage_offset,  l.total_bytes};
        const int64_t len[] = {l.recv_x_bytes(),   l.recv_w_bytes(), l.recv_next_bytes(),
                               l.recv_ret_bytes(), l.gather_bytes(), l.stage_bytes()};
        for (int i = 0; i < 6; ++i) {
            EXPECT_EQ(off[i] % detail::kBufferAlignBytes, 0) << c.to_string() << " region " << i;
            EXPECT_GE(off[i + 1], off[i] + len[i]) << c.to_string() << " region " << i;
            EXPECT_LT(off[i + 1], off[i] + len[i] + detail::kBufferAlignBytes) << c.to_string() << " region " << i;
        }
    }
    constexpr BufferLayout l = BufferLayout::make(4, 8, 2, 16, 4, 64);
    static_assert(l.num_bytes() > 0 && l.num_recv_rows == detail::recv_rows(16, 2, 2, 4));
}

TEST(CpuLayout, StageUnits) {
    EXPECT_EQ(detail::stage_units_per_token(4, 8), 4);
    EXPECT_EQ(detail::stage_units_per_token(8, 8), 8);
    EXPECT_EQ(detail::stage_units_per_token(6, 2), 4);   // at most 2 destinations, 2 units each
    EXPECT_EQ(detail::stage_units_per_token(32, 1), 2);  // one destination holding everything: one fp32 partial
    EXPECT_EQ(detail::partial_units(1), 1);
    EXPECT_EQ(detail::partial_units(2), 2);
    EXPECT_EQ(detail::partial_units(7), 2);
    const int64_t per_rank = 512 * 4;
    for (int src : {0, 3, 7})
        for (int64_t unit : {int64_t{0}, int64_t{17}, per_rank - 1}) {
            const int32_t ret = detail::encode_ret(src, unit, per_rank);
            EXPECT_GE(ret, 0);
            EXPECT_EQ(detail::ret_rank(ret, per_rank), src);
            EXPECT_EQ(detail::ret_unit(ret, per_rank), unit);
        }
}

TEST(CpuLayout, ExpertPoolAndWeights) {
    const BufferConfig c = make_cfg(4, 16, 2, 8, 4, 24, 10, 3);
    const auto p = c.pool_layout();
    const int64_t n = 24 * 10;
    EXPECT_EQ(p.B, 3);
    EXPECT_EQ(p.expert_elems(), n);
    EXPECT_EQ(p.slot_w(detail::kProjUp, 2) - p.slot_w(detail::kProjUp, 0), 2 * n * 2);
    EXPECT_EQ(p.slot_grad(detail::kProjDown, 1) - p.slot_grad(detail::kProjDown, 0), n * 4);
    EXPECT_GE(p.slot_grad_offset[0], p.slot_w_offset[2] + 3 * n * 2);
    EXPECT_GE(p.num_bytes(), p.slot_grad_offset[2] + 3 * n * 4);
    const auto w = c.weights_layout();
    EXPECT_EQ(w.epn, 4);
    EXPECT_EQ(w.weight(detail::kProjGate, 3) - w.weight(detail::kProjGate, 0), 3 * n * 2);
    EXPECT_GE(w.num_bytes(), 3 * 4 * n * 2);
    EXPECT_EQ(detail::proj_in_dim(detail::kProjDown, 24, 10), 10);
    EXPECT_EQ(detail::proj_out_dim(detail::kProjDown, 24, 10), 24);
    EXPECT_EQ(detail::proj_in_dim(detail::kProjGate, 24, 10), 24);
}

TEST(CpuLayout, SizesMatchLayout) {
    const BufferConfig c = make_cfg(8, 384, 8, 8192, 128, 7168, 2048);
    const BufferSizes s = buffer_sizes(c);
    const BufferLayout l = c.layout();
    EXPECT_EQ(s.recv_x, l.recv_x_bytes());
    EXPECT_EQ(s.recv_meta, 2 * l.num_recv_rows * 4);
    EXPECT_EQ(s.comm_total, l.num_bytes());
    EXPECT_EQ(s.deepep_recv_x, int64_t{8} * 8192 * 7168 * 2);
    EXPECT_EQ(s.pool_slots, int64_t{48} * 3 * 7168 * 2048 * 2);
    EXPECT_EQ(s.pool_reduce, 2 * s.pool_slots);
    EXPECT_EQ(s.layer_weights, c.weights_layout().num_bytes());
    EXPECT_EQ(s.layer_grads, int64_t{48} * 3 * 7168 * 2048 * 4);
}

TEST(CpuLayout, ConfigValidation) {
    auto expect_error = [](const BufferConfig& c, const std::string& needle) {
        try {
            c.validate();
            ADD_FAILURE() << "no error for " << c.to_string();
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error(make_cfg(4, 8, 2, 8, 4, 12, 8), "H = 12");
    expect_error(make_cfg(4, 8, 2, 8, 4, 16, 0), "H') = 0");
    expect_error(make_cfg(4, 10, 2, 8, 4, 16, 8), "E % R");
    make_cfg(4, 8, 2, 8, 4, 16, 8).validate();
}

}  // namespace
}  // namespace evenep
