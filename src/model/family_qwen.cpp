// The Qwen families (docs/MODEL.md): their registry rows (Qwen3.5 dense, Qwen3.5-MoE, Qwen3-Next),
// the config.json parser they share (nested text_config or flat), and their presets.
#include <cmath>
#include <nlohmann/json.hpp>

#include "hanpu/model_family.hpp"
#include "io/json_io.hpp"
#include "model/config_fields.hpp"
#include "model/gguf_arch.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;
using model::ConfigFields;

[[noreturn]] void fail(const std::string& source, const std::string& what) { model::config_fail(source, what); }

ModelConfig parse_config_json(const json& top, const std::string& source);

}  // namespace

ModelConfig parse_qwen_config(const std::string& json_text, const std::string& source) {
  // The project's JSON layer (io/json_io.hpp): nesting limited, duplicate keys rejected.
  const json top = parse_json(json_text, "config '" + source + "'");
  try {
    return parse_config_json(top, source);
  } catch (const json::exception& e) {  // a field of an unexpected type read by value()/get()
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    fail(source, "a field has an unexpected JSON type: " + what);
  }
}

namespace {
ModelConfig parse_config_json(const json& top, const std::string& source) {
  if (!top.is_object()) fail(source, "expected a JSON object");
  const std::string top_type = top.value("model_type", "");
  const bool nested = top.contains("text_config") && top["text_config"].is_object();
  const json& text = nested ? top["text_config"] : top;
  const std::string text_type = text.value("model_type", nested ? "" : top_type);

  // Qwen3.5 dense and MoE: nested (qwen3_5 / qwen3_5_moe with a text_config) or flat (*_text).
  auto dense = [](const std::string& t) { return t == "qwen3_5" || t == "qwen3_5_text"; };
  auto moe = [](const std::string& t) { return t == "qwen3_5_moe" || t == "qwen3_5_moe_text"; };
  const bool next = top_type == "qwen3_next" && (!nested || text_type.empty() || text_type == "qwen3_next");
  const bool q35_moe = moe(top_type) && (!nested || text_type.empty() || moe(text_type));
  const bool q35 = dense(top_type) && (!nested || text_type.empty() || dense(text_type));
  if (!next && !q35 && !q35_moe && (dense(top_type) || moe(top_type) || top_type == "qwen3_next"))
    fail(source, "model_type '" + top_type + "' with text_config.model_type '" + text_type +
                     "': the text model's type does not belong to it");
  if (!next && !q35 && !q35_moe)
    fail(source, "unknown model_type '" + printable(top_type) + "', expected one of " + known_model_types());

  ConfigFields f{text, top, source};
  ModelConfig c;
  c.model_type = next ? "qwen3_next" : q35_moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  c.gdn.fused_projections = next;
  c.vocab_size = f.required_int("vocab_size");
  c.hidden_size = f.required_int("hidden_size");
  // Qwen3.5-MoE has no dense MLP (every layer is MoE): no intermediate_size.
  c.mlp.intermediate_size = q35_moe ? f.optional_int("intermediate_size", 0) : f.required_int("intermediate_size");
  c.num_layers = f.required_int("num_hidden_layers");
  c.attention.num_heads = f.required_int("num_attention_heads");
  c.attention.num_kv_heads = f.required_int("num_key_value_heads");
  // Absent: 256, the dataclass default of transformers 5.24's Qwen3_5TextConfig, Qwen3_5MoeTextConfig
  // and Qwen3NextConfig (not hidden_size / num_attention_heads, which those classes never derive).
  c.attention.head_dim = f.optional_int("head_dim", 256);
  c.gdn.num_key_heads = f.required_int("linear_num_key_heads");
  c.gdn.num_value_heads = f.required_int("linear_num_value_heads");
  c.gdn.key_head_dim = f.required_int("linear_key_head_dim");
  c.gdn.value_head_dim = f.required_int("linear_value_head_dim");
  c.gdn.conv_kernel = f.optional_int("linear_conv_kernel_dim", 4);
  if (text.contains("rms_norm_eps")) c.rms_norm_eps = f.number(text, "rms_norm_eps", f.where("rms_norm_eps"));

  if (c.attention.num_heads % c.attention.num_kv_heads != 0)
    fail(source, "num_attention_heads " + std::to_string(c.attention.num_heads) + " is not a multiple of num_key_value_heads " +
                     std::to_string(c.attention.num_kv_heads));
  if (c.gdn.num_value_heads % c.gdn.num_key_heads != 0)
    fail(source, "linear_num_value_heads " + std::to_string(c.gdn.num_value_heads) +
                     " is not a multiple of linear_num_key_heads " + std::to_string(c.gdn.num_key_heads));

  // RoPE: rope_parameters (transformers v5) or the older top-level keys.
  double partial = 0.25;
  bool have_theta = false;
  for (const json* obj : std::initializer_list<const json*>{&text, &top}) {
    for (const char* holder : {"rope_parameters", "rope_scaling"}) {
      if (!obj->contains(holder) || !(*obj)[holder].is_object()) continue;
      const json& rp = (*obj)[holder];
      const std::string type = rp.value("rope_type", rp.value("type", "default"));
      if (type != "default" && type != "mrope")
        fail(source, std::string(holder) + ".rope_type '" + type + "' is not supported (expected 'default')");
      if (!have_theta && rp.contains("rope_theta")) {
        c.attention.rope_theta = f.number(rp, "rope_theta", std::string(holder) + ".rope_theta");
        have_theta = true;
      }
      if (rp.contains("partial_rotary_factor"))
        partial = f.number(rp, "partial_rotary_factor", std::string(holder) + ".partial_rotary_factor");
    }
    if (!have_theta && obj->contains("rope_theta")) {
      c.attention.rope_theta = f.number(*obj, "rope_theta", "rope_theta");
      have_theta = true;
    }
    if (obj->contains("partial_rotary_factor"))
      partial = f.number(*obj, "partial_rotary_factor", "partial_rotary_factor");
  }
  if (!have_theta) fail(source, "no rope_theta (looked in rope_parameters and at the top level)");
  c.attention.rotary_dim = static_cast<int64_t>(static_cast<double>(c.attention.head_dim) * partial);
  if (c.attention.rotary_dim < 2 || c.attention.rotary_dim % 2 != 0 || c.attention.rotary_dim > c.attention.head_dim)
    fail(source, "partial_rotary_factor " + std::to_string(partial) + " gives " + std::to_string(c.attention.rotary_dim) +
                     " rotary dims of head_dim " + std::to_string(c.attention.head_dim) + ", expected an even count >= 2");

  // The class whose config this is decides tying: the top level for a nested config.
  const json& tie_src = top.contains("tie_word_embeddings") ? top : text;
  if (tie_src.contains("tie_word_embeddings")) {
    if (!tie_src["tie_word_embeddings"].is_boolean()) fail(source, "field 'tie_word_embeddings' is not a boolean");
    c.tie_word_embeddings = tie_src["tie_word_embeddings"].get<bool>();
  }

  if (text.contains("layer_types") && !text["layer_types"].is_null()) {
    const json& lt = text["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers)
      fail(source, "field '" + f.where("layer_types") + "' must be a list of " + std::to_string(c.num_layers) +
                       " entries (num_hidden_layers), found " + json_got(lt));
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : json_summary(lt[i]);
      if (t != "full_attention" && t != "linear_attention")
        fail(source, f.where("layer_types") + "[" + std::to_string(i) + "] is '" + t +
                         "', expected 'full_attention' or 'linear_attention'");
      c.is_full_attention.push_back(t == "full_attention");
    }
  } else {
    const int64_t interval = f.optional_int("full_attention_interval", 4);
    for (int64_t i = 0; i < c.num_layers; ++i) c.is_full_attention.push_back((i + 1) % interval == 0);
  }

  // Qwen3-Next MoE (docs/MODEL.md): layer i is MoE unless listed in mlp_only_layers
  // or (i + 1) is not a multiple of decoder_sparse_step, as Qwen3NextDecoderLayer decides.
  // Qwen3.5-MoE (Qwen3_5MoeDecoderLayer): every layer is MoE, the top-k always renormalised, the
  // shared expert always there with its sigmoid gate.
  c.is_moe.assign(static_cast<size_t>(c.num_layers), false);
  const bool has_experts = text.contains("num_experts") && !text["num_experts"].is_null() && text["num_experts"] != 0;
  if (q35_moe || (next && has_experts)) {
    c.moe.num_experts = f.required_int("num_experts");
    c.moe.num_experts_per_tok = f.required_int("num_experts_per_tok");
    c.moe.intermediate_size = f.required_int("moe_intermediate_size");
    c.moe.shared_expert_intermediate_size = q35_moe ? f.required_int("shared_expert_intermediate_size")
                                        : text.contains("shared_expert_intermediate_size") &&
                                                text["shared_expert_intermediate_size"] == 0
                                            ? 0
                                            : f.optional_int("shared_expert_intermediate_size", 0);
    if (c.moe.num_experts_per_tok > c.moe.num_experts)
      fail(source, "num_experts_per_tok " + std::to_string(c.moe.num_experts_per_tok) + " exceeds num_experts " +
                       std::to_string(c.moe.num_experts));
    if (next) c.moe.norm_topk_prob = f.boolean("norm_topk_prob", true);  // absent: true, Qwen3NextConfig's default
    const int64_t step = next ? f.optional_int("decoder_sparse_step", 1) : 1;
    std::vector<bool> dense_only(static_cast<size_t>(c.num_layers), false);
    if (next && text.contains("mlp_only_layers") && !text["mlp_only_layers"].is_null()) {
      const json& ml = text["mlp_only_layers"];
      if (!ml.is_array()) fail(source, "field '" + f.where("mlp_only_layers") + "' is " + json_got(ml) + ", expected a list");
      for (const json& x : ml) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_layers)
          fail(source, "field '" + f.where("mlp_only_layers") + "' holds " + json_got(x) + ", expected layer indices in [0, " +
                           std::to_string(c.num_layers) + ")");
        dense_only[static_cast<size_t>(x.get<int64_t>())] = true;
      }
    }
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.is_moe[static_cast<size_t>(i)] = !dense_only[static_cast<size_t>(i)] && (i + 1) % step == 0;
    if (c.num_moe_layers() < c.num_layers && c.mlp.intermediate_size < 1)
      fail(source, "field '" + f.where("intermediate_size") + "' is missing (needed by the dense MLP layers)");
  }

  c.eos_token_ids = model::read_eos_token_ids(f);
  c.check();
  return c;
}

}  // namespace

