// HTTP endpoints of `hanpu serve` on cpp-httplib (server.hpp, docs/SERVE.md): request parsing and
// validation in OpenAI's shapes, server-sent events, authentication, metrics and shutdown.
#include "serve/server.hpp"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "hanpu/chat_output.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
#include "serve/anthropic.hpp"
#include "serve/chat_page.hpp"
#include "model/json_constraint_schema.hpp"
#include "model/json_constraint_tools.hpp"

namespace hanpu::serve {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// OpenAI allows at most 4 stop sequences; more would only slow the per-token search.
constexpr size_t kMaxStopStrings = 4;
// A stop string longer than this is a mistake, not a stop sequence (and is held back per token).
constexpr size_t kMaxStopBytes = 256;
// Choices per request (n): each is a sequence with its own state; 8 keeps one request from
// filling the scheduler's slots on a small machine.
constexpr int64_t kMaxChoices = 8;

/// An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
  std::string type = "invalid_request_error";
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

const char* json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "value";
  }
}

ApiError wrong_type(const std::string& field, const json& got, const std::string& expected) {
  return {400, "'" + field + "': expected " + expected + ", got " + json_type_name(got) + " " + dump(got).substr(0, 80),
          field, "invalid_type"};
}

// ---- chat template --------------------------------------------------------------------------

enum class TemplateKind { kNone, kChatMl, kJinja, kUnrecognised };

struct ChatTemplateInfo {
  TemplateKind kind = TemplateKind::kNone;
  std::string description;  // for the startup line and errors
  std::shared_ptr<const ChatTemplate> tmpl;       // kJinja: the default template
  std::shared_ptr<const ChatTemplate> tools_tmpl;  // kJinja: the one for requests with tools ("tool_use" if named)
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // bos_token, eos_token, ... (kJinja)
};

// The checkpoint's own chat template, rendered by hanpu's Jinja subset (hanpu/chat_template.hpp)
// as transformers renders it. ChatML (Tokenizer::apply_chat_template) is the fallback for a
// checkpoint without a template whose tokenizer has <|im_start|> and <|im_end|>. A template
// outside the subset is reported by construct and line, and chat requests are refused with it.
ChatTemplateInfo detect_chat_template(const std::string& model_dir, const Tokenizer* tok, const ModelFamily* family) {
  if (!tok) return {TemplateKind::kNone, "no tokenizer (tokenizer.json or tiktoken.model)"};
  ChatTemplateInfo info;
  try {
    std::string origin, tools_origin;
    const std::string text = find_chat_template(model_dir, false, &origin);
    if (!origin.empty()) {
      info.tmpl = std::make_shared<const ChatTemplate>(ChatTemplate::parse(text, origin));
      const std::string tools_text = find_chat_template(model_dir, true, &tools_origin);
      info.tools_tmpl = tools_origin == origin ? info.tmpl : std::make_shared<const ChatTemplate>(ChatTemplate::parse(tools_text, tools_origin));
      info.special_tokens = chat_template_special_tokens(model_dir);
      info.kind = TemplateKind::kJinja;
      info.description = "the checkpoint's (" + origin + "), rendered as Jinja";
      return info;
    }
  } catch (const Error& e) {
    return {TemplateKind::kUnrecognised, std::string("a chat_template hanpu cannot render: ") + e.what()};
  }
  // The family's fallback (its registry row, hanpu/model_family.hpp); a model of no known family
  // gets ChatML when its tokenizer has the tokens.
  if (family && family->chat_template.empty())
    return {TemplateKind::kUnrecognised, "none (no chat_template in the checkpoint, and " + family->name +
                                             " checkpoints have no fallback template: they ship their own)"};
  if (family && family->chat_template != "chatml")
    return {TemplateKind::kUnrecognised, "none (the " + family->name + " fallback template \"" + family->chat_template +
                                             "\" is not one hanpu has)"};
  if (tok->token_to_id("<|im_start|>") && tok->token_to_id("<|im_end|>"))
    return {TemplateKind::kChatMl, std::string("ChatML (no chat_template in the checkpoint; ") +
                                       (family ? family->name + "'s fallback" : std::string("no known family")) +
                                       ", and its tokenizer has <|im_start|> and <|im_end|>)"};
  return {TemplateKind::kUnrecognised, "none (no chat_template and no ChatML tokens)"};
}

// ---- metrics ----------------------------------------------------------------------------------

struct HttpMetrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> responses;  // (path, status) -> count
  void count(const std::string& path, int status) {
    std::lock_guard lock(mu);
    ++responses[{path, status}];
  }
};

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// ---- the server -------------------------------------------------------------------------------

// How a chat reply is split back into OpenAI's fields (hanpu/chat_output.hpp): only for a
// checkpoint template that knows <think> blocks or tool calls.
struct ReplyFormat {
  std::string forced_prefix;      // generation prompt text the reply continues (tool_choice required/named)
  bool split_reasoning = false;   // the template writes <think> blocks
  bool reasoning_opened = false;  // ... and the prompt ends inside one
  bool parse_tools = false;       // the request has tools and the template shows a call format
  ToolCallFormat tool_format = ToolCallFormat::kJsonTags;
  nlohmann::ordered_json tools;
};

/// Renders the conversation as the next turn will begin, given this turn's reply message: the
/// tokens every next turn shares, and the lengths worth a snapshot within them. Empty when the
/// conversation cannot be rendered that way.
using NextTurnPrefix = std::function<std::pair<std::vector<int32_t>, std::vector<int64_t>>(const json& reply)>;

struct ParsedRequest {
  GenerationRequest gen;
  bool stream = false, include_usage = false;
  std::string max_tokens_field;  // the field the limit came from, for errors
  ReplyFormat reply;
  NextTurnPrefix next_turn;      // chat: see warm_next_turn()
  bool logprobs = false;         // chat: 'logprobs': true; completions: 'logprobs' given
  bool echo = false;             // completions: the prompt's text before the output
  bool wants_schema = false;     // chat: response_format json_schema (compiled into gen.json_schema)
};

class Api {
 public:
  Api(const HybridModel& model, const Tokenizer* tok, const ServerOptions& so, Scheduler& sched)
      : model_(model), tok_(tok), so_(so), sched_(sched), chat_template_(detect_chat_template(so.model_dir, tok, find_model_family(model.config().model_type))) {
    std::random_device rd;
    id_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  const ChatTemplateInfo& chat_template() const { return chat_template_; }
  HttpMetrics& http_metrics() { return http_; }
  std::atomic<bool> draining{false};
  /// Generation responses whose body is still being sent (a response's releaser, which
  /// cpp-httplib calls when the response is done or dropped, counts it down): a drain waits for
  /// them, since the scheduler finishing a request does not mean its client has the bytes yet.
  std::atomic<int> responses_in_flight{0};

  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void messages(const httplib::Request& req, httplib::Response& res);
  void count_tokens(const httplib::Request& req, httplib::Response& res);
  void models(httplib::Response& res) const;
  void metrics(httplib::Response& res);

 private:
  json parse_body(const httplib::Request& req) const;
  void compile_response_schema(ParsedRequest& p, const std::string& raw_body) const;
  ParsedRequest parse_common(const json& body, bool chat) const;
  ParsedRequest anthropic_request(const nlohmann::ordered_json& raw) const;  // /v1/messages onto the chat request
  std::vector<int32_t> chat_prompt(const json& messages, const json& body, const std::string& raw_body, ParsedRequest& p) const;
  std::vector<int32_t> template_prompt(const std::string& raw_body, ParsedRequest& p) const;
  void warm_next_turn(const ParsedRequest& p, const json& reply);
  std::vector<std::shared_ptr<GenerationHandle>> submit(ParsedRequest& p, const char* prompt_field);
  std::vector<int32_t> completion_prompt(const json& prompt) const;
  std::string new_id(const char* prefix) {
    return prefix + std::to_string(id_seed_ % 100000) + "-" + std::to_string(++next_id_);
  }

  const HybridModel& model_;
  const Tokenizer* tok_;
  const ServerOptions& so_;
  Scheduler& sched_;
  const ChatTemplateInfo chat_template_;
  HttpMetrics http_;
  uint64_t id_seed_ = 0;
  std::atomic<uint64_t> next_id_{0};
};

json Api::parse_body(const httplib::Request& req) const {
  // The Content-Type is not checked: `curl -d` sends application/x-www-form-urlencoded, and the
  // body is JSON or an error either way.
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw ApiError{400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json"};
  }
  if (!body.is_object()) throw ApiError{400, std::string("the request body must be a JSON object, got ") + json_type_name(body), "", "invalid_json"};
  return body;
}

// The fields each endpoint accepts. OpenAI answers 400 "Unrecognized request argument supplied"
// for any other; so does this server. Some are accepted only at their default (checked below).
// Extensions: top_k, ignore_eos (as vLLM and llama.cpp's server name them), chat_template_kwargs
// with enable_thinking (as vLLM).
const std::vector<std::string>& known_fields(bool chat) {
  static const std::vector<std::string> chat_fields = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
      "stop", "stream", "stream_options", "n", "user", "presence_penalty", "frequency_penalty", "logprobs",
      "chat_template_kwargs", "ignore_eos", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs",
      "response_format", "repetition_penalty", "repeat_last_n", "thinking_budget_tokens", "logit_bias"};
  static const std::vector<std::string> completion_fields = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
      "stream_options", "n", "user", "presence_penalty", "frequency_penalty", "logprobs", "echo", "best_of",
      "ignore_eos", "repetition_penalty", "repeat_last_n", "logit_bias"};
  return chat ? chat_fields : completion_fields;
}

double number_field(const json& body, const std::string& name, double lo, double hi, double dflt) {
  if (!body.contains(name) || body[name].is_null()) return dflt;
  const json& v = body[name];
  if (!v.is_number()) throw wrong_type(name, v, "a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    throw ApiError{400, "'" + name + "': " + dump(v) + " is out of range, expected " + dump(lo) + " to " + dump(hi), name,
                   "invalid_value"};
  return x;
}

