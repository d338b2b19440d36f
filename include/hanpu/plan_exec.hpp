// Running a planner Plan (include/hanpu/plan.hpp) on the CPU backend: one Plan drives both the
// simulator and the real execution (docs/SIMULATION.md, "One plan, two backends"). Every CPU entry
// point (la_prefill and its wrappers, decode, the CLI, Python, the model's GDN layers, the bench)
// gets its Plan from the planner for the host device, through its engine's plan cache keyed by the
// problem, or runs a Plan it is given; the backend then *lowers* the Plan into its private CpuSchedule.
//
// The lowering executes what the plan says or refuses it, naming the field (in the manner of
// ggml's supports_op, but with the reason): the mapping with its tail tiers (per-core item lists in
// order), the lockstep groups, the operator order of the fused kernel as a sequence of CPU stages
// run in plan order, the state kept in place or double-buffered, and the layouts (the host's matrix
// unit reads dense rows, so a plan with a blocked tensor is refused). docs/SIMULATION.md lists what
// is executed and what is refused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hanpu/engine.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"

namespace hanpu {

/// One unit of head-level work: all chunks of one (sequence, value head) restricted to the state
/// columns [col0, col1) of V. Columns of S, v_new and o are independent, so a column block needs
/// no reduction with its sibling blocks.
struct WorkItem {
  int32_t seq = 0;
  int32_t head = 0;  // value head
  int32_t col0 = 0, col1 = 0;
  bool operator==(const WorkItem&) const = default;
};

/// The stages of the CPU's head-fused chunk program. Each runs a fixed set of the plan's
/// operators (the CPU fuses the vector work into the neighbouring GEMM where the plan keeps them
/// apart, e.g. rhs into the K S GEMM's store); a stage runs where the plan's order has the first
/// of its operators (KDA's decays: the gate stage builds every decayed operand at chunk start,
/// wherever the plan's order puts its decay operator).
///   gate     gate (+ KDA's decay_q, decay_ke,       grams    kkt, qkt
///            decay_ki, decay_kl)
///   mask     kkt_gate, qkt_gate                     state_k  ks, rhs (GEMM-first)
///   state_q  qs                                     solve    solve_diag, solve (GEMM-first)
///   inverse  solve_diag, solve_inv (W/U)            wu       wu_scale, wu (W/U)
///   state_w  ws, vnew (W/U)                         output   pv, out (and the store of o)
///   update   update_gate, update, state_add
/// (CpuStage is declared in hanpu/operators.hpp: the operator manifest gives each operator its stage.)
const char* cpu_stage_name(CpuStage s);

/// The head-fused chunk program lowered from the fused kernel's order.
struct FusedProgram {
  std::vector<CpuStage> stages;  // in plan order
  /// true: GEMM-first form (v_new solved in place, T, W, U never formed); false: the W/U form.
  bool gemm_first = true;
  /// true: one state per item, updated in place after its last reader; false: the next state is
  /// built in a second buffer (two states live per item).
  bool state_in_place = true;
  /// GDN: the update scales v_new by its decays into a buffer of its own, because a later stage
  /// still reads v_new (the state is updated before the output, as FLA orders it).
  bool update_keeps_vnew = false;
  /// The plan's CPU parameters (plan.cpu): the GEMMs' register tile, the prefetch rate (0 = off).
  int gemm_rows = 0, gemm_vectors = 0;  // 0: the compiled maximum (plans without a CPU part)
  int prefetch_rate = 1;
  bool operator==(const FusedProgram&) const = default;
};

/// A task of the CPU's chunk-parallel (FLA-style) path: chunk `chunk` (counted within its
/// sequence) of one (sequence, value head), state columns [col0, col1).
struct ChunkTask {
  int32_t seq = 0, head = 0;
  int64_t chunk = 0;
  int32_t col0 = 0, col1 = 0;
  bool operator==(const ChunkTask&) const = default;
};

/// The CPU backend's private execution schedule, lowered from a Plan.
struct CpuSchedule {
  CpuPath path = CpuPath::HeadFused;
  int threads = 1;
  int chunk = 64;
  /// HeadFused: the fused kernel's items, thread t runs per_thread[t] in order, in lockstep groups
  /// of groups[t][i] consecutive items (summing to per_thread[t].size()).
  std::vector<std::vector<WorkItem>> per_thread;
  std::vector<std::vector<int32_t>> groups;
  /// Tier 3 of the head mapping: whole heads the plan runs chunk-parallel (its tail_ kernels); the
  /// CPU runs them on its chunk-parallel path with the tail kernels' mapping and form (below).
  std::vector<WorkItem> chunk_parallel;
  /// The chunk-parallel path (FlaChunk, and HeadFused's tier 3), per thread in order, as the plan
  /// maps its kernels: the W/U Map phase per (chunk, head) (whole heads: the CPU fuses the Map
  /// kernels, so they must map alike), the state recurrence per (head, column block) item, the
  /// output per (chunk, head, column block).
  std::vector<std::vector<ChunkTask>> fla_map, fla_output;
  std::vector<std::vector<WorkItem>> fla_state;
  /// The chunk-parallel phases in the GEMM-first form (a GEMM-first plan's tier-3 kernels: Map
  /// forms the masked grams, the state phase solves for v_new) rather than the W/U form.
  bool chunk_parallel_gemm_first = false;
  FusedProgram program;
  /// How the plan is executed, in words (--show-plan).
  std::string summary;

