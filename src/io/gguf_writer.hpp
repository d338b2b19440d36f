// GGUF writer (format: ggml's docs/gguf.md, as gguf-py's gguf_writer.py and llama.cpp write it):
// header, metadata, tensor infos, then each tensor's data at an offset aligned to
// general.alignment (32). The file is written through AtomicFile: an error anywhere leaves no
// half-written file at the target.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "io/gguf.hpp"

namespace hanpu {

class GgufWriter {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);
  void add_bools(const std::string& key, const std::vector<bool>& v);

  /// A tensor of `type` with GGUF dims (dims[0] = elements per row, as ggml's ne) and its encoded
  /// bytes (whole blocks of `type`). Throws hanpu::Error naming the tensor on a size mismatch or a
  /// repeated name.
  void add_tensor(const std::string& name, gguf::GgmlType type, const std::vector<int64_t>& dims, std::vector<uint8_t> data);

  /// Writes the file atomically; throws hanpu::Error naming the file.
  void write(const std::string& path) const;
  /// Writes the file to the open descriptor `fd` (an anonymous memory file for quantizing at
  /// load); `what` names it in errors.
  void write_fd(int fd, const std::string& what) const;

  static constexpr uint32_t kAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT (no general.alignment key written)

 private:
  struct Tensor {
    std::string name;
    gguf::GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
  };
  void key(const std::string& k, GgufType t);
  template <class Sink>
  void emit(Sink&& sink) const;
  std::string kv_;  // encoded key/value pairs
  uint64_t kv_count_ = 0;
  std::vector<std::string> keys_;
  std::vector<Tensor> tensors_;
};

}  // namespace hanpu
