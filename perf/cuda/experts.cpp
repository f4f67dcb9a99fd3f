// The expert-copy benchmark rows (perf/cuda/bench.hpp): prefetch_weight (slots filled from the homes) and
// reduce_grad (slot gradients summed into the homes), on pools of Experts over the point's device EP.
#include "evenep/cuda/experts.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "evenep/cuda/detail/launchers.hpp"
#include "perf/cuda/point.hpp"

namespace evenep::perf {

void bench_experts(Point& p, bool want_prefetch, bool want_reduce) {
    const BenchConfig& bc = p.bc;
    cuda::DeviceEp& ep = *p.ep;
    const Plan& plan = p.plan;
    const int R = bc.R, H = bc.H;
    cudaStream_t stream = p.stream;
    int64_t copies = 0, distinct = 0;
    for (size_t i = 0; i < plan.copies.size(); ++i) {
        const int32_t e = plan.copies[i];
        if (e < 0) continue;
        ++copies;
        bool first = true;
        for (size_t j = 0; j < i; ++j) first = first && plan.copies[j] != e;
        distinct += first;
    }
    const int epn = p.cfg.epn(), B = p.cfg.num_slots();
    const size_t n = static_cast<size_t>(H) * bc.ffn_hidden;
    // Projections moved per copy: the requested number, fewer if the pool would not fit in free device memory
    // (every rank holds epn local experts and B slots per projection). Each op's Experts frees its windows at the end
    // of its block, so reduce_grad gets the memory prefetch_weight used.
    auto projections_that_fit = [&](bool grads) {
        size_t free_bytes = 0, total_bytes = 0;
        EVENEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        const double per_projection = static_cast<double>(R) * (epn + B) * n * (grads ? 4 : 2);
        int P = bc.expert_projections;
        while (P > 1 && P * per_projection > 0.9 * static_cast<double>(free_bytes)) --P;
        return P;
    };
    auto experts_note = [&](int P) {
        std::ostringstream note;
        note << copies << " copies of " << distinct << " experts, " << P << " projection(s) of " << H << "x"
             << bc.ffn_hidden;
        return note.str();
    };
    if (want_prefetch) {
        cuda::ExpertsShape es;
        es.num_projections = projections_that_fit(false);
        es.elems = static_cast<int64_t>(n);
        es.with_grads = false;
        cuda::Experts ex(ep, es);
        const int P = es.num_projections;
        for (int r = 0; r < R; ++r)
            for (int q = 0; q < P; ++q)
                for (int g = 0; g < epn; ++g)
                    cuda::launch_fill_random_bf16(ex.weight(r, q, g), n, 7 + r * 131 + q * 17 + g, stream);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        const Stats st = time_op([&] { ex.prefetch_weight(ep, p.ep_plan, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = p.graph_stats([&] { ex.prefetch_weight(ep, p.ep_plan, stream); });
        ep.check(stream);
        int64_t wrong = -1;
        if (bc.check) {
            wrong = 0;
            const size_t m = std::min<size_t>(n, 4096);
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b) {
                    const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
                    if (e < 0) continue;
                    for (int q = 0; q < P; ++q)
                        for (size_t off : {size_t{0}, n / 2, n - m})
                            wrong += download(ex.slot(r, q, b) + off, m) !=
                                     download(ex.weight(e / epn, q, e % epn) + off, m);
                }
        }
        const double b = 2.0 * n * P * static_cast<double>(distinct + copies);
        p.add("prefetch", st, b, ex.last_blocks_per_rank(), wrong, experts_note(P));
        p.add_graph("prefetch", stg, b, ex.last_blocks_per_rank(), wrong, experts_note(P));
    }
    if (want_reduce) {
        cuda::ExpertsShape es;
        es.num_projections = projections_that_fit(true);
        es.elems = static_cast<int64_t>(n);
        es.with_weights = false;
        cuda::Experts ex(ep, es);
        const int P = es.num_projections;
        // fp32 data: two random bf16 halves make a finite float in (-1, 1) with random low bits.
        for (int r = 0; r < R; ++r)
            for (int q = 0; q < P; ++q) {
                for (int g = 0; g < epn; ++g)
                    cuda::launch_fill_random_bf16(reinterpret_cast<uint16_t*>(ex.grad(r, q, g)), 2 * n, 9 + r * 131 + g,
                                                  stream);
                for (int b = 0; b < B; ++b)
                    cuda::launch_fill_random_bf16(reinterpret_cast<uint16_t*>(ex.slot_grad(r, q, b)), 2 * n,
                                                  11 + r * 131 + b, stream);
            }
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        int64_t wrong = -1;
        if (bc.check) {
            // One reduction checked on a sample of elements: g + slots in ascending (rank, slot) order.
            const size_t m = std::min<size_t>(n, 1024);
            std::vector<std::vector<float>> want_g(static_cast<size_t>(R) * epn * P);
            for (int h = 0; h < R; ++h)
                for (int q = 0; q < P; ++q)
                    for (int g = 0; g < epn; ++g) want_g[(h * P + q) * epn + g] = download(ex.grad(h, q, g), m);
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b) {
                    const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
                    if (e < 0) continue;
                    for (int q = 0; q < P; ++q) {
                        const std::vector<float> sg = download(ex.slot_grad(r, q, b), m);
                        std::vector<float>& g = want_g[((e / epn) * P + q) * epn + e % epn];
                        for (size_t i = 0; i < m; ++i) g[i] = g[i] + sg[i];
                    }
                }
            ex.reduce_grad(ep, p.ep_plan, stream);
            ep.check(stream);
            wrong = 0;
            for (int h = 0; h < R; ++h)
                for (int q = 0; q < P; ++q)
                    for (int g = 0; g < epn; ++g) {
                        const std::vector<float> got = download(ex.grad(h, q, g), m);
                        wrong += std::memcmp(got.data(), want_g[(h * P + q) * epn + g].data(), m * 4) != 0;
                    }
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b)
                    if (plan.copies[static_cast<size_t>(r) * B + b] >= 0)
                        for (float v : download(ex.slot_grad(r, 0, b), m)) wrong += v != 0.0f;
        }
        const Stats st = time_op([&] { ex.reduce_grad(ep, p.ep_plan, stream); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> stg = p.graph_stats([&] { ex.reduce_grad(ep, p.ep_plan, stream); });
        ep.check(stream);
        const double b = 8.0 * n * P * static_cast<double>(distinct + copies);
        p.add("reduce", st, b, ex.last_blocks_per_rank(), wrong,
              experts_note(P) + (bc.check ? " (timed runs after the checked one add zeroed slots)" : ""));
        p.add_graph("reduce", stg, b, ex.last_blocks_per_rank(), -1, experts_note(P));
    }
}

}  // namespace evenep::perf