  std::string describe() const;
};

/// ggml-style capability check: "" if the CPU backend can run every field of the plan (apart from
/// the problem, checked against the inputs by lower_plan_for_cpu), else the first field it cannot
/// run, its value and why, e.g. "plan.kernels[1].parallel: got \"segment\" (kernel segment_states);
/// the CPU backend has no segment-parallel execution".
std::string cpu_cannot_run(const Plan& plan);

/// Lowers a plan into the CPU schedule for inputs of shape `shape` with these sequence lengths.
/// Throws hanpu::Error if the plan is for another problem (variant, heads, dims, sequence
/// lengths) or cpu_cannot_run names a field.
CpuSchedule lower_plan_for_cpu(const Plan& plan, const LaShape& shape, const std::vector<int64_t>& seq_lens);

/// The CPU backend's planning rules (src/cpu/cpu_planning.cpp): PlanOptions::backend for a CPU
/// device (make_plan refuses a CPU device without it).
const PlanBackend& cpu_plan_backend();

/// `opt` with the CPU backend's rules and, for the host device (name "host") when opt.wisdom is
/// unset, the wisdom file the process is configured for (default_wisdom_path(): $HANPU_WISDOM,
/// "none" for none), read now: how the CLI, the Python package and host_plan plan. Harmless for an
/// NPU device (the planner ignores a CPU backend there). Throws naming a malformed wisdom file.
PlanOptions cpu_plan_options(const Device& dev, PlanOptions opt = {});

/// The wisdom key of this machine: the CPU model and the ISA the kernels dispatch to, as the
/// host device describes them (Device::cpu).
WisdomMachine this_machine();

/// The Problem of LA inputs (to plan for them): shapes, sequence lengths, dtypes, state flags.
Problem problem_for_inputs(Variant variant, const LaInputs& in, const LaOptions& opt);

/// A plan for the host and its lowering, from an engine's plan cache.
struct HostPlan {
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const CpuSchedule> schedule;
  bool cache_hit = false;
  double seconds = 0;  // this lookup: the key and the look-up, plus on a miss planning and lowering
};

/// The plan of `strategy` for problem `p` on the engine's host (Engine::host() as a device with
/// `threads` cores), planned with make_plan and lowered on the first call for this signature, then
/// taken from the engine's cache: a decode step or a model layer with the same signature does not
/// re-plan. Each engine has its own cache (two engines share no plans). Thread-safe; a cache keeps
/// the most recently used kPlanCacheEntries signatures.
HostPlan host_plan(Engine& engine, const Problem& p, int threads, const std::string& strategy = "hanpu");
constexpr size_t kPlanCacheEntries = 256;
void clear_plan_cache(Engine& engine);
size_t plan_cache_size(const Engine& engine);

}  // namespace hanpu
