// GDN/KDA prefill and the fp64 reference for Python. The FLA-named functions in python/hanpu/ops.py
// check arguments, allocate the outputs in the caller's array kind and call these with every tensor
// (or None); here the arrays become views (no copies), the GIL is released and the C++ engine runs.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#if defined(__linux__)
#include <dlfcn.h>
#endif

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "hanpu/isa.hpp"
#include "cpu/engine_impl.hpp"
#include "cpu/la_amx.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/reference.hpp"
#include "io/json_io.hpp"
#include "model/layer_kernels.hpp"
#include "model/layer_ops.hpp"

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

// ---------------------------------------------------------------------------------------------
// States kept in a caller's slot pool (vLLM's recurrent-state cache), read and updated in place.
//
// pool [S,HV,K,V] holds one state per slot; sequence n of the call uses slot slots[n] (negative:
// vLLM's PAD_SLOT_ID, the sequence is skipped and its outputs are left as they are). The engine
// addresses sequence n's state as pool + n * stride[0], so a run of sequences whose slots step by
// a constant (one sequence, or consecutive slots) is one view of the pool and one engine call;
// other slot orders split the call into such runs. Nothing is gathered, scattered or allocated
// when the pool is fp32 with unit column stride; other pool dtypes (bf16 states) go through the
// fp32 scratch buffers above, one run at a time.

int64_t index_at(const TensorView& t, int64_t i) {
  const int64_t off = i * t.stride[0];
  return t.dtype == DType::I32 ? static_cast<const int32_t*>(t.data)[off] : static_cast<const int64_t*>(t.data)[off];
}

// `t` with dimension `dim` narrowed to [begin, begin + len).
TensorView narrow(TensorView t, int dim, int64_t begin, int64_t len) {
  t.data = static_cast<std::byte*>(t.data) + begin * t.stride[dim] * static_cast<int64_t>(dtype_size(t.dtype));
  t.shape[dim] = len;
  return t;
}

// A run of sequences [n0, n1) whose slots are slot0, slot0 + step, ...: one engine call.
struct SlotRun {
  int64_t n0, n1, slot0, step;
  bool decode;  // every sequence has one token: the token-by-token path
};

// Largest token count of a sequence that still runs token by token in path "auto": a single
// decode token. Two or more tokens (a prefill chunk, or a speculative draft) go to the chunked path,
// which is faster from the first whole chunk on and equal to it for short ones (docs/VLLM.md).
constexpr int64_t kRecurrentMaxTokens = 1;

// vLLM's has_initial_state: a contiguous bool CPU array [N] (one flag per sequence), read through
// `keep` (which holds the reference), or None (nullptr: every sequence continues its slot's state).
const bool* has_initial_state_flags(nb::handle has_initial_state, int64_t N, nb::ndarray<nb::ro>& keep) {
  if (has_initial_state.is_none()) return nullptr;
  if (!nb::try_cast(has_initial_state, keep, false) || keep.dtype() != nb::dtype<bool>() || keep.ndim() != 1 ||
      keep.device_type() != nb::device::cpu::value || static_cast<int64_t>(keep.shape(0)) != N ||
      (N > 1 && keep.stride(0) != 1))
    throw nb::type_error(("tensor 'has_initial_state': expected a contiguous bool CPU array [N] with N = " +
                          std::to_string(N) + " (one flag per sequence)").c_str());
  return static_cast<const bool*>(keep.data());
}

