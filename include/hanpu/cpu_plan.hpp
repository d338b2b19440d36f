// The CPU execution plan: which core runs which (sequence, value head, column block) item, and in
// which form. The head-fused path executes a CpuPlan; make_cpu_plan builds the mapping from the
// problem's shapes, la_prefill sizes head_group from the detected L2, and tests or other planners
// may pass their own (ExecOptions::plan; validate_cpu_plan checks coverage).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hanpu/la.hpp"

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

/// Operator order inside a chunk (ha-npu.md §4): both choices give the same results up to fp32
/// rounding; the defaults are HA-NPU's, the alternatives are the baseline order for ablations.
struct OperatorOrder {
  /// true: v_new = T (diag(β) V − diag(β e^Γ) K S), solved in place, W and U never formed;
  /// false: T = (I + A)^-1 formed, W = T diag(β e^Γ) K and U = T diag(β) V, v_new = U − W S.
  bool gemm_first = true;
  /// true: chunk-first, one state per item updated in place after the output;
  /// false: the next state is built in a second buffer (two states live per item).
  bool state_in_place = true;
  bool operator==(const OperatorOrder&) const = default;
};

struct CpuPlan {
  int threads = 1;
  int chunk = 64;  // C: tokens per chunk (64 as FLA; the arena is sized for it)
  /// Head-fused items, statically assigned: thread t runs per_thread[t] in order.
  std::vector<std::vector<WorkItem>> per_thread;
  /// Extreme tail (fewer items than threads even after column splits): these items run through
  /// the chunk-parallel (FLA-style) path, all threads sharing each item's chunks.
  std::vector<WorkItem> chunk_parallel;
  /// Column block granularity in floats (the SIMD width the plan was made for).
  int column_quantum = 16;
  /// Up to this many consecutive items of a thread that share sequence and columns advance in
  /// lockstep, chunk by chunk, each with its own state in the arena (sized to stay in L2). A
  /// longer run is cut into the fewest groups of near-equal size (8 items with 7: 4 + 4).
  int head_group = 1;
  /// Operator order of the head-fused path.
  OperatorOrder order;

  std::string describe() const;
};

/// Throws hanpu::Error unless every item is in range and the items (head-fused and
/// chunk-parallel together) cover every (sequence, value head, column) exactly once.
void validate_cpu_plan(const CpuPlan& plan, const LaShape& shape);

/// Head-level mapping with the three tail tiers of ha-npu.md §3:
///  1. whole (sequence, head) items, longest first, to the least-loaded thread;
///  2. the tail that would leave threads idle is split column-wise along V (multiples of
///     column_quantum) so that every thread gets work;
///  3. if there are still fewer items than threads (e.g. one head of tiny V), those items go to the
///     chunk-parallel fallback.
CpuPlan make_cpu_plan(const LaShape& shape, const std::vector<int64_t>& seq_lens, int threads, int column_quantum = 16);

/// The plan la_prefill runs when none is given: make_cpu_plan for the problem's shapes and
/// sequence lengths, with head_group sized from the detected L2 (validates the inputs).
CpuPlan default_cpu_plan(Variant variant, const LaInputs& in, const LaOptions& opt, int threads);

/// How many item states of K x V fp32 fit in a quarter of a core's L2 (the rest holds the
/// chunk's intermediates and the rows in flight): the head_group for that cache.
int head_group_for_cache(const LaShape& shape, int64_t l2_bytes);

}  // namespace hanpu
