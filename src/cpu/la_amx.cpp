// The head-fused engine's GEMMs on AMX (la_amx.hpp has the operand layouts and the rounding).
//
// The product kernel runs blocks of 32 x 32 of C (2 x 2 tiles): per depth step of 32 it loads two
// A tiles and two B tiles for four TDPBF16PS (1 term), or 10 tiles for 12 (2 x 2 terms). The
// accumulators go through a 4 KiB buffer to the store rule (row factors, C's own factors, the M
// and N tails) on the vector unit: the gates stay there, as in the f32 path.
#include "cpu/la_amx.hpp"

#include <algorithm>

#include "cpu/linear_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HANPU_HAVE_LA_AMX 1
#include <immintrin.h>
// GCC 12 warns "'__Y' may be used uninitialized" inside its own avx512fintrin.h (the
// _mm512_undefined_* operands of the conversions): not this file's values.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace hanpu::cpu {

bool la_amx_usable() { return amx_usable(); }

#if HANPU_HAVE_LA_AMX

#define HANPU_LA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

HANPU_LA_AMX_TARGET inline __mmask16 first_n(ptrdiff_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1);
}

// The f32 values of 16 bf16 held in 32-bit lanes.
HANPU_LA_AMX_TARGET inline __m512 bf16_lanes_value(__m512i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)); }

// One block of C, MT x NT tiles of 16 x 16 (at most 2 x 2): accumulator (r, c) in tile 2r + c,
// A's row tile r in tile 4 + r, B's column tile c in tile 6 + c, so each loaded tile feeds MT or
// NT products (the 2 x 2 block of linear_amx.cpp). With two terms the products run in three
// passes per depth step (hi x hi, hi x lo, lo x hi), reloading only the tiles that change: the
// tiles are not renamed, so a load into a tile waits for the products still reading it.
template <int MT, int NT, int AT, int BT>
HANPU_LA_AMX_TARGET void block_tiles(const uint16_t* A, size_t lda, size_t a_ts, const uint32_t* B, size_t ldb,
                                     size_t b_ts, size_t steps, float* buf, AmxHook hook) {
  const size_t a_bytes = lda * 2, b_bytes = ldb * 4;
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (MT > 1) _tile_zero(2);
  if constexpr (MT > 1 && NT > 1) _tile_zero(3);
#define HANPU_LA_AMX_LOAD_A(off)                                                 \
  _tile_loadd(4, A + (off) + ks * 32, a_bytes);                                  \
  if constexpr (MT > 1) _tile_loadd(5, A + (off) + 16 * lda + ks * 32, a_bytes);
#define HANPU_LA_AMX_LOAD_B(off)                                                 \
  _tile_loadd(6, B + (off) + ks * 16 * ldb, b_bytes);                            \
  if constexpr (NT > 1) _tile_loadd(7, B + (off) + ks * 16 * ldb + 16, b_bytes);
#define HANPU_LA_AMX_PRODUCTS                                                    \
  _tile_dpbf16ps(0, 4, 6);                                                       \
  if constexpr (NT > 1) _tile_dpbf16ps(1, 4, 7);                                 \
  if constexpr (MT > 1) _tile_dpbf16ps(2, 5, 6);                                 \
  if constexpr (MT > 1 && NT > 1) _tile_dpbf16ps(3, 5, 7);
  for (size_t ks = 0; ks < steps; ++ks) {
    HANPU_LA_AMX_LOAD_A(0)
    HANPU_LA_AMX_LOAD_B(0)
    HANPU_LA_AMX_PRODUCTS
    if constexpr (BT > 1) {
      HANPU_LA_AMX_LOAD_B(b_ts)
      HANPU_LA_AMX_PRODUCTS
    }
    if constexpr (AT > 1) {
      HANPU_LA_AMX_LOAD_A(a_ts)
      if constexpr (BT > 1) {
        HANPU_LA_AMX_LOAD_B(0)
      }
      HANPU_LA_AMX_PRODUCTS
    }
  }
#undef HANPU_LA_AMX_LOAD_A
#undef HANPU_LA_AMX_LOAD_B
#undef HANPU_LA_AMX_PRODUCTS
  if (hook.fn) hook.fn(hook.ctx);  // while the last products run (the stores wait for them)
  _tile_stored(0, buf, 128);
  if constexpr (NT > 1) _tile_stored(1, buf + 16, 128);
  if constexpr (MT > 1) _tile_stored(2, buf + 16 * 32, 128);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, buf + 16 * 32 + 16, 128);
}

template <int AT, int BT>
HANPU_LA_AMX_TARGET void block_any(int mt, int nt, const uint16_t* A, size_t lda, size_t a_ts, const uint32_t* B,
                                   size_t ldb, size_t b_ts, size_t steps, float* buf, AmxHook hook) {
  if (mt > 1 && nt > 1) return block_tiles<2, 2, AT, BT>(A, lda, a_ts, B, ldb, b_ts, steps, buf, hook);
  if (mt > 1) return block_tiles<2, 1, AT, BT>(A, lda, a_ts, B, ldb, b_ts, steps, buf, hook);
  if (nt > 1) return block_tiles<1, 2, AT, BT>(A, lda, a_ts, B, ldb, b_ts, steps, buf, hook);
  return block_tiles<1, 1, AT, BT>(A, lda, a_ts, B, ldb, b_ts, steps, buf, hook);
}

