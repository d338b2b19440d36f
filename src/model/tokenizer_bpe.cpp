// Byte-level alphabet and the BPE merge loop (see tokenizer_bpe.hpp).
#include "model/tokenizer_bpe.hpp"

#include <algorithm>
#include <queue>
#include <utf8proc.h>

#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"
#include "model/tokenizer_text.hpp"

namespace hanpu::tok {

namespace {

std::string utf8_of(int32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  int32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int32_t cp = printable ? b : next_extra++;
    byte_to_char_[static_cast<size_t>(b)] = utf8_of(cp);
    char_to_byte_[cp] = static_cast<uint8_t>(b);
  }
}

std::optional<std::string> ByteLevelAlphabet::to_bytes(std::string_view byte_level) const {
  std::string out;
  out.reserve(byte_level.size());
  size_t pos = 0;
  while (pos < byte_level.size()) {
    const size_t len = utf8_sequence_length(byte_level, pos);
    if (len == 0) return std::nullopt;
    utf8proc_int32_t cp = -1;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(byte_level.data() + pos), static_cast<utf8proc_ssize_t>(len), &cp);
    const auto it = char_to_byte_.find(cp);
    if (it == char_to_byte_.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    pos += len;
  }
  return out;
}

std::string ByteLevelAlphabet::from_bytes(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_to_char_[static_cast<uint8_t>(c)];
  return out;
}

void BpeModel::add_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  merges_[pair_key(left, right)] = MergeTarget{rank, merged};
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  const bool cacheable = bytes.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(std::string(bytes)); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(bytes, out);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(bytes), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

void BpeModel::merge_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    if (const auto it = whole_word_ids.find(std::string(bytes)); it != whole_word_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols, one per byte; bytes missing from the vocabulary become the unk token
  // (consecutive ones fused into one with fuse_unk) or are dropped when there is none, as in
  // tokenizers' BPE::merge_word. A byte-level vocabulary has all 256 bytes, so neither happens.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  bool pending_unk = false;
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  };
  for (char c : bytes) {
    const int32_t id = byte_ids[static_cast<uint8_t>(c)];
    if (id >= 0) {
      if (pending_unk) push(*unk_id), pending_unk = false;
      push(id);
    } else if (unk_id) {
      if (pending_unk && !fuse_unk) push(*unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) push(*unk_id);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    const Symbol& s = symbols[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    const auto it = merges_.find(pair_key(s.id, symbols[static_cast<size_t>(s.next)].id));
    if (it != merges_.end()) queue.push(Candidate{it->second.rank, pos, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // Stale entry: the pair here has changed since it was queued (the same test as tokenizers:
    // the current pair must merge into the same token).
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[static_cast<size_t>(left.next)].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) out.push_back(symbols[static_cast<size_t>(i)].id);
}

}  // namespace hanpu::tok

// ---- tiktoken ------------------------------------------------------------------------------

namespace hanpu::tok {

namespace {

// Token ids index dense tables, so a tiktoken.model is limited like tokenizer.json's ids
// (tokenizer.cpp kMaxTokenId): 2^24 ranks, and its size accordingly.
constexpr size_t kMaxTiktokenRanks = size_t{1} << 24;
constexpr uint64_t kMaxTiktokenFileBytes = uint64_t{1} << 30;

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 (RFC 4648 section 4) with its padding; nullopt names nothing, the caller says
// where. Unused low bits of the last character are not checked (Python's b64decode does not).
std::optional<std::string> decode_base64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  size_t padding = 0;
  while (padding < 2 && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int nbits = 0;
  for (size_t i = 0; i < text.size() - padding; ++i) {
    const int v = base64_value(text[i]);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    nbits += 6;
    if (nbits >= 8) {
      nbits -= 8;
      out.push_back(static_cast<char>((bits >> nbits) & 0xFF));
    }
  }
  return out;
}

std::string describe_bytes(std::string_view bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7F && b != '\\' && b != '"') out += c;
    else out += std::string("\\x") + hex[b >> 4] + hex[b & 15];
  }
  return "\"" + out + "\"";
}

}  // namespace

std::vector<std::string> read_tiktoken_model(const std::string& path) {
  const std::string text = read_regular_file(path, "tiktoken BPE file", kMaxTiktokenFileBytes);
  struct Entry {
    std::string bytes;
    size_t line;
  };
  // Ranks must be 0..n-1 for the n tokens; counting the lines first bounds every rank by n, so a
  // short file naming a huge rank is refused before anything is sized by it.
  size_t n = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin && !(end == begin + 1 && text[begin] == '\r')) ++n;
    begin = end + 1;
  }
  if (n == 0) throw Error(path + ": no tokens (expected one \"<base64> <rank>\" line per token)");
  if (n > kMaxTiktokenRanks)
    throw Error(path + ": " + std::to_string(n) + " tokens, more than hanpu's limit " + std::to_string(kMaxTiktokenRanks));
  std::vector<std::optional<Entry>> by_rank(n);
  std::unordered_map<std::string, size_t> line_of_bytes;
  size_t line_number = 0, begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    ++line_number;
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      throw Error(where + ": got \"" + printable(line) + "\", expected \"<base64 of the token's bytes> <rank>\" (one space)");
    const std::string_view b64 = line.substr(0, space), rank_text = line.substr(space + 1);
    auto bytes = decode_base64(b64);
    if (!bytes || bytes->empty())
      throw Error(where + ": the token \"" + printable(b64) + "\" is not standard base64 of at least one byte "
                  "(A-Z a-z 0-9 + /, length a multiple of 4 with '=' padding)");
    if (rank_text.empty() || rank_text.size() > 9 ||
        !std::all_of(rank_text.begin(), rank_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw Error(where + ": the rank \"" + printable(rank_text) + "\" is not a decimal integer 0.." +
                  std::to_string(kMaxTiktokenRanks - 1));
    const size_t rank = std::stoul(std::string(rank_text));
    if (rank >= n)
      throw Error(where + ": the rank " + std::to_string(rank) + " is outside 0.." + std::to_string(n - 1) +
                  " (the file has " + std::to_string(n) + " tokens; expected ranks 0..n-1, each once, since the "
                  "special tokens are numbered from n)");
    if (const auto [it, inserted] = line_of_bytes.emplace(*bytes, line_number); !inserted)
      throw Error(where + ": the token " + describe_bytes(*bytes) + " is already given on line " +
                  std::to_string(it->second) + " (each token's bytes once)");
    if (by_rank[rank])
      throw Error(where + ": the rank " + std::to_string(rank) + " is already given on line " +
                  std::to_string(by_rank[rank]->line) + " (each rank once)");
    by_rank[rank] = Entry{std::move(*bytes), line_number};
  }
  // n distinct ranks below n: every rank 0..n-1 is present.
  for (int b = 0; b < 256; ++b)
    if (!line_of_bytes.count(std::string(1, static_cast<char>(b))))
      throw Error(path + ": the single byte " + describe_bytes(std::string(1, static_cast<char>(b))) +
                  " is not a token (expected all 256 single bytes, from which every piece is merged)");
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (auto& e : by_rank) tokens.push_back(std::move(e->bytes));
  return tokens;
}

void check_tiktoken_ranks(const std::vector<std::string>& tokens_by_rank, const std::string& source) {
  if (tokens_by_rank.size() > kMaxTiktokenRanks)
    throw Error(source + ": " + std::to_string(tokens_by_rank.size()) + " ranks, more than hanpu's limit " +
                std::to_string(kMaxTiktokenRanks));
  std::unordered_map<std::string_view, size_t> rank_of_bytes;
  rank_of_bytes.reserve(tokens_by_rank.size());
  for (size_t r = 0; r < tokens_by_rank.size(); ++r) {
    if (tokens_by_rank[r].empty()) throw Error(source + ": rank " + std::to_string(r) + " is empty, expected at least one byte");
    if (const auto [it, inserted] = rank_of_bytes.emplace(tokens_by_rank[r], r); !inserted)
      throw Error(source + ": rank " + std::to_string(r) + " is the token " + describe_bytes(tokens_by_rank[r]) +
                  ", already rank " + std::to_string(it->second) + " (each token's bytes once)");
  }
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    if (!rank_of_bytes.count(one))
      throw Error(source + ": the single byte " + describe_bytes(one) +
                  " is not a token (expected all 256 single bytes, from which every piece is merged)");
  }
}

