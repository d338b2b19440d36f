// Engine (hanpu/engine.hpp, cpu/workspace.hpp): the pool, the workspace sets, the host description.
#include <exception>
#include <mutex>

#include "cpu/engine_impl.hpp"

namespace hanpu {

Engine::Impl::Impl(int threads) : pool(threads > 0 ? threads : hardware_threads()), host(detect_host()) {}

WorkspaceLease::WorkspaceLease(Engine::Impl& e, int parts) : engine_(e) {
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (!e.idle.empty()) {
      set_ = std::move(e.idle.back());
      e.idle.pop_back();
    } else {
      // A new set (as many exist as runs were ever at once; none is freed): `idle` gets room for
      // all of them, so that giving one back never allocates.
      e.idle.reserve(++e.sets);
      set_ = std::make_unique<std::vector<cpu::Workspace>>();
    }
  }
  if (set_->size() < static_cast<size_t>(parts)) set_->resize(static_cast<size_t>(parts));
}

WorkspaceLease::~WorkspaceLease() {
  std::lock_guard<std::mutex> lock(engine_.mu);
  engine_.idle.push_back(std::move(set_));  // capacity reserved by the constructor
}

void EngineThreads::run(int parts, const std::function<void(int, Workspace&)>& fn) const { impl().run(parts, fn); }

void Engine::Impl::run(int n, const std::function<void(int, cpu::Workspace&)>& fn) {
  if (n <= 0) return;
  Lease lease(*this, n);
  const int P = pool.size();
  if (n == 1) {
    fn(0, lease[0]);
  } else if (const Team t = team.load(std::memory_order_acquire)) {
    struct Call {
      const std::function<void(int, cpu::Workspace&)>* fn;
      Lease* lease;
      std::mutex mu;
      std::exception_ptr error;
    } call{&fn, &lease, {}, {}};
    t(n, [](int part, void* ctx) {
      Call& c = *static_cast<Call*>(ctx);
      try {
        (*c.fn)(part, (*c.lease)[part]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(c.mu);
        if (!c.error) c.error = std::current_exception();
      }
    }, &call);
    if (call.error) std::rethrow_exception(call.error);
  } else if (n <= P) {
    pool.run(n, [&](int t) { fn(t, lease[t]); });
  } else {
    pool.run(P, [&](int w) {
      for (int t = w; t < n; t += P) fn(t, lease[t]);
    });
  }
}

Engine::Engine(int threads) : impl_(std::make_unique<Impl>(threads)) {}
Engine::~Engine() = default;

int Engine::threads() const { return impl_->pool.size(); }
const HostInfo& Engine::host() const { return impl_->host; }

size_t Engine::workspace_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  size_t n = 0;
  for (const auto& set : impl_->idle)
    for (const cpu::Workspace& w : *set) n += w.held();
  return n;
}

Engine& Engine::default_engine() {
  // Created once on first use, never recreated; a function-local static, so destroyed at exit
  // after every caller that could still run on it has returned from main.
  static Engine engine(0);
  return engine;
}

}  // namespace hanpu
