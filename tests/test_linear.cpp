// Bf16Linear against an fp64 reference: odd shapes, strided inputs and outputs, accumulate, 1 and 2
// threads, every backend this machine can run and every precision mode; exactness of the default
// mode on inputs whose result is exactly representable; error messages for bad shapes and dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hanpu/linear.hpp"

namespace {

using hanpu::Bf16Linear;
using hanpu::DType;
using hanpu::Error;
using hanpu::LinearBackend;
using hanpu::LinearPrecision;
using hanpu::TensorView;

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

std::vector<LinearBackend> backends() {
  std::vector<LinearBackend> b{LinearBackend::kPortable};
  if (hanpu::linear_amx_available()) b.push_back(LinearBackend::kAmx);
  if (hanpu::linear_avx512bf16_available()) b.push_back(LinearBackend::kAvx512Bf16);
  return b;
}

// Worst-case error bound per output, relative to sum_k |x w|: the activation representation error
// of the mode (1 term: bf16 rounding 2^-8; 2 terms: truncation then rounding, < 2^-15; 3 terms:
// exact) plus f32 accumulation over every product (terms x K of them, a few more for the final
// adds). A correct kernel never exceeds it; a dropped term, wrong index or wrong tile does.
double bound(LinearPrecision p, LinearBackend b, int64_t K) {
  if (b == LinearBackend::kPortable) p = LinearPrecision::kExact;  // the portable path is always exact
  if (b == LinearBackend::kAvx512Bf16 && p != LinearPrecision::kBf16) p = LinearPrecision::kExact;  // f32 kernel
  const int terms = p == LinearPrecision::kExact ? 3 : p == LinearPrecision::kBf16x2 ? 2 : 1;
  const double repr = p == LinearPrecision::kExact ? 0 : p == LinearPrecision::kBf16x2 ? std::ldexp(1.0, -15)
                                                                                       : std::ldexp(1.0, -8);
  return repr + static_cast<double>(terms * K + 8) * kU;
}

struct Problem {
  int64_t M, K, N;
  std::vector<uint16_t> w;      // [N, K] bf16
  std::vector<float> x;         // [M, ldx]
  int64_t ldx;
  std::vector<double> ref;      // [M, N] = x W^T in fp64
  std::vector<double> abs_sum;  // [M, N] = |x| |W|^T
};

Problem make_problem(int64_t M, int64_t K, int64_t N, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nrm(0.f, 1.f);
  Problem p{M, K, N, {}, {}, K + 3, {}, {}};
  p.w.resize(static_cast<size_t>(N * K));
  for (auto& v : p.w) v = hanpu::f32_to_bf16(0.05f * nrm(rng));
  p.x.assign(static_cast<size_t>(M * p.ldx), std::nanf(""));  // the row padding must never be read
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) p.x[static_cast<size_t>(m * p.ldx + k)] = nrm(rng);
  p.ref.assign(static_cast<size_t>(M * N), 0.0);
  p.abs_sum.assign(static_cast<size_t>(M * N), 0.0);
  std::vector<double> wd(static_cast<size_t>(N * K));
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = hanpu::bf16_to_f32(p.w[i]);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = &p.x[static_cast<size_t>(m * p.ldx)];
    for (int64_t n = 0; n < N; ++n) {
      const double* wr = &wd[static_cast<size_t>(n * K)];
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += xr[k] * wr[k];
        a += std::fabs(xr[k] * wr[k]);
      }
      p.ref[static_cast<size_t>(m * N + n)] = s;
      p.abs_sum[static_cast<size_t>(m * N + n)] = a;
    }
  }
  return p;
}

