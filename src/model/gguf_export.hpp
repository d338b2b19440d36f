// `hanpu quantize --format`: a Hugging Face safetensors checkpoint written as a GGUF file that
// llama.cpp loads, with llama.cpp's tensor names, metadata keys and tokenizer.ggml.* keys, and the
// projections in a GGML block format quantized with ggml's reference rounding (hanpu/gguf_format.hpp).
// docs/GGUF.md ("Writing GGUF").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"

namespace hanpu {

/// The file formats `hanpu quantize --format` writes, by their llama.cpp names.
enum class GgufFileFormat { kF16, kQ8_0, kQ4_K_M, kQ4_K, kQ6_K, kQ5_K_M, kQ5_K };
/// "f16", "q8_0", "q4_k_m", "q4_k", "q6_k", "q5_k_m", "q5_k" -> the format; throws hanpu::Error listing the names.
GgufFileFormat parse_gguf_file_format(const std::string& name);
/// llama.cpp's llama_ftype value written as general.file_type.
uint32_t gguf_file_type(GgufFileFormat f);

/// Which GGML type a tensor gets in a file of format `f` (llama.cpp's llama-quant.cpp rules for
/// the mixes, docs/GGUF.md lists them). `name` is the GGUF tensor name, `dims` its GGUF dims,
/// `i_attn_v` / `n_attn_v` the index of this tensor among the file's attn_v / attn_qkv tensors
/// and their count, `n_layer` the block count, `tied` whether output.weight is absent, `n_expert`
/// the file's expert_count (0 for a dense model; llama.cpp has rules for exactly 8).
gguf::GgmlType gguf_tensor_type(GgufFileFormat f, const std::string& name, const std::vector<int64_t>& dims,
                                int i_attn_v, int n_attn_v, int64_t n_layer, bool tied, int64_t n_expert = 0);

struct GgufExportStats {
  size_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::pair<std::string, gguf::GgmlType>> types;  // per tensor, in file order
};

class GgufWriter;
/// Adds the tokenizer.ggml.* keys (and tokenizer.chat_template) llama.cpp's converter writes for
/// the tokenizer of checkpoint directory `model_dir`, tokens for ids 0..vocab_size-1: from
/// tokenizer.json (a byte-level BPE whose split regex and normalizer are one of
/// model::gguf_pre_tokenizers(): qwen2, qwen35, Ling's bailingmoe2) or from Kimi's tiktoken.model
/// with tokenizer_config.json (pre "kimi-k2", merges recovered from the ranks). Returns false
/// when the directory has neither; throws hanpu::Error naming the file for a tokenizer it cannot
/// name (another split regex) or a token outside vocab_size.
bool add_gguf_tokenizer_keys(const std::string& model_dir, int64_t vocab_size, GgufWriter& w);
/// Reads the checkpoint directory `model_dir` (config.json, safetensors shards, tokenizer.json,
/// tokenizer_config.json) and writes `out_path` atomically. Throws hanpu::Error naming the file,
/// tensor or key on anything it cannot write (an architecture other than qwen35, a tensor
/// without a GGUF name, a missing tokenizer).
GgufExportStats write_checkpoint_as_gguf(const std::string& model_dir, const std::string& out_path, GgufFileFormat f);

/// The same file in an anonymous memory file (memfd) instead of on disk, for `--weights q4_k_m`
/// etc. on a safetensors checkpoint: returns the descriptor (the caller closes it once the GGUF
/// reader has mapped it). Throws hanpu::Error as write_checkpoint_as_gguf.
int write_checkpoint_as_gguf_memfd(const std::string& model_dir, GgufFileFormat f, GgufExportStats* stats = nullptr);

}  // namespace hanpu
