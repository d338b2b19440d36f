// The request scheduler of `hanpu serve` (scheduler.hpp).
#include "serve/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "hanpu/tensor.hpp"

namespace hanpu::serve {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t nanoseconds_since(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

}  // namespace

bool GenerationHandle::next(GenerationEvent& out) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || finished_; });
  if (events_.empty()) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

GenerationHandle::Wait GenerationHandle::next_for(GenerationEvent& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty() || finished_; })) return Wait::kTimeout;
  if (events_.empty()) return Wait::kEnd;
  out = std::move(events_.front());
  events_.pop_front();
  return Wait::kEvent;
}

GenerationHandle::Wait GenerationHandle::try_next(GenerationEvent& out) {
  std::lock_guard lock(mu_);
  if (events_.empty()) return finished_ ? Wait::kEnd : Wait::kTimeout;
  out = std::move(events_.front());
  events_.pop_front();
  return Wait::kEvent;
}

void GenerationHandle::push(GenerationEvent e) {
  {
    std::lock_guard lock(mu_);
    const bool last = e.kind != GenerationEvent::Kind::kDelta;
    events_.push_back(std::move(e));
    if (last) finished_ = true;
  }
  cv_.notify_all();
  if (signal_) {  // after the event is queued: a reader that saw the old count finds it
    {
      std::lock_guard lock(signal_->mu);
      ++signal_->pushes;
    }
    signal_->cv.notify_all();
  }
}

size_t next_of_any(const std::vector<std::shared_ptr<GenerationHandle>>& handles, size_t from, GenerationEvent& out,
                   std::chrono::milliseconds timeout) {
  const size_t n = handles.size();
  if (n == 0) return 0;
  const std::shared_ptr<ChoiceSignal>& signal = handles.front()->signal();
  for (size_t i = 1; i < n; ++i)
    if (handles[i]->signal() != signal) throw Error("next_of_any: the handles are not one request's choices");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    uint64_t seen = 0;
    if (signal) {
      std::lock_guard lock(signal->mu);
      seen = signal->pushes;
    }
    size_t ended = 0;
    for (size_t k = 0; k < n; ++k) {
      const size_t c = (from + k) % n;
      const GenerationHandle::Wait w = handles[c]->try_next(out);
      if (w == GenerationHandle::Wait::kEvent) return c;
      if (w == GenerationHandle::Wait::kEnd) ++ended;
    }
    if (ended == n) return n;
    if (!signal) {  // one handle without a signal: its own wait
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return n + 1;
      const GenerationHandle::Wait w = handles.front()->next_for(out, left);
      if (w == GenerationHandle::Wait::kEvent) return 0;
      if (w == GenerationHandle::Wait::kEnd) return n;
      return n + 1;
    }
    std::unique_lock lock(signal->mu);
    if (!signal->cv.wait_until(lock, deadline, [&] { return signal->pushes != seen; })) return n + 1;
  }
}

struct Scheduler::Sequence {
  GenerationRequest req;
  std::shared_ptr<GenerationHandle> handle;
  HybridState state;
  std::unique_ptr<TokenStream> stream;  // sampling and stop rules, as `hanpu run` (hanpu/generator.hpp)
  std::vector<int64_t> checkpoints;     // sorted prompt lengths to snapshot at
  int32_t next_input = -1;
  bool admitted = false, prefilling = true, finished = false;
  size_t emitted = 0;                   // bytes of the stream's text already sent
  size_t tokens_sent = 0;               // the stream's tokens already sent
  std::vector<std::unique_ptr<Sequence>> forks;  // choices 2..n: start from this one's prompt state
  Clock::time_point submitted = Clock::now();
};

namespace {

GenerationOptions generation_options(const GenerationRequest& req, uint64_t seed_offset) {
  GenerationOptions o;
  o.sampling = req.sampling;
  o.sampling.seed += seed_offset;
  o.max_tokens = req.max_tokens;
  o.stop_strings = req.stop;
  o.ignore_eos = req.ignore_eos;
  o.top_logprobs = req.top_logprobs;
  o.json_object = req.json_object;
  o.json_schema = req.json_schema;
  o.tool_calls = req.tool_calls;
  o.reasoning_opened = req.reasoning_opened;
  o.thinking_budget = req.thinking_budget;
  o.think_end = req.think_end;
  if (req.sampling.repetition_penalty != 1) {
    const size_t w = req.sampling.repetition_window < 0 ? req.prompt.size()
                                                         : std::min(req.prompt.size(), static_cast<size_t>(req.sampling.repetition_window));
    o.prompt_tail.assign(req.prompt.end() - static_cast<std::ptrdiff_t>(w), req.prompt.end());
  }
  return o;
}

}  // namespace

