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

#include <nlohmann/json.hpp>

#include "hanpu/gguf_format.hpp"
#include "hanpu/linear.hpp"  // GgufLayout
#include "hanpu/model.hpp"
#include "hanpu/tensor.hpp"
#include "io/gguf.hpp"

namespace hanpu::model {

/// What llama.cpp's converter did to a tensor, undone on load (and done again by
/// gguf_export_tensor). "Tiled" value heads: with r = value heads / key heads > 1 the qwen35
/// converter reorders GDN value heads from grouped-by-key-head [g0v0..g0v(r-1), g1v0, ...] to
/// ggml's tiled order [g0v0, g1v0, ..., g0v1, g1v1, ...] (_LinearAttentionVReorderBase._reorder_v_heads
/// in llama.cpp's conversion/qwen.py); only mappings with `tiled_value_heads` do that.
enum class GgufFix {
  kNone,
  kNormMinusOne,   // Qwen's zero-centred RMSNorm weights are stored as 1 + w (all "norm.weight" but linear_attn.norm)
  kALog,           // stored as ssm_a = -exp(A_log) (Qwen, Kimi); value heads tiled
  kALogExp,        // stored as exp(A_log) (Ling's safe gate multiplies by it)
  kDtBias,         // stored as ssm_dt.bias; value heads tiled (one value per head)
  kBetaAlphaRows,  // in_proj_b / in_proj_a: rows = value heads, tiled
  kQkvRows,        // in_proj_qkv: the value rows (after 2 * key_dim) tiled by head of linear_value_head_dim
  kZRows,          // in_proj_z: rows tiled by head of linear_value_head_dim
  kConv,           // conv weights: stored without their unit dims (GDN [C, K], KDA [1, C, 1, K]); GDN value channels tiled
  kOutCols,        // out_proj: input columns tiled by head of linear_value_head_dim
  kExpert,         // experts.{e}.*: slice e of the stacked 3-D ffn_*_exps tensor
  kSqueezed,       // stored without HF's unit dims (shared_expert_gate [1, H] as [H])
  kBetaOfBa,       // Qwen3-Next in_proj_b: the b rows of the fused ssm_ba (per key-head group [b (r) | a (r)])
  kAlphaOfBa,      // Qwen3-Next in_proj_a: the a rows of ssm_ba
  kKvB,            // MLA kv_b_proj: split into attn_k_b (per head, transposed) and attn_v_b; `gguf` names attn_k_b
};

/// Which layers a per-layer rule applies to: the same HF name can map to different GGUF tensors
/// on linear-attention and attention layers (Ling's g_proj: ssm_g_a or attn_gate).
enum class GgufLayerKind { kAny, kLinear, kAttention };

struct GgufTensorRule {
  std::string hf;    // after "model.layers.{i}." (layer rules, "*" an expert index) or the full name (global rules)
  std::string gguf;  // after "blk.{i}." or the full name
  GgufFix fix = GgufFix::kNone;
  GgufLayerKind only = GgufLayerKind::kAny;
};

/// One GGUF architecture as a mapping onto a family's model description: the family's registry
/// row (hanpu/model_family.hpp) points at it next to its gguf_architecture name, which is the only
/// list of the architectures hanpu reads.
struct GgufMapping {
  /// The model_type the metadata becomes (one of the family's).
  const char* model_type = "";
  /// Fills config.json fields from the metadata (keys "<arch>.<key>") and, where the metadata
  /// leaves a per-layer choice to the tensors present, from `m`'s tensors.
  void (*config)(const GgufModel& m, const std::string& arch, nlohmann::ordered_json& cfg) = nullptr;
  std::vector<GgufTensorRule> global, layer;
  /// The converter reorders GDN value heads to ggml's tiled order (qwen35, qwen35moe).
  bool tiled_value_heads = false;
  /// The file's tensors where their layout differs from the HF checkpoint the model_type stands
  /// for (Qwen3-Next: the fused GDN projections are stored split).
  void (*adjust)(ModelConfig& c) = nullptr;
};

/// The mapping of GGUF architecture `arch` from the family registry; nullptr when no family reads it.
const GgufMapping* gguf_mapping(const std::string& arch);

/// Metadata readers for the mappings' config functions; errors name the file and the key.
namespace gguf_meta {
/// block_count less the MTP ("nextn") layers the converter appends.
uint64_t main_layers(const GgufFile& f, const std::string& arch);
/// layer_types from <arch>.attention.recurrent_layers, else <arch>.full_attention_interval.
nlohmann::ordered_json layer_types_from_recurrent(const GgufFile& f, const std::string& arch, uint64_t n_layer);
/// layer_types from <arch>.attention.head_count_kv as a per-layer array: 0 = a recurrent (KDA)
/// layer, as llama.cpp's kimi-linear and bailingmoe3 loaders read it.
nlohmann::ordered_json layer_types_from_head_count_kv(const GgufFile& f, const std::string& arch, uint64_t n_layer);
/// An optional key: nullopt when absent, else its value (errors as GgufFile's getters).
std::optional<uint64_t> optional_uint(const GgufFile& f, const std::string& key);
std::optional<double> optional_float(const GgufFile& f, const std::string& key);
std::optional<bool> optional_bool(const GgufFile& f, const std::string& key);
/// The config.json fields of a KDA + MLA decoder (Kimi Linear, Ling 3.0) from the keys llama.cpp's
/// kimi-linear and bailingmoe3 converters share: sizes, the MLA geometry (attention.kv_lora_rank,
/// q_lora_rank, key_length_mla = nope + rope, value_length_mla, rope.dimension_count), the KDA
/// geometry (head_count heads of kda.head_dim, ssm.conv_kernel), the layer kinds
/// (attention.head_count_kv per layer), the dense lead (leading_dense_block_count) and the experts
/// (expert_count, expert_used_count, expert_feed_forward_length, expert_shared_count, the groups,
/// expert_weights_scale / _norm; expert_gating_func must be 2, sigmoid).
void kda_mla_decoder(const GgufFile& f, const std::string& arch, nlohmann::ordered_json& c);
/// Throws hanpu::Error "GGUF file '<path>': key '<key>' is <got>, expected <expected>".
[[noreturn]] void fail_key(const GgufFile& f, const std::string& key, const std::string& got, const std::string& expected);
}  // namespace gguf_meta

/// A projection weight [rows, cols] stored in GGML blocks (rows of cols / block elements).
struct BlockWeight {
  gguf::GgmlType type = gguf::GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  /// data is in GgufLinear's row-lane layout (GgufLinear::pack_row_lanes), not the file's rows.
  GgufLayout layout = GgufLayout::kFile;
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
  /// row_lanes_ok: the caller only runs the weight through GgufLinear (a projection, not an
  /// embedding read by rows), so a copy made at load may be packed into the row-lane layout
  /// instead (Q4_K on AVX2 where HANPU_GGUF_LAYOUT allows it; BlockWeight::layout says which).
  std::optional<BlockWeight> get_blocks(const std::string& hf_name, const std::vector<int64_t>& shape,
                                        std::vector<ByteBuffer>& owned, bool row_lanes_ok = false) const;

