// The model description (ModelConfig in include/hanpu/model.hpp): consistency checks, parameter
// count, the one-line summary, and the readers the family parsers share (docs/MODEL.md).
#include <nlohmann/json.hpp>
#include <sstream>

#include "hanpu/model.hpp"
#include "io/json_io.hpp"
#include "model/config_fields.hpp"

namespace hanpu {

const char* token_mixer_name(TokenMixer m) {
  switch (m) {
    case TokenMixer::kGdn: return "GDN";
    case TokenMixer::kKda: return "KDA";
    case TokenMixer::kGatedAttention: return "attention";
    case TokenMixer::kMla: return "MLA";
  }
  return "?";
}

LinearAttentionShape ModelConfig::linear_shape() const {
  if (linear_mixer == TokenMixer::kKda) return {kda.num_heads, kda.num_heads, kda.head_dim, kda.head_dim, kda.conv_kernel};
  return {gdn.num_key_heads, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim, gdn.conv_kernel};
}

int64_t ModelConfig::num_linear_layers() const {
  int64_t n = 0;
  for (bool full : is_full_attention) n += full ? 0 : 1;
  return n;
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_layers; ++i) n += layer_is_moe(i) ? 1 : 0;
  return n;
}

void ModelConfig::check() const {
  auto fail = [&](const std::string& what) { throw Error("model description (" + model_type + "): " + what); };
  if (static_cast<int64_t>(is_full_attention.size()) != num_layers)
    fail("layer kinds list " + std::to_string(is_full_attention.size()) + " layers, expected num_layers " +
         std::to_string(num_layers));
  if (!is_moe.empty() && static_cast<int64_t>(is_moe.size()) != num_layers)
    fail("MoE layer list has " + std::to_string(is_moe.size()) + " entries, expected num_layers " + std::to_string(num_layers));
  if (linear_mixer != TokenMixer::kGdn && linear_mixer != TokenMixer::kKda)
    fail(std::string("linear-attention layers must be GDN or KDA, got ") + token_mixer_name(linear_mixer));
  if (attention_mixer != TokenMixer::kGatedAttention && attention_mixer != TokenMixer::kMla)
    fail(std::string("full-attention layers must be gated attention or MLA, got ") + token_mixer_name(attention_mixer));
  if (num_linear_layers() > 0 && linear_mixer == TokenMixer::kGdn) {
    if (gdn.num_key_heads < 1 || gdn.num_value_heads % gdn.num_key_heads != 0)
      fail("linear_num_value_heads " + std::to_string(gdn.num_value_heads) + " is not a multiple of linear_num_key_heads " +
           std::to_string(gdn.num_key_heads));
  }
  if (num_linear_layers() > 0 && linear_mixer == TokenMixer::kKda && kda.num_heads < 1)
    fail("KDA layers need at least one head, got " + std::to_string(kda.num_heads));
  if (num_attention_layers() > 0) {
    if (attention_mixer == TokenMixer::kGatedAttention &&
        (attention.num_kv_heads < 1 || attention.num_heads % attention.num_kv_heads != 0))
      fail("num_attention_heads " + std::to_string(attention.num_heads) + " is not a multiple of num_key_value_heads " +
           std::to_string(attention.num_kv_heads));
    if (attention_mixer == TokenMixer::kMla &&
        (mla.kv_lora_rank < 1 || mla.qk_nope_head_dim < 1 || mla.qk_rope_head_dim < 1 || mla.v_head_dim < 1))
      fail("MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim >= 1");
    if (attention_mixer == TokenMixer::kMla && mla.rope && mla.qk_rope_head_dim % 2 != 0)
      fail("MLA RoPE needs an even qk_rope_head_dim");
  }
  if (num_moe_layers() > 0) {
    const int64_t num_experts = moe.num_experts, num_experts_per_tok = moe.num_experts_per_tok;
    const int64_t num_expert_groups = moe.num_expert_groups, topk_groups = moe.topk_groups;
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
      fail("num_experts_per_tok " + std::to_string(num_experts_per_tok) + " must be in [1, num_experts " +
           std::to_string(num_experts) + "]");
    if (num_expert_groups < 1 || num_experts % num_expert_groups != 0 || topk_groups < 1 || topk_groups > num_expert_groups)
      fail("expert groups: " + std::to_string(num_experts) + " experts in " + std::to_string(num_expert_groups) +
           " groups, top " + std::to_string(topk_groups) + " groups; expected groups dividing the experts and 1 <= topk_group <= groups");
    if (num_expert_groups > 1 && (num_experts / num_expert_groups < 2 ||
                                  num_experts_per_tok > topk_groups * (num_experts / num_expert_groups)))
      fail("grouped top-k needs >= 2 experts per group and num_experts_per_tok <= topk_group x experts per group");
  }
}

