// Qwen3-Next tests against transformers itself (tests/golden/qwen3next_tiny, made by
// tools/make_qwen3next_golden.py): the fused GDN projections permuted into the Qwen3.5 layout
// (checked row by row against transformers' own split), logits at every position through the
// MoE blocks, the greedy continuation, prefill + decode and chunked prefill against one whole
// prefill, the Qwen2-style tokenizer, and loader errors that name the file and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/safetensors.hpp"
#include "model/fused_gdn_layout.hpp"
#include "model_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

fs::path next_dir() { return testing::golden_dir() / "qwen3next_tiny"; }

using testing::all_logits;
using testing::copy_checkpoint;
using testing::Expected;
using testing::load_error;
using testing::nmse;
using testing::TensorMap;
std::string read_file(const fs::path& p) { return testing::read_text(p.string()); }

class Qwen3NextGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new HybridModel(HybridModel::load(next_dir().string()));
    expected_ = new Expected(testing::load_expected(next_dir()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete expected_;
  }
  static std::vector<int32_t> full_sequence() { return expected_->full_sequence(); }
  static HybridModel* model_;
  static Expected* expected_;
};
HybridModel* Qwen3NextGolden::model_ = nullptr;
Expected* Qwen3NextGolden::expected_ = nullptr;

TEST_F(Qwen3NextGolden, ConfigReadFromTheFlatQwen3NextConfig) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.model_type, "qwen3_next");
  EXPECT_TRUE(c.gdn.fused_projections);
  EXPECT_EQ(c.is_full_attention, (std::vector<bool>{false, true, false, true}));  // full_attention_interval 2
  EXPECT_EQ(c.is_moe, (std::vector<bool>{true, false, true, true}));              // mlp_only_layers [1]
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe.intermediate_size, 16);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 32);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.gdn.key_head_dim, 16);
  EXPECT_EQ(c.gdn.value_head_dim, 32);
  EXPECT_EQ(c.attention.rotary_dim, 8);
  EXPECT_DOUBLE_EQ(c.attention.rope_theta, 50000.0);
  // The parameter count from the config equals the checkpoint's text tensors, element for element.
  int64_t stored = 0;
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    SafetensorsFile f = SafetensorsFile::open((next_dir() / shard).string());
    for (const std::string& n : f.names())
      if (n.rfind("mtp.", 0) != 0) stored += f.get(n).numel();
  }
  EXPECT_EQ(c.parameter_count(), stored);
}

TEST_F(Qwen3NextGolden, PermutedProjectionRowsEqualTransformersSplit) {
  const ModelConfig& c = model_->config();
  SafetensorsFile ckpt = SafetensorsFile::open((next_dir() / "model-00001-of-00002.safetensors").string());
  SafetensorsFile want = SafetensorsFile::open((next_dir() / "expected.safetensors").string());
  const TensorView qkvz = ckpt.get("model.layers.0.linear_attn.in_proj_qkvz.weight");
  const TensorView ba = ckpt.get("model.layers.0.linear_attn.in_proj_ba.weight");
  const int64_t H = c.hidden_size, nk = c.gdn.num_key_heads, nv = c.gdn.num_value_heads;
  const std::vector<int64_t> qkvz_rows =
      model::qwen3next_qkvz_source_rows(nk, nv, c.gdn.key_head_dim, c.gdn.value_head_dim);
  const std::vector<int64_t> ba_rows = model::qwen3next_ba_source_rows(nk, nv);
  // Each is a permutation: every source row used once.
  for (const auto* rows : {&qkvz_rows, &ba_rows}) {
    std::vector<int64_t> sorted = *rows;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], static_cast<int64_t>(i));
  }
  ByteBuffer p_qkvz = model::gather_rows(qkvz, qkvz_rows, "in_proj_qkvz");
  ByteBuffer p_ba = model::gather_rows(ba, ba_rows, "in_proj_ba");
  auto compare = [&](const ByteBuffer& buf, int64_t row0, const char* name) {
    Tensor w = want.load_copy(name);  // F32 rows from transformers' fix_query_key_value_ordering
    const auto* bits = reinterpret_cast<const uint16_t*>(buf.data()) + row0 * H;
    int64_t mismatches = 0;
    for (int64_t i = 0; i < w.numel(); ++i) mismatches += bf16_to_f32(bits[i]) != w.ptr<float>()[i];
    EXPECT_EQ(mismatches, 0) << name << ": " << w.shape()[0] << " rows";
  };
  const int64_t cd = c.gdn.conv_dim();
  compare(p_qkvz, 0, "perm_qkv");
  compare(p_qkvz, cd, "perm_z");
  compare(p_ba, 0, "perm_b");
  compare(p_ba, nv, "perm_a");
}

