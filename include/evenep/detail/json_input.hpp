// evenep/detail/json_input.hpp — JSON inputs parsed strictly, shared by the library's readers (tpe JSON, pipeline
// cost and image files) and the CLI's (GPU timing files). Kept out of the public headers so that nlohmann::json
// stays a private dependency of users of evenep::core; the readers that include this link nlohmann_json themselves.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "evenep/files.hpp"

namespace evenep::detail {

// Parses `text`; `where` opens every error message (e.g. "tpe JSON 'h.json'"). Throws Error(kInvalidArgument) on a
// syntax error (line and column), a number outside a double's range, and a key that appears twice in one object (the
// key is named, with the key of the object that holds it). Last-wins duplicates would silently drop the data.
nlohmann::json parse_json_strict(std::string_view text, const std::string& where);

// read_input_file (files.hpp: no FIFOs, devices or directories; at most `max_bytes`) then parse_json_strict. Errors
// start with "<what> '<path>'".
nlohmann::json read_json_file(const std::string& path, std::string_view what, uint64_t max_bytes = kMaxJsonInputBytes);

}  // namespace evenep::detail
