// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors):
//
//   [8 bytes: header length N, little-endian u64][N bytes: JSON header][data section]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets
// relative to the data section, plus an optional "__metadata__" object of string -> string.
//
// Files come from users and other tools, so everything in them is validated before use and every
// problem is reported as a hanpu::Error naming the file, the tensor, what was found and what was
// expected. Only the dtypes hanpu computes with are accepted (F32, F16, BF16, F64, I32, I64, and I8
// for the int8 weights `hanpu quantize` writes).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hanpu/tensor.hpp"

namespace hanpu {

/// A safetensors file loaded into memory. Views returned by get() point into this object and stay
/// valid as long as it lives (moving it keeps them valid: the storage does not move).
class SafetensorsFile {
 public:
  /// Reads and validates the whole file; throws hanpu::Error on any problem.
  static SafetensorsFile open(const std::string& path);
  /// Same validation as open(), but the data section is memory-mapped read-only instead of read:
  /// nothing is copied (except tensors misaligned for their dtype), pages come in on first use,
  /// and several processes share them. For multi-gigabyte checkpoints. Views are read-only in
  /// fact: writing through them faults.
  static SafetensorsFile map(const std::string& path);
  /// Size of the data section in bytes (what map() maps, what open() reads).
  uint64_t data_bytes() const { return data_bytes_; }
  /// Touches every page of a mapped file's data section (no-op for open()) so that later reads
  /// do not fault; calls progress(done, total) in between (from the calling thread).
  void prefault(const std::function<void(uint64_t done, uint64_t total)>& progress = {}) const;

  /// For a mapped file: drops the whole pages inside tensor `name` from this process's resident
  /// set (the loader copied the tensor and will not read it again). Its bytes stay readable (from
  /// the page cache or the file on the next touch). No-op for open() and for misaligned tensors
  /// (their own copy). Throws hanpu::Error if there is no such tensor.
  void release_pages(const std::string& name) const;

  bool has(const std::string& name) const;
  /// A contiguous view of the tensor, aligned for its dtype. The view is mutable for API
  /// convenience; writing through it changes only this in-memory copy, never the file.
  /// Throws hanpu::Error naming the file and the tensor if there is no such tensor.
  TensorView get(const std::string& name) const;
  /// An owned copy of the tensor (outlives this object).
  Tensor load_copy(const std::string& name) const;
  /// Tensor names in the order of their data in the file.
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct AlignedFree {
    void operator()(std::byte* p) const;
  };
  using AlignedBytes = std::unique_ptr<std::byte, AlignedFree>;

  struct Entry {
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;         // offset in the data section
    uint64_t bytes = 0;         // numel * dtype size, validated against data_offsets
    std::byte* data = nullptr;  // into data_ or into own_copy
    AlignedBytes own_copy;      // set when the tensor's offset in the file is misaligned for its dtype
  };

  static SafetensorsFile open_impl(const std::string& path, bool mapped);

  std::string path_;
  AlignedBytes data_;  // the data section, 64-byte aligned (open())
  std::shared_ptr<void> mapping_;        // the whole file mapped read-only (map()); unmapped on release
  const std::byte* mapped_data_ = nullptr;  // start of the data section inside mapping_
  uint64_t data_bytes_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (in this order in the data section) with optional metadata. Views may be
/// strided; they are written contiguous. The file is written to a temporary name next to `path`
/// and renamed, so a failed write never leaves a truncated file behind.
/// Throws hanpu::Error for duplicate or reserved names, null data, or I/O failure.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// An owned contiguous copy of any (possibly strided) view, same dtype and shape.
Tensor copy_to_tensor(const TensorView& view);

}  // namespace hanpu
