// KDA gram factors: the per-token decay factors (KdaTokenFactors) and the anchored K K^T and
// Q K^T of KDA's per-channel decays (KdaBlockPairs, KdaGram).
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_KDA_GRAM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_KDA_GRAM_INL_H_
#undef HANPU_CPU_LA_KDA_GRAM_INL_H_
#else
#define HANPU_CPU_LA_KDA_GRAM_INL_H_
#endif

#include <algorithm>

#include <hwy/highway.h>

#include "cpu/la/base-inl.h"
#include "cpu/la/gemm-inl.h"
#include "cpu/la/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// KDA's per-token decay factors eg[t] = e^{g_t} = e^{Γt−Γ(t−1)} [L x K] (from the fp64
// cumulative gates, so they equal the differences the anchors use).
void KdaTokenFactors(const double* G, size_t L, size_t K, float* eg) {
  ExpRow(G, eg, K);
  for (size_t t = 1; t < L; ++t) ExpDiff(G + t * K, G + (t - 1) * K, eg + t * K, K);
}

// K K^T and Q K^T for KDA, anchored so that every exponent is a later-minus-earlier difference.
// Rows in 16-row blocks with anchor n (the block's first row): for columns j < n,
//   (k_i e^{Γi−Γn}) · (k_j e^{Γn−Γj})  — both factors <= 1;
// inside a block, e^{Γi−Γj} = Π_{t=j+1..i} e^{g_t} is built by multiplying the per-token factors
// `eg` [L x K] (KdaTokenFactors; at most 16 of them, each <= 1: a few ulp, no exponential per
// pair). The factors that carry the previous block's columns to the new anchor are products too.
// The in-block pairs of KdaGram (rows n..n+rows−1, columns n..r) with the running decay product
// e^{Γr−Γj} held in SEG registers instead of a row in memory: per pair one multiply of the product
// and the two dots, no load/store round trip of the product (the memory version was ~9% of a KDA
// chunk). K is whole segments of SEG vectors; with one segment (K = SEG vectors) everything stays
// in registers and the operations are those of the generic loop below in the same order, so the
// results are the same. With more (AVX2 at K = 128: 16 vectors, of which 4 fit with q, k and the
// accumulators) each segment runs the pairs with its own product, and the pairs' partial dot
// products wait in `partial` (two vectors per pair of the row, in L1) for the next segment; the
// horizontal sums happen once, after the last one. Against the generic loop that measured 11.9M
// -> 7.8M instructions for the gram (callgrind, AVX2, T = 1024, H = 4).
template <size_t SEG>
void KdaBlockPairs(const float* HWY_RESTRICT Kr, const float* HWY_RESTRICT Qs, const float* HWY_RESTRICT eg,
                   size_t n, size_t rows, size_t K, size_t ldc, float* HWY_RESTRICT KK, float* HWY_RESTRICT QK) {
  const DF d;
  const size_t N = hn::Lanes(d);
  HWY_ALIGN float partial[2 * kKdaBlock * (HWY_MAX_BYTES / sizeof(float))];
  for (size_t i = 0; i < rows; ++i) {
    const size_t r = n + i;
    for (size_t s = 0; s < K; s += SEG * N) {
      const bool first = s == 0, last = s + SEG * N == K;
      const float* qr = Qs + r * K + s;
      const float* kr = Kr + r * K + s;
      VF f[SEG];
      for (size_t v = 0; v < SEG; ++v) f[v] = hn::Set(d, 1.f);
      for (size_t j = r + 1; j-- > n;) {
        if (j < r)
          for (size_t v = 0; v < SEG; ++v) f[v] = hn::Mul(f[v], hn::LoadU(d, eg + (j + 1) * K + s + v * N));
        const float* kj = Kr + j * K + s;
        float* pq = partial + (j - n) * 2 * N;
        VF aq = first ? hn::Zero(d) : hn::Load(d, pq), ak = first ? hn::Zero(d) : hn::Load(d, pq + N);
        for (size_t v = 0; v < SEG; ++v) {
          const VF kf = hn::Mul(hn::LoadU(d, kj + v * N), f[v]);
          aq = hn::MulAdd(hn::LoadU(d, qr + v * N), kf, aq);
          ak = hn::MulAdd(hn::LoadU(d, kr + v * N), kf, ak);
        }
        if (last) {
          QK[r * ldc + j] = hn::GetLane(hn::SumOfLanes(d, aq));
          KK[r * ldc + j] = j < r ? hn::GetLane(hn::SumOfLanes(d, ak)) : 0.f;
        } else {
          hn::Store(aq, d, pq);
          hn::Store(ak, d, pq + N);
        }
      }
    }
  }
}

// Segments of up to 8 vectors (K = 128 on AVX-512 in one): with q, k and the accumulators that
// still fits 32 registers; 16-register targets take 4.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kMaxPairVectors = 4;
#else
constexpr size_t kMaxPairVectors = 8;
#endif

