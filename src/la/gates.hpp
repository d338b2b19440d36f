// Scalar input transforms FLA can apply in kernel (fla/ops/*/gate.py, fla/modules/l2norm.py), templated on the
// float type so that the fp64 reference and the fp32 kernels compute the same formulas.
#pragma once

#include <cmath>

namespace hanpu::gates {

/// Triton's softplus: x itself above 20 (where log1p(exp(x)) == x in fp32).
template <class T>
inline T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

template <class T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

/// g = -exp(A_log) * softplus(raw + dt_bias), always <= 0 (GDN per head, KDA per channel).
template <class T>
inline T decay_gate(T raw, T a_log, T dt_bias) {
  return -std::exp(a_log) * softplus(raw + dt_bias);
}

/// The lower-bounded KDA gate: lower_bound * sigmoid(rate * (raw + dt_bias)), in
/// (lower_bound, 0) for a negative lower_bound; rate is exp(A_log), or 1 without A_log
/// (FLA's naive_kda_lowerbound_gate, fla/ops/kda/gate.py).
template <class T>
inline T lower_bound_gate(T raw, T rate, T dt_bias, T lower_bound) {
  return lower_bound * sigmoid(rate * (raw + dt_bias));
}

/// beta after the optional in-kernel sigmoid (2 sigmoid with allow_neg_eigval).
template <class T>
inline T beta_transform(T raw, bool beta_sigmoid, bool allow_neg_eigval) {
  if (!beta_sigmoid) return raw;
  const T s = sigmoid(raw);
  return allow_neg_eigval ? T(2) * s : s;
}

/// FLA's l2norm epsilon: x / sqrt(sum x^2 + 1e-6).
constexpr double kL2NormEps = 1e-6;

}  // namespace hanpu::gates
