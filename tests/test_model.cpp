// Qwen3.5 model tests against transformers itself (tests/golden/qwen35_tiny, made by
// tools/make_qwen35_golden.py): logits at every position, the greedy continuation, prefill +
// decode and chunked prefill against one whole prefill, checkpoint variants (flat config, single
// file, tied head) and loader errors that name the file and the tensor.
#include <gtest/gtest.h>

#include <numeric>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hanpu/model.hpp"
#include "io/safetensors.hpp"
#include "model/model_parts.hpp"
#include "model/layer_kernels.hpp"  // simd_argmax
#include "model/layer_ops.hpp"
#include "model_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

fs::path tiny_dir() { return testing::golden_dir() / "qwen35_tiny"; }

using testing::all_logits;
using testing::copy_checkpoint;
using testing::Expected;
using testing::load_error;
using testing::nmse;
using testing::TensorMap;
std::string read_file(const fs::path& p) { return testing::read_text(p.string()); }
void write_file(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

class Qwen35Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new HybridModel(HybridModel::load(tiny_dir().string()));
    expected_ = new Expected(testing::load_expected(tiny_dir()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete expected_;
  }
  static std::vector<int32_t> full_sequence() { return expected_->full_sequence(); }
  static HybridModel* model_;
  static Expected* expected_;
};
HybridModel* Qwen35Golden::model_ = nullptr;
Expected* Qwen35Golden::expected_ = nullptr;

TEST_F(Qwen35Golden, ConfigReadFromNestedTextConfig) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.vocab_size, 320);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.num_gdn_layers(), 3);
  EXPECT_TRUE(c.is_full_attention[2]);
  EXPECT_EQ(c.attention.rotary_dim, 8);
  EXPECT_DOUBLE_EQ(c.attention.rope_theta, 50000.0);
  EXPECT_EQ(c.gdn.num_value_heads, 4);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST_F(Qwen35Golden, LogitsMatchTransformersAtEveryPosition) {
  testing::expect_logits_match_at_every_position(*model_, *expected_);
}

TEST_F(Qwen35Golden, GreedyDecodeMatchesTransformers) {
  const HybridState st = testing::expect_greedy_decode_matches(*model_, *expected_);
  EXPECT_EQ(st.position, static_cast<int64_t>(expected_->prompt.size() + expected_->greedy.size()));
}

TEST_F(Qwen35Golden, PrefillPlusDecodeEqualsOneLongerPrefill) {
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

TEST_F(Qwen35Golden, ChunkedPrefillEqualsWholePrefill) {
  const std::vector<int32_t> ids = full_sequence();
  const int64_t V = model_->config().vocab_size;
  Tensor whole = all_logits(*model_, ids);
  // Chunks cross the conv window (1, 2 tokens), a GDN chunk boundary (64) and end on a decode.
  for (const std::vector<size_t>& split : {std::vector<size_t>{30, 1, 2, 40, 11, 1}, std::vector<size_t>{70, 15}}) {
    HybridState st = model_->new_state();
    size_t done = 0;
    for (size_t len : split) {
      Tensor part = model_->forward(st, std::span(ids).subspan(done, len), {.threads = 2, .all_logits = true});
      EXPECT_LE(nmse(part.ptr<float>(), whole.ptr<float>() + static_cast<int64_t>(done) * V,
                     static_cast<int64_t>(len) * V),
                1e-10)
          << "chunk at " << done;
      done += len;
    }
    ASSERT_EQ(done, ids.size());
  }
}

TEST_F(Qwen35Golden, FlatConfigSingleFileGivesTheSameLogits) {
  TempDir tmp;
  // Qwen3_5ForCausalLM layout: flat config (model_type qwen3_5_text), model.* names, one file.
  nlohmann::json cfg = nlohmann::json::parse(read_file(tiny_dir() / "config.json"));
  nlohmann::json flat = cfg["text_config"];
  flat["tie_word_embeddings"] = false;
  write_file(tmp.path() / "config.json", flat.dump());
  TensorMap all;
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    SafetensorsFile f = SafetensorsFile::open((tiny_dir() / shard).string());
    for (const std::string& n : f.names()) {
      if (n.rfind("model.visual.", 0) == 0 || n.rfind("mtp.", 0) == 0) continue;
      std::string renamed = n;
      if (n.rfind("model.language_model.", 0) == 0) renamed = "model." + n.substr(21);
      all.emplace(renamed, f.load_copy(n));
    }
  }
  std::vector<std::pair<std::string, TensorView>> out;
  for (auto& [n, t] : all) out.emplace_back(n, t.view());
  write_safetensors(tmp.file("model.safetensors"), out);
  HybridModel m = HybridModel::load(tmp.path().string());
  const std::vector<int32_t> ids = full_sequence();
  Tensor a = all_logits(m, ids), b = all_logits(*model_, ids);
  EXPECT_EQ(nmse(a.ptr<float>(), b.ptr<float>(), a.numel()), 0.0);
}

