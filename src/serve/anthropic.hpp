// Anthropic's Messages API (POST /v1/messages) mapped onto the chat completions request that
// `hanpu serve` already renders with the checkpoint's chat template (docs/SERVE.md): system
// prompt, content blocks (text, thinking, tool_use, tool_result), tools, tool_choice, thinking,
// stop_sequences. Written from Anthropic's public API reference (request and streaming event
// shapes); the answer side is in server.cpp.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace hanpu::serve {

/// A request Anthropic's API would refuse with 400 invalid_request_error; `field` names the
/// request field (dotted path, e.g. "messages[2].content[0].type").
class AnthropicRequestError : public std::runtime_error {
 public:
  AnthropicRequestError(std::string field, const std::string& message)
      : std::runtime_error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

/// The chat completions body (model, messages, tools, tool_choice, max_tokens, temperature,
/// top_p, top_k, stop, stream, chat_template_kwargs) equivalent to an Anthropic Messages body.
/// Keys keep their order (the template's tojson output depends on it). Throws
/// AnthropicRequestError for a missing or malformed field, an unknown one, or a content block
/// hanpu cannot render (image, document, server tools, redacted_thinking).
nlohmann::ordered_json anthropic_to_chat_request(const nlohmann::ordered_json& body);

/// Anthropic's error "type" for an HTTP status (400 invalid_request_error, 401
/// authentication_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503
/// overloaded_error, else api_error).
const char* anthropic_error_type(int status);

}  // namespace hanpu::serve
