// Masking and solve: the grams' decay, beta and triangle masks (MaskGram) and the unit-lower
// triangular solve (I + A) E = X (SolveUnitLower).
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_SOLVE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_SOLVE_INL_H_
#undef HANPU_CPU_LA_SOLVE_INL_H_
#else
#define HANPU_CPU_LA_SOLVE_INL_H_
#endif

#include <algorithm>

#include <hwy/highway.h>

#include "cpu/la/base-inl.h"
#include "cpu/la/gemm-inl.h"
#include "cpu/la/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// (I + A) E = X in place on X [L x ldx] (width a multiple of the vector length); A strictly lower
// [L x lda]. Row strips: the part below the strip is a GEMM on solved rows, the strip's own
// triangle a short forward substitution.
void SolveUnitLower(const float* A, size_t lda, float* X, size_t ldx, size_t L, size_t width, TileShape tile = {}) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  for (size_t i0 = 0; i0 < L; i0 += tile.rows) {
    const size_t mr = std::min(tile.rows, L - i0);
    // The strip's triangle is solved in the tile's registers (kSubSolve): a separate pass of
    // row updates through memory cost as much as the strip's GEMM part.
    for (size_t j0 = 0; j0 < width; j0 += tile.vectors * lanes) {
      const size_t nv = std::min(tile.vectors, (width - j0) / lanes);
      TileAny<Acc::kSubSolve>(mr, nv, A + i0 * lda, lda, X + j0, ldx, X + i0 * ldx + j0, ldx, i0);
    }
  }
}

// Factors of grams formed from the raw bf16 rows (gram_bf16_lower), which carry neither scale
// nor the L2 norms: KK_ij gets a_row[i] col[j], QK_ij gets p_row[i] col[j].
struct GramScale {
  const float* a_row;  // 1 / |k_i| (or 1)
  const float* p_row;  // scale / |q_i| (or scale)
  const float* col;    // 1 / |k_j| (or 1); readable up to L rounded up to the vector length
};

// A = strictly-lower(beta_i * gate_ij * KK), P = lower-inclusive(gate_ij * QK), in place; entries
// outside the triangle (or beyond L) are set to 0 by selection. gate_ij = e^{Γi−Γj} for GDN and
// already inside the products for KDA. With `sc`, the raw grams' factors are applied too.
void MaskGram(bool head_gate, const double* G, const float* beta, size_t L, size_t C, size_t ldc, float* AP, float* ftmp,
              const GramScale* sc = nullptr) {
  float* KK = AP;
  float* QK = AP + C * ldc;
  const size_t Lp = RoundUp(L, kPad);
  // G holds C doubles and ftmp at least C floats: whole vectors stay inside both when C is a
  // multiple of the vector length (with a staged tail in 60 of 64 rows this pass took 9.0K TSC
  // cycles per GDN chunk, now 4.9K).
  const bool whole = C % hn::Lanes(DF()) == 0;
  for (size_t i = 0; i < L; ++i) {
    if (head_gate) (whole ? ExpDiffFromWhole : ExpDiffFrom)(G[i], G, ftmp, i + 1);
    float* a = KK + i * ldc;
    float* p = QK + i * ldc;
    // Selection masks (FirstN), never multiplication by a 0/1 mask: entries above the diagonal
    // may hold anything (even inf/NaN from skipped tiles) and must come out as exact zeros.
    const DF d;
    const size_t N = hn::Lanes(d);
    const VF vbeta = hn::Set(d, sc ? beta[i] * sc->a_row[i] : beta[i]);
    const VF vp = hn::Set(d, sc ? sc->p_row[i] : 1.f);
    for (size_t j0 = 0; j0 < Lp; j0 += N) {
      const size_t below = i > j0 ? i - j0 : 0;      // lanes with j < i
      const size_t upto = i + 1 > j0 ? i + 1 - j0 : 0;  // lanes with j <= i
      VF gate = head_gate ? hn::IfThenElseZero(hn::FirstN(d, upto), hn::LoadU(d, ftmp + j0)) : hn::Set(d, 1.f);
      if (sc) gate = hn::Mul(gate, hn::LoadU(d, sc->col + j0));
      hn::StoreU(hn::IfThenElseZero(hn::FirstN(d, below), hn::Mul(hn::Mul(vbeta, gate), hn::LoadU(d, a + j0))), d,
                 a + j0);
      hn::StoreU(hn::IfThenElseZero(hn::FirstN(d, upto), hn::Mul(hn::Mul(vp, gate), hn::LoadU(d, p + j0))), d,
                 p + j0);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_SOLVE_INL_H_