TEST_F(Qwen35Golden, TiedHeadUsesTheEmbedding) {
  // Untied with lm_head := embed_tokens must equal tied without lm_head.
  TempDir tmp;
  const fs::path untied = tmp.path() / "untied", tied = tmp.path() / "tied";
  Tensor embed;
  {
    SafetensorsFile f = SafetensorsFile::open((tiny_dir() / "model-00001-of-00002.safetensors").string());
    embed = f.load_copy("model.language_model.embed_tokens.weight");
  }
  copy_checkpoint(tiny_dir(), untied, [&](const std::string&, TensorMap& m) {
    if (m.count("lm_head.weight")) m["lm_head.weight"] = copy_to_tensor(embed.view());
  });
  copy_checkpoint(tiny_dir(), tied, [&](const std::string&, TensorMap& m) { m.erase("lm_head.weight"); });
  nlohmann::json cfg = nlohmann::json::parse(read_file(tiny_dir() / "config.json"));
  cfg["tie_word_embeddings"] = true;
  write_file(tied / "config.json", cfg.dump());
  nlohmann::json index = nlohmann::json::parse(read_file(tiny_dir() / "model.safetensors.index.json"));
  index["weight_map"].erase("lm_head.weight");
  write_file(tied / "model.safetensors.index.json", index.dump());

  HybridModel a = HybridModel::load(untied.string()), b = HybridModel::load(tied.string());
  EXPECT_TRUE(b.config().tie_word_embeddings);
  const std::vector<int32_t> ids = expected_->prompt;
  Tensor la = all_logits(a, ids), lb = all_logits(b, ids), lorig = all_logits(*model_, ids);
  EXPECT_EQ(nmse(la.ptr<float>(), lb.ptr<float>(), la.numel()), 0.0);
  EXPECT_GT(nmse(la.ptr<float>(), lorig.ptr<float>(), la.numel()), 1e-3);  // the head matters
}

TEST_F(Qwen35Golden, F32WeightsGiveTheSameLogits) {
  // A checkpoint converted to F32 (exactly: BF16 -> F32 is lossless) runs the F32 projection path.
  TempDir tmp;
  copy_checkpoint(tiny_dir(), tmp.path(), [](const std::string&, TensorMap& m) {
    for (auto& [n, t] : m) {
      if (t.dtype() != DType::BF16) continue;
      Tensor f(DType::F32, t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) f.set(i, t.get(i));
      t = std::move(f);
    }
  });
  HybridModel m = HybridModel::load(tmp.path().string());
  const std::vector<int32_t> ids = full_sequence();
  Tensor got = all_logits(m, ids, 2);
  EXPECT_LE(nmse(got.ptr<float>(), expected_->logits.ptr<float>(), got.numel()), 1e-8);
}