// Runs one forward (y strided, optionally accumulating onto a known start) and checks every output.
void check(const Problem& p, const Bf16Linear& lin, LinearPrecision prec, int threads, bool accumulate) {
  const int64_t ldy = p.N + 5;
  std::vector<float> y(static_cast<size_t>(p.M * ldy), 0.f);
  std::vector<float> start(y.size());
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (auto& v : start) v = uni(rng);
  y = start;
  TensorView xv = TensorView::contiguous(const_cast<float*>(p.x.data()), DType::F32, {p.M, p.K});
  xv.stride[0] = p.ldx;
  TensorView yv = TensorView::contiguous(y.data(), DType::F32, {p.M, p.N});
  yv.stride[0] = ldy;
  lin.forward(xv, yv, threads, accumulate, prec);
  const double tol = bound(prec, lin.backend(), p.K);
  const double tol_rounding = bound(LinearPrecision::kExact, LinearBackend::kAmx, p.K);
  const std::string what = std::string(hanpu::linear_backend_name(lin.backend())) + "/" +
                           hanpu::linear_precision_name(prec) + " M=" + std::to_string(p.M) + " K=" +
                           std::to_string(p.K) + " N=" + std::to_string(p.N) + " threads=" +
                           std::to_string(threads) + (accumulate ? " accumulate" : "");
  int failures = 0;
  for (int64_t m = 0; m < p.M; ++m) {
    for (int64_t n = 0; n < ldy; ++n) {
      const size_t i = static_cast<size_t>(m * ldy + n);
      if (n >= p.N) {  // the row padding of y is never written
        ASSERT_EQ(y[i], start[i]) << what << " wrote padding at m=" << m << " n=" << n;
        continue;
      }
      const size_t r = static_cast<size_t>(m * p.N + n);
      const double want = p.ref[r] + (accumulate ? start[i] : 0.0);
      // Accumulating, the start value is one more summand of the f32 chain: the rounding part of
      // the bound applies to it too.
      const double allowed = tol * p.abs_sum[r] + (accumulate ? (tol_rounding + 2 * kU) * std::fabs(start[i]) : 0);
      if (!(std::fabs(y[i] - want) <= allowed) && ++failures <= 5)
        ADD_FAILURE() << what << ": y[" << m << "," << n << "] = " << y[i] << ", fp64 reference " << want
                      << ", allowed error " << allowed;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// The auto backend takes the AVX512-BF16 kernels only where VDPBF16PS gives clearly more
// multiply-adds per second than the f32 FMA (a Xeon whose AMX a hypervisor hides ran them at 0.55x
// the f32 kernel); the measured ratio is a plausible rate, not a placeholder.
TEST(LinearBackends, AutoTakesBf16DotsOnlyWhereTheyAreFaster) {
  std::vector<uint16_t> w(static_cast<size_t>(8 * 8), hanpu::f32_to_bf16(1.f));
  const Bf16Linear lin(TensorView::contiguous(w.data(), DType::BF16, {8, 8}), "w");
  const double ratio = hanpu::linear_bf16dot_mac_ratio();
  if (hanpu::linear_avx512bf16_available()) {
    EXPECT_GT(ratio, 0.1);
    EXPECT_LT(ratio, 8.0);
  }
  const LinearBackend expected = hanpu::linear_amx_available() ? LinearBackend::kAmx
                                 : hanpu::linear_avx512bf16_available() && ratio >= 1.5 ? LinearBackend::kAvx512Bf16
                                                                                        : LinearBackend::kPortable;
  EXPECT_EQ(lin.backend(), expected) << "VDPBF16PS multiply-add ratio " << ratio;
  EXPECT_EQ(hanpu::linear_auto_backend(), expected);
}

TEST(Linear, MatchesFp64ReferenceOnOddShapes) {
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t M : {1, 3, 17, 64})
    for (int64_t K : {1, 7, 64, 1000, 1024})
      for (int64_t N : {1, 5, 33, 1027}) shapes.push_back({M, K, N});
  // 513 rows cross the AMX GEMM's 64-row passes and end in a one-row pass.
  shapes.push_back({513, 1000, 1027});
  shapes.push_back({513, 7, 33});
  shapes.push_back({513, 1024, 5});
  // K = 16385: the avx512bf16 GEMM's row passes (8 MiB of rounded activations, at least 256 rows)
  // are 256 rows here, so 260 rows cross one; the odd K ends in a half pair.
  shapes.push_back({260, 16385, 20});
  uint64_t seed = 1;
  for (const auto& [M, K, N] : shapes) {
    const Problem p = make_problem(M, K, N, seed++);
    TensorView wv = TensorView::contiguous(const_cast<uint16_t*>(p.w.data()), DType::BF16, {N, K});
    for (LinearBackend b : backends()) {
      const Bf16Linear lin(wv, "test.weight", b);
      for (LinearPrecision prec : {LinearPrecision::kExact, LinearPrecision::kBf16x2, LinearPrecision::kBf16}) {
        if (b == LinearBackend::kPortable && prec != LinearPrecision::kExact) continue;  // ignored there
        for (int threads : {1, 2}) check(p, lin, prec, threads, /*accumulate=*/threads == 2);
        if (M == 17 || M == 1) check(p, lin, prec, 1, /*accumulate=*/true);
      }
      if (testing::Test::HasFailure()) return;
    }
  }
}

// One-hot weights (w[n, k] = 1 for k = n mod K) make y[m, n] = x[m, n mod K]: the exact mode must
// reproduce every f32 activation bit for bit (three bf16 terms hold 24 significant bits), bf16
// mode must give exactly the bf16 rounding, and bf16x2 must differ from x by less than 2^-15.
TEST(Linear, ExactModeReproducesF32ActivationsBitForBit) {
  for (int64_t M : {1, 2, 5, 40}) {
    const int64_t K = 1000, N = 1027;
    std::vector<uint16_t> w(static_cast<size_t>(N * K), 0);
    for (int64_t n = 0; n < N; ++n) w[static_cast<size_t>(n * K + n % K)] = hanpu::f32_to_bf16(1.f);
    std::vector<float> x(static_cast<size_t>(M * K));
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> uni(-3.f, 3.f);
    for (auto& v : x) v = uni(rng) * std::ldexp(1.f, static_cast<int>(rng() % 40) - 20);
    std::vector<float> y(static_cast<size_t>(M * N));
    TensorView wv = TensorView::contiguous(w.data(), DType::BF16, {N, K});
    TensorView xv = TensorView::contiguous(x.data(), DType::F32, {M, K});
    TensorView yv = TensorView::contiguous(y.data(), DType::F32, {M, N});
    for (LinearBackend b : backends()) {
      const Bf16Linear lin(wv, "onehot.weight", b);
      for (LinearPrecision prec : {LinearPrecision::kExact, LinearPrecision::kBf16x2, LinearPrecision::kBf16}) {
        lin.forward(xv, yv, 2, false, prec);
        const bool exact = prec == LinearPrecision::kExact || b == LinearBackend::kPortable ||
                           (b == LinearBackend::kAvx512Bf16 && prec == LinearPrecision::kBf16x2);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            const float got = y[static_cast<size_t>(m * N + n)], xin = x[static_cast<size_t>(m * K + n % K)];
            const std::string what = std::string(hanpu::linear_backend_name(b)) + "/" +
                                     hanpu::linear_precision_name(prec) + " M=" + std::to_string(M) +
                                     " m=" + std::to_string(m) + " n=" + std::to_string(n);
            if (exact) ASSERT_EQ(got, xin) << what;
            else if (prec == LinearPrecision::kBf16)
              ASSERT_EQ(got, hanpu::bf16_to_f32(hanpu::f32_to_bf16(xin))) << what;
            else
              ASSERT_LE(std::fabs(got - xin), std::ldexp(std::fabs(xin), -15)) << what;
          }
        }
      }
    }
  }
}

