// Qwen3.5 dense text models (Gated DeltaNet + gated full attention hybrids) from Hugging Face
// checkpoints, run on the CPU: loading, prefill, decode (reference-models.md §1-3, §5-6).
//
//   Qwen35Model model = Qwen35Model::load("Qwen3.5-0.8B");   // config.json + safetensors, mmapped
//   Qwen35State state = model.new_state();
//   Tensor logits = model.forward(state, prompt_ids);        // [1, vocab]: last position
//   ... sample, then model.forward(state, {next_id}) token by token.
//
// forward() with several tokens is a (chunked) prefill: GDN layers run through the plan-driven
// engine (gdn_prefill) from the state's recurrent and conv states, attention layers append to the
// KV cache. With one token it is a decode step (gdn_decode). Both continue any state, so a prompt
// may be fed in several chunks and the result is the same as one prefill.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

/// The text model's hyperparameters (config.json's text_config, or the top level when flat).
struct Qwen35Config {
  std::string model_type;  // of the text model: "qwen3_5_text" or "qwen3_next"
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;  // full attention
  int64_t rotary_dim = 0;                                  // head_dim * partial_rotary_factor
  double rope_theta = 0;
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;  // GDN
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<bool> is_full_attention;  // per layer (layer_types)
  std::vector<int32_t> eos_token_ids;
  /// Qwen3-Next: the GDN projections are stored fused (in_proj_qkvz, in_proj_ba) in an interleaved
  /// per-key-head-group layout; the loader permutes them into the Qwen3.5 layout.
  bool fused_gdn_projections = false;
  /// Mixture of experts (Qwen3-Next, reference-models.md §3.4); num_experts 0: dense MLPs only.
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  std::vector<bool> is_moe;  // per layer: MoE block, else the dense MLP of intermediate_size

  int64_t gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int64_t num_gdn_layers() const;
  int64_t num_attention_layers() const { return num_layers - num_gdn_layers(); }
  bool layer_is_moe(int64_t layer) const { return layer < static_cast<int64_t>(is_moe.size()) && is_moe[static_cast<size_t>(layer)]; }
  int64_t num_moe_layers() const;
  /// Number of parameters of the text model (embedding, layers, final norm, LM head if untied).
  int64_t parameter_count() const;
  /// One line: "qwen3_5_text: 24 layers (18 GDN + 6 attention), hidden 1024, ...".
  std::string describe() const;
};

/// Parses a config.json (nested text_config or flat; Qwen3.5 or Qwen3-Next, which is flat with
/// model_type "qwen3_next"). `source` names the file in errors.
/// Throws hanpu::Error for an unknown model_type or a missing/invalid field, naming it.
Qwen35Config parse_qwen35_config(const std::string& json_text, const std::string& source);

/// The real shapes of a published size: "qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b";
/// "qwen3-next-80b-a3b-slice": Qwen3-Next-80B-A3B's layer shapes, 4 of its 48 layers (3 GDN +
/// 1 attention) and 64 of its 512 experts, so it fits in a few GB.
Qwen35Config qwen35_preset(const std::string& name);
/// The names qwen35_preset accepts, for help texts.
std::vector<std::string> qwen35_preset_names();

struct ModelLoadOptions {
  /// Draw a progress bar on stderr while the weights are paged in (done for files above
  /// progress_min_bytes; the weights are memory-mapped, so this is the actual disk read).
  bool progress = false;
  uint64_t progress_min_bytes = 256ull << 20;
};

/// Per-sequence inference state: GDN conv and recurrent states, the attention KV cache and the
/// number of tokens consumed so far (the next token's position).
struct Qwen35State {
  int64_t position = 0;
  std::vector<Tensor> conv_state;       // per GDN layer: [conv_kernel-1, conv_dim] F32, oldest first
  std::vector<Tensor> recurrent_state;  // per GDN layer: [1, HV, K, V] F32
  std::vector<std::vector<float>> key_cache, value_cache;  // per attention layer: [position, kv_heads, head_dim]
  /// Bytes held (states and caches).
  size_t bytes() const;
};

/// Where forward() spent its time, in seconds, accumulated over calls (for bench-model).
struct ForwardTimes {
  double embed = 0, gdn_proj = 0, attn_proj = 0, attn_core = 0, mlp = 0, norms = 0, lm_head = 0;
  double gdn_conv = 0, gdn_engine = 0, gdn_norm = 0;  // GDN besides projections: conv+SiLU, the
                                                      // GDN engine (prefill/decode), gated RMSNorm
  double gdn_core() const { return gdn_conv + gdn_engine + gdn_norm; }
  double gdn() const { return gdn_proj + gdn_core(); }
  double attention() const { return attn_proj + attn_core; }
  double total() const { return embed + gdn() + attention() + mlp + norms + lm_head; }
  void clear() { *this = ForwardTimes{}; }
};

struct ForwardOptions {
  int threads = 1;
  bool all_logits = false;  // logits for every new token, else only the last one
  ForwardTimes* times = nullptr;
  /// How the projections treat activations (hanpu/linear.hpp): exact f32 x bf16 by default;
  /// kBf16 rounds activations to bf16 as a bf16 transformers model does, and is the fastest.
  LinearPrecision precision = LinearPrecision::kExact;
};

class Qwen35Model {
 public:
  /// A checkpoint directory: config.json and model.safetensors or model.safetensors.index.json
  /// with its shards. model.visual.* and mtp.* are skipped. Throws hanpu::Error naming the file
  /// and tensor for a missing tensor, a wrong shape or dtype, an unknown model_type or a truncated file.
  static Qwen35Model load(const std::string& dir, const ModelLoadOptions& opt = {});
  /// Random BF16 weights of the given shapes, built in memory (benchmarks without a download).
  /// Scales keep activations O(1) through all layers.
  static Qwen35Model synthetic(const Qwen35Config& config, uint64_t seed = 1, int threads = 1);

  Qwen35Model(Qwen35Model&&) noexcept;
  Qwen35Model& operator=(Qwen35Model&&) noexcept;
  ~Qwen35Model();

  const Qwen35Config& config() const;
  /// Bytes of weights (as stored: mapped files or synthetic buffers).
  uint64_t weight_bytes() const;

  Qwen35State new_state() const;
  /// Runs `ids` through the model from `state` (which it advances) and returns the logits:
  /// [ids.size(), vocab] with all_logits, else [1, vocab] for the last token. F32.
  /// Throws hanpu::Error for an empty input or an id outside the vocabulary.
  Tensor forward(Qwen35State& state, std::span<const int32_t> ids, const ForwardOptions& opt = {}) const;

 private:
  Qwen35Model();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Sampling settings; greedy when temperature <= 0 or top_k == 1.
struct SamplingOptions {
  float temperature = 0.7f;
  int top_k = 20;       // 0: no limit
  float top_p = 0.95f;  // 1: no limit
  uint64_t seed = 0;
};

/// Picks the next token from one row of logits. Greedy takes the first maximum.
class Sampler {
 public:
  explicit Sampler(SamplingOptions opt);
  int32_t sample(std::span<const float> logits);
  bool greedy() const;

 private:
  SamplingOptions opt_;
  uint64_t rng_state_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace hanpu
