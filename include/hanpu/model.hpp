// Hybrid decoder models (linear attention + full attention layers) from Hugging Face
// checkpoints, run on the CPU: loading, prefill, decode (docs/MODEL.md).
//
//   HybridModel model = HybridModel::load("Qwen3.5-0.8B");  // config.json + safetensors, mmapped
//   HybridState state = model.new_state();
//   Tensor logits = model.forward(state, prompt_ids);       // [1, vocab]: last position
//   ... sample, then model.forward(state, {next_id}) token by token.
//
// A model is a stack of decoder layers, each `x += token_mixer(norm(x)); x += channel_mixer(norm(x))`.
// Token mixers: Gated DeltaNet (GDN), Kimi Delta Attention (KDA), gated GQA attention, multi-head
// latent attention (MLA). Channel mixers: the SwiGLU MLP and a mixture of experts (softmax or sigmoid
// routing, expert-score bias, grouped top-k, routed scaling, shared experts with or without a gate).
// One config parser per family (the family registry, hanpu/model_family.hpp, picks it by
// model_type) fills one ModelConfig; one runtime runs them all.
//
// forward() with several tokens is a (chunked) prefill: GDN/KDA layers run through the plan-driven
// engine (gdn_prefill / kda_prefill) from the state's recurrent and conv states, attention layers
// append to their cache. With one token it is a decode step (gdn_decode / kda_decode). Both continue
// any state, so a prompt may be fed in several chunks and the result is the same as one prefill.
// forward_batch() is one decode step of several sequences (the server's continuous batching).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hanpu/engine.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

/// The token mixer of a layer.
enum class TokenMixer {
  kGdn,             // Gated DeltaNet (Qwen3.5, Qwen3-Next linear_attn)
  kKda,             // Kimi Delta Attention, FLA's KimiDeltaAttention layer (Kimi Linear)
  kGatedAttention,  // GQA with q/k norms, partial RoPE and a sigmoid output gate (Qwen3.5, Qwen3-Next)
  kMla,             // multi-head latent attention with a compressed KV cache (Kimi Linear: no RoPE; Ling: RoPE)
};
const char* token_mixer_name(TokenMixer m);  // "GDN", "KDA", "attention", "MLA"

/// How a MoE router turns its logits into expert scores.
enum class RouterScoring {
  kSoftmax,  // softmax over the experts (Qwen3-Next, Qwen3.5-MoE)
  kSigmoid,  // independent sigmoids (Kimi Linear, DeepSeek-V3 style)
};

/// Checkpoint names that differ between families (the rest are shared: embed_tokens, layers.{i}.
/// input_layernorm / post_attention_layernorm, norm, lm_head).
struct CheckpointNames {
  std::string embed_tokens = "embed_tokens.";     // Ling: word_embeddings.
  std::string attention = "self_attn.";           // module of the full-attention layers (Ling: attention.)
  std::string attention_out = "o_proj";           // output projection of attention and KDA (Ling: dense)
  std::string router_score_bias = "gate.e_score_correction_bias";  // Ling: gate.expert_bias
  std::string linear_attention = "linear_attn.";  // module of the GDN/KDA layers
  /// Module of the channel mixer, in the order tried: Kimi's official checkpoints use
  /// block_sparse_moe. for MoE layers and mlp. for dense ones; save_pretrained writes
  /// block_sparse_moe. for both.
  std::vector<std::string> channel_mixer = {"mlp."};
  std::string expert_gate = "gate_proj", expert_up = "up_proj", expert_down = "down_proj";  // experts.{e}.*.weight
  std::string shared_expert = "shared_expert.";
};

