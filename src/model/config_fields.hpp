// Reading config.json fields with errors that name the file and the field (every family's parser
// uses these). Internal to src/model.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "hanpu/model.hpp"
#include "hanpu/tensor.hpp"
#include "io/json_io.hpp"

namespace hanpu::model {

[[noreturn]] inline void config_fail(const std::string& source, const std::string& what) {
  throw Error("config '" + source + "': " + what);
}

// Upper bounds on config sizes (docs/RELIABILITY.md): checked before anything loops over layers or
// allocates, and far above every published model (Qwen3.5-9B: 32 layers, vocab 248,320; the
// largest Qwen3-Next: 48 layers, 512 experts; Kimi Linear: 163,840 vocab, 256 experts), so products
// of them stay well inside 64 bits.
inline int64_t config_int_limit(const std::string& key) {
  if (key == "vocab_size") return int64_t{1} << 24;
  if (key == "hidden_size") return int64_t{1} << 16;
  if (key == "num_hidden_layers" || key == "full_attention_interval" || key == "decoder_sparse_step") return 1024;
  if (key == "num_attention_heads" || key == "num_key_value_heads" || key == "linear_num_key_heads" ||
      key == "linear_num_value_heads" || key == "linear_num_heads" || key == "num_heads")
    return 1024;
  if (key.find("head_dim") != std::string::npos || key.find("lora_rank") != std::string::npos) return 4096;
  if (key == "linear_conv_kernel_dim" || key == "short_conv_kernel_size") return 64;
  if (key == "num_experts" || key == "num_experts_per_tok" || key == "num_experts_per_token" ||
      key == "num_local_experts" || key == "n_routed_experts" || key == "num_expert_group" || key == "n_group" ||
      key == "topk_group" || key == "num_shared_experts" || key == "n_shared_experts")
    return 4096;
  return int64_t{1} << 20;  // intermediate sizes
}

// Text-model fields come from text_config when the config is nested, else from the top level.
struct ConfigFields {
  const nlohmann::json& text;
  const nlohmann::json& top;
  const std::string& source;
  std::string where(const char* key) const { return (&text == &top ? "" : "text_config.") + std::string(key); }

  bool present(const char* key) const { return text.contains(key) && !text[key].is_null(); }
  int64_t required_int(const char* key) const {
    if (!text.contains(key)) config_fail(source, "field '" + where(key) + "' is missing");
    return int_value(text[key], key, where(key));
  }
  int64_t optional_int(const char* key, int64_t fallback) const {
    return present(key) ? required_int(key) : fallback;
  }
  // A positive integer at most config_int_limit(key), named `name` in errors.
  int64_t int_value(const nlohmann::json& v, const std::string& key, const std::string& name) const {
    const int64_t limit = config_int_limit(key);
    // Unsigned first (nlohmann stores non-negative literals as unsigned): compare before narrowing.
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(limit)) ||
        v.get<int64_t>() < 1 || v.get<int64_t>() > limit)
      config_fail(source, "field '" + name + "' is " + json_got(v) + ", expected a positive integer at most " +
                              std::to_string(limit) + " (docs/RELIABILITY.md, input limits)");
    return v.get<int64_t>();
  }
  double number(const nlohmann::json& obj, const char* key, const std::string& name) const {
    const nlohmann::json& v = obj[key];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      config_fail(source, "field '" + name + "' is " + json_got(v) + ", expected a positive number");
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    if (!text[key].is_boolean()) config_fail(source, "field '" + where(key) + "' is " + json_got(text[key]) + ", expected a boolean");
    return text[key].get<bool>();
  }
};

/// The first of `keys` present (and not null) in `obj`: aliases of one setting, as configs spell
/// them differently (num_experts_per_token / num_experts_per_tok); nullptr when none is.
inline const char* first_present(const nlohmann::json& obj, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (obj.contains(k) && !obj[k].is_null()) return k;
  return nullptr;
}

/// eos_token_id (a number or a list) of `text`, else of `top`, as 32-bit non-negative ids.
std::vector<int32_t> read_eos_token_ids(const ConfigFields& f);

/// The fields the KDA + MLA families (Kimi Linear, Ling 3.0) share: model type, mixers, the plain
/// `weight * normed` RMSNorm, sizes, rms_norm_eps (default `default_eps`), tied embeddings, and
/// the options both refuse (an activation other than silu, biased MLA projections). `family`
/// names the model in errors ("Kimi Linear").
void read_kda_mla_decoder_fields(const ConfigFields& f, ModelConfig& c, const char* model_type, const char* family,
                                 double default_eps);

}  // namespace hanpu::model
