// The argument checks and trivial cases every linear layer's forward() shares (Bf16Linear,
// Int8Linear): x [M, K] and y [M, N] F32 with unit column stride, errors naming the layer.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "cpu/engine_impl.hpp"
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

/// fn(t, workspace of part t) for t in [0, n) on the engine's pool (n <= 1: on the caller).
inline void run_on_pool(Engine& engine, int n, const std::function<void(int, Workspace&)>& fn) {
  engine.impl().run(std::max(n, 1), fn);
}

/// Weight rows per chunk of a few-rows (decode) call: 128 KiB of bf16 at K = 1024, about 3900
/// chunks for a 248320-row LM head, so one fetch-add per chunk costs nothing.
constexpr int64_t kDecodeChunkColumns = 64;

/// Runs body(n0, n1) over columns [0, N) in chunks of `chunk` that up to `threads` workers take
/// from a shared counter, so a worker slowed by another process or a VM's steal time takes fewer
/// chunks instead of holding the whole call up (a static split waits for the slowest half). Each
/// output is still computed whole by one worker, with the same arithmetic: the result does not
/// depend on which worker or how many.
template <class Body>
void run_in_column_chunks(Engine& engine, int threads, int64_t N, int64_t chunk, const Body& body) {
  const int64_t chunks = (N + chunk - 1) / chunk;
  const int nt = static_cast<int>(std::min<int64_t>(threads, chunks));
  std::atomic<int64_t> next{0};
  run_on_pool(engine, nt, [&](int, Workspace&) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed))
      body(c * chunk, std::min(N, (c + 1) * chunk));
  });
}

}  // namespace hanpu::cpu
