// GGUF prefill on AMX-BF16 (issue 34: "dequantizing tiles to bf16/f32 for the FMA or AMX-BF16
// kernels"): see linear_gguf.hpp (gguf_prefill_amx) for what it computes and docs/GGUF.md
// ("AMX-BF16 prefill") for the measurements that choose it.
//
// The work of one call:
//   1. the M activation rows are split into `terms` bf16 parts and packed into AMX tiles once
//      (amx_pack_rows, the threads taking strips of 32 rows), into the calling thread's workspace,
//      read by every thread;
//   2. each thread takes column blocks of kColumnBlock weight rows; per block it dequantizes 16
//      rows at a time to f32 exactly (gguf::dequantize, after gguf_unpack_row_lanes for the
//      row-lane layout), rounds them to bf16 (VCVTNE2PS2BF16, to nearest even) and writes them
//      in amx_pack_weight's tile order into its scratch (a 16 x 16 transpose of bf16 pairs in
//      registers), then runs amx_gemm (linear_amx.cpp) over the block for all M rows, in passes
//      of kRowPass rows.
// Never a bf16 copy of the model: one block of kColumnBlock x K bf16 per thread (512 KiB at
// K = 1024 and 128 rows), rebuilt on every call. The dequantization is paid once per weight and
// call, the GEMM 2 M flops per weight: at M = 512 the first is a few percent of the second.
//
// Accuracy: the weights' only new error is the bf16 rounding, |w - bf16(w)| <= 2^-9 |w|, below
// the format's own quantization error (Q8_0: half a step, 2^-8 of a block's largest weight;
// Q4_K: half a step of a sub-block's range / 15, about 2^-5 of it); the activations are exact
// with 3 terms, within 2^-16 relative with 2, 2^-9 with 1 (the default, kGgufAmxTerms: finer than
// the integer path's int8 activations, half a step of max|x| / 127 per block, 2^-8 of the block's
// largest). Products are exact in f32 and accumulate with one rounding each (TDPBF16PS).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/engine_impl.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/linear_kernels.hpp"
#include "cpu/x86_features.hpp"
#include "hanpu/gguf_format.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu::cpu {

namespace {

// Weight rows per column block: a multiple of kAmxN. 128 x K bf16 = 256 KiB at K = 1024, 896 KiB
// at K = 3584, in the 2 MiB L2 while a pass of activation rows meets it.
constexpr int64_t kColumnBlock = 128;
// Activation rows per amx_gemm call (a multiple of kAmxRows): its C block, kRowPass x
// kColumnBlock f32 (64 KiB), stays in L2 across the k blocks.
constexpr int64_t kRowPass = 128;

int parse_terms_env() {
  const char* v = std::getenv("HANPU_GGUF_AMX_TERMS");
  if (v == nullptr || *v == '\0') return kGgufAmxTerms;
  const std::string s(v);
  if (s == "1" || s == "2" || s == "3") return s[0] - '0';
  throw Error("HANPU_GGUF_AMX_TERMS: got '" + s + "', expected 1, 2 or 3 (bf16 terms per activation)");
}

}  // namespace

int gguf_amx_terms() { return parse_terms_env(); }

bool gguf_amx_prefill_available(gguf::GgmlType t) {
  const gguf::BlockFormat& bf = gguf::block_format(t);
  return bf.dequantize && bf.block_elems % kAmxK == 0 && amx_usable();
}

bool gguf_amx_prefill_default(gguf::GgmlType t, int64_t M) {
  // Measured on a Xeon with AMX (KVM, 2 threads, benchmarks/gguf_prefill and bench-model,
  // docs/GGUF.md "AMX-BF16 prefill"): from 32 rows faster than the integer path for every type
  // measured (Q4_K, Q6_K, Q8_0; the whole Q4_K_M / Q8_0 models 2.5-4.7x per CPU second).
  return M >= kGgufAmxMinRows && gguf_amx_prefill_available(t);
}

bool gguf_use_amx_prefill(gguf::GgmlType t, GgufPrefill p, int64_t M) {
  if (!gguf_amx_prefill_available(t)) return false;
  if (p == GgufPrefill::kAuto) p = gguf_prefill_override();
  switch (p) {
    case GgufPrefill::kAmxBf16: return true;
    case GgufPrefill::kIntegerDot:
    case GgufPrefill::kF32Tiles: return false;
    case GgufPrefill::kAuto: break;
  }
  return gguf_amx_prefill_default(t, M);
}

#if HANPU_X86_KERNELS

