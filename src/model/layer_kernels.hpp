// SIMD row kernels of the layer glue and the attention block kernel (layer_kernels.cpp,
// compiled per SIMD target by Highway and dispatched at run time).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hanpu::model {

/// out = x * rsqrt(mean(x^2) + eps) * scale (n floats).
void simd_rms_norm_row(const float* x, float* out, size_t n, const float* scale, float eps);
/// g = silu(g) * u.
void simd_silu_mul_row(float* g, const float* u, size_t n);
/// y = silu(y).
void simd_silu_row(float* y, size_t n);
/// The index std::max_element(x, x + n) returns (the first maximum; 0 for n == 0), in vectors.
size_t simd_argmax(const float* x, size_t n);
/// o = o * sigmoid(g).
void simd_sigmoid_mul_row(float* o, const float* g, size_t n);
/// o = (o * rsqrt(mean(o^2) + eps) * w) * silu(z).
void simd_gated_norm_row(float* o, const float* z, const float* w, size_t n, float eps);

/// y[c] = silu(sum_j taps[j * tap_stride + c] * in[j][c]) for c < n (one token of the causal conv;
/// in[j] is the input row j steps into the window, oldest first).
void simd_conv_silu_row(const float* const* in, const float* taps, size_t tap_stride, size_t K, float* y, size_t n);
/// The same with each input row f32 (in_f32[j] non-null) or bf16 (in_bf16[j]; widened exactly), and
/// the output f32 (y_f32 non-null) or bf16 (y_bf16, rounded to nearest even). The sigmoid runs on
/// an approximate reciprocal with one Newton step: a few f32 ulp from simd_conv_silu_row, and for
/// acc < -80 acc / (1 + e^80) (within 1e-33 |acc| of silu(acc)). vLLM's conv (the plugin,
/// python/src/la_bindings.cpp).
void simd_conv_silu_row_mixed(const float* const* in_f32, const uint16_t* const* in_bf16, const float* taps,
                              size_t tap_stride, size_t K, float* y_f32, uint16_t* y_bf16, size_t n);

/// Keys per score tile of attention_rows (2 vectors): the transposed keys are padded to a
/// multiple of it.
size_t attention_key_tile();
/// Query rows per register block of attention_rows (6 or 8 by target): a block count of rows
/// per call wastes no block slots.
size_t attention_row_block();

/// Causal attention of `rows` query rows sharing one KV head:
/// out[r] = softmax(scale * q[r] . keys[0..limit[r])) values[0..limit[r]). Queries and keys have
/// head_dim dims, values and outputs value_dim.
struct AttentionRowsArgs {
  const float* const* q = nullptr;  // [rows] pointers to head_dim floats
  float* const* out = nullptr;      // [rows] pointers to value_dim floats
  const size_t* limit = nullptr;    // [rows] visible keys per row (>= 1)
  size_t rows = 0, head_dim = 0, value_dim = 0;
  /// Keys in transposed tiles of W = attention_key_tile(): dim i of key j at
  /// keys_t[(j / W) * head_dim * W + i * W + j % W], zero past the last key.
  const float* keys_t = nullptr;
  /// Values blocked by W dims (value_dim % W == 0): dim i of value j at
  /// values_blocked[(i / W) * values_block_stride + j * W + i % W]; null: use `values`.
  const float* values_blocked = nullptr;
  size_t values_block_stride = 0;
  const float* values = nullptr;  // value j at values + j * value_stride (when not blocked)
  size_t value_stride = 0;
  float scale = 1.0f;
  float* scores = nullptr;  // rows x score_stride scratch, score_stride >= max limit rounded up to the tile
  size_t score_stride = 0;
  const float* zero_row = nullptr;  // max(head_dim, value_dim, score_stride) zeros
  float* discard_row = nullptr;     // max(head_dim, value_dim, score_stride) floats of scratch
};
void attention_rows(const AttentionRowsArgs& args);

/// One split of attention over the cache's own row layout (no relayout), for a few query rows:
/// over keys j in [key_begin, min(key_end, limit[r])) of one KV head, with s_j = scale * q[r] . k_j:
///   max[r] = max_j s_j,  sum[r] = sum_j e^{s_j - max[r]},  acc[r] = sum_j e^{s_j - max[r]} v_j
/// (acc: value_dim floats per row). A row with no key in the range gets max = -inf, sum 0, acc 0.
/// Splits are combined by their maxima (causal_attention). Key j (head_dim floats) at keys + j *
/// key_stride, value j (value_dim floats) at values + j * value_stride.
struct AttentionSplitArgs {
  const float* const* q = nullptr;  // [rows]
  const size_t* limit = nullptr;    // [rows] visible keys per row
  size_t rows = 0, head_dim = 0, value_dim = 0;
  const float* keys = nullptr;
  const float* values = nullptr;
  size_t key_stride = 0, value_stride = 0;
  size_t key_begin = 0, key_end = 0;
  float scale = 1.0f;
  float* scores = nullptr;  // rows x (key_end - key_begin) scratch
  float* max = nullptr;     // [rows]
  float* sum = nullptr;     // [rows]
  float* acc = nullptr;     // [rows][value_dim]
};
void attention_split(const AttentionSplitArgs& args);

}  // namespace hanpu::model
