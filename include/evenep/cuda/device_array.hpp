// evenep/cuda/device_array.hpp — DeviceArray<T>: n elements of device memory (cudaMalloc), freed once when the
// array is destroyed. The one owner of plain device allocations in the library, its benchmarks (perf/) and its
// tests; symmetric memory (what peers address) is owned by the team that allocated it.
//
// Host-only. Errors throw evenep::Error naming the CUDA error; destruction never throws. The zero fill and the
// copies are synchronous (complete on return, so any stream sees them); DeviceFill::kNone allocates only, which is
// also allowed while a stream is being captured.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "evenep/cuda/check.hpp"

namespace evenep::cuda {

enum class DeviceFill {
    kZero,  // every byte 0 (cudaMemset, then the legacy default stream is synchronised)
    kNone,  // contents undefined
};

template <typename T>
class DeviceArray {
  public:
    DeviceArray() = default;  // empty: no allocation, get() == nullptr
    // n elements; at least one is allocated, so get() is a valid device pointer even for n = 0.
    explicit DeviceArray(size_t n, DeviceFill fill = DeviceFill::kZero) : n_(n) {
        const size_t bytes = sizeof(T) * (n ? n : 1);
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes));
        if (fill == DeviceFill::kZero) {
            cudaError_t err = cudaMemset(p_, 0, bytes);
            if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
            if (err != cudaSuccess) reset();  // the destructor does not run when the constructor throws
            EVENEP_CUDA_CHECK(err);
        }
    }
    ~DeviceArray() { reset(); }
    DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    DeviceArray& operator=(DeviceArray&& o) noexcept {
        if (this != &o) {
            reset();
            p_ = std::exchange(o.p_, nullptr), n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    T* get() const { return p_; }  // nullptr only when empty (default-constructed or moved from)
    size_t size() const { return n_; }

    // Copies data[0, n) to elements [0, n) (n <= size()).
    void upload(const T* data, size_t n) {
        EVENEP_CHECK(n <= n_, "DeviceArray: upload of ", n, " elements into ", n_);
        if (n) EVENEP_CUDA_CHECK(cudaMemcpy(p_, data, sizeof(T) * n, cudaMemcpyHostToDevice));
    }
    void upload(std::span<const T> data) { upload(data.data(), data.size()); }
    // Elements [0, n) (n <= size()), to `out` or returned.
    void download(T* out, size_t n) const {
        EVENEP_CHECK(n <= n_, "DeviceArray: download of ", n, " elements from ", n_);
        if (n) EVENEP_CUDA_CHECK(cudaMemcpy(out, p_, sizeof(T) * n, cudaMemcpyDeviceToHost));
    }
    std::vector<T> download(size_t n) const {
        std::vector<T> v(n);
        download(v.data(), n);
        return v;
    }
    std::vector<T> download() const { return download(n_); }

  private:
    void reset() noexcept {
        if (p_ != nullptr) cudaFree(p_);  // NOTE: an error here (a sticky one from a kernel) is reported elsewhere
        p_ = nullptr;
    }

    T* p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace evenep::cuda
