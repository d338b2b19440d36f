// Input validation for the LA operators: every error names the tensor, what it got and what it
// expected, so that a user with a wrong file or a wrong call knows what to fix.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "la/job.hpp"

namespace hanpu {

const char* variant_name(Variant v) { return variant_traits(v).name; }

std::string variant_names(const std::string& last_sep, const std::string& sep) {
  std::string out;
  const size_t n = std::size(kVariantTraits);
  for (size_t i = 0; i < n; ++i) out += (i == 0 ? "" : i + 1 == n ? last_sep : sep) + std::string(kVariantTraits[i].name);
  return out;
}

const char* cpu_path_name(CpuPath p) {
  switch (p) {
    case CpuPath::HeadFused: return "hanpu";
    case CpuPath::FlaChunk: return "fla";
    case CpuPath::Recurrent: return "recurrent";
  }
  return "?";
}

std::optional<Variant> variant_from_name(const std::string& name) {
  for (const VariantTraits& t : kVariantTraits)
    if (name == t.name) return t.variant;
  return std::nullopt;
}

std::optional<CpuPath> cpu_path_from_name(const std::string& name) {
  for (CpuPath p : {CpuPath::HeadFused, CpuPath::FlaChunk, CpuPath::Recurrent})
    if (name == cpu_path_name(p)) return p;
  return std::nullopt;
}

const char* la_amx_name(LaAmx a) {
  switch (a) {
    case LaAmx::Off: return "off";
    case LaAmx::Round: return "round";
    case LaAmx::Split: return "split";
  }
  return "?";
}

std::optional<LaAmx> la_amx_from_name(const std::string& name) {
  for (LaAmx a : {LaAmx::Off, LaAmx::Round, LaAmx::Split})
    if (name == la_amx_name(a)) return a;
  return std::nullopt;
}

namespace {

std::string dims(std::initializer_list<int64_t> d) {
  std::ostringstream os;
  os << '[';
  bool first = true;
  for (int64_t x : d) {
    os << (first ? "" : ",") << x;
    first = false;
  }
  os << ']';
  return os.str();
}

[[noreturn]] void fail(const std::string& msg) { throw Error(msg); }

void require_present(const TensorView& t, const char* name) {
  if (t.empty()) fail(std::string("missing tensor '") + name + "'");
}

void require_float(const TensorView& t, const char* name) {
  if (!is_float(t.dtype))
    fail(std::string("tensor '") + name + "' has dtype " + dtype_name(t.dtype) + ", expected F32, F16 or BF16");
}

void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.rank != rank)
    fail(std::string("tensor '") + name + "' has rank " + std::to_string(t.rank) + " (shape " + t.shape_str() +
         "), expected rank " + std::to_string(rank) + " " + layout);
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0 || t.stride[i] < 0)
      fail(std::string("tensor '") + name + "' has a negative dimension or stride (shape " + t.shape_str() + ")");
  }
}

void require_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expect,
                   const std::string& layout) {
  int i = 0;
  bool ok = t.rank == static_cast<int>(expect.size());
  if (ok)
    for (int64_t e : expect) ok = ok && t.shape[i++] == e;
  if (!ok)
    fail(std::string("tensor '") + name + "' has shape " + t.shape_str() + ", expected " + dims(expect) + " " +
         layout);
}

// An IEEE value is Inf or NaN iff its exponent bits are all ones, i.e. iff its bits without the
// sign, read as a signed integer, exceed those of the largest finite value (kExp - 1). Counting
// that compare over a block is branch-free integer code the compiler vectorises (pcmpgt on SSE2),
// so the scan runs at memory speed; the block with a bad value is then searched element by element.
template <typename Bits, Bits kExp>
int64_t first_non_finite_run(const Bits* p, int64_t n, int64_t stride) {
  using Signed = std::make_signed_t<Bits>;
  constexpr Bits kAbs = static_cast<Bits>(~Bits{0} >> 1);
  if (stride == 1) {
    for (int64_t i0 = 0; i0 < n; i0 += 1024) {  // blocks: test a whole block, then locate
      const int64_t e = std::min<int64_t>(n, i0 + 1024);
      Signed bad = 0;
      for (int64_t i = i0; i < e; ++i) bad |= static_cast<Signed>(p[i] & kAbs) > static_cast<Signed>(kExp - 1);
      if (bad)
        for (int64_t i = i0; i < e; ++i)
          if ((p[i] & kExp) == kExp) return i;
    }
    return -1;
  }
  for (int64_t i = 0; i < n; ++i)
    if ((p[i * stride] & kExp) == kExp) return i;
  return -1;
}

