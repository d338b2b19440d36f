// Shared pieces of the nanobind module hanpu._hanpu: turning Python arrays (numpy arrays, torch
// tensors: anything nanobind's ndarray accepts through DLPack or the buffer protocol) into
// hanpu::TensorView without copying, and the registration functions of each binding file.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "hanpu/tensor.hpp"

namespace hanpu::python {

namespace nb = nanobind;

/// Keeps the Python arrays behind the views of one call alive (and their buffers exported) until
/// the call returns. Destroy it with the GIL held.
struct ArrayRefs {
  std::vector<nb::ndarray<nb::ro>> inputs;
  std::vector<nb::ndarray<>> outputs;
};

/// A view of `obj` (None: an empty view meaning "absent"). `obj` may also be a tuple
/// (uint16 array, "bf16"): the Python side's spelling of a bfloat16 numpy array (ml_dtypes), whose
/// dtype nanobind does not know. Never copies: the view aliases the caller's memory with its
/// strides (in elements). Raises TypeError naming `name` for a non-array, a non-CPU array or a
/// dtype hanpu has no name for; `writable` additionally rejects read-only arrays.
TensorView array_view(nb::handle obj, const char* name, ArrayRefs& refs, bool writable = false);

void register_la(nb::module_& m);
void register_plan(nb::module_& m);
void register_model(nb::module_& m);

}  // namespace hanpu::python
