// Qwen3.5-MoE and Kimi Linear against transformers itself (tests/golden/qwen35moe_tiny and
// kimi_linear_tiny, made by tools/make_moe_family_goldens.py with save_pretrained): logits at every
// position, the greedy continuation, prefill + decode and chunked prefill against one whole
// prefill, the compressed MLA cache, the configs read from both key spellings, and errors that
// name the tensor or field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "hanpu/model.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/safetensors.hpp"
#include "model/blocks.hpp"
#include "model/model_work.hpp"
#include "model_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;
using testing::all_logits;
using testing::copy_checkpoint;
using testing::Expected;
using testing::load_error;
using testing::nmse;
using testing::TempDir;
using testing::TensorMap;

fs::path qwen_moe_dir() { return testing::golden_dir() / "qwen35moe_tiny"; }
fs::path kimi_dir() { return testing::golden_dir() / "kimi_linear_tiny"; }
fs::path ling_dir() { return testing::golden_dir() / "bailing_hybrid_tiny"; }
std::string read_file(const fs::path& p) { return testing::read_text(p.string()); }
void write_file(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// The sum of the elements of a checkpoint's text-model tensors (model.visual.* and names starting
// with `skipped` left out).
int64_t stored_parameters(const fs::path& dir, const std::string& skipped = "model.visual.") {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model-", 0) != 0) continue;
    SafetensorsFile f = SafetensorsFile::open(e.path().string());
    for (const std::string& t : f.names())
      if (t.rfind("model.visual.", 0) != 0 && t.rfind(skipped, 0) != 0) n += f.get(t).numel();
  }
  return n;
}

// One fixture per golden: the model loaded once, and the recorded run.
template <int kWhich>
class FamilyGolden : public ::testing::Test {
 protected:
  static fs::path dir() { return kWhich == 0 ? qwen_moe_dir() : kWhich == 1 ? kimi_dir() : ling_dir(); }
  static void SetUpTestSuite() {
    model_ = new HybridModel(HybridModel::load(dir().string()));
    expected_ = new Expected(testing::load_expected(dir()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete expected_;
  }

  // Prefill + one token at a time equals one longer prefill; chunked prefill equals whole.
  static void expect_decode_and_chunks_equal_whole_prefill() {
    const std::vector<int32_t> ids = expected_->full_sequence();
    const int64_t V = model_->config().vocab_size, T0 = static_cast<int64_t>(expected_->prompt.size());
    Tensor whole = all_logits(*model_, ids);
    HybridState st = model_->new_state();
    model_->forward(st, std::span(ids).first(static_cast<size_t>(T0)));
    for (size_t t = static_cast<size_t>(T0); t < ids.size(); ++t) {
      Tensor step = model_->forward(st, std::span(ids).subspan(t, 1));
      EXPECT_LE(nmse(step.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(t) * V, V), 1e-10) << "token " << t;
    }
    HybridState chunked = model_->new_state();
    size_t done = 0;
    for (size_t len : {30, 1, 2, 40, 11, 1}) {
      Tensor part = model_->forward(chunked, std::span(ids).subspan(done, len), {.threads = 2, .all_logits = true});
      EXPECT_LE(nmse(part.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(done) * V,
                     static_cast<int64_t>(len) * V),
                1e-10)
          << "chunk at " << done;
      done += len;
    }
    ASSERT_EQ(done, ids.size());
  }

  static HybridModel* model_;
  static Expected* expected_;
};
template <int kWhich>
HybridModel* FamilyGolden<kWhich>::model_ = nullptr;
template <int kWhich>
Expected* FamilyGolden<kWhich>::expected_ = nullptr;

using Qwen35MoeGolden = FamilyGolden<0>;
using KimiLinearGolden = FamilyGolden<1>;
using BailingHybridGolden = FamilyGolden<2>;

// ---- Qwen3.5-MoE ---------------------------------------------------------------------------------

TEST_F(Qwen35MoeGolden, ConfigReadFromTheNestedQwen35MoeConfig) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.linear_mixer, TokenMixer::kGdn);
  EXPECT_EQ(c.attention_mixer, TokenMixer::kGatedAttention);
  EXPECT_EQ(c.is_full_attention, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(c.is_moe, (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 32);
  EXPECT_TRUE(c.moe.shared_expert_gated);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.router_scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(c.gdn.key_head_dim, 16);
  EXPECT_EQ(c.gdn.value_head_dim, 24);
  EXPECT_EQ(c.parameter_count(), stored_parameters(qwen_moe_dir()));
}

TEST_F(Qwen35MoeGolden, LogitsMatchTransformersAtEveryPosition) {
  testing::expect_logits_match_at_every_position(*model_, *expected_);
}

TEST_F(Qwen35MoeGolden, GreedyDecodeMatchesTransformers) { testing::expect_greedy_decode_matches(*model_, *expected_); }

TEST_F(Qwen35MoeGolden, PrefillPlusDecodeAndChunkedPrefillEqualOneWholePrefill) {
  expect_decode_and_chunks_equal_whole_prefill();
}

TEST_F(Qwen35MoeGolden, FusedExpertTensorsGiveTheSameLogits) {
  // transformers' in-memory layout (experts.gate_up_proj [E, 2·Im, H], experts.down_proj [E, H, Im])
  // read from a single-file checkpoint: the same model.
  TempDir tmp;
  const ModelConfig& c = model_->config();
  TensorMap all;
  for (const auto& e : fs::directory_iterator(qwen_moe_dir())) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model-", 0) != 0) continue;
    SafetensorsFile f = SafetensorsFile::open(e.path().string());
    for (const std::string& n : f.names()) all.emplace(n, f.load_copy(n));
  }
  const int64_t E = c.moe.num_experts, Im = c.moe.intermediate_size, H = c.hidden_size;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string m = "model.language_model.layers." + std::to_string(layer) + ".mlp.experts.";
    Tensor gu(DType::BF16, {E, 2 * Im, H}), dn(DType::BF16, {E, H, Im});
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + std::to_string(e) + ".";
      const size_t w = static_cast<size_t>(Im * H) * 2;
      std::memcpy(gu.ptr<uint16_t>() + e * 2 * Im * H, all.at(x + "gate_proj.weight").ptr<uint16_t>(), w);
      std::memcpy(gu.ptr<uint16_t>() + e * 2 * Im * H + Im * H, all.at(x + "up_proj.weight").ptr<uint16_t>(), w);
      std::memcpy(dn.ptr<uint16_t>() + e * H * Im, all.at(x + "down_proj.weight").ptr<uint16_t>(), w);
      for (const char* p : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) all.erase(x + p);
    }
    all.emplace(m + "gate_up_proj", std::move(gu));
    all.emplace(m + "down_proj", std::move(dn));
  }
  std::vector<std::pair<std::string, TensorView>> out;
  for (auto& [n, t] : all) out.emplace_back(n, t.view());
  write_safetensors((tmp.path() / "model.safetensors").string(), out);
  fs::copy_file(qwen_moe_dir() / "config.json", tmp.path() / "config.json");
  HybridModel fused = HybridModel::load(tmp.path().string());
  const std::vector<int32_t> ids = expected_->full_sequence();
  Tensor a = all_logits(*model_, ids), b = all_logits(fused, ids);
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0);
}

