// The argument checks and trivial cases every linear layer's forward() shares (Bf16Linear,
// Int8Linear): x [M, K] and y [M, N] F32 with unit column stride, errors naming the layer.
#pragma once

#include <algorithm>
#include <optional>
#include <string>

#include "hanpu/tensor.hpp"

namespace hanpu::cpu {

struct LinearCall {
  const float* x;
  float* y;
  int64_t M, ldx, ldy;
};

/// Throws hanpu::Error naming `layer` when x or y has the wrong dtype, shape or strides, or no
/// data. Returns nothing when no kernel needs to run: M = 0 or N = 0, or K = 0 (then y is set to
/// zero unless accumulating: the empty sum).
inline std::optional<LinearCall> begin_linear_call(const std::string& layer, int64_t K, int64_t N, TensorView x,
                                                   TensorView y, bool accumulate) {
  if (x.dtype != DType::F32 || x.rank != 2 || x.shape[1] != K || x.stride[1] != 1 || x.stride[0] < K)
    throw Error(layer + ": input must be F32 [M, " + std::to_string(K) + "] with unit column stride and row stride >= " +
                std::to_string(K) + ", got " + std::string(dtype_name(x.dtype)) + " " + x.shape_str());
  if (y.dtype != DType::F32 || y.rank != 2 || y.shape[0] != x.shape[0] || y.shape[1] != N || y.stride[1] != 1 ||
      y.stride[0] < N)
    throw Error(layer + ": output must be F32 [" + std::to_string(x.shape[0]) + ", " + std::to_string(N) +
                "] with unit column stride and row stride >= " + std::to_string(N) + ", got " +
                std::string(dtype_name(y.dtype)) + " " + y.shape_str());
  const int64_t M = x.shape[0];
  if (M == 0 || N == 0) return std::nullopt;
  if (y.data == nullptr || (K > 0 && x.data == nullptr))
    throw Error(layer + ": forward on a view without data (input " + (x.data ? "set" : "null") + ", output " +
                (y.data ? "set" : "null") + ")");
  LinearCall call{static_cast<const float*>(x.data), static_cast<float*>(y.data), M, x.stride[0], y.stride[0]};
  if (K == 0) {  // the empty sum
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m) std::fill(call.y + m * call.ldy, call.y + m * call.ldy + N, 0.f);
    return std::nullopt;
  }
  return call;
}

}  // namespace hanpu::cpu
