// Reasoning split and tool-call parsers (include/hanpu/chat_output.hpp) on scripted outputs, and
// the streaming split against the whole-text split at every cut.
#include <gtest/gtest.h>

#include <string>

#include "hanpu/chat_output.hpp"

namespace hanpu {
namespace {

TEST(ReasoningSplit, ThinkBlockAtTheStart) {
  const ReasoningSplit r = split_reasoning("<think>\nI should add.\n</think>\n\n4", false);
  EXPECT_EQ(r.reasoning, "\nI should add.\n");
  EXPECT_EQ(r.content, "\n\n4");
}

TEST(ReasoningSplit, OpenedByTheTemplate) {
  const ReasoningSplit r = split_reasoning("plan</think>answer", true);
  EXPECT_EQ(r.reasoning, "plan");
  EXPECT_EQ(r.content, "answer");
}

TEST(ReasoningSplit, NeverClosedIsAllReasoning) {
  const ReasoningSplit r = split_reasoning("still thinking <th", true);
  EXPECT_EQ(r.reasoning, "still thinking <th");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningSplit, NoThinkingIsAllContent) {
  const ReasoningSplit r = split_reasoning("plain answer with a < sign", false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "plain answer with a < sign");
}

TEST(ReasoningSplit, EmptyThinkBlock) {
  const ReasoningSplit r = split_reasoning("<think>\n\n</think>\n\nHi", false);
  EXPECT_EQ(r.reasoning, "\n\n");
  EXPECT_EQ(r.content, "\n\nHi");
}

TEST(ReasoningStream, HoldsBackAPartialTag) {
  ReasoningStream s(true);
  ReasoningSplit d = s.push("abc</th");
  EXPECT_EQ(d.reasoning, "abc");
  EXPECT_EQ(d.content, "");
  d = s.push("ink>x");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "x");
  EXPECT_FALSE(s.in_reasoning());
  d = s.push("<");  // could start "<think>": held back, then released by finish()
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(s.finish().content, "<");
}

TEST(ReasoningStream, EveryCutMatchesTheWholeText) {
  const std::string texts[] = {"<think>a</think>b", "x</think>y<think>z", "</think></think>", "<thi", "<think><think>",
                               "no tags at all", "r\n</think>\n\n<tool_call>{}</tool_call>"};
  for (const std::string& t : texts) {
    for (bool opened : {false, true}) {
      const ReasoningSplit whole = split_reasoning(t, opened);
      for (size_t cut1 = 0; cut1 <= t.size(); ++cut1) {
        for (size_t cut2 = cut1; cut2 <= t.size(); ++cut2) {
          ReasoningStream s(opened);
          std::string reasoning, content;
          for (const ReasoningSplit& d : {s.push(t.substr(0, cut1)), s.push(t.substr(cut1, cut2 - cut1)),
                                          s.push(t.substr(cut2)), s.finish()}) {
            reasoning += d.reasoning;
            content += d.content;
          }
          EXPECT_EQ(reasoning, whole.reasoning) << t << " cut at " << cut1 << "," << cut2;
          EXPECT_EQ(content, whole.content) << t << " cut at " << cut1 << "," << cut2;
        }
      }
    }
  }
}

TEST(ToolCalls, JsonTags) {
  const ParsedToolCalls p = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}\n</tool_call>",
      ToolCallFormat::kJsonTags);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Oslo\",\"days\":2}");
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.calls[1].arguments, "{\"q\": \"x\"}");
  EXPECT_EQ(p.content, "Let me check.");
}

TEST(ToolCalls, JsonTagsMalformedStaysContentAndUnclosedLastCallParses) {
  ParsedToolCalls p = parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>", ToolCallFormat::kJsonTags);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>");
  p = parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", ToolCallFormat::kJsonTags);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{}");
  EXPECT_EQ(p.content, "");
}

TEST(ToolCalls, XmlTagsWithSchemaTypes) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "zip": {"type": "string"}, "opts": {"type": "object"}}}}}])");
  const std::string text =
      "I'll look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n<parameter=zip>\n10001\n</parameter>\n<parameter=opts>\n{\"units\": \"c\"}\n</parameter>\n</function>\n</tool_call>";
  ParsedToolCalls p = parse_tool_calls(text, ToolCallFormat::kXmlTags, tools);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"New York\",\"days\":3,\"zip\":\"10001\",\"opts\":{\"units\":\"c\"}}");
  EXPECT_EQ(p.content, "I'll look.");
  // without the schema: JSON where it parses, else the string
  p = parse_tool_calls(text, ToolCallFormat::kXmlTags);
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"New York\",\"days\":3,\"zip\":10001,\"opts\":{\"units\":\"c\"}}");
}

// The value's form follows the schema as the constrained grammar writes it
// (src/model/json_constraint_tools.hpp): a parameter that admits only strings (type string, a
// string enum, a format, a $ref to one) is its text; others JSON, with Python's True/False/None
// (what the template prints for past calls) read as JSON's.
TEST(ToolCalls, XmlTagsValueFormBySchema) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
      "color": {"enum": ["red", "1"]}, "when": {"format": "date"}, "ref": {"$ref": "#/$defs/s"}, "flag": {"type": "boolean"},
      "any": {}}, "required": ["extra"], "additionalProperties": {"type": "string"}, "$defs": {"s": {"type": "string"}}}}}])");
  auto args = [&](const std::string& params) {
    const ParsedToolCalls p = parse_tool_calls("<tool_call>\n<function=f>\n" + params + "</function>\n</tool_call>",
                                               ToolCallFormat::kXmlTags, tools);
    return p.calls.size() == 1 ? p.calls[0].arguments : "(no call)";
  };
  auto param = [](const std::string& name, const std::string& value) {
    return "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
  };
  EXPECT_EQ(args(param("note", "\"hi\"")), R"({"note":"hi"})");
  EXPECT_EQ(args(param("note", "null") + param("flag", "true")), R"({"note":null,"flag":true})");
  EXPECT_EQ(args(param("note", "None") + param("flag", "False")), R"({"note":null,"flag":false})");
  EXPECT_EQ(args(param("note", "plain words")), R"({"note":"plain words"})");  // not JSON: the text
  EXPECT_EQ(args(param("color", "1") + param("when", "2024-01-02") + param("ref", "12")),
            R"({"color":"1","when":"2024-01-02","ref":"12"})");
  EXPECT_EQ(args(param("any", "\"x\"") + param("extra", "7")), R"({"any":"x","extra":"7"})");
}

TEST(ToolCalls, XmlTagsMultilineValueTwoCallsAndMalformed) {
  const ParsedToolCalls p = parse_tool_calls(
      "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n<tool_call>\nnot xml\n</tool_call>",
      ToolCallFormat::kXmlTags);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, "{\"text\":\"line 1\\nline 2\"}");
  EXPECT_EQ(p.calls[1].name, "noop");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.content, "<tool_call>\nnot xml\n</tool_call>");
}

TEST(ToolCalls, KimiSections) {
  const ParsedToolCalls p = parse_tool_calls(
      "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"city\":\"Oslo\"}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"q\":\"a\"}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      ToolCallFormat::kKimiSections);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.content, "Checking.");
}

}  // namespace
}  // namespace hanpu