template <AmxStore kStore>
HANPU_LA_AMX_TARGET inline __m512 store_rule(__m512 ps, __m512 cs, __m512 acc, const float* c, __mmask16 m) {
  if constexpr (kStore == AmxStore::kSet) return _mm512_mul_ps(ps, acc);
  else if constexpr (kStore == AmxStore::kAdd) return _mm512_fmadd_ps(ps, acc, _mm512_maskz_loadu_ps(m, c));
  else return _mm512_fmadd_ps(ps, acc, _mm512_mul_ps(cs, _mm512_maskz_loadu_ps(m, c)));
}

// C rows [i0, i0 + mr), columns [n0, n0 + 16 nt) (those below N) from the block's accumulators
// (buf, 32 x 32) by the store rule kStore (la_amx.hpp).
template <AmxStore kStore>
HANPU_LA_AMX_TARGET void store_block(const float* buf, float* C, size_t ldc, size_t N, size_t i0, size_t n0, size_t mr,
                                     int nt, const float* p_scale, const float* c_scale) {
  constexpr auto rule = store_rule<kStore>;
  const bool full = nt == 2 && n0 + 32 <= N;
  for (size_t r = 0; r < mr; ++r) {
    const size_t i = i0 + r;
    const __m512 ps = _mm512_set1_ps(p_scale ? p_scale[i] : 1.f);
    const __m512 cs = _mm512_set1_ps(c_scale ? c_scale[i] : 1.f);
    float* crow = C + i * ldc + n0;
    const float* brow = buf + r * 32;
    if (full) {
      _mm512_storeu_ps(crow, rule(ps, cs, _mm512_load_ps(brow), crow, static_cast<__mmask16>(0xFFFF)));
      _mm512_storeu_ps(crow + 16, rule(ps, cs, _mm512_load_ps(brow + 16), crow + 16, static_cast<__mmask16>(0xFFFF)));
      continue;
    }
    for (int v = 0; v < nt; ++v) {
      const __mmask16 m = first_n(static_cast<ptrdiff_t>(N) - static_cast<ptrdiff_t>(n0 + 16 * v));
      _mm512_mask_storeu_ps(crow + 16 * v, m, rule(ps, cs, _mm512_load_ps(brow + 16 * v), crow + 16 * v, m));
    }
  }
}

}  // namespace

void la_amx_release() { amx_release_tiles(); }

HANPU_LA_AMX_TARGET void la_amx_pack_pairs(const float* B, size_t ldb, size_t rows, size_t cols,
                                           const float* row_scale, int terms, uint32_t* out, size_t ldo,
                                           size_t term_stride) {
  const size_t pairs = la_amx_depth(rows) / 2, cp = la_amx_cols(cols);
  // One conversion of both rows (x0's 16 bf16, then x1's), then one permutation into pairs.
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (size_t p = 0; p < pairs; ++p) {
    const size_t r0 = 2 * p, r1 = 2 * p + 1;
    const __m512 s0 = _mm512_set1_ps(r0 < rows && row_scale ? row_scale[r0] : 1.f);
    const __m512 s1 = _mm512_set1_ps(r1 < rows && row_scale ? row_scale[r1] : 1.f);
    for (size_t c = 0; c < cp; c += 16) {
      const __mmask16 m = first_n(static_cast<ptrdiff_t>(cols) - static_cast<ptrdiff_t>(c));
      __m512 x0 = r0 < rows ? _mm512_mul_ps(s0, _mm512_maskz_loadu_ps(m, B + r0 * ldb + c)) : _mm512_setzero_ps();
      __m512 x1 = r1 < rows ? _mm512_mul_ps(s1, _mm512_maskz_loadu_ps(m, B + r1 * ldb + c)) : _mm512_setzero_ps();
      for (int t = 0; t < terms; ++t) {
        const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        _mm512_storeu_si512(out + t * term_stride + p * ldo + c, _mm512_permutexvar_epi16(interleave, h));
        if (t + 1 == terms) break;
        // The remainders, exact in f32 (x and its bf16 agree in the top bits).
        x0 = _mm512_sub_ps(x0, bf16_lanes_value(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h))));
        x1 = _mm512_sub_ps(x1, bf16_lanes_value(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1))));
      }
    }
  }
}

