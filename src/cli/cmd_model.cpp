// `hanpu run` (generate text from a checkpoint of any supported hybrid family) and `hanpu bench-model` (prefill and decode
// speed of a checkpoint or of a synthetic model with the real shapes, with the share of time per
// part of the model).
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf_arch.hpp"
#include "cli/commands.hpp"
#include "cli/weight_args.hpp"
#include "hanpu/isa.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/host.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/generator.hpp"
#include "hanpu/model.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"
#include "io/safetensors.hpp"
#include "model/model_work.hpp"

namespace {

// 262,144 tokens: the native context length of Qwen3.5 and Qwen3-Next (max_position_embeddings in
// their Hugging Face config.json); longer prompts would not be served by the model anyway.
constexpr int64_t kMaxPromptTokens = int64_t{1} << 18;


using namespace hanpu;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds of the whole process (all threads): with other work on the machine, wall time
// includes waiting for a core; CPU time / threads is what the run would take on idle cores.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The process's resident high-water mark in MiB: VmHWM of /proc/self/status, which
// reset_peak_rss() can lower (getrusage's ru_maxrss cannot be reset); ru_maxrss where /proc is not
// readable.
double peak_rss_mib() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) return static_cast<double>(kib) / 1024.0;
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// Lowers the high-water mark to the current resident size (proc(5), /proc/pid/clear_refs, value 5,
// Linux 4.0 and later), so that the peak reported after it is the model's own and not the
// bandwidth probe's buffer, which is 4x the last-level cache up to 1 GiB (a 260 MiB L3 makes it
// 1 GiB: on such a machine the probe had added 1 GiB to the reported peak). Returns false where the
// kernel does not allow it; the report then says the peak includes the probe.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      throw Error("--prompt-ids: '" + item + "' is not a token id (expected comma-separated non-negative integers)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error("--prompt-ids: no ids given");
  return ids;
}

// --precision as a LinearPrecision; int8 (quantized activations) is for int8 weights only, so a
// synthetic model without --weights int8 is refused rather than silently run exact. (A checkpoint
// `hanpu quantize` wrote carries int8 weights without the flag.)
LinearPrecision precision_for(const std::string& name, const WeightArgs& w, bool synthetic) {
  const LinearPrecision p = linear_precision_from_name(name);
  if (p == LinearPrecision::kInt8 && synthetic && !w.int8())
    throw Error("--precision int8 quantizes the activations of int8 projections; give --weights int8 too");
  return p;
}

// What the projections compute, for the header line.
std::string projections_description(LinearPrecision p, const WeightArgs& w) {
  if (!w.int8()) return linear_precision_name(p);
  if (p != LinearPrecision::kInt8) return "int8 x f32";
  return Int8Linear::int8_activations_available(1)
             ? "int8 x f32 for prefill, int8 x int8 (activations quantized per group, AVX512-VNNI or AVX2) for decode"
             : "int8 x f32 (no AVX2 or AVX512-VNNI here: --precision int8 runs as exact)";
}

struct RunArgs {
  std::string model_dir, prompt, prompt_ids, logits_out, system, precision = "exact";
  int n_predict = 128;
  bool chat = false, greedy = false, think = false, print_ids = false, logits_per_token = false;
  int threads = 0;
  float temperature = 0.7f, top_p = 0.95f;
  int top_k = 20;
  uint64_t seed = 0;
  WeightArgs weights;
};

