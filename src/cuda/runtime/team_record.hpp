// Private helpers of both device teams (team.cpp, nccl_team.cpp): reading and throwing the host-mapped device error
// record, so the two teams report failures with one formatter (evenep::cuda::format_device_error).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "evenep/cuda/team.hpp"

namespace evenep::cuda::detail_team {

// The record as one line ("" when none is set); `note` is appended to a peer timeout's "missing rank" clause.
std::string read_record(const DeviceErrorRecord* h_record, const char* note);

// Throws evenep::Error for a set record (kind from the record; a failed synchronisation is named as a trap), else
// for sync_err != cudaSuccess; returns false when there is nothing to report.
bool throw_recorded(const DeviceErrorRecord* h_record, cudaError_t sync_err, const char* note);

}  // namespace evenep::cuda::detail_team
