// libFuzzer target: a request's tools (OpenAI's tools array, from the network) through the
// tool-call grammar (src/model/json_constraint_tools.cpp), then its automaton over a reply: the
// input is one byte of settings (format, parallel calls, the first tool named or not), then
// "tools\0reply". ToolSchemaError / hanpu::Error and invalid JSON are the expected answers to bad
// input. Checked: the shortest completion at the start is the grammar's min_bytes, every state's
// is finite, and a reply the automaton accepts parses (chat_output.cpp's parser, as the server
// reads it) as one or more calls with JSON-object arguments and no other text.
#include <cstring>
#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "hanpu/chat_output.hpp"
#include "model/json_constraint_tools.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t settings = data[0];
  ++data;
  --size;
  const uint8_t* split = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t tools_size = split ? static_cast<size_t>(split - data) : size;
  const auto tools = nlohmann::ordered_json::parse(hanpu::fuzz::as_text(data, tools_size), nullptr, false);
  if (tools.is_discarded() || !tools.is_array()) return 0;
  hanpu::ToolCallGrammar::Options o;
  o.format = static_cast<hanpu::ToolCallFormat>(settings % 3);
  o.parallel = (settings >> 2) & 1;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string())
      return 0;
    o.tools.push_back({t["function"]["name"].get<std::string>(),
                       t["function"].contains("parameters") ? t["function"]["parameters"] : nlohmann::ordered_json()});
  }
  if (o.tools.empty()) return 0;
  if ((settings >> 3) & 1) o.forced = o.tools[0].name;
  std::shared_ptr<const hanpu::ToolCallGrammar> g;
  try {
    g = hanpu::ToolCallGrammar::compile(o);
  } catch (const hanpu::Error&) {
    return 0;
  }
  hanpu::ToolCallState state(*g);
  if (state.closing_cost() != g->min_bytes()) std::abort();
  std::string reply;
  for (size_t i = tools_size + 1; split && i < size; ++i) {
    if (!state.feed(data[i])) return 0;
    reply.push_back(static_cast<char>(data[i]));
    if (state.closing_cost() >= (int64_t{1} << 40)) std::abort();
    if (state.accepting()) {
      const auto p = hanpu::parse_tool_calls(g->prompt_prefix() + reply, o.format, tools);
      if (p.calls.empty() || !p.content.empty()) std::abort();
      for (const auto& c : p.calls)
        if (!nlohmann::ordered_json::parse(c.arguments, nullptr, false).is_object()) std::abort();
    }
  }
  return 0;
}
