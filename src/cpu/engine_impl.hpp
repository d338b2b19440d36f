// Inside an Engine (hanpu/engine.hpp): its pool, the per-thread workspaces the kernels reuse, its
// host plan cache, and how a call takes its share. Internal to the library.
//
// A run takes a set of workspaces (one per part) for its duration and gives it back after, so two
// runs at once (two threads calling one engine, or a run nested in another's part: the pool then
// runs the second's parts on the calling thread) never share a buffer. Sets are kept and only
// grow: after the first call of each shape, a call allocates nothing.
#pragma once

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "cpu/workspace.hpp"
#include "cpu/host.hpp"
#include "hanpu/device.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/plan_exec.hpp"

namespace hanpu {

namespace cpu {

/// An engine's host plans (plan_exec.cpp, host_plan): problem signature -> (plan, lowered
/// schedule), the least recently used evicted beyond kPlanCacheEntries. Its own mutex: two threads
/// calling one engine plan and look up concurrently.
struct PlanCache {
  std::mutex mu;
  std::list<std::string> lru;  // most recent first
  struct Entry {
    HostPlan value;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Entry> entries;
  std::map<int, Device> devices;  // the engine's host as a planning device, per thread count
};

}  // namespace cpu

struct Engine::Impl {
  explicit Impl(int threads);
  ThreadPool pool;
  HostInfo host;
  std::mutex mu;  // guards idle and sets
  std::vector<std::unique_ptr<std::vector<cpu::Workspace>>> idle;
  size_t sets = 0;  // workspace sets made (idle or leased)
  cpu::PlanCache plans;

  /// A set of workspaces held for one run (or one model forward), given back when destroyed.
  class Lease {
   public:
    Lease(Impl& e, int parts);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    cpu::Workspace& operator[](int t) { return (*set_)[static_cast<size_t>(t)]; }

   private:
    Impl& e_;
    std::unique_ptr<std::vector<cpu::Workspace>> set_;
  };

  /// fn(t, workspace of part t) for t in [0, n) on the pool; more parts than threads run in turn
  /// on the pool's threads (parts are independent: the results do not change).
  void run(int n, const std::function<void(int, cpu::Workspace&)>& fn);
};

namespace cpu {

/// A call's share of an engine: the engine and how many parts to split into.
struct Threads {
  Engine* engine = nullptr;
  int n = 1;
  /// This share when `many`, else one part (work too small to wake the pool for).
  Threads when(bool many) const { return many ? *this : Threads{engine, 1}; }
  Engine::Impl& impl() const { return engine->impl(); }
};

/// The engine a call names, or the default one.
inline Engine& engine_or_default(Engine* e) { return e ? *e : Engine::default_engine(); }

}  // namespace cpu
}  // namespace hanpu
