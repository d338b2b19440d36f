// Bf16Linear: shape checks, backend choice, work split over threads. The kernels live in
// linear_amx.cpp (AMX tiles for GEMMs, AVX512-BF16 for GEMVs, on a weight repacked here once) and
// linear_portable.cpp (Highway, any CPU, checkpoint layout). docs/LINEAR.md has the method and
// the measured speeds and errors.
#include <algorithm>
#include <cstring>
#include <string>

#include "cpu/linear_call.hpp"
#include "cpu/linear_kernels.hpp"
#include "hanpu/linear.hpp"

namespace hanpu {

namespace {

// Up to this many rows the AMX backend uses the GEMV kernel: a TDPBF16PS costs the same for 1 or
// 16 rows, so below ~3 rows VDPBF16PS (32 products per instruction; one per cycle measured on this
// Sapphire Rapids VM, src/cpu/gram_bf16.cpp) does as much
// per weight byte, and decode (1 row) is bound by reading the weight anyway.
constexpr int64_t kGemvMaxRows = 2;
// Activation rows converted and multiplied per pass. With 64 rows the pass's packed rows (64 x K
// x 2 bytes per term: 384 KiB at K = 1024 and 3 terms), its C block (64 x 512 f32 = 128 KiB) and
// the weight block (128 KiB) all stay in L2; the weight is read once per pass (from L3 after the
// first). Measured (M=512, K=1024, N=8192, exact, loaded machine, GFLOP per CPU-second, 4 rounds
// interleaved): 64 rows 416-473, 128 rows 308-319, 256 rows 330-348; 32 rows within noise of 64.
constexpr int64_t kRowsPerPass = 64;

int precision_terms(LinearPrecision p) {
  switch (p) {
    case LinearPrecision::kBf16: return 1;
    case LinearPrecision::kBf16x2: return 2;
    case LinearPrecision::kExact:
    case LinearPrecision::kInt8: break;  // int8 activations are Int8Linear's; bf16 weights stay exact
  }
  return 3;
}

// [begin, end) of part t of n equal parts of `total` units.
inline int64_t part(int64_t total, int t, int n) { return total * t / n; }

// Rows per pass of the avx512bf16 GEMM form: every 48-column panel is transposed once per pass, so
// passes are as long as the rounded activations (rows x K x 2 bytes per thread) stay within
// kBf16DotPassBytes. The activations need not stay in L2: a tile reads its 8 rows (16 KiB at
// K = 1024) from L1 for all of its k pairs, ~1.3 bytes per cycle even from L3; the panel
// (K x 96 bytes) is what L2 holds. Measured with perf on Zen 4, one thread, M = 2048, K = 1024,
// N = 7168: with 256-row passes the scalar panel transpose took 18% of the GEMM, with one pass 3%.
constexpr int64_t kBf16DotPassBytes = int64_t{8} << 20;
int64_t bf16dot_rows_per_pass(int64_t Kp) { return std::max<int64_t>(256, kBf16DotPassBytes / (2 * Kp)); }

void forward_avx512bf16(Engine& engine, const uint16_t* w, int64_t K, int64_t N, const float* xd, int64_t ldx,
                        float* yd, int64_t ldy, int64_t M, int threads, bool accumulate) {
  const int64_t Kp = cpu::amx_k_steps(K) * cpu::kAmxK;
  if (M < cpu::kBf16DotGemmMinRows) {
    // Decode: the rows are rounded once (into the calling part's workspace, held for the call),
    // the threads stream chunks of weight rows.
    Engine::Impl::Lease caller(engine.impl(), 1);
    uint16_t* xs = caller[0].get<uint16_t>(cpu::kLinearRows, static_cast<size_t>(M * Kp));
    cpu::amx_pack_gemv_rows(xd, ldx, M, K, /*terms=*/1, xs);
    cpu::run_in_column_chunks(engine, threads, N, cpu::kDecodeChunkColumns, [&](int64_t n0, int64_t n1) {
      cpu::bf16dot_linear(w, K, xs, M, yd, ldy, n0, n1, accumulate, nullptr);
    });
    return;
  }
  // Threads split the columns when every thread gets a few 48-column panels (each reads only its
  // part of the weight), otherwise the rows (small N: in_proj_b/a).
  constexpr int64_t kPanel = 48;
  const int64_t col_groups = (N + 15) / 16;  // 16 columns: one output vector
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t row_blocks = (M + 7) / 8;  // the GEMM's 8-row register tile
  const bool split_columns = panels >= 2 * threads || row_blocks < threads;
  const int nt = static_cast<int>(std::min<int64_t>(threads, split_columns ? col_groups : row_blocks));
  cpu::run_on_pool(engine, nt, [&](int t, cpu::Workspace& ws) {
    int64_t r0 = 0, r1 = M, n0 = 0, n1 = N;
    if (split_columns) {
      n0 = std::min(N, part(col_groups, t, nt) * 16);
      n1 = std::min(N, part(col_groups, t + 1, nt) * 16);
    } else {
      r0 = std::min(M, part(row_blocks, t, nt) * 8);
      r1 = std::min(M, part(row_blocks, t + 1, nt) * 8);
    }
    if (n0 >= n1 || r0 >= r1) return;
    const int64_t pass_rows = bf16dot_rows_per_pass(Kp);
    uint16_t* xs = ws.get<uint16_t>(cpu::kLinearRows, static_cast<size_t>(std::min(pass_rows, r1 - r0) * Kp));
    uint32_t* panel = ws.get<uint32_t>(cpu::kLinearPanel, static_cast<size_t>(cpu::bf16dot_panel_words(K)));
    for (int64_t m0 = r0; m0 < r1; m0 += pass_rows) {
      const int64_t rows = std::min(pass_rows, r1 - m0);
      cpu::amx_pack_gemv_rows(xd + m0 * ldx, ldx, rows, K, /*terms=*/1, xs);
      cpu::bf16dot_linear(w, K, xs, rows, yd + m0 * ldy, ldy, n0, n1, accumulate, panel);
    }
  });
}

}  // namespace

const char* linear_precision_name(LinearPrecision p) {
  switch (p) {
    case LinearPrecision::kExact: return "exact";
    case LinearPrecision::kBf16x2: return "bf16x2";
    case LinearPrecision::kBf16: return "bf16";
    case LinearPrecision::kInt8: return "int8";
  }
  return "?";
}

LinearPrecision linear_precision_from_name(const std::string& name) {
  for (LinearPrecision p :
       {LinearPrecision::kExact, LinearPrecision::kBf16x2, LinearPrecision::kBf16, LinearPrecision::kInt8})
    if (name == linear_precision_name(p)) return p;
  throw Error("linear precision: got '" + name + "', expected exact, bf16x2, bf16 or int8");
}

const char* linear_backend_name(LinearBackend b) {
  switch (b) {
    case LinearBackend::kAuto: return "auto";
    case LinearBackend::kPortable: return "portable";
    case LinearBackend::kAmx: return "amx";
    case LinearBackend::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

LinearBackend linear_backend_from_name(const std::string& name) {
  for (LinearBackend b :
       {LinearBackend::kAuto, LinearBackend::kPortable, LinearBackend::kAmx, LinearBackend::kAvx512Bf16})
    if (name == linear_backend_name(b)) return b;
  throw Error("linear backend: got '" + name + "', expected auto, portable, amx or avx512bf16");
}

bool linear_amx_available() { return cpu::amx_usable(); }
bool linear_avx512bf16_available() { return cpu::avx512bf16_usable(); }
double linear_bf16dot_mac_ratio() { return cpu::bf16dot_mac_ratio(); }
LinearBackend linear_auto_backend() {
  return cpu::amx_usable()     ? LinearBackend::kAmx
         : cpu::bf16dot_pays() ? LinearBackend::kAvx512Bf16  // only where it is faster (kBf16DotMinMacRatio)
                               : LinearBackend::kPortable;
}

struct Bf16Linear::Impl {
  TensorView weight;
  std::string name;
  LinearBackend backend = LinearBackend::kPortable;
  ByteBuffer packed;  // AMX: the repacked weight (cpu::amx_pack_weight)
  ByteBuffer owned;   // stacked weights: the concatenated rows `weight` points to
};

Bf16Linear::Bf16Linear() = default;
Bf16Linear::~Bf16Linear() = default;
Bf16Linear::Bf16Linear(Bf16Linear&&) noexcept = default;
Bf16Linear& Bf16Linear::operator=(Bf16Linear&&) noexcept = default;

Bf16Linear::Bf16Linear(TensorView weight, std::string name) : Bf16Linear(weight, std::move(name), LinearBackend::kAuto) {}

Bf16Linear::Bf16Linear(TensorView weight, std::string name, LinearBackend backend) : impl_(std::make_unique<Impl>()) {
  if (weight.dtype != DType::BF16 || weight.rank != 2 || !weight.is_contiguous())
    throw Error(name + ": expected a contiguous 2-D BF16 weight [out_features, in_features], got " +
                std::string(dtype_name(weight.dtype)) + " " + weight.shape_str());
  if (weight.data == nullptr && weight.numel() > 0) throw Error(name + ": weight view has no data");
  if (backend == LinearBackend::kAmx && !cpu::amx_usable())
    throw Error(name + ": the AMX linear backend was requested but this CPU/OS cannot run it (needs AMX-BF16, "
                "AVX512-BF16 and the tile-data permission)");
  if (backend == LinearBackend::kAvx512Bf16 && !cpu::avx512bf16_usable())
    throw Error(name + ": the avx512bf16 linear backend was requested but this CPU/OS cannot run it (needs "
                "AVX512F/BW/VL and AVX512-BF16, and HANPU_ISA native)");
  if (backend == LinearBackend::kAuto) backend = linear_auto_backend();
  impl_->weight = weight;
  impl_->name = std::move(name);
  impl_->backend = backend;
  if (backend == LinearBackend::kAmx) {
    const int64_t N = weight.shape[0], K = weight.shape[1];
    impl_->packed = ByteBuffer(static_cast<size_t>(cpu::amx_packed_weight_elems(N, K)) * sizeof(uint16_t));
    cpu::amx_pack_weight(static_cast<const uint16_t*>(weight.data), N, K,
                         reinterpret_cast<uint16_t*>(impl_->packed.data()));
  }
}

Bf16Linear::Bf16Linear(const std::vector<TensorView>& weights, std::string name, LinearBackend backend) {
  if (weights.empty()) throw Error(name + ": no weights to stack");
  int64_t rows = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const TensorView& w = weights[i];
    const std::string which = name + " (stacked weight " + std::to_string(i) + ")";
    if (w.dtype != DType::BF16 || w.rank != 2 || !w.is_contiguous())
      throw Error(which + ": expected a contiguous 2-D BF16 weight [out_features, in_features], got " +
                  std::string(dtype_name(w.dtype)) + " " + w.shape_str());
    if (w.shape[1] != weights[0].shape[1])
      throw Error(which + ": in_features " + std::to_string(w.shape[1]) + " differs from the first weight's " +
                  std::to_string(weights[0].shape[1]));
    if (w.data == nullptr && w.numel() > 0) throw Error(which + ": weight view has no data");
    rows += w.shape[0];
  }
  const int64_t K = weights[0].shape[1];
  ByteBuffer owned(static_cast<size_t>(rows * K) * sizeof(uint16_t));
  auto* dst = reinterpret_cast<uint16_t*>(owned.data());
  for (const TensorView& w : weights) {
    if (w.numel() > 0) std::memcpy(dst, w.data, static_cast<size_t>(w.numel()) * sizeof(uint16_t));
    dst += w.numel();
  }
  *this = Bf16Linear(TensorView::contiguous(owned.data(), DType::BF16, {rows, K}), std::move(name), backend);
  if (impl_->backend == LinearBackend::kAmx) impl_->weight.data = nullptr;  // packed: the rows are not read again
  else impl_->owned = std::move(owned);  // ByteBuffer moves keep the data pointer: the view stays valid
}

int64_t Bf16Linear::in_features() const { return impl_->weight.shape[1]; }
int64_t Bf16Linear::out_features() const { return impl_->weight.shape[0]; }
const std::string& Bf16Linear::name() const { return impl_->name; }
LinearBackend Bf16Linear::backend() const { return impl_->backend; }
size_t Bf16Linear::bytes() const {
  // AMX holds the repacked copy only (a stacked weight's rows are dropped, a mapped one is not read).
  if (impl_->backend == LinearBackend::kAmx) return impl_->packed.size();
  return static_cast<size_t>(impl_->weight.numel()) * sizeof(uint16_t);
}

void Bf16Linear::forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                         bool accumulate, LinearPrecision precision) const {
  TensorView xv = TensorView::contiguous(const_cast<float*>(x), DType::F32, {M, in_features()});
  xv.stride[0] = ldx;
  TensorView yv = TensorView::contiguous(y, DType::F32, {M, out_features()});
  yv.stride[0] = ldy;
  forward(engine, xv, yv, threads, accumulate, precision);
}

void Bf16Linear::forward(TensorView x, TensorView y, int threads, bool accumulate, LinearPrecision precision) const {
  forward(Engine::default_engine(), x, y, threads, accumulate, precision);
}

void Bf16Linear::forward(Engine& engine, TensorView x, TensorView y, int threads, bool accumulate,
                         LinearPrecision precision) const {
  if (!impl_) throw Error("Bf16Linear: forward on an empty (default-constructed) linear layer");
  const int64_t K = in_features(), N = out_features();
  const auto call = cpu::begin_linear_call(impl_->name, K, N, x, y, accumulate);
  if (!call) return;
  const float* xd = call->x;
  float* yd = call->y;
  const int64_t M = call->M, ldx = call->ldx, ldy = call->ldy;
  threads = std::max(1, threads);

  // The avx512bf16 backend runs only the bf16 mode on VDPBF16PS (linear_bf16dot.cpp says why);
  // exact and bf16x2 take the f32 kernel, which is exact.
  const bool f32_kernel = impl_->backend == LinearBackend::kPortable ||
                          (impl_->backend == LinearBackend::kAvx512Bf16 && precision != LinearPrecision::kBf16);
  if (f32_kernel) {
    const auto* w = static_cast<const uint16_t*>(impl_->weight.data);
    if (M < cpu::kPortableGemmMinRows) {
      // Decode: the rows are split into even/odd halves once (into the calling part's workspace,
      // held for the call), the threads stream chunks of weight rows.
      Engine::Impl::Lease caller(engine.impl(), 1);
      float* xs = caller[0].get<float>(cpu::kLinearRows, static_cast<size_t>(std::max<int64_t>(1, M * cpu::split_pairs_stride(K))));
      cpu::split_pairs_rows(xd, ldx, M, K, xs);
      cpu::run_in_column_chunks(engine, threads, N, cpu::kDecodeChunkColumns, [&](int64_t n0, int64_t n1) {
        cpu::linear_portable_rows(w, K, xs, xd, ldx, yd, ldy, M, n0, n1, accumulate);
      });
      return;
    }
    const int nt = static_cast<int>(std::min<int64_t>(threads, (N + 3) / 4));
    cpu::run_on_pool(engine, nt, [&](int t, cpu::Workspace& ws) {
      // Column ranges in multiples of 4 (the kernel's register block).
      const int64_t n0 = std::min(N, part((N + 3) / 4, t, nt) * 4), n1 = std::min(N, part((N + 3) / 4, t + 1, nt) * 4);
      cpu::linear_portable(w, K, xd, ldx, yd, ldy, M, n0, n1, accumulate, &ws);
    });
    return;
  }

  const int terms = precision_terms(precision);
  if (impl_->backend == LinearBackend::kAvx512Bf16) {
    forward_avx512bf16(engine, static_cast<const uint16_t*>(impl_->weight.data), K, N, xd, ldx, yd, ldy, M, threads,
                       accumulate);
    return;
  }

  const auto* wp = reinterpret_cast<const uint16_t*>(impl_->packed.data());
  if (M <= kGemvMaxRows) {
    Engine::Impl::Lease caller(engine.impl(), 1);  // the packed rows, held for the call
    uint16_t* xs = caller[0].get<uint16_t>(cpu::kLinearRows, static_cast<size_t>(M * terms * cpu::amx_k_steps(K) * cpu::kAmxK));
    cpu::amx_pack_gemv_rows(xd, ldx, M, K, terms, xs);
    const int64_t quads = (N + 63) / 64;  // units of 64 columns: the GEMV's 4 x 16-column block
    const int nt = static_cast<int>(std::min<int64_t>(threads, quads));
    cpu::run_on_pool(engine, nt, [&](int t, cpu::Workspace&) {
      const int64_t n0 = std::min(N, part(quads, t, nt) * 64), n1 = std::min(N, part(quads, t + 1, nt) * 64);
      if (n0 < n1) cpu::amx_gemv(xs, M, terms, wp, K, N, n0, n1, yd, ldy, accumulate);
    });
    return;
  }

  // One pool dispatch per forward: each thread packs the rows it needs itself (all rows of a pass
  // when the threads split the columns; packing is ~2% of the GEMM, so doing it twice is cheaper
  // than a barrier per pass, which also stalls the other thread whenever one is descheduled).
  // Columns are split when there are enough 32-column panels for every thread (each thread then
  // reads only its part of the weight), otherwise the 32-row strips (small N: in_proj_b/a).
  const int64_t panels = (N + cpu::kAmxN - 1) / cpu::kAmxN;
  const int64_t all_strips = (M + cpu::kAmxRows - 1) / cpu::kAmxRows;
  const bool split_columns = panels >= 2 * threads || all_strips < threads;
  const int nt = static_cast<int>(std::min<int64_t>(threads, split_columns ? panels : all_strips));
  cpu::run_on_pool(engine, nt, [&](int t, cpu::Workspace& ws) {
    int64_t r0 = 0, r1 = M, n0 = 0, n1 = N;
    if (split_columns) {
      n0 = std::min(N, part(panels, t, nt) * cpu::kAmxN);
      n1 = std::min(N, part(panels, t + 1, nt) * cpu::kAmxN);
    } else {
      r0 = part(all_strips, t, nt) * cpu::kAmxRows;
      r1 = std::min(M, part(all_strips, t + 1, nt) * cpu::kAmxRows);
    }
    if (n0 >= n1 || r0 >= r1) return;
    const int64_t pass_strips = kRowsPerPass / cpu::kAmxRows;
    uint16_t* ap = ws.get<uint16_t>(cpu::kLinearRows, static_cast<size_t>(cpu::amx_packed_rows_elems(kRowsPerPass, K, terms)));
    float* cbuf = ws.get<float>(cpu::kLinearC, static_cast<size_t>(cpu::amx_cbuf_floats(pass_strips)));
    for (int64_t m0 = r0; m0 < r1; m0 += kRowsPerPass) {
      const int64_t rows = std::min(kRowsPerPass, r1 - m0);
      const int64_t strips = (rows + cpu::kAmxRows - 1) / cpu::kAmxRows;
      cpu::amx_pack_rows(xd + m0 * ldx, ldx, rows, strips * cpu::kAmxRows, K, terms, ap);
      cpu::amx_gemm(ap, 0, strips, rows, terms, wp, K, N, n0, n1, yd + m0 * ldy, ldy, accumulate, cbuf);
    }
  });
}

}  // namespace hanpu