TEST(Qwen35Loader, MissingTensorNamesFileAndTensor) {
  TempDir tmp;
  const std::string victim = "model.language_model.layers.1.linear_attn.A_log";
  copy_checkpoint(tiny_dir(), tmp.path(), [&](const std::string&, TensorMap& m) { m.erase(victim); });
  const std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("model-00001-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;

  // Gone from the index as well: the error names the tensor and the checkpoint.
  nlohmann::json index = nlohmann::json::parse(read_file(tmp.path() / "model.safetensors.index.json"));
  index["weight_map"].erase(victim);
  write_file(tmp.path() / "model.safetensors.index.json", index.dump());
  const std::string err2 = load_error(tmp.path().string());
  EXPECT_NE(err2.find(victim), std::string::npos) << err2;
  EXPECT_NE(err2.find(tmp.path().string()), std::string::npos) << err2;
}

TEST(Qwen35Loader, WrongShapeNamesFileTensorAndShapes) {
  TempDir tmp;
  const std::string victim = "model.language_model.layers.2.self_attn.k_proj.weight";
  copy_checkpoint(tiny_dir(), tmp.path(), [&](const std::string&, TensorMap& m) {
    if (m.count(victim)) m[victim] = Tensor(DType::BF16, {32, 64});
  });
  const std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("[32,64]"), std::string::npos) << err;
  EXPECT_NE(err.find("[64,64]"), std::string::npos) << err;
}

TEST(Qwen35Loader, UnknownModelTypeNamesTheField) {
  TempDir tmp;
  copy_checkpoint(tiny_dir(), tmp.path());
  nlohmann::json cfg = nlohmann::json::parse(read_file(tmp.path() / "config.json"));
  cfg["model_type"] = "llama";
  write_file(tmp.path() / "config.json", cfg.dump());
  std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("unknown model_type 'llama'"), std::string::npos) << err;

  cfg["model_type"] = "qwen3_5_moe";  // Qwen3.5-MoE runs (test_qwen35moe.cpp), but needs its MoE fields
  err = (write_file(tmp.path() / "config.json", cfg.dump()), load_error(tmp.path().string()));
  EXPECT_NE(err.find("text_config.model_type 'qwen3_5_text'"), std::string::npos) << err;
  cfg["text_config"]["model_type"] = "qwen3_5_moe_text";
  write_file(tmp.path() / "config.json", cfg.dump());
  err = load_error(tmp.path().string());
  EXPECT_NE(err.find("text_config.num_experts"), std::string::npos) << err;

  cfg["model_type"] = "qwen3_5";
  cfg["text_config"]["model_type"] = "qwen3_5_text";
  cfg["text_config"].erase("hidden_size");
  write_file(tmp.path() / "config.json", cfg.dump());
  err = load_error(tmp.path().string());
  EXPECT_NE(err.find("text_config.hidden_size"), std::string::npos) << err;
}

