// UTF-8 runs, NFC, Python strip and the PCRE2 split regex (see tokenizer_text.hpp).
#include "model/tokenizer_text.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "hanpu/tensor.hpp"

namespace hanpu::tok {

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const size_t left = text.size() - pos;
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return 1;
  const auto cont = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i < left && byte(pos + i) >= lo && byte(pos + i) <= hi;
  };
  // Ranges of the second byte from the Unicode standard's table 3-7 (well-formed sequences).
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 1 + 1 : 0;
  if (b0 == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (b0 == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;  // no surrogates
  if (b0 == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (b0 >= 0xF1 && b0 <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b0 == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;  // <= U+10FFFF
  return 0;
}

std::vector<std::pair<std::string_view, bool>> utf8_runs(std::string_view text) {
  std::vector<std::pair<std::string_view, bool>> runs;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t begin = pos;
    const bool valid = utf8_sequence_length(text, pos) != 0;
    while (pos < text.size()) {
      const size_t n = utf8_sequence_length(text, pos);
      if ((n != 0) != valid) break;
      pos += valid ? n : 1;
    }
    runs.emplace_back(text.substr(begin, pos - begin), valid);
  }
  return runs;
}

std::string nfc(std::string_view valid_utf8) {
  bool ascii = true;
  for (char c : valid_utf8) ascii &= static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(valid_utf8);  // ASCII is its own NFC
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid_utf8.data()),
                   static_cast<utf8proc_ssize_t>(valid_utf8.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw Error(std::string("tokenizer: NFC normalization failed: ") + utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

namespace {

// Python's str.isspace(): bidirectional class WS, B or S, or general category Zs.
bool python_isspace(int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20)) return true;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

int32_t decode_at(std::string_view text, size_t pos, size_t& len) {
  len = utf8_sequence_length(text, pos);
  if (len == 0) {
    len = 1;
    return -1;  // an invalid byte is not space
  }
  utf8proc_int32_t cp = -1;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos), static_cast<utf8proc_ssize_t>(len), &cp);
  return cp;
}

}  // namespace

std::string python_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t len = 0;
    if (!python_isspace(decode_at(text, begin, len))) break;
    begin += len;
  }
  size_t end = begin, pos = begin;
  while (pos < text.size()) {  // end = just past the last non-space character
    size_t len = 0;
    const bool space = python_isspace(decode_at(text, pos, len));
    pos += len;
    if (!space) end = pos;
  }
  return std::string(text.substr(begin, end - begin));
}

// Written out as in tokenization_kimi.py (see tokenizer_text.hpp).
const char* const kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

std::vector<std::string_view> kimi_chunks(std::string_view text, size_t max_chunk_chars, size_t max_run_chars) {
  std::vector<std::string_view> out;
  size_t chunk_begin = 0;
  while (chunk_begin < text.size()) {
    // One chunk: up to max_chunk_chars characters.
    size_t chunk_end = chunk_begin, chars = 0;
    while (chunk_end < text.size() && chars < max_chunk_chars) {
      size_t len = 0;
      decode_at(text, chunk_end, len);
      chunk_end += len;
      ++chars;
    }
    // Within it, a new substring starts where a run of same-kind characters would exceed
    // max_run_chars (the run then counts from 1 again), as in tokenization_kimi.py.
    size_t slice_begin = chunk_begin, pos = chunk_begin, run = 0;
    bool run_is_space = false;
    bool first = true;
    while (pos < chunk_end) {
      size_t len = 0;
      const bool space = python_isspace(decode_at(text, pos, len));
      if (first) {
        run_is_space = space;
        first = false;
      }
      if (space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > max_run_chars) {
        out.push_back(text.substr(slice_begin, pos - slice_begin));
        slice_begin = pos;
        run = 1;
      }
      pos += len;
    }
    out.push_back(text.substr(slice_begin, chunk_end - slice_begin));
    chunk_begin = chunk_end;
  }
  return out;
}

namespace {

// End (index of the closing ']') of the character class opening at pattern[open], nested
// classes and escapes included; npos if it does not close.
size_t class_end(const std::string& pattern, size_t open) {
  size_t i = open + 1;
  if (i < pattern.size() && pattern[i] == '^') ++i;
  if (i < pattern.size() && pattern[i] == ']') ++i;  // a literal ']' first
  for (; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      ++i;
    } else if (pattern[i] == '[') {
      const size_t inner = class_end(pattern, i);
      if (inner == std::string::npos) return inner;
      i = inner;
    } else if (pattern[i] == ']') {
      return i;
    }
  }
  return std::string::npos;
}

}  // namespace

