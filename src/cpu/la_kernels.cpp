// SIMD kernels of the CPU backend, compiled once per SIMD target by Highway and dispatched at run
// time (AVX2, AVX-512, NEON, ...).
//
// The head-fused path (FusedGroup) runs all six operators of the chunkwise computation (the paper, arXiv 2609.32114, §2) for a group of work
// items (sequence, value head, column block), chunk after chunk, with the states S and every
// per-chunk intermediate in a per-core arena. Per chunk of L <= C rows, with Γ the chunk-local cumulative
// log-decay (Γ_r = Σ_{s<=r} g_s, computed in fp64: see LoadChunk) and scale folded into q:
//
//   GEMM-first (paper §4):        X = diag(β) V − diag(β e^Γ) K S     (#5 read, rewritten)
//                                O = diag(e^Γ) Q S                   (#6, inter-chunk part)
//                                A = strictly-lower(β_i e^{Γi−Γj} k_i·k_j),  P = lower(e^{Γi−Γj} q_i·k_j)
//   solve:                       (I + A) E = X                       (#3, W never formed)
//   output:                      O += P E ;  o <- O
//   state update, in place:      S <- e^{Γ_L} S + Σ_j e^{Γ_L−Γ_j} k_j^T E_j   (#5 update)
//
// For KDA the decays are per key channel: the e^Γ factors multiply K and Q element-wise, and
// K K^T / Q K^T are evaluated with anchors so that only non-positive exponents appear (§2.7 of
// FLA's fla/ops/kda/chunk_intra.py). Masks are applied by selection, never by multiplying with 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/operator_timers.hpp"
#include "la/gates.hpp"

// SVE/RVV vectors are sizeless and cannot live in the accumulator arrays the GEMM tile uses.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/la_kernels.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Row padding of every arena matrix whose columns are a GEMM's N dimension: 16 floats = 64 bytes,
// a multiple of the vector length of every target (4, 8 or 16 floats), so tiles never need
// partial vectors; the pad columns are kept at zero.
constexpr size_t kPad = 16;
inline size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Leading dimension (floats) of an arena matrix with n columns: padded to kPad, plus one more kPad
// when the row length is a multiple of 256 bytes. Rows a power-of-two apart fall into a few L1
// sets (with 512-byte rows, a 128-row GEMM panel maps to 8 of the 64 sets and thrashes the 12
// ways); the extra 64 bytes spread consecutive rows over all sets.
inline size_t LeadingDim(size_t n) {
  const size_t padded = RoundUp(n, kPad);
  return padded % 64 == 0 ? padded + kPad : padded;
}

// GEMM register tiles: MR rows x NV vectors of C held in registers. 32-register targets (AVX-512,
// NEON) use 8 x 3 (24 accumulators + 3 B vectors + 1 broadcast: 11 loads per 24 FMAs; measured
// on AVX-512 against 8x2, 12x2, 6x4 and 7x4). Column tails (e.g. the last 32 of 128 columns)
// keep 8 rows: taller tail tiles (12 x 2, 16 x 1) measured 10% slower on the GEMM probe.
// 16-register x86 targets: 4 x 2.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kMR = 4;
constexpr size_t kNV = 2;
#else
constexpr size_t kMR = 8;
constexpr size_t kNV = 3;
#endif
constexpr size_t RowsFor(size_t /*nv*/) { return kMR; }

// The register tile a GEMM uses at most: the compiled kMR x kNV, or a smaller shape the plan asks
// for (plan.cpu.gemm_rows / gemm_vectors; TileRows / TileCols below already instantiate every
// smaller tile for the row and column tails, so a runtime choice needs no new instantiation).
struct TileShape {
  size_t rows = kMR, vectors = kNV;
};
TileShape ProgramTile(const FusedProgram& program) {
  TileShape t;
  if (program.gemm_rows > 0) t.rows = std::min(kMR, static_cast<size_t>(program.gemm_rows));
  if (program.gemm_vectors > 0) t.vectors = std::min(kNV, static_cast<size_t>(program.gemm_vectors));
  return t;
}

// C = A B, C += A B, C -= A B, C = diag(row_scale) C + A B (the state update's decay, applied as
// the accumulators are loaded instead of in a pass of its own), and for GDN's scalar per-row
// gates C = diag(row_scale) A B and C += diag(row_scale) A B (the gate applied as the
// accumulators are stored, instead of a pass that scales the rows of A first).
// kSubSolve: C −= A B over kd, then the strip's own unit-lower triangle, A's MR x MR block at
// columns [kd, kd + MR), is solved on the accumulators (forward substitution in registers).
enum class Acc { kSet, kAdd, kSub, kScaleAdd, kSetRowScaled, kAddRowScaled, kSubSolve };

// C[MR x NV*lanes] (op)= A[MR x kd] (rows of stride lda, broadcast per element) * B[kd x NV*lanes]
// (rows of stride ldb, loaded as vectors). A is a dense row-major operand, B a packed panel.
template <size_t MR, size_t NV, Acc kMode>
HWY_NOINLINE void Tile(const float* HWY_RESTRICT A, size_t lda, const float* HWY_RESTRICT B, size_t ldb,
                       float* HWY_RESTRICT C, size_t ldc, size_t kd, const float* HWY_RESTRICT row_scale) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc[MR][NV];
  for (size_t i = 0; i < MR; ++i) {
    for (size_t v = 0; v < NV; ++v) {
      if constexpr (kMode == Acc::kSet || kMode == Acc::kSetRowScaled || kMode == Acc::kAddRowScaled) {
        acc[i][v] = hn::Zero(d);
      } else if constexpr (kMode == Acc::kScaleAdd) {
        acc[i][v] = hn::Mul(hn::Set(d, row_scale[i]), hn::LoadU(d, C + i * ldc + v * N));
      } else {
        acc[i][v] = hn::LoadU(d, C + i * ldc + v * N);
      }
    }
  }
  for (size_t k = 0; k < kd; ++k) {
    VF b[NV];
    for (size_t v = 0; v < NV; ++v) b[v] = hn::LoadU(d, B + k * ldb + v * N);
    for (size_t i = 0; i < MR; ++i) {
      const VF a = hn::Set(d, A[i * lda + k]);
      for (size_t v = 0; v < NV; ++v)
        acc[i][v] = kMode == Acc::kSub || kMode == Acc::kSubSolve ? hn::NegMulAdd(a, b[v], acc[i][v])
                                                                  : hn::MulAdd(a, b[v], acc[i][v]);
    }
  }
  if constexpr (kMode == Acc::kSubSolve) {
    for (size_t r = 1; r < MR; ++r)
      for (size_t j = 0; j < r; ++j) {
        const VF a = hn::Set(d, A[r * lda + kd + j]);
        for (size_t v = 0; v < NV; ++v) acc[r][v] = hn::NegMulAdd(a, acc[j][v], acc[r][v]);
      }
  }
  for (size_t i = 0; i < MR; ++i) {
    for (size_t v = 0; v < NV; ++v) {
      if constexpr (kMode == Acc::kSetRowScaled) {
        acc[i][v] = hn::Mul(hn::Set(d, row_scale[i]), acc[i][v]);
      } else if constexpr (kMode == Acc::kAddRowScaled) {
        acc[i][v] = hn::MulAdd(hn::Set(d, row_scale[i]), acc[i][v], hn::LoadU(d, C + i * ldc + v * N));
      }
      hn::StoreU(acc[i][v], d, C + i * ldc + v * N);
    }
  }
}

template <size_t M, size_t NV, Acc kMode>
HWY_INLINE void TileRows(size_t mr, const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc,
                         size_t kd, const float* rs) {
  if constexpr (M > 0) {
    if (mr == M) return Tile<M, NV, kMode>(A, lda, B, ldb, C, ldc, kd, rs);
    TileRows<M - 1, NV, kMode>(mr, A, lda, B, ldb, C, ldc, kd, rs);
  }
}

template <size_t NV, Acc kMode>
HWY_INLINE void TileCols(size_t mr, size_t nv, const float* A, size_t lda, const float* B, size_t ldb, float* C,
                         size_t ldc, size_t kd, const float* rs) {
  if constexpr (NV > 0) {
    if (nv == NV) return TileRows<RowsFor(NV), NV, kMode>(mr, A, lda, B, ldb, C, ldc, kd, rs);
    TileCols<NV - 1, kMode>(mr, nv, A, lda, B, ldb, C, ldc, kd, rs);
  }
}

// Any tile up to RowsFor(nv) rows x nv <= kNV vectors (row and column tails of a GEMM).
template <Acc kMode>
HWY_INLINE void TileAny(size_t mr, size_t nv, const float* A, size_t lda, const float* B, size_t ldb, float* C,
                        size_t ldc, size_t kd, const float* rs = nullptr) {
  TileCols<kNV, kMode>(mr, nv, A, lda, B, ldb, C, ldc, kd, rs);
}

enum class Tri {
  kNone,
  kLowerN,  // only C[i][j] with j <= i are needed: skip column panels right of the strip
  kLowerK,  // A[i][k] is zero for k > i: limit the reduction of each strip to k <= its last row
};

// Software prefetch of the rows the next work item reads (q, k, v and KDA's g; o is written with
// streaming stores). Rows of one head are H*K elements apart, a page or more, so the hardware
// streamers follow them poorly and LoadChunk would wait on memory for most of them (measured: 14%
// of a GDN chunk with inputs in L3, 21% from DRAM). Each prefetch holds a line-fill buffer until
// its line arrives, and the GEMM tiles need those buffers for their own L2 refills: issuing too
// many at once stalls the tiles. So the lines are handed out evenly over every GEMM tile of the
// chunk (the tile count of the previous chunk sets the share), a few per tile.
class ChunkPrefetcher {
 public:
  // rate (plan.cpu.prefetch_rate): 0 issues no prefetches; r >= 1 hands out r times the even share
  // per tile, so the lines are all issued within the first 1/r of the chunk's tiles.
  explicit ChunkPrefetcher(int rate = 1) : rate_(static_cast<size_t>(rate < 0 ? 0 : rate)) {}
  void plan(const LaJob& job, const SeqSpan& seq, int64_t hv, int64_t t0, size_t L, int64_t col0, int64_t col1) {
    count_ = 0;
    next_ = 0;
    offset_ = 0;
    total_lines_ = 0;
    if (rate_ == 0) return;
    const LaInputs& in = job.in;
    const int64_t h = job.key_head(hv), t = seq.bos + t0;
    const size_t K = static_cast<size_t>(job.shape.K);
    for (size_t i = 0; i < L; ++i) {
      add(in.q, seq.batch, t + i, h, 0, K);
      add(in.k, seq.batch, t + i, h, 0, K);
      add(in.v, seq.batch, t + i, hv, col0, static_cast<size_t>(col1 - col0));
      if (job.variant() == Variant::KDA) add(in.g, seq.batch, t + i, hv, 0, K);
    }
    // Share per tile from the previous chunk's tile count (+1 so that rounding leaves no rest).
    per_tile_ = (tiles_ ? total_lines_ / tiles_ + 1 : kFirstChunkLinesPerTile) * rate_;
    tiles_ = 0;
  }
  // Called once per GEMM tile: issues this tile's share of the lines.
  void tile() {
    ++tiles_;
    lines(per_tile_);
  }
  // Whatever the tiles did not issue (only when the chunk had fewer tiles than the last one).
  void rest() { lines(~size_t{0}); }

