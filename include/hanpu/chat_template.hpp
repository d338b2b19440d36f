// A checkpoint's chat template (Hugging Face `chat_template`), rendered by hanpu's own Jinja
// subset (src/model/jinja.cpp) with the settings transformers uses: trim_blocks and
// lstrip_blocks on, jinja2's default Undefined, loop controls (break/continue), the globals
// raise_exception and strftime_now, and a tojson filter that is Python's json.dumps with
// ensure_ascii=False. docs/SERVE.md, "Chat templates", lists the supported subset.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hanpu {

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  /// Parses `text` (the template source). `origin` names it in error messages (a file name or
  /// "tokenizer_config.json chat_template"). A construct outside the subset is a hanpu::Error that
  /// names the construct and its line.
  static ChatTemplate parse(std::string_view text, std::string origin = "chat template");

  /// Renders with every key of `context` (an object) as a template variable.
  std::string render_context(const nlohmann::ordered_json& context) const;

  /// transformers' apply_chat_template: messages, tools (null when none), add_generation_prompt,
  /// and the extra kwargs (enable_thinking, bos_token, ...) as further variables.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_kwargs = nlohmann::ordered_json::object()) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }

 private:
  std::shared_ptr<const jinja::Template> t_;
  std::string origin_, source_;
};

/// A checkpoint directory's chat template text, as transformers finds it: chat_template.jinja
/// beside the tokenizer (it overrides the config), else tokenizer_config.json's `chat_template`,
/// a string or a list of {name, template} (the one named "tool_use" when `want_tools` and it
/// exists, else "default"). Empty when the checkpoint has none. `origin` gets the source's name.
std::string find_chat_template(const std::string& model_dir, bool want_tools, std::string* origin);

}  // namespace hanpu