// Runs KdaBlockPairs with the widest segment of at most SEG vectors that divides K's nv vectors
// (nv itself when nv <= SEG: one segment); false when K is not whole vectors (generic loop).
template <size_t SEG>
bool KdaBlockPairsInRegisters(size_t nv, bool whole_vectors, const float* Kr, const float* Qs, const float* eg,
                              size_t n, size_t rows, size_t K, size_t ldc, float* KK, float* QK) {
  if constexpr (SEG == 0) {
    return false;
  } else {
    if (!whole_vectors || nv == 0) return false;
    if (nv % SEG == 0) {
      KdaBlockPairs<SEG>(Kr, Qs, eg, n, rows, K, ldc, KK, QK);
      return true;
    }
    return KdaBlockPairsInRegisters<SEG - 1>(nv, whole_vectors, Kr, Qs, eg, n, rows, K, ldc, KK, QK);
  }
}

void KdaGram(const float* Kr, const float* Qs, const double* G, size_t L, size_t K, size_t C, size_t ldc, float* KQl,
             float* KrT, float* ftmp, const float* eg, float* AP, ChunkPrefetcher* pf = nullptr, TileShape tile = {}) {
  constexpr size_t kBlock = kKdaBlock;
  float* KK = AP;
  float* QK = AP + C * ldc;
  const DF d;
  const size_t N = hn::Lanes(d);
  for (size_t n = 0; n < L; n += kBlock) {
    const size_t rows = std::min(kBlock, L - n);
    if (n > 0) {
      float* Kl = KQl;
      float* Ql = KQl + kBlock * K;
      // KrT[d][j] = k_j[d] e^{Γn[d]−Γj[d]} for j < n. The 16 new columns [p, n), p = n − 16:
      // e^{Γn−Γj} = Π_{t=j+1..n} e^{g_t}, built from j = n − 1 down (at most 16 factors); the
      // last product, e^{Γn−Γp}, then carries the older columns j < p forward to this anchor.
      const size_t p = n - kBlock;
      std::copy(eg + n * K, eg + (n + 1) * K, ftmp);
      for (size_t j = n; j-- > p;) {
        if (j + 1 < n) MulInPlace(ftmp, eg + (j + 1) * K, K);
        MulRows(Kr + j * K, ftmp, Kl + (j - p) * K, K);  // Kl as staging rows
      }
      if (p > 0)
        for (size_t dd = 0; dd < K; ++dd) Scale(KrT + dd * ldc, ftmp[dd], p);
      TransposeInto(Kl, kBlock, K, KrT + p, ldc, kBlock);
      for (size_t i = 0; i < rows; ++i) {
        // e^{Γi−Γn} = e^{Γ(i−1)−Γn} e^{g_i}, kept in ftmp.
        if (i == 0)
          std::fill(ftmp, ftmp + K, 1.f);
        else
          MulInPlace(ftmp, eg + (n + i) * K, K);
        MulRows(Kr + (n + i) * K, ftmp, Kl + i * K, K);
        MulRows(Qs + (n + i) * K, ftmp, Ql + i * K, K);
      }
      Gemm<Acc::kSet>(Kl, K, KrT, ldc, KK + n * ldc, ldc, rows, RoundUp(n, kPad), K, Tri::kNone, pf, nullptr, tile);
      Gemm<Acc::kSet>(Ql, K, KrT, ldc, QK + n * ldc, ldc, rows, RoundUp(n, kPad), K, Tri::kNone, pf, nullptr, tile);
    }
    if (KdaBlockPairsInRegisters<kMaxPairVectors>(K / N, K % N == 0, Kr, Qs, eg, n, rows, K, ldc, KK, QK)) continue;
    for (size_t i = 0; i < rows; ++i) {
      const size_t r = n + i;
      const float* qr = Qs + r * K;
      const float* kr = Kr + r * K;
      std::fill(ftmp, ftmp + K, 1.f);  // e^{Γr−Γj} for j = r, then j = r−1, ...
      for (size_t j = r + 1; j-- > n;) {
        if (j < r) MulInPlace(ftmp, eg + (j + 1) * K, K);
        const float* kj = Kr + j * K;
        VF aq = hn::Zero(d), ak = hn::Zero(d);
        size_t dd = 0;
        for (; dd + N <= K; dd += N) {
          const VF kf = hn::Mul(hn::LoadU(d, kj + dd), hn::LoadU(d, ftmp + dd));
          aq = hn::MulAdd(hn::LoadU(d, qr + dd), kf, aq);
          ak = hn::MulAdd(hn::LoadU(d, kr + dd), kf, ak);
        }
        float sq = hn::GetLane(hn::SumOfLanes(d, aq)), sk = hn::GetLane(hn::SumOfLanes(d, ak));
        for (; dd < K; ++dd) {
          const float kf = kj[dd] * ftmp[dd];
          sq += qr[dd] * kf;
          sk += kr[dd] * kf;
        }
        QK[r * ldc + j] = sq;
        KK[r * ldc + j] = j < r ? sk : 0.f;
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_KDA_GRAM_INL_H_
