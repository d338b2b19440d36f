// ChatTemplate (include/hanpu/chat_template.hpp): the checkpoint's template found and rendered
// through hanpu's Jinja subset (model/jinja.hpp).
#include "hanpu/chat_template.hpp"

#include <filesystem>

#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
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

}  // namespace hanpu