template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no hanpu::Error thrown";
  } catch (const Error& e) {
    for (const auto& s : parts) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << " lacks " << s;
  }
}

// Stacked weights give exactly the outputs of the separate layers, side by side.
TEST(Linear, StackedWeightsEqualSeparateLayers) {
  const int64_t K = 200;
  const std::vector<int64_t> outs{48, 5, 37};
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nrm(0.f, 1.f);
  std::vector<std::vector<uint16_t>> ws;
  std::vector<TensorView> views;
  for (int64_t n : outs) {
    ws.emplace_back(static_cast<size_t>(n * K));
    for (auto& v : ws.back()) v = hanpu::f32_to_bf16(nrm(rng));
  }
  for (size_t i = 0; i < outs.size(); ++i) views.push_back(TensorView::contiguous(ws[i].data(), DType::BF16, {outs[i], K}));
  for (int64_t M : {1, 20}) {
    std::vector<float> x(static_cast<size_t>(M * K));
    for (auto& v : x) v = nrm(rng);
    const TensorView xv = TensorView::contiguous(x.data(), DType::F32, {M, K});
    for (LinearBackend b : backends()) {
      const Bf16Linear stacked(views, "stacked", b);
      ASSERT_EQ(stacked.out_features(), 90);
      std::vector<float> ys(static_cast<size_t>(M * 90));
      stacked.forward(xv, TensorView::contiguous(ys.data(), DType::F32, {M, 90}), 2);
      int64_t col = 0;
      for (size_t i = 0; i < outs.size(); ++i) {
        const Bf16Linear one(views[i], "one", b);
        std::vector<float> y(static_cast<size_t>(M * outs[i]));
        one.forward(xv, TensorView::contiguous(y.data(), DType::F32, {M, outs[i]}), 1);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < outs[i]; ++n)
            ASSERT_EQ(ys[static_cast<size_t>(m * 90 + col + n)], y[static_cast<size_t>(m * outs[i] + n)])
                << hanpu::linear_backend_name(b) << " M=" << M << " weight " << i << " m=" << m << " n=" << n;
        col += outs[i];
      }
    }
  }
  std::vector<uint16_t> bad(30);
  expect_error([&] { Bf16Linear({views[0], TensorView::contiguous(bad.data(), DType::BF16, {3, 10})}, "mlp.gate_up"); },
               {"mlp.gate_up", "stacked weight 1", "in_features 10", "200"});
  expect_error([&] { Bf16Linear(std::vector<TensorView>{}, "mlp.gate_up"); }, {"mlp.gate_up", "no weights"});
}