 private:
  struct Resolved;
  Resolved resolve(const std::string& hf_name) const;
  /// Where get_blocks puts the blocks it copies (gguf_arch.cpp "Weight arena"): tensors under
  /// kArenaLimit side by side in chunks of kArenaChunk appended to `owned` (huge pages for every
  /// one of them), larger ones in a buffer of their own.
  std::byte* weight_copy(size_t bytes, std::vector<ByteBuffer>& owned) const;
  struct Arena {
    const std::vector<ByteBuffer>* owner = nullptr;  // the chunk below is owner's
    std::byte* next = nullptr;
    size_t left = 0;
  };
  mutable Arena arena_;
  std::string path_, arch_;
  std::shared_ptr<GgufModel> file_;
  ModelConfig config_;
  const GgufMapping* mapping_ = nullptr;  // from the family registry
};

/// A pre-tokenizer hanpu reads from `tokenizer.ggml.pre`: llama.cpp's name, the Split regex of the
/// Hugging Face tokenizer.json it stands for, and whether that tokenizer NFC-normalizes first.
/// Kimi's "kimi-k2" has no row: its vocabulary is tiktoken's (gguf_tiktoken_vocab).
struct GgufPreTokenizer {
  const char* name;
  const char* regex;
  bool nfc;
};
inline constexpr const char* kGgufKimiPre = "kimi-k2";
/// The rows: qwen2, qwen35, bailingmoe2, bailingmoe (the last two: Ling's one regex).
const std::vector<GgufPreTokenizer>& gguf_pre_tokenizers();
/// The first row whose regex and normalizer are a tokenizer.json's (the name the GGUF writer
/// gives it), or nullptr.
const GgufPreTokenizer* gguf_pre_tokenizer_for(const std::string& regex, bool nfc);
/// "qwen2, qwen35, bailingmoe2, bailingmoe, kimi-k2", for messages.
std::string gguf_pre_tokenizer_names();
/// Whether `tokenizer.ggml.pre` is "kimi-k2" (checks tokenizer.ggml.model and that the name is known).
bool gguf_tokenizer_is_tiktoken(const GgufFile& f);
/// A kimi-k2 vocabulary as Kimi's tiktoken tokenizer holds it: the ranks' bytes (id = rank),
/// the special tokens (CONTROL: id, text) and tokenizer.ggml.eos_token_id.
struct GgufTiktokenVocab {
  std::vector<std::string> ranks;
  std::vector<std::pair<int32_t, std::string>> specials;
  std::optional<int32_t> eos;
};
/// Throws hanpu::Error naming the key and index for a token that is not a byte-level rank, a
/// rank after the specials, a duplicate, a missing single byte, an unexpected token type.
GgufTiktokenVocab gguf_tiktoken_vocab(const GgufFile& f);
/// The tokenizer.json (Hugging Face tokenizers' format) the `tokenizer.ggml.*` keys of `f` amount
/// to: a byte-level BPE (tokenizer.ggml.model "gpt2") with tokens, merges and token types (CONTROL
/// tokens become special added tokens, USER_DEFINED ones plain added tokens), the split regex
/// and normalizer of its pre-tokenizer's row. `eos` gets tokenizer.ggml.eos_token_id when
/// present. Throws hanpu::Error naming the key for anything else (kimi-k2 included).
std::string gguf_tokenizer_json(const GgufFile& f, std::optional<int32_t>* eos);
/// Whether the GGUF file (or split set) at `path` carries a vocabulary (tokenizer.ggml.tokens):
/// llama.cpp's vocab-less files (random weights for benchmarks) have none, as a checkpoint
/// directory may have no tokenizer.json.
bool gguf_has_tokenizer(const std::string& path);
/// tokenizer.chat_template of a GGUF file ("" when absent).
std::string gguf_chat_template(const GgufFile& f);

/// A tensor as llama.cpp's converter writes it: its GGUF name, dims (ggml's ne order: dims[0]
/// is the element count of a row) and float32 values; `expert` >= 0 marks slice `expert` of a
/// stacked ffn_*_exps tensor (dims of the slice; the caller stacks the slices in expert order).
struct GgufExportedTensor {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<float> data;
  int64_t expert = -1;
};
/// The inverse of GgufCheckpoint::get for `hf_name` ("model.layers.3.linear_attn.A_log", the text
/// model's names) of a model of GGUF architecture `arch` with config `c`: applies to `data`
/// (float32, HF shape `hf_shape`) what llama.cpp's converter does to that tensor (norm weights + 1,
/// A_log -> -exp(A_log) or exp(A_log), value heads to ggml's tiled order, GDN convs squeezed, KDA
/// convs as [1, C, 1, K], MLA kv_b_proj split into attn_k_b and attn_v_b, experts as slices) and
/// returns the GGUF tensors (two for kv_b_proj). Empty for a tensor the mapping has no name for
/// (the caller decides whether that is an error). Throws hanpu::Error naming the tensor for an
/// architecture hanpu does not write or a shape that does not fit the config.
std::vector<GgufExportedTensor> gguf_export_tensor(const std::string& arch, const ModelConfig& c, const std::string& hf_name,
                                                   const std::vector<int64_t>& hf_shape, std::vector<float> data);
/// The GGUF architectures hanpu writes (`hanpu quantize --format`).
std::vector<std::string> gguf_writable_archs();

/// The config.json text the GGUF metadata of `m` amounts to (what GgufCheckpoint parses; for tests
/// and `hanpu` diagnostics).
std::string gguf_config_json(const GgufModel& m);

}  // namespace hanpu::model
