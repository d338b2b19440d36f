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

// ---- streaming -------------------------------------------------------------------------------

namespace hanpu {
namespace {

bool json_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Bytes of whole UTF-8 characters at the start of s (a character cut at the end waits; a byte that
// cannot start one counts as one, as the JSON writer replaces it).
size_t whole_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
    if (i + len > s.size()) break;
    i += len;
  }
  return i;
}

// A string's characters as the compact dump writes them, without the quotes.
std::string escaped(std::string_view s) {
  const std::string q = nlohmann::ordered_json(std::string(s)).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return q.substr(1, q.size() - 2);
}

std::string compact(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Length of the longest suffix of s that is a proper prefix of one of the markers.
size_t partial_marker_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t keep = 0;
  for (std::string_view m : markers) keep = std::max(keep, partial_tag_suffix(s, m));
  return keep;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// s is a proper prefix of p (more bytes could still make p).
bool may_become(std::string_view s, std::string_view p) { return s.size() < p.size() && p.substr(0, s.size()) == s; }

}  // namespace

// ---- JsonTextNormalizer ----

size_t JsonTextNormalizer::feed(std::string_view in, std::string& out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (complete_) return i;
    if (failed_) return in.size();
    if (!byte(in[i], out)) failed_ = true;
  }
  return in.size();
}

bool JsonTextNormalizer::value_done() {
  first_in_container_ = false;
  if (stack_.empty()) complete_ = true;
  else mode_ = Mode::kAfterValue;
  return true;
}

void JsonTextNormalizer::flush_string(std::string& out, bool all) {
  const size_t n = all ? decoded_.size() : whole_utf8(decoded_);
  if (n == 0) return;
  out += escaped(std::string_view(decoded_).substr(0, n));
  decoded_.erase(0, n);
}

bool JsonTextNormalizer::end_scalar(std::string& out) {
  const auto j = nlohmann::ordered_json::parse(scalar_, nullptr, false);
  if (j.is_discarded()) return false;
  out += compact(j);
  scalar_.clear();
  return value_done();
}

bool JsonTextNormalizer::byte(char c, std::string& out) {
  switch (mode_) {
    case Mode::kString: {
      if (escape_) {
        escape_text_ += c;
        if (escape_text_[0] == 'u') {
          if (escape_text_.size() < 5) return true;
          uint32_t cp = 0;
          for (size_t k = 1; k < 5; ++k) {
            const char h = escape_text_[k];
            const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (v < 0) return false;
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          escape_ = false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (high_surrogate_) return false;
            high_surrogate_ = cp;
            return true;
          }
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            if (!high_surrogate_) return false;
            cp = 0x10000 + ((high_surrogate_ - 0xD800) << 10) + (cp - 0xDC00);
            high_surrogate_ = 0;
          } else if (high_surrogate_) {
            return false;
          }
          append_utf8(decoded_, cp);
        } else {
          escape_ = false;
          if (high_surrogate_) return false;
          switch (c) {
            case '"': decoded_ += '"'; break;
            case '\\': decoded_ += '\\'; break;
            case '/': decoded_ += '/'; break;
            case 'b': decoded_ += '\b'; break;
            case 'f': decoded_ += '\f'; break;
            case 'n': decoded_ += '\n'; break;
            case 'r': decoded_ += '\r'; break;
            case 't': decoded_ += '\t'; break;
            default: return false;
          }
        }
        flush_string(out, false);
        return true;
      }
      if (high_surrogate_ && c != '\\') return false;  // a high surrogate needs its low half next
      if (c == '\\') {
        escape_ = true;
        escape_text_.clear();
        return true;
      }
      if (c == '"') {
        flush_string(out, true);
        out += '"';
        if (in_key_) {
          in_key_ = false;
          mode_ = Mode::kColon;
          return true;
        }
        return value_done();
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;  // control bytes must be escaped
      decoded_ += c;
      flush_string(out, false);
      return true;
    }
    case Mode::kNumber:
      if ((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
        scalar_ += c;
        return true;
      }
      return end_scalar(out) && byte(c, out);
    case Mode::kLiteral: {
      scalar_ += c;
      for (std::string_view lit : {"true", "false", "null"}) {
        if (scalar_ == lit) return end_scalar(out);
        if (may_become(scalar_, lit)) return true;
      }
      return false;
    }
    case Mode::kValue:
      if (json_space(c)) return true;
      if (c == ']' && first_in_container_ && !stack_.empty() && stack_.back() == '[') {
        stack_.pop_back();
        out += ']';
        return value_done();
      }
      first_in_container_ = false;
      if (c == '{' || c == '[') {
        out += c;
        stack_.push_back(c);
        mode_ = c == '{' ? Mode::kKey : Mode::kValue;
        first_in_container_ = true;
        return true;
      }
      if (c == '"') {
        out += '"';
        in_key_ = false;
        mode_ = Mode::kString;
        return true;
      }
      if (c == '-' || (c >= '0' && c <= '9')) {
        scalar_ = c;
        mode_ = Mode::kNumber;
        return true;
      }
      if (c == 't' || c == 'f' || c == 'n') {
        scalar_ = c;
        mode_ = Mode::kLiteral;
        return true;
      }
      return false;
    case Mode::kKey:
      if (json_space(c)) return true;
      if (c == '"') {
        first_in_container_ = false;
        out += '"';
        in_key_ = true;
        mode_ = Mode::kString;
        return true;
      }
      if (c == '}' && first_in_container_) {
        stack_.pop_back();
        out += '}';
        return value_done();
      }
      return false;
    case Mode::kColon:
      if (json_space(c)) return true;
      if (c != ':') return false;
      out += ':';
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue:
      if (json_space(c)) return true;
      if (c == ',') {
        out += ',';
        mode_ = stack_.back() == '{' ? Mode::kKey : Mode::kValue;
        return true;
      }
      if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
        stack_.pop_back();
        out += c;
        return value_done();
      }
      return false;
  }
  return false;
}