std::vector<std::string> tiktoken_merges(const std::vector<std::string>& tokens_by_rank) {
  std::unordered_map<std::string_view, size_t> rank_of_bytes;
  rank_of_bytes.reserve(tokens_by_rank.size());
  for (size_t r = 0; r < tokens_by_rank.size(); ++r) rank_of_bytes.emplace(tokens_by_rank[r], r);
  const ByteLevelAlphabet alphabet;
  std::vector<std::string> merges;
  std::vector<std::string_view> parts;
  for (size_t r = 0; r < tokens_by_rank.size(); ++r) {
    const std::string_view token = tokens_by_rank[r];
    if (token.size() < 2) continue;
    parts.clear();
    for (size_t i = 0; i < token.size(); ++i) parts.push_back(token.substr(i, 1));
    // Parts are adjacent sub-ranges of `token`, so a merged pair is again one sub-range.
    while (parts.size() > 1) {
      size_t best = 0, best_rank = r;  // only ranks below r may merge
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const std::string_view pair(parts[i].data(), parts[i].size() + parts[i + 1].size());
        const auto it = rank_of_bytes.find(pair);
        if (it != rank_of_bytes.end() && it->second < best_rank) best = i, best_rank = it->second;
      }
      if (best_rank == r) break;
      parts[best] = std::string_view(parts[best].data(), parts[best].size() + parts[best + 1].size());
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    if (parts.size() == 2) merges.push_back(alphabet.from_bytes(parts[0]) + " " + alphabet.from_bytes(parts[1]));
  }
  return merges;
}

