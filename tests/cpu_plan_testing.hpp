// Planning as the CPU's callers do (the CLI, the Python package, host_plan): with the CPU
// backend's rules and the wisdom the process is configured for (cpu_plan_options). make_plan
// itself refuses a CPU device without a backend; NPU devices are planned alike either way.
#pragma once

#include <string>
#include <utility>

#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"

namespace hanpu::testing {

inline Plan plan_as_callers_do(const Problem& p, const Device& dev, const std::string& strategy, PlanOptions opt = {}) {
  return make_plan(p, dev, strategy, cpu_plan_options(dev, std::move(opt)));
}

}  // namespace hanpu::testing
