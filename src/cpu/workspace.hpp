// The buffers one part of an engine's run reuses across calls (cpu/engine_impl.hpp hands them
// out). Internal to the library.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>

#include "hanpu/tensor.hpp"

namespace hanpu::cpu {

/// The buffers of one workspace. The model's activation slots (src/model/model_parts.hpp,
/// ScratchSlot) follow kModelSlots.
enum WorkspaceSlot : int {
  kLaArena,          // the LA kernels' per-thread arena (head-fused, recurrent, FLA-style scratch)
  kLinearRows,       // a linear layer's rounded / packed activation rows
  kLinearPanel,      // its transposed weight panel
  kLinearC,          // its C block (AMX)
  kAttentionKeys,    // causal attention: keys in transposed tiles
  kAttentionValues,  // and values in blocks
  kModelSlots,
  kWorkspaceSlots = kModelSlots + 32,
};

/// Per-part buffers, 64-byte aligned (ByteBuffer), each only growing. Contents are scratch: a
/// grown buffer is not copied (it is zero, as every new ByteBuffer).
class Workspace {
 public:
  std::byte* bytes(int slot, size_t n) {
    ByteBuffer& b = slots_[static_cast<size_t>(slot)];
    if (b.size() < n) b = ByteBuffer(std::max<size_t>(n, 1));
    return b.data();
  }
  template <class T>
  T* get(int slot, size_t count) {
    return reinterpret_cast<T*>(bytes(slot, count * sizeof(T)));
  }
  size_t held() const {
    size_t n = 0;
    for (const ByteBuffer& b : slots_) n += b.size();
    return n;
  }

 private:
  std::array<ByteBuffer, kWorkspaceSlots> slots_;
};

}  // namespace hanpu::cpu