std::optional<std::string> slots_call(const std::string& variant, nb::handle q, nb::handle k, nb::handle v,
                                      nb::handle g, nb::handle beta, nb::handle state_pool, nb::handle slots,
                                      nb::handle has_initial_state, nb::handle cu_seqlens, nb::handle A_log,
                                      nb::handle dt_bias, nb::handle o, std::optional<double> scale, bool qk_l2norm,
                                      bool gate_in_kernel, bool beta_sigmoid, bool allow_neg_eigval,
                                      const std::string& path, int threads, std::optional<double> lower_bound,
                                      const std::string& amx) {
  const Variant var = parse_variant(variant);
  if (path != "auto" && path != "hanpu" && path != "recurrent")
    throw nb::value_error(("path: got \"" + path + "\", expected \"auto\", \"hanpu\" or \"recurrent\"").c_str());
  const std::optional<LaAmx> amx_setting = la_amx_from_name(amx);
  if (!amx_setting)
    throw nb::value_error(("amx: got \"" + amx + "\", expected \"off\", \"round\" or \"split\"").c_str());
  Args a;
  read_inputs(a, q, k, v, g, beta, nb::none(), cu_seqlens, A_log, dt_bias, scale, qk_l2norm, gate_in_kernel,
              beta_sigmoid, allow_neg_eigval, lower_bound);
  const TensorView pool = array_view(state_pool, "state_pool", a.refs, /*writable=*/true);
  const TensorView slot = array_view(slots, "slots", a.refs);
  const TensorView out_o = array_view(o, "o", a.refs, /*writable=*/true);
  // has_initial_state: bool [N] (vLLM's), or None (every sequence continues its slot's state).
  const bool varlen = !a.in.cu_seqlens.empty();
  if (a.in.q.empty() || a.in.q.rank != 4) throw nb::value_error("tensor 'q': expected [B,T,H,K]");
  const int64_t N = varlen ? a.in.cu_seqlens.shape[0] - 1 : a.in.q.shape[0];
  nb::ndarray<nb::ro> has_init_array;
  const bool* has_init = has_initial_state_flags(has_initial_state, N, has_init_array);
  if (pool.empty() || pool.rank != 4 || !is_float(pool.dtype))
    throw nb::value_error(("tensor 'state_pool' has shape " + (pool.empty() ? std::string("None") : pool.shape_str()) +
                           ", expected a float [slots,HV,K,V] pool").c_str());
  if (slot.empty() || slot.rank != 1 || (slot.dtype != DType::I32 && slot.dtype != DType::I64) || slot.shape[0] != N)
    throw nb::value_error(("tensor 'slots': expected int32/int64 [N] with N = " + std::to_string(N) +
                           " (one slot per sequence), got " + (slot.empty() ? std::string("None") : slot.shape_str()) +
                           (slot.empty() ? "" : std::string(" ") + dtype_name(slot.dtype)))
                              .c_str());
  if (out_o.empty()) throw nb::value_error("tensor 'o' is required");
  if (varlen && a.in.cu_seqlens.dtype != DType::I32 && a.in.cu_seqlens.dtype != DType::I64)
    throw nb::type_error("tensor 'cu_seqlens': expected int32 or int64");
  const int64_t S = pool.shape[0];
  std::vector<int64_t> bos(static_cast<size_t>(N) + 1);
  for (int64_t n = 0; n <= N; ++n) bos[static_cast<size_t>(n)] = varlen ? index_at(a.in.cu_seqlens, n) : n;
  const int64_t T = a.in.q.shape[1];
  auto seq_len = [&](int64_t n) { return varlen ? bos[n + 1] - bos[n] : T; };
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = index_at(slot, n);
    if (s >= S)
      throw nb::value_error(("tensor 'slots': slots[" + std::to_string(n) + "] = " + std::to_string(s) +
                             ", expected < " + std::to_string(S) + " (the pool's slots) or negative (padding)").c_str());
    if (varlen && (bos[n + 1] < bos[n] || bos[n] < 0 || bos[n + 1] > T))
      throw nb::value_error(("tensor 'cu_seqlens': entry " + std::to_string(n + 1) + " = " + std::to_string(bos[n + 1]) +
                             " is out of order or beyond T = " + std::to_string(T)).c_str());
  }
  // The runs, in sequence order.
  std::vector<SlotRun> runs;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = index_at(slot, n);
    if (s < 0) continue;
    const bool dec = path == "recurrent" || (path == "auto" && seq_len(n) <= kRecurrentMaxTokens);
    if (!runs.empty()) {
      SlotRun& r = runs.back();
      const int64_t last = r.slot0 + (r.n1 - 1 - r.n0) * r.step;
      const int64_t step = r.n1 - r.n0 == 1 ? s - r.slot0 : r.step;
      if (r.n1 == n && r.decode == dec && step > 0 && s == last + step) {
        r.step = step;
        r.n1 = n + 1;
        continue;
      }
    }
    runs.push_back({n, n + 1, s, 1, dec});
  }
  ExecOptions ex;
  ex.threads = threads;
  ex.engine = &Engine::default_engine();
  ex.amx = *amx_setting;
  ExecReport report;
  std::optional<std::string> gemms;  // what ran the chunked runs' GEMMs (the last one's report)
  nb::gil_scoped_release no_gil;
  std::lock_guard<std::mutex> lock(engine_mutex);
  const size_t elem = dtype_size(pool.dtype);
  const int64_t state_elems = pool.shape[1] * pool.shape[2] * pool.shape[3];
  for (const SlotRun& r : runs) {
    TensorView state = pool;
    state.data = static_cast<std::byte*>(pool.data) + r.slot0 * pool.stride[0] * static_cast<int64_t>(elem);
    state.shape[0] = r.n1 - r.n0;
    state.stride[0] = pool.stride[0] * r.step;
    // Slots starting a new sequence begin from zero (vLLM reuses slots without clearing them).
    for (int64_t n = r.n0; n < r.n1; ++n) {
      if (!has_init || has_init[n]) continue;
      TensorView one = narrow(state, 0, n - r.n0, 1);
      if (one.is_contiguous()) {
        std::memset(one.data, 0, static_cast<size_t>(state_elems) * elem);
      } else {
        copy_state_tiles(one, one, [](int64_t) { return 0.0; },
                         [&](int64_t i, double x) { store_from_double(one.data, one.dtype, i, x); });
      }
    }
    LaInputs in = a.in;
    LaOutputs out;
    const int64_t t0 = bos[r.n0], tokens = bos[r.n1] - bos[r.n0];
    std::vector<int64_t> cu;
    if (varlen) {
      for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) *t = narrow(*t, 1, t0, tokens);
      out.o = narrow(out_o, 1, t0, tokens);
      for (int64_t n = r.n0; n <= r.n1; ++n) cu.push_back(bos[n] - t0);
      in.cu_seqlens = TensorView::contiguous(cu.data(), DType::I64, {static_cast<int64_t>(cu.size())});
    } else {
      for (TensorView* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) *t = narrow(*t, 0, r.n0, r.n1 - r.n0);
      out.o = narrow(out_o, 0, r.n0, r.n1 - r.n0);
    }
    ex.path = r.decode ? CpuPath::Recurrent : CpuPath::HeadFused;
    ex.report = r.decode ? nullptr : &report;
    // In place: the engine loads each (sequence, head, columns) block of the state once before its
    // tokens and stores it once after them, so the initial and the final state may be one view.
    if (state.dtype == DType::F32 && state.stride[3] == 1) {
      in.initial_state = state;
      out.final_state = state;
      la_prefill(var, in, a.opt, out, ex);
    } else {
      const TensorView scratch = state_scratch(initial_state_scratch, state);
      copy_state(state, scratch);
      in.initial_state = scratch;
      out.final_state = scratch;
      la_prefill(var, in, a.opt, out, ex);
      copy_state(scratch, state);
    }
    if (!r.decode) gemms = report.gemms;
  }
  return gemms;
}

