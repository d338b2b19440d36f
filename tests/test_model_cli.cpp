// `hanpu run` and `hanpu bench-model` end to end on the tiny transformers-made checkpoints
// (tests/golden/qwen35_tiny; greedy, text-prompt and bench-model checks also on
// tests/golden/qwen3next_tiny): the greedy run reproduces transformers' continuation and its
// --logits-out file transformers' logits (one forward, and one per token); bench-model --json prints well-formed rows; bad input
// gives one error line naming the problem and exit code 1.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/gguf.hpp"
#include "io/safetensors.hpp"
#include "test_support.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace {

using hanpu::SafetensorsFile;
using hanpu::Tensor;
using hanpu::testing::TempDir;

using hanpu::testing::read_text;
using RunResult = hanpu::testing::CommandResult;
std::string quote(const std::string& s) { return hanpu::testing::shell_quote(s); }

RunResult run_hanpu(const TempDir& dir, const std::string& args) {
  return hanpu::testing::run_command(dir, quote(HANPU_EXE) + " " + args);
}

std::string tiny(const char* name = "qwen35_tiny") { return (hanpu::testing::golden_dir() / name).string(); }
// The transformers-made checkpoints with a text-prompt record: Qwen3.5 and Qwen3-Next (fused
// projections, MoE).
constexpr const char* kGoldens[] = {"qwen35_tiny", "qwen3next_tiny"};
// Every family's checkpoint: those two, Qwen3.5-MoE, Kimi Linear and Ling 3.0 (KDA, MLA, sigmoid
// MoE; no tokenizer.json: they run with --prompt-ids).
constexpr const char* kAllFamilies[] = {"qwen35_tiny", "qwen3next_tiny", "qwen35moe_tiny", "kimi_linear_tiny",
                                        "bailing_hybrid_tiny"};

struct Expected {
  std::vector<long long> prompt, greedy;
  Tensor logits;
};
Expected expected(const char* name = "qwen35_tiny") {
  SafetensorsFile f = SafetensorsFile::open(tiny(name) + "/expected.safetensors");
  Expected e;
  Tensor p = f.load_copy("prompt_ids"), g = f.load_copy("greedy_ids");
  for (int64_t i = 0; i < p.numel(); ++i) e.prompt.push_back(static_cast<long long>(p.get(i)));
  for (int64_t i = 0; i < g.numel(); ++i) e.greedy.push_back(static_cast<long long>(g.get(i)));
  e.logits = f.load_copy("logits");
  return e;
}