TEST(Linear, EmptyShapes) {
  std::vector<uint16_t> w(6, hanpu::f32_to_bf16(1.f));
  for (LinearBackend b : backends()) {
    // K = 0: y = 0 (or unchanged when accumulating).
    const Bf16Linear lin0(TensorView::contiguous(w.data(), DType::BF16, {3, 0}), "k0", b);
    std::vector<float> x(2), y(6, 5.f);
    lin0.forward(TensorView::contiguous(x.data(), DType::F32, {2, 0}),
                 TensorView::contiguous(y.data(), DType::F32, {2, 3}), 2, true);
    EXPECT_EQ(y[0], 5.f);
    lin0.forward(TensorView::contiguous(x.data(), DType::F32, {2, 0}),
                 TensorView::contiguous(y.data(), DType::F32, {2, 3}), 2);
    for (float v : y) EXPECT_EQ(v, 0.f);
    // M = 0: nothing happens.
    const Bf16Linear lin(TensorView::contiguous(w.data(), DType::BF16, {3, 2}), "m0", b);
    lin.forward(TensorView::contiguous(x.data(), DType::F32, {0, 2}),
                TensorView::contiguous(y.data(), DType::F32, {0, 3}), 1);
  }
}

TEST(Linear, BadShapesAndDtypesNameTheWeight) {
  std::vector<uint16_t> w(12, 0);
  std::vector<float> wf(12, 0.f), x(64, 0.f), y(64, 0.f);
  expect_error([&] { Bf16Linear(TensorView::contiguous(wf.data(), DType::F32, {3, 4}), "layer.w"); },
               {"layer.w", "BF16", "F32", "[3,4]"});
  expect_error([&] { Bf16Linear(TensorView::contiguous(w.data(), DType::BF16, {12}), "layer.w"); },
               {"layer.w", "2-D", "[12]"});
  TensorView strided = TensorView::contiguous(w.data(), DType::BF16, {3, 2});
  strided.stride[0] = 4;
  expect_error([&] { Bf16Linear(strided, "layer.w"); }, {"layer.w", "contiguous"});
  for (LinearBackend b : backends()) {
    const Bf16Linear lin(TensorView::contiguous(w.data(), DType::BF16, {3, 4}), "model.up.weight", b);
    EXPECT_EQ(lin.in_features(), 4);
    EXPECT_EQ(lin.out_features(), 3);
    expect_error([&] { lin.forward(TensorView::contiguous(x.data(), DType::F32, {2, 5}),
                                   TensorView::contiguous(y.data(), DType::F32, {2, 3}), 1); },
                 {"model.up.weight", "input", "[M, 4]", "[2,5]"});
    expect_error([&] { lin.forward(TensorView::contiguous(x.data(), DType::BF16, {2, 4}),
                                   TensorView::contiguous(y.data(), DType::F32, {2, 3}), 1); },
                 {"model.up.weight", "input", "F32", "BF16"});
    expect_error([&] { lin.forward(TensorView::contiguous(x.data(), DType::F32, {2, 4}),
                                   TensorView::contiguous(y.data(), DType::F32, {2, 4}), 1); },
                 {"model.up.weight", "output", "[2, 3]", "[2,4]"});
    expect_error([&] { lin.forward(TensorView::contiguous(x.data(), DType::F32, {2, 4}),
                                   TensorView::contiguous(y.data(), DType::F32, {3, 3}), 1); },
                 {"model.up.weight", "output", "[2, 3]", "[3,3]"});
    expect_error([&] { lin.forward(TensorView::contiguous(x.data(), DType::F32, {2, 4}),
                                   TensorView::contiguous(y.data(), DType::F64, {2, 3}), 1); },
                 {"model.up.weight", "output", "F64"});
    expect_error([&] { lin.forward(TensorView::contiguous(nullptr, DType::F32, {2, 4}),
                                   TensorView::contiguous(y.data(), DType::F32, {2, 3}), 1); },
                 {"model.up.weight", "without data"});
    TensorView xt = TensorView::contiguous(x.data(), DType::F32, {2, 4});
    xt.stride = {1, 2};  // transposed: columns not unit-stride
    expect_error([&] { lin.forward(xt, TensorView::contiguous(y.data(), DType::F32, {2, 3}), 1); },
                 {"model.up.weight", "unit column stride"});
  }
  expect_error([&] {
    std::vector<float> a(4), c(4);
    Bf16Linear().forward(TensorView::contiguous(a.data(), DType::F32, {1, 4}),
                         TensorView::contiguous(c.data(), DType::F32, {1, 4}), 1);
  }, {"empty"});
  if (!hanpu::linear_amx_available())
    expect_error([&] { Bf16Linear(TensorView::contiguous(w.data(), DType::BF16, {3, 4}), "layer.w", LinearBackend::kAmx); },
                 {"layer.w", "AMX"});
  expect_error([] { hanpu::linear_precision_from_name("fp8"); }, {"fp8", "exact"});
  expect_error([] { hanpu::linear_backend_from_name("gpu"); }, {"gpu", "portable"});
}

}  // namespace

