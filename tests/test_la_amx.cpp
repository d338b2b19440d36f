// The engine's AMX products (cpu/la_amx.hpp) against fp64 products, element by element, over odd
// shapes (M, N and depth not multiples of 16 or 32), each store rule, lower-triangular A and one or
// two bf16 terms per f32 operand. The engine-level tests against the fp64 reference are in
// test_la.cpp (LaAmx).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/la_amx.hpp"

namespace hanpu::testing {
namespace {

constexpr const char* kNoAmx =
    "no usable AMX (AMX-BF16 with the OS tile permission, and HANPU_ISA unset or native): the engine's AMX products "
    "cannot run here";

uint16_t bf16_bits(float x) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Relative error of one f32 operand as `terms` bf16 parts (la_amx.hpp): 2^-8 rounded, 2^-16 split.
double term_error(int terms) { return terms == 1 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -16); }

TEST(LaAmxKernels, ProductsMatchFp64) {
  if (!cpu::la_amx_usable()) GTEST_SKIP() << kNoAmx;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape {
    size_t M, N, depth;
  };
  const Shape shapes[] = {{64, 128, 128}, {1, 1, 1}, {17, 33, 31}, {63, 100, 65}, {128, 130, 64}, {15, 16, 33},
                          {40, 60, 100}};
  for (const Shape& sh : shapes)
    for (int terms : {1, 2})
      for (bool a_f32 : {false, true})  // A: exact bf16 rows, or f32 packed with `terms`
        for (bool lower : {false, true})
          for (cpu::AmxStore store : {cpu::AmxStore::kSet, cpu::AmxStore::kAdd, cpu::AmxStore::kScaleAdd}) {
            const size_t M = sh.M, N = sh.N, D = sh.depth;
            const size_t lda = cpu::la_amx_depth(D) + 32, ldb = cpu::la_amx_cols(N) + 16, ldc = N + 5;
            const size_t Mr = cpu::la_amx_rows(M), Dp = cpu::la_amx_depth(D);
            std::vector<float> A(M * D), B(D * N), p(M), c(M), C0((M + 1) * ldc);
            for (float& x : A) x = nd(rng);
            for (float& x : B) x = nd(rng);
            for (float& x : p) x = nd(rng);
            for (float& x : c) x = nd(rng);
            for (float& x : C0) x = nd(rng);
            const int a_terms = a_f32 ? terms : 1;
            std::vector<uint16_t> Ap(2 * Mr * lda, 0xFFFF);  // NaN pattern: every read element must be written
            std::vector<uint32_t> Bp(2 * (Dp / 2) * ldb, 0xFFFFFFFF);
            const size_t a_ts = Mr * lda, b_ts = (Dp / 2) * ldb;
            if (a_f32) {
              cpu::la_amx_pack_rows(A.data(), D, M, D, lower, a_terms, Ap.data(), lda, a_ts);
            } else {  // exact bf16 rows, zero past the depth (and past the diagonal when lower)
              for (size_t i = 0; i < Mr; ++i)
                for (size_t k = 0; k < Dp; ++k) {
                  const bool live = i < M && k < D && (!lower || k <= i);
                  Ap[i * lda + k] = live ? bf16_bits(A[i * D + k]) : 0;
                  if (i < M && k < D) A[i * D + k] = bf16_value(bf16_bits(A[i * D + k]));
                }
            }
            cpu::la_amx_pack_pairs(B.data(), N, D, N, nullptr, terms, Bp.data(), ldb, b_ts);
            std::vector<float> C = C0;
            cpu::la_amx_gemm(Ap.data(), lda, a_ts, a_terms, Bp.data(), ldb, b_ts, terms, C.data(), ldc, M, N, D, lower,
                             store, p.data(), store == cpu::AmxStore::kScaleAdd ? c.data() : nullptr);
            const double e = term_error(terms), ea = a_f32 ? term_error(terms) : 0.0;
            // |error| <= (e_a + e_b + e_a e_b + dropped lo x lo + f32 summation) |p| (|A||B|), plus the f32 store.
            const double rel = ea + e + ea * e + (a_f32 && terms == 2 ? e : 0.0) + D * std::ldexp(1.0, -23);
            for (size_t i = 0; i < M + 1; ++i)
              for (size_t j = 0; j < ldc; ++j) {
                const size_t at = i * ldc + j;
                if (i >= M || j >= N) {  // outside C: untouched
                  ASSERT_EQ(C[at], C0[at]) << "wrote outside C at " << i << "," << j;
                  continue;
                }
                double dot = 0, mag = 0;
                for (size_t k = 0; k < D; ++k) {
                  if (lower && k > i) break;
                  dot += static_cast<double>(A[i * D + k]) * B[k * N + j];
                  mag += std::fabs(static_cast<double>(A[i * D + k]) * B[k * N + j]);
                }
                double ref = p[i] * dot, base = 0;
                if (store == cpu::AmxStore::kAdd) base = C0[at];
                if (store == cpu::AmxStore::kScaleAdd) base = static_cast<double>(c[i]) * C0[at];
                ref += base;
                const double tol = rel * std::fabs(p[i]) * mag + 4e-7 * (std::fabs(ref) + std::fabs(base)) + 1e-30;
                ASSERT_NEAR(C[at], ref, tol) << "M=" << M << " N=" << N << " depth=" << D << " terms=" << terms
                                             << " a_f32=" << a_f32 << " lower=" << lower
                                             << " store=" << static_cast<int>(store) << " at " << i << "," << j;
              }
          }
}

// K^T as bf16 rows from the grams' K^T pairs: out[d][j] = X[j][d], zeros past the columns.
TEST(LaAmxKernels, UnpairTransposes) {
  if (!cpu::la_amx_usable()) GTEST_SKIP() << kNoAmx;
  std::mt19937 rng(3);
  for (size_t dims : {1, 63, 64, 128})
    for (size_t cols : {1, 17, 64}) {
      const size_t ldx = (dims + 1) / 2 * 2, ldp = cols + 7, ldo = cpu::la_amx_depth(cols) + 32;
      std::vector<uint16_t> X(cols * ldx);
      for (uint16_t& x : X) x = static_cast<uint16_t>(rng());
      std::vector<uint32_t> pairs(ldx / 2 * ldp);
      for (size_t p = 0; p < ldx / 2; ++p)
        for (size_t j = 0; j < cols; ++j) pairs[p * ldp + j] = X[j * ldx + 2 * p] | uint32_t{X[j * ldx + 2 * p + 1]} << 16;
      std::vector<uint16_t> out(cpu::la_amx_rows(dims) * ldo, 0xABCD);
      cpu::la_amx_unpair(pairs.data(), ldp, dims, cols, out.data(), ldo);
      for (size_t d = 0; d < cpu::la_amx_rows(dims); ++d)
        for (size_t j = 0; j < cpu::la_amx_depth(cols); ++j)
          ASSERT_EQ(out[d * ldo + j], d < dims && j < cols ? X[j * ldx + d] : 0) << dims << " " << cols << " " << d << " " << j;
    }
}

}  // namespace
}  // namespace hanpu::testing
