// GGUF checkpoints as hanpu models: the table that maps a GGUF architecture (general.architecture,
// llama.cpp's names) onto the model description the config parsers produce and its tensors onto
// the Hugging Face tensor names the blocks load (docs/GGUF.md). A GGUF family is a mapping, not a
// second model: the metadata becomes the config.json the family's parser reads, and each HF tensor
// the loader asks for is found in the file and undone from what llama.cpp's converter
// (convert_hf_to_gguf.py, conversion/qwen.py) did to it (norm offsets folded in, A_log stored as
// -exp(A_log), value heads reordered to ggml's tiled broadcast order, conv weights squeezed).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "hanpu/model.hpp"
#include "hanpu/tensor.hpp"
#include "io/gguf.hpp"

namespace hanpu::model {

/// A projection weight [rows, cols] stored in GGML blocks (rows of cols / block elements).
struct BlockWeight {
  gguf::GgmlType type = gguf::GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
};

/// Whether `path` names a GGUF file (a regular file ending in .gguf).
bool is_gguf_path(const std::string& path);

/// The GGUF architectures hanpu maps (for errors and help).
std::vector<std::string> gguf_supported_archs();

/// A GGUF model opened as a hanpu checkpoint.
class GgufCheckpoint {
 public:
  /// Opens (and validates) `path` or its split set and maps its metadata onto a ModelConfig.
  /// Throws hanpu::Error naming the file and the key for an architecture hanpu cannot run, a
  /// missing or invalid key.
  explicit GgufCheckpoint(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const GgufModel& file() const { return *file_; }
  const std::string& path() const { return path_; }
  const std::string& arch() const { return arch_; }
  uint64_t data_bytes() const;
  /// Whether the model has a separate LM head (output.weight), else it is tied to the embedding.
  bool has_lm_head() const;

  /// Whether the HF tensor `hf_name` ("model.layers.0.linear_attn.A_log") maps to a tensor of the file.
  bool has(const std::string& hf_name) const;
  /// The HF tensor as floats with the HF shape (F32/F16/BF16 tensors without a transform are
  /// views of the mapping; others are dequantized or transformed into a buffer appended to
  /// `owned`). Throws hanpu::Error naming the file, both names and the shapes on a mismatch.
  TensorView get(const std::string& hf_name, const std::vector<int64_t>& shape, std::vector<ByteBuffer>& owned) const;
  /// A projection [out, in] as GGML blocks when the file stores it quantized (not F32/F16/BF16)
  /// and the mapping can keep it in blocks (whole-row reorders are copied into `owned`); nullopt
  /// when it must go through get() instead.
  std::optional<BlockWeight> get_blocks(const std::string& hf_name, const std::vector<int64_t>& shape,
                                        std::vector<ByteBuffer>& owned) const;

 private:
  struct Resolved;
  Resolved resolve(const std::string& hf_name) const;
  std::string path_, arch_;
  std::shared_ptr<GgufModel> file_;
  ModelConfig config_;
};

/// The tokenizer.json (Hugging Face tokenizers' format) the `tokenizer.ggml.*` keys of `f` amount
/// to: a byte-level BPE (tokenizer.ggml.model "gpt2") with tokens, merges and token types (CONTROL
/// tokens become special added tokens, USER_DEFINED ones plain added tokens), and the split regex of
/// its pre-tokenizer (tokenizer.ggml.pre: llama.cpp's names "qwen2", "qwen35"). `eos` gets
/// tokenizer.ggml.eos_token_id when present. Throws hanpu::Error naming the key for anything else.
std::string gguf_tokenizer_json(const GgufFile& f, std::optional<int32_t>* eos);
/// Whether the GGUF file (or split set) at `path` carries a vocabulary (tokenizer.ggml.tokens):
/// llama.cpp's vocab-less files (random weights for benchmarks) have none, as a checkpoint
/// directory may have no tokenizer.json.
bool gguf_has_tokenizer(const std::string& path);
/// tokenizer.chat_template of a GGUF file ("" when absent).
std::string gguf_chat_template(const GgufFile& f);

/// A tensor as llama.cpp's converter writes it: its GGUF name and dims (ggml's ne order: dims[0]
/// is the element count of a row).
struct GgufExportedTensor {
  std::string name;
  std::vector<int64_t> dims;
};
/// The inverse of GgufCheckpoint::get for `hf_name` ("model.layers.3.linear_attn.A_log", the text
/// model's names) of a model of GGUF architecture `arch` with config `c`: applies in place to
/// `data` (float32, HF shape `hf_shape`) what llama.cpp's converter does to that tensor (norm
/// weights + 1, A_log -> -exp(A_log), value heads to ggml's tiled order, conv squeezed) and
/// returns the GGUF name and dims. nullopt for a tensor the mapping has no name for (the caller
/// decides whether that is an error). Throws hanpu::Error naming the tensor for an architecture
/// hanpu does not write (only qwen35) or a shape that does not fit the config.
std::optional<GgufExportedTensor> gguf_export_tensor(const std::string& arch, const ModelConfig& c,
                                                     const std::string& hf_name, const std::vector<int64_t>& hf_shape,
                                                     std::vector<float>& data);

/// The config.json text the GGUF metadata of `m` amounts to (what GgufCheckpoint parses; for tests
/// and `hanpu` diagnostics).
std::string gguf_config_json(const GgufModel& m);

}  // namespace hanpu::model
