// libFuzzer target: chat-template source through hanpu's Jinja subset (src/model/jinja.cpp):
// parse, then render on a conversation with tools, tool calls, reasoning and multi-part content.
// A hanpu::Error (with the template line) is the expected answer to a template outside the subset.
#include "fuzz_common.hpp"
#include "hanpu/chat_template.hpp"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "image": "x"}]},
      {"role": "assistant", "content": "<think>r</think>a", "reasoning_content": "r",
       "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}}]},
      {"role": "tool", "tool_call_id": "c0", "content": "{\"ok\": 1}"},
      {"role": "user", "content": "again"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>"})");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const hanpu::ChatTemplate t = hanpu::ChatTemplate::parse(hanpu::fuzz::as_text(data, size), "fuzz");
    (void)t.render_context(context());
  } catch (const hanpu::Error&) {
  }
  return 0;
}
