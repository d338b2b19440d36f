// The operator manifest: every fine-grained operator of the chunk graph (include/hanpu/plan.hpp,
// OpGraph) with its unit, the paper's operator it belongs to, the CPU stage that runs it and the
// phase of the CPU's FLA-style path, in one constexpr table. Everything else is derived from it:
// the graph builder takes each operator's name, paper operator and unit from its row
// (src/plan/graph.cpp), the CPU lowering its stage table and FLA phases (src/cpu/plan_exec.cpp),
// the planner its list of KDA decay operators. Code names an operator by OpId, so renaming or
// dropping one is a compile error; names are strings only at the edges (Plan JSON, the
// simulator's per-operator table and timeline).
//
// The header is public because OperatorDef (plan.hpp) carries the OpId and FusedProgram
// (plan_exec.hpp) the CpuStage; it depends on nothing but the standard library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hanpu {

enum class Unit { Matrix, Vector };

/// The graph forms (plan.hpp documents them), as bits of the forms an operator appears in.
enum class GraphForm { WU, Inverse, GemmFirst };
inline constexpr std::array<GraphForm, 3> kGraphForms = {GraphForm::WU, GraphForm::Inverse, GraphForm::GemmFirst};

/// Every operator of the chunk graph, in manifest order (the order of kOperatorManifest).
enum class OpId : uint8_t {
  Gate, DecayQ, DecayKe, DecayKi, DecayKl,  // #1
  Kkt, Qkt, KktGate, QktGate,               // #2 and #6's Q K^T
  Ks, Rhs, Qs,                              // #5 read (GEMM-first), #6's Q S
  SolveDiag, Solve, SolveInv, Apply,        // #3, #4 (inverse form)
  WuScale, Wu, Ws, Vnew,                    // #4, #5 read (W/U form)
  Pv, Out,                                  // #6
  UpdateGate, Update, StateAdd,             // #5 update
};
inline constexpr size_t kOperatorCount = static_cast<size_t>(OpId::StateAdd) + 1;

/// The stages of the CPU's head-fused chunk program (include/hanpu/plan_exec.hpp documents what
/// each runs); each operator belongs to at most one stage per form.
enum class CpuStage { Gate, Grams, Mask, StateK, StateQ, Solve, Inverse, WU, StateW, Output, Update };

/// The phases of the CPU's chunk-parallel (FLA-style, W/U form) path: Map (state-independent),
/// State (the recurrence), Output. Recomputed: KDA's decays, rebuilt in whichever phase needs
/// them, as FLA's kernels do. None: not on that path (GEMM-first and inverse-form operators).
enum class FlaPhase { Map, State, Output, Recomputed, None };

/// Which variants' graphs hold an operator: all, those with a per-channel gate (KDA's decays),
/// those with a per-head gate (GDN's update_gate).
enum class GateKind { Any, Channel, Head };

inline constexpr uint8_t form_bit(GraphForm f) { return static_cast<uint8_t>(1u << static_cast<unsigned>(f)); }
inline constexpr uint8_t kAllForms = form_bit(GraphForm::WU) | form_bit(GraphForm::Inverse) | form_bit(GraphForm::GemmFirst);

struct OperatorManifestRow {
  OpId id;
  std::string_view name;      // the name at the JSON edge ("kkt_gate")
  std::string_view paper_op;  // the paper's operator: "1".."4", "5r" (#5 read), "5u" (#5 update), "6"
  Unit unit;
  uint8_t forms;  // form_bit()s of the forms whose graph holds it
  GateKind gate;
  /// The CPU head-fused stage that runs it in the GEMM-first and in the W/U form (nullopt: the
  /// CPU has no stage for it in that form; the inverse form is not run on the CPU).
  std::optional<CpuStage> cpu_stage_gemm_first, cpu_stage_wu;
  FlaPhase fla_phase;
};

namespace manifest_detail {
using F = GraphForm;
using S = CpuStage;
using P = FlaPhase;
inline constexpr uint8_t WU = form_bit(F::WU), INV = form_bit(F::Inverse), GF = form_bit(F::GemmFirst);
inline constexpr std::nullopt_t no = std::nullopt;
}  // namespace manifest_detail

