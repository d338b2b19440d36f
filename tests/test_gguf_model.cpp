// GGUF checkpoints run as hanpu models (model/gguf_arch.hpp, issue 34): the tiny Qwen3.5 golden
// converted by llama.cpp's own convert_hf_to_gguf.py (tools/make_gguf_model_fixtures.py, files in
// tests/data/gguf):
//   - F16: logits at every position and the greedy continuation against transformers' (the
//     golden's weights are bf16, which f16 holds exactly here, so the bound is the float32 one of
//     the safetensors tests, NMSE 1e-8);
//   - Q8_0: a whole-sequence prefill (weights dequantized exactly, f32 activations) against
//     transformers in float64 on the Q8_0-rounded weights, NMSE 1e-8; decode steps (llama.cpp's
//     int8 activations in the GEMV) against the same reference within the activation rounding;
//   - the metadata mapped onto the same ModelConfig as config.json gives;
//   - refusals that name the key or tensor: an architecture hanpu does not map, a missing key, a
//     missing tensor, a tensor of the wrong shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hanpu/model.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/gguf.hpp"
#include "io/gguf_writer.hpp"
#include "io/safetensors.hpp"
#include "model/gguf_arch.hpp"
#include "model/gguf_export.hpp"
#include "model/tokenizer_bpe.hpp"
#include "model_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;
using testing::nmse;

// Sets HANPU_GGUF_PREFILL for a scope (GgufLinear reads it on every call): "f32" pins the prefill to
// the exact f32 tiles, which the mapping tests below need (their bounds are f32 summation order);
// "int" the integer prefill GEMM (int8 activations, the decode steps' arithmetic).
struct PrefillPath {
  explicit PrefillPath(const char* v) { setenv("HANPU_GGUF_PREFILL", v, 1); }
  ~PrefillPath() { unsetenv("HANPU_GGUF_PREFILL"); }
};
using testing::TempDir;

fs::path data_dir() { return testing::golden_dir().parent_path() / "data" / "gguf"; }
fs::path tiny_dir() { return testing::golden_dir() / "qwen35_tiny"; }

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// A copy of `src` with the first occurrence of `from` replaced by `to` (same length: the file's
// offsets stay valid).
fs::path patched(const TempDir& tmp, const fs::path& src, const std::string& from, const std::string& to) {
  EXPECT_EQ(from.size(), to.size());
  std::string b = read_bytes(src);
  const size_t at = b.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) b.replace(at, from.size(), to);
  const fs::path out = tmp.path() / "patched.gguf";
  write_bytes(out, b);
  return out;
}

std::string load_error(const fs::path& p) {
  try {
    HybridModel::load(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GgufModel, F16MatchesTransformersAtEveryPositionAndGreedy) {
  const HybridModel m = HybridModel::load((data_dir() / "qwen35_tiny-f16.gguf").string());
  const testing::Expected e = testing::load_expected(tiny_dir());
  testing::expect_logits_match_at_every_position(m, e);
  testing::expect_greedy_decode_matches(m, e);
}

TEST(GgufModel, Qwen35MoeF16MatchesTransformersAtEveryPositionAndGreedy) {
  // Arch qwen35moe: the experts are slices of ffn_{gate,up,down}_exps, the shared expert and its
  // gate ffn_*_shexp / ffn_gate_inp_shexp.
  const HybridModel m = HybridModel::load((data_dir() / "qwen35moe_tiny-f16.gguf").string());
  EXPECT_EQ(m.config().moe.num_experts, 8);
  EXPECT_EQ(m.config().model_type, "qwen3_5_moe_text");
  const testing::Expected e = testing::load_expected(testing::golden_dir() / "qwen35moe_tiny");
  testing::expect_logits_match_at_every_position(m, e);
  testing::expect_greedy_decode_matches(m, e);
}

TEST(GgufModel, ConfigEqualsTheSafetensorsOne) {
  const HybridModel g = HybridModel::load((data_dir() / "qwen35_tiny-f16.gguf").string());
  const HybridModel s = HybridModel::load(tiny_dir().string());
  const ModelConfig &a = g.config(), &b = s.config();
  EXPECT_EQ(a.describe(), b.describe());
  EXPECT_EQ(a.is_full_attention, b.is_full_attention);
  EXPECT_EQ(a.attention.rotary_dim, b.attention.rotary_dim);
  EXPECT_DOUBLE_EQ(a.attention.rope_theta, b.attention.rope_theta);
  EXPECT_EQ(static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));  // stored as f32 in GGUF
  EXPECT_EQ(a.gdn.num_key_heads, b.gdn.num_key_heads);
  EXPECT_EQ(a.gdn.num_value_heads, b.gdn.num_value_heads);  // 4 > 2: the converter's value-head reorder is undone
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
}

class GgufQ8 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new HybridModel(HybridModel::load((data_dir() / "qwen35_tiny-q8_0.gguf").string()));
    SafetensorsFile f = SafetensorsFile::open((data_dir() / "qwen35_tiny-q8_0.expected.safetensors").string());
    ids_ = new std::vector<int32_t>(testing::ids_of(f.load_copy("ids")));
    const Tensor l = f.load_copy("logits");  // F64
    ref_ = new std::vector<float>(static_cast<size_t>(l.numel()));
    for (int64_t i = 0; i < l.numel(); ++i) (*ref_)[static_cast<size_t>(i)] = static_cast<float>(l.get(i));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ids_;
    delete ref_;
  }
  static HybridModel* model_;
  static std::vector<int32_t>* ids_;
  static std::vector<float>* ref_;
};
HybridModel* GgufQ8::model_ = nullptr;
std::vector<int32_t>* GgufQ8::ids_ = nullptr;
std::vector<float>* GgufQ8::ref_ = nullptr;

