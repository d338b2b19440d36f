// Byte-level BPE: GPT-2's byte-to-character alphabet and the merge loop of Hugging Face
// `tokenizers` (models/bpe/word.rs merge_all), reproduced rule for rule so the ids match:
// symbols start as one per byte; the applicable merge with the lowest rank is applied first,
// the leftmost one on ties; a queued merge is dropped when the pair at its position no longer
// merges into the same token.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hanpu::tok {

/// The mergeable ranks of a tiktoken BPE (tiktoken.model): token bytes -> rank, rank = token id.
/// Merging is tiktoken's (openai/tiktoken src/lib.rs, byte_pair_encode), not Hugging Face's:
/// there is no merge list; a piece starts as one part per byte, and the adjacent pair whose
/// concatenated bytes have the lowest rank is merged (the leftmost one on ties) until no adjacent
/// pair's concatenation is a token. A piece that is itself a token is that token at once.
class TiktokenBpe {
 public:
  /// tokens_by_rank[r] = the bytes of rank r. The caller guarantees what read_tiktoken_model
  /// checks: ranks dense, no duplicate bytes, every single byte a token.
  explicit TiktokenBpe(std::vector<std::string> tokens_by_rank);
  /// Appends the ids of one pre-token (any bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  const std::vector<std::string>& tokens_by_rank() const { return tokens_by_rank_; }

 private:
  // Heterogeneous lookup: the merge loop looks up sub-ranges of a piece without copying them.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::optional<int32_t> rank_of(std::string_view bytes) const;

  std::vector<std::string> tokens_by_rank_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ranks_;
};

/// Reads and validates a tiktoken.model file: one "<base64 of the token's bytes> <rank>" per
/// line (tiktoken/load.py load_tiktoken_bpe). hanpu is stricter than tiktoken, whose loader
/// skips characters outside the base64 alphabet and keeps the last of two lines with the same
/// bytes: here each line must be exactly standard base64 (with its padding), one space and a
/// decimal rank; bytes and ranks must each be unique, the ranks must be 0..n-1 (Kimi's
/// tokenization_kimi.py numbers the special tokens from n = the number of lines, so a gap would
/// give two tokens one id), and every single byte must be a token (tiktoken's merge loop
/// starts from single bytes and panics on a missing one). Empty lines are skipped, as tiktoken
/// does. Errors name the file and line. Returns the token bytes by rank.
std::vector<std::string> read_tiktoken_model(const std::string& path);

/// The checks read_tiktoken_model makes, for ranks from elsewhere (a GGUF kimi-k2 vocabulary):
/// at most 2^24 ranks, each non-empty and its bytes given once, and every single byte a token.
/// Throws hanpu::Error starting with `source` and naming the rank.
void check_tiktoken_ranks(const std::vector<std::string>& tokens_by_rank, const std::string& source);

/// The merge list llama.cpp's converter writes for a tiktoken vocabulary (conversion/qwen.py
/// QwenModel.bpe with max_rank, used by conversion/kimi_linear.py): for each rank r in order,
/// r's bytes merged from single bytes with only ranks below r (the lowest-ranked adjacent pair
/// first, the leftmost on ties); when that ends in exactly two parts, "left right" (each in the
/// byte-level spelling) is the next merge. Single bytes and tokens that end in more parts give
/// none. `tokens_by_rank` as check_tiktoken_ranks accepts.
std::vector<std::string> tiktoken_merges(const std::vector<std::string>& tokens_by_rank);

/// The ByteLevel pre-tokenizer's table: every byte is shown as one printable character
/// (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF as themselves, the others as U+0100 + n in order).
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  /// The UTF-8 text of the character byte b is shown as.
  const std::string& char_of(uint8_t b) const { return byte_to_char_[b]; }
  /// The bytes a byte-level string stands for; nullopt if a character is not in the alphabet.
  std::optional<std::string> to_bytes(std::string_view byte_level) const;
  /// The byte-level string of raw bytes.
  std::string from_bytes(std::string_view bytes) const;

 private:
  std::array<std::string, 256> byte_to_char_;
  std::unordered_map<int32_t, uint8_t> char_to_byte_;
};

class BpeModel {
 public:
  /// id of the vocabulary entry for each single byte (-1 if the vocabulary lacks it).
  std::array<int32_t, 256> byte_ids{};
  /// (left id, right id) -> (rank, merged id); later merges of the same pair replace earlier
  /// ones, as in `tokenizers`.
  void add_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged);
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  /// ignore_merges: a word that is itself in the vocabulary is one token (whole_word_ids).
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> whole_word_ids;  // raw bytes -> id, only with ignore_merges

  /// Appends the ids of one pre-token (raw bytes) to out. Thread-safe; caches short words.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

 private:
  struct MergeTarget {
    uint32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void merge_word(std::string_view bytes, std::vector<int32_t>& out) const;

  std::unordered_map<uint64_t, MergeTarget> merges_;
  // Words repeat a lot in real text ("the", " of", digits, spaces); caching them makes long
  // prompts several times faster. Words longer than kMaxCachedWord bytes are rare and would
  // bloat the cache; at kMaxCacheEntries the cache starts over (a bound on memory).
  static constexpr size_t kMaxCachedWord = 64;
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace hanpu::tok
