// The scheduler of `hanpu serve` (docs/SERVE.md): one thread owns the model and alternates two
// kinds of turn: one decode step of every sequence that is generating, batched into one
// forward_batch() call (continuous batching: sequences join and leave between steps), and one
// prefill chunk of the next sequence still reading its prompt (round robin), so a long prompt
// delays the others by one chunk per step instead of by its whole prefill.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "hanpu/generator.hpp"
#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"
#include "serve/prefix_cache.hpp"

namespace hanpu::serve {

struct SchedulerOptions {
  int threads = 1;  // forward() threads
  // Sequences holding a state at once. Each holds its own (Qwen3.5-0.8B: 20 MiB + 24 KiB per
  // token, up to 800 MiB at 32K tokens); 4 bounds that on a small machine and already gives the
  // batched decode step rows to share.
  int max_running = 4;
  // Requests waiting beyond max_running. On a few cores the 16th waits minutes; a 429 then lets
  // the client retry or go elsewhere instead of queueing without bound.
  int max_queue = 16;
  // Prompt tokens per turn: 256 take 1 to 2 s on Qwen3.5-0.8B shapes on 2 cores, the longest a
  // long prompt stalls the generating sequences per step. Longer chunks prefill faster but not by
  // much (bench-model on the shared machine: 42 tokens/s at 256, 54 at 2048).
  int64_t prefill_chunk = 256;
  // Snapshot spacing during prefill (0: prompt ends only). A Qwen3.5-0.8B snapshot is 32 MiB at
  // 512 tokens, 68 MiB at 2K: every 512 keeps a 2K prompt's snapshots near 200 MiB while a prompt
  // that diverges inside a cached one recomputes at most 512 tokens.
  int64_t checkpoint_every = 512;
  // 1 GiB: about 15 snapshots of 2K-token Qwen3.5-0.8B conversations.
  size_t cache_bytes = size_t{1024} << 20;
  LinearPrecision precision = LinearPrecision::kExact;
  /// Decode the generating sequences together (HybridModel::forward_batch); false: one
  /// forward() per sequence and turn, as a baseline for the benchmark.
  bool batch_decode = true;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingOptions sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;        // generate max_tokens whatever comes (benchmarks, tests)
  /// Prompt lengths worth a snapshot besides the regular ones (a chat's last message end, which
  /// the next turn of the conversation shares, unlike the generation prompt after it).
  std::vector<int64_t> extra_checkpoints;
  /// Log probabilities of the chosen tokens, with this many alternatives each (OpenAI's
  /// top_logprobs, 0 to 20); -1: none.
  int top_logprobs = -1;
  /// Choices (OpenAI's n): the prompt is prefilled once, and its state is copied into n - 1 more
  /// sequences, sampled with seeds seed + 1, seed + 2, ... (see Scheduler::submit_choices).
  int n = 1;
  /// Only compute the prompt's state and snapshot it; nothing is generated and no one reads the
  /// handle. The server sends one after a chat reply with the conversation as the next turn will
  /// render it (docs/SERVE.md, "prefix cache"); it prefills before other prompts, so the next turn,
  /// queued behind it, finds its snapshot.
  bool warm_only = false;
  bool json_object = false;  // constrain the output to one JSON object (GenerationOptions::json_object)
  std::shared_ptr<const hanpu::JsonSchema> json_schema;  // ... to a schema's document (GenerationOptions::json_schema)
  std::shared_ptr<const hanpu::ToolCallGrammar> tool_calls;  // ... to tool calls (GenerationOptions::tool_calls)
  bool reasoning_opened = false;  // the prompt ends inside a <think> block (GenerationOptions::reasoning_opened)
  int64_t thinking_budget = -1;   // GenerationOptions::thinking_budget
  std::vector<int32_t> think_end;  // GenerationOptions::think_end
};

using hanpu::TokenLogprob;  // hanpu/generator.hpp

/// What the scheduler tells a request's HTTP handler, in order.
struct GenerationEvent {
  enum class Kind { kDelta, kDone, kError } kind = Kind::kDelta;
  std::string text;              // kDelta: new output text (whole UTF-8 characters)
  std::vector<int32_t> tokens;   // kDelta: the tokens generated since the previous event
  std::vector<TokenLogprob> logprobs;  // kDelta: one per token in `tokens` (top_logprobs >= 0)
  std::string stop_string;       // kDone: the stop string that ended it (empty: a stop token or length)
  std::string finish_reason;     // kDone: "stop" or "length"
  std::string error;             // kError
};

/// Shared by the handles of one request's choices: every event pushed to any of them counts one,
/// so a reader streaming all the choices can sleep until one of them has something
/// (next_of_any) instead of reading them one after another.
struct ChoiceSignal {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t pushes = 0;  // under mu
};

/// One request's channel between the scheduler and its handler thread.
class GenerationHandle {
 public:
  GenerationHandle() = default;
  explicit GenerationHandle(std::shared_ptr<ChoiceSignal> signal) : signal_(std::move(signal)) {}
  /// Waits for the next event (false after kDone/kError was taken).
  bool next(GenerationEvent& out);
  /// As next(), waiting at most `timeout`: kEvent (out filled), kTimeout, or kEnd.
  enum class Wait { kEvent, kTimeout, kEnd };
  Wait next_for(GenerationEvent& out, std::chrono::milliseconds timeout);
  /// The next event if one is queued, without waiting: kEvent, kTimeout (none yet) or kEnd.
  Wait try_next(GenerationEvent& out);
  const std::shared_ptr<ChoiceSignal>& signal() const { return signal_; }
  /// The client went away: the scheduler drops the sequence at its next turn.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Filled by the scheduler before kDone.
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double ttft_seconds = 0;
  /// Why the cache gave what it gave (set when the request is admitted): "hit", "partial" (a
  /// cached sequence shares more of the prompt than the deepest snapshot in it covers) or "miss".
  std::string cache_result, cache_note;

