// The Qwen families (docs/MODEL.md): their registry rows (Qwen3.5 dense, Qwen3.5-MoE, Qwen3-Next),
// the config.json parser they share (nested text_config or flat), and their presets.
#include <cmath>
#include <nlohmann/json.hpp>

#include "hanpu/model_family.hpp"
#include "io/json_io.hpp"
#include "model/config_fields.hpp"

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

}  // namespace

namespace model {

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
};

}  // namespace model

}  // namespace hanpu
