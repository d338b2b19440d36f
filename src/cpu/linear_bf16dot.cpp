// AVX512-BF16 kernels of Bf16Linear on the checkpoint's own layout (LinearBackend::kAvx512Bf16),
// for CPUs that have VDPBF16PS but no AMX (AMD Zen 4 and Zen 5; Intel Cooper Lake). x86-64 with
// GCC/Clang only; every function is compiled for those extensions through target attributes and
// called only after avx512bf16_usable() said yes.
//
// Why: VDPBF16PS does 32 multiply-adds (bf16 pairs into f32) per instruction. On Zen 4 it issues
// at the rate of a 512-bit f32 FMA (measured on an EPYC family 25 model 17: the same instructions
// per second as VFMADD231PS, so twice the multiply-adds), so with activations rounded to bf16
// (LinearPrecision::kBf16, what llama.cpp's BF16 models do) the projections can run at twice the
// f32 FMA peak. (On Sapphire Rapids it issues at half that rate and gains nothing: see
// gram_bf16.cpp; there AMX is used instead. Where a hypervisor hides AMX from such a Xeon, the
// auto backend measures the rate, bf16dot_mac_ratio(), and keeps the f32 kernel.) Only the
// one-term mode runs here: splitting the activations into two or three bf16 terms (as the AMX
// backend does for bf16x2 / exact) costs two or three instructions per pair, measured on Zen 4 (M = 512, K = 1024, N = 3584, one thread):
// 3 terms 0.63x and 2 terms 0.99x the f32 FMA kernel, so exact and bf16x2 run linear_portable's
// f32 kernel instead (bf16x2 then is exact). The activations are rounded to bf16 by
// amx_pack_gemv_rows with one term, the rounding the AMX backend uses.
//
// Two forms, as in linear_portable.cpp:
//   few rows (decode): dot products, one weight row after the other (address order). Each weight
//     vector is read once, 32 bf16 per instruction, no widening, and reused by up to 4 activation
//     rows.
//   many rows (prefill): a GEMM in broadcast form. A panel of kPanelColumns weight rows is
//     transposed once per row pass into k pairs, [K/2][kPanelColumns] 32-bit words (the layout
//     VDPBF16PS wants for its second operand; each word is two adjacent bf16 of one weight row, so
//     the transpose moves 32-bit words and needs no conversion), and register tiles of kTileRows
//     rows x 3 vectors accumulate broadcast activation pairs times panel rows. No second copy of
//     the weight is kept: the panel (K * 96 bytes) is per-thread scratch.
#include "cpu/linear_kernels.hpp"
#include "hanpu/isa.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cpu/x86_features.hpp"
#ifdef HANPU_X86_KERNELS
#define HANPU_HAVE_BF16DOT_CODE 1
#endif

namespace hanpu::cpu {

#if HANPU_HAVE_BF16DOT_CODE

#define HANPU_BF16DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

// GEMM register tile: kTileRows rows x kPanelVectors vectors of 16 columns = 24 accumulators,
// plus 3 panel vectors and the broadcast: 28 of the 32 zmm registers. 24 independent chains
// cover VDPBF16PS's latency (6 cycles on Zen 4) at one issue per cycle even with one term.
constexpr int kTileRows = 8;
constexpr int kPanelVectors = 3;
constexpr int64_t kPanelColumns = 16 * kPanelVectors;
// The panel is transposed in blocks of this many k pairs, so that each weight row is read in
// 256-byte runs and the writes stay in a 12 KiB (L1) part of the panel.
constexpr int64_t kTransposeBlock = 64;

bool detect_avx512bf16() { return x86::avx512_core_usable() && x86::has_avx512_bf16(); }

// ---- dot form -------------------------------------------------------------------------------
// Rows [0, MR) of xs (row i at i * Kp, zero past K) times weight rows [n, n + NR): one
// accumulator per (row, weight row). The last partial
// 32-k step of each weight row is a masked load (past K the row belongs to the next row or to no
// allocation at all).

// Rows [0, MR) of xs (row i at i * Kp, zero past K) times weight row n, in weight-row order: the
// weight streams through memory in address order, which the hardware prefetchers follow (reading
// several rows side by side, as linear_portable.cpp's RowOrderDots explains, halved the DRAM
// rate). Four accumulators per activation row over k hide VDPBF16PS's latency; the last partial
// 32-k step is a masked load (past K the row belongs to the next row or to no allocation).
template <int MR>
HANPU_BF16DOT_TARGET void dot_row(const uint16_t* w, int64_t K, const uint16_t* xs, int64_t Kp, float* y, int64_t ldy,
                                  int64_t n, bool accumulate) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < 4; ++u) acc[i][u] = _mm512_setzero_ps();
  const uint16_t* row = w + n * K;
  int64_t k = 0;
  for (; k + 128 <= K; k += 128)
    for (int u = 0; u < 4; ++u) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(row + k + 32 * u);
      for (int i = 0; i < MR; ++i)
        acc[i][u] = _mm512_dpbf16_ps(acc[i][u], (__m512bh)_mm512_loadu_si512(xs + i * Kp + k + 32 * u), wv);
    }
  for (; k < K; k += 32) {
    const __mmask32 mask = K - k >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (K - k)) - 1);
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, row + k);
    for (int i = 0; i < MR; ++i)
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)_mm512_loadu_si512(xs + i * Kp + k), wv);
  }
  for (int i = 0; i < MR; ++i) {
    const float sum =
        x86::horizontal_sum(_mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3])));
    float& out = y[i * ldy + n];
    out = accumulate ? out + sum : sum;
  }
}

