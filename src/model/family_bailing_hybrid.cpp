// The Ling 3.0 family: its registry row, preset and config.json parser (docs/MODEL.md). The
// parser reads the config transformers 5.24's
// BailingHybridConfig saves (model_type bailing_hybrid) and the layout of the published
// checkpoints (architectures BailingMoeV3ForCausalLM, model_type bailing_hybrid, or bailing_moe_v3
// from their remote-code config class): KDA layers with full-rank gate projections and the safe
// gate, MLA with interleaved RoPE and a head-wise output gate, sigmoid grouped top-k MoE.
// Absent optional keys take BailingHybridConfig's defaults. Options the BailingHybrid model does
// not compute either, or that hanpu does not run (a RoPE type other than default, biases, KDA LoRA
// gates, element-wise MLA gates, SwiGLU clamps), are refused, naming the key.
#include <cmath>
#include <nlohmann/json.hpp>

#include "hanpu/model_family.hpp"
#include "io/json_io.hpp"
#include "model/config_fields.hpp"
#include "model/gguf_arch.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;
using model::config_fail;
using model::ConfigFields;
using model::first_present;

// A list of per-layer kinds: each entry one of `a` (true) or `b` (false).
std::vector<bool> kinds(const json& top, const char* key, const char* a, const char* b, int64_t layers,
                        const std::string& source) {
  const json& v = top[key];
  if (!v.is_array() || static_cast<int64_t>(v.size()) != layers)
    config_fail(source, std::string("field '") + key + "' must be a list of " + std::to_string(layers) +
                            " entries (num_hidden_layers), found " + json_got(v));
  std::vector<bool> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string t = v[i].is_string() ? v[i].get<std::string>() : json_summary(v[i]);
    if (t != a && t != b)
      config_fail(source, std::string(key) + "[" + std::to_string(i) + "] is '" + t + "', expected '" + a + "' or '" + b + "'");
    out.push_back(t == a);
  }
  return out;
}

// The checkpoint layout (transformers' conversion_mapping for bailing_hybrid, reversed; the
// published checkpoints name the KDA output projection o_proj, which the KDA loader reads when
// present).
CheckpointNames bailing_hybrid_names() {
  CheckpointNames n;
  n.embed_tokens = "word_embeddings.";
  n.attention = "attention.";
  n.linear_attention = "attention.";
  n.attention_out = "dense";
  n.router_score_bias = "gate.expert_bias";
  n.channel_mixer = {"mlp."};
  n.shared_expert = "shared_experts.";
  return n;
}

