// --weights and --int8-group, shared by `hanpu run`, `hanpu bench-model` and `hanpu chat`.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/model.hpp"

namespace hanpu {

struct WeightArgs {
  std::string weights = "bf16";
  int64_t int8_group = kDefaultInt8Group;
  int64_t group() const { return weights == "int8" ? int8_group : 0; }
  /// A GGUF file format to quantize a safetensors checkpoint into at load ("" for bf16 / int8).
  std::string gguf_format() const { return weights == "bf16" || weights == "int8" ? "" : weights; }
  void add_to(CLI::App* app) {
    app->add_option("--weights", weights,
                    "projection weights: bf16 (as the checkpoint stores them, default), int8 (quantized at load: "
                    "symmetric, one scale per --int8-group inputs; about half the bytes per decode step), or a "
                    "GGUF format q8_0, q4_k_m, q4_k, q6_k (a safetensors checkpoint quantized at load as "
                    "`hanpu quantize --format` writes it, then run as that GGUF file)")
        ->check(CLI::IsMember(std::vector<std::string>{"bf16", "int8", "q8_0", "q4_k_m", "q4_k", "q6_k"}))
        ->capture_default_str();
    app->add_option("--int8-group", int8_group, "with --weights int8: inputs per scale")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
  }
};

}  // namespace hanpu
