// libFuzzer target: an Anthropic Messages request body (JSON from the network) through
// hanpu serve's mapping onto a chat completions request (src/serve/anthropic.cpp). Invalid JSON
// and AnthropicRequestError are the expected answers to bad input.
#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "serve/anthropic.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto body = nlohmann::ordered_json::parse(hanpu::fuzz::as_text(data, size), nullptr, false);
  if (body.is_discarded()) return 0;
  try {
    const nlohmann::ordered_json chat = hanpu::serve::anthropic_to_chat_request(body);
    (void)chat.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } catch (const hanpu::serve::AnthropicRequestError&) {
  }
  return 0;
}
