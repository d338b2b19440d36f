// Decode GEMV over GGUF block formats: y = W x with W [N, K] stored as rows of GGML blocks
// (Q8_0, Q4_K, Q5_K, Q6_K), read once in address order, never dequantized to memory.
//
// As llama.cpp does for these formats (ggml-cpu's ggml_vec_dot_q8_0_q8_0 / _q4_K_q8_K), the
// activations are quantized to int8 first with an f32 scale per block (Q8_0's rule: s = max|x| / 127,
// q = round(x / s)): per 32 for Q8_0 weights (llama.cpp's Q8_0 activations, the scale kept in f32
// rather than f16), per 256 for Q4_K, Q5_K and Q6_K (llama.cpp's Q8_K), so that each block's dot product runs in
// integers (exact), then one f32 multiply-add per weight block by the product of the scales. For
// Q4_K / Q5_K the min term, dmin * m_j * sum(x over sub-block j), uses the f32 sum of the unquantized x. tests/test_linear_gguf.cpp bounds both errors (the activation rounding and the f32
// accumulation) against fp64 of the dequantized weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "hanpu/linear.hpp"  // GgufPrefill

namespace hanpu {
class Engine;
}

namespace hanpu::cpu {

/// x quantized for the GGUF kernels: int8 values (stored widened to int16, the form the kernels
/// multiply) with an f32 scale per `block` elements, and the f32 sum of the original values per 32.
struct GgufActivations {
  int64_t K = 0;
  int64_t block = 32;
  std::vector<int16_t> q;     // K
  std::vector<int8_t> q8;     // the same values as int8 (the AVX2 K-quant form multiplies bytes)
  std::vector<int16_t> bsum16;  // K / 16: sums of q8 per 16 (the AVX2 Q6_K form's -32 term)
  std::vector<int16_t> bsum32;  // K / 32: sums of q8 per 32 (the Q4_K / Q5_K min term, llama.cpp's Q8_K bsums in pairs)
  std::vector<float> scale;   // K / block
  std::vector<float> sum;     // K / 32
};

/// The activation block the kernel for `t` takes: 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or 256 (the
/// K-quants, IQ4_XS).
int64_t gguf_activation_block(gguf::GgmlType t);
/// Quantizes x[0, K) in blocks of `block` (32 or 256; K a multiple of it). Throws hanpu::Error otherwise.
void gguf_quantize_activations(const float* x, int64_t K, int64_t block, GgufActivations& out);
/// The same quantizer for one row into caller-owned arrays: q8[K], scale[K / block], sum[K / 32]
/// (f32 sums of x), bsum16[K / 16] (sums of q8). block 32 or 256, K a multiple of it (unchecked).
void gguf_quantize_activation_row(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale, float* sum,
                                  int16_t* bsum16);
/// Its scalar form, which runs where the AVX2 forms may not (gguf_avx2_forms_allowed): the
/// reference the AVX2 form (gguf_avx2.hpp, shared by the decode GEMV and the integer prefill)
/// equals bit for bit. Same arguments, unchecked.
void gguf_quantize_activation_row_scalar(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale, float* sum,
                                         int16_t* bsum16);

/// Whether gguf_gemv has a kernel for `t`.
bool gguf_gemv_supported(gguf::GgmlType t);

/// y[n] = dot(row n of W, x) for n in [n0, n1). `w` points at row 0; a row is
/// K / block_elems blocks. Throws hanpu::Error for an unsupported type or K not a multiple of the
/// block size.
void gguf_gemv_rows(gguf::GgmlType t, const void* w, int64_t K, const GgufActivations& x, float* y, int64_t n0,
                    int64_t n1);

/// Row lanes: a load-time layout of Q4_K weights for the decode GEMV (linear_gguf_row_lanes.cpp):
/// groups of 8 rows, lane r of every vector row r, so one broadcast of 4 activation bytes feeds 8
/// rows' multiply-adds and the f32 tail runs once per super-block for 8 rows. Per group and
/// super-block a tile of 1152 bytes, the file's 8 x 144 rearranged (the same bytes in all); the
/// N % 8 rows past the last group follow in the file's layout. Whether it
/// applies: Q4_K, N >= 8 and the AVX2 forms may run (gguf_avx2_forms_allowed).
bool gguf_row_lanes_available(gguf::GgmlType t, int64_t N);
/// Bytes of the row-lane layout of [N, K]. The functions below throw hanpu::Error for a type other
/// than Q4_K, N < 8 or K not a positive multiple of 256.
size_t gguf_row_lanes_bytes(gguf::GgmlType t, int64_t N, int64_t K);
/// Writes the row-lane layout of `blocks` (N rows of the file's layout) to `out`
/// (gguf_row_lanes_bytes of it; no alignment needed).
void gguf_pack_row_lanes(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, void* out);
/// Rows [n0, n1) of a row-lane layout back in the file's layout (bit for bit), at `out`.
void gguf_unpack_row_lanes(gguf::GgmlType t, const void* packed, int64_t N, int64_t K, int64_t n0, int64_t n1,
                           void* out);
/// y[n - n0] = dot(row n, x) for n in [n0, n1) over a row-lane layout; n0 and n1 multiples of 8 or
/// within the rows past the last group. The same value as gguf_gemv_rows up to the f32 summation
/// order (the same bound). Throws hanpu::Error where gguf_row_lanes_available is false.
void gguf_gemv_row_lanes(gguf::GgmlType t, const void* packed, int64_t N, int64_t K, const GgufActivations& x,
                         float* y, int64_t n0, int64_t n1);

/// Rows of x from which GgufLinear (hanpu/linear.hpp) dequantizes weight tiles instead of streaming the blocks once per
/// row: at 4 rows the GEMV has read the weights 4 times (placeholder until the prefill kernels are
/// chosen by measurement, issue 34).
inline constexpr int64_t kGgufPrefillRows = 4;
/// Weight rows per dequantized tile: 16 x K f32 (64 KiB at K = 1024, 229 KiB at K = 3584) stays in
/// Zen 4's 1 MiB L2 next to a block of x.
inline constexpr int64_t kGgufTileRows = 16;
/// Rows of x per pass over a tile: 64 x K f32 (256 KiB at K = 1024).
inline constexpr int64_t kGgufRowBlock = 64;

/// The integer prefill's instruction forms (gguf_prefill_int): AVX2 (VPMADDUBSW / VPMADDWD on 256-bit
/// registers) or AVX512-VNNI (VPDPBUSD on 512-bit registers). HANPU_GGUF_INT_FORM=avx2 makes kAuto the
/// AVX2 form (measurement; read on every call).
enum class GgufIntForm { kAuto, kAvx2, kVnni };

/// Whether the AVX2 forms (target attributes; the CPU has AVX2, FMA, F16C) may run: the selected
/// Highway target is AVX2 or better (as linear_int8_dot.cpp's chosen form).
bool gguf_avx2_forms_allowed();

/// Prefill (M >= kGgufPrefillRows) on integer dot products: the M activation rows quantized once
/// per call as the decode GEMV quantizes them (int8, per 32 for Q8_0, per 256 for the K-quants),
/// the weights unpacked once per tile of kGgufTileRows rows and register blocks of 4 activation
/// rows x 2 weight rows multiplied with AVX2 VPMADDUBSW + VPMADDWD (K-quants), 6 activation rows x
/// 16 weight rows with int16 VPMADDWD (Q8_0) (linear_gguf_prefill.cpp); where the CPU has
/// AVX512-VNNI, 8 activation rows x 16 weight rows with VPDPBUSD, the same results bit for bit.
/// Each y[m][n] is the decode GEMV's value for row m up to the f32 summation order, so it meets
/// the same bound. Rows split over `threads` (<= 0: all) of `engine` by tiles of weight rows.
/// Throws hanpu::Error where gguf_int_prefill_available(type) is false or K is not whole blocks.
/// w_row_lanes: w is in the row-lane layout (gguf_pack_row_lanes, Q4_K): each tile's rows are
/// put back in the file's layout (gguf_unpack_row_lanes) before the tile's unpack.
/// form: the instruction form (GgufIntForm); kAuto is the AVX2 one under HANPU_GGUF_INT_FORM=avx2, else
/// the AVX512-VNNI form where gguf_int_prefill_vnni_available(type), else the AVX2 one. kVnni where it is not
/// available throws hanpu::Error.
void gguf_prefill_int(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K, const float* x,
                      int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate,
                      bool w_row_lanes = false, GgufIntForm form = GgufIntForm::kAuto);

/// Whether gguf_prefill_int has an AVX512-VNNI form for `t` and may run it: Q8_0, Q4_K, Q5_K, Q6_K;
/// the CPU has AVX-512 F/DQ/BW/VL and VNNI, and HANPU_ISA is native or a Highway target with VNNI
/// (AVX3_DL, AVX3_ZEN4, AVX3_SPR; not plain AVX3 or AVX2). Bit for bit the AVX2 form's results
/// (the same integer sums per super-block / block, the same f32 operations on them).
bool gguf_int_prefill_vnni_available(gguf::GgmlType t);

/// The AVX2 activation quantizer gguf_prefill_int runs (the decode GEMV's, gguf_avx2.hpp): q8,
/// scale, sum and bsum16 bit for bit those of gguf_quantize_activation_row_scalar. Throws hanpu::Error where the
/// AVX2 forms may not run or K is not a positive multiple of block (32 or 256).
void gguf_prefill_quantize_row(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale, float* sum,
                               int16_t* bsum16);

/// Q8_0, Q4_K, Q5_K, Q6_K (linear_gguf_prefill.cpp) and Q4_0, IQ4_NL, IQ4_XS
/// (linear_gguf_prefill_small_blocks.cpp) where the AVX2 forms may run (gguf_avx2_forms_allowed).
bool gguf_int_prefill_available(gguf::GgmlType t);

/// HANPU_GGUF_PREFILL: unset (kAuto), "int" (kIntegerDot), "f32" (kF32Tiles) or "amx" (kAmxBf16); anything else is a
/// hanpu::Error naming it. Read on every call.
GgufPrefill gguf_prefill_override();

/// The per-ISA default for `t`: the integer path for every type with a form on AVX2 targets (measured
/// faster on Zen 3) and on AVX-512 targets but for Q4_0 / IQ4_NL, which keep the f32 tiles there
/// (measured on an Intel Xeon with AVX-512). docs/GGUF.md "Prefill".
bool gguf_int_prefill_default(gguf::GgmlType t);

/// What GgufLinear's prefill runs for `t` under setting `p`: the integer path when available and
/// chosen (kIntegerDot; kAuto: HANPU_GGUF_PREFILL, unset: the default); else the f32 tiles (also
/// Q4_1 / Q5_0 / Q5_1 always).
bool gguf_use_int_prefill(gguf::GgmlType t, GgufPrefill p = GgufPrefill::kAuto);

/// Prefill on AMX-BF16 (linear_gguf_amx.cpp): the M activation rows split into `terms` bf16 parts
/// (3: exact; 2: within 2^-16 relative; 1: rounded, 2^-9) and packed once per call; the weights
/// dequantized exactly (gguf::dequantize; row lanes put back in the file's layout first) per
/// column block of rows into the worker's scratch, rounded to bf16 (|w - bf16(w)| <= 2^-9 |w|) in
/// amx_pack_weight's tile order, and multiplied on AMX tiles (amx_gemm), products exact in f32,
/// one f32 rounding per product accumulated. Columns split over `threads` (<= 0: all) by blocks.
/// Throws hanpu::Error where gguf_amx_prefill_available(type) is false, K is not whole blocks or
/// terms is not 1, 2 or 3.
void gguf_prefill_amx(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K, const float* x,
                      int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate, bool w_row_lanes,
                      int terms);
/// Rows [n0, n1) of W dequantized, rounded to bf16 and packed as amx_pack_weight packs an
/// [n1 - n0, K] matrix, into `out` (amx_packed_weight_elems(n1 - n0, K)); f32_rows: 16 x K floats
/// of scratch, file_rows: scratch for the row-lane layout's rows. Only where
/// gguf_amx_prefill_available(type).
void gguf_pack_weight_bf16(gguf::GgmlType type, const void* w, int64_t N, int64_t K, int64_t n0, int64_t n1,
                           bool w_row_lanes, uint16_t* out, float* f32_rows, std::vector<uint8_t>& file_rows);
/// Every type gguf::dequantize handles, with blocks of a multiple of 32 elements, where AMX is
/// usable (amx_usable: the CPU, the OS's tile permission and HANPU_ISA "native").
bool gguf_amx_prefill_available(gguf::GgmlType t);
/// Bf16 terms per activation gguf_prefill_amx gets from GgufLinear: HANPU_GGUF_AMX_TERMS (1, 2, 3;
/// anything else is a hanpu::Error), unset: kGgufAmxTerms. Read on every call. One term by default:
/// each activation rounded to bf16 (2^-9 relative) is finer than the integer path's int8 per block
/// (up to 2^-8 of the block's largest), and the whole prefill ran 1.7-2.1x the 3-term form (docs/GGUF.md
/// "AMX-BF16 prefill").
inline constexpr int kGgufAmxTerms = 1;
int gguf_amx_terms();
/// Rows of x from which the default takes AMX-BF16: below, the dequantization per call (paid once
/// per weight whatever M) outweighs the GEMM's gain. Measured (benchmarks/gguf_prefill, MLP
/// shapes, 2 threads, GOP/s per CPU second, AMX 1 term against the integer path): M = 4 0.5-0.6x,
/// 8 0.7-0.8x, 16 0.9-0.95x (Q4_K) / 1.1-1.2x (Q8_0), 32 1.4x / 1.9-2.0x, 64 2.0x / 2.6-2.9x.
inline constexpr int64_t kGgufAmxMinRows = 32;
/// The per-ISA default: AMX-BF16 wherever it is available, for M >= kGgufAmxMinRows rows
/// (docs/GGUF.md "AMX-BF16 prefill").
bool gguf_amx_prefill_default(gguf::GgmlType t, int64_t M = kGgufAmxMinRows);
/// What GgufLinear's prefill of M rows runs for `t` under setting `p`: AMX-BF16 when available and
/// chosen (kAmxBf16: for every M; kAuto: HANPU_GGUF_PREFILL, unset: the default). Checked before
/// gguf_use_int_prefill.
bool gguf_use_amx_prefill(gguf::GgmlType t, GgufPrefill p = GgufPrefill::kAuto, int64_t M = kGgufAmxMinRows);

}  // namespace hanpu::cpu