  void push(GenerationEvent e);  // scheduler side

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};
  std::shared_ptr<ChoiceSignal> signal_;  // null for a lone request
};

/// The next event of any of one request's choices (their handles share a ChoiceSignal), looking
/// at them round-robin from `from` so that none waits behind another: its index, or
/// handles.size() when every choice has ended. Waits at most `timeout` (then returns
/// handles.size() + 1), so the caller can check that its client is still there.
size_t next_of_any(const std::vector<std::shared_ptr<GenerationHandle>>& handles, size_t from, GenerationEvent& out,
                   std::chrono::milliseconds timeout);

/// Counters for /metrics (monotonic unless named as a gauge).
struct SchedulerMetrics {
  std::atomic<uint64_t> requests_started{0}, requests_finished{0}, requests_cancelled{0}, requests_failed{0};
  std::atomic<uint64_t> prompt_tokens{0}, completion_tokens{0};
  std::atomic<uint64_t> prefill_tokens{0};    // prompt tokens actually computed (not restored)
  std::atomic<uint64_t> decode_tokens{0};
  std::atomic<uint64_t> decode_steps{0};      // forward passes of decode (batched: several tokens each)
  std::atomic<uint64_t> cache_hits{0}, cache_misses{0}, cache_tokens_reused{0};
  std::atomic<uint64_t> snapshots_taken{0};
  std::atomic<uint64_t> warm_requests{0};     // warm_only sequences (next-turn snapshots)
  std::atomic<uint64_t> ttft_count{0};
  // Seconds, kept as nanoseconds so they can be atomic integers.
  std::atomic<uint64_t> prefill_ns{0}, decode_ns{0}, snapshot_ns{0}, restore_ns{0}, ttft_ns{0};
  std::atomic<int64_t> running{0}, waiting{0};  // gauges
  std::atomic<int64_t> state_bytes{0};          // gauge: states of the running sequences
};

class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShuttingDown : public Error {
 public:
  using Error::Error;
};

class Scheduler {
 public:
  /// The tokenizer may be null (ids in, ids out; no text, no stop strings).
  Scheduler(const HybridModel& model, const Tokenizer* tokenizer, SchedulerOptions opt);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Queues a request; throws QueueFull when max_queue requests already wait, ShuttingDown after
  /// drain() began, and hanpu::Error for settings the generation refuses (TokenStream).
  std::shared_ptr<GenerationHandle> submit(GenerationRequest req);
  /// As submit(), for req.n choices: one handle per choice, in order.
  std::vector<std::shared_ptr<GenerationHandle>> submit_choices(GenerationRequest req);
  /// Log one line per finished request to stderr (prompt, cached tokens and why, output, TTFT).
  void set_log_requests(bool on) { log_requests_ = on; }
  /// Stops taking requests, finishes the queued and running ones, and joins the thread.
  void drain();

  const SchedulerMetrics& metrics() const { return metrics_; }
  const PrefixCache& cache() const { return cache_; }
  const SchedulerOptions& options() const { return opt_; }

 private:
  struct Sequence;
  void loop();
  void admit(Sequence& s);
  void prefill_step(Sequence& s);
  void decode_step(const std::vector<Sequence*>& batch);
  void on_token(Sequence& s, std::span<const float> logits);
  void finish(Sequence& s, const std::string& reason);
  void emit_text(Sequence& s, bool final);
  void snapshot(const Sequence& s);

  void fork_choices(Sequence& s, std::span<const float> logits);

  const HybridModel& model_;
  const Tokenizer* tokenizer_;
  std::atomic<bool> log_requests_{false};
  const SchedulerOptions opt_;
  Generator generator_;  // stop ids, sampling and stop rules, chunked prefill: as `hanpu run`
  PrefixCache cache_;
  SchedulerMetrics metrics_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  bool draining_ = false;
  std::vector<std::unique_ptr<Sequence>> running_;  // scheduler thread only
  std::vector<std::unique_ptr<Sequence>> spawned_;  // forked choices joining running_ after this turn
  size_t next_prefill_ = 0;
  bool last_turn_decoded_ = false;
  int64_t admitted_ = 0;  // waiting plus running, under mu_
  std::thread thread_;
};

}  // namespace hanpu::serve
