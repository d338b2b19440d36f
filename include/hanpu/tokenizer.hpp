// The tokenizers of hanpu's checkpoints:
//   - Qwen3.5 / Qwen3-Next: byte-level BPE read from a Hugging Face tokenizer.json (NFC
//     normalization, the Qwen split regex through PCRE2, utf8proc for Unicode), added/special
//     tokens, and the ChatML chat template for `hanpu run --chat`;
//   - Kimi Linear (and Kimi K2's format): a tiktoken BPE, tiktoken.model plus the special tokens
//     of tokenizer_config.json, split by the pattern of Moonshot's tokenization_kimi.py. No chat
//     template yet (apply_chat_template refuses).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hanpu {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  /// tokenizer.json of a checkpoint; errors name the file and what is wrong with it.
  static Tokenizer from_file(const std::string& tokenizer_json);
  /// A checkpoint directory (or a GGUF file: from_gguf): tokenizer.json and tokenizer_config.json (optional: its added tokens
  /// and eos token); or, when it has no tokenizer.json, tiktoken.model and tokenizer_config.json
  /// (from_tiktoken).
  static Tokenizer from_dir(const std::string& dir);
  /// A tiktoken BPE as Kimi Linear ships it (tokenization_kimi.py): tiktoken.model's n ranks are
  /// the ids 0..n-1; ids n..n+257 are special tokens, named by tokenizer_config.json's
  /// added_tokens_decoder or else "<|reserved_token_{id}|>"; its eos_token, if any, is
  /// eos_token_id(). Errors name the file and line or field.
  /// A GGUF file's tokenizer.ggml.* keys (byte-level BPE: tokens, merges, token types, eos id;
  /// or, for tokenizer.ggml.pre "kimi-k2", the tiktoken ranks and special tokens, tokenized as
  /// from_tiktoken does); errors name the file and key.
  static Tokenizer from_gguf(const std::string& path);
  static Tokenizer from_tiktoken(const std::string& tiktoken_model, const std::string& tokenizer_config);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Text to ids. Special/added tokens written literally in the text (e.g. "<|im_start|>") are
  /// recognised when parse_special is true, else encoded as ordinary text (as in `tokenizers`
  /// with encode_special_tokens: only tokens marked "special" become text; other added tokens,
  /// such as Qwen's <think>, are still recognised). Any bytes are accepted: a run of bytes that
  /// is not valid UTF-8 is one pre-token of its own, its bytes BPE-encoded as they are, so
  /// decode(encode(bytes)) gives them back.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  /// Ids to text (invalid UTF-8 from partial byte sequences is kept as bytes).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  /// The raw bytes one token stands for (may be part of a UTF-8 sequence), for streaming output.
  std::string token_bytes(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  int32_t vocab_size() const;  // largest id + 1, added tokens included
  /// The eos token of tokenizer_config.json (from_dir), if it names one.
  std::optional<int32_t> eos_token_id() const;
  /// True for added tokens marked "special" (<|im_end|>, ...), which decode skips on request.
  bool is_special(int32_t id) const;

  /// Qwen's tokenizers only (a tiktoken tokenizer throws: Kimi's template is not implemented).
  /// ChatML as Qwen's template renders it without tools:
  /// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n" if
  /// add_generation_prompt (Qwen3.5 adds "<think>\n\n</think>\n\n" after it when enable_thinking
  /// is false).
  /// Details of Qwen3.5's template kept too: contents are trimmed (Python str.strip); a system
  /// message may only come first; there must be a user message; assistant turns after the last
  /// user message carry "<think>\n{reasoning}\n</think>\n\n" (reasoning taken from a
  /// "...</think>" prefix of the content); "tool" messages become <tool_response> blocks in a
  /// user turn; with enable_thinking the generation prompt ends in "<think>\n".
  std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                                  bool enable_thinking = false) const;

 private:
  Tokenizer();
  /// tokenizer.json text (empty: read the file `source`), `source` naming it in errors.
  static Tokenizer from_json_text(const std::string& text, const std::string& source);
  /// A tiktoken tokenizer of these ranks (bytes by rank, checked as tok::check_tiktoken_ranks
  /// says) with Kimi's pattern and chunking, no special tokens yet.
  static Tokenizer from_tiktoken_ranks(std::vector<std::string> ranks, const std::string& source);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hanpu
