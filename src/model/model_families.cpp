// The model-family registry (include/hanpu/model_family.hpp): the list of families, the lookup by
// model_type / architectures, and what goes through it: parse_model_config and the presets.
// Each row lives in its family's file (family_*.cpp) with its parser and presets.
#include <nlohmann/json.hpp>

#include "hanpu/model_family.hpp"
#include "io/json_io.hpp"
#include "model/config_fields.hpp"

namespace hanpu {

namespace model {
// The rows, one per family (family_*.cpp).
extern const ModelFamily kQwen35Family, kQwen35MoeFamily, kQwen3NextFamily;  // family_qwen.cpp
extern const ModelFamily kKimiLinearFamily;                                   // family_kimi_linear.cpp
extern const ModelFamily kBailingHybridFamily;                                // family_bailing_hybrid.cpp
}  // namespace model

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families{
      &model::kQwen35Family, &model::kQwen3NextFamily, &model::kQwen35MoeFamily, &model::kKimiLinearFamily,
      &model::kBailingHybridFamily};
  return families;
}

const ModelFamily* find_model_family(std::string_view model_type, const std::vector<std::string>& architectures) {
  for (const ModelFamily* f : model_families()) {
    if (!model_type.empty()) {
      for (const std::string& t : f->model_types)
        if (t == model_type) return f;
      continue;
    }
    for (const std::string& a : architectures)
      for (const std::string& known : f->architectures)
        if (a == known) return f;
  }
  return nullptr;
}

std::string known_model_types() {
  std::string out;
  for (const ModelFamily* f : model_families()) {
    if (!out.empty()) out += ", ";
    for (size_t i = 0; i < f->model_types.size(); ++i) out += (i ? ", '" : "'") + f->model_types[i] + "'";
    out += " (" + f->name + ")";
  }
  return out;
}

const ModelFamily& model_family(const ModelConfig& config) {
  const ModelFamily* f = find_model_family(config.model_type);
  if (!f) throw Error("model description: unknown model_type '" + config.model_type + "', expected one of " + known_model_types());
  return *f;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  // The project's JSON layer (io/json_io.hpp): nesting limited, duplicate keys rejected.
  const nlohmann::json top = parse_json(json_text, "config '" + source + "'");
  if (!top.is_object()) model::config_fail(source, "expected a JSON object");
  const std::string type = top.contains("model_type") && top["model_type"].is_string() ? top["model_type"].get<std::string>() : "";
  // A config without model_type names its architecture only (Ling's BailingMoeV3ForCausalLM).
  std::vector<std::string> architectures;
  if (type.empty() && top.contains("architectures") && top["architectures"].is_array())
    for (const nlohmann::json& a : top["architectures"])
      if (a.is_string()) architectures.push_back(a.get<std::string>());
  const ModelFamily* f = find_model_family(type, architectures);
  if (!f)
    model::config_fail(source, "unknown model_type '" + printable(type) + "', expected one of " + known_model_types() +
                                   (type.empty() ? " (or architectures naming one of those families)" : ""));
  return f->parse(json_text, source);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families())
    for (const ModelPreset& p : f->presets) names.push_back(p.name);
  return names;
}

ModelConfig model_preset(const std::string& name) {
  for (const ModelFamily* f : model_families())
    for (const ModelPreset& p : f->presets)
      if (p.name == name) return p.make();
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown model size '" + name + "', expected one of " + names);
}

}  // namespace hanpu
