// The one generation path (hanpu/generator.hpp).
#include "hanpu/generator.hpp"

#include "hanpu/model_family.hpp"
#include "json_constraint.hpp"
#include "json_constraint_schema.hpp"
#include "json_constraint_tools.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

namespace hanpu {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Length of the longest run of whole UTF-8 characters in text[begin, end): a character whose
// bytes are not all there yet waits for the next token (a token may carry half a character).
// Bytes that cannot start a character count as one each (a JSON writer replaces them), and a
// lead byte followed by fewer continuation bytes than it announces ends where they end: so each
// piece ends where a decoder of the whole text is between characters too, and the pieces' JSON
// (invalid bytes replaced) concatenates to the whole text's (a stream equals the whole reply).
size_t whole_characters_end(const std::string& text, size_t begin, size_t end) {
  size_t i = begin;
  while (i < end) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
    size_t n = 1;
    while (n < len && i + n < end && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    if (n < len && i + n == end) break;  // the next byte may continue it
    i += n;
  }
  return i;
}

}  // namespace

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  float mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double log_z = mx + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - log_z);
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const size_t k = std::min(ids.size(), static_cast<size_t>(top));
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
      return la > lb || (la == lb && a < b);
    });
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], static_cast<float>(logits[static_cast<size_t>(ids[i])] - log_z));
  }
  return out;
}

TokenStream::TokenStream(const Tokenizer* tokenizer, std::vector<int32_t> stop_ids, GenerationOptions opt)
    : tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)), opt_(std::move(opt)), sampler_(opt_.sampling) {
  if (!opt_.stop_strings.empty() && !tokenizer_) throw Error("generation: stop strings need a tokenizer (text output)");
  for (const std::string& s : opt_.stop_strings) {
    if (s.empty()) throw Error("generation: an empty stop string");
    longest_stop_ = std::max(longest_stop_, s.size());
  }
  if (opt_.max_tokens <= 0) reason_ = FinishReason::kLength;
  if (opt_.sampling.has_penalties()) context_ = opt_.prompt_tail;
  if (opt_.thinking_budget >= 0 && opt_.think_end.empty()) throw Error("generation: a thinking budget needs the end-of-thinking marker's tokens");
  for (int32_t t : opt_.think_end)
    if (t < 0 || (tokenizer_ && t >= tokenizer_->vocab_size())) throw Error("generation: think_end token " + std::to_string(t) + " is outside the vocabulary");
  if (opt_.json_object) {
    if (!tokenizer_) throw Error("generation: JSON output needs a tokenizer (text output)");
    if (opt_.max_tokens < 2)
      throw Error("generation: JSON output needs max_tokens of at least 2 (the shortest object, {}), got " +
                  std::to_string(opt_.max_tokens));
    json_ = std::make_unique<JsonConstraint>(*tokenizer_);
  }
  if (opt_.json_schema) {
    if (opt_.json_object) throw Error("generation: json_object and json_schema are exclusive");
    if (!tokenizer_) throw Error("generation: JSON schema output needs a tokenizer (text output)");
    if (opt_.max_tokens < opt_.json_schema->min_bytes())
      throw Error("generation: max_tokens " + std::to_string(opt_.max_tokens) +
                  " is too few for the JSON schema (its shortest document takes up to " +
                  std::to_string(opt_.json_schema->min_bytes()) + " tokens)");
    schema_ = std::make_unique<SchemaConstraint>(*tokenizer_, opt_.json_schema);
  }
  if (opt_.tool_calls && !opt_.tool_calls->trigger().empty()) {
    // tool_choice auto: free text until the trigger, then the call's grammar (push()).
    if (opt_.json_object || opt_.json_schema) throw Error("generation: tool calls and JSON output are exclusive");
    if (!tokenizer_) throw Error("generation: constrained tool calls need a tokenizer (text output)");
    // The call's mask is built now (once): a vocabulary that cannot close a call within the
    // budget (no single-byte token for a byte it needs) leaves auto unconstrained.
    try {
      lazy_tools_ = std::make_unique<ToolCallConstraint>(*tokenizer_, opt_.tool_calls,
                                                         opt_.ignore_eos ? std::vector<int32_t>{} : stop_ids_);
      lazy_ = true;
    } catch (const Error&) {
      lazy_ = false;
    }
    trie_ = vocabulary_trie(*tokenizer_);
    if (auto id = tokenizer_->token_to_id(opt_.tool_calls->trigger()); id && tokenizer_->is_special(*id) &&
        std::find(stop_ids_.begin(), stop_ids_.end(), *id) == stop_ids_.end())
      trigger_token_ = *id;
  } else if (opt_.tool_calls) {
    if (opt_.json_object || opt_.json_schema) throw Error("generation: tool calls and JSON output are exclusive");
    if (!tokenizer_) throw Error("generation: constrained tool calls need a tokenizer (text output)");
    if (!opt_.stop_strings.empty()) throw Error("generation: stop strings could cut a constrained tool call short");
    if (opt_.max_tokens < opt_.tool_calls->min_bytes())
      throw Error("generation: max_tokens " + std::to_string(opt_.max_tokens) +
                  " is too few for the tool call (its shortest form takes up to " +
                  std::to_string(opt_.tool_calls->min_bytes()) + " tokens)");
    // The stop tokens end the reply where the grammar may end (after a call, with parallel
    // calls); with ignore_eos none does, and the reply ends there by itself.
    tools_ = std::make_unique<ToolCallConstraint>(*tokenizer_, opt_.tool_calls,
                                                  opt_.ignore_eos ? std::vector<int32_t>{} : stop_ids_);
  }
}