TEST_F(GgufQ8, PrefillMatchesFloat64OfTheDequantizedWeights) {
  const PrefillPath f32("f32");
  const int64_t V = model_->config().vocab_size;
  for (int threads : {1, 2}) {
    Tensor got = testing::all_logits(*model_, *ids_, threads);
    ASSERT_EQ(got.numel(), static_cast<int64_t>(ref_->size()));
    double worst = 0;
    for (size_t t = 0; t < ids_->size(); ++t)
      worst = std::max(worst, nmse(got.ptr<float>() + t * V, ref_->data() + t * V, V));
    EXPECT_LE(worst, 1e-8) << "threads " << threads;
    std::printf("Q8_0 prefill, threads %d: worst position NMSE vs float64 %.3g\n", threads, worst);
  }
}

// The integer prefill (int8 activations per 32, the decode steps' arithmetic, on every row of the
// prompt): the decode test's bounds against float64 (5e-2 per position, 5e-3 on the mean), and the
// NMSE against the f32-tile prefill reported. Where the CPU has no integer form it is the f32 path.
TEST_F(GgufQ8, IntegerPrefillWithinTheActivationRounding) {
  const int64_t V = model_->config().vocab_size;
  Tensor exact, integer;
  {
    const PrefillPath f32("f32");
    exact = testing::all_logits(*model_, *ids_, 2);
  }
  {
    const PrefillPath in("int");
    integer = testing::all_logits(*model_, *ids_, 2);
  }
  double worst = 0, sum = 0, worst_vs_f32 = 0, sum_vs_f32 = 0;
  for (size_t t = 0; t < ids_->size(); ++t) {
    const double err = nmse(integer.ptr<float>() + t * V, ref_->data() + t * V, V);
    const double d = nmse(integer.ptr<float>() + t * V, exact.ptr<float>() + t * V, V);
    worst = std::max(worst, err);
    sum += err;
    worst_vs_f32 = std::max(worst_vs_f32, d);
    sum_vs_f32 += d;
    EXPECT_LE(err, 5e-2) << "position " << t;
  }
  const double n = static_cast<double>(ids_->size());
  EXPECT_LE(sum / n, 5e-3);
  std::printf("Q8_0 integer prefill: mean / worst position NMSE vs float64 %.3g / %.3g, vs the f32 tiles %.3g / %.3g\n",
              sum / n, worst, sum_vs_f32 / n, worst_vs_f32);
}

TEST_F(GgufQ8, DecodeStepsWithinTheActivationRounding) {
  // Decode rows run llama.cpp's arithmetic: activations rounded to int8 per block of 32 (error up
  // to 1/254 of the block's largest value per element, NMSE ~3e-5..4e-4 per projection input for
  // these activations), carried through 4 layers of a random model that amplifies input noise ~40x
  // (the Q8_0 rounding of the weights alone, similar per element, moves its logits by NMSE 1.3e-3
  // from the unquantized golden's). Measured here: worst step 1.2e-2, mean 1.3e-3; the same steps with
  // the prefill path (f32 activations) give 4e-11, so the difference is the activation rounding.
  // Bounds 5e-2 per step and 5e-3 on the mean; a wrong block, scale or mapped row gives NMSE ~1.
  const int64_t V = model_->config().vocab_size, T0 = 40;
  HybridState st = model_->new_state();
  model_->forward(st, std::span(*ids_).first(T0), {.threads = 2});
  double worst = 0, sum = 0;
  int steps = 0;
  for (size_t t = T0; t < ids_->size(); ++t) {
    Tensor step = model_->forward(st, std::span(*ids_).subspan(t, 1), {.threads = 2});
    const double err = nmse(step.ptr<float>(), ref_->data() + t * V, V);
    worst = std::max(worst, err);
    sum += err;
    ++steps;
    EXPECT_LE(err, 5e-2) << "token " << t;
  }
  EXPECT_LE(sum / steps, 5e-3);
  std::printf("Q8_0 decode: mean step NMSE vs float64 %.3g\n", sum / steps);
  std::printf("Q8_0 decode: worst step NMSE vs float64 %.3g\n", worst);
}

TEST(GgufModel, TokenizerFromGgufKeysEncodesAsTokenizerJson) {
  // The converter wrote tokenizer.ggml.* from the golden's tokenizer.json; read back they must
  // tokenize exactly as it does (special tokens, merges, bytes outside the vocabulary's words).
  const Tokenizer g = Tokenizer::from_dir((data_dir() / "qwen35_tiny-f16.gguf").string());
  const Tokenizer h = Tokenizer::from_dir(tiny_dir().string());
  EXPECT_EQ(g.vocab_size(), h.vocab_size());
  for (const std::string text : {std::string("Hello world, this is a test."), std::string("<|im_start|>user\nhi<|im_end|>\n"),
                                 std::string("  spaces\t\ttabs\n\nnewlines 12345 caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd"),
                                 std::string("\xff\xfe invalid bytes"), std::string("")}) {
    EXPECT_EQ(g.encode(text), h.encode(text)) << text;
    EXPECT_EQ(g.encode(text, false), h.encode(text, false)) << text;
    EXPECT_EQ(g.decode(g.encode(text)), text);
  }
  for (int32_t id = 0; id < h.vocab_size(); ++id) {
    EXPECT_EQ(g.token_bytes(id), h.token_bytes(id)) << id;
    EXPECT_EQ(g.is_special(id), h.is_special(id)) << id;
  }
  ASSERT_TRUE(g.eos_token_id().has_value());
  EXPECT_EQ(g.eos_token_id(), h.eos_token_id());
}