TEST_F(Qwen35MoeGolden, TokenizerFromTheCheckpointRuns) {
  Tokenizer tok = Tokenizer::from_dir(qwen_moe_dir().string());
  EXPECT_FALSE(tok.encode("Hello world!").empty());
}

// A synthetic model of `config` (seed `seed`) over 70 token ids (i * stride mod vocab): prefill of
// the first `prefill` then one decode step at a time gives the logits of one whole prefill.
void expect_decode_continues_prefill(const ModelConfig& config, uint64_t seed, int64_t stride, size_t prefill) {
  const int64_t V = config.vocab_size;
  HybridModel m = HybridModel::synthetic(config, seed, 2);
  std::vector<int32_t> ids(70);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) * stride % V);
  Tensor whole = all_logits(m, ids, 2);
  HybridState st = m.new_state();
  m.forward(st, std::span(ids).first(prefill), {.threads = 2});
  for (size_t t = prefill; t < ids.size(); ++t) {
    Tensor step = m.forward(st, std::span(ids).subspan(t, 1));
    EXPECT_LE(nmse(step.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(t) * V, V), 1e-10) << t;
  }
}

TEST(Qwen35MoeConfig, AbsentHeadDimIsTransformersDefault) {
  // transformers' Qwen3.5 / Qwen3-Next config classes default head_dim to 256 (hidden 64 / 4 heads
  // would give 16): a config.json without it describes the model transformers builds from it.
  nlohmann::json j = nlohmann::json::parse(read_file(qwen_moe_dir() / "config.json"));
  ASSERT_EQ(j["text_config"]["hidden_size"], 64);
  j["text_config"].erase("head_dim");
  EXPECT_EQ(parse_model_config(j.dump(), "config.json").attention.head_dim, 256);
}

TEST(Qwen35MoeSynthetic, SliceOfTheConfigDefaultShapesRunsAndDecodes) {
  const ModelConfig c = model_preset("qwen3.5-35b-a3b-slice");
  EXPECT_EQ(c.num_moe_layers(), 4);
  EXPECT_EQ(c.num_gdn_layers(), 3);
  ModelConfig small = c;  // the same composition at small sizes
  small.vocab_size = 400;
  small.hidden_size = 64;
  small.gdn.num_key_heads = 2;
  small.gdn.num_value_heads = 4;
  small.gdn.key_head_dim = small.gdn.value_head_dim = 16;
  small.attention.num_heads = 4;
  small.attention.num_kv_heads = 2;
  small.attention.head_dim = 32;
  small.attention.rotary_dim = 8;
  small.moe.num_experts = 8;
  small.moe.intermediate_size = small.moe.shared_expert_intermediate_size = 16;
  expect_decode_continues_prefill(small, 3, 29, 67);
}

TEST(Qwen35MoeLoader, MissingExpertAndSharedGateNameTheTensor) {
  TempDir tmp;
  copy_checkpoint(qwen_moe_dir(), tmp.path(), [](const std::string&, TensorMap& m) {
    m.erase("model.language_model.layers.3.mlp.experts.5.up_proj.weight");
  });
  std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find("model.language_model.layers.3.mlp.experts.5.up_proj.weight"), std::string::npos) << err;
  TempDir tmp2;
  copy_checkpoint(qwen_moe_dir(), tmp2.path(), [](const std::string&, TensorMap& m) {
    m.erase("model.language_model.layers.1.mlp.shared_expert_gate.weight");
  });
  err = load_error(tmp2.path().string());
  EXPECT_NE(err.find("layers.1.mlp.shared_expert_gate.weight"), std::string::npos) << err;
}

// ---- Kimi Linear ---------------------------------------------------------------------------------

TEST_F(KimiLinearGolden, ConfigReadFromTheSavedKimiLinearConfig) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.linear_mixer, TokenMixer::kKda);
  EXPECT_EQ(c.attention_mixer, TokenMixer::kMla);
  EXPECT_FALSE(c.norm_weight_plus_one);
  EXPECT_EQ(c.is_full_attention, (std::vector<bool>{false, false, true, false, true}));
  EXPECT_EQ(c.is_moe, (std::vector<bool>{false, true, true, true, true}));
  EXPECT_EQ(c.kda.num_heads, 3);
  EXPECT_EQ(c.kda.head_dim, 24);
  EXPECT_EQ(c.mla.kv_lora_rank, 40);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 16);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 8);
  EXPECT_EQ(c.mla.v_head_dim, 20);
  EXPECT_EQ(c.moe.router_scoring, RouterScoring::kSigmoid);
  EXPECT_TRUE(c.moe.router_score_bias);
  EXPECT_EQ(c.moe.num_expert_groups, 2);
  EXPECT_EQ(c.moe.topk_groups, 1);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.446);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 16);
  EXPECT_FALSE(c.moe.shared_expert_gated);
  EXPECT_EQ(c.parameter_count(), stored_parameters(kimi_dir()));
}

