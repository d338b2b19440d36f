// One generation path for `hanpu run`, the Python package's Model.generate and `hanpu serve`'s
// scheduler (issue 35): the same stop tokens, stop strings, sampling and chunked prefill, so the
// same prompt and settings give the same tokens from each.
//   - TokenStream: one sequence's decisions after each forward pass (sample, stop on a stop token,
//     a stop string or the length; the output text and how much of it is safe to show). The
//     scheduler drives it from its batched decode steps.
//   - Generator: the whole loop for one sequence (chunked prefill with snapshot hooks, then
//     decode), used by the CLI and Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"

namespace hanpu {

class JsonSchema;       // src/model/json_constraint_schema.hpp
struct VocabularyTrie;  // src/model/json_constraint_schema.hpp
class ToolCallGrammar;  // src/model/json_constraint_tools.hpp

struct GenerationOptions {
  SamplingOptions sampling;
  int64_t max_tokens = 128;
  std::vector<std::string> stop_strings;  // end the output before them (not included)
  bool ignore_eos = false;                // generate max_tokens whatever comes
  /// Log probabilities of the chosen tokens with this many alternatives each; -1: none.
  int top_logprobs = -1;
  /// Constrain the output to one JSON object, closed within max_tokens (OpenAI's
  /// response_format json_object): tokens that cannot continue it are masked before sampling,
  /// and the generation ends when the object closes. Needs a tokenizer and max_tokens >= 2.
  bool json_object = false;
  /// Constrain the output to a document that follows this compiled JSON Schema (OpenAI's
  /// response_format json_schema; src/model/json_constraint_schema.hpp): masked the same way, and
  /// the generation ends when the document closes. Needs a tokenizer and max_tokens of at least
  /// the schema's shortest document in bytes.
  std::shared_ptr<const JsonSchema> json_schema;
  /// Constrain the output to tool calls following this grammar (tool_choice "required" or a
  /// named function; src/model/json_constraint_tools.hpp): the prompt ends with the grammar's
  /// prompt_prefix(), and the generation ends when the call closes (with parallel calls: at a stop
  /// token after a call, or when no further call fits). Needs a tokenizer and max_tokens of at
  /// least the grammar's min_bytes().
  std::shared_ptr<const ToolCallGrammar> tool_calls;
  /// The prompt ends inside a <think> block (the template opened it): a lazy tool-call grammar's
  /// trigger (tool_choice auto) counts only once the block is closed.
  bool reasoning_opened = false;
  /// The prompt's last tokens (at least sampling.repetition_window of them; all with -1): the
  /// repetition penalty's window reaches into the prompt (apply_penalties, hanpu/model.hpp).
  std::vector<int32_t> prompt_tail;
  /// Tokens of reasoning allowed (inside a <think> block: from the start with reasoning_opened, or
  /// after a <think> the model writes); when they are spent inside the block, think_end (the
  /// family's end-of-thinking marker, encoded) is forced token by token and the answer follows.
  /// -1: no limit.
  int64_t thinking_budget = -1;
  std::vector<int32_t> think_end;
};

class JsonConstraint;      // src/model/json_constraint.hpp
class SchemaConstraint;    // src/model/json_constraint_schema.hpp
class ToolCallConstraint;  // src/model/json_constraint_tools.hpp

/// One generated token's log probability (natural log of the model's distribution before
/// temperature, top-k and top-p, as OpenAI reports it) and the most likely alternatives.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first (ties: lower id first)
};

/// The ids that end a generation for a model of this config: config.json's eos ids, then the
/// stop tokens its family's registry row names (hanpu/model_family.hpp) that `tokenizer` has
/// (none without a tokenizer or for a config of no known family).
std::vector<int32_t> family_stop_ids(const ModelConfig& config, const Tokenizer* tokenizer);

/// log_softmax(logits)[token] and the `top` most likely tokens.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

enum class FinishReason { kNone, kStopToken, kStopString, kLength };

class TokenStream {
 public:
  /// `tokenizer` may be null (ids only: no text, no stop strings).
  TokenStream(const Tokenizer* tokenizer, std::vector<int32_t> stop_ids, GenerationOptions opt);
  TokenStream(TokenStream&&) noexcept;
  ~TokenStream();

  /// Samples the next token from one row of logits and records it. Returns the token to feed to
  /// the model next, or nothing when the generation ended with it (finished()).
  std::optional<int32_t> push(std::span<const float> logits);
  /// Ends it now as `length` (max_tokens 0: nothing is sampled).
  void finish_by_length() { reason_ = FinishReason::kLength; }

