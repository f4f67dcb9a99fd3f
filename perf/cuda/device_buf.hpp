// perf/cuda/device_buf.hpp — the benchmarks' device arrays (cuda::DeviceArray), synchronous read-backs, the columns
// --check compares. Internal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/detail/bf16.hpp"

namespace evenep::perf {

using ::evenep::cuda::DeviceArray;

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
