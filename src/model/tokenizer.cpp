// The Qwen3.5 tokenizer (include/hanpu/tokenizer.hpp): a Hugging Face tokenizer.json read into
// hanpu's byte-level BPE, following what the `tokenizers` library does step by step:
//
//   1. added tokens that are not `normalized` are cut out of the raw text (leftmost, longest);
//   2. [hanpu] the rest is split into runs of well-formed UTF-8 and runs of invalid bytes; an
//      invalid run is one pre-token of its own (byte-level mapped and BPE'd, never normalized or
//      regex-split), so any byte string encodes and decode(encode(bytes)) gives the bytes back.
//      `tokenizers` cannot see invalid UTF-8 (its input is a Rust &str / Python str);
//   3. valid text is normalized (NFC), then `normalized` added tokens are cut out of it;
//   4. the pre-tokenizer splits each piece (Split steps with their behaviours), and the
//      ByteLevel step maps bytes to the byte-level alphabet;
//   5. BPE turns each pre-token into ids (model/tokenizer_bpe.cpp).
// Decoding maps each token back to bytes through the alphabet (ByteLevel decoder); added tokens
// decode to their own text.
//
// A tiktoken BPE (Kimi Linear's tiktoken.model, from_tiktoken) shares the special-token search,
// the invalid-UTF-8 handling and decoding; its text goes through Kimi's chunking, Kimi's split
// pattern and tiktoken's rank-based merging (tok::TiktokenBpe) instead of steps 3-5.
//
// Anything in tokenizer.json that hanpu does not implement is rejected with an error naming the
// file and the JSON field, rather than being ignored and producing different ids.
//
// Known differences from `tokenizers` 0.23.3 (checked on the committed golden strings, on 20,000
// random strings over all characters assigned in Unicode 14, and on 278K tokens of mixed text:
// all ids equal except the one case below):
//   - characters new in Unicode 15.1/16 are unknown to PCRE2 10.42's tables, so \p{L}, \p{N},
//     \p{M} do not match them and they split differently (Oniguruma knows Unicode 16);
//   - tokenizers' NFC tables are older than utf8proc's (Unicode 15): it does not compose
//     U+11935 U+11930 (Dives Akuru, Unicode 13) and once moved U+10F4F before U+094D;
//   - an added token whose text is not ASCII decodes to its text; tokenizers' ByteLevel decoder
//     maps such text through the byte alphabet and returns U+FFFD.
#include "hanpu/tokenizer.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "hanpu/tensor.hpp"
#include "io/json_io.hpp"
#include "io/gguf.hpp"
#include "model/gguf_arch.hpp"
#include "model/tokenizer_bpe.hpp"
#include "model/tokenizer_text.hpp"

namespace hanpu {

namespace {

using nlohmann::json;

enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  tok::SplitRegex regex;
  SplitBehavior behavior;
  bool invert;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  bool normalized;
  std::string match;  // what is searched for: content, normalized too if `normalized` (as tokenizers does)
};

// Leftmost-longest search over a set of added tokens (what `tokenizers` does with its
// Aho-Corasick automaton in LeftmostLongest mode). Added vocabularies are small (tens to a few
// hundred tokens), so candidates are bucketed by first byte and compared directly.
class AddedTokenMatcher {
 public:
  void add(const AddedToken* token) {
    auto& bucket = by_first_byte_[static_cast<uint8_t>(token->match[0])];
    bucket.push_back(token);
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const AddedToken* a, const AddedToken* b) { return a->match.size() > b->match.size(); });
  }
  bool empty() const {
    return std::all_of(by_first_byte_.begin(), by_first_byte_.end(), [](const auto& b) { return b.empty(); });
  }
  /// Calls text_fn(piece) for text between matches and token_fn(token) for each match. A special
  /// token matched while parse_special is false stays text, and its span is not searched again
  /// (tokenizers' encode_special_tokens behaves the same).
  template <class TextFn, class TokenFn>
  void split(std::string_view text, bool parse_special, TextFn&& text_fn, TokenFn&& token_fn) const {
    size_t text_begin = 0, pos = 0;
    while (pos < text.size()) {
      const AddedToken* found = nullptr;
      for (const AddedToken* t : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
        if (text.compare(pos, t->match.size(), t->match) == 0) {
          found = t;
          break;  // longest first
        }
      }
      if (!found) {
        ++pos;
        continue;
      }
      if (found->special && !parse_special) {
        pos += found->match.size();
        continue;
      }
      if (pos > text_begin) text_fn(text.substr(text_begin, pos - text_begin));
      token_fn(*found);
      pos += found->match.size();
      text_begin = pos;
    }
    if (text.size() > text_begin) text_fn(text.substr(text_begin));
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
};

// The project's JSON layer (io/json_io.hpp): regular files only, nesting limited, duplicate keys
// (a vocabulary entry given twice) rejected with their JSON pointer.
json parse_json_file(const std::string& path) { return read_json_file(path); }