void run_generate(const RunArgs& a) {
  if (a.prompt.empty() == a.prompt_ids.empty()) throw Error("give exactly one of --prompt and --prompt-ids");
  if (a.logits_per_token && a.logits_out.empty()) throw Error("--logits-per-token needs --logits-out FILE");
  const int threads = a.threads > 0 ? a.threads : hardware_threads();
  HybridModel model = HybridModel::load(
      a.model_dir, {.progress = true,
                    .weights = a.weights.options(),
                    .engine = std::make_shared<Engine>(threads)});
  const ModelConfig& cfg = model.config();

  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    if (a.chat) throw Error("--chat needs a text --prompt, not --prompt-ids");
    prompt = parse_ids(a.prompt_ids);
  }
  // tokenizer.json (Qwen) or tiktoken.model (Kimi Linear); Tokenizer::from_dir picks the format.
  const std::filesystem::path dir(a.model_dir);
  if (std::filesystem::exists(dir / "tokenizer.json") || std::filesystem::exists(dir / "tiktoken.model") ||
       (model::is_gguf_path(a.model_dir) && model::gguf_has_tokenizer(a.model_dir)))
    tok = std::make_unique<Tokenizer>(Tokenizer::from_dir(a.model_dir));
  if (!a.prompt.empty()) {
    if (!tok) throw Error("checkpoint '" + a.model_dir + "' has no tiktoken.model and no tokenizer.json; use --prompt-ids");
    std::string text = a.prompt;
    if (a.chat) {
      std::vector<ChatMessage> msgs;
      if (!a.system.empty()) msgs.push_back({"system", a.system});
      msgs.push_back({"user", a.prompt});
      // the checkpoint's chat template when it has one, else ChatML (hanpu/chat_template.hpp)
      const std::unique_ptr<ChatTemplate> tmpl = load_chat_template(a.model_dir);
      text = render_chat_prompt(tmpl.get(), chat_template_special_tokens(a.model_dir), *tok, msgs, true, a.think);
    }
    prompt = tok->encode(text, /*parse_special=*/a.chat);
    if (prompt.empty()) throw Error("--prompt: the prompt encodes to no tokens");
  }

  // The one generation path (hanpu/generator.hpp): the stop ids, sampling and stop rules of
  // `hanpu serve` and the Python package; prefill in the same chunks as they do.
  const Generator gen(model, tok.get());
  GenerationOptions go;
  go.sampling = {.temperature = a.greedy ? 0.f : a.temperature, .top_k = a.top_k, .top_p = a.top_p, .seed = a.seed};
  go.max_tokens = a.n_predict;
  HybridState st = model.new_state();
  const LinearPrecision precision = precision_for(a.precision, a.weights, false);
  const ForwardOptions fo{.threads = threads, .precision = precision};
  const int64_t V = cfg.vocab_size;

  auto emit = [&](int32_t id) {
    if (tok && !a.print_ids) {
      std::cout << tok->token_bytes(id);
      std::cout.flush();
      return;
    }
    std::cout << id << ' ';
    std::cout.flush();
  };
  const auto t_prefill = Clock::now();
  Generator::Result r;
  double prefill_s = 0;
  if (!a.logits_out.empty()) {
    // Every prompt position's logits: one pass with all_logits (the prefill path), or with
    // --logits-per-token one forward per token (the decode path: what each generated token runs,
    // e.g. the GGUF GEMVs on int8 activations), then the same decode loop.
    Tensor logits;
    if (a.logits_per_token) {
      logits = Tensor(DType::F32, {static_cast<int64_t>(prompt.size()), V});
      for (size_t t = 0; t < prompt.size(); ++t) {
        const Tensor step = model.forward(st, std::span(prompt).subspan(t, 1), fo);
        std::copy_n(step.ptr<float>(), V, logits.ptr<float>() + static_cast<int64_t>(t) * V);
      }
    } else {
      logits = model.forward(st, prompt, {.threads = threads, .all_logits = true, .precision = precision});
    }
    prefill_s = seconds_since(t_prefill);
    Tensor ids(DType::I64, {static_cast<int64_t>(prompt.size())});
    for (size_t i = 0; i < prompt.size(); ++i) ids.set(static_cast<int64_t>(i), prompt[i]);
    write_safetensors(a.logits_out, {{"logits", logits.view()}, {"prompt_ids", ids.view()}},
                      {{"model", a.model_dir}, {"generator", "hanpu run"}});
    const float* last = logits.ptr<float>() + (logits.shape()[0] - 1) * V;
    r = gen.decode(st, {last, static_cast<size_t>(V)}, go, fo, emit);
    r.first_token_seconds += prefill_s;
  } else {
    r = gen.generate(st, prompt, go, fo, Generator::kDefaultPrefillChunk, emit);
    prefill_s = r.prefill_seconds;
  }
  const int generated = static_cast<int>(r.tokens.size());
  const double ttft = a.n_predict > 0 ? r.first_token_seconds : 0, decode_s = r.decode_seconds;
  const std::string stop_reason = r.reason == FinishReason::kStopToken ? "end of sequence" : "length";
  std::cout << '\n';
  std::fprintf(stderr,
               "\nprompt tokens %zu, generated %d (%s)\n"
               "time to first token %.3f s, prefill %.1f tokens/s, decode %.2f tokens/s (%d threads)\n"
               "peak memory %.0f MiB (weights %.0f MiB mapped, state %.1f MiB)\n",
               prompt.size(), generated, stop_reason.c_str(), ttft,
               static_cast<double>(prompt.size()) / prefill_s,
               generated > 1 ? (generated - 1) / decode_s : 0.0, threads, peak_rss_mib(),
               static_cast<double>(model.weight_bytes()) / 1048576.0, static_cast<double>(st.bytes()) / 1048576.0);
}