/// Gated DeltaNet layers (Qwen3.5, Qwen3-Next linear_attn).
struct GdnConfig {
  int64_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0, conv_kernel = 0;
  /// Qwen3-Next's checkpoint layout: the projections are stored fused (in_proj_qkvz, in_proj_ba)
  /// in an interleaved per-key-head-group layout; the loader permutes them into the Qwen3.5 layout.
  bool fused_projections = false;
  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  /// Channels of the conv: q, k and v.
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

/// Kimi Delta Attention layers (Kimi Linear, Ling 3.0): one head count and one head dim for q, k, v.
struct KdaConfig {
  int64_t num_heads = 0, head_dim = 0, conv_kernel = 0;
  /// Gate projections: Kimi's low-rank f_a/f_b and g_a/g_b (rank head_dim, A_log stored
  /// [1,1,H,1]), or Ling's full-rank f_proj and g_proj (A_log [H]).
  bool low_rank_gates = true;
  /// Safe gate (Ling): g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)), in (lower_bound, 0),
  /// instead of -exp(A_log) * softplus(f + dt_bias).
  bool safe_gate = false;
  double lower_bound = 0;
};

/// Gated GQA full attention (Qwen3.5, Qwen3-Next): q/k norms, partial RoPE, sigmoid output gate.
struct GatedAttentionConfig {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t rotary_dim = 0;  // head_dim * partial_rotary_factor
  double rope_theta = 0;
};

/// Multi-head latent attention (Kimi Linear, Ling 3.0). q_lora_rank 0 means a full-rank q_proj;
/// keys are [nope | rope] dims, values v_head_dim.
struct MlaConfig {
  int64_t num_heads = 0, q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  /// RoPE (Ling): DeepSeek's interleaved-pair rotation of the rope dims of q and of the cached
  /// shared key, theta rope_theta; Kimi's MLA has none.
  bool rope = false;
  double rope_theta = 0;
  /// Head-wise output gate (Ling): each head's output times sigmoid(g_proj(x))[head].
  bool head_gate = false;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// Floats per token of the cache: the normed latent and the (shared) rope key part.
  int64_t cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

/// The dense SwiGLU MLP.
struct MlpConfig {
  int64_t intermediate_size = 0;
};

/// Mixture of experts (docs/MODEL.md).
struct MoeConfig {
  int64_t num_experts = 0, num_experts_per_tok = 0, intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  RouterScoring router_scoring = RouterScoring::kSoftmax;
  /// Sigmoid routers: e_score_correction_bias is added to the scores to choose experts (not to weigh them).
  bool router_score_bias = false;
  /// Grouped top-k: the experts split into num_expert_groups groups, a group scores the sum of its
  /// two best experts, and only the topk_groups best groups are eligible.
  int64_t num_expert_groups = 1, topk_groups = 1;
  double routed_scaling_factor = 1.0;  // multiplies the routed experts' weights
  double topk_norm_eps = 0;            // added to the top-k sum when renormalising (Kimi: 1e-20)
  bool shared_expert_gated = true;     // shared expert scaled by sigmoid(shared_expert_gate(x))
};

/// What the states of the linear-attention layers (GDN or KDA) and their engine calls share.
struct LinearAttentionShape {
  int64_t key_heads = 0, value_heads = 0, key_head_dim = 0, value_head_dim = 0, conv_kernel = 0;
  int64_t conv_dim() const { return 2 * key_heads * key_head_dim + value_heads * value_head_dim; }
};

/// The model description: the decoder's shared hyperparameters, its block composition, and one
/// typed config per block kind it uses. Layer i's token mixer is `attention_mixer` when
/// is_full_attention[i], else `linear_mixer`; its channel mixer is the MoE block when is_moe[i],
/// else the SwiGLU MLP. Only the configs of the blocks the model uses are read.
struct ModelConfig {
  std::string model_type;  // of the text model: "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "kimi_linear", "bailing_hybrid"
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0;
  TokenMixer linear_mixer = TokenMixer::kGdn, attention_mixer = TokenMixer::kGatedAttention;
  /// Qwen's zero-centred RMSNorms multiply by (1 + w); Kimi's by w.
  bool norm_weight_plus_one = true;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<bool> is_full_attention;  // per layer (layer_types)
  std::vector<bool> is_moe;             // per layer: MoE block, else the dense MLP
  std::vector<int32_t> eos_token_ids;
  /// Which config.json keys gave the linear-attention geometry ("config.json gives the KDA layers 4
  /// heads of 32 (linear_num_heads, linear_head_dim) ..."), appended to a load error of those
  /// layers' tensors; empty: nothing appended.
  std::string linear_shape_source;
  CheckpointNames names;  // the family's checkpoint layout (its registry row's)