// Token ids index dense tables (one entry per id up to the largest), so they are limited like
// config.json's vocab_size (docs/RELIABILITY.md): a 100-byte file naming id 107,333,333 made
// the loader allocate 3.4 GB (found by fuzz_tokenizer_json).
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

std::string type_name(const json& j) { return j.type_name(); }

// Small accessors that name the file and field in every error.
struct JsonReader {
  const std::string& file;
  const json& get(const json& obj, const std::string& key, const std::string& field) const {
    if (!obj.is_object() || !obj.contains(key)) throw Error(file + ": missing field \"" + field + "\"");
    return obj.at(key);
  }
  std::string string_at(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_string()) throw Error(file + ": field \"" + field + "\" is " + type_name(v) + ", expected a string");
    return v.get<std::string>();
  }
  bool bool_or(const json& obj, const std::string& key, const std::string& field, bool fallback) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    const json& v = obj.at(key);
    if (!v.is_boolean()) throw Error(file + ": field \"" + field + "\" is " + type_name(v) + ", expected true or false");
    return v.get<bool>();
  }
  int32_t id_at(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = get(obj, key, field);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId)
      throw Error(file + ": field \"" + field + "\" is " + json_summary(v) + ", expected a token id (integer 0.." +
                  std::to_string(kMaxTokenId) + ")");
    return static_cast<int32_t>(v.get<int64_t>());
  }
  [[noreturn]] void unsupported(const std::string& field, const std::string& got, const std::string& supported) const {
    throw Error(file + ": " + field + " is " + got + "; hanpu supports " + supported);
  }
};

// encode() adds no tokens around the text, so only post-processors that add none are accepted:
// ByteLevel (it only adjusts offsets), a TemplateProcessing whose single-sequence template is
// the sequence alone (no BOS/EOS), and Sequences of those.
void check_post_processor(const json& pp, const std::string& field, const JsonReader& r) {
  if (pp.is_null()) return;
  const std::string type = pp.is_object() && pp.contains("type") && pp.at("type").is_string() ? pp.at("type").get<std::string>() : "";
  if (type == "ByteLevel") return;
  if (type == "Sequence" && pp.contains("processors") && pp.at("processors").is_array()) {
    for (size_t i = 0; i < pp.at("processors").size(); ++i)
      check_post_processor(pp.at("processors")[i], field + ".processors[" + std::to_string(i) + "]", r);
    return;
  }
  if (type == "TemplateProcessing" && pp.contains("single") && pp.at("single").is_array()) {
    for (const json& item : pp.at("single"))
      if (!item.is_object() || !item.contains("Sequence"))
        r.unsupported(field + ".single", json_summary(pp.at("single")), "only templates without added tokens (hanpu adds no BOS/EOS)");
    return;
  }
  r.unsupported(field + ".type", type.empty() ? json_summary(pp) : "\"" + type + "\"",
                "null, \"ByteLevel\", or a TemplateProcessing that adds no tokens");
}

bool is_empty_string_or_null(const json& obj, const std::string& key) {
  return !obj.contains(key) || obj.at(key).is_null() || (obj.at(key).is_string() && obj.at(key).get<std::string>().empty());
}

// tokenization_kimi.py's num_reserved_special_tokens (256) + 2: the special ids after the ranks.
constexpr int32_t kKimiSpecialTokenCount = 256 + 2;

}  // namespace

struct Tokenizer::Impl {
  std::string source;  // the tokenizer.json path, for messages
  tok::ByteLevelAlphabet alphabet;
  tok::BpeModel bpe;
  std::vector<std::string> id_to_token;  // vocabulary strings (byte-level form) and added tokens; "" = unused id
  std::vector<uint8_t> id_is_added, id_is_special;
  std::unordered_map<std::string, int32_t> token_ids;
  std::vector<std::unique_ptr<AddedToken>> added;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  bool nfc = false;
  std::vector<SplitStep> splits;
  std::optional<int32_t> eos;
  // Set for a tiktoken tokenizer (from_tiktoken), which encodes through these instead of bpe,
  // the normalizer and the Split steps.
  std::unique_ptr<tok::TiktokenBpe> tiktoken;
  std::unique_ptr<tok::SplitRegex> tiktoken_pattern;

  void set_token(int32_t id, const std::string& token, bool is_added, bool special) {
    if (static_cast<size_t>(id) >= id_to_token.size()) {
      id_to_token.resize(static_cast<size_t>(id) + 1);
      id_is_added.resize(static_cast<size_t>(id) + 1, 0);
      id_is_special.resize(static_cast<size_t>(id) + 1, 0);
    }
    id_to_token[static_cast<size_t>(id)] = token;
    id_is_added[static_cast<size_t>(id)] = is_added;
    id_is_special[static_cast<size_t>(id)] = special;
    token_ids[token] = id;
  }

