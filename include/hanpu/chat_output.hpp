// Generated chat text split back into OpenAI's fields: reasoning_content (the <think> block) and
// content, and tool calls in the forms the supported checkpoints' templates teach their models:
//   - JSON in <tool_call> tags (Qwen3-Next; "Hermes" style):
//       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   - XML parameters in <tool_call> tags (Qwen3.5, "Qwen3-Coder" style):
//       <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
//   - Kimi's sections: <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
//       <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>
// Written from the templates' own instructions to the model (what they render for past calls).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace hanpu {

struct ReasoningSplit {
  std::string reasoning;  // the text inside <think>...</think> (as generated: whitespace kept)
  std::string content;    // the rest
};

/// Splits a whole generated text. `opened_in_prompt`: the prompt already ends inside a <think>
/// block (the template rendered "<think>\n" for the model to continue, as Qwen3.5 and Kimi do with
/// thinking on), so the text starts as reasoning until "</think>". A block never closed is all
/// reasoning (the generation stopped while thinking).
ReasoningSplit split_reasoning(std::string_view text, bool opened_in_prompt);

/// The same, incrementally, for streaming: push() each decoded piece and send the returned
/// delta; a possible partial tag at the end of a piece is held back until the next piece or
/// finish() decides it. Concatenating all deltas gives split_reasoning() of the whole text.
class ReasoningStream {
 public:
  explicit ReasoningStream(bool opened_in_prompt) : in_reasoning_(opened_in_prompt) {}
  ReasoningSplit push(std::string_view piece);
  ReasoningSplit finish();
  bool in_reasoning() const { return in_reasoning_; }

 private:
  bool in_reasoning_;
  std::string pending_;
};

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object as text (OpenAI's function.arguments)
};

enum class ToolCallFormat { kJsonTags, kXmlTags, kKimiSections };

struct ParsedToolCalls {
  std::string content;          // the text outside the calls
  std::vector<ToolCall> calls;  // in order
};

/// Tool calls in `text` in the given format. A call that does not parse stays in `content` as
/// text (the client sees what the model wrote). For the XML form, `tools` (the request's tools,
/// or null) gives each parameter's schema: one that admits only strings keeps the text as it is,
/// others are read as JSON when they parse (Python's True/False/None, as the template prints past
/// calls, as JSON's), else kept as strings; a parameter the tools do not describe is JSON when it
/// parses to a non-string. The constrained grammar writes what this reads
/// (src/model/json_constraint_tools.hpp, xml_parameter_is_string).
ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format,
                                 const nlohmann::ordered_json& tools = nullptr);

}  // namespace hanpu