namespace {

struct Preset {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, v_heads, intermediate;
  bool tied;
};
// docs/MODEL.md (config and model-card values, checked by the parameter-count identity).
constexpr Preset kPresets[] = {
    {"qwen3.5-0.8b", 1024, 24, 8, 2, 16, 3584, true},
    {"qwen3.5-2b", 2048, 24, 8, 2, 16, 6144, true},
    {"qwen3.5-4b", 2560, 32, 16, 4, 32, 9216, true},
    {"qwen3.5-9b", 4096, 32, 16, 4, 32, 12288, false},
};

// A slice of Qwen3-Next-80B-A3B for benchmarks in the memory of a small machine: the real layer
// shapes (docs/MODEL.md) for one block of 3 GDN + 1 attention layers of the 48, with
// 64 of the 512 experts (the real model's 160 GB of weights do not fit). Per token it does the
// real model's active work per layer (top-10 experts of 512 wide, the shared expert, the 2048 x
// 151936 head); in a prefill each expert gets 8x more tokens than in the full model.
constexpr const char* kQwen3NextSlice = "qwen3-next-80b-a3b-slice";

ModelConfig qwen3next_slice() {
  ModelConfig c;
  c.model_type = "qwen3_next";
  c.gdn.fused_projections = true;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.mlp.intermediate_size = 5120;  // in the config, used by no layer (every layer is MoE)
  c.num_layers = 4;
  c.attention.num_heads = 16;
  c.attention.num_kv_heads = 2;
  c.attention.head_dim = 256;
  c.attention.rotary_dim = 64;
  c.attention.rope_theta = 1e7;
  c.gdn.num_key_heads = 16;
  c.gdn.num_value_heads = 32;
  c.gdn.key_head_dim = 128;
  c.gdn.value_head_dim = 128;
  c.gdn.conv_kernel = 4;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.is_full_attention = {false, false, false, true};
  c.moe.num_experts = 64;
  c.moe.num_experts_per_tok = 10;
  c.moe.intermediate_size = 512;
  c.moe.shared_expert_intermediate_size = 512;
  c.moe.norm_topk_prob = true;
  c.is_moe.assign(4, true);
  c.eos_token_ids = {151645, 151643};
  return c;
}

// A slice of Qwen3.5-35B-A3B with the shapes of transformers 5.24's Qwen3_5MoeTextConfig defaults
// (whose docstring names that checkpoint; no official config was read): hidden 2048, GDN 16 qk /
// 32 v heads of 128, attention 16q/2kv x 256, 256 experts top-8 of 512 plus a shared expert of 512,
// vocabulary 248320, untied. One 3 GDN + 1 attention block of the 40 layers, 64 of the 256 experts.
constexpr const char* kQwen35MoeSlice = "qwen3.5-35b-a3b-slice";

ModelConfig qwen35_moe_slice() {
  ModelConfig c;
  c.model_type = "qwen3_5_moe_text";
  c.vocab_size = 248320;
  c.hidden_size = 2048;
  c.num_layers = 4;
  c.attention.num_heads = 16;
  c.attention.num_kv_heads = 2;
  c.attention.head_dim = 256;
  c.attention.rotary_dim = 64;
  c.attention.rope_theta = 10000.0;  // the config default; it does not change the work
  c.gdn.num_key_heads = 16;
  c.gdn.num_value_heads = 32;
  c.gdn.key_head_dim = 128;
  c.gdn.value_head_dim = 128;
  c.gdn.conv_kernel = 4;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.is_full_attention = {false, false, false, true};
  c.moe.num_experts = 64;
  c.moe.num_experts_per_tok = 8;
  c.moe.intermediate_size = 512;
  c.moe.shared_expert_intermediate_size = 512;
  c.moe.norm_topk_prob = true;
  c.is_moe.assign(4, true);
  c.eos_token_ids = {248044, 248046};
  return c;
}

// A Qwen3.5 dense model of a published size: every fourth layer full attention.
ModelConfig qwen35_dense(const Preset& p) {
  ModelConfig c;
  c.model_type = "qwen3_5_text";
  c.vocab_size = 248320;
  c.hidden_size = p.hidden;
  c.mlp.intermediate_size = p.intermediate;
  c.num_layers = p.layers;
  c.attention.num_heads = p.heads;
  c.attention.num_kv_heads = p.kv_heads;
  c.attention.head_dim = 256;
  c.attention.rotary_dim = 64;
  c.attention.rope_theta = 1e7;
  c.gdn.num_key_heads = 16;
  c.gdn.num_value_heads = p.v_heads;
  c.gdn.key_head_dim = 128;
  c.gdn.value_head_dim = 128;
  c.gdn.conv_kernel = 4;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = p.tied;
  for (int64_t i = 0; i < p.layers; ++i) c.is_full_attention.push_back((i + 1) % 4 == 0);
  c.eos_token_ids = {248044, 248046};
  return c;
}


// ---- GGUF mappings (llama.cpp's qwen35, qwen35moe, qwen3next; model/gguf_arch.hpp) ---------------
// Keys: Qwen3NextModel.set_gguf_parameters in llama.cpp's conversion/qwen.py (the qwen35 classes
// derive from it), Qwen2MoeModel's expert keys, TextModel's shared ones (conversion/base.py).

using ojson = nlohmann::ordered_json;
using model::GgufFix;
using model::GgufTensorRule;
namespace gguf_meta = model::gguf_meta;

// The keys all three share: embedding, attention, GDN geometry, RoPE and the layer pattern.
void qwen_gguf_common(const GgufFile& f, const std::string& a, ojson& c) {
  const uint64_t n_layer = gguf_meta::main_layers(f, a);
  c["hidden_size"] = f.get_uint(a + ".embedding_length");
  if (f.find(a + ".feed_forward_length")) c["intermediate_size"] = f.get_uint(a + ".feed_forward_length");
  c["num_hidden_layers"] = n_layer;
  c["num_attention_heads"] = f.get_uint(a + ".attention.head_count");
  c["num_key_value_heads"] = f.get_uint(a + ".attention.head_count_kv");
  const uint64_t head_dim = f.get_uint(a + ".attention.key_length");
  if (const auto v = gguf_meta::optional_uint(f, a + ".attention.value_length"); v && *v != head_dim)
    gguf_meta::fail_key(f, a + ".attention.value_length", std::to_string(*v),
                        std::to_string(head_dim) + " (key_length: hanpu's gated attention has one head_dim)");
  c["head_dim"] = head_dim;
  const uint64_t nk = f.get_uint(a + ".ssm.group_count"), nv = f.get_uint(a + ".ssm.time_step_rank");
  const uint64_t inner = f.get_uint(a + ".ssm.inner_size");
  if (nv == 0 || inner % nv != 0)
    gguf_meta::fail_key(f, a + ".ssm.inner_size", std::to_string(inner),
                        "a multiple of " + a + ".ssm.time_step_rank (" + std::to_string(nv) + ", the value heads)");
  c["linear_num_key_heads"] = nk;
  c["linear_num_value_heads"] = nv;
  c["linear_key_head_dim"] = f.get_uint(a + ".ssm.state_size");
  c["linear_value_head_dim"] = inner / nv;
  c["linear_conv_kernel_dim"] = f.get_uint(a + ".ssm.conv_kernel");
  c["rms_norm_eps"] = f.get_float(a + ".attention.layer_norm_rms_epsilon");
  const uint64_t rot = f.get_uint(a + ".rope.dimension_count");
  c["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", f.get_float(a + ".rope.freq_base")},
                          {"partial_rotary_factor", static_cast<double>(rot) / static_cast<double>(head_dim)}};
  c["layer_types"] = gguf_meta::layer_types_from_recurrent(f, a, n_layer);
}

