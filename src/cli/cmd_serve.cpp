// `hanpu serve`: the OpenAI-compatible local server (src/serve, docs/SERVE.md).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "model/gguf_arch.hpp"
#include "cli/commands.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"
#include "serve/server.hpp"

namespace {

using namespace hanpu;

struct ServeArgs {
  std::string model_dir, synthetic, precision = "exact";
  serve::ServerOptions server;
  serve::SchedulerOptions scheduler;
  int64_t cache_mib = 1024;
  uint64_t seed = 1;
};

void run_serve(ServeArgs& a) {
  if (a.model_dir.empty() == a.synthetic.empty()) throw Error("give exactly one of --model and --synthetic");
  if (a.server.max_prompt_tokens > a.server.context_tokens)
    throw Error("--max-prompt-tokens " + std::to_string(a.server.max_prompt_tokens) + " is more than --ctx " +
                std::to_string(a.server.context_tokens) + "; expected at most the context");
  a.scheduler.threads = a.scheduler.threads > 0 ? a.scheduler.threads : hardware_threads();
  a.scheduler.cache_bytes = static_cast<size_t>(a.cache_mib) << 20;
  a.scheduler.precision = linear_precision_from_name(a.precision);
  auto engine = std::make_shared<Engine>(a.scheduler.threads);
  HybridModel model = a.model_dir.empty()
                          ? HybridModel::synthetic(model_preset(a.synthetic), a.seed, a.scheduler.threads, {}, engine)
                          : HybridModel::load(a.model_dir, {.progress = true, .engine = engine});
  std::unique_ptr<Tokenizer> tok;
  // Tokenizer::from_dir reads tokenizer.json (Qwen) or tiktoken.model (Kimi Linear).
  const std::filesystem::path dir(a.model_dir);
  if (!a.model_dir.empty() &&
      (std::filesystem::exists(dir / "tokenizer.json") || std::filesystem::exists(dir / "tiktoken.model") ||
       (model::is_gguf_path(a.model_dir) && model::gguf_has_tokenizer(a.model_dir))))
    tok = std::make_unique<Tokenizer>(Tokenizer::from_dir(a.model_dir));
  a.server.model_dir = a.model_dir;
  if (a.server.model_name.empty())
    a.server.model_name = a.model_dir.empty() ? a.synthetic
                                              : std::filesystem::path(a.model_dir).lexically_normal().filename().string();
  if (a.server.model_name.empty()) a.server.model_name = std::filesystem::path(a.model_dir).parent_path().filename().string();
  serve::run_server(model, tok.get(), a.server, a.scheduler);
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server with a prefix cache for hybrid models (docs/SERVE.md)");
  s->add_option("--model", a->model_dir, "checkpoint directory (config.json, *.safetensors, tokenizer.json or tiktoken.model) or a GGUF file (NAME.gguf, or any part NAME-0000i-of-0000N.gguf)");
  std::string presets;
  for (const std::string& p : model_preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  s->add_option("--synthetic", a->synthetic, "serve random bf16 weights of a preset instead (" + presets + "; token ids only)");
  s->add_option("--seed", a->seed, "seed of the --synthetic weights (default 1)");
  s->add_option("--model-name", a->server.model_name, "the model id clients send (default: the directory's name)");
  s->add_option("--host", a->server.host, "address to listen on (default 127.0.0.1, this machine only)");
  s->add_option("--port", a->server.port, "port (default 8080)")->check(CLI::Range(1, 65535));
  s->add_option("--threads", a->scheduler.threads, "threads of the forward passes (default all)")->check(CLI::Range(1, 1024));
  s->add_option("--api-key", a->server.api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health");
  s->add_option("--cache-mib", a->cache_mib, "prefix cache budget in MiB (default 1024; 0 turns the cache off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_option("--checkpoint-every", a->scheduler.checkpoint_every,
                "snapshot the state every N prompt tokens during prefill (default 512; 0: only at prompt ends)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  s->add_option("--prefill-chunk", a->scheduler.prefill_chunk,
                "prompt tokens per scheduler turn (default 256): smaller keeps other requests' tokens flowing during a "
                "long prefill, larger prefills faster")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--parallel", a->scheduler.max_running, "requests running at once (default 4)")->check(CLI::Range(1, 256));
  s->add_option("--max-queue", a->scheduler.max_queue, "requests waiting beyond --parallel before 429 (default 16)")
      ->check(CLI::Range(0, 4096));
  s->add_option("--ctx", a->server.context_tokens, "tokens per sequence, prompt plus output (default 32768)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 18));
  s->add_option("--max-prompt-tokens", a->server.max_prompt_tokens, "longest prompt accepted (default 32768)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 18));
  s->add_option("--max-body-bytes", a->server.max_body_bytes, "largest request body (default 8 MiB)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
  s->add_flag("!--no-request-log", a->server.log_requests, "do not log one line per request (cache hit or miss and why) on stderr");
  s->add_flag("!--no-batch-decode", a->scheduler.batch_decode,
              "decode each running sequence in its own forward pass instead of batching them (for comparison)");
  s->add_option("--precision", a->precision, "projection activations: exact (default), bf16x2, bf16");
  s->callback([a] { run_serve(*a); });
}