TiktokenBpe::TiktokenBpe(std::vector<std::string> tokens_by_rank) : tokens_by_rank_(std::move(tokens_by_rank)) {
  ranks_.reserve(tokens_by_rank_.size());
  for (size_t r = 0; r < tokens_by_rank_.size(); ++r) ranks_.emplace(tokens_by_rank_[r], static_cast<int32_t>(r));
}

std::optional<int32_t> TiktokenBpe::rank_of(std::string_view bytes) const {
  const auto it = ranks_.find(bytes);
  if (it == ranks_.end()) return std::nullopt;
  return it->second;
}

void TiktokenBpe::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (const auto whole = rank_of(piece)) {  // tiktoken looks the whole piece up first
    out.push_back(*whole);
    return;
  }
  // Parts are identified by the byte offset they start at (a part keeps its start when it
  // absorbs its right neighbour). tiktoken rescans all pairs after each merge (quadratic in the
  // piece); a heap of candidate pairs ordered by (rank, start) picks the same pair -- the lowest
  // rank, the leftmost on ties -- in O(n log n), so long pieces cannot stall encoding.
  // A candidate is stale once either of its parts changed: `version` counts changes per part.
  const size_t n = piece.size();
  std::vector<size_t> next(n), prev(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;  // n = no next part
    prev[i] = i == 0 ? n : i - 1;
  }
  struct Candidate {
    int32_t rank;
    size_t left;
    uint32_t version;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto end_of = [&](size_t part) { return next[part] == n ? n : next[part]; };
  auto push_pair = [&](size_t left) {
    const size_t right = next[left];
    if (right >= n) return;
    if (const auto r = rank_of(piece.substr(left, end_of(right) - left))) heap.push({*r, left, version[left]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || version[c.left] != c.version) continue;
    const size_t right = next[c.left];
    alive[right] = 0;
    next[c.left] = next[right];
    if (next[right] < n) prev[next[right]] = c.left;
    // The merged part's pair with its new right neighbour, and its left neighbour's pair with it.
    ++version[c.left];
    push_pair(c.left);
    if (prev[c.left] < n) {
      ++version[prev[c.left]];
      push_pair(prev[c.left]);
    }
  }
  for (size_t part = 0; part < n; part = next[part]) {
    const auto r = rank_of(piece.substr(part, end_of(part) - part));
    // Every part is a single byte or a merge whose bytes had a rank; all single bytes have one.
    out.push_back(r ? *r : -1);
  }
}

}  // namespace hanpu::tok
