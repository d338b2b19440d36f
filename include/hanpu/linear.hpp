// Dense projections of a model (q/k/v/z/b/a/out projections, MLP, LM head): y = x W^T with the
// weight in bf16 as checkpoints ship it ([out_features, in_features], row-major, like
// torch.nn.Linear) and activations in f32.
//
// Bf16Linear is a handle so that the implementation may repack the weight once at load time into
// whatever layout its kernel wants (e.g. pairs for the bf16 dot-product instructions); callers
// never see the layout. Int8Linear and GgufLinear hold quantized weights (int8 with group scales;
// a GGUF checkpoint's GGML blocks). Kernels: src/cpu/linear_*.cpp; method, errors and speed:
// docs/LINEAR.md, docs/GGUF.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

class Engine;  // hanpu/engine.hpp

/// How forward() treats the f32 activations (docs/LINEAR.md has the measured errors).
enum class LinearPrecision {
  /// Default. Every product is f32 activation x bf16 weight, accumulated in f32: on the bf16
  /// instructions (AMX, AVX512-BF16) each activation is split exactly into three bf16 terms.
  kExact,
  /// Two bf16 terms: activations keep ~16 significant bits (relative error < 2^-15).
  kBf16x2,
  /// One bf16 term: activations rounded to bf16 (relative error <= 2^-8), the fastest.
  kBf16,
  /// Int8Linear only, decode rows (M < 16) on CPUs with AVX512-VNNI: activations quantized to
  /// int8 per group of the weight's group size (scale max|x| / 127: error <= scale / 2 per
  /// input), int8 dot products (what llama.cpp's Q8_0 does). Elsewhere (prefill rows, CPUs
  /// without VNNI, and for Bf16Linear) it is kExact.
  kInt8,
};

/// Which kernel family a Bf16Linear uses. kAuto picks the fastest one this CPU and OS allow.
enum class LinearBackend {
  kAuto,
  /// Highway kernels on the checkpoint's own layout, f32 arithmetic; runs on every CPU. Always
  /// exact: the precision argument of forward() is ignored (rounding would not make it faster).
  kPortable,
  /// Intel AMX tiles for M >= a few rows and AVX512-BF16 dot products for decode; needs
  /// amx_bf16 + avx512_bf16 and the Linux permission for tile data. Repacks the weight.
  kAmx,
  /// AVX512-BF16 dot products (VDPBF16PS) on the checkpoint's own layout, for CPUs without AMX
  /// (AMD Zen 4/5): no repacked copy of the weight. Needs avx512_bf16. Only kBf16 runs on the bf16
  /// instructions (about twice the f32 FMA rate on Zen 4); kExact and kBf16x2 run the portable f32
  /// kernel (split activations would cost as much or more there), so kBf16x2 is exact here.
  kAvx512Bf16,
};

/// Short lowercase name ("exact", "bf16x2", "bf16", "int8"; "auto", "portable", "amx", "avx512bf16"), and the inverse
/// (throws hanpu::Error naming the accepted values).
const char* linear_precision_name(LinearPrecision p);
LinearPrecision linear_precision_from_name(const std::string& name);
const char* linear_backend_name(LinearBackend b);
LinearBackend linear_backend_from_name(const std::string& name);
/// Whether the AMX backend can run here (CPUID and, on Linux, the tile-data permission).
bool linear_amx_available();
/// Whether the AVX512-BF16 backend can run here (CPUID, XCR0, HANPU_ISA native).
bool linear_avx512bf16_available();
/// VDPBF16PS multiply-adds per second over VFMADD231PS's, measured once per process (0 without the
/// instruction). The auto backend takes AVX512-BF16 only where this is at least 1.5 (Zen 4: 2;
/// Sapphire Rapids: 1, where the f32 kernel is faster).
double linear_bf16dot_mac_ratio();
/// The backend LinearBackend::kAuto resolves to here: AMX where usable, else AVX512-BF16 where
/// linear_bf16dot_mac_ratio() is at least 1.5, else portable.
LinearBackend linear_auto_backend();

class Bf16Linear {
 public:
  Bf16Linear();
  /// weight: [out_features, in_features] BF16, contiguous rows. `name` is used in error messages
  /// (e.g. "model.layers.0.mlp.up_proj.weight"). The view must stay valid while this object lives
  /// unless the implementation copied it (callers keep the checkpoint mapped; that is always safe).
  Bf16Linear(TensorView weight, std::string name);
  /// Same with an explicit backend; kAmx throws hanpu::Error when this machine cannot run it.
  Bf16Linear(TensorView weight, std::string name, LinearBackend backend);
  /// Several weights with the same in_features stacked along out_features into one layer (e.g.
  /// q/k/v, gate/up, in_proj_qkv/z/b/a: one pass over the input instead of several, and bigger
  /// GEMMs). Output columns follow the order of `weights`. The rows are copied, so the views need
  /// not outlive this object.
  Bf16Linear(const std::vector<TensorView>& weights, std::string name, LinearBackend backend = LinearBackend::kAuto);
  ~Bf16Linear();
  Bf16Linear(Bf16Linear&&) noexcept;
  Bf16Linear& operator=(Bf16Linear&&) noexcept;