Scheduler::Scheduler(const HybridModel& model, const Tokenizer* tokenizer, SchedulerOptions opt)
    : model_(model), tokenizer_(tokenizer), opt_(opt), generator_(model, tokenizer), cache_(opt.cache_bytes) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { drain(); }

std::shared_ptr<GenerationHandle> Scheduler::submit(GenerationRequest req) {
  req.n = 1;
  return submit_choices(std::move(req)).front();
}

std::vector<std::shared_ptr<GenerationHandle>> Scheduler::submit_choices(GenerationRequest req) {
  const int choices = std::max(1, req.n);
  if (req.warm_only && choices != 1) throw Error("scheduler: a warm_only request has no choices to fork");
  auto s = std::make_unique<Sequence>();
  // The choices of one request share a signal, so that their stream interleaves them.
  auto signal = choices > 1 ? std::make_shared<ChoiceSignal>() : nullptr;
  s->handle = std::make_shared<GenerationHandle>(signal);
  s->handle->prompt_tokens = static_cast<int64_t>(req.prompt.size());
  s->stream = std::make_unique<TokenStream>(tokenizer_, generator_.stop_ids(), generation_options(req, 0));
  const int64_t len = static_cast<int64_t>(req.prompt.size());
  if (opt_.checkpoint_every > 0)
    for (int64_t at = opt_.checkpoint_every; at < len; at += opt_.checkpoint_every) s->checkpoints.push_back(at);
  for (int64_t at : req.extra_checkpoints)
    if (at > 0 && at < len) s->checkpoints.push_back(at);
  s->checkpoints.push_back(len);
  // And one token before the end: the same prompt again (a regenerate, another choice later, a
  // retry) can then restore all it may (the last token always runs, for its logits).
  if (!req.warm_only && len > 1) s->checkpoints.push_back(len - 1);
  // And the last --prefill-chunk boundary before the end (counted from the prompt's start): a
  // prompt that differs from this one only in its last tokens (a regenerate after an edit,
  // another suffix) reuses everything up to it, even where --checkpoint-every left no snapshot.
  if (!req.warm_only && opt_.prefill_chunk > 0) {
    const int64_t boundary = (len - 1) / opt_.prefill_chunk * opt_.prefill_chunk;
    if (boundary > 0) s->checkpoints.push_back(boundary);
  }
  std::sort(s->checkpoints.begin(), s->checkpoints.end());
  s->checkpoints.erase(std::unique(s->checkpoints.begin(), s->checkpoints.end()), s->checkpoints.end());
  std::vector<std::shared_ptr<GenerationHandle>> handles{s->handle};
  for (int i = 1; i < choices; ++i) {
    auto f = std::make_unique<Sequence>();
    f->handle = std::make_shared<GenerationHandle>(signal);
    f->handle->prompt_tokens = s->handle->prompt_tokens;
    f->stream = std::make_unique<TokenStream>(tokenizer_, generator_.stop_ids(), generation_options(req, static_cast<uint64_t>(i)));
    f->req = req;
    f->req.prompt.clear();  // the parent's prompt; only its length matters (snapshot() uses it)
    f->req.prompt.shrink_to_fit();
    handles.push_back(f->handle);
    s->forks.push_back(std::move(f));
  }
  s->req = std::move(req);
  for (auto& f : s->forks) f->req.prompt = s->req.prompt;
  {
    std::lock_guard lock(mu_);
    if (draining_) throw ShuttingDown("the server is shutting down");
    // A request with n choices takes n places (each choice becomes a sequence of its own).
    if (admitted_ + choices - 1 >= static_cast<int64_t>(opt_.max_running) + opt_.max_queue)
      throw QueueFull("the server is full: " + std::to_string(admitted_) + " requests running or waiting (--parallel " +
                      std::to_string(opt_.max_running) + " plus --max-queue " + std::to_string(opt_.max_queue) +
                      "); retry later");
    admitted_ += choices;
    waiting_.push_back(std::move(s));
    metrics_.waiting = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_all();
  return handles;
}

void Scheduler::drain() {
  {
    std::lock_guard lock(mu_);
    draining_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::admit(Sequence& s) {
  const auto t0 = Clock::now();
  const int64_t len = static_cast<int64_t>(s.req.prompt.size());
  // At most len - 1 tokens come from the cache: the last prompt token must run through the
  // model to give the logits of the first generated token (snapshots hold states, not logits).
  // A warm_only request needs no logits: a snapshot of its whole prompt means nothing to do.
  const int64_t usable = s.req.warm_only ? len : len - 1;
  const int64_t shared = cache_.shared_prefix(s.req.prompt);
  if (std::optional<HybridState> hit = cache_.lookup(s.req.prompt, usable)) {
    s.state = std::move(*hit);
    s.handle->cached_tokens = s.state.position;
    ++metrics_.cache_hits;
    metrics_.cache_tokens_reused += static_cast<uint64_t>(s.state.position);
  } else {
    s.state = model_.new_state();
    ++metrics_.cache_misses;
  }
  const int64_t got = s.handle->cached_tokens;
  if (got > 0 && got >= std::min(shared, usable)) {
    s.handle->cache_result = "hit";
    s.handle->cache_note = "reused " + std::to_string(got) + " of " + std::to_string(len) + " prompt tokens" +
                           (got == len - 1 && !s.req.warm_only ? " (the last one always runs, for its logits)" : "");
  } else if (shared == 0) {
    s.handle->cache_result = "miss";
    s.handle->cache_note = "no cached sequence starts with this prompt's first token";
  } else {
    s.handle->cache_result = got > 0 ? "partial" : "miss";
    s.handle->cache_note = "cached sequences share " + std::to_string(std::min(shared, len)) + " prompt tokens, but " +
                           (got > 0 ? "the deepest snapshot within them is at " + std::to_string(got)
                                    : std::string("no snapshot lies within them")) +
                           " (snapshots are taken every --checkpoint-every tokens, at prompt ends and after replies)";
  }
  metrics_.restore_ns += nanoseconds_since(t0);
  ++metrics_.requests_started;
  metrics_.prompt_tokens += static_cast<uint64_t>(len);
}

void Scheduler::snapshot(const Sequence& s) {
  const auto t0 = Clock::now();
  const size_t pos = static_cast<size_t>(s.state.position);
  std::vector<int32_t> tokens(s.req.prompt.begin(), s.req.prompt.begin() + static_cast<std::ptrdiff_t>(
                                                                                std::min(pos, s.req.prompt.size())));
  for (size_t i = 0; tokens.size() < pos; ++i) tokens.push_back(s.stream->tokens()[i]);
  if (cache_.insert(tokens, s.state)) ++metrics_.snapshots_taken;
  metrics_.snapshot_ns += nanoseconds_since(t0);
}

void Scheduler::emit_text(Sequence& s, bool final) {
  const TokenStream& st = *s.stream;
  // Held back: what could still be the start of a stop string, and half characters.
  const size_t end = final ? st.text().size() : st.settled_text_bytes(s.emitted);
  const bool has_text = end > s.emitted;
  const bool has_tokens = st.tokens().size() > s.tokens_sent;
  if (!has_text && !has_tokens) return;
  // With a tokenizer, tokens that add no visible text yet wait for the next event.
  if (!has_text && tokenizer_ && !final) return;
  GenerationEvent e;
  e.text = st.text().substr(s.emitted, end - s.emitted);
  e.tokens.assign(st.tokens().begin() + static_cast<std::ptrdiff_t>(s.tokens_sent), st.tokens().end());
  e.logprobs = s.stream->take_logprobs();
  s.tokens_sent = st.tokens().size();
  s.emitted = end;
  s.handle->push(std::move(e));
}

void Scheduler::finish(Sequence& s, const std::string& reason) {
  emit_text(s, true);
  if (s.state.position > static_cast<int64_t>(s.req.prompt.size())) snapshot(s);  // prompt + reply
  s.handle->completion_tokens = static_cast<int64_t>(s.stream->tokens().size());
  metrics_.completion_tokens += s.stream->tokens().size();
  ++metrics_.requests_finished;
  if (s.req.warm_only) ++metrics_.warm_requests;
  if (log_requests_)
    std::fprintf(stderr, "hanpu serve: %s: prompt %lld tokens, cache %s: %s; generated %lld (%s), first token after %.3f s\n",
                 s.req.warm_only ? "next-turn snapshot" : "request", static_cast<long long>(s.req.prompt.size()),
                 s.handle->cache_result.c_str(), s.handle->cache_note.c_str(), static_cast<long long>(s.stream->tokens().size()),
                 reason.c_str(), s.handle->ttft_seconds);
  GenerationEvent done;
  done.kind = GenerationEvent::Kind::kDone;
  done.finish_reason = reason;
  done.stop_string = s.stream->stop_string();
  s.finished = true;
  s.handle->push(std::move(done));
}

void Scheduler::on_token(Sequence& s, std::span<const float> logits) {
  const std::optional<int32_t> next = s.stream->push(logits);
  if (!next) {
    finish(s, s.stream->reason() == FinishReason::kLength ? "length" : "stop");
    return;
  }
  emit_text(s, false);
  s.next_input = *next;
}

void Scheduler::prefill_step(Sequence& s) {
  const ForwardOptions fo{.threads = opt_.threads, .precision = opt_.precision};
  const int64_t V = model_.config().vocab_size;
  const int64_t pos = s.state.position, len = static_cast<int64_t>(s.req.prompt.size());
  if (pos == len) {  // a warm_only prompt already snapshotted whole: nothing to compute
    s.prefilling = false;
    finish(s, "length");
    return;
  }
  int64_t end = std::min(len, pos + opt_.prefill_chunk);
  // One chunk per turn, ending at the next checkpoint if one comes first (Generator::prefill
  // splits there and snapshots: the state at that point exists anyway, no extra pass).
  auto next_checkpoint = std::upper_bound(s.checkpoints.begin(), s.checkpoints.end(), pos);
  if (next_checkpoint != s.checkpoints.end()) end = std::min(end, *next_checkpoint);
  const auto t0 = Clock::now();
  uint64_t snapshot_ns = 0;
  Tensor logits = generator_.prefill(s.state, s.req.prompt, end, opt_.prefill_chunk, fo, s.checkpoints, [&](const HybridState&) {
    const auto t1 = Clock::now();
    snapshot(s);
    snapshot_ns += nanoseconds_since(t1);
  });
  metrics_.prefill_ns += nanoseconds_since(t0) - snapshot_ns;
  metrics_.prefill_tokens += static_cast<uint64_t>(end - pos);
  if (end < len) return;
  s.prefilling = false;
  if (s.req.max_tokens <= 0) {
    finish(s, "length");
    for (auto& f : s.forks) {
      finish(*f, "length");
      spawned_.push_back(std::move(f));
    }
    s.forks.clear();
    return;
  }
  const std::span<const float> row{logits.ptr<float>(), static_cast<size_t>(V)};
  fork_choices(s, row);
  s.handle->ttft_seconds = std::chrono::duration<double>(Clock::now() - s.submitted).count();
  metrics_.ttft_ns += static_cast<uint64_t>(s.handle->ttft_seconds * 1e9);
  ++metrics_.ttft_count;
  on_token(s, row);
}

// Choices 2..n start from a copy of the prompt's state and its logits, each with its own sampler
// (they join running_ at the end of this turn).
void Scheduler::fork_choices(Sequence& s, std::span<const float> logits) {
  for (auto& f : s.forks) {
    f->state = s.state;
    f->admitted = true;
    f->prefilling = false;
    f->submitted = s.submitted;
    f->handle->cached_tokens = s.handle->cached_tokens;
    f->handle->cache_result = s.handle->cache_result;
    f->handle->cache_note = s.handle->cache_note;
    f->handle->ttft_seconds = std::chrono::duration<double>(Clock::now() - s.submitted).count();
    on_token(*f, logits);
    spawned_.push_back(std::move(f));
  }
  s.forks.clear();
}

void Scheduler::decode_step(const std::vector<Sequence*>& batch) {
  const ForwardOptions fo{.threads = opt_.threads, .precision = opt_.precision};
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  const auto t0 = Clock::now();
  if (opt_.batch_decode && batch.size() > 1) {
    std::vector<HybridState*> states;
    std::vector<int32_t> ids;
    for (Sequence* s : batch) {
      states.push_back(&s->state);
      ids.push_back(s->next_input);
    }
    Tensor logits = model_.forward_batch(states, ids, fo);
    metrics_.decode_ns += nanoseconds_since(t0);
    metrics_.decode_tokens += batch.size();
    ++metrics_.decode_steps;
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::span<const float> row{logits.ptr<float>() + i * V, V};
      on_token(*batch[i], row);
    }
    return;
  }
  for (Sequence* s : batch) {
    const auto t1 = Clock::now();
    const int32_t one[1] = {s->next_input};
    Tensor logits = model_.forward(s->state, one, fo);
    metrics_.decode_ns += nanoseconds_since(t1);
    ++metrics_.decode_tokens;
    ++metrics_.decode_steps;
    const std::span<const float> row{logits.ptr<float>(), V};
    on_token(*s, row);
  }
}

void Scheduler::loop() {
  auto fail = [&](Sequence& s, const std::string& why, bool cancelled) {
    ++(cancelled ? metrics_.requests_cancelled : metrics_.requests_failed);
    s.finished = true;
    GenerationEvent e;
    e.kind = GenerationEvent::Kind::kError;
    e.error = why;
    s.handle->push(e);
    // Choices not forked yet fail with it (and leave running_ at the end of this turn).
    for (auto& f : s.forks) {
      f->finished = true;
      f->handle->push(e);
      spawned_.push_back(std::move(f));
    }
    s.forks.clear();
  };
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !waiting_.empty() || !running_.empty() || draining_; });
      if (draining_ && waiting_.empty() && running_.empty()) return;
      while (static_cast<int>(running_.size()) < opt_.max_running && !waiting_.empty()) {
        running_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      metrics_.waiting = static_cast<int64_t>(waiting_.size());
    }
    std::vector<Sequence*> decoding, prefilling;
    for (const auto& s : running_) {
      if (s->handle->cancelled()) fail(*s, "cancelled", true);
      else (s->admitted && !s->prefilling ? decoding : prefilling).push_back(s.get());
    }
    // A next-turn snapshot goes first: the turn it is for is usually queued right behind it.
    auto warm = std::find_if(prefilling.begin(), prefilling.end(), [](Sequence* s) { return s->req.warm_only; });
    // Alternate: a batched decode step of everything generating, then one prefill chunk.
    const bool decode_turn = !decoding.empty() && (prefilling.empty() || !last_turn_decoded_);
    if (decode_turn) {
      last_turn_decoded_ = true;
      try {
        decode_step(decoding);
      } catch (const std::exception& ex) {
        for (Sequence* s : decoding)
          if (!s->finished) fail(*s, ex.what(), false);
      }
    } else if (!prefilling.empty()) {
      last_turn_decoded_ = false;
      Sequence& s = warm != prefilling.end() ? **warm : *prefilling[next_prefill_++ % prefilling.size()];
      try {
        if (!s.admitted) {
          admit(s);
          s.admitted = true;
        }
        prefill_step(s);
      } catch (const std::exception& ex) {
        fail(s, ex.what(), false);
      }
    }
    for (auto& f : spawned_) running_.push_back(std::move(f));
    spawned_.clear();
    // Finished sequences leave (freeing their states); the others keep their order.
    size_t left = 0;
    {
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < running_.size(); ++i) {
        if (running_[i]->finished) {
          --admitted_;
          continue;
        }
        if (left != i) running_[left] = std::move(running_[i]);
        ++left;
      }
    }
    running_.resize(left);
    int64_t held = 0;
    for (const auto& r : running_) held += static_cast<int64_t>(r->state.bytes());
    metrics_.state_bytes = held;
    metrics_.running = static_cast<int64_t>(running_.size());
  }
}

}  // namespace hanpu::serve
