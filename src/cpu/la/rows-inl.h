// Row and vector work: row loads and stores with dtype conversion, small vector helpers
// (Dot, Scale, Exp*, Mul*), the in-kernel gate activation, chunk loading (LoadChunk), the
// state's loads and stores, the output rows, and the transposes.
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_ROWS_INL_H_
#undef HANPU_CPU_LA_ROWS_INL_H_
#else
#define HANPU_CPU_LA_ROWS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include <hwy/highway.h>
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>

#include "cpu/kernels.hpp"
#include "cpu/la/base-inl.h"
#include "la/gates.hpp"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

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
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // Whole aligned lines: streaming stores, as for f32 (the same rounding, two vectors packed into
    // one line). Without them every o line is first read for ownership: that was 12% of a bf16 GDN
    // chunk once its GEMMs ran on AMX.
    if (n % 32 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0) {
      const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
      const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
      auto round16 = [&](const float* p) {
        const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(p));
        return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
      };
      for (; i < n; i += 32)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i),
                            _mm512_permutexvar_epi64(order, _mm512_packus_epi32(round16(src + i), round16(src + i + 16))));
      return;
    }
#endif
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
  // The engine's GEMMs on AMX (LaJob::amx_terms) read q and k only as the raw rows: the f32 rows
  // are not formed (with qk_l2norm only the inverse norms are, from the same f32 values). K <= 256.
  bool raw_only = false;
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
  const bool channel = job.traits().channel_gate();
  const size_t n = channel ? static_cast<size_t>(job.shape.K) : 1;
  if (channel)
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
    const int64_t off = in.dt_bias.rank == 2 ? hv * in.dt_bias.stride[0] : (channel ? hv * job.shape.K : hv) * in.dt_bias.stride[0];
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
  const bool channel = job.traits().channel_gate();
  const size_t width = static_cast<size_t>(col1 - col0);
  const size_t gk = channel ? K : 1;
  double running[256];  // KDA with kda_factors: the cumulative gates of the current row (K <= 256)
  for (size_t i = 0; i < L; ++i) {
    const int64_t t = seq.bos + t0 + static_cast<int64_t>(i);
    float* q = r.q + i * K;
    float* k = r.k + i * K;
    const float beta_t = gates::beta_transform(
        LoadScalar(in.beta, offset3(in.beta, b, t, hv)),
        job.opt.beta_sigmoid, job.opt.allow_neg_eigval);
    r.beta[i] = beta_t;
    // q and k as stored (contiguous bf16, checked by bf16_grams_possible), zero-padded to ldraw.
    auto copy_raw_rows = [&] {
      const auto* qs = static_cast<const uint16_t*>(in.q.data) + offset4(in.q, b, t, h, 0);
      const auto* ks = static_cast<const uint16_t*>(in.k.data) + offset4(in.k, b, t, h, 0);
      std::copy(qs, qs + K, r.qraw + i * r.ldraw);
      std::copy(ks, ks + K, r.kraw + i * r.ldraw);
      std::fill(r.qraw + i * r.ldraw + K, r.qraw + (i + 1) * r.ldraw, uint16_t{0});
      std::fill(r.kraw + i * r.ldraw + K, r.kraw + (i + 1) * r.ldraw, uint16_t{0});
    };
    if (!r.skip_qk && r.raw_only) {
      copy_raw_rows();
      if (job.opt.qk_l2norm) {  // L2Normalize's factor, of the same f32 values
        HWY_ALIGN float x[256];
        LoadRow(in.q, offset4(in.q, b, t, h, 0), 1, K, x);
        r.qinv[i] = 1.0f / std::sqrt(Dot(x, x, K) + static_cast<float>(gates::kL2NormEps));
        LoadRow(in.k, offset4(in.k, b, t, h, 0), 1, K, x);
        r.kinv[i] = 1.0f / std::sqrt(Dot(x, x, K) + static_cast<float>(gates::kL2NormEps));
      }
    } else if (!r.skip_qk) {
      // q is scaled as it is loaded unless it is normalised first.
      LoadRow(in.q, offset4(in.q, b, t, h, 0), in.q.stride[3], K, q, job.opt.qk_l2norm ? 1.f : job.scale);
      LoadRow(in.k, offset4(in.k, b, t, h, 0), in.k.stride[3], K, k);
      if (job.opt.qk_l2norm) {
        const float qi = L2Normalize(q, K), ki = L2Normalize(k, K);
        Scale(q, job.scale, K);
        if (r.qinv) r.qinv[i] = qi;
        if (r.kinv) r.kinv[i] = ki;
      }
      if (r.kraw) copy_raw_rows();
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
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// dst[c * ldd + r] = src[r * lds + c] for r, c < 8: 24 in-register shuffles. AVX2's gather issues
// one load per lane (8 per output vector) and was the transposes' whole cost on the AVX2 target.
HWY_INLINE void Transpose8x8(const float* HWY_RESTRICT src, size_t lds, float* HWY_RESTRICT dst, size_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  // Pairs of rows interleaved per 128-bit half.
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  // Quads: r[4g + c] holds, in half h, rows 4g..4g+3 of column 4h + c.
  for (int g = 0; g < 2; ++g) {
    r[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    r[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  // Column c (low half) and 4 + c (high half): rows 0-3 from r[c], rows 4-7 from r[4 + c].
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps(dst + (4 + c) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
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
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  blocked_rows = K / 8 * 8;
  blocked_cols = L / 8 * 8;
  for (size_t k0 = 0; k0 < blocked_rows; k0 += 8)
    for (size_t j0 = 0; j0 < blocked_cols; j0 += 8) Transpose8x8(src + j0 * K + k0, K, dst + k0 * ldt + j0, ldt);
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

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_ROWS_INL_H_
