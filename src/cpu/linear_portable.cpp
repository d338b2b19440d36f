// Portable kernel of Bf16Linear (see linear_kernels.hpp): Highway, compiled once per SIMD target
// and dispatched at run time. The weight stays in the checkpoint layout [N, K]. Two forms:
//
//   few rows (M < kGemmMinRows, decode): dot products, one weight row after the other (the weight
//     streams in address order, which the hardware prefetchers follow: RowOrderDots); each weight
//     vector is read as 32-bit lanes holding a pair of bf16 values, widened in registers without a
//     shuffle (even element: lane << 16, odd element: lane & 0xFFFF0000; both exact), against
//     activation rows split once per call into even and odd halves (split_pairs_rows), and reused
//     by up to MR activation rows. Reductions happen once per output, after the whole K. The weight
//     is read once: memory bound, as decode must be.
//   many rows (prefill): a GEMM in broadcast form. A panel of PN weight rows is widened once into
//     an f32 buffer laid out [K][PN] (amortised over all M rows), then register tiles of MR rows x
//     PN columns accumulate x[m,k] (broadcast) * panel[k, :] over the whole K.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cpu/linear_kernels.hpp"
#include "cpu/workspace.hpp"
#include "hanpu/isa.hpp"
#include "cpu/x86_features.hpp"
#include "hanpu/tensor.hpp"  // Error

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/linear_portable.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <hwy/cache_control.h>

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// bf16 -> f32 (exact: the bits shifted up). Inline here rather than hanpu::bf16_to_f32: a call in
// the decode kernel's tail made the compiler keep the odd-lane mask on the stack across it and
// reload it on every step of the main loop (4-8% slower, measured on Zen 4).
inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Register block of the few-rows forms: RowOrderDots keeps MR x 4 accumulators (4 x 4 = 16 + a
// weight vector + an activation vector fit the 32 registers of AVX-512/NEON; 16-register x86
// targets use 2 x 4); BlockInt8 (int8 groups that split a vector) MR x kNR.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kMR = 2;
#else
constexpr int kMR = 4;
#endif
constexpr int kNR = 4;

// The few-rows form in weight-row order: each weight row is read start to end, one row after the
// other, so the weight streams through memory in address order, the one access pattern the
// hardware prefetchers follow across a whole matrix. (The earlier register block read four rows
// side by side: four short streams of K * 2 bytes that end inside a 4 KiB page, and the
// prefetchers kept re-training. Measured on Zen 4, the LM head 248320 x 1024 from DRAM, one
// thread: 4.8 GB/s before, 9.7-10.3 GB/s in this order, at the same CPU share.) Four accumulators
// per activation row over k hide the FMA latency; every row count uses the same four chains, so
// an output does not depend on how many rows share the call (batched decode equals
// single-sequence decode). weight_vector(k) returns the f32 weights [k, k + lanes) of the current
// row, weight_at(k) one of them.
template <int MR, class WeightVector, class WeightAt>
void RowOrderDots(int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n, bool accumulate,
                  const WeightVector& weight_vector, const WeightAt& weight_at) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<decltype(df)>;
  V acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < 4; ++u) acc[i][u] = hn::Zero(df);
  int64_t k = 0;
  for (; k + 4 * L <= K; k += 4 * L) {
    for (int u = 0; u < 4; ++u) {
      const V wv = weight_vector(k + u * L);
      for (int i = 0; i < MR; ++i) acc[i][u] = hn::MulAdd(hn::LoadU(df, x + i * ldx + k + u * L), wv, acc[i][u]);
    }
  }
  for (; k + L <= K; k += L) {
    const V wv = weight_vector(k);
    for (int i = 0; i < MR; ++i) acc[i][0] = hn::MulAdd(hn::LoadU(df, x + i * ldx + k), wv, acc[i][0]);
  }
  for (int i = 0; i < MR; ++i) {
    float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(acc[i][0], acc[i][1]), hn::Add(acc[i][2], acc[i][3]))));
    for (int64_t kk = k; kk < K; ++kk) sum += x[i * ldx + kk] * weight_at(kk);
    float& out = y[i * ldy + n];
    out = accumulate ? out + sum : sum;
  }
}

