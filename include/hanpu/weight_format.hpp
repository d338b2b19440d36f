// The formats a projection's weight can be held in, as values: one registry row per format with
// everything the rest of hanpu asks of a format (issue 34, "Weight formats as one abstraction").
// Code never tests a format by a side condition (a group size > 0, a GGUF type code); it asks the
// row. The CLI's `--weights` choices, `hanpu quantize --format` and the Python options are the
// names of these rows (and of the GGUF mixes at the end), so a new format is its kernels
// (src/cpu/linear_*.cpp, one hanpu::Linear implementation in hanpu/linear.hpp) plus one row here.
//
// Formats are per tensor. A *mix* (llama.cpp's Q4_K_M) is a file-level recipe that gives each
// tensor one of these formats (src/model/gguf_export.cpp has llama.cpp's rules); it is listed
// separately (weight_mixes) because it is no layout of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

class Linear;  // hanpu/linear.hpp

enum class WeightFormat : uint8_t {
  kBf16,   // bfloat16, the checkpoints' own format
  kF32,    // float32 (converted or test checkpoints, GGUF F32)
  kF16,    // IEEE half (f16 safetensors, GGUF F16)
  kInt8,   // hanpu's int8: symmetric, one f32 scale per group of in_features (Int8Linear)
  kQ8_0,   // GGML blocks (GgufLinear) from here on
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_XS,
  kIQ4_NL,  // llama-quantize's fallback for IQ4_XS on rows that are not whole 256-blocks
};

/// How a `--weights NAME` load gets a checkpoint's projections into the format.
enum class WeightLoad : uint8_t {
  /// Kept as the file stores them (bf16: a bf16 checkpoint's projections as they are; f32 and
  /// f16 weights of other checkpoints stay f32 and f16).
  kAsStored,
  /// Each projection converted at load by the row's quantizer (int8: Int8Linear's rounding; f16:
  /// round to nearest even), not kept in the original format.
  kPerTensor,
  /// The checkpoint written as a GGUF file of this format into memory with ggml's reference
  /// quantizer and llama.cpp's tensor rules (`hanpu quantize --format NAME`), then loaded as that
  /// file (docs/GGUF.md "Writing GGUF"). Only safetensors checkpoints.
  kGgufFile,
  /// Read from files only (a GGUF file that stores it); not quantized at load (`quantize_writes`
  /// says whether `hanpu quantize --format` writes it).
  kReadOnly,
};

/// One row of the registry.
struct WeightFormatInfo {
  WeightFormat format;
  /// The CLI and Python name (`--weights`, `hanpu quantize --format`, Model.load(weights=)).
  const char* name;
  /// Block layout: `block_elems` consecutive in_features of a row take `block_bytes` bytes. int8's
  /// block is its group: block_elems 0 here means "the group size" (ModelLoadOptions), its bytes
  /// group + 4 (the int8 values, and one f32 scale in a separate tensor).
  uint32_t block_elems;
  uint32_t block_bytes;
  /// The layout in words (docs/MODEL.md "Formats" prints these).
  const char* layout;
  /// File metadata: the safetensors dtype a checkpoint stores it as (nullopt: not in safetensors),
  /// the GGUF type code (nullopt: not in GGUF files), and what else marks it in a file.
  std::optional<DType> safetensors_dtype;
  std::optional<gguf::GgmlType> ggml_type;
  const char* file_metadata;
  /// How `--weights NAME` loads it, and whether `hanpu quantize --format NAME` writes it.
  WeightLoad load;
  bool quantize_writes;
  /// The load-time quantizer (kPerTensor rows; nullptr for the others): a float weight [N, K]
  /// (BF16, F16 or F32) as a projection in this format, owning its converted copy (`group`:
  /// int8's inputs per scale).
  std::unique_ptr<Linear> (*quantize)(const TensorView& weight, const std::string& name, int64_t group);
  /// The kernels per ISA, decode (M < a few rows) and prefill, with the source file.
  const char* decode_kernels;
  const char* prefill_kernels;

  /// Bytes of an [N, K] weight in this format (int8: with the group's scales).
  uint64_t bytes_for(int64_t N, int64_t K, int64_t int8_group) const;
  /// Average bytes per weight (int8: 1 + 4 / group).
  double bytes_per_weight(int64_t int8_group) const;
};

/// Every format, in WeightFormat order.
std::span<const WeightFormatInfo> weight_formats();
const WeightFormatInfo& weight_format_info(WeightFormat f);
/// The format of a GGML type code (nullopt: not a projection format hanpu runs).
std::optional<WeightFormat> weight_format_of_ggml(gguf::GgmlType t);
/// The format a safetensors tensor of dtype `dt` is held in when kept as stored (BF16, F32, F16,
/// I8 -> int8; nullopt for the rest).
std::optional<WeightFormat> weight_format_of_dtype(DType dt);

/// A GGUF mix: a file format whose tensors take several formats (llama.cpp's rules per tensor).
struct WeightMix {
  const char* name;     // "q4_k_m"
  WeightFormat main;    // the format most projections get
  const char* summary;  // which tensors get which format
};
std::span<const WeightMix> weight_mixes();

/// The names `--weights` accepts: the rows that load (kAsStored, kPerTensor, kGgufFile), then
/// the mixes.
std::vector<std::string> weight_load_names();
/// The names `hanpu quantize --format` accepts (quantize_writes rows, then the mixes).
std::vector<std::string> weight_quantize_names();

/// What `--weights` (or Model.load(weights=)) asked for.
struct WeightChoice {
  /// A format row, or nullopt for a mix.
  std::optional<WeightFormat> format;
  /// The mix (nullptr for a format row).
  const WeightMix* mix = nullptr;
  /// The name as given.
  std::string name;
  /// The format's load (a mix: kGgufFile).
  WeightLoad load() const { return mix ? WeightLoad::kGgufFile : weight_format_info(*format).load; }
};

/// Looks `name` up among the rows and mixes whose use `names` lists (weight_load_names() for
/// `--weights`, weight_quantize_names() for `--format`). Throws hanpu::Error naming `flag`,
/// what it got and the accepted names: "--weights: got 'q3_k', expected one of bf16, f16, ...".
WeightChoice weight_choice(const std::string& name, const std::string& flag, const std::vector<std::string>& names);

}  // namespace hanpu
