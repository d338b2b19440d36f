// The blocks a hybrid decoder layer is composed of (include/hanpu/model.hpp): token mixers (GDN,
// KDA, gated GQA attention, MLA) and channel mixers (SwiGLU MLP, mixture of experts). Each block
// loads its weights from a WeightReader under a module prefix ("model.layers.3.linear_attn.") and
// runs T rows of normed hidden states `h` [T, hidden], adding its output into the residual `x`
// [T, hidden]. State and caches are the caller's (HybridState), passed per call.
// Internal to src/model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/model.hpp"
#include "model/model_parts.hpp"

namespace hanpu::model {

/// What every block's forward gets besides its inputs.
struct BlockRun {
  const ModelConfig& cfg;
  const ForwardOptions& opt;
  ForwardTimes& times;
  int64_t T = 0;   // new tokens
  int64_t p0 = 0;  // position of the first new token
  EngineThreads th;       // the model's engine and opt.threads
  Workspace* ws = nullptr;  // the forward's activation scratch (held from the engine for the call)
};

/// Gated DeltaNet (docs/MODEL.md; Qwen3_5GatedDeltaNet): in_proj_qkv/z/b/a, causal conv +
/// SiLU, the GDN engine with in-kernel q/k L2 norm, g = -exp(A_log)·softplus(a + dt_bias) and
/// beta = sigmoid(b), gated RMSNorm with silu(z), out_proj.
struct GdnMixer {
  Projection in_proj;  // in_proj_qkv | in_proj_z | in_proj_b | in_proj_a stacked: one GEMM of the input
  Projection out_proj;
  std::vector<float> conv_taps;  // [K, conv_dim]: conv1d.weight [conv_dim, 1, K] transposed
  std::vector<float> A_log, dt_bias, norm_w;

  void load(const ModelConfig& c, const WeightReader& w, const std::string& prefix);
  void forward(const BlockRun& r, Tensor& conv_state, Tensor& recurrent_state, const float* h, float* x) const;
};

/// Kimi Delta Attention as FLA's KimiDeltaAttention layer (docs/MODEL.md): q/k/v
/// projections each with its own causal depthwise conv + SiLU (stored as q_conv1d / k_conv1d /
/// v_conv1d, or concatenated as one conv1d by transformers' in-memory layout), the low-rank forget
/// gate f_b(f_a(x)) (Ling: full-rank f_proj(x)) turned into g = -exp(A_log[h])·softplus(f + dt_bias)
/// per channel inside the KDA engine (Ling's safe gate lower_bound·sigmoid(exp(A_log)·(f + dt_bias))
/// too: LaOptions::lower_bound), beta = sigmoid(b_proj(x)), q/k L2 norm in the
/// engine, then o_norm(o)·sigmoid(g_b(g_a(x))) (Ling: g_proj(x)) and o_proj.
struct KdaMixer {
  // Every projection of the layer's input stacked into one GEMM: q | k | v | f_a | g_a | b (Kimi)
  // or q | k | v | f | g | b (Ling's full-rank gates); then Kimi's f_b and g_b of the low rank.
  Projection in_proj, f_b, g_b, o_proj;
  std::vector<float> conv_taps;  // [K, 3·H·K]: the q, k and v convs side by side, transposed
  std::vector<float> A_log, dt_bias, o_norm;  // [H], [H·K], [K] (raw weight)

  void load(const ModelConfig& c, const WeightReader& w, const std::string& prefix);
  void forward(const BlockRun& r, Tensor& conv_state, Tensor& recurrent_state, const float* h, float* x) const;
};

/// Gated full attention (docs/MODEL.md; Qwen3_5Attention): q_proj with the per-head
/// interleaved [query | gate], q_norm/k_norm, rotate-half partial RoPE, GQA over an F32 KV cache,
/// sigmoid output gate, o_proj.
struct GatedAttention {
  Projection qkv_proj;  // q_proj | k_proj | v_proj stacked: one GEMM of the input
  Projection o_proj;
  std::vector<float> q_norm, k_norm;  // norm multipliers
  std::vector<float> inv_freq;        // [rotary_dim / 2]

