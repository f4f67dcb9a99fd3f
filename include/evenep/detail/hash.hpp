// evenep/detail/hash.hpp — the library's one integer hash (SplitMix64) and its one random-bf16 element,
// identical on host and device.
//
// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by the odd constant kSplitMix64Gamma and an
// output function (splitmix64_mix, Stafford's "Mix13") that is a bijection of 64-bit words. Everything random in
// EvenEP derives from it: the seeding of evenep::Rng (src/core/routing.cpp), the problem generator of the MoE
// layer, the random fills of device buffers and the tests' own generators. Changing any constant here changes
// golden values (tests/unit/routing_test.cpp) and every generated problem.
#pragma once

#include <cstdint>

#include "evenep/detail/bf16.hpp"
#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;

// The SplitMix64 output function of state z.
EVENEP_HOST_DEVICE constexpr uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// One generator step: advances `state` and returns the next output.
EVENEP_HOST_DEVICE constexpr uint64_t splitmix64_next(uint64_t& state) {
    state += kSplitMix64Gamma;
    return splitmix64_mix(state);
}

// Hash of one word: the first output of a generator seeded with z.
EVENEP_HOST_DEVICE constexpr uint64_t hash64(uint64_t z) { return splitmix64_mix(z + kSplitMix64Gamma); }

// Hash of (seed, i): output i + 1 of a generator seeded with `seed` (the key of the device random fill).
EVENEP_HOST_DEVICE constexpr uint64_t hash64(uint64_t seed, uint64_t i) { return hash64(seed + kSplitMix64Gamma * i); }

// Uniform float in [0, 1) from the top 24 bits of a hash (every value exact in binary32).
EVENEP_HOST_DEVICE constexpr float unit_float(uint64_t h) {
    return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// The element of every random bf16 fill: (2u - 1) * scale rounded to nearest even, u = unit_float(h), so a value in
// [-scale, scale). Host and device fills call this one function; only the hash key of element i differs per fill.
EVENEP_HOST_DEVICE inline Bf16 random_bf16(uint64_t h, float scale) {
    return float_to_bf16((2.0f * unit_float(h) - 1.0f) * scale);
}

static_assert(hash64(0) == 0xE220A8397B1DCDAFull, "SplitMix64(0)'s first output (the published reference value)");
static_assert(hash64(5, 3) == splitmix64_mix(5 + 4 * kSplitMix64Gamma), "hash64(seed, i) is output i + 1 of seed");

}  // namespace evenep::detail
