// The weight formats as registry rows (hanpu/weight_format.hpp) and the linear interface over them
// (hanpu/linear.hpp):
//   - the registry: one row per format in enum order, the names the CLI and Python derive from it,
//     the refusal of an unknown name (naming the flag, the value and the names);
//   - F16Linear and F32Linear against fp64 per element, tails and odd shapes, decode and prefill
//     rows, accumulate, every thread count; f16 and f32 kernels bit-equal on the same values;
//   - the refactor changed no result: the logits of every tiny golden with bf16, int8 (f32 and int8
//     activations) and the GGUF Q8_0 / Q4_K_M paths are bit-equal to those recorded before it
//     (tests/golden/weight_formats_logits.json, per kernel target).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hanpu/engine.hpp"
#include "hanpu/isa.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/model.hpp"
#include "hanpu/weight_format.hpp"
#include "model/model_parts.hpp"
#include "model_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

// ---- the registry ---------------------------------------------------------------------------

TEST(WeightFormatRegistry, OneRowPerFormatInEnumOrderWithUniqueNames) {
  std::set<std::string> names;
  size_t i = 0;
  for (const WeightFormatInfo& r : weight_formats()) {
    EXPECT_EQ(static_cast<size_t>(r.format), i++) << r.name;
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_EQ(&weight_format_info(r.format), &r);
    EXPECT_NE(std::string(r.decode_kernels), "") << r.name;
    EXPECT_NE(std::string(r.prefill_kernels), "") << r.name;
    // Per-tensor conversions have a quantizer, and only they.
    EXPECT_EQ(r.load == WeightLoad::kPerTensor, r.quantize != nullptr) << r.name;
    // A GGUF type's block layout is the GGUF registry's.
    if (r.ggml_type) {
      EXPECT_EQ(weight_format_of_ggml(*r.ggml_type), r.format) << r.name;
      EXPECT_EQ(gguf::block_format(*r.ggml_type).block_elems, r.block_elems) << r.name;
      EXPECT_EQ(gguf::block_format(*r.ggml_type).block_bytes, r.block_bytes) << r.name;
    }
    if (r.safetensors_dtype) EXPECT_EQ(weight_format_of_dtype(*r.safetensors_dtype), r.format) << r.name;
  }
  for (const WeightMix& m : weight_mixes()) EXPECT_TRUE(names.insert(m.name).second) << m.name;
  EXPECT_EQ(weight_format_of_ggml(gguf::GgmlType::Q2_K), std::nullopt);
  EXPECT_EQ(weight_format_of_ggml(gguf::GgmlType::IQ4_NL), WeightFormat::kIQ4_NL);
}

TEST(WeightFormatRegistry, LoadAndQuantizeNamesComeFromTheRows) {
  EXPECT_EQ(weight_load_names(), (std::vector<std::string>{"bf16", "f16", "int8", "q8_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"}));
  EXPECT_EQ(weight_quantize_names(), (std::vector<std::string>{"f16", "int8", "q8_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"}));
  EXPECT_EQ(weight_choice("q4_k_m", "--weights", weight_load_names()).mix->main, WeightFormat::kQ4_K);
  EXPECT_EQ(weight_choice("int8", "--weights", weight_load_names()).format, WeightFormat::kInt8);
  EXPECT_EQ(weight_choice("f16", "--weights", weight_load_names()).load(), WeightLoad::kPerTensor);
  EXPECT_EQ(weight_format_info(WeightFormat::kQ4_K).bytes_for(3, 512, 0), 3u * 2 * 144);
  EXPECT_EQ(weight_format_info(WeightFormat::kInt8).bytes_for(3, 100, 64), 300u + 3 * 2 * 4);
  EXPECT_DOUBLE_EQ(weight_format_info(WeightFormat::kInt8).bytes_per_weight(64), 1.0625);
}

TEST(WeightFormatRegistry, AnUnknownNameIsRefusedNamingTheFlagTheValueAndTheNames) {
  const std::string e = testing::error_of([] { weight_choice("q3_k", "--weights", weight_load_names()); });
  EXPECT_NE(e.find("--weights: got 'q3_k', expected one of bf16, f16, int8, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m"), std::string::npos)
      << e;
  // A format the registry has but that the flag does not take (read from files only).
  const std::string r = testing::error_of([] { weight_choice("q5_0", "--format", weight_quantize_names()); });
  EXPECT_NE(r.find("--format: got 'q5_0', expected one of f16, int8"), std::string::npos) << r;
  // The model loader names its option.
  const std::string m = testing::error_of([] {
    HybridModel::load((testing::golden_dir() / "qwen35_tiny").string(), {.weights = {.format = "int4"}});
  });
  EXPECT_NE(m.find("weights: got 'int4', expected one of bf16"), std::string::npos) << m;
}

// ---- F16Linear / F32Linear against fp64 ------------------------------------------------------