// ---- Int8Linear ------------------------------------------------------------------------------

namespace {

// The quantization rule itself, checked per element: scale = max|w| / 127 over each group,
// |w - q scale| <= scale / 2 (round to nearest) up to f32 rounding, q in [-127, 127].
void check_quantization(const Problem& p, const hanpu::Int8Linear& lin) {
  const int64_t G = lin.group(), groups = (p.K + G - 1) / G;
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t k = g * G; k < std::min(p.K, (g + 1) * G); ++k)
        amax = std::max(amax, std::fabs(hanpu::bf16_to_f32(p.w[static_cast<size_t>(n * p.K + k)])));
      const float scale = lin.scales()[n * groups + g];
      ASSERT_EQ(scale, amax / 127.0f) << "n=" << n << " g=" << g;
      for (int64_t k = g * G; k < std::min(p.K, (g + 1) * G); ++k) {
        const double w = hanpu::bf16_to_f32(p.w[static_cast<size_t>(n * p.K + k)]);
        ASSERT_LE(std::abs(static_cast<int>(lin.quantized()[n * p.K + k])), 127);
        // Half a step, plus the f32 roundings of w / scale and of q * scale (u each, on |w|).
        ASSERT_LE(std::fabs(w - lin.weight(n, k)), 0.5 * scale + 3 * kU * (std::fabs(w) + scale)) << "n=" << n << " k=" << k;
      }
    }
}

}  // namespace