int64_t integer_field(const json& body, const std::string& name, int64_t lo, int64_t hi, int64_t dflt) {
  if (!body.contains(name) || body[name].is_null()) return dflt;
  const json& v = body[name];
  if (!v.is_number_integer()) throw wrong_type(name, v, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw ApiError{400, "'" + name + "': " + dump(v) + " is out of range", name, "invalid_value"};
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw ApiError{400, "'" + name + "': " + std::to_string(x) + " is out of range, expected " + std::to_string(lo) +
                            " to " + std::to_string(hi),
                   name, "invalid_value"};
  return x;
}

bool bool_field(const json& body, const std::string& name, bool dflt) {
  if (!body.contains(name) || body[name].is_null()) return dflt;
  if (!body[name].is_boolean()) throw wrong_type(name, body[name], "a boolean");
  return body[name].get<bool>();
}

ParsedRequest Api::parse_common(const json& body, bool chat) const {
  const auto& known = known_fields(chat);
  for (const auto& [key, value] : body.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw ApiError{400, "Unrecognized request argument supplied: " + key, key, "unknown_parameter"};
  if (!body.contains("model")) throw ApiError{400, "you must provide a model parameter", "model", "missing_required_parameter"};
  if (!body["model"].is_string()) throw wrong_type("model", body["model"], "a string");
  if (body["model"].get<std::string>() != so_.model_name)
    throw ApiError{404,
                   "The model '" + body["model"].get<std::string>() + "' does not exist; this server serves '" +
                       so_.model_name + "'",
                   "model", "model_not_found"};
  ParsedRequest p;
  // n choices share the prompt's prefill (Scheduler::submit_choices); each takes a running slot,
  // so at most --parallel + --max-queue of them, and 8 as a sanity bound (OpenAI allows 128).
  p.gen.n = static_cast<int>(integer_field(body, "n", 1, kMaxChoices, 1));
  // Accepted only at the value that means "off": this server has no best_of.
  integer_field(body, "best_of", 1, 1, 1);
  // Penalties (hanpu::apply_penalties): OpenAI's two over the generated tokens, in OpenAI's
  // range; repetition_penalty (vLLM's and llama.cpp's extension) over the last repeat_last_n
  // prompt and generated tokens (llama.cpp's name and default, 64; -1: the whole sequence).
  p.gen.sampling.presence_penalty = static_cast<float>(number_field(body, "presence_penalty", -2, 2, 0));
  p.gen.sampling.frequency_penalty = static_cast<float>(number_field(body, "frequency_penalty", -2, 2, 0));
  p.gen.sampling.repetition_penalty = static_cast<float>(number_field(body, "repetition_penalty", 0, 10, 1));
  if (body.contains("repetition_penalty") && body["repetition_penalty"].is_number() && body["repetition_penalty"].get<double>() <= 0)
    throw ApiError{400, "'repetition_penalty': " + dump(body["repetition_penalty"]) + " is out of range, expected more than 0 up to 10",
                   "repetition_penalty", "invalid_value"};
  p.gen.sampling.repetition_window = integer_field(body, "repeat_last_n", -1, so_.context_tokens, 64);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    // OpenAI's: {"token id": bias from -100 to 100}, at most 300 entries.
    const json& lb = body["logit_bias"];
    if (!lb.is_object()) throw wrong_type("logit_bias", lb, "an object of token ids to biases");
    if (lb.size() > 300)
      throw ApiError{400, "'logit_bias': " + std::to_string(lb.size()) + " entries, expected at most 300", "logit_bias", "invalid_value"};
    const int64_t vocab = model_.config().vocab_size;
    for (const auto& [key, value] : lb.items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id >= vocab)
        throw ApiError{400, "'logit_bias': key '" + key + "' is not a token id in [0, " + std::to_string(vocab) + ")",
                       "logit_bias", "invalid_value"};
      double bias = 0;
      try {
        bias = number_field(lb, key, -100, 100, 0);
      } catch (ApiError& e) {
        e.param = "logit_bias." + key;
        e.message = "'logit_bias." + e.message.substr(1);
        throw;
      }
      p.gen.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
    }
  }
  const int64_t room_limit = so_.context_tokens;
  if (chat) {
    // OpenAI: logprobs a boolean, top_logprobs 0 to 20 (only with logprobs true).
    p.logprobs = bool_field(body, "logprobs", false);
    const int64_t top = integer_field(body, "top_logprobs", 0, 20, -1);
    if (top >= 0 && !p.logprobs)
      throw ApiError{400, "'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value"};
    if (p.logprobs) p.gen.top_logprobs = static_cast<int>(std::max<int64_t>(top, 0));
    if (body.contains("response_format") && !body["response_format"].is_null()) {
      const json& rf = body["response_format"];
      if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
        throw ApiError{400, "'response_format': expected an object with a 'type'", "response_format", "invalid_type"};
      if (rf["type"] == "json_object") {
        p.gen.json_object = true;  // constrained sampling (hanpu/generator.hpp); checked in chat_prompt
      } else if (rf["type"] == "json_schema") {
        // Compiled in completions() from the raw body, whose key order this parse does not keep
        // (properties are written in the schema's order).
        if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
          throw ApiError{400, "'response_format.json_schema': expected an object {\"name\": ..., \"schema\": {...}, "
                              "\"strict\": true}", "response_format.json_schema", "invalid_type"};
        const json& js = rf["json_schema"];
        if (!js.contains("schema") || !(js["schema"].is_object() || js["schema"].is_boolean()))
          throw ApiError{400, "'response_format.json_schema.schema': expected a JSON Schema object", 
                         "response_format.json_schema.schema", "invalid_type"};
        if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
          throw wrong_type("response_format.json_schema.strict", js["strict"], "a boolean");
        if (js.contains("name") && !js["name"].is_null() && !js["name"].is_string())
          throw wrong_type("response_format.json_schema.name", js["name"], "a string");
        p.wants_schema = true;  // strict or not, the schema is enforced
      } else if (rf["type"] != "text") {
        throw ApiError{400, "'response_format' " + dump(rf["type"]) + " is not supported by hanpu serve; expected "
                            "{\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", ...}",
                       "response_format", "unsupported_value"};
      }
    }
    // Extension (Anthropic's thinking.budget_tokens maps onto it): reasoning tokens allowed before
    // the end-of-thinking marker is forced (set up in template_prompt).
    p.gen.thinking_budget = integer_field(body, "thinking_budget_tokens", 0, room_limit, -1);
    if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null() && !body["parallel_tool_calls"].is_boolean())
      throw wrong_type("parallel_tool_calls", body["parallel_tool_calls"], "a boolean");
  } else {
    // Completions: logprobs is the number of alternatives, 0 to 5.
    const int64_t top = integer_field(body, "logprobs", 0, 5, -1);
    p.logprobs = top >= 0;
    p.gen.top_logprobs = static_cast<int>(top);
    p.echo = bool_field(body, "echo", false);
  }
  if (body.contains("user") && !body["user"].is_null() && !body["user"].is_string()) throw wrong_type("user", body["user"], "a string");

  p.gen.ignore_eos = bool_field(body, "ignore_eos", false);
  p.stream = bool_field(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& o = body["stream_options"];
    if (!o.is_object()) throw wrong_type("stream_options", o, "an object");
    for (const auto& [key, value] : o.items())
      if (key != "include_usage")
        throw ApiError{400, "Unrecognized request argument supplied: stream_options." + key, "stream_options." + key,
                       "unknown_parameter"};
    p.include_usage = bool_field(o, "include_usage", false);
  }
  const int64_t room = so_.context_tokens;
  int64_t max_tokens = integer_field(body, "max_tokens", 0, room, -1);
  p.max_tokens_field = "max_tokens";
  if (chat) {
    const int64_t mct = integer_field(body, "max_completion_tokens", 0, room, -1);
    if (mct >= 0) {
      max_tokens = mct;  // OpenAI's newer name wins when both are given
      p.max_tokens_field = "max_completion_tokens";
    }
  }
  p.gen.max_tokens = max_tokens;  // -1: until the context is full (set once the prompt is known)
  const double temperature = number_field(body, "temperature", 0, 2, 1.0);  // OpenAI's range and default
  p.gen.sampling.temperature = static_cast<float>(temperature);
  p.gen.sampling.top_p = static_cast<float>(number_field(body, "top_p", 0, 1, 1.0));
  if (body.contains("top_p") && body["top_p"].is_number() && body["top_p"].get<double>() <= 0)
    throw ApiError{400, "'top_p': " + dump(body["top_p"]) + " is out of range, expected more than 0 up to 1", "top_p",
                   "invalid_value"};
  p.gen.sampling.top_k = static_cast<int>(integer_field(body, "top_k", 0, 1 << 30, 0));
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) throw wrong_type("seed", body["seed"], "an integer");
    p.gen.sampling.seed = body["seed"].is_number_unsigned() ? body["seed"].get<uint64_t>()
                                                            : static_cast<uint64_t>(body["seed"].get<int64_t>());
  } else {
    std::random_device rd;
    p.gen.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      p.gen.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& e : s) {
        if (!e.is_string()) throw wrong_type("stop", e, "a string or an array of strings");
        p.gen.stop.push_back(e.get<std::string>());
      }
    } else {
      throw wrong_type("stop", s, "a string or an array of strings");
    }
    if (p.gen.stop.size() > kMaxStopStrings)
      throw ApiError{400, "'stop': " + std::to_string(p.gen.stop.size()) + " stop sequences, expected at most " +
                              std::to_string(kMaxStopStrings),
                     "stop", "invalid_value"};
    for (const std::string& st : p.gen.stop)
      if (st.empty() || st.size() > kMaxStopBytes)
        throw ApiError{400, "'stop': a stop sequence of " + std::to_string(st.size()) + " bytes, expected 1 to " +
                                std::to_string(kMaxStopBytes),
                       "stop", "invalid_value"};
    if (!tok_) throw ApiError{400, "'stop' needs a tokenizer (text output); this model has no tokenizer.json", "stop", "unsupported_value"};
  }
  return p;
}

// The checkpoint's template (transformers' apply_chat_template): messages and tools as the client
// sent them (the raw body is parsed again keeping key order, which tojson output depends on), the
// tokenizer's special tokens and chat_template_kwargs as further variables.

// tool_choice: "auto", "none", "required", or {"type": "function", "function": {"name": ...}};
// returns "" for auto/none/absent, "*" for required, else the function's name.
std::string forced_tool(const json& body) {
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return "";
  const json& c = body["tool_choice"];
  if (c.is_string()) {
    if (c == "auto" || c == "none") return "";
    if (c == "required") return "*";
  } else if (c.is_object() && c.value("type", "") == "function" && c.contains("function") && c["function"].is_object() &&
             c["function"].contains("name") && c["function"]["name"].is_string()) {
    return c["function"]["name"].get<std::string>();
  }
  throw ApiError{400, "'tool_choice': expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}}, got " + dump(c).substr(0, 80),
                 "tool_choice", "invalid_value"};
}

