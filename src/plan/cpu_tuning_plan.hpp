// Between the planner (planner.cpp) and the CPU parameters' model (cpu_tuning.cpp).
#pragma once

#include <vector>

#include "hanpu/cpu_tuning.hpp"
#include "hanpu/plan.hpp"

namespace hanpu::plan_detail {

/// The plan's CPU part for `p` on CPU device `dev`: the model's choice, the wisdom's for the host
/// (unless opt.no_wisdom), then the values opt.cpu gives. Throws naming PlanOptions.cpu's field
/// for a value out of range, or naming the wisdom file for a malformed one.
CpuTuning plan_cpu_tuning(const Problem& p, const Device& dev, int cores, const PlanOptions& opt);

/// Reorders a core's whole-head items so like column blocks of neighbouring heads are adjacent.
void order_blocks_for_lockstep(std::vector<PlanItem>& items);

}  // namespace hanpu::plan_detail
