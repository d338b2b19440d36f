#include "la_testing.hpp"

#include <sstream>

namespace hanpu::testing {

std::string ProblemSpec::describe() const {
  std::ostringstream os;
  os << variant_name(variant) << " B=" << B << " T=" << T << " H=" << H << " HV=" << HV << " K=" << K << " V=" << V
     << " dtype=" << dtype_name(dtype) << " gates=" << static_cast<int>(gates) << " h0=" << initial_state
     << " l2norm=" << opt.qk_l2norm << " gate_in_kernel=" << opt.gate_in_kernel << " beta_sigmoid=" << opt.beta_sigmoid
     << " seed=" << seed;
  if (opt.lower_bound) os << " lower_bound=" << *opt.lower_bound;
  if (!seqlens.empty()) {
    os << " seqlens=";
    for (size_t i = 0; i < seqlens.size(); ++i) os << (i ? "," : "") << seqlens[i];
  }
  return os.str();
}

LaInputs Problem::inputs() const {
  LaInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  in.g = g.view();
  in.beta = beta.view();
  if (h0.defined()) in.initial_state = h0.view();
  if (cu.defined()) in.cu_seqlens = cu.view();
  if (A_log.defined()) in.A_log = A_log.view();
  if (dt_bias.defined()) in.dt_bias = dt_bias.view();
  return in;
}

Problem make_problem(const ProblemSpec& spec0) {
  Problem p;
  p.spec = spec0;
  ProblemSpec& s = p.spec;
  if (!s.seqlens.empty()) {
    s.B = 1;
    s.T = 0;
    for (int64_t l : s.seqlens) s.T += l;
  }
  const int64_t N = s.seqlens.empty() ? s.B : static_cast<int64_t>(s.seqlens.size());
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::normal_distribution<double> Nrm(0.0, 1.0);
  p.q = Tensor(s.dtype, {s.B, s.T, s.H, s.K});
  p.k = Tensor(s.dtype, {s.B, s.T, s.H, s.K});
  p.v = Tensor(s.dtype, {s.B, s.T, s.HV, s.V});
  // q, k as FLA's tests: random then L2-normalised (unless the kernel normalises them).
  for (Tensor* t : {&p.q, &p.k}) {
    const int64_t rows = t->numel() / s.K;
    std::vector<double> row(static_cast<size_t>(s.K));
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (auto& x : row) {
        x = (t == &p.k && (r & 1)) ? U(rng) : Nrm(rng);  // mix uniform [0,1) (ill-conditioned) and normal rows
        ss += x * x;
      }
      const double inv = s.opt.qk_l2norm ? 1.7 : 1.0 / std::sqrt(ss + 1e-6);
      for (int64_t d = 0; d < s.K; ++d) t->set(r * s.K + d, row[static_cast<size_t>(d)] * inv);
    }
  }
  for (int64_t i = 0; i < p.v.numel(); ++i) p.v.set(i, Nrm(rng));
  p.g = s.variant == Variant::GDN ? Tensor(DType::F32, {s.B, s.T, s.HV}) : Tensor(DType::F32, {s.B, s.T, s.HV, s.K});
  const double normalizer = U(rng) < 0.5 ? 1.0 : 10.0;
  for (int64_t i = 0; i < p.g.numel(); ++i) {
    double x;
    if (s.opt.gate_in_kernel) {
      x = Nrm(rng);  // raw pre-activation
    } else {
      x = -std::log1p(std::exp(-U(rng))) / normalizer;  // logsigmoid(U[0,1)) / n
      const double u = U(rng);
      switch (s.gates) {
        case GateRegime::kMild: break;
        case GateRegime::kStrong:
          if (u < 0.05) x = -69.0;
          break;
        case GateRegime::kMasked:
          if (u < 0.02) x = -1000.0;
          else if (u < 0.10) x = 0.0;
          break;
        case GateRegime::kZeros:
          if (u < 0.5) x = 0.0;
          break;
      }
    }
    p.g.set(i, x);
  }
  p.beta = Tensor(DType::F32, {s.B, s.T, s.HV});
  for (int64_t i = 0; i < p.beta.numel(); ++i) {
    p.beta.set(i, s.opt.beta_sigmoid ? Nrm(rng) : 2.0 * (0.0005 + 0.999 * U(rng)));  // beta in (0, 2)
  }
  if (s.initial_state) {
    p.h0 = Tensor(DType::F32, {N, s.HV, s.K, s.V});
    for (int64_t i = 0; i < p.h0.numel(); ++i) p.h0.set(i, Nrm(rng));
  }
  if (!s.seqlens.empty()) {
    p.cu = Tensor(DType::I64, {N + 1});
    int64_t acc = 0;
    p.cu.set(0, 0);
    for (int64_t n = 0; n < N; ++n) p.cu.set(n + 1, acc += s.seqlens[static_cast<size_t>(n)]);
  }
  if (s.opt.gate_in_kernel) {
    p.A_log = Tensor(DType::F32, {s.HV});
    for (int64_t i = 0; i < s.HV; ++i) p.A_log.set(i, std::log(1.0 + 15.0 * U(rng)));  // log U(1,16)
    p.dt_bias = s.variant == Variant::GDN ? Tensor(DType::F32, {s.HV}) : Tensor(DType::F32, {s.HV * s.K});
    for (int64_t i = 0; i < p.dt_bias.numel(); ++i) p.dt_bias.set(i, Nrm(rng));
  }
  return p;
}

double nmse(const Tensor& x, const Tensor& ref) {
  if (x.shape() != ref.shape()) return INFINITY;
  double num = 0, den = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double a = x.get(i), r = ref.get(i);
    if (!std::isfinite(a)) return INFINITY;
    num += (a - r) * (a - r);
    den += r * r;
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return num / den;
}

Accuracy run_and_compare(const Problem& p, const LaReference& ref, const ExecOptions& ex) {
  const LaResult r = la_prefill_alloc(p.spec.variant, p.inputs(), p.spec.opt, ex);
  return {nmse(r.o, ref.o), nmse(r.final_state, ref.final_state)};
}

}  // namespace hanpu::testing