TEST(GgufModel, RefusesWhatItCannotRunByName) {
  TempDir tmp;
  const fs::path src = data_dir() / "qwen35_tiny-q8_0.gguf";
  // An architecture not in the table.
  std::string err = load_error(patched(tmp, src, std::string("\x06\0\0\0\0\0\0\0qwen35", 14), std::string("\x06\0\0\0\0\0\0\0llama9", 14)));
  EXPECT_NE(err.find("general.architecture"), std::string::npos) << err;
  EXPECT_NE(err.find("'llama9'"), std::string::npos) << err;
  EXPECT_NE(err.find("qwen35"), std::string::npos) << err;  // the supported list
  // A missing metadata key.
  err = load_error(patched(tmp, src, "qwen35.ssm.group_count", "qwen35.ssm.group_couXX"));
  EXPECT_NE(err.find("qwen35.ssm.group_count"), std::string::npos) << err;
  // A missing tensor: named in the file's and in hanpu's terms.
  err = load_error(patched(tmp, src, "blk.1.ssm_a", "blk.1.ssm_X"));
  EXPECT_NE(err.find("'blk.1.ssm_a'"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.1.linear_attn.A_log"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  // Metadata that disagrees with a tensor's shape (feed_forward_length 96 -> 95 is caught as a shape).
  std::string b = read_bytes(src);
  const std::string key = "qwen35.feed_forward_length";
  const size_t at = b.find(key);
  ASSERT_NE(at, std::string::npos);
  uint32_t v = 0;
  std::memcpy(&v, b.data() + at + key.size() + 4, 4);
  ASSERT_EQ(v, 96u);
  v = 95;
  std::memcpy(b.data() + at + key.size() + 4, &v, 4);
  write_bytes(tmp.path() / "ffn.gguf", b);
  err = load_error(tmp.path() / "ffn.gguf");
  EXPECT_NE(err.find("ffn_"), std::string::npos) << err;
  EXPECT_NE(err.find("95"), std::string::npos) << err;
}


// ---- The other families' GGUF architectures: qwen3next, kimi-linear, bailingmoe3 ------------------
// Fixtures written by tools/make_gguf_arch_fixtures.py (PyPI gguf) from the tiny goldens, doing what
// llama.cpp's converters do to each tensor (docstring there). Each family's registry row names its
// architecture and points at its mapping; nothing else lists them.

namespace arch {

struct Family {
  const char* golden;  // tests/golden/<golden>, fixtures tests/data/gguf/<golden>-{f16,q8_0}.gguf
  const char* arch;
};
const Family kFamilies[] = {{"qwen3next_tiny", "qwen3next"}, {"kimi_linear_tiny", "kimi-linear"},
                            {"bailing_hybrid_tiny", "bailingmoe3"}};

fs::path fixture(const Family& f, const char* type) { return data_dir() / (std::string(f.golden) + "-" + type + ".gguf"); }

// A copy of the GGUF file `src` with every block-quantized tensor (Q8_0, Q5_0, ...) replaced by its exact dequantization in F32
// (gguf::dequantize, tested bit-exact against gguf-py), all else as it is: the same weights in a
// format that runs through the f32 path.
fs::path dequantized_copy(const TempDir& tmp, const fs::path& src) {
  const GgufFile f = GgufFile::open(src.string());
  GgufWriter w;
  for (const auto& [key, v] : f.metadata()) {
    const auto* arr = std::get_if<std::vector<GgufValue>>(&v.value);
    switch (v.type) {
      case GgufType::U32: w.add_u32(key, static_cast<uint32_t>(std::get<uint64_t>(v.value))); break;
      case GgufType::I32: w.add_i32(key, static_cast<int32_t>(std::get<int64_t>(v.value))); break;
      case GgufType::F32: w.add_f32(key, static_cast<float>(std::get<double>(v.value))); break;
      case GgufType::BOOL: w.add_bool(key, std::get<bool>(v.value)); break;
      case GgufType::STRING: w.add_string(key, std::get<std::string>(v.value)); break;
      case GgufType::ARRAY:
        if (v.elem_type == GgufType::BOOL) {  // qwen3next.attention.recurrent_layers
          std::vector<bool> bools;
          for (const GgufValue& e : *arr) bools.push_back(std::get<bool>(e.value));
          w.add_bools(key, bools);
        } else if (v.elem_type == GgufType::STRING) {  // tokenizer.ggml.tokens / merges (llama-quantize's files)
          std::vector<std::string> strings;
          for (const GgufValue& e : *arr) strings.push_back(std::get<std::string>(e.value));
          w.add_strings(key, strings);
        } else {  // head_count_kv per layer, token_type, rope.dimension_sections
          std::vector<int32_t> ints;
          EXPECT_EQ(v.elem_type, GgufType::I32) << key;
          for (const GgufValue& e : *arr) ints.push_back(static_cast<int32_t>(std::get<int64_t>(e.value)));
          w.add_i32s(key, ints);
        }
        break;
      default: ADD_FAILURE() << "metadata type of " << key << " not copied: " << v.describe();
    }
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::vector<int64_t> dims(t.dims, t.dims + t.n_dims);
    std::vector<uint8_t> bytes;
    if (gguf::block_format(t.type).block_elems > 1) {  // every block format (Q8_0, Q5_0, ...)
      bytes.resize(static_cast<size_t>(t.numel()) * sizeof(float));
      gguf::dequantize(t.type, t.data, reinterpret_cast<float*>(bytes.data()), t.numel());
      w.add_tensor(t.name, gguf::GgmlType::F32, dims, std::move(bytes));
    } else {
      const auto* b = reinterpret_cast<const uint8_t*>(t.data);
      w.add_tensor(t.name, t.type, dims, std::vector<uint8_t>(b, b + t.bytes));
    }
  }
  const fs::path out = tmp.path() / (src.stem().string() + "-dequantized.gguf");
  w.write(out.string());
  return out;
}

int count_type(const fs::path& p, gguf::GgmlType type) {
  int n = 0;
  // The file named: a range-for over a temporary's member would read it after it is gone.
  const GgufFile file = GgufFile::open(p.string());
  for (const GgufTensorInfo& t : file.tensors()) n += t.type == type;
  return n;
}

}  // namespace arch

TEST(GgufArch, RegistryIsTheListOfArchitectures) {
  std::vector<std::string> want;
  for (const ModelFamily* f : model_families())
    if (!f->gguf_architecture.empty()) {
      EXPECT_NE(f->gguf_mapping, nullptr) << f->name;
      want.push_back(f->gguf_architecture);
      EXPECT_EQ(model::gguf_mapping(f->gguf_architecture), f->gguf_mapping);
    }
  EXPECT_EQ(model::gguf_supported_archs(), want);
  EXPECT_EQ(want, (std::vector<std::string>{"qwen35", "qwen3next", "qwen35moe", "kimi-linear", "bailingmoe3"}));
  EXPECT_EQ(model::gguf_mapping("bailingmoe2"), nullptr);
}

// F16 holds every bf16 weight of the goldens exactly (8 significant bits, exponents well inside
// f16's normal range here; the norm offsets +1 and -1 and A_log through -exp / log are done in f32:
// the +-1 exactly, exp/log within an ulp or two), so the GGUF model is the golden's model: its
// logits meet the safetensors tests' bound against transformers (NMSE 1e-8 at every position, on 1
// and 2 threads), the greedy continuation is the same token by token, and against hanpu's own
// safetensors path of the golden (same runtime, same weight values) the logits differ only by f32
// rounding: the bf16 weights run Bf16Linear, the F16 ones are widened to f32 and run the f32 path,
// which sum in another order (relative ~1e-7 per dot product), plus A_log's ulp through -exp/log;
// carried through 4-5 layers of a random model that amplifies input noise ~40x (GgufQ8), that is
// ~1e-6 of the logits' range (measured 1.4e-6 to 3.4e-6 of it on AVX2). Where Bf16Linear runs on AMX
// (linear_amx.cpp) each f32 activation is three bf16 terms whose products are accumulated one after
// the other: three f32 roundings per multiply-add instead of one, and 1.7e-6 to 2.4e-6 of the range
// here, 1.0e-5 for qwen35moe through `hanpu run` (tests/python/test_gguf_export_arch.py; Xeon with
// AMX, 2026-12-05). Bound 3e-5 of the range: the AVX2 bound of 1e-5 for each of the three roundings;
// a wrong row, head or transform gives ~0.5-1.
TEST(GgufArch, F16EqualsTheSafetensorsModel) {
  for (const arch::Family& fam : arch::kFamilies) {
    SCOPED_TRACE(fam.arch);
    const fs::path golden = testing::golden_dir() / fam.golden;
    const HybridModel g = HybridModel::load(arch::fixture(fam, "f16").string());
    const HybridModel s = HybridModel::load(golden.string());
    EXPECT_EQ(g.config().describe(), s.config().describe());
    EXPECT_EQ(g.config().is_full_attention, s.config().is_full_attention);
    EXPECT_EQ(g.config().is_moe, s.config().is_moe);
    const testing::Expected e = testing::load_expected(golden);
    testing::expect_logits_match_at_every_position(g, e);
    testing::expect_greedy_decode_matches(g, e);
    const std::vector<int32_t> ids = e.full_sequence();
    const Tensor a = testing::all_logits(g, ids, 2), b = testing::all_logits(s, ids, 2);
    ASSERT_EQ(a.shape(), b.shape());
    float diff = 0, range = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      diff = std::max(diff, std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]));
      range = std::max(range, std::abs(b.ptr<float>()[i]));
    }
    EXPECT_LE(diff, 3e-5f * range);
    std::printf("%s f16: max |logit - safetensors path| %.3g (logits up to %.3g)\n", fam.arch, diff, range);
  }
}