std::vector<int32_t> Api::template_prompt(const std::string& raw_body, ParsedRequest& p) const {
  std::vector<int64_t>& checkpoints = p.gen.extra_checkpoints;
  ReplyFormat& reply = p.reply;
  const nlohmann::ordered_json raw = nlohmann::ordered_json::parse(raw_body, nullptr, false);
  nlohmann::ordered_json messages = raw["messages"];
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    nlohmann::ordered_json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw ApiError{400, "'" + where + "': expected an object with a string 'role'", where, "invalid_value"};
    // OpenAI clients send a call's arguments as a JSON string; templates that iterate them
    // (Qwen3.5's arguments|items) need the object. As vLLM does, a string that parses as a JSON
    // object is passed as the object (templates that print strings print its tojson instead).
    if (m.contains("tool_calls") && m["tool_calls"].is_array())
      for (auto& tc : m["tool_calls"])
        if (tc.is_object() && tc.contains("function") && tc["function"].is_object() && tc["function"].contains("arguments") &&
            tc["function"]["arguments"].is_string()) {
          auto parsed = nlohmann::ordered_json::parse(tc["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) tc["function"]["arguments"] = std::move(parsed);
        }
  }
  nlohmann::ordered_json tools = raw.contains("tools") ? raw["tools"] : nlohmann::ordered_json(nullptr);
  if (!tools.is_null()) {
    if (!tools.is_array()) throw ApiError{400, "'tools': expected an array of tools", "tools", "invalid_type"};
    for (const auto& t : tools)
      if (!t.is_object()) throw ApiError{400, "'tools': expected an array of tool objects", "tools", "invalid_type"};
    if (tools.empty() || (raw.contains("tool_choice") && raw["tool_choice"] == "none")) tools = nullptr;
  }
  const std::string forced = forced_tool(json::parse(raw.contains("tool_choice") ? "{\"tool_choice\":" + raw["tool_choice"].dump() + "}" : "{}"));
  if (!forced.empty() && tools.is_null())
    throw ApiError{400, "'tool_choice': " + std::string(forced == "*" ? "\"required\"" : "function '" + forced + "'") +
                        " needs a non-empty 'tools'", "tool_choice", "invalid_value"};
  if (!forced.empty() && forced != "*") {
    bool found = false;
    for (const auto& t : tools)
      if (t.contains("function") && t["function"].is_object() && t["function"].value("name", "") == forced) found = true;
    if (!found)
      throw ApiError{400, "'tool_choice': function '" + forced + "' is not in 'tools'", "tool_choice", "invalid_value"};
  }
  nlohmann::ordered_json kwargs = chat_template_.special_tokens;
  if (raw.contains("chat_template_kwargs") && !raw["chat_template_kwargs"].is_null()) {
    const auto& k = raw["chat_template_kwargs"];
    if (!k.is_object()) throw ApiError{400, "'chat_template_kwargs': expected an object", "chat_template_kwargs", "invalid_type"};
    for (const auto& [key, value] : k.items()) {
      if (key == "messages" || key == "tools" || key == "add_generation_prompt" || key == "documents")
        throw ApiError{400, "'chat_template_kwargs." + key + "': set by the request itself", "chat_template_kwargs." + key, "invalid_value"};
      kwargs[key] = value;
    }
  }
  const ChatTemplate& t = tools.is_null() ? *chat_template_.tmpl : *chat_template_.tools_tmpl;
  std::string text;
  try {
    text = t.render(messages, tools, true, kwargs);
  } catch (const Error& e) {
    throw ApiError{400, std::string("messages: the chat template refused them: ") + e.what(), "messages", "invalid_value"};
  }
  const std::string& src = t.source();
  if (src.find("</think>") != std::string::npos) {
    reply.split_reasoning = true;
    const size_t open = text.rfind("<think>"), close = text.rfind("</think>");
    reply.reasoning_opened = open != std::string::npos && (close == std::string::npos || close < open);
  }
  if (!tools.is_null()) {
    reply.parse_tools = true;
    // The template's own markers say what it teaches the model; a template that shows none (it
    // passes the tools in another way) leaves the family's format (its registry row).
    if (src.find("<|tool_call_begin|>") != std::string::npos) reply.tool_format = ToolCallFormat::kKimiSections;
    else if (src.find("<function=") != std::string::npos) reply.tool_format = ToolCallFormat::kXmlTags;
    else if (src.find("<tool_call>") != std::string::npos) reply.tool_format = ToolCallFormat::kJsonTags;
    else if (const ModelFamily* family = find_model_family(model_.config().model_type)) reply.tool_format = family->tool_call_format;
    else reply.parse_tools = false;
    reply.tools = tools;
  }
  if (p.gen.json_object || p.wants_schema) {
    if (!tools.is_null())
      throw ApiError{400, "'response_format' " + std::string(p.wants_schema ? "json_schema" : "json_object") +
                          " with 'tools': the reply is either a JSON document or tool calls; "
                          "send tool_choice \"none\" or drop one", "response_format", "invalid_value"};
    if (reply.reasoning_opened) {  // the JSON is the answer, not thinking: the block closes empty
      text += "\n</think>\n\n";
      reply.reasoning_opened = false;
    }
  }
  auto grammar_options = [&] {
    hanpu::ToolCallGrammar::Options o;
    o.format = reply.tool_format;
    // OpenAI's default allows parallel calls: then more calls may follow the first, each
    // constrained the same way, until a stop token (or max_tokens leaves no room for another).
    o.parallel = !(raw.contains("parallel_tool_calls") && raw["parallel_tool_calls"] == false);
    for (const auto& t : tools) {
      const bool named = t.contains("function") && t["function"].is_object() && t["function"].contains("name") &&
                         t["function"]["name"].is_string();
      const auto& fn = named ? t["function"] : t;
      o.tools.push_back({named ? fn["name"].get<std::string>() : std::string(),
                         named && fn.contains("parameters") ? fn["parameters"] : nlohmann::ordered_json()});
    }
    return o;
  };
  if (forced.empty() && reply.parse_tools) {
    // tool_choice auto: the reply is free text until the model writes the format's opening marker;
    // from there the call is constrained as a required one (a lazy grammar, as llama.cpp's), so
    // a call the model starts always parses, names one of the tools and follows its schema. Tools
    // the grammar cannot enforce (a keyword it refuses, a bad name) leave the reply unconstrained,
    // as before: with auto nothing is refused.
    hanpu::ToolCallGrammar::Options o = grammar_options();
    o.lazy = true;
    bool named = true;
    for (const auto& t : o.tools) named = named && !t.name.empty();
    if (named) {
      try {
        p.gen.tool_calls = hanpu::ToolCallGrammar::compile(o);
        p.gen.reasoning_opened = reply.reasoning_opened;
      } catch (const hanpu::Error&) {
        p.gen.tool_calls = nullptr;
      }
    }
  }
  if (!forced.empty()) {
    // tool_choice required or named: the generation prompt goes on with the start of a call in
    // the template's format (and the function's name), and the call grammar masks every token
    // after it (src/model/json_constraint_tools.hpp): the name one of the tools, the arguments
    // following its parameters schema, the closing markers, then the end of the reply.
    if (!reply.parse_tools)
      throw ApiError{400, "'tool_choice': the chat template shows no tool-call format hanpu knows (<tool_call> JSON or XML, "
                          "Kimi's sections), so a call cannot be required", "tool_choice", "unsupported_value"};
    if (reply.reasoning_opened) {  // a call, not thinking, comes first: the block closes empty
      text += "\n</think>\n\n";
      reply.reasoning_opened = false;
    }
    hanpu::ToolCallGrammar::Options o = grammar_options();
    o.forced = forced == "*" ? "" : forced;
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string where = "tools[" + std::to_string(i) + "].function";
      if (o.tools[i].name.empty())
        throw ApiError{400, "'" + where + ".name': expected a string (a required call chooses among the tools by name)",
                       where + ".name", "invalid_value"};
    }
    try {
      p.gen.tool_calls = hanpu::ToolCallGrammar::compile(o);
    } catch (const hanpu::ToolSchemaError& e) {
      const std::string where = "tools[" + std::to_string(e.tool()) + "].function";
      const std::string param = e.keyword() == "name" && e.pointer().empty() ? where + ".name" : where + ".parameters" + e.pointer();
      throw ApiError{400, "'" + param + "' (tool '" + e.tool_name() + "', keyword '" + e.keyword() +
                              "'): a required tool call cannot be constrained to it: " + e.what(),
                     param, "unsupported_value"};
    }
    if (!p.gen.stop.empty())
      throw ApiError{400, "'stop' with tool_choice " + std::string(forced == "*" ? "\"required\"" : "naming a function") +
                          " could cut the call short; the generation ends when the call closes", "stop", "invalid_value"};
    const int64_t shortest = p.gen.tool_calls->min_bytes();
    if (p.gen.max_tokens >= 0 && p.gen.max_tokens < shortest)
      throw ApiError{400, "'" + p.max_tokens_field + "': " + std::to_string(p.gen.max_tokens) +
                          " is too few for the required tool call (its shortest form after the call's start, " +
                          std::to_string(shortest) + " bytes, may take as many tokens)",
                     p.max_tokens_field, "invalid_value"};
    const std::string& prefix = p.gen.tool_calls->prompt_prefix();
    text += prefix;
    reply.forced_prefix = prefix;
  }
  p.gen.reasoning_opened = reply.reasoning_opened;
  // A template that writes no <think> blocks leaves no reasoning to cap: the budget is ignored
  // there (as Anthropic's thinking on such a model always was).
  if (p.gen.thinking_budget >= 0 && !reply.split_reasoning) p.gen.thinking_budget = -1;
  // The marker as the templates write a closed block (Qwen3.5's and Kimi's "\n</think>\n\n").
  if (p.gen.thinking_budget >= 0) p.gen.think_end = tok_->encode("\n</think>\n\n", /*parse_special=*/true);
  std::vector<int32_t> ids = tok_->encode(text, /*parse_special=*/true);
  // As with ChatML below: a snapshot where the next turn's prompt will diverge.
  if (auto h = history_snapshot_length([&] { return t.render(messages, tools, false, kwargs); }, *tok_, ids)) checkpoints.push_back(*h);
  // And where the next turn will diverge, when the template renders this conversation's turns
  // anew then (the first turn of an agent's conversation has no next-turn snapshot before it).
  if (auto d = next_turn_divergence_length(
          [&] { return t.render(with_placeholder_next_turn(messages), tools, false, kwargs); }, *tok_, ids))
    checkpoints.push_back(*d);
  // The next turn: this conversation plus the reply, then a message not known yet. Two
  // renderings with different user messages share exactly what any next user turn shares.
  std::shared_ptr<const ChatTemplate> tmpl = tools.is_null() ? chat_template_.tmpl : chat_template_.tools_tmpl;
  const Tokenizer* tok = tok_;
  p.next_turn = [tmpl, messages, tools, kwargs, tok](const json& reply_msg) {
    nlohmann::ordered_json conv = messages;
    conv.push_back(nlohmann::ordered_json::parse(dump(reply_msg)));
    nlohmann::ordered_json a = conv, b = conv;
    a.push_back({{"role", "user"}, {"content", "A"}});
    b.push_back({{"role", "user"}, {"content", "B"}});
    std::vector<int32_t> ta = tok->encode(tmpl->render(a, tools, false, kwargs), true);
    const std::vector<int32_t> tb = tok->encode(tmpl->render(b, tools, false, kwargs), true);
    ta.resize(common_prefix(ta, tb));
    std::vector<int64_t> extra;
    const std::vector<int32_t> end = tok->encode(tmpl->render(conv, tools, false, kwargs), true);
    if (end.size() < ta.size() && std::equal(end.begin(), end.end(), ta.begin())) extra.push_back(static_cast<int64_t>(end.size()));
    return std::make_pair(std::move(ta), std::move(extra));
  };
  return ids;
}

