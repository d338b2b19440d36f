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

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/safetensors.hpp"
#include "model/gguf_arch.hpp"
#include "model_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;
using testing::nmse;
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

}  // namespace
}  // namespace hanpu