// |y - sum_k x_k w_k| <= gamma_K * sum_k |x_k w_k| with gamma_K = K u / (1 - K u), u = 2^-24: every
// product is exact in f32 (f16 and f32 weights times f32 activations round once per FMA), and any
// order of K - 1 additions and FMAs stays within the classical bound (Higham, Accuracy and Stability
// of Numerical Algorithms, eq. 3.5); accumulate adds one more term (y's previous value).
void check_against_fp64(const Linear& lin, const std::vector<float>& w, int64_t M, int threads, bool accumulate) {
  const int64_t N = lin.out_features(), K = lin.in_features();
  std::mt19937 rng(static_cast<uint32_t>(N * 131 + K * 7 + M));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t ldx = K + 3, ldy = N + 5;  // row strides past the row: the kernels must honour them
  std::vector<float> x(static_cast<size_t>(M * ldx)), y(static_cast<size_t>(M * ldy));
  for (float& v : x) v = u(rng);
  for (float& v : y) v = u(rng);
  const std::vector<float> y0 = y;
  lin.forward(Engine::default_engine(), x.data(), ldx, y.data(), ldy, M, threads, accumulate, LinearPrecision::kExact);
  const double unit = std::ldexp(1.0, -24), gamma = (K + 1) * unit / (1 - (K + 1) * unit);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = accumulate ? y0[static_cast<size_t>(m * ldy + n)] : 0.0;
      double mag = std::abs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x[static_cast<size_t>(m * ldx + k)]) * w[static_cast<size_t>(n * K + k)];
        ref += p;
        mag += std::abs(p);
      }
      ASSERT_LE(std::abs(y[static_cast<size_t>(m * ldy + n)] - ref), gamma * mag)
          << lin.name() << " M=" << M << " N=" << N << " K=" << K << " m=" << m << " n=" << n;
    }
    for (int64_t n = N; n < ldy; ++n)  // past the row: untouched
      ASSERT_EQ(y[static_cast<size_t>(m * ldy + n)], y0[static_cast<size_t>(m * ldy + n)]);
  }
}

// Weights whose f16 values cover normals, subnormals (|w| < 2^-14), signed zeros and the largest
// finite magnitudes a row can hold without the fp64 reference mattering.
std::vector<uint16_t> random_f16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (auto& v : h) {
    const uint32_t r = rng();
    switch (r % 8) {
      case 0: v = static_cast<uint16_t>(r >> 16 & 0x83ffu); break;  // subnormal or zero
      case 1: v = static_cast<uint16_t>((r >> 16 & 0x8000u) | 0x7bffu); break;  // +-65504
      default: v = f32_to_f16(std::uniform_real_distribution<float>(-2.f, 2.f)(rng)); break;
    }
  }
  return h;
}

TEST(FloatLinear, F16AndF32AgainstFp64AtOddShapesAndEveryRowCount) {
  for (const int64_t K : {1, 7, 16, 31, 33, 100, 257, 1029})
    for (const int64_t N : {1, 5, 67, 130}) {
      const std::vector<uint16_t> h = random_f16(N * K, static_cast<uint32_t>(N * 1000 + K));
      std::vector<float> w(h.size());
      for (size_t i = 0; i < h.size(); ++i) w[i] = f16_to_f32(h[i]);
      const F16Linear f16(TensorView::contiguous(const_cast<uint16_t*>(h.data()), DType::F16, {N, K}), "test.f16");
      const F32Linear f32(TensorView::contiguous(w.data(), DType::F32, {N, K}), "test.f32");
      EXPECT_EQ(f16.bytes(), static_cast<size_t>(N * K) * 2);
      for (const int64_t M : {1, 2, 3, 15, 16, 17, 40})
        for (const int threads : {1, 2})
          for (const bool acc : {false, true}) {
            check_against_fp64(f16, w, M, threads, acc);
            check_against_fp64(f32, w, M, threads, acc);
          }
    }
}

// The f16 kernels are the f32 kernels with a widening load: on the same values they give the same
// bits, for any thread count (the outputs do not depend on how the columns are split).
TEST(FloatLinear, F16IsBitEqualToF32OnTheSameValuesForAnyThreadCount) {
  const int64_t N = 203, K = 515;
  const std::vector<uint16_t> h = random_f16(N * K, 99);
  std::vector<float> w(h.size());
  for (size_t i = 0; i < h.size(); ++i) w[i] = f16_to_f32(h[i]);
  const F16Linear f16(TensorView::contiguous(const_cast<uint16_t*>(h.data()), DType::F16, {N, K}), "a");
  const F32Linear f32(TensorView::contiguous(w.data(), DType::F32, {N, K}), "b");
  for (const int64_t M : {1, 5, 16, 33}) {
    std::vector<float> x(static_cast<size_t>(M * K));
    std::mt19937 rng(static_cast<uint32_t>(M));
    for (float& v : x) v = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);
    std::vector<float> a(static_cast<size_t>(M * N)), b(a.size()), c(a.size());
    f16.forward(Engine::default_engine(), x.data(), K, a.data(), N, M, 1, false, LinearPrecision::kExact);
    f16.forward(Engine::default_engine(), x.data(), K, b.data(), N, M, 2, false, LinearPrecision::kExact);
    f32.forward(Engine::default_engine(), x.data(), K, c.data(), N, M, 2, false, LinearPrecision::kExact);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "M=" << M;
    ASSERT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << "M=" << M;
  }
}

