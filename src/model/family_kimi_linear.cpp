// The Kimi Linear family: its registry row, presets and config.json parser (model_type
// kimi_linear; docs/MODEL.md). The parser reads the
// official checkpoints' keys (linear_attn_config with 1-indexed kda_layers / full_attn_layers,
// num_experts_per_token, first_k_dense_replace, ...) and the ones transformers' save_pretrained
// writes (layer_types, mlp_layer_types, linear_num_heads, ...), with transformers 5.24's
// KimiLinearConfig defaults for absent optional keys. Options transformers' KimiLinear model does
// not run either (RoPE in MLA, biases, other activations) are refused, naming the key.
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

// The checkpoint layout (docs/MODEL.md): the KDA module is self_attn; MoE layers are
// block_sparse_moe (dense ones mlp in official checkpoints, block_sparse_moe in save_pretrained's),
// experts w1 / w3 / w2, the shared experts shared_experts.
CheckpointNames kimi_linear_names() {
  CheckpointNames n;
  n.linear_attention = "self_attn.";
  n.channel_mixer = {"block_sparse_moe.", "mlp."};
  n.expert_gate = "w1";
  n.expert_up = "w3";
  n.expert_down = "w2";
  n.shared_expert = "shared_experts.";
  return n;
}

ModelConfig parse(const json& top, const std::string& source) {
  if (!top.is_object()) config_fail(source, "expected a JSON object");
  const ConfigFields f{top, top, source};
  ModelConfig c;
  // The fields shared with Ling 3.0, and the options outside what the KimiLinear layers compute.
  read_kda_mla_decoder_fields(f, c, "kimi_linear", "Kimi Linear", 1e-5);
  if (!f.boolean("mla_use_nope", true))
    config_fail(source, "field 'mla_use_nope' is false (MLA with RoPE) is not supported for kimi_linear; hanpu runs "
                        "its MLA without RoPE, as the published Kimi Linear checkpoints");
  if (top.contains("moe_router_activation_func") && top["moe_router_activation_func"] != "sigmoid")
    config_fail(source, "field 'moe_router_activation_func' is " + json_got(top["moe_router_activation_func"]) +
                            ", expected 'sigmoid' (the Kimi Linear router)");
  if (top.contains("moe_layer_freq") && top["moe_layer_freq"] != 1)
    config_fail(source, "field 'moe_layer_freq' is " + json_got(top["moe_layer_freq"]) +
                            ", only 1 (every layer from first_k_dense_replace on is MoE) is supported");
  if (top.contains("num_nextn_predict_layers") && top["num_nextn_predict_layers"].is_number_integer() &&
      top["num_nextn_predict_layers"].get<int64_t>() > 0)
    config_fail(source, "field 'num_nextn_predict_layers' > 0: Kimi Linear MTP layers are not supported");

  // KDA layers: linear_attn_config (official) or the flat keys save_pretrained writes.
  const json empty = json::object();
  const json& lac = top.contains("linear_attn_config") && top["linear_attn_config"].is_object() ? top["linear_attn_config"] : empty;
  const ConfigFields lf{lac, top, source};
  std::string keys;  // which keys gave the geometry, for load errors
  auto kda_int = [&](const char* nested, const char* flat, int64_t fallback) {
    keys += keys.empty() ? "" : ", ";
    if (lac.contains(nested) && !lac[nested].is_null()) {
      keys += std::string("linear_attn_config.") + nested;
      return lf.int_value(lac[nested], nested, std::string("linear_attn_config.") + nested);
    }
    keys += flat;
    return f.optional_int(flat, fallback);
  };
  const int64_t kda_heads = kda_int("num_heads", "linear_num_heads", 32);
  const int64_t kda_dim = kda_int("head_dim", "linear_head_dim", 128);
  c.kda.num_heads = kda_heads;
  c.kda.head_dim = kda_dim;
  c.kda.conv_kernel = kda_int("short_conv_kernel_size", "linear_conv_kernel_dim", 4);
  c.linear_shape_source = "config.json gives the KDA layers " + std::to_string(kda_heads) + " heads of " +
                          std::to_string(kda_dim) + " and a conv of " + std::to_string(c.kda.conv_kernel) + " (" +
                          keys + ")";

  // Layer kinds: layer_types, else linear_attn_config's 1-indexed lists, else transformers' default.
  c.is_full_attention.assign(static_cast<size_t>(c.num_layers), false);
  if (f.present("layer_types")) {
    const json& lt = top["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers)
      config_fail(source, "field 'layer_types' must be a list of " + std::to_string(c.num_layers) +
                              " entries (num_hidden_layers), found " + json_got(lt));
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : json_summary(lt[i]);
      if (t != "full_attention" && t != "linear_attention")
        config_fail(source, "layer_types[" + std::to_string(i) + "] is '" + t + "', expected 'full_attention' or 'linear_attention'");
      c.is_full_attention[i] = t == "full_attention";
    }
  } else if (lac.contains("full_attn_layers") && lac.contains("kda_layers")) {
    std::vector<int> seen(static_cast<size_t>(c.num_layers), 0);
    for (const char* key : {"full_attn_layers", "kda_layers"}) {
      const json& list = lac[key];
      if (!list.is_array()) config_fail(source, std::string("field 'linear_attn_config.") + key + "' is " + json_got(list) + ", expected a list");
      for (const json& x : list) {
        if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > c.num_layers)
          config_fail(source, std::string("field 'linear_attn_config.") + key + "' holds " + json_got(x) +
                                  ", expected 1-indexed layer numbers in [1, " + std::to_string(c.num_layers) + "]");
        const size_t i = static_cast<size_t>(x.get<int64_t>() - 1);
        ++seen[i];
        c.is_full_attention[i] = std::string(key) == "full_attn_layers";
      }
    }
    for (size_t i = 0; i < seen.size(); ++i)
      if (seen[i] != 1)
        config_fail(source, "linear_attn_config: layer " + std::to_string(i + 1) + " is listed " + std::to_string(seen[i]) +
                                " times in full_attn_layers + kda_layers, expected exactly once");
  } else {
    for (int64_t i = 0; i < c.num_layers; ++i) c.is_full_attention[static_cast<size_t>(i)] = i > 0 && i % 4 == 0;
  }

  // MLA (KimiLinearAttention): one KV head per query head after kv_b_proj.
  c.mla.num_heads = f.required_int("num_attention_heads");
  const int64_t num_kv_heads = f.optional_int("num_key_value_heads", c.mla.num_heads);
  if (num_kv_heads != c.mla.num_heads)
    config_fail(source, "num_key_value_heads " + std::to_string(num_kv_heads) + " differs from num_attention_heads " +
                            std::to_string(c.mla.num_heads) + ": Kimi Linear's MLA expands the latent to one key/value head "
                            "per query head");
  c.mla.q_lora_rank = f.optional_int("q_lora_rank", 0);
  c.mla.kv_lora_rank = f.optional_int("kv_lora_rank", 512);
  c.mla.qk_nope_head_dim = f.optional_int("qk_nope_head_dim", 128);
  c.mla.qk_rope_head_dim = f.optional_int("qk_rope_head_dim", 64);
  c.mla.v_head_dim = f.optional_int("v_head_dim", 128);

  // Channel mixers: mlp_layer_types ("dense" / "sparse"), else the first first_k_dense_replace
  // layers dense and the rest MoE.
  c.is_moe.assign(static_cast<size_t>(c.num_layers), false);
  if (f.present("mlp_layer_types")) {
    const json& mt = top["mlp_layer_types"];
    if (!mt.is_array() || static_cast<int64_t>(mt.size()) != c.num_layers)
      config_fail(source, "field 'mlp_layer_types' must be a list of " + std::to_string(c.num_layers) + " entries, found " + json_got(mt));
    for (size_t i = 0; i < mt.size(); ++i) {
      const std::string t = mt[i].is_string() ? mt[i].get<std::string>() : json_summary(mt[i]);
      if (t != "dense" && t != "sparse")
        config_fail(source, "mlp_layer_types[" + std::to_string(i) + "] is '" + t + "', expected 'dense' or 'sparse'");
      c.is_moe[i] = t == "sparse";
    }
  } else {
    int64_t dense_first = 1;
    if (top.contains("first_k_dense_replace")) {
      const json& v = top["first_k_dense_replace"];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > c.num_layers)
        config_fail(source, "field 'first_k_dense_replace' is " + json_got(v) + ", expected a layer count in [0, " +
                                std::to_string(c.num_layers) + "]");
      dense_first = v.get<int64_t>();
    }
    for (int64_t i = dense_first; i < c.num_layers; ++i) c.is_moe[static_cast<size_t>(i)] = true;
  }
  if (c.num_moe_layers() < c.num_layers) c.mlp.intermediate_size = f.required_int("intermediate_size");
  if (c.num_moe_layers() > 0) {
    const char* experts = first_present(top, {"num_experts", "num_local_experts", "n_routed_experts"});
    if (!experts) config_fail(source, "field 'num_experts' is missing (needed by the MoE layers)");
    c.moe.num_experts = f.required_int(experts);
    const char* per_tok = first_present(top, {"num_experts_per_token", "num_experts_per_tok"});
    c.moe.num_experts_per_tok = per_tok ? f.required_int(per_tok) : 8;
    c.moe.intermediate_size = f.required_int("moe_intermediate_size");
    const char* shared = first_present(top, {"num_shared_experts", "n_shared_experts"});
    const bool no_shared = shared && top[shared] == 0;
    c.moe.shared_expert_intermediate_size = no_shared ? 0 : (shared ? f.required_int(shared) : 1) * c.moe.intermediate_size;
    c.moe.shared_expert_gated = false;
    c.moe.router_scoring = RouterScoring::kSigmoid;
    c.moe.router_score_bias = true;  // KimiLinearTopkRouter.e_score_correction_bias
    const char* groups = first_present(top, {"num_expert_group", "n_group"});
    c.moe.num_expert_groups = groups ? f.required_int(groups) : 1;
    c.moe.topk_groups = f.optional_int("topk_group", 1);
    const char* renorm = first_present(top, {"moe_renormalize", "norm_topk_prob"});
    c.moe.norm_topk_prob = renorm ? f.boolean(renorm, true) : true;
    c.moe.topk_norm_eps = 1e-20;
    c.moe.routed_scaling_factor =
        f.present("routed_scaling_factor") ? f.number(top, "routed_scaling_factor", "routed_scaling_factor") : 2.446;
  }

  c.names = kimi_linear_names();
  c.eos_token_ids = model::read_eos_token_ids(f);
  c.check();
  return c;
}