size_t TokenStream::outside_think_from() const {
  const size_t open = text_.rfind("<think>"), close = text_.rfind("</think>");
  if (close != std::string::npos && (open == std::string::npos || open < close)) return close + 8;
  if (open != std::string::npos) return std::string::npos;
  return opt_.reasoning_opened ? std::string::npos : 0;
}

// Before a lazy grammar's trigger: a token that would complete the trigger is allowed only if
// the call it opens (the trigger and the rest of the token's bytes) can go on and still close
// within max_tokens, so a call, once opened, always parses.
void TokenStream::mask_lazy_opening(std::span<float> row) const {
  const size_t from = outside_think_from();
  if (from == std::string::npos) return;  // thinking: a marker there is not a call
  const std::string& trigger = opt_.tool_calls->trigger();
  const int64_t left = opt_.max_tokens - static_cast<int64_t>(tokens_.size());
  const size_t keep = std::min(trigger.size() - 1, text_.size() - from);
  const std::string tail = text_.substr(text_.size() - keep);
  auto check = [&](int32_t id, bool special) {
    if (static_cast<size_t>(id) >= row.size()) return;
    const std::string s = tail + tokenizer_->token_bytes(id);
    const size_t at = s.find(trigger);
    if (at != std::string::npos &&
        !ToolCallConstraint::opening_fits(*opt_.tool_calls, std::string_view(s).substr(at), special, left))
      row[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  };
  for (int32_t id : trie_->closing_angle) check(id, false);
  if (trigger_token_) check(*trigger_token_, true);
}

TokenStream::TokenStream(TokenStream&&) noexcept = default;
TokenStream::~TokenStream() = default;

std::optional<int32_t> TokenStream::push(std::span<const float> logits) {
  if (finished()) throw Error("generation: push() after the generation ended");
  std::span<const float> row = logits;
  // A spent thinking budget: the end-of-thinking marker's tokens, one per step, whatever the model
  // would rather write.
  const bool in_think = opt_.thinking_budget >= 0 && outside_think_from() == std::string::npos;
  if (in_think && !budget_spent_ && thinking_tokens_ >= opt_.thinking_budget) {
    budget_spent_ = true;
    forcing_.assign(opt_.think_end.rbegin(), opt_.think_end.rend());
  }
  const bool forced = !forcing_.empty();
  if (forced) {
    masked_.assign(logits.size(), -std::numeric_limits<float>::infinity());
    masked_[static_cast<size_t>(forcing_.back())] = 0;
    forcing_.pop_back();
  }
  if (forced) {
  } else if (opt_.sampling.has_penalties()) {
    penalized_.assign(logits.begin(), logits.end());
    apply_penalties(penalized_, context_, opt_.prompt_tail.size(), opt_.sampling);
    row = penalized_;
  }
  if (forced) {
    row = masked_;
  } else if (json_) {
    masked_.assign(row.begin(), row.end());
    json_->mask(masked_, opt_.max_tokens - static_cast<int64_t>(tokens_.size()));
    row = masked_;
  } else if (schema_) {
    masked_.assign(row.begin(), row.end());
    schema_->mask(masked_, opt_.max_tokens - static_cast<int64_t>(tokens_.size()));
    row = masked_;
  } else if (tools_) {
    masked_.assign(row.begin(), row.end());
    tools_->mask(masked_, opt_.max_tokens - static_cast<int64_t>(tokens_.size()));
    row = masked_;
  } else if (lazy_) {
    masked_.assign(row.begin(), row.end());
    mask_lazy_opening(masked_);
    row = masked_;
  }
  const int32_t token = sampler_.sample(row);
  const bool is_stop = std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
  // A special token the call grammar took is a marker of the call: its text belongs to the reply.
  bool call_marker = false;
  if (tools_ && !(is_stop && !opt_.ignore_eos && tools_->accepting())) {
    if (!tools_->advance(token))
      throw Error("generation: tool call output: sampled token " + std::to_string(token) + " that the mask excluded");
    call_marker = true;
  }
  // A lazy grammar's trigger written as a special token: the call's marker, kept in the text.
  const bool trigger_special = lazy_ && !tools_ && trigger_token_ && token == *trigger_token_;
  if (trigger_special || forced) call_marker = true;  // (a forced marker's text is kept too)
  if (in_think && !forced) ++thinking_tokens_;
  if (json_ && !json_->advance(token))  // the mask always leaves a way to close the document
    throw Error("generation: JSON output: sampled token " + std::to_string(token) + " that the mask excluded");
  if (schema_ && !schema_->advance(token))
    throw Error("generation: JSON schema output: sampled token " + std::to_string(token) + " that the mask excluded");
  if (!opt_.ignore_eos && is_stop) {
    reason_ = FinishReason::kStopToken;
    stop_token_ = token;
    return std::nullopt;
  }
  tokens_.push_back(token);
  if (opt_.sampling.has_penalties()) context_.push_back(token);
  if (opt_.top_logprobs >= 0) logprobs_.push_back(token_logprob(logits, token, opt_.top_logprobs));
  if (tokenizer_ && (!tokenizer_->is_special(token) || call_marker)) {
    const size_t before = text_.size();
    text_ += tokenizer_->token_bytes(token);
    // A stop string may end in this token: search from where it could have begun.
    const size_t from = before > longest_stop_ ? before - longest_stop_ : 0;
    size_t cut = std::string::npos;
    for (const std::string& stop : opt_.stop_strings) {
      const size_t at = text_.find(stop, from);
      if (at != std::string::npos && at < cut) {
        cut = at;
        stop_string_ = stop;
      }
    }
    if (cut != std::string::npos) {
      text_.resize(cut);
      reason_ = FinishReason::kStopString;
      return std::nullopt;
    }
    if (lazy_ && !tools_) {
      // The trigger, outside a think block, completed in this token: the call's grammar takes
      // over from it (with what followed it in the token, which the mask checked it can take).
      const std::string& trigger = opt_.tool_calls->trigger();
      const size_t outside = outside_think_from();
      if (outside != std::string::npos) {
        const size_t from = std::max(outside, before >= trigger.size() - 1 ? before - (trigger.size() - 1) : 0);
        const size_t at = text_.find(trigger, from);
        if (at != std::string::npos) {
          tools_ = std::move(lazy_tools_);
          // Only a marker cut in a way the mask did not foresee (after a </think> in the same
          // token) fails here: the reply then goes on unconstrained.
          if (!tools_->advance_bytes(std::string_view(text_).substr(at), trigger_special)) {
            tools_.reset();
            lazy_ = false;
          }
        }
      }
    }
  }
  if ((json_ && json_->done()) || (schema_ && schema_->done())) {  // the object closed: nothing may follow it
    reason_ = FinishReason::kStopToken;
    return std::nullopt;
  }
  // The call closed and nothing may follow, or only a stop token could end it here and none
  // may come (ignore_eos) or fit: the reply ends as a finished call.
  if (tools_ && (tools_->done() || (tools_->accepting() && (!tools_->may_stop() ||
                                                            static_cast<int64_t>(tokens_.size()) >= opt_.max_tokens)))) {
    reason_ = FinishReason::kStopToken;
    return std::nullopt;
  }
  if (static_cast<int64_t>(tokens_.size()) >= opt_.max_tokens) {
    reason_ = FinishReason::kLength;
    return std::nullopt;
  }
  return token;
}

size_t TokenStream::settled_text_bytes(size_t from) const {
  if (finished()) return text_.size();
  // Hold back what could still be the start of a stop string, and half characters.
  const size_t hold = longest_stop_ > 0 ? longest_stop_ - 1 : 0;
  const size_t end = text_.size() > hold ? text_.size() - hold : 0;
  return end <= from ? from : whole_characters_end(text_, from, end);
}

std::vector<int32_t> family_stop_ids(const ModelConfig& config, const Tokenizer* tokenizer) {
  std::vector<int32_t> ids = config.eos_token_ids;
  const ModelFamily* family = find_model_family(config.model_type);
  if (tokenizer && family)
    for (const std::string& s : family->stop_tokens)
      if (auto id = tokenizer->token_to_id(s))
        if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  return ids;
}

Generator::Generator(const HybridModel& model, const Tokenizer* tokenizer)
    : model_(model), tokenizer_(tokenizer), stop_ids_(family_stop_ids(model.config(), tokenizer)) {}

Tensor Generator::prefill(HybridState& state, std::span<const int32_t> prompt, int64_t end, int64_t chunk,
                          const ForwardOptions& fo, std::span<const int64_t> checkpoints,
                          const std::function<void(const HybridState&)>& on_checkpoint) const {
  if (end > static_cast<int64_t>(prompt.size()) || end <= state.position)
    throw Error("generation: prefill to " + std::to_string(end) + " from position " + std::to_string(state.position) +
                " of a " + std::to_string(prompt.size()) + "-token prompt");
  Tensor logits;
  while (state.position < end) {
    const int64_t pos = state.position;
    int64_t stop = chunk > 0 ? std::min(end, pos + chunk) : end;
    // Chunks end at the checkpoints, where the state is the snapshot: one copy, no extra pass.
    auto next_checkpoint = std::upper_bound(checkpoints.begin(), checkpoints.end(), pos);
    if (next_checkpoint != checkpoints.end()) stop = std::min(stop, *next_checkpoint);
    logits = model_.forward(state, prompt.subspan(static_cast<size_t>(pos), static_cast<size_t>(stop - pos)), fo);
    if (on_checkpoint && std::binary_search(checkpoints.begin(), checkpoints.end(), stop)) on_checkpoint(state);
  }
  return logits;
}

Generator::Result Generator::generate(HybridState& state, std::span<const int32_t> prompt, const GenerationOptions& opt,
                                      const ForwardOptions& fo, int64_t prefill_chunk,
                                      const std::function<void(int32_t)>& on_token) const {
  if (prompt.empty()) throw Error("generation: the prompt is empty, expected at least one token");
  if (state.position >= static_cast<int64_t>(prompt.size()))
    throw Error("generation: the state is at position " + std::to_string(state.position) + ", past the " +
                std::to_string(prompt.size()) + "-token prompt (the last prompt token must run for its logits)");
  ForwardOptions one = fo;
  one.all_logits = false;
  Result r;
  const auto t0 = Clock::now();
  Tensor logits = prefill(state, prompt, static_cast<int64_t>(prompt.size()), prefill_chunk, one);
  r.prefill_seconds = seconds_since(t0);
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  Result d = decode(state, {logits.ptr<float>() + (logits.shape()[0] - 1) * static_cast<int64_t>(V), V}, opt, fo, on_token);
  d.prefill_seconds = r.prefill_seconds;
  d.first_token_seconds += r.prefill_seconds;
  r = std::move(d);
  return r;
}

Generator::Result Generator::decode(HybridState& state, std::span<const float> logits, const GenerationOptions& opt,
                                    const ForwardOptions& fo, const std::function<void(int32_t)>& on_token) const {
  ForwardOptions one = fo;
  one.all_logits = false;
  Result r;
  TokenStream stream = this->stream(opt);
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  if (logits.size() != V)
    throw Error("generation: a logits row of " + std::to_string(logits.size()) + " values, expected the vocabulary's " +
                std::to_string(V));
  const auto t0 = Clock::now();
  size_t shown = 0;
  Tensor next_logits;
  while (!stream.finished()) {
    const std::optional<int32_t> next = stream.push(logits);
    if (r.first_token_seconds == 0) r.first_token_seconds = seconds_since(t0);
    for (; shown < stream.tokens().size(); ++shown)
      if (on_token) on_token(stream.tokens()[shown]);
    if (!next) break;
    const int32_t ids[1] = {*next};
    next_logits = model_.forward(state, ids, one);
    logits = {next_logits.ptr<float>(), V};
  }
  r.decode_seconds = seconds_since(t0);
  r.tokens = stream.tokens();
  r.reason = stream.reason();
  r.stop_token = stream.stop_token();
  r.stop_string = stream.stop_string();
  r.text = stream.text();
  return r;
}

}  // namespace hanpu