#define HANPU_GGUF_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {

// The all-lanes shuffles through their zero-masked forms: GCC 12's unmasked ones pass
// _mm512_undefined_epi32() as the merge source and warn (-Wmaybe-uninitialized); the code is the same.
HANPU_GGUF_AMX_TARGET inline __m512i unpacklo32(__m512i a, __m512i b) { return _mm512_maskz_unpacklo_epi32(0xFFFF, a, b); }
HANPU_GGUF_AMX_TARGET inline __m512i unpackhi32(__m512i a, __m512i b) { return _mm512_maskz_unpackhi_epi32(0xFFFF, a, b); }
HANPU_GGUF_AMX_TARGET inline __m512i unpacklo64(__m512i a, __m512i b) { return _mm512_maskz_unpacklo_epi64(0xFF, a, b); }
HANPU_GGUF_AMX_TARGET inline __m512i unpackhi64(__m512i a, __m512i b) { return _mm512_maskz_unpackhi_epi64(0xFF, a, b); }
template <int kImm>
HANPU_GGUF_AMX_TARGET inline __m512i lanes128(__m512i a, __m512i b) { return _mm512_maskz_shuffle_i32x4(0xFFFF, a, b, kImm); }

// 16 rows of f32 weights (row c at f + c * K, K a multiple of 32) rounded to bf16 and written as
// the 16-column tiles of amx_pack_weight: tile (nb, ks) row r holds, per column c, the pair
// (w[c][32 ks + 2r], w[c][32 ks + 2r + 1]), low half first. Per k step: 16 conversions of 32
// floats (one vector of 16 pairs per row), then a 16 x 16 transpose of the 32-bit pairs.
HANPU_GGUF_AMX_TARGET void pack_group(const float* f, int64_t K, uint16_t* out, int64_t nb, int64_t NB) {
  const int64_t KS = K / kAmxK;
  for (int64_t ks = 0; ks < KS; ++ks) {
    __m512i r[16];
    for (int c = 0; c < 16; ++c) {
      const float* src = f + c * K + ks * kAmxK;
      r[c] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
    }
    // Stage 1: dwords of row pairs; stage 2: quadwords of row quads. Then 128-bit lane q of
    // u[4 g + j] holds pair 4 q + j of rows 4 g .. 4 g + 3.
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = unpacklo32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = unpackhi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; ++g) {
      u[4 * g + 0] = unpacklo64(t[4 * g], t[4 * g + 2]);
      u[4 * g + 1] = unpackhi64(t[4 * g], t[4 * g + 2]);
      u[4 * g + 2] = unpacklo64(t[4 * g + 1], t[4 * g + 3]);
      u[4 * g + 3] = unpackhi64(t[4 * g + 1], t[4 * g + 3]);
    }
    uint16_t* tile = out + amx_weight_tile(nb, ks, NB, KS);
    for (int j = 0; j < 4; ++j) {
      const __m512i x0 = lanes128<0x88>(u[j], u[4 + j]), x1 = lanes128<0xDD>(u[j], u[4 + j]);
      const __m512i y0 = lanes128<0x88>(u[8 + j], u[12 + j]),
                    y1 = lanes128<0xDD>(u[8 + j], u[12 + j]);
      _mm512_storeu_si512(tile + (0 + j) * 32, lanes128<0x88>(x0, y0));
      _mm512_storeu_si512(tile + (4 + j) * 32, lanes128<0x88>(x1, y1));
      _mm512_storeu_si512(tile + (8 + j) * 32, lanes128<0xDD>(x0, y0));
      _mm512_storeu_si512(tile + (12 + j) * 32, lanes128<0xDD>(x1, y1));
    }
  }
}

}  // namespace

void gguf_pack_weight_bf16(gguf::GgmlType type, const void* w, int64_t N, int64_t K, int64_t n0, int64_t n1,
                           bool w_row_lanes, uint16_t* out, float* f32_rows, std::vector<uint8_t>& file_rows) {
  const gguf::BlockFormat& bf = gguf::block_format(type);
  const int64_t row_bytes = K / bf.block_elems * bf.block_bytes;
  const int64_t nw = n1 - n0, NB = amx_n_padded(nw) / 16;
  const uint8_t* rows = static_cast<const uint8_t*>(w) + n0 * row_bytes;
  if (w_row_lanes) {  // the block's rows back in the file's layout first
    file_rows.resize(static_cast<size_t>(nw * row_bytes));
    gguf_unpack_row_lanes(type, w, N, K, n0, n1, file_rows.data());
    rows = file_rows.data();
  }
  for (int64_t nb = 0; nb < NB; ++nb) {
    const int64_t r0 = nb * 16, rn = std::clamp<int64_t>(nw - r0, 0, 16);
    if (rn > 0) gguf::dequantize(type, rows + r0 * row_bytes, f32_rows, rn * K);
    if (rn < 16) std::memset(f32_rows + rn * K, 0, static_cast<size_t>((16 - rn) * K) * sizeof(float));
    pack_group(f32_rows, K, out, nb, NB);
  }
}

