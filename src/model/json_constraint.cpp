// JSON pushdown automaton and token mask (json_constraint.hpp).
#include "json_constraint.hpp"

#include <cmath>
#include <map>
#include <mutex>

#include "hanpu/tensor.hpp"
#include "hanpu/tokenizer.hpp"
#include "json_constraint_schema.hpp"

namespace hanpu {

namespace {

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

}  // namespace

bool utf8_lead(uint8_t b, uint8_t& left, uint8_t& lo, uint8_t& hi) {
  // RFC 3629, section 4: E0, ED, F0 and F4 narrow their first continuation byte (no overlong
  // forms, no surrogates, nothing above U+10FFFF); C0, C1 and F5..FF never occur.
  if (b >= 0xC2 && b <= 0xDF) left = 1;
  else if (b == 0xE0) left = 2, lo = 0xA0;
  else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) left = 2;
  else if (b == 0xED) left = 2, hi = 0x9F;
  else if (b == 0xF0) left = 3, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) left = 3;
  else if (b == 0xF4) left = 3, hi = 0x8F;
  else return false;
  return true;
}

bool JsonState::after_value() {
  if (stack_.empty()) {
    mode_ = Mode::kDone;
    return true;
  }
  mode_ = stack_.back() == 'o' ? Mode::kObjectNext : Mode::kArrayNext;
  return true;
}

bool JsonState::start_value(uint8_t b) {
  switch (b) {
    case '{': stack_.push_back('o'); mode_ = Mode::kObjectKeyOrEnd; return true;
    case '[': stack_.push_back('a'); mode_ = Mode::kArrayValueOrEnd; return true;
    case '"': string_is_key_ = false; mode_ = Mode::kString; return true;
    case '-': mode_ = Mode::kNumberSign; return true;
    case '0': mode_ = Mode::kNumberZero; return true;
    case 't': literal_ = "rue"; mode_ = Mode::kLiteral; return true;
    case 'f': literal_ = "alse"; mode_ = Mode::kLiteral; return true;
    case 'n': literal_ = "ull"; mode_ = Mode::kLiteral; return true;
    default:
      if (b >= '1' && b <= '9') {
        mode_ = Mode::kNumberInt;
        return true;
      }
      return false;
  }
}

// A number may end at this byte (the byte then belongs to what follows the number).
bool JsonState::end_number(uint8_t b) {
  after_value();
  if (mode_ == Mode::kDone) return false;  // a top-level number: not an object (never reached)
  return feed(b);
}

