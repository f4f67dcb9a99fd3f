// Copy-bandwidth anchors and the device summary (perf/cuda/bench.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "perf/cuda/bench.hpp"
#include "perf/cuda/point.hpp"
#include "perf/cuda/timing.hpp"

namespace evenep::perf {

std::string device_summary() {
    int dev = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p{};
    EVENEP_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    int clock_khz = 0, mem_clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
    cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    std::ostringstream os;
    os << p.name << ", sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
       << p.totalGlobalMem / (1 << 20) << " MiB, L2 " << p.l2CacheSize / (1 << 20) << " MiB, SM clock "
       << clock_khz / 1000 << " MHz, memory " << mem_clock_khz / 1000 << " MHz x " << bus_bits << " bit";
    return os.str();
}

std::vector<BenchRow> bench_copy(size_t bytes, int warmup, int iters) {
    bytes = bytes / 16 * 16;
    DeviceArray<char> a(bytes), b(bytes);
    EVENEP_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
    EVENEP_CUDA_CHECK(cudaMemset(b.get(), 2, bytes));
    cudaStream_t stream;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int dev = 0, sms = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    std::ostringstream shape;
    shape << bytes / (1 << 20) << " MiB";
    std::vector<BenchRow> rows;
    const Stats m =
        time_op([&] { EVENEP_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream)); },
                stream, warmup, iters);
    rows.push_back(make_row("copy_memcpy", shape.str(), 0, m, 2.0 * bytes, 0, iters));
    const Stats k =
        time_op([&] { cuda::launch_copy_vec16(b.get(), a.get(), bytes, 4 * sms, stream); }, stream, warmup, iters);
    rows.push_back(make_row("copy_kernel", shape.str(), 0, k, 2.0 * bytes, 0, iters));
    rows.back().note = "16-byte vectors, 4 loads in flight per thread, 4 blocks of 512 per SM";
    EVENEP_CUDA_CHECK(cudaStreamDestroy(stream));
    const double best = copy_anchor_gbps(rows);
    for (BenchRow& r : rows) r.frac_copy = r.gbps / best;
    return rows;
}

double copy_anchor_gbps(const std::vector<BenchRow>& anchors) {
    double best = 0;
    for (const BenchRow& r : anchors)
        if (r.op.rfind("copy_", 0) == 0) best = std::max(best, r.gbps);
    return best;
}

}  // namespace evenep::perf
