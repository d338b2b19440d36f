// A checkpoint's chat template (Hugging Face `chat_template`), rendered by hanpu's own Jinja
// subset (src/model/jinja.cpp) with the settings transformers uses: trim_blocks and
// lstrip_blocks on, jinja2's default Undefined, loop controls (break/continue), the globals
// raise_exception and strftime_now, and a tojson filter that is Python's json.dumps with
// ensure_ascii=False. docs/SERVE.md, "Chat templates", lists the supported subset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "hanpu/tokenizer.hpp"

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

/// The special tokens transformers passes to every chat template (its special_tokens_map:
/// bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, mask_token,
/// additional_special_tokens) from the checkpoint's tokenizer_config.json, as strings (an
/// AddedToken object {"content": ...} gives its content). An empty object when there is none.
nlohmann::ordered_json chat_template_special_tokens(const std::string& model_dir);

/// A checkpoint's chat template parsed, or nullptr when it has none (find_chat_template). A
/// template outside the subset throws hanpu::Error naming the construct and line.
std::unique_ptr<ChatTemplate> load_chat_template(const std::string& model_dir, bool want_tools = false);

/// The prompt for a plain conversation (`hanpu run --chat`, `hanpu tokenize --chat`): the
/// checkpoint's template when `tmpl` is given (with `special_tokens` and enable_thinking as
/// variables), else the tokenizer's ChatML (Tokenizer::apply_chat_template), the stated fallback.
std::string render_chat_prompt(const ChatTemplate* tmpl, const nlohmann::ordered_json& special_tokens, const Tokenizer& tok,
                               const std::vector<ChatMessage>& messages, bool add_generation_prompt, bool enable_thinking);

/// How many tokens two encodings share from the start.
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

/// Where a chat prompt's "history" snapshot goes (the server and `hanpu chat` keep one there): the
/// conversation rendered without the generation prompt (`render_history`), encoded with special
/// tokens parsed, when that is a proper prefix of `prompt`. The next turn's rendering agrees up to
/// it, while the generation prompt (and a <think> block it opened) differ once the reply is part of
/// the history. Nothing when the template refuses the shorter conversation (it may want a user
/// message last) or its tokens are not a prefix of the prompt's.
std::optional<int64_t> history_snapshot_length(const std::function<std::string()>& render_history, const Tokenizer& tok,
                                               std::span<const int32_t> prompt);

/// Where the next turn's prompt will first differ from `prompt`: `render_continued` renders this
/// conversation (without the generation prompt) followed by a placeholder assistant reply and a
/// placeholder user message. A template that renders earlier turns anew once a user message
/// follows (Qwen3.5's drops an assistant turn's <think> block then, so an agent's tool-call turn
/// reads differently next time) makes the next prompt diverge before this one's end, where no
/// other snapshot may lie; a snapshot here lets the next turn restore everything it shares. Nothing
/// when the template refuses the continued conversation, or when it shares all of `prompt` (then
/// the end-of-prompt snapshots serve).
std::optional<int64_t> next_turn_divergence_length(const std::function<std::string()>& render_continued, const Tokenizer& tok,
                                                   std::span<const int32_t> prompt);

/// Appends to a copy of `messages` the placeholder turns `render_continued` above needs: an
/// assistant reply and a user message (their text never matters: only what precedes them).
nlohmann::ordered_json with_placeholder_next_turn(const nlohmann::ordered_json& messages);

}  // namespace hanpu