ModelConfig parse(const json& top, const std::string& source) {
  if (!top.is_object()) config_fail(source, "expected a JSON object");
  const ConfigFields f{top, top, source};
  ModelConfig c;
  read_kda_mla_decoder_fields(f, c, "bailing_hybrid", "Ling 3.0", 1e-6);

  // KDA geometry as transformers reads it: BailingHybridConfig.__post_init__ copies head_dim into
  // linear_head_dim, num_attention_heads into linear_num_heads and short_conv_kernel_size into
  // linear_conv_kernel_dim, then overwrites head_dim with qk_rope_head_dim; its KDA layers are built
  // from the linear_* values, and save_pretrained writes them all (head_dim then holds
  // qk_rope_head_dim). The published configs have no linear_* keys: head_dim is the KDA head dim
  // there (llama.cpp's conversion/bailingmoe3.py and vLLM's bailing_moe_v3.py read it so).
  c.mla.num_heads = f.required_int("num_attention_heads");
  const int64_t num_kv_heads = f.optional_int("num_key_value_heads", c.mla.num_heads);
  if (num_kv_heads != c.mla.num_heads)
    config_fail(source, "num_key_value_heads " + std::to_string(num_kv_heads) + " differs from num_attention_heads " +
                            std::to_string(c.mla.num_heads) + ": the MLA latent expands to one key/value head per query head");
  const char* heads_key = f.present("linear_num_heads") ? "linear_num_heads" : "num_attention_heads";
  const char* dim_key = f.present("linear_head_dim") ? "linear_head_dim" : "head_dim";
  const char* conv_key = f.present("linear_conv_kernel_dim") ? "linear_conv_kernel_dim" : "short_conv_kernel_size";
  c.kda.num_heads = f.required_int(heads_key);
  c.kda.head_dim = f.optional_int(dim_key, 128);
  c.kda.conv_kernel = f.optional_int(conv_key, 4);
  c.linear_shape_source = "config.json gives the KDA layers " + std::to_string(c.kda.num_heads) + " heads of " +
                          std::to_string(c.kda.head_dim) + " (" + heads_key + ", " + dim_key + ") and a conv of " +
                          std::to_string(c.kda.conv_kernel) + " (" + conv_key + ")";
  c.kda.low_rank_gates = false;
  // The published layout's switches (llama.cpp's conversion/bailingmoe3.py refuses the same ones):
  // KDA LoRA gate projections, and any MLA output gate but the head-wise one.
  if (f.present("no_kda_lora") && !f.boolean("no_kda_lora", true))
    config_fail(source, "field 'no_kda_lora' is false: Ling's low-rank (LoRA) KDA gate projections are not supported, "
                        "expected true (full-rank f_proj / g_proj, as the published Ling 3.0 checkpoints)");
  if (f.boolean("use_kda_lora", false))
    config_fail(source, "field 'use_kda_lora' is true: Ling's low-rank (LoRA) KDA gate projections are not supported, "
                        "expected false (full-rank f_proj / g_proj)");
  if (top.contains("gated_attention_proj_granularity_type") && top["gated_attention_proj_granularity_type"] != "head_wise")
    config_fail(source, "field 'gated_attention_proj_granularity_type' is " +
                            json_got(top["gated_attention_proj_granularity_type"]) +
                            ", expected 'head_wise' (one sigmoid gate per MLA head; element-wise or no gate is not "
                            "supported)");
  c.kda.safe_gate = f.boolean("kda_safe_gate", true);
  if (c.kda.safe_gate) {
    c.kda.lower_bound = -5.0;
    if (f.present("kda_lower_bound")) {
      const json& v = top["kda_lower_bound"];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() < 0))
        config_fail(source, "field 'kda_lower_bound' is " + json_got(v) + ", expected a negative number");
      c.kda.lower_bound = v.get<double>();
    }
  }

  // MLA with RoPE and the head-wise output gate.
  c.mla.q_lora_rank = f.optional_int("q_lora_rank", 0);
  c.mla.kv_lora_rank = f.optional_int("kv_lora_rank", 512);
  c.mla.qk_nope_head_dim = f.optional_int("qk_nope_head_dim", 128);
  c.mla.qk_rope_head_dim = f.optional_int("qk_rope_head_dim", 64);
  c.mla.v_head_dim = f.optional_int("v_head_dim", 128);
  c.mla.rope = true;
  c.mla.head_gate = true;
  c.mla.rope_theta = 6e6;
  if (f.present("rope_parameters")) {
    const json& rp = top["rope_parameters"];
    if (!rp.is_object()) config_fail(source, "field 'rope_parameters' is " + json_got(rp) + ", expected an object");
    const std::string type = rp.value("rope_type", "default");
    if (type != "default")
      config_fail(source, "rope_parameters.rope_type '" + type + "' is not supported (expected 'default'; YaRN and other "
                          "scalings are not implemented)");
    if (rp.contains("rope_theta")) c.mla.rope_theta = f.number(rp, "rope_theta", "rope_parameters.rope_theta");
  } else if (f.present("rope_theta")) {
    c.mla.rope_theta = f.number(top, "rope_theta", "rope_theta");
  }
  if (f.present("rope_scaling")) {  // the published configs: null
    const json& rs = top["rope_scaling"];
    if (!rs.is_object()) config_fail(source, "field 'rope_scaling' is " + json_got(rs) + ", expected null or an object");
    const std::string type = rs.value("rope_type", rs.value("type", "default"));
    if (type != "default")
      config_fail(source, "rope_scaling type '" + type + "' is not supported (expected null or 'default'; YaRN and other "
                          "scalings are not implemented)");
  }
  // The published configs carry partial_rotary_factor 0.5 beside qk_rope_head_dim 64: MLA rotates
  // all qk_rope_head_dim dims either way (transformers' BailingHybridRotaryEmbedding takes its
  // width from qk_rope_head_dim; vLLM's bailing_moe_v3.py drops the factor), so it is not read.
  if (top.contains("rope_interleave") && top["rope_interleave"] != true)
    config_fail(source, "field 'rope_interleave' is " + json_got(top["rope_interleave"]) +
                            ", expected true (Ling's MLA rotates interleaved pairs; the half-split layout is not supported)");
  if (f.boolean("use_mla_nope", false))
    config_fail(source, "field 'use_mla_nope' is true (MLA without RoPE) is not supported for bailing_hybrid; expected "
                        "false, as the published Ling 3.0 checkpoints");
  for (const char* bias : {"use_qkv_bias", "use_bias"})
    if (f.boolean(bias, false))
      config_fail(source, std::string("field '") + bias + "' is true: projections with biases are not supported, expected false");
  if (c.mla.qk_rope_head_dim % 2 != 0)
    config_fail(source, "qk_rope_head_dim " + std::to_string(c.mla.qk_rope_head_dim) + " is odd; RoPE rotates pairs");

  // Layer kinds: layer_types, else the last layer of every layer_group_size group is MLA.
  if (f.present("layer_types")) {
    c.is_full_attention = kinds(top, "layer_types", "full_attention", "linear_attention", c.num_layers, source);
  } else {
    // The last layer of each group is MLA. transformers stops there; the published model's code
    // (as llama.cpp's conversion/bailingmoe3.py and vLLM's bailing_moe_v3.py mirror it) also makes
    // the layers after the last whole group MLA. The two agree when the groups divide the layers,
    // as in every published config; otherwise it is refused rather than guessed.
    const int64_t group = f.optional_int("layer_group_size", 6);
    if (c.num_layers % group != 0)
      config_fail(source, "num_hidden_layers " + std::to_string(c.num_layers) + " is not a multiple of layer_group_size " +
                              std::to_string(group) + " and there is no layer_types: transformers and the published "
                              "model's code disagree on the layers after the last group; give layer_types");
    for (int64_t i = 0; i < c.num_layers; ++i) c.is_full_attention.push_back((i + 1) % group == 0);
  }
  if (f.present("mlp_layer_types")) {
    c.is_moe = kinds(top, "mlp_layer_types", "sparse", "dense", c.num_layers, source);
  } else {
    int64_t dense_first = 2;
    if (top.contains("first_k_dense_replace")) {
      const json& v = top["first_k_dense_replace"];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > c.num_layers)
        config_fail(source, "field 'first_k_dense_replace' is " + json_got(v) + ", expected a layer count in [0, " +
                                std::to_string(c.num_layers) + "]");
      dense_first = v.get<int64_t>();
    }
    for (int64_t i = 0; i < c.num_layers; ++i) c.is_moe.push_back(i >= dense_first);
  }
  if (c.num_moe_layers() < c.num_layers) c.mlp.intermediate_size = f.required_int("intermediate_size");
  if (c.num_moe_layers() > 0) {
    const char* experts = first_present(top, {"num_experts", "num_local_experts"});
    c.moe.num_experts = experts ? f.required_int(experts) : 512;
    const char* per_tok = first_present(top, {"num_experts_per_token", "num_experts_per_tok"});
    c.moe.num_experts_per_tok = per_tok ? f.required_int(per_tok) : 8;
    c.moe.intermediate_size = f.required_int("moe_intermediate_size");
    const char* shared = first_present(top, {"num_shared_experts", "n_shared_experts"});
    const bool no_shared = shared && top[shared] == 0;
    // The published configs give the shared expert's width (moe_shared_expert_intermediate_size,
    // times num_shared_experts as vLLM's bailing_moe_v3.py builds it); transformers uses
    // moe_intermediate_size. Equal in every published config; the tensors' shapes are checked.
    const int64_t shared_width = f.optional_int("moe_shared_expert_intermediate_size", c.moe.intermediate_size);
    c.moe.shared_expert_intermediate_size = no_shared ? 0 : (shared ? f.required_int(shared) : 1) * shared_width;
    c.moe.shared_expert_gated = false;
    c.moe.router_scoring = RouterScoring::kSigmoid;
    c.moe.router_score_bias = true;
    for (const char* key : {"scoring_func", "score_function", "moe_router_activation_func"})
      if (top.contains(key) && top[key] != "sigmoid")
        config_fail(source, std::string("field '") + key + "' is " + json_got(top[key]) + ", expected 'sigmoid' (the Ling router)");
    if (top.contains("topk_method") && top["topk_method"] != "noaux_tc")
      config_fail(source, "field 'topk_method' is " + json_got(top["topk_method"]) +
                              ", expected 'noaux_tc' (grouped top-k on the bias-corrected sigmoid scores)");
    if (!f.boolean("moe_router_enable_expert_bias", true))
      config_fail(source, "field 'moe_router_enable_expert_bias' is false: a Ling router without its expert_bias is not "
                          "supported, expected true");
    // SwiGLU clamps per layer (published as null): a non-zero limit on a layer hanpu runs is refused.
    for (const char* key : {"expert_swiglu_limit_list", "share_expert_swiglu_limit_list"}) {
      if (!f.present(key)) continue;
      const json& v = top[key];
      if (!v.is_array()) config_fail(source, std::string("field '") + key + "' is " + json_got(v) + ", expected null or a list");
      for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < c.num_layers; ++i)
        if (!v[i].is_null() && !(v[i].is_number() && v[i].get<double>() == 0.0))
          config_fail(source, std::string("field '") + key + "[" + std::to_string(i) + "]' is " + json_got(v[i]) +
                                  ": clamped SwiGLU experts are not supported, expected null or 0");
    }
    const char* groups = first_present(top, {"num_expert_group", "n_group"});
    c.moe.num_expert_groups = groups ? f.required_int(groups) : 8;
    c.moe.topk_groups = f.optional_int("topk_group", 4);
    const char* renorm = first_present(top, {"moe_renormalize", "norm_topk_prob"});
    c.moe.norm_topk_prob = renorm ? f.boolean(renorm, true) : true;
    c.moe.topk_norm_eps = 1e-20;
    c.moe.routed_scaling_factor =
        f.present("routed_scaling_factor") ? f.number(top, "routed_scaling_factor", "routed_scaling_factor") : 2.5;
  }

  // The MTP layers stored after num_hidden_layers (num_nextn_predict_layers / num_mtp_layers) are
  // never read (skipped by design: a text engine decoding one token at a time does not use them).
  c.names = bailing_hybrid_names();
  c.eos_token_ids = model::read_eos_token_ids(f);
  c.check();
  return c;
}