TEST(Qwen35Loader, TruncatedFileNamesFileAndTensor) {
  TempDir tmp;
  copy_checkpoint(tiny_dir(), tmp.path());
  const fs::path shard = tmp.path() / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1000);
  const std::string err = load_error(tmp.path().string());
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("tensor '"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST(Qwen35Loader, NoWeightsOrNoConfig) {
  TempDir tmp;
  EXPECT_NE(load_error(tmp.path().string()).find("no config.json"), std::string::npos);
  fs::copy_file(tiny_dir() / "config.json", tmp.path() / "config.json");
  EXPECT_NE(load_error(tmp.path().string()).find("no model.safetensors"), std::string::npos);
  EXPECT_NE(load_error(tmp.file("nope")).find("not a directory"), std::string::npos);
}

TEST(Qwen35Synthetic, PresetsHaveThePublishedParameterCounts) {
  // Text parts of the safetensors totals of Qwen's published model cards and safetensors headers (total minus vision and
  // MTP): the presets have the real shapes.
  const ModelConfig c = model_preset("qwen3.5-0.8b");
  EXPECT_EQ(c.num_gdn_layers(), 18);
  const int64_t H = 1024, I = 3584;
  const int64_t attn = H * 8 * 256 * 2 + 2 * H * 2 * 256 + 8 * 256 * H + 2 * 256;
  const int64_t mtp = 2 * H * H + 2 * H + (attn + 3 * H * I + 2 * H) + H;
  const int64_t vision_08b = 873438784 - c.parameter_count() - mtp;
  // vision(h=768, I=3072, d=12, out=1024) of §1.3
  const int64_t h = 768, vi = 3072, d = 12, out = 1024;
  const int64_t vision = 1536 * h + h + 2304 * h + d * (4 * h + 4 * h * h + 4 * h + 2 * h * vi + vi + h) + 2 * h +
                         16 * h * h + 4 * h + 4 * h * out + out;
  EXPECT_EQ(vision_08b, vision);
  EXPECT_THROW(model_preset("qwen3.5-7b"), Error);
}

TEST(Qwen35Synthetic, SmallSyntheticModelRunsAndDecodes) {
  ModelConfig c = model_preset("qwen3.5-0.8b");
  c.num_layers = 4;
  c.is_full_attention = {false, false, false, true};
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.mlp.intermediate_size = 512;
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.attention.num_heads = 2;
  c.attention.num_kv_heads = 1;
  HybridModel m = HybridModel::synthetic(c, 7, 2);
  HybridState st = m.new_state();
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 17 % 1000);
  Tensor l = m.forward(st, ids, {.threads = 2});
  Tensor l2 = m.forward(st, std::vector<int32_t>{5}, {.threads = 2});
  for (const Tensor* t : {&l, &l2})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(t->ptr<float>()[i]));
  EXPECT_EQ(st.position, 41);
  int32_t bad[1] = {1000};
  EXPECT_THROW(m.forward(st, bad), Error);
}

// The causal conv + SiLU against fp64, token by token and in one call, on 1 and 2 threads: few
// tokens split the channels over the threads (slices of 64), more split the tokens. Every split
// gives the same bits (a slice's vector loop and tail cover the channels the whole row's do), the
// state ends as the last K - 1 inputs, and calls of one token continue exactly as one long call.
TEST(LayerOps, CausalConvSiluSplitsGiveTheSameBitsAndFollowFp64) {
  struct Case {
    int64_t channels, K, T;
  };
  for (const Case c : {Case{6144, 4, 1}, Case{130, 4, 1}, Case{200, 4, 3}, Case{129, 3, 2}, Case{127, 4, 1},
                       Case{300, 4, 7}, Case{300, 4, 8}, Case{1000, 2, 5}, Case{96, 5, 9}}) {
    const int64_t S = c.K - 1, ldx = c.channels + 5;  // x rows wider than the channels, as a stacked projection's
    uint64_t s = 7;
    auto rnd = [&] {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      return static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    };
    std::vector<float> taps(static_cast<size_t>(c.K * c.channels)), state0(static_cast<size_t>(S * c.channels)),
        x(static_cast<size_t>(c.T * ldx));
    for (auto* v : {&taps, &state0, &x})
      for (float& e : *v) e = rnd();
    std::vector<std::vector<float>> ys, states;
    for (const int nt : {1, 2})
      for (const bool stepwise : {false, true}) {
        const EngineThreads th{&Engine::default_engine(), nt};
        std::vector<float> y(static_cast<size_t>(c.T * c.channels)), state = state0;
        if (stepwise) {
          for (int64_t t = 0; t < c.T; ++t)
            model::causal_conv_silu(x.data() + t * ldx, ldx, y.data() + t * c.channels, 1, c.channels, taps.data(), c.K,
                                    state.data(), th);
        } else {
          model::causal_conv_silu(x.data(), ldx, y.data(), c.T, c.channels, taps.data(), c.K, state.data(), th);
        }
        ys.push_back(y);
        states.push_back(state);
      }
    // fp64: in[r] for r in [-S, T) is the state's row S + r below 0, else x's row r.
    auto in = [&](int64_t r, int64_t ch) {
      return static_cast<double>(r < 0 ? state0[static_cast<size_t>((S + r) * c.channels + ch)]
                                       : x[static_cast<size_t>(r * ldx + ch)]);
    };
    double worst = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t ch = 0; ch < c.channels; ++ch) {
        double a = 0;
        for (int64_t j = 0; j < c.K; ++j) a += static_cast<double>(taps[static_cast<size_t>(j * c.channels + ch)]) * in(t - S + j, ch);
        worst = std::max(worst, std::abs(a / (1 + std::exp(-a)) - ys[0][static_cast<size_t>(t * c.channels + ch)]));
      }
    // f32 sums of K products of |x| <= 2 and the vector SiLU's sigmoid: a few ulps of values up to ~30
    EXPECT_LT(worst, 2e-5) << c.channels << " channels, K " << c.K << ", T " << c.T;
    for (size_t i = 1; i < ys.size(); ++i) {
      EXPECT_EQ(ys[i], ys[0]) << "split " << i << ": " << c.channels << " channels, T " << c.T;
      EXPECT_EQ(states[i], states[0]) << "split " << i << ": " << c.channels << " channels, T " << c.T;
    }
    for (int64_t r = 0; r < S; ++r)
      for (int64_t ch = 0; ch < c.channels; ++ch)
        ASSERT_EQ(states[0][static_cast<size_t>(r * c.channels + ch)], static_cast<float>(in(c.T - S + r, ch)))
            << "state row " << r << " channel " << ch;
  }
}