HANPU_BF16DOT_TARGET void dot_form(const uint16_t* w, int64_t K, const uint16_t* xs, int64_t Kp, int64_t M, float* y,
                                   int64_t ldy, int64_t n0, int64_t n1, bool accumulate) {
  // Columns in slices whose weight rows (128 x K x 2 bytes, 256 KiB at K = 1024) stay in L2 while
  // every group of 4 activation rows passes over them; one row (decode) streams the weight once.
  constexpr int64_t kColumnSlice = 128;
  for (int64_t c0 = n0; c0 < n1; c0 += kColumnSlice) {
    const int64_t c1 = std::min(n1, c0 + kColumnSlice);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
      for (int64_t n = c0; n < c1; ++n) dot_row<4>(w, K, xs + m * Kp, Kp, y + m * ldy, ldy, n, accumulate);
    for (; m + 2 <= M; m += 2)
      for (int64_t n = c0; n < c1; ++n) dot_row<2>(w, K, xs + m * Kp, Kp, y + m * ldy, ldy, n, accumulate);
    for (; m < M; ++m)
      for (int64_t n = c0; n < c1; ++n) dot_row<1>(w, K, xs + m * Kp, Kp, y + m * ldy, ldy, n, accumulate);
  }
}

// ---- GEMM form ------------------------------------------------------------------------------
// panel[kp * kPanelColumns + c] = the bf16 pair (w[n + c][2kp], w[n + c][2kp + 1]) for c < width,
// zero for the padding columns; an odd K's last pair has a zero second half.
void transpose_panel(const uint16_t* w, int64_t K, int64_t n, int64_t width, uint32_t* panel) {
  const int64_t pairs = (K + 1) / 2, whole = K / 2;
  for (int64_t p0 = 0; p0 < pairs; p0 += kTransposeBlock) {
    const int64_t p1 = std::min(pairs, p0 + kTransposeBlock), w1 = std::min(p1, whole);
    for (int64_t c = 0; c < kPanelColumns; ++c) {
      uint32_t* dst = panel + c;
      if (c >= width) {
        for (int64_t p = p0; p < p1; ++p) dst[p * kPanelColumns] = 0;
        continue;
      }
      const uint16_t* row = w + (n + c) * K;
      for (int64_t p = p0; p < w1; ++p) {
        uint32_t pair;
        std::memcpy(&pair, row + 2 * p, 4);
        dst[p * kPanelColumns] = pair;
      }
      if (w1 < p1) dst[w1 * kPanelColumns] = row[K - 1];  // odd K: (w[K-1], 0), little-endian pair
    }
  }
}

// Rows [0, MR) x the panel's columns [0, width): every k pair, then one store.
template <int MR>
HANPU_BF16DOT_TARGET void gemm_tile(const uint32_t* panel, int64_t pairs, const uint16_t* xs, int64_t Kp, float* y,
                                    int64_t ldy, int64_t width, bool accumulate) {
  __m512 acc[MR][kPanelVectors];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kPanelVectors; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[kPanelVectors];
    for (int j = 0; j < kPanelVectors; ++j)
      b[j] = (__m512bh)_mm512_loadu_si512(panel + p * kPanelColumns + 16 * j);
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, xs + i * Kp + 2 * p, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < kPanelVectors; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* yr = y + i * ldy;
    for (int j = 0; j < kPanelVectors; ++j) {
      const int64_t cnt = std::clamp<int64_t>(width - 16 * j, 0, 16);
      if (cnt == 0) break;
      const __mmask16 mask = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
      __m512 v = acc[i][j];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yr + 16 * j));
      _mm512_mask_storeu_ps(yr + 16 * j, mask, v);
    }
  }
}

