// Anthropic Messages request -> chat completions request (anthropic.hpp).
#include "serve/anthropic.hpp"

#include <algorithm>
#include <vector>

namespace hanpu::serve {

namespace {

using ojson = nlohmann::ordered_json;

std::string type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "boolean";
    case ojson::value_t::string: return "string";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned: return "integer";
    case ojson::value_t::number_float: return "number";
    case ojson::value_t::array: return "array";
    case ojson::value_t::object: return "object";
    default: return "value";
  }
}

[[noreturn]] void fail(const std::string& field, const std::string& why) { throw AnthropicRequestError(field, field + ": " + why); }

void expect(bool ok, const std::string& field, const ojson& got, const std::string& expected) {
  if (!ok) fail(field, "expected " + expected + ", got " + type_name(got));
}

void only_keys(const ojson& obj, const std::string& where, std::initializer_list<const char*> allowed) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& key = it.key();
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; }))
      fail(where.empty() ? key : where + "." + key, "Extra inputs are not permitted");
  }
}

const ojson& required(const ojson& obj, const std::string& where, const char* key) {
  if (!obj.contains(key)) fail(where.empty() ? key : where + "." + key, "Field required");
  return obj[key];
}

// Text of a string or of an array of text blocks (system prompt, tool_result content).
std::string text_of(const ojson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  expect(v.is_array(), where, v, "a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const ojson& b = v[i];
    expect(b.is_object(), w, b, "a content block object");
    const ojson& type = required(b, w, "type");
    if (type != "text")
      fail(w + ".type", "'" + (type.is_string() ? type.get<std::string>() : type.dump()) +
                            "' blocks are not supported here by hanpu serve (text only: the model reads text)");
    only_keys(b, w, {"type", "text", "cache_control", "citations"});
    const ojson& t = required(b, w, "text");
    expect(t.is_string(), w + ".text", t, "a string");
    out += t.get<std::string>();
  }
  return out;
}

}  // namespace

const char* anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

