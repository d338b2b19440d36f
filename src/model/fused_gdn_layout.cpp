// Row permutations from Qwen3-Next's fused, group-interleaved GDN projections to the Qwen3.5 order
// (see fused_gdn_layout.hpp).
#include "model/fused_gdn_layout.hpp"

#include <cstring>

namespace hanpu::model {

std::vector<int64_t> qwen3next_qkvz_source_rows(int64_t nk, int64_t nv, int64_t dk, int64_t dv) {
  const int64_t r = nv / nk, group = 2 * dk + 2 * r * dv;
  const int64_t kd = nk * dk, vd = nv * dv;
  std::vector<int64_t> src(static_cast<size_t>(2 * kd + 2 * vd));
  for (int64_t g = 0; g < nk; ++g) {
    const int64_t base = g * group;
    for (int64_t i = 0; i < dk; ++i) {
      src[static_cast<size_t>(g * dk + i)] = base + i;            // q head g
      src[static_cast<size_t>(kd + g * dk + i)] = base + dk + i;  // k head g
    }
    for (int64_t j = 0; j < r; ++j) {  // v and z heads g*r + j
      const int64_t h = g * r + j;
      for (int64_t i = 0; i < dv; ++i) {
        src[static_cast<size_t>(2 * kd + h * dv + i)] = base + 2 * dk + j * dv + i;
        src[static_cast<size_t>(2 * kd + vd + h * dv + i)] = base + 2 * dk + r * dv + j * dv + i;
      }
    }
  }
  return src;
}

std::vector<int64_t> qwen3next_ba_source_rows(int64_t nk, int64_t nv) {
  const int64_t r = nv / nk;
  std::vector<int64_t> src(static_cast<size_t>(2 * nv));
  for (int64_t g = 0; g < nk; ++g)
    for (int64_t j = 0; j < r; ++j) {
      src[static_cast<size_t>(g * r + j)] = g * 2 * r + j;           // b head g*r + j
      src[static_cast<size_t>(nv + g * r + j)] = g * 2 * r + r + j;  // a head g*r + j
    }
  return src;
}

ByteBuffer gather_rows(const TensorView& w, std::span<const int64_t> rows, const std::string& what) {
  if (w.rank != 2 || w.stride[1] != 1) throw Error(what + ": expected a rank-2 tensor with contiguous rows, got " + w.shape_str());
  const size_t row_bytes = static_cast<size_t>(w.shape[1]) * dtype_size(w.dtype);
  const size_t pitch = static_cast<size_t>(w.stride[0]) * dtype_size(w.dtype);
  ByteBuffer out(rows.size() * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= w.shape[0])
      throw Error(what + ": row " + std::to_string(rows[i]) + " out of range for shape " + w.shape_str());
    std::memcpy(out.data() + i * row_bytes, static_cast<const std::byte*>(w.data) + static_cast<size_t>(rows[i]) * pitch,
                row_bytes);
  }
  return out;
}

}  // namespace hanpu::model