// Every output against fp64 sums of the dequantized weights (the kernel forms q * scale in f32, so
// the only error left is f32 accumulation: the exact mode's bound), on both kernel forms (few rows:
// dot products; 16 rows and more: panels), group sizes that do and do not divide K, strided x and
// y, accumulate, 1 and 2 threads.
TEST(LinearInt8, MatchesFp64ReferenceOfTheQuantizedWeights) {
  uint64_t seed = 100;
  for (int64_t M : {1, 3, 17, 40})
    for (int64_t K : {1, 7, 64, 100, 1030})
      for (int64_t N : {1, 5, 37})
        for (int64_t G : {1, 16, 32, 64, 128}) {
          Problem p = make_problem(M, K, N, seed++);
          TensorView wv = TensorView::contiguous(p.w.data(), DType::BF16, {N, K});
          const hanpu::Int8Linear lin(wv, "test.int8", G);
          ASSERT_EQ(lin.bytes(), static_cast<size_t>(N * K + N * ((K + G - 1) / G) * 4));
          check_quantization(p, lin);
          // The reference of the quantized weights.
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double s = 0, a = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double prod = static_cast<double>(p.x[static_cast<size_t>(m * p.ldx + k)]) * lin.weight(n, k);
                s += prod;
                a += std::fabs(prod);
              }
              p.ref[static_cast<size_t>(m * N + n)] = s;
              p.abs_sum[static_cast<size_t>(m * N + n)] = a;
            }
          for (int threads : {1, 2})
            for (bool acc : {false, true}) {
              const int64_t ldy = N + 5;
              std::vector<float> y(static_cast<size_t>(M * ldy), 0.25f), start = y;
              TensorView xv = TensorView::contiguous(p.x.data(), DType::F32, {M, K});
              xv.stride[0] = p.ldx;
              TensorView yv = TensorView::contiguous(y.data(), DType::F32, {M, N});
              yv.stride[0] = ldy;
              lin.forward(xv, yv, threads, acc);
              const double tol = bound(LinearPrecision::kExact, LinearBackend::kPortable, K);
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < ldy; ++n) {
                  const size_t i = static_cast<size_t>(m * ldy + n);
                  if (n >= N) {
                    ASSERT_EQ(y[i], start[i]) << "padding written";
                    continue;
                  }
                  const size_t r = static_cast<size_t>(m * N + n);
                  const double want = p.ref[r] + (acc ? 0.25 : 0.0);
                  ASSERT_LE(std::fabs(y[i] - want), tol * p.abs_sum[r] + (acc ? 4 * kU : 0))
                      << "M=" << M << " K=" << K << " N=" << N << " G=" << G << " threads=" << threads;
                }
            }
        }
}