ojson anthropic_to_chat_request(const ojson& body) {
  expect(body.is_object(), "body", body, "a JSON object");
  only_keys(body, "", {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
                       "top_k", "tools", "tool_choice", "thinking", "metadata", "service_tier", "cache_control", "output_config",
                       "ignore_eos"});
  // Accepted, with no effect here: cache_control (hanpu caches every prefix on its own; see
  // docs/SERVE.md) and service_tier. output_config.effort is accepted and has no effect;
  // output_config.format (structured output, {"type": "json_schema", "schema": {...}}) becomes
  // OpenAI's response_format json_schema: the same compiled schema masks the reply.
  ojson response_format;
  if (body.contains("output_config") && !body["output_config"].is_null()) {
    const ojson& oc = body["output_config"];
    expect(oc.is_object(), "output_config", oc, "an object");
    only_keys(oc, "output_config", {"effort", "format"});
    if (oc.contains("format") && !oc["format"].is_null()) {
      const ojson& f = oc["format"];
      expect(f.is_object(), "output_config.format", f, "an object {\"type\": \"json_schema\", \"schema\": {...}}");
      only_keys(f, "output_config.format", {"type", "schema"});
      const ojson& type = required(f, "output_config.format", "type");
      if (type != "json_schema")
        fail("output_config.format.type", "expected 'json_schema', got " + type.dump());
      const ojson& schema = required(f, "output_config.format", "schema");
      expect(schema.is_object(), "output_config.format.schema", schema, "a JSON Schema object");
      response_format = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", schema}, {"strict", true}}}};
    }
  }
  ojson out = ojson::object();
  const ojson& model = required(body, "", "model");
  expect(model.is_string(), "model", model, "a string");
  out["model"] = model;
  // Anthropic requires max_tokens (unlike OpenAI): no default.
  const ojson& max_tokens = required(body, "", "max_tokens");
  expect(max_tokens.is_number_integer(), "max_tokens", max_tokens, "an integer");
  if (max_tokens.is_number_integer() && max_tokens.get<int64_t>() < 1) fail("max_tokens", "must be at least 1, got " + max_tokens.dump());
  out["max_tokens"] = max_tokens;

  ojson messages = ojson::array();
  if (body.contains("system") && !body["system"].is_null())
    messages.push_back({{"role", "system"}, {"content", text_of(body["system"], "system")}});
  const ojson& in = required(body, "", "messages");
  expect(in.is_array(), "messages", in, "an array of messages");
  if (in.empty()) fail("messages", "at least one message is required");
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const ojson& m = in[i];
    expect(m.is_object(), where, m, "a message object");
    only_keys(m, where, {"role", "content"});
    const ojson& role = required(m, where, "role");
    if (role != "user" && role != "assistant")
      fail(where + ".role", "expected 'user' or 'assistant', got " + role.dump());
    const ojson& content = required(m, where, "content");
    if (content.is_string()) {
      messages.push_back({{"role", role}, {"content", content}});
      continue;
    }
    expect(content.is_array(), where + ".content", content, "a string or an array of content blocks");
    std::string text, thinking;
    ojson tool_calls = ojson::array();
    std::vector<ojson> tool_results;
    for (size_t j = 0; j < content.size(); ++j) {
      const std::string w = where + ".content[" + std::to_string(j) + "]";
      const ojson& b = content[j];
      expect(b.is_object(), w, b, "a content block object");
      const ojson& type = required(b, w, "type");
      expect(type.is_string(), w + ".type", type, "a string");
      const std::string t = type.get<std::string>();
      if (t == "text") {
        only_keys(b, w, {"type", "text", "cache_control", "citations"});
        const ojson& s = required(b, w, "text");
        expect(s.is_string(), w + ".text", s, "a string");
        text += s.get<std::string>();
      } else if (t == "thinking" && role == "assistant") {
        only_keys(b, w, {"type", "thinking", "signature"});
        const ojson& s = required(b, w, "thinking");
        expect(s.is_string(), w + ".thinking", s, "a string");
        thinking += s.get<std::string>();
      } else if (t == "tool_use" && role == "assistant") {
        only_keys(b, w, {"type", "id", "name", "input", "cache_control"});
        const ojson& id = required(b, w, "id");
        const ojson& name = required(b, w, "name");
        const ojson& input = required(b, w, "input");
        expect(id.is_string(), w + ".id", id, "a string");
        expect(name.is_string(), w + ".name", name, "a string");
        expect(input.is_object(), w + ".input", input, "an object");
        tool_calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", input.dump()}}}});
      } else if (t == "tool_result" && role == "user") {
        only_keys(b, w, {"type", "tool_use_id", "content", "is_error", "cache_control"});
        const ojson& id = required(b, w, "tool_use_id");
        expect(id.is_string(), w + ".tool_use_id", id, "a string");
        std::string result = b.contains("content") ? text_of(b["content"], w + ".content") : "";
        if (b.contains("is_error")) {
          expect(b["is_error"].is_boolean(), w + ".is_error", b["is_error"], "a boolean");
          // The template has no field for it; say it in the text the model reads.
          if (b["is_error"].get<bool>()) result = "Error: " + result;
        }
        tool_results.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
      } else {
        fail(w + ".type", "'" + t + "' blocks are not supported in " + role.get<std::string>() +
                              " messages by hanpu serve (text, thinking, tool_use, tool_result)");
      }
    }
    if (role == "user") {
      // Tool results answer the previous assistant turn's calls; the template renders them as
      // tool messages right after it, then any text the user added.
      for (ojson& r : tool_results) messages.push_back(std::move(r));
      if (!text.empty() || tool_results.empty()) messages.push_back({{"role", "user"}, {"content", text}});
    } else {
      ojson a = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!tool_calls.empty()) a["tool_calls"] = tool_calls;
      messages.push_back(std::move(a));
    }
  }
  out["messages"] = std::move(messages);

  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    expect(tools.is_array(), "tools", tools, "an array of tools");
    ojson converted = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string w = "tools[" + std::to_string(i) + "]";
      const ojson& t = tools[i];
      expect(t.is_object(), w, t, "a tool object");
      if (t.contains("type") && t["type"] != "custom")
        fail(w + ".type", "server tools (" + t["type"].dump() + ") are not supported by hanpu serve; give custom tools "
                          "with name, description and input_schema");
      only_keys(t, w, {"type", "name", "description", "input_schema", "cache_control"});
      const ojson& name = required(t, w, "name");
      expect(name.is_string(), w + ".name", name, "a string");
      const ojson& schema = required(t, w, "input_schema");
      expect(schema.is_object(), w + ".input_schema", schema, "a JSON schema object");
      ojson fn = {{"name", name}};
      if (t.contains("description")) {
        expect(t["description"].is_string(), w + ".description", t["description"], "a string");
        fn["description"] = t["description"];
      }
      fn["parameters"] = schema;
      converted.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!converted.empty()) out["tools"] = std::move(converted);
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& c = body["tool_choice"];
    expect(c.is_object(), "tool_choice", c, "an object with a 'type'");
    only_keys(c, "tool_choice", {"type", "name", "disable_parallel_tool_use"});
    const ojson& type = required(c, "tool_choice", "type");
    if (type == "auto") out["tool_choice"] = "auto";
    else if (type == "none") out["tool_choice"] = "none";
    else if (type == "any") out["tool_choice"] = "required";
    else if (type == "tool") {
      const ojson& name = required(c, "tool_choice", "name");
      expect(name.is_string(), "tool_choice.name", name, "a string");
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      fail("tool_choice.type", "expected 'auto', 'any', 'tool' or 'none', got " + type.dump());
    }
    if (c.contains("disable_parallel_tool_use")) {
      expect(c["disable_parallel_tool_use"].is_boolean(), "tool_choice.disable_parallel_tool_use", c["disable_parallel_tool_use"], "a boolean");
      out["parallel_tool_calls"] = !c["disable_parallel_tool_use"].get<bool>();
    }
  }
  // Anthropic's thinking is off unless asked for; the template's variable says so either way.
  bool thinking = false, thinking_default = false;
  if (body.contains("thinking") && !body["thinking"].is_null()) {
    const ojson& t = body["thinking"];
    expect(t.is_object(), "thinking", t, "an object with a 'type'");
    only_keys(t, "thinking", {"type", "budget_tokens", "display"});
    if (t.contains("display") && !t["display"].is_null() && t["display"] != "summarized")
      fail("thinking.display", "only 'summarized' is supported by hanpu serve (it returns the thinking as generated), got " +
                                   t["display"].dump());
    const ojson& type = required(t, "thinking", "type");
    if (type == "adaptive") {
      thinking_default = true;  // the template's own default
    } else if (type == "between_tools") {
      thinking = true;
    } else if (type == "enabled") {
      const ojson& budget = required(t, "thinking", "budget_tokens");
      expect(budget.is_number_integer(), "thinking.budget_tokens", budget, "an integer");
      // As Anthropic: at least 1024 and below max_tokens. The reasoning is capped at it: then the
      // end-of-thinking marker is forced and the answer follows (the chat request's
      // thinking_budget_tokens, GenerationOptions::thinking_budget).
      if (budget.get<int64_t>() < 1024) fail("thinking.budget_tokens", "must be at least 1024, got " + budget.dump());
      if (budget.get<int64_t>() >= max_tokens.get<int64_t>())
        fail("thinking.budget_tokens", "must be less than max_tokens (" + max_tokens.dump() + "), got " + budget.dump());
      thinking = true;
      out["thinking_budget_tokens"] = budget;
    } else if (type != "disabled") {
      fail("thinking.type", "expected 'enabled', 'disabled', 'adaptive' or 'between_tools', got " + type.dump());
    }
  }
  if (!thinking_default) out["chat_template_kwargs"] = {{"enable_thinking", thinking}};
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
    const ojson& s = body["stop_sequences"];
    expect(s.is_array(), "stop_sequences", s, "an array of strings");
    for (size_t i = 0; i < s.size(); ++i) expect(s[i].is_string(), "stop_sequences[" + std::to_string(i) + "]", s[i], "a string");
    if (!s.empty()) out["stop"] = s;
  }
  if (body.contains("stream")) {
    expect(body["stream"].is_boolean(), "stream", body["stream"], "a boolean");
    out["stream"] = body["stream"];
  }
  for (const char* key : {"temperature", "top_p"})
    if (body.contains(key) && !body[key].is_null()) {
      expect(body[key].is_number(), key, body[key], "a number");
      const double v = body[key].get<double>();
      if (!(v >= 0 && v <= 1)) fail(key, "must be between 0 and 1, got " + body[key].dump());
      out[key] = body[key];
    }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {  // extension, as on the OpenAI endpoints
    expect(body["ignore_eos"].is_boolean(), "ignore_eos", body["ignore_eos"], "a boolean");
    out["ignore_eos"] = body["ignore_eos"];
  }
  if (body.contains("top_k") && !body["top_k"].is_null()) {
    expect(body["top_k"].is_number_integer(), "top_k", body["top_k"], "an integer");
    out["top_k"] = body["top_k"];
  }
  if (body.contains("metadata") && !body["metadata"].is_null()) {
    expect(body["metadata"].is_object(), "metadata", body["metadata"], "an object");
    only_keys(body["metadata"], "metadata", {"user_id"});
  }
  if (!response_format.is_null()) out["response_format"] = std::move(response_format);
  return out;
}

}  // namespace hanpu::serve
