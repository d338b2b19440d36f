// Inside an Engine (hanpu/engine.hpp): its pool, the per-thread workspaces the kernels reuse, its
// host plan cache, and how a call takes its share. Internal to the library.
//
// What code outside src/cpu may use of an engine (workspaces, leases, a call's share of threads)
// is public: hanpu/engine_work.hpp.
#pragma once

#include <atomic>

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
#include "hanpu/engine_work.hpp"
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

  /// A set of workspaces held for one run (hanpu/engine_work.hpp).
  using Lease = WorkspaceLease;

  /// fn(t, workspace of part t) for t in [0, n) on the pool; more parts than threads run in turn
  /// on the pool's threads (parts are independent: the results do not change).
  void run(int n, const std::function<void(int, cpu::Workspace&)>& fn);

  /// Another runtime's threads to run the parts on instead of the pool: team(n, body, ctx) calls
  /// body(t, ctx) once for every t in [0, n), on as many of its threads as it has, and returns
  /// when all are done; body does not throw. Set by the Python bindings for the vLLM plugin
  /// (torch's OpenMP team, whose workers spin-wait between torch ops on the same cores: python/src/
  /// la_bindings.cpp); null: the pool.
  using Team = void (*)(int n, void (*body)(int, void*), void* ctx);
  std::atomic<Team> team{nullptr};
};

namespace cpu {

/// A call's share of an engine (hanpu/engine_work.hpp).
using Threads = EngineThreads;

/// The engine a call names, or the default one.
inline Engine& engine_or_default(Engine* e) { return e ? *e : Engine::default_engine(); }

}  // namespace cpu
}  // namespace hanpu