TEST(ModelCli, GreedyRunReproducesTransformers) {
  for (const char* golden : kAllFamilies) {
    SCOPED_TRACE(golden);
    TempDir tmp;
    const Expected e = expected(golden);
    std::string ids;
    for (long long id : e.prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    const std::string logits_path = tmp.file("logits.safetensors");
    const RunResult r = run_hanpu(tmp, "run --model " + quote(tiny(golden)) + " --prompt-ids " + ids + " -n " +
                                           std::to_string(e.greedy.size()) + " --greedy --ids --threads 2 --logits-out " +
                                           quote(logits_path));
    ASSERT_EQ(r.code, 0) << r.err;
    std::istringstream out(r.out);
    std::vector<long long> got;
    for (long long id; out >> id;) got.push_back(id);
    EXPECT_EQ(got, e.greedy) << r.out;
    for (const char* field : {"prompt tokens 75", "time to first token", "prefill", "decode", "peak memory"})
      EXPECT_NE(r.err.find(field), std::string::npos) << field << " missing in: " << r.err;

    // The prompt's logits, from one whole-sequence forward and (--logits-per-token) from one forward
    // per token, the decode path: both transformers' at every position, and the same continuation.
    const std::string step_path = tmp.file("logits-step.safetensors");
    const RunResult rs = run_hanpu(tmp, "run --model " + quote(tiny(golden)) + " --prompt-ids " + ids + " -n " +
                                            std::to_string(e.greedy.size()) + " --greedy --ids --threads 2 --logits-out " +
                                            quote(step_path) + " --logits-per-token");
    ASSERT_EQ(rs.code, 0) << rs.err;
    EXPECT_EQ(rs.out, r.out);
    for (const std::string& path : {logits_path, step_path}) {
      SCOPED_TRACE(path);
      SafetensorsFile f = SafetensorsFile::open(path);
      Tensor l = f.load_copy("logits");
      const int64_t V = e.logits.shape()[1], T0 = static_cast<int64_t>(e.prompt.size());
      ASSERT_EQ(l.shape(), (std::vector<int64_t>{T0, V}));
      double err = 0, ref = 0;
      for (int64_t i = 0; i < T0 * V; ++i) {
        const double d = l.get(i) - e.logits.get(i);
        err += d * d;
        ref += e.logits.get(i) * e.logits.get(i);
      }
      EXPECT_LE(err / ref, 1e-8);
    }
  }
}

TEST(ModelCli, TextPromptRunReproducesTokenizersAndTransformers) {
  // The golden's text prompt, encoded by the tokenizers library, continued greedily by transformers.
  for (const char* golden : kGoldens) {
    SCOPED_TRACE(golden);
    TempDir tmp;
    SafetensorsFile f = SafetensorsFile::open(tiny(golden) + "/expected.safetensors");
    const std::string text = f.metadata().at("text_prompt");
    Tensor prompt = f.load_copy("text_prompt_ids"), greedy = f.load_copy("text_greedy_ids");
    std::vector<long long> want;
    for (int64_t i = 0; i < greedy.numel(); ++i) want.push_back(static_cast<long long>(greedy.get(i)));
    const RunResult r = run_hanpu(tmp, "run --model " + quote(tiny(golden)) + " --prompt " + quote(text) + " -n " +
                                           std::to_string(want.size()) + " --greedy --ids");
    ASSERT_EQ(r.code, 0) << r.err;
    std::istringstream out(r.out);
    std::vector<long long> got;
    for (long long id; out >> id;) got.push_back(id);
    EXPECT_EQ(got, want) << r.out;
    EXPECT_NE(r.err.find("prompt tokens " + std::to_string(prompt.numel())), std::string::npos) << r.err;
  }
}

TEST(ModelCli, SampledRunIsReproducibleWithASeed) {
  TempDir tmp;
  const std::string args = "run --model " + quote(tiny()) + " --prompt-ids 5,6,7 -n 12 --ids --temp 1.0 --top-k 50 "
                           "--top-p 0.9 --seed 42";
  const RunResult a = run_hanpu(tmp, args), b = run_hanpu(tmp, args);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(ModelCli, BenchModelJsonRows) {
  for (const char* golden : kAllFamilies) {
    SCOPED_TRACE(golden);
    TempDir tmp;
    const RunResult r =
        run_hanpu(tmp, "bench-model --model " + quote(tiny(golden)) + " -p 8,70 --threads 2 --decode-tokens 3 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    std::istringstream lines(r.out);
    std::vector<nlohmann::json> rows;
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(rows.size(), 2u) << r.out;
    EXPECT_EQ(rows[0]["prompt_tokens"], 8);
    EXPECT_EQ(rows[1]["prompt_tokens"], 70);
    for (const auto& row : rows) {
      EXPECT_EQ(row["threads"], 2);
      EXPECT_EQ(row["warmup_runs"], 1);  // the default, as llama-bench
      for (const char* k : {"prefill_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "prefill_gflops_total",
                            "decode_weight_gbs", "decode_weight_bytes_per_token", "machine_fma_peak_gflops",
                            "machine_read_bandwidth_gbs"})
        EXPECT_GT(row[k].get<double>(), 0) << k;
      EXPECT_GT(row["prefill_gflops"]["MLP"].get<double>(), 0);
      double shares = 0;
      for (const char* k : {"share_gdn", "share_kda", "share_attention", "share_mlp", "share_lm_head", "share_other"})
        shares += row[k].get<double>();
      EXPECT_NEAR(shares, 1.0, 1e-9);
      // Time lands in the block kinds the model has, and only there.
      const bool kda = std::string(golden) == "kimi_linear_tiny" || std::string(golden) == "bailing_hybrid_tiny";
      EXPECT_EQ(row["share_kda"].get<double>() > 0, kda);
      EXPECT_EQ(row["share_gdn"].get<double>() > 0, !kda);
      // Decode per part: every part that streams weights, under its family's name.
      const auto& parts = row["decode_part_weight_gbs"];
      for (const char* k : {kda ? "KDA projections" : "GDN projections", "attention projections", "MLP", "LM head"})
        EXPECT_GT(parts.value(k, 0.0), 0) << k;
      EXPECT_FALSE(parts.contains(kda ? "GDN projections" : "KDA projections"));
      EXPECT_GE(row["decode_rest_ms_per_token"].get<double>(), 0);
    }
  }
}

TEST(ModelCli, BenchModelLabelsAGgufFilesWeights) {
  // A GGUF file runs its own block formats: the row says so, and its bytes per weight are the
  // file's (the tiny Qwen3.5 in Q8_0: 34 bytes per 32 weights, F32 norms and an F16 embedding
  // beside them), not --weights' default bf16's 2.
  TempDir tmp;
  const std::string file = (hanpu::testing::golden_dir().parent_path() / "data" / "gguf" / "qwen35_tiny-q8_0.gguf").string();
  const RunResult r = run_hanpu(tmp, "bench-model --model " + quote(file) + " -p 8 --threads 1 --decode-tokens 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json row = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_EQ(row["weights"], "gguf");
  EXPECT_GT(row["weight_bytes_per_parameter"].get<double>(), 34.0 / 32 - 1e-9);
  EXPECT_LT(row["weight_bytes_per_parameter"].get<double>(), 2.0);
  // Per part, a decode token's bytes are the part's own tensors' (the tied F16 embedding as the LM
  // head, not the file's average bytes per weight); the parts add up to the file's matrices.
  const hanpu::GgufModel m = hanpu::GgufModel::open(file);
  double mlp = 0, mixers = 0;
  for (const hanpu::GgufTensorInfo& t : m.main().tensors()) {
    if (t.name.rfind("blk.", 0) != 0 || t.n_dims < 2 || t.name.find("norm") != std::string::npos ||
        t.name.find("conv") != std::string::npos)
      continue;
    (t.name.find(".ffn_") != std::string::npos ? mlp : mixers) += static_cast<double>(t.bytes);
  }
  const auto& bytes = row["decode_part_weight_bytes_per_token"];
  EXPECT_NEAR(bytes["LM head"].get<double>(), static_cast<double>(m.tensor("token_embd.weight").bytes), 1e-6);
  EXPECT_NEAR(bytes["MLP"].get<double>(), mlp, 1e-6 * mlp);
  EXPECT_NEAR(bytes["GDN projections"].get<double>() + bytes["attention projections"].get<double>(), mixers, 1e-6 * mixers);
  // The linear-attention states: read and written once per token, F32 (a recurrent [HV, K, V] per
  // GDN layer and its conv state), more than the recurrent states alone.
  EXPECT_GT(row["decode_state_bytes_per_token"].get<double>(), 0);
  // A safetensors golden keeps the --weights label.
  const RunResult g = run_hanpu(tmp, "bench-model --model " + quote(tiny()) + " -p 8 --threads 1 --decode-tokens 2 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out.substr(0, g.out.find('\n')))["weights"], "bf16");
}

TEST(ModelCli, BenchModelSyntheticFromAConfigJson) {
  // Random weights of the shapes any family's config.json gives (here the Ling golden's).
  TempDir tmp;
  const RunResult r = run_hanpu(tmp, "bench-model --synthetic " + quote(tiny("bailing_hybrid_tiny") + "/config.json") +
                                         " -p 20 --threads 1 --decode-tokens 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json row = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_GT(row["share_kda"].get<double>(), 0);
  EXPECT_GT(row["decode_tokens_per_s"].get<double>(), 0);
}

TEST(ModelCli, TextPromptWithoutTokenizerNamesTheFix) {
  TempDir tmp;
  const RunResult r = run_hanpu(tmp, "run --model " + quote(tiny("kimi_linear_tiny")) + " --prompt hello -n 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no tokenizer.json; use --prompt-ids"), std::string::npos) << r.err;
}

TEST(ModelCli, BadInputGivesOneErrorLine) {
  TempDir tmp;
  RunResult r = run_hanpu(tmp, "run --model " + quote(tmp.file("missing")) + " --prompt-ids 1,2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;
  r = run_hanpu(tmp, "run --model " + quote(tiny()) + " --prompt-ids 1,x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("'x' is not a token id"), std::string::npos) << r.err;
  r = run_hanpu(tmp, "run --model " + quote(tiny()) + " --prompt-ids 1,99999");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("99999"), std::string::npos) << r.err;
  r = run_hanpu(tmp, "run --model " + quote(tiny()) + " --prompt-ids 1,2 --logits-per-token");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--logits-per-token needs --logits-out"), std::string::npos) << r.err;
  r = run_hanpu(tmp, "bench-model --synthetic qwen3.5-1b");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("qwen3.5-0.8b"), std::string::npos) << r.err;
}


// hanpu quantize: the written checkpoint stores the projections as I8 + F32 scales with the group
// in its metadata, and running it gives exactly the logits of quantizing at load, on every family;
// a different --int8-group on such a file is refused by name.
TEST(ModelCli, QuantizedCheckpointEqualsQuantizingAtLoad) {
  for (const char* golden : kAllFamilies) {
    SCOPED_TRACE(golden);
    TempDir tmp;
    const std::string out = tmp.file("int8");
    RunResult r = run_hanpu(tmp, "quantize --model " + quote(tiny(golden)) + " --out " + quote(out) + " --int8-group 32");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("projections stored as int8 (group 32)"), std::string::npos) << r.err;
    bool saw_i8 = false;
    for (const auto& entry : std::filesystem::directory_iterator(out)) {
      if (entry.path().extension() != ".safetensors") continue;
      SafetensorsFile f = SafetensorsFile::open(entry.path().string());
      EXPECT_EQ(f.metadata().at("hanpu.int8_group"), "32");
      for (const std::string& n : f.names())
        if (f.get(n).dtype == hanpu::DType::I8) {
          saw_i8 = true;
          EXPECT_TRUE(f.has(n + ".int8_scale")) << n;
        }
    }
    EXPECT_TRUE(saw_i8);
    const std::string a = tmp.file("a.safetensors"), b = tmp.file("b.safetensors");
    r = run_hanpu(tmp, "run --model " + quote(out) + " --prompt-ids 3,1,4,1,5,9,2,6 -n 2 --greedy --ids --logits-out " + quote(a));
    ASSERT_EQ(r.code, 0) << r.err;
    r = run_hanpu(tmp, "run --model " + quote(tiny(golden)) + " --prompt-ids 3,1,4,1,5,9,2,6 -n 2 --greedy --ids "
                       "--weights int8 --int8-group 32 --logits-out " + quote(b));
    ASSERT_EQ(r.code, 0) << r.err;
    const Tensor la = SafetensorsFile::open(a).load_copy("logits"), lb = SafetensorsFile::open(b).load_copy("logits");
    ASSERT_EQ(la.shape(), lb.shape());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.bytes()), 0);
    r = run_hanpu(tmp, "run --model " + quote(out) + " --prompt-ids 1,2 -n 1 --weights int8 --int8-group 64");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("holds int8 weights with group 32, but int8 group 64 was asked for"), std::string::npos) << r.err;
  }
  TempDir tmp;
  const RunResult r = run_hanpu(tmp, "quantize --model " + quote(tiny()) + " --out " + quote(tiny()));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is the input checkpoint"), std::string::npos) << r.err;
}

}  // namespace