int64_t ModelConfig::parameter_count() const {
  const int64_t H = hidden_size;
  int64_t attn = 0;
  if (attention_mixer == TokenMixer::kGatedAttention) {
    const int64_t nh = attention.num_heads, nkv = attention.num_kv_heads, hd = attention.head_dim;
    attn = H * nh * hd * 2 + 2 * H * nkv * hd + nh * hd * H + 2 * hd;
  } else {
    const int64_t nh = mla.num_heads, qk = mla.qk_head_dim(), r = mla.kv_lora_rank, ql = mla.q_lora_rank;
    attn = (ql > 0 ? H * ql + ql + ql * nh * qk : H * nh * qk) + H * (r + mla.qk_rope_head_dim) + r +
           r * nh * (mla.qk_nope_head_dim + mla.v_head_dim) + nh * mla.v_head_dim * H + (mla.head_gate ? H * nh : 0);
  }
  int64_t linear = 0;
  if (linear_mixer == TokenMixer::kGdn) {
    const int64_t nv = gdn.num_value_heads;
    linear = H * gdn.conv_dim() + H * gdn.value_dim() + 2 * H * nv + gdn.conv_dim() * gdn.conv_kernel + 2 * nv +
             gdn.value_head_dim + gdn.value_dim() * H;
  } else {
    const int64_t nv = kda.num_heads, dk = kda.head_dim, qkv = nv * dk;
    const int64_t gate = kda.low_rank_gates ? H * dk + dk * qkv : H * qkv;  // forget and output gate each
    linear = 3 * H * qkv + 3 * qkv * kda.conv_kernel + gate + nv + qkv + H * nv + gate + dk + qkv * H;
  }
  const int64_t dense_mlp = 3 * H * mlp.intermediate_size;
  const int64_t E = moe.num_experts;
  const int64_t moe_block = H * E + (moe.router_score_bias ? E : 0) + E * 3 * H * moe.intermediate_size +
                            (moe.shared_expert_intermediate_size > 0
                                 ? 3 * H * moe.shared_expert_intermediate_size + (moe.shared_expert_gated ? H : 0)
                                 : 0);
  int64_t total = 0;
  for (int64_t i = 0; i < num_layers; ++i)
    total += (is_full_attention[static_cast<size_t>(i)] ? attn : linear) + (layer_is_moe(i) ? moe_block : dense_mlp) + 2 * H;
  total += vocab_size * H * (tie_word_embeddings ? 1 : 2) + H;
  return total;
}

