// Shared pieces of the libFuzzer targets (docs/RELIABILITY.md, "Fuzzing"). Each target feeds the
// bytes to one reader; a hanpu::Error is the expected answer to bad input, anything else (another
// exception, a crash, a sanitizer report, a hang) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hanpu/tensor.hpp"

namespace hanpu::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

/// A scratch file of this process (readers that take a path): rewritten for every input.
inline const std::string& scratch_path(const char* name) {
  static const std::string path = [name] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/hanpu_fuzz_" + std::to_string(::getpid()) + "_" + name;
  }();
  // Removed when the fuzzer exits (-max_total_time ends with exit()), so runs leave no files in /tmp.
  static const bool removed_at_exit = std::atexit([] { std::remove(path.c_str()); }) == 0;
  (void)removed_at_exit;
  return path;
}

inline void write_scratch(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

}  // namespace hanpu::fuzz
