// The plan's CPU parameters (include/hanpu/cpu_tuning.hpp) on the CPU backend: checked against
// what this build and this CPU can run, and carried into the head-fused program (lowering.hpp).
#include <algorithm>
#include <string>

#include "cpu/kernels.hpp"
#include "cpu/lowering.hpp"

namespace hanpu::cpu {

std::string lower_cpu_tuning(const Plan& plan, int fused, FusedProgram& program) {
  const CpuTuning& t = plan.cpu;
  if (!t.set()) return "";  // no CPU part (an older plan): the compiled tile, prefetch as before
  try {
    validate_cpu_tuning(t, plan.problem.V);
  } catch (const Error& e) {
    return e.what();
  }
  const int max_rows = gemm_max_rows(), max_vectors = gemm_max_vectors();
  const std::string target = simd_target_name();
  if (t.gemm_rows.value > max_rows)
    return "plan.cpu.gemm_rows: got " + std::to_string(t.gemm_rows.value) + ", the " + target +
           " kernels' register tile has at most " + std::to_string(max_rows) + " rows";
  if (t.gemm_vectors.value > max_vectors)
    return "plan.cpu.gemm_vectors: got " + std::to_string(t.gemm_vectors.value) + ", the " + target +
           " kernels' register tile has at most " + std::to_string(max_vectors) + " vectors";
  if (fused >= 0) {
    const Kernel& k = plan.kernels[static_cast<size_t>(fused)];
    const std::string at = "plan.kernels[" + std::to_string(fused) + "]";
    for (size_t c = 0; c < k.cores.size(); ++c)
      for (size_t i = 0; i < k.cores[c].size(); ++i) {
        const PlanItem& it = k.cores[c][i];
        if (it.col1 - it.col0 > t.column_block.value)
          return "plan.cpu.column_block: got " + std::to_string(t.column_block.value) + ", but " + at + ".cores[" +
                 std::to_string(c) + "][" + std::to_string(i) + "] is " + std::to_string(it.col1 - it.col0) +
                 " columns wide (re-plan after changing the column block)";
      }
    for (size_t c = 0; c < k.groups.size(); ++c)
      for (size_t g = 0; g < k.groups[c].size(); ++g)
        if (k.groups[c][g] > t.lockstep_group.value)
          return "plan.cpu.lockstep_group: got " + std::to_string(t.lockstep_group.value) + ", but " + at + ".groups[" +
                 std::to_string(c) + "][" + std::to_string(g) + "] has " + std::to_string(k.groups[c][g]) +
                 " items (re-plan after changing the lockstep group)";
  }
  if (fused >= 0) {
    // The arena the plan gives each thread against what its largest group of its widest items
    // needs in this plan's fused program (the kernels' layout).
    const int64_t width = std::min(t.column_block.value, plan.problem.V), group = t.lockstep_group.value;
    const size_t need = fused_arena_bytes(plan.problem, width, static_cast<size_t>(group), program, false);
    if (need > static_cast<size_t>(t.arena_bytes.value))
      return "plan.cpu.arena_bytes: got " + std::to_string(t.arena_bytes.value) + " bytes, but lockstep_group " +
             std::to_string(group) + " x column_block " + std::to_string(width) + " need " + std::to_string(need) +
             " bytes per thread in this plan's fused program (re-plan, or give at least that)";
  }
  program.gemm_rows = static_cast<int>(t.gemm_rows.value);
  program.gemm_vectors = static_cast<int>(t.gemm_vectors.value);
  program.prefetch_rate = static_cast<int>(t.prefetch_rate.value);
  return "";
}

std::string describe_cpu_tuning(const CpuTuning& t) {
  if (!t.set()) return "";
  return ", CPU parameters (" + t.source + "): lockstep group <= " + std::to_string(t.lockstep_group.value) +
         ", column block " + std::to_string(t.column_block.value) + ", GEMM tile " + std::to_string(t.gemm_rows.value) + " x " +
         std::to_string(t.gemm_vectors.value) + ", prefetch rate " + std::to_string(t.prefetch_rate.value) +
         ", arena " + std::to_string(t.arena_bytes.value) + " bytes per thread";
}

namespace {
// The fields of a job the kernels' arena layout reads (shape, GQA group, bf16 grams), from a Problem.
LaJob arena_job(const Problem& p, bool bf16_grams) {
  LaJob job;
  job.shape.variant = p.variant;
  job.shape.H = p.H;
  job.shape.HV = p.HV;
  job.shape.K = p.K;
  job.shape.V = p.V;
  job.group = p.H > 0 ? std::max<int64_t>(1, p.HV / p.H) : 1;
  job.bf16_grams = bf16_grams;
  return job;
}
}  // namespace

size_t fused_arena_bytes(const Problem& p, int64_t width, size_t group, const FusedProgram& program, bool bf16_grams) {
  return fused_arena_floats(arena_job(p, bf16_grams), width, static_cast<int>(p.chunk), group, program) * sizeof(float);
}

ArenaBound fused_arena_bound(const Problem& p, int64_t width, size_t group, bool bf16_grams) {
  ArenaBound best;
  for (const bool gemm_first : {true, false})
    for (const bool in_place : {true, false})
      for (const bool keeps_vnew : {false, true}) {
        FusedProgram prog;
        prog.gemm_first = gemm_first;
        prog.state_in_place = in_place;
        prog.update_keeps_vnew = keeps_vnew;
        const size_t bytes = fused_arena_bytes(p, width, group, prog, bf16_grams);
        if (bytes > best.bytes) {
          best.bytes = bytes;
          best.state_bytes = bytes - fused_arena_bytes(p, width, 0, prog, bf16_grams);
          best.program = prog;
        }
      }
  return best;
}

}  // namespace hanpu::cpu
