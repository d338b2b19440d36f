// The model-family registry: one row per supported family, holding everything that is particular
// to it outside the blocks it is built from (docs/ARCHITECTURE.md, "Model families").
//
//   const ModelFamily* f = find_model_family("kimi_linear");   // or by architectures, or a config's type
//   ModelConfig c = f->parse(config_json_text, "config.json");
//
// A row gives the Hugging Face `model_type`s and `architectures` that select the family, its
// config.json parser (which fills the typed block configs of ModelConfig), its synthetic presets,
// its checkpoint layout (tensor names), and the slots other parts fill: the chat template and stop
// tokens (serving) and the GGUF architecture name (GGUF loading). Adding a family is a new
// src/model/family_<name>.cpp holding its row, parser and presets, one line in the list of
// src/model/model_families.cpp, and any block the runtime does not have yet.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hanpu/chat_output.hpp"
#include "hanpu/model.hpp"

namespace hanpu {

namespace model {
struct GgufMapping;  // src/model/gguf_arch.hpp
}

/// A synthetic model of a family: random weights of published shapes (bench-model, tests).
struct ModelPreset {
  std::string name;                  // "qwen3.5-0.8b", "kimi-linear-48b-a3b-slice"
  std::function<ModelConfig()> make;  // the description, with the family's checkpoint names
};

struct ModelFamily {
  std::string name;  // for people: "Qwen3.5", "Kimi Linear"
  /// config.json `model_type` values that select the family: the top-level ones and the text
  /// model's own (ModelConfig::model_type is one of these).
  std::vector<std::string> model_types;
  /// `architectures` entries of its checkpoints; they select the family when a config has no
  /// model_type.
  std::vector<std::string> architectures;
  /// The config.json parser. `source` names the file in errors.
  ModelConfig (*parse)(const std::string& json_text, const std::string& source) = nullptr;
  std::vector<ModelPreset> presets;
  /// The checkpoint layout: the tensor names that differ from the shared ones.
  CheckpointNames checkpoint_names;
  /// Serving. The chat template used when a checkpoint has none, by name: "chatml" (ChatML,
  /// Tokenizer::apply_chat_template, when the tokenizer has its tokens) or "" (none: the family's
  /// checkpoints ship their own, and a guess in another family's format would be worse than a
  /// clear refusal).
  std::string chat_template;
  /// The tokens that end a reply besides config.json's eos_token_id (the end-of-turn marker of
  /// the family's template), by their text; those the tokenizer lacks are skipped
  /// (family_stop_ids in hanpu/generator.hpp).
  std::vector<std::string> stop_tokens;
  /// How the family's models write tool calls (hanpu/chat_output.hpp), used when the chat
  /// template in use does not show it by its own markers.
  ToolCallFormat tool_call_format = ToolCallFormat::kJsonTags;
  /// GGUF `general.architecture` of the family's GGUF files ("qwen35", "kimi-linear"), llama.cpp's
  /// name, and the mapping of those files onto this family's model description (metadata keys,
  /// tensor names and the converter's transforms: src/model/gguf_arch.hpp), defined in the
  /// family's file. The registry is the one list of the GGUF architectures hanpu reads.
  std::string gguf_architecture;
  const model::GgufMapping* gguf_mapping = nullptr;
};

/// Every supported family, in a fixed order.
const std::vector<const ModelFamily*>& model_families();

/// The family a config.json selects: by `model_type` when it is non-empty, else by the first of
/// `architectures` a family lists. nullptr when none does.
const ModelFamily* find_model_family(std::string_view model_type, const std::vector<std::string>& architectures = {});

/// The family of a description (by its model_type). Throws hanpu::Error listing the known types
/// when none has it.
const ModelFamily& model_family(const ModelConfig& config);

/// "'qwen3_5', 'qwen3_5_text' (Qwen3.5), ..., 'bailing_hybrid' (Ling 3.0)": the known model types,
/// for errors and help texts.
std::string known_model_types();

/// The parsers (each family row's `parse`). parse_model_config dispatches to them.
ModelConfig parse_qwen_config(const std::string& json_text, const std::string& source);  // Qwen3.5, Qwen3.5-MoE, Qwen3-Next
ModelConfig parse_kimi_linear_config(const std::string& json_text, const std::string& source);
ModelConfig parse_bailing_hybrid_config(const std::string& json_text, const std::string& source);  // Ling 3.0

}  // namespace hanpu
