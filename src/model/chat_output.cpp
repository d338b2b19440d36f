// Reasoning split and tool-call parsers (include/hanpu/chat_output.hpp).
#include "hanpu/chat_output.hpp"

#include <algorithm>

#include "json_constraint_tools.hpp"  // xml_parameter_is_string

namespace hanpu {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// Length of the longest suffix of `s` that is a proper prefix of `tag` (a tag that may be cut).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string_view trim_newlines(std::string_view s) {
  while (!s.empty() && (s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string_view trim_space(std::string_view s) {
  auto sp = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && sp(s.front())) s.remove_prefix(1);
  while (!s.empty() && sp(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

ReasoningSplit ReasoningStream::push(std::string_view piece) {
  ReasoningSplit out;
  pending_.append(piece);
  for (;;) {
    const std::string_view tag = in_reasoning_ ? kClose : kOpen;
    const size_t at = pending_.find(tag);
    std::string& sink = in_reasoning_ ? out.reasoning : out.content;
    if (at == std::string::npos) {
      const size_t keep = partial_tag_suffix(pending_, tag);
      sink.append(pending_, 0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    sink.append(pending_, 0, at);
    pending_.erase(0, at + tag.size());
    in_reasoning_ = !in_reasoning_;
  }
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  (in_reasoning_ ? out.reasoning : out.content) = std::move(pending_);
  pending_.clear();
  return out;
}

ReasoningSplit split_reasoning(std::string_view text, bool opened_in_prompt) {
  ReasoningStream s(opened_in_prompt);
  ReasoningSplit a = s.push(text);
  ReasoningSplit b = s.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

namespace {

// The schema of parameter `param` of tool `name` in an OpenAI tools array (its property, else the
// additionalProperties schema), and the tool's parameters schema it belongs to (for $ref); nulls
// when the tools do not say.
std::pair<const nlohmann::ordered_json*, const nlohmann::ordered_json*> param_schema(const nlohmann::ordered_json& tools,
                                                                                    const std::string& name,
                                                                                    const std::string& param) {
  if (!tools.is_array()) return {nullptr, nullptr};
  for (const auto& t : tools) {
    const auto& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || fn.value("name", std::string()) != name) continue;
    if (!fn.contains("parameters")) return {nullptr, nullptr};
    const auto& params = fn["parameters"];
    if (!params.is_object()) return {nullptr, nullptr};
    if (params.contains("properties") && params["properties"].is_object() && params["properties"].contains(param))
      return {&params["properties"][param], &params};
    // A name not among the properties takes additionalProperties' schema, as the grammar does
    // (any value when a required name has none).
    if (params.contains("additionalProperties")) return {&params["additionalProperties"], &params};
    static const nlohmann::ordered_json any_value = true;
    if (params.contains("required") && params["required"].is_array())
      for (const auto& r : params["required"])
        if (r == param) return {&any_value, &params};
    return {nullptr, nullptr};
  }
  return {nullptr, nullptr};
}

bool parse_json_call(std::string_view body, ToolCall& call) {
  const auto j = nlohmann::ordered_json::parse(trim_space(body), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  call.name = j["name"].get<std::string>();
  const auto args = j.contains("arguments") ? j["arguments"] : j.contains("parameters") ? j["parameters"] : nlohmann::ordered_json::object();
  if (args.is_string()) call.arguments = args.get<std::string>();  // already JSON text
  else if (args.is_object()) call.arguments = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  else return false;
  return true;
}

bool parse_xml_call(std::string_view body, const nlohmann::ordered_json& tools, ToolCall& call) {
  body = trim_space(body);
  constexpr std::string_view fn_open = "<function=", fn_close = "</function>", p_open = "<parameter=", p_close = "</parameter>";
  if (body.substr(0, fn_open.size()) != fn_open) return false;
  const size_t name_end = body.find('>');
  if (name_end == std::string_view::npos) return false;
  call.name = std::string(trim_space(body.substr(fn_open.size(), name_end - fn_open.size())));
  if (call.name.empty()) return false;
  std::string_view rest = body.substr(name_end + 1);
  const size_t end = rest.rfind(fn_close);
  if (end != std::string_view::npos) {
    if (!trim_space(rest.substr(end + fn_close.size())).empty()) return false;
    rest = rest.substr(0, end);
  }
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  for (;;) {
    const size_t at = rest.find(p_open);
    if (at == std::string_view::npos) {
      if (!trim_space(rest).empty()) return false;
      break;
    }
    if (!trim_space(rest.substr(0, at)).empty()) return false;
    rest = rest.substr(at + p_open.size());
    const size_t gt = rest.find('>');
    if (gt == std::string_view::npos) return false;
    const std::string pname(trim_space(rest.substr(0, gt)));
    rest = rest.substr(gt + 1);
    size_t close = rest.find(p_close);
    // a value may run to the next parameter or the end when the model left out </parameter>
    const size_t next = rest.find(p_open);
    size_t value_end = close;
    if (close == std::string_view::npos || (next != std::string_view::npos && next < close)) value_end = next == std::string_view::npos ? rest.size() : next;
    const std::string value(trim_newlines(rest.substr(0, value_end)));
    rest = rest.substr(value_end == close && close != std::string_view::npos ? close + p_close.size() : value_end);
    // As the constrained grammar writes them (json_constraint_tools.hpp): a parameter whose
    // schema admits only strings is its text; others are JSON. Unconstrained models write what
    // the template renders for past calls, Python's str() of scalars: True, False and None are
    // read as JSON's. A parameter the tools do not describe: JSON where it parses to a non-string,
    // else the text.
    const auto [schema, root] = param_schema(tools, call.name, pname);
    if (schema && xml_parameter_is_string(*schema, *root)) {
      args[pname] = value;
    } else {
      auto j = nlohmann::ordered_json::parse(value, nullptr, false);
      if (j.is_discarded() && schema && (value == "True" || value == "False")) j = value == "True";
      else if (j.is_discarded() && schema && value == "None") j = nullptr;
      args[pname] = (j.is_discarded() || (!schema && j.is_string())) ? nlohmann::ordered_json(value) : j;
    }
  }
  call.arguments = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return true;
}

}  // namespace

ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format, const nlohmann::ordered_json& tools) {
  ParsedToolCalls out;
  if (format == ToolCallFormat::kKimiSections) {
    constexpr std::string_view sec_open = "<|tool_calls_section_begin|>", sec_close = "<|tool_calls_section_end|>",
                               c_open = "<|tool_call_begin|>", c_arg = "<|tool_call_argument_begin|>", c_close = "<|tool_call_end|>";
    size_t pos = 0;
    for (;;) {
      const size_t s = text.find(sec_open, pos);
      if (s == std::string_view::npos) { out.content.append(text.substr(pos)); return out; }
      out.content.append(text.substr(pos, s - pos));
      size_t e = text.find(sec_close, s);
      const size_t sec_end = e == std::string_view::npos ? text.size() : e;
      std::string_view sec = text.substr(s + sec_open.size(), sec_end - s - sec_open.size());
      std::vector<ToolCall> calls;
      bool ok = true;
      for (size_t q = 0;;) {
        const size_t b = sec.find(c_open, q);
        if (b == std::string_view::npos) { ok = ok && trim_space(sec.substr(q)).empty(); break; }
        const size_t a = sec.find(c_arg, b);
        const size_t c = sec.find(c_close, b);
        if (a == std::string_view::npos || c == std::string_view::npos || a > c) { ok = false; break; }
        std::string id(trim_space(sec.substr(b + c_open.size(), a - b - c_open.size())));
        // "functions.NAME:IDX" -> NAME
        std::string name = id;
        if (name.rfind("functions.", 0) == 0) name = name.substr(10);
        if (const size_t colon = name.rfind(':'); colon != std::string::npos) name = name.substr(0, colon);
        const std::string_view args = trim_space(sec.substr(a + c_arg.size(), c - a - c_arg.size()));
        const auto j = nlohmann::ordered_json::parse(args, nullptr, false);
        if (name.empty() || j.is_discarded() || !j.is_object()) { ok = false; break; }
        calls.push_back({name, j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)});
        q = c + c_close.size();
      }
      if (ok) out.calls.insert(out.calls.end(), calls.begin(), calls.end());
      else out.content.append(text.substr(s, (e == std::string_view::npos ? text.size() : e + sec_close.size()) - s));
      if (e == std::string_view::npos) return out;
      pos = e + sec_close.size();
    }
  }
  constexpr std::string_view open = "<tool_call>", close = "</tool_call>";
  size_t pos = 0;
  for (;;) {
    const size_t s = text.find(open, pos);
    if (s == std::string_view::npos) { out.content.append(text.substr(pos)); break; }
    out.content.append(text.substr(pos, s - pos));
    const size_t e = text.find(close, s);
    const size_t body_end = e == std::string_view::npos ? text.size() : e;  // an unclosed last call (stopped at </tool_call>)
    const std::string_view body = text.substr(s + open.size(), body_end - s - open.size());
    ToolCall call;
    const bool ok = format == ToolCallFormat::kJsonTags ? parse_json_call(body, call) : parse_xml_call(body, tools, call);
    const size_t next = e == std::string_view::npos ? text.size() : e + close.size();
    if (ok) out.calls.push_back(std::move(call));
    else out.content.append(text.substr(s, next - s));
    pos = next;
    if (pos >= text.size()) break;
  }
  // the text between and around calls: trailing whitespace left by the calls is not content
  if (!out.calls.empty()) out.content = std::string(trim_space(out.content));
  return out;
}

}  // namespace hanpu