 private:
  // Before any tile count is known: a GDN chunk of K = V = 128 has ~150 tiles and ~1.5K lines.
  static constexpr size_t kFirstChunkLinesPerTile = 12;
  void lines(size_t n) {
    for (; n > 0 && next_ < count_; --n) {
      const Span& r = rows_[next_];
      // Locality 2 (x86: prefetcht1): into L2 only. The next item's rows do not fit in L1 next
      // to the GEMM operands; LoadChunk then streams them from L2.
      __builtin_prefetch(r.first + offset_, 0, 2);
      offset_ += 64;
      if (offset_ >= r.bytes) {
        offset_ = 0;
        ++next_;
      }
    }
  }
  struct Span {
    const char* first;  // the first cache line of the row (64-byte aligned)
    size_t bytes;       // from `first` to the row's end
  };
  void add(const TensorView& t, int64_t b, int64_t tok, int64_t h, int64_t col0, size_t n) {
    if (t.rank != 4 || t.stride[3] != 1 || count_ == kMaxRows) return;
    const size_t esz = dtype_size(t.dtype);
    const char* p = static_cast<const char*>(t.data) + offset4(t, b, tok, h, col0) * esz;
    const char* first = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63});
    const size_t bytes = static_cast<size_t>(p + n * esz - first);
    rows_[count_++] = {first, bytes};
    total_lines_ += (bytes + 63) / 64;
  }
  static constexpr size_t kMaxRows = 4 * 64;  // four row kinds of a 64-token chunk
  Span rows_[kMaxRows];
  size_t rate_ = 1;
  size_t count_ = 0, next_ = 0, offset_ = 0, total_lines_ = 0, tiles_ = 0,
         per_tile_ = kFirstChunkLinesPerTile;
};

// C[M x N] (op)= A[M x Kd] B[Kd x N]; N a multiple of the vector length. Column panels outside,
// row strips inside, so each B panel (Kd x NV vectors) stays in L1 while all strips stream by.
template <Acc kMode>
void Gemm(const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc, size_t M, size_t N,
          size_t Kd, Tri tri = Tri::kNone, ChunkPrefetcher* pf = nullptr, const float* row_scale = nullptr,
          TileShape shape = {}) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  for (size_t j0 = 0; j0 < N; j0 += shape.vectors * lanes) {
    const size_t nv = std::min(shape.vectors, (N - j0) / lanes);
    const size_t rows = std::min(RowsFor(nv), shape.rows);
    for (size_t i0 = 0; i0 < M; i0 += rows) {
      const size_t mr = std::min(rows, M - i0);
      size_t tile_nv = nv;
      if (tri == Tri::kLowerN) {
        // Only columns j < i0 + mr are needed: narrow the tile near the diagonal.
        if (j0 >= i0 + mr) continue;
        tile_nv = std::min(nv, (i0 + mr - j0 + lanes - 1) / lanes);
      }
      const size_t kd = tri == Tri::kLowerK ? std::min(Kd, i0 + mr) : Kd;
      if (kd == 0 && kMode != Acc::kSet && kMode != Acc::kSetRowScaled) continue;
      TileAny<kMode>(mr, tile_nv, A + i0 * lda, lda, B + j0, ldb, C + i0 * ldc + j0, ldc, kd,
                     row_scale ? row_scale + i0 : nullptr);
      if (pf) pf->tile();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row loads and stores with dtype conversion.

// One element of a per-token scalar tensor (beta, GDN's g) as float. f32 and bf16 inline: the
// out-of-line load_as_double per token and tensor was a visible part of LoadChunk.
HWY_INLINE float LoadScalar(const TensorView& t, int64_t off) {
  switch (t.dtype) {
    case DType::F32:
      return static_cast<const float*>(t.data)[off];
    case DType::BF16: {
      const uint32_t bits = uint32_t{static_cast<const uint16_t*>(t.data)[off]} << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    default:
      return static_cast<float>(load_as_double(t.data, t.dtype, off));
  }
}

void LoadRowScalar(const TensorView& t, int64_t off, int64_t stride, size_t n, float* dst, float scale = 1.f) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = scale * static_cast<float>(load_as_double(t.data, t.dtype, off + i * stride));
}

// dst[0:n] = scale * the n elements of t starting at element offset `off` with element stride
// `stride` (the scale rides along with the conversion: no second pass over the row).
void LoadRow(const TensorView& t, int64_t off, int64_t stride, size_t n, float* HWY_RESTRICT dst, float scale = 1.f) {
  if (stride != 1) return LoadRowScalar(t, off, stride, n, dst, scale);
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vs = hn::Set(d, scale);
  size_t i = 0;
  switch (t.dtype) {
    case DType::F32: {
      const float* src = static_cast<const float*>(t.data) + off;
      for (; i + N <= n; i += N) hn::StoreU(hn::Mul(vs, hn::LoadU(d, src + i)), d, dst + i);
      break;
    }
    case DType::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
      const hn::Rebind<uint16_t, DF> d16;
      const hn::RebindToUnsigned<DF> du;
      for (; i + N <= n; i += N)
        hn::StoreU(hn::Mul(vs, hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, src + i))))), d,
                   dst + i);
      break;
    }
    case DType::F16: {
      const hwy::float16_t* src = static_cast<const hwy::float16_t*>(t.data) + off;
      const hn::Rebind<hwy::float16_t, DF> d16;
      for (; i + N <= n; i += N) hn::StoreU(hn::Mul(vs, hn::PromoteTo(d, hn::LoadU(d16, src + i))), d, dst + i);
      break;
    }
    default:
      break;
  }
  if (i < n) LoadRowScalar(t, off + i, 1, n - i, dst + i, scale);
}

// Whether Highway's f32 -> f16 DemoteTo is the hardware conversion (round to nearest even):
// F16C on AVX2 and AVX-512, FCVTN on AArch64. Highway 1.0.3 emulates it on SSE4/SSSE3 and the
// scalar targets by dropping the low mantissa bits (truncation: f16 output NMSE 1.7e-7 against
// 7.7e-8 rounded, LaGrid under HANPU_ISA=sse4); there StoreRow rounds in scalar code instead.
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128)
constexpr bool kHardwareF16Demote = true;
#else
constexpr bool kHardwareF16Demote = false;
#endif

void StoreRow(const float* HWY_RESTRICT src, size_t n, const TensorView& t, int64_t off, int64_t stride) {
  if (stride == 1 && t.dtype == DType::F32) {
    float* dst = static_cast<float*>(t.data) + off;
    const DF d;
    const size_t N = hn::Lanes(d);
    if (n % N == 0 && reinterpret_cast<uintptr_t>(dst) % (N * sizeof(float)) == 0) {
      // Outputs are written once and not read back here: streaming stores skip the read for
      // ownership of every line (callers FlushStream before handing o over).
      for (size_t i = 0; i < n; i += N) hn::Stream(hn::LoadU(d, src + i), d, dst + i);
      return;
    }
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  size_t i = 0;
  if (stride == 1 && t.dtype == DType::BF16) {
    const DF d;
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<uint16_t, DF> d16;
    const size_t N = hn::Lanes(d);
    uint16_t* out = static_cast<uint16_t*>(t.data) + off;
    for (; i + N <= n; i += N) {
      const auto u = hn::BitCast(du, hn::LoadU(d, src + i));
      // Round to nearest even on the 16 dropped bits (finite values; NaN stays NaN).
      const auto rounded = hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
      // Values are < 2^16 after the shift: the signed-to-unsigned demotion is exact.
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(rounded))), d16, out + i);
    }
  } else if (stride == 1 && t.dtype == DType::F16 && kHardwareF16Demote) {
    const DF d;
    const hn::Rebind<hwy::float16_t, DF> d16;
    const size_t N = hn::Lanes(d);
    hwy::float16_t* out = static_cast<hwy::float16_t*>(t.data) + off;
    for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(d16, hn::LoadU(d, src + i)), d16, out + i);
  }
  for (; i < n; ++i) store_from_double(t.data, t.dtype, off + static_cast<int64_t>(i) * stride, src[i]);
}

// ---------------------------------------------------------------------------------------------
// Small vector helpers on dense rows.

HWY_INLINE float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), acc1);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

HWY_INLINE void Scale(float* HWY_RESTRICT x, float s, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vs = hn::Set(d, s);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  for (; i < n; ++i) x[i] *= s;
}

// dst = s * src
HWY_INLINE void ScaleTo(const float* HWY_RESTRICT src, float s, float* HWY_RESTRICT dst, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vs = hn::Set(d, s);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, src + i), vs), d, dst + i);
  for (; i < n; ++i) dst[i] = s * src[i];
}


// Returns the factor applied, 1 / sqrt(sum x^2 + eps).
float L2Normalize(float* x, size_t n) {
  const float inv = 1.0f / std::sqrt(Dot(x, x, n) + static_cast<float>(gates::kL2NormEps));
  Scale(x, inv, n);
  return inv;
}

// out[i] = exp(float(a[i] − b[i])) (or exp(float(a[0] − b[i])) with kBroadcastA) for the fp64
// cumulative gates a, b: the difference is taken in fp64 (exact for the sums of fp32 gates we
// form), so large |Γ| after a −1000 mask costs no precision; the exponent is non-positive by
// construction (later minus earlier).
// out[j] = exp(x(j)) for j in [i, n), fewer than one vector: one vector exponential over a
// staging vector whose unused lanes hold 0 (never an argument of the caller's), not a scalar
// exp per element. Still a scalar staging loop: MaskGram's rows use ExpDiffImpl's kWhole instead.
// It loops, so it is also right for more than one vector's worth: the scalar target skips the
// fp64 vector loop of ExpDiffImpl and hands ExpTail the whole row (before the loop, rows longer
// than one lane read past `lanes`: inf/NaN outputs under HANPU_ISA=portable).
template <class X>
HWY_INLINE void ExpTail(size_t i, size_t n, float* HWY_RESTRICT out, X x) {
  const DF d;
  const size_t N = hn::Lanes(d);
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  for (; i < n; i += N) {
    for (size_t t = 0; t < N; ++t) lanes[t] = i + t < n ? x(i + t) : 0.f;
    hn::Store(hn::Exp(d, hn::Load(d, lanes)), d, lanes);
    std::copy(lanes, lanes + std::min(N, n - i), out + i);
  }
}

// kWhole: the last partial vector is computed as a whole one, its lanes >= n selected to 0 before
// the exponential (so they hold 1 and no caller's difference is exponentiated); b must be readable
// and out writable up to n rounded up to the vector length.
template <bool kBroadcastA, bool kWhole = false>
void ExpDiffImpl(const double* HWY_RESTRICT a, const double* HWY_RESTRICT b, float* HWY_RESTRICT out, size_t n) {
  size_t i = 0;
#if HWY_HAVE_FLOAT64 && HWY_TARGET != HWY_SCALAR
  const DF d;
  const size_t N = hn::Lanes(d);
  if (N >= 2) {
    const hn::Repartition<double, DF> dd;
    const hn::Rebind<float, decltype(dd)> dh;
    const size_t Nd = hn::Lanes(dd);
    auto load_a = [&](size_t at) { return kBroadcastA ? hn::Set(dd, a[0]) : hn::LoadU(dd, a + at); };
    for (; kWhole ? i < n : i + N <= n; i += N) {
      const auto lo = hn::DemoteTo(dh, hn::Sub(load_a(i), hn::LoadU(dd, b + i)));
      const auto hi = hn::DemoteTo(dh, hn::Sub(load_a(i + Nd), hn::LoadU(dd, b + i + Nd)));
      auto diff = hn::Combine(d, hi, lo);
      if (kWhole && i + N > n) diff = hn::IfThenElseZero(hn::FirstN(d, n - i), diff);
      hn::StoreU(hn::Exp(d, diff), d, out + i);
    }
  }
#endif
  ExpTail(i, n, out, [&](size_t j) { return static_cast<float>(a[kBroadcastA ? 0 : j] - b[j]); });
}