std::vector<int32_t> Api::chat_prompt(const json& messages, const json& body, const std::string& raw_body, ParsedRequest& p) const {
  std::vector<int64_t>& checkpoints = p.gen.extra_checkpoints;
  if (!tok_)
    throw ApiError{400, "model '" + so_.model_name + "' has no tokenizer.json, so it has no chat: send token ids to "
                        "/v1/completions as 'prompt'", "messages", "no_tokenizer"};
  if (chat_template_.kind != TemplateKind::kChatMl && chat_template_.kind != TemplateKind::kJinja)
    throw ApiError{400, "model '" + so_.model_name + "': chat template " + chat_template_.description +
                            "; /v1/completions with a rendered prompt still works",
                   "messages", "unsupported_chat_template"};
  if (!messages.is_array()) throw wrong_type("messages", messages, "an array of messages");
  if (messages.empty()) throw ApiError{400, "'messages': empty, expected at least one message", "messages", "invalid_value"};
  if (chat_template_.kind == TemplateKind::kJinja) return template_prompt(raw_body, p);
  p.gen.thinking_budget = -1;  // the ChatML fallback splits no reasoning: nothing to cap
  if (!forced_tool(body).empty())
    throw ApiError{400, "'tool_choice': model '" + so_.model_name + "' has no chat template, and the ChatML fallback renders no tools",
                   "tool_choice", "unsupported_parameter"};
  if (body.contains("tools") && !body["tools"].is_null() && !(body["tools"].is_array() && body["tools"].empty()))
    throw ApiError{400, "'tools': model '" + so_.model_name + "' has no chat template, and the ChatML fallback renders no tools",
                   "tools", "unsupported_parameter"};
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object()) throw wrong_type(where, m, "an object with 'role' and 'content'");
    if (!m.contains("role") || !m["role"].is_string())
      throw ApiError{400, "'" + where + ".role': expected one of system, developer, user, assistant, tool", where + ".role", "invalid_value"};
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      throw ApiError{400, "'" + where + ".role': '" + role + "', expected one of system, developer, user, assistant, tool",
                     where + ".role", "invalid_value"};
    std::string content;
    const json c = m.contains("content") ? m["content"] : json(nullptr);
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {  // content parts: only text ones
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw ApiError{400, "'" + where + ".content': only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                         where + ".content", "unsupported_value"};
        content += part["text"].get<std::string>();
      }
    } else if (!(c.is_null() && role == "assistant")) {
      throw wrong_type(where + ".content", c, "a string or an array of text parts");
    }
    for (const auto& [key, value] : m.items())
      if (key != "role" && key != "content" && key != "name")
        throw ApiError{400, "'" + where + "." + key + "': not supported by hanpu serve (tool calls are not implemented)",
                       where + "." + key, "unsupported_parameter"};
    msgs.push_back({role, content});
  }
  bool thinking = false;
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    const json& k = body["chat_template_kwargs"];
    if (!k.is_object()) throw wrong_type("chat_template_kwargs", k, "an object");
    for (const auto& [key, value] : k.items())
      if (key != "enable_thinking")
        throw ApiError{400, "Unrecognized request argument supplied: chat_template_kwargs." + key,
                       "chat_template_kwargs." + key, "unknown_parameter"};
    thinking = bool_field(k, "enable_thinking", false);
  }
  std::string text;
  try {
    text = tok_->apply_chat_template(msgs, true, thinking);
  } catch (const Error& e) {
    throw ApiError{400, std::string("messages: ") + e.what(), "messages", "invalid_value"};
  }
  std::vector<int32_t> ids = tok_->encode(text, /*parse_special=*/true);
  // The conversation without the generation prompt is what the next turn shares: a snapshot there
  // lets it skip everything up to its new tokens (the generation prompt and any <think> block
  // differ once the reply is part of the history).
  // (The history alone may not be a valid conversation, no user message yet: then no snapshot.)
  if (auto h = history_snapshot_length([&] { return tok_->apply_chat_template(msgs, false, thinking); }, *tok_, ids))
    checkpoints.push_back(*h);
  const Tokenizer* tok = tok_;
  p.next_turn = [msgs, thinking, tok](const json& reply_msg) {
    const json sent = json::parse(dump(reply_msg));  // as the client gets it back (invalid UTF-8 replaced)
    std::vector<ChatMessage> conv = msgs;
    conv.push_back({"assistant", sent["content"].is_string() ? sent["content"].get<std::string>() : ""});
    std::vector<ChatMessage> a = conv, b = conv;
    a.push_back({"user", "A"});
    b.push_back({"user", "B"});
    std::vector<int32_t> ta = tok->encode(tok->apply_chat_template(a, false, thinking), true);
    const std::vector<int32_t> tb = tok->encode(tok->apply_chat_template(b, false, thinking), true);
    ta.resize(common_prefix(ta, tb));
    std::vector<int64_t> extra;
    const std::vector<int32_t> end = tok->encode(tok->apply_chat_template(conv, false, thinking), true);
    if (end.size() < ta.size() && std::equal(end.begin(), end.end(), ta.begin())) extra.push_back(static_cast<int64_t>(end.size()));
    return std::make_pair(std::move(ta), std::move(extra));
  };
  return ids;
}

