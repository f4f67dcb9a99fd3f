// LLEP-like baseline (perf/llep.hpp).
#include "perf/llep.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "evenep/error.hpp"

namespace evenep::perf {

std::vector<int64_t> llep_alloc(int R, int E, std::span<const int64_t> expert_load, double threshold) {
    EVENEP_CHECK(R >= 1 && E >= R && E % R == 0, "LLEP: E = ", E, " is not a positive multiple of R = ", R);
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(E), "LLEP: expert_load has ", expert_load.size(),
                 " entries, expected E = ", E);
    EVENEP_CHECK(std::isfinite(threshold) && threshold >= 1, "LLEP: threshold = ", threshold, " must be >= 1");
    const int epn = E / R;
    std::vector<int64_t> alloc(static_cast<size_t>(E) * R, 0), load(R, 0);
    int64_t total = 0;
    for (int e = 0; e < E; ++e) {
        EVENEP_CHECK(expert_load[e] >= 0, "LLEP: expert ", e, " has negative load ", expert_load[e]);
        alloc[static_cast<size_t>(e) * R + e / epn] = expert_load[e];
        load[e / epn] += expert_load[e];
        total += expert_load[e];
    }
    const int64_t cap = static_cast<int64_t>(std::ceil(threshold * static_cast<double>(total) / R));
    std::vector<int32_t> ranks(R);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(ranks.begin(), ranks.end(), [&](int32_t a, int32_t b) { return load[a] > load[b]; });
    for (int32_t r : ranks) {
        if (load[r] <= cap) break;
        std::vector<int32_t> own(epn);
        std::iota(own.begin(), own.end(), r * epn);
        std::stable_sort(own.begin(), own.end(),
                         [&](int32_t a, int32_t b) { return expert_load[a] > expert_load[b]; });
        for (int32_t e : own) {
            int64_t& home_rows = alloc[static_cast<size_t>(e) * R + r];
            while (load[r] > cap && home_rows > 0) {
                int32_t dst = -1;  // the least-loaded rank, lower id on ties
                for (int q = 0; q < R; ++q)
                    if (dst < 0 || load[q] < load[dst]) dst = q;
                const int64_t n = std::min({load[r] - cap, home_rows, cap - load[dst]});
                if (n <= 0) break;  // cannot happen while R * cap >= total
                home_rows -= n;
                alloc[static_cast<size_t>(e) * R + dst] += n;
                load[r] -= n;
                load[dst] += n;
            }
            if (load[r] <= cap) break;
        }
    }
    return alloc;
}

}  // namespace evenep::perf
