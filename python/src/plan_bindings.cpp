// Planner and simulator for Python: devices and plans cross the boundary as JSON text (the same
// JSON the CLI writes: device_to_json, plan_to_json, sim_result_to_json), which python/hanpu/
// planning.py turns into plain dicts.
#include <string>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"
#include "hanpu/simulate.hpp"
#include "io/json_io.hpp"

namespace hanpu::python {
namespace {

// The project's JSON layer (io/json_io.hpp): nesting limited, duplicate keys rejected.
nlohmann::json parse(const std::string& text, const std::string& origin) { return parse_json(text, origin); }

Device device_from_text(const std::string& text, const std::string& origin) {
  return device_from_json(parse(text, origin), origin);
}

Problem make_problem(const std::string& variant, const std::vector<int64_t>& seqlens, bool varlen, int64_t H,
                     int64_t HV, int64_t K, int64_t V, bool initial_state, bool final_state) {
  Problem p;
  const std::optional<Variant> v = variant_from_name(variant);
  if (!v) throw Error("variant: got \"" + variant + "\", expected " + variant_names(" or "));
  p.variant = *v;
  p.seqlens = seqlens;
  p.varlen = varlen;
  p.H = H, p.HV = HV, p.K = K, p.V = V;
  p.read_initial_state = initial_state;
  p.write_final_state = final_state;
  validate_problem(p);
  return p;
}

std::string plan_json(const std::string& device_text, const std::string& device_origin, const std::string& variant,
                      const std::vector<int64_t>& seqlens, bool varlen, int64_t H, int64_t HV, int64_t K, int64_t V,
                      bool initial_state, bool final_state, const std::string& strategy, int cores) {
  const Device dev = device_from_text(device_text, device_origin);
  const Problem p = make_problem(variant, seqlens, varlen, H, HV, K, V, initial_state, final_state);
  PlanOptions po = cpu_plan_options(dev);
  po.cores = cores;
  nb::gil_scoped_release no_gil;
  return plan_to_json(make_plan(p, dev, strategy, po)).dump();
}

std::string simulate_plan_json(const std::string& device_text, const std::string& device_origin,
                               const std::string& plan_text, bool detail) {
  const Device dev = device_from_text(device_text, device_origin);
  const Plan plan = plan_from_json(parse(plan_text, "plan"), "plan");
  nb::gil_scoped_release no_gil;
  return sim_result_to_json(simulate(plan, dev), detail).dump();
}

std::string describe_plan_text(const std::string& plan_text) {
  return describe_plan(plan_from_json(parse(plan_text, "plan"), "plan"));
}

std::string load_device_json(const std::string& path) { return device_to_json(load_device(path)).dump(); }

std::string host_device_json(int threads, double measure_seconds) {
  nb::gil_scoped_release no_gil;
  return device_to_json(host_device(threads, measure_seconds)).dump();
}

std::string check_device_json(const std::string& text, const std::string& origin) {
  return device_to_json(device_from_text(text, origin)).dump();
}

}  // namespace

void register_plan(nb::module_& m) {
  m.def("plan_json", &plan_json, nb::arg("device_text"), nb::arg("device_origin"), nb::arg("variant"),
        nb::arg("seqlens"), nb::arg("varlen"), nb::arg("H"), nb::arg("HV"), nb::arg("K"), nb::arg("V"),
        nb::arg("initial_state"), nb::arg("final_state"), nb::arg("strategy"), nb::arg("cores"),
        "Plans LA prefill on a device (JSON text) with a strategy; returns the plan as JSON text.");
  m.def("simulate_plan_json", &simulate_plan_json, nb::arg("device_text"), nb::arg("device_origin"),
        nb::arg("plan_text"), nb::arg("detail"), "Simulates a plan (JSON text) on a device; returns the result as JSON text.");
  m.def("describe_plan", &describe_plan_text, nb::arg("plan_text"), "Human-readable summary of a plan (JSON text).");
  m.def("load_device_json", &load_device_json, nb::arg("path"), "Loads and validates a device file; returns its JSON text.");
  m.def("check_device_json", &check_device_json, nb::arg("text"), nb::arg("origin"),
        "Validates a device description (JSON text); returns it normalized.");
  m.def("host_device_json", &host_device_json, nb::arg("threads"), nb::arg("measure_seconds"),
        "Describes this machine in the device schema (measured for about measure_seconds; 0: estimates).");
  m.def("strategy_names", &strategy_names, "The planning strategies (baselines and hanpu).");
  m.def("ablation_names", &ablation_names, "The ablation steps from fla to hanpu.");
}

}  // namespace hanpu::python
