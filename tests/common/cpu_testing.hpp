// tests/common/cpu_testing.hpp — header-only helpers for the CPU data-path tests.
//
// Tagged payloads: bf16 rows whose bits encode (source rank, token, column), so a wrong row names its source;
// an independent, loop-by-loop implementation of the combine formula of SPEC §4.2 (the tests compare the
// backend to it bit for bit); receive-buffer row bookkeeping.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep::testing {

// Tag bits of column c of token t of rank r: column 0 holds r, column 1 holds t, the others a hash of all three
// (exponent < 0x7F: finite, no NaN). Copies are bitwise, so any bit pattern travels unchanged.
inline Bf16 tag(int r, int t, int c) {
    if (c == 0) return Bf16{static_cast<uint16_t>(r)};
    if (c == 1) return Bf16{static_cast<uint16_t>(t)};
    return Bf16{static_cast<uint16_t>(
        detail::hash64((static_cast<uint64_t>(r) << 40) ^ (static_cast<uint64_t>(t) << 16) ^ static_cast<uint64_t>(c)) &
        0x3FFF)};
}

// "row of (rank r, token t)" for a row that matches some tag, else its first two columns.
inline std::string describe_row(const Bf16* row) {
    std::ostringstream os;
    os << "row tagged (rank " << row[0].bits << ", token " << row[1].bits << ")";
    return os.str();
}

inline BufferConfig buffer_config(int R, int E, int K, int S, int tp, int H = 16, int F = 8, int B = -1) {
    BufferConfig c;
    c.cfg.R = R;
    c.cfg.E = E;
    c.cfg.K = K;
    c.cfg.S = S;
    c.cfg.tp = tp;
    c.cfg.B = B;
    c.H = H;
    c.ffn_hidden = F;
    return c;
}

// Every rank's tokens: tagged rows and the library's route weights for `routing`.
inline std::vector<cpu::RankTokens> tagged_tokens(const BufferConfig& cfg, const Routing& routing, uint64_t seed) {
    const auto w = make_route_weights(routing, seed);
    std::vector<cpu::RankTokens> out(cfg.cfg.R);
    for (int r = 0; r < cfg.cfg.R; ++r) {
        out[r].s = routing.s[r];
        out[r].topk_idx = routing.topk_idx[r];
        out[r].topk_w = w[r];
        out[r].x.resize(static_cast<size_t>(routing.s[r]) * cfg.H);
        for (int t = 0; t < routing.s[r]; ++t)
            for (int c = 0; c < cfg.H; ++c) out[r].x[static_cast<size_t>(t) * cfg.H + c] = tag(r, t, c);
    }
    return out;
}

// Random finite bf16 values U(-1, 1), a pure function of (seed, index).
inline std::vector<Bf16> random_bf16(size_t n, uint64_t seed) {
    std::vector<Bf16> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = detail::random_bf16(detail::hash64(seed * 0x100000001B3ull + i), 1.0f);
    return v;
}

// Random floats U(-1, 1), a pure function of (seed, index) (the values the GPU tests upload and expect back).
inline std::vector<float> random_floats(size_t n, uint64_t seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = 2.0f * detail::unit_float(detail::hash64(seed * 0x100000001B3ull + i)) - 1.0f;
    return v;
}

// random_floats(n, seed) rounded to bf16, as raw bits.
inline std::vector<uint16_t> random_bf16_bits(size_t n, uint64_t seed) {
    const std::vector<float> f = random_floats(n, seed);
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float_to_bf16(f[i]).bits;
    return v;
}

// Tokens with random (not tagged) rows, for arithmetic tests.
inline std::vector<cpu::RankTokens> random_tokens(const BufferConfig& cfg, const Routing& routing, uint64_t seed) {
    auto out = tagged_tokens(cfg, routing, seed);
    for (int r = 0; r < cfg.cfg.R; ++r) out[r].x = random_bf16(out[r].x.size(), seed * 131 + r);
    return out;
}

// [R][NvS] flags: 1 for rows holding an entry, 2 for padding rows, 0 past the last segment.
inline std::vector<std::vector<int>> row_kinds(const Plan& plan) {
    const int R = plan.R(), G = plan.G();
    std::vector<std::vector<int>> kinds(R, std::vector<int>(static_cast<size_t>(plan.cfg.recv_rows()), 0));
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) {
            const int32_t begin = plan.group_begin(r, g), end = plan.group_end(r, g);
            const int32_t used = begin + plan.group_count[static_cast<size_t>(r) * G + g];
            for (int32_t row = begin; row < end; ++row) kinds[r][row] = row < used ? 1 : 2;
        }
    return kinds;
}