// A whole-sequence prefill of a quantized file `q` against the same file dequantized to F32 (`d`):
// the worst and the median NMSE over the positions, and (checked here) the same argmax at every
// position.
struct PrefillNmse {
  double worst, median;
};
PrefillNmse prefill_nmse_against_dequantized(const HybridModel& q, const HybridModel& d,
                                             const std::vector<int32_t>& ids, int threads) {
  const int64_t V = q.config().vocab_size;
  const Tensor a = testing::all_logits(q, ids, threads), b = testing::all_logits(d, ids, threads);
  std::vector<double> per_position;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* pa = a.ptr<float>() + t * V;
    const float* pb = b.ptr<float>() + t * V;
    per_position.push_back(nmse(pa, pb, V));
    EXPECT_EQ(std::max_element(pa, pa + V) - pa, std::max_element(pb, pb + V) - pb) << "position " << t;
  }
  std::sort(per_position.begin(), per_position.end());
  return {per_position.back(), per_position[per_position.size() / 2]};
}

// The quantized fixture: Q8_0 wherever a row is whole blocks (the converter's rule; the rest F16 or
// F32), checked against the same file with its Q8_0 tensors dequantized to F32: the same weights,
// so a whole-sequence prefill on the f32 tiles (exact dequantized weights, f32 activations) gives the
// same logits up to f32 summation order (bound NMSE 1e-10 at every position) and the same argmax
// everywhere. (Decode steps use llama.cpp's int8 activations; their bound is the one of
// GgufQ8.DecodeStepsWithinTheActivationRounding, the same kernels.)
TEST(GgufArch, Q8_0EqualsItsDequantizedWeights) {
  const PrefillPath f32("f32");  // the exact path (the integer one: GgufQ8.IntegerPrefillWithinTheActivationRounding)
  for (const arch::Family& fam : arch::kFamilies) {
    SCOPED_TRACE(fam.arch);
    TempDir tmp;
    const fs::path q8 = arch::fixture(fam, "q8_0");
    EXPECT_GE(arch::count_type(q8, gguf::GgmlType::Q8_0), 10);
    const HybridModel q = HybridModel::load(q8.string());
    const HybridModel d = HybridModel::load(arch::dequantized_copy(tmp, q8).string());
    const std::vector<int32_t> ids = testing::load_expected(testing::golden_dir() / fam.golden).full_sequence();
    for (int threads : {1, 2}) {
      const double worst = prefill_nmse_against_dequantized(q, d, ids, threads).worst;
      EXPECT_LE(worst, 1e-10) << "threads " << threads;
      std::printf("%s q8_0 prefill, threads %d: worst position NMSE vs dequantized F32 %.3g\n", fam.arch, threads, worst);
    }
  }
}