  GdnConfig gdn;                   // linear_mixer kGdn
  KdaConfig kda;                   // linear_mixer kKda
  GatedAttentionConfig attention;  // attention_mixer kGatedAttention
  MlaConfig mla;                   // attention_mixer kMla
  MlpConfig mlp;                   // layers with !is_moe[i]
  MoeConfig moe;                   // layers with is_moe[i]

  TokenMixer token_mixer(int64_t layer) const {
    return is_full_attention[static_cast<size_t>(layer)] ? attention_mixer : linear_mixer;
  }
  /// The linear-attention layers' geometry, from gdn or kda.
  LinearAttentionShape linear_shape() const;
  /// Linear-attention layers (GDN or KDA): the ones with conv and recurrent states.
  int64_t num_linear_layers() const;
  int64_t num_gdn_layers() const { return linear_mixer == TokenMixer::kGdn ? num_linear_layers() : 0; }
  int64_t num_kda_layers() const { return linear_mixer == TokenMixer::kKda ? num_linear_layers() : 0; }
  int64_t num_attention_layers() const { return num_layers - num_linear_layers(); }
  bool layer_is_moe(int64_t layer) const { return layer < static_cast<int64_t>(is_moe.size()) && is_moe[static_cast<size_t>(layer)]; }
  int64_t num_moe_layers() const;
  /// Number of parameters of the text model (embedding, layers, final norm, LM head if untied).
  int64_t parameter_count() const;
  /// One line: "qwen3_5_text: 24 layers (18 GDN + 6 attention), hidden 1024, ...".
  std::string describe() const;
  /// Throws hanpu::Error naming the field when the description is inconsistent (per-layer lists
  /// of the wrong length, head counts that do not divide, a block the runtime cannot run).
  void check() const;
};

/// Parses a config.json of any supported family: the family registry (hanpu/model_family.hpp)
/// picks the parser by model_type (or architectures). `source` names the file in errors. Throws
/// hanpu::Error for an unsupported model_type (naming it and the supported ones) or a
/// missing/invalid field, naming it.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

/// A synthetic model's description, by preset name, from the presets of every family's registry
/// row: "qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b" (published sizes);
/// "qwen3-next-80b-a3b-slice": Qwen3-Next-80B-A3B's layer shapes, 4 of its 48 layers (3 GDN +
/// 1 attention) and 64 of its 512 experts, so it fits in a few GB; "kimi-linear-48b-a3b-slice":
/// Kimi-Linear-48B-A3B's layer shapes, 4 of its 27 layers (dense KDA layer 0, two MoE KDA layers,
/// one MoE MLA layer) and 64 of its 256 experts; "qwen3.5-35b-a3b-slice": transformers'
/// Qwen3_5MoeTextConfig default shapes (Qwen3.5-35B-A3B), 4 of 40 layers, 64 of 256 experts;
/// "ling-3.0-flash-slice". Throws hanpu::Error listing the names for an unknown one.
ModelConfig model_preset(const std::string& name);
/// The names model_preset accepts, for help texts.
std::vector<std::string> model_preset_names();

/// The int8 group size `--weights int8` uses unless told otherwise (docs/MODEL.md has the
/// accuracy and speed measured for 32, 64 and 128).
inline constexpr int64_t kDefaultInt8Group = 64;

/// Which format a model's projections take (ModelLoadOptions::weights, HybridModel::synthetic).
struct WeightOptions {
  /// A name of weight_load_names() (hanpu/weight_format.hpp; its refusal lists them): "bf16" keeps
  /// the checkpoint's weights as stored (bf16, f16 or f32; a file `hanpu quantize` wrote: its
  /// int8); "int8" and "f16" convert each projection at load (the row's quantizer); "q8_0",
  /// "q4_k", "q6_k" and the mix "q4_k_m" quantize a safetensors checkpoint at load into that GGUF
  /// format, with the quantizer and tensor mix `hanpu quantize --format` writes, and load it as
  /// that GGUF file would be (an anonymous memory file; docs/GGUF.md).
  std::string format = "bf16";
  /// With format "int8": inputs per scale (Int8Linear).
  int64_t int8_group = kDefaultInt8Group;
};

struct ModelLoadOptions {
  /// Draw a progress bar on stderr while the weights are paged in (done for files above
  /// progress_min_bytes; the weights are memory-mapped, so this is the actual disk read).
  bool progress = false;
  uint64_t progress_min_bytes = 256ull << 20;
  /// The projections' format (every projection: attention, GDN/KDA, MLP and experts, LM head; not
  /// the embedding table, MoE routers or shared-expert gates). docs/MODEL.md "Weight formats".
  WeightOptions weights;
  /// Called for every projection quantized to int8 at load under its checkpoint tensor name (those
  /// stored as they are used; `hanpu quantize` writes them out). The reference stays valid while
  /// the model lives.
  std::function<void(const std::string& tensor, const Int8Linear& q)> on_int8_projection;
  /// The engine the model runs on (its pool, workspaces and activation scratch); null:
  /// Engine::default_engine(). Two models with their own engines share nothing.
  std::shared_ptr<Engine> engine;
};

/// Per-sequence inference state: the linear-attention layers' conv and recurrent states, the
/// attention layers' caches and the number of tokens consumed so far (the next token's position).
struct HybridState {
  int64_t position = 0;
  std::vector<Tensor> conv_state;       // per GDN/KDA layer: [conv_kernel-1, conv_dim] F32, oldest first
  std::vector<Tensor> recurrent_state;  // per GDN/KDA layer: [1, HV, K, V] F32
  /// Per attention layer. Gated attention: keys and values [position, kv_heads, head_dim].
  /// MLA: key_cache holds the compressed rows [position, kv_lora_rank + qk_rope_head_dim] (normed
  /// latent, then the shared rope-part key), never expanded K/V; value_cache stays empty.
  std::vector<std::vector<float>> key_cache, value_cache;
  /// Bytes held (states and caches).
  size_t bytes() const;
};

/// Where forward() spent its time, in seconds, accumulated over calls (for bench-model).
struct ForwardTimes {
  double embed = 0, gdn_proj = 0, attn_proj = 0, attn_core = 0, mlp = 0, norms = 0, lm_head = 0;
  double gdn_conv = 0, gdn_engine = 0, gdn_norm = 0;  // GDN besides projections: conv+SiLU, the
                                                      // GDN engine (prefill/decode), gated RMSNorm
  double kda_proj = 0, kda_conv = 0, kda_engine = 0, kda_norm = 0;  // the same parts of KDA layers
  double gdn_core() const { return gdn_conv + gdn_engine + gdn_norm; }
  double gdn() const { return gdn_proj + gdn_core(); }
  double kda() const { return kda_proj + kda_conv + kda_engine + kda_norm; }
  double attention() const { return attn_proj + attn_core; }  // gated attention or MLA
  double total() const { return embed + gdn() + kda() + attention() + mlp + norms + lm_head; }
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

class HybridModel {
 public:
  /// A checkpoint directory: config.json and model.safetensors or model.safetensors.index.json
  /// with its shards. model.visual.* and mtp.* are skipped (MTP layers by design: a text engine
  /// decoding one token at a time does not use them). Throws hanpu::Error naming the file and
  /// tensor for a missing tensor, a wrong shape or dtype, an unsupported model_type or option,
  /// or a truncated file.
  static HybridModel load(const std::string& dir, const ModelLoadOptions& opt = {});
  /// Random BF16 weights of the given shapes, built in memory (benchmarks without a download).
  /// Scales keep activations O(1) through all layers.
  /// engine: as ModelLoadOptions::engine (null: the default engine).
  /// weights: as ModelLoadOptions::weights, the formats converted per tensor ("bf16", "int8",
  /// "f16"; a GGUF format needs a checkpoint: the error says so).
  static HybridModel synthetic(const ModelConfig& config, uint64_t seed = 1, int threads = 1,
                               const WeightOptions& weights = {}, std::shared_ptr<Engine> engine = nullptr);

