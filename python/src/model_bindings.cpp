// Whole hybrid models from Python: hanpu::HybridModel (any supported family), its per-sequence
// state, the tokenizer and the sampler, wrapped for python/hanpu/model.py (docs/PYTHON.md). The
// model runs with the GIL released; its weights stay memory-mapped from the checkpoint.
#include <cstring>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/generator.hpp"
#include "hanpu/model.hpp"
#include "hanpu/weight_format.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"

namespace hanpu::python {
namespace {

// Token ids from a Python sequence of ints or an integer array (any int dtype numpy accepts).
std::vector<int32_t> ids_from(nb::handle obj) {
  std::vector<int32_t> ids;
  if (nb::isinstance<nb::str>(obj) || nb::isinstance<nb::bytes>(obj))
    throw nb::type_error("`ids` must be a sequence of token ids (ints), got a string: encode it with a Tokenizer first");
  nb::object seq = nb::borrow(obj);
  if (nb::hasattr(seq, "tolist")) seq = seq.attr("tolist")();  // numpy / torch
  if (!nb::isinstance<nb::list>(seq) && !nb::isinstance<nb::tuple>(seq) && !nb::isinstance<nb::sequence>(seq))
    throw nb::type_error("`ids` must be a sequence of token ids (ints)");
  for (nb::handle x : seq) {
    if (!nb::isinstance<nb::int_>(x))
      throw nb::type_error(("`ids` must hold ints, got " + nb::cast<std::string>(nb::str(x.type().attr("__name__"))))
                               .c_str());
    const long long v = nb::cast<long long>(x);
    if (v < 0 || v > INT32_MAX)
      throw nb::value_error(("token id " + std::to_string(v) + " is outside [0, 2^31)").c_str());
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

nb::ndarray<nb::numpy, float> to_numpy(Tensor&& t) {
  auto* data = new float[static_cast<size_t>(t.numel())];
  std::memcpy(data, t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  return nb::ndarray<nb::numpy, float>(data, shape.size(), shape.data(), owner);
}

// The parts of the model description a Python caller asks about (the rest is in "description").
nb::dict config_dict(const ModelConfig& c) {
  nb::dict d;
  d["model_type"] = c.model_type;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["num_layers"] = c.num_layers;
  nb::list kinds;
  for (int64_t i = 0; i < c.num_layers; ++i) kinds.append(token_mixer_name(c.token_mixer(i)));
  d["layer_kinds"] = kinds;
  d["linear_layers"] = c.num_linear_layers();
  d["attention_layers"] = c.num_attention_layers();
  d["moe_layers"] = c.num_moe_layers();
  d["num_experts"] = c.moe.num_experts;
  d["parameters"] = c.parameter_count();
  nb::list eos;
  for (int32_t e : c.eos_token_ids) eos.append(e);
  d["eos_token_ids"] = eos;
  d["description"] = c.describe();
  return d;
}

ModelConfig synthetic_config(const std::string& spec) {
  if (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0)
    return parse_model_config(read_regular_file(spec, "config file", kMaxJsonFileBytes), spec);
  return model_preset(spec);
}

std::vector<ChatMessage> messages_from(nb::handle obj) {
  std::vector<ChatMessage> out;
  for (nb::handle m : obj) {
    if (!nb::isinstance<nb::dict>(m)) throw nb::type_error("each message must be a dict with 'role' and 'content'");
    nb::dict d = nb::borrow<nb::dict>(m);
    for (const char* key : {"role", "content"})
      if (!d.contains(key) || !nb::isinstance<nb::str>(d[key]))
        throw nb::type_error((std::string("each message needs a string '") + key + "'").c_str());
    out.push_back({nb::cast<std::string>(d["role"]), nb::cast<std::string>(d["content"])});
  }
  return out;
}

}  // namespace

void register_model(nb::module_& m) {
  // The weight-format registry (hanpu/weight_format.hpp): Model.load(weights=) takes these names.
  m.def(
      "weight_load_names", [] { return weight_load_names(); },
      "the names Model.load / Model.synthetic accept as `weights` (the registry rows that load, then the GGUF mixes)");
  m.def(
      "weight_formats",
      [] {
        nb::list rows;
        for (const WeightFormatInfo& r : weight_formats()) {
          nb::dict d;
          d["name"] = r.name;
          d["layout"] = r.layout;
          d["file_metadata"] = r.file_metadata;
          d["load"] = r.load == WeightLoad::kAsStored    ? "as_stored"
                      : r.load == WeightLoad::kPerTensor ? "per_tensor"
                      : r.load == WeightLoad::kGgufFile  ? "gguf_file"
                                                         : "read_only";
          d["bytes_per_weight"] = r.format == WeightFormat::kInt8 ? nb::object(nb::none())
                                                                  : nb::cast(r.bytes_per_weight(0));
          d["decode_kernels"] = r.decode_kernels;
          d["prefill_kernels"] = r.prefill_kernels;
          rows.append(d);
        }
        return rows;
      },
      "one dict per weight format of the registry (name, layout, file_metadata, load, bytes_per_weight "
      "(None for int8: 1 + 4 / group), decode_kernels, prefill_kernels)");
  nb::class_<HybridState>(m, "ModelState", "Per-sequence state: LA recurrent and conv states, attention caches.")
      .def_ro("position", &HybridState::position, "tokens consumed so far (the next token's position)")
      .def_prop_ro("nbytes", &HybridState::bytes, "bytes held by the states and caches")
      .def("copy", [](const HybridState& s) { return HybridState(s); },
           "a deep copy (a snapshot to continue from later, e.g. a shared prompt prefix)");

  nb::class_<HybridModel>(m, "_Model")
      .def_static(
          "load",
          [](const std::string& dir, const std::string& weights, int64_t int8_group) {
            nb::gil_scoped_release no_gil;
            // Each model its own engine (pool, workspaces, activation scratch): two models share nothing.
            return HybridModel::load(dir, {.weights = {.format = weights, .int8_group = int8_group},
                                           .engine = std::make_shared<Engine>()});
          },
          nb::arg("dir"), nb::arg("weights") = "bf16", nb::arg("int8_group") = kDefaultInt8Group)
      .def_static(
          "synthetic",
          [](const std::string& spec, uint64_t seed, int threads, const std::string& weights, int64_t int8_group) {
            ModelConfig c = synthetic_config(spec);
            nb::gil_scoped_release no_gil;
            return HybridModel::synthetic(c, seed, threads, {.format = weights, .int8_group = int8_group},
                                          std::make_shared<Engine>());
          },
          nb::arg("spec"), nb::arg("seed"), nb::arg("threads"), nb::arg("weights") = "bf16",
          nb::arg("int8_group") = kDefaultInt8Group)
      .def_prop_ro("config", [](const HybridModel& mdl) { return config_dict(mdl.config()); })
      .def_prop_ro("weight_bytes", &HybridModel::weight_bytes)
      .def("new_state", &HybridModel::new_state)
      .def(
          "forward",
          [](const HybridModel& mdl, HybridState& state, nb::handle ids_obj, bool all_logits, int threads,
             const std::string& precision) {
            const std::vector<int32_t> ids = ids_from(ids_obj);
            ForwardOptions fo;
            fo.threads = threads;
            fo.all_logits = all_logits;
            if (precision == "exact") fo.precision = LinearPrecision::kExact;
            else if (precision == "bf16") fo.precision = LinearPrecision::kBf16;
            else if (precision == "bf16x2") fo.precision = LinearPrecision::kBf16x2;
            else if (precision == "int8") fo.precision = LinearPrecision::kInt8;
            else
              throw nb::value_error(
                  ("`precision` is '" + precision + "', expected exact, bf16x2, bf16 or int8").c_str());
            Tensor logits;
            {
              nb::gil_scoped_release no_gil;
              logits = mdl.forward(state, ids, fo);
            }
            return to_numpy(std::move(logits));
          },
          nb::arg("state"), nb::arg("ids"), nb::arg("all_logits"), nb::arg("threads"), nb::arg("precision"));

  nb::class_<Tokenizer>(m, "_Tokenizer")
      .def_static("from_dir", &Tokenizer::from_dir, nb::arg("dir"))
      .def_static("from_file", &Tokenizer::from_file, nb::arg("path"))
      .def("encode", [](const Tokenizer& t, const std::string& text,
                        bool parse_special) { return t.encode(text, parse_special); },
           nb::arg("text"), nb::arg("parse_special"))
      .def("decode", [](const Tokenizer& t, nb::handle ids, bool skip_special) {
             const std::string text = t.decode(ids_from(ids), skip_special);
             return nb::bytes(text.data(), text.size());  // may end inside a UTF-8 sequence
           },
           nb::arg("ids"), nb::arg("skip_special"))
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def_prop_ro("eos_token_id", &Tokenizer::eos_token_id)
      .def("token_to_id", [](const Tokenizer& t, const std::string& s) { return t.token_to_id(s); })
      .def("apply_chat_template",
           [](const Tokenizer& t, nb::handle messages, bool add_generation_prompt, bool enable_thinking) {
             return t.apply_chat_template(messages_from(messages), add_generation_prompt, enable_thinking);
           },
           nb::arg("messages"), nb::arg("add_generation_prompt"), nb::arg("enable_thinking"));

  // The one generation path (hanpu/generator.hpp), as `hanpu run` and `hanpu serve` use it.
  m.def(
      "_generate",
      [](const HybridModel& mdl, HybridState& state, nb::handle ids_obj, const Tokenizer* tok, float temperature, int top_k,
         float top_p, uint64_t seed, int64_t max_new_tokens, std::optional<std::vector<int32_t>> stop_ids,
         std::vector<std::string> stop_strings, int64_t prefill_chunk, int threads) {
        const std::vector<int32_t> ids = ids_from(ids_obj);
        GenerationOptions go;
        go.sampling = SamplingOptions{temperature, top_k, top_p, seed};
        go.max_tokens = max_new_tokens;
        go.stop_strings = std::move(stop_strings);
        Generator::Result r;
        {
          nb::gil_scoped_release no_gil;
          const Generator gen(mdl, tok);
          const ForwardOptions fo{.threads = threads};
          if (stop_ids) {
            // Explicit stop ids replace the default ones: a stream of its own over them.
            HybridState& st = state;
            Tensor logits = gen.prefill(st, ids, static_cast<int64_t>(ids.size()), prefill_chunk, fo);
            const size_t V = static_cast<size_t>(mdl.config().vocab_size);
            TokenStream stream(tok, *stop_ids, go);
            std::span<const float> row{logits.ptr<float>() + (logits.shape()[0] - 1) * static_cast<int64_t>(V), V};
            Tensor next_logits;
            while (!stream.finished()) {
              const std::optional<int32_t> next = stream.push(row);
              if (!next) break;
              const int32_t one[1] = {*next};
              next_logits = mdl.forward(st, one, fo);
              row = {next_logits.ptr<float>(), V};
            }
            r.tokens = stream.tokens();
            r.reason = stream.reason();
            r.stop_token = stream.stop_token();
            r.stop_string = stream.stop_string();
          } else {
            r = gen.generate(state, ids, go, fo, prefill_chunk);
          }
        }
        const char* reason = r.reason == FinishReason::kStopToken    ? "stop_token"
                             : r.reason == FinishReason::kStopString ? "stop_string"
                                                                     : "length";
        return std::make_pair(r.tokens, std::make_pair(std::string(reason), r.stop_token));
      },
      nb::arg("model"), nb::arg("state"), nb::arg("ids"), nb::arg("tokenizer").none(), nb::arg("temperature"), nb::arg("top_k"),
      nb::arg("top_p"), nb::arg("seed"), nb::arg("max_new_tokens"), nb::arg("stop_ids").none(), nb::arg("stop_strings"),
      nb::arg("prefill_chunk"), nb::arg("threads"));
  m.def("_default_stop_ids", [](const HybridModel& mdl, const Tokenizer* tok) { return Generator(mdl, tok).stop_ids(); },
        nb::arg("model"), nb::arg("tokenizer").none());
  m.attr("_DEFAULT_PREFILL_CHUNK") = Generator::kDefaultPrefillChunk;

  // The checkpoint's chat template (hanpu/chat_template.hpp), rendered as the server renders it:
  // messages, tools and extra variables as JSON text (key order kept).
  m.def(
      "_render_checkpoint_template",
      [](const std::string& dir, const std::string& messages_json, const std::string& tools_json, bool add_generation_prompt,
         const std::string& kwargs_json) -> std::optional<std::string> {
        const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(tools_json);
        const std::unique_ptr<ChatTemplate> t = load_chat_template(dir, !tools.is_null());
        if (!t) return std::nullopt;
        nlohmann::ordered_json kwargs = chat_template_special_tokens(dir);
        const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(kwargs_json);  // kept alive for items()
        for (const auto& [key, value] : extra.items()) kwargs[key] = value;
        return t->render(nlohmann::ordered_json::parse(messages_json), tools, add_generation_prompt, kwargs);
      },
      nb::arg("dir"), nb::arg("messages_json"), nb::arg("tools_json"), nb::arg("add_generation_prompt"), nb::arg("kwargs_json"));

  nb::class_<Sampler>(m, "_Sampler")
      .def("__init__",
           [](Sampler* s, float temperature, int top_k, float top_p, uint64_t seed) {
             new (s) Sampler(SamplingOptions{temperature, top_k, top_p, seed});
           },
           nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"), nb::arg("seed"))
      .def("sample", [](Sampler& s, nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> row) {
             return s.sample(std::span<const float>(row.data(), row.shape(0)));
           },
           nb::arg("logits"));
}

}  // namespace hanpu::python
