// F16Linear and F32Linear (include/hanpu/linear.hpp): float weights kept in their own format. Shape
// checks, load-time conversion and the work split over threads, as Bf16Linear's portable path
// (decode: chunks of columns taken from a shared counter; prefill: column ranges in multiples of 4
// per thread); the kernels are linear_portable.cpp's float forms.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/linear_call.hpp"
#include "cpu/linear_kernels.hpp"
#include "hanpu/linear.hpp"

namespace hanpu {

namespace {

void check_float_weight(const TensorView& w, const std::string& name, DType want) {
  if (w.dtype != want || w.rank != 2 || !w.is_contiguous())
    throw Error(name + ": expected a contiguous 2-D " + dtype_name(want) + " weight [out_features, in_features], got " +
                std::string(dtype_name(w.dtype)) + " " + w.shape_str());
  if (w.data == nullptr && w.numel() > 0) throw Error(name + ": weight view has no data");
}

// An f16 weight with an infinite or NaN element (exponent bits all ones) is refused: the vector
// conversion of targets without F16C (Highway's emulation) would turn it into a finite number.
void check_f16_finite(const uint16_t* w, int64_t N, int64_t K, const std::string& name) {
  for (int64_t i = 0; i < N * K; ++i)
    if ((w[i] & 0x7c00u) == 0x7c00u)
      throw Error(name + ": weight [" + std::to_string(i / K) + ", " + std::to_string(i % K) + "] is " +
                  ((w[i] & 0x3ffu) ? "NaN" : "infinite") + " (f16 bits 0x" +
                  [&] {
                    char b[8];
                    std::snprintf(b, sizeof b, "%04x", w[i]);
                    return std::string(b);
                  }() +
                  "), expected finite weights");
}

// Runs a float kernel over all rows: decode in column chunks, prefill in column ranges of 4.
template <class Kernel>
void forward_float(Engine& engine, const std::string& name, int64_t N, int64_t K, const float* x, int64_t ldx,
                   float* y, int64_t ldy, int64_t M, int threads, bool accumulate, const Kernel& kernel) {
  TensorView xv = TensorView::contiguous(const_cast<float*>(x), DType::F32, {M, K});
  xv.stride[0] = ldx;
  TensorView yv = TensorView::contiguous(y, DType::F32, {M, N});
  yv.stride[0] = ldy;
  const auto call = cpu::begin_linear_call(name, K, N, xv, yv, accumulate);
  if (!call) return;
  threads = std::max(1, threads);
  if (M < cpu::kPortableGemmMinRows) {
    cpu::run_in_column_chunks(engine, threads, N, cpu::kDecodeChunkColumns,
                              [&](int64_t n0, int64_t n1) { kernel(n0, n1, nullptr); });
    return;
  }
  const int nt = static_cast<int>(std::min<int64_t>(threads, (N + 3) / 4));
  cpu::run_on_pool(engine, nt, [&](int t, cpu::Workspace& ws) {
    const int64_t units = (N + 3) / 4;
    const int64_t n0 = std::min(N, units * t / nt * 4), n1 = std::min(N, units * (t + 1) / nt * 4);
    if (n0 < n1) kernel(n0, n1, &ws);
  });
}

}  // namespace

// ---- F16Linear ------------------------------------------------------------------------------

F16Linear::F16Linear(TensorView weight, std::string name) : name_(std::move(name)) {
  check_float_weight(weight, name_, DType::F16);
  w_ = static_cast<const uint16_t*>(weight.data);
  N_ = weight.shape[0];
  K_ = weight.shape[1];
  check_f16_finite(w_, N_, K_, name_);
}

F16Linear F16Linear::converted(const TensorView& weight, std::string name) {
  if (!is_float(weight.dtype) || weight.rank != 2 || !weight.is_contiguous())
    throw Error(name + ": expected a contiguous 2-D float weight [out_features, in_features] to convert to f16, got " +
                std::string(dtype_name(weight.dtype)) + " " + weight.shape_str());
  if (weight.dtype == DType::F16)  // already f16: a copy, so the result never refers to the view
    return F16Linear(std::vector<TensorView>{weight}, std::move(name));
  F16Linear out;
  out.name_ = std::move(name);
  out.N_ = weight.shape[0];
  out.K_ = weight.shape[1];
  out.owned_ = ByteBuffer(static_cast<size_t>(out.N_ * out.K_) * sizeof(uint16_t));
  auto* dst = reinterpret_cast<uint16_t*>(out.owned_.data());
  for (int64_t i = 0; i < out.N_ * out.K_; ++i) {
    const double v = load_as_double(weight.data, weight.dtype, i);
    dst[i] = f32_to_f16(static_cast<float>(v));
    if (std::isfinite(v) && (dst[i] & 0x7c00u) == 0x7c00u)
      throw Error(out.name_ + ": weight [" + std::to_string(i / out.K_) + ", " + std::to_string(i % out.K_) + "] = " +
                  std::to_string(v) + " is beyond f16's range (65504); keep this checkpoint in bf16 or f32");
  }
  out.w_ = dst;
  check_f16_finite(out.w_, out.N_, out.K_, out.name_);
  return out;
}

F16Linear::F16Linear(const std::vector<TensorView>& weights, std::string name) : name_(std::move(name)) {
  if (weights.empty()) throw Error(name_ + ": no weights to stack");
  int64_t rows = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    check_float_weight(weights[i], name_ + " (stacked weight " + std::to_string(i) + ")", DType::F16);
    if (weights[i].shape[1] != weights[0].shape[1])
      throw Error(name_ + " (stacked weight " + std::to_string(i) + "): in_features " +
                  std::to_string(weights[i].shape[1]) + " differs from the first weight's " +
                  std::to_string(weights[0].shape[1]));
    rows += weights[i].shape[0];
  }
  N_ = rows;
  K_ = weights[0].shape[1];
  owned_ = ByteBuffer(static_cast<size_t>(N_ * K_) * sizeof(uint16_t));
  auto* dst = reinterpret_cast<uint16_t*>(owned_.data());
  for (const TensorView& w : weights) {
    if (w.numel() > 0) std::memcpy(dst, w.data, static_cast<size_t>(w.numel()) * sizeof(uint16_t));
    dst += w.numel();
  }
  w_ = reinterpret_cast<const uint16_t*>(owned_.data());
  check_f16_finite(w_, N_, K_, name_);
}