bool JsonState::feed(uint8_t b) {
  switch (mode_) {
    case Mode::kStart:  // json_object: the document is an object
      if (b != '{') return false;
      stack_.push_back('o');
      mode_ = Mode::kObjectKeyOrEnd;
      return true;
    case Mode::kValue: return start_value(b);
    case Mode::kObjectKeyOrEnd:
      if (b == '}') {
        stack_.pop_back();
        return after_value();
      }
      [[fallthrough]];
    case Mode::kObjectKey:
      if (b != '"') return false;
      string_is_key_ = true;
      mode_ = Mode::kString;
      return true;
    case Mode::kColon:
      if (b != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kObjectNext:
      if (b == ',') {
        mode_ = Mode::kObjectKey;
        return true;
      }
      if (b != '}') return false;
      stack_.pop_back();
      return after_value();
    case Mode::kArrayValueOrEnd:
      if (b == ']') {
        stack_.pop_back();
        return after_value();
      }
      return start_value(b);
    case Mode::kArrayNext:
      if (b == ',') {
        mode_ = Mode::kValue;
        return true;
      }
      if (b != ']') return false;
      stack_.pop_back();
      return after_value();
    case Mode::kString:
      if (utf8_left_ > 0) {
        if (b < utf8_lo_ || b > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xBF;
        return true;
      }
      if (b == '"') {
        if (string_is_key_) {
          mode_ = Mode::kColon;
          return true;
        }
        return after_value();
      }
      if (b == '\\') {
        mode_ = Mode::kStringEscape;
        return true;
      }
      if (b < 0x20) return false;  // control characters must be escaped
      if (b < 0x80) return true;
      return utf8_lead(b, utf8_left_, utf8_lo_, utf8_hi_);
    case Mode::kStringEscape:
      if (b == 'u') {
        hex_left_ = 4;
        mode_ = Mode::kStringHex;
        return true;
      }
      if (b != '"' && b != '\\' && b != '/' && b != 'b' && b != 'f' && b != 'n' && b != 'r' && b != 't') return false;
      mode_ = Mode::kString;
      return true;
    case Mode::kStringHex:
      if (!is_hex(b)) return false;
      if (--hex_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kNumberSign:
      if (b == '0') mode_ = Mode::kNumberZero;
      else if (b >= '1' && b <= '9') mode_ = Mode::kNumberInt;
      else return false;
      return true;
    case Mode::kNumberZero:
    case Mode::kNumberInt:
      if (mode_ == Mode::kNumberInt && is_digit(b)) return true;
      if (b == '.') {
        mode_ = Mode::kNumberDot;
        return true;
      }
      if (b == 'e' || b == 'E') {
        mode_ = Mode::kNumberExp;
        return true;
      }
      return end_number(b);
    case Mode::kNumberDot:
      if (!is_digit(b)) return false;
      mode_ = Mode::kNumberFrac;
      return true;
    case Mode::kNumberFrac:
      if (is_digit(b)) return true;
      if (b == 'e' || b == 'E') {
        mode_ = Mode::kNumberExp;
        return true;
      }
      return end_number(b);
    case Mode::kNumberExp:
      if (b == '+' || b == '-') {
        mode_ = Mode::kNumberExpSign;
        return true;
      }
      [[fallthrough]];
    case Mode::kNumberExpSign:
      if (!is_digit(b)) return false;
      mode_ = Mode::kNumberExpInt;
      exponent_digits_ = 1;
      return true;
    case Mode::kNumberExpInt:
      // At most two exponent digits: RFC 8259 (section 6) lets a parser limit the range, and
      // common ones reject what overflows a double (nlohmann/json: "number overflow").
      if (is_digit(b)) return ++exponent_digits_ <= 2;
      return end_number(b);
    case Mode::kLiteral:
      if (b != static_cast<uint8_t>(*literal_)) return false;
      if (*++literal_ == '\0') return after_value();
      return true;
    case Mode::kDone: return false;
  }
  return false;
}

int64_t JsonState::closing_cost() const {
  int64_t cost = static_cast<int64_t>(stack_.size());  // one closer per open container
  switch (mode_) {
    case Mode::kStart: return 2;  // {}
    case Mode::kValue: cost += 1; break;  // 0
    case Mode::kObjectKey: cost += 4; break;  // "":0
    case Mode::kColon: cost += 2; break;  // :0
    case Mode::kString:
      cost += 1 + utf8_left_ + (string_is_key_ ? 2 : 0);  // the rest of a character, ", and :0 after a key
      break;
    case Mode::kStringEscape: cost += 2 + (string_is_key_ ? 2 : 0); break;
    case Mode::kStringHex: cost += hex_left_ + 1 + (string_is_key_ ? 2 : 0); break;
    case Mode::kNumberSign:
    case Mode::kNumberDot:
    case Mode::kNumberExp:
    case Mode::kNumberExpSign: cost += 1; break;  // a digit
    case Mode::kLiteral: cost += static_cast<int64_t>(std::char_traits<char>::length(literal_)); break;
    case Mode::kDone: return 0;
    default: break;  // the container's closers are already counted
  }
  return cost;
}

namespace {

// Token bytes per tokenizer, computed once: the mask reads them at every step.
std::shared_ptr<const std::vector<std::string>> vocabulary_bytes(const Tokenizer& tok) {
  static std::mutex mu;
  static std::map<const Tokenizer*, std::shared_ptr<const std::vector<std::string>>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[&tok];
  if (!slot) {
    auto v = std::make_shared<std::vector<std::string>>(static_cast<size_t>(tok.vocab_size()));
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
      if (!tok.is_special(id)) (*v)[static_cast<size_t>(id)] = tok.token_bytes(id);
    slot = std::move(v);
  }
  return slot;
}

}  // namespace

JsonConstraint::JsonConstraint(const Tokenizer& tokenizer)
    : token_bytes_(vocabulary_bytes(tokenizer)), trie_(vocabulary_trie(tokenizer)) {
  // The budget counts one token per closing byte: each must exist as a token of its own.
  for (char c : std::string("{}[]\":,0-.eE+rueal sn")) {
    if (c == ' ') continue;
    bool found = false;
    for (const std::string& t : *token_bytes_)
      if (t.size() == 1 && t[0] == c) {
        found = true;
        break;
      }
    if (!found)
      throw Error(std::string("JSON output: the tokenizer has no single-byte token for '") + c +
                  "', which closing a document within max_tokens relies on");
  }
  // ... and the rest of a UTF-8 character cut by the budget: every continuation byte.
  std::vector<bool> single(256, false);
  for (const std::string& t : *token_bytes_)
    if (t.size() == 1) single[static_cast<uint8_t>(t[0])] = true;
  for (int b = 0x80; b <= 0xBF; ++b)
    if (!single[static_cast<size_t>(b)])
      throw Error("JSON output: the tokenizer has no single-byte token for byte " + std::to_string(b) +
                  " (a UTF-8 continuation byte), which closing a document within max_tokens relies on");
}

void JsonConstraint::mask(std::span<float> logits, int64_t tokens_left) const {
  // Over the vocabulary's byte trie (json_constraint_schema.hpp): shared prefixes are fed once,
  // and inside a string the plain content tokens are decided at once.
  mask_with_trie(*trie_, state_, state_.in_plain_string(), logits, tokens_left);
}

bool JsonConstraint::advance(int32_t token) {
  const std::vector<std::string>& bytes = *token_bytes_;
  if (token < 0 || static_cast<size_t>(token) >= bytes.size() || bytes[static_cast<size_t>(token)].empty()) return false;
  JsonState s = state_;
  for (char c : bytes[static_cast<size_t>(token)])
    if (!s.feed(static_cast<uint8_t>(c))) return false;
  state_ = std::move(s);
  return true;
}

}  // namespace hanpu