void ExpDiff(const double* a, const double* b, float* out, size_t n) { ExpDiffImpl<false>(a, b, out, n); }

// One row of GDN's intra-chunk decays: out[j] = e^{Γi−Γj} for j < n, with a = Γi.
void ExpDiffFrom(double a, const double* b, float* out, size_t n) { ExpDiffImpl<true>(&a, b, out, n); }
// The same in whole vectors (ExpDiffImpl's kWhole: b readable, out writable up to n rounded up).
void ExpDiffFromWhole(double a, const double* b, float* out, size_t n) { ExpDiffImpl<true, true>(&a, b, out, n); }

// out[i] = exp(float(a[i])) (a <= 0)
void ExpRow(const double* HWY_RESTRICT a, float* HWY_RESTRICT out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(a[i]);
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Exp(d, hn::LoadU(d, out + i)), d, out + i);
  ExpTail(i, n, out, [&](size_t j) { return out[j]; });
}

// out[i] = exp(x[i]) (x <= 0)
void ExpFloats(const float* HWY_RESTRICT x, float* HWY_RESTRICT out, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Exp(d, hn::LoadU(d, x + i)), d, out + i);
  ExpTail(i, n, out, [&](size_t j) { return x[j]; });
}

// x *= w (element-wise, in place)
HWY_INLINE void MulInPlace(float* HWY_RESTRICT x, const float* HWY_RESTRICT w, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), hn::LoadU(d, w + i)), d, x + i);
  for (; i < n; ++i) x[i] *= w[i];
}

// dst = s * src * w (element-wise)
HWY_INLINE void MulRowsScaled(const float* HWY_RESTRICT src, const float* HWY_RESTRICT w, float s,
                              float* HWY_RESTRICT dst, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vs = hn::Set(d, s);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(vs, hn::Mul(hn::LoadU(d, src + i), hn::LoadU(d, w + i))), d, dst + i);
  for (; i < n; ++i) dst[i] = s * src[i] * w[i];
}

// dst = src * w (element-wise)
HWY_INLINE void MulRows(const float* HWY_RESTRICT src, const float* HWY_RESTRICT w, float* HWY_RESTRICT dst,
                        size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, src + i), hn::LoadU(d, w + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = src[i] * w[i];
}

// ---------------------------------------------------------------------------------------------
// Chunk loading: q, k (l2-normalised, q scaled), v columns, gates and beta for rows [t0, t0+L).

// KDA's anchor spacing: the sub-chunk size of FLA's KDA kernels. Exponentials are exact at the
// anchors; between them decays are products of at most kKdaBlock per-token factors (a few ulp).
constexpr size_t kKdaBlock = 16;

struct ChunkRows {
  float* q;      // [C x K], scaled
  float* k;      // [C x K]
  float* v;      // [C x ldv] (columns [col0, col1)), zero pad
  size_t ldv;
  double* G;     // cumulative gates: [C] (GDN) or [C x K] (KDA), fp64
  float* beta;   // [C]
  float* graw;   // scratch [K]
  bool v_times_beta = false;  // store beta_t v_t instead of v_t (the head-fused path's X init)
  bool skip_qk = false;       // q and k (and everything derived from them) are already loaded
  // bf16 grams (LaJob::bf16_grams): the raw bf16 rows of q and k [C x ldraw] (K, then zeros up
  // to whole AMX tile steps of 32) and, with qk_l2norm, each row's 1/norm.
  uint16_t* qraw = nullptr;
  uint16_t* kraw = nullptr;
  size_t ldraw = 0;
  float* qinv = nullptr;
  float* kinv = nullptr;
  // KDA in the head-fused path: the per-token factors e^{g_t} [C x K] are written here, and G
  // only at the kKdaBlock anchors and the last row (the only rows that path reads).
  float* kda_factors = nullptr;
};

// The in-kernel gate activation of one row of n <= 256 channels (KDA: the K channels of one token
// and value head; GDN: 1), x = raw + dt_bias: g = -a softplus(x) with Triton's softplus (x itself
// above 20), or the lower-bounded lb sigmoid(a x). Vectorised (Highway's Exp/Log1p, 1-2 ULP):
// evaluated one channel at a time with std::exp and std::log1p it took 2/3 of a KDA layer's engine
// call (T = 512, 32 heads x 128, 2 threads, Zen 4: 129 ms against 44 ms with a finished gate). The
// row is staged in a padded buffer so every channel goes through the same vector formula.
void GateActivationRow(float* HWY_RESTRICT g, const float* HWY_RESTRICT bias, size_t n, float a,
                       const std::optional<float>& lower_bound) {
  const DF d;
  const size_t N = hn::Lanes(d);
  HWY_ALIGN float x[256 + HWY_MAX_BYTES / sizeof(float)];
  const size_t padded = RoundUp(n, N);
  for (size_t i = 0; i < n; ++i) x[i] = bias ? g[i] + bias[i] : g[i];
  std::fill(x + n, x + padded, 0.f);
  if (lower_bound) {
    // e^{-a x} capped at e^88 (< FLT_MAX, inside Exp's range): lb / (1 + e^88) is 0 in fp32 anyway.
    const VF neg_a = hn::Set(d, -a), lb = hn::Set(d, *lower_bound), one = hn::Set(d, 1.f), cap = hn::Set(d, 88.f);
    for (size_t i = 0; i < padded; i += N) {
      const VF e = hn::Exp(d, hn::Min(hn::Mul(neg_a, hn::Load(d, x + i)), cap));
      hn::Store(hn::Div(lb, hn::Add(one, e)), d, x + i);
    }
  } else {
    // Above 20 the lanes take x itself; the exponential sees at most 20 (inside its range).
    const VF neg_a = hn::Set(d, -a), twenty = hn::Set(d, 20.f);
    for (size_t i = 0; i < padded; i += N) {
      const VF v = hn::Load(d, x + i);
      const VF sp = hn::IfThenElse(hn::Gt(v, twenty), v, hn::Log1p(d, hn::Exp(d, hn::Min(v, twenty))));
      hn::Store(hn::Mul(neg_a, sp), d, x + i);
    }
  }
  std::copy(x, x + n, g);
}

void LoadGateRow(const LaJob& job, int64_t b, int64_t t, int64_t hv, float* g) {
  const LaInputs& in = job.in;
  const bool kda = job.variant() == Variant::KDA;
  const size_t n = kda ? static_cast<size_t>(job.shape.K) : 1;
  if (kda)
    LoadRow(in.g, offset4(in.g, b, t, hv, 0), in.g.stride[3], n, g);
  else
    g[0] = LoadScalar(in.g, offset3(in.g, b, t, hv));
  if (!job.opt.gate_in_kernel) return;
  // rate exp(A_log), or 1 without A_log (allowed with a lower bound), fp32 as FLA's gate kernels.
  const float a = in.A_log.empty()
                      ? 1.f
                      : std::exp(static_cast<float>(load_as_double(in.A_log.data, in.A_log.dtype, hv * in.A_log.stride[0])));
  float bias_row[256];
  const float* bias = nullptr;
  if (!in.dt_bias.empty()) {
    const int64_t off = in.dt_bias.rank == 2 ? hv * in.dt_bias.stride[0] : (kda ? hv * job.shape.K : hv) * in.dt_bias.stride[0];
    const int64_t step = in.dt_bias.stride[in.dt_bias.rank - 1];
    if (in.dt_bias.dtype == DType::F32 && step == 1) {
      bias = static_cast<const float*>(in.dt_bias.data) + off;  // the models' case: read in place
    } else {
      for (size_t d = 0; d < n; ++d)
        bias_row[d] = static_cast<float>(load_as_double(in.dt_bias.data, in.dt_bias.dtype, off + static_cast<int64_t>(d) * step));
      bias = bias_row;
    }
  }
  GateActivationRow(g, bias, n, a, job.opt.lower_bound);
}

void LoadChunk(const LaJob& job, const SeqSpan& seq, int64_t hv, int64_t t0, size_t L, int64_t col0, int64_t col1,
               const ChunkRows& r) {
  const LaInputs& in = job.in;
  const size_t K = static_cast<size_t>(job.shape.K);
  const int64_t h = job.key_head(hv);
  const int64_t b = seq.batch;
  const bool kda = job.variant() == Variant::KDA;
  const size_t width = static_cast<size_t>(col1 - col0);
  const size_t gk = kda ? K : 1;
  double running[256];  // KDA with kda_factors: the cumulative gates of the current row (K <= 256)
  for (size_t i = 0; i < L; ++i) {
    const int64_t t = seq.bos + t0 + static_cast<int64_t>(i);
    float* q = r.q + i * K;
    float* k = r.k + i * K;
    const float beta_t = gates::beta_transform(
        LoadScalar(in.beta, offset3(in.beta, b, t, hv)),
        job.opt.beta_sigmoid, job.opt.allow_neg_eigval);
    r.beta[i] = beta_t;
    if (!r.skip_qk) {
      // q is scaled as it is loaded unless it is normalised first.
      LoadRow(in.q, offset4(in.q, b, t, h, 0), in.q.stride[3], K, q, job.opt.qk_l2norm ? 1.f : job.scale);
      LoadRow(in.k, offset4(in.k, b, t, h, 0), in.k.stride[3], K, k);
      if (job.opt.qk_l2norm) {
        const float qi = L2Normalize(q, K), ki = L2Normalize(k, K);
        Scale(q, job.scale, K);
        if (r.qinv) r.qinv[i] = qi;
        if (r.kinv) r.kinv[i] = ki;
      }
      if (r.kraw) {  // the rows as stored (contiguous bf16, checked by bf16_grams_possible)
        const auto* qs = static_cast<const uint16_t*>(in.q.data) + offset4(in.q, b, t, h, 0);
        const auto* ks = static_cast<const uint16_t*>(in.k.data) + offset4(in.k, b, t, h, 0);
        std::copy(qs, qs + K, r.qraw + i * r.ldraw);
        std::copy(ks, ks + K, r.kraw + i * r.ldraw);
        std::fill(r.qraw + i * r.ldraw + K, r.qraw + (i + 1) * r.ldraw, uint16_t{0});
        std::fill(r.kraw + i * r.ldraw + K, r.kraw + (i + 1) * r.ldraw, uint16_t{0});
      }
    }
    if (r.v) {
      float* v = r.v + i * r.ldv;
      LoadRow(in.v, offset4(in.v, b, t, hv, col0), in.v.stride[3], width, v, r.v_times_beta ? beta_t : 1.f);
      for (size_t j = width; j < r.ldv; ++j) v[j] = 0.f;
    }
    LoadGateRow(job, b, t, hv, r.graw);
    // Chunk-local cumulative log-decay in fp64 (the sums are exact enough that differences of
    // large cumulative values keep full fp32 precision).
    double* G = r.G + i * gk;
    if (r.kda_factors) {
      for (size_t d = 0; d < K; ++d) running[d] = (i ? running[d] : 0.0) + static_cast<double>(r.graw[d]);
      if (i % kKdaBlock == 0 || i + 1 == L) std::copy(running, running + K, G);
      // e^{g_t} from the gate row itself: the fp64 difference Γt − Γ(t−1) rounds to the same float.
      ExpFloats(r.graw, r.kda_factors + i * K, K);
    } else {
      for (size_t d = 0; d < gk; ++d) G[d] = (i ? r.G[(i - 1) * gk + d] : 0.0) + static_cast<double>(r.graw[d]);
    }
  }
}

