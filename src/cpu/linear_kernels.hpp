// Internal kernels behind hanpu::Bf16Linear (include/hanpu/linear.hpp). Two families:
//
//   portable (linear_portable.cpp): Highway, any CPU. The weight stays in the checkpoint layout
//     [N, K]; each output is a dot product of an x row with a weight row, bf16 widened to f32 in
//     registers, f32 FMA.
//   AMX (linear_amx.cpp): Intel AMX tiles (TDPBF16PS) for GEMMs and AVX512-BF16 (VDPBF16PS) for
//     GEMVs, both on a weight repacked once into 16x32 tiles of bf16 pairs. f32 activations are
//     split into `terms` bf16 parts (1, 2 or 3; three reproduce f32 exactly), so the bf16
//     instructions compute exactly the f32-activation products.
//
// All functions compute y[m, n] (+)= sum_k x[m, k] * w[n, k] for the given row and column ranges.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace hanpu {
class Workspace;  // hanpu/engine_work.hpp (cpu/workspace.hpp)
}  // namespace hanpu

namespace hanpu::cpu {

using hanpu::Workspace;

// ---- portable -----------------------------------------------------------------------------
/// From this many rows on linear_portable(_int8) use their GEMM form (a widened panel amortised
/// over the rows); below, dot products in weight-row order (decode).
constexpr int64_t kPortableGemmMinRows = 16;
/// The GEMM form (M >= kPortableGemmMinRows; fewer rows take linear_portable_rows): rows [0, M)
/// of x (row stride ldx) times weight rows [n0, n1) of w ([N, K] row-major bf16). ws: the calling
/// part's workspace (cpu/workspace.hpp), where the GEMM form widens its panel.
void linear_portable(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int64_t M, int64_t n0, int64_t n1, bool accumulate, Workspace* ws);

/// The decode form (M < kPortableGemmMinRows): rows [0, M) of x times weight rows [n0, n1), with
/// x also given split by split_pairs_rows into xs (row stride split_pairs_stride(K)).
void linear_portable_rows(const uint16_t* w, int64_t K, const float* xs, const float* x, int64_t ldx, float* y,
                          int64_t ldy, int64_t M, int64_t n0, int64_t n1, bool accumulate);
/// Bytes ahead of its weight stream that the decode form prefetches (linear_portable.cpp has the
/// measurements): 1024 on AMD CPUs, 3072 on other x86 CPUs, 1024 elsewhere; the environment
/// variable HANPU_DECODE_PREFETCH_BYTES (0 to 65536, a multiple of 64; 0: none) overrides it for
/// measurements on other machines. Read once; a bad value throws hanpu::Error naming it.
int64_t decode_prefetch_bytes();
/// Whether the GGUF decode GEMVs' AVX2 forms (file rows and Q4_K row lanes) prefetch into L2
/// (prefetcht1) rather than L1 (prefetcht0): HANPU_DECODE_PREFETCH_L2=1 / 0, default 1 on Intel
/// (on the AVX-512 Xeon +5% decode for the 0.8B Q4_K_M from the row lanes and +5% for the Q8_0
/// file, Q6_K unchanged; docs/GGUF.md), 0 elsewhere (not measured there).
bool decode_prefetch_l2();
/// Elements per block of the split activation layout: each block of kPairBlock consecutive
/// elements is stored as its kPairBlock / 2 even-indexed elements, then its odd-indexed ones, so
/// that a vector of bf16 weight pairs meets its activations without a shuffle (the decode form in
/// linear_portable.cpp). 32 = two AVX-512 f32 vectors: every target's pair vector (2 x lanes,
/// at most 32 elements) falls inside one block.
constexpr int64_t kPairBlock = 32;
/// Row stride of the split rows: the whole blocks of K (the tail past them is read from x itself).
inline int64_t split_pairs_stride(int64_t K) { return K / kPairBlock * kPairBlock; }
/// xs[m, :] = the whole blocks of x[m, :] in the split layout, for m in [0, M).
void split_pairs_rows(const float* x, int64_t ldx, int64_t M, int64_t K, float* xs);

/// The same for int8 weights q [N, K] with scales [N, ceil(K / group)] (f32): weight (n, k) is
/// q[n, k] * scales[n, k / group], formed in f32.
void linear_portable_int8(const int8_t* q, const float* scales, int64_t K, int64_t group, const float* x, int64_t ldx,
                          float* y, int64_t ldy, int64_t M, int64_t n0, int64_t n1, bool accumulate, Workspace* ws);

/// The same for float weights kept as stored (F16Linear, F32Linear): w [N, K] f16 bits or f32,
/// rows in address order for M < kPortableGemmMinRows (ws may be null then), the widened-panel
/// GEMM from there on. Every product is exact (f16 widens to f32 exactly).
void linear_portable_f16(const uint16_t* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                         int64_t n0, int64_t n1, bool accumulate, Workspace* ws);
void linear_portable_f32(const float* w, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                         int64_t n0, int64_t n1, bool accumulate, Workspace* ws);

// ---- AMX ------------------------------------------------------------------------------------
/// Tile geometry: a weight tile holds 16 output columns x 32 k (16 rows of k pairs); an
/// activation tile 16 rows x 32 k. K is padded with zeros to kAmxK, N to kAmxN (the GEMM's
/// register block is two column tiles wide).
constexpr int64_t kAmxK = 32;
constexpr int64_t kAmxN = 32;
constexpr int64_t kAmxRows = 32;  // rows per GEMM strip (two 16-row tiles)
/// k steps (of kAmxK) per k block of the packed weight: the GEMM's k block (linear_amx.cpp).
constexpr int64_t kAmxKBlock = 4;

/// CPUID (AMX-TILE, AMX-BF16, AVX512F/BW/VL, AVX512-BF16), XCR0 and the Linux tile-data
/// permission (arch_prctl(ARCH_REQ_XCOMP_PERM)). Computed once.
bool amx_usable();
/// Loads the tile configuration every AMX kernel here uses (palette 1, all 8 tiles 16 rows x 64
/// bytes) on the calling thread / releases the tile state (the OS then need not save 8 KiB of
/// tile data on context switches). Only after amx_usable().
void amx_configure_tiles();
void amx_release_tiles();

inline int64_t amx_k_steps(int64_t K) { return (K + kAmxK - 1) / kAmxK; }
inline int64_t amx_n_padded(int64_t N) { return (N + kAmxN - 1) / kAmxN * kAmxN; }
/// Number of uint16_t in the repacked weight.
inline int64_t amx_packed_weight_elems(int64_t N, int64_t K) { return amx_n_padded(N) * amx_k_steps(K) * kAmxK; }
/// Offset (uint16_t) of weight tile (nb, ks) in the packed weight of NB = N_padded / 16 column
/// blocks: k-block major, so one k block of consecutive column blocks is one contiguous run (the
/// GEMM reads it panel after panel, the GEMV streams the whole weight in order).
inline int64_t amx_weight_tile(int64_t nb, int64_t ks, int64_t NB, int64_t KS) {
  const int64_t kb0 = ks / kAmxKBlock * kAmxKBlock, kcs = std::min(kAmxKBlock, KS - kb0);
  return (kb0 * NB + nb * kcs + (ks - kb0)) * 512;
}
/// Repacks w [N, K] into `out` (amx_packed_weight_elems, zero padding included): tile (nb, ks),
/// row r, column c holds the pair w[nb*16+c][ks*32+2r .. +1].
void amx_pack_weight(const uint16_t* w, int64_t N, int64_t K, uint16_t* out);

/// Activation rows for the GEMM: rows [0, rows) of x go to `out` as tiles ((mb * KS + ks) * terms
/// + t) * 512 (16 rows x 32 bf16); rows up to rows_padded (a multiple of kAmxRows) are zero.
inline int64_t amx_packed_rows_elems(int64_t rows_padded, int64_t K, int terms) {
  return rows_padded * amx_k_steps(K) * kAmxK * terms;
}
void amx_pack_rows(const float* x, int64_t ldx, int64_t rows, int64_t rows_padded, int64_t K, int terms, uint16_t* out);

/// GEMM on packed activations (strips [strip0, strip1) of kAmxRows rows; `rows` of them valid)
/// and the packed weight, columns [n0, n1) (n0 a multiple of kAmxN; n1 <= N) into y. cbuf: at
/// least amx_cbuf_floats() floats of per-thread scratch, 64-byte aligned.
void amx_gemm(const uint16_t* a_packed, int64_t strip0, int64_t strip1, int64_t rows, int terms,
              const uint16_t* w_packed, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y, int64_t ldy,
              bool accumulate, float* cbuf);
/// Scratch the GEMM needs for `strips` strips.
int64_t amx_cbuf_floats(int64_t strips);

/// GEMV form for a few rows: xs holds, per row m and term t, K padded to kAmxK bf16 values at
/// (m * terms + t) * Kp (Kp = amx_k_steps(K) * kAmxK). Columns [n0, n1), n0 a multiple of 16.
/// amx_pack_gemv_rows needs only AVX512-BF16 (no AMX): the bf16dot kernels below use it too.
void amx_pack_gemv_rows(const float* x, int64_t ldx, int64_t rows, int64_t K, int terms, uint16_t* out);
void amx_gemv(const uint16_t* xs, int64_t rows, int terms, const uint16_t* w_packed, int64_t K, int64_t N,
              int64_t n0, int64_t n1, float* y, int64_t ldy, bool accumulate);

// ---- AVX512-BF16 on the checkpoint layout (linear_bf16dot.cpp) -------------------------------
/// CPUID (AVX512F/DQ/BW/VL, AVX512-BF16) and XCR0, and HANPU_ISA "native". Computed once.
bool avx512bf16_usable();
/// Multiply-adds per second of VDPBF16PS over those of VFMADD231PS on one core, measured once per
/// process in registers (a few ms); 0 where the instruction is missing. Zen 4 and Zen 5 issue
/// both at one rate (2.0); a Xeon model 207 (Emerald Rapids) measured 0.99-1.26.
double bf16dot_mac_ratio();
/// The auto backend takes the AVX512-BF16 kernels only from this ratio on. The whole bf16-mode
/// projection costs more than its dot products (rounding the activations to bf16, transposing the
/// weight panel into k pairs), measured on a Xeon model 207 (Emerald Rapids under KVM, AMX not
/// exposed), Qwen3.5-0.8B projections at M = 512, 2 threads: the VDPBF16PS kernels at 0.55x the f32
/// FMA kernel's GFLOP/s; on Zen 4 (ratio 2) at 1.8-2x. Anything short of a clear gain keeps the
/// exact f32 kernel, which is never less accurate.
constexpr double kBf16DotMinMacRatio = 1.5;
/// avx512bf16_usable() and bf16dot_mac_ratio() >= kBf16DotMinMacRatio: the auto backend's test.
bool bf16dot_pays();
/// From this many rows on Bf16Linear runs bf16dot_linear in its GEMM form (a k-pair panel transposed once per
/// call and reused by every row); below, dot products on the weight rows as they are. The panel
/// costs about as much as 16 rows of dot products over it.
constexpr int64_t kBf16DotGemmMinRows = 16;
/// uint32_t words of per-thread panel scratch the GEMM form needs for in_features K.
int64_t bf16dot_panel_words(int64_t K);
/// y[m, n] (+)= sum_k x[m, k] w[n, k] for rows [0, M) and columns [n0, n1) of w ([N, K] bf16,
/// row-major, the checkpoint layout), the activations rounded to bf16 as amx_pack_gemv_rows
/// writes them with one term (row m at m * Kp, K padded to kAmxK with zeros). With a panel (bf16dot_panel_words(K) words of
/// scratch) the GEMM form runs, without (nullptr) the dot form. The caller chooses from the whole
/// call's row count (kBf16DotGemmMinRows), never from a thread's or pass's share: the two forms
/// sum in different orders, and the result must not depend on the thread count.
void bf16dot_linear(const uint16_t* w, int64_t K, const uint16_t* xs, int64_t M, float* y, int64_t ldy, int64_t n0,
                    int64_t n1, bool accumulate, uint32_t* panel);

/// Symmetric int8 of one group of n values, the rule of Int8Linear's weights and of kInt8's
/// activations: scale = max|x| / 127, q = round(x / scale) to nearest in [-127, 127], scale 0 and
/// q = 0 for an all-zero group. A non-finite value gives scale NaN and q = 0, so a product with
/// the group is NaN, as it is with f32 activations (weights are checked before, with an error).
inline float quantize_int8_group(const float* x, int64_t n, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int64_t k = 0; k < n; ++k) {
    finite = finite && std::isfinite(x[k]);
    amax = std::max(amax, std::fabs(x[k]));
  }
  if (!finite) {
    std::fill(q, q + n, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float scale = amax / 127.0f;
  for (int64_t k = 0; k < n; ++k)
    q[k] = static_cast<int8_t>(std::clamp(scale > 0 ? std::nearbyint(x[k] / scale) : 0.f, -127.f, 127.f));
  return scale;
}

// ---- int8 x int8 decode (linear_int8_dot.cpp, LinearPrecision::kInt8) --------------------------
/// An int8 dot-product kernel runs here: AVX512-VNNI (with AVX512-BW, OS ZMM state) under HANPU_ISA
/// native, or AVX2 + FMA when HANPU_ISA allows AVX2 or better.
bool int8_dot_usable();
/// Row stride (bytes) of quantized activations: K rounded up to 64 plus one more 64-byte step,
/// zero-filled, so the kernel's unmasked 64-byte activation loads stay inside the row.
inline int64_t int8_dot_row_stride(int64_t K) { return (K + 63) / 64 * 64 + 64; }
/// Quantizes rows [0, M) of x to int8 per group of G inputs (quantize_int8_group: a group with a
/// non-finite input gets scale NaN, so its outputs are NaN as with f32 activations): xq [M][int8_dot_row_stride(K)], xs [M][ceil(K / G)].
void int8_dot_quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t G, int8_t* xq, float* xs);
/// y[m, n] (+)= sum over groups g of w_scale[n, g] * x_scale[m, g] * sum_k q[n, k] xq[m, k], for
/// columns [n0, n1), in weight-row order; integer products are exact, the result does not depend
/// on M or on how columns are split.
void int8_dot_gemv(const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq, const float* xs,
                    int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1, bool accumulate);

}  // namespace hanpu::cpu
