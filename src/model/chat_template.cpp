// ChatTemplate (include/hanpu/chat_template.hpp): the checkpoint's template found and rendered
// through hanpu's Jinja subset (model/jinja.hpp).
#include "hanpu/chat_template.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
#include "io/gguf.hpp"
#include "model/gguf_arch.hpp"
#include "model/jinja.hpp"

namespace hanpu {

ChatTemplate ChatTemplate::parse(std::string_view text, std::string origin) {
  ChatTemplate t;
  t.t_ = jinja::parse(text, origin);
  t.origin_ = std::move(origin);
  t.source_ = std::string(text);
  return t;
}

std::string ChatTemplate::render_context(const nlohmann::ordered_json& context) const {
  return jinja::render(*t_, context);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs) const {
  // transformers' render_jinja_template: render(messages=..., tools=..., documents=...,
  // add_generation_prompt=..., **template_kwargs); tools is None when the request has none.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (extra_kwargs.is_object())
    for (const auto& [k, v] : extra_kwargs.items()) ctx[k] = v;
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  return jinja::render(*t_, ctx);
}

std::string find_chat_template(const std::string& model_dir, bool want_tools, std::string* origin) {
  namespace fs = std::filesystem;
  if (model::is_gguf_path(model_dir)) {  // a GGUF file: tokenizer.chat_template
    std::string t = model::gguf_chat_template(GgufModel::open(model_dir).main());
    if (origin) *origin = t.empty() ? std::string() : "GGUF file '" + model_dir + "' tokenizer.chat_template";
    return t;
  }
  const fs::path dir(model_dir);
  std::error_code ec;
  if (fs::is_regular_file(dir / "chat_template.jinja", ec)) {
    if (origin) *origin = (dir / "chat_template.jinja").string();
    return read_regular_file((dir / "chat_template.jinja").string(), "chat template", 1u << 24);
  }
  const fs::path cfg_path = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg_path, ec)) return {};
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(cfg_path.string(), "tokenizer config", 1u << 26), nullptr, false);
  if (!cfg.is_object() || !cfg.contains("chat_template")) return {};
  const nlohmann::json& t = cfg["chat_template"];
  if (t.is_string()) {
    if (origin) *origin = cfg_path.string() + " chat_template";
    return t.get<std::string>();
  }
  if (t.is_array()) {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    std::string chosen, chosen_name;
    for (const nlohmann::json& e : t) {
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") || !e["template"].is_string())
        throw Error(cfg_path.string() + ": chat_template: expected a list of {\"name\": ..., \"template\": ...} objects");
      const std::string name = e["name"].get<std::string>();
      if ((name == "default" && chosen_name != "tool_use") || (name == "tool_use" && want_tools)) {
        chosen = e["template"].get<std::string>();
        chosen_name = name;
      }
    }
    if (chosen_name.empty())
      throw Error(cfg_path.string() + ": chat_template: a list of named templates without one named \"default\"");
    if (origin) *origin = cfg_path.string() + " chat_template '" + chosen_name + "'";
    return chosen;
  }
  if (!t.is_null()) throw Error(cfg_path.string() + ": chat_template: expected a string or a list of named templates");
  return {};
}

nlohmann::ordered_json chat_template_special_tokens(const std::string& model_dir) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (model::is_gguf_path(model_dir)) {  // tokenizer.ggml.<bos|eos|...>_token_id as the tokens' text
    const GgufModel m = GgufModel::open(model_dir);
    const GgufFile& f = m.main();
    const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
    const auto* list = tokens ? std::get_if<std::vector<GgufValue>>(&tokens->value) : nullptr;
    for (const char* key : {"bos", "eos", "unknown", "separator", "padding", "cls", "mask"}) {
      const std::string k = std::string("tokenizer.ggml.") + key + "_token_id";
      if (!list || !f.find(k)) continue;
      const uint64_t id = f.get_uint(k);
      if (id >= list->size()) continue;
      if (const auto* text = std::get_if<std::string>(&(*list)[id].value)) {
        const std::string name = std::string(key) == "unknown" ? "unk" : std::string(key) == "separator" ? "sep"
                                 : std::string(key) == "padding" ? "pad" : key;
        out[name + "_token"] = *text;
      }
    }
    return out;
  }
  const std::filesystem::path cfg_path = std::filesystem::path(model_dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg_path, ec)) return out;
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(cfg_path.string(), "tokenizer config", 1u << 26), nullptr, false);
  if (!cfg.is_object()) return out;
  auto text = [](const nlohmann::json& v) -> std::optional<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (cfg.contains(key))
      if (auto t = text(cfg[key])) out[key] = *t;
  if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& v : cfg["additional_special_tokens"])
      if (auto t = text(v)) list.push_back(*t);
    out["additional_special_tokens"] = list;
  }
  return out;
}

std::unique_ptr<ChatTemplate> load_chat_template(const std::string& model_dir, bool want_tools) {
  std::string origin;
  const std::string text = find_chat_template(model_dir, want_tools, &origin);
  if (origin.empty()) return nullptr;
  return std::make_unique<ChatTemplate>(ChatTemplate::parse(text, origin));
}

std::string render_chat_prompt(const ChatTemplate* tmpl, const nlohmann::ordered_json& special_tokens, const Tokenizer& tok,
                               const std::vector<ChatMessage>& messages, bool add_generation_prompt, bool enable_thinking) {
  if (!tmpl) return tok.apply_chat_template(messages, add_generation_prompt, enable_thinking);
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  nlohmann::ordered_json kwargs = special_tokens.is_object() ? special_tokens : nlohmann::ordered_json::object();
  kwargs["enable_thinking"] = enable_thinking;
  return tmpl->render(msgs, nullptr, add_generation_prompt, kwargs);
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

std::optional<int64_t> history_snapshot_length(const std::function<std::string()>& render_history, const Tokenizer& tok,
                                               std::span<const int32_t> prompt) {
  std::vector<int32_t> history;
  try {
    history = tok.encode(render_history(), /*parse_special=*/true);
  } catch (const Error&) {
    return std::nullopt;  // the history alone may not be a conversation the template renders
  }
  if (history.size() >= prompt.size() || !std::equal(history.begin(), history.end(), prompt.begin())) return std::nullopt;
  return static_cast<int64_t>(history.size());
}

std::optional<int64_t> next_turn_divergence_length(const std::function<std::string()>& render_continued, const Tokenizer& tok,
                                                   std::span<const int32_t> prompt) {
  std::vector<int32_t> continued;
  try {
    continued = tok.encode(render_continued(), /*parse_special=*/true);
  } catch (const Error&) {
    return std::nullopt;  // e.g. a template that wants the conversation to end otherwise
  }
  const size_t shared = common_prefix(prompt, continued);
  if (shared == 0 || shared >= prompt.size()) return std::nullopt;
  return static_cast<int64_t>(shared);
}

nlohmann::ordered_json with_placeholder_next_turn(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json continued = messages;
  continued.push_back({{"role", "assistant"}, {"content", "-"}});
  continued.push_back({{"role", "user"}, {"content", "-"}});
  return continued;
}

}  // namespace hanpu
