// A small pool of pinned worker threads for static (planned) work assignment: run(n, fn) calls
// fn(t) for t in [0, n) with t = 0 on the calling thread, and returns when all are done. An
// Engine (hanpu/engine.hpp) owns one; there is no process-wide pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hanpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  /// Runs fn(t) for t in [0, n), n <= size(); rethrows the first exception a worker raised.
  /// Thread-safe: while the pool runs one call, other calls (from other threads, or nested) run
  /// their parts on the calling thread, in order.
  void run(int n, const std::function<void(int)>& fn);

  /// Upper bound on threads per pool (docs/RELIABILITY.md).
  static constexpr int kMaxThreads = 1024;
  /// Test hook: make the creation of worker `worker` (1-based; 0 = off) fail as if the OS refused
  /// the thread. A failing constructor joins the workers it made and throws hanpu::Error.
  static void fail_thread_creation_for_testing(int worker);

 private:
  void worker_loop(int index);
  void stop_and_join();
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex run_mu_;  // held for the whole of a run() that uses the workers
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int)>* job_ = nullptr;
  int job_n_ = 0;
  // Written under mu_; atomic so that the polling before a sleep (thread_pool.cpp) may read them.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  bool poll_ = false;  // workers and run() poll briefly before sleeping (not when oversubscribed)
  std::exception_ptr error_;
};

/// Number of hardware threads this process may use (sched affinity).
int hardware_threads();

}  // namespace hanpu