// ---- ToolCallStream ----

namespace {
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>", kFnOpen = "<function=",
                           kFnClose = "</function>", kParamOpen = "<parameter=", kParamClose = "</parameter>",
                           kSecOpen = "<|tool_calls_section_begin|>", kSecClose = "<|tool_calls_section_end|>",
                           kKimiCall = "<|tool_call_begin|>", kKimiArgs = "<|tool_call_argument_begin|>",
                           kKimiEnd = "<|tool_call_end|>";
}  // namespace

ToolCallStream::ToolCallStream(ToolCallFormat format, nlohmann::ordered_json tools, bool strip_leading_newlines)
    : format_(format), tools_(std::move(tools)), strip_leading_newlines_(strip_leading_newlines) {}

void ToolCallStream::start_call(const std::string& name, ToolCallDelta& d) {
  calls_.push_back({name, ""});
  d.calls.push_back({calls_.size() - 1, true, name, ""});
}

void ToolCallStream::args(const std::string& piece, ToolCallDelta& d, size_t index) {
  if (piece.empty() || calls_.empty()) return;
  if (index == SIZE_MAX) index = calls_.size() - 1;
  calls_[index].arguments += piece;
  if (!d.calls.empty() && d.calls.back().index == index) d.calls.back().arguments += piece;
  else d.calls.push_back({index, false, "", piece});
}

void ToolCallStream::content_text(std::string_view text, ToolCallDelta& d, bool) {
  for (char c : text) {
    if (json_space(c)) {
      held_space_ += c;
      continue;
    }
    // Whitespace before the first content byte is kept only while no call came (the final parse
    // trims the content of a reply with calls); between content bytes it is kept.
    if (!content_started_ && !calls_.empty()) held_space_.clear();
    d.content += held_space_;
    d.content += c;
    sent_content_ += held_space_;
    sent_content_ += c;
    held_space_.clear();
    content_started_ = true;
  }
}

bool ToolCallStream::xml_param_is_string(const std::string& param) const {
  const auto [schema, root] = param_schema(tools_, calls_.empty() ? std::string() : calls_.back().name, param);
  return schema && xml_parameter_is_string(*schema, *root);
}

ToolCallDelta ToolCallStream::push(std::string_view piece) {
  ToolCallDelta d;
  if (strip_leading_newlines_ && all_.empty()) {
    while (!piece.empty() && piece.front() == '\n') piece.remove_prefix(1);
    if (piece.empty()) return d;
  }
  all_.append(piece);
  buf_.append(piece);
  step(d);
  return d;
}