// The decode form of the bf16 weight (RowOrderDots' access order and chains). Each 32-bit lane of
// a weight vector holds the bf16 pair (k, k + 1) of one row; lane << 16 is element k in f32 and
// lane & 0xFFFF0000 element k + 1, so a vector of 2L weights becomes two f32 vectors with one shift
// and one AND, instead of a widening shuffle per L weights. The activations come pre-split
// (split_pairs_rows: per block of kPairBlock, the even elements, then the odd ones), so both
// products are plain FMAs. Measured on Zen 4 (AVX-512, one thread, a 248320 x 2048 weight from
// DRAM, 16 interleaved runs each): median 25.0 GB/s against 21.5 GB/s with the widening shuffle: the
// widening instructions, not the memory alone, limited the stream. Four chains:
// even and odd products of two consecutive pair vectors; every row count uses the same chains, so
// an output does not depend on how many rows share the call (batched decode equals
// single-sequence decode). Elements past the last whole block take the scalar tail from x.
// How far ahead RowBlockPairs prefetches its weight stream (`ahead` bytes, decode_prefetch_bytes;
// the matrix is contiguous, so this runs into the next rows). The best distance differs between
// the machines measured, 2 threads, the LM head GEMV (1024 x 248320 bf16) from DRAM:
//   Zen 3, five interleaved runs each: none 29.7 GB/s, 768 bytes 31.4, 1024 31.6, 1536 29.2,
//     2048 27.1 (further ahead evicts lines before use).
//   Xeon model 207 (Emerald Rapids, 2 MiB L2), in one process, 30 alternating rounds:
//     native 1024 22.1, 3072 23.3; AVX2 target 1024 19.3, 3072 21.3; a 15-round sweep of
//     1-8 KiB was flat from 2 to 6 KiB, and without prefetching 18.4 (native).
template <int MR>
void RowBlockPairs(const uint16_t* w, int64_t K, const float* xs, int64_t lds, const float* x, int64_t ldx, float* y,
                   int64_t ldy, int64_t n0, int64_t n1, bool accumulate, int64_t ahead_bytes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  using V = hn::Vec<decltype(df)>;
  constexpr int64_t L = static_cast<int64_t>(hn::MaxLanes(df));
  static_assert(kPairBlock % (2 * L) == 0, "a pair vector must not straddle two split blocks");
  const int64_t Kb = split_pairs_stride(K);  // elements in whole split blocks
  const auto odd_mask = hn::Set(du32, 0xFFFF0000u);
  const int64_t pairs = Kb / (2 * L);
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* row = w + n * K;
    V acc[MR][4];
    for (int i = 0; i < MR; ++i)
      for (int u = 0; u < 4; ++u) acc[i][u] = hn::Zero(df);
    // Pair vector j (bf16 elements [2Lj, 2Lj + 2L)) into chains c (even) and c + 1 (odd); its
    // activations: the evens at o, the odds kPairBlock / 2 further.
    const auto pair_step = [&](int64_t j, int c) {
      const auto lanes = hn::LoadU(du32, reinterpret_cast<const uint32_t*>(row + 2 * L * j));
      const V even = hn::BitCast(df, hn::ShiftLeft<16>(lanes));
      const V odd = hn::BitCast(df, hn::And(lanes, odd_mask));
      const int64_t o = (2 * L * j) / kPairBlock * kPairBlock + (2 * L * j) % kPairBlock / 2;
      for (int i = 0; i < MR; ++i) {
        acc[i][c] = hn::MulAdd(hn::LoadU(df, xs + i * lds + o), even, acc[i][c]);
        acc[i][c + 1] = hn::MulAdd(hn::LoadU(df, xs + i * lds + o + kPairBlock / 2), odd, acc[i][c + 1]);
      }
    };
    int64_t j = 0;
    const char* ahead = reinterpret_cast<const char*>(row) + ahead_bytes;
    for (; j + 2 <= pairs; j += 2) {
      // One line per 64 bytes consumed (two pair vectors on AVX2, four per two steps on AVX-512).
      if (ahead_bytes > 0) {
        hwy::Prefetch(ahead + 2 * L * j * sizeof(uint16_t));
        if (4 * L * sizeof(uint16_t) > 64) hwy::Prefetch(ahead + 2 * L * j * sizeof(uint16_t) + 64);
      }
      pair_step(j, 0), pair_step(j + 1, 2);
    }
    if (j < pairs) pair_step(j, 0);
    for (int i = 0; i < MR; ++i) {
      float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(acc[i][0], acc[i][1]), hn::Add(acc[i][2], acc[i][3]))));
      for (int64_t k = Kb; k < K; ++k) sum += x[i * ldx + k] * Bf16ToF32(row[k]);
      float& out = y[i * ldy + n];
      out = accumulate ? out + sum : sum;
    }
  }
}