struct BenchModelArgs {
  std::string model_dir, synthetic, precision = "exact";
  std::vector<int64_t> prompt_lengths{512, 2048};
  int threads = 0;
  int decode_tokens = 16;
  int warmup = 1;
  bool json = false;
  uint64_t seed = 1;
  WeightArgs weights;
};

// A GGUF file's bytes per weight per part, from its tensors (blk.{i}.* by the layer's kind; ffn_*
// the MLP; output.weight, else the tied token_embd.weight, the LM head): its bytes over its
// elements, so that a part in another format than the file's average (the Q6_K LM head of a
// Q4_K_M file) is counted at its own size. Matrices only: norms, conv taps and per-head vectors
// (1-D, or a name with "norm" or "conv") are left out, as forward_work leaves them out.
void set_gguf_part_bytes(const std::string& path, const ModelConfig& cfg, model::ProjectionWork& w) {
  const GgufModel m = GgufModel::open(path);
  double bytes[4] = {0, 0, 0, 0}, elems[4] = {0, 0, 0, 0};  // linear, attention, mlp, lm head
  const auto count = [&](int part, const GgufTensorInfo& t) {
    bytes[part] += static_cast<double>(t.bytes);
    elems[part] += static_cast<double>(t.numel());
  };
  for (const GgufFile& f : m.files())
    for (const GgufTensorInfo& t : f.tensors()) {
      if (t.name.rfind("blk.", 0) != 0) continue;
      const size_t dot = t.name.find('.', 4);
      if (dot == std::string::npos) continue;
      const int64_t layer = std::stoll(t.name.substr(4, dot - 4));
      const std::string rest = t.name.substr(dot + 1);
      if (layer >= cfg.num_layers || t.n_dims < 2 || rest.find("norm") != std::string::npos ||
          rest.find("conv") != std::string::npos)
        continue;
      if (rest.rfind("ffn_", 0) == 0)
        count(2, t);
      else
        count(cfg.token_mixer(layer) == cfg.attention_mixer ? 1 : 0, t);
    }
  const GgufTensorInfo* head = m.find_tensor("output.weight");
  if (head == nullptr) head = m.find_tensor("token_embd.weight");
  if (head != nullptr) count(3, *head);
  double* out[4] = {&w.linear_bytes_per_weight, &w.attention_bytes_per_weight, &w.mlp_bytes_per_weight,
                    &w.lm_head_bytes_per_weight};
  for (int p = 0; p < 4; ++p)
    if (elems[p] > 0) *out[p] = bytes[p] / elems[p];
}