TEST_F(KimiLinearGolden, LogitsMatchTransformersAtEveryPosition) {
  testing::expect_logits_match_at_every_position(*model_, *expected_);
}

TEST_F(KimiLinearGolden, GreedyDecodeMatchesTransformers) {
  const HybridState st = testing::expect_greedy_decode_matches(*model_, *expected_);
  // The MLA cache holds the compressed rows only: kv_lora_rank + rope floats per token and layer.
  const ModelConfig& c = model_->config();
  ASSERT_EQ(st.key_cache.size(), 2u);
  for (size_t i = 0; i < st.key_cache.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(st.key_cache[i].size()), st.position * c.mla.cache_dim());
    EXPECT_TRUE(st.value_cache[i].empty());
  }
  EXPECT_EQ(c.mla.cache_dim(), 48);
}

TEST_F(KimiLinearGolden, PrefillPlusDecodeAndChunkedPrefillEqualOneWholePrefill) {
  expect_decode_and_chunks_equal_whole_prefill();
}

TEST(KimiLinearConfig, OfficialKeysGiveTheSameDescription) {
  // The official checkpoints' config (docs/MODEL.md): linear_attn_config with 1-indexed
  // layer lists, num_experts_per_token, first_k_dense_replace, the router keys.
  const ModelConfig saved = parse_model_config(read_file(kimi_dir() / "config.json"), "config.json");
  nlohmann::json j = nlohmann::json::parse(read_file(kimi_dir() / "config.json"));
  for (const char* k : {"layer_types", "mlp_layer_types", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"})
    j.erase(k);
  j["linear_attn_config"] = {{"num_heads", 3}, {"head_dim", 24}, {"short_conv_kernel_size", 4},
                             {"kda_layers", {1, 2, 4}}, {"full_attn_layers", {3, 5}}};
  j["first_k_dense_replace"] = 1;
  j["moe_router_activation_func"] = "sigmoid";
  j["mla_use_nope"] = true;
  const ModelConfig official = parse_model_config(j.dump(), "config.json");
  EXPECT_EQ(official.describe(), saved.describe());
  EXPECT_EQ(official.is_full_attention, saved.is_full_attention);
  EXPECT_EQ(official.is_moe, saved.is_moe);

  auto error_of = [&](const nlohmann::json& cfg) {
    try {
      parse_model_config(cfg.dump(), "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  nlohmann::json bad = j;
  bad["mla_use_nope"] = false;
  EXPECT_NE(error_of(bad).find("mla_use_nope"), std::string::npos) << error_of(bad);
  bad = j;
  bad["moe_router_activation_func"] = "softmax";
  EXPECT_NE(error_of(bad).find("moe_router_activation_func"), std::string::npos) << error_of(bad);
  bad = j;
  bad["linear_attn_config"]["kda_layers"] = {1, 2, 3, 4};  // layer 3 twice
  EXPECT_NE(error_of(bad).find("layer 3 is listed 2 times"), std::string::npos) << error_of(bad);
  bad = j;
  bad["num_key_value_heads"] = 1;
  EXPECT_NE(error_of(bad).find("num_key_value_heads 1"), std::string::npos) << error_of(bad);
  bad = j;
  bad["num_expert_group"] = 3;  // 8 experts do not split into 3 groups
  EXPECT_NE(error_of(bad).find("expert groups"), std::string::npos) << error_of(bad);
}

TEST(KimiLinearLoader, OfficialDenseMlpNameAndMissingTensorsNamed) {
  // Official checkpoints name layer 0's dense MLP mlp.*; save_pretrained writes block_sparse_moe.*.
  TempDir tmp;
  copy_checkpoint(kimi_dir(), tmp.path(), [](const std::string&, TensorMap& m) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      auto it = m.find(std::string("model.layers.0.block_sparse_moe.") + p + ".weight");
      if (it == m.end()) continue;
      Tensor t = std::move(it->second);
      m.erase(it);
      m.emplace(std::string("model.layers.0.mlp.") + p + ".weight", std::move(t));
    }
  });
  nlohmann::json index = nlohmann::json::parse(read_file(tmp.path() / "model.safetensors.index.json"));
  nlohmann::json& wm = index["weight_map"];
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
    const std::string from = std::string("model.layers.0.block_sparse_moe.") + p + ".weight";
    wm[std::string("model.layers.0.mlp.") + p + ".weight"] = wm[from];
    wm.erase(from);
  }
  write_file(tmp.path() / "model.safetensors.index.json", index.dump());
  HybridModel renamed = HybridModel::load(tmp.path().string());
  const Expected e = testing::load_expected(kimi_dir());
  const std::vector<int32_t> ids = e.full_sequence();
  Tensor got = all_logits(renamed, ids);
  EXPECT_LE(nmse(got.ptr<float>(), e.logits.ptr<float>(), got.numel()), 1e-8);

  TempDir tmp2;
  copy_checkpoint(kimi_dir(), tmp2.path(), [](const std::string&, TensorMap& m) {
    m.erase("model.layers.3.self_attn.k_conv1d.weight");
    m.erase("model.layers.4.block_sparse_moe.gate.e_score_correction_bias");
  });
  const std::string err = load_error(tmp2.path().string());
  EXPECT_NE(err.find("model.layers.3.self_attn.k_conv1d.weight"), std::string::npos) << err;

  // A KDA head dim the tensors disagree with: the tensor, both shapes and the keys that set it.
  TempDir tmp3;
  copy_checkpoint(kimi_dir(), tmp3.path());
  nlohmann::json j = nlohmann::json::parse(read_file(kimi_dir() / "config.json"));
  j["linear_head_dim"] = 20;
  write_file(tmp3.path() / "config.json", j.dump());
  const std::string geometry = load_error(tmp3.path().string());
  EXPECT_NE(geometry.find("tensor 'model.layers.0.self_attn.q_conv1d.weight' has shape [72,1,4], expected [60,1,4] "
                          "from config.json; config.json gives the KDA layers 3 heads of 20 and a conv of 4 "
                          "(linear_num_heads, linear_head_dim, linear_conv_kernel_dim)"),
            std::string::npos)
      << geometry;
}

TEST(KimiLinearSynthetic, SliceOfTheRealShapesHasTheirParameterCountPerLayer) {
  const ModelConfig c = model_preset("kimi-linear-48b-a3b-slice");
  EXPECT_EQ(c.num_kda_layers(), 3);
  EXPECT_EQ(c.num_attention_layers(), 1);
  EXPECT_EQ(c.mla.cache_dim(), 576);  // docs/MODEL.md: 576 values per token per layer
  // A tiny model of the same composition runs and its decode continues its prefill exactly.
  ModelConfig small = c;
  small.vocab_size = 500;
  small.hidden_size = 96;
  small.mlp.intermediate_size = 128;
  small.kda.num_heads = 2;
  small.kda.head_dim = 32;
  small.mla.num_heads = 2;
  small.mla.kv_lora_rank = 56;
  small.mla.qk_nope_head_dim = 16;
  small.mla.qk_rope_head_dim = 8;
  small.mla.v_head_dim = 16;
  small.moe.num_experts = 8;
  small.moe.num_experts_per_tok = 2;
  small.moe.intermediate_size = 32;
  small.moe.shared_expert_intermediate_size = 32;
  expect_decode_continues_prefill(small, 5, 37, 66);
}

// ---- Ling 3.0 (bailing_hybrid) ----------------------------------------------------------------------

TEST_F(BailingHybridGolden, ConfigReadFromTheBailingHybridConfig) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.model_type, "bailing_hybrid");
  EXPECT_EQ(c.linear_mixer, TokenMixer::kKda);
  EXPECT_EQ(c.attention_mixer, TokenMixer::kMla);
  EXPECT_EQ(c.is_full_attention, (std::vector<bool>{false, false, true, false, true}));
  EXPECT_EQ(c.is_moe, (std::vector<bool>{false, true, true, true, true}));
  EXPECT_FALSE(c.kda.low_rank_gates);
  EXPECT_TRUE(c.kda.safe_gate);
  EXPECT_DOUBLE_EQ(c.kda.lower_bound, -5.0);
  // save_pretrained's config as it is: head_dim holds qk_rope_head_dim (8), the KDA geometry is in
  // linear_head_dim / linear_num_heads, as transformers reads it back.
  const nlohmann::json saved = nlohmann::json::parse(read_file(ling_dir() / "config.json"));
  ASSERT_EQ(saved["head_dim"], 8);
  ASSERT_EQ(saved["linear_head_dim"], 24);
  EXPECT_EQ(c.kda.head_dim, 24);
  EXPECT_EQ(c.kda.num_heads, 3);
  EXPECT_TRUE(c.mla.rope);
  EXPECT_TRUE(c.mla.head_gate);
  EXPECT_EQ(c.mla.q_lora_rank, 20);
  EXPECT_DOUBLE_EQ(c.mla.rope_theta, 10000.0);
  EXPECT_EQ(c.moe.num_expert_groups, 4);
  EXPECT_EQ(c.moe.topk_groups, 2);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  // The MTP layer (layers.5.*, after num_hidden_layers) is in the checkpoint but not in the model.
  EXPECT_EQ(c.parameter_count(), stored_parameters(ling_dir(), "model.layers.5."));
}

