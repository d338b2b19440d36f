// The weight-format registry (include/hanpu/weight_format.hpp): one row per format. The kernel
// columns name the files and functions that run each format; the load-time quantizers are the
// Linear classes' own conversions, so a format quantized at load and one read from a file run the
// same code.
#include "hanpu/weight_format.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "hanpu/linear.hpp"

namespace hanpu {

namespace {

std::unique_ptr<Linear> quantize_int8(const TensorView& w, const std::string& name, int64_t group) {
  return std::make_unique<Int8Linear>(w, name, group);
}
std::unique_ptr<Linear> convert_f16(const TensorView& w, const std::string& name, int64_t) {
  return std::make_unique<F16Linear>(F16Linear::converted(w, name));
}

using F = WeightFormat;
using G = gguf::GgmlType;
using L = WeightLoad;

// Shared texts of the GGML block formats' kernels (src/cpu/linear_gguf.cpp).
#define HANPU_GGUF_AMX_PREFILL                                                                           \
  "AMX hosts: blocks of 128 weight rows dequantized exactly, rounded to bf16 tiles in the worker's "      \
  "scratch, AMX GEMM over every row of x split into bf16 terms (linear_gguf_amx.cpp, HANPU_GGUF_AMX_TERMS); " \
  "elsewhere "
#define HANPU_GGUF_F32_PREFILL                                                                          \
  "tiles of 16 weight rows dequantized to f32 exactly (gguf::dequantize), f32 dot products with every " \
  "row of x (GgufF32Tile, Highway: AVX-512, AVX2, SSE4, NEON, portable); activations stay f32"
#define HANPU_GGUF_PREFILL HANPU_GGUF_AMX_PREFILL HANPU_GGUF_F32_PREFILL

// Q4_0, IQ4_NL, IQ4_XS prefill (linear_gguf_prefill_small_blocks.cpp).
#define HANPU_GGUF_SMALL_INT_PREFILL                                                                     \
  HANPU_GGUF_AMX_PREFILL "AVX2 targets: activations quantized once per call as the GEMV's, 16 weight rows unpacked per tile to " \
  "signed int8 (IQ4_XS: int16 times the sub-block scale), 4 x 2 register blocks of VPMADDUBSW with the " \
  "sign moved onto the activations (IQ4_XS: VPMADDWD) and one FMA per block of scales; elsewhere " HANPU_GGUF_F32_PREFILL

// The blocks of 32 without a K-quant (linear_gguf_small_blocks.cpp).
#define HANPU_GGUF_SMALL_GEMV                                                                            \
  "M < 4: activations quantized per 32 (llama.cpp's Q8_0 rule, f32 scale), per block VPMADDUBSW of the " \
  "codes (signed ones with the sign moved onto the activations) by the int8 activations, VPMADDWD, one FMA " \
  "by the two scales; Q4_1 / Q5_1 add m times the f32 block sum of x (linear_gguf_small_blocks.cpp; AVX2 " \
  "or better, else a portable form)"

const WeightFormatInfo kRows[] = {
    {F::kBf16, "bf16", 1, 2, "bfloat16 per element, rows as the checkpoint stores them (AMX: repacked into 16x32 tiles at load)",
     DType::BF16, G::BF16, "safetensors dtype BF16; GGUF type BF16 (30)", L::kAsStored, false, nullptr,
     "AMX: VDPBF16PS GEMV on the repacked tiles (linear_amx.cpp); AVX512-BF16: VDPBF16PS on the rows "
     "(linear_bf16dot.cpp); else RowBlockPairs, pairs of bf16 widened by shift/AND, f32 FMA "
     "(linear_portable.cpp, Highway: AVX-512, AVX2, SSE4, NEON, portable)",
     "AMX: TDPBF16PS tiles, activations split into 1-3 bf16 terms; AVX512-BF16 with --precision bf16; else "
     "GemmPanels, panels widened to f32 once per call, register-tiled f32 FMA (linear_portable.cpp)"},
    {F::kF32, "f32", 1, 4, "float32 per element", DType::F32, G::F32, "safetensors dtype F32; GGUF type F32 (0)",
     L::kReadOnly, false, nullptr,
     "RowOrderDots over each row in address order, f32 FMA (linear_portable.cpp LinearPortableF32, Highway: "
     "AVX-512, AVX2, SSE4, NEON, portable)",
     "GemmPanels on panels of rows, register-tiled f32 FMA (linear_portable.cpp)"},
    {F::kF16, "f16", 1, 2, "IEEE half per element, rows as stored", DType::F16, G::F16,
     "safetensors dtype F16; GGUF type F16 (1)", L::kPerTensor, true, convert_f16,
     "RowOrderDots over each row in address order, f16 widened in registers (AVX2/AVX-512: VCVTPH2PS; SSE4, "
     "portable: Highway's shift-and-mask conversion; NEON: FCVTL), f32 FMA (linear_portable.cpp "
     "LinearPortableF16)",
     "GemmPanels: panels widened to f32 once per call (8x8 blocks in registers on AVX2/AVX-512), "
     "register-tiled f32 FMA, the bf16 prefill kernel (linear_portable.cpp)"},
    {F::kInt8, "int8", 0, 0,
     "per group of G in_features (--int8-group, default 64): G int8 values q = round(w / s), |q| <= 127, and one "
     "f32 scale s = max|w| / 127 in a separate tensor",
     DType::I8, std::nullopt,
     "safetensors: `<name>` I8 [out, in] and `<name>.int8_scale` F32 [out, ceil(in / G)], shard metadata "
     "hanpu.int8_group = G (hanpu quantize)",
     L::kPerTensor, true, quantize_int8,
     "--precision int8: activations quantized per group, int8 dot products (AVX512-VNNI, or AVX2 VPMADDUBSW; "
     "linear_int8_dot.cpp); else RowBlockInt8, int8 widened and scaled to f32 in registers, f32 FMA "
     "(linear_portable.cpp)",
     "GemmPanels on panels widened to q * s in f32 (linear_portable.cpp LinearPortableInt8)"},
    {F::kQ8_0, "q8_0", 32, 34, "blocks of 32: f16 scale d, 32 int8 q; w = d * q", std::nullopt, G::Q8_0,
     "GGUF type Q8_0 (8)", L::kGgufFile, true, nullptr,
     "M < 4: activations quantized per 32 (llama.cpp's Q8_0 rule, f32 scale), integer dot products per "
     "block (DotQ8_0, Highway: AVX-512, AVX2, SSE4, NEON, portable; linear_gguf.cpp)",
     HANPU_GGUF_PREFILL},
    {F::kQ4_0, "q4_0", 32, 18, "blocks of 32: f16 scale d, 16 bytes of 4-bit q; w = d * (q - 8)", std::nullopt,
     G::Q4_0, "GGUF type Q4_0 (2)", L::kReadOnly, false, nullptr, HANPU_GGUF_SMALL_GEMV, HANPU_GGUF_SMALL_INT_PREFILL},
    {F::kQ4_1, "q4_1", 32, 20, "blocks of 32: f16 scale d and offset m, 16 bytes of 4-bit q; w = d * q + m",
     std::nullopt, G::Q4_1, "GGUF type Q4_1 (3)", L::kReadOnly, false, nullptr, HANPU_GGUF_SMALL_GEMV,
     HANPU_GGUF_PREFILL},
    {F::kQ5_0, "q5_0", 32, 22,
     "blocks of 32: f16 scale d, 32 fifth bits, 16 bytes of low nibbles; w = d * (q - 16) (llama-quantize's "
     "fallback for Q4_K on rows that are not whole 256-blocks)",
     std::nullopt, G::Q5_0, "GGUF type Q5_0 (6)", L::kReadOnly, false, nullptr, HANPU_GGUF_SMALL_GEMV,
     HANPU_GGUF_PREFILL},
    {F::kQ5_1, "q5_1", 32, 24,
     "blocks of 32: f16 d and m, 32 fifth bits, 16 bytes of low nibbles; w = d * q + m (llama-quantize's "
     "fallback for Q5_K)",
     std::nullopt, G::Q5_1, "GGUF type Q5_1 (7)", L::kReadOnly, false, nullptr, HANPU_GGUF_SMALL_GEMV,
     HANPU_GGUF_PREFILL},
    {F::kQ4_K, "q4_k", 256, 144,
     "super-blocks of 256: f16 d and dmin, 8 sub-blocks of 32 with 6-bit scales and mins, 4-bit q; "
     "w = d * sc * q - dmin * m",
     std::nullopt, G::Q4_K, "GGUF type Q4_K (12)", L::kGgufFile, true, nullptr,
     "M < 4: activations quantized per 256 (llama.cpp's Q8_K), DotK4: AVX2 VPMADDUBSW form (DotK4Avx2) where "
     "the target is AVX2 or better, else Highway (SSE4, NEON, portable); linear_gguf.cpp",
     HANPU_GGUF_PREFILL},
    {F::kQ5_K, "q5_k", 256, 176, "as Q4_K with a fifth bit per element (qh)", std::nullopt, G::Q5_K,
     "GGUF type Q5_K (13)", L::kGgufFile, true, nullptr,
     "M < 4: as Q4_K (DotK4Avx2<true> on AVX2 or better, else Highway DotK4); linear_gguf.cpp", HANPU_GGUF_PREFILL},
    {F::kQ6_K, "q6_k", 256, 210,
     "super-blocks of 256: f16 d, 16 int8 scales per 16, 6-bit q (4 low + 2 high bits); w = d * sc * (q - 32)",
     std::nullopt, G::Q6_K, "GGUF type Q6_K (14)", L::kGgufFile, true, nullptr,
     "M < 4: activations quantized per 256, DotQ6KAvx2 on AVX2 or better, else Highway DotQ6_K; linear_gguf.cpp",
     HANPU_GGUF_PREFILL},
    {F::kIQ4_XS, "iq4_xs", 256, 136,
     "super-blocks of 256: f16 d, 8 6-bit scales, 4-bit indices into the IQ4_NL levels", std::nullopt, G::IQ4_XS,
     "GGUF type IQ4_XS (23)", L::kReadOnly, false, nullptr,
     "M < 4: activations quantized per 256 (llama.cpp's Q8_K), levels looked up with VPSHUFB, VPMADDUBSW by "
     "the activations with the levels' signs moved onto them, VPMADDWD by the 6-bit sub-block scale "
     "(linear_gguf_small_blocks.cpp; AVX2 or better, else a portable form)",
     HANPU_GGUF_SMALL_INT_PREFILL},
    {F::kIQ4_NL, "iq4_nl", 32, 18,
     "blocks of 32: f16 scale d, 16 bytes of 4-bit indices into the IQ4_NL levels; w = d * level (llama-quantize's "
     "fallback for IQ4_XS on rows that are not whole 256-blocks)",
     std::nullopt, G::IQ4_NL, "GGUF type IQ4_NL (20)", L::kReadOnly, false, nullptr,
     "M < 4: activations quantized per 32 (llama.cpp's Q8_0 rule, f32 scale), levels looked up with VPSHUFB, "
     "VPMADDUBSW by the activations with the levels' signs moved onto them, VPMADDWD by ones, one FMA by the two "
     "scales per block (linear_gguf_small_blocks.cpp; AVX2 or better, else a portable form)",
     HANPU_GGUF_SMALL_INT_PREFILL},
};
#undef HANPU_GGUF_PREFILL
#undef HANPU_GGUF_F32_PREFILL
#undef HANPU_GGUF_AMX_PREFILL
#undef HANPU_GGUF_SMALL_INT_PREFILL
#undef HANPU_GGUF_SMALL_GEMV

static_assert(sizeof(kRows) / sizeof(kRows[0]) == static_cast<size_t>(WeightFormat::kIQ4_NL) + 1,
              "one registry row per WeightFormat, in enum order");

const WeightMix kMixes[] = {
    {"q4_k_m", WeightFormat::kQ4_K,
     "llama.cpp's Q4_K_M: Q4_K, with Q6_K for the LM head and for half of attn_v / ffn_down (llama-quant.cpp's "
     "rules, src/model/gguf_export.cpp); tensors whose rows are not whole 256-blocks fall back as llama.cpp does"},
    {"q5_k_m", WeightFormat::kQ5_K,
     "llama.cpp's Q5_K_M: Q5_K, with Q6_K for the LM head and for half of attn_v / ffn_down (the Q4_K_M rules of "
     "llama-quant.cpp); rows that are not whole 256-blocks fall back to Q8_0 (llama.cpp: Q5_1)"},
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

uint64_t WeightFormatInfo::bytes_for(int64_t N, int64_t K, int64_t int8_group) const {
  if (format == WeightFormat::kInt8) {
    const int64_t g = std::max<int64_t>(1, int8_group);
    return static_cast<uint64_t>(N * K) + static_cast<uint64_t>(N * ((K + g - 1) / g)) * 4;
  }
  return static_cast<uint64_t>(N) * static_cast<uint64_t>((K + block_elems - 1) / block_elems) * block_bytes;
}

double WeightFormatInfo::bytes_per_weight(int64_t int8_group) const {
  if (format == WeightFormat::kInt8) return 1.0 + 4.0 / static_cast<double>(std::max<int64_t>(1, int8_group));
  return static_cast<double>(block_bytes) / static_cast<double>(block_elems);
}

std::span<const WeightFormatInfo> weight_formats() { return kRows; }

const WeightFormatInfo& weight_format_info(WeightFormat f) {
  const auto i = static_cast<size_t>(f);
  if (i >= std::size(kRows)) throw Error("weight format code " + std::to_string(i) + " has no registry row");
  return kRows[i];
}

std::optional<WeightFormat> weight_format_of_ggml(gguf::GgmlType t) {
  for (const WeightFormatInfo& r : kRows)
    if (r.ggml_type == t) return r.format;
  return std::nullopt;
}

std::optional<WeightFormat> weight_format_of_dtype(DType dt) {
  for (const WeightFormatInfo& r : kRows)
    if (r.safetensors_dtype == dt) return r.format;
  return std::nullopt;
}

std::span<const WeightMix> weight_mixes() { return kMixes; }

std::vector<std::string> weight_load_names() {
  std::vector<std::string> names;
  for (const WeightFormatInfo& r : kRows)
    if (r.load != WeightLoad::kReadOnly) names.emplace_back(r.name);
  for (const WeightMix& m : kMixes) names.emplace_back(m.name);
  return names;
}

std::vector<std::string> weight_quantize_names() {
  std::vector<std::string> names;
  for (const WeightFormatInfo& r : kRows)
    if (r.quantize_writes) names.emplace_back(r.name);
  for (const WeightMix& m : kMixes) names.emplace_back(m.name);
  return names;
}

WeightChoice weight_choice(const std::string& name, const std::string& flag, const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), name) != names.end()) {
    for (const WeightFormatInfo& r : kRows)
      if (name == r.name) return WeightChoice{r.format, nullptr, name};
    for (const WeightMix& m : kMixes)
      if (name == m.name) return WeightChoice{std::nullopt, &m, name};
  }
  throw Error(flag + ": got '" + name + "', expected one of " + joined(names) +
              " (the weight formats, hanpu/weight_format.hpp; docs/MODEL.md \"Weight formats\")");
}

}  // namespace hanpu
