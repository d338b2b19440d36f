// Token sampling from logits: greedy, or temperature with top-k then top-p (nucleus) filtering,
// in the order transformers' generate() applies them.
#include <algorithm>
#include <cmath>

#include "hanpu/model.hpp"

namespace hanpu {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Sampler::Sampler(SamplingOptions opt) : opt_(opt), rng_state_(opt.seed) {
  if (opt_.top_k < 0) throw Error("sampling: top-k " + std::to_string(opt_.top_k) + " must be >= 0");
  if (!(opt_.top_p > 0.f && opt_.top_p <= 1.f))
    throw Error("sampling: top-p " + std::to_string(opt_.top_p) + " must be in (0, 1]");
  if (std::isnan(opt_.temperature)) throw Error("sampling: temperature is NaN");
}

bool Sampler::greedy() const { return opt_.temperature <= 0.f || opt_.top_k == 1; }

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw Error("sampling: empty logits");
  if (greedy()) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const size_t n = logits.size();
  scratch_.resize(n);
  for (size_t i = 0; i < n; ++i) scratch_[i] = {logits[i] / opt_.temperature, static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = n;
  if (opt_.top_k > 0 && static_cast<size_t>(opt_.top_k) < n) {
    keep = static_cast<size_t>(opt_.top_k);
    std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(keep), scratch_.end(), by_logit);
  } else {
    std::sort(scratch_.begin(), scratch_.end(), by_logit);
  }
  // Softmax over the kept candidates (sorted, largest first), then the smallest prefix whose
  // probability reaches top_p (always at least one token).
  const float mx = scratch_[0].first;
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
  const double u = static_cast<double>(splitmix64(rng_state_) >> 11) * (1.0 / 9007199254740992.0) * sum;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += scratch_[i].first;
    if (u < acc) return scratch_[i].second;
  }
  return scratch_[keep - 1].second;
}

}  // namespace hanpu
