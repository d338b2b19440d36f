// `hanpu serve`: an OpenAI-compatible HTTP server over one hybrid model (docs/SERVE.md).
#pragma once

#include <cstdint>
#include <string>

#include "serve/scheduler.hpp"

namespace hanpu::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise: the API has no TLS
  int port = 8080;
  std::string api_key;             // empty: no authentication
  std::string model_name;          // the id /v1/models lists and requests must name
  std::string model_dir;           // for the tokenizer and chat template (empty: synthetic)
  // 8 MiB: a prompt at the longest --max-prompt-tokens default (32,768 tokens) as a JSON array of
  // ids is under 256 KiB, as text a few hundred KiB; 8 MiB leaves room for long chat histories
  // while one request cannot make the server buffer without bound.
  size_t max_body_bytes = size_t{8} << 20;
  int64_t max_prompt_tokens = 32768;
  int64_t context_tokens = 32768;  // prompt + generated tokens per sequence
  bool log_requests = true;         // one line per request on stderr (cache hit/miss and why)
  int http_threads = 0;            // 0: enough for every running and queued request, plus spares
};

/// Loads nothing itself: serves `model` (and `tokenizer`, may be null) until SIGTERM or SIGINT,
/// then drains the running requests and returns 0.
int run_server(const HybridModel& model, const Tokenizer* tokenizer, const ServerOptions& server_opt,
               const SchedulerOptions& scheduler_opt);

}  // namespace hanpu::serve