  int64_t in_features() const;
  int64_t out_features() const;
  const std::string& name() const;
  /// The backend actually chosen (never kAuto).
  LinearBackend backend() const;

  /// y[m, :] = x[m, :] W^T for every row m: x is [M, in_features] F32 (row stride may exceed
  /// in_features), y is [M, out_features] F32 (row stride may exceed out_features).
  /// accumulate: y += x W^T instead of y = x W^T. threads: how many threads of the engine's pool to
  /// use (1 = the calling thread only; do not pass > 1 from inside a task of that pool). x and y
  /// must not overlap. Throws hanpu::Error naming this weight on shape mismatch.
  /// precision: see LinearPrecision (default exact). The result does not depend on `threads`.
  void forward(TensorView x, TensorView y, int threads, bool accumulate = false,
               LinearPrecision precision = LinearPrecision::kExact) const;
  /// The same on `engine`'s pool and workspaces (the one above uses Engine::default_engine()).
  void forward(Engine& engine, TensorView x, TensorView y, int threads, bool accumulate = false,
               LinearPrecision precision = LinearPrecision::kExact) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// y = x W^T with W quantized to int8: symmetric, one f32 scale per group of `group` consecutive
/// in_features of each output row (scale = max|w| / 127 over the group, q = round(w / scale) in
/// [-127, 127]; the last group of a row may be shorter). Activations and accumulation stay f32:
/// the only error is the weights' quantization (docs/LINEAR.md). Memory: 1 + 4 / group bytes per
/// weight; the weight is read once per decode step, so decode moves about half the bf16 bytes.
class Int8Linear {
 public:
  Int8Linear();
  /// Quantizes `weight` ([out_features, in_features] BF16, F16 or F32, contiguous) now; the view
  /// is not kept. group >= 1 (errors name the weight).
  Int8Linear(TensorView weight, std::string name, int64_t group);
  /// Already quantized: q [N, K] int8, scales [N, ceil(K / group)] f32, not copied: they must
  /// outlive this object (as Bf16Linear's views: callers keep the checkpoint mapped).
  Int8Linear(const int8_t* q, const float* scales, int64_t out_features, int64_t in_features, int64_t group,
             std::string name);
  ~Int8Linear();
  Int8Linear(Int8Linear&&) noexcept;
  Int8Linear& operator=(Int8Linear&&) noexcept;

  int64_t in_features() const;
  int64_t out_features() const;
  int64_t group() const;
  const std::string& name() const;
  /// Bytes of the int8 weight and its scales (owned, or read in place).
  size_t bytes() const;
  const int8_t* quantized() const;  // [N, K]
  const float* scales() const;      // [N, ceil(K / group)]
  /// Weight (n, k) as forward() uses it: q * scale, in f32.
  float weight(int64_t n, int64_t k) const;

  /// As Bf16Linear::forward (shapes, strides, accumulate, threads; the result does not depend on
  /// `threads`). precision: kInt8 quantizes decode rows' activations (see LinearPrecision); every
  /// other value keeps them f32.
  void forward(TensorView x, TensorView y, int threads, bool accumulate = false,
               LinearPrecision precision = LinearPrecision::kExact) const;
  void forward(Engine& engine, TensorView x, TensorView y, int threads, bool accumulate = false,
               LinearPrecision precision = LinearPrecision::kExact) const;
  /// Whether forward(..., kInt8) with M rows runs int8 activations on this CPU.
  static bool int8_activations_available(int64_t M);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A projection y = x W^T whose weight W [N, K] stays in GGML blocks (a GGUF tensor, not copied:
/// it must outlive this object): a GGUF checkpoint's quantized weights. Decode rows (M < 4) of
/// Q8_0 / Q4_K / Q5_K / Q6_K run a GEMV over the blocks with int8 activations, as llama.cpp does;
/// other rows and other decodable types dequantize tiles of W to f32 exactly and keep the
/// activations f32 (kernels and thresholds: src/cpu/linear_gguf.hpp; formats: docs/GGUF.md).
class GgufLinear {
 public:
  GgufLinear(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, std::string name);
  gguf::GgmlType type() const { return type_; }
  int64_t out_features() const { return N_; }
  int64_t in_features() const { return K_; }
  const std::string& name() const { return name_; }
  const void* blocks() const { return blocks_; }
  size_t bytes() const;
  /// y[m, :N] (+)= x[m, :K] W^T for m < M; rows ldx / ldy floats apart; `threads` of the engine's pool.
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate) const;

 private:
  gguf::GgmlType type_;
  const void* blocks_;
  int64_t N_, K_, row_bytes_ = 0;
  std::string name_;
};

}  // namespace hanpu