// ---- int8 weights (Int8Linear): q [N, K] int8 with one f32 scale per group of G k per row ----
// The dot-product form for groups that split a vector (RowBlockInt8 takes RowOrderDots otherwise): each weight vector is widened int8 -> i32 -> f32 and
// multiplied by its row's group scale in registers (exactly the f32 value q * scale the GEMM panel
// holds), then reused MR times. Groups shorter than a vector (or their last partial vector) go
// through the same q * scale product in scalar code.
template <int MR, int NR>
void BlockInt8(const int8_t* q, const float* scales, int64_t K, int64_t G, const float* x, int64_t ldx, float* y,
               int64_t ldy, int64_t n, bool accumulate) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di32;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (K + G - 1) / G;
  using V = hn::Vec<decltype(df)>;
  V acc[MR][NR];
  float tail[MR][NR] = {};
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t g0 = g * G, g1 = std::min(K, g0 + G);
    V sv[NR];
    for (int j = 0; j < NR; ++j) sv[j] = hn::Set(df, scales[(n + j) * groups + g]);
    int64_t k = g0;
    for (; k + L <= g1; k += L) {
      V wv[NR];
      for (int j = 0; j < NR; ++j)
        wv[j] = hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, q + (n + j) * K + k))), sv[j]);
      for (int i = 0; i < MR; ++i) {
        const V xv = hn::LoadU(df, x + i * ldx + k);
        for (int j = 0; j < NR; ++j) acc[i][j] = hn::MulAdd(xv, wv[j], acc[i][j]);
      }
    }
    for (; k < g1; ++k)
      for (int j = 0; j < NR; ++j) {
        const float wf = static_cast<float>(q[(n + j) * K + k]) * scales[(n + j) * groups + g];
        for (int i = 0; i < MR; ++i) tail[i][j] += x[i * ldx + k] * wf;
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float sum = hn::GetLane(hn::SumOfLanes(df, acc[i][j])) + tail[i][j];
      float& out = y[i * ldy + n + j];
      out = accumulate ? out + sum : sum;
    }
}

template <int MR>
void RowBlockInt8(const int8_t* q, const float* scales, int64_t K, int64_t G, const float* x, int64_t ldx, float* y,
                  int64_t ldy, int64_t n0, int64_t n1, bool accumulate) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di32;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (G % L == 0) {  // every weight vector inside one group: the row-order form (see RowOrderDots)
    const int64_t groups = (K + G - 1) / G;
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* row = q + n * K;
      const float* row_scales = scales + n * groups;
      // RowOrderDots asks for the vectors in increasing k: the group's scale is looked up once per
      // group (a division per vector measured 3x slower).
      int64_t group_end = 0;
      auto scale = hn::Zero(df);
      RowOrderDots<MR>(
          K, x, ldx, y, ldy, n, accumulate,
          [&](int64_t k) {
            if (k >= group_end) {
              scale = hn::Set(df, row_scales[k / G]);
              group_end = (k / G + 1) * G;
            }
            return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, row + k))), scale);
          },
          [&](int64_t k) { return static_cast<float>(row[k]) * row_scales[k / G]; });
    }
    return;
  }
  int64_t n = n0;
  for (; n + kNR <= n1; n += kNR) BlockInt8<MR, kNR>(q, scales, K, G, x, ldx, y, ldy, n, accumulate);
  for (; n < n1; ++n) BlockInt8<MR, 1>(q, scales, K, G, x, ldx, y, ldy, n, accumulate);
}

// GEMM register tile: kGemmMR rows x kGemmNV vectors. 32-register targets: 8 x 3 (24
// accumulators, 3 panel vectors, 1 broadcast; the tile the LA kernels (src/cpu/la/gemm-inl.h)
// measured best on AVX-512). 16-register x86 targets: 6 x 2, the shape of the classic Haswell
// SGEMM kernels (BLIS's and OpenBLAS's 6x16): 12 accumulators + 2 panel vectors + 1 broadcast =
// 15 registers. Two FMA pipes of 4-5 cycles latency (Haswell..Zen 3) need 8-10 independent
// chains; the 4 x 2 tile used before had exactly 8 and measured 0.64 of the FMA peak on Zen 4 in
// AVX2 mode, where OpenBLAS and oneDNN reached 0.78 (docs/LINEAR.md).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kGemmMR = 6;
constexpr int kGemmNV = 2;
#else
constexpr int kGemmMR = 8;
constexpr int kGemmNV = 3;
#endif
// The panel spans the whole K (64 KiB at K = 1024 on AVX2, in L2). Measured on Zen 3 (AVX2, 2
// threads and 1, Qwen3.5-0.8B's projections, docs/LINEAR.md): blocking K by 256 or 512 so that the
// panel stays in L1 was slower (the outputs are re-loaded per block and the activations streamed
// once per block), and so was packing the activations of a row tile into one [k][rows] stream.

