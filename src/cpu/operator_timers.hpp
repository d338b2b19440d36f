// Per-operator time of the head-fused path (FusedGroup), for profiling. Compiled in only with the
// CMake option HANPU_OPERATOR_TIMERS (preset "timers"); otherwise OperatorClock is empty and every
// call on it vanishes. Results: hanpu/operator_timers.hpp, `hanpu bench --operator-times`.
#pragma once

#include <cstdint>

namespace hanpu::cpu {

// The operators of the chunkwise computation (paper, arXiv 2609.32114, §2) as FusedGroup runs them, in that order.
enum class Op : int {
  kLoad,        // LoadChunk: q, k, v, beta, gates into the arena (and KDA's per-token factors)
  kGate,        // #1: e^Γ rows, and for KDA the gated K and Q operands
  kStateGemms,  // X = βV − (β e^Γ K) S and O = (e^Γ Q) S
  kGrams,       // #2: K K^T and Q K^T (transposes, KDA's anchored gram)
  kMask,        // gating and masking of the grams
  kSolve,       // #3: (I + A) E = X (or the W/U form)
  kOutput,      // #6: O += P E
  kStore,       // o to memory
  kUpdate,      // #5: the state update and its column factors
  kCount
};

#ifdef HANPU_OPERATOR_TIMERS
uint64_t operator_timer_now();  // TSC ticks on x86-64, steady-clock nanoseconds elsewhere
void add_operator_times(const uint64_t* ticks, uint64_t head_chunks);

class OperatorClock {
 public:
  OperatorClock() : last_(operator_timer_now()) {}
  OperatorClock(const OperatorClock&) = delete;
  OperatorClock& operator=(const OperatorClock&) = delete;
  ~OperatorClock() { add_operator_times(ticks_, head_chunks_); }
  // The time since the previous mark (or skip) belongs to `op`.
  void mark(Op op) {
    const uint64_t now = operator_timer_now();
    ticks_[static_cast<int>(op)] += now - last_;
    last_ = now;
  }
  // The time since the previous mark belongs to no operator (state loads and stores).
  void skip() { last_ = operator_timer_now(); }
  void head_chunk_done() { ++head_chunks_; }

 private:
  uint64_t ticks_[static_cast<int>(Op::kCount)] = {};
  uint64_t last_;
  uint64_t head_chunks_ = 0;
};
#else
class OperatorClock {
 public:
  void mark(Op) {}
  void skip() {}
  void head_chunk_done() {}
};
#endif

}  // namespace hanpu::cpu
