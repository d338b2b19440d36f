// Byte-level alphabet and the BPE merge loop (see tokenizer_bpe.hpp).
#include "model/tokenizer_bpe.hpp"

#include <queue>
#include <utf8proc.h>

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
