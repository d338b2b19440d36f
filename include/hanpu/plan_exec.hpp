// Running a planner Plan (include/hanpu/plan.hpp) on the CPU backend: one Plan drives both the
// simulator and the real execution (DESIGN.md). The CPU executes the plan's mapping (which core runs
// which (sequence, head, column block), tail tiers included), its operator order (GEMM-first or W/U
// form, in-place or double-buffered state) and its layouts, which for the host are all dense: the
// host's matrix unit is described as reading and writing dense rows (host_device), so the layout
// planner anchors matrix operands dense, and a plan with a blocked tensor is refused.
#pragma once

#include <string>
#include <vector>

#include "hanpu/cpu_plan.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"

namespace hanpu {

struct CpuExecution {
  CpuPath path = CpuPath::HeadFused;
  CpuPlan plan;     // used when path == HeadFused
  int threads = 1;  // = plan.cores
  /// How the plan was executed, in words, e.g. "head-fused, 2 threads, gemm_first, in-place state"
  /// or "FLA-style chunk path (the CPU has no segment-parallel path; flashqla runs as fla)".
  std::string summary;
};

/// Translates a plan into the CPU backend's execution for inputs of shape `shape` with these
/// sequence lengths. Throws hanpu::Error if the plan's problem does not match the inputs (variant,
/// heads, dims, sequence lengths) or its mapping is not one the CPU can run.
CpuExecution cpu_execution_for(const Plan& plan, const LaShape& shape, const std::vector<int64_t>& seq_lens);

/// The Problem of LA inputs (to plan for them): shapes, sequence lengths, dtypes, state flags.
Problem problem_for_inputs(Variant variant, const LaInputs& in, const LaOptions& opt);

}  // namespace hanpu
