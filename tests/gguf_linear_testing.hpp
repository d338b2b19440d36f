// Shared check of the GGUF linear tests (test_linear_gguf.cpp, test_linear_gguf_small_blocks.cpp):
// one output row of the f32-tile prefill against fp64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace hanpu::testing {

// Row m of y (the f32 tiles: the exactly dequantized weights w [N, K] times f32 activations xr, K
// terms in f32) against the fp64 sum, plus y0's value where the call accumulated. The bound is the
// f32 dot product's: (K + 1) roundings of the magnitudes' sum, plus one of the result.
inline void expect_row_within_f32_dot_bound(const std::vector<float>& w, int64_t N, int64_t K, const std::vector<float>& xr,
                                            const float* y_row, const float* y0_row, bool accumulate) {
  for (int64_t n = 0; n < N; ++n) {
    double ref = accumulate ? y0_row[n] : 0.0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double p = static_cast<double>(w[n * K + k]) * xr[k];
      ref += p;
      mag += std::abs(p);
    }
    const double got = y_row[n];
    ASSERT_LE(std::abs(got - ref), (K + 1) * 0x1p-24 * mag + 0x1p-24 * std::abs(got)) << "col " << n;
  }
}

}  // namespace hanpu::testing