// From this many rows on the GEMM form is used: widening a panel (scalar, strided writes) costs
// about as much as a few rows of dot products, and the broadcast tile needs full row blocks.
constexpr int64_t kGemmMinRows = kPortableGemmMinRows;

// Rows [0, MR) x panel columns [0, width) over the panel's kd rows (width <= kGemmNV * lanes; the
// panel is zero-padded). Every output row is its own chain over k, so its value does not depend on
// the tile height it was computed in.
template <int MR>
void GemmTile(const float* panel, int64_t pn, int64_t kd, const float* x, int64_t ldx, float* y, int64_t ldy,
              int64_t width, bool accumulate) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<decltype(df)>;
  V acc[MR][kGemmNV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kGemmNV; ++j) acc[i][j] = hn::Zero(df);
  for (int64_t k = 0; k < kd; ++k) {
    V b[kGemmNV];
    for (int j = 0; j < kGemmNV; ++j) b[j] = hn::Load(df, panel + k * pn + j * L);
    for (int i = 0; i < MR; ++i) {
      const V a = hn::Set(df, x[i * ldx + k]);
      for (int j = 0; j < kGemmNV; ++j) acc[i][j] = hn::MulAdd(a, b[j], acc[i][j]);
    }
  }
  HWY_ALIGN float tmp[kGemmNV * HWY_MAX_BYTES / sizeof(float)];
  for (int i = 0; i < MR; ++i) {
    float* yr = y + i * ldy;
    if (width == pn) {
      for (int j = 0; j < kGemmNV; ++j) {
        V v = acc[i][j];
        if (accumulate) v = hn::Add(v, hn::LoadU(df, yr + j * L));
        hn::StoreU(v, df, yr + j * L);
      }
    } else {
      for (int j = 0; j < kGemmNV; ++j) hn::Store(acc[i][j], df, tmp + j * L);
      for (int64_t c = 0; c < width; ++c) yr[c] = accumulate ? yr[c] + tmp[c] : tmp[c];
    }
  }
}

// The last M % kGemmMR rows in one tile of their own height (one row at a time ran at a quarter
// of the rate: two accumulator chains cannot cover the FMA latency).
template <int MR>
void GemmRowTail(int64_t rows, const float* panel, int64_t pn, int64_t kd, const float* x, int64_t ldx, float* y,
                 int64_t ldy, int64_t width, bool accumulate) {
  if constexpr (MR > 0) {
    if (rows == MR) return GemmTile<MR>(panel, pn, kd, x, ldx, y, ldy, width, accumulate);
    GemmRowTail<MR - 1>(rows, panel, pn, kd, x, ldx, y, ldy, width, accumulate);
  }
}

// One k block of a panel, one column at a time: `widen(n, k0, k1, out, pn)` writes the f32 values
// of weight row n, columns [k0, k1), to out[(k - k0) * pn] (one panel column); columns from
// `first` on, past `width` zero.
template <class Widen>
void WidenColumns(int64_t n, int64_t first, int64_t width, int64_t pn, int64_t k0, int64_t k1, float* panel,
                  const Widen& widen) {
  for (int64_t c = first; c < pn; ++c) {
    if (c < width) {
      widen(n + c, k0, k1, panel + k0 * pn + c, pn);
    } else {
      for (int64_t k = k0; k < k1; ++k) panel[k * pn + c] = 0.f;
    }
  }
}

