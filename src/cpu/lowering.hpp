// Between the CPU driver (la_cpu.cpp) and the plan lowering (plan_exec.cpp): the Problem of an
// already validated job, so a call plans (or looks its plan up) without validating twice.
#pragma once

#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"
#include "la/job.hpp"

#include <string>

namespace hanpu::cpu {

Problem problem_of_job(const LaJob& job);

}  // namespace hanpu::cpu

namespace hanpu::cpu {

/// The plan's CPU parameters (plan.cpu) into the fused program (cpu_tuning_exec.cpp): "" when the
/// CPU runs them, else the field, its value and why not (a GEMM tile beyond the dispatched
/// target's compiled one; a fused item wider than the column block; a lockstep group larger than
/// the plan's lockstep_group). `fused`: the fused kernel's index, -1 none.
std::string lower_cpu_tuning(const Plan& plan, int fused, FusedProgram& program);

/// The parameters in words, for CpuSchedule::summary ("" for a plan without a CPU part).
std::string describe_cpu_tuning(const CpuTuning& t);

/// Bytes of one thread's head-fused arena for a lockstep group of `group` items of `width` state
/// columns of problem p under `program` (kernels.hpp, fused_arena_floats). bf16_grams: the GDN
/// grams from raw bf16 rows (their row buffers added).
size_t fused_arena_bytes(const Problem& p, int64_t width, size_t group, const FusedProgram& program, bool bf16_grams);

/// The largest fused_arena_bytes over the programs the lowering makes (GEMM-first or W/U form,
/// in-place or double-buffered state, v_new kept for the update or not), and that program.
struct ArenaBound {
  size_t bytes = 0, state_bytes = 0;  // all; the group's states among them
  FusedProgram program;
};
ArenaBound fused_arena_bound(const Problem& p, int64_t width, size_t group, bool bf16_grams);

}  // namespace hanpu::cpu
