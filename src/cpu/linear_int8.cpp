// Int8Linear (include/hanpu/linear.hpp): quantization at load, shape checks and the work split
// over threads; the kernels are linear_portable.cpp's int8 forms (Highway, every CPU).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/linear_call.hpp"
#include "cpu/linear_kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/linear.hpp"

namespace hanpu {

struct Int8Linear::Impl {
  std::string name;
  int64_t N = 0, K = 0, group = 1, groups = 0;
  ByteBuffer q_owned, scales_owned;  // quantized here: the buffers below point into these
  const int8_t* q = nullptr;         // [N, K]
  const float* scales = nullptr;     // [N, groups]
};

Int8Linear::Int8Linear() = default;
Int8Linear::~Int8Linear() = default;
Int8Linear::Int8Linear(Int8Linear&&) noexcept = default;
Int8Linear& Int8Linear::operator=(Int8Linear&&) noexcept = default;

namespace {

void check_group(const std::string& name, int64_t group) {
  if (group < 1) throw Error(name + ": int8 group size " + std::to_string(group) + ", expected >= 1");
}

}  // namespace

Int8Linear::Int8Linear(TensorView weight, std::string name, int64_t group) : impl_(std::make_unique<Impl>()) {
  check_group(name, group);
  if (!is_float(weight.dtype) || weight.rank != 2 || !weight.is_contiguous())
    throw Error(name + ": expected a contiguous 2-D float weight [out_features, in_features] to quantize, got " +
                std::string(dtype_name(weight.dtype)) + " " + weight.shape_str());
  Impl& m = *impl_;
  m.name = std::move(name);
  m.N = weight.shape[0];
  m.K = weight.shape[1];
  m.group = group;
  m.groups = (m.K + group - 1) / group;
  m.q_owned = ByteBuffer(static_cast<size_t>(m.N * m.K));
  m.scales_owned = ByteBuffer(static_cast<size_t>(m.N * m.groups) * sizeof(float));
  auto* q = reinterpret_cast<int8_t*>(m.q_owned.data());
  auto* sc = reinterpret_cast<float*>(m.scales_owned.data());
  m.q = q;
  m.scales = sc;
  // Rows are independent: quantize them on all threads (a 0.8B model has ~0.5 G weights).
  const int nt = static_cast<int>(std::clamp<int64_t>(m.N / 64, 1, hardware_threads()));
  auto rows = [&](int t) {
    const int64_t n0 = m.N * t / nt, n1 = m.N * (t + 1) / nt;
    std::vector<float> w(static_cast<size_t>(m.K));
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t k = 0; k < m.K; ++k)
        w[static_cast<size_t>(k)] = static_cast<float>(load_as_double(weight.data, weight.dtype, n * m.K + k));
      for (int64_t g = 0; g < m.groups; ++g) {
        const int64_t k0 = g * group, k1 = std::min(m.K, k0 + group);
        for (int64_t k = k0; k < k1; ++k)
          if (!std::isfinite(w[static_cast<size_t>(k)]))
            throw Error(m.name + ": weight [" + std::to_string(n) + ", " + std::to_string(k) + "] is " +
                        std::to_string(w[static_cast<size_t>(k)]) + ", a non-finite value cannot be quantized");
        sc[n * m.groups + g] = cpu::quantize_int8_group(w.data() + k0, k1 - k0, q + n * m.K + k0);
      }
    }
  };
  // Load time, not a forward: the default engine's pool (rethrows a row's error).
  cpu::run_on_pool(Engine::default_engine(), nt, [&](int t, cpu::Workspace&) { rows(t); });
}

Int8Linear::Int8Linear(const int8_t* q, const float* scales, int64_t out_features, int64_t in_features, int64_t group,
                       std::string name)
    : impl_(std::make_unique<Impl>()) {
  check_group(name, group);
  if (out_features < 0 || in_features < 0)
    throw Error(name + ": int8 weight shape [" + std::to_string(out_features) + ", " + std::to_string(in_features) +
                "] is negative");
  Impl& m = *impl_;
  m.name = std::move(name);
  m.N = out_features;
  m.K = in_features;
  m.group = group;
  m.groups = (m.K + group - 1) / group;
  if ((m.N * m.K > 0 && q == nullptr) || (m.N * m.groups > 0 && scales == nullptr))
    throw Error(m.name + ": int8 weight or scales without data");
  m.q = q;
  m.scales = scales;
}

