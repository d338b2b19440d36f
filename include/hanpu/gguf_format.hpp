// GGML/GGUF tensor block formats: the registry of type codes and block sizes, and the scalar
// reference dequantizers and quantizers hanpu uses to read and write GGUF checkpoints (src/io/gguf.hpp,
// src/model/gguf_export.hpp, GgufLinear in hanpu/linear.hpp). The block layouts themselves, which
// only the kernels read, are in src/cpu/gguf_blocks.hpp.
//
// Every format here is defined by ggml (ggml/src/ggml-common.h for the block layouts,
// ggml/src/ggml-quants.c for dequantize_row_* / quantize_row_*_ref) and mirrored in gguf-py
// (gguf-py/gguf/quants.py, gguf-py/gguf/constants.py GGML_QUANT_SIZES). The dequantizers compute
// each element with the same float32 operations in the same order as those definitions, so their
// results are bit-identical to gguf-py's numpy dequantizers (tests/python: test_gguf_blocks.py).
// src/cpu/gguf_blocks.cpp, which implements them, is compiled with -ffp-contract=off so that no
// a*b-c becomes a fused multiply-add.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace hanpu::gguf {

/// GGML type codes (the `ggml_type` enum, stored as u32 in a GGUF tensor info).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

/// One row of the registry: a block of `block_elems` consecutive elements of a row is stored in
/// `block_bytes` bytes. `dequantize` says whether hanpu can turn it into float32.
struct BlockFormat {
  GgmlType type;
  const char* name;
  uint32_t block_elems;
  uint32_t block_bytes;
  bool dequantize;
};

/// Every GGML type a GGUF file may name (sizes from ggml's type traits), in code order.
std::span<const BlockFormat> block_formats();
/// The row for a type code, or nullptr for a code ggml does not define (or has retired).
const BlockFormat* find_block_format(uint32_t code);
/// The row for a known type (throws hanpu::Error if `t` is not in the registry).
const BlockFormat& block_format(GgmlType t);
/// "Q4_K", or "unknown type code N".
std::string ggml_type_name(uint32_t code);

/// Dequantizes `n` elements (a whole number of blocks) stored as `t` at `src` into `dst`.
/// Throws hanpu::Error if `t` is not dequantizable or `n` is not a multiple of its block size.
void dequantize(GgmlType t, const void* src, float* dst, int64_t n);

/// ggml's quantize_row_q8_0_ref: per block of 32, d = max|x| / 127 (stored f16), q = round(x / d)
/// with round half away from zero. `n` must be a multiple of 32.
void quantize_q8_0(const float* src, void* dst, int64_t n);

/// ggml's quantize_row_q4_K_ref (the rounding llama-quantize uses without an importance matrix):
/// per sub-block of 32 an asymmetric 4-bit fit, scale and min searched by make_qkx2_quants
/// (weights |x| + rms, 21 candidate scales), the 8 scales and 8 mins coded in 6 bits against two
/// f16 super-block scales, then every element re-rounded against the coded scale and min.
/// `n` must be a multiple of 256. Bit-equal to ggml's (tools/compare_quantizers_with_ggml.py).
void quantize_q4_k(const float* src, void* dst, int64_t n);

/// ggml's quantize_row_q5_K_ref: as Q4_K with 5-bit levels (0..31; make_qkx2_quants with 16
/// candidate scales from rmin -0.5), the fifth bits in qh. `n` must be a multiple of 256.
/// Bit-equal to ggml's (tests/test_gguf_quantize.cpp, tools/compare_quantizers_with_ggml.py).
void quantize_q5_k(const float* src, void* dst, int64_t n);

/// ggml's quantize_row_q6_K_ref: per sub-block of 16 a symmetric 6-bit fit (make_qx_quants,
/// weights x^2, 19 candidate scales), the 16 scales coded as int8 against one f16 scale, then
/// every element re-rounded against its coded scale. `n` must be a multiple of 256.
void quantize_q6_k(const float* src, void* dst, int64_t n);

/// True for the types `quantize` writes: Q8_0, Q4_K, Q5_K, Q6_K (and F32/F16/BF16 as plain conversions).
bool can_quantize(GgmlType t);
/// Quantizes `n` float32 values (a whole number of blocks of `t`) into `dst`, which holds
/// n / block_elems * block_bytes bytes. Throws hanpu::Error for a type hanpu cannot write.
void quantize(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace hanpu::gguf
