// Qwen3.5 config.json parsing (nested text_config or flat) and the published model sizes
// (reference-models.md §1.1, §6).
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hanpu/model.hpp"
#include "io/json_io.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error("config '" + source + "': " + what);
}

// Upper bounds on config sizes (docs/RELIABILITY.md): checked before anything loops over layers or
// allocates, and far above every published model (Qwen3.5-9B: 32 layers, vocab 248,320; the
// largest Qwen3-Next: 48 layers, 512 experts), so products of them stay well inside 64 bits.
int64_t config_int_limit(const std::string& key) {
  if (key == "vocab_size") return int64_t{1} << 24;
  if (key == "hidden_size") return int64_t{1} << 16;
  if (key == "num_hidden_layers" || key == "full_attention_interval" || key == "decoder_sparse_step") return 1024;
  if (key == "num_attention_heads" || key == "num_key_value_heads" || key == "linear_num_key_heads" ||
      key == "linear_num_value_heads")
    return 1024;
  if (key == "head_dim" || key == "linear_key_head_dim" || key == "linear_value_head_dim") return 4096;
  if (key == "linear_conv_kernel_dim") return 64;
  if (key == "num_experts" || key == "num_experts_per_tok") return 4096;
  return int64_t{1} << 20;  // intermediate sizes
}

// Text-model fields come from text_config when the config is nested, else from the top level.
struct Fields {
  const json& text;
  const json& top;
  const std::string& source;
  std::string where(const char* key) const { return (&text == &top ? "" : "text_config.") + std::string(key); }

  int64_t required_int(const char* key) const {
    if (!text.contains(key)) fail(source, "field '" + where(key) + "' is missing");
    const json& v = text[key];
    const int64_t limit = config_int_limit(key);
    // Unsigned first (nlohmann stores non-negative literals as unsigned): compare before narrowing.
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(limit)) ||
        v.get<int64_t>() < 1 || v.get<int64_t>() > limit)
      fail(source, "field '" + where(key) + "' is " + json_got(v) + ", expected a positive integer at most " +
                       std::to_string(limit) + " (docs/RELIABILITY.md, input limits)");
    return v.get<int64_t>();
  }
  int64_t optional_int(const char* key, int64_t fallback) const {
    return text.contains(key) && !text[key].is_null() ? required_int(key) : fallback;
  }
  double number(const json& obj, const char* key, const std::string& name) const {
    const json& v = obj[key];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      fail(source, "field '" + name + "' is " + json_got(v) + ", expected a positive number");
    return v.get<double>();
  }
};

}  // namespace

int64_t Qwen35Config::num_gdn_layers() const {
  int64_t n = 0;
  for (bool full : is_full_attention) n += full ? 0 : 1;
  return n;
}

int64_t Qwen35Config::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_layers; ++i) n += layer_is_moe(i) ? 1 : 0;
  return n;
}

int64_t Qwen35Config::parameter_count() const {
  const int64_t H = hidden_size;
  const int64_t attn = H * num_heads * head_dim * 2 + 2 * H * num_kv_heads * head_dim + num_heads * head_dim * H +
                       2 * head_dim;
  const int64_t nv = linear_num_value_heads;
  const int64_t gdn = H * gdn_conv_dim() + H * gdn_value_dim() + 2 * H * nv + gdn_conv_dim() * linear_conv_kernel +
                      2 * nv + linear_value_head_dim + gdn_value_dim() * H;
  const int64_t dense_mlp = 3 * H * intermediate_size;
  const int64_t moe = H * num_experts + num_experts * 3 * H * moe_intermediate_size +
                      (shared_expert_intermediate_size > 0 ? 3 * H * shared_expert_intermediate_size + H : 0);
  int64_t total = 0;
  for (int64_t i = 0; i < num_layers; ++i)
    total += (is_full_attention[static_cast<size_t>(i)] ? attn : gdn) + (layer_is_moe(i) ? moe : dense_mlp) + 2 * H;
  total += vocab_size * H * (tie_word_embeddings ? 1 : 2) + H;
  return total;
}

std::string Qwen35Config::describe() const {
  std::ostringstream os;
  os << model_type << ": " << num_layers << " layers (" << num_gdn_layers() << " GDN + " << num_attention_layers()
     << " attention), hidden " << hidden_size << ", MLP " << intermediate_size;
  if (num_moe_layers() > 0)
    os << ", MoE on " << num_moe_layers() << " layers (" << num_experts << " experts, top-" << num_experts_per_tok
       << " x " << moe_intermediate_size << ", shared " << shared_expert_intermediate_size << ")";
  os << ", vocab " << vocab_size
     << ", attention " << num_heads << "q/" << num_kv_heads << "kv x " << head_dim << " (rope " << rotary_dim
     << " dims, theta " << rope_theta << "), GDN " << linear_num_key_heads << "qk/" << linear_num_value_heads
     << "v x " << linear_key_head_dim << ", " << (tie_word_embeddings ? "tied" : "untied") << " head, "
     << static_cast<double>(parameter_count()) / 1e9 << "B parameters";
  return os.str();
}