int64_t first_non_finite(const void* base, DType dt, int64_t n, int64_t stride) {
  switch (dt) {
    case DType::F32: return first_non_finite_run<uint32_t, 0x7f800000u>(static_cast<const uint32_t*>(base), n, stride);
    case DType::F64:
      return first_non_finite_run<uint64_t, 0x7ff0000000000000ull>(static_cast<const uint64_t*>(base), n, stride);
    case DType::F16: return first_non_finite_run<uint16_t, 0x7c00>(static_cast<const uint16_t*>(base), n, stride);
    case DType::BF16: return first_non_finite_run<uint16_t, 0x7f80>(static_cast<const uint16_t*>(base), n, stride);
    default: return -1;
  }
}

// The NaN/Inf policy (docs/RELIABILITY.md): gates must be finite on every path. The chunked paths
// work on cumulative sums of g, where a NaN or an infinity cannot behave as it does in the
// token-by-token recurrence, so a non-finite gate is an error naming the tensor and the element
// rather than a path-dependent answer.
void require_finite(const TensorView& t, const char* name) {
  if (t.empty() || t.rank == 0 || t.numel() == 0) return;
  const size_t esize = dtype_size(t.dtype);
  if (t.is_contiguous() && first_non_finite(t.data, t.dtype, t.numel(), 1) < 0) return;  // the common case: one pass
  // Strided, or a bad value to locate: walk the rows.
  const int inner = t.rank - 1;
  const int64_t inner_len = t.rank == 0 ? 1 : t.shape[inner], inner_stride = t.rank == 0 ? 1 : t.stride[inner];
  std::array<int64_t, kMaxRank> index{};
  const int64_t n = t.numel();
  for (int64_t done = 0; done < n; done += inner_len) {
    int64_t base = 0;
    for (int d = 0; d < inner; ++d) base += index[d] * t.stride[d];
    const auto* p = static_cast<const std::byte*>(t.data) + base * static_cast<int64_t>(esize);
    const int64_t bad = first_non_finite(p, t.dtype, inner_len, inner_stride);
    if (bad >= 0) {
      index[inner] = bad;
      std::string at = "[";
      for (int d = 0; d < t.rank; ++d) at += (d ? "," : "") + std::to_string(index[d]);
      const double v = load_as_double(p, t.dtype, bad * inner_stride);
      fail(std::string("tensor '") + name + "' has " + (std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf") +
           " at index " + at + "] (shape " + t.shape_str() + "), expected finite values (NaN/Inf policy, docs/RELIABILITY.md)");
    }
    for (int d = inner - 1; d >= 0; --d) {  // odometer over the outer dimensions
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
}

int64_t cu_at(const TensorView& cu, int64_t i) {
  const int64_t off = i * cu.stride[0];
  return cu.dtype == DType::I32 ? static_cast<const int32_t*>(cu.data)[off] : static_cast<const int64_t*>(cu.data)[off];
}

}  // namespace

LaShape validate_la(Variant variant, const LaInputs& in, const LaOptions& opt) {
  const VariantTraits& tr = variant_traits(variant);
  // What the paths implement: gated delta rules with beta (docs/ARCHITECTURE.md, "Adding a
  // delta-rule variant").
  if (tr.gate == GateGranularity::None || !tr.delta_rule || !tr.beta)
    fail(std::string("variant ") + tr.name + ": the reference, graph and kernels implement gated delta rules with beta only");
  LaShape s;
  s.variant = variant;
  require_present(in.q, "q");
  require_present(in.k, "k");
  require_present(in.v, "v");
  require_present(in.g, "g");
  require_present(in.beta, "beta");
  for (auto [t, n] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}, {&in.g, "g"}, {&in.beta, "beta"}})
    require_float(*t, n);
  require_rank(in.q, "q", 4, "[B,T,H,K]");
  s.B = in.q.shape[0];
  s.T = in.q.shape[1];
  s.H = in.q.shape[2];
  s.K = in.q.shape[3];
  require_shape(in.k, "k", {s.B, s.T, s.H, s.K}, "[B,T,H,K] (the shape of q)");
  require_rank(in.v, "v", 4, "[B,T,HV,V]");
  s.HV = in.v.shape[2];
  s.V = in.v.shape[3];
  require_shape(in.v, "v", {s.B, s.T, s.HV, s.V}, "[B,T,HV,V] with B,T of q");
  if (s.H < 1) fail("tensor 'q' has H = 0 heads, expected at least 1");
  if (s.HV < s.H || s.HV % s.H != 0)
    fail("tensor 'v' has HV = " + std::to_string(s.HV) + " value heads, expected a positive multiple of H = " +
         std::to_string(s.H) + " (the head count of q and k)");
  if (s.K < 1 || s.K > 256)
    fail("tensor 'q' has head dim K = " + std::to_string(s.K) + ", expected 1 <= K <= 256");
  if (s.V < 1 || s.V > 256)
    fail("tensor 'v' has head dim V = " + std::to_string(s.V) + ", expected 1 <= V <= 256");
  if (tr.head_gate())
    require_shape(in.g, "g", {s.B, s.T, s.HV}, std::string("[B,T,HV] (") + tr.label + ": one log-decay per token and value head)");
  else
    require_shape(in.g, "g", {s.B, s.T, s.HV, s.K}, std::string("[B,T,HV,K] (") + tr.label + ": one log-decay per key channel)");
  require_shape(in.beta, "beta", {s.B, s.T, s.HV}, "[B,T,HV]");

  if (!in.cu_seqlens.empty()) {
    const TensorView& cu = in.cu_seqlens;
    if (cu.dtype != DType::I32 && cu.dtype != DType::I64)
      fail(std::string("tensor 'cu_seqlens' has dtype ") + dtype_name(cu.dtype) + ", expected I32 or I64");
    if (cu.rank != 1 || cu.shape[0] < 2)
      fail("tensor 'cu_seqlens' has shape " + cu.shape_str() + ", expected [N+1] with N >= 1");
    if (s.B != 1)
      fail("tensor 'q' has batch B = " + std::to_string(s.B) + " but cu_seqlens is given: expected B = 1 (flattened)");
    s.varlen = true;
    s.N = cu.shape[0] - 1;
    if (cu_at(cu, 0) != 0)
      fail("tensor 'cu_seqlens' starts at " + std::to_string(cu_at(cu, 0)) + ", expected 0");
    for (int64_t i = 1; i <= s.N; ++i) {
      if (cu_at(cu, i) < cu_at(cu, i - 1))
        fail("tensor 'cu_seqlens' decreases at index " + std::to_string(i) + " (" + std::to_string(cu_at(cu, i - 1)) +
             " -> " + std::to_string(cu_at(cu, i)) + "), expected non-decreasing offsets");
    }
    if (cu_at(cu, s.N) != s.T)
      fail("tensor 'cu_seqlens' ends at " + std::to_string(cu_at(cu, s.N)) + ", expected T = " + std::to_string(s.T));
  } else {
    s.N = s.B;
  }

  if (!in.initial_state.empty()) {
    require_float(in.initial_state, "initial_state");
    require_shape(in.initial_state, "initial_state", {s.N, s.HV, s.K, s.V}, "[N,HV,K,V]");
  }
  if (opt.lower_bound) {
    // As FLA's fla/ops/kda/gate.py: a bound on KDA's in-kernel gate activation, nothing else.
    if (!tr.lower_bound_gate)
      fail(std::string("lower_bound is KDA's lower-bounded gate; ") + tr.label + " has none (got lower_bound = " +
           std::to_string(*opt.lower_bound) + ")");
    if (!opt.gate_in_kernel)
      fail("lower_bound bounds the gate computed in kernel, so it needs gate_in_kernel (without it g is the "
           "finished log decay and the bound would have no effect)");
    if (!std::isfinite(*opt.lower_bound) || !(*opt.lower_bound < 0.f))
      fail("lower_bound is " + std::to_string(*opt.lower_bound) +
           ", expected a finite negative number (the gate lies in (lower_bound, 0))");
  }
  if (opt.gate_in_kernel) {
    // With a lower bound A_log is optional (rate 1), as in FLA.
    if (in.A_log.empty() && !opt.lower_bound) fail("gate in kernel needs tensor 'A_log' [HV], which is missing");
    if (!in.A_log.empty()) {
      require_float(in.A_log, "A_log");
      require_shape(in.A_log, "A_log", {s.HV}, "[HV]");
    }
    if (!in.dt_bias.empty()) {
      require_float(in.dt_bias, "dt_bias");
      const std::string which = std::string(" (") + tr.label + ")";
      if (tr.head_gate()) {
        require_shape(in.dt_bias, "dt_bias", {s.HV}, "[HV]" + which);
      } else if (in.dt_bias.rank == 2) {
        require_shape(in.dt_bias, "dt_bias", {s.HV, s.K}, "[HV,K]" + which);
      } else {
        require_shape(in.dt_bias, "dt_bias", {s.HV * s.K}, "[HV*K]" + which);
      }
    }
  }
  if (opt.allow_neg_eigval && !opt.beta_sigmoid)
    fail("allow_neg_eigval needs beta_sigmoid (beta = 2 sigmoid(beta) is computed in kernel)");
  if (opt.scale && !std::isfinite(*opt.scale)) fail("scale is not finite");
  return s;
}

