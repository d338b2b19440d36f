// The SME gram kernel (src/cpu/gram_sme.cpp, issue 38 item 4) against a plain fp64 loop, on the
// engine's shape (64 x 64 by 128 deep, K K^T from the arena's K^T) and odd ones, at every
// streaming vector length the CPU grants (PR_SME_SET_VL). It runs on aarch64 Linux with SME:
// under qemu-user (scripts/test_arm64.sh: Debian 12's qemu 7.2 emulates SME on its default CPU,
// SVL 16 to 256 bytes) or on a real SME machine; elsewhere it skips saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"

#if HANPU_HAVE_GRAM_SME
#include <sys/prctl.h>
#endif

namespace hanpu::cpu {
namespace {

#if HANPU_HAVE_GRAM_SME

// Linux's prctl for the streaming vector length (include/uapi/linux/prctl.h), for C library
// headers that predate it.
#ifndef PR_SME_SET_VL
#define PR_SME_SET_VL 63
#define PR_SME_GET_VL 64
#endif
constexpr int kSmeVlLenMask = 0xffff;

// The streaming vector lengths (bytes) this thread can be given: the architecture allows powers of
// two from 16 to 256; Linux rounds a request down to a length the CPU implements.
std::vector<int> granted_vector_lengths() {
  std::vector<int> lengths;
  for (int vl = 16; vl <= 256; vl *= 2) {
    const int got = prctl(PR_SME_SET_VL, vl, 0, 0, 0);
    if (got >= 0 && (got & kSmeVlLenMask) == vl) lengths.push_back(vl);
  }
  return lengths;
}

struct Shape {
  size_t M, N, K;
  size_t lda, ldb, ldc;  // leading dimensions (floats); padding beyond M / N holds poison
  bool same_operand;     // At == Bt (K K^T: one operand, the arena's K^T)
};

// One case: random operands in [-1, 1), NaN in every padding column of A^T / B^T (read, it would
// poison C), a sentinel everywhere in C's buffer outside M x N (written, it would change). The
// bound is that of an f32 dot product of K terms (Higham, "Accuracy and Stability of Numerical
// Algorithms", 2nd ed., eq. 3.5: |fl(x^T y) - x^T y| <= gamma_K |x|^T |y|, gamma_K = K u / (1 - K u),
// u = 2^-24), whatever the summation order or whether FMOPA fuses its multiply-adds, plus the
// fp64 reference's own error (the same bound with u = 2^-53). The reference is formed once and
// the kernel run at each streaming vector length.
struct Case {
  Shape s;
  std::vector<float> At, Bt;
  std::vector<double> exact, magnitude;  // M x N: the fp64 result and sum |a b|

  Case(const Shape& shape, uint32_t seed) : s(shape) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    const float nan = std::nanf("");
    At.assign(std::max<size_t>(s.K, 1) * s.lda, nan);
    Bt.assign(std::max<size_t>(s.K, 1) * s.ldb, nan);
    for (size_t k = 0; k < s.K; ++k) {
      for (size_t i = 0; i < s.M; ++i) At[k * s.lda + i] = dist(rng);
      for (size_t j = 0; j < s.N; ++j) Bt[k * s.ldb + j] = dist(rng);
    }
    exact.assign(s.M * s.N, 0);
    magnitude.assign(s.M * s.N, 0);
    for (size_t i = 0; i < s.M; ++i)
      for (size_t j = 0; j < s.N; ++j)
        for (size_t k = 0; k < s.K; ++k) {
          const double p = static_cast<double>(a()[k * s.lda + i]) * b()[k * ldb() + j];
          exact[i * s.N + j] += p;
          magnitude[i * s.N + j] += std::fabs(p);
        }
  }
  const float* a() const { return At.data(); }
  const float* b() const { return s.same_operand ? At.data() : Bt.data(); }
  size_t ldb() const { return s.same_operand ? s.lda : s.ldb; }