HANPU_BF16DOT_TARGET void gemm_form(const uint16_t* w, int64_t K, const uint16_t* xs, int64_t Kp, int64_t M, float* y,
                                    int64_t ldy, int64_t n0, int64_t n1, bool accumulate, uint32_t* panel) {
  const int64_t pairs = (K + 1) / 2, rs = Kp;
  for (int64_t n = n0; n < n1; n += kPanelColumns) {
    const int64_t width = std::min(kPanelColumns, n1 - n);
    transpose_panel(w, K, n, width, panel);
    int64_t m = 0;
    for (; m + kTileRows <= M; m += kTileRows)
      gemm_tile<kTileRows>(panel, pairs, xs + m * rs, Kp, y + m * ldy + n, ldy, width, accumulate);
    for (; m + 4 <= M; m += 4) gemm_tile<4>(panel, pairs, xs + m * rs, Kp, y + m * ldy + n, ldy, width, accumulate);
    for (; m < M; ++m) gemm_tile<1>(panel, pairs, xs + m * rs, Kp, y + m * ldy + n, ldy, width, accumulate);
  }
}

}  // namespace

bool avx512bf16_usable() {
  // HANPU_ISA below "native" turns the kernels outside Highway off (hanpu/isa.hpp).
  static const bool usable = detect_avx512bf16();
  return usable && isa_selection().native;
}

namespace {

// Instructions of one kind per nanosecond on one core, in registers only: kChains independent
// accumulators, as many as the GEMM tile above keeps (kTileRows x kPanelVectors), so the figure is
// the rate the kernel can reach (on a Xeon model 207 VDPBF16PS has a long latency: with 12 chains
// it measured 0.51-0.57x of the FMA's multiply-adds, with 24 0.85-1.28x); kRounds rounds (about
// 0.2 ms) per repeat. The caller alternates the two instructions' repeats after a warm-up and keeps
// each one's best (a core that was descheduled or still raising its clock gives a slower repeat,
// never a faster one), so both are timed under the same conditions: timing all FMA repeats before
// all VDPBF16PS repeats gave 0.81-1.78 over 20 processes on a Xeon model 207 (two at 1.49 and
// 1.78, one past kBf16DotMinMacRatio), alternating gave 0.77-1.06 (docs/LINEAR.md).
constexpr int kChains = kTileRows * kPanelVectors;
constexpr int kRounds = 8192;
constexpr int kRepeats = 9;
constexpr int kWarmupRepeats = 16;  // ~3 ms of 512-bit FMAs before anything is timed

template <bool kDot>
HANPU_BF16DOT_TARGET double instructions_per_ns(int repeats) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1e-3f * static_cast<float>(c));
  // Small values so that nothing overflows over kRounds * kRepeats accumulations.
  const __m512 a = _mm512_set1_ps(1e-4f), b = _mm512_set1_ps(0.5f);
  const __m512bh ab = _mm512_cvtne2ps_pbh(a, a), bb = _mm512_cvtne2ps_pbh(b, b);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = kDot ? _mm512_dpbf16_ps(acc[c], ab, bb) : _mm512_fmadd_ps(a, b, acc[c]);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    if (ns > 0) best = std::max(best, kRounds * kChains / ns);
  }
  // Keep the accumulators alive: the loop must not be dropped as dead code.
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return best;
}

}  // namespace

double bf16dot_mac_ratio() {
  static const double ratio = [] {
    if (!detect_avx512bf16()) return 0.0;
    (void)instructions_per_ns<false>(kWarmupRepeats);
    double fma = 0, dot = 0;
    for (int r = 0; r < kRepeats; ++r) {
      fma = std::max(fma, instructions_per_ns<false>(1));
      dot = std::max(dot, instructions_per_ns<true>(1));
    }
    // 32 bf16 multiply-adds per VDPBF16PS against 16 f32 per VFMADD231PS.
    return fma > 0 ? (32.0 * dot) / (16.0 * fma) : 0.0;
  }();
  return ratio;
}

bool bf16dot_pays() { return avx512bf16_usable() && bf16dot_mac_ratio() >= kBf16DotMinMacRatio; }

int64_t bf16dot_panel_words(int64_t K) { return (K + 1) / 2 * kPanelColumns; }

void bf16dot_linear(const uint16_t* w, int64_t K, const uint16_t* xs, int64_t M, float* y, int64_t ldy, int64_t n0,
                    int64_t n1, bool accumulate, uint32_t* panel) {
  const int64_t Kp = amx_k_steps(K) * kAmxK;
  if (panel != nullptr) gemm_form(w, K, xs, Kp, M, y, ldy, n0, n1, accumulate, panel);
  else dot_form(w, K, xs, Kp, M, y, ldy, n0, n1, accumulate);
}

#else  // no AVX512-BF16 code on this architecture / compiler: the portable backend is used.

bool avx512bf16_usable() { return false; }
double bf16dot_mac_ratio() { return 0.0; }
bool bf16dot_pays() { return false; }
int64_t bf16dot_panel_words(int64_t) { return 0; }
void bf16dot_linear(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t, int64_t, bool,
                    uint32_t*) {}

#endif

}  // namespace hanpu::cpu