// LinearPrecision::kInt8 (decode rows on AVX512-VNNI, or AVX2 under HANPU_ISA=avx2 and on AVX2
// CPUs): the activations quantized per weight
// group, here independently (scale max|x| / 127, round to nearest), and the result checked against
// the fp64 sum of the two quantized operands: the kernel's only error is f32 accumulation of the
// group terms. Also: within the activations' quantization error of the f32-activation result, the
// same for every row count and thread count (batched decode equals one row), and where no int8
// dot kernel runs (or for prefill rows) kInt8 is exactly kExact.
TEST(LinearInt8, Int8ActivationsMatchTheirQuantizedReference) {
  uint64_t seed = 500;
  int checked = 0;
  for (int64_t M : {1, 2, 3, 5, 15, 16})
    for (int64_t K : {1, 7, 64, 100, 1030})
      for (int64_t G : {7, 32, 64, 128, 4096}) {
        const int64_t N = 37;
        Problem p = make_problem(M, K, N, seed++);
        const hanpu::Int8Linear lin(TensorView::contiguous(p.w.data(), DType::BF16, {N, K}), "test.int8", G);
        const int64_t groups = (K + G - 1) / G;
        TensorView xv = TensorView::contiguous(p.x.data(), DType::F32, {M, K});
        xv.stride[0] = p.ldx;
        std::vector<float> y_exact(static_cast<size_t>(M * N));
        lin.forward(xv, TensorView::contiguous(y_exact.data(), DType::F32, {M, N}), 1, false, LinearPrecision::kExact);
        const bool int8 = hanpu::Int8Linear::int8_activations_available(M);
        for (int threads : {1, 2})
          for (bool acc : {false, true}) {
            std::vector<float> y(static_cast<size_t>(M * N), 0.25f);
            lin.forward(xv, TensorView::contiguous(y.data(), DType::F32, {M, N}), threads, acc, LinearPrecision::kInt8);
            if (!int8) {
              // The same call with kExact, accumulating onto the same 0.25s.
              std::vector<float> y_same(static_cast<size_t>(M * N), 0.25f);
              lin.forward(xv, TensorView::contiguous(y_same.data(), DType::F32, {M, N}), threads, acc, LinearPrecision::kExact);
              for (size_t i = 0; i < y.size(); ++i)
                ASSERT_EQ(y[i], y_same[i]) << "kInt8 without an int8 dot kernel (or M >= 16) must be exact";
              continue;
            }
            ++checked;
            for (int64_t m = 0; m < M; ++m) {
              // This row's quantized activations.
              std::vector<double> xq(static_cast<size_t>(K)), xs(static_cast<size_t>(groups));
              for (int64_t g = 0; g < groups; ++g) {
                float amax = 0;
                for (int64_t k = g * G; k < std::min(K, (g + 1) * G); ++k)
                  amax = std::max(amax, std::fabs(p.x[static_cast<size_t>(m * p.ldx + k)]));
                const float scale = amax / 127.0f;
                xs[static_cast<size_t>(g)] = scale;
                for (int64_t k = g * G; k < std::min(K, (g + 1) * G); ++k)
                  xq[static_cast<size_t>(k)] =
                      scale > 0 ? std::clamp(std::nearbyint(p.x[static_cast<size_t>(m * p.ldx + k)] / scale), -127.f, 127.f) : 0;
              }
              for (int64_t n = 0; n < N; ++n) {
                double want = 0, mag = 0, qerr = 0;
                for (int64_t g = 0; g < groups; ++g) {
                  double dot = 0, dabs = 0;
                  for (int64_t k = g * G; k < std::min(K, (g + 1) * G); ++k) {
                    const double wq = lin.quantized()[n * K + k];
                    dot += wq * xq[static_cast<size_t>(k)];
                    dabs += std::fabs(wq * xq[static_cast<size_t>(k)]);
                    qerr += std::fabs(lin.weight(n, k)) * xs[static_cast<size_t>(g)] / 2;
                  }
                  const double ws = lin.scales()[n * groups + g] * static_cast<double>(xs[static_cast<size_t>(g)]);
                  want += ws * dot;
                  mag += ws * dabs;
                }
                const float got = y[static_cast<size_t>(m * N + n)] - (acc ? 0.25f : 0.f);
                // f32: the scale product, the conversion of each group's exact integer dot, and
                // a few-term accumulation; (groups + 20) roundings bound it.
                ASSERT_LE(std::fabs(got - want), static_cast<double>(groups + 20) * kU * (mag + (acc ? 0.25 : 0)) + 1e-30)
                    << "M=" << M << " K=" << K << " G=" << G << " m=" << m << " n=" << n << " threads=" << threads;
                // Against the f32 activations: at most half a quantization step per input.
                ASSERT_LE(std::fabs(got - y_exact[static_cast<size_t>(m * N + n)]),
                          qerr + static_cast<double>(K + groups + 20) * kU * (mag + p.abs_sum[static_cast<size_t>(m * N + n)]))
                    << "M=" << M << " K=" << K << " G=" << G;
              }
            }
            // Row-count independence: each row alone gives the same bits.
            for (int64_t m = 0; m < M && !acc && threads == 2; ++m) {
              std::vector<float> one(static_cast<size_t>(N));
              TensorView row = TensorView::contiguous(p.x.data() + m * p.ldx, DType::F32, {1, K});
              lin.forward(row, TensorView::contiguous(one.data(), DType::F32, {1, N}), 1, false, LinearPrecision::kInt8);
              for (int64_t n = 0; n < N; ++n) ASSERT_EQ(one[static_cast<size_t>(n)], y[static_cast<size_t>(m * N + n)]);
            }
          }
      }
  if (checked == 0) GTEST_SKIP() << "no int8 dot kernel here (no AVX2, or HANPU_ISA below avx2): kInt8 was checked to equal kExact";
}