// Loads the item's columns of initial_state[n, hv] into S [K x ldS] (zero when absent).
void LoadState(const LaJob& job, int64_t n, int64_t hv, int64_t col0, int64_t col1, float* S, size_t ldS) {
  const size_t K = static_cast<size_t>(job.shape.K);
  const size_t width = static_cast<size_t>(col1 - col0);
  const TensorView& h0 = job.in.initial_state;
  for (size_t d = 0; d < K; ++d) {
    float* row = S + d * ldS;
    std::fill(row, row + ldS, 0.f);
    if (!h0.empty())
      LoadRow(h0, n * h0.stride[0] + hv * h0.stride[1] + static_cast<int64_t>(d) * h0.stride[2] + col0 * h0.stride[3],
              h0.stride[3], width, row);
  }
}

void StoreState(const LaJob& job, int64_t n, int64_t hv, int64_t col0, int64_t col1, const float* S, size_t ldS) {
  const TensorView& ht = job.out.final_state;
  if (ht.empty()) return;
  const size_t K = static_cast<size_t>(job.shape.K);
  for (size_t d = 0; d < K; ++d)
    StoreRow(S + d * ldS, static_cast<size_t>(col1 - col0), ht,
             n * ht.stride[0] + hv * ht.stride[1] + static_cast<int64_t>(d) * ht.stride[2] + col0 * ht.stride[3],
             ht.stride[3]);
}

void StoreOutputRows(const LaJob& job, const SeqSpan& seq, int64_t hv, int64_t t0, size_t L, int64_t col0,
                     int64_t col1, const float* O, size_t ldo) {
  const TensorView& o = job.out.o;
  for (size_t i = 0; i < L; ++i) {
    const int64_t t = seq.bos + t0 + static_cast<int64_t>(i);
    StoreRow(O + i * ldo, static_cast<size_t>(col1 - col0), o, offset4(o, seq.batch, t, hv, col0), o.stride[3]);
  }
}

// Transpose rows [L x K] (ld K) into columns [0, L) of [K x ldt], zero-filling columns
// [L, zero_to). Each output vector is one gather of `lanes` rows' element d (a scalar loop was 6%
// of the GDN chunk).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// dst[c * ldd + r] = src[r * lds + c] for r, c < 16: 64 in-register shuffles instead of 16
// gathers of 16 loads each (the gather transpose was 3.7% of a GDN chunk).
HWY_INLINE void Transpose16x16(const float* HWY_RESTRICT src, size_t lds, float* HWY_RESTRICT dst, size_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  // Pairs of rows interleaved per 128-bit block: t[2i] = (r2i[4b], r2i+1[4b], r2i[4b+1], ...).
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // Quads: r[4g + c] holds, in block b, rows 4g..4g+3 of column 4b + c.
  for (int g = 0; g < 4; ++g) {
    const __m512d a0 = _mm512_castps_pd(t[4 * g]), a1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d a2 = _mm512_castps_pd(t[4 * g + 2]), a3 = _mm512_castps_pd(t[4 * g + 3]);
    r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // Column 4b + c gathers block b of r[c], r[4 + c], r[8 + c], r[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
    const __m512 x2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 x3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    _mm512_storeu_ps(dst + (0 + c) * ldd, _mm512_shuffle_f32x4(x0, x2, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * ldd, _mm512_shuffle_f32x4(x0, x2, 0xDD));
    _mm512_storeu_ps(dst + (8 + c) * ldd, _mm512_shuffle_f32x4(x1, x3, 0x88));
    _mm512_storeu_ps(dst + (12 + c) * ldd, _mm512_shuffle_f32x4(x1, x3, 0xDD));
  }
}
#endif

void TransposeInto(const float* src, size_t L, size_t K, float* dst, size_t ldt, size_t zero_to) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const size_t N = hn::Lanes(d);
  const auto row_offsets = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(K)));
  const size_t full = L / N * N;
  size_t blocked_rows = 0, blocked_cols = 0;  // dst rows [0, blocked_rows) done up to column blocked_cols
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  blocked_rows = K / 16 * 16;
  blocked_cols = L / 16 * 16;
  for (size_t k0 = 0; k0 < blocked_rows; k0 += 16)
    for (size_t j0 = 0; j0 < blocked_cols; j0 += 16) Transpose16x16(src + j0 * K + k0, K, dst + k0 * ldt + j0, ldt);
#endif
  for (size_t k = 0; k < K; ++k) {
    float* row = dst + k * ldt;
    for (size_t j = k < blocked_rows ? blocked_cols : 0; j < full; j += N)
      hn::StoreU(hn::GatherIndex(d, src + j * K + k, row_offsets), d, row + j);
    for (size_t j = full; j < L; ++j) row[j] = src[j * K + k];
    for (size_t j = L; j < zero_to; ++j) row[j] = 0.f;
  }
}

void Transpose(const float* src, size_t L, size_t K, float* dst, size_t ldt) { TransposeInto(src, L, K, dst, ldt, ldt); }

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

// ---------------------------------------------------------------------------------------------
// Head-fused item.

struct FusedLayout {
  size_t K, C, Vp, ldc, gk;  // Vp: leading dim of V-wide rows; ldc: of C-wide rows
  size_t KrQs, KnQg, Kt, AP, XO, G, beta, egam, graw, KQl, KrT, eg;
  size_t ldw, Tinv, W, U;  // only without GEMM-first: the inverse, W and U of the W/U form
  // only with bf16 grams: raw q/k rows (ldraw bf16 each), K^T in bf16 pairs (ldc per pair row),
  // the grams' row and column factors
  size_t ldraw, raw, KtPairs, gram_scale;
  size_t AP_unmasked;  // only for GDN with HV > H: the grams before masking, for the next value head
  size_t Eg;  // only with update_keeps_vnew: v_new scaled by e^{Γ_L−Γ_j} for the update
  size_t total;
};

FusedLayout MakeFusedLayout(const LaJob& job, int64_t width, int chunk, const FusedProgram& program) {
  FusedLayout l{};
  l.K = static_cast<size_t>(job.shape.K);
  l.C = static_cast<size_t>(chunk);
  l.Vp = LeadingDim(static_cast<size_t>(width));
  l.ldc = LeadingDim(l.C);
  l.gk = job.variant() == Variant::KDA ? l.K : 1;
  size_t off = 0;
  auto take = [&](size_t floats) {
    const size_t at = off;
    off += RoundUp(floats, kPad);
    return at;
  };
  l.KrQs = take(2 * l.C * l.K);
  l.KnQg = take(2 * l.C * l.K);
  l.Kt = take(l.K * l.ldc);
  l.AP = take(2 * l.C * l.ldc);
  l.XO = take(2 * l.C * l.Vp);
  l.G = take(2 * l.C * l.gk);  // doubles
  l.beta = take(l.C);
  l.egam = take(l.C * std::max<size_t>(l.gk, 2));  // GDN: e^Γ_i, then e^{Γ_L−Γ_j} (update)
  l.graw = take(std::max(l.K, l.C));  // a gate row (K) or a row of C gate factors (MaskGram)
  l.KQl = take(2 * 16 * l.K);
  l.KrT = take(l.K * l.ldc);
  l.eg = take(l.C * l.gk);  // KDA: per-token decay factors of the chunk
  l.ldw = LeadingDim(l.K);
  if (!program.gemm_first) {
    l.Tinv = take(l.C * l.ldc);
    l.W = take(l.C * l.ldw);
    l.U = take(l.C * std::max(l.Vp, l.ldw));  // also stages T Kn (ld ldw)
  }
  if (job.bf16_grams) {
    l.ldraw = RoundUp(l.K, 32);  // whole AMX tile steps (32 bf16 = 64 bytes per tile row)
    l.raw = take(l.C * l.ldraw);  // two blocks of C x ldraw bf16 = C x ldraw floats
    l.KtPairs = take(l.ldraw / 2 * l.ldc);
    l.gram_scale = take(3 * l.C);
  }
  if (job.variant() == Variant::GDN && job.group > 1) l.AP_unmasked = take(2 * l.C * l.ldc);
  if (program.update_keeps_vnew) l.Eg = take(l.C * l.Vp);
  l.total = off;
  return l;
}


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
// e^{Γr−Γj} held in NV registers instead of a row in memory: per pair one multiply of the product
// and the two dots, no load/store round trip of the product (the memory version was ~9% of a KDA
// chunk). Same operations in the same order as the generic loop below, so the same results.
template <size_t NV>
void KdaBlockPairs(const float* HWY_RESTRICT Kr, const float* HWY_RESTRICT Qs, const float* HWY_RESTRICT eg,
                   size_t n, size_t rows, size_t K, size_t ldc, float* HWY_RESTRICT KK, float* HWY_RESTRICT QK) {
  const DF d;
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i < rows; ++i) {
    const size_t r = n + i;
    const float* qr = Qs + r * K;
    const float* kr = Kr + r * K;
    VF f[NV];
    for (size_t v = 0; v < NV; ++v) f[v] = hn::Set(d, 1.f);
    for (size_t j = r + 1; j-- > n;) {
      if (j < r)
        for (size_t v = 0; v < NV; ++v) f[v] = hn::Mul(f[v], hn::LoadU(d, eg + (j + 1) * K + v * N));
      const float* kj = Kr + j * K;
      VF aq = hn::Zero(d), ak = hn::Zero(d);
      for (size_t v = 0; v < NV; ++v) {
        const VF kf = hn::Mul(hn::LoadU(d, kj + v * N), f[v]);
        aq = hn::MulAdd(hn::LoadU(d, qr + v * N), kf, aq);
        ak = hn::MulAdd(hn::LoadU(d, kr + v * N), kf, ak);
      }
      QK[r * ldc + j] = hn::GetLane(hn::SumOfLanes(d, aq));
      KK[r * ldc + j] = j < r ? hn::GetLane(hn::SumOfLanes(d, ak)) : 0.f;
    }
  }
}

// Up to 8 vectors of product (K = 128 on AVX-512): with q, k and the accumulators that still fits
// 32 registers; 16-register targets get K <= 64 this way.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kMaxPairVectors = 4;
#else
constexpr size_t kMaxPairVectors = 8;
#endif

