// The CPU kernels' shared vocabulary: Highway's float tag and vector, and the padded row layout
// of every arena matrix (kPad, LeadingDim).
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_BASE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_BASE_INL_H_
#undef HANPU_CPU_LA_BASE_INL_H_
#else
#define HANPU_CPU_LA_BASE_INL_H_
#endif

#include <cstddef>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Row padding of every arena matrix whose columns are a GEMM's N dimension: 16 floats = 64 bytes,
// a multiple of the vector length of every target (4, 8 or 16 floats), so tiles never need
// partial vectors; the pad columns are kept at zero.
constexpr size_t kPad = 16;
inline size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Leading dimension (floats) of an arena matrix with n columns: padded to kPad, plus one more kPad
// when the row length is a multiple of 256 bytes. Rows a power-of-two apart fall into a few L1
// sets (with 512-byte rows, a 128-row GEMM panel maps to 8 of the 64 sets and thrashes the 12
// ways); the extra 64 bytes spread consecutive rows over all sets.
inline size_t LeadingDim(size_t n) {
  const size_t padded = RoundUp(n, kPad);
  return padded % 64 == 0 ? padded + kPad : padded;
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_BASE_INL_H_