HANPU_LA_AMX_TARGET void la_amx_pack_rows(const float* A, size_t lda, size_t rows, size_t cols, bool lower, int terms,
                                          uint16_t* out, size_t ldo, size_t term_stride) {
  const size_t rp = la_amx_rows(rows), dp = la_amx_depth(cols);
  for (size_t i = 0; i < rp; ++i) {
    const ptrdiff_t n = i >= rows ? 0 : static_cast<ptrdiff_t>(lower ? std::min(cols, i + 1) : cols);
    for (size_t k = 0; k < dp; k += 16) {
      __m512 x = _mm512_maskz_loadu_ps(first_n(n - static_cast<ptrdiff_t>(k)), A + i * lda + k);
      for (int t = 0; t < terms; ++t) {
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * term_stride + i * ldo + k), h);
        x = _mm512_sub_ps(x, bf16_lanes_value(_mm512_cvtepu16_epi32(h)));
      }
    }
  }
}

HANPU_LA_AMX_TARGET void la_amx_unpair(const uint32_t* pairs, size_t ldp, size_t dims, size_t cols, uint16_t* out,
                                       size_t ldo) {
  const size_t dp = la_amx_depth(cols), rp = la_amx_rows(dims);
  for (size_t p = 0; 2 * p < dims; ++p) {
    for (size_t j = 0; j < dp; j += 16) {
      const __m512i w =
          _mm512_maskz_loadu_epi32(first_n(static_cast<ptrdiff_t>(cols) - static_cast<ptrdiff_t>(j)), pairs + p * ldp + j);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * p * ldo + j), _mm512_cvtepi32_epi16(w));
      if (2 * p + 1 < dims)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (2 * p + 1) * ldo + j),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
    }
  }
  for (size_t d = dims; d < rp; ++d) std::fill(out + d * ldo, out + d * ldo + dp, uint16_t{0});
}

HANPU_LA_AMX_TARGET void la_amx_gemm(const uint16_t* A, size_t lda, size_t a_ts, int a_terms, const uint32_t* B,
                                     size_t ldb, size_t b_ts, int b_terms, float* C, size_t ldc, size_t M, size_t N,
                                     size_t depth, bool lower, AmxStore store, const float* p_scale,
                                     const float* c_scale, AmxHook hook) {
  alignas(64) float buf[32 * 32];
  amx_configure_tiles();
  // The store rule of a block, row by row on the vector unit, one instantiation per rule and
  // unmasked for whole 32-column blocks (10% faster than one loop testing the rule per vector).
  // Running it one block late, so that the next block's products overlap it, measured no faster.
  auto finish = [&](size_t i0, size_t n0, size_t mr, int nt) HANPU_LA_AMX_TARGET {
    if (store == AmxStore::kSet) store_block<AmxStore::kSet>(buf, C, ldc, N, i0, n0, mr, nt, p_scale, c_scale);
    else if (store == AmxStore::kAdd) store_block<AmxStore::kAdd>(buf, C, ldc, N, i0, n0, mr, nt, p_scale, c_scale);
    else store_block<AmxStore::kScaleAdd>(buf, C, ldc, N, i0, n0, mr, nt, p_scale, c_scale);
  };
  // Column blocks outside, row blocks inside: a block's B panel (depth x 32 columns, 8 KiB per
  // term at depth 128) stays in L1 while the row blocks pass.
  for (size_t n0 = 0; n0 < N; n0 += 32) {
    const int nt = N - n0 > 16 ? 2 : 1;
    const uint32_t* b = B + n0;
    for (size_t i0 = 0; i0 < M; i0 += 32) {
      const size_t mr = std::min<size_t>(32, M - i0);
      const int mt = mr > 16 ? 2 : 1;
      const size_t steps = la_amx_depth(lower ? std::min(depth, i0 + mr) : depth) / 32;
      const uint16_t* a = A + i0 * lda;
      if (a_terms > 1 && b_terms > 1) block_any<2, 2>(mt, nt, a, lda, a_ts, b, ldb, b_ts, steps, buf, hook);
      else if (a_terms > 1) block_any<2, 1>(mt, nt, a, lda, a_ts, b, ldb, b_ts, steps, buf, hook);
      else if (b_terms > 1) block_any<1, 2>(mt, nt, a, lda, a_ts, b, ldb, b_ts, steps, buf, hook);
      else block_any<1, 1>(mt, nt, a, lda, a_ts, b, ldb, b_ts, steps, buf, hook);
      finish(i0, n0, mr, nt);
    }
  }
}

#else  // no AMX code in this build: la_amx_usable() is false and nothing below runs

void la_amx_release() {}
void la_amx_pack_pairs(const float*, size_t, size_t, size_t, const float*, int, uint32_t*, size_t, size_t) {}
void la_amx_pack_rows(const float*, size_t, size_t, size_t, bool, int, uint16_t*, size_t, size_t) {}
void la_amx_unpair(const uint32_t*, size_t, size_t, size_t, uint16_t*, size_t) {}
void la_amx_gemm(const uint16_t*, size_t, size_t, int, const uint32_t*, size_t, size_t, int, float*, size_t, size_t,
                 size_t, size_t, bool, AmxStore, const float*, const float*, AmxHook) {}

#endif

}  // namespace hanpu::cpu