TEST(Sampler, GreedyTopKTopPAndSeeds) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  Sampler g({.temperature = 0});
  EXPECT_EQ(g.sample(logits), 1);
  Sampler k1({.temperature = 1.0f, .top_k = 1, .top_p = 1.0f, .seed = 3});
  EXPECT_EQ(k1.sample(logits), 1);
  Sampler p({.temperature = 1.0f, .top_k = 0, .top_p = 0.01f, .seed = 3});  // nucleus of one
  EXPECT_EQ(p.sample(logits), 1);
  // top-k 2: only ids 1 and 3, in proportion exp(2.0) : exp(1.9).
  Sampler k2({.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 11});
  int count1 = 0, n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t s = k2.sample(logits);
    ASSERT_TRUE(s == 1 || s == 3);
    count1 += s == 1;
  }
  const double want = std::exp(2.0) / (std::exp(2.0) + std::exp(1.9));
  EXPECT_NEAR(count1 / static_cast<double>(n), want, 0.015);
  // Same seed, same sequence.
  Sampler a({.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 5}), b({.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 5});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.0f}), Error);
}

// Greedy decoding's vector argmax (simd_argmax) gives std::max_element's index on every length
// (vector tails included), with ties (the first wins), the maximum in the tail, -inf, +-0 and NaN
// (at index 0 it is the answer; elsewhere never).
TEST(Sampler, GreedyArgmaxIsStdMaxElement) {
  uint64_t s = 7;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(s >> 40) % 2001 - 1000) / 100.f;  // many ties
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<size_t> lengths;
  for (size_t n = 1; n <= 130; ++n) lengths.push_back(n);
  lengths.push_back(248320);
  int checked = 0;
  for (const size_t n : lengths)
    for (int variant = 0; variant < 7; ++variant) {
      std::vector<float> x(n);
      for (float& v : x) v = next();
      switch (variant) {
        case 1: x[n - 1] = 100.f; break;                                      // the maximum in the tail
        case 2: x[0] = nan; break;                                            // NaN first: index 0
        case 3: x[n / 2] = nan; x[n - 1] = nan; break;                        // NaN elsewhere: skipped
        case 4: for (float& v : x) v = -inf; break;                           // all -inf: index 0
        case 5: for (float& v : x) v = (&v - x.data()) % 3 == 0 ? -0.f : 0.f; break;  // +-0 ties
        case 6: x.back() = 20.f; x[n / 3] = 20.f; break;                      // two equal maxima
        default: break;
      }
      const size_t want = static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
      ASSERT_EQ(model::simd_argmax(x.data(), n), want) << "n = " << n << ", variant " << variant;
      Sampler g({.temperature = 0});
      ASSERT_EQ(g.sample(x), static_cast<int32_t>(want));
      ++checked;
    }
  EXPECT_EQ(checked, 131 * 7);
  EXPECT_EQ(model::simd_argmax(nullptr, 0), 0u);
}

