// The registries tests are stamped from: the variant traits, the strategy registry and the device
// files of the source tree (shared by the planner, simulator and CPU tests; no other helpers, so
// it goes with la_testing.hpp as well as plan_testing.hpp).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "hanpu/la_variant.hpp"
#include "hanpu/plan.hpp"

namespace hanpu::testing {

inline std::string device_path(const std::string& name) {
#ifdef HANPU_TEST_SOURCE_DIR
  std::filesystem::path root = HANPU_TEST_SOURCE_DIR;
#else
  std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
#endif
  if (const char* src = std::getenv("HANPU_SOURCE_DIR"); src && *src) root = src;
  return (root / "devices" / (name + ".json")).string();
}

// The registries tests are stamped from (instead of hand-listed variants, strategies, devices):
// a variant, strategy or device file added to the tree is tested without touching the tests.

/// Every variant of the traits table (hanpu/la_variant.hpp), in enum order.
inline std::vector<Variant> every_variant() {
  std::vector<Variant> v;
  for (const VariantTraits& t : kVariantTraits) v.push_back(t.variant);
  return v;
}

/// Every strategy of the registry: strategy_names(), then the ablation steps not among them.
inline std::vector<std::string> every_strategy() {
  auto s = strategy_names();
  for (const auto& a : ablation_names())
    if (std::find(s.begin(), s.end(), a) == s.end()) s.push_back(a);
  return s;
}

/// The names of the device files under devices/ (sorted), e.g. "ascend310p".
inline std::vector<std::string> device_names() {
  const std::filesystem::path dir = std::filesystem::path(device_path("x")).parent_path();
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// A gtest parameter name from a registry name ("fla+mapping" -> "fla_mapping").
inline std::string param_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

}  // namespace hanpu::testing
