// evenep/io.hpp — routing files and plan dumps (SPEC §6).
//
// Readers take regular files only, within a size limit (.npy: kMaxInputFileBytes, JSON: kMaxJsonInputBytes), and
// refuse FIFOs, devices and directories before opening them; JSON objects with a key given twice are refused.
// Writers replace their target atomically (a temporary file beside it, renamed once complete). Both go through
// evenep/files.hpp; every error is evenep::Error(kInvalidArgument) naming the path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep {

// tpe JSON: {"R":..,"E":..,"K":..,"S":..,"s":[R],"tpe":[[E]...R]}. Throws evenep::Error naming the field.
struct TpeFile {
    int R = 0, E = 0, K = 0, S = 0;
    std::vector<int32_t> s;    // [R]
    std::vector<int32_t> tpe;  // [R*E]
};
TpeFile read_tpe_json(const std::string& path);
void write_tpe_json(const std::string& path, const TpeFile& f);

// NumPy .npy (format 1.0/2.0, little-endian, C order). Throws evenep::Error on anything else.
struct NpyArray {
    std::string dtype;            // numpy descr, e.g. "<i4", "<f4"
    std::vector<int64_t> shape;
    std::vector<char> data;       // raw little-endian bytes, C order
};
NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
               size_t num_bytes);

// Routing from an int32 [R, S, K] .npy (-1 masked); s_r = S for every rank unless trailing tokens of a rank
// are fully masked AND `trim_masked_tail` is set. Checks ids against E (error names rank, token, k, value).
// int64 ('<i8') files are accepted too; every id is range-checked before the conversion to int32. With
// `trim_masked_tail`, s_r is one past the last token of rank r with an unmasked entry (at least 1).
Routing read_routing_npy(const std::string& path, int E, bool trim_masked_tail = false);
void write_routing_npy(const std::string& path, const Routing& routing);  // pads ranks with s_r < S by -1

// The plan dump's schema string. Version 2 added the copy tree (relay_src, relay_round) and the copy critical paths;
// version 1 dumps lack them (docs/plan-schema.md says how to upgrade one).
inline constexpr const char* kPlanSchema = "evenep.plan/2";

// Plan dump, schema kPlanSchema (docs/plan-schema.md). `dst` may be empty (no routing given).
std::string plan_to_json(const Plan& plan, const std::vector<std::vector<int32_t>>& dst, int indent = -1);

}  // namespace evenep
