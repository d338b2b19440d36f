// Python arrays -> hanpu::TensorView. nanobind's ndarray caster reads numpy arrays through the
// buffer protocol and torch tensors through DLPack; with no dtype/shape/order constraints and
// conversion disabled it never copies, so outputs written through the view land in the caller's
// array and inputs are read in place, in the caller's dtype and strides.
#include <string>

#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace hanpu::python {
namespace {

std::string dtype_label(const nb::dlpack::dtype& dt) {
  const char* code = "?";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: code = "complex"; break;
    case nb::dlpack::dtype_code::Bool: code = "bool"; break;
  }
  return std::string(code) + std::to_string(dt.bits);
}

DType to_dtype(const nb::dlpack::dtype& dt, const char* name) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(dt.code);
  if (dt.lanes == 1) {
    if (code == C::Float && dt.bits == 32) return DType::F32;
    if (code == C::Float && dt.bits == 16) return DType::F16;
    if (code == C::Float && dt.bits == 64) return DType::F64;
    if (code == C::Bfloat && dt.bits == 16) return DType::BF16;
    if (code == C::Int && dt.bits == 32) return DType::I32;
    if (code == C::Int && dt.bits == 64) return DType::I64;
  }
  throw nb::type_error((std::string("tensor '") + name + "' has dtype " + dtype_label(dt) +
                        ", expected float32, float16, bfloat16, float64, int32 or int64")
                           .c_str());
}

// Fills the view from any ndarray flavour (read-only or writable).
template <class Array>
TensorView fill_view(const Array& a, DType dtype, const char* name) {
  if (a.device_type() != nb::device::cpu::value)
    throw nb::type_error((std::string("tensor '") + name + "' is not in host memory: hanpu runs on the CPU "
                          "(move it with .cpu() first)").c_str());
  if (a.ndim() > static_cast<size_t>(kMaxRank))
    throw nb::value_error((std::string("tensor '") + name + "' has " + std::to_string(a.ndim()) +
                           " dimensions, hanpu tensors have at most " + std::to_string(kMaxRank)).c_str());
  TensorView v;
  // An empty array may have no storage; the view still has to read as "present".
  static std::byte empty_storage[64];
  v.data = a.data() ? const_cast<void*>(static_cast<const void*>(a.data())) : empty_storage;
  v.dtype = dtype;
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.stride[i] = static_cast<int64_t>(a.stride(i));
  }
  return v;
}

}  // namespace

TensorView array_view(nb::handle obj, const char* name, ArrayRefs& refs, bool writable) {
  if (obj.is_none()) return {};
  nb::handle array = obj;
  bool bf16_bits = false;
  if (nb::isinstance<nb::tuple>(obj)) {
    nb::tuple t = nb::borrow<nb::tuple>(obj);
    if (t.size() != 2 || !nb::isinstance<nb::str>(t[1]) || nb::cast<std::string>(t[1]) != "bf16")
      throw nb::type_error((std::string("tensor '") + name + "' is a tuple; expected an array").c_str());
    array = t[0];
    bf16_bits = true;
  }
  auto as_dtype = [&](const nb::dlpack::dtype& dt) {
    if (!bf16_bits) return to_dtype(dt, name);
    if (dt != nb::dtype<uint16_t>())
      throw nb::type_error((std::string("tensor '") + name + "': bfloat16 bits must arrive as uint16").c_str());
    return DType::BF16;
  };
  auto not_array = [&] {
    return std::string("tensor '") + name + "' must be a numpy array or a torch tensor, got " +
           nb::cast<std::string>(nb::str(array.type().attr("__name__")));
  };
  if (writable) {
    nb::ndarray<> a;
    if (!nb::try_cast(array, a, /*convert=*/false)) throw nb::type_error((not_array() + " (writable)").c_str());
    TensorView v = fill_view(a, as_dtype(a.dtype()), name);
    refs.outputs.push_back(std::move(a));
    return v;
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(array, a, /*convert=*/false)) throw nb::type_error(not_array().c_str());
  TensorView v = fill_view(a, as_dtype(a.dtype()), name);
  refs.inputs.push_back(std::move(a));
  return v;
}

}  // namespace hanpu::python