  HybridModel(HybridModel&&) noexcept;
  HybridModel& operator=(HybridModel&&) noexcept;
  ~HybridModel();

  const ModelConfig& config() const;
  /// The engine forward() runs on. ForwardOptions::threads parts run on its pool.
  Engine& engine() const;
  /// Bytes of weights (as stored: mapped files or synthetic buffers).
  uint64_t weight_bytes() const;

  HybridState new_state() const;
  /// Runs `ids` through the model from `state` (which it advances) and returns the logits:
  /// [ids.size(), vocab] with all_logits, else [1, vocab] for the last token. F32.
  /// Throws hanpu::Error for an empty input or an id outside the vocabulary.
  Tensor forward(HybridState& state, std::span<const int32_t> ids, const ForwardOptions& opt = {}) const;
  /// One decode step of several sequences at once: token ids[i] continues states[i] (each advances
  /// by one). The rows go through the norms, the channel mixers (MLP / MoE) and the LM head
  /// together, so their weights are read once for all sequences; each token mixer runs per
  /// sequence on its own state. Returns the logits [states.size(), vocab], row i for sequence i;
  /// equal to forward() on each sequence up to fp rounding. `all_logits` is ignored.
  /// Throws hanpu::Error for empty or mismatched inputs, an id outside the vocabulary or a state
  /// not made by this model.
  Tensor forward_batch(std::span<HybridState* const> states, std::span<const int32_t> ids,
                       const ForwardOptions& opt = {}) const;