// Runs KdaBlockPairs<nv> when K is exactly nv <= NV vectors; false otherwise (generic loop).
template <size_t NV>
bool KdaBlockPairsInRegisters(size_t nv, bool whole_vectors, const float* Kr, const float* Qs, const float* eg,
                              size_t n, size_t rows, size_t K, size_t ldc, float* KK, float* QK) {
  if constexpr (NV == 0) {
    return false;
  } else {
    if (!whole_vectors || nv > NV) return false;
    if (nv == NV) {
      KdaBlockPairs<NV>(Kr, Qs, eg, n, rows, K, ldc, KK, QK);
      return true;
    }
    return KdaBlockPairsInRegisters<NV - 1>(nv, whole_vectors, Kr, Qs, eg, n, rows, K, ldc, KK, QK);
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
void MaskGram(bool gdn, const double* G, const float* beta, size_t L, size_t C, size_t ldc, float* AP, float* ftmp,
              const GramScale* sc = nullptr) {
  float* KK = AP;
  float* QK = AP + C * ldc;
  const size_t Lp = RoundUp(L, kPad);
  // G holds C doubles and ftmp at least C floats: whole vectors stay inside both when C is a
  // multiple of the vector length (with a staged tail in 60 of 64 rows this pass took 9.0K TSC
  // cycles per GDN chunk, now 4.9K).
  const bool whole = C % hn::Lanes(DF()) == 0;
  for (size_t i = 0; i < L; ++i) {
    if (gdn) (whole ? ExpDiffFromWhole : ExpDiffFrom)(G[i], G, ftmp, i + 1);
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
      VF gate = gdn ? hn::IfThenElseZero(hn::FirstN(d, upto), hn::LoadU(d, ftmp + j0)) : hn::Set(d, 1.f);
      if (sc) gate = hn::Mul(gate, hn::LoadU(d, sc->col + j0));
      hn::StoreU(hn::IfThenElseZero(hn::FirstN(d, below), hn::Mul(hn::Mul(vbeta, gate), hn::LoadU(d, a + j0))), d,
                 a + j0);
      hn::StoreU(hn::IfThenElseZero(hn::FirstN(d, upto), hn::Mul(hn::Mul(vp, gate), hn::LoadU(d, p + j0))), d,
                 p + j0);
    }
  }
}

// A group of items sharing the sequence and the column block (consecutive value heads, normally):
// all run chunk c before any runs chunk c+1, each with its own state in the arena. The heads'
// rows of one token are adjacent in q, k, v and o, so the group reads and writes memory in runs
// the hardware prefetchers follow, instead of one isolated row per head and token.
//
// Per chunk the rows are loaded, then the stages of `program` run in the plan's order (one case
// of the switch below each; plan_exec.hpp lists the plan operators each stage runs).
void FusedGroup(const LaJob& job, const WorkItem* items, size_t count, float* arena, int chunk,
                const FusedProgram& program) {
  const WorkItem& first = items[0];
  const SeqSpan seq = job.seqs[static_cast<size_t>(first.seq)];
  const bool kda = job.variant() == Variant::KDA;
  const FusedLayout l = MakeFusedLayout(job, first.col1 - first.col0, chunk, program);
  const size_t K = l.K, C = l.C, Vp = l.Vp, ldc = l.ldc, gk = l.gk;
  const size_t width = RoundUp(static_cast<size_t>(first.col1 - first.col0), kPad);  // GEMM N
  // count states of K x Vp after the shared buffers (twice as many without the in-place update:
  // state g lives at g or count + g, alternating per chunk).
  float* states = arena + l.total;
  const size_t state_floats = RoundUp(K * Vp, kPad);
  size_t parity = 0;  // which half holds the current states (always 0 in place)
  float* Kr = arena + l.KrQs;
  float* Qs = Kr + C * K;
  float* Kn = arena + l.KnQg;
  float* Qg = Kn + C * K;
  float* Kt = arena + l.Kt;
  float* AP = arena + l.AP;
  float* X = arena + l.XO;
  float* O = X + C * Vp;
  double* G = reinterpret_cast<double*>(arena + l.G);
  float* beta = arena + l.beta;
  float* egam = arena + l.egam;
  float* graw = arena + l.graw;

  for (size_t g = 0; g < count; ++g)
    LoadState(job, items[g].seq, items[g].head, items[g].col0, items[g].col1, states + g * state_floats, Vp);
  ChunkRows rows{Qs, Kr, X, Vp, G, beta, graw, /*v_times_beta=*/true};
  if (kda) rows.kda_factors = arena + l.eg;
  // bf16 grams: raw rows staged by LoadChunk; factors p_row (all `scale` without L2 norms), then
  // a_row = col = the keys' inverse norms (all 1 without).
  float* gram_scale = job.bf16_grams ? arena + l.gram_scale : nullptr;
  GramScale gram_sc{};
  if (job.bf16_grams) {
    gram_sc = {gram_scale + C, gram_scale, gram_scale + C};
    rows.qraw = reinterpret_cast<uint16_t*>(arena + l.raw);
    rows.kraw = rows.qraw + C * l.ldraw;
    rows.ldraw = l.ldraw;
    std::fill(gram_scale, gram_scale + C, job.scale);
    std::fill(gram_scale + C, gram_scale + 3 * C, 1.f);
    if (job.opt.qk_l2norm) {
      rows.qinv = gram_scale;
      rows.kinv = gram_scale + C;
    }
  }
  ChunkPrefetcher prefetch(program.prefetch_rate);
  const TileShape tile = ProgramTile(program);
  OperatorClock clock;  // per-operator timers (operator_timers.hpp; empty unless compiled in)
  clock.skip();         // the states' loads are nobody's
  // GDN (GEMM-first): the X GEMM's row factors −β e^Γ, in egam's second half (the update's
  // e^{Γ_L−Γ_j} go there only after the X GEMM).
  float* gdn_x_scale = egam + C;
  for (int64_t t0 = 0; t0 < seq.len; t0 += chunk)
  for (size_t g = 0; g < count; ++g) {
    const WorkItem& item = items[g];
    const int64_t hv = item.head;
    float* S = states + (parity * count + g) * state_floats;
    const size_t L = static_cast<size_t>(std::min<int64_t>(chunk, seq.len - t0));
    const size_t Lp = RoundUp(L, kPad);
    // GDN value heads that read the same key head (HV > H) have the same q, k and grams before
    // the per-head beta and decays: the group's previous head left them in the arena.
    const bool keys_loaded = !kda && g > 0 && job.key_head(hv) == job.key_head(items[g - 1].head);
    const bool keys_reused_next = !kda && g + 1 < count && job.key_head(items[g + 1].head) == job.key_head(hv);
    rows.skip_qk = keys_loaded;
    LoadChunk(job, seq, hv, t0, L, item.col0, item.col1, rows);
    clock.mark(Op::kLoad);
    // Prefetch what runs next: the group's next head on this chunk, or the first head on the next.
    if (g + 1 < count)
      prefetch.plan(job, seq, items[g + 1].head, t0, L, item.col0, item.col1);
    else if (t0 + chunk < seq.len)
      prefetch.plan(job, seq, items[0].head, t0 + chunk,
                    static_cast<size_t>(std::min<int64_t>(chunk, seq.len - t0 - chunk)), item.col0, item.col1);
    else
      prefetch.plan(job, seq, 0, 0, 0, 0, 0);
    for (const CpuStage stage : program.stages) switch (stage) {
      case CpuStage::Gate: {
        // #1 Gate: e^Γ per row (GDN) or per row and channel (KDA); scale the GEMM operands. KDA:
        // the per-token factors e^{g_t} first; e^{Γi} is exact at the 16-row anchors and the last
        // row (the state's decay) and a product of at most 15 factors in between.
        if (!kda) ExpRow(G, egam, L);  // one gate per row: the whole column at once (KDA: LoadChunk
                                       // left the per-token factors in l.eg)
        for (size_t i = 0; i < L; ++i) {
          if (kda && i % kKdaBlock != 0 && i + 1 != L)
            MulRows(egam + (i - 1) * K, arena + l.eg + i * K, egam + i * K, K);
          else if (kda)
            ExpRow(G + i * K, egam + i * K, K);
          if (kda) {
            MulRowsScaled(Kr + i * K, egam + i * K, -beta[i], Kn + i * K, K);
            MulRows(Qs + i * K, egam + i * K, Qg + i * K, K);
          } else if (program.gemm_first) {
            gdn_x_scale[i] = -beta[i] * egam[i];
          } else {
            ScaleTo(Kr + i * K, -beta[i] * egam[i], Kn + i * K, K);  // the W/U form needs Kn itself
          }
        }
        clock.mark(Op::kGate);
        break;
      }
      case CpuStage::StateK:
        // GEMM-first: X = diag(β)V − diag(β e^Γ) K S (LoadChunk left diag(β)V in X). GDN's gates are
        // one scalar per row: they scale the products as the tiles store them.
        if (kda) Gemm<Acc::kAdd>(Kn, K, S, Vp, X, Vp, L, width, K, Tri::kNone, &prefetch, nullptr, tile);
        else Gemm<Acc::kAddRowScaled>(Kr, K, S, Vp, X, Vp, L, width, K, Tri::kNone, &prefetch, gdn_x_scale, tile);
        clock.mark(Op::kStateGemms);
        break;
      case CpuStage::StateQ:
        // O = diag(e^Γ) Q S. Kept apart from the X GEMM rather than one GEMM over the stacked
        // [Kn; Qg]: measured faster on AVX-512 (the stacked A operand, 2C x K, no longer stays in
        // L1 next to the S panel).
        if (kda) Gemm<Acc::kSet>(Qg, K, S, Vp, O, Vp, L, width, K, Tri::kNone, &prefetch, nullptr, tile);
        else Gemm<Acc::kSetRowScaled>(Qs, K, S, Vp, O, Vp, L, width, K, Tri::kNone, &prefetch, egam, tile);
        clock.mark(Op::kStateGemms);
        break;
      case CpuStage::Grams:
        // #2 KKT and the intra-chunk Q K^T.
        if (keys_loaded) {
          std::copy(arena + l.AP_unmasked, arena + l.AP_unmasked + 2 * C * ldc, AP);
        } else if (kda) {
          KdaGram(Kr, Qs, G, L, K, C, ldc, arena + l.KQl, arena + l.KrT, graw, arena + l.eg, AP, &prefetch, tile);
        } else if (job.bf16_grams) {
          // The grams of the stored bf16 rows on AMX (gram_bf16.cpp); scale and the norms are
          // applied by MaskGram. Kt (f32) is still needed by the state update. K^T in bf16 pairs is
          // the transpose of the rows read as 32-bit words.
          Transpose(Kr, L, K, Kt, ldc);
          float* KtPairs = arena + l.KtPairs;
          TransposeInto(reinterpret_cast<const float*>(rows.kraw), L, l.ldraw / 2, KtPairs, ldc, ldc);
          gram_bf16_lower(rows.kraw, rows.qraw, l.ldraw, reinterpret_cast<const uint32_t*>(KtPairs), ldc, L, AP,
                          AP + C * ldc, ldc);
          for (size_t i = 0; i < L / 2; ++i) prefetch.tile();  // the share of the f32 grams' tiles
          if (job.opt.qk_l2norm)
            for (size_t i = 0; i < L; ++i) gram_scale[i] *= job.scale;  // p_row = scale / |q_i|
        } else {
          Transpose(Kr, L, K, Kt, ldc);
          Gemm<Acc::kSet>(Kr, K, Kt, ldc, AP, ldc, L, Lp, K, Tri::kLowerN, &prefetch, nullptr, tile);
          Gemm<Acc::kSet>(Qs, K, Kt, ldc, AP + C * ldc, ldc, L, Lp, K, Tri::kLowerN, &prefetch, nullptr, tile);
        }
        if (keys_reused_next && !keys_loaded) std::copy(AP, AP + 2 * C * ldc, arena + l.AP_unmasked);
        clock.mark(Op::kGrams);
        break;
      case CpuStage::Mask:
        MaskGram(!kda, G, beta, L, C, ldc, AP, graw, job.bf16_grams ? &gram_sc : nullptr);
        clock.mark(Op::kMask);
        break;
      case CpuStage::Solve:
        // #3 Solve (I + A) E = X: v_new, in place; W is never formed.
        SolveUnitLower(AP, ldc, X, Vp, L, width, tile);
        clock.mark(Op::kSolve);
        break;
      case CpuStage::Inverse: {
        // #3 as FLA orders it: T = (I + A)^-1.
        float* Tinv = arena + l.Tinv;
        for (size_t i = 0; i < L; ++i) {
          std::fill(Tinv + i * ldc, Tinv + i * ldc + Lp, 0.f);
          Tinv[i * ldc + i] = 1.f;
        }
        SolveUnitLower(AP, ldc, Tinv, ldc, L, Lp, tile);
        clock.mark(Op::kSolve);
        break;
      }
      case CpuStage::WU: {
        // #4 W = T diag(β e^Γ) K (here −W, from Kn), U = T diag(β) V (LoadChunk left diag(β)V in X).
        const float* Tinv = arena + l.Tinv;
        float* W = arena + l.W;
        float* U = arena + l.U;
        for (size_t i = 0; i < L; ++i) {
          std::copy(Kn + i * K, Kn + (i + 1) * K, W + i * l.ldw);  // staging for T Kn
          std::fill(W + i * l.ldw + K, W + (i + 1) * l.ldw, 0.f);
        }
        float* Wm = U;  // T Kn into U's storage first, then copied back into W
        Gemm<Acc::kSet>(Tinv, ldc, W, l.ldw, Wm, l.ldw, L, RoundUp(K, kPad), L, Tri::kLowerK, nullptr, nullptr, tile);
        for (size_t i = 0; i < L; ++i) std::copy(Wm + i * l.ldw, Wm + (i + 1) * l.ldw, W + i * l.ldw);
        Gemm<Acc::kSet>(Tinv, ldc, X, Vp, U, Vp, L, width, L, Tri::kLowerK, nullptr, nullptr, tile);
        for (size_t i = 0; i < L; ++i) std::copy(U + i * Vp, U + (i + 1) * Vp, X + i * Vp);
        clock.mark(Op::kSolve);
        break;
      }
      case CpuStage::StateW:
        // #5 read in the W/U form: v_new = U − W S, i.e. X = U + (−W) S.
        Gemm<Acc::kAdd>(arena + l.W, l.ldw, S, Vp, X, Vp, L, width, K, Tri::kNone, nullptr, nullptr, tile);
        clock.mark(Op::kStateGemms);
        break;
      case CpuStage::Output:
        // #6 Output: O += P E, then store.
        Gemm<Acc::kAdd>(AP + C * ldc, ldc, X, Vp, O, Vp, L, width, L, Tri::kLowerK, &prefetch, nullptr, tile);
        clock.mark(Op::kOutput);
        StoreOutputRows(job, seq, hv, t0, L, item.col0, item.col1, O, Vp);
        clock.mark(Op::kStore);
        break;
      case CpuStage::Update: {
        // #5 update: S <- e^{Γ_L} S + Σ_j (e^{Γ_L−Γ_j} k_j)^T E_j; the decay of S is applied by the
        // GEMM as it loads S (kScaleAdd with one factor per row of S).
        const double* GL = G + (L - 1) * gk;
        float* decay_rows = graw;  // K factors (graw holds max(K, C) floats)
        const float* E = X;        // v_new, or (GDN) v_new scaled by e^{Γ_L−Γ_j}
        if (kda) {
          // Kt[d][j] = k_j[d] e^{ΓL[d]−Γj[d]}: the columns before the last anchor nl come from the
          // gram's KrT (k_j e^{Γnl−Γj}) times e^{ΓL−Γnl}; the rest need exponentials of their own.
          const size_t nl = (L - 1) / kKdaBlock * kKdaBlock;
          // e^{ΓL−Γj} = Π_{t=j+1..L} e^{g_t} from j = L − 1 down (1 for the last row; at most 15
          // factors); the last product, e^{ΓL−Γnl}, carries the gram's older columns.
          const float* KrT = arena + l.KrT;
          const float* eg = arena + l.eg;
          float* staging = arena + l.KQl;  // 32 x K rows, free after the gram
          std::copy(Kr + (L - 1) * K, Kr + L * K, staging + (L - 1 - nl) * K);
          std::fill(graw, graw + K, 1.f);
          for (size_t j = L - 1; j-- > nl;) {
            MulInPlace(graw, eg + (j + 1) * K, K);
            MulRows(Kr + j * K, graw, staging + (j - nl) * K, K);
          }
          if (nl > 0)  // graw = e^{ΓL−Γnl} now; the gram left KrT[d][j] = k_j[d] e^{Γnl[d]−Γj[d]}
            for (size_t d = 0; d < K; ++d) ScaleTo(KrT + d * ldc, graw[d], Kt + d * ldc, nl);
          TransposeInto(staging, L - nl, K, Kt + nl, ldc, L - nl);
          std::copy(egam + (L - 1) * K, egam + L * K, decay_rows);
        } else {
          float* to_end = egam + C;  // GDN uses egam's first C floats only; e^{Γ_L−Γ_j} after them
          ExpDiffFrom(GL[0], G, to_end, L);
          if (program.update_keeps_vnew) {  // a later stage still reads v_new: scale a copy
            float* Eg = arena + l.Eg;
            for (size_t j = 0; j < L; ++j) ScaleTo(X + j * Vp, to_end[j], Eg + j * Vp, width);
            E = Eg;
          } else {
            for (size_t j = 0; j < L; ++j) Scale(X + j * Vp, to_end[j], width);
          }
          std::fill(decay_rows, decay_rows + K, egam[L - 1]);
        }
        float* S_next = S;
        if (!program.state_in_place) {  // the next state in the other half, from a copy of this one
          S_next = states + ((1 - parity) * count + g) * state_floats;
          std::copy(S, S + K * Vp, S_next);
        }
        Gemm<Acc::kScaleAdd>(Kt, ldc, E, Vp, S_next, Vp, K, width, L, Tri::kNone, &prefetch, decay_rows, tile);
        clock.mark(Op::kUpdate);
        break;
      }
    }
    if (!program.state_in_place && g + 1 == count) parity = 1 - parity;
    prefetch.rest();  // whatever the tiles did not issue
    clock.head_chunk_done();
  }
  for (size_t g = 0; g < count; ++g)
    StoreState(job, items[g].seq, items[g].head, items[g].col0, items[g].col1,
               states + (parity * count + g) * state_floats, Vp);
  hwy::FlushStream();  // order the streaming stores of o before the pool hands the results over
}

size_t FusedArenaFloats(const LaJob& job, int64_t width, int chunk, size_t group, const FusedProgram& program) {
  const FusedLayout l = MakeFusedLayout(job, width, chunk, program);
  return l.total + (program.state_in_place ? 1 : 2) * group * RoundUp(l.K * l.Vp, kPad);
}

// ---------------------------------------------------------------------------------------------
// Recurrent form / decode: per token, S' = decay S; e = β (v − k S'); S = S' + k^T e; o = q S.

size_t RecurrentArenaFloats(const LaJob& job, int64_t width) {
  const size_t K = static_cast<size_t>(job.shape.K), Vp = RoundUp(static_cast<size_t>(width), kPad);
  return K * Vp + 2 * RoundUp(K, kPad) + 3 * Vp + 2 * RoundUp(K, kPad) + 4 * kPad;
}

void RecurrentItem(const LaJob& job, const WorkItem& item, float* arena) {
  const SeqSpan seq = job.seqs[static_cast<size_t>(item.seq)];
  const int64_t hv = item.head;
  const bool kda = job.variant() == Variant::KDA;
  const size_t K = static_cast<size_t>(job.shape.K);
  const size_t width = static_cast<size_t>(item.col1 - item.col0);
  const size_t Vp = RoundUp(width, kPad), Kp = RoundUp(K, kPad);
  float* S = arena;
  float* q = S + K * Vp;
  float* k = q + Kp;
  float* v = k + Kp;
  float* kS = v + Vp;
  float* o = kS + Vp;
  float* decay = o + Vp;
  float* graw = decay + Kp;
  double G1[1];
  LoadState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  const DF d;
  const size_t N = hn::Lanes(d);
  const ChunkRows rows{q, k, v, Vp, nullptr, nullptr, graw};
  std::vector<double> Gk(kda ? K : 1);
  for (int64_t t = 0; t < seq.len; ++t) {
    float beta = 0.f;
    ChunkRows r = rows;
    r.G = kda ? Gk.data() : G1;
    r.beta = &beta;
    LoadChunk(job, seq, hv, t, 1, item.col0, item.col1, r);
    const size_t gk = kda ? K : 1;
    for (size_t i = 0; i < gk; ++i) decay[i] = std::exp(static_cast<float>(r.G[i]));
    // Pass 1: S' = decay S and kS = k S' together.
    for (size_t j = 0; j < Vp; j += N) hn::StoreU(hn::Zero(d), d, kS + j);
    for (size_t dd = 0; dd < K; ++dd) {
      const float dec = kda ? decay[dd] : decay[0];
      float* row = S + dd * Vp;
      const VF vdec = hn::Set(d, dec), vk = hn::Set(d, k[dd]);
      for (size_t j = 0; j < Vp; j += N) {
        const VF s = hn::Mul(hn::LoadU(d, row + j), vdec);
        hn::StoreU(s, d, row + j);
        hn::StoreU(hn::MulAdd(vk, s, hn::LoadU(d, kS + j)), d, kS + j);
      }
    }
    // e = β (v − kS), kept in kS.
    const VF vb = hn::Set(d, beta);
    for (size_t j = 0; j < Vp; j += N) hn::StoreU(hn::Mul(vb, hn::Sub(hn::LoadU(d, v + j), hn::LoadU(d, kS + j))), d, kS + j);
    // Pass 2: S += k^T e and o = q S together.
    for (size_t j = 0; j < Vp; j += N) hn::StoreU(hn::Zero(d), d, o + j);
    for (size_t dd = 0; dd < K; ++dd) {
      float* row = S + dd * Vp;
      const VF vk = hn::Set(d, k[dd]), vq = hn::Set(d, q[dd]);
      for (size_t j = 0; j < Vp; j += N) {
        const VF s = hn::MulAdd(vk, hn::LoadU(d, kS + j), hn::LoadU(d, row + j));
        hn::StoreU(s, d, row + j);
        hn::StoreU(hn::MulAdd(vq, s, hn::LoadU(d, o + j)), d, o + j);
      }
    }
    StoreOutputRows(job, seq, hv, t, 1, item.col0, item.col1, o, Vp);
  }
  StoreState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  hwy::FlushStream();
}

// ---------------------------------------------------------------------------------------------
// FLA-style chunk-parallel baseline. Phase 1 (per chunk and head): Γ, T = (I+A)^-1,
// W = T diag(β e^Γ) K, U = T diag(β) V into main memory. Phase 2 (per sequence, head, columns):
// h[c] = S, v_new = U − W S, S update. Phase 3 (per chunk and head): O = (Q e^Γ) h[c] + P v_new.

struct FlaScratch {
  size_t K, C, Vp, gk;
  size_t q, k, v, G, beta, graw, AP, Kt, KQl, KrT, eg, tmpA, tmpB, total;
};

FlaScratch MakeFlaScratch(const LaJob& job, int chunk) {
  FlaScratch s{};
  s.K = static_cast<size_t>(job.shape.K);
  s.C = static_cast<size_t>(chunk);
  s.Vp = RoundUp(static_cast<size_t>(job.shape.V), kPad);
  s.gk = job.variant() == Variant::KDA ? s.K : 1;
  const size_t Kp = RoundUp(s.K, kPad);
  size_t off = 0;
  auto take = [&](size_t floats) {
    const size_t at = off;
    off += RoundUp(floats, kPad);
    return at;
  };
  s.q = take(s.C * s.K);
  s.k = take(s.C * s.K);
  s.v = take(s.C * s.Vp);
  s.G = take(2 * s.C * s.gk);
  s.beta = take(s.C);
  s.graw = take(std::max(s.K, s.C));  // a gate row (K) or a row of C gate factors (MaskGram)
  s.AP = take(2 * s.C * s.C);
  s.Kt = take(s.K * s.C);
  s.KQl = take(2 * 16 * s.K);
  s.KrT = take(s.K * s.C);
  s.eg = take(s.C * s.gk);
  s.tmpA = take(s.C * std::max(Kp, s.Vp));
  s.tmpB = take(s.C * std::max(Kp, s.Vp));
  s.total = off;
  return s;
}

struct ChunkRef {
  SeqSpan seq;
  int64_t t0;
  size_t L;
};

ChunkRef FlaChunk(const LaJob& job, const FlaBuffers& buf, int64_t c) {
  const SeqSpan seq = job.seqs[static_cast<size_t>(buf.chunk_seq[c])];
  const int64_t t0 = buf.chunk_start[c];
  return {seq, t0, static_cast<size_t>(std::min<int64_t>(buf.chunk, seq.len - t0))};
}

// Loads the chunk rows and Γ into the scratch and forms the masked grams: the Map phase
// (map_phase) needs K K^T and v, the output phase Q K^T, as FLA's separate kernels compute them
// (GDN; KDA's anchored evaluation forms both together). Returns the ChunkRef.
ChunkRef FlaPrepare(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch, bool map_phase) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaChunk(job, buf, c);
  float* q = scratch + s.q;
  float* k = scratch + s.k;
  double* G = reinterpret_cast<double*>(scratch + s.G);
  float* beta = scratch + s.beta;
  float* graw = scratch + s.graw;
  float* AP = scratch + s.AP;
  const ChunkRows rows{q, k, map_phase ? scratch + s.v : nullptr, s.Vp, G, beta, graw};
  LoadChunk(job, ch.seq, hv, ch.t0, ch.L, 0, job.shape.V, rows);
  const size_t Lp = RoundUp(ch.L, kPad);
  if (s.gk > 1) {
    KdaTokenFactors(G, ch.L, s.K, scratch + s.eg);
    KdaGram(k, q, G, ch.L, s.K, s.C, s.C, scratch + s.KQl, scratch + s.KrT, graw, scratch + s.eg, AP);
  } else {
    float* Kt = scratch + s.Kt;
    Transpose(k, ch.L, s.K, Kt, s.C);
    if (map_phase)
      Gemm<Acc::kSet>(k, s.K, Kt, s.C, AP, s.C, ch.L, Lp, s.K, Tri::kLowerN);
    else
      Gemm<Acc::kSet>(q, s.K, Kt, s.C, AP + s.C * s.C, s.C, ch.L, Lp, s.K, Tri::kLowerN);
  }
  MaskGram(s.gk == 1, G, beta, ch.L, s.C, s.C, AP, graw);
  return ch;
}

void FlaMapChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaPrepare(job, buf, c, hv, scratch, true);
  const size_t K = s.K, C = s.C, Vp = s.Vp, L = ch.L, gk = s.gk;
  const int64_t HV = job.shape.HV;
  const size_t slot = static_cast<size_t>(c * HV + hv);
  float* T = buf.T + slot * C * C;
  const size_t Kp = RoundUp(K, kPad);
  float* W = buf.W + slot * C * Kp;
  float* U = buf.U + slot * C * Vp;
  double* gam = buf.gamma + slot * C * gk;
  const float* k = scratch + s.k;
  const float* v = scratch + s.v;
  const double* G = reinterpret_cast<const double*>(scratch + s.G);
  const float* beta = scratch + s.beta;
  float* egam = scratch + s.graw;  // K floats: one row of e^Γ at a time
  // T = (I + A)^-1: solve against the identity (rows padded to a vector multiple).
  std::fill(T, T + C * C, 0.f);
  for (size_t i = 0; i < L; ++i) T[i * C + i] = 1.f;
  SolveUnitLower(scratch + s.AP, C, T, C, L, RoundUp(L, kPad));
  // W = T diag(β e^Γ) K, U = T diag(β) V (FLA's recompute_w_u).
  float* Kb = scratch + s.tmpA;
  float* Vb = scratch + s.tmpB;
  for (size_t i = 0; i < L; ++i) {
    ExpRow(G + i * gk, egam, gk);
    float* kb = Kb + i * Kp;
    if (gk > 1) {
      MulRows(k + i * K, egam, kb, K);
      Scale(kb, beta[i], K);
    } else {
      ScaleTo(k + i * K, beta[i] * egam[0], kb, K);
    }
    std::fill(kb + K, kb + Kp, 0.f);
    ScaleTo(v + i * Vp, beta[i], Vb + i * Vp, Vp);
    for (size_t d = 0; d < gk; ++d) gam[i * gk + d] = G[i * gk + d];
  }
  // W = T Kb: rows of W and Kb are padded to Kp columns (zero pads) so W is a GEMM output.
  Gemm<Acc::kSet>(T, C, Kb, Kp, W, Kp, L, Kp, L, Tri::kLowerK);
  Gemm<Acc::kSet>(T, C, Vb, Vp, U, Vp, L, Vp, L, Tri::kLowerK);
}

