// hanpu's Jinja subset for chat templates (include/hanpu/chat_template.hpp is the public face).
// Written from the Jinja documentation (jinja.palletsprojects.com, "Template Designer
// Documentation") and checked against jinja2 itself (python/tests/test_chat_template.py), with the
// environment transformers builds in src/transformers/utils/chat_template_utils.py
// (_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[AssistantTracker, jinja2.ext.loopcontrols]), tojson = json.dumps(x,
// ensure_ascii=False, indent, separators, sort_keys), globals raise_exception and strftime_now.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hanpu::jinja {

struct Template;

/// Parses template source; a hanpu::Error names `origin`, the line and the construct.
std::shared_ptr<const Template> parse(std::string_view source, const std::string& origin);

/// Renders with the keys of `context` (an object) as variables.
std::string render(const Template& t, const nlohmann::ordered_json& context);

}  // namespace hanpu::jinja