std::vector<int32_t> Api::completion_prompt(const json& prompt) const {
  if (prompt.is_string()) {
    if (!tok_)
      throw ApiError{400, "model '" + so_.model_name + "' has no tokenizer.json: give 'prompt' as an array of token ids",
                     "prompt", "no_tokenizer"};
    // As `hanpu run --prompt`: special tokens written in the text stay text.
    return tok_->encode(prompt.get<std::string>(), /*parse_special=*/false);
  }
  if (!prompt.is_array()) throw wrong_type("prompt", prompt, "a string or an array of token ids");
  if (!prompt.empty() && (prompt[0].is_array() || prompt[0].is_string()))
    throw ApiError{400, "'prompt': several prompts in one request are not supported; send one string or one array of ids",
                   "prompt", "unsupported_value"};
  std::vector<int32_t> ids;
  const int64_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const json& v = prompt[i];
    if (!v.is_number_integer()) throw wrong_type("prompt[" + std::to_string(i) + "]", v, "a token id (integer)");
    const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? -1 : v.get<int64_t>();
    if (id < 0 || id >= vocab)
      throw ApiError{400, "'prompt[" + std::to_string(i) + "]': token id " + dump(v) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")",
                     "prompt", "invalid_value"};
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

void write_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// A chat reply's reasoning and content as the client gets them, streamed or whole (one push of
// the whole text, then finish): the <think> blocks' text as reasoning, the rest as content
// (ReasoningStream; hanpu/chat_output.hpp), the reasoning without the line feeds at its start and
// end and the content without those at its start (the templates put them around the tags:
// "<think>\n...\n</think>\n\n"). Streamed, a run of line feeds in the reasoning is held back
// until more reasoning text follows it (then it was inside) or the reply ends (then it was the
// end), so the pieces concatenate to the whole message's fields byte for byte.
class ReplySplitStream {
 public:
  explicit ReplySplitStream(bool opened_in_prompt) : stream_(opened_in_prompt) {}
  ReasoningSplit push(std::string_view piece) { return trim(stream_.push(piece), false); }
  ReasoningSplit finish() { return trim(stream_.finish(), true); }

 private:
  ReasoningSplit trim(ReasoningSplit d, bool end) {
    ReasoningSplit out;
    for (char ch : d.reasoning) {
      if (ch == '\n') {
        if (reasoning_started_) held_feeds_ += ch;  // leading ones are dropped
        continue;
      }
      out.reasoning += held_feeds_;
      held_feeds_.clear();
      out.reasoning += ch;
      reasoning_started_ = true;
    }
    if (end) held_feeds_.clear();  // the reasoning's last line feeds
    size_t skip = 0;
    if (!content_started_)
      while (skip < d.content.size() && d.content[skip] == '\n') ++skip;
    if (skip < d.content.size()) {
      content_started_ = true;
      out.content.assign(d.content, skip);
    }
    return out;
  }

  ReasoningStream stream_;
  bool reasoning_started_ = false, content_started_ = false;
  std::string held_feeds_;
};

// The assistant message of a finished chat reply: content split into reasoning_content and
// content (ReplySplitStream, as the stream sends them), tool calls parsed out (ReplyFormat;
// hanpu/chat_output.hpp).
json reply_message(const ReplyFormat& f, const std::string& text, const std::string& id) {
  json m = {{"role", "assistant"}};
  std::string content = text;
  if (f.split_reasoning) {
    ReplySplitStream split(f.reasoning_opened);
    ReasoningSplit r = split.push(text);
    const ReasoningSplit tail = split.finish();
    const std::string reasoning = r.reasoning + tail.reasoning;
    content = r.content + tail.content;
    if (!reasoning.empty() || text.find("</think>") != std::string::npos || f.reasoning_opened) m["reasoning_content"] = reasoning;
  }
  if (f.parse_tools) {
    const ParsedToolCalls p = parse_tool_calls(content, f.tool_format, f.tools);
    if (!p.calls.empty()) {
      json calls = json::array();
      for (size_t i = 0; i < p.calls.size(); ++i)
        calls.push_back({{"id", "call_" + id + "_" + std::to_string(i)}, {"type", "function"},
                         {"function", {{"name", p.calls[i].name}, {"arguments", p.calls[i].arguments}}}});
      m["tool_calls"] = calls;
      content = p.content;
    }
  }
  m["content"] = (m.contains("tool_calls") && content.empty()) ? json(nullptr) : json(content);
  return m;
}

// The bytes of a token as OpenAI's logprobs show them (token_id:N without a tokenizer, as vLLM).
std::string token_text(const Tokenizer* tok, int32_t id) {
  const int32_t one[1] = {id};
  return tok ? tok->decode(one) : "token_id:" + std::to_string(id);  // special tokens by name
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat completions' logprobs.content entries.
json chat_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps) {
  json out = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(tok, lp.token);
    json top = json::array();
    for (const auto& [id, v] : lp.top) {
      const std::string s = token_text(tok, id);
      top.push_back({{"token", s}, {"logprob", v}, {"bytes", bytes_of(s)}});
    }
    out.push_back({{"token", t}, {"logprob", lp.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", std::move(top)}});
  }
  return out;
}

// Legacy completions' logprobs object; text_offset counts bytes from `offset`.
json completion_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps, size_t offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(tok, lp.token);
    tokens.push_back(t);
    values.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[token_text(tok, id)] = v;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += tok && tok->is_special(lp.token) ? 0 : t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// A finished choice, gathered from its handle's events.
struct ChoiceResult {
  std::string text, finish_reason, stop_string, error;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
};

// Waits for the end of `handle` while probing the connection every kKeepAliveMs with a space
// (whitespace before a JSON value is valid JSON): a write that fails means the client went away.
// Returns false then. cpp-httplib 0.11 tells a handler nothing about a closed connection otherwise.
bool gather(GenerationHandle& handle, httplib::DataSink& sink, bool probe_with_space, ChoiceResult& out) {
  // How often an idle request probes its connection: a client that leaves is noticed within about
  // two periods (the first write after the close may still be buffered).
  constexpr int kKeepAliveMs = 500;
  GenerationEvent ev;
  auto last_probe = std::chrono::steady_clock::now();
  for (;;) {
    const GenerationHandle::Wait w = handle.next_for(ev, std::chrono::milliseconds(kKeepAliveMs));
    // Probe on time, not only when idle: a busy generation sends events continuously.
    if (std::chrono::steady_clock::now() - last_probe >= std::chrono::milliseconds(kKeepAliveMs)) {
      last_probe = std::chrono::steady_clock::now();
      static const std::string ping_event = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
      const bool ok = sink.is_writable() &&
                      (probe_with_space ? sink.write(" ", 1) : sink.write(ping_event.data(), ping_event.size()));
      if (!ok) return false;
    }
    if (w == GenerationHandle::Wait::kTimeout) continue;
    if (w == GenerationHandle::Wait::kEnd) return true;
    if (ev.kind == GenerationEvent::Kind::kDelta) {
      out.text += ev.text;
      out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      out.logprobs.insert(out.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    } else if (ev.kind == GenerationEvent::Kind::kDone) {
      out.finish_reason = ev.finish_reason;
      out.stop_string = ev.stop_string;
    } else {
      out.error = ev.error;
    }
  }
}

// Checks the prompt against the limits and queues it (n choices); one response in flight.
std::vector<std::shared_ptr<GenerationHandle>> Api::submit(ParsedRequest& p, const char* prompt_field) {
  const int64_t n = static_cast<int64_t>(p.gen.prompt.size());
  if (n == 0) throw ApiError{400, "the prompt is empty (0 tokens), expected at least one token", prompt_field, "invalid_value"};
  if (n > so_.max_prompt_tokens)
    throw ApiError{400, "the prompt is " + std::to_string(n) + " tokens, expected at most " +
                            std::to_string(so_.max_prompt_tokens) + " (--max-prompt-tokens)",
                   prompt_field, "context_length_exceeded"};
  const int64_t room = so_.context_tokens - n;
  if (p.gen.max_tokens < 0) p.gen.max_tokens = room;
  if (p.gen.max_tokens > room)
    throw ApiError{400, "the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" + std::to_string(p.gen.max_tokens) +
                            ") exceed the context of " + std::to_string(so_.context_tokens) + " tokens (--ctx)",
                   p.max_tokens_field, "context_length_exceeded"};
  try {
    auto handles = sched_.submit_choices(p.gen);
    ++responses_in_flight;
    return handles;
  } catch (const QueueFull& e) {
    throw ApiError{429, e.what(), "", "rate_limit_exceeded", "rate_limit_error"};
  } catch (const ShuttingDown& e) {
    throw ApiError{503, e.what(), "", "shutting_down", "server_error"};
  } catch (const Error& e) {  // settings the generation refuses (hanpu/generator.hpp)
    throw ApiError{400, e.what(), p.gen.json_object || p.gen.json_schema ? "response_format" : p.gen.tool_calls ? "tool_choice" : "",
                   "invalid_value"};
  }
}

// After a chat reply: the conversation as the next turn will begin (this prompt, the reply as
// the client gets it back, the template's end of turn) is prefilled from the snapshots this
// request left and snapshotted, so that next turn computes only its new message. Queued before
// the reply's last bytes go out, so a client's next turn queues behind it.
void Api::warm_next_turn(const ParsedRequest& p, const json& reply) {
  if (!p.next_turn || sched_.options().cache_bytes == 0) return;
  try {
    auto [tokens, extra] = p.next_turn(reply);
    // (It may be shorter than this prompt: a template may drop the reply's reasoning once a user
    // message follows.)
    if (tokens.empty() || static_cast<int64_t>(tokens.size()) > so_.context_tokens) return;
    GenerationRequest g;
    g.prompt = std::move(tokens);
    g.extra_checkpoints = std::move(extra);
    g.max_tokens = 0;
    g.warm_only = true;
    sched_.submit(std::move(g));  // no one waits for it
  } catch (const std::exception&) {
    // A full queue or a conversation the template refuses to continue: the next turn just
    // reuses less (the snapshots after the prompt and after the reply's tokens remain).
  }
}

json usage_of(const std::vector<std::shared_ptr<GenerationHandle>>& handles) {
  int64_t completion = 0;
  for (const auto& h : handles) completion += h->completion_tokens;
  const GenerationHandle& h = *handles.front();
  return {{"prompt_tokens", h.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", h.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", h.cached_tokens}}},
          // Extension: why the prefix cache gave what it gave (docs/SERVE.md, "prefix cache").
          {"hanpu_cache", {{"result", h.cache_result}, {"note", h.cache_note}}}};
}

// response_format json_schema: the schema compiled from the raw body (its key order kept, which
// the written document follows), and the limits it puts on stop and max_tokens.
void Api::compile_response_schema(ParsedRequest& p, const std::string& raw_body) const {
  const auto raw = nlohmann::ordered_json::parse(raw_body, nullptr, false);
  const std::string param = "response_format.json_schema.schema";
  try {
    p.gen.json_schema = hanpu::JsonSchema::compile(raw["response_format"]["json_schema"]["schema"]);
  } catch (const hanpu::SchemaError& e) {
    throw ApiError{400, "'" + param + e.pointer() + "': " + e.what(), param + e.pointer(), "unsupported_value"};
  }
  if (!p.gen.stop.empty())
    throw ApiError{400, "'stop' with 'response_format' json_schema could cut the document short; the generation ends "
                        "when the document closes", "stop", "invalid_value"};
  const int64_t shortest = p.gen.json_schema->min_bytes();
  if (p.gen.max_tokens >= 0 && p.gen.max_tokens < shortest)
    throw ApiError{400, "'" + p.max_tokens_field + "': " + std::to_string(p.gen.max_tokens) +
                        " is too few for this response_format json_schema (its shortest document, " +
                        std::to_string(shortest) + " bytes, may take as many tokens)",
                   p.max_tokens_field, "invalid_value"};
}

void Api::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (draining) throw ApiError{503, "the server is shutting down", "", "shutting_down", "server_error"};
  const json body = parse_body(req);
  ParsedRequest p = parse_common(body, chat);
  std::string echo_text;
  if (chat) {
    if (!body.contains("messages")) throw ApiError{400, "'messages' is required", "messages", "missing_required_parameter"};
    p.gen.prompt = chat_prompt(body["messages"], body, req.body, p);
  } else {
    if (!body.contains("prompt")) throw ApiError{400, "'prompt' is required", "prompt", "missing_required_parameter"};
    p.gen.prompt = completion_prompt(body["prompt"]);
    if (p.echo && p.logprobs)
      throw ApiError{400, "'echo' with 'logprobs' would need the prompt tokens' logprobs, which hanpu serve does not compute; "
                          "drop one of them", "echo", "unsupported_value"};
    if (p.echo) echo_text = body["prompt"].is_string() ? body["prompt"].get<std::string>() : tok_ ? tok_->decode(p.gen.prompt) : "";
  }
  if (p.wants_schema) compile_response_schema(p, req.body);
  if (p.gen.json_object) {
    if (!p.gen.stop.empty())
      throw ApiError{400, "'stop' with 'response_format' json_object could cut the object short; the generation ends when "
                          "the object closes", "stop", "invalid_value"};
    if (p.gen.max_tokens >= 0 && p.gen.max_tokens < 2)
      throw ApiError{400, "'" + p.max_tokens_field + "': " + std::to_string(p.gen.max_tokens) +
                          " is too few for response_format json_object (the shortest object, {}, takes 2 tokens)",
                     p.max_tokens_field, "invalid_value"};
  }
  const auto handles = submit(p, chat ? "messages" : "prompt");
  const std::string id = new_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string model_name = so_.model_name;
  const ReplyFormat reply = p.reply;
  const bool logprobs = p.logprobs;
  const Tokenizer* tok = tok_;
  auto cancel_all = [handles] {
    for (const auto& h : handles) h->cancel();
  };
  auto shared_p = std::make_shared<const ParsedRequest>(std::move(p));

  if (!shared_p->stream) {
    // The body is sent when every choice ends; the status is 200 from the first byte on, and a
    // generation that fails afterwards returns the error object in the body.
    res.status = 200;
    res.set_chunked_content_provider(
        "application/json",
        [=, this](size_t, httplib::DataSink& sink) {
          std::vector<ChoiceResult> results(handles.size());
          for (size_t c = 0; c < handles.size(); ++c)
            if (!gather(*handles[c], sink, true, results[c])) {
              cancel_all();
              return false;
            }
          json out;
          json choices = json::array();
          for (size_t c = 0; c < handles.size() && out.is_null(); ++c) {
            const ChoiceResult& r = results[c];
            if (!r.error.empty()) {
              out = error_body({500, "generation failed: " + r.error, "", "generation_failed", "server_error"});
              break;
            }
            json choice = {{"index", c}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}};
            if (chat) {
              choice["message"] = reply_message(reply, reply.forced_prefix + r.text, id + "_" + std::to_string(c));
              if (choice["message"].contains("tool_calls") && r.finish_reason == "stop") choice["finish_reason"] = "tool_calls";
              if (logprobs) choice["logprobs"] = {{"content", chat_logprobs(tok, r.logprobs)}};
              if (handles.size() == 1) warm_next_turn(*shared_p, choice["message"]);
            } else {
              choice["text"] = echo_text + r.text;
              choice["token_ids"] = r.tokens;  // extension: the ids, for checkpoints without a tokenizer
              if (logprobs) choice["logprobs"] = completion_logprobs(tok, r.logprobs, 0);
            }
            choices.push_back(std::move(choice));
          }
          if (out.is_null())
            out = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                   {"model", model_name}, {"choices", std::move(choices)}, {"usage", usage_of(handles)}};
          const std::string text = dump(out);
          if (!sink.write(text.data(), text.size())) {
            cancel_all();
            return false;
          }
          sink.done();
          return true;
        },
        [cancel_all, this](bool success) {
          if (!success) cancel_all();
          --responses_in_flight;
        });
    return;
  }

  // Streaming: the choices' chunks interleave as the choices are generated (each chunk names its
  // index; a client assembles them by it, as OpenAI's stream of n choices), then the usage chunk
  // if asked for, then [DONE]. Each choice starts with its role chunk, all of them up front.
  const bool include_usage = shared_p->include_usage;
  auto chunk = [=](json choice) {
    return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                {"model", model_name}, {"choices", json::array({std::move(choice)})}};
  };
  struct ChoiceStream {
    std::unique_ptr<ReplySplitStream> reasoning;
    std::unique_ptr<ToolCallStream> tools;  // with tools: the content's calls as they are written
    std::string full;        // the whole reply
    size_t text_offset = 0;  // completions' logprobs.text_offset
  };
  struct StreamState {
    bool started = false;
    size_t next_look = 0;  // the choice next_of_any looks at first (round-robin)
    size_t finished = 0;   // choices whose last chunk was sent
    std::vector<ChoiceStream> choices;
  };
  auto st = std::make_shared<StreamState>();
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, this](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string line = "data: " + dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        // One chunk per piece of a ToolCallDelta: content, then the calls' starts (id, type,
        // name, the first arguments) and argument pieces.
        auto send_tool_delta = [&](const ToolCallDelta& d, size_t choice) {
          bool sent = true;
          if (!d.content.empty())
            sent = send(chunk({{"index", choice}, {"delta", {{"content", d.content}}}, {"finish_reason", nullptr}}));
          for (const ToolCallPiece& piece : d.calls) {
            json call = {{"index", piece.index}};
            if (piece.start) {
              call["id"] = "call_" + id + "_" + std::to_string(choice) + "_" + std::to_string(piece.index);
              call["type"] = "function";
              call["function"] = {{"name", piece.name}, {"arguments", piece.arguments}};
            } else {
              call["function"] = {{"arguments", piece.arguments}};
            }
            sent = sent && send(chunk({{"index", choice}, {"delta", {{"tool_calls", json::array({std::move(call)})}}}, {"finish_reason", nullptr}}));
          }
          return sent;
        };
        if (!st->started) {
          st->started = true;
          st->choices.resize(handles.size());
          bool ok = true;
          for (size_t c = 0; c < handles.size() && ok; ++c) {
            ChoiceStream& cs = st->choices[c];
            cs.reasoning = std::make_unique<ReplySplitStream>(reply.reasoning_opened);
            if (chat) ok = send(chunk({{"index", c}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}));
            if (reply.parse_tools) {
              cs.tools = std::make_unique<ToolCallStream>(reply.tool_format, reply.tools, reply.split_reasoning);
              ok = ok && send_tool_delta(cs.tools->push(reply.forced_prefix), c);
            } else if (!echo_text.empty()) {
              ok = ok && send(chunk({{"index", c}, {"text", echo_text}, {"finish_reason", nullptr}, {"logprobs", nullptr}}));
            }
          }
          if (!ok) {
            cancel_all();
            return false;
          }
        }
        GenerationEvent ev;
        // Waits a while at most, so that a client that left is noticed even while no choice has
        // anything to send (httplib calls again after a return of true without a write).
        const size_t c = next_of_any(handles, st->next_look, ev, std::chrono::milliseconds(500));
        if (c > handles.size()) {
          if (sink.is_writable()) return true;
          cancel_all();
          return false;
        }
        if (c == handles.size()) return false;  // every choice ended (not reached: [DONE] ends the stream first)
        st->next_look = (c + 1) % handles.size();
        ChoiceStream& cs = st->choices[c];
        bool ok = true;
        // A split reply streams reasoning_content and content deltas (a partial tag held back;
        // line feeds trimmed as the whole message trims them); with tools, the content goes
        // through the tool-call stream: text outside the calls as content, each call's id, type
        // and name once its name is known, then its arguments in pieces as the model writes them
        // (OpenAI's tool_calls deltas).
        auto send_split = [&](const ReasoningSplit& d) {
          if (!d.reasoning.empty())
            ok = ok && send(chunk({{"index", c}, {"delta", {{"reasoning_content", d.reasoning}}}, {"finish_reason", nullptr}}));
          if (reply.parse_tools) {
            ok = ok && send_tool_delta(cs.tools->push(d.content), c);
          } else if (!d.content.empty()) {
            ok = ok && send(chunk({{"index", c}, {"delta", {{"content", d.content}}}, {"finish_reason", nullptr}}));
          }
        };
        const bool split = chat && (reply.split_reasoning || reply.parse_tools);
        if (ev.kind == GenerationEvent::Kind::kDelta) cs.full += ev.text;
        if (ev.kind == GenerationEvent::Kind::kDelta && split) {
          send_split(reply.split_reasoning ? cs.reasoning->push(ev.text) : ReasoningSplit{"", ev.text});
          if (logprobs && !ev.logprobs.empty())
            ok = ok && send(chunk({{"index", c}, {"delta", json::object()}, {"logprobs", {{"content", chat_logprobs(tok, ev.logprobs)}}},
                                   {"finish_reason", nullptr}}));
        } else if (ev.kind == GenerationEvent::Kind::kDelta) {
          json choice;
          if (chat) {
            choice = {{"index", c}, {"delta", {{"content", ev.text}}}, {"finish_reason", nullptr}};
            if (logprobs) choice["logprobs"] = {{"content", chat_logprobs(tok, ev.logprobs)}};
          } else {
            choice = {{"index", c}, {"text", ev.text}, {"token_ids", ev.tokens}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
            if (logprobs) choice["logprobs"] = completion_logprobs(tok, ev.logprobs, cs.text_offset);
            cs.text_offset += ev.text.size();
          }
          ok = send(chunk(std::move(choice)));
        } else if (ev.kind == GenerationEvent::Kind::kDone) {
          std::string finish_reason = ev.finish_reason;
          if (split) {
            if (reply.split_reasoning) send_split(cs.reasoning->finish());
            if (reply.parse_tools) {
              ok = ok && send_tool_delta(cs.tools->finish(), c);
              if (cs.tools->calls_started() > 0 && finish_reason == "stop") finish_reason = "tool_calls";
            }
          }
          if (chat && handles.size() == 1) warm_next_turn(*shared_p, reply_message(reply, reply.forced_prefix + cs.full, id + "_0"));
          json choice = chat ? json{{"index", c}, {"delta", json::object()}, {"finish_reason", finish_reason}}
                             : json{{"index", c}, {"text", ""}, {"finish_reason", ev.finish_reason}, {"logprobs", nullptr}};
          ok = ok && send(chunk(std::move(choice)));
          if (++st->finished < handles.size()) {  // other choices are still generating
            if (!ok) cancel_all();
            return ok;
          }
          if (ok && include_usage) {
            json u = chunk(nullptr);
            u["choices"] = json::array();
            u["usage"] = usage_of(handles);
            ok = send(u);
          }
        } else {
          ok = send(error_body({500, "generation failed: " + ev.error, "", "generation_failed", "server_error"}));
          cancel_all();  // the stream ends here: the other choices are dropped
        }
        if (ev.kind != GenerationEvent::Kind::kDelta) {  // the last choice ended, or one failed
          static const std::string done = "data: [DONE]\n\n";
          ok = ok && sink.write(done.data(), done.size());
          if (ok) sink.done();
        }
        if (!ok) cancel_all();  // the client went away: free its sequences
        return ok;
      },
      [cancel_all, this](bool success) {
        if (!success) cancel_all();
        --responses_in_flight;
      });
}