  void add_token(const AddedToken& t) {
    added.push_back(std::make_unique<AddedToken>(t));
    // A `normalized` token is searched for in normalized text, so in its normalized spelling.
    added.back()->match = t.normalized && nfc ? tok::nfc(t.content) : t.content;
    if (added.back()->match.empty()) added.back()->match = t.content;
    (t.normalized ? normalized_matcher : raw_matcher).add(added.back().get());
    set_token(t.id, t.content, true, t.special);
  }

  void load_model(const json& root, const JsonReader& r);
  void load_normalizer(const json& root, const JsonReader& r);
  void load_pre_tokenizer(const json& root, const JsonReader& r);
  void load_added_tokens(const json& root, const JsonReader& r);

  void pre_tokenize_and_encode(std::string_view text, std::vector<int32_t>& ids) const;
  void tiktoken_encode(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;
};

void Tokenizer::Impl::load_model(const json& root, const JsonReader& r) {
  const json& model = r.get(root, "model", "model");
  if (!model.is_object()) throw Error(source + ": field \"model\" is " + type_name(model) + ", expected an object");
  // Files written by old `tokenizers` versions have no model.type; they hold BPE when they have
  // vocab and merges, and that is what tokenizers assumes too.
  if (model.contains("type")) {
    const std::string type = r.string_at(model, "type", "model.type");
    if (type != "BPE") r.unsupported("model.type", "\"" + type + "\"", "only \"BPE\"");
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0))
    r.unsupported("model.dropout", json_summary(model.at("dropout")), "only null (no BPE dropout)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_empty_string_or_null(model, key))
      r.unsupported(std::string("model.") + key, json_summary(model.at(key)), "only null or \"\" (byte-level BPE)");
  if (r.bool_or(model, "byte_fallback", "model.byte_fallback", false))
    r.unsupported("model.byte_fallback", "true", "only false (byte-level BPE needs no fallback)");
  bpe.fuse_unk = r.bool_or(model, "fuse_unk", "model.fuse_unk", false);
  bpe.ignore_merges = r.bool_or(model, "ignore_merges", "model.ignore_merges", false);

  const json& vocab = r.get(model, "vocab", "model.vocab");
  if (!vocab.is_object()) throw Error(source + ": field \"model.vocab\" is " + type_name(vocab) + ", expected an object of token -> id");
  // Added tokens come later, so token_ids holds exactly the model vocabulary while merges load.
  const auto& model_vocab = token_ids;
  token_ids.reserve(vocab.size() + 1024);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const json& id = it.value();
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId)
      throw Error(source + ": field \"model.vocab[\"" + printable(it.key()) + "\"]\" is " + json_summary(id) +
                  ", expected a token id (integer 0.." + std::to_string(kMaxTokenId) + ")");
    set_token(static_cast<int32_t>(id.get<int64_t>()), it.key(), false, false);
  }
  bpe.byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (const auto it = model_vocab.find(alphabet.char_of(static_cast<uint8_t>(b))); it != model_vocab.end())
      bpe.byte_ids[static_cast<size_t>(b)] = it->second;
  if (bpe.ignore_merges)
    for (const auto& [token, id] : model_vocab)
      if (auto bytes = alphabet.to_bytes(token)) bpe.whole_word_ids.emplace(std::move(*bytes), id);

  if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
    const std::string unk = r.string_at(model, "unk_token", "model.unk_token");
    const auto it = model_vocab.find(unk);
    if (it == model_vocab.end()) throw Error(source + ": model.unk_token \"" + unk + "\" is not in model.vocab");
    bpe.unk_id = it->second;
  }

  const json& merges = r.get(model, "merges", "model.merges");
  if (!merges.is_array()) throw Error(source + ": field \"model.merges\" is " + type_name(merges) + ", expected an array");
  auto vocab_id = [&](const std::string& token, size_t rank) {
    const auto it = model_vocab.find(token);
    if (it == model_vocab.end())
      throw Error(source + ": model.merges[" + std::to_string(rank) + "] uses \"" + token + "\", which is not in model.vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string left, right;
    // Two spellings: "left right" (older files) and ["left", "right"] (tokenizers >= 0.20).
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw Error(source + ": model.merges[" + std::to_string(rank) + "] is \"" + s +
                    "\", expected two tokens separated by one space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      throw Error(source + ": model.merges[" + std::to_string(rank) + "] is " + json_summary(m) +
                  ", expected \"left right\" or [\"left\", \"right\"]");
    }
    bpe.add_merge(vocab_id(left, rank), vocab_id(right, rank), static_cast<uint32_t>(rank), vocab_id(left + right, rank));
  }
}