// One k block of a panel from 8-wide row pieces: panel[k][c] = w[n + c][k] for k in [k0, k1).
// `row8(row, k)` returns the f32 weights [k, k + 8) of a weight row as a 256-bit vector and
// `scalar(row, ka, kb, out, stride)` writes one row's [ka, kb) down a panel column. On x86 with
// 256-bit vectors (AVX2 and the AVX-512 targets) whole 8 x 8 blocks are widened and transposed in
// registers: 8 row loads, 24 shuffles, 8 stores, where the column loop does a scalar load,
// conversion and strided store per element. At M = 512 the scalar widening of bf16 panels was
// 3.6% of a whole model prefill on Zen 3 (perf, Kimi-shaped layers, hidden 2304), and it is
// amortised over the panel's M rows only, so MoE experts with few tokens each pay more
// (docs/LINEAR.md). The values are the same either way. The rest (k % 8, width % 8) stays scalar.
#define HANPU_WIDEN_IN_REGISTERS (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
template <class Row8, class Scalar>
void WidenBlock8(int64_t n, int64_t width, int64_t pn, int64_t k0, int64_t k1, float* panel, const Row8& row8,
                 const Scalar& scalar) {
  int64_t c8 = 0;
#if HANPU_WIDEN_IN_REGISTERS
  const hn::FixedTag<float, 8> d8;
  const hn::Repartition<double, decltype(d8)> dd;
  using V8 = hn::Vec<decltype(d8)>;
  const int64_t k8 = k0 + (k1 - k0) / 8 * 8;
  for (; c8 + 8 <= width; c8 += 8) {
    for (int64_t k = k0; k < k8; k += 8) {
      V8 r[8];
      for (int i = 0; i < 8; ++i) r[i] = row8(n + c8 + i, k);
      // Rows i hold w[n + c8 + i][k .. k + 8). Pairs, then quads (as doubles), inside each 128-bit
      // half; the halves are then recombined: out[j] holds column k + j of the 8 rows.
      V8 t[8], u[8];
      for (int i = 0; i < 8; i += 2) {
        t[i] = hn::InterleaveLower(d8, r[i], r[i + 1]);
        t[i + 1] = hn::InterleaveUpper(d8, r[i], r[i + 1]);
      }
      for (int h = 0; h < 8; h += 4)
        for (int p = 0; p < 2; ++p) {
          const auto a = hn::BitCast(dd, t[h + p]), b = hn::BitCast(dd, t[h + 2 + p]);
          u[h + 2 * p] = hn::BitCast(d8, hn::InterleaveLower(dd, a, b));
          u[h + 2 * p + 1] = hn::BitCast(d8, hn::InterleaveUpper(dd, a, b));
        }
      float* out = panel + k * pn + c8;
      for (int j = 0; j < 4; ++j) {
        hn::StoreU(hn::ConcatLowerLower(d8, u[4 + j], u[j]), d8, out + j * pn);
        hn::StoreU(hn::ConcatUpperUpper(d8, u[4 + j], u[j]), d8, out + (j + 4) * pn);
      }
    }
    for (int i = 0; i < 8; ++i) scalar(n + c8 + i, k8, k1, panel + k8 * pn + c8 + i, pn);
  }
#else
  (void)row8;
#endif
  WidenColumns(n, c8, width, pn, k0, k1, panel, scalar);
}

// Panels widened before the row loop when K is short (at most this many f32 floats, 64 KiB: in
// L2 next to the activations). With one panel of a short K, a row tile's 6 rows x 16 outputs
// take only K steps before the tile moves to rows 16 KiB (N floats) further on, and the output
// stores dominate: K = 128 ran at 0.74-0.82 of the FMA peak against 0.88-0.92 at K >= 2304 (Zen 3,
// docs/LINEAR.md). With several panels the tile walks along each output row instead.
constexpr int64_t kPanelGroupFloats = 16 * 1024;

// The longest panel the row loop streams whole. The panel of one tile column block is re-read from
// L2 for every row tile; past about half of a 2 MiB L2 it no longer stays there next to the
// activations. Measured on a Xeon model 207 (AVX-512, 48-column panels, 2 MiB L2, 2 threads, M =
// 512, medians of four interleaved runs, docs/LINEAR.md): K = 6144 (a 1.15 MiB panel, Qwen3.5-2B's
// down projection) 184 GFLOP/s whole against 223 in two blocks of 3072 (211 in six of 1024, 215
// in three of 2048); K = 3584 (688 KiB) 226 whole against 200 in two blocks, and K = 2048 the same
// either way. AVX2's 16-column panels stay below this up to K = 12288.
constexpr int64_t kMaxPanelBytes = 768 * 1024;

