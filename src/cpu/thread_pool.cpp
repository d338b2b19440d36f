#include "cpu/thread_pool.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <system_error>

#include "hanpu/tensor.hpp"

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace hanpu {

int hardware_threads() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

namespace {
void pin_to_cpu(std::thread& t, int cpu) {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % CPU_SETSIZE, &set);
  pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);  // best effort: ignore failure
#endif
}
}  // namespace

namespace {
std::atomic<int> g_fail_spawn_at{0};  // test hook: 0 = off

// How long a worker polls for its next job, and run() for the workers to finish, before sleeping
// on a condition variable. A decode step calls the pool once per projection (about 130 times per
// token for Qwen3.5-0.8B), jobs a few hundred microseconds apart; a sleeping thread costs a futex
// wake-up each time, and in a VM whose idle vCPU halted, the host rescheduling it (tens of
// microseconds). 50 us covers the gap between two projections of one token and bounds the CPU
// burnt when no job comes. Pools with more threads than cores never poll (a polling worker would
// take the core the thread it waits for needs).
constexpr auto kPollTime = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// Polls done() for up to kPollTime.
template <class Done>
void poll_until(const Done& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned i = 1; !done(); ++i) {
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > kPollTime) return;
  }
}
}  // namespace

void ThreadPool::fail_thread_creation_for_testing(int worker) { g_fail_spawn_at.store(worker); }

ThreadPool::ThreadPool(int threads) {
  if (threads > kMaxThreads)
    throw Error("thread pool: got " + std::to_string(threads) + " threads, expected at most " + std::to_string(kMaxThreads));
  // HANPU_POOL_POLL=0 turns polling off (a machine shared with other work; A/B measurements).
  static const bool poll_allowed = [] {
    const char* v = std::getenv("HANPU_POOL_POLL");
    return v == nullptr || std::string(v) != "0";
  }();
  poll_ = poll_allowed && threads <= hardware_threads();
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) {
    try {
      if (g_fail_spawn_at.load() == i)
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "injected by the test hook");
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::system_error& e) {
      // The OS refused a thread (RLIMIT_NPROC, address space): stop and join the workers already
      // running (a joinable std::thread left behind would call std::terminate), then say so.
      stop_and_join();
      throw Error("thread pool: cannot create worker thread " + std::to_string(i) + " of " + std::to_string(threads) +
                  " (" + e.what() + "); use fewer threads");
    }
    if (threads <= hardware_threads()) pin_to_cpu(workers_.back(), i);
  }
}

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    int n;
    if (poll_) poll_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    if (index < n) {
      try {
        (*job)(index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::run(int n, const std::function<void(int)>& fn) {
  // One run at a time per pool: a second caller (another thread calling the engine, or a nested
  // run from inside a job) runs its n parts itself, in order. The parts are independent by the
  // contract of run(), so the results are the same; only that caller's speed changes.
  std::unique_lock<std::mutex> running(run_mu_, std::try_to_lock);
  if (n <= 1 || workers_.empty() || !running.owns_lock()) {
    for (int t = 0; t < n; ++t) fn(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  cv_start_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  if (poll_) poll_until([&] { return pending_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return pending_ == 0; });
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace hanpu