void Tokenizer::Impl::load_normalizer(const json& root, const JsonReader& r) {
  if (!root.contains("normalizer") || root.at("normalizer").is_null()) return;
  std::vector<std::pair<const json*, std::string>> steps{{&root.at("normalizer"), "normalizer"}};
  const json& top = root.at("normalizer");
  if (top.is_object() && top.value("type", "") == "Sequence") {
    const json& list = r.get(top, "normalizers", "normalizer.normalizers");
    if (!list.is_array()) throw Error(source + ": field \"normalizer.normalizers\" is " + type_name(list) + ", expected an array");
    steps.clear();
    for (size_t i = 0; i < list.size(); ++i) steps.emplace_back(&list[i], "normalizer.normalizers[" + std::to_string(i) + "]");
  }
  for (const auto& [step, field] : steps) {
    const std::string type = r.string_at(*step, "type", field + ".type");
    if (type != "NFC") r.unsupported(field + ".type", "\"" + type + "\"", "only \"NFC\" (or no normalizer)");
    nfc = true;
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const json& root, const JsonReader& r) {
  const json& top = r.get(root, "pre_tokenizer", "pre_tokenizer");
  if (top.is_null()) r.unsupported("pre_tokenizer", "null", "a ByteLevel pre-tokenizer (byte-level BPE)");
  std::vector<std::pair<const json*, std::string>> steps{{&top, "pre_tokenizer"}};
  if (top.is_object() && top.value("type", "") == "Sequence") {
    const json& list = r.get(top, "pretokenizers", "pre_tokenizer.pretokenizers");
    if (!list.is_array()) throw Error(source + ": field \"pre_tokenizer.pretokenizers\" is " + type_name(list) + ", expected an array");
    steps.clear();
    for (size_t i = 0; i < list.size(); ++i) steps.emplace_back(&list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
  }
  bool byte_level_seen = false;
  for (const auto& [step, field] : steps) {
    const std::string type = r.string_at(*step, "type", field + ".type");
    if (byte_level_seen)
      r.unsupported(field + ".type", "\"" + type + "\" after ByteLevel", "Split steps followed by one ByteLevel step");
    if (type == "Split") {
      const json& pattern = r.get(*step, "pattern", field + ".pattern");
      bool literal = false;
      std::string text;
      if (pattern.is_object() && pattern.contains("Regex")) {
        text = r.string_at(pattern, "Regex", field + ".pattern.Regex");
      } else if (pattern.is_object() && pattern.contains("String")) {
        text = r.string_at(pattern, "String", field + ".pattern.String");
        literal = true;
      } else {
        r.unsupported(field + ".pattern", json_summary(pattern), "{\"Regex\": ...} or {\"String\": ...}");
      }
      const std::string behavior = r.string_at(*step, "behavior", field + ".behavior");
      static const std::map<std::string, SplitBehavior> behaviors{
          {"Isolated", SplitBehavior::Isolated},
          {"Removed", SplitBehavior::Removed},
          {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
          {"MergedWithNext", SplitBehavior::MergedWithNext},
          {"Contiguous", SplitBehavior::Contiguous}};
      const auto it = behaviors.find(behavior);
      if (it == behaviors.end())
        r.unsupported(field + ".behavior", "\"" + behavior + "\"", "Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
      const bool invert = r.bool_or(*step, "invert", field + ".invert", false);
      splits.push_back(SplitStep{tok::SplitRegex(text, literal, source + ": " + field + ".pattern"), it->second, invert});
    } else if (type == "ByteLevel") {
      if (r.bool_or(*step, "add_prefix_space", field + ".add_prefix_space", false))
        r.unsupported(field + ".add_prefix_space", "true", "only false (as in Qwen's tokenizers)");
      // use_regex=true would split with GPT-2's built-in regex; Qwen's files split with an
      // explicit Split step instead and set it to false.
      if (r.bool_or(*step, "use_regex", field + ".use_regex", true))
        r.unsupported(field + ".use_regex", "true", "only false (splitting done by an explicit Split step)");
      byte_level_seen = true;
    } else {
      r.unsupported(field + ".type", "\"" + type + "\"", "Split and ByteLevel (in a Sequence)");
    }
  }
  if (!byte_level_seen) r.unsupported("pre_tokenizer", "without a ByteLevel step", "byte-level BPE (a ByteLevel step last)");

  const json& decoder = r.get(root, "decoder", "decoder");
  const std::string decoder_type = decoder.is_object() && decoder.contains("type") ? json_summary(decoder.at("type")) : json_summary(decoder);
  if (decoder_type != "\"ByteLevel\"") r.unsupported("decoder.type", decoder_type, "only \"ByteLevel\"");
  if (root.contains("post_processor")) check_post_processor(root.at("post_processor"), "post_processor", r);
  for (const char* key : {"truncation", "padding"})
    if (root.contains(key) && !root.at(key).is_null()) r.unsupported(key, json_summary(root.at(key)), "only null");
}

void Tokenizer::Impl::load_added_tokens(const json& root, const JsonReader& r) {
  if (!root.contains("added_tokens") || root.at("added_tokens").is_null()) return;
  const json& list = root.at("added_tokens");
  if (!list.is_array()) throw Error(source + ": field \"added_tokens\" is " + type_name(list) + ", expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    AddedToken token;
    token.id = r.id_at(t, "id", field + ".id");
    token.content = r.string_at(t, "content", field + ".content");
    if (token.content.empty()) throw Error(source + ": " + field + ".content is empty");
    token.special = r.bool_or(t, "special", field + ".special", false);
    token.normalized = r.bool_or(t, "normalized", field + ".normalized", !token.special);
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (r.bool_or(t, flag, field + "." + flag, false)) r.unsupported(field + "." + flag, "true", "only false");
    add_token(token);
  }
}

void Tokenizer::Impl::pre_tokenize_and_encode(std::string_view text, std::vector<int32_t>& ids) const {
  // Pieces are [begin, end) ranges of `text`; each Split step refines every piece.
  std::vector<std::pair<size_t, size_t>> pieces{{0, text.size()}}, next, matches;
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> marked;
  for (const SplitStep& step : splits) {
    next.clear();
    for (const auto& [pb, pe] : pieces) {
      const std::string_view piece = text.substr(pb, pe - pb);
      step.regex.find_all(piece, matches);
      // (range, is_match) covering the piece, like tokenizers' Pattern::find_matches.
      marked.clear();
      size_t prev = 0;
      for (const auto& [mb, me] : matches) {
        if (mb > prev) marked.push_back({{prev, mb}, step.invert});
        marked.push_back({{mb, me}, !step.invert});
        prev = me;
      }
      if (prev < piece.size()) marked.push_back({{prev, piece.size()}, step.invert});
      // The behaviours, as in tokenizers' NormalizedString::split.
      std::vector<std::pair<size_t, size_t>> out;
      bool previous_match = false;
      switch (step.behavior) {
        case SplitBehavior::Isolated:
          for (const auto& [r, m] : marked) out.push_back(r);
          break;
        case SplitBehavior::Removed:
          for (const auto& [r, m] : marked)
            if (!m) out.push_back(r);
          break;
        case SplitBehavior::MergedWithPrevious:
          for (const auto& [r, m] : marked) {
            if (m && !previous_match && !out.empty()) out.back().second = r.second;
            else out.push_back(r);
            previous_match = m;
          }
          break;
        case SplitBehavior::MergedWithNext:
          for (auto it = marked.rbegin(); it != marked.rend(); ++it) {
            if (it->second && !previous_match && !out.empty()) out.back().first = it->first.first;
            else out.push_back(it->first);
            previous_match = it->second;
          }
          std::reverse(out.begin(), out.end());
          break;
        case SplitBehavior::Contiguous:
          for (const auto& [r, m] : marked) {
            if (m == previous_match && !out.empty()) out.back().second = r.second;
            else out.push_back(r);
            previous_match = m;
          }
          break;
      }
      for (const auto& [b, e] : out)
        if (e > b) next.emplace_back(pb + b, pb + e);
    }
    pieces.swap(next);
  }
  for (const auto& [b, e] : pieces) bpe.encode_word(text.substr(b, e - b), ids);
}

void Tokenizer::Impl::tiktoken_encode(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const {
  // As tokenization_kimi.py's encode: the text is cut into chunks first, then each chunk goes
  // through tiktoken's encode (special tokens found, the text between them split by the pattern,
  // each match merged). tiktoken keeps only what the pattern matches; Kimi's pattern matches
  // every character, so nothing is dropped in practice.
  std::vector<std::pair<size_t, size_t>> matches;
  auto encode_text = [&](std::string_view segment) {
    for (const auto& [run, valid] : tok::utf8_runs(segment)) {
      if (!valid) {  // bytes that are no UTF-8: one piece of their own, as for tokenizer.json
        tiktoken->encode_piece(run, ids);
        continue;
      }
      tiktoken_pattern->find_all(run, matches);
      for (const auto& [b, e] : matches) tiktoken->encode_piece(run.substr(b, e - b), ids);
    }
  };
  auto add_special = [&](const AddedToken& t) { ids.push_back(t.id); };
  for (const std::string_view chunk : tok::kimi_chunks(text)) raw_matcher.split(chunk, parse_special, encode_text, add_special);
}

Tokenizer Tokenizer::from_tiktoken_ranks(std::vector<std::string> ranks, const std::string& source) {
  Tokenizer t;
  Impl& impl = *t.impl_;
  impl.source = source;
  impl.tiktoken = std::make_unique<tok::TiktokenBpe>(std::move(ranks));
  impl.tiktoken_pattern = std::make_unique<tok::SplitRegex>(
      tok::translate_tiktoken_pattern(tok::kKimiPattern, "Kimi's pre-tokenizer pattern"), false, "Kimi's pre-tokenizer pattern");
  const std::vector<std::string>& by_rank = impl.tiktoken->tokens_by_rank();
  // Base tokens are kept in the byte-level spelling tokenization_kimi.py's get_vocab() shows
  // them in (GPT-2's bytes_to_unicode), so token_to_id and decoding work as for tokenizer.json.
  for (size_t r = 0; r < by_rank.size(); ++r) impl.set_token(static_cast<int32_t>(r), impl.alphabet.from_bytes(by_rank[r]), false, false);
  return t;
}

Tokenizer Tokenizer::from_tiktoken(const std::string& tiktoken_model, const std::string& tokenizer_config) {
  Tokenizer t = from_tiktoken_ranks(tok::read_tiktoken_model(tiktoken_model), tiktoken_model);
  Impl& impl = *t.impl_;
  const auto base_count = static_cast<int32_t>(impl.tiktoken->tokens_by_rank().size());

  const json config = parse_json_file(tokenizer_config);
  if (!config.is_object()) throw Error(tokenizer_config + ": the top level is " + type_name(config) + ", expected an object");
  const JsonReader r{tokenizer_config};
  const json& decoder = r.get(config, "added_tokens_decoder", "added_tokens_decoder");
  if (!decoder.is_object())
    throw Error(tokenizer_config + ": field \"added_tokens_decoder\" is " + type_name(decoder) + ", expected an object of id -> token");
  const int32_t special_end = base_count + kKimiSpecialTokenCount;
  std::map<int32_t, std::string> named;
  for (const auto& [id_text, entry] : decoder.items()) {
    const std::string field = "added_tokens_decoder[\"" + id_text + "\"]";
    int64_t id = -1;
    if (!id_text.empty() && id_text.size() <= 9 && std::all_of(id_text.begin(), id_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = std::stoll(id_text);
    if (id < base_count || id >= special_end)
      throw Error(tokenizer_config + ": " + field + " has the id \"" + id_text + "\"; expected a special-token id " +
                  std::to_string(base_count) + ".." + std::to_string(special_end - 1) + " (" + tiktoken_model + " has " +
                  std::to_string(base_count) + " ranks, and tokenization_kimi.py numbers " +
                  std::to_string(kKimiSpecialTokenCount) + " special tokens after them)");
    const std::string content = r.string_at(entry, "content", field + ".content");
    if (content.empty()) throw Error(tokenizer_config + ": " + field + ".content is empty, expected the token's text");
    named[static_cast<int32_t>(id)] = content;
  }
  // Every special id is a token, named or reserved (tiktoken recognises all of them in text
  // when specials are allowed). lstrip/rstrip/normalized are not read: tokenization_kimi.py's
  // encode hands the text straight to tiktoken, which ignores them.
  std::unordered_map<std::string, int32_t> special_ids;
  for (int32_t id = base_count; id < special_end; ++id) {
    const auto it = named.find(id);
    const std::string content = it != named.end() ? it->second : "<|reserved_token_" + std::to_string(id) + "|>";
    if (const auto [prev, inserted] = special_ids.emplace(content, id); !inserted)
      throw Error(tokenizer_config + ": added_tokens_decoder gives \"" + printable(content) + "\" to ids " +
                  std::to_string(prev->second) + " and " + std::to_string(id) + "; expected each special token once");
    impl.add_token(AddedToken{content, id, /*special=*/true, /*normalized=*/false, {}});
  }
  if (config.contains("eos_token") && !config.at("eos_token").is_null()) {
    const json& eos = config.at("eos_token");
    const std::string content = eos.is_object() ? r.string_at(eos, "content", "eos_token.content") : r.string_at(config, "eos_token", "eos_token");
    const auto it = special_ids.find(content);
    if (it == special_ids.end())
      throw Error(tokenizer_config + ": eos_token \"" + printable(content) + "\" is not one of the special tokens " +
                  std::to_string(base_count) + ".." + std::to_string(special_end - 1));
    impl.eos = it->second;
  }
  return t;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_gguf(const std::string& path) {
  // The tokenizer.ggml.* keys as the tokenizer.json they stand for (model/gguf_arch.hpp), read by
  // the same steps as a checkpoint's, so everything a tokenizer.json is checked for is checked here.
  // Kimi's (tokenizer.ggml.pre "kimi-k2") as the tiktoken tokenizer its checkpoint ships: the
  // ranks and special tokens give the same tokenizer from_tiktoken builds, so the ids are
  // tiktoken's (llama.cpp instead runs BPE over the merges its converter recovered from the ranks).
  const GgufModel m = GgufModel::open(path);
  const std::string source = "GGUF file '" + path + "' (tokenizer.ggml.*)";
  if (model::gguf_tokenizer_is_tiktoken(m.main())) {
    model::GgufTiktokenVocab v = model::gguf_tiktoken_vocab(m.main());
    Tokenizer t = from_tiktoken_ranks(std::move(v.ranks), source);
    for (const auto& [id, content] : v.specials) {
      if (const auto known = t.impl_->token_ids.find(content); known != t.impl_->token_ids.end())
        throw Error(source + ": key 'tokenizer.ggml.tokens'[" + std::to_string(id) + "], the special token \"" +
                    printable(content) + "\", is also token " + std::to_string(known->second) +
                    " (byte-level spelling included), expected each token once");
      t.impl_->add_token(AddedToken{content, id, /*special=*/true, /*normalized=*/false, {}});
    }
    t.impl_->eos = v.eos;
    return t;
  }
  std::optional<int32_t> eos;
  const std::string text = model::gguf_tokenizer_json(m.main(), &eos);
  Tokenizer t = from_json_text(text, source);
  t.impl_->eos = eos;
  return t;
}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json) {
  return from_json_text(std::string(), tokenizer_json);
}

Tokenizer Tokenizer::from_json_text(const std::string& text, const std::string& tokenizer_json) {
  auto load = [&] {
    Tokenizer t;
    Impl& impl = *t.impl_;
    impl.source = tokenizer_json;
    const json root = text.empty() ? parse_json_file(tokenizer_json) : parse_json(text, tokenizer_json);
    if (!root.is_object()) throw Error(tokenizer_json + ": the top level is " + type_name(root) + ", expected an object");
    const JsonReader r{impl.source};
    impl.load_model(root, r);
    impl.load_normalizer(root, r);
    impl.load_pre_tokenizer(root, r);
    impl.load_added_tokens(root, r);
    return t;
  };
  try {
    return load();
  } catch (const json::exception& e) {  // a field of an unexpected type read by get()/value()
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    throw Error(tokenizer_json + ": a field has an unexpected JSON type: " + what);
  }
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (model::is_gguf_path(dir)) return from_gguf(dir);
  const fs::path tokenizer_json = fs::path(dir) / "tokenizer.json";
  if (!fs::is_directory(dir)) throw Error(dir + ": not a directory (expected a checkpoint directory with tokenizer.json)");
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  // Kimi's checkpoints ship tiktoken.model and no tokenizer.json; with both, tokenizer.json is
  // what `transformers` would load (its fast tokenizer), so it wins.
  if (!fs::exists(tokenizer_json) && fs::exists(fs::path(dir) / "tiktoken.model")) {
    if (!fs::exists(config_path))
      throw Error(config_path.string() + ": missing (a tiktoken checkpoint needs it for its special tokens)");
    return from_tiktoken((fs::path(dir) / "tiktoken.model").string(), config_path.string());
  }
  if (!fs::exists(tokenizer_json))
    throw Error(tokenizer_json.string() + ": missing (a checkpoint directory needs tokenizer.json, or tiktoken.model with tokenizer_config.json)");
  Tokenizer t = from_file(tokenizer_json.string());
  if (!fs::exists(config_path)) return t;
  const std::string config_file = config_path.string();
  const json config = parse_json_file(config_file);
  if (!config.is_object()) throw Error(config_file + ": the top level is " + type_name(config) + ", expected an object");
  const JsonReader r{config_file};
  Impl& impl = *t.impl_;
  // added_tokens_decoder: {"248046": {"content": "<|im_end|>", "special": true, ...}}. Tokens
  // tokenizer.json already has are left as they are.
  if (config.contains("added_tokens_decoder") && config.at("added_tokens_decoder").is_object()) {
    for (const auto& [id_text, entry] : config.at("added_tokens_decoder").items()) {
      const std::string field = "added_tokens_decoder[\"" + id_text + "\"]";
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(id_text, &used);
        if (used != id_text.size()) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0 || id > kMaxTokenId)
        throw Error(config_file + ": " + field + " has a key that is not a token id (0.." + std::to_string(kMaxTokenId) + ")");
      const std::string content = r.string_at(entry, "content", field + ".content");
      if (content.empty()) throw Error(config_file + ": " + field + ".content is empty");
      const auto known = impl.token_ids.find(content);
      if (known != impl.token_ids.end() && impl.id_is_added[static_cast<size_t>(known->second)]) continue;
      if (static_cast<size_t>(id) < impl.id_to_token.size() && !impl.id_to_token[static_cast<size_t>(id)].empty() &&
          impl.id_to_token[static_cast<size_t>(id)] != content)
        throw Error(config_file + ": " + field + " gives id " + id_text + " to \"" + content + "\", but " +
                    impl.source + " has \"" + impl.id_to_token[static_cast<size_t>(id)] + "\" there");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (r.bool_or(entry, flag, field + "." + flag, false)) r.unsupported(field + "." + flag, "true", "only false");
      const bool special = r.bool_or(entry, "special", field + ".special", false);
      impl.add_token(AddedToken{content, static_cast<int32_t>(id), special,
                                r.bool_or(entry, "normalized", field + ".normalized", !special), {}});
    }
  }
  if (config.contains("eos_token") && !config.at("eos_token").is_null()) {
    const json& eos = config.at("eos_token");
    const std::string content = eos.is_object() ? r.string_at(eos, "content", "eos_token.content") : r.string_at(config, "eos_token", "eos_token");
    const auto it = impl.token_ids.find(content);
    if (it == impl.token_ids.end())
      throw Error(config_file + ": eos_token \"" + content + "\" is not a token of " + impl.source);
    impl.eos = it->second;
  }
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);  // ~3-4 bytes per token in typical text
  if (impl.tiktoken) {
    impl.tiktoken_encode(text, parse_special, ids);
    return ids;
  }
  auto add_token = [&](const AddedToken& t) { ids.push_back(t.id); };
  auto encode_normalized = [&](std::string_view piece) { impl.pre_tokenize_and_encode(piece, ids); };
  auto encode_raw = [&](std::string_view segment) {
    for (const auto& [run, valid] : tok::utf8_runs(segment)) {
      if (!valid) {
        impl.bpe.encode_word(run, ids);  // invalid bytes: one pre-token, bytes as they are
        continue;
      }
      const std::string normalized = impl.nfc ? tok::nfc(run) : std::string(run);
      impl.normalized_matcher.split(normalized, parse_special, encode_normalized, add_token);
    }
  };
  impl.raw_matcher.split(text, parse_special, encode_raw, add_token);
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& impl = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= impl.id_to_token.size() || impl.id_to_token[static_cast<size_t>(id)].empty())
    throw Error("tokenizer " + impl.source + ": token id " + std::to_string(id) + " is not in the vocabulary (ids 0.." +
                std::to_string(static_cast<int64_t>(impl.id_to_token.size()) - 1) + ")");
  const std::string& token = impl.id_to_token[static_cast<size_t>(id)];
  if (impl.id_is_added[static_cast<size_t>(id)]) return token;
  // A vocabulary string outside the byte-level alphabet stands for its own UTF-8 (the ByteLevel
  // decoder's fallback).
  auto bytes = impl.alphabet.to_bytes(token);
  return bytes ? std::move(*bytes) : token;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    const std::string bytes = token_bytes(id);  // validates the id
    if (skip_special && impl_->id_is_special[static_cast<size_t>(id)]) continue;
    out += bytes;
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_ids.find(std::string(token));
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_is_special.size() && impl_->id_is_special[static_cast<size_t>(id)];
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                           bool enable_thinking) const {
  // Qwen3.5's chat_template without tools, rule for rule: contents are trimmed; a system message
  // may only come first; assistant turns after the last user message show their reasoning in a
  // <think> block, earlier ones only their answer; tool results are wrapped in <tool_response>
  // inside a user turn.
  if (impl_->tiktoken)
    throw Error("chat template: " + impl_->source + " is a tiktoken tokenizer (Kimi), whose chat template hanpu does not "
                "implement yet; give the prompt as plain text without --chat, or as --prompt-ids");
  if (messages.empty()) throw Error("chat template: no messages");
  // The last user message that is not a wrapped tool result ("multi-step tool" turns).
  const auto last_user = std::find_if(messages.rbegin(), messages.rend(), [](const ChatMessage& m) {
    if (m.role != "user") return false;
    const std::string c = tok::python_strip(m.content);
    const std::string_view open = "<tool_response>", close = "</tool_response>";
    return !(c.starts_with(open) && c.ends_with(close));
  });
  if (last_user == messages.rend()) throw Error("chat template: no user query among the messages (Qwen's template requires one)");
  const size_t last_query = static_cast<size_t>(messages.rend() - last_user) - 1;
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string content = tok::python_strip(m.content);
    if (m.role == "system") {
      if (i != 0) throw Error("chat template: message " + std::to_string(i) + " is a system message; it must be the first");
      out += "<|im_start|>system\n" + content + "<|im_end|>\n";
    } else if (m.role == "user") {
      out += "<|im_start|>user\n" + content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string reasoning;
      if (const size_t close = content.find("</think>"); close != std::string::npos) {
        // reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string before = content.substr(0, close);
        while (!before.empty() && before.back() == '\n') before.pop_back();
        if (const size_t open = before.rfind("<think>"); open != std::string::npos) before = before.substr(open + 7);
        reasoning = before.substr(std::min(before.find_first_not_of('\n'), before.size()));
        // content = content.split('</think>')[-1].lstrip('\n')
        std::string after = content.substr(content.rfind("</think>") + 8);
        content = after.substr(std::min(after.find_first_not_of('\n'), after.size()));
      }
      reasoning = tok::python_strip(reasoning);
      if (i > last_query) out += "<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content;
      else out += "<|im_start|>assistant\n" + content;
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // As the template's `loop.previtem and ...`: a tool message first opens no user turn.
      if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      throw Error("chat template: message " + std::to_string(i) + " has role \"" + m.role +
                  "\"; expected system, user, assistant or tool");
    }
  }
  if (add_generation_prompt) out += enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return out;
}

}  // namespace hanpu
