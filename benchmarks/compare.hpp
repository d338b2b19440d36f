// Error measure shared by the benchmark programs in this folder.
#pragma once

#include <cstddef>

namespace hanpu::bench {

/// sum (a - ref)^2 / sum ref^2 (0 when ref is all zeros).
inline double nmse(const float* a, const float* ref, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    e += d * d;
    r += static_cast<double>(ref[i]) * ref[i];
  }
  return r > 0 ? e / r : 0;
}

}  // namespace hanpu::bench
