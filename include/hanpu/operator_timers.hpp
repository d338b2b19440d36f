// Per-operator time of the head-fused CPU path, summed over all threads. Only a build with the
// CMake option HANPU_OPERATOR_TIMERS (preset "timers") measures anything: each operator boundary
// then reads a timestamp, so keep it out of production builds.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hanpu {

struct OperatorTimes {
  bool enabled = false;        // false: this build has no timers (everything else is empty)
  std::string unit;            // "TSC cycles" (x86-64) or "ns"
  int64_t head_chunks = 0;     // (value head, column block, chunk) steps measured since the reset
  std::vector<std::pair<std::string, double>> per_head_chunk;  // operator name, mean time per step
};

/// Time per operator since the last reset_operator_times() (or the start of the process).
OperatorTimes read_operator_times();
void reset_operator_times();

}  // namespace hanpu
