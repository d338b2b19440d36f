// Between the CPU driver (la_cpu.cpp) and the plan lowering (plan_exec.cpp): the Problem of an
// already validated job, so a call plans (or looks its plan up) without validating twice.
#pragma once

#include "hanpu/plan.hpp"
#include "la/job.hpp"

namespace hanpu::cpu {

Problem problem_of_job(const LaJob& job);

}  // namespace hanpu::cpu