void run_bench_model(const BenchModelArgs& a) {
  if (a.model_dir.empty() == a.synthetic.empty())
    throw Error("give exactly one of --model and --synthetic (a preset name or a config.json)");
  // Checked before the model is built (docs/RELIABILITY.md): Qwen3.5's context is 262,144 tokens.
  for (int64_t T : a.prompt_lengths)
    if (T > kMaxPromptTokens)
      throw Error("-p: prompt length " + std::to_string(T) + ", expected at most " + std::to_string(kMaxPromptTokens) +
                  " tokens (the models' context length)");
  const int threads = a.threads > 0 ? a.threads : hardware_threads();
  const LinearPrecision precision = precision_for(a.precision, a.weights, !a.synthetic.empty());
  // The limits every figure is printed next to, measured in this run (docs/PERFORMANCE.md), before
  // the model is built so that the probe's buffer (up to 1 GiB) is gone before the weights arrive
  // and the peak memory below counts the model's load and runs only.
  const HostMeasurement host = measure_host(threads, 0.5);
  const bool peak_excludes_probe = reset_peak_rss();
  const auto t_load = Clock::now();
  // --synthetic takes a preset name or any family's config.json (random weights of its shapes).
  auto synthetic_config = [&]() -> ModelConfig {
    if (a.synthetic.size() > 5 && a.synthetic.compare(a.synthetic.size() - 5, 5, ".json") == 0)
      return parse_model_config(read_regular_file(a.synthetic, "config file", kMaxJsonFileBytes), a.synthetic);
    return model_preset(a.synthetic);
  };
  auto engine = std::make_shared<Engine>(threads);
  const WeightChoice weights = a.weights.choice();
  if (a.model_dir.empty() && weights.load() == WeightLoad::kGgufFile)
    throw Error("--weights " + a.weights.weights + " quantizes a checkpoint at load; give --model (synthetic weights "
                "take bf16 or a format converted per tensor: int8, f16)");
  HybridModel model = a.model_dir.empty()
                          ? HybridModel::synthetic(synthetic_config(), a.seed, threads, a.weights.options(), engine)
                          : HybridModel::load(a.model_dir, {.progress = !a.json,
                                                            .weights = a.weights.options(),
                                                            .engine = engine});
  const double load_s = seconds_since(t_load);
  const ModelConfig& cfg = model.config();
  const std::string name = a.model_dir.empty() ? a.synthetic : a.model_dir;
  if (!a.json)
    std::printf("%s%s\n%s\nweights %.2f GB%s, built/mapped in %.1f s, %d threads, projections %s, %d untimed warm-up "
                "run(s) per prompt length\n\n", name.c_str(),
                a.model_dir.empty() ? " (synthetic random bf16 weights)" : "", cfg.describe().c_str(),
                static_cast<double>(model.weight_bytes()) / 1e9,
                weights.load() == WeightLoad::kPerTensor
                    ? (", projections converted to " + weights.name + " at load" +
                       (a.weights.int8() ? " (group " + std::to_string(a.weights.int8_group) + ")" : std::string()))
                          .c_str()
                    : "",
                load_s, threads, projections_description(precision, a.weights).c_str(), a.warmup);
  if (!a.json)
    std::printf("machine: %s, kernels %s; f32 FMA peak %.0f GFLOP/s and read bandwidth %.1f GB/s with %d threads "
                "(measured now)\n\n",
                detect_host().cpu_model.c_str(), isa_selection().target.c_str(), host.fma_peak_gflops_all,
                host.mem_bandwidth_gbs, threads);
  if (!a.json)
    std::printf("%8s %10s %10s %9s | %6s %6s %6s %6s %6s | %9s\n", "prompt", "prefill_ms", "prefill/s", "TTFT_ms",
                token_mixer_name(cfg.linear_mixer), token_mixer_name(cfg.attention_mixer), "MLP", "head", "other",
                "decode/s");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t T : a.prompt_lengths) {
    if (T < 1) throw Error("-p: prompt length " + std::to_string(T) + " must be >= 1");
    std::vector<int32_t> ids(static_cast<size_t>(T));
    uint64_t s = a.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(T);
    for (int32_t& id : ids) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      id = static_cast<int32_t>(s % static_cast<uint64_t>(cfg.vocab_size));
    }
    // Warm-up, as llama-bench does before its timed runs: one untimed prefill of the same length
    // and a decode step. The first prefill at a length grows every scratch buffer and takes its
    // page faults (measured here at T = 2048 on the kimi h2304 config: the conv 277 ms cold
    // against 40 ms warm, the MLA projections 1348 against 751 ms); a server pays that once.
    for (int w = 0; w < a.warmup; ++w) {
      HybridState warm = model.new_state();
      Tensor l = model.forward(warm, ids, {.threads = threads, .precision = precision});
      const int32_t one[1] = {ids.front()};
      model.forward(warm, one, {.threads = threads, .precision = precision});
    }
    HybridState st = model.new_state();
    ForwardTimes pt;
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    Tensor logits = model.forward(st, ids, {.threads = threads, .times = &pt, .precision = precision});
    const double prefill_s = seconds_since(t0);
    const double prefill_cpu_s = process_cpu_seconds() - cpu0;
    ForwardTimes dt;
    Sampler greedy({.temperature = 0});
    int32_t next = greedy.sample({logits.ptr<float>(), static_cast<size_t>(cfg.vocab_size)});
    const double cpu1 = process_cpu_seconds();
    const auto t1 = Clock::now();
    for (int i = 0; i < a.decode_tokens; ++i) {
      const int32_t one[1] = {next};
      Tensor l = model.forward(st, one, {.threads = threads, .times = &dt, .precision = precision});
      next = greedy.sample({l.ptr<float>(), static_cast<size_t>(cfg.vocab_size)});
    }
    const double decode_s = seconds_since(t1);
    const double decode_cpu_s = process_cpu_seconds() - cpu1;
    const double tot = pt.total(), dtot = dt.total();
    const auto part_seconds = [](const ForwardTimes& t) {
      return nlohmann::json{{"gdn_projections", t.gdn_proj}, {"gdn_conv", t.gdn_conv}, {"gdn_engine", t.gdn_engine},
                            {"gdn_gated_norm", t.gdn_norm}, {"kda_projections", t.kda_proj}, {"kda_conv", t.kda_conv},
                            {"kda_engine", t.kda_engine}, {"kda_gated_norm", t.kda_norm},
                            {"attention_projections", t.attn_proj}, {"attention_core", t.attn_core}, {"mlp", t.mlp},
                            {"lm_head", t.lm_head}, {"norms", t.norms}, {"embedding", t.embed}};
    };
    auto share = [](double part, double total) { return total > 0 ? part / total : 0.0; };
    // Achieved rates: the counted work (model/model_work.hpp) over the measured time of each part.
    // A GGUF file's weights: its bytes over its parameters (the average of its block formats).
    // Bytes per weight: the registry row's for a format converted at load (and synthetic bf16); a
    // file's own (a GGUF file, one quantized at load, a checkpoint as stored): its bytes over its
    // parameters, the average of its formats.
    model::ProjectionWork proj_work;
    if (weights.load() == WeightLoad::kPerTensor || a.model_dir.empty())
      proj_work.bytes_per_weight = weight_format_info(*weights.format).bytes_per_weight(a.weights.int8_group);
    else
      proj_work.bytes_per_weight = static_cast<double>(model.weight_bytes()) / static_cast<double>(cfg.parameter_count());
    proj_work.latent_only = weights.load() == WeightLoad::kPerTensor && weight_format_info(*weights.format).block_elems != 1;
    const model::ForwardWork pw = model::forward_work(cfg, 0, T, false, proj_work);
    // Per part, a GGUF file's bytes are its tensors' (set_gguf_part_bytes); the total per token
    // stays the file's bytes over its parameters (the average, every tensor read once).
    model::ProjectionWork part_work = proj_work;
    if (model::is_gguf_path(a.model_dir)) set_gguf_part_bytes(a.model_dir, cfg, part_work);
    model::ForwardWork decode_parts, decode_average;  // summed over the decode steps, at their positions
    for (int i = 0; i < a.decode_tokens; ++i) {
      decode_parts += model::forward_work(cfg, T + i, 1, false, part_work);
      decode_average += model::forward_work(cfg, T + i, 1, false, proj_work);
    }
    const model::PartWork decode_work = decode_average.total();
    // The linear-attention layers' states, read and written once per decode step (recurrent [HV,
    // K, V] and conv, F32): not weights, so a figure of their own beside the weight bytes.
    double state_bytes_per_token = 0;
    for (const Tensor& t : st.recurrent_state) state_bytes_per_token += 2.0 * static_cast<double>(t.bytes());
    for (const Tensor& t : st.conv_state) state_bytes_per_token += 2.0 * static_cast<double>(t.bytes());
    auto gflops = [](double flops, double seconds) { return seconds > 0 ? flops / seconds / 1e9 : 0.0; };
    const bool kda = cfg.linear_mixer == TokenMixer::kKda;
    const double lin_proj_s = kda ? pt.kda_proj : pt.gdn_proj, lin_engine_s = kda ? pt.kda_engine : pt.gdn_engine;
    struct Rate {
      const char* name;
      double gflops;
    };
    const Rate rates[] = {
        {kda ? "KDA projections" : "GDN projections", gflops(pw.linear_projections.flops, lin_proj_s)},
        {kda ? "KDA engine" : "GDN engine", gflops(pw.linear_engine.flops, lin_engine_s)},
        {"attention projections", gflops(pw.attention_projections.flops, pt.attn_proj)},
        {"attention core", gflops(pw.attention_core.flops, pt.attn_core)},
        {"MLP", gflops(pw.mlp.flops, pt.mlp)},
        {"LM head", gflops(pw.lm_head.flops, pt.lm_head)},
    };
    const double decode_gbs = decode_s > 0 ? decode_work.weight_bytes / decode_s / 1e9 : 0.0;
    // Decode per part: the weight bytes each part streams over its own measured time, so a part
    // that falls short of the read probe shows by name; "rest" is the time of everything that
    // streams no projection weights (the LA engine's state update, conv, norms, attention over the
    // cache, embedding, thread hand-offs between parts).
    struct Stream {
      const char* name;
      double bytes, seconds;
    };
    const Stream streams[] = {
        {kda ? "KDA projections" : "GDN projections", decode_parts.linear_projections.weight_bytes,
         kda ? dt.kda_proj : dt.gdn_proj},
        {"attention projections", decode_parts.attention_projections.weight_bytes, dt.attn_proj},
        {"MLP", decode_parts.mlp.weight_bytes, dt.mlp},
        {"LM head", decode_parts.lm_head.weight_bytes, dt.lm_head},
    };
    double decode_rest_s = dt.total();
    nlohmann::json decode_part_gbs = nlohmann::json::object(), decode_part_bytes = nlohmann::json::object();
    for (const Stream& st : streams) {
      decode_rest_s -= st.seconds;
      if (st.seconds > 0) decode_part_gbs[st.name] = st.bytes / st.seconds / 1e9;
      if (a.decode_tokens > 0) decode_part_bytes[st.name] = st.bytes / a.decode_tokens;
    }
    const double bytes_per_token = a.decode_tokens > 0 ? decode_work.weight_bytes / a.decode_tokens : 0.0;
    nlohmann::json achieved = nlohmann::json::object();
    for (const Rate& r : rates) achieved[r.name] = r.gflops;
    nlohmann::json row = {
        {"model", name},
        {"prompt_tokens", T},
        {"threads", threads},
        {"linear_precision", linear_precision_name(precision)},
        {"warmup_runs", a.warmup},
        {"prefill_ms", prefill_s * 1e3},
        {"prefill_tokens_per_s", static_cast<double>(T) / prefill_s},
        {"prefill_cpu_ms", prefill_cpu_s * 1e3},
        {"decode_tokens", a.decode_tokens},
        {"decode_cpu_ms", decode_cpu_s * 1e3},
        {"decode_tokens_per_s", a.decode_tokens > 0 ? a.decode_tokens / decode_s : 0.0},
        {"share_gdn", share(pt.gdn(), tot)},
        {"share_kda", share(pt.kda(), tot)},
        {"share_attention", share(pt.attention(), tot)},
        {"share_mlp", share(pt.mlp, tot)},
        {"share_lm_head", share(pt.lm_head, tot)},
        {"share_other", share(pt.embed + pt.norms, tot)},
        {"prefill_seconds", part_seconds(pt)},
        {"decode_seconds", part_seconds(dt)},
        {"decode_share_gdn", share(dt.gdn(), dtot)},
        {"decode_share_kda", share(dt.kda(), dtot)},
        {"decode_share_attention", share(dt.attention(), dtot)},
        {"decode_share_mlp", share(dt.mlp, dtot)},
        {"decode_share_lm_head", share(dt.lm_head, dtot)},
        {"peak_rss_mib", peak_rss_mib()},
        {"peak_rss_excludes_probe", peak_excludes_probe},
        {"prefill_gflops", achieved},
        {"prefill_gflops_total", gflops(pw.total().flops, prefill_s)},
        {"decode_weight_bytes_per_token", bytes_per_token},
        {"decode_weight_gbs", decode_gbs},
        {"decode_part_weight_gbs", decode_part_gbs},
        {"decode_part_weight_bytes_per_token", decode_part_bytes},
        {"decode_rest_ms_per_token", a.decode_tokens > 0 ? decode_rest_s * 1e3 / a.decode_tokens : 0.0},
        {"decode_state_bytes_per_token", state_bytes_per_token},
        {"decode_weight_and_state_gbs",
         decode_s > 0 ? (decode_work.weight_bytes + state_bytes_per_token * a.decode_tokens) / decode_s / 1e9 : 0.0},
        {"machine_fma_peak_gflops", host.fma_peak_gflops_all},
        {"machine_read_bandwidth_gbs", host.mem_bandwidth_gbs},
        {"isa", isa_selection().target},
        // A GGUF file runs its own block formats whatever --weights says (its default "bf16" would
        // mislabel the row); the bytes per weight tell the formats' mix.
        {"weights", model::is_gguf_path(a.model_dir) ? std::string("gguf") : a.weights.weights},
        {"weight_bytes_per_parameter", proj_work.bytes_per_weight},
        {"int8_group", a.weights.int8() ? a.weights.int8_group : 0},
    };
    if (a.json) {
      std::cout << row.dump() << std::endl;
    } else {
      std::printf("%8lld %10.0f %10.1f %9.0f | %5.1f%% %5.1f%% %5.1f%% %5.1f%% %5.1f%% | %9.2f\n",
                  static_cast<long long>(T), prefill_s * 1e3, static_cast<double>(T) / prefill_s, prefill_s * 1e3,
                  100 * share(pt.gdn() + pt.kda(), tot), 100 * share(pt.attention(), tot), 100 * share(pt.mlp, tot),
                  100 * share(pt.lm_head, tot), 100 * share(pt.embed + pt.norms, tot),
                  a.decode_tokens > 0 ? a.decode_tokens / decode_s : 0.0);
      std::printf("%8s   CPU time: prefill %.0f ms (%.1f tokens per CPU-second x %d threads), decode %.0f ms\n", "",
                  prefill_cpu_s * 1e3, static_cast<double>(T) / prefill_cpu_s * threads, threads, decode_cpu_s * 1e3);
      if (cfg.linear_mixer == TokenMixer::kKda)
        std::printf("%8s   KDA: projections %.0f ms, conv %.0f ms, engine %.0f ms, gated norm %.0f ms; ", "",
                    pt.kda_proj * 1e3, pt.kda_conv * 1e3, pt.kda_engine * 1e3, pt.kda_norm * 1e3);
      else
        std::printf("%8s   GDN: projections %.0f ms, conv %.0f ms, engine %.0f ms, gated norm %.0f ms; ", "",
                    pt.gdn_proj * 1e3, pt.gdn_conv * 1e3, pt.gdn_engine * 1e3, pt.gdn_norm * 1e3);
      std::printf("%s: projections %.0f ms, core %.0f ms; MLP %.0f ms\n", token_mixer_name(cfg.attention_mixer),
                  pt.attn_proj * 1e3, pt.attn_core * 1e3, pt.mlp * 1e3);
      std::printf("%8s   prefill GFLOP/s (%% of the %.0f peak): all %.0f (%.0f%%)", "", host.fma_peak_gflops_all,
                  gflops(pw.total().flops, prefill_s), 100 * gflops(pw.total().flops, prefill_s) / host.fma_peak_gflops_all);
      for (const Rate& r : rates)
        if (r.gflops > 0) std::printf(", %s %.0f (%.0f%%)", r.name, r.gflops, 100 * r.gflops / host.fma_peak_gflops_all);
      std::printf("\n");
      if (a.decode_tokens > 0)
        std::printf("%8s   decode: %.2f GB of weights per token, %.1f GB/s (%.0f%% of the measured %.1f GB/s); "
                    "bandwidth bound %.1f tokens/s\n",
                    "", bytes_per_token / 1e9, decode_gbs, 100 * decode_gbs / host.mem_bandwidth_gbs,
                    host.mem_bandwidth_gbs, host.mem_bandwidth_gbs * 1e9 / bytes_per_token);
      if (a.decode_tokens > 0 && state_bytes_per_token > 0) {
        const double both_gbs = (bytes_per_token + state_bytes_per_token) * a.decode_tokens / decode_s / 1e9;
        std::printf("%8s   decode: plus %.1f MB of linear-attention state read and written per token: "
                    "%.1f GB/s of weights and state (%.0f%%)\n",
                    "", state_bytes_per_token / 1e6, both_gbs, 100 * both_gbs / host.mem_bandwidth_gbs);
      }
      if (a.decode_tokens > 0) {
        std::printf("%8s   decode GB/s per part (ms, MB of its weights per token):", "");
        const char* sep = " ";
        for (const Stream& st : streams)
          if (st.seconds > 0) {
            std::printf("%s%s %.1f (%.1f, %.0f)", sep, st.name, st.bytes / st.seconds / 1e9, st.seconds * 1e3 / a.decode_tokens,
                        st.bytes / a.decode_tokens / 1e6);
            sep = ", ";
          }
        std::printf("; the rest %.1f ms per token\n", decode_rest_s * 1e3 / a.decode_tokens);
      }
    }
    std::fflush(stdout);
  }
  if (!a.json)
    std::printf("\npeak memory %.0f MiB (%s)\n", peak_rss_mib(),
                peak_excludes_probe ? "load and runs; the bandwidth probe's buffer, freed before the load, excluded"
                                    : "includes the bandwidth probe's buffer: this kernel cannot reset the peak");
}

}  // namespace