void validate_la_outputs(const LaShape& s, const LaOutputs& out) {
  require_present(out.o, "o");
  require_float(out.o, "o");
  require_shape(out.o, "o", {s.B, s.T, s.HV, s.V}, "[B,T,HV,V]");
  if (!out.final_state.empty()) {
    if (out.final_state.dtype != DType::F32)
      fail(std::string("tensor 'final_state' has dtype ") + dtype_name(out.final_state.dtype) + ", expected F32");
    require_shape(out.final_state, "final_state", {s.N, s.HV, s.K, s.V}, "[N,HV,K,V]");
  }
}

LaJob make_la_job(Variant variant, const LaInputs& in, const LaOptions& opt, const LaOutputs& out) {
  LaJob job;
  job.shape = validate_la(variant, in, opt);
  validate_la_outputs(job.shape, out);
  // Values, once per run (every path, the fp64 reference included, builds its job here).
  require_finite(in.g, "g");
  require_finite(in.beta, "beta");
  if (opt.gate_in_kernel) {
    require_finite(in.A_log, "A_log");
    require_finite(in.dt_bias, "dt_bias");
  }
  job.opt = opt;
  job.in = in;
  job.out = out;
  job.scale = opt.scale ? *opt.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(job.shape.K)));
  job.group = job.shape.HV / job.shape.H;
  const LaShape& s = job.shape;
  job.seqs.resize(static_cast<size_t>(s.N));
  for (int64_t n = 0; n < s.N; ++n) {
    if (s.varlen) {
      const int64_t b0 = cu_at(in.cu_seqlens, n), b1 = cu_at(in.cu_seqlens, n + 1);
      job.seqs[n] = {0, b0, b1 - b0};
    } else {
      job.seqs[n] = {n, 0, s.T};
    }
  }
  return job;
}

}  // namespace hanpu
