// The CPU reference data path: dispatch, combine and their backward over a Team (evenep/cpu/buffer.hpp).
//
// Synchronisation (every collective call):
//   dispatch           [write own (s, s_total, tpe) row into every peer's gather area]
//                      barrier "all-gather" (also exchanges each rank's input status)
//                      plan, dst (a group-level error found here: one more barrier, then every rank throws);
//                      write rows + per-entry records into peers' buffers
//                      barrier "rows written"; zero own padding rows, fill own duplicate rows
//   dispatch (reuse)   barrier "start"; write; barrier "rows written"; fill
//   combine            barrier "start"; push partials to sources' staging; barrier "partials staged";
//                      reduce own tokens from own staging, pull gathered weights from peers
// A rank writes into a peer's memory only after a barrier that every rank reached in the same call, so no rank
// can still be reading that memory from an earlier call.

// Every product and sum is rounded separately (no contraction into FMA), whatever -march says: the results are
// the contract the GPU backend reproduces bit for bit.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "evenep/cpu/buffer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>

#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "local_status.hpp"

namespace evenep::cpu {
namespace {

using internal::LocalStatus;
using internal::validated;

std::atomic<uint64_t> g_next_handle_id{1};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The fp32 partial-sum step of combine (the order contract of src/cuda/kernels/combine.cu, which sums the same terms
// in the same order): acc[i] += w * row[i] with apply_weights, else acc[i] += row[i].
void add_row_terms(float* acc, const Bf16* row, int64_t H, float w, bool apply_weights) {
    if (apply_weights) {
        for (int64_t i = 0; i < H; ++i) acc[i] += w * bf16_to_float(row[i]);
    } else {
        for (int64_t i = 0; i < H; ++i) acc[i] += bf16_to_float(row[i]);
    }
}

// The distinct destination ranks of one token in order of their first k, with entry counts and staging units.
struct TokenDests {
    int n = 0;
    int rank[detail::kMaxTopK];
    int count[detail::kMaxTopK];
    int64_t unit[detail::kMaxTopK];  // first staging unit of the partial (relative to the token's first unit)

    void build(const int32_t* codes, int K, int64_t nvs) {
        n = 0;
        for (int k = 0; k < K; ++k) {
            const int32_t code = codes[k];
            if (detail::is_masked(code)) continue;
            const int d = static_cast<int>(detail::decode_dst(code) / nvs);
            if (detail::is_payload(code)) {
                rank[n] = d;
                count[n++] = 1;
            } else {
                int j = 0;
                while (j < n && rank[j] != d) ++j;
                EVENEP_ASSERT(j < n, "duplicate entry for rank ", d, " precedes its payload entry");
                ++count[j];
            }
        }
        int64_t u = 0;
        for (int j = 0; j < n; ++j) {
            unit[j] = u;
            u += detail::partial_units(count[j]);
        }
    }
    int index_of(int d) const {
        for (int j = 0; j < n; ++j)
            if (rank[j] == d) return j;
        return -1;
    }
};

void check_config_match(const Config& a, const Config& b, int rank) {
    EVENEP_CHECK(a.R == b.R && a.E == b.E && a.K == b.K && a.S == b.S && a.tp == b.tp && a.num_slots() == b.num_slots(),
                 "rank ", rank, ": the handle's plan is for ", a.to_string(), ", the buffer for ", b.to_string());
}

}  // namespace

Buffer::Buffer(Team& team, const BufferConfig& cfg, PlannerMode mode)
    : team_(team),
      cfg_(validated(cfg)),
      layout_(cfg_.layout()),
      rank_(team.rank()),
      planner_(cfg_.cfg, mode),
      traffic_(cfg_.cfg.R),
      gather_traffic_(cfg_.cfg.R) {
    EVENEP_CHECK(team.size() == cfg_.cfg.R, "buffer: team size ", team.size(), " differs from R = ", cfg_.cfg.R);
    window_ = team_.alloc_symmetric(static_cast<size_t>(layout_.num_bytes()), "evenep.cpu.buffer");
    peers_.resize(cfg_.cfg.R);
    for (int p = 0; p < cfg_.cfg.R; ++p) peers_[p] = team_.peer_base(window_, p);
    int32_t* next = at<int32_t>(rank_, layout_.recv_next_offset);
    int32_t* ret = at<int32_t>(rank_, layout_.recv_ret_offset);
    std::fill(next, next + layout_.num_recv_rows, detail::kChainEnd);
    std::fill(ret, ret + layout_.num_recv_rows, detail::kRetPadding);
    tpe_scratch_.resize(static_cast<size_t>(cfg_.cfg.R) * cfg_.cfg.E);
    s_scratch_.resize(cfg_.cfg.R);
    acc_scratch_.resize(cfg_.H);
    if (layout_.fp8) {
        x8_scratch_.resize(cfg_.H);
        scale_scratch_.resize(static_cast<size_t>(layout_.scales_per_row()));
    }
}

Buffer::~Buffer() { team_.free_symmetric(window_); }

std::span<Bf16> Buffer::recv_x() {
    return {at<Bf16>(rank_, layout_.recv_x_offset), static_cast<size_t>(layout_.num_recv_rows * layout_.H)};
}
std::span<float> Buffer::recv_w() {
    return {at<float>(rank_, layout_.recv_w_offset), static_cast<size_t>(layout_.num_recv_rows)};
}
std::span<Fp8E4m3> Buffer::recv_x8() {
    return {at<Fp8E4m3>(rank_, layout_.recv_x8_offset), static_cast<size_t>(layout_.recv_x8_bytes())};
}
std::span<float> Buffer::recv_scale() {
    return {at<float>(rank_, layout_.recv_scale_offset), static_cast<size_t>(layout_.recv_scale_bytes() / 4)};
}
std::span<const int32_t> Buffer::recv_next() const {
    return {at<int32_t>(rank_, layout_.recv_next_offset), static_cast<size_t>(layout_.num_recv_rows)};
}
std::span<const int32_t> Buffer::recv_ret() const {
    return {at<int32_t>(rank_, layout_.recv_ret_offset), static_cast<size_t>(layout_.num_recv_rows)};
}

DispatchHandle Buffer::dispatch(const DispatchArgs& a) {
    const Config& cfg = cfg_.cfg;
    const int R = cfg.R, E = cfg.E, K = cfg.K, H = cfg_.H;
    traffic_ = PhaseTraffic(R);
    gather_traffic_ = PhaseTraffic(R);
    filled_id_ = 0;  // the rows are about to change, whatever happens
    std::vector<int32_t> my_tpe(E, 0);

    LocalStatus status;
    status.run([&] {
        EVENEP_CHECK(a.s >= 1 && a.s <= cfg.S, "dispatch: rank ", rank_, ": s = ", a.s, " outside [1, S = ", cfg.S,
                     "]");
        const size_t sk = static_cast<size_t>(a.s) * K;
        EVENEP_CHECK(a.x.size() == static_cast<size_t>(a.s) * H, "dispatch: rank ", rank_, ": x has ", a.x.size(),
                     " values, expected s*H = ", static_cast<int64_t>(a.s) * H);
        EVENEP_CHECK(a.topk_idx.size() == sk, "dispatch: rank ", rank_, ": topk_idx has ", a.topk_idx.size(),
                     " ids, expected s*K = ", sk);
        EVENEP_CHECK(a.topk_w.size() == sk, "dispatch: rank ", rank_, ": topk_w has ", a.topk_w.size(),
                     " weights, expected s*K = ", sk);
        EVENEP_CHECK(a.s_total == -1 || (a.s_total >= 1 && a.s_total <= static_cast<int64_t>(R) * cfg.S),
                     "dispatch: rank ", rank_, ": s_total = ", a.s_total, " outside [1, R*S] (or -1)");
        compute_tpe(cfg, rank_, a.topk_idx, a.s, my_tpe);
        if (!a.tpe.empty()) {
            EVENEP_CHECK(a.tpe.size() == static_cast<size_t>(E), "dispatch: rank ", rank_, ": caller histogram has ",
                         a.tpe.size(), " values, expected E = ", E);
            for (int e = 0; e < E; ++e)
                EVENEP_CHECK(a.tpe[e] == my_tpe[e], "dispatch: rank ", rank_, ": caller histogram says ", a.tpe[e],
                             " entries for expert ", e, " but topk_idx routes ", my_tpe[e]);
        }
        if (layout_.fp8)
            for (size_t i = 0; i < a.x.size(); ++i)
                EVENEP_CHECK(bf16_is_finite(a.x[i]), "dispatch: rank ", rank_, ": x[", i / H, ", ", i % H,
                             "] = ", bf16_to_float(a.x[i]), " (token ", i / H, ", channel ", i % H,
                             ") is not finite; the FP8 dispatch quantises each 128-channel block by its amax");
    });
    if (status.ok) {
        const int64_t row_ints = layout_.gather_row_ints();
        for (int p = 0; p < R; ++p) {
            int32_t* row = at<int32_t>(p, layout_.gather_offset) + static_cast<int64_t>(rank_) * row_ints;
            row[0] = a.s;
            row[1] = static_cast<int32_t>(a.s_total);
            std::copy(my_tpe.begin(), my_tpe.end(), row + 2);
            gather_traffic_.move(rank_, p, row_ints * 4);
        }
    }
    const int bad = team_.barrier("dispatch: histogram all-gather", status.ok);
    status.throw_if_failed(bad, "dispatch", "nothing was sent");

    // Every rank reads the same gathered rows and makes the same decisions from here on. A group-level error
    // found here is found by every rank; they meet once more before throwing, so that no rank can start its next
    // dispatch (writing into the gather areas) while another is still reading them.
    DispatchHandle h;
    const auto t_plan = std::chrono::steady_clock::now();
    try {
        plan_from_gather(a, h);
    } catch (const Error&) {
        team_.barrier("dispatch: failed after the all-gather");
        throw;
    }
    plan_seconds_ = seconds_since(t_plan);

    write_payloads(h, a.x, layout_.fp8);
    team_.barrier("dispatch: rows written");
    fill_local_rows(h, layout_.fp8);
    h.id = g_next_handle_id.fetch_add(1);
    filled_id_ = h.id;
    return h;
}

void Buffer::dispatch(DispatchHandle& h, std::span<const Bf16> x) {
    traffic_ = PhaseTraffic(cfg_.cfg.R);
    filled_id_ = 0;
    LocalStatus status;
    status.run([&] {
        EVENEP_CHECK(h.rank == rank_, "dispatch: rank ", rank_, " was given the handle of rank ", h.rank);
        check_config_match(h.plan.cfg, cfg_.cfg, rank_);
        EVENEP_CHECK(x.size() == static_cast<size_t>(h.s) * cfg_.H, "dispatch: rank ", rank_, ": x has ", x.size(),
                     " values, expected s*H = ", static_cast<int64_t>(h.s) * cfg_.H);
    });
    const int bad = team_.barrier("dispatch (plan reused): start", status.ok);
    status.throw_if_failed(bad, "dispatch (plan reused)", "nothing was sent");
    write_payloads(h, x, false);
    team_.barrier("dispatch (plan reused): rows written");
    fill_local_rows(h, false);
    h.id = g_next_handle_id.fetch_add(1);
    filled_id_ = h.id;
}

// After the all-gather: checks the group's (s, s_total), plans, and computes this rank's destinations.
void Buffer::plan_from_gather(const DispatchArgs& a, DispatchHandle& h) {
    const Config& cfg = cfg_.cfg;
    const int R = cfg.R, E = cfg.E, K = cfg.K;
    const int64_t row_ints = layout_.gather_row_ints();
    const int32_t* gathered = at<int32_t>(rank_, layout_.gather_offset);
    for (int r = 0; r < R; ++r) {
        const int32_t* row = gathered + r * row_ints;
        s_scratch_[r] = row[0];
        std::copy(row + 2, row + 2 + E, tpe_scratch_.begin() + static_cast<int64_t>(r) * E);
    }
    for (int r = 1; r < R; ++r)
        EVENEP_CHECK(gathered[r * row_ints + 1] == gathered[1], "dispatch: rank ", r,
                     " passes s_total = ", gathered[r * row_ints + 1], " but rank 0 passes ", gathered[1]);
    check_group_tokens(cfg, s_scratch_, gathered[1]);

    h.rank = rank_;
    h.s = a.s;
    planner_.plan(tpe_scratch_, s_scratch_, h.plan);
    h.dst.resize(static_cast<size_t>(a.s) * K);
    compute_dst(h.plan, rank_, a.topk_idx, h.dst);
    h.topk_w.assign(a.topk_w.begin(), a.topk_w.end());
}

// Source side of dispatch: every entry's record, and the token row once per destination rank.
void Buffer::write_payloads(const DispatchHandle& h, std::span<const Bf16> x, bool fp8) {
    const int K = cfg_.cfg.K;
    const int64_t H = cfg_.H, nvs = layout_.num_recv_rows, spr = layout_.scales_per_row();
    const int64_t units_per_token = layout_.units_per_token, units_per_rank = layout_.stage_units();
    const int64_t row_bytes = fp8 ? H + spr * 4 : H * 2;
    const bool ue8m0 = cfg_.precision.ue8m0;
    TokenDests td;
    for (int t = 0; t < h.s; ++t) {
        const int32_t* codes = h.dst.data() + static_cast<int64_t>(t) * K;
        td.build(codes, K, nvs);
        if (fp8 && td.n > 0)  // once per token, whatever the number of destinations
            for (int64_t b = 0; b < spr; ++b)
                scale_scratch_[b] = fp8_quantize_act_block(x.data() + static_cast<int64_t>(t) * H + b * kFp8Block,
                                                           x8_scratch_.data() + b * kFp8Block, ue8m0);
        for (int k = 0; k < K; ++k) {
            const int32_t code = codes[k];
            if (detail::is_masked(code)) continue;
            const int32_t flat = detail::decode_dst(code);
            const int d = static_cast<int>(flat / nvs);
            const int64_t row = flat % nvs;
            int32_t next = detail::kChainEnd;
            for (int k2 = k + 1; k2 < K && next == detail::kChainEnd; ++k2) {
                const int32_t c2 = codes[k2];
                if (detail::is_masked(c2)) continue;
                const int32_t f2 = detail::decode_dst(c2);
                if (f2 / nvs == d) next = static_cast<int32_t>(f2 % nvs);
            }
            at<float>(d, layout_.recv_w_offset)[row] = h.topk_w[static_cast<size_t>(t) * K + k];
            at<int32_t>(d, layout_.recv_next_offset)[row] = next;
            int32_t ret = detail::kRetDuplicate;
            if (detail::is_payload(code)) {
                const int j = td.index_of(d);
                ret = detail::encode_ret(rank_, static_cast<int64_t>(t) * units_per_token + td.unit[j], units_per_rank);
                if (fp8) {
                    std::memcpy(at<Fp8E4m3>(d, layout_.recv_x8_offset) + row * H, x8_scratch_.data(),
                                static_cast<size_t>(H));
                    std::memcpy(at<float>(d, layout_.recv_scale_offset) + row * spr, scale_scratch_.data(),
                                static_cast<size_t>(spr) * 4);
                } else {
                    std::memcpy(at<Bf16>(d, layout_.recv_x_offset) + row * H, x.data() + static_cast<int64_t>(t) * H,
                                static_cast<size_t>(row_bytes));
                }
                if (d != rank_) {
                    traffic_.rows += 1;
                    traffic_.move(rank_, d, row_bytes);
                }
            }
            at<int32_t>(d, layout_.recv_ret_offset)[row] = ret;
            if (d != rank_) {
                traffic_.entries += 1;
                traffic_.move(rank_, d, 12);
            }
        }
    }
}

// Destination side of dispatch, after every source has written: padding rows zero, duplicates from their head.
void Buffer::fill_local_rows(const DispatchHandle& h, bool fp8) {
    const int G = h.plan.G();
    const int64_t H = cfg_.H, spr = layout_.scales_per_row();
    Bf16* x = at<Bf16>(rank_, layout_.recv_x_offset);
    Fp8E4m3* x8 = at<Fp8E4m3>(rank_, layout_.recv_x8_offset);
    float* sc = at<float>(rank_, layout_.recv_scale_offset);
    float* w = at<float>(rank_, layout_.recv_w_offset);
    int32_t* next = at<int32_t>(rank_, layout_.recv_next_offset);
    int32_t* ret = at<int32_t>(rank_, layout_.recv_ret_offset);
    const int32_t rows_used = h.plan.rows_used(rank_);
    for (int g = 0; g < G; ++g) {
        const int32_t begin = h.plan.group_begin(rank_, g), end = h.plan.group_end(rank_, g);
        const int32_t used_end = begin + h.plan.group_count[static_cast<size_t>(rank_) * G + g];
        for (int32_t row = used_end; row < end; ++row) {
            if (fp8) {
                std::fill(x8 + row * H, x8 + (row + 1) * H, Fp8E4m3{0});
                std::fill(sc + row * spr, sc + (row + 1) * spr, 0.0f);
            } else {
                std::fill(x + row * H, x + (row + 1) * H, Bf16{0});
            }
            w[row] = 0.0f;
            next[row] = detail::kChainEnd;
            ret[row] = detail::kRetPadding;
        }
        for (int32_t row = begin; row < used_end; ++row) {
            if (ret[row] < 0) continue;
            for (int32_t n = next[row]; n != detail::kChainEnd; n = next[n]) {
                EVENEP_ASSERT(n >= 0 && n < rows_used && ret[n] == detail::kRetDuplicate, "rank ", rank_,
                              ": chain from row ", row, " reaches row ", n, " which is not a duplicate row");
                if (fp8) {
                    std::memcpy(x8 + n * H, x8 + row * H, static_cast<size_t>(H));
                    std::memcpy(sc + n * spr, sc + row * spr, static_cast<size_t>(spr) * 4);
                } else {
                    std::memcpy(x + n * H, x + row * H, static_cast<size_t>(H) * 2);
                }
            }
        }
    }
}

void Buffer::combine(const DispatchHandle& h, const CombineArgs& a) { combine_impl(h, a, {}, "combine"); }

void Buffer::dispatch_backward(const DispatchHandle& h,
                               std::span<const Bf16> grad_recv_x,
                               std::span<const float> grad_recv_w,
                               std::span<Bf16> grad_x,
                               std::span<float> grad_topk_w) {
    CombineArgs a;
    a.y = grad_recv_x;
    a.apply_weights = false;
    a.out = grad_x;
    a.gathered_w = grad_topk_w;
    combine_impl(h, a, grad_recv_w, "dispatch_backward");
}

void Buffer::combine_impl(const DispatchHandle& h,
                          const CombineArgs& a,
                          std::span<const float> new_recv_w,
                          const char* call) {
    const Config& cfg = cfg_.cfg;
    const int R = cfg.R, K = cfg.K, G = cfg.num_groups();
    const int64_t H = cfg_.H, nvs = layout_.num_recv_rows;
    const int64_t units_per_token = layout_.units_per_token, units_per_rank = layout_.stage_units();
    const int64_t unit_bytes = layout_.stage_unit_bytes();
    const bool bf16_partials = cfg_.precision.bf16_partials;
    traffic_ = PhaseTraffic(R);

    LocalStatus status;
    status.run([&] {
        EVENEP_CHECK(h.rank == rank_, call, ": rank ", rank_, " was given the handle of rank ", h.rank);
        check_config_match(h.plan.cfg, cfg, rank_);
        EVENEP_CHECK(h.id != 0 && h.id == filled_id_, call, ": rank ", rank_,
                     ": the handle is not the one of the last dispatch into this buffer");
        EVENEP_CHECK(a.out.size() == static_cast<size_t>(h.s) * H, call, ": rank ", rank_, ": out has ", a.out.size(),
                     " values, expected s*H = ", static_cast<int64_t>(h.s) * H);
        EVENEP_CHECK(a.gathered_w.empty() || a.gathered_w.size() == static_cast<size_t>(h.s) * K, call, ": rank ",
                     rank_, ": gathered weights have ", a.gathered_w.size(),
                     " slots, expected s*K = ", static_cast<int64_t>(h.s) * K);
        EVENEP_CHECK(a.y.empty() || a.y.size() == static_cast<size_t>(nvs * H), call, ": rank ", rank_,
                     ": expert outputs have ", a.y.size(), " values, expected NvS*H = ", nvs * H);
        EVENEP_CHECK(new_recv_w.empty() || new_recv_w.size() == static_cast<size_t>(nvs), call, ": rank ", rank_,
                     ": row weight gradients have ", new_recv_w.size(), " values, expected NvS = ", nvs);
    });
    const int bad = team_.barrier(std::string(call) + ": start", status.ok);
    status.throw_if_failed(bad, call, "nothing was sent");

    const Bf16* y = a.y.empty() ? at<Bf16>(rank_, layout_.recv_x_offset) : a.y.data();
    float* w = at<float>(rank_, layout_.recv_w_offset);
    const int32_t* next = at<int32_t>(rank_, layout_.recv_next_offset);
    const int32_t* ret = at<int32_t>(rank_, layout_.recv_ret_offset);
    const int32_t rows_used = h.plan.rows_used(rank_);
    if (!new_recv_w.empty() && new_recv_w.data() != w) std::copy(new_recv_w.begin(), new_recv_w.begin() + rows_used, w);

    // Phase A (destination): one partial per chain, pushed into the source's staging area.
    float* acc = acc_scratch_.data();
    for (int g = 0; g < G; ++g) {
        const int32_t begin = h.plan.group_begin(rank_, g);
        const int32_t used_end = begin + h.plan.group_count[static_cast<size_t>(rank_) * G + g];
        for (int32_t row = begin; row < used_end; ++row) {
            const int32_t r = ret[row];
            if (r < 0) continue;
            const int src = detail::ret_rank(r, units_per_rank);
            std::byte* slot =
                at<std::byte>(src, layout_.stage_offset) + detail::ret_unit(r, units_per_rank) * unit_bytes;
            const bool single = next[row] == detail::kChainEnd;
            if (single) {
                std::memcpy(slot, y + row * H, static_cast<size_t>(unit_bytes));
            } else {
                std::fill(acc, acc + H, 0.0f);
                for (int32_t n = row; n != detail::kChainEnd; n = next[n])
                    add_row_terms(acc, y + static_cast<int64_t>(n) * H, H, w[n], a.apply_weights);
                if (bf16_partials) {
                    Bf16* p = reinterpret_cast<Bf16*>(slot);
                    for (int64_t i = 0; i < H; ++i) p[i] = float_to_bf16(acc[i]);
                } else {
                    std::memcpy(slot, acc, static_cast<size_t>(2 * unit_bytes));
                }
            }
            if (src != rank_) {
                const bool wide = !single && !bf16_partials;
                traffic_.rows += 1;
                traffic_.fp32_rows += wide ? 1 : 0;
                traffic_.move(rank_, src, wide ? 2 * unit_bytes : unit_bytes);
            }
        }
    }
    team_.barrier(std::string(call) + ": partials staged");

    // Phase B (source): accumulate each token's partials in the order of its destinations' first k.
    const std::byte* stage = at<std::byte>(rank_, layout_.stage_offset);
    TokenDests td;
    for (int t = 0; t < h.s; ++t) {
        const int32_t* codes = h.dst.data() + static_cast<int64_t>(t) * K;
        td.build(codes, K, nvs);
        std::fill(acc, acc + H, 0.0f);
        int j = 0;
        for (int k = 0; k < K && j < td.n; ++k) {
            if (!detail::is_payload(codes[k])) continue;
            const std::byte* slot = stage + (static_cast<int64_t>(t) * units_per_token + td.unit[j]) * unit_bytes;
            if (td.count[j] == 1) {
                add_row_terms(acc, reinterpret_cast<const Bf16*>(slot), H, h.topk_w[static_cast<size_t>(t) * K + k],
                              a.apply_weights);
            } else if (bf16_partials) {
                add_row_terms(acc, reinterpret_cast<const Bf16*>(slot), H, 1.0f, false);  // weights already applied
            } else {
                const float* p = reinterpret_cast<const float*>(slot);
                for (int64_t i = 0; i < H; ++i) acc[i] += p[i];
            }
            ++j;
        }
        Bf16* o = a.out.data() + static_cast<int64_t>(t) * H;
        for (int64_t i = 0; i < H; ++i) o[i] = float_to_bf16(acc[i]);
    }
    if (!a.gathered_w.empty()) {
        for (int t = 0; t < h.s; ++t)
            for (int k = 0; k < K; ++k) {
                const size_t i = static_cast<size_t>(t) * K + k;
                const int32_t code = h.dst[i];
                if (detail::is_masked(code)) {
                    a.gathered_w[i] = 0.0f;
                    continue;
                }
                const int32_t flat = detail::decode_dst(code);
                const int d = static_cast<int>(flat / nvs);
                a.gathered_w[i] = at<float>(d, layout_.recv_w_offset)[flat % nvs];
                if (d != rank_) {
                    traffic_.entries += 1;
                    traffic_.move(d, rank_, 4);
                }
            }
    }
}

}  // namespace evenep::cpu
