// LaJob: a validated linear-attention problem in the form the kernels consume. Built once per
// call from the public LaInputs/LaOptions; everything a kernel needs to address any row of any
// tensor, with the sequences resolved (fixed-length batch or cu_seqlens).
#pragma once

#include <vector>

#include "hanpu/la.hpp"

namespace hanpu {

/// One sequence: tokens [bos, bos+len) of batch row `batch`; its state is initial_state[index].
struct SeqSpan {
  int64_t batch = 0;
  int64_t bos = 0;
  int64_t len = 0;
};

struct LaJob {
  LaShape shape;
  LaOptions opt;
  float scale = 1.f;
  int64_t group = 1;  // HV / H: value head hv reads key head hv / group
  LaInputs in;
  LaOutputs out;
  std::vector<SeqSpan> seqs;
  /// The head-fused GDN grams run on the raw bf16 q/k rows with bf16 dot products
  /// (ExecOptions::bf16_dot, set by the backend when the inputs and the CPU allow it).
  bool bf16_grams = false;
  /// bf16 terms per f32 operand of the engine's AMX GEMMs (ExecOptions::amx; cpu/la_amx.hpp):
  /// 0 = the f32 GEMMs, 1 = rounded, 2 = hi + lo. Only with bf16_grams (the staged bf16 rows).
  int amx_terms = 0;

  Variant variant() const { return shape.variant; }
  const VariantTraits& traits() const { return variant_traits(shape.variant); }
  int64_t key_head(int64_t hv) const { return hv / group; }
};

/// Validates inputs and outputs (throws hanpu::Error naming the tensor) and resolves sequences.
LaJob make_la_job(Variant variant, const LaInputs& in, const LaOptions& opt, const LaOutputs& out);

/// Element offset of [b, t, h, d] in a rank-4 view (or [b, t, h] when rank 3).
inline int64_t offset4(const TensorView& t, int64_t b, int64_t tok, int64_t h, int64_t d) {
  return b * t.stride[0] + tok * t.stride[1] + h * t.stride[2] + d * t.stride[3];
}
inline int64_t offset3(const TensorView& t, int64_t b, int64_t tok, int64_t h) {
  return b * t.stride[0] + tok * t.stride[1] + h * t.stride[2];
}

}  // namespace hanpu
