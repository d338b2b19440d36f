// Shared helpers of the LA tests: random problems drawn the way FLA's tests draw them, and the
// normalized MSE metric of the issue: ||x - ref||^2 / ||ref||^2.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hanpu/la.hpp"
#include "hanpu/reference.hpp"

namespace hanpu::testing {

enum class GateRegime {
  kMild,     // logsigmoid(U[0,1)) / n, n in {1, 10}: typical decays
  kStrong,   // some tokens at -69 (FLA's gate_logit_normalizer = 0.01 extreme)
  kMasked,   // some entries at -1000 (KDA varlen masks) and exact zeros
  kZeros,    // many exact-zero gates (no decay)
};

struct ProblemSpec {
  Variant variant = Variant::GDN;
  int64_t B = 1, T = 64, H = 1, HV = 1, K = 64, V = 64;
  std::vector<int64_t> seqlens;  // non-empty: varlen with these lengths (then B = 1, T = sum)
  DType dtype = DType::F32;      // q, k, v (g, beta, state stay F32)
  GateRegime gates = GateRegime::kMild;
  bool initial_state = true;
  LaOptions opt;
  uint64_t seed = 1;
  std::string describe() const;
};

/// Owns the input tensors of a problem; inputs() gives the views.
struct Problem {
  ProblemSpec spec;
  Tensor q, k, v, g, beta, h0, cu, A_log, dt_bias;
  LaInputs inputs() const;
};

Problem make_problem(const ProblemSpec& spec);

/// ||x - ref||^2 / ||ref||^2 over all elements (any dtypes, same shape). NaN/inf in x or a shape
/// mismatch give +inf.
double nmse(const Tensor& x, const Tensor& ref);

struct Accuracy {
  double o = 0, state = 0;
};
Accuracy run_and_compare(const Problem& p, const LaReference& ref, const ExecOptions& ex);

}  // namespace hanpu::testing
