// The CPU backend's planning rules (cpu_planning.cpp), for tests and `hanpu tune`, which look at
// the model-based choice alone. Callers that plan use cpu_plan_backend() / cpu_plan_options()
// (hanpu/plan_exec.hpp).
#pragma once

#include <vector>

#include "hanpu/cpu_tuning.hpp"
#include "hanpu/plan.hpp"

namespace hanpu::cpu {

/// The model-based choice for `p` on CPU device `dev` with `cores` threads, every reason naming the
/// device numbers it follows from.
CpuTuning model_cpu_tuning(const Problem& p, const Device& dev, int cores);

/// Sets t.arena_bytes from t.lockstep_group and t.column_block for `p` (the kernels' layout; bf16
/// grams counted when the device's CPU runs them, dev.cpu.bf16_gram), with the reason in numbers.
void choose_cpu_arena(CpuTuning& t, const Problem& p, const Device& dev);

/// Reorders a core's whole-head items so like column blocks of neighbouring heads are adjacent.
void order_blocks_for_lockstep(std::vector<PlanItem>& items);

}  // namespace hanpu::cpu