namespace {
Qwen35Config parse_config_json(const json& top, const std::string& source);
}

Qwen35Config parse_qwen35_config(const std::string& json_text, const std::string& source) {
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
Qwen35Config parse_config_json(const json& top, const std::string& source) {
  if (!top.is_object()) fail(source, "expected a JSON object");
  const std::string top_type = top.value("model_type", "");
  const bool nested = top.contains("text_config") && top["text_config"].is_object();
  const json& text = nested ? top["text_config"] : top;
  const std::string text_type = text.value("model_type", nested ? "" : top_type);

  auto known = [](const std::string& t) { return t == "qwen3_5" || t == "qwen3_5_text"; };
  const bool next = top_type == "qwen3_next" && (!nested || text_type.empty() || text_type == "qwen3_next");
  if (top_type == "qwen3_5_moe" || text_type == "qwen3_5_moe_text")
    fail(source, "model_type '" + (top_type.empty() ? text_type : top_type) +
                     "' (Qwen3.5 mixture-of-experts) is not supported yet; hanpu runs the dense Qwen3.5 models "
                     "(model_type qwen3_5 / qwen3_5_text) and Qwen3-Next (qwen3_next)");
  if (!next && (!known(top_type) || (nested && !text_type.empty() && !known(text_type))))
    fail(source, "unknown model_type '" + (known(top_type) ? text_type : top_type) +
                     "', expected 'qwen3_5' (nested text_config), 'qwen3_5_text' (flat) or 'qwen3_next'");

  Fields f{text, top, source};
  Qwen35Config c;
  c.model_type = next ? "qwen3_next" : "qwen3_5_text";
  c.fused_gdn_projections = next;
  c.vocab_size = f.required_int("vocab_size");
  c.hidden_size = f.required_int("hidden_size");
  c.intermediate_size = f.required_int("intermediate_size");
  c.num_layers = f.required_int("num_hidden_layers");
  c.num_heads = f.required_int("num_attention_heads");
  c.num_kv_heads = f.required_int("num_key_value_heads");
  c.head_dim = f.optional_int("head_dim", c.hidden_size / c.num_heads);
  c.linear_num_key_heads = f.required_int("linear_num_key_heads");
  c.linear_num_value_heads = f.required_int("linear_num_value_heads");
  c.linear_key_head_dim = f.required_int("linear_key_head_dim");
  c.linear_value_head_dim = f.required_int("linear_value_head_dim");
  c.linear_conv_kernel = f.optional_int("linear_conv_kernel_dim", 4);
  if (text.contains("rms_norm_eps")) c.rms_norm_eps = f.number(text, "rms_norm_eps", f.where("rms_norm_eps"));

  if (c.num_heads % c.num_kv_heads != 0)
    fail(source, "num_attention_heads " + std::to_string(c.num_heads) + " is not a multiple of num_key_value_heads " +
                     std::to_string(c.num_kv_heads));
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    fail(source, "linear_num_value_heads " + std::to_string(c.linear_num_value_heads) +
                     " is not a multiple of linear_num_key_heads " + std::to_string(c.linear_num_key_heads));

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
        c.rope_theta = f.number(rp, "rope_theta", std::string(holder) + ".rope_theta");
        have_theta = true;
      }
      if (rp.contains("partial_rotary_factor"))
        partial = f.number(rp, "partial_rotary_factor", std::string(holder) + ".partial_rotary_factor");
    }
    if (!have_theta && obj->contains("rope_theta")) {
      c.rope_theta = f.number(*obj, "rope_theta", "rope_theta");
      have_theta = true;
    }
    if (obj->contains("partial_rotary_factor"))
      partial = f.number(*obj, "partial_rotary_factor", "partial_rotary_factor");
  }
  if (!have_theta) fail(source, "no rope_theta (looked in rope_parameters and at the top level)");
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)
    fail(source, "partial_rotary_factor " + std::to_string(partial) + " gives " + std::to_string(c.rotary_dim) +
                     " rotary dims of head_dim " + std::to_string(c.head_dim) + ", expected an even count >= 2");

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

  // Qwen3-Next MoE (reference-models.md §1.2, §3.4): layer i is MoE unless listed in mlp_only_layers
  // or (i + 1) is not a multiple of decoder_sparse_step, as Qwen3NextDecoderLayer decides.
  c.is_moe.assign(static_cast<size_t>(c.num_layers), false);
  if (next && text.contains("num_experts") && !text["num_experts"].is_null() && text["num_experts"] != 0) {
    c.num_experts = f.required_int("num_experts");
    c.num_experts_per_tok = f.required_int("num_experts_per_tok");
    c.moe_intermediate_size = f.required_int("moe_intermediate_size");
    c.shared_expert_intermediate_size = text.contains("shared_expert_intermediate_size") &&
                                                text["shared_expert_intermediate_size"] == 0
                                            ? 0
                                            : f.optional_int("shared_expert_intermediate_size", 0);
    if (c.num_experts_per_tok > c.num_experts)
      fail(source, "num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " exceeds num_experts " +
                       std::to_string(c.num_experts));
    if (text.contains("norm_topk_prob")) {
      if (!text["norm_topk_prob"].is_boolean()) fail(source, "field '" + f.where("norm_topk_prob") + "' is not a boolean");
      c.norm_topk_prob = text["norm_topk_prob"].get<bool>();
    }  // absent: true, Qwen3NextConfig's default
    const int64_t step = f.optional_int("decoder_sparse_step", 1);
    std::vector<bool> dense_only(static_cast<size_t>(c.num_layers), false);
    if (text.contains("mlp_only_layers") && !text["mlp_only_layers"].is_null()) {
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
  }

  // Token ids are 32-bit (and non-negative): an id outside that range is an error, never cut.
  auto eos_id = [&](const json& x, const std::string& name) {
    if (!x.is_number_integer() || (x.is_number_unsigned() ? x.get<uint64_t>() > 2147483647u : x.get<int64_t>() < 0))
      fail(source, "field '" + name + "' is " + json_got(x) + ", expected a token id in [0, 2147483647]");
    c.eos_token_ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  };
  for (const json* obj : std::initializer_list<const json*>{&text, &top}) {
    if (!c.eos_token_ids.empty() || !obj->contains("eos_token_id")) continue;
    const std::string name = (obj == &text ? f.where("eos_token_id") : std::string("eos_token_id"));
    const json& e = (*obj)["eos_token_id"];
    if (e.is_null()) continue;
    if (e.is_array()) {
      for (size_t i = 0; i < e.size(); ++i) eos_id(e[i], name + "[" + std::to_string(i) + "]");
    } else {
      eos_id(e, name);
    }
  }
  return c;
}
}  // namespace

