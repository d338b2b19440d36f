// The linear-attention variants as data: one traits entry per variant says what its gate, delta
// rule and beta are, and validation, the reference, the operator graph, the planner, the simulator
// and the CPU kernels branch on these fields rather than on which variant it is. A new delta-rule
// variant is one entry here plus its reference (docs/ARCHITECTURE.md, "Adding a delta-rule variant").
#pragma once

#include <cstddef>
#include <cstdint>

namespace hanpu {

/// The key into the traits; Python and JSON use its name (VariantTraits::name).
enum class Variant { GDN, KDA };

/// How many log-decays a token has per value head (the paper, arXiv 2609.32114, §2).
enum class GateGranularity {
  None,     // no decay: no tensor g
  Head,     // one per token and value head, g [B,T,HV] (GDN): the decay scales whole rows
  Channel,  // one per key channel, g [B,T,HV,K] (KDA): the decay multiplies K and Q element-wise,
            // and the grams are evaluated with anchors so that only non-positive exponents appear
};

struct VariantTraits {
  Variant variant;
  const char* name;   // "gdn": the CLI subcommand, JSON and Python
  const char* label;  // "GDN": in messages
  GateGranularity gate;
  bool delta_rule;  // the state update is the delta rule S += k^T beta (v − k S)
  bool beta;        // a write strength beta [B,T,HV] per token and value head
  /// FLA's lower-bounded ("safe") in-kernel gate activation exists for it (fla/ops/kda/gate.py).
  bool lower_bound_gate;

  constexpr bool head_gate() const { return gate == GateGranularity::Head; }
  constexpr bool channel_gate() const { return gate == GateGranularity::Channel; }
  /// Log-decays per token and value head: 0, 1 or K (the last dimension of g and of the
  /// cumulative gates).
  constexpr int64_t gate_width(int64_t K) const {
    return gate == GateGranularity::Channel ? K : gate == GateGranularity::Head ? 1 : 0;
  }
};

/// One entry per Variant, in the enum's order.
inline constexpr VariantTraits kVariantTraits[] = {
    {Variant::GDN, "gdn", "GDN", GateGranularity::Head, /*delta_rule=*/true, /*beta=*/true, /*lower_bound_gate=*/false},
    {Variant::KDA, "kda", "KDA", GateGranularity::Channel, /*delta_rule=*/true, /*beta=*/true, /*lower_bound_gate=*/true},
};

constexpr const VariantTraits& variant_traits(Variant v) { return kVariantTraits[static_cast<size_t>(v)]; }

constexpr bool variant_traits_in_enum_order() {
  for (size_t i = 0; i < sizeof(kVariantTraits) / sizeof(kVariantTraits[0]); ++i)
    if (static_cast<size_t>(kVariantTraits[i].variant) != i) return false;
  return true;
}
static_assert(variant_traits_in_enum_order(), "kVariantTraits: one entry per Variant, in the enum's order");

}  // namespace hanpu
