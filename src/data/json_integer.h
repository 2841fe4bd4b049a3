// JSON integer checks shared by the data readers (shard index, token samples).
#pragma once

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

namespace dspine::data {

// Whether an unsigned JSON integer fits int64_t (the JSON parser reports non-negative integers
// as unsigned; 2^63 and above would wrap).
inline bool fits_int64(uint64_t value) {
  return value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

// Whether `value` is a JSON integer that fits int64_t. get<int64_t>() alone would truncate 1.5,
// wrap 2^63 and treat 1e300 as undefined behaviour.
inline bool is_int64(const nlohmann::json& value) {
  return value.is_number_integer() &&
         (!value.is_number_unsigned() || fits_int64(value.get<uint64_t>()));
}

}  // namespace dspine::data
