// AMX and AVX512-BF16 kernels of Bf16Linear (see linear_kernels.hpp). x86-64 with GCC/Clang only;
// every function here is compiled for those ISA extensions through target attributes and only
// called after amx_usable() said yes, so the rest of the binary stays baseline x86-64.
//
// Why AMX: one TDPBF16PS does 16x16x32 multiply-adds; measured here 2.87 TFLOP/s per core on
// bf16, 13x the f32 FMA peak (~220 GFLOP/s). Checkpoint weights are already bf16, but the
// activations are f32, so each activation is split into bf16 terms and the products of every
// term are accumulated: with truncation, x = hi + mid + lo exactly (8 + 8 + 8 significant bits
// cover f32's 24), each bf16 x bf16 product is exact in f32, and the instruction accumulates in
// f32. Three terms are thus the exact f32-activation GEMM at a third of the bf16 speed, still
// ~4x the f32 FMA peak.
//
// GEMM blocking (per thread, its column range):
//   for each column block of kNC columns         C block (rows x kNC f32) lives in cbuf (L2)
//     for each k block of kKC steps               weight block kKC*32 x kNC bf16 (L2)
//       for each strip of 32 rows                 activation strip 32 x kKC*32 x terms (L1)
//         for each panel of 32 columns            2x2 C tiles: load, kKC steps of TDPs, store
//   then copy the C block out into y.
#include "cpu/linear_kernels.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HANPU_HAVE_AMX_CODE 1
#include <cpuid.h>
#include <immintrin.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace hanpu::cpu {

#if HANPU_HAVE_AMX_CODE

#define HANPU_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

namespace {

// k steps (of 32) per k block: the activation strip of one k block, 32 rows x kKC*32 x 3 terms
// x 2 bytes = 24 KiB at kKC = 4, stays in the 48 KiB L1 while it meets every panel of the column
// block; the C tiles are reloaded once per k block (4 KiB per 48 TDPs).
constexpr int64_t kKC = 4;
// Columns per column block: the C block of one 256-row pass, 256 x 512 x 4 = 512 KiB, and the
// weight block (kKC*32 x 512 x 2 = 128 KiB) share the 2 MiB L2.
constexpr int64_t kNC = 512;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

HANPU_AMX_TARGET void load_tile_config() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {  // every tile 16 rows x 64 bytes
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// Splits 32 floats (the first `valid`, the rest zero) into `terms` bf16 vectors, term t written
// to dst + t * term_stride. Truncation for all but the last term keeps the split exact; the last
// term rounds to nearest (for one term that is plain f32 -> bf16 rounding).
HANPU_AMX_TARGET inline void split32(const float* src, int64_t valid, int terms, uint16_t* dst, int64_t term_stride) {
  const __mmask16 m0 = valid >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << std::max<int64_t>(valid, 0)) - 1);
  const int64_t v1 = valid - 16;
  const __mmask16 m1 = v1 >= 16 ? 0xFFFF : (v1 <= 0 ? 0 : static_cast<__mmask16>((1u << v1) - 1));
  __m512 r0 = _mm512_maskz_loadu_ps(m0, src);
  __m512 r1 = _mm512_maskz_loadu_ps(m1, src + 16);
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int t = 0; t < terms; ++t) {
    uint16_t* out = dst + t * term_stride;
    if (t == terms - 1) {
      const __m256i lo = (__m256i)_mm512_cvtneps_pbh(r0);
      const __m256i hi = (__m256i)_mm512_cvtneps_pbh(r1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), hi);
    } else {
      const __m512i b0 = _mm512_and_si512(_mm512_castps_si512(r0), hi_mask);
      const __m512i b1 = _mm512_and_si512(_mm512_castps_si512(r1), hi_mask);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b0, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b1, 16)));
      r0 = _mm512_sub_ps(r0, _mm512_castsi512_ps(b0));  // exact: the low bits of r0
      r1 = _mm512_sub_ps(r1, _mm512_castsi512_ps(b1));
    }
  }
}

