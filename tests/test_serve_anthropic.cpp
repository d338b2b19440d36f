// Anthropic Messages requests mapped onto chat completions requests (src/serve/anthropic.cpp):
// each block kind, tools and tool_choice, thinking, and errors that name the field.
#include <gtest/gtest.h>

#include "serve/anthropic.hpp"

namespace {

using hanpu::serve::anthropic_to_chat_request;
using hanpu::serve::AnthropicRequestError;
using ojson = nlohmann::ordered_json;

ojson chat(const char* body) { return anthropic_to_chat_request(ojson::parse(body)); }

std::string error_of(const char* body) {
  try {
    chat(body);
  } catch (const AnthropicRequestError& e) {
    return e.field() + " | " + e.what();
  }
  return "no error";
}

TEST(ServeAnthropic, MapsSystemBlocksToolsAndThinking) {
  const ojson c = chat(R"({
    "model": "m", "max_tokens": 2000, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use it.", "signature": "s"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo", "n": 2}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "-3 C"}]},
                                   {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": true},
                                   {"type": "text", "text": "Thanks"}]}],
    "tools": [{"name": "w", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "thinking": {"type": "enabled", "budget_tokens": 1024}, "stop_sequences": ["END"], "stream": true, "temperature": 0.5})");
  const ojson want = ojson::parse(R"({
    "model": "m", "max_tokens": 2000,
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "Checking.", "reasoning_content": "Use it.",
       "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Oslo\",\"n\":2}"}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "-3 C"},
      {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
      {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "w", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": "required", "parallel_tool_calls": false, "thinking_budget_tokens": 1024,
    "chat_template_kwargs": {"enable_thinking": true}, "stop": ["END"], "stream": true, "temperature": 0.5})");
  EXPECT_EQ(c, want) << c.dump(1);
  // Key order is kept (tojson in templates prints it).
  EXPECT_EQ(c["tools"][0]["function"].begin().key(), "name");

  EXPECT_EQ(chat(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                     "tool_choice": {"type": "tool", "name": "w"}})")["tool_choice"],
            ojson::parse(R"({"type": "function", "function": {"name": "w"}})"));
  // Thinking is off unless asked for; "adaptive" leaves the template's default.
  EXPECT_EQ(chat(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})")["chat_template_kwargs"],
            ojson::parse(R"({"enable_thinking": false})"));
  EXPECT_FALSE(chat(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                        "thinking": {"type": "adaptive"}})").contains("chat_template_kwargs"));
}

TEST(ServeAnthropic, ErrorsNameTheField) {
  EXPECT_EQ(error_of(R"({"model": "m", "messages": []})"), "max_tokens | max_tokens: Field required");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": []})"), "messages | messages: at least one message is required");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": "9", "messages": []})"), "max_tokens | max_tokens: expected an integer, got string");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]})"),
            "messages[0].content[0].type | messages[0].content[0].type: 'image' blocks are not supported in user messages "
            "by hanpu serve (text, thinking, tool_use, tool_result)");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "y", "input": {}}]}]})"),
            "messages[0].content[0].type | messages[0].content[0].type: 'tool_use' blocks are not supported in user messages "
            "by hanpu serve (text, thinking, tool_use, tool_result)");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "top_k": 1.5})"),
            "top_k | top_k: expected an integer, got number");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5})"),
            "temperature | temperature: must be between 0 and 1, got 1.5");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "s"}]})"),
            "tools[0].type | tools[0].type: server tools (\"web_search_20250305\") are not supported by hanpu serve; give "
            "custom tools with name, description and input_schema");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1100, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 2000}})"),
            "thinking.budget_tokens | thinking.budget_tokens: must be less than max_tokens (1100), got 2000");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x", "name": "n"}]})"),
            "messages[0].name | messages[0].name: Extra inputs are not permitted");
  EXPECT_EQ(error_of(R"([1])"), "body | body: expected a JSON object, got array");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                         "output_config": {"format": {"type": "json_object"}}})"),
            "output_config.format.type | output_config.format.type: expected 'json_schema', got \"json_object\"");
  EXPECT_EQ(error_of(R"({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                         "output_config": {"format": {"type": "json_schema"}}})"),
            "output_config.format.schema | output_config.format.schema: Field required");
}

// output_config.format is OpenAI's response_format json_schema (the schema kept as sent, key order
// included: the document follows it).
TEST(ServeAnthropic, OutputFormatIsResponseFormatJsonSchema) {
  const ojson c = chat(R"({"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}],
      "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object",
      "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}, "required": ["z", "a"]}}}})");
  EXPECT_EQ(c["response_format"], ojson::parse(R"({"type": "json_schema", "json_schema": {"name": "output", "schema":
      {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}, "required": ["z", "a"]},
      "strict": true}})"));
  EXPECT_EQ(c["response_format"]["json_schema"]["schema"]["properties"].begin().key(), "z");
  EXPECT_FALSE(chat(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})").contains("response_format"));
}

}  // namespace
