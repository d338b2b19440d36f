#include "model/model_work.hpp"

#include <cmath>

#include "hanpu/la.hpp"
#include "model/blocks.hpp"

namespace hanpu::model {

namespace {

// A part made of matrices applied once per token: `weights` multiply-adds per token.
PartWork per_token_matrices(double weights, double rows, double bytes_per_weight) {
  return {2 * weights * rows, bytes_per_weight * weights};
}

void add(PartWork& to, const PartWork& w) {
  to.flops += w.flops;
  to.weight_bytes += w.weight_bytes;
}

}  // namespace

PartWork ForwardWork::total() const {
  PartWork t;
  for (const PartWork* p : {&linear_projections, &linear_engine, &attention_projections, &attention_core, &mlp, &lm_head})
    add(t, *p);
  return t;
}

ForwardWork& ForwardWork::operator+=(const ForwardWork& o) {
  add(linear_projections, o.linear_projections);
  add(linear_engine, o.linear_engine);
  add(attention_projections, o.attention_projections);
  add(attention_core, o.attention_core);
  add(mlp, o.mlp);
  add(lm_head, o.lm_head);
  return *this;
}

ForwardWork forward_work(const ModelConfig& c, int64_t start, int64_t tokens, bool all_logits,
                         const ProjectionWork& weights) {
  const auto or_average = [&](double part) { return part > 0 ? part : weights.bytes_per_weight; };
  const double linear_bpw = or_average(weights.linear_bytes_per_weight);
  const double attention_bpw = or_average(weights.attention_bytes_per_weight);
  const double mlp_bpw = or_average(weights.mlp_bytes_per_weight), lm_head_bpw = or_average(weights.lm_head_bytes_per_weight);
  const double H = static_cast<double>(c.hidden_size), T = static_cast<double>(tokens);
  ForwardWork w;
  // Per layer kind: the matrices (as ModelConfig::parameter_count counts them, without norms,
  // conv taps and gate vectors, which are not multiplied per token as matrices).
  double linear_weights = 0;
  const LinearAttentionShape la = c.linear_shape();
  const double nv = static_cast<double>(la.value_heads);
  if (c.linear_mixer == TokenMixer::kGdn) {
    const double cd = static_cast<double>(c.gdn.conv_dim()), vd = static_cast<double>(c.gdn.value_dim());
    linear_weights = H * cd + H * vd + 2 * H * nv + vd * H;
  } else {
    const double dk = static_cast<double>(c.kda.head_dim), qkv = nv * dk;
    const double gate = c.kda.low_rank_gates ? H * dk + dk * qkv : H * qkv;  // forget and output gate each
    linear_weights = 3 * H * qkv + 2 * gate + H * nv + qkv * H;
  }
  const double nh = static_cast<double>(c.attention_mixer == TokenMixer::kMla ? c.mla.num_heads : c.attention.num_heads);
  double attention_weights = 0, core_dim = 0;  // core_dim: multiply-adds per query head per key
  double attention_rows_weights = 0;  // MLA expanded: matrices applied once per cached row, not per token
  if (c.attention_mixer == TokenMixer::kGatedAttention) {
    const double hd = static_cast<double>(c.attention.head_dim), nkv = static_cast<double>(c.attention.num_kv_heads);
    attention_weights = H * nh * hd * 2 + 2 * H * nkv * hd + nh * hd * H;
    core_dim = 2 * hd;  // q·k and p·v
  } else {
    const double qk = static_cast<double>(c.mla.qk_head_dim()), r = static_cast<double>(c.mla.kv_lora_rank);
    const double ql = static_cast<double>(c.mla.q_lora_rank), rope = static_cast<double>(c.mla.qk_rope_head_dim);
    const double nope = static_cast<double>(c.mla.qk_nope_head_dim), dv = static_cast<double>(c.mla.v_head_dim);
    attention_weights = (ql > 0 ? H * ql + ql * nh * qk : H * nh * qk) + H * (r + rope) + nh * dv * H +
                        (c.mla.head_gate ? H * nh : 0);
    // The form MlaAttention::forward runs: expanded (int8 weights never expand) or latent.
    if (!weights.latent_only && MlaAttention::expand_pays(c, tokens, start)) {
      attention_rows_weights = r * nh * (nope + dv);  // W_uk and W_uv over every cached row
      core_dim = qk + dv;  // scores over nope + rope, sums over the v dims
    } else {
      attention_weights += r * nh * (nope + dv);  // key absorption and value up-projection per token
      core_dim = 2 * r + rope;                    // scores over the latent rows (r + rope), sums over r
    }
  }
  // Keys each new token attends to: its position + 1, summed over the tokens.
  const double keys = T * static_cast<double>(start) + T * (T + 1) / 2;
  const double E = static_cast<double>(c.moe.num_experts), topk = static_cast<double>(c.moe.num_experts_per_tok);
  const double expert = 3 * H * static_cast<double>(c.moe.intermediate_size);
  const double shared = c.moe.shared_expert_intermediate_size > 0
                            ? 3 * H * static_cast<double>(c.moe.shared_expert_intermediate_size) + (c.moe.shared_expert_gated ? H : 0)
                            : 0;
  const double experts_touched = E > 0 ? E * (1 - std::pow(1 - topk / E, T)) : 0;
  const double K = static_cast<double>(la.key_head_dim), V = static_cast<double>(la.value_head_dim);
  const Variant variant = c.linear_mixer == TokenMixer::kGdn ? Variant::GDN : Variant::KDA;
  const double engine_flops_per_token_head =
      tokens > 1 ? la_flops_per_token_head(variant, la.key_head_dim, la.value_head_dim) : 2 * 3 * K * V;

  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.token_mixer(i) == c.attention_mixer) {
      add(w.attention_projections, per_token_matrices(attention_weights, T, attention_bpw));
      add(w.attention_projections,
          per_token_matrices(attention_rows_weights, static_cast<double>(start) + T, attention_bpw));
      w.attention_core.flops += 2 * nh * core_dim * keys;
    } else {
      add(w.linear_projections, per_token_matrices(linear_weights, T, linear_bpw));
      w.linear_engine.flops += engine_flops_per_token_head * T * nv;
    }
    if (c.layer_is_moe(i)) {
      w.mlp.flops += 2 * T * (H * E + topk * expert + shared);
      w.mlp.weight_bytes += mlp_bpw * (H * E + experts_touched * expert + shared);
    } else {
      add(w.mlp, per_token_matrices(3 * H * static_cast<double>(c.mlp.intermediate_size), T, mlp_bpw));
    }
  }
  add(w.lm_head, per_token_matrices(H * static_cast<double>(c.vocab_size), all_logits ? T : 1, lm_head_bpw));
  return w;
}

}  // namespace hanpu::model
