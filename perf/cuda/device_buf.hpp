// perf/cuda/device_buf.hpp — a device array owned by a benchmark, synchronous read-backs, the columns --check
// compares. Internal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "evenep/cuda/check.hpp"
#include "evenep/detail/bf16.hpp"

namespace evenep::perf {

template <typename T>
class DeviceBuf {
  public:
    // n elements (at least one is allocated); zero: cudaMemset to 0 first.
    explicit DeviceBuf(size_t n, bool zero = false) : n_(n) {
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), sizeof(T) * (n ? n : 1)));
        if (zero) {
            const cudaError_t err = cudaMemset(p_, 0, sizeof(T) * (n ? n : 1));
            if (err != cudaSuccess) cudaFree(p_);
            EVENEP_CUDA_CHECK(err);
        }
    }
    ~DeviceBuf() { cudaFree(p_); }
    DeviceBuf(const DeviceBuf&) = delete;
    DeviceBuf& operator=(const DeviceBuf&) = delete;
    T* get() const { return p_; }
    size_t size() const { return n_; }

  private:
    T* p_ = nullptr;
    size_t n_;
};

template <typename T>
std::vector<T> download(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n) EVENEP_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// --check compares the data path with the CPU oracle (evenep/cpu/oracle.hpp) on a slice of kCheckColumns columns
// of every row: dispatch moves whole rows and combine is column by column, so the oracle run on the slice (a
// valid hidden size: a multiple of 8) gives exactly the sliced columns of the full run.
inline constexpr int kCheckColumns = 8;
std::vector<int> check_columns(int H);
// rows [0, n) of a row-major [*, H] bf16 device array at `cols` -> [n, cols.size()] on the host.
std::vector<Bf16> download_columns(const uint16_t* p, int64_t n, int H, const std::vector<int>& cols);

}  // namespace evenep::perf