 private:
  HybridModel();
  struct Impl;  // src/model/hybrid_model.cpp
  std::unique_ptr<Impl> impl_;
};

/// Sampling settings; greedy when temperature <= 0 or top_k == 1.
struct SamplingOptions {
  float temperature = 0.7f;
  int top_k = 20;       // 0: no limit
  float top_p = 0.95f;  // 1: no limit
  uint64_t seed = 0;
  // Penalties (apply_penalties), applied to the logits before temperature and filtering.
  float presence_penalty = 0;   // OpenAI's: minus this once for each token generated at least once
  float frequency_penalty = 0;  // OpenAI's: minus this times how often each token was generated
  float repetition_penalty = 1;  // transformers'/llama.cpp's: positive logits / p, negative * p
  int64_t repetition_window = 64;  // ... over the last this many prompt and generated tokens (-1: all)
  std::vector<std::pair<int32_t, float>> logit_bias;  // OpenAI's: added to these tokens' logits
  bool has_penalties() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1 || !logit_bias.empty();
  }
};

/// The penalties of `opt` on one row of logits. `context` holds the tokens before this step:
/// the prompt's (at least its last repetition_window) then the generated ones, which begin at
/// `generated_from`. First the repetition penalty, as transformers' RepetitionPenaltyLogitsProcessor
/// and llama.cpp's penalties sampler apply it: each distinct token among the last
/// repetition_window of `context` has its logit divided by repetition_penalty when positive,
/// multiplied when negative. Then OpenAI's formula over the generated tokens only:
/// logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty. Last, logit_bias.
void apply_penalties(std::span<float> logits, std::span<const int32_t> context, size_t generated_from,
                     const SamplingOptions& opt);

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
