#include "hanpu/reference.hpp"

#include <cmath>
#include <vector>

#include "la/gates.hpp"
#include "la/job.hpp"

namespace hanpu {
namespace {

double at(const TensorView& t, int64_t off) { return load_as_double(t.data, t.dtype, off); }

void load_row(const TensorView& t, int64_t b, int64_t tok, int64_t h, int64_t n, double* dst) {
  const int64_t base = offset4(t, b, tok, h, 0);
  for (int64_t d = 0; d < n; ++d) dst[d] = at(t, base + d * t.stride[3]);
}

void l2_normalize(double* x, int64_t n) {
  double ss = 0;
  for (int64_t d = 0; d < n; ++d) ss += x[d] * x[d];
  const double inv = 1.0 / std::sqrt(ss + gates::kL2NormEps);
  for (int64_t d = 0; d < n; ++d) x[d] *= inv;
}

}  // namespace

LaReference la_reference(Variant variant, const LaInputs& in, const LaOptions& opt) {
  const LaShape s = validate_la(variant, in, opt);
  const VariantTraits& tr = variant_traits(variant);
  LaReference ref{Tensor(DType::F64, {s.B, s.T, s.HV, s.V}), Tensor(DType::F64, {s.N, s.HV, s.K, s.V})};
  // Borrow make_la_job's sequence resolution with a throwaway output view of the right shape.
  LaOutputs dummy{ref.o.view(), TensorView{}};
  dummy.o.dtype = DType::F64;
  const LaJob job = make_la_job(variant, in, opt, dummy);
  const int64_t K = s.K, V = s.V;
  const double scale = opt.scale ? static_cast<double>(*opt.scale) : 1.0 / std::sqrt(static_cast<double>(K));
  double* o = ref.o.ptr<double>();
  double* ht = ref.final_state.ptr<double>();

  std::vector<double> S(static_cast<size_t>(K * V)), q(K), k(K), v(V), g(K), kS(V), e(V);
  for (int64_t n = 0; n < s.N; ++n) {
    const SeqSpan seq = job.seqs[n];
    for (int64_t hv = 0; hv < s.HV; ++hv) {
      const int64_t h = job.key_head(hv);
      for (int64_t i = 0; i < K * V; ++i) {
        S[i] = 0.0;
        if (!in.initial_state.empty()) {
          const TensorView& h0 = in.initial_state;
          S[i] = at(h0, n * h0.stride[0] + hv * h0.stride[1] + (i / V) * h0.stride[2] + (i % V) * h0.stride[3]);
        }
      }
      for (int64_t t = seq.bos; t < seq.bos + seq.len; ++t) {
        const int64_t b = seq.batch;
        load_row(in.q, b, t, h, K, q.data());
        load_row(in.k, b, t, h, K, k.data());
        load_row(in.v, b, t, hv, V, v.data());
        if (opt.qk_l2norm) {
          l2_normalize(q.data(), K);
          l2_normalize(k.data(), K);
        }
        for (int64_t d = 0; d < K; ++d) q[d] *= scale;
        const int64_t gk = tr.gate_width(K);
        for (int64_t d = 0; d < gk; ++d) {
          double raw = tr.channel_gate() ? at(in.g, offset4(in.g, b, t, hv, d)) : at(in.g, offset3(in.g, b, t, hv));
          if (opt.gate_in_kernel) {
            const bool has_a_log = !in.A_log.empty();  // optional with a lower bound (rate 1)
            const double a_log = has_a_log ? at(in.A_log, hv * in.A_log.stride[0]) : 0.0;
            double bias = 0.0;
            if (!in.dt_bias.empty()) {
              const int64_t flat = tr.channel_gate() ? hv * K + d : hv;
              bias = in.dt_bias.rank == 2 ? at(in.dt_bias, hv * in.dt_bias.stride[0] + d * in.dt_bias.stride[1])
                                          : at(in.dt_bias, flat * in.dt_bias.stride[0]);
            }
            raw = opt.lower_bound ? gates::lower_bound_gate(raw, has_a_log ? std::exp(a_log) : 1.0, bias,
                                                            static_cast<double>(*opt.lower_bound))
                                  : gates::decay_gate(raw, a_log, bias);
          }
          g[d] = raw;
        }
        const double beta =
            gates::beta_transform(at(in.beta, offset3(in.beta, b, t, hv)), opt.beta_sigmoid, opt.allow_neg_eigval);
        // S' = decay * S  (decay first), kS = k S'
        for (int64_t j = 0; j < V; ++j) kS[j] = 0.0;
        for (int64_t d = 0; d < K; ++d) {
          const double decay = std::exp(tr.channel_gate() ? g[d] : g[0]);
          double* row = &S[d * V];
          for (int64_t j = 0; j < V; ++j) {
            row[j] *= decay;
            kS[j] += k[d] * row[j];
          }
        }
        for (int64_t j = 0; j < V; ++j) e[j] = beta * (v[j] - kS[j]);
        double* orow = o + ((b * s.T + t) * s.HV + hv) * V;
        for (int64_t j = 0; j < V; ++j) orow[j] = 0.0;
        for (int64_t d = 0; d < K; ++d) {
          double* row = &S[d * V];
          for (int64_t j = 0; j < V; ++j) {
            row[j] += k[d] * e[j];
            orow[j] += q[d] * row[j];
          }
        }
      }
      std::copy(S.begin(), S.end(), ht + (n * s.HV + hv) * K * V);
    }
  }
  return ref;
}

}  // namespace hanpu