// ---- GGUF mapping (llama.cpp's bailingmoe3; model/gguf_arch.hpp) -------------------------------
// Keys: BailingMoeV3Model.set_gguf_parameters (llama.cpp's conversion/bailingmoe3.py) and
// TextModel's shared ones; tensors: its modify_tensors (A_log stored as exp(A_log) [H, 1], the KDA
// convs as [1, C, 1, K], f_proj as ssm_f_a, g_proj as ssm_g_a on KDA layers and attn_gate on MLA
// layers, expert_bias as exp_probs_b.bias, experts stacked, kv_b_proj split into attn_k_b
// (transposed per head) and attn_v_b).

void ling_gguf_config(const GgufModel& m, const std::string& a, nlohmann::ordered_json& c) {
  const GgufFile& f = m.main();
  model::gguf_meta::kda_mla_decoder(f, a, c);
  c["rope_theta"] = f.get_float(a + ".rope.freq_base");
  // llama.cpp's bailingmoe3 loader: an absent safe_gate means true; the lower bound is required.
  c["kda_safe_gate"] = model::gguf_meta::optional_bool(f, a + ".kda.safe_gate").value_or(true);
  c["kda_lower_bound"] = f.get_float(a + ".kda.gate_lower_bound");
  // The shared experts' total width (llama.cpp's n_ff_shexp); hanpu's parser takes it per expert.
  if (c.contains("num_shared_experts"))
    if (const auto total = model::gguf_meta::optional_uint(f, a + ".expert_shared_feed_forward_length")) {
      const uint64_t count = c["num_shared_experts"].get<uint64_t>();
      if (count == 0 || *total % count != 0)
        model::gguf_meta::fail_key(f, a + ".expert_shared_feed_forward_length", std::to_string(*total),
                                   "a multiple of " + a + ".expert_shared_count (" + std::to_string(count) + ")");
      c["moe_shared_expert_intermediate_size"] = *total / count;
    }
  for (const char* clamp : {".swiglu_clamp_exp", ".swiglu_clamp_shexp"})
    if (const GgufValue* v = f.find(a + clamp)) {
      const auto* arr = std::get_if<std::vector<GgufValue>>(&v->value);
      bool all_zero = arr != nullptr;
      if (arr)
        for (const GgufValue& x : *arr)
          all_zero = all_zero && std::holds_alternative<double>(x.value) && std::get<double>(x.value) == 0.0;
      if (!all_zero)
        model::gguf_meta::fail_key(f, a + clamp, v->describe(), "absent or all 0 (clamped SwiGLU experts are not supported)");
    }
}