// 2x2 register block: C tiles 0..3 = rows (a0 | a1) x columns (b0 | b1). a0/a1 point at the first
// term tile of k step 0 of their 16-row block; b0/b1 at k step 0 of their 16-column block.
template <int kTerms>
HANPU_AMX_TARGET inline void micro_2x2(const uint16_t* a0, const uint16_t* a1, const uint16_t* b0,
                                       const uint16_t* b1, int64_t ks0, int64_t ks1, float* c, bool zero) {
  constexpr int64_t kTile = 512;  // uint16_t per tile
  if (zero) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    _tile_loadd(2, c + 512, 64);
    _tile_loadd(3, c + 768, 64);
  }
  for (int64_t ks = ks0; ks < ks1; ++ks) {
    _tile_loadd(6, b0 + ks * kTile, 64);
    _tile_loadd(7, b1 + ks * kTile, 64);
    for (int t = 0; t < kTerms; ++t) {
      _tile_loadd(4, a0 + (ks * kTerms + t) * kTile, 64);
      _tile_loadd(5, a1 + (ks * kTerms + t) * kTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}

template <int kTerms>
HANPU_AMX_TARGET void gemm_terms(const uint16_t* ap, int64_t strip0, int64_t strip1, int64_t rows,
                                 const uint16_t* wp, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy,
                                 bool accumulate, float* cbuf) {
  const int64_t KS = amx_k_steps(K);
  const int64_t a_block = KS * kTerms * 512;  // uint16_t per 16-row block
  const int64_t w_block = KS * 512;           // uint16_t per 16-column block
  const int64_t strips = strip1 - strip0;
  load_tile_config();
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kNC) {
    const int64_t nc1 = std::min(n1, nc0 + kNC);
    const int64_t panels = (nc1 - nc0 + kAmxN - 1) / kAmxN;
    for (int64_t ks0 = 0; ks0 < KS; ks0 += kKC) {
      const int64_t ks1 = std::min(KS, ks0 + kKC);
      for (int64_t s = 0; s < strips; ++s) {
        const uint16_t* a0 = ap + (2 * (strip0 + s)) * a_block;
        const uint16_t* a1 = a0 + a_block;
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t nb = nc0 / 16 + 2 * p;
          micro_2x2<kTerms>(a0, a1, wp + nb * w_block, wp + (nb + 1) * w_block, ks0, ks1,
                            cbuf + (s * panels + p) * 1024, ks0 == 0);
        }
      }
    }
    // C block -> y. cbuf tile (s, p, i, j) holds rows 32s + 16i .. and columns 32p + 16j ..
    for (int64_t s = 0; s < strips; ++s) {
      for (int i = 0; i < 2; ++i) {
        for (int r = 0; r < 16; ++r) {
          const int64_t m = (strip0 + s) * kAmxRows + 16 * i + r;
          if (m >= rows) break;
          float* yrow = y + m * ldy;
          for (int64_t p = 0; p < panels; ++p) {
            for (int j = 0; j < 2; ++j) {
              const int64_t n = nc0 + 32 * p + 16 * j;
              if (n >= nc1) break;
              const int64_t cnt = std::min<int64_t>(16, nc1 - n);
              const __mmask16 mask = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
              __m512 v = _mm512_loadu_ps(cbuf + (s * panels + p) * 1024 + (2 * i + j) * 256 + r * 16);
              if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yrow + n));
              _mm512_mask_storeu_ps(yrow + n, mask, v);
            }
          }
        }
      }
    }
  }
  _tile_release();  // the OS then need not save 8 KiB of tile data on every context switch
}