// ---------------------------------------------------------------------------------------------
// vLLM's causal convolution (depthwise, width W, SiLU, no bias) on its conv-state pool, in place.
//
// x [T,D] holds the tokens of N sequences (cu_seqlens [N+1]); sequence n continues the state in
// conv_pool[slots[n]] ([S,W-1,D]: the last W-1 input rows, oldest first; vLLM's "SD" layout, or
// its "DS" layout passed as a transposed view) or, with has_initial_state[n] false, starts from
// zeros, as vLLM's causal_conv1d_fn_cpu / causal_conv1d_update_cpu do. out [T,D] (fp32, or bf16
// rounded to nearest even once) gets silu(sum_j taps[j] * input[t - W + 1 + j]); the slot gets the
// last W-1 rows of [state; x], rounded to the pool's dtype. Negative slots (padding) skip the
// sequence; its rows of out become zeros.
//
// One pass over the tokens reads each window's rows where they are (x, and the pool's rows for a
// sequence's first W-1 tokens; f32 or bf16, widened in registers) through
// model::simd_conv_silu_row_mixed, then a second pass moves each slot's last rows. Only inputs the
// kernel cannot read in place (x or a pool in another dtype, strided rows: the DS layout) are
// first widened to fp32 scratch. The old version widened every row into a buffer first and
// divided in the sigmoid: 1.4 ms for 256 tokens x 6144 channels on one AVX-512 core (now a third).