TEST_F(Qwen3NextGolden, LogitsMatchTransformersAtEveryPosition) {
  testing::expect_logits_match_at_every_position(*model_, *expected_);
}

TEST_F(Qwen3NextGolden, GreedyDecodeMatchesTransformers) {
  testing::expect_greedy_decode_matches(*model_, *expected_);
}

TEST_F(Qwen3NextGolden, PrefillPlusDecodeEqualsOneLongerPrefill) {
  const std::vector<int32_t> ids = full_sequence();
  const int64_t V = model_->config().vocab_size, T0 = static_cast<int64_t>(expected_->prompt.size());
  Tensor whole = all_logits(*model_, ids);
  HybridState st = model_->new_state();
  model_->forward(st, std::span(ids).first(static_cast<size_t>(T0)));
  for (size_t t = static_cast<size_t>(T0); t < ids.size(); ++t) {
    Tensor step = model_->forward(st, std::span(ids).subspan(t, 1));
    EXPECT_LE(nmse(step.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(t) * V, V), 1e-10) << "token " << t;
  }
}

TEST_F(Qwen3NextGolden, ChunkedPrefillEqualsWholePrefill) {
  const std::vector<int32_t> ids = full_sequence();
  const int64_t V = model_->config().vocab_size;
  Tensor whole = all_logits(*model_, ids);
  HybridState st = model_->new_state();
  size_t done = 0;
  for (size_t len : {30, 1, 2, 40, 11, 1}) {
    Tensor part = model_->forward(st, std::span(ids).subspan(done, len), {.threads = 2, .all_logits = true});
    EXPECT_LE(nmse(part.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(done) * V, static_cast<int64_t>(len) * V),
              1e-10)
        << "chunk at " << done;
    done += len;
  }
  ASSERT_EQ(done, ids.size());
}

TEST_F(Qwen3NextGolden, TokenizerAndTextGreedyMatchTransformers) {
  // The Qwen2 split regex read from tokenizer.json; ids as the tokenizers library gave them.
  Tokenizer tok = Tokenizer::from_dir(next_dir().string());
  SafetensorsFile f = SafetensorsFile::open((next_dir() / "expected.safetensors").string());
  const std::string text = f.metadata().at("text_prompt");
  EXPECT_EQ(tok.encode(text), expected_->text_prompt);
  HybridState st = model_->new_state();
  Tensor logits = model_->forward(st, expected_->text_prompt);
  Sampler greedy({.temperature = 0});
  std::vector<int32_t> got;
  for (size_t i = 0; i < expected_->text_greedy.size(); ++i) {
    const int32_t next = greedy.sample({logits.ptr<float>(), static_cast<size_t>(logits.numel())});
    got.push_back(next);
    const int32_t one[1] = {next};
    logits = model_->forward(st, one);
  }
  EXPECT_EQ(got, expected_->text_greedy);
}

TEST_F(Qwen3NextGolden, SyntheticModelOfTheSameShapesRunsAndDecodes) {
  // The synthetic builder (bench-model --synthetic) goes through the same fused-projection and MoE
  // construction; its decode continues its prefill exactly as a longer prefill would.
  HybridModel m = HybridModel::synthetic(model_->config(), 7);
  const std::vector<int32_t> ids = full_sequence();
  const int64_t V = m.config().vocab_size;
  Tensor whole = all_logits(m, ids, 2);
  HybridState st = m.new_state();
  m.forward(st, std::span(ids).first(ids.size() - 3));
  for (size_t t = ids.size() - 3; t < ids.size(); ++t) {
    Tensor step = m.forward(st, std::span(ids).subspan(t, 1));
    EXPECT_LE(nmse(step.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(t) * V, V), 1e-10) << "token " << t;
  }
  const std::vector<std::string> presets = model_preset_names();
  EXPECT_NE(std::find(presets.begin(), presets.end(), "qwen3-next-80b-a3b-slice"), presets.end());
  const ModelConfig slice = model_preset("qwen3-next-80b-a3b-slice");
  EXPECT_EQ(slice.num_moe_layers(), 4);
  EXPECT_TRUE(slice.gdn.fused_projections);
}

