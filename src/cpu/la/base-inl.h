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

#include "cpu/kernel_facts.hpp"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Row padding and leading dimension of arena matrices: stated once in cpu/kernel_facts.hpp, which
// the CPU's planning rules size arenas by.
constexpr size_t kPad = kArenaRowPadFloats;
inline size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }
inline size_t LeadingDim(size_t n) { return arena_leading_dim(n); }

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_BASE_INL_H_