// A slice of Kimi-Linear-48B-A3B (docs/MODEL.md) with its real layer shapes: the dense
// KDA layer 0, two MoE KDA layers and one MoE MLA layer of the 27 (the real ratio is 20 KDA : 7
// MLA), 64 of the 256 experts (top-8 of them, as the real router picks 8).
constexpr const char* kKimiLinearSlice = "kimi-linear-48b-a3b-slice";

ModelConfig kimi_linear_slice() {
  ModelConfig c;
  c.model_type = "kimi_linear";
  c.linear_mixer = TokenMixer::kKda;
  c.attention_mixer = TokenMixer::kMla;
  c.norm_weight_plus_one = false;
  c.vocab_size = 163840;
  c.hidden_size = 2304;
  c.mlp.intermediate_size = 9216;
  c.num_layers = 4;
  c.mla.num_heads = 32;
  c.mla.kv_lora_rank = 512;
  c.mla.qk_nope_head_dim = 128;
  c.mla.qk_rope_head_dim = 64;
  c.mla.v_head_dim = 128;
  c.kda.num_heads = 32;
  c.kda.head_dim = 128;
  c.kda.conv_kernel = 4;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = false;
  c.is_full_attention = {false, false, false, true};
  c.is_moe = {false, true, true, true};
  c.moe.num_experts = 64;
  c.moe.num_experts_per_tok = 8;
  c.moe.intermediate_size = 1024;
  c.moe.shared_expert_intermediate_size = 1024;
  c.moe.shared_expert_gated = false;
  c.moe.router_scoring = RouterScoring::kSigmoid;
  c.moe.router_score_bias = true;
  c.moe.norm_topk_prob = true;
  c.moe.topk_norm_eps = 1e-20;
  c.moe.routed_scaling_factor = 2.446;
  c.names = kimi_linear_names();
  c.eos_token_ids = {163586};
  return c;
}

