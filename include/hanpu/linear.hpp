// Dense projections of a model (q/k/v/z/b/a/out projections, MLP, LM head): y = x W^T with the
// weight in bf16 as checkpoints ship it ([out_features, in_features], row-major, like
// torch.nn.Linear) and activations in f32.
//
// Bf16Linear is a handle so that the implementation may repack the weight once at load time into
// whatever layout its kernel wants (e.g. pairs for the bf16 dot-product instructions); callers
// never see the layout.
#pragma once

#include <cstdint>
#include <memory>

#include "hanpu/tensor.hpp"

namespace hanpu {

class Bf16Linear {
 public:
  Bf16Linear();
  /// weight: [out_features, in_features] BF16, contiguous rows. `name` is used in error messages
  /// (e.g. "model.layers.0.mlp.up_proj.weight"). The view must stay valid while this object lives
  /// unless the implementation copied it (callers keep the checkpoint mapped; that is always safe).
  Bf16Linear(TensorView weight, std::string name);
  ~Bf16Linear();
  Bf16Linear(Bf16Linear&&) noexcept;
  Bf16Linear& operator=(Bf16Linear&&) noexcept;

  int64_t in_features() const;
  int64_t out_features() const;
  const std::string& name() const;

  /// y[m, :] = x[m, :] W^T for every row m: x is [M, in_features] F32 (row stride may exceed
  /// in_features), y is [M, out_features] F32 (row stride may exceed out_features).
  /// accumulate: y += x W^T instead of y = x W^T. threads: how many threads of the shared pool to
  /// use (1 = the calling thread only). Throws hanpu::Error naming this weight on shape mismatch.
  void forward(TensorView x, TensorView y, int threads, bool accumulate = false) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hanpu