  void load(const ModelConfig& c, const WeightReader& w, const std::string& prefix);
  void forward(const BlockRun& r, std::vector<float>& keys, std::vector<float>& values, const float* h,
               float* x) const;
};

/// Multi-head latent attention (docs/MODEL.md; KimiLinearAttention, BailingHybridAttention): queries
/// from q_proj (or q_b(norm(q_a(x))) with a q LoRA), the compressed row [c | k_rope] =
/// kv_a_proj_with_mqa(x) with c RMS-normed, keys [W_uk c | k_rope] and values W_uv c per head from
/// kv_b_proj. The cache holds only [c | k_rope] per token. Attention runs in the latent space with
/// W_uk absorbed into the queries (q_lat = [W_ukᵀ q_nope | q_rope], one shared "KV head" of the
/// cached rows) and W_uv applied after: softmax(q·k) v = W_uv Σ p c, exactly the expanded form.
/// A prefill whose arithmetic is smaller expanded (MlaAttention::expand_pays) expands keys and
/// values of every cached row once per call instead, as transformers computes it.
/// With RoPE (Ling) the rope dims of q and of the shared key are rotated (interleaved pairs) before
/// the key is cached; with the head gate each head's output is scaled by sigmoid(g_proj(x)).
struct MlaAttention {
  // q_proj (or q_a_proj) | kv_a_proj_with_mqa | g_proj (the head gate, Ling) stacked: one GEMM of
  // the input.
  Projection in_proj, q_b_proj, o_proj;
  std::vector<float> inv_freq;  // [qk_rope_head_dim / 2], with RoPE
  std::vector<float> q_a_norm, kv_a_norm;
  std::vector<Projection> key_absorb;  // per head: W_uk_hᵀ [kv_lora_rank, qk_nope_head_dim]
  std::vector<Projection> value_up;    // per head: W_uv_h [v_head_dim, kv_lora_rank]
  std::vector<Projection> key_up;      // per head: W_uk_h [qk_nope_head_dim, kv_lora_rank] (expanded
                                       // prefill; empty with int8 weights, which stay latent)

  /// Whether attending over expanded keys and values takes fewer multiply-adds than the latent
  /// form for T new tokens after p0 cached ones (the counts are in the definition).
  static bool expand_pays(const ModelConfig& c, int64_t T, int64_t p0);

  void load(const ModelConfig& c, const WeightReader& w, const std::string& prefix);
  void forward(const BlockRun& r, std::vector<float>& cache, const float* h, float* x) const;

 private:
  // Head gate (Ling) on the outputs attn [T, nh, dv], then o_proj added into x.
  void finish(const BlockRun& r, const float* kv_in, int64_t S, float* attn, float* x) const;
};

/// down(silu(gate(x)) · up(x)), added into x.
struct SwiGluMlp {
  Projection gate_up;  // gate_proj | up_proj stacked: one GEMM of the input
  Projection down_proj;

  void load(const WeightReader& w, const std::string& prefix, int64_t hidden, int64_t intermediate,
            const std::string& gate = "gate_proj", const std::string& up = "up_proj",
            const std::string& down = "down_proj");
  /// `slot`: scratch for the [gate | up] activations (the shared expert uses its own). The output
  /// is added into x, or written to x with `accumulate` false (a gated shared expert's).
  void forward(const BlockRun& r, const float* h, float* x, ScratchSlot slot = kGateUp, bool accumulate = true) const;
};

/// Mixture of experts (Qwen3NextSparseMoeBlock, Qwen3_5MoeSparseMoeBlock, KimiLinearMoE): the router
/// (softmax or sigmoid scores, optional score bias for the choice, optional grouped top-k), the
/// top-k SwiGLU experts weighted by their (renormalised, scaled) scores, and an optional shared
/// expert, gated by sigmoid(shared_expert_gate(x)) or not.
struct MoeBlock {
  Projection router;                 // gate.weight [experts, hidden]
  std::vector<float> score_bias;     // gate.e_score_correction_bias [experts], when the config has one
  std::vector<Projection> gate_up, down_proj;  // per expert (gate_up: gate | up stacked)
  bool has_shared = false;
  SwiGluMlp shared;
  Projection shared_gate;  // shared_expert_gate [1, hidden], when gated

  void load(const ModelConfig& c, const WeightReader& w, const std::string& prefix);
  void forward(const BlockRun& r, const float* h, float* x) const;
  /// The routing of one token: the chosen experts and their weights (in choice order).
  void route(const ModelConfig& c, const float* logits, std::vector<int64_t>& experts, std::vector<float>& weights,
             std::vector<float>& work) const;
};

/// Causal depthwise conv taps [K, channels] from conv weights [channels, 1, K] (several stacked).
void append_conv_taps(const std::vector<float>& w, int64_t channels, int64_t K, int64_t channel0,
                      int64_t total_channels, std::vector<float>& taps);

}  // namespace hanpu::model
