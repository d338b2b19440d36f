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
// C tiles inside y are loaded from / stored to y directly on the first / last k block; edge
// blocks (partial rows or columns) go through cbuf and a masked copy.
#include "cpu/linear_kernels.hpp"
#include "hanpu/isa.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/x86_features.hpp"
#ifdef HANPU_X86_KERNELS
#define HANPU_HAVE_AMX_CODE 1
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

// k steps (of 32) per k block (kAmxKBlock = 4): the activation strip of one k block, 32 rows x
// 128 k x 3 terms x 2 bytes = 24 KiB, stays in the 48 KiB L1 while it meets every panel of the
// column block, next to the current weight panel (8 KiB); the C tiles are
// reloaded once per k block (4 KiB per 48 TDPs). Measured (M=512, K=1024, N=8192, exact, 64-row
// passes, GFLOP per CPU-second on a loaded machine, 3 rounds interleaved): k blocks of 2/4/8/32
// steps 240-266 / 373-395 / 305-320 / 351-379. Column blocks of 128 to 2048 were within noise.
constexpr int64_t kKC = kAmxKBlock;
// Columns per column block: the C block of one 64-row pass (linear_bf16.cpp), 64 x 512 x 4 =
// 128 KiB, and the weight block (kKC*32 x 512 x 2 = 128 KiB) share the 2 MiB L2 with the pass's
// packed rows.
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
  // GCC 12's ldtilecfg builtin does not tell the optimiser that it reads cfg: out of line, the
  // stores above were dropped as dead (only palette_id survived) and the first tile instruction
  // raised SIGILL. The barrier makes them happen.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
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
    __m512 p0 = r0, p1 = r1;  // the last term: rounded to nearest by the conversion
    if (t < terms - 1) {      // the others: truncated, so the remainder below is exact
      p0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r0), hi_mask));
      p1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), hi_mask));
    }
    // A truncated part has 8 significant bits, so converting it to bf16 is exact.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(p0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), (__m256i)_mm512_cvtneps_pbh(p1));
    r0 = _mm512_sub_ps(r0, p0);
    r1 = _mm512_sub_ps(r1, p1);
  }
}

// 2x2 register block: C tiles 0..3 = rows (a0 | a1) x columns (b0 | b1) over nks k steps. a0/a1
// point at the first term tile of the block's first k step, b0/b1 at its weight tiles (nks
// consecutive tiles each). C comes from c_in (row stride ldc_in floats) unless `zero`, and goes to
// c_out. (Software prefetch of the next panel into L1 or L2 measured no gain, with 256- and with
// 64-row passes: the panels of a k block are one contiguous run, which the hardware prefetchers
// follow.)
template <int kTerms>
HANPU_AMX_TARGET inline void micro_2x2(const uint16_t* a0, const uint16_t* a1, const uint16_t* b0, const uint16_t* b1,
                                       int64_t nks, const float* c_in, int64_t ldc_in, bool zero, float* c_out,
                                       int64_t ldc_out) {
  constexpr int64_t kTile = 512;  // uint16_t per tile
  const int64_t in_stride = ldc_in * 4, out_stride = ldc_out * 4;
  if (zero) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c_in, in_stride);
    _tile_loadd(1, c_in + 16, in_stride);
    _tile_loadd(2, c_in + 16 * ldc_in, in_stride);
    _tile_loadd(3, c_in + 16 * ldc_in + 16, in_stride);
  }
  for (int64_t ks = 0; ks < nks; ++ks) {
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
  _tile_stored(0, c_out, out_stride);
  _tile_stored(1, c_out + 16, out_stride);
  _tile_stored(2, c_out + 16 * ldc_out, out_stride);
  _tile_stored(3, c_out + 16 * ldc_out + 16, out_stride);
}