int64_t Int8Linear::in_features() const { return impl_->K; }
int64_t Int8Linear::out_features() const { return impl_->N; }
int64_t Int8Linear::group() const { return impl_->group; }
const std::string& Int8Linear::name() const { return impl_->name; }
size_t Int8Linear::bytes() const {
  return static_cast<size_t>(impl_->N * impl_->K) + static_cast<size_t>(impl_->N * impl_->groups) * sizeof(float);
}
const int8_t* Int8Linear::quantized() const { return impl_->q; }
const float* Int8Linear::scales() const { return impl_->scales; }
float Int8Linear::weight(int64_t n, int64_t k) const {
  return static_cast<float>(quantized()[n * impl_->K + k]) * scales()[n * impl_->groups + k / impl_->group];
}

void Int8Linear::forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                         bool accumulate, LinearPrecision precision) const {
  TensorView xv = TensorView::contiguous(const_cast<float*>(x), DType::F32, {M, in_features()});
  xv.stride[0] = ldx;
  TensorView yv = TensorView::contiguous(y, DType::F32, {M, out_features()});
  yv.stride[0] = ldy;
  forward(engine, xv, yv, threads, accumulate, precision);
}

bool Int8Linear::int8_activations_available(int64_t M) { return M < cpu::kPortableGemmMinRows && cpu::int8_dot_usable(); }

void Int8Linear::forward(TensorView x, TensorView y, int threads, bool accumulate, LinearPrecision precision) const {
  forward(Engine::default_engine(), x, y, threads, accumulate, precision);
}

void Int8Linear::forward(Engine& engine, TensorView x, TensorView y, int threads, bool accumulate,
                         LinearPrecision precision) const {
  if (!impl_) throw Error("Int8Linear: forward on an empty (default-constructed) linear layer");
  const int64_t K = impl_->K, N = impl_->N;
  const auto call = cpu::begin_linear_call(impl_->name, K, N, x, y, accumulate);
  if (!call) return;
  const float* xd = call->x;
  float* yd = call->y;
  const int64_t M = call->M, ldx = call->ldx, ldy = call->ldy;
  threads = std::max(1, threads);
  if (precision == LinearPrecision::kInt8 && int8_activations_available(M)) {
    // Quantized once per call (M x K, a few microseconds) into the calling part's workspace (held
    // for the call: the quantized rows, then their scales), then the threads stream the weight.
    const int64_t G = impl_->group, groups = impl_->groups;
    const size_t row_bytes = static_cast<size_t>(M * cpu::int8_dot_row_stride(K));
    const size_t scale_offset = (row_bytes + 63) / 64 * 64;
    Engine::Impl::Lease caller(engine.impl(), 1);
    uint8_t* scratch = caller[0].get<uint8_t>(cpu::kLinearRows, scale_offset + static_cast<size_t>(M * groups) * sizeof(float));
    int8_t* xq = reinterpret_cast<int8_t*>(scratch);
    float* xs = reinterpret_cast<float*>(scratch + scale_offset);
    cpu::int8_dot_quantize_rows(xd, ldx, M, K, G, xq, xs);
    cpu::run_in_column_chunks(engine, threads, N, cpu::kDecodeChunkColumns, [&](int64_t n0, int64_t n1) {
      cpu::int8_dot_gemv(quantized(), scales(), K, G, xq, xs, M, yd, ldy, n0, n1, accumulate);
    });
    return;
  }
  if (M < cpu::kPortableGemmMinRows) {
    cpu::run_in_column_chunks(engine, threads, N, cpu::kDecodeChunkColumns, [&](int64_t n0, int64_t n1) {
      cpu::linear_portable_int8(quantized(), scales(), K, impl_->group, xd, ldx, yd, ldy, M, n0, n1, accumulate, nullptr);
    });
    return;
  }
  // Column ranges in multiples of 4 (the kernel's register block), one per thread.
  const int nt = static_cast<int>(std::min<int64_t>(threads, (N + 3) / 4));
  auto body = [&](int t, cpu::Workspace& ws) {
    const int64_t units = (N + 3) / 4;
    const int64_t n0 = std::min(N, units * t / nt * 4), n1 = std::min(N, units * (t + 1) / nt * 4);
    if (n0 < n1)
      cpu::linear_portable_int8(quantized(), scales(), K, impl_->group, xd, ldx, yd, ldy, M, n0, n1, accumulate, &ws);
  };
  cpu::run_on_pool(engine, nt, body);
}

}  // namespace hanpu
