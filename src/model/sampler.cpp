// Token sampling from logits: greedy, or temperature with top-k then top-p (nucleus) filtering,
// in the order transformers' generate() applies them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "hanpu/model.hpp"
#include "model/layer_kernels.hpp"  // simd_argmax

namespace hanpu {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// One draw from the first `keep` candidates, whose weights (unnormalized probabilities) sum to
/// `sum`: the first whose running weight passes a uniform point of [0, sum).
int32_t draw(const std::vector<std::pair<float, int32_t>>& weighted, size_t keep, double sum, uint64_t& rng_state) {
  const double u = static_cast<double>(splitmix64(rng_state) >> 11) * (1.0 / 9007199254740992.0) * sum;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += weighted[i].first;
    if (u < acc) return weighted[i].second;
  }
  return weighted[keep - 1].second;
}

}  // namespace

void apply_penalties(std::span<float> logits, std::span<const int32_t> context, size_t generated_from,
                     const SamplingOptions& opt) {
  const size_t V = logits.size();
  if (opt.repetition_penalty != 1) {
    const size_t n = opt.repetition_window < 0 ? context.size()
                                               : std::min(context.size(), static_cast<size_t>(opt.repetition_window));
    std::vector<uint8_t> seen(V, 0);
    for (size_t i = context.size() - n; i < context.size(); ++i) {
      const int32_t t = context[i];
      if (t < 0 || static_cast<size_t>(t) >= V || seen[static_cast<size_t>(t)]) continue;
      seen[static_cast<size_t>(t)] = 1;
      float& x = logits[static_cast<size_t>(t)];
      x = x > 0 ? x / opt.repetition_penalty : x * opt.repetition_penalty;
    }
  }
  if (opt.presence_penalty != 0 || opt.frequency_penalty != 0) {
    std::vector<int32_t> count(V, 0);
    for (size_t i = std::min(generated_from, context.size()); i < context.size(); ++i)
      if (context[i] >= 0 && static_cast<size_t>(context[i]) < V) ++count[static_cast<size_t>(context[i])];
    for (size_t j = 0; j < V; ++j)
      if (count[j] > 0)
        logits[j] -= static_cast<float>(count[j]) * opt.frequency_penalty + opt.presence_penalty;
  }
  for (const auto& [t, bias] : opt.logit_bias)
    if (t >= 0 && static_cast<size_t>(t) < V) logits[static_cast<size_t>(t)] += bias;
}

Sampler::Sampler(SamplingOptions opt) : opt_(opt), rng_state_(opt.seed) {
  if (opt_.top_k < 0) throw Error("sampling: top-k " + std::to_string(opt_.top_k) + " must be >= 0");
  if (!(opt_.top_p > 0.f && opt_.top_p <= 1.f))
    throw Error("sampling: top-p " + std::to_string(opt_.top_p) + " must be in (0, 1]");
  if (std::isnan(opt_.temperature)) throw Error("sampling: temperature is NaN");
}

bool Sampler::greedy() const { return opt_.temperature <= 0.f || opt_.top_k == 1; }

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw Error("sampling: empty logits");
  if (greedy()) return static_cast<int32_t>(model::simd_argmax(logits.data(), logits.size()));  // std::max_element's index
  const size_t n = logits.size();
  scratch_.resize(n);
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) {
    scratch_[i] = {logits[i] / opt_.temperature, static_cast<int32_t>(i)};
    mx = std::max(mx, scratch_[i].first);
  }
  // Candidates in order of logit, largest first; equal logits by id (a total order, so selecting
  // the top m and sorting them gives the same prefix as sorting everything).
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  auto sort_top = [&](size_t m) {
    const auto mid = scratch_.begin() + static_cast<std::ptrdiff_t>(m);
    if (m < n) std::nth_element(scratch_.begin(), mid, scratch_.end(), by_logit);
    std::sort(scratch_.begin(), mid, by_logit);
  };
  size_t keep = n;
  if (opt_.top_k > 0 && static_cast<size_t>(opt_.top_k) < n) {
    keep = static_cast<size_t>(opt_.top_k);
    sort_top(keep);
  } else if (opt_.top_p >= 1.f) {
    // No filter: every token keeps its probability and the draw needs no order. A full sort of a
    // 150K-250K vocabulary cost 17-32 ms a token (docs/SERVE.md), a third of a 0.8B model's
    // decode step on 2 cores; the draw in id order costs one exp per token.
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += (scratch_[i].first = std::exp(scratch_[i].first - mx));
    return draw(scratch_, n, sum, rng_state_);
  } else {
    // The nucleus (below) is a prefix of the sorted candidates, and its mass is known before any
    // sort: top_p of the sum over all tokens. So sort a growing top m until its prefix reaches that
    // mass. 256 candidates hold a trained model's nucleus at top_p 0.9-0.95 (tens of tokens) with
    // room to spare; each miss quadruples m, so a flat distribution ends in the full sort.
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += std::exp(scratch_[i].first - mx);
    const double reach = static_cast<double>(opt_.top_p) * total;
    for (size_t m = std::min<size_t>(n, 256);; m = std::min(n, m * 4)) {
      sort_top(m);
      double cum = 0;
      size_t cut = 0;
      for (; cut < m && cum < reach; ++cut) {
        scratch_[cut].first = std::exp(scratch_[cut].first - mx);
        cum += scratch_[cut].first;
      }
      if (cum >= reach || m == n) return draw(scratch_, std::max<size_t>(cut, 1), cum, rng_state_);
      // Not reached: the prefix's exps are redone from the logits after the next selection.
      for (size_t i = 0; i < cut; ++i) scratch_[i].first = logits[static_cast<size_t>(scratch_[i].second)] / opt_.temperature;
    }
  }
  // Softmax over the kept candidates (sorted, largest first), then the smallest prefix whose
  // probability reaches top_p (always at least one token).
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (scratch_[i].first = std::exp(scratch_[i].first - mx));
  if (opt_.top_p < 1.f) {
    double cum = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += scratch_[i].first / sum;
      if (cum >= opt_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += scratch_[i].first;
  }
  return draw(scratch_, keep, sum, rng_state_);
}

}  // namespace hanpu