void gguf_prefill_amx(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K, const float* x,
                      int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate, bool w_row_lanes,
                      int terms) {
  if (!gguf_amx_prefill_available(type))
    throw Error(std::string("gguf_prefill_amx: no AMX-BF16 prefill for ") + gguf::block_format(type).name + " here");
  if (K <= 0 || K % gguf::block_format(type).block_elems != 0)
    throw Error("gguf_prefill_amx: K = " + std::to_string(K) + " is not whole blocks");
  if (terms < 1 || terms > 3) throw Error("gguf_prefill_amx: terms " + std::to_string(terms) + ", expected 1, 2 or 3");
  if (M <= 0 || N <= 0) return;
  const int nt = std::max(1, threads > 0 ? threads : engine.threads());
  const int64_t strips = (M + kAmxRows - 1) / kAmxRows, KS = amx_k_steps(K);
  // 1. The activations, packed once into the caller's workspace (held for the call).
  Engine::Impl::Lease caller(engine.impl(), 1);
  uint16_t* ap = caller[0].get<uint16_t>(kLinearRows, static_cast<size_t>(amx_packed_rows_elems(strips * kAmxRows, K, terms)));
  const int pack_parts = static_cast<int>(std::min<int64_t>(nt, strips));
  engine.impl().run(pack_parts, [&](int p, Workspace&) {
    const int64_t s0 = strips * p / pack_parts, s1 = strips * (p + 1) / pack_parts;
    const int64_t m0 = s0 * kAmxRows, rows = std::min(M, s1 * kAmxRows) - m0;
    amx_pack_rows(x + m0 * ldx, ldx, rows, (s1 - s0) * kAmxRows, K, terms, ap + (m0 / 16) * KS * terms * 512);
  });
  // 2. Column blocks of weight rows over the threads: blocks narrower than kColumnBlock (down to
  // kAmxN) where there are fewer blocks than threads.
  int64_t nc = kColumnBlock;
  while (nc > kAmxN && (N + nc - 1) / nc < nt) nc /= 2;
  const int64_t blocks = (N + nc - 1) / nc;
  const int parts = static_cast<int>(std::min<int64_t>(nt, blocks));
  const int64_t pass_strips = kRowPass / kAmxRows;
  engine.impl().run(parts, [&](int p, Workspace& ws) {
    uint16_t* wp = ws.get<uint16_t>(kLinearPanel, static_cast<size_t>(amx_packed_weight_elems(nc, K)));
    float* f32_rows = ws.get<float>(kLinearRows, static_cast<size_t>(16 * K));
    float* cbuf = ws.get<float>(kLinearC, static_cast<size_t>(amx_cbuf_floats(pass_strips)));
    thread_local std::vector<uint8_t> file_rows;
    for (int64_t b = blocks * p / parts; b < blocks * (p + 1) / parts; ++b) {
      const int64_t n0 = b * nc, n1 = std::min(N, n0 + nc);
      gguf_pack_weight_bf16(type, w, N, K, n0, n1, w_row_lanes, wp, f32_rows, file_rows);
      for (int64_t s0 = 0; s0 < strips; s0 += pass_strips)
        amx_gemm(ap, s0, std::min(strips, s0 + pass_strips), M, terms, wp, K, n1 - n0, 0, n1 - n0, y + n0, ldy,
                 accumulate, cbuf);
    }
  });
}

#else  // no AMX code here: gguf_amx_prefill_available is false.

void gguf_pack_weight_bf16(gguf::GgmlType, const void*, int64_t, int64_t, int64_t, int64_t, bool, uint16_t*, float*,
                           std::vector<uint8_t>&) {
  throw Error("gguf_pack_weight_bf16: no AMX code in this build");
}

void gguf_prefill_amx(Engine&, gguf::GgmlType, const void*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                      int64_t, int, bool, bool, int) {
  throw Error("gguf_prefill_amx: no AMX code in this build");
}

#endif

}  // namespace hanpu::cpu