// Rows in OpId order. Within one CPU stage, the rows are in the order the stage runs its operators.
inline constexpr std::array<OperatorManifestRow, kOperatorCount> kOperatorManifest = [] {
  using namespace manifest_detail;
  return std::array<OperatorManifestRow, kOperatorCount>{{
      {OpId::Gate, "gate", "1", Unit::Vector, kAllForms, GateKind::Any, S::Gate, S::Gate, P::Map},
      {OpId::DecayQ, "decay_q", "1", Unit::Vector, kAllForms, GateKind::Channel, S::Gate, S::Gate, P::Recomputed},
      {OpId::DecayKe, "decay_ke", "1", Unit::Vector, kAllForms, GateKind::Channel, S::Gate, S::Gate, P::Recomputed},
      {OpId::DecayKi, "decay_ki", "1", Unit::Vector, kAllForms, GateKind::Channel, S::Gate, S::Gate, P::Recomputed},
      {OpId::DecayKl, "decay_kl", "1", Unit::Vector, kAllForms, GateKind::Channel, S::Gate, S::Gate, P::Recomputed},
      {OpId::Kkt, "kkt", "2", Unit::Matrix, kAllForms, GateKind::Any, S::Grams, S::Grams, P::Map},
      {OpId::Qkt, "qkt", "6", Unit::Matrix, kAllForms, GateKind::Any, S::Grams, S::Grams, P::Output},
      {OpId::KktGate, "kkt_gate", "2", Unit::Vector, kAllForms, GateKind::Any, S::Mask, S::Mask, P::Map},
      {OpId::QktGate, "qkt_gate", "6", Unit::Vector, kAllForms, GateKind::Any, S::Mask, S::Mask, P::Output},
      {OpId::Ks, "ks", "5r", Unit::Matrix, GF | INV, GateKind::Any, S::StateK, no, P::None},
      {OpId::Rhs, "rhs", "5r", Unit::Vector, GF | INV, GateKind::Any, S::StateK, no, P::None},
      {OpId::Qs, "qs", "6", Unit::Matrix, kAllForms, GateKind::Any, S::StateQ, S::StateQ, P::Output},
      {OpId::SolveDiag, "solve_diag", "3", Unit::Vector, kAllForms, GateKind::Any, S::Solve, S::Inverse, P::Map},
      {OpId::Solve, "solve", "3", Unit::Matrix, GF, GateKind::Any, S::Solve, no, P::None},
      {OpId::SolveInv, "solve_inv", "3", Unit::Matrix, WU | INV, GateKind::Any, no, S::Inverse, P::Map},
      {OpId::Apply, "apply", "4", Unit::Matrix, INV, GateKind::Any, no, no, P::None},
      {OpId::WuScale, "wu_scale", "4", Unit::Vector, WU, GateKind::Any, no, S::WU, P::Map},
      {OpId::Wu, "wu", "4", Unit::Matrix, WU, GateKind::Any, no, S::WU, P::Map},
      {OpId::Ws, "ws", "5r", Unit::Matrix, WU, GateKind::Any, no, S::StateW, P::State},
      {OpId::Vnew, "vnew", "5r", Unit::Vector, WU, GateKind::Any, no, S::StateW, P::State},
      {OpId::Pv, "pv", "6", Unit::Matrix, kAllForms, GateKind::Any, S::Output, S::Output, P::Output},
      {OpId::Out, "out", "6", Unit::Vector, kAllForms, GateKind::Any, S::Output, S::Output, P::Output},
      {OpId::UpdateGate, "update_gate", "5u", Unit::Vector, kAllForms, GateKind::Head, S::Update, S::Update, P::State},
      {OpId::Update, "update", "5u", Unit::Matrix, kAllForms, GateKind::Any, S::Update, S::Update, P::State},
      {OpId::StateAdd, "state_add", "5u", Unit::Vector, kAllForms, GateKind::Any, S::Update, S::Update, P::State},
  }};
}();

inline constexpr bool manifest_rows_in_id_order() {
  for (size_t i = 0; i < kOperatorManifest.size(); ++i)
    if (static_cast<size_t>(kOperatorManifest[i].id) != i) return false;
  return true;
}
static_assert(manifest_rows_in_id_order(), "kOperatorManifest: rows must be in OpId order (row i has id i)");

inline constexpr bool manifest_names_unique() {
  for (size_t i = 0; i < kOperatorManifest.size(); ++i)
    for (size_t j = i + 1; j < kOperatorManifest.size(); ++j)
      if (kOperatorManifest[i].name == kOperatorManifest[j].name) return false;
  return true;
}
static_assert(manifest_names_unique(), "kOperatorManifest: operator names must be unique");

inline constexpr const OperatorManifestRow& operator_row(OpId id) { return kOperatorManifest[static_cast<size_t>(id)]; }
inline constexpr std::string_view operator_name(OpId id) { return operator_row(id).name; }

/// The operator of a name (the JSON and CLI edge); nullopt for an unknown name.
inline constexpr std::optional<OpId> operator_id(std::string_view name) {
  for (const OperatorManifestRow& r : kOperatorManifest)
    if (r.name == name) return r.id;
  return std::nullopt;
}

/// The CPU head-fused stage of an operator in a form (nullopt: none, e.g. the inverse form).
inline constexpr std::optional<CpuStage> cpu_stage_of(OpId id, GraphForm form) {
  if (form == GraphForm::GemmFirst) return operator_row(id).cpu_stage_gemm_first;
  if (form == GraphForm::WU) return operator_row(id).cpu_stage_wu;
  return std::nullopt;
}

/// KDA's operators forming the channel-decayed operands (decay_q, decay_ke, decay_ki, decay_kl).
inline constexpr bool is_decay_operator(OpId id) { return operator_row(id).gate == GateKind::Channel; }

}  // namespace hanpu