TEST(Qwen3NextLayout, RowMapsWrittenOutByHand) {
  // nk = 2 groups, one row per head part. r = 1: [q0 k0 v0 z0 | q1 k1 v1 z1] -> q0 q1 k0 k1 v0 v1 z0 z1.
  EXPECT_EQ(model::qwen3next_qkvz_source_rows(2, 2, 1, 1), (std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(model::qwen3next_ba_source_rows(2, 2), (std::vector<int64_t>{0, 2, 1, 3}));
  // r = 2: [q0 k0 v0 v1 z0 z1 | q1 k1 v2 v3 z2 z3] -> q0 q1 k0 k1 v0 v1 v2 v3 z0 z1 z2 z3;
  // [b0 b1 a0 a1 | b2 b3 a2 a3] -> b0 b1 b2 b3 a0 a1 a2 a3.
  EXPECT_EQ(model::qwen3next_qkvz_source_rows(2, 4, 1, 1),
            (std::vector<int64_t>{0, 6, 1, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
  EXPECT_EQ(model::qwen3next_ba_source_rows(2, 4), (std::vector<int64_t>{0, 1, 4, 5, 2, 3, 6, 7}));
  // gather_rows keeps whole rows and names the tensor for a bad row.
  Tensor w(DType::F32, {3, 2});
  for (int64_t i = 0; i < 6; ++i) w.set(i, static_cast<double>(i));
  const std::vector<int64_t> order{2, 0, 1};
  ByteBuffer g = model::gather_rows(w.view(), order, "w");
  const auto* f = reinterpret_cast<const float*>(g.data());
  EXPECT_EQ(std::vector<float>(f, f + 6), (std::vector<float>{4, 5, 0, 1, 2, 3}));
  const std::vector<int64_t> bad{3};
  try {
    model::gather_rows(w.view(), bad, "layers.0.linear_attn.in_proj_ba.weight");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_proj_ba"), std::string::npos) << e.what();
  }
}

TEST(Qwen3NextLoader, WrongFusedProjectionShapeNamesFileAndTensor) {
  TempDir tmp;
  const std::string victim = "model.layers.2.linear_attn.in_proj_qkvz.weight";
  copy_checkpoint(next_dir(), tmp.path(), [&](const std::string&, TensorMap& m) {
    // The Qwen3.5 in_proj_qkv shape (no z rows): what a mixed-up conversion would hold.
    if (m.count(victim)) m[victim] = Tensor(DType::BF16, {192, 64});
  });
  const std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("[192,64]"), std::string::npos) << err;
  EXPECT_NE(err.find("[320,64]"), std::string::npos) << err;
}

TEST(Qwen3NextLoader, MissingExpertTensorNamesFileAndTensor) {
  TempDir tmp;
  const std::string victim = "model.layers.0.mlp.experts.5.down_proj.weight";
  copy_checkpoint(next_dir(), tmp.path(), [&](const std::string&, TensorMap& m) { m.erase(victim); });
  const std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("model-00001-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;

  const std::string shared = "model.layers.3.mlp.shared_expert_gate.weight";
  TempDir tmp2;
  copy_checkpoint(next_dir(), tmp2.path(), [&](const std::string&, TensorMap& m) { m.erase(shared); });
  const std::string err2 = load_error(tmp2.path().string());
  EXPECT_NE(err2.find(shared), std::string::npos) << err2;
  EXPECT_NE(err2.find("model-00002-of-00002.safetensors"), std::string::npos) << err2;
}

TEST(Qwen3NextLoader, BadMoeConfigNamesTheField) {
  TempDir tmp;
  copy_checkpoint(next_dir(), tmp.path());
  nlohmann::json cfg = nlohmann::json::parse(read_file(next_dir() / "config.json"));
  cfg["num_experts_per_tok"] = 9;
  std::ofstream(tmp.path() / "config.json") << cfg.dump();
  std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find("num_experts_per_tok 9"), std::string::npos) << err;
  cfg["num_experts_per_tok"] = 2;
  cfg["mlp_only_layers"] = {7};
  std::ofstream(tmp.path() / "config.json") << cfg.dump();
  err = load_error(tmp.path().string());
  EXPECT_NE(err.find("mlp_only_layers"), std::string::npos) << err;
}

}  // namespace
}  // namespace hanpu