// The item's columns [col0, col1) only (FLA's BV tiling): the state, v_new and the snapshots h of
// those columns; sibling column blocks may run on other threads at the same time, so v_new is
// formed in scratch and only the item's columns are written to the shared buffers.
void FlaReduceItem(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const size_t K = s.K, C = s.C, Vp = s.Vp, gk = s.gk;
  const int64_t HV = job.shape.HV, hv = item.head;
  const SeqSpan seq = job.seqs[static_cast<size_t>(item.seq)];
  const size_t Kp = RoundUp(K, kPad);
  const size_t c0 = static_cast<size_t>(item.col0), w = static_cast<size_t>(item.col1 - item.col0);
  // GEMM width: whole heads as always (Vp); a block in whole vectors, which stays inside Vp
  // because blocks start at multiples of the column quantum (the vector length or a multiple).
  const size_t N = item.col0 == 0 && item.col1 == job.shape.V ? Vp : RoundUp(w, hn::Lanes(DF()));
  float* S = scratch;  // K x Vp: the running state of the item's columns (FlaScratchFloats reserves room)
  float* krow = S + RoundUp(K * Vp, kPad);
  float* Kt = krow + Kp;  // K x C: decayed keys of the chunk
  float* vnew = Kt + RoundUp(K * C, kPad);  // C x Vp: v_new of the item's columns
  LoadState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  int64_t c = buf.seq_first_chunk[item.seq];
  for (int64_t t0 = 0; t0 < seq.len; t0 += buf.chunk, ++c) {
    const size_t L = static_cast<size_t>(std::min<int64_t>(buf.chunk, seq.len - t0));
    const size_t slot = static_cast<size_t>(c * HV + hv);
    for (size_t d = 0; d < K; ++d) std::memcpy(buf.h + slot * K * Vp + d * Vp + c0, S + d * Vp, w * sizeof(float));
    // v_new = U − W S
    const float* U = buf.U + slot * C * Vp;
    for (size_t i = 0; i < L; ++i) {
      std::memcpy(vnew + i * Vp, U + i * Vp + c0, w * sizeof(float));
      std::fill(vnew + i * Vp + w, vnew + i * Vp + N, 0.f);
    }
    Gemm<Acc::kSub>(buf.W + slot * C * Kp, Kp, S, Vp, vnew, Vp, L, N, K);
    for (size_t i = 0; i < L; ++i) std::memcpy(buf.v_new + slot * C * Vp + i * Vp + c0, vnew + i * Vp, w * sizeof(float));
    const double* gam = buf.gamma + slot * C * gk;
    const double* GL = gam + (L - 1) * gk;
    // FLA's state kernel re-reads the chunk's keys from main memory.
    for (size_t j = 0; j < L; ++j) {
      const int64_t t = seq.bos + t0 + static_cast<int64_t>(j);
      LoadRow(job.in.k, offset4(job.in.k, seq.batch, t, job.key_head(hv), 0), job.in.k.stride[3], K, krow);
      if (job.opt.qk_l2norm) L2Normalize(krow, K);
      for (size_t d = 0; d < K; ++d) {
        const float e = std::exp(static_cast<float>(GL[gk > 1 ? d : 0] - gam[j * gk + (gk > 1 ? d : 0)]));
        Kt[d * C + j] = krow[d] * e;
      }
    }
    for (size_t d = 0; d < K; ++d) Scale(S + d * Vp, std::exp(static_cast<float>(GL[gk > 1 ? d : 0])), N);
    Gemm<Acc::kAdd>(Kt, C, vnew, Vp, S, Vp, K, N, L);
  }
  StoreState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  hwy::FlushStream();
}

// Columns [col0, col1) of the chunk's output (FLA's BV tiling of chunk_fwd_o).
void FlaOutputChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                    float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaPrepare(job, buf, c, hv, scratch, false);
  const size_t K = s.K, C = s.C, Vp = s.Vp, L = ch.L, gk = s.gk;
  const size_t slot = static_cast<size_t>(c * job.shape.HV + hv);
  const size_t c0 = static_cast<size_t>(col0), w = static_cast<size_t>(col1 - col0);
  const size_t N = col0 == 0 && col1 == job.shape.V ? Vp : RoundUp(w, hn::Lanes(DF()));  // as FlaReduceItem
  const float* q = scratch + s.q;
  const double* G = reinterpret_cast<const double*>(scratch + s.G);
  float* Qg = scratch + s.tmpA;
  float* O = scratch + s.tmpB;
  float* egam = scratch + s.graw;
  for (size_t i = 0; i < L; ++i) {
    ExpRow(G + i * gk, egam, gk);
    if (gk > 1)
      MulRows(q + i * K, egam, Qg + i * K, K);
    else
      ScaleTo(q + i * K, egam[0], Qg + i * K, K);
  }
  Gemm<Acc::kSet>(Qg, K, buf.h + slot * K * Vp + c0, Vp, O, Vp, L, N, K);
  Gemm<Acc::kAdd>(scratch + s.AP + C * C, C, buf.v_new + slot * C * Vp + c0, Vp, O, Vp, L, N, L, Tri::kLowerK);
  StoreOutputRows(job, ch.seq, hv, ch.t0, L, col0, col1, O, Vp);
  hwy::FlushStream();
}

// ---------------------------------------------------------------------------------------------
// The chunk-parallel path in the GEMM-first form: the tier-3 kernels (tail_map, tail_state,
// tail_output) of a GEMM-first plan, with the plan's operators in the plan's phases. Map (gate,
// kkt, qkt, kkt_gate, qkt_gate, solve_diag): the masked gated grams A and P of a (chunk, head)
// into main memory (A in buf.T, P in buf.P). State (ks, rhs, solve, update): per item's columns,
// chunk by chunk, X = diag(β)V − diag(β e^Γ) K S solved in place against (I + A) into v_new, the
// state snapshot h, then the update. Output (qs, pv, out): O = diag(e^Γ) Q h + P v_new.

void GfMapChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaChunk(job, buf, c);
  const size_t K = s.K, C = s.C, L = ch.L, gk = s.gk;
  float* q = scratch + s.q;
  float* k = scratch + s.k;
  double* G = reinterpret_cast<double*>(scratch + s.G);
  float* beta = scratch + s.beta;
  float* graw = scratch + s.graw;
  float* AP = scratch + s.AP;
  const ChunkRows rows{q, k, nullptr, s.Vp, G, beta, graw};
  LoadChunk(job, ch.seq, hv, ch.t0, L, 0, job.shape.V, rows);
  if (gk > 1) {
    KdaTokenFactors(G, L, K, scratch + s.eg);
    KdaGram(k, q, G, L, K, C, C, scratch + s.KQl, scratch + s.KrT, graw, scratch + s.eg, AP);
  } else {
    float* Kt = scratch + s.Kt;
    const size_t Lp = RoundUp(L, kPad);
    Transpose(k, L, K, Kt, C);
    Gemm<Acc::kSet>(k, K, Kt, C, AP, C, L, Lp, K, Tri::kLowerN);
    Gemm<Acc::kSet>(q, K, Kt, C, AP + C * C, C, L, Lp, K, Tri::kLowerN);
  }
  MaskGram(gk == 1, G, beta, L, C, C, AP, graw);
  const size_t slot = static_cast<size_t>(c * job.shape.HV + hv);
  std::memcpy(buf.T + slot * C * C, AP, C * C * sizeof(float));
  std::memcpy(buf.P + slot * C * C, AP + C * C, C * C * sizeof(float));
  std::memcpy(buf.gamma + slot * C * gk, G, L * gk * sizeof(double));
}

void GfStateItem(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const size_t K = s.K, C = s.C, Vp = s.Vp, gk = s.gk;
  const int64_t HV = job.shape.HV, hv = item.head;
  const SeqSpan seq = job.seqs[static_cast<size_t>(item.seq)];
  const size_t c0 = static_cast<size_t>(item.col0), w = static_cast<size_t>(item.col1 - item.col0);
  const size_t N = RoundUp(w, kPad);  // private rows of Vp floats: whole pads, as the fused path
  float* q = scratch + s.q;
  float* k = scratch + s.k;
  float* X = scratch + s.v;  // β v of the item's columns, then v_new
  double* G = reinterpret_cast<double*>(scratch + s.G);
  float* beta = scratch + s.beta;
  float* graw = scratch + s.graw;
  float* Kn = scratch + s.tmpA;  // KDA: −β e^Γ ⊙ k; GDN: the row factors −β e^Γ
  float* Kt = scratch + s.Kt;    // K x C: k_j e^{Γ_L−Γ_j}
  float* S = scratch + s.total;  // K x Vp (GfScratchFloats reserves it)
  LoadState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  ChunkRows rows{q, k, X, Vp, G, beta, graw, /*v_times_beta=*/true};
  int64_t c = buf.seq_first_chunk[item.seq];
  for (int64_t t0 = 0; t0 < seq.len; t0 += buf.chunk, ++c) {
    const size_t L = static_cast<size_t>(std::min<int64_t>(buf.chunk, seq.len - t0));
    const size_t slot = static_cast<size_t>(c * HV + hv);
    LoadChunk(job, seq, hv, t0, L, item.col0, item.col1, rows);
    for (size_t d = 0; d < K; ++d) std::memcpy(buf.h + slot * K * Vp + d * Vp + c0, S + d * Vp, w * sizeof(float));
    // ks, rhs: X = diag(β)V − diag(β e^Γ) K S.
    if (gk > 1) {
      for (size_t i = 0; i < L; ++i) {
        ExpRow(G + i * K, graw, K);
        MulRowsScaled(k + i * K, graw, -beta[i], Kn + i * K, K);
      }
      Gemm<Acc::kAdd>(Kn, K, S, Vp, X, Vp, L, N, K);
    } else {
      ExpRow(G, graw, L);
      for (size_t i = 0; i < L; ++i) Kn[i] = -beta[i] * graw[i];
      Gemm<Acc::kAddRowScaled>(k, K, S, Vp, X, Vp, L, N, K, Tri::kNone, nullptr, Kn);
    }
    // solve: (I + A) v_new = X, A from the Map phase.
    SolveUnitLower(buf.T + slot * C * C, C, X, Vp, L, N);
    for (size_t i = 0; i < L; ++i) std::memcpy(buf.v_new + slot * C * Vp + i * Vp + c0, X + i * Vp, w * sizeof(float));
    // update: S <- e^{Γ_L} S + Σ_j (e^{Γ_L−Γ_j} k_j)^T v_new_j.
    const double* GL = G + (L - 1) * gk;
    for (size_t j = 0; j < L; ++j)
      for (size_t d = 0; d < K; ++d)
        Kt[d * C + j] = k[j * K + d] * std::exp(static_cast<float>(GL[gk > 1 ? d : 0] - G[j * gk + (gk > 1 ? d : 0)]));
    for (size_t d = 0; d < K; ++d) Scale(S + d * Vp, std::exp(static_cast<float>(GL[gk > 1 ? d : 0])), N);
    Gemm<Acc::kAdd>(Kt, C, X, Vp, S, Vp, K, N, L);
  }
  StoreState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  hwy::FlushStream();
}

void GfOutputChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                   float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaChunk(job, buf, c);
  const size_t K = s.K, C = s.C, Vp = s.Vp, L = ch.L, gk = s.gk;
  const size_t slot = static_cast<size_t>(c * job.shape.HV + hv);
  const size_t c0 = static_cast<size_t>(col0), w = static_cast<size_t>(col1 - col0);
  const size_t N = col0 == 0 && col1 == job.shape.V ? Vp : RoundUp(w, hn::Lanes(DF()));  // as FlaOutputChunk
  float* q = scratch + s.q;
  double* G = reinterpret_cast<double*>(scratch + s.G);
  const ChunkRows rows{q, scratch + s.k, nullptr, Vp, G, scratch + s.beta, scratch + s.graw};
  LoadChunk(job, ch.seq, hv, ch.t0, L, 0, job.shape.V, rows);
  float* Qg = scratch + s.tmpA;
  float* O = scratch + s.tmpB;
  float* egam = scratch + s.graw;
  for (size_t i = 0; i < L; ++i) {
    ExpRow(G + i * gk, egam, gk);
    if (gk > 1)
      MulRows(q + i * K, egam, Qg + i * K, K);
    else
      ScaleTo(q + i * K, egam[0], Qg + i * K, K);
  }
  // qs, then pv and out with the Map phase's P.
  Gemm<Acc::kSet>(Qg, K, buf.h + slot * K * Vp + c0, Vp, O, Vp, L, N, K);
  Gemm<Acc::kAdd>(buf.P + slot * C * C, C, buf.v_new + slot * C * Vp + c0, Vp, O, Vp, L, N, L, Tri::kLowerK);
  StoreOutputRows(job, ch.seq, hv, ch.t0, L, col0, col1, O, Vp);
  hwy::FlushStream();
}

size_t FlaScratchFloats(const LaJob& job, int chunk) {
  const FlaScratch s = MakeFlaScratch(job, chunk);
  const size_t reduce = RoundUp(s.K * s.Vp, kPad) + RoundUp(s.K, kPad) + RoundUp(s.K * s.C, kPad) + s.C * s.Vp + kPad;
  const size_t gemm_first_state = s.total + RoundUp(s.K * s.Vp, kPad);  // GfStateItem's S after the chunk buffers
  return std::max({s.total, reduce, gemm_first_state});
}

// Times C += A B (M x Kd times Kd x N, operands resident in cache) on this thread: the GEMM
// core's own efficiency, for the benchmark's breakdown.
double GemmProbeGflops(size_t M, size_t N, size_t Kd, double seconds) {
  const size_t Np = RoundUp(N, kPad), ld = LeadingDim(N);
  std::vector<float> A(M * Kd, 0.5f), B(Kd * ld, 0.25f), C(M * ld, 0.f);
  size_t reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 16; ++i) Gemm<Acc::kAdd>(A.data(), Kd, B.data(), ld, C.data(), ld, M, Np, Kd);
    reps += 16;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  volatile float sink = C[0];
  (void)sink;
  return 2.0 * static_cast<double>(M * Np * Kd) * static_cast<double>(reps) / elapsed / 1e9;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
int FloatLanes() { return static_cast<int>(hn::Lanes(DF())); }
int GemmMaxRows() { return static_cast<int>(kMR); }
int GemmMaxVectors() { return static_cast<int>(kNV); }

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hanpu::cpu {
HWY_EXPORT(FusedGroup);
HWY_EXPORT(FusedArenaFloats);
HWY_EXPORT(RecurrentItem);
HWY_EXPORT(RecurrentArenaFloats);
HWY_EXPORT(FlaMapChunk);
HWY_EXPORT(FlaReduceItem);
HWY_EXPORT(FlaOutputChunk);
HWY_EXPORT(GfMapChunk);
HWY_EXPORT(GfStateItem);
HWY_EXPORT(GfOutputChunk);
HWY_EXPORT(FlaScratchFloats);
HWY_EXPORT(TargetName);
HWY_EXPORT(GemmProbeGflops);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(GemmMaxRows);
HWY_EXPORT(GemmMaxVectors);

size_t fused_arena_floats(const LaJob& job, int64_t width, int chunk, size_t group, const FusedProgram& order) {
  return HANPU_DISPATCH(FusedArenaFloats)(job, width, chunk, group, order);
}
void fused_group(const LaJob& job, const WorkItem* items, size_t count, float* arena, int chunk,
                 const FusedProgram& order) {
  HANPU_DISPATCH(FusedGroup)(job, items, count, arena, chunk, order);
}
size_t recurrent_arena_floats(const LaJob& job, int64_t width) {
  return HANPU_DISPATCH(RecurrentArenaFloats)(job, width);
}
void recurrent_item(const LaJob& job, const WorkItem& item, float* arena) {
  HANPU_DISPATCH(RecurrentItem)(job, item, arena);
}
size_t fla_scratch_floats(const LaJob& job, int chunk) { return HANPU_DISPATCH(FlaScratchFloats)(job, chunk); }
void fla_map_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  HANPU_DISPATCH(FlaMapChunk)(job, buf, c, hv, scratch);
}
void fla_reduce_item(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  HANPU_DISPATCH(FlaReduceItem)(job, buf, item, scratch);
}
void fla_output_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                      float* scratch) {
  HANPU_DISPATCH(FlaOutputChunk)(job, buf, c, hv, col0, col1, scratch);
}
void gf_map_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  HANPU_DISPATCH(GfMapChunk)(job, buf, c, hv, scratch);
}
void gf_state_item(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  HANPU_DISPATCH(GfStateItem)(job, buf, item, scratch);
}
void gf_output_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                     float* scratch) {
  HANPU_DISPATCH(GfOutputChunk)(job, buf, c, hv, col0, col1, scratch);
}
const char* simd_target_name() { return HANPU_DISPATCH(TargetName)(); }
double gemm_probe_gflops(size_t M, size_t N, size_t Kd, double seconds) {
  return HANPU_DISPATCH(GemmProbeGflops)(M, N, Kd, seconds);
}
int simd_float_lanes() { return HANPU_DISPATCH(FloatLanes)(); }
int gemm_max_rows() { return HANPU_DISPATCH(GemmMaxRows)(); }
int gemm_max_vectors() { return HANPU_DISPATCH(GemmMaxVectors)(); }

DenormalGuard::DenormalGuard() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  saved_ = csr;
  csr |= 0x8040u;  // FTZ (bit 15) and DAZ (bit 6)
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#endif
}
DenormalGuard::~DenormalGuard() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr = saved_;
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#endif
}

}  // namespace hanpu::cpu
#endif
