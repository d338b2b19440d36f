// GDN/KDA prefill and the fp64 reference for Python. The FLA-named functions in python/hanpu/ops.py
// check arguments, allocate the outputs in the caller's array kind and call these with every tensor
// (or None); here the arrays become views (no copies), the GIL is released and the C++ engine runs.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "cpu/isa.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/reference.hpp"
#include "io/json_io.hpp"

namespace hanpu::python {
namespace {

// The engine's shared thread pool is re-created when the thread count changes and runs one job at
// a time; concurrent calls from several Python threads are serialized here.
std::mutex engine_mutex;

Variant parse_variant(const std::string& s) {
  if (const std::optional<Variant> v = variant_from_name(s)) return *v;
  throw nb::value_error(("variant: got \"" + s + "\", expected \"gdn\" or \"kda\"").c_str());
}

CpuPath parse_path(const std::string& s) {
  if (const std::optional<CpuPath> p = cpu_path_from_name(s)) return *p;
  throw nb::value_error(("path: got \"" + s + "\", expected \"hanpu\", \"fla\" or \"recurrent\"").c_str());
}

// States in FLA's V-first layout ([N,HV,V,K], state_v_first=True) reach the engine as transposed
// views: inner stride K. The engine reads and writes such rows element by element, which made a
// 16x128x128 decode step 5x slower; states are copied through a contiguous fp32 [N,HV,K,V] buffer
// instead, transposed in square tiles so that both sides stay in cache.
constexpr int64_t kTransposeTile = 32;  // 32x32 fp32 = 4 KiB per side: both tiles fit in L1

bool needs_state_copy(const TensorView& t) { return !t.empty() && t.rank == 4 && t.shape[3] > 1 && t.stride[3] != 1; }

// dst[n,h,i,j] = src[n,h,i,j] for rank-4 views of the same shape (any float dtypes, any strides).
template <class Load, class Store>
void copy_state_tiles(const TensorView& src, const TensorView& dst, Load load, Store store) {
  const int64_t I = src.shape[2], J = src.shape[3];
  for (int64_t n = 0; n < src.shape[0]; ++n)
    for (int64_t h = 0; h < src.shape[1]; ++h) {
      const int64_t s0 = n * src.stride[0] + h * src.stride[1], d0 = n * dst.stride[0] + h * dst.stride[1];
      for (int64_t i0 = 0; i0 < I; i0 += kTransposeTile)
        for (int64_t j0 = 0; j0 < J; j0 += kTransposeTile) {
          const int64_t i1 = std::min(I, i0 + kTransposeTile), j1 = std::min(J, j0 + kTransposeTile);
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j)
              store(d0 + i * dst.stride[2] + j * dst.stride[3], load(s0 + i * src.stride[2] + j * src.stride[3]));
        }
    }
}

void copy_state(const TensorView& src, const TensorView& dst) {
  if (src.dtype == DType::F32 && dst.dtype == DType::F32) {
    const float* s = static_cast<const float*>(src.data);
    float* d = static_cast<float*>(dst.data);
    copy_state_tiles(src, dst, [s](int64_t i) { return s[i]; }, [d](int64_t i, float x) { d[i] = x; });
  } else {
    copy_state_tiles(
        src, dst, [&](int64_t i) { return load_as_double(src.data, src.dtype, i); },
        [&](int64_t i, double x) { store_from_double(dst.data, dst.dtype, i, x); });
  }
}

// A contiguous fp32 [N,HV,K,V] view over `buffer`, grown as needed. The buffers live across calls
// (guarded by engine_mutex): a fresh multi-MiB allocation per decode step costs more in page
// faults than the copy itself.
TensorView state_scratch(std::vector<float>& buffer, const TensorView& like) {
  const std::vector<int64_t> shape{like.shape[0], like.shape[1], like.shape[2], like.shape[3]};
  buffer.resize(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
  return TensorView::contiguous(buffer.data(), DType::F32, shape);
}
std::vector<float> initial_state_scratch, final_state_scratch;

struct Args {
  ArrayRefs refs;
  LaInputs in;
  LaOptions opt;
};

void read_inputs(Args& a, nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta,
                 nb::handle initial_state, nb::handle cu_seqlens, nb::handle A_log, nb::handle dt_bias,
                 std::optional<double> scale, bool qk_l2norm, bool gate_in_kernel, bool beta_sigmoid,
                 bool allow_neg_eigval, std::optional<double> lower_bound) {
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
  if (lower_bound) a.opt.lower_bound = static_cast<float>(*lower_bound);
}

void prefill(const std::string& variant, nb::handle q, nb::handle k, nb::handle v, nb::handle g, nb::handle beta,
             nb::handle initial_state, nb::handle cu_seqlens, nb::handle A_log, nb::handle dt_bias, nb::handle o,
             nb::handle final_state, std::optional<double> scale, bool qk_l2norm, bool gate_in_kernel,
             bool beta_sigmoid, bool allow_neg_eigval, const std::string& path, int threads,
             const std::string& plan_json, std::optional<double> lower_bound) {
  const Variant var = parse_variant(variant);
  // plan=: the plan JSON (hanpu.plan(...) or `hanpu plan -o`), parsed and validated before the run;
  // errors name the field ("plan.kernels[0].cores: ...").
  std::optional<Plan> plan;
  if (!plan_json.empty()) plan = plan_from_json(parse_json(plan_json, "plan"), "plan");
  Args a;
  read_inputs(a, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm, gate_in_kernel,
              beta_sigmoid, allow_neg_eigval, lower_bound);
  LaOutputs out;
  out.o = array_view(o, "o", a.refs, /*writable=*/true);
  out.final_state = array_view(final_state, "final_state", a.refs, /*writable=*/true);
  ExecOptions ex;
  ex.path = parse_path(path);
  ex.threads = plan ? 0 : threads;  // a plan brings its own core count
  if (plan) ex.plan = &*plan;
  // The package's LA functions share the process-wide default engine (calls are serialized by
  // engine_mutex below); each model has its own (model_bindings.cpp).
  ex.engine = &Engine::default_engine();
  nb::gil_scoped_release no_gil;
  std::lock_guard<std::mutex> lock(engine_mutex);
  if (needs_state_copy(a.in.initial_state)) {
    const TensorView h0 = state_scratch(initial_state_scratch, a.in.initial_state);
    copy_state(a.in.initial_state, h0);
    a.in.initial_state = h0;
  }
  const TensorView ht_user = out.final_state;
  const bool copy_final = needs_state_copy(ht_user);
  if (copy_final) out.final_state = state_scratch(final_state_scratch, ht_user);
  la_prefill(var, a.in, a.opt, out, ex);
  if (copy_final) copy_state(out.final_state, ht_user);
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
                    bool beta_sigmoid, bool allow_neg_eigval, std::optional<double> lower_bound) {
  const Variant var = parse_variant(variant);
  Args a;
  read_inputs(a, q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, qk_l2norm, gate_in_kernel,
              beta_sigmoid, allow_neg_eigval, lower_bound);
  LaReference r;
  {
    nb::gil_scoped_release no_gil;
    r = la_reference(var, a.in, a.opt);
  }
  return nb::make_tuple(to_numpy(r.o), to_numpy(r.final_state));
}

// HANPU_ISA as applied (cpu/isa.hpp); a bad value raises ValueError naming it.
nb::dict isa_info() {
  const cpu::IsaSelection& s = cpu::isa_selection();
  nb::dict d;
  d["requested"] = s.requested;
  d["target"] = s.target;
  d["native"] = s.native;
  nb::list choices;
  for (const std::string& c : cpu::isa_choices()) choices.append(c);
  d["choices"] = choices;
  return d;
}

}  // namespace

void register_la(nb::module_& m) {
  m.def("la_prefill", &prefill, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("o"), nb::arg("final_state").none(), nb::arg("scale").none(),
        nb::arg("qk_l2norm"), nb::arg("gate_in_kernel"), nb::arg("beta_sigmoid"), nb::arg("allow_neg_eigval"),
        nb::arg("path"), nb::arg("threads"), nb::arg("plan_json") = "", nb::arg("lower_bound").none() = nb::none(),
        "Runs GDN/KDA prefill into the given o / final_state arrays (no copies; GIL released).");
  m.def("la_reference", &reference, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("scale").none(), nb::arg("qk_l2norm"), nb::arg("gate_in_kernel"),
        nb::arg("beta_sigmoid"), nb::arg("allow_neg_eigval"), nb::arg("lower_bound").none() = nb::none(),
        "The fp64 token-by-token reference: returns (o, final_state) as float64 numpy arrays.");
  m.def("isa", &isa_info, "The SIMD target the kernels dispatch to, after HANPU_ISA (requested, target, native, choices).");
  m.def("hardware_threads", &hardware_threads, "Hardware threads this process may run on (its CPU affinity).");
}

}  // namespace hanpu::python
