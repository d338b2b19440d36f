// The engine: what a CPU computation runs on. It owns the thread pool (sized at construction), the
// per-thread workspaces the kernels reuse across calls (the LA kernels' arenas, the linear layers'
// packed rows and panels, a model's activation scratch) and the host description. Nothing of it is
// process-wide: two engines in one process share no threads and no memory, so two models, each
// with its own engine, or two threads each running its own model, give the results each gives
// alone (docs/ARCHITECTURE.md).
//
// Every entry point takes one: ExecOptions::engine (hanpu/la.hpp), ModelLoadOptions::engine and
// HybridModel::synthetic (hanpu/model.hpp), Bf16Linear / Int8Linear::forward (hanpu/linear.hpp).
// A caller that passes none gets Engine::default_engine().
#pragma once

#include <memory>

namespace hanpu {

struct HostInfo;  // src/cpu/host.hpp

class Engine {
 public:
  /// A pool of `threads` threads (<= 0: every hardware thread this process may use, as
  /// sched_getaffinity reports). Throws hanpu::Error for more than 1024 threads or when the OS
  /// refuses a thread.
  explicit Engine(int threads = 0);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Threads of the pool, the calling thread included. A call may ask for more parts than this
  /// (ExecOptions::threads, ForwardOptions::threads): the pool's threads then run them in turn,
  /// with the same results.
  int threads() const;
  /// The host description (CPU model, cores, caches, SIMD target) read when the engine was made.
  const HostInfo& host() const;
  /// Bytes of workspace the engine holds in the sets no call is using right now (all of them
  /// between calls; they only grow).
  size_t workspace_bytes() const;

  /// The process-wide default engine, for callers that pass none: created on first use with all
  /// hardware threads, never recreated or resized, destroyed at exit. The library's own paths
  /// (model, CLI, Python, server) pass their engine explicitly.
  static Engine& default_engine();

  struct Impl;  // src/cpu/workspace.hpp
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hanpu