// The GEMM form for any weight format: `widen_block(n, width, k0, k1, panel, pn)` writes the f32
// values of weight rows [n, n + width), columns [k0, k1), transposed into panel[k][c] (row stride
// pn), and zeros in the columns from width to pn.
template <class WidenBlock>
void GemmPanels(int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t n0, int64_t n1,
                bool accumulate, Workspace& ws, const WidenBlock& widen_block) {
  const hn::ScalableTag<float> df;
  const int64_t pn = kGemmNV * static_cast<int64_t>(hn::Lanes(df));
  const int64_t group = std::max<int64_t>(1, kPanelGroupFloats / (K * pn));
  float* panels = ws.get<float>(kLinearPanel, static_cast<size_t>(K * pn * group));  // 64-byte aligned, kept
  // A panel longer than kMaxPanelBytes runs over the rows in K blocks of equal length (the outputs
  // accumulate from the second block on).
  const int64_t k_blocks = (K * pn * static_cast<int64_t>(sizeof(float)) + kMaxPanelBytes - 1) / kMaxPanelBytes;
  const int64_t kb = (K + k_blocks - 1) / k_blocks;
  for (int64_t n = n0; n < n1; n += pn * group) {
    const int64_t count = std::min(group, (n1 - n + pn - 1) / pn);
    // Panel p: output columns from n + p·pn, `width` of them.
    const auto width = [&](int64_t p) { return std::min(pn, n1 - n - p * pn); };
    // Widen + transpose: panel[k][c] = w[n + c][k], in k blocks so that the reads of each weight
    // row are 128-byte runs and the writes stay in a 4-12 KiB (L1) part of the panel.
    constexpr int64_t kWidenBlock = 64;
    for (int64_t p = 0; p < count; ++p)
      for (int64_t k0 = 0; k0 < K; k0 += kWidenBlock)
        widen_block(n + p * pn, width(p), k0, std::min(K, k0 + kWidenBlock), panels + p * K * pn, pn);
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
      const int64_t kd = std::min(kb, K - k0);
      const bool acc = accumulate || k0 > 0;
      int64_t m = 0;
      for (; m + kGemmMR <= M; m += kGemmMR)
        for (int64_t p = 0; p < count; ++p)
          GemmTile<kGemmMR>(panels + p * K * pn + k0 * pn, pn, kd, x + m * ldx + k0, ldx, y + m * ldy + n + p * pn, ldy,
                            width(p), acc);
      for (int64_t p = 0; p < count; ++p)
        GemmRowTail<kGemmMR - 1>(M - m, panels + p * K * pn + k0 * pn, pn, kd, x + m * ldx + k0, ldx,
                                 y + m * ldy + n + p * pn, ldy, width(p), acc);
    }
  }
}

void LinearPortableInt8(const int8_t* q, const float* scales, int64_t K, int64_t G, const float* x, int64_t ldx,
                        float* y, int64_t ldy, int64_t M, int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  if (M >= kGemmMinRows) {
    const int64_t groups = (K + G - 1) / G;
    const auto scalar = [&](int64_t n, int64_t k0, int64_t k1, float* out, int64_t stride) {
      const int8_t* qr = q + n * K;
      const float* sr = scales + n * groups;
      for (int64_t k = k0; k < k1; ++k) out[(k - k0) * stride] = static_cast<float>(qr[k]) * sr[k / G];
    };
#if HANPU_WIDEN_IN_REGISTERS
    const hn::FixedTag<float, 8> d8;
    const hn::RebindToSigned<decltype(d8)> di32;
    const hn::Rebind<int8_t, decltype(d8)> di8;
    const auto row8 = [&](int64_t n, int64_t k) {
      // Eight weights inside one scale group (G a multiple of 8, checked below): one scale.
      return hn::Mul(hn::ConvertTo(d8, hn::PromoteTo(di32, hn::LoadU(di8, q + n * K + k))),
                     hn::Set(d8, scales[n * groups + k / G]));
    };
#else
    const int row8 = 0;  // 128-bit targets: the columns stay scalar
#endif
    GemmPanels(K, x, ldx, y, ldy, M, n0, n1, accumulate, *ws,
               [&](int64_t n, int64_t width, int64_t k0, int64_t k1, float* panel, int64_t pn) {
                 if (G % 8 == 0) WidenBlock8(n, width, pn, k0, k1, panel, row8, scalar);
                 else WidenColumns(n, 0, width, pn, k0, k1, panel, scalar);
               });
    return;
  }
  // Columns in slices whose weight rows (kColumnSlice * K bytes) stay in L2 while every
  // activation row passes over them (as the bf16 form below).
  constexpr int64_t kColumnSlice = 128;
  for (int64_t c0 = n0; c0 < n1; c0 += kColumnSlice) {
    const int64_t c1 = std::min(n1, c0 + kColumnSlice);
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR)
      RowBlockInt8<kMR>(q, scales, K, G, x + m * ldx, ldx, y + m * ldy, ldy, c0, c1, accumulate);
    for (; m < M; ++m) RowBlockInt8<1>(q, scales, K, G, x + m * ldx, ldx, y + m * ldy, ldy, c0, c1, accumulate);
  }
}

void LinearPortable(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                    int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  if (M >= kGemmMinRows) {
    const auto scalar = [&](int64_t n, int64_t k0, int64_t k1, float* out, int64_t stride) {
      const uint16_t* wr = w + n * K;
      for (int64_t k = k0; k < k1; ++k) out[(k - k0) * stride] = Bf16ToF32(wr[k]);
    };
#if HANPU_WIDEN_IN_REGISTERS
    const hn::FixedTag<float, 8> d8;
    const hn::RebindToUnsigned<decltype(d8)> du32;
    const hn::Rebind<uint16_t, decltype(d8)> du16;
    const auto row8 = [&](int64_t n, int64_t k) {
      return hn::BitCast(d8, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, w + n * K + k))));
    };
