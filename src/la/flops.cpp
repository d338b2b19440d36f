#include "hanpu/la.hpp"

namespace hanpu {

// Multiply-adds per chunk of C tokens for one value head in the GEMM-first form, counting only
// what the math needs (exact triangles):
//   K K^T (strictly lower) C(C-1)/2 K,  Q K^T (lower incl.) C(C+1)/2 K,
//   K S and Q S                       2 C K V,
//   solve (I+A) E = X                 C(C-1)/2 V,
//   P E (lower incl.)                 C(C+1)/2 V,
//   state update K^T E                C K V.
// KDA evaluates the same products (its per-channel decays are element-wise work on top).
// For K = V = 128, C = 64 this is 65 536 MACs = 131 072 FLOP per token (below the 180 kFLOP
// FLA-style count that also forms W and U explicitly).
double la_flops_per_token_head(Variant, int64_t K, int64_t V, int64_t C) {
  const double c = static_cast<double>(C), k = static_cast<double>(K), v = static_cast<double>(V);
  const double tri_strict = c * (c - 1) / 2, tri_incl = c * (c + 1) / 2;
  const double macs = tri_strict * k + tri_incl * k + 3 * c * k * v + tri_strict * v + tri_incl * v;
  return 2.0 * macs / c;
}

}  // namespace hanpu