TEST_F(BailingHybridGolden, LogitsMatchTransformersAtEveryPosition) {
  testing::expect_logits_match_at_every_position(*model_, *expected_);
}

TEST_F(BailingHybridGolden, GreedyDecodeMatchesTransformers) {
  testing::expect_greedy_decode_matches(*model_, *expected_);
}

TEST_F(BailingHybridGolden, PrefillPlusDecodeAndChunkedPrefillEqualOneWholePrefill) {
  expect_decode_and_chunks_equal_whole_prefill();
}

TEST(BailingHybridConfig, UnsupportedOptionsAreNamed) {
  const nlohmann::json j = nlohmann::json::parse(read_file(ling_dir() / "config.json"));
  auto error_of = [&](const nlohmann::json& cfg) {
    try {
      parse_model_config(cfg.dump(), "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  nlohmann::json bad = j;
  bad["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  EXPECT_NE(error_of(bad).find("rope_type 'yarn'"), std::string::npos) << error_of(bad);
  bad = j;
  bad["kda_lower_bound"] = 1.0;
  EXPECT_NE(error_of(bad).find("kda_lower_bound"), std::string::npos) << error_of(bad);
  bad = j;
  bad["num_expert_group"] = 3;
  EXPECT_NE(error_of(bad).find("expert groups"), std::string::npos) << error_of(bad);
  // Without the safe gate the KDA gate is Kimi's softplus one (computed in the engine).
  bad = j;
  bad["kda_safe_gate"] = false;
  EXPECT_FALSE(parse_model_config(bad.dump(), "config.json").kda.safe_gate);
  // The published layout's options hanpu does not run, each named with what it got.
  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"no_kda_lora", false}}, "field 'no_kda_lora' is false"},
      {{{"use_kda_lora", true}}, "field 'use_kda_lora' is true"},
      {{{"gated_attention_proj_granularity_type", "element_wise"}}, "field 'gated_attention_proj_granularity_type' is a string"},
      {{{"gated_attention_proj_granularity_type", nullptr}}, "field 'gated_attention_proj_granularity_type' is null"},
      {{{"rope_interleave", false}}, "field 'rope_interleave' is a boolean false"},
      {{{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}}, "rope_scaling type 'yarn'"},
      {{{"use_mla_nope", true}}, "field 'use_mla_nope' is true"},
      {{{"use_qkv_bias", true}}, "field 'use_qkv_bias' is true"},
      {{{"use_bias", true}}, "field 'use_bias' is true"},
      {{{"scoring_func", "softmax"}}, "field 'scoring_func' is a string"},
      {{{"topk_method", "greedy"}}, "field 'topk_method' is a string"},
      {{{"moe_router_enable_expert_bias", false}}, "field 'moe_router_enable_expert_bias' is false"},
      {{{"expert_swiglu_limit_list", {0, 0, 0, 7.0, 7.0}}}, "field 'expert_swiglu_limit_list[3]' is a number 7"},
      {{{"share_expert_swiglu_limit_list", {5, nullptr, 0, 0, 0}}}, "field 'share_expert_swiglu_limit_list[0]' is an integer 5"},
  };
  for (const auto& [edit, named] : refused) {
    bad = j;
    bad.update(edit);
    const std::string err = error_of(bad);
    EXPECT_NE(err.find(named), std::string::npos) << edit.dump() << ": " << err;
    EXPECT_NE(err.find("expected"), std::string::npos) << err;
  }
  // Their published values are accepted (null / zero clamps, limits past num_hidden_layers for the MTP layer).
  bad = j;
  bad.update({{"no_kda_lora", true}, {"use_kda_lora", false}, {"gated_attention_proj_granularity_type", "head_wise"},
              {"rope_interleave", true}, {"rope_scaling", nullptr}, {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"}, {"expert_swiglu_limit_list", nullptr},
              {"share_expert_swiglu_limit_list", {0, nullptr, 0, 0, 0, 7.0}}, {"num_nextn_predict_layers", 1}});
  EXPECT_EQ(error_of(bad), "(no error)");
  // Without layer_types, groups that do not divide the layers are refused (transformers and the
  // published code disagree on the trailing layers); groups that do give every group's last layer.
  bad = j;
  bad.erase("layer_types");
  bad["layer_group_size"] = 2;
  EXPECT_NE(error_of(bad).find("num_hidden_layers 5 is not a multiple of layer_group_size 2"), std::string::npos)
      << error_of(bad);
  bad["num_hidden_layers"] = 6;
  bad["mlp_layer_types"].push_back("sparse");
  EXPECT_EQ(parse_model_config(bad.dump(), "config.json").is_full_attention,
            (std::vector<bool>{false, true, false, true, false, true}));
}

TEST(BailingHybridConfig, KdaGeometryReadAsTransformersReadsIt) {
  const nlohmann::json j = nlohmann::json::parse(read_file(ling_dir() / "config.json"));
  auto kda = [](const nlohmann::json& cfg) {
    const ModelConfig c = parse_model_config(cfg.dump(), "config.json");
    return std::vector<int64_t>{c.kda.num_heads, c.kda.head_dim, c.kda.conv_kernel};
  };
  // save_pretrained's keys win over head_dim (= qk_rope_head_dim) and short_conv_kernel_size.
  nlohmann::json cfg = j;
  cfg["linear_num_heads"] = 6;
  cfg["linear_head_dim"] = 12;
  cfg["linear_conv_kernel_dim"] = 3;
  EXPECT_EQ(kda(cfg), (std::vector<int64_t>{6, 12, 3}));
  // Without them (the published configs), BailingHybridConfig's rule: num_attention_heads, head_dim,
  // short_conv_kernel_size.
  for (const char* k : {"linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"}) cfg.erase(k);
  cfg["head_dim"] = 24;
  cfg["short_conv_kernel_size"] = 2;
  EXPECT_EQ(kda(cfg), (std::vector<int64_t>{3, 24, 2}));
  // The model_types and architecture the published checkpoints and their code declare.
  for (const char* type : {"bailing_hybrid", "bailing_moe_v3", ""}) {
    nlohmann::json t = cfg;
    if (*type) t["model_type"] = type;
    else t.erase("model_type");
    t["architectures"] = {"BailingMoeV3ForCausalLM"};
    EXPECT_EQ(parse_model_config(t.dump(), "config.json").model_type, "bailing_hybrid") << type;
  }
}

TEST(BailingHybridLoader, KdaGeometryTheTensorsDisagreeWithIsNamed) {
  // The issue's failure, now with the cause: a config whose KDA head dim does not match the
  // checkpoint names the tensor, both shapes and the keys the geometry came from.
  TempDir tmp;
  copy_checkpoint(ling_dir(), tmp.path());
  nlohmann::json j = nlohmann::json::parse(read_file(ling_dir() / "config.json"));
  j["linear_head_dim"] = 16;
  write_file(tmp.path() / "config.json", j.dump());
  const std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find("tensor 'model.layers.0.attention.q_conv1d.weight' has shape [72,1,4], expected [48,1,4] from "
                     "config.json; config.json gives the KDA layers 3 heads of 16 (linear_num_heads, linear_head_dim)"),
            std::string::npos)
      << err;
}

