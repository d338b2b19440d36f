// GDN/KDA prefill and the fp64 reference for Python. The FLA-named functions in python/hanpu/ops.py
// check arguments, allocate the outputs in the caller's array kind and call these with every tensor
// (or None); here the arrays become views (no copies), the GIL is released and the C++ engine runs.
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/la.hpp"
#include "hanpu/reference.hpp"

namespace hanpu::python {
namespace {

// The engine's shared thread pool is re-created when the thread count changes and runs one job at
// a time; concurrent calls from several Python threads are serialized here.
std::mutex engine_mutex;

Variant parse_variant(const std::string& s) {
  if (s == "gdn") return Variant::GDN;
  if (s == "kda") return Variant::KDA;
  throw nb::value_error(("variant: got \"" + s + "\", expected \"gdn\" or \"kda\"").c_str());
}

CpuPath parse_path(const std::string& s) {
  if (s == "hanpu") return CpuPath::HeadFused;
  if (s == "fla") return CpuPath::FlaChunk;
  if (s == "recurrent") return CpuPath::Recurrent;
  throw nb::value_error(("path: got \"" + s + "\", expected \"hanpu\", \"fla\" or \"recurrent\"").c_str());
}

struct Args {
  ArrayRefs refs;
  LaInputs in;
  LaOptions opt;
};

void read_inputs(Args& a, nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta,
                 nb::handle initial_state, nb::handle cu_seqlens, nb::handle A_log, nb::handle dt_bias,
                 std::optional<double> scale, bool qk_l2norm, bool gate_in_kernel, bool beta_sigmoid,
                 bool allow_neg_eigval) {
  a.in.q = array_view(q, "q", a.refs);
  a.in.k = array_view(k, "k", a.refs);
  a.in.v = array_view(v, "v", a.refs);
  a.in.g = array_view(g, "g", a.refs);
  a.in.beta = array_view(beta, "beta", a.refs);
  a.in.initial_state = array_view(initial_state, "initial_state", a.refs);
  a.in.cu_seqlens = array_view(cu_seqlens, "cu_seqlens", a.refs);
  a.in.A_log = array_view(A_log, "A_log", a.refs);
  a.in.dt_bias = array_view(dt_bias, "dt_bias", a.refs);
  if (scale) a.opt.scale = static_cast<float>(*scale);
  a.opt.qk_l2norm = qk_l2norm;
  a.opt.gate_in_kernel = gate_in_kernel;
  a.opt.beta_sigmoid = beta_sigmoid;
  a.opt.allow_neg_eigval = allow_neg_eigval;
}

void prefill(const std::string& variant, nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta,
             nb::handle initial_state, nb::handle cu_seqlens, nb::handle A_log, nb::handle dt_bias, nb::handle o,
             nb::handle final_state, std::optional<double> scale, bool qk_l2norm, bool gate_in_kernel,
             bool beta_sigmoid, bool allow_neg_eigval, const std::string& path, int threads) {
  const Variant var = parse_variant(variant);
  Args a;
  read_inputs(a, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm, gate_in_kernel,
              beta_sigmoid, allow_neg_eigval);
  LaOutputs out;
  out.o = array_view(o, "o", a.refs, /*writable=*/true);
  out.final_state = array_view(final_state, "final_state", a.refs, /*writable=*/true);
  ExecOptions ex;
  ex.path = parse_path(path);
  ex.threads = threads;
  nb::gil_scoped_release no_gil;
  std::lock_guard<std::mutex> lock(engine_mutex);
  la_prefill(var, a.in, a.opt, out, ex);
}

// A freshly allocated float64 numpy array holding a copy of `t` (contiguous F64).
nb::ndarray<nb::numpy, double> to_numpy(const Tensor& t) {
  const size_t n = static_cast<size_t>(t.numel());
  double* data = new double[n > 0 ? n : 1];
  std::memcpy(data, t.data(), n * sizeof(double));
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<double*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  return nb::ndarray<nb::numpy, double>(data, shape.size(), shape.data(), owner);
}

nb::tuple reference(const std::string& variant, nb::handle q, nb::handle k, nb::handle v, nb::handle g,
                    nb::handle beta, nb::handle initial_state, nb::handle cu_seqlens, nb::handle A_log,
                    nb::handle dt_bias, std::optional<double> scale, bool qk_l2norm, bool gate_in_kernel,
                    bool beta_sigmoid, bool allow_neg_eigval) {
  const Variant var = parse_variant(variant);
  Args a;
  read_inputs(a, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm, gate_in_kernel,
              beta_sigmoid, allow_neg_eigval);
  LaReference r;
  {
    nb::gil_scoped_release no_gil;
    r = la_reference(var, a.in, a.opt);
  }
  return nb::make_tuple(to_numpy(r.o), to_numpy(r.final_state));
}

}  // namespace

void register_la(nb::module_& m) {
  m.def("la_prefill", &prefill, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("o"), nb::arg("final_state").none(), nb::arg("scale").none(),
        nb::arg("qk_l2norm"), nb::arg("gate_in_kernel"), nb::arg("beta_sigmoid"), nb::arg("allow_neg_eigval"),
        nb::arg("path"), nb::arg("threads"),
        "Runs GDN/KDA prefill into the given o / final_state arrays (no copies; GIL released).");
  m.def("la_reference", &reference, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("scale").none(), nb::arg("qk_l2norm"), nb::arg("gate_in_kernel"),
        nb::arg("beta_sigmoid"), nb::arg("allow_neg_eigval"),
        "The fp64 token-by-token reference: returns (o, final_state) as float64 numpy arrays.");
  m.def("hardware_threads", &hardware_threads, "Hardware threads this process may run on (its CPU affinity).");
}

}  // namespace hanpu::python