template <int kTerms>
HANPU_AMX_TARGET void gemm_terms(const uint16_t* ap, int64_t strip0, int64_t strip1, int64_t rows,
                                 const uint16_t* wp, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y,
                                 int64_t ldy, bool accumulate, float* cbuf) {
  const int64_t KS = amx_k_steps(K), NB = amx_n_padded(N) / 16;
  const int64_t a_block = KS * kTerms * 512;  // uint16_t per 16-row block
  const int64_t strips = strip1 - strip0;
  load_tile_config();
  for (int64_t nc0 = n0; nc0 < n1; nc0 += kNC) {
    const int64_t nc1 = std::min(n1, nc0 + kNC);
    const int64_t panels = (nc1 - nc0 + kAmxN - 1) / kAmxN;
    // cbuf holds the C blocks between k blocks: block (s, p) at (s * panels + p) * 1024, 32 x 32
    // row-major. Blocks entirely inside [0, rows) x [nc0, nc1) take C from y on the first k block
    // (when accumulating) and write it to y on the last; edge blocks go through cbuf and a masked
    // copy at the end.
    for (int64_t ks0 = 0; ks0 < KS; ks0 += kKC) {
      const int64_t nks = std::min(kKC, KS - ks0);
      const bool first = ks0 == 0, last = ks0 + nks == KS;
      for (int64_t s = 0; s < strips; ++s) {
        const int64_t m = (strip0 + s) * kAmxRows;
        const uint16_t* a0 = ap + (2 * (strip0 + s)) * a_block + ks0 * kTerms * 512;
        const uint16_t* a1 = a0 + a_block;
        const bool full_rows = m + kAmxRows <= rows;
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t n = nc0 + p * kAmxN, nb = n / 16;
          const uint16_t* b0 = wp + amx_weight_tile(nb, ks0, NB, KS);
          const uint16_t* b1 = b0 + nks * 512;
          float* cb = cbuf + (s * panels + p) * 1024;
          const bool full = full_rows && n + kAmxN <= nc1;
          const float* c_in = cb;
          int64_t ldc_in = 32;
          if (first && full && accumulate) {
            c_in = y + m * ldy + n;
            ldc_in = ldy;
          }
          float* c_out = cb;
          int64_t ldc_out = 32;
          if (last && full) {
            c_out = y + m * ldy + n;
            ldc_out = ldy;
          }
          micro_2x2<kTerms>(a0, a1, b0, b1, nks, c_in, ldc_in, first && !(full && accumulate), c_out, ldc_out);
        }
      }
    }
    // Edge blocks: cbuf -> y.
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t m0 = (strip0 + s) * kAmxRows;
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t n = nc0 + p * kAmxN;
        if (m0 + kAmxRows <= rows && n + kAmxN <= nc1) continue;
        const float* cb = cbuf + (s * panels + p) * 1024;
        for (int64_t r = 0; r < kAmxRows && m0 + r < rows; ++r) {
          float* yrow = y + (m0 + r) * ldy;
          for (int j = 0; j < 2; ++j) {
            const int64_t nn = n + 16 * j;
            if (nn >= nc1) break;
            const int64_t cnt = std::min<int64_t>(16, nc1 - nn);
            const __mmask16 mask = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
            __m512 v = _mm512_loadu_ps(cb + r * 32 + 16 * j);
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yrow + nn));
            _mm512_mask_storeu_ps(yrow + nn, mask, v);
          }
        }
      }
    }
  }
  _tile_release();  // the OS then need not save 8 KiB of tile data on every context switch
}

// GEMV, in the order of the packed weight (k block after k block, each a contiguous run of column
// blocks), so the weight streams sequentially; y holds the partial sums between k blocks. Per k
// block, 4 column blocks x `terms` accumulators of 16 columns, one per (block, term) so the
// VDPBF16PS chains are independent (latency ~5 cycles; one issues per cycle here, measured).
template <int kTerms, int kBlocks>
HANPU_AMX_TARGET inline void gemv_blocks(const uint16_t* x, int64_t Kp, const uint16_t* w, int64_t nks, int64_t n,
                                         int64_t n1, float* yrow, bool init_zero) {
  __m512 acc[kBlocks][kTerms];
  __mmask16 mask[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t cnt = std::clamp<int64_t>(n1 - (n + 16 * b), 0, 16);
    mask[b] = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
    acc[b][0] = init_zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[b], yrow + n + 16 * b);
    for (int t = 1; t < kTerms; ++t) acc[b][t] = _mm512_setzero_ps();
  }
  for (int64_t ks = 0; ks < nks; ++ks) {
    for (int r = 0; r < 16; ++r) {
      const int64_t k = ks * 32 + 2 * r;
      __m512bh xb[kTerms];
      for (int t = 0; t < kTerms; ++t) {
        uint32_t pair;
        std::memcpy(&pair, x + t * Kp + k, 4);
        xb[t] = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      }
      for (int b = 0; b < kBlocks; ++b) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (b * nks + ks) * 512 + r * 32);
        for (int t = 0; t < kTerms; ++t) acc[b][t] = _mm512_dpbf16_ps(acc[b][t], xb[t], wv);
      }
    }
  }
  for (int b = 0; b < kBlocks; ++b) {
    __m512 sum = acc[b][0];
    for (int t = 1; t < kTerms; ++t) sum = _mm512_add_ps(sum, acc[b][t]);
    _mm512_mask_storeu_ps(yrow + n + 16 * b, mask[b], sum);
  }
}