namespace {

struct Preset {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, v_heads, intermediate;
  bool tied;
};
// reference-models.md §1.1 (config and model-card values, checked by the parameter-count identity).
constexpr Preset kPresets[] = {
    {"qwen3.5-0.8b", 1024, 24, 8, 2, 16, 3584, true},
    {"qwen3.5-2b", 2048, 24, 8, 2, 16, 6144, true},
    {"qwen3.5-4b", 2560, 32, 16, 4, 32, 9216, true},
    {"qwen3.5-9b", 4096, 32, 16, 4, 32, 12288, false},
};

// A slice of Qwen3-Next-80B-A3B for benchmarks in the memory of a small machine: the real layer
// shapes (reference-models.md §1.2) for one block of 3 GDN + 1 attention layers of the 48, with
// 64 of the 512 experts (the real model's 160 GB of weights do not fit). Per token it does the
// real model's active work per layer (top-10 experts of 512 wide, the shared expert, the 2048 x
// 151936 head); in a prefill each expert gets 8x more tokens than in the full model.
constexpr const char* kQwen3NextSlice = "qwen3-next-80b-a3b-slice";

Qwen35Config qwen3next_slice() {
  Qwen35Config c;
  c.model_type = "qwen3_next";
  c.fused_gdn_projections = true;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 5120;  // in the config, used by no layer (every layer is MoE)
  c.num_layers = 4;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  c.rotary_dim = 64;
  c.rope_theta = 1e7;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel = 4;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.is_full_attention = {false, false, false, true};
  c.num_experts = 64;
  c.num_experts_per_tok = 10;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  c.norm_topk_prob = true;
  c.is_moe.assign(4, true);
  c.eos_token_ids = {151645, 151643};
  return c;
}

}  // namespace

std::vector<std::string> qwen35_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  names.emplace_back(kQwen3NextSlice);
  return names;
}

Qwen35Config qwen35_preset(const std::string& name) {
  if (name == kQwen3NextSlice) return qwen3next_slice();
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    Qwen35Config c;
    c.model_type = "qwen3_5_text";
    c.vocab_size = 248320;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.head_dim = 256;
    c.rotary_dim = 64;
    c.rope_theta = 1e7;
    c.linear_num_key_heads = 16;
    c.linear_num_value_heads = p.v_heads;
    c.linear_key_head_dim = 128;
    c.linear_value_head_dim = 128;
    c.linear_conv_kernel = 4;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = p.tied;
    for (int64_t i = 0; i < p.layers; ++i) c.is_full_attention.push_back((i + 1) % 4 == 0);
    c.eos_token_ids = {248044, 248046};
    return c;
  }
  std::string names;
  for (const Preset& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  names += std::string(", ") + kQwen3NextSlice;
  throw Error("unknown model size '" + name + "', expected one of " + names);
}

}  // namespace hanpu
