// Layout-independent initialisation: the value of element i of parameter
// `name` is a pure function of (seed, name, i). Any later sharding or stage
// split materialises identical weights by evaluating only its own indices.
#pragma once

#include <cstdint>
#include <string_view>

#include "models/param_registry.hpp"

namespace strata::models {

// Counter-based hash (splitmix64 finaliser); also keys the data sampler.
std::uint64_t mix64(std::uint64_t x);
std::uint64_t hash_name(std::string_view name);
// Standard normal for key (seed, name_hash, index), by Box-Muller.
double keyed_normal(std::uint64_t seed, std::uint64_t name_hash, std::int64_t index);

// Fills out[k] with local element (begin + k) of parameter `spec`, k < count:
// the value of its global element, so a tensor-parallel shard holds exactly
// its slice of the whole tensor.
void init_param(float* out, const ParamSpec& spec, std::uint64_t seed, std::int64_t begin, std::int64_t count);

}  // namespace strata::models
