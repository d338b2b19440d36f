// The layering check the build runs (CMakeLists.txt): this program links the simulator library
// alone (hanpu_sim, with the planner, devices, files and the algorithm beneath it) and no CPU
// backend. If the planner or the simulator called into src/cpu, it would not link. Run by ctest
// (SimOnly.PlansAndSimulatesAnNpuFile): plans GDN on a device file with every strategy and
// simulates each, so the check also proves the pieces work without the CPU.
#include <cstdio>
#include <exception>

#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/simulate.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hanpu_sim_link_check DEVICE.json\n");
    return 2;
  }
  try {
    const hanpu::Device dev = hanpu::load_device(argv[1]);
    hanpu::Problem p;
    p.seqlens = {1024};
    p.H = p.HV = 16;
    for (const std::string& s : hanpu::strategy_names()) {
      const hanpu::SimResult r = hanpu::simulate(hanpu::make_plan(p, dev, s), dev);
      if (!(r.latency_s > 0)) {
        std::fprintf(stderr, "%s: latency %g, expected > 0\n", s.c_str(), r.latency_s);
        return 1;
      }
      std::printf("%s on %s: %.3f ms\n", s.c_str(), dev.name.c_str(), r.latency_s * 1e3);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hanpu_sim_link_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
