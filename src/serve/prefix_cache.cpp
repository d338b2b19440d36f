// Radix tree of token ids whose nodes may hold a HybridState snapshot (prefix_cache.hpp).
#include "serve/prefix_cache.hpp"

#include <algorithm>

namespace hanpu::serve {

struct PrefixCache::Node {
  std::vector<int32_t> edge;  // the tokens from the parent to this node
  int64_t depth = 0;          // tokens from the root to the end of this node
  Node* parent = nullptr;
  std::map<int32_t, std::unique_ptr<Node>> children;  // by the first token of the child's edge
  std::optional<HybridState> snapshot;
  size_t snapshot_bytes = 0;
  std::list<Node*>::iterator lru_pos;
};

PrefixCache::PrefixCache(size_t capacity_bytes) : capacity_(capacity_bytes), root_(std::make_unique<Node>()) {}
PrefixCache::~PrefixCache() = default;

std::optional<HybridState> PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_length) {
  std::lock_guard lock(mu_);
  const int64_t limit = std::min<int64_t>(max_length, static_cast<int64_t>(tokens.size()));
  Node* best = nullptr;
  Node* n = root_.get();
  while (true) {
    if (n->snapshot && n->depth <= limit) best = n;
    if (n->depth >= limit) break;
    auto it = n->children.find(tokens[static_cast<size_t>(n->depth)]);
    if (it == n->children.end()) break;
    Node* c = it->second.get();
    // A snapshot sits at the end of its node, so only a fully matched edge can lead to one.
    if (c->depth > static_cast<int64_t>(tokens.size()) ||
        !std::equal(c->edge.begin(), c->edge.end(), tokens.begin() + n->depth))
      break;
    n = c;
  }
  if (!best) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, best->lru_pos);
  return *best->snapshot;
}

PrefixCache::Node* PrefixCache::find_or_make(std::span<const int32_t> tokens) {
  Node* n = root_.get();
  const int64_t len = static_cast<int64_t>(tokens.size());
  while (n->depth < len) {
    const int64_t d = n->depth;
    auto it = n->children.find(tokens[static_cast<size_t>(d)]);
    if (it == n->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(tokens.begin() + d, tokens.end());
      leaf->depth = len;
      leaf->parent = n;
      stats_.bytes += leaf->edge.size() * sizeof(int32_t);
      Node* raw = leaf.get();
      n->children.emplace(tokens[static_cast<size_t>(d)], std::move(leaf));
      return raw;
    }
    Node* c = it->second.get();
    const size_t max_common = std::min<size_t>(c->edge.size(), static_cast<size_t>(len - d));
    size_t common = 0;
    while (common < max_common && c->edge[common] == tokens[static_cast<size_t>(d) + common]) ++common;
    if (common == c->edge.size()) {
      n = c;
      continue;
    }
    // Split the child's edge after `common` tokens: a new middle node takes the shared part.
    auto mid = std::make_unique<Node>();
    mid->edge.assign(c->edge.begin(), c->edge.begin() + static_cast<std::ptrdiff_t>(common));
    mid->depth = d + static_cast<int64_t>(common);
    mid->parent = n;
    std::unique_ptr<Node> child = std::move(it->second);
    child->edge.erase(child->edge.begin(), child->edge.begin() + static_cast<std::ptrdiff_t>(common));
    child->parent = mid.get();
    mid->children.emplace(child->edge.front(), std::move(child));
    Node* raw = mid.get();
    it->second = std::move(mid);  // the same first token keys the middle node
    n = raw;
  }
  return n;
}

bool PrefixCache::insert(std::span<const int32_t> tokens, const HybridState& state) {
  std::lock_guard lock(mu_);
  if (state.position != static_cast<int64_t>(tokens.size()) || tokens.empty()) return false;
  const size_t need = state.bytes();
  if (need > capacity_) return false;
  {
    Node* held = find_or_make(tokens);
    if (held->snapshot) {
      lru_.splice(lru_.begin(), lru_, held->lru_pos);
      return true;
    }
  }
  // Evict before copying so the peak stays near the budget. Eviction prunes empty nodes, which
  // may include the one just found, so the node is looked up again after it.
  while (stats_.bytes + need > capacity_ && !lru_.empty()) evict_one();
  Node* n = find_or_make(tokens);
  n->snapshot = state;
  n->snapshot_bytes = n->snapshot->bytes();
  stats_.bytes += n->snapshot_bytes;
  ++stats_.entries;
  ++stats_.inserts;
  lru_.push_front(n);
  n->lru_pos = lru_.begin();
  return true;
}

void PrefixCache::evict_one() {
  Node* victim = lru_.back();
  lru_.pop_back();
  victim->snapshot.reset();
  stats_.bytes -= victim->snapshot_bytes;
  victim->snapshot_bytes = 0;
  --stats_.entries;
  ++stats_.evictions;
  prune(victim);
}

// Removes nodes that hold neither a snapshot nor children, walking up: their tokens lead nowhere.
void PrefixCache::prune(Node* n) {
  while (n != root_.get() && !n->snapshot && n->children.empty()) {
    Node* parent = n->parent;
    stats_.bytes -= n->edge.size() * sizeof(int32_t);
    parent->children.erase(n->edge.front());
    n = parent;
  }
}

std::vector<int64_t> PrefixCache::snapshot_lengths(std::span<const int32_t> tokens) const {
  std::lock_guard lock(mu_);
  std::vector<int64_t> out;
  const Node* n = root_.get();
  while (true) {
    if (n->snapshot) out.push_back(n->depth);
    if (n->depth >= static_cast<int64_t>(tokens.size())) break;
    auto it = n->children.find(tokens[static_cast<size_t>(n->depth)]);
    if (it == n->children.end()) break;
    const Node* c = it->second.get();
    if (c->depth > static_cast<int64_t>(tokens.size()) ||
        !std::equal(c->edge.begin(), c->edge.end(), tokens.begin() + n->depth))
      break;
    n = c;
  }
  return out;
}

int64_t PrefixCache::shared_prefix(std::span<const int32_t> tokens) const {
  std::lock_guard lock(mu_);
  const Node* n = root_.get();
  const int64_t len = static_cast<int64_t>(tokens.size());
  while (n->depth < len) {
    auto it = n->children.find(tokens[static_cast<size_t>(n->depth)]);
    if (it == n->children.end()) return n->depth;
    const Node* c = it->second.get();
    int64_t matched = 0;
    const int64_t most = std::min<int64_t>(static_cast<int64_t>(c->edge.size()), len - n->depth);
    while (matched < most && c->edge[static_cast<size_t>(matched)] == tokens[static_cast<size_t>(n->depth + matched)]) ++matched;
    if (matched < static_cast<int64_t>(c->edge.size())) return n->depth + matched;
    n = c;
  }
  return n->depth;
}

CacheStats PrefixCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace hanpu::serve