TEST_F(BailingHybridGolden, PublishedLayoutGivesTheSameLogits) {
  // The golden rewritten in the published checkpoints' layout (Ling-3.0-tiny/-flash config keys,
  // as llama.cpp's conversion/bailingmoe3.py and vLLM's bailing_moe_v3.py read them; the KDA
  // output projection named o_proj): the same model, so transformers' logits. layer_types and
  // mlp_layer_types stay (the golden's layer pattern is no layer_group_size's).
  TempDir tmp;
  const std::vector<int> kda_layers = {0, 1, 3};
  auto renamed = [&](const std::string& name) {
    for (int i : kda_layers) {
      const std::string dense = "model.layers." + std::to_string(i) + ".attention.dense.weight";
      if (name == dense) return "model.layers." + std::to_string(i) + ".attention.o_proj.weight";
    }
    return name;
  };
  copy_checkpoint(ling_dir(), tmp.path(), [&](const std::string&, TensorMap& m) {
    TensorMap out;
    for (auto& [n, t] : m) out.emplace(renamed(n), std::move(t));
    m = std::move(out);
  });
  nlohmann::json index = nlohmann::json::parse(read_file(ling_dir() / "model.safetensors.index.json"));
  nlohmann::json map = nlohmann::json::object();
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) map[renamed(it.key())] = it.value();
  ASSERT_TRUE(map.contains("model.layers.3.attention.o_proj.weight"));
  index["weight_map"] = map;
  write_file(tmp.path() / "model.safetensors.index.json", index.dump());
  nlohmann::json j = nlohmann::json::parse(read_file(ling_dir() / "config.json"));
  j["head_dim"] = j["linear_head_dim"];
  for (const char* k : {"linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim", "qk_head_dim"}) j.erase(k);
  j.update({{"architectures", {"BailingMoeV3ForCausalLM"}}, {"no_kda_lora", true},
            {"gated_attention_proj_granularity_type", "head_wise"}, {"rope_interleave", true},
            {"partial_rotary_factor", 0.5}, {"rope_scaling", nullptr}, {"use_qkv_bias", false},
            {"moe_shared_expert_intermediate_size", 16}, {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"},
            {"moe_router_enable_expert_bias", true}, {"expert_swiglu_limit_list", nullptr},
            {"num_nextn_predict_layers", 1}});
  write_file(tmp.path() / "config.json", j.dump());
  HybridModel m = HybridModel::load(tmp.path().string());
  EXPECT_EQ(m.config().kda.head_dim, 24);
  testing::expect_logits_match_at_every_position(m, *expected_);
}

