// evenep/detail/host_device.hpp — EVENEP_HOST_DEVICE: code that compiles for the CPU and, under nvcc, the GPU.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define EVENEP_HOST_DEVICE __host__ __device__
#define EVENEP_DEVICE __device__
#else
#define EVENEP_HOST_DEVICE
#define EVENEP_DEVICE
#endif