// ---- Anthropic Messages ---------------------------------------------------------------------

json anthropic_error_body(int status, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

json anthropic_usage(const GenerationHandle& h) {
  // Anthropic counts cache reads apart from input_tokens (the tokens computed).
  return {{"input_tokens", h.prompt_tokens - h.cached_tokens},
          {"output_tokens", h.completion_tokens},
          {"cache_read_input_tokens", h.cached_tokens},
          {"cache_creation_input_tokens", 0}};
}

std::string anthropic_stop_reason(const std::string& finish_reason, const std::string& stop_string, bool tool_calls) {
  if (tool_calls) return "tool_use";
  if (finish_reason == "length") return "max_tokens";
  if (!stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

// An OpenAI-shaped assistant message (reply_message) as Anthropic content blocks: thinking, text,
// tool_use (input: the parsed arguments; a call whose arguments are not a JSON object stays text).
json anthropic_blocks(const json& message) {
  json blocks = json::array();
  if (message.contains("reasoning_content"))
    blocks.push_back({{"type", "thinking"}, {"thinking", message["reasoning_content"]}, {"signature", ""}});
  std::string text = message["content"].is_string() ? message["content"].get<std::string>() : "";
  json tools = json::array();
  if (message.contains("tool_calls"))
    for (const json& tc : message["tool_calls"]) {
      const std::string args = tc["function"]["arguments"].get<std::string>();
      json input = json::parse(args, nullptr, false);
      if (input.is_discarded() || !input.is_object()) {
        text += args;
        continue;
      }
      std::string id = tc["id"].get<std::string>();
      tools.push_back({{"type", "tool_use"}, {"id", "toolu_" + id.substr(std::min<size_t>(id.size(), 5))}, {"name", tc["function"]["name"]}, {"input", input}});
    }
  if (!text.empty() || (blocks.empty() && tools.empty())) blocks.push_back({{"type", "text"}, {"text", text}});
  for (json& t : tools) blocks.push_back(std::move(t));
  return blocks;
}

// Anthropic's POST /v1/messages/count_tokens: the prompt a /v1/messages request with these
// messages, system, tools, tool_choice and thinking would prefill, rendered and encoded the same
// way (input_tokens counts every prompt token, cached or not).
void Api::count_tokens(const httplib::Request& req, httplib::Response& res) {
  nlohmann::ordered_json raw;
  try {
    raw = nlohmann::ordered_json::parse(req.body);
  } catch (const std::exception& e) {
    throw ApiError{400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json"};
  }
  if (!raw.is_object()) throw ApiError{400, "the request body must be a JSON object", "", "invalid_json"};
  for (const auto& [key, value] : raw.items())
    if (key != "model" && key != "messages" && key != "system" && key != "tools" && key != "tool_choice" && key != "thinking" &&
        key != "output_config" && key != "cache_control")
      throw ApiError{400, "'" + key + "': not a count_tokens field (model, messages, system, tools, tool_choice, thinking, "
                          "output_config)", key, "invalid_request"};
  // max_tokens is no count_tokens field; the mapping needs one (and a thinking budget below it).
  raw["max_tokens"] = so_.context_tokens;
  ParsedRequest p = anthropic_request(raw);
  write_json(res, 200, {{"input_tokens", p.gen.prompt.size()}});
}

ParsedRequest Api::anthropic_request(const nlohmann::ordered_json& raw) const {
  nlohmann::ordered_json chat_body;
  try {
    chat_body = anthropic_to_chat_request(raw);
  } catch (const AnthropicRequestError& e) {
    throw ApiError{400, e.what(), e.field(), "invalid_request"};
  }
  const std::string chat_text = chat_body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  const json body = json::parse(chat_text);
  ParsedRequest p = parse_common(body, true);
  try {
    p.gen.prompt = chat_prompt(body["messages"], body, chat_text, p);
    if (p.wants_schema) compile_response_schema(p, chat_text);  // output_config.format
  } catch (ApiError& e) {
    // The checks ran on the OpenAI-shaped request: name the Anthropic fields it came from.
    for (auto [from, to] : {std::pair<std::string, std::string>{"response_format.json_schema.schema", "output_config.format.schema"},
                            {".function.parameters", ".input_schema"}, {".function.name", ".name"},
                            {"thinking_budget_tokens", "thinking.budget_tokens"}})
      for (std::string* text : {&e.param, &e.message})
        for (size_t at = text->find(from); at != std::string::npos; at = text->find(from, at + to.size()))
          text->replace(at, from.size(), to);
    throw;
  }
  return p;
}

void Api::messages(const httplib::Request& req, httplib::Response& res) {
  if (draining) throw ApiError{503, "the server is shutting down", "", "shutting_down", "server_error"};
  nlohmann::ordered_json raw;
  try {
    raw = nlohmann::ordered_json::parse(req.body);
  } catch (const std::exception& e) {
    throw ApiError{400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json"};
  }
  ParsedRequest p = anthropic_request(raw);
  const auto handles = submit(p, "messages");
  auto handle = handles.front();
  const std::string id = new_id("msg_");
  const std::string model_name = so_.model_name;
  const ReplyFormat reply = p.reply;
  auto shared_p = std::make_shared<const ParsedRequest>(std::move(p));

  if (!shared_p->stream) {
    res.status = 200;
    res.set_chunked_content_provider(
        "application/json",
        [=, this](size_t, httplib::DataSink& sink) {
          ChoiceResult r;
          if (!gather(*handle, sink, true, r)) {
            handle->cancel();
            return false;
          }
          json out;
          if (!r.error.empty()) {
            out = anthropic_error_body(500, "generation failed: " + r.error);
          } else {
            const json message = reply_message(reply, reply.forced_prefix + r.text, id);
            warm_next_turn(*shared_p, message);
            out = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model_name},
                   {"content", anthropic_blocks(message)},
                   {"stop_reason", anthropic_stop_reason(r.finish_reason, r.stop_string, message.contains("tool_calls"))},
                   {"stop_sequence", r.stop_string.empty() ? json(nullptr) : json(r.stop_string)},
                   {"usage", anthropic_usage(*handle)}};
          }
          const std::string text = dump(out);
          if (!sink.write(text.data(), text.size())) {
            handle->cancel();
            return false;
          }
          sink.done();
          return true;
        },
        [handle, this](bool success) {
          if (!success) handle->cancel();
          --responses_in_flight;
        });
    return;
  }

  // Streaming, as Anthropic's API sends it: message_start, then per content block
  // content_block_start, its deltas and content_block_stop (thinking blocks stream as the model
  // thinks, text as it writes; with tools each call becomes a tool_use block once its name is
  // known, its arguments input_json_delta pieces as they are written), then message_delta
  // with the stop reason and usage, and message_stop.
  struct StreamState {
    bool started = false;
    int index = -1;          // the open block's index (-1: none)
    std::string open_type;   // "thinking", "text" or ""
    std::unique_ptr<ReplySplitStream> reasoning;
    std::unique_ptr<ToolCallStream> tools;
    std::string full;
  };
  auto st = std::make_shared<StreamState>();
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, this](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto send = [&](const char* event, const json& data) {
          const std::string s = std::string("event: ") + event + "\ndata: " + dump(data) + "\n\n";
          ok = ok && sink.write(s.data(), s.size());
        };
        auto close_block = [&] {
          if (st->open_type.empty()) return;
          if (st->open_type == "thinking")  // hanpu signs nothing: an empty signature
            send("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
          send("content_block_stop", {{"type", "content_block_stop"}, {"index", st->index}});
          st->open_type.clear();
        };
        auto open_block = [&](const std::string& type, json block) {
          if (st->open_type == type) return;
          close_block();
          ++st->index;
          st->open_type = type;
          send("content_block_start", {{"type", "content_block_start"}, {"index", st->index}, {"content_block", std::move(block)}});
        };
        auto stream_text = [&](const std::string& kind, const std::string& text) {
          if (text.empty()) return;
          if (kind == "thinking") {
            open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
            send("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index}, {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
          } else {
            open_block("text", {{"type", "text"}, {"text", ""}});
            send("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
          }
        };
        // A tool call becomes a tool_use block once its name is known; its arguments stream as
        // input_json_delta pieces as the model writes them.
        auto tool_delta = [&](const ToolCallDelta& d) {
          stream_text("text", d.content);
          for (const ToolCallPiece& piece : d.calls) {
            if (piece.start) {
              close_block();
              ++st->index;
              st->open_type = "tool_use";
              send("content_block_start", {{"type", "content_block_start"}, {"index", st->index},
                                           {"content_block", {{"type", "tool_use"}, {"id", "toolu_" + id + "_" + std::to_string(piece.index)},
                                                              {"name", piece.name}, {"input", json::object()}}}});
            }
            if (!piece.arguments.empty())
              send("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index},
                                           {"delta", {{"type", "input_json_delta"}, {"partial_json", piece.arguments}}}});
          }
        };
        auto split = [&](const ReasoningSplit& d) {
          stream_text("thinking", d.reasoning);
          if (reply.parse_tools) tool_delta(st->tools->push(d.content));
          else stream_text("text", d.content);
        };
        GenerationEvent ev;
        if (!handle->next(ev)) return false;
        if (!st->started) {  // after the first event: the cached token count is known by then
          st->started = true;
          st->reasoning = std::make_unique<ReplySplitStream>(reply.reasoning_opened);
          json usage = anthropic_usage(*handle);
          usage["output_tokens"] = 0;
          send("message_start", {{"type", "message_start"},
                                 {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model_name},
                                              {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                              {"usage", usage}}}});
          send("ping", {{"type", "ping"}});
          if (reply.parse_tools) {
            st->tools = std::make_unique<ToolCallStream>(reply.tool_format, reply.tools, reply.split_reasoning);
            tool_delta(st->tools->push(reply.forced_prefix));
          }
        }
        if (ev.kind == GenerationEvent::Kind::kDelta) {
          st->full += ev.text;
          if (reply.split_reasoning) split(st->reasoning->push(ev.text));
          else split({"", ev.text});
        } else if (ev.kind == GenerationEvent::Kind::kDone) {
          if (reply.split_reasoning) split(st->reasoning->finish());
          bool called = false;
          if (reply.parse_tools) {
            tool_delta(st->tools->finish());
            called = st->tools->calls_started() > 0;
          }
          if (st->index < 0) open_block("text", {{"type", "text"}, {"text", ""}});  // never an empty content list
          close_block();
          warm_next_turn(*shared_p, reply_message(reply, reply.forced_prefix + st->full, id));
          send("message_delta", {{"type", "message_delta"},
                                 {"delta", {{"stop_reason", anthropic_stop_reason(ev.finish_reason, ev.stop_string, called)},
                                            {"stop_sequence", ev.stop_string.empty() ? json(nullptr) : json(ev.stop_string)}}},
                                 {"usage", {{"output_tokens", handle->completion_tokens}}}});
          send("message_stop", {{"type", "message_stop"}});
          if (ok) sink.done();
        } else {
          send("error", anthropic_error_body(500, "generation failed: " + ev.error));
          if (ok) sink.done();
        }
        if (!ok) handle->cancel();
        return ok;
      },
      [handle, this](bool success) {
        if (!success) handle->cancel();
        --responses_in_flight;
      });
}

void Api::models(httplib::Response& res) const {
  write_json(res, 200,
             {{"object", "list"},
              {"data", json::array({{{"id", so_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "hanpu"}}})}});
}

void Api::metrics(httplib::Response& res) {
  const SchedulerMetrics& m = sched_.metrics();
  const CacheStats cs = sched_.cache().stats();
  std::ostringstream o;
  o.precision(15);  // counters of bytes and tokens exactly, not as 1.07374e+09
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
  };
  auto sec = [](const std::atomic<uint64_t>& ns) { return static_cast<double>(ns.load()) * 1e-9; };
  {
    std::lock_guard lock(http_.mu);
    o << "# HELP hanpu_http_responses_total HTTP responses by path and status\n# TYPE hanpu_http_responses_total counter\n";
    for (const auto& [key, count] : http_.responses)
      o << "hanpu_http_responses_total{path=\"" << key.first << "\",status=\"" << key.second << "\"} " << count << '\n';
  }
  metric("hanpu_requests_started_total", "counter", "generation requests that began running", m.requests_started);
  metric("hanpu_requests_finished_total", "counter", "generation requests that finished (stop or length)", m.requests_finished);
  metric("hanpu_requests_cancelled_total", "counter", "generation requests dropped because the client went away", m.requests_cancelled);
  metric("hanpu_requests_failed_total", "counter", "generation requests that failed in the model", m.requests_failed);
  metric("hanpu_requests_running", "gauge", "sequences holding a state now", static_cast<double>(m.running.load()));
  metric("hanpu_requests_waiting", "gauge", "requests queued for a running slot", static_cast<double>(m.waiting.load()));
  metric("hanpu_prompt_tokens_total", "counter", "prompt tokens of started requests", m.prompt_tokens);
  metric("hanpu_completion_tokens_total", "counter", "generated tokens", m.completion_tokens);
  metric("hanpu_prefill_tokens_total", "counter", "prompt tokens computed (not restored from the cache)", m.prefill_tokens);
  metric("hanpu_prefill_seconds_total", "counter", "seconds in prefill forward passes", sec(m.prefill_ns));
  metric("hanpu_decode_tokens_total", "counter", "tokens decoded", m.decode_tokens);
  metric("hanpu_decode_seconds_total", "counter", "seconds in decode forward passes", sec(m.decode_ns));
  metric("hanpu_decode_steps_total", "counter", "decode forward passes (a batched one decodes several sequences)", m.decode_steps);
  const double pf = sec(m.prefill_ns), dc = sec(m.decode_ns);
  metric("hanpu_prefill_tokens_per_second", "gauge", "prefill tokens per second of forward time, since start",
         pf > 0 ? static_cast<double>(m.prefill_tokens.load()) / pf : 0.0);
  metric("hanpu_decode_tokens_per_second", "gauge", "decode tokens per second of forward time, since start",
         dc > 0 ? static_cast<double>(m.decode_tokens.load()) / dc : 0.0);
  o << "# HELP hanpu_time_to_first_token_seconds time from queueing to the first token\n"
       "# TYPE hanpu_time_to_first_token_seconds summary\n"
    << "hanpu_time_to_first_token_seconds_sum " << sec(m.ttft_ns) << "\nhanpu_time_to_first_token_seconds_count "
    << m.ttft_count.load() << '\n';
  metric("hanpu_cache_hits_total", "counter", "requests that restored a cached prefix", m.cache_hits);
  metric("hanpu_cache_misses_total", "counter", "requests that found no cached prefix", m.cache_misses);
  metric("hanpu_cache_tokens_reused_total", "counter", "prompt tokens restored from the cache instead of computed", m.cache_tokens_reused);
  metric("hanpu_cache_snapshots_total", "counter", "snapshots stored", m.snapshots_taken);
  metric("hanpu_cache_next_turn_snapshots_total", "counter", "prefills of a chat's next-turn prefix after its reply (warm_only)",
         m.warm_requests);
  metric("hanpu_cache_snapshot_seconds_total", "counter", "seconds copying states into the cache", sec(m.snapshot_ns));
  metric("hanpu_cache_restore_seconds_total", "counter", "seconds looking up and copying states out of the cache", sec(m.restore_ns));
  metric("hanpu_cache_evictions_total", "counter", "snapshots evicted (least recently used)", static_cast<double>(cs.evictions));
  metric("hanpu_cache_entries", "gauge", "snapshots held", static_cast<double>(cs.entries));
  metric("hanpu_cache_bytes", "gauge", "bytes held by the prefix cache", static_cast<double>(cs.bytes));
  metric("hanpu_cache_capacity_bytes", "gauge", "--cache-mib", static_cast<double>(sched_.cache().capacity_bytes()));
  metric("hanpu_state_bytes", "gauge", "bytes of the running sequences' states", static_cast<double>(m.state_bytes.load()));
  metric("hanpu_weight_bytes", "gauge", "bytes of model weights (mapped or built)", static_cast<double>(model_.weight_bytes()));
  metric("hanpu_process_resident_memory_bytes", "gauge", "resident set size of the server", resident_bytes());
  res.set_content(o.str(), "text/plain; version=0.0.4");
}

}  // namespace

