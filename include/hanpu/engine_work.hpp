// What code built on an engine (hanpu/engine.hpp) may use of it besides its public calls: a share
// of its threads for one call, parts run on its pool each with a workspace, and a workspace held
// for the length of a call. The model's layers (src/model) use the engine through this header and
// hanpu/linear.hpp only; the engine's internals (its pool, plan cache and host, cpu/engine_impl.hpp)
// stay in src/cpu (docs/ARCHITECTURE.md, "Libraries").
//
// A run takes a set of workspaces (one per part) for its duration and gives it back after, so two
// runs at once (two threads calling one engine, or a run nested in another's part: the pool then
// runs the second's parts on the calling thread) never share a buffer. Sets are kept and only
// grow: after the first call of each shape, a call allocates nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "hanpu/engine.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu {

/// The buffers of one workspace: the engine's kernels' slots first, then the slots of code built
/// on the engine from kModelSlots on (the model's activations: src/model/model_parts.hpp).
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

/// A set of workspaces held from an engine for one run (or one model forward), given back when
/// destroyed; `parts` of them, [0, parts).
class WorkspaceLease {
 public:
  WorkspaceLease(Engine& engine, int parts) : WorkspaceLease(engine.impl(), parts) {}
  WorkspaceLease(Engine::Impl& engine, int parts);  // src/cpu/engine.cpp
  ~WorkspaceLease();
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;
  Workspace& operator[](int t) { return (*set_)[static_cast<size_t>(t)]; }

 private:
  Engine::Impl& engine_;
  std::unique_ptr<std::vector<Workspace>> set_;
};

/// A call's share of an engine: the engine and how many parts to split into.
struct EngineThreads {
  Engine* engine = nullptr;
  int n = 1;
  /// This share when `many`, else one part (work too small to wake the pool for).
  EngineThreads when(bool many) const { return many ? *this : EngineThreads{engine, 1}; }
  /// fn(t, workspace of part t) for t in [0, parts) on the engine's pool; more parts than threads
  /// run in turn on the pool's threads (parts are independent: the results do not change).
  void run(int parts, const std::function<void(int, Workspace&)>& fn) const;  // src/cpu/engine.cpp
  /// The engine's internals, for src/cpu (cpu/engine_impl.hpp defines them).
  Engine::Impl& impl() const { return engine->impl(); }
};

}  // namespace hanpu