// The sampler's fast paths (no filter: a draw in id order; nucleus: a growing sorted top m)
// against the distribution a full sort defines: every draw inside the reference nucleus, and each
// token's frequency near its renormalized probability. Flat logits over 2000 tokens make the
// nucleus far larger than the first selection of 256, so the growing path is taken too.
TEST(Sampler, FastPathsDrawFromTheFullSortsDistribution) {
  for (const float spread : {8.0f, 0.05f}) {  // peaked, and nearly flat
    std::vector<float> logits(2000);
    uint64_t s = 42;
    for (float& x : logits) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x = spread * static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0);
    }
    logits[17] = logits[1500];  // a tie, broken by id
    for (const float top_p : {1.0f, 0.9f, 0.3f}) {
      // Reference: sort everything, softmax in double, smallest prefix reaching top_p.
      std::vector<int32_t> order(logits.size());
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      std::vector<double> p(logits.size());
      double z = 0;
      for (size_t i = 0; i < p.size(); ++i) z += (p[i] = std::exp(static_cast<double>(logits[i]) - logits[order[0]]));
      std::vector<double> want(logits.size(), 0.0);
      double cum = 0, kept = 0;
      size_t nucleus = 0;
      while (nucleus < order.size() && (nucleus == 0 || cum < top_p)) kept += p[order[nucleus]], cum += p[order[nucleus++]] / z;
      for (size_t i = 0; i < nucleus; ++i) want[order[i]] = p[order[i]] / kept;
      Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = top_p, .seed = 9});
      const int draws = 10000;
      std::vector<int> seen(logits.size(), 0);
      for (int d = 0; d < draws; ++d) {
        const int32_t t = sampler.sample(logits);
        ASSERT_GT(want[t], 0.0) << "token " << t << " outside the nucleus of " << nucleus << " (top_p " << top_p << ")";
        ++seen[t];
      }
      // The five most probable tokens: frequency within 5 standard deviations of the binomial.
      for (size_t i = 0; i < std::min<size_t>(5, nucleus); ++i) {
        const double q = want[order[i]], sd = std::sqrt(q * (1 - q) / draws);
        EXPECT_NEAR(seen[order[i]] / static_cast<double>(draws), q, 5 * sd + 1e-9)
            << "spread " << spread << " top_p " << top_p << " rank " << i;
      }
    }
  }
}

}  // namespace
}  // namespace hanpu

