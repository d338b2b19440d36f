// Text handling under the tokenizer: UTF-8 validity runs, NFC normalization (utf8proc), Python's
// str.strip (the chat template's `trim`), and the pre-tokenizer's split regex (PCRE2).
//
// Hugging Face `tokenizers` compiles split regexes with Oniguruma; hanpu uses PCRE2 with UTF and
// UCP (Unicode properties for \s, \w, \d and case folding), which reads the same syntax for the
// patterns tokenizer.json files use (\p{L}, \p{N}, \p{M}, (?i:...), (?!...), classes). The
// dialect differences that matter are handled in translate_oniguruma() and tested against
// `tokenizers` on the golden strings (tests/test_tokenizer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hanpu::tok {

/// Length (1-4) of the well-formed UTF-8 sequence starting at text[pos] (Unicode 15, table 3-7:
/// no overlongs, no surrogates, nothing above U+10FFFF), or 0 if text[pos] starts none.
size_t utf8_sequence_length(std::string_view text, size_t pos);

/// Splits text into maximal runs of well-formed UTF-8 and of bytes that belong to no well-formed
/// sequence, in order: (run, valid).
std::vector<std::pair<std::string_view, bool>> utf8_runs(std::string_view text);

/// Unicode NFC of well-formed UTF-8 (utf8proc). ASCII is returned unchanged without a call.
std::string nfc(std::string_view valid_utf8);

/// Python's str.strip(): removes leading and trailing characters for which str.isspace() is true
/// (Jinja's `trim` filter, used by Qwen's chat template).
std::string python_strip(std::string_view text);

/// What tokenization_kimi.py (Kimi Linear / Kimi K2's remote tokenizer code) does to the text
/// before tiktoken sees it: cut into chunks of at most 400,000 characters, then each chunk into
/// substrings with at most 25,000 consecutive characters that are all Python str.isspace() or
/// all not (its _split_whitespaces_or_nonwhitespaces; tiktoken's regex stalls on longer runs).
/// Characters are code points; a byte outside well-formed UTF-8 counts as one non-space
/// character. Each substring is encoded on its own, so the cuts only matter for huge inputs.
std::vector<std::string_view> kimi_chunks(std::string_view text, size_t max_chunk_chars = 400000,
                                          size_t max_run_chars = 25000);

/// The pre-tokenizer pattern of Kimi Linear's tokenizer: pat_str of class TikTokenTokenizer in
/// tokenization_kimi.py, the remote code of moonshotai/Kimi-Linear-48B-A3B-Instruct (the same
/// in Kimi K2's repositories). It is not in any data file, so it is written out here. In words:
/// a run of Han; a word of other letters and marks (optionally led by one character that is not
/// a letter, number, CR or LF; upper-then-lower or all-upper case shapes) with an optional
/// English contraction; 1-3 numbers; punctuation/symbol runs with an optional leading space and
/// trailing newlines; newline runs; spaces not followed by a non-space; other spaces. Rust-regex
/// syntax (class intersections, a bare script name): tok::translate_tiktoken_pattern rewrites it
/// for PCRE2.
extern const char* const kKimiPattern;

/// A tiktoken pat_str (Rust regex / fancy-regex syntax) rewritten into what translate_oniguruma
/// and PCRE2 then read the same way:
///   - class intersections "[X&&[^Y]]" (Rust regex; PCRE2 10.42 has none) become
///     "(?:(?![Y])[X])": one character of X that is not in Y. Other uses of && are refused.
///   - a bare script property such as \p{Han} becomes \p{sc:Han}: Rust's regex reads a bare
///     script name as the Script property, PCRE2 >= 10.40 as Script_Extensions, which would also
///     count e.g. U+3001 IDEOGRAPHIC COMMA (Script=Common) as Han. Only the scripts the known
///     patterns use are rewritten (Han); any other bare script name is refused.
/// `what` names the pattern in errors.
std::string translate_tiktoken_pattern(const std::string& pattern, const std::string& what);

/// One compiled split pattern of a tokenizer.json `Split` pre-tokenizer.
class SplitRegex {
 public:
  /// `what` names the pattern in error messages (file and JSON field). `literal` compiles a
  /// {"String": ...} pattern, which matches itself; otherwise an Oniguruma {"Regex": ...} one.
  SplitRegex(const std::string& pattern, bool literal, const std::string& what);
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;
  ~SplitRegex();

  /// Non-overlapping matches [begin, end) left to right over well-formed UTF-8, as
  /// Oniguruma's search loop finds them; empty matches are skipped (they split nothing).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The pattern rewritten from Oniguruma's reading to PCRE2's where the two differ: Oniguruma's
/// \s is exactly Unicode White_Space (25 characters); PCRE2 10.42's \s in UCP mode also matches
/// U+180E (MONGOLIAN VOWEL SEPARATOR, a space before Unicode 6.3). So \s becomes the explicit
/// White_Space set ([...] outside a class, its members inside one) and \S its negation. Throws if
/// \S appears inside a class (no faithful rewrite; no known tokenizer uses it).
/// Checked over all code points against `tokenizers` 0.23.3: \s, the contraction alternatives
/// under (?i:) agree exactly after this rewrite. \p{L}, \p{N}, \p{M} agree for every character
/// assigned up to Unicode 15.0 (PCRE2 10.42's tables); characters new in Unicode 15.1/16
/// (rare scripts, CJK extension I) are unassigned to PCRE2 and split differently.
std::string translate_oniguruma(const std::string& pattern, const std::string& what);

}  // namespace hanpu::tok
