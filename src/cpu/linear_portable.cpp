// Portable kernel of Bf16Linear (see linear_kernels.hpp): Highway, compiled once per SIMD target
// and dispatched at run time. The weight stays in the checkpoint layout [N, K]; a register block
// of MR activation rows x NR weight rows keeps MR*NR vector accumulators over k, each weight
// vector is widened bf16 -> f32 in registers (a 16-bit shift: exact) and reused MR times, each
// activation vector NR times. Reductions happen once per output, after the whole K.
#include <algorithm>

#include "cpu/linear_kernels.hpp"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/linear_portable.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register block: 4 x 4 = 16 accumulators + 4 weight vectors + 1 activation vector fit the 32
// registers of AVX-512/NEON; 16-register x86 targets use 2 x 4 (8 + 4 + 1).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kMR = 2;
#else
constexpr int kMR = 4;
#endif
constexpr int kNR = 4;

template <int MR, int NR>
void Block(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n,
           bool accumulate) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<decltype(df)>;
  V acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    V wv[NR];
    for (int j = 0; j < NR; ++j)
      wv[j] = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, w + (n + j) * K + k))));
    for (int i = 0; i < MR; ++i) {
      const V xv = hn::LoadU(df, x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = hn::MulAdd(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[i][j]));
      for (int64_t kk = k; kk < K; ++kk) {
        const uint32_t bits = static_cast<uint32_t>(w[(n + j) * K + kk]) << 16;
        float wf;
        __builtin_memcpy(&wf, &bits, 4);
        sum += x[i * ldx + kk] * wf;
      }
      float& out = y[i * ldy + n + j];
      out = accumulate ? out + sum : sum;
    }
  }
}

template <int MR>
void RowBlock(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0,
              int64_t n1, bool accumulate) {
  int64_t n = n0;
  for (; n + kNR <= n1; n += kNR) Block<MR, kNR>(w, K, x, ldx, y, ldy, n, accumulate);
  for (; n < n1; ++n) Block<MR, 1>(w, K, x, ldx, y, ldy, n, accumulate);
}

void LinearPortable(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                    int64_t n0, int64_t n1, bool accumulate) {
  // Columns in slices whose weight rows (kColumnSlice * K * 2 bytes, 256 KiB at K = 1024) stay in
  // L2 while every activation row passes over them.
  constexpr int64_t kColumnSlice = 128;
  for (int64_t c0 = n0; c0 < n1; c0 += kColumnSlice) {
    const int64_t c1 = std::min(n1, c0 + kColumnSlice);
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR) RowBlock<kMR>(w, K, x + m * ldx, ldx, y + m * ldy, ldy, c0, c1, accumulate);
    for (; m < M; ++m) RowBlock<1>(w, K, x + m * ldx, ldx, y + m * ldy, ldy, c0, c1, accumulate);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hanpu::cpu {
HWY_EXPORT(LinearPortable);

void linear_portable(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                     int64_t n0, int64_t n1, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(LinearPortable)(w, K, x, ldx, y, ldy, M, n0, n1, accumulate);
}
}  // namespace hanpu::cpu
#endif