std::vector<model::GgufTensorRule> ling_gguf_layer() {
  using model::GgufFix;
  using K = model::GgufLayerKind;
  return {{"input_layernorm.weight", "attn_norm.weight"},
          {"post_attention_layernorm.weight", "ffn_norm.weight"},
          {"attention.q_proj.weight", "attn_q.weight"},
          {"attention.dense.weight", "attn_output.weight"},
          {"attention.o_proj.weight", "attn_output.weight"},
          {"attention.k_proj.weight", "attn_k.weight", GgufFix::kNone, K::kLinear},
          {"attention.v_proj.weight", "attn_v.weight", GgufFix::kNone, K::kLinear},
          {"attention.q_conv1d.weight", "ssm_conv1d_q.weight", GgufFix::kConv, K::kLinear},
          {"attention.k_conv1d.weight", "ssm_conv1d_k.weight", GgufFix::kConv, K::kLinear},
          {"attention.v_conv1d.weight", "ssm_conv1d_v.weight", GgufFix::kConv, K::kLinear},
          {"attention.f_proj.weight", "ssm_f_a.weight", GgufFix::kNone, K::kLinear},
          {"attention.g_proj.weight", "ssm_g_a.weight", GgufFix::kNone, K::kLinear},
          {"attention.b_proj.weight", "ssm_beta.weight", GgufFix::kNone, K::kLinear},
          {"attention.A_log", "ssm_a", GgufFix::kALogExp, K::kLinear},
          {"attention.dt_bias", "ssm_dt.bias", GgufFix::kDtBias, K::kLinear},
          {"attention.o_norm.weight", "ssm_norm.weight", GgufFix::kNone, K::kLinear},
          {"attention.g_proj.weight", "attn_gate.weight", GgufFix::kNone, K::kAttention},
          {"attention.q_a_proj.weight", "attn_q_a.weight", GgufFix::kNone, K::kAttention},
          {"attention.q_a_layernorm.weight", "attn_q_a_norm.weight", GgufFix::kNone, K::kAttention},
          {"attention.q_b_proj.weight", "attn_q_b.weight", GgufFix::kNone, K::kAttention},
          {"attention.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", GgufFix::kNone, K::kAttention},
          {"attention.kv_a_layernorm.weight", "attn_kv_a_norm.weight", GgufFix::kNone, K::kAttention},
          {"attention.kv_b_proj.weight", "attn_k_b.weight", GgufFix::kKvB, K::kAttention},
          {"mlp.gate.weight", "ffn_gate_inp.weight"},
          {"mlp.gate.expert_bias", "exp_probs_b.bias"},
          {"mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", GgufFix::kExpert},
          {"mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", GgufFix::kExpert},
          {"mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", GgufFix::kExpert},
          {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
          {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
          {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
          {"mlp.gate_proj.weight", "ffn_gate.weight"},
          {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
}

}  // namespace

ModelConfig parse_bailing_hybrid_config(const std::string& json_text, const std::string& source) {
  const json top = parse_json(json_text, "config '" + source + "'");
  try {
    return parse(top, source);
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    config_fail(source, "a field has an unexpected JSON type: " + what);
  }
}

namespace {

// A slice of Ling-3.0-Flash with the shapes of transformers 5.24's BailingHybridConfig defaults
// (whose docstring names inclusionAI/Ling-3.0-Flash; no official config was read): hidden 2560,
// KDA 32 heads of 128 with full-rank gates and the safe gate (lower bound -5), MLA 32 heads
// (kv_lora 512, nope 128 + rope 64, v 128, RoPE theta 6e6, no q_lora), 512 experts top-8 of 768
// plus a shared expert of 768 with grouped sigmoid routing (8 groups, top-4), dense MLPs of 6144
// in the first two layers, vocabulary 157184, untied. Of the 42 layers (groups of 5 KDA + 1 MLA)
// it keeps 3 KDA + 1 MLA, the two dense layers and two MoE layers, and 64 of the 512 experts
// (8 per group, so grouped top-k still chooses 4 of 8 groups). Written as a config.json and read
// by the family's own parser, so the preset is exactly what such a checkpoint would load.
constexpr const char* kLingFlashSlice = "ling-3.0-flash-slice";

ModelConfig ling_flash_slice() {
  return parse_bailing_hybrid_config(R"({
    "model_type": "bailing_hybrid", "vocab_size": 157184, "hidden_size": 2560,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 4,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
    "kv_lora_rank": 512, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "rope_theta": 6000000.0,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
    "num_experts": 64, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "norm_topk_prob": true, "kda_safe_gate": true, "kda_lower_bound": -5.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "eos_token_id": 156895
  })", kLingFlashSlice);
}

}  // namespace

namespace model {

extern const GgufMapping kBailingMoe3Gguf{.model_type = "bailing_hybrid",
                                          .config = ling_gguf_config,
                                          .global = {{"model.word_embeddings.weight", "token_embd.weight"},
                                                     {"model.norm.weight", "output_norm.weight"},
                                                     {"lm_head.weight", "output.weight"}},
                                          .layer = ling_gguf_layer()};

extern const ModelFamily kBailingHybridFamily{
    .name = "Ling 3.0",
    // bailing_hybrid: transformers' type, which the published checkpoints declare too;
    // bailing_moe_v3: their remote-code config class.
    .model_types = {"bailing_hybrid", "bailing_moe_v3"},
    // A config without model_type names the architecture only (BailingMoeV3ForCausalLM, the one
    // llama.cpp's and vLLM's Ling code registers).
    .architectures = {"BailingMoeV3ForCausalLM", "BailingHybridForCausalLM"},
    .parse = parse_bailing_hybrid_config,
    .presets = {{kLingFlashSlice, ling_flash_slice}},
    .checkpoint_names = bailing_hybrid_names(),
    // Ling's (Bailing) template: <role>HUMAN</role>... turns ending in <|role_end|>,
    // <|endoftext|> its end of text; tool calls as JSON in <tool_call> tags. No fallback.
    .chat_template = "",
    .stop_tokens = {"<|role_end|>", "<|endoftext|>"},
    .tool_call_format = ToolCallFormat::kJsonTags,
    .gguf_architecture = "bailingmoe3",
    .gguf_mapping = &kBailingMoe3Gguf,
};

}  // namespace model

}  // namespace hanpu
