// The extension module hanpu._hanpu: the C++ engine, reference, planner and simulator behind the
// Python package python/hanpu/. hanpu::Error (bad input: the message names the tensor, what it got
// and what it expected) becomes hanpu.HanpuError, a subclass of ValueError.
#include "bindings.hpp"

NB_MODULE(_hanpu, m) {
  namespace nb = nanobind;
  m.doc() = "hanpu C++ engine (use the functions of the hanpu package, not this module directly)";
  nb::exception<hanpu::Error>(m, "HanpuError", PyExc_ValueError);
  hanpu::python::register_la(m);
  hanpu::python::register_plan(m);
  hanpu::python::register_model(m);
}