void qwen_gguf_experts(const GgufFile& f, const std::string& a, ojson& c) {
  c["num_experts"] = f.get_uint(a + ".expert_count");
  c["num_experts_per_tok"] = f.get_uint(a + ".expert_used_count");
  c["moe_intermediate_size"] = f.get_uint(a + ".expert_feed_forward_length");
  c["shared_expert_intermediate_size"] = f.get_uint(a + ".expert_shared_feed_forward_length");
}

// Qwen3.5 (dense): Qwen3_5TextModel.
void qwen35_gguf_config(const GgufModel& m, const std::string& a, ojson& c) { qwen_gguf_common(m.main(), a, c); }

// Qwen3.5-MoE: Qwen3_5MoeTextModel (every layer MoE).
void qwen35moe_gguf_config(const GgufModel& m, const std::string& a, ojson& c) {
  qwen_gguf_common(m.main(), a, c);
  c.erase("intermediate_size");  // every layer is MoE; a dense size may be absent or meaningless
  qwen_gguf_experts(m.main(), a, c);
}

// Qwen3-Next: Qwen3NextModel. GGUF has no key for mlp_only_layers (llama.cpp's qwen3next makes
// every layer MoE, as the published checkpoints are); a layer without ffn_gate_inp is read as a
// dense MLP layer (ffn_gate / ffn_up / ffn_down, feed_forward_length), so that checkpoints with
// mlp_only_layers convert without loss.
void qwen3next_gguf_config(const GgufModel& m, const std::string& a, ojson& c) {
  const GgufFile& f = m.main();
  qwen_gguf_common(f, a, c);
  qwen_gguf_experts(f, a, c);
  if (const auto norm = gguf_meta::optional_bool(f, a + ".expert_weights_norm")) c["norm_topk_prob"] = *norm;
  ojson dense = ojson::array();
  for (uint64_t i = 0; i < c["num_hidden_layers"].get<uint64_t>(); ++i)
    if (!m.find_tensor("blk." + std::to_string(i) + ".ffn_gate_inp.weight")) dense.push_back(i);
  c["mlp_only_layers"] = dense;
}

