// The one JSON reading layer of hanpu: device files, plan files, config.json, tokenizer.json, the
// checkpoint index and the safetensors header all go through parse_json / read_json_file.
//
//  * Nesting is limited (kMaxJsonDepth levels) while parsing, so a value nested 100,000 deep is an
//    error naming the file, never a stack overflow in a recursive walk, dump or destructor later.
//  * Duplicate keys are rejected (nlohmann keeps the last one silently; RFC 8259 section 4 leaves
//    their meaning undefined), with the JSON pointer (RFC 6901) of the object that repeats one.
//  * Parse errors name the file and the byte offset, and never dump the offending value.
//  * Files are read only if they are regular files (a FIFO or a directory is an error, not a hang).
//
// Error messages show values through json_summary(), which stops after a few dozen characters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hanpu {

/// Nesting limit for every JSON document hanpu reads. Real files nest a handful of levels
/// (tokenizer.json about 6); 256 leaves room for any sane generator and is far below what a
/// recursive walk can overflow.
constexpr int kMaxJsonDepth = 256;
/// Size limit for a JSON text file (tokenizer.json of large vocabularies is about 30 MB).
constexpr uint64_t kMaxJsonFileBytes = 1ull << 30;

struct JsonReadOptions {
  int max_depth = kMaxJsonDepth;
  bool reject_duplicate_keys = true;
};

/// Parses `text`; `origin` (a file name, or e.g. "plan JSON") starts every error message.
nlohmann::json parse_json(std::string_view text, const std::string& origin, const JsonReadOptions& opt = {});
/// Reads a regular file (read_regular_file) and parses it.
nlohmann::json read_json_file(const std::string& path, const JsonReadOptions& opt = {});

/// A short rendering of a JSON value for messages: like dump(), but cut at 60 characters and
/// never walking further into the value than that (a huge or deep value costs nothing).
std::string json_summary(const nlohmann::json& j);
/// "a string \"abc\"", "an integer 5", "an array [1,2]": the type and the summary.
std::string json_got(const nlohmann::json& j);

/// Escapes bytes below 0x20, 0x7f and backslash/quote as C escapes so that names from files cannot
/// inject terminal control sequences or fake lines into messages; other bytes pass unchanged.
std::string printable(std::string_view s);

}  // namespace hanpu
