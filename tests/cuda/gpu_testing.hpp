// tests/cuda/gpu_testing.hpp — helpers of the GPU tests: device skip, per-rank device inputs (cuda::DeviceArray).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/detail/bf16.hpp"

// Skips the current test when no CUDA device is usable (cudaGetDeviceCount fails or returns 0).
#define EVENEP_SKIP_WITHOUT_DEVICE()                                               \
    do {                                                                           \
        if (!::evenep::cuda::device_available()) GTEST_SKIP() << "no CUDA device"; \
    } while (0)

namespace evenep::testing {

using cuda::DeviceArray;

// Device inputs and outputs of R virtual ranks, each sized for S tokens (x, out: [S*H]; idx, w, out_w: [S*K]).
struct GroupIo {
    std::vector<DeviceArray<uint16_t>> x, out;
    std::vector<DeviceArray<int32_t>> idx;
    std::vector<DeviceArray<float>> w, out_w;
    std::vector<cuda::RankIo> io;

    GroupIo(int R, int S, int K, int H) {
        for (int r = 0; r < R; ++r) {
            x.emplace_back(static_cast<size_t>(S) * H);
            out.emplace_back(static_cast<size_t>(S) * H);
            idx.emplace_back(static_cast<size_t>(S) * K);
            w.emplace_back(static_cast<size_t>(S) * K);
            out_w.emplace_back(static_cast<size_t>(S) * K);
        }
        for (int r = 0; r < R; ++r)
            io.push_back(cuda::RankIo{x[r].get(), idx[r].get(), w[r].get(), out[r].get(), out_w[r].get()});
    }
};

inline std::vector<uint16_t> bits_of(const std::vector<Bf16>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
    return b;
}

// Synchronous host <-> device copies of raw device pointers (library-owned regions: slots, weights).
template <typename T>
void put(T* dev, const std::vector<T>& v) {
    EVENEP_CUDA_CHECK(cudaMemcpy(dev, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> get(const T* dev, size_t n) {
    std::vector<T> v(n);
    EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

}  // namespace evenep::testing
