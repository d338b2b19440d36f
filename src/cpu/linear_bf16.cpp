// Bf16Linear: first, plain implementation (row-by-row dot products in f32, threads split the output
// features). Correct for every shape; the fast kernel replaces its body.
#include <algorithm>
#include <string>

#include "cpu/thread_pool.hpp"
#include "hanpu/linear.hpp"

namespace hanpu {

struct Bf16Linear::Impl {
  TensorView weight;
  std::string name;
};

Bf16Linear::Bf16Linear() = default;
Bf16Linear::~Bf16Linear() = default;
Bf16Linear::Bf16Linear(Bf16Linear&&) noexcept = default;
Bf16Linear& Bf16Linear::operator=(Bf16Linear&&) noexcept = default;

Bf16Linear::Bf16Linear(TensorView weight, std::string name) : impl_(std::make_unique<Impl>()) {
  if (weight.dtype != DType::BF16 || weight.rank != 2 || !weight.is_contiguous())
    throw Error(name + ": expected a contiguous 2-D BF16 weight [out_features, in_features], got " +
                std::string(dtype_name(weight.dtype)) + " " + weight.shape_str());
  impl_->weight = weight;
  impl_->name = std::move(name);
}

int64_t Bf16Linear::in_features() const { return impl_->weight.shape[1]; }
int64_t Bf16Linear::out_features() const { return impl_->weight.shape[0]; }
const std::string& Bf16Linear::name() const { return impl_->name; }

void Bf16Linear::forward(TensorView x, TensorView y, int threads, bool accumulate) const {
  if (!impl_) throw Error("Bf16Linear: forward on an empty (default-constructed) linear layer");
  const int64_t K = in_features(), N = out_features();
  if (x.dtype != DType::F32 || x.rank != 2 || x.shape[1] != K || x.stride[1] != 1)
    throw Error(impl_->name + ": input must be F32 [M, " + std::to_string(K) + "] with unit column stride, got " +
                std::string(dtype_name(x.dtype)) + " " + x.shape_str());
  if (y.dtype != DType::F32 || y.rank != 2 || y.shape[0] != x.shape[0] || y.shape[1] != N || y.stride[1] != 1)
    throw Error(impl_->name + ": output must be F32 [" + std::to_string(x.shape[0]) + ", " + std::to_string(N) +
                "] with unit column stride, got " + std::string(dtype_name(y.dtype)) + " " + y.shape_str());
  const int64_t M = x.shape[0];
  const auto* w = static_cast<const uint16_t*>(impl_->weight.data);
  const auto* xd = static_cast<const float*>(x.data);
  auto* yd = static_cast<float*>(y.data);
  const int nt = std::max(1, std::min<int>(threads, static_cast<int>(std::max<int64_t>(N, 1))));
  auto work = [&](int t) {
    const int64_t n0 = N * t / nt, n1 = N * (t + 1) / nt;
    for (int64_t n = n0; n < n1; ++n) {
      const uint16_t* wr = w + n * K;
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = xd + m * x.stride[0];
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += xr[k] * bf16_to_f32(wr[k]);
        float& out = yd[m * y.stride[0] + n];
        out = accumulate ? out + acc : acc;
      }
    }
  };
  if (nt == 1) work(0);
  else ThreadPool::shared(nt).run(nt, work);
}

}  // namespace hanpu