  bool finished() const { return reason_ != FinishReason::kNone; }
  FinishReason reason() const { return reason_; }
  const std::string& stop_string() const { return stop_string_; }     // kStopString: which one
  std::optional<int32_t> stop_token() const { return stop_token_; }  // kStopToken: which one
  /// The generated tokens (a stop token not included).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  /// Their bytes (special tokens skipped), cut before a stop string.
  const std::string& text() const { return text_; }
  /// How many bytes of text() cannot change any more: all once finished, else short of what
  /// could still be the start of a stop string and of a UTF-8 character not complete yet.
  /// `from`: a character boundary already known settled (the scan starts there).
  size_t settled_text_bytes(size_t from = 0) const;
  /// The logprobs recorded since the last call (top_logprobs >= 0).
  std::vector<TokenLogprob> take_logprobs() { return std::exchange(logprobs_, {}); }

 private:
  const Tokenizer* tokenizer_;
  std::vector<int32_t> stop_ids_;
  GenerationOptions opt_;
  Sampler sampler_;
  size_t longest_stop_ = 0;
  std::vector<int32_t> tokens_;
  std::string text_;
  std::vector<TokenLogprob> logprobs_;
  FinishReason reason_ = FinishReason::kNone;
  std::string stop_string_;
  std::optional<int32_t> stop_token_;
  std::unique_ptr<JsonConstraint> json_;  // json_object
  std::unique_ptr<SchemaConstraint> schema_;  // json_schema
  std::unique_ptr<ToolCallConstraint> tools_;  // tool_calls (a lazy grammar's: once triggered)
  std::vector<float> masked_;             // the logits row with the mask applied
  std::vector<float> penalized_;          // the logits row with the penalties applied
  std::vector<int32_t> context_;          // penalties: prompt_tail, then the generated tokens
  // A lazy tool-call grammar (tool_choice auto) not triggered yet: the tokens that could complete
  // its trigger are checked each step (closing_angle of the trie, and the marker as a special token).
  int64_t thinking_tokens_ = 0;     // generated inside a think block
  std::vector<int32_t> forcing_;    // think_end tokens still to force (reversed)
  bool budget_spent_ = false;
  bool lazy_ = false;
  std::unique_ptr<ToolCallConstraint> lazy_tools_;  // the call's mask, until the trigger
  std::shared_ptr<const VocabularyTrie> trie_;
  std::optional<int32_t> trigger_token_;
  size_t outside_think_from() const;  // where text outside a <think> block begins (npos: inside one)
  void mask_lazy_opening(std::span<float> row) const;
};

class Generator {
 public:
  /// `tokenizer` may be null.
  Generator(const HybridModel& model, const Tokenizer* tokenizer);

  /// The tokens that end a generation: family_stop_ids (the config's eos ids and the family's
  /// end-of-turn markers the tokenizer has).
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  TokenStream stream(const GenerationOptions& opt) const { return TokenStream(tokenizer_, stop_ids_, opt); }

  /// Prefills prompt[state.position, end) in chunks of at most `chunk` tokens (0: one chunk)
  /// that also end at each of `checkpoints` (sorted lengths), calling on_checkpoint(state) there.
  /// Returns the logits of the last chunk's last token.
  Tensor prefill(HybridState& state, std::span<const int32_t> prompt, int64_t end, int64_t chunk,
                 const ForwardOptions& fo, std::span<const int64_t> checkpoints = {},
                 const std::function<void(const HybridState&)>& on_checkpoint = {}) const;

  struct Result {
    std::vector<int32_t> tokens;  // generated, a stop token not included
    FinishReason reason = FinishReason::kNone;
    std::optional<int32_t> stop_token;
    std::string stop_string, text;
    double prefill_seconds = 0, first_token_seconds = 0, decode_seconds = 0;
  };
  /// One sequence from `state` (fresh or restored): prefill the prompt's tokens after
  /// state.position in `prefill_chunk` chunks, then decode until the stream ends. on_token sees
  /// each generated token as it comes (not a stop token).
  Result generate(HybridState& state, std::span<const int32_t> prompt, const GenerationOptions& opt,
                  const ForwardOptions& fo, int64_t prefill_chunk,
                  const std::function<void(int32_t)>& on_token = {}) const;

  /// Decoding only: `logits` is the row after the prompt (or after whatever `state` has seen).
  Result decode(HybridState& state, std::span<const float> logits, const GenerationOptions& opt, const ForwardOptions& fo,
                const std::function<void(int32_t)>& on_token = {}) const;

  /// The prefill chunk all entry points use by default: the server's (docs/SERVE.md) -- 256
  /// prompt tokens take 1 to 2 s on Qwen3.5-0.8B shapes on 2 cores, the longest a long prompt
  /// stalls other sequences per scheduler turn. The same chunking everywhere gives the same
  /// floating-point sums, hence the same tokens.
  static constexpr int64_t kDefaultPrefillChunk = 256;

 private:
  const HybridModel& model_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> stop_ids_;
};

}  // namespace hanpu