// GEMV: 4 column blocks x `terms` accumulators of 16 columns, one per (block, term) so the
// VDPBF16PS chains are independent (latency ~5 cycles, two per cycle).
template <int kTerms, int kBlocks>
HANPU_AMX_TARGET inline void gemv_blocks(const uint16_t* xs, int64_t Kp, const uint16_t* wp, int64_t KS,
                                         int64_t nb, int64_t n1, float* yrow, bool accumulate) {
  __m512 acc[kBlocks][kTerms];
  for (int b = 0; b < kBlocks; ++b)
    for (int t = 0; t < kTerms; ++t) acc[b][t] = _mm512_setzero_ps();
  const uint16_t* w0 = wp + nb * KS * 512;
  for (int64_t ks = 0; ks < KS; ++ks) {
    for (int r = 0; r < 16; ++r) {
      const int64_t k = ks * 32 + 2 * r;
      __m512bh xb[kTerms];
      for (int t = 0; t < kTerms; ++t) {
        uint32_t pair;
        std::memcpy(&pair, xs + t * Kp + k, 4);
        xb[t] = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      }
      for (int b = 0; b < kBlocks; ++b) {
        const __m512bh w = (__m512bh)_mm512_loadu_si512(w0 + (b * KS + ks) * 512 + r * 32);
        for (int t = 0; t < kTerms; ++t) acc[b][t] = _mm512_dpbf16_ps(acc[b][t], xb[t], w);
      }
    }
  }
  for (int b = 0; b < kBlocks; ++b) {
    __m512 sum = acc[b][0];
    for (int t = 1; t < kTerms; ++t) sum = _mm512_add_ps(sum, acc[b][t]);
    const int64_t n = (nb + b) * 16;
    if (n >= n1) break;
    const int64_t cnt = std::min<int64_t>(16, n1 - n);
    const __mmask16 mask = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
    if (accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, yrow + n));
    _mm512_mask_storeu_ps(yrow + n, mask, sum);
  }
}

template <int kTerms>
HANPU_AMX_TARGET void gemv_terms(const uint16_t* xs, int64_t rows, const uint16_t* wp, int64_t K, int64_t n0,
                                 int64_t n1, float* y, int64_t ldy, bool accumulate) {
  const int64_t KS = amx_k_steps(K), Kp = KS * kAmxK;
  const int64_t nb1 = (n1 + 15) / 16;
  for (int64_t nb = n0 / 16; nb < nb1; nb += 4) {
    for (int64_t m = 0; m < rows; ++m) {
      const uint16_t* x = xs + m * kTerms * Kp;
      switch (std::min<int64_t>(4, nb1 - nb)) {
        case 4: gemv_blocks<kTerms, 4>(x, Kp, wp, KS, nb, n1, y + m * ldy, accumulate); break;
        case 3: gemv_blocks<kTerms, 3>(x, Kp, wp, KS, nb, n1, y + m * ldy, accumulate); break;
        case 2: gemv_blocks<kTerms, 2>(x, Kp, wp, KS, nb, n1, y + m * ldy, accumulate); break;
        default: gemv_blocks<kTerms, 1>(x, Kp, wp, KS, nb, n1, y + m * ldy, accumulate); break;
      }
    }
  }
}

bool detect_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512 = (b >> 16 & 1) && (b >> 17 & 1) && (b >> 30 & 1) && (b >> 31 & 1);  // F DQ BW VL
  const bool amx = (d >> 22 & 1) && (d >> 24 & 1);                                       // BF16 TILE
  if (!avx512 || !amx) return false;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) return false;  // AVX512_BF16
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return false;           // OSXSAVE
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE6u) != 0xE6u) return false;  // SSE, AVX, opmask, ZMM state enabled by the OS
#ifdef __linux__
  // Linux >= 5.16 hands out the 8 KiB tile-data state only on request; once per process.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo >> 17 & 3u) == 3u;  // XTILECFG, XTILEDATA
}

}  // namespace

bool amx_usable() {
  static const bool usable = detect_amx();
  return usable;
}