TEST(BailingHybridSynthetic, SliceOfTheConfigDefaultShapesRunsAndDecodes) {
  // transformers 5.24's BailingHybridConfig defaults (docstring: inclusionAI/Ling-3.0-Flash).
  const ModelConfig c = model_preset("ling-3.0-flash-slice");
  EXPECT_EQ(c.model_type, "bailing_hybrid");
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.vocab_size, 157184);
  EXPECT_EQ(c.num_kda_layers(), 3);
  EXPECT_EQ(c.num_attention_layers(), 1);
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_EQ(c.kda.num_heads, 32);
  EXPECT_EQ(c.kda.head_dim, 128);
  EXPECT_FALSE(c.kda.low_rank_gates);
  EXPECT_TRUE(c.kda.safe_gate);
  EXPECT_EQ(c.kda.lower_bound, -5.0);
  EXPECT_EQ(c.mla.cache_dim(), 576);
  EXPECT_EQ(c.moe.intermediate_size, 768);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 768);
  EXPECT_EQ(c.mlp.intermediate_size, 6144);
  EXPECT_EQ(c.moe.num_expert_groups, 8);
  EXPECT_EQ(c.moe.topk_groups, 4);
  EXPECT_EQ(c.moe.num_experts % c.moe.num_expert_groups, 0);
  // A tiny model of the same composition runs and its decode continues its prefill exactly.
  ModelConfig small = c;
  small.vocab_size = 300;
  small.hidden_size = 64;
  small.mlp.intermediate_size = 96;
  small.kda.num_heads = 2;
  small.kda.head_dim = 16;
  small.mla.num_heads = 2;
  small.mla.kv_lora_rank = 24;
  small.mla.qk_nope_head_dim = 16;
  small.mla.qk_rope_head_dim = 8;
  small.mla.v_head_dim = 16;
  small.moe.num_experts = 16;  // 8 groups of 2, top-4 groups
  small.moe.num_experts_per_tok = 3;
  small.moe.intermediate_size = small.moe.shared_expert_intermediate_size = 24;
  expect_decode_continues_prefill(small, 7, 41, 65);
}

TEST_F(BailingHybridGolden, SafeGateAndRopeEachMoveTheLogits) {
  // The golden is sensitive to both Ling-specific parts: the softplus gate instead of the safe
  // gate, or another RoPE theta, each leave transformers' logits far behind.
  const std::vector<int32_t> ids = expected_->full_sequence();
  for (const char* edit : {"no safe gate", "rope theta"}) {
    TempDir tmp;
    copy_checkpoint(ling_dir(), tmp.path());
    nlohmann::json j = nlohmann::json::parse(read_file(ling_dir() / "config.json"));
    if (std::string(edit) == "no safe gate") j["kda_safe_gate"] = false;
    else j["rope_parameters"]["rope_theta"] = 500.0;
    write_file(tmp.path() / "config.json", j.dump());
    HybridModel m = HybridModel::load(tmp.path().string());
    Tensor got = all_logits(m, ids);
    EXPECT_GT(nmse(got.ptr<float>(), expected_->logits.ptr<float>(), got.numel()), 1e-3) << edit;
  }
}

TEST(BailingHybridLoader, MissingTensorsNamed) {
  TempDir tmp;
  copy_checkpoint(ling_dir(), tmp.path(), [](const std::string&, TensorMap& m) {
    m.erase("model.layers.2.attention.g_proj.weight");
  });
  std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find("model.layers.2.attention.g_proj.weight"), std::string::npos) << err;
}