template <int kTerms>
HANPU_AMX_TARGET void gemv_terms(const uint16_t* xs, int64_t rows, const uint16_t* wp, int64_t K, int64_t N,
                                 int64_t n0, int64_t n1, float* y, int64_t ldy, bool accumulate) {
  const int64_t KS = amx_k_steps(K), Kp = KS * kAmxK, NB = amx_n_padded(N) / 16;
  const int64_t nb1 = (n1 + 15) / 16;
  for (int64_t ks0 = 0; ks0 < KS; ks0 += kKC) {
    const int64_t nks = std::min(kKC, KS - ks0);
    const bool init_zero = ks0 == 0 && !accumulate;
    for (int64_t nb = n0 / 16; nb < nb1; nb += 4) {
      const uint16_t* w = wp + amx_weight_tile(nb, ks0, NB, KS);
      for (int64_t m = 0; m < rows; ++m) {
        const uint16_t* x = xs + m * kTerms * Kp + ks0 * kAmxK;
        float* yrow = y + m * ldy;
        switch (std::min<int64_t>(4, nb1 - nb)) {
          case 4: gemv_blocks<kTerms, 4>(x, Kp, w, nks, nb * 16, n1, yrow, init_zero); break;
          case 3: gemv_blocks<kTerms, 3>(x, Kp, w, nks, nb * 16, n1, yrow, init_zero); break;
          case 2: gemv_blocks<kTerms, 2>(x, Kp, w, nks, nb * 16, n1, yrow, init_zero); break;
          default: gemv_blocks<kTerms, 1>(x, Kp, w, nks, nb * 16, n1, yrow, init_zero); break;
        }
      }
    }
  }
}

bool detect_amx() {
  if (!x86::avx512_core_usable() || !x86::has_amx_bf16_tiles() || !x86::has_avx512_bf16()) return false;
#ifdef __linux__
  // Linux >= 5.16 hands out the 8 KiB tile-data state only on request; once per process.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return (x86::xcr0() >> 17 & 3u) == 3u;  // XTILECFG, XTILEDATA
}

}  // namespace

bool amx_usable() {
  // HANPU_ISA below "native" turns the kernels outside Highway off (hanpu/isa.hpp).
  static const bool usable = detect_amx();
  return usable && isa_selection().native;
}

HANPU_AMX_TARGET void amx_configure_tiles() { load_tile_config(); }
HANPU_AMX_TARGET void amx_release_tiles() { _tile_release(); }

void amx_pack_weight(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) {
  const int64_t KS = amx_k_steps(K), NB = amx_n_padded(N) / 16;
  for (int64_t nb = 0; nb < NB; ++nb) {
    for (int64_t ks = 0; ks < KS; ++ks) {
      uint16_t* tile = out + amx_weight_tile(nb, ks, NB, KS);
      if ((nb + 1) * 16 <= N && (ks + 1) * 32 <= K) {  // interior tile: a 16 x 16 transpose of pairs
        for (int64_t c = 0; c < 16; ++c) {
          const uint16_t* src = w + (nb * 16 + c) * K + ks * 32;
          for (int64_t r = 0; r < 16; ++r) std::memcpy(tile + r * 32 + c * 2, src + 2 * r, 4);
        }
        continue;
      }
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
              const uint16_t* w_packed, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y, int64_t ldy,
              bool accumulate, float* cbuf) {
  switch (terms) {
    case 1: gemm_terms<1>(a_packed, strip0, strip1, rows, w_packed, K, N, n0, n1, y, ldy, accumulate, cbuf); break;
    case 2: gemm_terms<2>(a_packed, strip0, strip1, rows, w_packed, K, N, n0, n1, y, ldy, accumulate, cbuf); break;
    default: gemm_terms<3>(a_packed, strip0, strip1, rows, w_packed, K, N, n0, n1, y, ldy, accumulate, cbuf); break;
  }
}

void amx_gemv(const uint16_t* xs, int64_t rows, int terms, const uint16_t* w_packed, int64_t K, int64_t N,
              int64_t n0, int64_t n1, float* y, int64_t ldy, bool accumulate) {
  switch (terms) {
    case 1: gemv_terms<1>(xs, rows, w_packed, K, N, n0, n1, y, ldy, accumulate); break;
    case 2: gemv_terms<2>(xs, rows, w_packed, K, N, n0, n1, y, ldy, accumulate); break;
    default: gemv_terms<3>(xs, rows, w_packed, K, N, n0, n1, y, ldy, accumulate); break;
  }
}

#else  // no AMX code on this architecture / compiler: the portable backend is used.

bool amx_usable() { return false; }
void amx_configure_tiles() {}
void amx_release_tiles() {}
void amx_pack_weight(const uint16_t*, int64_t, int64_t, uint16_t*) {}
void amx_pack_rows(const float*, int64_t, int64_t, int64_t, int64_t, int, uint16_t*) {}
void amx_pack_gemv_rows(const float*, int64_t, int64_t, int64_t, int, uint16_t*) {}
int64_t amx_cbuf_floats(int64_t) { return 0; }
void amx_gemm(const uint16_t*, int64_t, int64_t, int64_t, int, const uint16_t*, int64_t, int64_t, int64_t, int64_t,
              float*, int64_t, bool, float*) {}
void amx_gemv(const uint16_t*, int64_t, int, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*, int64_t,
              bool) {}

#endif

}  // namespace hanpu::cpu