// The file stores Qwen3-Next's fused in_proj_qkvz / in_proj_ba split (Qwen3NextModel.modify_tensors:
// attn_qkv and attn_gate in plain head order; ssm_ba stays fused and is split by rows on load).
void qwen3next_gguf_adjust(ModelConfig& c) { c.gdn.fused_projections = false; }

const std::vector<GgufTensorRule> kQwenGgufGlobal = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                     {"model.norm.weight", "output_norm.weight", GgufFix::kNormMinusOne},
                                                     {"lm_head.weight", "output.weight"}};

// Norms, full attention (q_proj holds [query | gate] per head, as in HF) and the GDN tensors both
// conversions store alike.
std::vector<GgufTensorRule> qwen_gguf_layer_common() {
  return {{"input_layernorm.weight", "attn_norm.weight", GgufFix::kNormMinusOne},
          {"post_attention_layernorm.weight", "post_attention_norm.weight", GgufFix::kNormMinusOne},
          {"linear_attn.norm.weight", "ssm_norm.weight"},
          {"self_attn.q_proj.weight", "attn_q.weight"},
          {"self_attn.k_proj.weight", "attn_k.weight"},
          {"self_attn.v_proj.weight", "attn_v.weight"},
          {"self_attn.o_proj.weight", "attn_output.weight"},
          {"self_attn.q_norm.weight", "attn_q_norm.weight", GgufFix::kNormMinusOne},
          {"self_attn.k_norm.weight", "attn_k_norm.weight", GgufFix::kNormMinusOne}};
}