// bench-model's work counts (model/model_work.hpp) against the checkpoints themselves: the weight
// bytes of a decode step are every matrix once (bf16), the routed experts' at top-k / E, the
// embedding table not at all (rows are gathered).
TEST(ModelWork, DecodeStepReadsEveryMatrixOnceOnEveryFamily) {
  for (const char* golden : {"qwen35_tiny", "qwen3next_tiny", "qwen35moe_tiny", "kimi_linear_tiny", "bailing_hybrid_tiny"}) {
    SCOPED_TRACE(golden);
    const std::string dir = (testing::golden_dir() / golden).string();
    const HybridModel m = HybridModel::load(dir);
    const ModelConfig& c = m.config();
    double dense = 0, experts = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      if (entry.path().extension() != ".safetensors" || file == "expected.safetensors" || file.find("mtp") != std::string::npos)
        continue;
      const SafetensorsFile f = SafetensorsFile::open(entry.path().string());
      for (const std::string& name : f.names()) {
        const TensorView t = f.get(name);
        if (t.rank != 2 || name.find("embed_tokens") != std::string::npos || name.find("word_embeddings") != std::string::npos)
          continue;
        if (name.rfind("mtp.", 0) == 0 || name.find(".visual.") != std::string::npos) continue;  // never read by a text decode
        const size_t at = name.find("layers.");
        if (at != std::string::npos && std::stoll(name.substr(at + 7)) >= c.num_layers) continue;  // MTP layers
        (name.find(".experts.") != std::string::npos ? experts : dense) += static_cast<double>(t.numel());
      }
    }
    ASSERT_GT(dense, 0);
    const double routed = c.moe.num_experts > 0 ? static_cast<double>(c.moe.num_experts_per_tok) / static_cast<double>(c.moe.num_experts) : 0;
    const model::ForwardWork w = model::forward_work(c, 7, 1, false);
    EXPECT_NEAR(w.total().weight_bytes, 2 * (dense + routed * experts), 1e-6 * w.total().weight_bytes);
    // One token: two flops per weight used, plus the engine and the attention over 8 keys.
    EXPECT_GT(w.total().flops, 2 * (dense + routed * experts));
    EXPECT_GT(w.linear_engine.flops, 0);
    EXPECT_GT(w.attention_core.flops, 0);
    // Prefill counts grow linearly in the projections and quadratically in attention.
    const model::ForwardWork p1 = model::forward_work(c, 0, 64, false), p2 = model::forward_work(c, 0, 128, false);
    EXPECT_NEAR(p2.linear_projections.flops, 2 * p1.linear_projections.flops, 1e-9 * p2.linear_projections.flops);
    EXPECT_GT(p2.attention_core.flops, 3.9 * p1.attention_core.flops);
  }
}


// MLA's work is counted in the form the layer runs (MlaAttention::expand_pays): a fresh prefill
// expanded (attention over nope + rope key dims and v value dims per pair), one decode token over
// a long cache latent (scores over the latent rows, r + rope wide, sums over their r). Counting
// the latent form for an expanded run printed an attention core above the FMA peak.
TEST(ModelWork, MlaCountsTheFormThatRuns) {
  for (const char* golden : {"kimi_linear_tiny", "bailing_hybrid_tiny"}) {
    SCOPED_TRACE(golden);
    const HybridModel m = HybridModel::load((testing::golden_dir() / golden).string());
    const ModelConfig& c = m.config();
    int64_t attention_layers = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) attention_layers += c.token_mixer(i) == c.attention_mixer;
    ASSERT_GT(attention_layers, 0);
    const double nh = static_cast<double>(c.mla.num_heads) * static_cast<double>(attention_layers);
    const int64_t T = 64;
    ASSERT_TRUE(model::MlaAttention::expand_pays(c, T, 0));
    const double pairs = T * (T + 1) / 2.0;
    EXPECT_DOUBLE_EQ(model::forward_work(c, 0, T, false).attention_core.flops,
                     2 * nh * static_cast<double>(c.mla.qk_head_dim() + c.mla.v_head_dim) * pairs);
    const int64_t cached = 100000;
    ASSERT_FALSE(model::MlaAttention::expand_pays(c, 1, cached));
    EXPECT_DOUBLE_EQ(model::forward_work(c, cached, 1, false).attention_core.flops,
                     2 * nh * static_cast<double>(c.mla.cache_dim() + c.mla.kv_lora_rank) * (cached + 1));
    // int8 weights keep the latent form (no W_uk copy is built for them).
    EXPECT_DOUBLE_EQ(model::forward_work(c, 0, T, false, {.bytes_per_weight = 1 + 4.0 / 32, .latent_only = true}).attention_core.flops,
                     2 * nh * static_cast<double>(c.mla.cache_dim() + c.mla.kv_lora_rank) * pairs);
  }
}