// llama-quantize's own files of the tiny golden (tools/make_gguf_fallback_fixtures.py): its rows are
// 64-128 wide, never whole 256-blocks, so Q4_K_M and Q5_K_M fall back to Q5_0 / Q5_1 (and Q8_0) and
// IQ4_XS to IQ4_NL, as they do in users' files of models with such rows; Q4_0 and Q4_1 are quantized
// as asked. Each is
// checked against the same file with its quantized tensors dequantized to F32 (the same weights;
// hanpu's f32 path on them meets transformers in float64 at NMSE ~1e-11, GgufModel above):
//   - a whole-sequence prefill on the f32 tiles: f32 summation order only, NMSE 1e-10 at every
//     position (1e-9 for the IQ4_NL file: at its positions 67 and 27 the logits nearly cancel, and the
//     kernels' summation order shows: 1.1e-10 with the AVX2 kernels, 4.1e-10 with the AVX-512 ones
//     (the same file on one Xeon, HANPU_ISA=avx2 against native, 2026-12-05), the same with 1 and 2
//     threads, while its median position, 5.2e-13..5.9e-13, is the others' 4.1e-13..6.6e-13; a wrong
//     level or scale gives 1e-6 or more), 1e-11 at the median position, and the same argmax;
//   - decode steps (the GEMV of linear_gguf_small_blocks.cpp, activations rounded to int8 per 32 as
//     llama.cpp's): within GgufQ8.DecodeStepsWithinTheActivationRounding's bounds for the same
//     rounding (5e-2 per step, 5e-3 on the mean; a wrong block, bit or offset gives NMSE ~1).
TEST(GgufSmallBlocks, LlamaQuantizeFilesEqualTheirDequantizedWeights) {
  const PrefillPath f32("f32");
  const struct {
    const char* name;
    gguf::GgmlType type;
    double worst_position;
  } files[] = {{"q4_k_m", gguf::GgmlType::Q5_0, 1e-10},
               {"q5_k_m", gguf::GgmlType::Q5_1, 1e-10},
               {"q4_0", gguf::GgmlType::Q4_0, 1e-10},
               {"q4_1", gguf::GgmlType::Q4_1, 1e-10},
               {"iq4_xs", gguf::GgmlType::IQ4_NL, 1e-9}};
  const std::vector<int32_t> ids = testing::load_expected(tiny_dir()).full_sequence();
  for (const auto& f : files) {
    SCOPED_TRACE(f.name);
    TempDir tmp;
    const fs::path file = data_dir() / (std::string("qwen35_tiny-") + f.name + ".gguf");
    EXPECT_GE(arch::count_type(file, f.type), 28);
    const HybridModel q = HybridModel::load(file.string());
    const HybridModel d = HybridModel::load(arch::dequantized_copy(tmp, file).string());
    const int64_t V = q.config().vocab_size;
    for (int threads : {1, 2}) {
      const PrefillNmse e = prefill_nmse_against_dequantized(q, d, ids, threads);
      EXPECT_LE(e.worst, f.worst_position) << "threads " << threads;
      EXPECT_LE(e.median, 1e-11) << "threads " << threads;
      std::printf("%s prefill, threads %d: worst / median position NMSE vs dequantized F32 %.3g / %.3g\n", f.name,
                  threads, e.worst, e.median);
    }
    const size_t T0 = 40;
    HybridState sq = q.new_state(), sd = d.new_state();
    q.forward(sq, std::span(ids).first(T0), {.threads = 2});
    d.forward(sd, std::span(ids).first(T0), {.threads = 2});
    double worst = 0, sum = 0;
    int steps = 0;
    for (size_t t = T0; t < ids.size(); ++t) {
      const Tensor a = q.forward(sq, std::span(ids).subspan(t, 1), {.threads = 2});
      const Tensor b = d.forward(sd, std::span(ids).subspan(t, 1), {.threads = 2});
      const double err = nmse(a.ptr<float>(), b.ptr<float>(), V);
      worst = std::max(worst, err);
      sum += err;
      ++steps;
      EXPECT_LE(err, 5e-2) << "token " << t;
    }
    EXPECT_LE(sum / steps, 5e-3);
    std::printf("%s decode: mean / worst step NMSE vs dequantized F32 %.3g / %.3g\n", f.name, sum / steps, worst);
  }
}

