// tests/cuda/gpu_testing.hpp — helpers of the GPU tests: device skip, RAII device arrays, per-rank device inputs.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/detail/bf16.hpp"

// Skips the current test when no CUDA device is usable (cudaGetDeviceCount fails or returns 0).
#define EVENEP_SKIP_WITHOUT_DEVICE()                                               \
    do {                                                                           \
        if (!::evenep::cuda::device_available()) GTEST_SKIP() << "no CUDA device"; \
    } while (0)

namespace evenep::testing {

// A device array of n T (at least one element), zero-filled.
template <typename T>
class DeviceArray {
  public:
    explicit DeviceArray(size_t n = 0) : n_(n) {
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(T) * (n ? n : 1)));
        EVENEP_CUDA_CHECK(cudaMemset(ptr_, 0, sizeof(T) * (n ? n : 1)));
    }
    ~DeviceArray() { cudaFree(ptr_); }
    DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    T* get() const { return ptr_; }
    size_t size() const { return n_; }
    void upload(const T* data, size_t n) {
        if (n) EVENEP_CUDA_CHECK(cudaMemcpy(ptr_, data, sizeof(T) * n, cudaMemcpyHostToDevice));
    }
    void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
    std::vector<T> download(size_t n) const {
        std::vector<T> v(n);
        if (n) EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), ptr_, sizeof(T) * n, cudaMemcpyDeviceToHost));
        return v;
    }
    std::vector<T> download() const { return download(n_); }

  private:
    T* ptr_ = nullptr;
    size_t n_ = 0;
};

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

}  // namespace evenep::testing