void F16Linear::forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                        bool accumulate, LinearPrecision) const {
  forward_float(engine, name_, N_, K_, x, ldx, y, ldy, M, threads, accumulate,
                [&](int64_t n0, int64_t n1, cpu::Workspace* ws) {
                  cpu::linear_portable_f16(w_, K_, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
                });
}

// ---- F32Linear ------------------------------------------------------------------------------

F32Linear::F32Linear(TensorView weight, std::string name) : name_(std::move(name)) {
  check_float_weight(weight, name_, DType::F32);
  w_ = static_cast<const float*>(weight.data);
  N_ = weight.shape[0];
  K_ = weight.shape[1];
}

F32Linear F32Linear::converted(const TensorView& weight, std::string name) {
  if (!is_float(weight.dtype) || weight.rank != 2 || !weight.is_contiguous())
    throw Error(name + ": expected a contiguous 2-D float weight [out_features, in_features], got " +
                std::string(dtype_name(weight.dtype)) + " " + weight.shape_str());
  F32Linear out;
  out.name_ = std::move(name);
  out.N_ = weight.shape[0];
  out.K_ = weight.shape[1];
  out.owned_ = ByteBuffer(static_cast<size_t>(out.N_ * out.K_) * sizeof(float));
  auto* dst = reinterpret_cast<float*>(out.owned_.data());
  for (int64_t i = 0; i < out.N_ * out.K_; ++i) dst[i] = static_cast<float>(load_as_double(weight.data, weight.dtype, i));
  out.w_ = dst;
  return out;
}

void F32Linear::forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                        bool accumulate, LinearPrecision) const {
  forward_float(engine, name_, N_, K_, x, ldx, y, ldy, M, threads, accumulate,
                [&](int64_t n0, int64_t n1, cpu::Workspace* ws) {
                  cpu::linear_portable_f32(w_, K_, x, ldx, y, ldy, M, n0, n1, accumulate, ws);
                });
}

}  // namespace hanpu
