// `hanpu quantize`: writes a checkpoint whose projections are stored as int8 (hanpu::Int8Linear:
// symmetric, one f32 scale per group of inputs), so `--weights int8` need not quantize at every
// load. The projections are exactly those the loader quantizes (it reports them through
// ModelLoadOptions::on_int8_projection), each stored as `<name>` I8 [out, in] plus
// `<name>.int8_scale` F32 [out, ceil(in / group)]; every other tensor is copied unchanged, shard by
// shard, and the shards carry the metadata `hanpu.int8_group`. Weights the loader permutes or
// transposes first (Qwen3-Next's fused in_proj_qkvz / in_proj_ba, MLA's kv_b_proj) stay bf16 and
// are quantized at load with the file's group. docs/MODEL.md.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "hanpu/model.hpp"
#include "hanpu/weight_format.hpp"
#include "io/file_io.hpp"
#include "model/gguf_export.hpp"
#include "io/json_io.hpp"
#include "io/safetensors.hpp"
#include "model/model_parts.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;

struct QuantizeArgs {
  std::string model_dir, out_dir;
  int64_t group = kDefaultInt8Group;
  std::string format;  // empty: hanpu's int8 safetensors; else a GGUF file format
};

// `--format`: one GGUF file (docs/GGUF.md "Writing GGUF").
void run_quantize_gguf(const QuantizeArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const GgufFileFormat f = parse_gguf_file_format(a.format);
  const GgufExportStats s = write_checkpoint_as_gguf(a.model_dir, a.out_dir, f);
  std::map<std::string, int> by_type;
  for (const auto& [name, t] : s.types) ++by_type[gguf::block_format(t).name];
  std::string mix;
  for (const auto& [t, n] : by_type) mix += (mix.empty() ? "" : ", ") + std::to_string(n) + " " + t;
  std::fprintf(stderr, "quantize: %zu tensors (%s), %.3f GB of tensor data, %.1f s; written to %s (%s)\n", s.tensors,
               mix.c_str(), static_cast<double>(s.bytes) / 1e9,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), a.out_dir.c_str(),
               a.format.c_str());
}