// A non-finite activation makes its row's outputs NaN with kInt8 as with f32 activations (its
// group's scale is NaN), never a value from an undefined int8 conversion.
TEST(LinearInt8, Int8ActivationsPropagateNonFiniteInputs) {
  Problem p = make_problem(3, 200, 9, 77);
  const hanpu::Int8Linear lin(TensorView::contiguous(p.w.data(), DType::BF16, {9, 200}), "test.int8", 64);
  p.x[static_cast<size_t>(1 * p.ldx + 130)] = std::numeric_limits<float>::infinity();
  p.x[static_cast<size_t>(2 * p.ldx + 7)] = std::nanf("");
  TensorView xv = TensorView::contiguous(p.x.data(), DType::F32, {3, 200});
  xv.stride[0] = p.ldx;
  for (LinearPrecision prec : {LinearPrecision::kExact, LinearPrecision::kInt8}) {
    std::vector<float> y(3 * 9);
    lin.forward(xv, TensorView::contiguous(y.data(), DType::F32, {3, 9}), 1, false, prec);
    for (int64_t n = 0; n < 9; ++n) {
      const std::string what = std::string(hanpu::linear_precision_name(prec)) + " n=" + std::to_string(n);
      EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(n)])) << what;
      EXPECT_FALSE(std::isfinite(y[static_cast<size_t>(9 + n)])) << what << " (inf input)";
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(18 + n)])) << what << " (NaN input)";
    }
  }
}

TEST(LinearInt8, QuantizationErrorAndBadInput) {
  // Relative weight error of symmetric int8 with a group of 64: <= 1/254 of the group's max.
  Problem p = make_problem(1, 256, 8, 5);
  const hanpu::Int8Linear lin(TensorView::contiguous(p.w.data(), DType::BF16, {8, 256}), "w", 64);
  double err2 = 0, ref2 = 0;
  for (int64_t n = 0; n < 8; ++n)
    for (int64_t k = 0; k < 256; ++k) {
      const double w = hanpu::bf16_to_f32(p.w[static_cast<size_t>(n * 256 + k)]);
      err2 += (w - lin.weight(n, k)) * (w - lin.weight(n, k));
      ref2 += w * w;
    }
  EXPECT_LT(err2 / ref2, 1e-4);  // Gaussian weights: ~3e-5 measured
  EXPECT_GT(err2 / ref2, 0);
  // An all-zero row quantizes to zeros with scale 0, and its outputs are 0.
  std::vector<float> zeros(2 * 32, 0.f);
  const hanpu::Int8Linear z(TensorView::contiguous(zeros.data(), DType::F32, {2, 32}), "zero", 16);
  EXPECT_EQ(z.scales()[0], 0.f);
  std::vector<float> x(32, 1.f), y(2, 5.f);
  z.forward(TensorView::contiguous(x.data(), DType::F32, {1, 32}), TensorView::contiguous(y.data(), DType::F32, {1, 2}), 1);
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 0.f);
  expect_error([&] { hanpu::Int8Linear(TensorView::contiguous(zeros.data(), DType::F32, {2, 32}), "layer.w", 0); },
               {"layer.w", "group size 0"});
  std::vector<int32_t> ints(4);
  expect_error([&] { hanpu::Int8Linear(TensorView::contiguous(ints.data(), DType::I32, {2, 2}), "layer.w", 16); },
               {"layer.w", "float weight"});
  zeros[3] = std::nanf("");
  expect_error([&] { hanpu::Int8Linear(TensorView::contiguous(zeros.data(), DType::F32, {2, 32}), "layer.w", 16); },
               {"layer.w", "non-finite"});
  std::vector<float> bad(3 * 31);
  expect_error([&] { z.forward(TensorView::contiguous(bad.data(), DType::F32, {3, 31}),
                               TensorView::contiguous(y.data(), DType::F32, {1, 2}), 1); },
               {"zero", "input must be F32 [M, 32]"});
}