void register_model_commands(CLI::App& app) {
  auto run = std::make_shared<RunArgs>();
  std::string families;  // the family registry's (hanpu/model_family.hpp)
  for (const ModelFamily* f : model_families()) families += (families.empty() ? "" : ", ") + f->name;
  CLI::App* r = app.add_subcommand("run", "generate text with a hybrid model checkpoint of any family (" + families +
                                              "): prefill, then decode");
  r->add_option("--model", run->model_dir, "checkpoint directory (config.json, *.safetensors, tokenizer.json or tiktoken.model) or a GGUF file (NAME.gguf, or any part NAME-0000i-of-0000N.gguf)")->required();
  r->add_option("--prompt", run->prompt, "prompt text");
  r->add_option("--prompt-ids", run->prompt_ids, "prompt as comma-separated token ids instead of text");
  r->add_option("-n,--n-predict", run->n_predict, "tokens to generate at most (default 128)")->check(CLI::Range(0, 1 << 30));
  r->add_flag("--chat", run->chat, "wrap the prompt as a user message in the checkpoint's chat template (ChatML when it has none)");
  r->add_option("--system", run->system, "system message (with --chat)");
  r->add_flag("--think", run->think, "with --chat: let the model think (no empty <think></think> block)");
  r->add_option("--threads", run->threads, "threads (default all)")->check(CLI::Range(1, 1024));
  r->add_option("--temp", run->temperature, "sampling temperature (default 0.7; 0 = greedy)")->check(CLI::Range(0.0, 100.0));
  r->add_option("--top-k", run->top_k, "keep the k most likely tokens (default 20, 0 = all)")->check(CLI::Range(0, 1 << 30));
  r->add_option("--top-p", run->top_p, "nucleus sampling threshold (default 0.95)")->check(CLI::Range(0.0, 1.0));
  r->add_option("--seed", run->seed, "sampling seed (default 0)");
  r->add_flag("--greedy", run->greedy, "always take the most likely token");
  r->add_option("--precision", run->precision,
                "projection activations: exact (f32, default), bf16x2, bf16 (rounded like a bf16 model; fastest), int8 (with "
                "int8 weights: decode activations quantized per group, int8 dot products with AVX512-VNNI or AVX2)");
  run->weights.add_to(r);
  r->add_flag("--ids", run->print_ids, "print the generated token ids instead of text");
  r->add_option("--logits-out", run->logits_out, "write the prompt's logits (all positions) to this safetensors file");
  r->add_flag("--logits-per-token", run->logits_per_token,
              "with --logits-out: run the prompt one token per forward (the decode path) instead of one whole-sequence forward");
  r->callback([run] { run_generate(*run); });

  auto bench = std::make_shared<BenchModelArgs>();
  CLI::App* b = app.add_subcommand("bench-model", "prefill and decode speed of a hybrid model (checkpoint or synthetic), with the time per block kind");
  b->add_option("--model", bench->model_dir, "checkpoint directory or GGUF file");
  std::string presets;
  for (const std::string& p : model_preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  b->add_option("--synthetic", bench->synthetic,
                "random bf16 weights of a published size (" + presets + ") or of the shapes a config.json (any family) gives");
  b->add_option("-p,--prompt-lengths", bench->prompt_lengths, "prompt lengths (default 512,2048)")->delimiter(',');
  b->add_option("--threads", bench->threads, "threads (default all)")->check(CLI::Range(1, 1024));
  b->add_option("--decode-tokens", bench->decode_tokens, "decode steps measured after each prefill (default 16)")
      ->check(CLI::Range(0, 1 << 20));
  b->add_option("--warmup", bench->warmup,
                "untimed prefills (plus one decode step) at each prompt length before the timed one, as llama-bench "
                "does (default 1; 0 times the cold first run)")
      ->check(CLI::Range(0, 16));
  b->add_option("--seed", bench->seed, "seed of the synthetic weights and prompt (default 1)");
  b->add_option("--precision", bench->precision,
                "projection activations: exact (default), bf16x2, bf16, int8 (with --weights int8: decode activations "
                "quantized per group, AVX512-VNNI or AVX2)");
  bench->weights.add_to(b);
  b->add_flag("--json", bench->json, "one JSON object per prompt length");
  b->callback([bench] { run_bench_model(*bench); });
}
