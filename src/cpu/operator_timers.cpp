#include "hanpu/operator_timers.hpp"

#include <atomic>
#include <chrono>

#include "cpu/operator_timers.hpp"

#if defined(HANPU_OPERATOR_TIMERS) && defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace hanpu {
namespace {

#ifdef HANPU_OPERATOR_TIMERS
constexpr int kOps = static_cast<int>(cpu::Op::kCount);
constexpr const char* kNames[kOps] = {"load", "gate", "state GEMMs", "grams", "mask", "solve", "output", "store",
                                      "update"};
std::atomic<uint64_t> g_ticks[kOps];
std::atomic<uint64_t> g_head_chunks{0};
#endif

}  // namespace

#ifdef HANPU_OPERATOR_TIMERS
namespace cpu {

uint64_t operator_timer_now() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}

void add_operator_times(const uint64_t* ticks, uint64_t head_chunks) {
  for (int i = 0; i < kOps; ++i) g_ticks[i].fetch_add(ticks[i], std::memory_order_relaxed);
  g_head_chunks.fetch_add(head_chunks, std::memory_order_relaxed);
}

}  // namespace cpu
#endif

OperatorTimes read_operator_times() {
  OperatorTimes t;
#ifdef HANPU_OPERATOR_TIMERS
  t.enabled = true;
#if defined(__x86_64__)
  t.unit = "TSC cycles";
#else
  t.unit = "ns";
#endif
  t.head_chunks = static_cast<int64_t>(g_head_chunks.load());
  const double n = t.head_chunks > 0 ? static_cast<double>(t.head_chunks) : 1.0;
  for (int i = 0; i < kOps; ++i) t.per_head_chunk.emplace_back(kNames[i], static_cast<double>(g_ticks[i].load()) / n);
#endif
  return t;
}

void reset_operator_times() {
#ifdef HANPU_OPERATOR_TIMERS
  for (auto& x : g_ticks) x.store(0);
  g_head_chunks.store(0);
#endif
}

}  // namespace hanpu
