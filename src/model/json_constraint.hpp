// Constrained sampling for JSON output (OpenAI's response_format {"type": "json_object"}): a
// byte-level pushdown automaton of compact JSON (no whitespace between tokens) whose top level is
// an object (exponents of at most two digits, so every number fits a double), run over the
// vocabulary's byte trie (json_constraint_schema.hpp) to mask the tokens that cannot continue a
// valid document, and a length budget so the document is always closed within max_tokens
// (a token is allowed only if the shortest completion after it still fits). Written from the JSON
// grammar of RFC 8259; strings must be valid UTF-8 (RFC 3629's byte ranges).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace hanpu {

class Tokenizer;
struct VocabularyTrie;  // json_constraint_schema.hpp

/// A UTF-8 lead byte (>= 0x80): sets `left` to the continuation bytes it needs and narrows
/// [lo, hi] to the first one's range; false for a byte that cannot start a character.
bool utf8_lead(uint8_t byte, uint8_t& left, uint8_t& lo, uint8_t& hi);

/// Where a JSON document is after some bytes. Small and copyable: the mask tries every token
/// from a copy of the current state.
class JsonState {
 public:
  /// Feeds one byte; false (state unchanged afterwards is not guaranteed) if it cannot continue
  /// a valid document.
  bool feed(uint8_t byte);
  /// The document is complete (the top-level object closed).
  bool done() const { return mode_ == Mode::kDone; }
  /// Bytes the shortest completion needs (each of them one of {"}]0:, or a literal's letters).
  int64_t closing_cost() const;
  /// A state that reads one JSON value of any kind instead of an object (json_constraint_schema.hpp).
  static JsonState any_value() {
    JsonState s;
    s.mode_ = Mode::kValue;
    return s;
  }
  /// Inside a string, between characters: content bytes leave it here, whatever encloses it.
  bool in_plain_string() const { return mode_ == Mode::kString && utf8_left_ == 0; }
  /// A top-level number that may end here: the next byte belongs to what follows it.
  bool number_may_end() const {
    return stack_.empty() && (mode_ == Mode::kNumberZero || mode_ == Mode::kNumberInt ||
                              mode_ == Mode::kNumberFrac || mode_ == Mode::kNumberExpInt);
  }

 private:
  enum class Mode : uint8_t {
    kStart, kValue, kObjectKeyOrEnd, kObjectKey, kColon, kObjectNext, kArrayValueOrEnd, kArrayNext,
    kString, kStringEscape, kStringHex, kNumberSign, kNumberZero, kNumberInt, kNumberDot, kNumberFrac,
    kNumberExp, kNumberExpSign, kNumberExpInt, kLiteral, kDone
  };
  bool after_value();  // a value ended: continue in the enclosing container
  bool start_value(uint8_t byte);
  bool end_number(uint8_t byte);

  Mode mode_ = Mode::kStart;
  std::string stack_;           // 'o' object, 'a' array, innermost last
  bool string_is_key_ = false;
  uint8_t hex_left_ = 0;        // \uXXXX digits still to come
  uint8_t utf8_left_ = 0;       // continuation bytes still to come
  uint8_t exponent_digits_ = 0;
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the next continuation byte's range
  const char* literal_ = nullptr;  // kLiteral: the rest of true/false/null
};

/// The mask for one generation: the vocabulary's token bytes and byte trie (preprocessed once per
/// tokenizer and shared), the document's state, and the budget.
class JsonConstraint {
 public:
  /// Throws hanpu::Error when the vocabulary lacks a single-byte token the budget relies on.
  explicit JsonConstraint(const Tokenizer& tokenizer);
  /// Sets logits of tokens that cannot continue the document within `tokens_left` tokens
  /// (this one included) to -infinity. Special tokens are never allowed (a finished document
  /// ends the generation by itself).
  void mask(std::span<float> logits, int64_t tokens_left) const;
  /// Advances over the chosen token; false if it was not allowed.
  bool advance(int32_t token);
  bool done() const { return state_.done(); }

 private:
  std::shared_ptr<const std::vector<std::string>> token_bytes_;  // empty: special or unusable
  std::shared_ptr<const VocabularyTrie> trie_;  // the same tokens as a byte trie (the mask walks it)
  JsonState state_;
};

}  // namespace hanpu