namespace hanpu {
namespace {

// The attention block kernel against a plain double-precision softmax(q k^T) v, for head dims on
// and off the vector width, GQA groups, and a cache that already holds p0 tokens. T <= 4 takes
// the cache-layout path (splits of 256 keys merged by their maxima): contexts within one split,
// across split boundaries (600 = 2 splits + 88, 255 + 1 = exactly one), a single key, several new
// tokens with different causal limits, one KV head for all query heads (MLA's latent). Values of
// their own width (dv) and row stride (ldv; 0: nkv x dv): MLA's expanded heads (192 / 128) and its
// latent cache (values = the first r dims of the key rows), on both paths, with dv off the tile.
TEST(Qwen35Ops, CausalAttentionMatchesPlainSoftmax) {
  struct Case {
    int64_t T, p0, nq, nkv, hd, dv = 0, ldv = 0;  // dv 0: hd
  };
  for (const Case c : {Case{70, 0, 8, 2, 256}, Case{5, 33, 4, 2, 40}, Case{1, 100, 8, 2, 256}, Case{37, 3, 3, 3, 8},
                       Case{1, 0, 4, 2, 24}, Case{1, 600, 8, 2, 256}, Case{1, 255, 6, 3, 36}, Case{3, 510, 4, 1, 72},
                       Case{4, 1000, 32, 1, 20}, Case{2, 0, 2, 2, 17}, Case{45, 2, 5, 5, 48, 32},
                       Case{3, 300, 4, 4, 48, 32}, Case{29, 0, 7, 1, 72, 64, 72}, Case{2, 270, 7, 1, 72, 64, 72},
                       Case{33, 1, 4, 2, 24, 13}, Case{1, 9, 4, 2, 24, 13, 40}}) {
    const int64_t keys = c.p0 + c.T, group = c.nq / c.nkv, dv = c.dv ? c.dv : c.hd, ldv = c.ldv ? c.ldv : c.nkv * dv;
    std::vector<float> q(static_cast<size_t>(c.T * c.nq * c.hd)), k(static_cast<size_t>(keys * c.nkv * c.hd)),
        v(static_cast<size_t>(keys * ldv)), out(static_cast<size_t>(c.T * c.nq * dv));
    uint64_t s = 99;
    auto rnd = [&] {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      return static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    };
    for (auto* vec : {&q, &k, &v})
      for (float& x : *vec) x = rnd();
    const float* values = v.data();
    if (c.ldv == c.nkv * c.hd && c.nkv == 1) values = k.data();  // the latent form: values inside the key rows
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    const EngineThreads th{&Engine::default_engine(), 2};
    if (c.dv == 0 && c.ldv == 0)
      model::causal_attention(q.data(), k.data(), values, out.data(), c.T, c.p0, c.nq, c.nkv, c.hd, scale, th);
    else
      model::causal_attention(q.data(), k.data(), values, out.data(), c.T, c.p0, c.nq, c.nkv, c.hd, dv, ldv, scale, th);
    double worst = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t h = 0; h < c.nq; ++h) {
        const int64_t g = h / group, visible = c.p0 + t + 1;
        std::vector<double> p(static_cast<size_t>(visible));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < c.hd; ++i)
            dot += static_cast<double>(q[static_cast<size_t>((t * c.nq + h) * c.hd + i)]) *
                   k[static_cast<size_t>((j * c.nkv + g) * c.hd + i)];
          p[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < dv; ++i) {
          double o = 0;
          for (int64_t j = 0; j < visible; ++j)
            o += p[static_cast<size_t>(j)] / sum * values[static_cast<size_t>(j * ldv + g * dv + i)];
          worst = std::max(worst, std::abs(o - out[static_cast<size_t>((t * c.nq + h) * dv + i)]));
        }
      }
    EXPECT_LT(worst, 2e-5) << "T " << c.T << " p0 " << c.p0 << " hd " << c.hd << " dv " << dv << " ldv " << ldv;
  }
}

}  // namespace
}  // namespace hanpu