// Every refusal names what it refuses: an architecture no family maps (listing those it reads),
// a missing key, a tensor the metadata gives another shape, a missing tensor of a split pair.
TEST(GgufArch, RefusalsNameTheKeyOrTensor) {
  TempDir tmp;
  using arch::fixture;
  const arch::Family& qn = arch::kFamilies[0];
  const arch::Family& kimi = arch::kFamilies[1];
  const arch::Family& ling = arch::kFamilies[2];
  // An architecture no family maps (llama.cpp's bailingmoe2 is another model).
  std::string err = load_error(patched(tmp, fixture(ling, "f16"), std::string("\x0b\0\0\0\0\0\0\0bailingmoe3", 19), std::string("\x0b\0\0\0\0\0\0\0bailingmoe2", 19)));
  EXPECT_NE(err.find("general.architecture"), std::string::npos) << err;
  EXPECT_NE(err.find("'bailingmoe2'"), std::string::npos) << err;
  EXPECT_NE(err.find("kimi-linear"), std::string::npos) << err;  // the supported list, from the registry
  // Missing keys, one per family.
  err = load_error(patched(tmp, fixture(kimi, "q8_0"), "kimi-linear.kda.head_dim", "kimi-linear.kda.head_diX"));
  EXPECT_NE(err.find("'kimi-linear.kda.head_dim'"), std::string::npos) << err;
  err = load_error(patched(tmp, fixture(ling, "q8_0"), "bailingmoe3.kda.gate_lower_bound", "bailingmoe3.kda.gate_lower_bounX"));
  EXPECT_NE(err.find("'bailingmoe3.kda.gate_lower_bound'"), std::string::npos) << err;
  err = load_error(patched(tmp, fixture(qn, "q8_0"), "qwen3next.ssm.time_step_rank", "qwen3next.ssm.time_step_ranX"));
  EXPECT_NE(err.find("'qwen3next.ssm.time_step_rank'"), std::string::npos) << err;
  err = load_error(patched(tmp, fixture(kimi, "f16"), "kimi-linear.attention.head_count_kv", "kimi-linear.attention.head_count_kX"));
  EXPECT_NE(err.find("'kimi-linear.attention.head_count_kv'"), std::string::npos) << err;
  // A router hanpu does not run (expert_gating_func 1, softmax).
  {
    std::string b = read_bytes(fixture(kimi, "f16"));
    const std::string key = "kimi-linear.expert_gating_func";
    const size_t at = b.find(key);
    ASSERT_NE(at, std::string::npos);
    uint32_t v = 0;
    std::memcpy(&v, b.data() + at + key.size() + 4, 4);
    ASSERT_EQ(v, 2u);
    v = 1;
    std::memcpy(b.data() + at + key.size() + 4, &v, 4);
    write_bytes(tmp.path() / "gating.gguf", b);
    err = load_error(tmp.path() / "gating.gguf");
    EXPECT_NE(err.find("'kimi-linear.expert_gating_func' is 1"), std::string::npos) << err;
  }
  // Wrong shapes: metadata that disagrees with the tensors names the tensor (kda.head_dim 24 -> 25;
  // Qwen3-Next's value heads 4 -> 2 makes ssm_ba, split by rows, the wrong size).
  auto with_u32 = [&](const fs::path& src, const std::string& key, uint32_t was, uint32_t now) {
    std::string b = read_bytes(src);
    const size_t at = b.find(key);
    EXPECT_NE(at, std::string::npos) << key;
    uint32_t v = 0;
    std::memcpy(&v, b.data() + at + key.size() + 4, 4);
    EXPECT_EQ(v, was) << key;
    std::memcpy(b.data() + at + key.size() + 4, &now, 4);
    const fs::path out = tmp.path() / "u32.gguf";
    write_bytes(out, b);
    return out;
  };
  err = load_error(with_u32(fixture(ling, "q8_0"), "bailingmoe3.kda.head_dim", 24, 25));
  EXPECT_NE(err.find("blk.0."), std::string::npos) << err;
  EXPECT_NE(err.find("has shape"), std::string::npos) << err;
  err = load_error(with_u32(fixture(qn, "q8_0"), "qwen3next.ssm.conv_kernel", 4, 3));
  EXPECT_NE(err.find("'blk.0.ssm_conv1d.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.0.linear_attn.conv1d.weight"), std::string::npos) << err;
  err = load_error(with_u32(fixture(kimi, "q8_0"), "kimi-linear.attention.value_length_mla", 20, 21));
  EXPECT_NE(err.find("'blk.2.attn_output.weight'"), std::string::npos) << err;  // the first MLA tensor v sizes
  EXPECT_NE(err.find("63"), std::string::npos) << err;                           // 3 heads x 21
  // Without attention.recurrent_layers, full_attention_interval gives the layers (llama.cpp's order).
  {
    const HybridModel m = HybridModel::load(
        patched(tmp, fixture(qn, "f16"), "qwen3next.attention.recurrent_layers", "qwen3next.attention.recurrent_layerX").string());
    EXPECT_EQ(m.config().is_full_attention, (std::vector<bool>{false, true, false, true}));
  }
  // Missing tensors: one half of the MLA kv_b pair, Qwen3-Next's fused ssm_ba.
  err = load_error(patched(tmp, fixture(kimi, "f16"), "blk.2.attn_v_b", "blk.2.attn_v_X"));
  EXPECT_NE(err.find("'blk.2.attn_v_b.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  err = load_error(patched(tmp, fixture(qn, "f16"), "blk.2.ssm_ba", "blk.2.ssm_bX"));
  EXPECT_NE(err.find("'blk.2.ssm_ba.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.2.linear_attn.in_proj_"), std::string::npos) << err;
}


// ---- Kimi's and Ling's tokenizers as tokenizer.ggml.* keys ------------------------------------------
// The GGUF writer's keys for a checkpoint's tokenizer (add_gguf_tokenizer_keys, what `hanpu
// quantize --format` writes), read back by Tokenizer::from_gguf, must tokenize as the Hugging Face
// side does: Kimi's tiktoken tokenizer (tests/data/kimi_tiktoken, ids from tiktoken) and a
// tokenizer in Ling's form (tests/data/ling_tokenizer, ids from Hugging Face tokenizers;
// tools/make_ling_tokenizer_golden.py), on every golden string, with special tokens parsed and
// read as text.

fs::path tokenizer_data(const char* name) { return testing::golden_dir().parent_path() / "data" / name; }

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(read_bytes(p)); }

// The checkpoint's tokenizer written as GGUF keys for ids 0..vocab_size-1, in a file of its own.
fs::path tokenizer_gguf(const TempDir& tmp, const fs::path& dir, int64_t vocab_size) {
  GgufWriter w;
  w.add_string("general.architecture", "kimi-linear");
  EXPECT_TRUE(add_gguf_tokenizer_keys(dir.string(), vocab_size, w));
  const fs::path out = tmp.path() / "tokenizer.gguf";
  w.write(out.string());
  return out;
}

void expect_golden_ids(const Tokenizer& t, const nlohmann::json& cases, const char* plain_key) {
  int failures = 0;
  for (const nlohmann::json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const bool ok = t.encode(text, true) == c.at("ids").get<std::vector<int32_t>>() &&
                    t.encode(text, false) == c.at(plain_key).get<std::vector<int32_t>>();
    if (!ok && ++failures <= 5) ADD_FAILURE() << "case " << c.at("name") << " differs";
  }
  EXPECT_EQ(failures, 0) << failures << " of " << cases.size() << " golden strings differ";
}

TEST(GgufTokenizer, KimiTiktokenRoundTripsWithTiktokensIds) {
  TempDir tmp;
  const nlohmann::json expected = read_json(tokenizer_data("kimi_tiktoken") / "expected.json");
  const Tokenizer h = Tokenizer::from_dir(tokenizer_data("kimi_tiktoken").string());
  const int64_t vocab = h.vocab_size() + 7;  // [PAD] ids after the special tokens, as a padded embedding has
  const fs::path file = tokenizer_gguf(tmp, tokenizer_data("kimi_tiktoken"), vocab);
  const GgufModel m = GgufModel::open(file.string());
  EXPECT_EQ(m.main().get_string("tokenizer.ggml.pre"), "kimi-k2");
  EXPECT_EQ(m.main().get_string("tokenizer.ggml.model"), "gpt2");
  const Tokenizer g = Tokenizer::from_gguf(file.string());
  expect_golden_ids(g, expected.at("cases"), "ids_specials_as_text");
  EXPECT_EQ(g.vocab_size(), h.vocab_size());  // the [PAD] ids are no tokens
  for (int32_t id = 0; id < h.vocab_size(); ++id) {
    EXPECT_EQ(g.token_bytes(id), h.token_bytes(id)) << id;
    EXPECT_EQ(g.is_special(id), h.is_special(id)) << id;
  }
  EXPECT_EQ(g.eos_token_id(), h.eos_token_id());
  ASSERT_TRUE(g.eos_token_id().has_value());
  EXPECT_EQ(m.main().get_uint("tokenizer.ggml.eos_token_id"), static_cast<uint64_t>(*h.eos_token_id()));
}

TEST(GgufTokenizer, KimiMergesAreTheConvertersRecovery) {
  // conversion/qwen.py QwenModel.bpe with max_rank on a hand-made vocabulary: "ab" merges from
  // a+b (its own rank is not below itself); "abc" from ab+c, not a+bc ("bc" ranks after "abc");
  // "abcd" from abc+d; "xyz" ends in three parts (no pair of it is a token) and gives no merge;
  // "aaa" merges the leftmost "aa" first.
  std::vector<std::string> ranks;
  for (int b = 0; b < 256; ++b) ranks.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"ab", "abc", "bc", "abcd", "xyz", "aa", "aaa"}) ranks.push_back(t);
  EXPECT_EQ(tok::tiktoken_merges(ranks), (std::vector<std::string>{"a b", "ab c", "b c", "abc d", "a a", "aa a"}));
  // Bytes outside printable ASCII are written in the byte-level spelling ("\n" is U+010A).
  ranks.push_back("\n\n");
  EXPECT_EQ(tok::tiktoken_merges(ranks).back(), "\xc4\x8a \xc4\x8a");
}

