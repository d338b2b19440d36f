// Reasoning split and tool-call parsers (include/hanpu/chat_output.hpp) on scripted outputs, and
// the streaming split against the whole-text split at every cut.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

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


// ---- streaming tool calls (issue 35: arguments as the model writes them) ----

std::string compact_dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Cuts `text` into pieces at random points (some of one byte, some longer).
std::vector<std::string> random_pieces(const std::string& text, std::mt19937& rng) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min(text.size() - i, static_cast<size_t>(rng() % 7 + 1));
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

std::string normalized_in_pieces(const std::string& text, std::mt19937& rng, bool* complete = nullptr) {
  JsonTextNormalizer n;
  std::string out;
  for (const std::string& p : random_pieces(text, rng)) n.feed(p, out);
  if (complete) *complete = n.complete() && !n.failed();
  return out;
}

TEST(JsonTextNormalizer, PiecesConcatenateToTheCompactDumpOfTheParse) {
  const std::vector<std::string> docs = {
      R"({})", R"( { "a" : 1 , "b" : [ 1 , 2.50 , -0.0, 1e3, 1E-2, 12345678901234567890 ] } )",
      R"({"s": "tab\there \"q\" \\ \/ \u00e9\u4e2d \ud83d\ude00 \u0001 é 中 😀", "t": true, "f": false, "n": null})",
      R"({"nested": {"x": [[], {}, [{"y": []}]], "e": ""}, "k\u0041": "v"})",
      R"({"a":[true,false,null,0,-1,3.14159,"x"]})",
      "{\n  \"city\": \"New York\",\n  \"days\": 3\n}",
  };
  std::mt19937 rng(7);
  for (const std::string& doc : docs)
    for (int round = 0; round < 50; ++round) {
      bool complete = false;
      EXPECT_EQ(normalized_in_pieces(doc, rng, &complete), compact_dump(nlohmann::ordered_json::parse(doc))) << doc;
      EXPECT_TRUE(complete) << doc;
    }
}

TEST(JsonTextNormalizer, StopsAfterTheValueAndFailsOnBadJson) {
  JsonTextNormalizer n;
  std::string out;
  EXPECT_EQ(n.feed("{\"a\": [1]}\n</tool_call>", out), 10u);
  EXPECT_TRUE(n.complete());
  EXPECT_EQ(out, "{\"a\":[1]}");
  for (const std::string bad : {"{a: 1}", "{\"a\" 1}", "[1,]", "{\"a\": tru}", "{\"a\": \"\\x\"}", "{\"a\": \"\\ud800x\"}",
                                "{\"a\": 01}", "{\"a\": \"\n\"}"}) {
    JsonTextNormalizer m;
    std::string o;
    m.feed(bad, o);
    EXPECT_TRUE(m.failed()) << bad;
  }
}

// Streams `text` in random pieces and checks each call's pieces against parse_tool_calls of the
// whole text: the first piece carries the name, the arguments concatenate to the parsed ones,
// and (with `exact_content`) the content too.
void check_stream(const std::string& text, ToolCallFormat format, const nlohmann::ordered_json& tools, bool exact_content,
                  size_t min_incremental_pieces) {
  const ParsedToolCalls whole = parse_tool_calls(text, format, tools);
  std::mt19937 rng(11);
  for (int round = 0; round < 40; ++round) {
    ToolCallStream s(format, tools);
    std::map<size_t, std::pair<std::string, std::string>> calls;
    std::string content;
    size_t pieces_before_finish = 0;
    auto take = [&](const ToolCallDelta& d, bool final_delta) {
      content += d.content;
      for (const ToolCallPiece& p : d.calls) {
        if (p.start) {
          ASSERT_FALSE(calls.count(p.index)) << "call " << p.index << " started twice";
          calls[p.index].first = p.name;
        }
        ASSERT_TRUE(calls.count(p.index)) << "arguments before the call's start";
        calls[p.index].second += p.arguments;
        if (!final_delta && !p.arguments.empty()) ++pieces_before_finish;
      }
    };
    for (const std::string& p : random_pieces(text, rng)) take(s.push(p), false);
    take(s.finish(), true);
    ASSERT_EQ(calls.size(), whole.calls.size()) << text;
    for (size_t i = 0; i < whole.calls.size(); ++i) {
      EXPECT_EQ(calls[i].first, whole.calls[i].name);
      EXPECT_EQ(calls[i].second, whole.calls[i].arguments) << text;
    }
    if (exact_content) EXPECT_EQ(content, whole.content) << text;
    EXPECT_GE(pieces_before_finish, min_incremental_pieces) << "the arguments did not stream: " << text;
  }
}

const char* kStreamTools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
    "opts": {"type": "object"}, "flag": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}])";

TEST(ToolCallStream, JsonTagsStreamArgumentsAsTheyCome) {
  const auto tools = nlohmann::ordered_json::parse(kStreamTools);
  check_stream("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\u00e9\\n\", "
               "\"days\": 3, \"opts\": {\"a\": [1, 2.50]}}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n"
               "</tool_call>",
               ToolCallFormat::kJsonTags, tools, true, 3);
  // what the grammar writes (compact arguments), one call
  check_stream("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"a < b\",\"days\":12}}\n</tool_call>",
               ToolCallFormat::kJsonTags, tools, true, 3);
  // "parameters" for "arguments", and text around
  check_stream("a <b> c <tool_call>{\"name\":\"noop\",\"parameters\":{\"x\":1}}</tool_call> d", ToolCallFormat::kJsonTags, tools,
               true, 1);
  // a call that does not parse stays content, sent at the end; no call started
  check_stream("x <tool_call>\n{\"name\": \"noop\", \"arguments\": \"oops\"}\n</tool_call>", ToolCallFormat::kJsonTags, tools,
               true, 0);
  check_stream("just text with < and <tool and \n\n spaces  ", ToolCallFormat::kJsonTags, tools, true, 0);
}

TEST(ToolCallStream, XmlParametersStreamAsJsonArgumentText) {
  const auto tools = nlohmann::ordered_json::parse(kStreamTools);
  check_stream("I'll look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\nline two \"q\" é\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n<parameter=unit>\nc\n</parameter>\n<parameter=opts>\n{\"units\": \"c\"}\n"
               "</parameter>\n<parameter=flag>\nTrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n"
               "</function>\n</tool_call>",
               ToolCallFormat::kXmlTags, tools, true, 6);
  // a parameter the tools do not describe, a value without </parameter>, no </function>
  check_stream("<tool_call>\n<function=get_weather>\n<parameter=other>\n42\n<parameter=city>\n\n\nx\n\n</tool_call>",
               ToolCallFormat::kXmlTags, tools, true, 2);
  check_stream("<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n</function>\n</tool_call>",
               ToolCallFormat::kXmlTags, nullptr, true, 2);
}

TEST(ToolCallStream, KimiSectionsStreamArguments) {
  const auto tools = nlohmann::ordered_json::parse(kStreamTools);
  check_stream("Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
               "{\"city\": \"Oslo\", \"days\": 2}<|tool_call_end|><|tool_call_begin|>functions.noop:1"
               "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
               ToolCallFormat::kKimiSections, tools, true, 3);
}

}  // namespace
}  // namespace hanpu