namespace hanpu {
namespace {

// SafetensorsFile::map: same tensors as open() (including one at an offset misaligned for its
// dtype, which gets an aligned copy), prefault reports progress, a truncated file is refused.
TEST(SafetensorsMap, MappedViewsEqualReadViews) {
  TempDir tmp;
  const std::string path = tmp.file("m.safetensors");
  Tensor a(DType::BF16, {3, 5}), b(DType::F32, {7}), c(DType::I64, {2});
  for (int64_t i = 0; i < 15; ++i) a.set(i, i * 0.5 - 3);
  for (int64_t i = 0; i < 7; ++i) b.set(i, i * 1.25);
  c.set(0, 42), c.set(1, -7);
  // a (30 bytes) first: b then starts at an offset that is not a multiple of 4.
  write_safetensors(path, {{"a", a.view()}, {"b", b.view()}, {"c", c.view()}});
  SafetensorsFile read = SafetensorsFile::open(path), mapped = SafetensorsFile::map(path);
  EXPECT_EQ(mapped.names(), read.names());
  EXPECT_EQ(mapped.data_bytes(), read.data_bytes());
  for (const std::string& n : {"a", "b", "c"}) {
    TensorView x = read.get(n), y = mapped.get(n);
    ASSERT_EQ(x.shape_str(), y.shape_str());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(y.data) % dtype_size(y.dtype), 0u) << n;
    EXPECT_EQ(std::memcmp(x.data, y.data, static_cast<size_t>(x.numel()) * dtype_size(x.dtype)), 0) << n;
  }
  uint64_t last = 0;
  mapped.prefault([&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, mapped.data_bytes());
    last = done;
  });
  EXPECT_EQ(last, mapped.data_bytes());

  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  try {
    SafetensorsFile::map(path);
    ADD_FAILURE() << "truncated file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'c'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hanpu

// WeightReader::stacked (the model's stacked projections): one projection whose outputs are the
// parts' outputs side by side, bit for bit, in bf16 and in int8; every part handed to `release`
// exactly once, after its rows were copied (the synthetic model frees them then).
TEST(StackedProjection, EqualsThePartsAndReleasesEachPartOnce) {
  const int64_t K = 96, M = 20;
  const std::vector<std::pair<std::string, int64_t>> parts = {{"a.weight", 40}, {"b.weight", 7}, {"c.weight", 33}};
  std::map<std::string, std::vector<uint16_t>> store;
  uint32_t s = 12345;
  auto next = [&] { s = s * 1664525u + 1013904223u; return static_cast<float>(s >> 8) / 16777216.0f - 0.5f; };
  for (const auto& [name, rows] : parts) {
    std::vector<uint16_t>& w = store[name];
    for (int64_t i = 0; i < rows * K; ++i) w.push_back(hanpu::f32_to_bf16(next()));
  }
  std::vector<float> x(static_cast<size_t>(M * K));
  for (float& v : x) v = next();
  // As stored (bf16), and converted at load by the int8 (group 32) and f16 rows' quantizers.
  for (const std::optional<hanpu::WeightFormat> format :
       {std::optional<hanpu::WeightFormat>{}, std::optional{hanpu::WeightFormat::kInt8},
        std::optional{hanpu::WeightFormat::kF16}}) {
    const std::string group = format ? hanpu::weight_format_info(*format).name : "bf16";  // (named for the messages)
    std::vector<hanpu::ByteBuffer> owned;
    std::map<std::string, int> released;
    hanpu::model::WeightReader w;
    w.get = [&](const std::string& name, const std::vector<int64_t>& shape) {
      EXPECT_EQ(released.count(name), 0u) << name << " read after it was released";
      return hanpu::TensorView::contiguous(store.at(name).data(), hanpu::DType::BF16, shape);
    };
    w.has = [&](const std::string& name) { return store.count(name) > 0; };
    w.owned = &owned;
    if (format) w.load = {&hanpu::weight_format_info(*format), 32};
    w.release = [&](const std::string& name) { ++released[name]; };
    const hanpu::model::Projection stacked = w.stacked(parts, K);
    ASSERT_EQ(stacked.out_features(), 80);
    for (const auto& [name, rows] : parts) EXPECT_EQ(released[name], 1) << name << ", format " << group;
    released.clear();
    std::vector<float> y(static_cast<size_t>(M * 80));
    const hanpu::EngineThreads th{&hanpu::Engine::default_engine(), 1};
    stacked.forward(x.data(), K, y.data(), 80, M, th, false);
    int64_t col = 0;
    for (const auto& [name, rows] : parts) {
      const hanpu::model::Projection one = w.projection(name, rows, K);
      std::vector<float> yp(static_cast<size_t>(M * rows));
      one.forward(x.data(), K, yp.data(), rows, M, th, false);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < rows; ++n)
          ASSERT_EQ(y[static_cast<size_t>(m * 80 + col + n)], yp[static_cast<size_t>(m * rows + n)])
              << name << " row " << m << " col " << n << ", format " << group;
      col += rows;
    }
  }
}