#else
    const int row8 = 0;  // 128-bit targets: the columns stay scalar
#endif
    GemmPanels(K, x, ldx, y, ldy, M, n0, n1, accumulate, *ws,
               [&](int64_t n, int64_t width, int64_t k0, int64_t k1, float* panel, int64_t pn) {
                 WidenBlock8(n, width, pn, k0, k1, panel, row8, scalar);
               });
    return;
  }
  throw Error("linear_portable: " + std::to_string(M) + " rows take linear_portable_rows (the pair-split decode form)");
}

void LinearPortableRows(const uint16_t* w, int64_t K, const float* xs, const float* x, int64_t ldx, float* y,
                        int64_t ldy, int64_t M, int64_t n0, int64_t n1, bool accumulate) {
  const int64_t lds = split_pairs_stride(K);
  // Columns in slices whose weight rows (kColumnSlice * K * 2 bytes, 256 KiB at K = 1024) stay in
  // L2 while every activation row passes over them.
  constexpr int64_t kColumnSlice = 128;
  const int64_t ahead = decode_prefetch_bytes();
  for (int64_t c0 = n0; c0 < n1; c0 += kColumnSlice) {
    const int64_t c1 = std::min(n1, c0 + kColumnSlice);
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR)
      RowBlockPairs<kMR>(w, K, xs + m * lds, lds, x + m * ldx, ldx, y + m * ldy, ldy, c0, c1, accumulate, ahead);
    for (; m < M; ++m)
      RowBlockPairs<1>(w, K, xs + m * lds, lds, x + m * ldx, ldx, y + m * ldy, ldy, c0, c1, accumulate, ahead);
  }
}

// ---- f16 and f32 weights (F16Linear, F32Linear) --------------------------------------------------
// f16 -> f32 in scalar code (the tails): exact for every finite input (F16Linear refuses inf and
// NaN weights at load, because Highway's emulated vector conversion, on targets without F16C,
// does not produce them).
inline float F16ToF32Scalar(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp != 0) {
    u = sign | (exp + 112) << 23 | mant << 13;
  } else {  // zero or subnormal: mant * 2^-24, exact in f32
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Both forms of a float weight whose element type W is hwy::float16_t (stored as uint16_t bits)
// or float: the decode form is RowOrderDots over each weight row in address order (one widening
// per vector: VCVTPH2PS on the AVX2 and AVX-512 targets, which Highway compiles with F16C; the
// shift-and-mask emulation on SSE4 and the portable target), the prefill form GemmPanels on panels
// widened once per call, the f32 GEMM bf16 and int8 weights use.
template <class W>
void LinearPortableFloatT(const W* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                          int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  constexpr bool kF16 = !std::is_same_v<W, float>;
  const auto scalar_at = [](const W* row, int64_t k) -> float {
    if constexpr (kF16) return F16ToF32Scalar(reinterpret_cast<const uint16_t*>(row)[k]);
    else return row[k];
  };
  if (M >= kGemmMinRows) {
    const auto scalar = [&](int64_t n, int64_t k0, int64_t k1, float* out, int64_t stride) {
      const W* wr = w + n * K;
      for (int64_t k = k0; k < k1; ++k) out[(k - k0) * stride] = scalar_at(wr, k);
    };
#if HANPU_WIDEN_IN_REGISTERS
    const hn::FixedTag<float, 8> d8;
    const hn::Rebind<W, decltype(d8)> dw;
    const auto row8 = [&](int64_t n, int64_t k) {
      if constexpr (kF16) return hn::PromoteTo(d8, hn::LoadU(dw, w + n * K + k));
      else return hn::LoadU(d8, w + n * K + k);
    };
#else
    const int row8 = 0;  // 128-bit targets: the columns stay scalar
#endif
    GemmPanels(K, x, ldx, y, ldy, M, n0, n1, accumulate, *ws,
               [&](int64_t n, int64_t width, int64_t k0, int64_t k1, float* panel, int64_t pn) {
                 WidenBlock8(n, width, pn, k0, k1, panel, row8, scalar);
               });
    return;
  }
  const hn::ScalableTag<float> df;
  const hn::Rebind<W, decltype(df)> dw;
  // Columns in slices whose weight rows stay in L2 while every activation row passes over them
  // (as the bf16 and int8 decode forms).
  constexpr int64_t kColumnSlice = 128;
  const int64_t ahead = decode_prefetch_bytes();
  for (int64_t c0 = n0; c0 < n1; c0 += kColumnSlice) {
    const int64_t c1 = std::min(n1, c0 + kColumnSlice);
    const auto rows = [&](auto mr, int64_t m) {
      constexpr int MR = decltype(mr)::value;
      for (int64_t n = c0; n < c1; ++n) {
        const W* row = w + n * K;
        const char* pf = reinterpret_cast<const char*>(row) + ahead;
        RowOrderDots<MR>(
            K, x + m * ldx, ldx, y + m * ldy, ldy, n, accumulate,
            [&](int64_t k) {
              // One prefetch per 64 bytes of weights: every vector of 64 bytes or more, else every
              // other (f16 vectors of AVX2: 16 bytes per 8 lanes, 4 per line).
              const int64_t byte = k * static_cast<int64_t>(sizeof(W));
              if (ahead > 0 && byte % 64 == 0) hwy::Prefetch(pf + byte);
              if constexpr (kF16) return hn::PromoteTo(df, hn::LoadU(dw, row + k));
              else return hn::LoadU(df, row + k);
            },
            [&](int64_t k) { return scalar_at(row, k); });
      }
    };
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR) rows(std::integral_constant<int, kMR>{}, m);
    for (; m < M; ++m) rows(std::integral_constant<int, 1>{}, m);
  }
}

