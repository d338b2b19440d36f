// `hanpu template render`: renders a chat template (a file, or a checkpoint's own) with a JSON
// context through hanpu's Jinja subset. python/tests/test_chat_template.py compares its output
// with jinja2's byte for byte.
#include <CLI/CLI.hpp>

#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"

namespace {

struct TemplateArgs {
  std::string template_file, model_dir, context_file, contexts_file;
};

nlohmann::ordered_json read_json(const std::string& path, const char* what) {
  const std::string text = path == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                                       : hanpu::read_regular_file(path, what, 1u << 28);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) throw hanpu::Error(path + ": " + what + " is not valid JSON");
  return j;
}

void run_render(const TemplateArgs& a) {
  std::string text, origin;
  if (!a.template_file.empty()) {
    text = hanpu::read_regular_file(a.template_file, "chat template", 1u << 24);
    origin = a.template_file;
  } else {
    text = hanpu::find_chat_template(a.model_dir, false, &origin);
    if (origin.empty()) throw hanpu::Error(a.model_dir + ": no chat template (chat_template.jinja or tokenizer_config.json chat_template)");
  }
  const hanpu::ChatTemplate t = hanpu::ChatTemplate::parse(text, origin);
  // With --model, the checkpoint's special tokens are variables too (as transformers passes
  // them); a context's own keys win.
  const nlohmann::ordered_json specials =
      a.model_dir.empty() ? nlohmann::ordered_json::object() : hanpu::chat_template_special_tokens(a.model_dir);
  auto with_specials = [&](const nlohmann::ordered_json& ctx) {
    if (!ctx.is_object()) return ctx;
    nlohmann::ordered_json out = specials;
    for (const auto& [k, v] : ctx.items()) out[k] = v;
    return out;
  };
  if (!a.contexts_file.empty()) {  // a JSON array of contexts in, a JSON array of {"text"} / {"error"} out
    const nlohmann::ordered_json all = read_json(a.contexts_file, "contexts");
    if (!all.is_array()) throw hanpu::Error(a.contexts_file + ": expected a JSON array of context objects");
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& ctx : all) {
      try {
        out.push_back({{"text", t.render_context(with_specials(ctx))}});
      } catch (const hanpu::Error& e) {
        out.push_back({{"error", e.what()}});
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    return;
  }
  const nlohmann::ordered_json ctx = a.context_file.empty() ? nlohmann::ordered_json::object() : read_json(a.context_file, "context");
  std::cout << t.render_context(with_specials(ctx));
}

}  // namespace

void register_template_command(CLI::App& app) {
  CLI::App* tmpl = app.add_subcommand("template", "chat templates (hanpu's Jinja subset)");
  tmpl->require_subcommand(1);
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* r = tmpl->add_subcommand("render", "render a chat template with a JSON context (its keys are the variables)");
  auto* file = r->add_option("--template", args->template_file, "the template file (Jinja source)");
  auto* dir = r->add_option("--model", args->model_dir, "a checkpoint directory: its chat_template.jinja or tokenizer_config.json chat_template");
  file->excludes(dir);
  auto* one = r->add_option("--context", args->context_file, "JSON object of variables (messages, tools, add_generation_prompt, ...); - for stdin");
  auto* many = r->add_option("--contexts", args->contexts_file, "JSON array of contexts: prints a JSON array of {\"text\": ...} or {\"error\": ...}");
  one->excludes(many);
  r->callback([args] {
    if (args->template_file.empty() && args->model_dir.empty()) throw hanpu::Error("template render: give --template FILE or --model DIR");
    run_render(*args);
  });
}
