// The data-path benchmark rows (perf/cuda/bench.hpp): dispatch and the three combine variants. Byte counts from
// the plan and every rank's encoded destinations (docs/benchmarks.md); --check compares with the CPU oracle
// (evenep/cpu/oracle.hpp) on kCheckColumns columns of every row.
#include <cuda_runtime_api.h>

#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "evenep/cuda/fp8_cast.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/detail/layout.hpp"
#include "perf/cuda/point.hpp"

namespace evenep::perf {
namespace {

struct DataBytes {
    double dispatch = 0, combine_pull = 0, combine_push = 0;
    int64_t entries = 0, heads = 0, multi_heads = 0, multi_entries = 0, padding_rows = 0, tokens = 0;
};

// fp8: the dispatch moves e4m3 rows and their scales (H + 4 H/128 bytes a row); the source reads the bf16 row, or
// with fp8_source the caller's codes and scales (RankIo::x8, x_scales).
DataBytes count_bytes(
    const Plan& plan, const std::vector<std::vector<int32_t>>& dst, int H, bool fp8, bool fp8_source) {
    const int R = plan.R(), K = plan.cfg.K, G = plan.G();
    const int64_t nvs = plan.cfg.recv_rows();
    const double row = 2.0 * H, sent = fp8 ? H + 4.0 * (H / kFp8Block) : row, read = fp8_source ? sent : row;
    DataBytes b;
    for (int r = 0; r < R; ++r) {
        for (int g = 0; g < G; ++g)
            b.padding_rows +=
                plan.group_end(r, g) - plan.group_begin(r, g) - plan.group_count[static_cast<size_t>(r) * G + g];
        const int s = plan.s[r];
        for (int t = 0; t < s; ++t) {
            const int32_t* c = dst[r].data() + static_cast<size_t>(t) * K;
            int live = 0, heads = 0;
            for (int k = 0; k < K; ++k) {
                if (detail::is_masked(c[k])) continue;
                ++live;
                if (!detail::is_payload(c[k])) continue;
                ++heads;
                int chain = 0;
                const int64_t d = detail::decode_dst(c[k]) / nvs;
                for (int j = 0; j < K; ++j)
                    if (!detail::is_masked(c[j]) && detail::decode_dst(c[j]) / nvs == d) ++chain;
                if (chain >= 2) ++b.multi_heads, b.multi_entries += chain;
            }
            b.tokens += 1;
            b.entries += live;
            b.heads += heads;
            // dispatch: K codes, live weights, 12 B metadata per live entry, x row once (if any head), one row
            // write per head.
            b.dispatch += 4.0 * K + 16.0 * live + (heads ? read : 0) + sent * heads;
            // combine pull: K codes + K weights, one y row per live entry, gathered weights are not requested,
            // one out row.
            b.combine_pull += 8.0 * K + row * live + row;
            // combine push, source side: K codes + K weights, partial units, one out row.
            b.combine_push += 8.0 * K + row;
        }
    }
    const int64_t dups = b.entries - b.heads;
    // dispatch, destination side: padding rows (row + weight + next + ret), entry-row metadata scan (ret + next),
    // duplicate fill (one read per multi-entry head, one write per duplicate).
    b.dispatch += b.padding_rows * (sent + 12.0) + 8.0 * b.entries + sent * b.multi_heads + sent * dups;
    // combine push: destination reads every entry row once and its metadata; writes one unit per single head and
    // two per multi head; the source reads the same units back.
    const int64_t single_heads = b.heads - b.multi_heads;
    const double staged = row * single_heads + 2.0 * row * b.multi_heads;
    b.combine_push += row * b.entries + 12.0 * b.entries + 2.0 * staged;
    return b;
}

// Rows of `got` ([n, C]) that differ from `want` ([>= n, C]) in any column.
int64_t rows_differing(const std::vector<Bf16>& got, const std::vector<Bf16>& want, int64_t n, size_t C) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += std::memcmp(got.data() + i * C, want.data() + i * C, C * sizeof(Bf16)) != 0;
    return bad;
}

}  // namespace