// Row `src` (n elements `stride` apart, dtype dt) widened to fp32.
void load_row(const std::byte* src, DType dt, int64_t stride, int64_t n, float* dst) {
  if (dt == DType::F32) {
    const float* s = reinterpret_cast<const float*>(src);
    if (stride == 1) {
      std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i * stride];
    }
  } else if (dt == DType::BF16) {
    // bf16 is the top half of an fp32: a shift, which the compiler vectorizes for unit stride.
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    if (stride == 1) {
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i * stride]) << 16;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_as_double(src, dt, i * stride));
  }
}

// fp32 row `src` stored into `dst` (n elements `stride` apart, dtype dt, round to nearest even).
void store_row(const float* src, int64_t n, std::byte* dst, DType dt, int64_t stride) {
  if (dt == DType::F32) {
    float* d = reinterpret_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i * stride] = src[i];
  } else if (dt == DType::BF16) {
    // Round to nearest even, inline (f32_to_bf16 per element is a call): NaN keeps a quiet payload.
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    auto round = [](uint32_t b) {
      const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
      return nan ? static_cast<uint16_t>((b >> 16) | 0x40u)
                 : static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    };
    if (stride == 1) {  // vectorized by the compiler
      for (int64_t i = 0; i < n; ++i) d[i] = round(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * stride] = round(s[i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) store_from_double(dst, dt, i * stride, src[i]);
  }
}

void conv_slots_call(nb::handle x, nb::handle conv_pool, nb::handle slots, nb::handle has_initial_state,
                     nb::handle cu_seqlens, nb::handle taps, nb::handle out, int threads) {
  ArrayRefs refs;
  const TensorView xv = array_view(x, "x", refs);
  const TensorView pool = array_view(conv_pool, "conv_pool", refs, /*writable=*/true);
  const TensorView slot = array_view(slots, "slots", refs);
  const TensorView cu = array_view(cu_seqlens, "cu_seqlens", refs);
  const TensorView tv = array_view(taps, "taps", refs);
  const TensorView ov = array_view(out, "out", refs, /*writable=*/true);
  if (xv.empty() || xv.rank != 2 || !is_float(xv.dtype))
    throw nb::value_error(("tensor 'x': expected a float [T,D] array, got " +
                           (xv.empty() ? std::string("None") : xv.shape_str())).c_str());
  const int64_t T = xv.shape[0], D = xv.shape[1];
  if (tv.empty() || tv.rank != 2 || tv.dtype != DType::F32 || tv.shape[1] != D || !tv.is_contiguous() ||
      tv.shape[0] < 1)
    throw nb::value_error(("tensor 'taps': expected a contiguous float32 [W,D] array with D = " + std::to_string(D) +
                           " (the conv weight [D,W] transposed), got " +
                           (tv.empty() ? std::string("None") : tv.shape_str() + " " + dtype_name(tv.dtype))).c_str());
  const int64_t W = tv.shape[0], S1 = W - 1;
  if (pool.empty() || pool.rank != 3 || !is_float(pool.dtype) || pool.shape[1] != S1 || pool.shape[2] != D)
    throw nb::value_error(("tensor 'conv_pool': expected a float [slots,W-1,D] pool with W-1 = " + std::to_string(S1) +
                           ", D = " + std::to_string(D) + ", got " +
                           (pool.empty() ? std::string("None") : pool.shape_str())).c_str());
  if (ov.empty() || ov.rank != 2 || (ov.dtype != DType::F32 && ov.dtype != DType::BF16) || ov.shape[0] != T ||
      ov.shape[1] != D || ov.stride[1] != 1)
    throw nb::value_error(("tensor 'out': expected a float32 or bf16 [T,D] array with unit column stride, T = " +
                           std::to_string(T) + ", D = " + std::to_string(D) + ", got " +
                           (ov.empty() ? std::string("None") : ov.shape_str() + " " + dtype_name(ov.dtype))).c_str());
  if (cu.empty() || cu.rank != 1 || (cu.dtype != DType::I32 && cu.dtype != DType::I64) || cu.shape[0] < 1)
    throw nb::value_error("tensor 'cu_seqlens': expected int32/int64 [N+1] sequence starts");
  const int64_t N = cu.shape[0] - 1;
  if (slot.empty() || slot.rank != 1 || (slot.dtype != DType::I32 && slot.dtype != DType::I64) || slot.shape[0] != N)
    throw nb::value_error(("tensor 'slots': expected int32/int64 [N] with N = " + std::to_string(N) +
                           " (one slot per sequence), got " + (slot.empty() ? std::string("None") : slot.shape_str()))
                              .c_str());
  nb::ndarray<nb::ro> has_init_array;
  const bool* has_init = has_initial_state_flags(has_initial_state, N, has_init_array);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = index_at(cu, n), e = index_at(cu, n + 1), s = index_at(slot, n);
    if (b < 0 || e < b || e > T)
      throw nb::value_error(("tensor 'cu_seqlens': entry " + std::to_string(n + 1) + " = " + std::to_string(e) +
                             " is out of order or beyond T = " + std::to_string(T)).c_str());
    if (s >= pool.shape[0])
      throw nb::value_error(("tensor 'slots': slots[" + std::to_string(n) + "] = " + std::to_string(s) +
                             ", expected < " + std::to_string(pool.shape[0]) + " (the pool's slots) or negative (padding)")
                                .c_str());
  }
  if (threads < 1) throw nb::value_error(("threads: got " + std::to_string(threads) + ", expected at least 1").c_str());
  nb::gil_scoped_release no_gil;
  std::lock_guard<std::mutex> lock(engine_mutex);  // the engine's pool runs one job at a time
  const size_t xe = dtype_size(xv.dtype), pe = dtype_size(pool.dtype);
  const float* tp = static_cast<const float*>(tv.data);
  auto direct = [](const TensorView& t, int dim) {
    return (t.dtype == DType::F32 || t.dtype == DType::BF16) && (t.stride[dim] == 1 || t.shape[dim] == 1);
  };
  const bool x_direct = direct(xv, 1), pool_direct = direct(pool, 2);
  std::vector<int64_t> bos(static_cast<size_t>(N) + 1), slot_of(static_cast<size_t>(N));
  std::vector<int32_t> seq_of(static_cast<size_t>(T));  // token -> its sequence
  for (int64_t n = 0; n <= N; ++n) bos[n] = index_at(cu, n);
  for (int64_t n = 0; n < N; ++n) {
    slot_of[n] = index_at(slot, n);
    std::fill(seq_of.begin() + bos[n], seq_of.begin() + bos[n + 1], static_cast<int32_t>(n));
  }
  auto state_row = [&](int64_t s, int64_t r) {
    return static_cast<std::byte*>(pool.data) + (s * pool.stride[0] + r * pool.stride[1]) * static_cast<int64_t>(pe);
  };
  auto x_row = [&](int64_t t) {
    return static_cast<const std::byte*>(xv.data) + t * xv.stride[0] * static_cast<int64_t>(xe);
  };
  const EngineThreads th{&Engine::default_engine(), threads};
  // Decode steps (a token per sequence) stay on the calling thread: a token is a few microseconds
  // of work (6144 channels), less than waking the pool, whose threads may find their cores held
  // by torch's spin-waiting OpenMP workers (a 4-request step took milliseconds on 2 threads at
  // load average 8, 2-core Zen 3). On torch's own team (use_openmp_team) too: at load average 4 on
  // the 2-core Xeon a 4-token step on 2 threads took 31-241 us (median about 110), against
  // 35-64 us on one; the second thread is often not on a core when the work is this small.
  const bool many = T >= 64;
  // Scratch kept across calls (a prefill's rows are megabytes; fresh allocations cost page
  // faults): fp32 copies of what the kernel cannot read in place, and a row of zeros.
  static std::vector<float> x_f32, state_f32, zeros;
  zeros.assign(static_cast<size_t>(D), 0.0f);
  if (!x_direct) {
    x_f32.resize(static_cast<size_t>(T * D));
    model::parallel_for(T, th.when(many), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) load_row(x_row(t), xv.dtype, xv.stride[1], D, &x_f32[t * D]);
    });
  }
  if (!pool_direct) {  // each continued sequence's state rows, before any slot is written
    state_f32.resize(static_cast<size_t>(N * S1 * D));
    for (int64_t n = 0; n < N; ++n)
      if (slot_of[n] >= 0 && (!has_init || has_init[n]))
        for (int64_t r = 0; r < S1; ++r)
          load_row(state_row(slot_of[n], r), pool.dtype, pool.stride[2], D, &state_f32[(n * S1 + r) * D]);
  }
  // Row `p` of sequence n's [state; x] as the kernel's (f32, bf16) pointer pair.
  auto window_row = [&](int64_t n, int64_t p, const float*& f, const uint16_t*& b) {
    f = nullptr;
    b = nullptr;
    if (p >= S1) {
      const int64_t t = bos[n] + p - S1;
      if (!x_direct) f = &x_f32[t * D];
      else if (xv.dtype == DType::F32) f = reinterpret_cast<const float*>(x_row(t));
      else b = reinterpret_cast<const uint16_t*>(x_row(t));
    } else if (has_init && !has_init[n]) {
      f = zeros.data();
    } else if (!pool_direct) {
      f = &state_f32[(n * S1 + p) * D];
    } else if (pool.dtype == DType::F32) {
      f = reinterpret_cast<const float*>(state_row(slot_of[n], p));
    } else {
      b = reinterpret_cast<const uint16_t*>(state_row(slot_of[n], p));
    }
  };
  const bool out_bf16 = ov.dtype == DType::BF16;
  model::parallel_for(T, th.when(many), [&](int64_t t0, int64_t t1) {
    std::vector<const float*> in_f(static_cast<size_t>(W));
    std::vector<const uint16_t*> in_b(static_cast<size_t>(W));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = seq_of[t];
      std::byte* y = static_cast<std::byte*>(ov.data) + t * ov.stride[0] * static_cast<int64_t>(dtype_size(ov.dtype));
      if (slot_of[n] < 0) {
        std::memset(y, 0, static_cast<size_t>(D) * dtype_size(ov.dtype));  // +0.0 in f32 and bf16
        continue;
      }
      for (int64_t j = 0; j < W; ++j) window_row(n, t - bos[n] + j, in_f[j], in_b[j]);
      model::simd_conv_silu_row_mixed(in_f.data(), in_b.data(), tp, static_cast<size_t>(D), static_cast<size_t>(W),
                                      out_bf16 ? nullptr : reinterpret_cast<float*>(y),
                                      out_bf16 ? reinterpret_cast<uint16_t*>(y) : nullptr, static_cast<size_t>(D));
    }
  });
  // Each slot's new state: rows len .. len + W-2 of [state; x]. Row r takes row r + len (> r), so
  // in ascending r a state row is read before it is overwritten.
  model::parallel_for(N, th.when(N > 1 && many), [&](int64_t n0, int64_t n1) {
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t s = slot_of[n], len = bos[n + 1] - bos[n];
      if (s < 0 || len == 0) continue;
      for (int64_t r = 0; r < S1; ++r) {
        const float* f;
        const uint16_t* b;
        window_row(n, len + r, f, b);
        std::byte* dst = state_row(s, r);
        const DType src_dt = f ? DType::F32 : DType::BF16;
        const void* src = f ? static_cast<const void*>(f) : static_cast<const void*>(b);
        if (pool_direct && src_dt == pool.dtype) {
          if (src != dst) std::memmove(dst, src, static_cast<size_t>(D) * pe);
        } else {
          if (f == nullptr) load_row(reinterpret_cast<const std::byte*>(b), DType::BF16, 1, D, row.data());
          store_row(f ? f : row.data(), D, dst, pool.dtype, pool.stride[2]);
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The default engine's parallel runs on torch's OpenMP team (Engine::Impl::team), for the vLLM
// plugin. Between torch ops torch's OpenMP workers spin-wait on the other cores; the engine's own
// pool then shares those cores with them, and on 2 cores a 16-request decode step of la_slots took
// 2x its time right after a torch matmul (1261 against 641 us, 2-core Xeon under KVM). Run on that
// team instead, the parts start at once on threads that are already awake, and nothing competes.
// The runtime is the libgomp (or libiomp5, which exports the same GOMP_ entry points) the process
// has loaded already, found by its path; its team belongs to the thread that calls it, torch's
// own calling thread in vLLM's model runner.

struct OpenMp {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;  // GOMP_parallel
  int (*thread_num)() = nullptr;                                           // omp_get_thread_num
  int (*num_threads)() = nullptr;                                          // omp_get_num_threads
} openmp;

struct TeamCall {
  int n;
  void (*body)(int, void*);
  void* ctx;
};

void openmp_team(int n, void (*body)(int, void*), void* ctx) {
  TeamCall call{n, body, ctx};
  openmp.parallel(
      [](void* p) {
        const TeamCall& c = *static_cast<const TeamCall*>(p);
        // A smaller team than asked for (a nested region gets one thread) takes the parts in turn.
        const int nt = openmp.num_threads();
        for (int t = openmp.thread_num(); t < c.n; t += nt) c.body(t, c.ctx);
      },
      &call, static_cast<unsigned>(n), 0);
}

// Loaded OpenMP runtime at `path` -> the engine's team (None: back to the engine's pool).
bool use_openmp_team(std::optional<std::string> path) {
  Engine::Impl& impl = Engine::default_engine().impl();
  if (!path) {
    impl.team.store(nullptr, std::memory_order_release);
    return false;
  }
#if defined(__linux__)
  // RTLD_NOLOAD: only a runtime the process has loaded already (torch's), never a second copy.
  void* lib = dlopen(path->c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) throw nb::value_error(("use_openmp_team: \"" + *path + "\" is not loaded in this process").c_str());
  OpenMp found;
  found.parallel = reinterpret_cast<decltype(found.parallel)>(dlsym(lib, "GOMP_parallel"));
  found.thread_num = reinterpret_cast<decltype(found.thread_num)>(dlsym(lib, "omp_get_thread_num"));
  found.num_threads = reinterpret_cast<decltype(found.num_threads)>(dlsym(lib, "omp_get_num_threads"));
  if (!found.parallel || !found.thread_num || !found.num_threads)
    throw nb::value_error(("use_openmp_team: \"" + *path + "\" has no GOMP_parallel / omp_get_thread_num").c_str());
  nb::gil_scoped_release no_gil;
  std::lock_guard<std::mutex> lock(engine_mutex);  // no run is using the previous runtime
  openmp = found;
  impl.team.store(&openmp_team, std::memory_order_release);
  return true;
#else
  throw nb::value_error("use_openmp_team: Linux only");
#endif
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

// HANPU_ISA as applied (hanpu/isa.hpp); a bad value raises ValueError naming it.
nb::dict isa_info() {
  const IsaSelection& s = isa_selection();
  nb::dict d;
  d["requested"] = s.requested;
  d["target"] = s.target;
  d["native"] = s.native;
  nb::list choices;
  for (const std::string& c : isa_choices()) choices.append(c);
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
  m.def("la_slots", &slots_call, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("state_pool"), nb::arg("slots"), nb::arg("has_initial_state").none(),
        nb::arg("cu_seqlens").none(), nb::arg("A_log").none(), nb::arg("dt_bias").none(), nb::arg("o"),
        nb::arg("scale").none(), nb::arg("qk_l2norm"), nb::arg("gate_in_kernel"), nb::arg("beta_sigmoid"),
        nb::arg("allow_neg_eigval"), nb::arg("path"), nb::arg("threads"), nb::arg("lower_bound").none() = nb::none(),
        nb::arg("amx") = "off",
        "Runs GDN/KDA on states kept in a slot pool [S,HV,K,V], read and updated in place (state_pool[slots[n]] "
        "for sequence n; negative slots skip the sequence); o is written; nothing is allocated (GIL released). "
        "amx: the chunked runs' GEMMs on AMX (\"off\", \"round\", \"split\": ExecOptions::amx, docs/ACCURACY.md; "
        "bf16 q and k on a CPU with usable AMX, else the f32 engine). Returns what ran the chunked runs' GEMMs "
        "(\"f32\", \"amx-split\", \"amx-round\", or \"f32 (amx: why not)\"), None when every sequence ran token by "
        "token.");
  m.def("causal_conv_slots", &conv_slots_call, nb::arg("x"), nb::arg("conv_pool"), nb::arg("slots"),
        nb::arg("has_initial_state").none(), nb::arg("cu_seqlens"), nb::arg("taps"), nb::arg("out"),
        nb::arg("threads"),
        "vLLM's causal convolution with SiLU (no bias) on its conv-state pool [S,W-1,D], read and updated in place "
        "(conv_pool[slots[n]] for sequence n, from zeros where has_initial_state[n] is false; negative slots skip "
        "the sequence); out [T,D] (fp32 or bf16) is written, on `threads` of the engine's pool (GIL released).");
  m.def("la_reference", &reference, nb::arg("variant"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("scale").none(), nb::arg("qk_l2norm"), nb::arg("gate_in_kernel"),
        nb::arg("beta_sigmoid"), nb::arg("allow_neg_eigval"), nb::arg("lower_bound").none() = nb::none(),
        "The fp64 token-by-token reference: returns (o, final_state) as float64 numpy arrays.");
  m.def("use_openmp_team", &use_openmp_team, nb::arg("path").none(),
        "Runs the default engine's parallel work (la_slots, causal_conv_slots, la_prefill) on the OpenMP "
        "runtime loaded from `path` (torch's libgomp), the calling thread's team, instead of the engine's "
        "own pool; None: back to the pool. Returns whether a team is in use.");
  m.def("la_amx_usable", &cpu::la_amx_usable,
        "Whether the engine's GEMMs can run on AMX here (AMX-BF16 in CPUID, the OS tile permission, HANPU_ISA "
        "native): la_slots' amx setting takes effect only then.");
  m.def("isa", &isa_info, "The SIMD target the kernels dispatch to, after HANPU_ISA (requested, target, native, choices).");
  m.def("hardware_threads", &hardware_threads, "Hardware threads this process may run on (its CPU affinity).");
}

}  // namespace hanpu::python