void LinearPortableF16(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                       int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  LinearPortableFloatT(reinterpret_cast<const hwy::float16_t*>(w), K, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
}

void LinearPortableF32(const float* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                       int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  LinearPortableFloatT(w, K, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hanpu::cpu {
HWY_EXPORT(LinearPortable);
HWY_EXPORT(LinearPortableRows);
HWY_EXPORT(LinearPortableInt8);
HWY_EXPORT(LinearPortableF16);
HWY_EXPORT(LinearPortableF32);

void linear_portable_f16(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                         int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  HANPU_DISPATCH(LinearPortableF16)(w, K, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
}

void linear_portable_f32(const float* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                         int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  HANPU_DISPATCH(LinearPortableF32)(w, K, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
}

void linear_portable_int8(const int8_t* q, const float* scales, int64_t K, int64_t group, const float* x, int64_t ldx,
                          float* y, int64_t ldy, int64_t M, int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  HANPU_DISPATCH(LinearPortableInt8)(q, scales, K, group, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
}

void linear_portable(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                     int64_t n0, int64_t n1, bool accumulate, Workspace* ws) {
  HANPU_DISPATCH(LinearPortable)(w, K, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
}

int64_t decode_prefetch_bytes() {
  static const int64_t bytes = [] {
    if (const char* v = std::getenv("HANPU_DECODE_PREFETCH_BYTES")) {
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (end == v || *end != '\0' || n < 0 || n > 65536 || n % 64 != 0)
        throw Error(std::string("HANPU_DECODE_PREFETCH_BYTES: got '") + v +
                    "', expected a multiple of 64 from 0 to 65536 (bytes ahead of the decode weight stream)");
      return static_cast<int64_t>(n);
    }
#if HANPU_X86_KERNELS
    return x86::vendor_is_amd() ? int64_t{1024} : int64_t{3072};
#else
    return int64_t{1024};
#endif
  }();
  return bytes;
}

bool decode_prefetch_l2() {
  static const bool l2 = [] {
    if (const char* v = std::getenv("HANPU_DECODE_PREFETCH_L2")) {
      if (std::string(v) == "1") return true;
      if (std::string(v) == "0") return false;
      throw Error(std::string("HANPU_DECODE_PREFETCH_L2: got '") + v +
                  "', expected 1 (the GGUF decode GEMVs prefetch into L2) or 0 (into L1)");
    }
#if HANPU_X86_KERNELS
    return !x86::vendor_is_amd();
#else
    return false;
#endif
  }();
  return l2;
}

void linear_portable_rows(const uint16_t* w, int64_t K, const float* xs, const float* x, int64_t ldx, float* y,
                          int64_t ldy, int64_t M, int64_t n0, int64_t n1, bool accumulate) {
  HANPU_DISPATCH(LinearPortableRows)(w, K, xs, x, ldx, y, ldy, M, n0, n1, accumulate);
}

void split_pairs_rows(const float* x, int64_t ldx, int64_t M, int64_t K, float* xs) {
  const int64_t lds = split_pairs_stride(K);
  for (int64_t m = 0; m < M; ++m) {
    const float* src = x + m * ldx;
    float* dst = xs + m * lds;
    for (int64_t b = 0; b < lds; b += kPairBlock)
      for (int64_t e = 0; e < kPairBlock; e += 2) {
        dst[b + e / 2] = src[b + e];
        dst[b + kPairBlock / 2 + e / 2] = src[b + e + 1];
      }
  }
}
}  // namespace hanpu::cpu
#endif