int run_server(const HybridModel& model, const Tokenizer* tokenizer, const ServerOptions& so, const SchedulerOptions& sched_opt) {
  // SIGTERM/SIGINT are taken by one thread with sigwait (blocked everywhere else, so every thread
  // started below inherits the mask); a broken pipe is an error return from send, not a signal.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Scheduler sched(model, tokenizer, sched_opt);
  sched.set_log_requests(so.log_requests);
  Api api(model, tokenizer, so, sched);
  httplib::Server svr;
  // Each running or queued request holds a handler thread while it waits for tokens; keep-alive
  // connections hold one while idle; a few more answer /health, /metrics and 429s meanwhile.
  const int http_threads = so.http_threads > 0 ? so.http_threads : sched_opt.max_running + sched_opt.max_queue + 8;
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(static_cast<size_t>(http_threads)); };
  svr.set_payload_max_length(so.max_body_bytes);
  // An idle keep-alive connection holds a handler thread, and stop() waits for it: 2 s instead of
  // httplib's 5 keeps SIGTERM prompt; clients on loopback reconnect for free.
  svr.set_keep_alive_timeout(2);

  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (so.api_key.empty() || req.path == "/health" || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    // Anthropic's clients send the key as x-api-key.
    const std::string x_api_key = req.get_header_value("x-api-key");
    if (auth == "Bearer " + so.api_key || x_api_key == so.api_key) return httplib::Server::HandlerResponse::Unhandled;
    const std::string why = auth.empty() && x_api_key.empty()
                                ? "no API key given: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                                : "incorrect API key in the Authorization or x-api-key header";
    if (req.path.rfind("/v1/messages", 0) == 0) write_json(res, 401, anthropic_error_body(401, why));
    else write_json(res, 401, error_body({401, why, "", "invalid_api_key", "invalid_request_error"}));
    api.http_metrics().count(req.path, 401);
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib answers some errors itself (404 for unknown paths, 413 for a body over the limit)
  // with an empty body; give them OpenAI's error shape too.
  svr.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 404) message = "no endpoint " + req.method + " " + req.path;
    if (res.status == 413)
      message = "the request body is over the limit of " + std::to_string(so.max_body_bytes) + " bytes (--max-body-bytes)";
    if (res.status == 405) message = "method " + req.method + " is not allowed on " + req.path;
    if (req.path.rfind("/v1/messages", 0) == 0) write_json(res, res.status, anthropic_error_body(res.status, message));
    else write_json(res, res.status, error_body({res.status, message, "", res.status == 413 ? "request_too_large" : "", "invalid_request_error"}));
  });

  auto guarded = [&](const std::string& path, auto&& body_fn, bool anthropic = false) {
    return [&, path, body_fn, anthropic](const httplib::Request& req, httplib::Response& res) {
      try {
        body_fn(req, res);
      } catch (const ApiError& e) {
        write_json(res, e.status, anthropic ? anthropic_error_body(e.status, e.message) : error_body(e));
      } catch (const std::exception& e) {
        const std::string m = std::string("internal error: ") + e.what();
        write_json(res, 500, anthropic ? anthropic_error_body(500, m) : error_body({500, m, "", "internal_error", "server_error"}));
      }
      api.http_metrics().count(path, res.status);
    };
  };
  svr.Post("/v1/chat/completions", guarded("/v1/chat/completions", [&](const httplib::Request& q, httplib::Response& r) {
             api.completions(q, r, true);
           }));
  svr.Post("/v1/completions", guarded("/v1/completions", [&](const httplib::Request& q, httplib::Response& r) {
             api.completions(q, r, false);
           }));
  svr.Post("/v1/messages", guarded("/v1/messages", [&](const httplib::Request& q, httplib::Response& r) { api.messages(q, r); }, true));
  svr.Post("/v1/messages/count_tokens", guarded("/v1/messages/count_tokens", [&](const httplib::Request& q, httplib::Response& r) {
             api.count_tokens(q, r);
           }, true));
  svr.Get("/", guarded("/", [&](const httplib::Request&, httplib::Response& r) {
            r.set_content(chat_page_html(), "text/html; charset=utf-8");
          }));
  svr.Get("/v1/models", guarded("/v1/models", [&](const httplib::Request&, httplib::Response& r) { api.models(r); }));
  svr.Get("/health", guarded("/health", [&](const httplib::Request&, httplib::Response& r) {
            if (api.draining) write_json(r, 503, {{"status", "shutting down"}});
            else write_json(r, 200, {{"status", "ok"}});
          }));
  svr.Get("/metrics", guarded("/metrics", [&](const httplib::Request&, httplib::Response& r) { api.metrics(r); }));

  if (!svr.bind_to_port(so.host.c_str(), so.port))
    throw Error("cannot listen on " + so.host + ":" + std::to_string(so.port) + " (address in use, or not an address of this machine)");
  std::fprintf(stderr, "hanpu serve: model '%s' (%s)\nchat template: %s\nlistening on http://%s:%d%s\n", so.model_name.c_str(),
               model.config().describe().c_str(), api.chat_template().description.c_str(), so.host.c_str(), so.port,
               so.api_key.empty() ? "" : " (API key required)");
  const bool loopback = so.host == "127.0.0.1" || so.host == "::1" || so.host == "localhost";
  if (!loopback && so.api_key.empty())
    std::fprintf(stderr, "hanpu serve: warning: listening on %s without --api-key: anyone who can reach this address "
                         "can use the model (plain HTTP, no TLS)\n", so.host.c_str());
  std::fflush(stderr);

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig == 0) return;
    std::fprintf(stderr, "hanpu serve: signal %d: draining running requests\n", sig);
    api.draining = true;  // new generation requests get 503 from here on
    sched.drain();        // finishes the queued and running ones
    // ... and their clients receive the rest of their bodies before the sockets close (bounded:
    // a client that stops reading must not hold the shutdown forever).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (api.responses_in_flight > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    svr.stop();
  });
  const bool listened = svr.listen_after_bind();
  if (signal_thread.joinable()) {
    if (svr.is_running() || !api.draining) pthread_kill(signal_thread.native_handle(), SIGTERM);
    signal_thread.join();
  }
  sched.drain();
  std::fprintf(stderr, "hanpu serve: stopped\n");
  return listened || api.draining ? 0 : 1;
}

}  // namespace hanpu::serve
