// libFuzzer target: plan files (hanpu plan -o) through the JSON layer and plan_from_json; a plan
// that validates round-trips through plan_to_json and, when small, is simulated on the Ascend 310P
// description (the plan's device name is replaced so that every valid plan is simulated).
#include <cstdlib>

#include "fuzz_common.hpp"
#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/simulate.hpp"
#include "io/json_io.hpp"

#ifndef HANPU_FUZZ_DEVICE
#error "HANPU_FUZZ_DEVICE (a device file) must be defined by the build"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const hanpu::Device dev = hanpu::load_device(HANPU_FUZZ_DEVICE);
  try {
    hanpu::Plan plan = hanpu::plan_from_json(hanpu::parse_json(hanpu::fuzz::as_text(data, size), "plan.json"), "plan.json");
    const nlohmann::json back = hanpu::plan_to_json(plan);
    if (hanpu::plan_to_json(hanpu::plan_from_json(back, "plan.json (written back)")) != back) std::abort();
    // Keep each input fast: simulate plans of bounded work only.
    if (plan.problem.HV * plan.problem.total_chunks() <= 4096) {
      plan.device = dev.name;
      hanpu::simulate(plan, dev);
    }
  } catch (const hanpu::Error&) {
  }
  return 0;
}
