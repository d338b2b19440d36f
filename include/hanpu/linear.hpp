// Dense projections of a model (q/k/v/z/b/a/out projections, MLP, LM head): y = x W^T with the
// weight [out_features, in_features] (row-major, like torch.nn.Linear) in one of the formats of
// hanpu/weight_format.hpp, and activations in f32.
//
// Linear is the one interface over every format: a model holds its projections as Linear and
// never asks which format a weight has (the registry row says what differs). One class per
// family of kernels implements it: Bf16Linear (bf16), F16Linear (f16), F32Linear (f32),
// Int8Linear (hanpu's int8) and GgufLinear (GGML blocks: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K, IQ4_NL, IQ4_XS).
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
#include "hanpu/weight_format.hpp"

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

/// y = x W^T over a weight in any format (hanpu/weight_format.hpp). Implementations keep the
/// arithmetic of their kernels: the pointer form of forward() below computes exactly what each
/// class's own forward computes.
class Linear {
 public:
  virtual ~Linear() = default;
  /// The weight's format (its registry row: weight_format_info(format())).
  virtual WeightFormat format() const = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual const std::string& name() const = 0;
  /// Bytes of the weight as held (a mapped file's, or the copy made at load).
  virtual size_t bytes() const = 0;
  /// y[m, :N] (+)= x[m, :K] W^T for m < M; rows of x and y are ldx / ldy floats apart (>= K, N);
  /// `threads` parts of the engine's pool. precision: see LinearPrecision (formats whose
  /// arithmetic it does not apply to ignore it, as their classes document). The result does not
  /// depend on `threads`. Throws hanpu::Error naming the weight on bad arguments.
  virtual void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                       bool accumulate, LinearPrecision precision) const = 0;
};

class Bf16Linear final : public Linear {
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

  WeightFormat format() const override { return WeightFormat::kBf16; }
  int64_t in_features() const override;
  int64_t out_features() const override;
  const std::string& name() const override;
  size_t bytes() const override;
  /// The backend actually chosen (never kAuto).
  LinearBackend backend() const;
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate, LinearPrecision precision) const override;

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
class Int8Linear final : public Linear {
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

  WeightFormat format() const override { return WeightFormat::kInt8; }
  int64_t in_features() const override;
  int64_t out_features() const override;
  int64_t group() const;
  const std::string& name() const override;
  /// Bytes of the int8 weight and its scales (owned, or read in place).
  size_t bytes() const override;
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate, LinearPrecision precision) const override;
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
/// every block type run a GEMV over the blocks with int8 activations, as llama.cpp does;
/// other rows dequantize tiles of W to f32 exactly and keep the
/// activations f32 (kernels and thresholds: src/cpu/linear_gguf.hpp; formats: docs/GGUF.md).
/// GgufLinear's prefill (M >= 4 rows) arithmetic: kAuto = HANPU_GGUF_PREFILL ("int" / "f32" / "amx")
/// if set, else the per-ISA default (AMX-BF16 where AMX is usable, from 32 rows; else integer dot products for
/// Q8_0 / Q4_K / Q5_K / Q6_K / Q4_0 / IQ4_NL / IQ4_XS on AVX2 targets, all but Q4_0 / IQ4_NL on AVX-512
/// targets; docs/GGUF.md "Prefill", "AVX-512", "AMX-BF16 prefill"). kIntegerDot falls back to the f32
/// tiles where it has no kernel (Q4_1, Q5_0, Q5_1, CPUs without AVX2); kAmxBf16 (weight tiles
/// dequantized to bf16 on the fly, the AMX GEMM) to the per-ISA choice among the others where AMX is
/// not usable.
enum class GgufPrefill { kAuto, kIntegerDot, kF32Tiles, kAmxBf16 };

/// How GgufLinear's blocks are laid out: the file's rows of blocks, or row lanes (Q4_K on AVX2: groups
/// of 8 rows interleaved at load, the decode GEMV multiplying 8 rows per vector; docs/GGUF.md
/// "Decode GEMV on row lanes"), written by GgufLinear::pack_row_lanes.
enum class GgufLayout { kFile, kRowLanes };