// --weights int8 on every family's golden: the logits stay near transformers' fp32 ones (bounds
// are three times what was measured with the default group: the tiny random models differ a lot
// in how much their outputs move for a weight error of ~0.4%; Kimi's is the most sensitive, the
// same amount of random weight noise on its KDA k_proj alone moves it by 8e-3), the int8 model is
// self-consistent (chunked prefill and decode equal one prefill to rounding), and the bytes held
// are int8's.
TEST(ModelInt8, EveryFamilyNearTheFp32LogitsAndSelfConsistent) {
  const std::pair<const char*, double> bounds[] = {{"qwen35_tiny", 3e-3},      {"qwen3next_tiny", 7e-3},
                                                   {"qwen35moe_tiny", 6e-2},   {"kimi_linear_tiny", 0.3},
                                                   {"bailing_hybrid_tiny", 0.1}};
  for (const auto& [golden, bound] : bounds) {
    SCOPED_TRACE(golden);
    const fs::path dir = testing::golden_dir() / golden;
    const testing::Expected e = testing::load_expected(dir);
    const HybridModel m = HybridModel::load(dir.string(), {.weights = {.format = "int8"}});
    const std::vector<int32_t> ids = e.full_sequence();
    const Tensor whole = testing::all_logits(m, ids, 2);
    const double err = testing::nmse(whole.ptr<float>(), e.logits.ptr<float>(), whole.numel());
    EXPECT_LE(err, bound);
    EXPECT_GT(err, 1e-9);  // the weights really were quantized
    HybridState st = m.new_state();
    std::vector<float> rows;
    for (size_t i = 0; i < ids.size();) {
      const size_t n = i < 40 ? 13 : 1;  // chunks of 13, then one token at a time
      const size_t take = std::min(n, ids.size() - i);
      const Tensor l = m.forward(st, std::span<const int32_t>(ids.data() + i, take), {.threads = 1, .all_logits = true});
      rows.insert(rows.end(), l.ptr<float>(), l.ptr<float>() + l.numel());
      i += take;
    }
    EXPECT_LE(testing::nmse(rows.data(), whole.ptr<float>(), whole.numel()), 1e-10);
  }
}


// The family registry (hanpu/model_family.hpp): every row is found by each of its model types and
// by nothing else, its presets describe models of its own type with its checkpoint layout, and the
// golden checkpoints' configs are read through it.
// The message `fn` throws hanpu::Error with, or "(no error)".
template <class Fn>
std::string thrown(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelFamilies, EveryRowIsFoundByItsTypesAndOwnsItsPresets) {
  std::set<std::string> types, presets, gguf;
  for (const ModelFamily* f : model_families()) {
    ASSERT_NE(f->parse, nullptr) << f->name;
    EXPECT_FALSE(f->model_types.empty()) << f->name;
    EXPECT_FALSE(f->presets.empty()) << f->name;
    EXPECT_TRUE(gguf.insert(f->gguf_architecture).second) << f->name << ": GGUF architecture '" << f->gguf_architecture << "' twice";
    for (const std::string& t : f->model_types) {
      EXPECT_TRUE(types.insert(t).second) << "model_type '" << t << "' in two rows";
      EXPECT_EQ(find_model_family(t), f) << t;
    }
    for (const std::string& a : f->architectures) EXPECT_EQ(find_model_family("", {"SomethingElse", a}), f) << a;
    for (const ModelPreset& p : f->presets) {
      EXPECT_TRUE(presets.insert(p.name).second) << "preset '" << p.name << "' twice";
      const ModelConfig c = model_preset(p.name);
      EXPECT_EQ(&model_family(c), f) << p.name << " is " << c.model_type;
      EXPECT_EQ(c.names.embed_tokens, f->checkpoint_names.embed_tokens) << p.name;
      EXPECT_EQ(c.names.linear_attention, f->checkpoint_names.linear_attention) << p.name;
      EXPECT_EQ(c.names.channel_mixer, f->checkpoint_names.channel_mixer) << p.name;
      EXPECT_EQ(c.names.expert_gate, f->checkpoint_names.expert_gate) << p.name;
      EXPECT_EQ(c.names.router_score_bias, f->checkpoint_names.router_score_bias) << p.name;
      EXPECT_NO_THROW(c.check()) << p.name;
    }
  }
  EXPECT_EQ(gguf, (std::set<std::string>{"qwen35", "qwen35moe", "qwen3next", "kimi-linear", "bailingmoe3"}));
  EXPECT_EQ(presets.size(), model_preset_names().size());
  EXPECT_EQ(find_model_family("llama"), nullptr);
  EXPECT_EQ(find_model_family("", {"LlamaForCausalLM"}), nullptr);
  EXPECT_EQ(find_model_family("llama", {"BailingMoeV3ForCausalLM"}), nullptr);  // a model_type decides alone
}

TEST(ModelFamilies, GoldenConfigsAreReadByTheirRowsParser) {
  const std::pair<const char*, const char*> goldens[] = {{"qwen35_tiny", "Qwen3.5"},
                                                         {"qwen35moe_tiny", "Qwen3.5-MoE"},
                                                         {"qwen3next_tiny", "Qwen3-Next"},
                                                         {"kimi_linear_tiny", "Kimi Linear"},
                                                         {"bailing_hybrid_tiny", "Ling 3.0"}};
  for (const auto& [dir, family] : goldens) {
    const std::string text = read_file(testing::golden_dir() / dir / "config.json");
    const ModelConfig c = parse_model_config(text, "config.json");
    EXPECT_EQ(model_family(c).name, family) << dir;
    const ModelConfig direct = model_family(c).parse(text, "config.json");
    EXPECT_EQ(direct.describe(), c.describe()) << dir;
  }
}

TEST(ModelFamilies, UnknownTypeListsEveryKnownOne) {
  const std::string err = thrown([] { parse_model_config(R"({"model_type": "llama"})", "config.json"); });
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("unknown model_type 'llama'"), std::string::npos) << err;
  for (const ModelFamily* f : model_families()) {
    EXPECT_NE(err.find("(" + f->name + ")"), std::string::npos) << err;
    for (const std::string& t : f->model_types) EXPECT_NE(err.find("'" + t + "'"), std::string::npos) << t << ": " << err;
  }
  ModelConfig unknown = model_preset("qwen3.5-0.8b");
  unknown.model_type = "llama";
  EXPECT_NE(thrown([&] { model_family(unknown); }).find("unknown model_type 'llama'"), std::string::npos);
  const std::string preset_err = thrown([] { model_preset("qwen3.5-7b"); });
  for (const std::string& n : model_preset_names()) EXPECT_NE(preset_err.find(n), std::string::npos) << preset_err;
}

}  // namespace
}  // namespace hanpu
