// The prefix cache of `hanpu serve` (docs/SERVE.md): snapshots of a sequence's whole HybridState
// (GDN/KDA recurrent and conv states, attention KV or MLA latent cache) keyed by the token ids
// that produced them, in a radix tree. A recurrent state cannot be truncated to a shorter prefix
// the way a KV cache can, so a request can only resume from a length at which a snapshot was
// taken; the server takes them at chunk boundaries of its prefill, where the state exists anyway.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "hanpu/model.hpp"

namespace hanpu::serve {

struct CacheStats {
  size_t bytes = 0;         // snapshot states plus the tree's token labels
  size_t entries = 0;       // snapshots held
  uint64_t evictions = 0;   // snapshots dropped to stay within the budget
  uint64_t inserts = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(size_t capacity_bytes);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  /// The deepest snapshot whose tokens are a prefix of `tokens` and whose length is at most
  /// `max_length` (a copy of it: the caller continues it), or nothing. Marks it recently used.
  std::optional<HybridState> lookup(std::span<const int32_t> tokens, int64_t max_length);
  /// How many leading tokens of `tokens` some cached sequence shares (snapshot or not): with the
  /// depth of the snapshot lookup() finds, it tells why a prompt reused less than it shares.
  int64_t shared_prefix(std::span<const int32_t> tokens) const;
  /// Stores a copy of `state`, which must be the state after exactly `tokens` (state.position ==
  /// tokens.size()). Evicts least recently used snapshots to stay within the capacity; a snapshot
  /// larger than the whole capacity is not stored (returns false). Storing a length already held
  /// only marks it used (the same tokens give the same state).
  bool insert(std::span<const int32_t> tokens, const HybridState& state);
  /// Lengths of the snapshots along `tokens` (for tests and logs), shallowest first.
  std::vector<int64_t> snapshot_lengths(std::span<const int32_t> tokens) const;
  CacheStats stats() const;
  size_t capacity_bytes() const { return capacity_; }

 private:
  struct Node;
  Node* find_or_make(std::span<const int32_t> tokens);
  void evict_one();
  void prune(Node* n);

  const size_t capacity_;
  mutable std::mutex mu_;  // the scheduler writes; /metrics reads the stats from other threads
  std::unique_ptr<Node> root_;
  std::list<Node*> lru_;  // front: most recently used; holds the nodes that carry a snapshot
  CacheStats stats_;
};

}  // namespace hanpu::serve
