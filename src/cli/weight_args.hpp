// --weights and --int8-group, shared by `hanpu run`, `hanpu bench-model` and `hanpu chat`. The
// choices are the weight-format registry's (hanpu/weight_format.hpp weight_load_names()).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/model.hpp"
#include "hanpu/weight_format.hpp"

namespace hanpu {

struct WeightArgs {
  std::string weights = "bf16";
  int64_t int8_group = kDefaultInt8Group;
  /// The registry's answer for --weights (throws naming the flag, the value and the choices).
  WeightChoice choice() const { return weight_choice(weights, "--weights", weight_load_names()); }
  /// ModelLoadOptions::weights / HybridModel::synthetic's.
  WeightOptions options() const { return {.format = weights, .int8_group = int8_group}; }
  /// int8 projections (quantized at load).
  bool int8() const { return choice().format == WeightFormat::kInt8; }
  void add_to(CLI::App* app) {
    std::string help = "projection weights, one of:";
    for (const WeightFormatInfo& r : weight_formats()) {
      if (r.load == WeightLoad::kReadOnly) continue;
      help += std::string("\n  ") + r.name + ": " +
              (r.load == WeightLoad::kAsStored    ? "as the checkpoint stores them (default)"
               : r.load == WeightLoad::kPerTensor ? "each projection converted at load"
                                                  : "the safetensors checkpoint quantized at load into this GGUF format "
                                                    "(as `hanpu quantize --format` writes it), then run as that file") +
              " [" + r.layout + "]";
    }
    for (const WeightMix& m : weight_mixes()) help += std::string("\n  ") + m.name + ": " + m.summary;
    app->add_option("--weights", weights, help)
        ->check([](const std::string& v) {
          try {
            weight_choice(v, "--weights", weight_load_names());
            return std::string();
          } catch (const Error& e) {
            // CLI11 puts the option's name in front itself.
            const std::string m = e.what(), named = "--weights: ";
            return m.rfind(named, 0) == 0 ? m.substr(named.size()) : m;
          }
        })
        ->capture_default_str();
    app->add_option("--int8-group", int8_group, "with --weights int8: inputs per scale")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
  }
};

}  // namespace hanpu