TEST(FloatLinear, RefusesWhatF16CannotHoldNamingTheWeightAndElement) {
  std::vector<uint16_t> h(6, f32_to_f16(1.f));
  h[4] = 0x7c00;  // +inf
  const std::string e = testing::error_of(
      [&] { F16Linear(TensorView::contiguous(h.data(), DType::F16, {2, 3}), "layer.w"); });
  EXPECT_NE(e.find("layer.w: weight [1, 1] is infinite"), std::string::npos) << e;
  std::vector<float> big = {1.f, 70000.f};
  const std::string r = testing::error_of(
      [&] { F16Linear::converted(TensorView::contiguous(big.data(), DType::F32, {1, 2}), "layer.v"); });
  EXPECT_NE(r.find("layer.v: weight [0, 1] = 70000"), std::string::npos) << r;
  EXPECT_NE(r.find("beyond f16's range"), std::string::npos) << r;
  std::vector<uint16_t> bf(4);
  const std::string d = testing::error_of(
      [&] { F16Linear(TensorView::contiguous(bf.data(), DType::BF16, {2, 2}), "layer.u"); });
  EXPECT_NE(d.find("layer.u: expected a contiguous 2-D F16 weight"), std::string::npos) << d;
}

// An f16 checkpoint's projections stay f16 in memory (F16Linear over the mapped rows), stacked
// ones too; f32 ones run F32Linear (a copy, as before).
TEST(FloatLinear, F16ProjectionsStayF16) {
  const int64_t K = 40;
  std::map<std::string, std::vector<uint16_t>> store = {{"a", random_f16(3 * K, 1)}, {"b", random_f16(5 * K, 2)}};
  std::vector<ByteBuffer> owned;
  model::WeightReader w;
  w.get = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return TensorView::contiguous(store.at(name).data(), DType::F16, shape);
  };
  w.has = [&](const std::string& name) { return store.count(name) > 0; };
  w.owned = &owned;
  const model::Projection one = w.projection("a", 3, K);
  ASSERT_NE(one.linear(), nullptr);
  EXPECT_EQ(one.linear()->format(), WeightFormat::kF16);
  EXPECT_EQ(static_cast<const F16Linear*>(one.linear())->data(), store.at("a").data());  // not copied
  const model::Projection both = w.stacked({{"a", 3}, {"b", 5}}, K);
  ASSERT_NE(both.linear(), nullptr);
  EXPECT_EQ(both.linear()->format(), WeightFormat::kF16);
  EXPECT_EQ(both.linear()->bytes(), static_cast<size_t>(8 * K) * 2);
}

// ---- the refactor changed no result ---------------------------------------------------------

uint64_t fnv1a64(const void* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  return h;
}

TEST(WeightFormatRefactor, LogitsBitEqualToThoseRecordedBeforeIt) {
  const std::filesystem::path tests = testing::golden_dir().parent_path();
  std::ifstream in(testing::golden_dir() / "weight_formats_logits.json");
  const nlohmann::json rec = nlohmann::json::parse(in);
#ifndef NDEBUG
  // The hashes are of the release build's logits (-O3): an unoptimized build (the ASan + UBSan
  // preset) compiles the plain C++ between the SIMD kernels differently, and rounds differently.
  GTEST_SKIP() << "logits recorded from the release build; this build is not optimized";
#endif
  const std::string target = isa_selection().target;
  if (!rec["fnv1a64"].contains(target))
    GTEST_SKIP() << "no logits recorded for kernel target " << target << " (recorded: AVX2, SCALAR)";
  // The GGUF cases were recorded on the f32-tile prefill (the integer prefill GEMM came later and
  // rounds the activations to int8; tests/test_linear_gguf.cpp and test_gguf_model.cpp bound it).
  struct F32Prefill {
    F32Prefill() { setenv("HANPU_GGUF_PREFILL", "f32", 1); }
    ~F32Prefill() { unsetenv("HANPU_GGUF_PREFILL"); }
  } f32_prefill;
  const std::vector<int32_t> ids = rec["prompt_ids"].get<std::vector<int32_t>>();
  const auto& cases = rec["cases"];
  const auto& want = rec["fnv1a64"][target];
  ASSERT_EQ(cases.size(), want.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string model = cases[i]["model"], weights = cases[i]["weights"], prec = cases[i]["precision"];
    SCOPED_TRACE(model + " --weights " + weights + " --precision " + prec);
    const HybridModel m = HybridModel::load((tests / model).string(), {.weights = {.format = weights}});
    HybridState st = m.new_state();
    const Tensor logits =
        m.forward(st, ids, {.threads = 2, .all_logits = true, .precision = linear_precision_from_name(prec)});
    char got[17];
    std::snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(fnv1a64(logits.data(), logits.bytes())));
    EXPECT_EQ(std::string(got), want[i].get<std::string>());
  }
}

}  // namespace
}  // namespace hanpu