TEST(GgufTokenizer, LingRoundTripsWithTokenizersIds) {
  TempDir tmp;
  const fs::path dir = tokenizer_data("ling_tokenizer");
  const nlohmann::json expected = read_json(dir / "expected.json");
  const fs::path file = tokenizer_gguf(tmp, dir, expected.at("vocab_size").get<int64_t>());
  const GgufModel m = GgufModel::open(file.string());
  EXPECT_EQ(m.main().get_string("tokenizer.ggml.pre"), "bailingmoe2");
  const Tokenizer g = Tokenizer::from_gguf(file.string()), h = Tokenizer::from_dir(dir.string());
  expect_golden_ids(h, expected.at("cases"), "ids_no_special");  // hanpu's tokenizer.json path
  expect_golden_ids(g, expected.at("cases"), "ids_no_special");
  EXPECT_EQ(g.vocab_size(), h.vocab_size());
  for (int32_t id = 0; id < h.vocab_size(); ++id) {
    EXPECT_EQ(g.token_bytes(id), h.token_bytes(id)) << id;
    EXPECT_EQ(g.is_special(id), h.is_special(id)) << id;
  }
  EXPECT_EQ(g.eos_token_id(), h.eos_token_id());
  EXPECT_EQ(model::gguf_chat_template(m.main()), read_json(dir / "tokenizer_config.json").at("chat_template").get<std::string>());
}