void bench_data_path(Point& p, bool want_dispatch, bool want_combine) {
    const BenchConfig& bc = p.bc;
    cuda::DeviceEp& ep = *p.ep;
    const int R = bc.R, H = bc.H;
    cudaStream_t stream = p.stream;
    const DataBytes bytes = count_bytes(p.plan, p.dst, H, bc.fp8, false);
    const std::vector<int> cols = check_columns(H);
    const size_t C = cols.size();
    std::vector<cpu::RankTokens> tokens;
    cpu::OracleOptions oracle;
    oracle.mode = bc.mode;
    if (bc.check) tokens = p.oracle_tokens(cols);

    std::ostringstream note;
    note << bytes.entries << " entries, " << bytes.heads << " rows sent, " << bytes.entries - bytes.heads
         << " filled on the destination, " << bytes.padding_rows << " padding rows";
    if (bc.fp8) {
        // The FP8 dispatch (e4m3 rows + 1x128 scales, quantised in the send) into the buffers' recv_x8 / recv_scale,
        // and into caller-owned codes and scales (RankIo::rows8 / row_scales, as the PyTorch op). Not checked here:
        // the sampled columns of --check cannot give a 128-block's amax (tests/cuda/gpu_fp8_dispatch_test.cu checks
        // every byte against the oracle).
        std::vector<DeviceArray<uint8_t>> rows8;
        std::vector<DeviceArray<float>> scales;
        std::vector<cuda::RankIo> caller = p.io;
        const int64_t nvs = ep.layout().nvs, spr = H / kFp8Block;
        for (int r = 0; r < R; ++r) {
            rows8.emplace_back(static_cast<size_t>(nvs * H));
            scales.emplace_back(static_cast<size_t>(nvs * spr));
            caller[r].rows8 = rows8.back().get();
            caller[r].row_scales = scales.back().get();
        }
        // DeepEP's form: the caller quantised the rows (launch_fp8_cast_rows, not timed) and the send moves its codes
        // and scales (RankIo::x8 / x_scales), so the source reads e4m3 too.
        std::vector<DeviceArray<uint8_t>> x8;
        std::vector<DeviceArray<float>> x_scales;
        std::vector<cuda::RankIo> quantised = p.io;
        for (int r = 0; r < R; ++r) {
            const int64_t s = p.routing.s[r];
            x8.emplace_back(static_cast<size_t>(s * H));
            x_scales.emplace_back(static_cast<size_t>(s * spr));
            cuda::launch_fp8_cast_rows(reinterpret_cast<const Bf16*>(p.io[r].x), s, H, /*ue8m0=*/false,
                                       reinterpret_cast<Fp8E4m3*>(x8.back().get()), x_scales.back().get(), nullptr,
                                       stream);
            quantised[r].x = nullptr;
            quantised[r].x8 = x8.back().get();
            quantised[r].x_scales = x_scales.back().get();
        }
        const DataBytes bytes8 = count_bytes(p.plan, p.dst, H, true, true);
        struct Row {
            const char* name;
            const std::vector<cuda::RankIo>* io;
            double bytes;
            const char* what;
        };
        for (const Row& row : {Row{"dispatch_fp8", &p.io, bytes.dispatch, ", bf16 rows cast in the send"},
                               Row{"dispatch_fp8_rows", &caller, bytes.dispatch, ", cast in the send, caller's rows"},
                               Row{"dispatch_fp8_quantised", &quantised, bytes8.dispatch, ", caller-quantised rows"}}) {
            const Stats st = time_op([&] { ep.dispatch(p.ep_plan, *row.io, stream); }, stream, bc.warmup, bc.iters);
            const std::optional<Stats> stg = p.graph_stats([&] { ep.dispatch(p.ep_plan, *row.io, stream); });
            ep.check(stream);
            if (want_dispatch) {
                p.add(row.name, st, row.bytes, ep.last_blocks_per_rank(), -1, note.str() + row.what);
                p.add_graph(row.name, stg, row.bytes, ep.last_blocks_per_rank(), -1, note.str() + row.what);
            }
        }
        return;  // combine stays bf16: bench combine without --fp8
    }
    {
        const Stats st = time_op([&] { ep.dispatch(p.ep_plan, p.io, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = p.graph_stats([&] { ep.dispatch(p.ep_plan, p.io, stream); });
        ep.check(stream);
        int64_t wrong = -1;
        if (bc.check && want_dispatch) {
            // Every used receive row (payload rows, duplicates, zeroed padding) and its weight, as the oracle's.
            const cpu::GroupDispatchResult want = cpu::dispatch_group(p.oracle_config(), tokens, oracle);
            wrong = 0;
            for (int r = 0; r < R; ++r) {
                const int64_t rows = p.plan.rows_used(r);
                const std::vector<Bf16> got = download_columns(ep.recv_x(r), rows, H, cols);
                const std::vector<float> gw = download(ep.recv_w(r), static_cast<size_t>(rows));
                for (int64_t i = 0; i < rows; ++i)
                    wrong += std::memcmp(got.data() + i * C, want.recv_x[r].data() + i * C, C * sizeof(Bf16)) != 0 ||
                             std::memcmp(&gw[i], &want.recv_w[r][i], sizeof(float)) != 0;
            }
        }
        if (want_dispatch) {
            p.add("dispatch", st, bytes.dispatch, ep.last_blocks_per_rank(), wrong, note.str());
            p.add_graph("dispatch", stg, bytes.dispatch, ep.last_blocks_per_rank(), wrong, note.str());
        }
    }
    if (!want_combine) return;

    struct Variant {
        const char* name;
        cuda::CombineMode mode;
        bool apply;
        double bytes;
    };
    const Variant variants[] = {{"combine_pull", cuda::CombineMode::kPull, false, bytes.combine_pull},
                                {"combine_push", cuda::CombineMode::kPushPartials, false, bytes.combine_push},
                                {"combine_pull_weighted", cuda::CombineMode::kPull, true, bytes.combine_pull}};
    for (const Variant& v : variants) {
        const Stats st =
            time_op([&] { ep.combine(p.ep_plan, p.io, v.apply, v.mode, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = p.graph_stats([&] { ep.combine(p.ep_plan, p.io, v.apply, v.mode, stream); });
        ep.check(stream);
        int64_t wrong = -1;
        if (bc.check) {
            // y = the dispatched rows (in place): every token's output against the oracle's combine of the same.
            const cpu::GroupCombineResult want = cpu::combine_group(p.oracle_config(), tokens, {}, v.apply, oracle);
            wrong = 0;
            for (int r = 0; r < R; ++r) {
                const int64_t s = p.routing.s[r];
                wrong += rows_differing(download_columns(p.out[r]->get(), s, H, cols), want.out[r], s, C);
            }
        }
        std::ostringstream note;
        note << bytes.heads << " partials (" << bytes.multi_heads << " fp32), y = dispatched rows";
        p.add(v.name, st, v.bytes, ep.last_blocks_per_rank(), wrong, note.str());
        p.add_graph(v.name, stg, v.bytes, ep.last_blocks_per_rank(), wrong, note.str());
    }
}

}  // namespace evenep::perf
