// Helpers shared by the planner and simulator tests: the device files of the source tree, a device
// with unlimited buffers, problems, and compulsory GM traffic computed from first principles.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <string>
#include <vector>

#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"
#include "registry_testing.hpp"

namespace hanpu::testing {

/// The names of an operator order (Kernel::order holds OpIds; names read better in expectations).
inline std::vector<std::string> op_names(const std::vector<OpId>& order) {
  std::vector<std::string> names;
  for (const OpId o : order) names.emplace_back(operator_name(o));
  return names;
}

/// The operator of a manifest name (fails the test for an unknown one).
inline OpId op_id(std::string_view name) {
  const std::optional<OpId> id = operator_id(name);
  if (!id) throw std::invalid_argument("no operator named " + std::string(name));
  return *id;
}

/// The position of an operator in an order (its size if absent).
inline std::ptrdiff_t position(const std::vector<OpId>& order, std::string_view name) {
  return std::find(order.begin(), order.end(), op_id(name)) - order.begin();
}

inline Device ascend310p() { return load_device(device_path("ascend310p")); }

/// The 310P with every on-core buffer made large enough for anything (a petabyte).
inline Device unlimited_buffers(Device d) {
  for (BufferSpec& b : d.buffers) b.capacity_bytes.value = 1e15;
  return d;
}

inline Problem problem(Variant v, std::vector<int64_t> seqlens, int64_t H, int64_t HV = 0) {
  Problem p;
  p.variant = v;
  p.seqlens = std::move(seqlens);
  p.varlen = p.seqlens.size() > 1;
  p.H = H;
  p.HV = HV ? HV : H;
  return p;
}

/// Inputs, outputs and states, each once (what any plan must at least move).
struct Compulsory {
  int64_t read = 0, write = 0;
};
inline Compulsory compulsory_traffic(const Problem& p) {
  const int64_t tok = p.total_tokens();
  Compulsory c;
  c.read = tok * p.H * p.K * 2 * 2                          // q, k fp16 (per key head)
           + tok * p.HV * p.V * 2                            // v fp16
           + tok * p.HV * variant_traits(p.variant).gate_width(p.K) * 4  // g fp32
           + tok * p.HV * 4;                                 // beta fp32
  c.write = tok * p.HV * p.V * 2;                            // o fp16
  const int64_t state = p.sequences() * p.HV * p.K * p.V * 4;
  if (p.read_initial_state) c.read += state;
  if (p.write_final_state) c.write += state;
  return c;
}

}  // namespace hanpu::testing