void run_quantize(const QuantizeArgs& a) {
  // The registry says what --format writes: hanpu's int8 as safetensors, the rest as GGUF files.
  const WeightChoice choice = weight_choice(a.format.empty() ? "int8" : a.format, "--format", weight_quantize_names());
  if (choice.format != WeightFormat::kInt8) return run_quantize_gguf(a);
  const fs::path src(a.model_dir), dst(a.out_dir);
  if (fs::weakly_canonical(src) == fs::weakly_canonical(dst))
    throw Error("quantize: --out '" + a.out_dir + "' is the input checkpoint; write to another directory");
  const auto t0 = std::chrono::steady_clock::now();
  // The loader decides what is a projection; record what it quantized (the data stays valid while
  // the model lives).
  // Copied: a stacked projection's parts are freed once their rows are concatenated.
  struct Quantized {
    std::vector<int8_t> q;
    std::vector<float> scales;
    int64_t out, in;
  };
  std::map<std::string, Quantized> quantized;
  ModelLoadOptions opt;
  opt.progress = true;
  opt.weights = {.format = "int8", .int8_group = a.group};
  opt.on_int8_projection = [&](const std::string& name, const Int8Linear& q) {
    const int64_t groups = (q.in_features() + q.group() - 1) / q.group();
    quantized[name] = {std::vector<int8_t>(q.quantized(), q.quantized() + q.out_features() * q.in_features()),
                       std::vector<float>(q.scales(), q.scales() + q.out_features() * groups), q.out_features(),
                       q.in_features()};
  };
  (void)HybridModel::load(a.model_dir, opt);  // the model itself is not needed once quantized

  // The shards as the checkpoint lists them.
  std::vector<std::string> shards;
  nlohmann::json index;
  const fs::path index_path = src / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    index = parse_json(read_regular_file(index_path.string(), "index", kMaxJsonFileBytes), index_path.string());
    std::map<std::string, bool> seen;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it)
      if (!seen[it.value().get<std::string>()]) {
        seen[it.value().get<std::string>()] = true;
        shards.push_back(it.value().get<std::string>());
      }
  } else {
    shards.push_back("model.safetensors");
  }
  fs::create_directories(dst);
  uint64_t bytes_in = 0, bytes_out = 0;
  size_t stored = 0;
  for (const std::string& shard : shards) {
    const SafetensorsFile f = SafetensorsFile::map((src / shard).string());
    bytes_in += f.data_bytes();
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const std::string& name : f.names()) {
      auto it = quantized.find(name);
      if (it == quantized.end()) {
        const TensorView v = f.get(name);
        tensors.emplace_back(name, v);
        bytes_out += static_cast<uint64_t>(v.numel()) * dtype_size(v.dtype);
        continue;
      }
      const Quantized& q = it->second;
      const int64_t groups = (q.in + a.group - 1) / a.group;
      tensors.emplace_back(name, TensorView::contiguous(const_cast<int8_t*>(q.q.data()), DType::I8, {q.out, q.in}));
      tensors.emplace_back(name + model::kInt8ScaleSuffix,
                           TensorView::contiguous(const_cast<float*>(q.scales.data()), DType::F32, {q.out, groups}));
      if (index.is_object()) index["weight_map"][name + model::kInt8ScaleSuffix] = shard;
      bytes_out += static_cast<uint64_t>(q.out * q.in) + static_cast<uint64_t>(q.out * groups) * 4;
      ++stored;
    }
    std::map<std::string, std::string> meta = f.metadata();
    meta["hanpu.int8_group"] = std::to_string(a.group);
    meta["hanpu.quantized_from"] = fs::absolute(src).string();
    write_safetensors((dst / shard).string(), tensors, meta);
  }
  if (index.is_object()) write_file_atomic((dst / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  // config.json, the tokenizer and whatever else describes the model: copied as they are.
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.path().extension() == ".safetensors" || name == "model.safetensors.index.json")
      continue;
    write_file_atomic((dst / name).string(), read_regular_file(entry.path().string(), "checkpoint file", 1ull << 32));
  }
  std::fprintf(stderr,
               "quantize: %zu projections stored as int8 (group %lld), %.2f GB -> %.2f GB in %zu shard(s), %.1f s; "
               "written to %s\n",
               stored, static_cast<long long>(a.group), static_cast<double>(bytes_in) / 1e9,
               static_cast<double>(bytes_out) / 1e9, shards.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), a.out_dir.c_str());
}

}  // namespace
}  // namespace hanpu

void register_quantize_command(CLI::App& app) {
  auto a = std::make_shared<hanpu::QuantizeArgs>();
  CLI::App* q = app.add_subcommand(
      "quantize", "write a copy of a checkpoint with its projections stored as int8 (run it with --weights int8 or as is)");
  q->add_option("--model", a->model_dir, "checkpoint directory to read")->required();
  q->add_option("--out", a->out_dir,
                "directory to write (created; the shards, index, config and tokenizer), or with --format the .gguf file")
      ->required();
  std::string formats;
  for (const std::string& n : hanpu::weight_quantize_names()) formats += (formats.empty() ? "" : ", ") + n;
  q->add_option("--format", a->format,
                "int8 (default): hanpu's int8 checkpoint (safetensors, run it as is); any other writes one GGUF file "
                "in that llama.cpp format (q4_k: all Q4_K, q5_k: all Q5_K, q6_k: all Q6_K). One of: " + formats)
      ->check([](const std::string& v) {
        try {
          hanpu::weight_choice(v, "--format", hanpu::weight_quantize_names());
          return std::string();
        } catch (const hanpu::Error& e) {
          // CLI11 puts the option's name in front itself.
          const std::string m = e.what(), named = "--format: ";
          return m.rfind(named, 0) == 0 ? m.substr(named.size()) : m;
        }
      });
  q->add_option("--int8-group", a->group, "inputs per scale")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  q->callback([a] { hanpu::run_quantize(*a); });
}
