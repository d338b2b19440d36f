// The plan's CPU parameters (include/hanpu/cpu_tuning.hpp) on the CPU backend: checked against
// what this build and this CPU can run, and carried into the head-fused program (lowering.hpp).
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
  program.gemm_rows = static_cast<int>(t.gemm_rows.value);
  program.gemm_vectors = static_cast<int>(t.gemm_vectors.value);
  program.prefetch_rate = static_cast<int>(t.prefetch_rate.value);
  return "";
}

std::string describe_cpu_tuning(const CpuTuning& t) {
  if (!t.set()) return "";
  return ", CPU parameters (" + t.source + "): lockstep group <= " + std::to_string(t.lockstep_group.value) +
         ", column block " + std::to_string(t.column_block.value) + ", GEMM tile " + std::to_string(t.gemm_rows.value) + " x " +
         std::to_string(t.gemm_vectors.value) + ", prefetch rate " + std::to_string(t.prefetch_rate.value);
}

}  // namespace hanpu::cpu