std::string ModelConfig::describe() const {
  std::ostringstream os;
  os << model_type << ": " << num_layers << " layers (" << num_linear_layers() << " " << token_mixer_name(linear_mixer)
     << " + " << num_attention_layers() << " " << token_mixer_name(attention_mixer) << "), hidden " << hidden_size;
  if (num_moe_layers() < num_layers) os << ", MLP " << mlp.intermediate_size;
  if (num_moe_layers() > 0) {
    os << ", MoE on " << num_moe_layers() << " layers (" << moe.num_experts << " experts, "
       << (moe.router_scoring == RouterScoring::kSoftmax ? "softmax" : "sigmoid") << " top-" << moe.num_experts_per_tok;
    if (moe.num_expert_groups > 1) os << " of " << moe.topk_groups << "/" << moe.num_expert_groups << " groups";
    os << " x " << moe.intermediate_size << ", shared " << moe.shared_expert_intermediate_size;
    if (moe.routed_scaling_factor != 1.0) os << ", scaling " << moe.routed_scaling_factor;
    os << ")";
  }
  os << ", vocab " << vocab_size;
  if (attention_mixer == TokenMixer::kGatedAttention)
    os << ", attention " << attention.num_heads << "q/" << attention.num_kv_heads << "kv x " << attention.head_dim
       << " (rope " << attention.rotary_dim << " dims, theta " << attention.rope_theta << ")";
  else {
    os << ", MLA " << mla.num_heads << " heads, latent " << mla.kv_lora_rank << " + " << mla.qk_rope_head_dim << " (qk "
       << mla.qk_nope_head_dim << "+" << mla.qk_rope_head_dim << ", v " << mla.v_head_dim;
    if (mla.q_lora_rank > 0) os << ", q LoRA " << mla.q_lora_rank;
    // theta through the stream, as the gated branch prints it: a cast to an integer is undefined
    // for a theta beyond int64 (found by fuzz_config_json).
    if (mla.rope) os << ", RoPE theta " << mla.rope_theta;
    else os << ", no RoPE";
    os << (mla.head_gate ? ", head gate" : "") << ")";
  }
  if (linear_mixer == TokenMixer::kGdn)
    os << ", GDN " << gdn.num_key_heads << "qk/" << gdn.num_value_heads << "v x " << gdn.key_head_dim;
  else {
    os << ", KDA " << kda.num_heads << " heads x " << kda.head_dim;
    if (kda.safe_gate) os << " (safe gate, lower bound " << kda.lower_bound << ")";  // ostream: -5, not -5.000000
  }
  os << ", " << (tie_word_embeddings ? "tied" : "untied") << " head, " << static_cast<double>(parameter_count()) / 1e9
     << "B parameters";
  return os.str();
}

namespace model {
void read_kda_mla_decoder_fields(const ConfigFields& f, ModelConfig& c, const char* model_type, const char* family,
                                 double default_eps) {
  const nlohmann::json& top = f.top;
  c.model_type = model_type;
  c.linear_mixer = TokenMixer::kKda;
  c.attention_mixer = TokenMixer::kMla;
  c.norm_weight_plus_one = false;  // KimiLinearRMSNorm and BailingHybridRMSNorm: weight * normed
  c.vocab_size = f.required_int("vocab_size");
  c.hidden_size = f.required_int("hidden_size");
  c.num_layers = f.required_int("num_hidden_layers");
  c.rms_norm_eps = f.present("rms_norm_eps") ? f.number(top, "rms_norm_eps", "rms_norm_eps") : default_eps;
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  if (top.contains("hidden_act") && top["hidden_act"] != "silu")
    config_fail(f.source, "field 'hidden_act' is " + json_got(top["hidden_act"]) + ", hanpu runs " + family +
                              " with 'silu' only");
  if (f.boolean("attention_bias", false))
    config_fail(f.source, "field 'attention_bias' is true: MLA projections with biases are not supported");
}

std::vector<int32_t> read_eos_token_ids(const ConfigFields& f) {
  // Token ids are 32-bit (and non-negative): an id outside that range is an error, never cut.
  std::vector<int32_t> ids;
  auto eos_id = [&](const nlohmann::json& x, const std::string& name) {
    if (!x.is_number_integer() || (x.is_number_unsigned() ? x.get<uint64_t>() > 2147483647u : x.get<int64_t>() < 0))
      config_fail(f.source, "field '" + name + "' is " + json_got(x) + ", expected a token id in [0, 2147483647]");
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  };
  for (const nlohmann::json* obj : std::initializer_list<const nlohmann::json*>{&f.text, &f.top}) {
    if (!ids.empty() || !obj->contains("eos_token_id")) continue;
    const std::string name = (obj == &f.text ? f.where("eos_token_id") : std::string("eos_token_id"));
    const nlohmann::json& e = (*obj)["eos_token_id"];
    if (e.is_null()) continue;
    if (e.is_array()) {
      for (size_t i = 0; i < e.size(); ++i) eos_id(e[i], name + "[" + std::to_string(i) + "]");
    } else {
      eos_id(e, name);
    }
  }
  return ids;
}
}  // namespace model

}  // namespace hanpu