TEST(GgufTokenizer, RefusesUnknownPreTokenizersAndMalformedKimiVocabularies) {
  TempDir tmp;
  const fs::path ling = tokenizer_gguf(tmp, tokenizer_data("ling_tokenizer"), 1006);
  // An unknown name: the key, the value and the names hanpu knows.
  const auto error_of = [](const fs::path& p) -> std::string {
    try {
      (void)Tokenizer::from_gguf(p.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string err = error_of(patched(tmp, ling, "bailingmoe2", "bailingmoeX"));
  EXPECT_NE(err.find("tokenizer.ggml.pre"), std::string::npos) << err;
  EXPECT_NE(err.find("'bailingmoeX'"), std::string::npos) << err;
  EXPECT_NE(err.find("kimi-k2"), std::string::npos) << err;
  // A kimi-k2 vocabulary whose first single byte is spelt outside the byte-level alphabet.
  const fs::path kimi = tmp.path() / "kimi.gguf";
  fs::rename(tokenizer_gguf(tmp, tokenizer_data("kimi_tiktoken"), 3009), kimi);
  std::string bytes = read_bytes(kimi);
  const size_t at = bytes.find("tokenizer.ggml.tokens");
  ASSERT_NE(at, std::string::npos);
  // key, type (4), element type (4), count (8), then the first string: length (8), text.
  const size_t first = at + std::strlen("tokenizer.ggml.tokens") + 4 + 4 + 8 + 8;
  bytes[first] = ' ';  // a raw space is no byte-level character (the alphabet spells it U+0120)
  write_bytes(tmp.path() / "bad.gguf", bytes);
  err = error_of(tmp.path() / "bad.gguf");
  EXPECT_NE(err.find("'tokenizer.ggml.tokens'[0]"), std::string::npos) << err;
  EXPECT_NE(err.find("byte-level"), std::string::npos) << err;
  // The writer names a tokenizer.json split it has no llama.cpp name for.
  const fs::path odd = tmp.path() / "odd";
  fs::create_directories(odd);
  std::string tj = read_bytes(tokenizer_data("ling_tokenizer") / "tokenizer.json");
  const std::string from = "\\\\s*[\\\\r\\\\n]|";
  ASSERT_NE(tj.find(from), std::string::npos);
  tj.replace(tj.find(from), from.size(), "\\\\s*[\\\\r\\\\n]+|");
  write_bytes(odd / "tokenizer.json", tj);
  GgufWriter w;
  try {
    add_gguf_tokenizer_keys(odd.string(), 1006, w);
    ADD_FAILURE() << "a split regex without a llama.cpp name was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.pre"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bailingmoe2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hanpu