// ---- GGUF mapping (llama.cpp's kimi-linear; model/gguf_arch.hpp) ------------------------------
// Keys: KimiLinearModel.set_gguf_parameters (llama.cpp's conversion/kimi_linear.py) and
// TextModel's shared ones; tensors: its modify_tensors (A_log stored as -exp(A_log) [1, 1, H, 1],
// the three KDA convs as [1, C, 1, K], dt_bias as ssm_dt.bias, experts w1/w2/w3 stacked into
// ffn_{gate,down,up}_exps, kv_b_proj split into attn_k_b (transposed per head) and attn_v_b).

void kimi_gguf_config(const GgufModel& m, const std::string& a, nlohmann::ordered_json& c) {
  model::gguf_meta::kda_mla_decoder(m.main(), a, c);
}

std::vector<model::GgufTensorRule> kimi_gguf_layer() {
  using model::GgufFix;
  using K = model::GgufLayerKind;
  std::vector<model::GgufTensorRule> r = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      // KDA and MLA share q_proj (KDA's q, MLA's full-rank q) and o_proj.
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.v_proj.weight", "attn_v.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.q_conv1d.weight", "ssm_conv1d_q.weight", GgufFix::kConv, K::kLinear},
      {"self_attn.k_conv1d.weight", "ssm_conv1d_k.weight", GgufFix::kConv, K::kLinear},
      {"self_attn.v_conv1d.weight", "ssm_conv1d_v.weight", GgufFix::kConv, K::kLinear},
      {"self_attn.f_a_proj.weight", "ssm_f_a.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.f_b_proj.weight", "ssm_f_b.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.g_a_proj.weight", "ssm_g_a.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.g_b_proj.weight", "ssm_g_b.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.b_proj.weight", "ssm_beta.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.A_log", "ssm_a", GgufFix::kALog, K::kLinear},
      {"self_attn.dt_bias", "ssm_dt.bias", GgufFix::kDtBias, K::kLinear},
      {"self_attn.o_norm.weight", "ssm_norm.weight", GgufFix::kNone, K::kLinear},
      {"self_attn.q_a_proj.weight", "attn_q_a.weight", GgufFix::kNone, K::kAttention},
      {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", GgufFix::kNone, K::kAttention},
      {"self_attn.q_b_proj.weight", "attn_q_b.weight", GgufFix::kNone, K::kAttention},
      {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", GgufFix::kNone, K::kAttention},
      {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", GgufFix::kNone, K::kAttention},
      {"self_attn.kv_b_proj.weight", "attn_k_b.weight", GgufFix::kKvB, K::kAttention}};
  // The channel mixer under either module name the checkpoints use (kimi_linear_names()).
  for (const std::string mod : {"block_sparse_moe.", "mlp."})
    r.insert(r.end(), {{mod + "gate.weight", "ffn_gate_inp.weight"},
                       {mod + "gate.e_score_correction_bias", "exp_probs_b.bias"},
                       {mod + "experts.*.w1.weight", "ffn_gate_exps.weight", GgufFix::kExpert},
                       {mod + "experts.*.w3.weight", "ffn_up_exps.weight", GgufFix::kExpert},
                       {mod + "experts.*.w2.weight", "ffn_down_exps.weight", GgufFix::kExpert},
                       {mod + "shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
                       {mod + "shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
                       {mod + "shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
                       {mod + "gate_proj.weight", "ffn_gate.weight"},
                       {mod + "up_proj.weight", "ffn_up.weight"},
                       {mod + "down_proj.weight", "ffn_down.weight"}});
  return r;
}

}  // namespace

namespace model {
extern const GgufMapping kKimiLinearGguf{.model_type = "kimi_linear",
                                         .config = kimi_gguf_config,
                                         .global = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                    {"model.norm.weight", "output_norm.weight"},
                                                    {"lm_head.weight", "output.weight"}},
                                         .layer = kimi_gguf_layer()};
}  // namespace model

ModelConfig parse_kimi_linear_config(const std::string& json_text, const std::string& source) {
  const json top = parse_json(json_text, "config '" + source + "'");
  try {
    return parse(top, source);
  } catch (const json::exception& e) {  // a field of an unexpected type read by get()
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    config_fail(source, "a field has an unexpected JSON type: " + what);
  }
}

namespace model {

extern const ModelFamily kKimiLinearFamily{
    .name = "Kimi Linear",
    .model_types = {"kimi_linear"},
    .architectures = {"KimiLinearForCausalLM"},
    .parse = parse_kimi_linear_config,
    .presets = {{kKimiLinearSlice, kimi_linear_slice}},
    .checkpoint_names = kimi_linear_names(),
    // Kimi's template: <|im_user|>/<|im_assistant|> turns ending in <|im_end|>, [EOS] its
    // tokenizer's end of text; tool calls in <|tool_calls_section_begin|> sections. No fallback:
    // its tokenizer has no ChatML tokens.
    .chat_template = "",
    .stop_tokens = {"<|im_end|>", "[EOS]"},
    .tool_call_format = ToolCallFormat::kKimiSections,
    .gguf_architecture = "kimi-linear",
    .gguf_mapping = &kKimiLinearGguf,
};

}  // namespace model

}  // namespace hanpu