  void check(const std::string& where) const {
    constexpr float kSentinel = -12345.5f;
    const size_t guard_rows = 3;  // rows after the last one, which must stay untouched too
    std::vector<float> C((s.M + guard_rows) * s.ldc, kSentinel);
    gram_f32_sme(a(), s.lda, b(), ldb(), s.M, s.N, s.K, C.data(), s.ldc);
    const double u32 = std::ldexp(1.0, -24), u64 = std::ldexp(1.0, -53);
    const double kd = static_cast<double>(s.K);
    const double gamma = kd * u32 / (1 - kd * u32) + kd * u64 / (1 - kd * u64);
    size_t bad = 0;
    for (size_t i = 0; i < s.M + guard_rows; ++i) {
      for (size_t j = 0; j < s.ldc; ++j) {
        const float got = C[i * s.ldc + j];
        if (i >= s.M || j >= s.N) {
          if (std::memcmp(&got, &kSentinel, sizeof got) != 0 && bad++ < 5)
            ADD_FAILURE() << where << ": C[" << i << "][" << j << "] is outside the " << s.M << " x " << s.N
                          << " result but was written (" << got << ")";
          continue;
        }
        const double exact_ij = exact[i * s.N + j], bound = gamma * magnitude[i * s.N + j];
        const double err = std::fabs(static_cast<double>(got) - exact_ij);
        // NaN fails this comparison too (a padding value that was read).
        if (!(err <= bound) && bad++ < 5)
          ADD_FAILURE() << where << ": C[" << i << "][" << j << "] = " << got << ", fp64 " << exact_ij << ", error "
                        << err << " > bound " << bound << " (gamma_K " << gamma << " x sum |a b|)";
      }
    }
    EXPECT_EQ(bad, 0u) << where;
  }
};

TEST(LaSme, GramMatchesFp64AtEveryStreamingVectorLength) {
  if (!gram_f32_sme_usable())
    GTEST_SKIP() << "the CPU reports no SME (getauxval(AT_HWCAP2) & HWCAP2_SME), or HANPU_ISA is below native: "
                    "the SME gram cannot run here";
  const int original = prctl(PR_SME_GET_VL, 0, 0, 0, 0) & kSmeVlLenMask;
  const std::vector<int> lengths = granted_vector_lengths();
  ASSERT_FALSE(lengths.empty()) << "SME is reported but no streaming vector length from 16 to 256 bytes was granted";
  const Shape shapes[] = {
      {64, 64, 128, 72, 72, 64, true},    // the engine's K K^T: chunk 64, K = 128, the arena's K^T (ld 72)
      {64, 64, 128, 64, 72, 72, false},   // the engine's Q K^T
      {1, 1, 1, 1, 1, 1, false},          // smaller than any tile, depth 1
      {37, 71, 1, 40, 75, 80, false},     // K = 1; M, N multiples of no SVL/4
      {5, 3, 0, 8, 8, 8, false},          // K = 0: C = 0, written
      {63, 65, 129, 64, 66, 70, false},   // tails on both sides of a 64-wide block, odd depth
      {130, 17, 33, 131, 17, 17, false},  // more block rows than block columns, a bottom-tile tail
      {33, 33, 7, 33, 33, 33, true},      // square, one operand, no padding at all
  };
  for (size_t c = 0; c < std::size(shapes); ++c) {
    const Shape& s = shapes[c];
    const Case data(s, static_cast<uint32_t>(1000 + c));
    for (int vl : lengths) {
      ASSERT_EQ(prctl(PR_SME_SET_VL, vl, 0, 0, 0) & kSmeVlLenMask, vl);
      ASSERT_EQ(sme_vector_bytes(), static_cast<size_t>(vl)) << "RDSVL disagrees with the length prctl set";
      data.check("SVL " + std::to_string(vl) + " bytes, M " + std::to_string(s.M) + " N " + std::to_string(s.N) +
                 " K " + std::to_string(s.K));
    }
  }
  prctl(PR_SME_SET_VL, original, 0, 0, 0);
  RecordProperty("streaming_vector_lengths", std::to_string(lengths.size()));
  std::printf("SME gram checked at %zu streaming vector length(s), from %d to %d bytes\n", lengths.size(),
              lengths.front(), lengths.back());
}

#else

TEST(LaSme, GramMatchesFp64AtEveryStreamingVectorLength) {
  EXPECT_FALSE(gram_f32_sme_usable());
  GTEST_SKIP() << "not an aarch64 Linux build: the SME gram kernel (src/cpu/gram_sme.cpp) is compiled only there";
}

#endif

}  // namespace
}  // namespace hanpu::cpu
