// Decode GEMV over the GGML formats of 32-element blocks that llama-quantize falls back to, and
// IQ4_XS: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (activations quantized per 32, Q8_0's rule, as llama.cpp's Q8_0 /
// Q8_1 activations) and IQ4_XS (activations per 256, as llama.cpp's Q8_K). The kernels are in
// linear_gguf_small_blocks.cpp; gguf_gemv_rows (linear_gguf.hpp) dispatches to them.
//
// Each block's product with the int8 activations runs in exact integers; then one conversion and
// one f32 multiply-add by (weight scale * activation scale) per block (IQ4_XS: per super-block, its
// 6-bit sub-block scales applied in integers). Q4_1 / Q5_1's offset m adds m * s_b * S_b, S_b the
// integer sum of the block's quantized activations (llama.cpp's Q8_1 form), so every row is the dot
// product of the exact weights with the quantized x up to f32 rounding; tests/test_linear_gguf_small_blocks.cpp
// checks two bounds derived from that arithmetic against fp64 of the exactly dequantized weights.
#pragma once

#include <cstdint>

#include "cpu/linear_gguf.hpp"
#include "hanpu/gguf_format.hpp"

namespace hanpu::cpu {

/// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS.
bool gguf_small_block_type(gguf::GgmlType t);

/// Which form runs: kAuto is the AVX2 form where gguf_avx2_forms_allowed(), else the portable one
/// (plain C++, the same integer sums). The tests run both.
enum class SmallBlockForm { kAuto, kAvx2, kPortable };

/// Whether `form` can run here (kAvx2 only where gguf_avx2_forms_allowed()).
bool gguf_small_block_form_available(SmallBlockForm form);

/// y[n] = dot(row n of W, x) for n in [n0, n1), `w` pointing at row 0 of rows of K / block_elems
/// blocks of `t`, x quantized by gguf_quantize_activations with gguf_activation_block(t). Throws
/// hanpu::Error for another type, K not whole blocks, activations in other blocks, or an
/// unavailable form.
void gguf_small_block_gemv_rows(gguf::GgmlType t, const void* w, int64_t K, const GgufActivations& x, float* y,
                                int64_t n0, int64_t n1, SmallBlockForm form = SmallBlockForm::kAuto);

/// Q4_0, IQ4_NL, IQ4_XS: the types with an integer prefill form in linear_gguf_prefill_small_blocks.cpp
/// (every weight a signed integer of at most 7 bits after a table lookup or an offset).
bool gguf_small_block_int_prefill_type(gguf::GgmlType t);

/// gguf_prefill_int (linear_gguf.hpp) for those types: activations quantized once per call with the
/// GEMV's rule (per 32 for Q4_0 / IQ4_NL, per 256 for IQ4_XS), weight rows unpacked once per tile
/// into signed int8 values (int16 times the sub-block scale for IQ4_XS), register blocks of 4
/// activation rows x 2 weight rows. Each y[m][n] is the decode GEMV's value for row m up to the f32
/// summation order. Throws hanpu::Error for another type, without AVX2, or K not whole blocks.
void gguf_small_block_prefill_int(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K,
                                  const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                                  bool accumulate);

}  // namespace hanpu::cpu