void ToolCallStream::step(ToolCallDelta& d) {
  const bool kimi = format_ == ToolCallFormat::kKimiSections;
  const std::string_view open = kimi ? kSecOpen : kCallOpen;
  auto skip_space = [&] {
    size_t n = 0;
    while (n < buf_.size() && json_space(buf_[n])) ++n;
    buf_.erase(0, n);
  };
  for (;;) {
    switch (state_) {
      case State::kContent: {
        const size_t at = buf_.find(open);
        if (at == std::string::npos) {
          const size_t keep = partial_marker_suffix(buf_, {open});
          content_text(std::string_view(buf_).substr(0, buf_.size() - keep), d, false);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        content_text(std::string_view(buf_).substr(0, at), d, false);
        buf_.erase(0, at + open.size());
        state_ = kimi ? State::kKimiBetween : State::kCallHead;
        break;
      }
      case State::kCallHead: {
        skip_space();
        if (buf_.empty()) return;
        if (format_ == ToolCallFormat::kXmlTags) {
          if (may_become(buf_, kFnOpen)) return;
          if (!starts_with(buf_, kFnOpen)) { state_ = State::kSkip; break; }
          const size_t gt = buf_.find('>');
          if (gt == std::string::npos) return;
          const std::string name(trim_space(std::string_view(buf_).substr(kFnOpen.size(), gt - kFnOpen.size())));
          if (name.empty()) { state_ = State::kSkip; break; }
          buf_.erase(0, gt + 1);
          start_call(name, d);
          args("{", d);
          xml_any_param_ = false;
          state_ = State::kXmlBetween;
          break;
        }
        // JSON: {"name": "NAME", "arguments": {  (or "parameters"), as the grammar writes it
        size_t i = 0;
        auto ws = [&] { while (i < buf_.size() && json_space(buf_[i])) ++i; };
        auto lit = [&](std::string_view t) -> int {  // 1 matched, 0 need more, -1 mismatch
          const std::string_view rest = std::string_view(buf_).substr(i);
          if (starts_with(rest, t)) { i += t.size(); return 1; }
          return may_become(rest, t) ? 0 : -1;
        };
        int r = lit("{");
        std::string name;
        if (r == 1) { ws(); r = lit("\"name\""); }
        if (r == 1) { ws(); r = lit(":"); }
        if (r == 1) {
          ws();
          r = lit("\"");
          if (r == 1) {  // the name's string, escapes and all
            size_t e = i;
            while (e < buf_.size() && buf_[e] != '"') e += buf_[e] == '\\' ? 2 : 1;
            if (e >= buf_.size()) r = 0;
            else {
              const auto j = nlohmann::ordered_json::parse(std::string_view(buf_).substr(i - 1, e - i + 2), nullptr, false);
              if (j.is_discarded() || !j.is_string()) r = -1;
              else { name = j.get<std::string>(); i = e + 1; }
            }
          }
        }
        if (r == 1) { ws(); r = lit(","); }
        if (r == 1) {
          ws();
          r = lit("\"arguments\"");
          if (r == -1) r = lit("\"parameters\"");
        }
        if (r == 1) { ws(); r = lit(":"); }
        if (r == 1) {
          ws();
          r = i < buf_.size() ? (buf_[i] == '{' ? 1 : -1) : 0;
        }
        if (r == 0) return;
        if (r < 0) { state_ = State::kSkip; break; }
        buf_.erase(0, i);
        start_call(name, d);
        json_ = JsonTextNormalizer();
        state_ = State::kArgs;
        break;
      }
      case State::kArgs: {
        std::string out;
        const size_t n = json_.feed(buf_, out);
        buf_.erase(0, n);
        args(out, d);
        if (json_.failed()) { state_ = State::kSkip; break; }
        if (!json_.complete()) return;
        state_ = State::kCallTail;
        break;
      }
      case State::kCallTail: {
        const std::string_view end = kimi ? kKimiEnd : kCallClose;
        const size_t at = buf_.find(end);
        if (at == std::string::npos) return;
        buf_.erase(0, at + end.size());
        state_ = kimi ? State::kKimiBetween : State::kContent;
        break;
      }
      case State::kXmlBetween: {
        skip_space();
        if (buf_.empty()) return;
        if (starts_with(buf_, kParamOpen)) {
          const size_t gt = buf_.find('>');
          if (gt == std::string::npos) return;
          xml_param_ = std::string(trim_space(std::string_view(buf_).substr(kParamOpen.size(), gt - kParamOpen.size())));
          buf_.erase(0, gt + 1);
          xml_string_ = xml_param_is_string(xml_param_);
          args((xml_any_param_ ? "," : "") + compact(xml_param_) + ":" + (xml_string_ ? "\"" : ""), d);
          xml_any_param_ = true;
          xml_value_.clear();
          xml_newlines_.clear();
          xml_value_started_ = false;
          state_ = State::kXmlValue;
          break;
        }
        if (starts_with(buf_, kFnClose)) {
          buf_.erase(0, kFnClose.size());
          args("}", d);
          state_ = State::kCallTail;
          break;
        }
        if (starts_with(buf_, kCallClose)) {  // </function> left out
          buf_.erase(0, kCallClose.size());
          args("}", d);
          state_ = State::kContent;
          break;
        }
        if (may_become(buf_, kParamOpen) || may_become(buf_, kFnClose) || may_become(buf_, kCallClose)) return;
        state_ = State::kSkip;
        break;
      }
      case State::kXmlValue: {
        // The value ends where parse_tool_calls ends it: at </parameter> (taken), or at the next
        // parameter, </function> or </tool_call> (left for kXmlBetween).
        size_t end = std::string::npos, take = 0;
        for (std::string_view m : {kParamClose, kParamOpen, kFnClose, kCallClose}) {
          const size_t at = buf_.find(m);
          if (at < end) {
            end = at;
            take = m == kParamClose ? m.size() : 0;
          }
        }
        const bool last = end != std::string::npos;
        const size_t n = last ? end : buf_.size() - partial_marker_suffix(buf_, {kParamClose, kParamOpen, kFnClose, kCallClose});
        const std::string_view part = std::string_view(buf_).substr(0, n);
        if (xml_string_) {
          // The text as a JSON string: leading and trailing line feeds trimmed (trim_newlines), a
          // run of them held until a character follows.
          std::string pending;
          for (char c : part) {
            if (c == '\n' || c == '\r') {
              if (xml_value_started_) xml_newlines_ += c;
              continue;
            }
            xml_value_started_ = true;
            pending += xml_newlines_;
            xml_newlines_.clear();
            pending += c;
          }
          xml_value_ += pending;
          const size_t whole = last ? xml_value_.size() : whole_utf8(xml_value_);
          std::string piece = escaped(std::string_view(xml_value_).substr(0, whole));
          xml_value_.erase(0, whole);
          if (last) piece += '"';
          args(piece, d);
        } else {
          xml_value_.append(part);
          if (last) {
            // As parse_tool_calls reads a value that is not a plain string.
            const std::string value(trim_newlines(xml_value_));
            const auto [schema, root] = param_schema(tools_, calls_.back().name, xml_param_);
            auto j = nlohmann::ordered_json::parse(value, nullptr, false);
            if (j.is_discarded() && schema && (value == "True" || value == "False")) j = value == "True";
            else if (j.is_discarded() && schema && value == "None") j = nullptr;
            args(compact((j.is_discarded() || (!schema && j.is_string())) ? nlohmann::ordered_json(value) : j), d);
          }
        }
        buf_.erase(0, n + take);
        if (!last) return;
        state_ = State::kXmlBetween;
        break;
      }
      case State::kKimiBetween: {
        skip_space();
        if (buf_.empty()) return;
        if (starts_with(buf_, kSecClose)) {
          buf_.erase(0, kSecClose.size());
          state_ = State::kContent;
          break;
        }
        if (starts_with(buf_, kKimiCall)) {
          const size_t a = buf_.find(kKimiArgs);
          if (a == std::string::npos) return;
          size_t i = a + kKimiArgs.size();
          while (i < buf_.size() && json_space(buf_[i])) ++i;
          if (i >= buf_.size()) return;
          if (buf_[i] != '{') { state_ = State::kSkip; break; }
          std::string name(trim_space(std::string_view(buf_).substr(kKimiCall.size(), a - kKimiCall.size())));
          if (name.rfind("functions.", 0) == 0) name = name.substr(10);
          if (const size_t colon = name.rfind(':'); colon != std::string::npos) name = name.substr(0, colon);
          if (name.empty()) { state_ = State::kSkip; break; }
          buf_.erase(0, i);
          start_call(name, d);
          json_ = JsonTextNormalizer();
          state_ = State::kArgs;
          break;
        }
        if (may_become(buf_, kSecClose) || may_become(buf_, kKimiCall)) return;
        state_ = State::kSkip;
        break;
      }
      case State::kSkip:
        // A call this stream cannot follow: its bytes wait for finish(), which sends what the
        // whole reply's parse makes of it.
        buf_.clear();
        return;
    }
  }
}

ToolCallDelta ToolCallStream::finish() {
  ToolCallDelta d;
  const ParsedToolCalls parsed = parse_tool_calls(all_, format_, tools_);
  for (size_t i = 0; i < parsed.calls.size(); ++i) {
    const ToolCall& c = parsed.calls[i];
    if (i >= calls_.size()) {
      start_call(c.name, d);
      args(c.arguments, d);
    } else if (starts_with(c.arguments, calls_[i].arguments)) {
      args(c.arguments.substr(calls_[i].arguments.size()), d, i);
    }
  }
  if (starts_with(parsed.content, sent_content_)) {
    const std::string rest = parsed.content.substr(sent_content_.size());
    d.content += rest;
    sent_content_ += rest;
  }
  return d;
}

}  // namespace hanpu