std::vector<GgufTensorRule> qwen_gguf_dense_mlp() {
  return {{"mlp.gate_proj.weight", "ffn_gate.weight"},
          {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
}

std::vector<GgufTensorRule> qwen_gguf_moe() {
  return {{"mlp.gate.weight", "ffn_gate_inp.weight"},
          {"mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", GgufFix::kExpert},
          {"mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", GgufFix::kExpert},
          {"mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", GgufFix::kExpert},
          {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
          {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
          {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
          {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", GgufFix::kSqueezed}};
}

// Qwen3.5's GDN tensors: value heads tiled (_LinearAttentionVReorderBase), A_log as -exp(A_log),
// conv squeezed.
std::vector<GgufTensorRule> qwen35_gguf_layer(std::vector<GgufTensorRule> mlp) {
  std::vector<GgufTensorRule> r = qwen_gguf_layer_common();
  r.insert(r.end(), {{"linear_attn.in_proj_qkv.weight", "attn_qkv.weight", GgufFix::kQkvRows},
                     {"linear_attn.in_proj_z.weight", "attn_gate.weight", GgufFix::kZRows},
                     {"linear_attn.in_proj_b.weight", "ssm_beta.weight", GgufFix::kBetaAlphaRows},
                     {"linear_attn.in_proj_a.weight", "ssm_alpha.weight", GgufFix::kBetaAlphaRows},
                     {"linear_attn.conv1d.weight", "ssm_conv1d.weight", GgufFix::kConv},
                     {"linear_attn.dt_bias", "ssm_dt.bias", GgufFix::kDtBias},
                     {"linear_attn.A_log", "ssm_a", GgufFix::kALog},
                     {"linear_attn.out_proj.weight", "ssm_out.weight", GgufFix::kOutCols}});
  r.insert(r.end(), mlp.begin(), mlp.end());
  return r;
}

// Qwen3-Next's: no value-head reorder; in_proj_qkvz split into attn_qkv ([q | k | v], HF head
// order) and attn_gate (z); in_proj_ba kept fused as ssm_ba.
std::vector<GgufTensorRule> qwen3next_gguf_layer() {
  std::vector<GgufTensorRule> r = qwen_gguf_layer_common();
  r.insert(r.end(), {{"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
                     {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
                     {"linear_attn.in_proj_b.weight", "ssm_ba.weight", GgufFix::kBetaOfBa},
                     {"linear_attn.in_proj_a.weight", "ssm_ba.weight", GgufFix::kAlphaOfBa},
                     {"linear_attn.conv1d.weight", "ssm_conv1d.weight", GgufFix::kConv},
                     {"linear_attn.dt_bias", "ssm_dt.bias", GgufFix::kDtBias},
                     {"linear_attn.A_log", "ssm_a", GgufFix::kALog},
                     {"linear_attn.out_proj.weight", "ssm_out.weight"}});
  const std::vector<GgufTensorRule> moe = qwen_gguf_moe(), dense = qwen_gguf_dense_mlp();
  r.insert(r.end(), moe.begin(), moe.end());
  r.insert(r.end(), dense.begin(), dense.end());
  return r;
}

}  // namespace

namespace model {

extern const GgufMapping kQwen35Gguf{.model_type = "qwen3_5_text",
                                     .config = qwen35_gguf_config,
                                     .global = kQwenGgufGlobal,
                                     .layer = qwen35_gguf_layer(qwen_gguf_dense_mlp()),
                                     .tiled_value_heads = true};
extern const GgufMapping kQwen35MoeGguf{.model_type = "qwen3_5_moe_text",
                                        .config = qwen35moe_gguf_config,
                                        .global = kQwenGgufGlobal,
                                        .layer = qwen35_gguf_layer(qwen_gguf_moe()),
                                        .tiled_value_heads = true};
extern const GgufMapping kQwen3NextGguf{.model_type = "qwen3_next",
                                        .config = qwen3next_gguf_config,
                                        .global = kQwenGgufGlobal,
                                        .layer = qwen3next_gguf_layer(),
                                        .tiled_value_heads = false,
                                        .adjust = qwen3next_gguf_adjust};

extern const ModelFamily kQwen35Family{
    .name = "Qwen3.5",
    .model_types = {"qwen3_5", "qwen3_5_text"},
    .architectures = {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"},
    .parse = parse_qwen_config,
    .presets = [] {
      std::vector<ModelPreset> out;
      for (const Preset& p : kPresets) out.push_back({p.name, [p] { return qwen35_dense(p); }});
      return out;
    }(),
    .checkpoint_names = {},
    // Qwen3.5's template: ChatML turns ending in <|im_end|>; tool calls as XML parameters in
    // <tool_call> tags ("Qwen3-Coder" style).
    .chat_template = "chatml",
    .stop_tokens = {"<|im_end|>", "<|endoftext|>"},
    .tool_call_format = ToolCallFormat::kXmlTags,
    .gguf_architecture = "qwen35",
    .gguf_mapping = &kQwen35Gguf,
};

extern const ModelFamily kQwen35MoeFamily{
    .name = "Qwen3.5-MoE",
    .model_types = {"qwen3_5_moe", "qwen3_5_moe_text"},
    .architectures = {"Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"},
    .parse = parse_qwen_config,
    .presets = {{kQwen35MoeSlice, qwen35_moe_slice}},
    .checkpoint_names = {},
    // Qwen3.5's template: ChatML turns ending in <|im_end|>; tool calls as XML parameters in
    // <tool_call> tags ("Qwen3-Coder" style).
    .chat_template = "chatml",
    .stop_tokens = {"<|im_end|>", "<|endoftext|>"},
    .tool_call_format = ToolCallFormat::kXmlTags,
    .gguf_architecture = "qwen35moe",
    .gguf_mapping = &kQwen35MoeGguf,
};

extern const ModelFamily kQwen3NextFamily{
    .name = "Qwen3-Next",
    .model_types = {"qwen3_next"},
    .architectures = {"Qwen3NextForCausalLM"},
    .parse = parse_qwen_config,
    .presets = {{kQwen3NextSlice, qwen3next_slice}},
    .checkpoint_names = {},
    // Qwen3-Next's template: ChatML turns; tool calls as JSON in <tool_call> tags (Hermes style).
    .chat_template = "chatml",
    .stop_tokens = {"<|im_end|>", "<|endoftext|>"},
    .tool_call_format = ToolCallFormat::kJsonTags,
    .gguf_architecture = "qwen3next",
    .gguf_mapping = &kQwen3NextGguf,
};

}  // namespace model

}  // namespace hanpu