void amx_pack_weight(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) {
  const int64_t KS = amx_k_steps(K), NP = amx_n_padded(N);
  for (int64_t nb = 0; nb < NP / 16; ++nb) {
    for (int64_t ks = 0; ks < KS; ++ks) {
      uint16_t* tile = out + (nb * KS + ks) * 512;
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t n = nb * 16 + c;
        for (int64_t r = 0; r < 16; ++r) {
          for (int64_t p = 0; p < 2; ++p) {
            const int64_t k = ks * 32 + 2 * r + p;
            tile[r * 32 + c * 2 + p] = (n < N && k < K) ? w[n * K + k] : 0;
          }
        }
      }
    }
  }
}

HANPU_AMX_TARGET void amx_pack_rows(const float* x, int64_t ldx, int64_t rows, int64_t rows_padded, int64_t K,
                                    int terms, uint16_t* out) {
  const int64_t KS = amx_k_steps(K);
  for (int64_t m = 0; m < rows_padded; ++m) {
    const int64_t mb = m / 16, i = m % 16;
    for (int64_t ks = 0; ks < KS; ++ks) {
      uint16_t* dst = out + ((mb * KS + ks) * terms) * 512 + i * 32;
      split32(x + m * ldx + ks * 32, m < rows ? K - ks * 32 : 0, terms, dst, 512);
    }
  }
}

HANPU_AMX_TARGET void amx_pack_gemv_rows(const float* x, int64_t ldx, int64_t rows, int64_t K, int terms,
                                         uint16_t* out) {
  const int64_t KS = amx_k_steps(K), Kp = KS * kAmxK;
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t ks = 0; ks < KS; ++ks)
      split32(x + m * ldx + ks * 32, K - ks * 32, terms, out + m * terms * Kp + ks * 32, Kp);
}

int64_t amx_cbuf_floats(int64_t strips) { return strips * (kNC / kAmxN) * 1024; }

void amx_gemm(const uint16_t* a_packed, int64_t strip0, int64_t strip1, int64_t rows, int terms,
              const uint16_t* w_packed, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy,
              bool accumulate, float* cbuf) {
  switch (terms) {
    case 1: gemm_terms<1>(a_packed, strip0, strip1, rows, w_packed, K, n0, n1, y, ldy, accumulate, cbuf); break;
    case 2: gemm_terms<2>(a_packed, strip0, strip1, rows, w_packed, K, n0, n1, y, ldy, accumulate, cbuf); break;
    default: gemm_terms<3>(a_packed, strip0, strip1, rows, w_packed, K, n0, n1, y, ldy, accumulate, cbuf); break;
  }
}

void amx_gemv(const uint16_t* xs, int64_t rows, int terms, const uint16_t* w_packed, int64_t K, int64_t n0,
              int64_t n1, float* y, int64_t ldy, bool accumulate) {
  switch (terms) {
    case 1: gemv_terms<1>(xs, rows, w_packed, K, n0, n1, y, ldy, accumulate); break;
    case 2: gemv_terms<2>(xs, rows, w_packed, K, n0, n1, y, ldy, accumulate); break;
    default: gemv_terms<3>(xs, rows, w_packed, K, n0, n1, y, ldy, accumulate); break;
  }
}

#else  // no AMX code on this architecture / compiler: the portable backend is used.

bool amx_usable() { return false; }
void amx_pack_weight(const uint16_t*, int64_t, int64_t, uint16_t*) {}
void amx_pack_rows(const float*, int64_t, int64_t, int64_t, int64_t, int, uint16_t*) {}
void amx_pack_gemv_rows(const float*, int64_t, int64_t, int64_t, int, uint16_t*) {}
int64_t amx_cbuf_floats(int64_t) { return 0; }
void amx_gemm(const uint16_t*, int64_t, int64_t, int64_t, int, const uint16_t*, int64_t, int64_t, int64_t, float*,
              int64_t, bool, float*) {}
void amx_gemv(const uint16_t*, int64_t, int, const uint16_t*, int64_t, int64_t, int64_t, float*, int64_t, bool) {}

#endif

}  // namespace hanpu::cpu