std::string translate_tiktoken_pattern(const std::string& pattern, const std::string& what) {
  auto refuse = [&](const std::string& why) -> Error {
    return Error(what + ": " + why + " (pattern \"" + pattern + "\")");
  };
  std::string out;
  out.reserve(pattern.size() + 64);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if ((e == 'p' || e == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
        const size_t close = pattern.find('}', i + 3);
        if (close == std::string::npos) throw refuse("an unclosed \\p{...}");
        const std::string name = pattern.substr(i + 3, close - i - 3);
        // General categories are one or two letters (L, Lu, N, M, ...); Han is the one script
        // the known patterns name.
        if (name == "Han") out += std::string("\\") + e + "{sc:Han}";
        else if (name.size() <= 2) out += pattern.substr(i, close - i + 1);
        else throw refuse("\\p{" + name + "} is not supported (hanpu translates general categories and Han)");
        i = close;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (c == '[') {
      const size_t end = class_end(pattern, i);
      if (end == std::string::npos) throw refuse("an unclosed character class");
      const std::string body = pattern.substr(i + 1, end - i - 1);
      const size_t amp = body.find("&&");
      if (amp == std::string::npos) {
        // No intersection: copied, with its \p{...} translated.
        out += '[';
        out += translate_tiktoken_pattern(body, what);
        out += ']';
        i = end;
        continue;
      }
      const std::string left = body.substr(0, amp), right = body.substr(amp + 2);
      const bool simple = !left.empty() && left[0] != '^' && left.find('[') == std::string::npos &&
                          right.size() > 3 && right.rfind("[^", 0) == 0 && right.back() == ']' &&
                          right.find('[', 1) == std::string::npos && right.find(']') == right.size() - 1 &&
                          right.find("&&") == std::string::npos;
      if (!simple) throw refuse("the class intersection \"[" + body + "]\" is not of the form [X&&[^Y]]");
      const std::string excluded = right.substr(2, right.size() - 3);
      out += "(?:(?![";
      out += translate_tiktoken_pattern(excluded, what);
      out += "])[";
      out += translate_tiktoken_pattern(left, what);
      out += "])";
      i = end;
      continue;
    }
    out += c;
  }
  return out;
}

// Unicode's White_Space property (stable since Unicode 6.3), which is Oniguruma's \s.
constexpr const char* kWhiteSpace = "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

std::string translate_oniguruma(const std::string& pattern, const std::string& what) {
  std::string out;
  out.reserve(pattern.size() + 16);
  int class_depth = 0;  // inside [...]; POSIX [:name:] and nested classes keep the count right
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += class_depth ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (class_depth)
          throw Error(what + ": \\S inside a character class is not supported (got pattern \"" + pattern + "\")");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && class_depth) --class_depth;
    out += c;
  }
  return out;
}

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& what) : impl_(std::make_unique<Impl>()) {
  const std::string source = literal ? pattern : translate_oniguruma(pattern, what);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL admits only a few other options; UCP means nothing for a literal.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error_code,
                              &error_offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    throw Error(what + ": the pattern \"" + pattern + "\" does not compile (PCRE2: " +
                reinterpret_cast<const char*>(message) + " at offset " + std::to_string(error_offset) + ")");
  }
  // JIT makes matching several times faster; without JIT support pcre2_match interprets.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;
SplitRegex::~SplitRegex() = default;

void SplitRegex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  matches.clear();
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    // The text was validated as UTF-8 by the caller, so PCRE2 need not check it again.
    int rc = pcre2_match(impl_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, data, nullptr);
    // The JIT's stack is small (32 KiB); a pattern that backtracks deeply on a huge piece can
    // exhaust it. The interpreter keeps its backtracking on the heap, so retry with it.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(impl_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(data);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw Error(std::string("tokenizer: split regex failed while matching: ") + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {  // empty match: step over one character, as the regex engines' search loops do
      const size_t n = begin < text.size() ? utf8_sequence_length(text, begin) : 1;
      offset = begin + (n ? n : 1);
    }
  }
  pcre2_match_data_free(data);
}

}  // namespace hanpu::tok
