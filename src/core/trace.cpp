// Router traces (evenep/trace.hpp): .npy reading and writing through read_npy / write_npy (evenep/io.hpp).
#include "evenep/trace.hpp"

#include <cstring>
#include <limits>

#include "evenep/error.hpp"
#include "evenep/io.hpp"

namespace evenep {

void validate_trace(const RouterTrace& t, int K, int S, const std::string& where) {
    EVENEP_CHECK(t.T >= 1 && t.L >= 1 && t.R >= 1 && t.E >= 1, where, ": every dimension must be >= 1 (T = ", t.T,
                 ", L = ", t.L, ", R = ", t.R, ", E = ", t.E, ")");
    EVENEP_CHECK(K >= 1 && S >= 1, where, ": K = ", K, " and S = ", S, " must be >= 1");
    const size_t n = static_cast<size_t>(t.T) * t.L * t.R * t.E;
    EVENEP_CHECK(t.counts.size() == n, where, ": ", t.counts.size(), " counts, expected T*L*R*E = ", n);
    const int64_t row_max = static_cast<int64_t>(S) * K;
    for (int step = 0; step < t.T; ++step)
        for (int l = 0; l < t.L; ++l) {
            const std::span<const int32_t> h = t.histogram(step, l);
            for (int r = 0; r < t.R; ++r) {
                int64_t sum = 0;
                for (int e = 0; e < t.E; ++e) {
                    const int32_t c = h[static_cast<size_t>(r) * t.E + e];
                    EVENEP_CHECK(c >= 0 && c <= S, where, ": step ", step, ", layer ", l, ", rank ", r, ", expert ", e,
                                 ": count ", c, " outside [0, S = ", S, "]");
                    sum += c;
                }
                EVENEP_CHECK(sum <= row_max, where, ": step ", step, ", layer ", l, ", rank ", r, ": ", sum,
                             " entries exceed S*K = ", row_max, " (S = ", S, ", K = ", K, ")");
            }
        }
}

RouterTrace read_trace(const std::string& path, int K, int S) {
    const NpyArray a = read_npy(path);
    const std::string where = "trace '" + path + "'";
    EVENEP_CHECK(a.dtype == "<i4" || a.dtype == "<i8", where, ": dtype ", a.dtype, " must be int32 (<i4) or int64 (<i8)");
    EVENEP_CHECK(a.shape.size() == 3 || a.shape.size() == 4, where, ": ", a.shape.size(),
                 " dimensions, expected [T, R, E] or [T, L, R, E]");
    for (int64_t d : a.shape)
        EVENEP_CHECK(d >= 1 && d <= std::numeric_limits<int32_t>::max(), where, ": dimension ", d,
                     " must be in [1, 2^31)");
    RouterTrace t;
    t.layered = a.shape.size() == 4;
    t.T = static_cast<int>(a.shape[0]);
    t.L = t.layered ? static_cast<int>(a.shape[1]) : 1;
    t.R = static_cast<int>(a.shape[a.shape.size() - 2]);
    t.E = static_cast<int>(a.shape.back());
    const size_t n = static_cast<size_t>(t.T) * t.L * t.R * t.E;
    t.counts.resize(n);
    if (a.dtype == "<i4") {
        std::memcpy(t.counts.data(), a.data.data(), n * sizeof(int32_t));
    } else {
        for (size_t i = 0; i < n; ++i) {
            int64_t v = 0;
            std::memcpy(&v, a.data.data() + i * sizeof(int64_t), sizeof(int64_t));
            EVENEP_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(), where,
                         ": count ", v, " at flat index ", i, " does not fit int32");
            t.counts[i] = static_cast<int32_t>(v);
        }
    }
    validate_trace(t, K, S, where);
    return t;
}

void write_trace(const std::string& path, const RouterTrace& t) {
    const size_t n = static_cast<size_t>(t.T) * t.L * t.R * t.E;
    EVENEP_CHECK(t.counts.size() == n, "write_trace: ", t.counts.size(), " counts, expected T*L*R*E = ", n);
    std::vector<int64_t> shape{t.T, t.R, t.E};
    if (t.layered || t.L > 1) shape = {t.T, t.L, t.R, t.E};
    write_npy(path, "<i4", shape, t.counts.data(), n * sizeof(int32_t));
}

}  // namespace evenep