// SPEC §4.2 written out loop by loop: per token, the entries on each destination rank pre-summed in fp32 in k
// order (p = 0; p += v_k), then acc = 0; acc += partial in the order of the destinations' first k; a partial of
// one entry is the bf16 value itself (times w in fp32 with apply_weights). y[d]: [NvS*H] on rank d.
// bf16_partials (DataPrecision::bf16_partials): a partial of >= 2 entries is rounded to bf16 before it is added.
inline std::vector<std::vector<Bf16>> reference_combine(const Plan& plan,
                                                        const std::vector<std::vector<int32_t>>& dst,
                                                        const std::vector<std::vector<Bf16>>& y,
                                                        const std::vector<std::vector<float>>& topk_w,
                                                        int H,
                                                        bool apply_weights,
                                                        bool bf16_partials = false) {
    const int R = plan.R(), K = plan.cfg.K;
    const int64_t nvs = plan.cfg.recv_rows();
    std::vector<std::vector<Bf16>> out(R);
    for (int r = 0; r < R; ++r) {
        const int s = plan.s[r];
        out[r].assign(static_cast<size_t>(s) * H, Bf16{0});
        for (int t = 0; t < s; ++t) {
            std::vector<int> dest_order;
            for (int k = 0; k < K; ++k) {
                const int32_t code = dst[r][static_cast<size_t>(t) * K + k];
                if (code == detail::kMaskedDst) continue;
                const int d = static_cast<int>(detail::decode_dst(code) / nvs);
                bool seen = false;
                for (int x : dest_order) seen = seen || x == d;
                if (!seen) dest_order.push_back(d);
            }
            std::vector<float> acc(H, 0.0f);
            for (int d : dest_order) {
                std::vector<int> ks;
                for (int k = 0; k < K; ++k) {
                    const int32_t code = dst[r][static_cast<size_t>(t) * K + k];
                    if (code != detail::kMaskedDst && detail::decode_dst(code) / nvs == d) ks.push_back(k);
                }
                for (int i = 0; i < H; ++i) {
                    float part = 0.0f;
                    if (ks.size() == 1) {
                        const int k = ks[0];
                        const int64_t row = detail::decode_dst(dst[r][static_cast<size_t>(t) * K + k]) % nvs;
                        part = bf16_to_float(y[d][row * H + i]);
                        if (apply_weights) part = topk_w[r][static_cast<size_t>(t) * K + k] * part;
                    } else {
                        for (int k : ks) {
                            const int64_t row = detail::decode_dst(dst[r][static_cast<size_t>(t) * K + k]) % nvs;
                            const float v = bf16_to_float(y[d][row * H + i]);
                            part += apply_weights ? topk_w[r][static_cast<size_t>(t) * K + k] * v : v;
                        }
                    }
                    acc[i] += bf16_partials && ks.size() > 1 ? round_to_bf16(part) : part;
                }
            }
            for (int i = 0; i < H; ++i) out[r][static_cast<size_t>(t) * H + i] = float_to_bf16(acc[i]);
        }
    }
    return out;
}

// The routing kinds the data-path tests sweep, with names for TEST_P.
struct NamedRouting {
    std::string name;
    Routing routing;
};
inline std::vector<NamedRouting> test_routings(const Config& cfg, uint64_t seed) {
    RoutingSpec spec{cfg.R, cfg.E, cfg.K, cfg.S, seed};
    std::vector<NamedRouting> out;
    out.push_back({"lognormal_sigma2", make_lognormal(spec, 2.0)});
    out.push_back({"round_robin", make_round_robin(spec)});
    for (Adversarial a : all_adversarial()) out.push_back({to_string(a), make_adversarial(spec, a)});
    return out;
}

// TEST_P parameters: every shape once per routing of test_routings(seed) at that shape (P: aggregate with R, E, K,
// S, tp, H and the routing index `routing`).
template <typename P, size_t N>
std::vector<P> with_each_routing(const P (&shapes)[N], uint64_t seed) {
    std::vector<P> out;
    for (P p : shapes) {
        const size_t n = test_routings(buffer_config(p.R, p.E, p.K, p.S, p.tp, p.H).cfg, seed).size();
        for (size_t i = 0; i < n; ++i) {
            p.routing = static_cast<int>(i);
            out.push_back(p);
        }
    }
    return out;
}

// Groups of the given row counts laid end to end in a receive buffer: cu (inclusive ends, the cu_seqlens of the
// GEMMs), count (the rows again, as GroupedGemmShape::group_count) and rows (the total).
struct GroupRows {
    std::vector<int32_t> cu, count;
    int64_t rows = 0;
};
inline GroupRows group_rows(const std::vector<int32_t>& rows) {
    GroupRows g;
    for (int32_t r : rows) {
        g.rows += r;
        g.cu.push_back(static_cast<int32_t>(g.rows));
        g.count.push_back(r);
    }
    return g;
}

}  // namespace evenep::testing