class GgufLinear final : public Linear {
 public:
  /// Throws hanpu::Error naming the weight for a type without a registry row
  /// (weight_format_of_ggml), a shape that is not rows of whole blocks, or kRowLanes where
  /// row_lanes_available(t, N) is false.
  GgufLinear(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, std::string name,
             GgufLayout layout = GgufLayout::kFile);
  /// Whether a [N, K] weight of type t can take the row-lane layout here (Q4_K, N >= 8, the AVX2
  /// forms allowed on this CPU / HANPU_ISA).
  static bool row_lanes_available(gguf::GgmlType t, int64_t N);
  /// The row-lane layout's bytes for [N, K] (the file's: the same bits rearranged), and the packing of the file's rows `blocks` into `out` (that many
  /// bytes). Throw hanpu::Error where row_lanes_available is false or K is not whole super-blocks.
  static size_t row_lanes_bytes(gguf::GgmlType t, int64_t N, int64_t K);
  static void pack_row_lanes(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, void* out);
  GgufLayout layout() const { return layout_; }
  gguf::GgmlType type() const { return type_; }
  WeightFormat format() const override { return format_; }
  int64_t out_features() const override { return N_; }
  int64_t in_features() const override { return K_; }
  const std::string& name() const override { return name_; }
  const void* blocks() const { return blocks_; }
  size_t bytes() const override;
  /// y[m, :N] (+)= x[m, :K] W^T for m < M; rows ldx / ldy floats apart; `threads` of the engine's pool.
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate) const;
  /// The format's own arithmetic: `precision` does not apply.
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate, LinearPrecision) const override {
    forward(engine, x, ldx, y, ldy, M, threads, accumulate);
  }
  /// Decode rows (M < 4) of several projections that read the same x, the GGUF parts of a stacked
  /// projection (GDN's in_proj, attention's q / k / v, the MLP's gate / up): y[m, cols[i] + n]
  /// (+)= x[m, :K] W_i^T for every part i. The activations are quantized once per row and all
  /// parts run in one pass of the pool, each thread the share of every part it gets in the part's
  /// own forward, so the results equal calling each part's forward bit for bit. Returns false and
  /// does nothing where that does not apply: M >= 4, fewer than two parts, a part without a GEMV
  /// kernel, different K, or parts whose activations are quantized in different blocks (Q8_0's 32
  /// beside a K-quant's 256).
  static bool forward_decode_parts(Engine& engine, const std::vector<const GgufLinear*>& parts,
                                   const std::vector<int64_t>& cols, const float* x, int64_t ldx, float* y, int64_t ldy,
                                   int64_t M, int threads, bool accumulate);
  /// Overrides the prefill path for this projection (measurement and tests; kAuto by default).
  void set_prefill(GgufPrefill p) { prefill_ = p; }
  /// Whether forward's prefill rows run the integer path (the setting above resolved for this type;
  /// where AMX is usable, for M >= 32 rows, as below).
  bool prefill_is_integer() const;
  /// Whether they run the AMX-BF16 path (for M >= 32 rows; under kAuto's default the fewer rows
  /// below take the others, src/cpu/linear_gguf.hpp kGgufAmxMinRows).
  bool prefill_is_amx() const;

 private:
  GgufPrefill prefill_ = GgufPrefill::kAuto;
  GgufLayout layout_ = GgufLayout::kFile;
  gguf::GgmlType type_;
  WeightFormat format_;
  const void* blocks_;
  int64_t N_, K_, row_bytes_ = 0;
  std::string name_;
  // The decode pass forward() and forward_decode_parts() share: for each of the M rows of x, its
  // activations quantized once in blocks of `block`, then the rows of the `count` projections
  // (output columns cols[i] on) claimed by nt threads in guided chunks, part after part.
  static void decode_rows(Engine& engine, const GgufLinear* const* parts, const int64_t* cols, size_t count,
                          int64_t block, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int nt,
                          bool accumulate);
};

/// A weight stored as IEEE half [N, K] (an f16 safetensors checkpoint, a GGUF F16 tensor, or
/// `--weights f16`), kept in f16: half the bytes of f32, as bf16. Activations and accumulation are
/// f32 and every product is exact (f16 widens to f32 exactly), so the only difference from f32
/// weights is the order of the sums. Decode rows (M < 16) stream each weight row once, widened in
/// registers (VCVTPH2PS on x86 with F16C, Highway's f16 conversion elsewhere); prefill rows widen
/// panels of rows to f32 once per call and run the register-tiled f32 GEMM bf16 uses
/// (src/cpu/linear_portable.cpp). `precision` does not apply.
class F16Linear final : public Linear {
 public:
  /// weight: [N, K] F16, contiguous; not copied (it must outlive this object, as Bf16Linear's).
  F16Linear(TensorView weight, std::string name);
  /// A copy of `weight` ([N, K] BF16, F16 or F32, contiguous) rounded to f16 (to nearest even;
  /// values beyond f16's range become +-inf: throws naming the weight and the element instead).
  static F16Linear converted(const TensorView& weight, std::string name);
  /// Several f16 weights with the same in_features stacked along out_features (rows copied).
  F16Linear(const std::vector<TensorView>& weights, std::string name);
  WeightFormat format() const override { return WeightFormat::kF16; }
  int64_t in_features() const override { return K_; }
  int64_t out_features() const override { return N_; }
  const std::string& name() const override { return name_; }
  size_t bytes() const override { return static_cast<size_t>(N_ * K_) * 2; }
  const uint16_t* data() const { return w_; }
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate, LinearPrecision precision = LinearPrecision::kExact) const override;

 private:
  F16Linear() = default;
  const uint16_t* w_ = nullptr;
  int64_t N_ = 0, K_ = 0;
  std::string name_;
  ByteBuffer owned_;  // converted or stacked rows (w_ points here), else empty
};

/// A weight in f32 [N, K] (converted checkpoints, GGUF F32 tensors, weights a loader reorders),
/// kept in f32: the same kernels as F16Linear without the widening. `precision` does not apply.
class F32Linear final : public Linear {
 public:
  /// weight: [N, K] F32, contiguous; not copied.
  F32Linear(TensorView weight, std::string name);
  /// A copy of `weight` ([N, K], any float dtype, contiguous) in f32.
  static F32Linear converted(const TensorView& weight, std::string name);
  WeightFormat format() const override { return WeightFormat::kF32; }
  int64_t in_features() const override { return K_; }
  int64_t out_features() const override { return N_; }
  const std::string& name() const override { return name_; }
  size_t bytes() const override { return static_cast<size_t>(N_ * K_) * 4; }
  void forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
               bool accumulate, LinearPrecision precision = LinearPrecision::kExact) const override;

 private:
  F32Linear() = default;
  const float* w_ = nullptr;
  int64_t N_ = 0, K_ = 0;
  std::string name_;
  ByteBuffer owned_;
};

}  // namespace hanpu
