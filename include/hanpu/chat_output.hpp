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

#include <cstddef>
#include <cstdint>
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

/// Re-writes JSON text as it arrives, byte by byte, into what nlohmann's parse then compact dump
/// (ensure_ascii off, invalid UTF-8 replaced) writes for the whole value: the form
/// parse_tool_calls gives arguments in. Structure and whole string characters go out as soon as
/// they are known; a number or literal when it ends, an escape when it is complete. So the pieces
/// of one value concatenate to the dump of the parsed value (duplicate keys aside: the parse keeps
/// the last value at the first key's place).
class JsonTextNormalizer {
 public:
  /// Feeds bytes; appends what is settled to `out`. Returns how many bytes of `in` were taken
  /// (fewer than all once the value is complete: the rest follows it).
  size_t feed(std::string_view in, std::string& out);
  bool complete() const { return complete_; }
  bool failed() const { return failed_; }

 private:
  enum class Mode : uint8_t { kValue, kAfterValue, kKey, kColon, kString, kNumber, kLiteral };
  bool byte(char c, std::string& out);  // false: failed
  bool end_scalar(std::string& out);    // a number or literal ended
  void flush_string(std::string& out, bool all);
  bool value_done();
  std::vector<char> stack_;  // '{' or '['
  Mode mode_ = Mode::kValue;
  bool in_key_ = false, escape_ = false, complete_ = false, failed_ = false;
  bool first_in_container_ = false;  // an object or array just opened: ']'/'}' may close it
  std::string scalar_;       // a number or literal so far
  std::string escape_text_;  // the escape being read (after the backslash)
  uint32_t high_surrogate_ = 0;
  std::string decoded_;      // string bytes decoded, not yet written
};

/// One piece of a streamed reply with tool calls: content text, and per call its start (index,
/// name, first with `start` true) and pieces of its arguments.
struct ToolCallPiece {
  size_t index = 0;
  bool start = false;
  std::string name;       // with start
  std::string arguments;  // the next piece of the arguments (JSON text)
};
struct ToolCallDelta {
  std::string content;
  std::vector<ToolCallPiece> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

/// parse_tool_calls, incrementally, for streaming (OpenAI's tool_calls deltas, Anthropic's
/// input_json_delta): push() each piece of the reply's content as it is generated, send the
/// delta. A call starts once its name is known; its arguments then stream as the model writes
/// them (JSON formats through JsonTextNormalizer; the XML format as a JSON object built
/// parameter by parameter, string parameters character by character, others when they end).
/// Content outside the calls streams as it comes, a possible partial marker and whitespace that
/// the final parse would trim held back. finish() compares with parse_tool_calls of the whole
/// text and sends what is missing: each call's arguments then concatenate to the non-streamed
/// arguments whenever the streamed pieces are a prefix of them (always for replies the call
/// grammar constrained; a call that fails to parse after its start had been sent, e.g. cut by
/// max_tokens, cannot be taken back).
class ToolCallStream {
 public:
  /// `strip_leading_newlines`: the content is compared after dropping leading line feeds, as the
  /// server's reply message does after a reasoning block.
  ToolCallStream(ToolCallFormat format, nlohmann::ordered_json tools, bool strip_leading_newlines = false);
  ToolCallDelta push(std::string_view piece);
  ToolCallDelta finish();
  size_t calls_started() const { return calls_.size(); }

 private:
  enum class State : uint8_t { kContent, kCallHead, kArgs, kCallTail, kXmlBetween, kXmlValue, kKimiBetween, kSkip };
  void step(ToolCallDelta& d);
  void content_text(std::string_view text, ToolCallDelta& d, bool final_piece);
  void start_call(const std::string& name, ToolCallDelta& d);
  void args(const std::string& piece, ToolCallDelta& d, size_t index = SIZE_MAX);  // default: the last call
  bool xml_param_is_string(const std::string& param) const;
  ToolCallFormat format_;
  nlohmann::ordered_json tools_;
  bool strip_leading_newlines_;
  std::string all_;      // every byte pushed
  std::string buf_;      // bytes not consumed yet
  State state_ = State::kContent;
  std::string sent_content_, held_space_;
  bool content_started_ = false;  // a non-space content byte was sent
  struct Call {
    std::string name, arguments;
  };
  std::vector<Call> calls_;
  JsonTextNormalizer json_;
  // XML: the current parameter
  std::string xml_param_;
  bool xml_string_ = false, xml_value_started_ = false, xml_any_param_ = false;
  std::string xml_value_;  // non-string: the raw value; string: bytes not yet written
  std::string xml_newlines_;  // string: line feeds held (the value's trailing ones are dropped)
};

}  // namespace hanpu
