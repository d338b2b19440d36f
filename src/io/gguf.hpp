// Reading GGUF files (the checkpoint format of ggml / llama.cpp; specification: ggml's
// docs/gguf.md, writer: gguf-py's gguf_writer.py):
//
//   u32 magic "GGUF" | u32 version (2 or 3) | u64 tensor count | u64 metadata count
//   metadata: { string key, u32 value type, value }*      string = u64 length + UTF-8 bytes
//   tensor infos: { string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset }*
//   padding to general.alignment (default 32) | data section (tensor offsets are relative to it)
//
// dims[0] is the innermost (contiguous) dimension, a multiple of the type's block size. A model
// may be split over NAME-00001-of-0000N.gguf ... files carrying split.no / split.count /
// split.tensors.count; GgufModel opens the whole set from any one of them.
//
// Files come from users, so everything is validated before use (as in io/safetensors.cpp) and
// every problem is a hanpu::Error naming the file, the key or tensor, what was found and what was
// expected. The file is memory-mapped read-only; tensor data is never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "hanpu/gguf_format.hpp"

namespace hanpu {

/// GGUF metadata value types (gguf_type).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

/// One metadata value. Integers are widened (unsigned to uint64_t, signed to int64_t), floats to
/// double; `type` keeps the stored type. An array has `elem_type` and its elements in `array`
/// (arrays of arrays are allowed, as gguf-py writes them).
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // arrays only
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;

  bool is_integer() const;
  /// A short description for error messages: "u32 7", "string 'llama'", "array of 3 string".
  std::string describe() const;
};

struct GgufTensorInfo {
  std::string name;
  int n_dims = 0;
  int64_t dims[4] = {1, 1, 1, 1};  // ggml order: dims[0] innermost
  gguf::GgmlType type = gguf::GgmlType::F32;
  uint64_t offset = 0;  // in the data section
  uint64_t bytes = 0;
  const std::byte* data = nullptr;  // into the mapping
  int64_t numel() const { return dims[0] * dims[1] * dims[2] * dims[3]; }
  /// Elements of one row (dims[0]) and the number of rows (the product of the others).
  int64_t row_elems() const { return dims[0]; }
  int64_t rows() const { return dims[1] * dims[2] * dims[3]; }
};

class GgufFile;
GgufFile parse_gguf(const std::string& path, const std::byte* data, uint64_t size);

/// One GGUF file, memory-mapped and validated.
class GgufFile {
 public:
  /// Maps and validates `path`; throws hanpu::Error on any problem.
  static GgufFile open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts in the file

  /// Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(const std::string& key) const;
  /// The value of an integer key (any integer type; a negative value is an error), of a string key,
  /// or of a float key. Throw hanpu::Error naming the file and key if absent or of another type.
  uint64_t get_uint(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  double get_float(const std::string& key) const;

  /// Tensor infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  /// The tensor or a hanpu::Error naming the file and the tensor.
  const GgufTensorInfo& tensor(const std::string& name) const;

 private:
  friend GgufFile parse_gguf(const std::string& path, const std::byte* data, uint64_t size);
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::shared_ptr<void> mapping_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t> key_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

/// Validates GGUF bytes already in memory (the parser behind GgufFile::open; `data` must outlive
/// the result's tensor pointers). `path` names the source in errors. For the fuzzer and tests.
GgufFile parse_gguf(const std::string& path, const std::byte* data, uint64_t size);

/// A model in one GGUF file or split over NAME-0000i-of-0000N.gguf files.
class GgufModel {
 public:
  /// Opens `path`; if it is a split (split.count > 1, or a name of the form NAME-0000i-of-0000N.gguf)
  /// opens every part, checking split.no / split.count / split.tensors.count and that no tensor
  /// name appears twice. Throws hanpu::Error naming the part and key on any inconsistency.
  static GgufModel open(const std::string& path);

  const std::vector<GgufFile>& files() const { return files_; }
  /// The first part (its metadata is the model's).
  const GgufFile& main() const { return files_.front(); }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  const GgufTensorInfo& tensor(const std::string& name) const;
  size_t tensor_count() const { return by_name_.size(); }

 private:
  std::vector<GgufFile> files_;
  std::map<std::string, std::pair<size_t, size_t>> by_name_;  // -> (file, tensor index)
};

/// "NAME-00002-of-00005.gguf" -> {"NAME", 2, 5}; {"", 0, 0} if `path` is not a split part name.
struct GgufSplitName {
  std::string prefix;  // directory and NAME
  int no = 0, count = 0;
};
GgufSplitName parse_gguf_split_name(const std::string& path);
std::string gguf_split_path(const std::string& prefix, int no, int count);

}  // namespace hanpu
