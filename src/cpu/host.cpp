// Host detection and peak measurement. The SIMD kernels are compiled once per Highway target in this
// same translation unit (foreach_target re-includes this file) and picked at run time, so the same
// binary measures AVX-512 on x86 and NEON/SVE on ARM.

// ----------------------------------------------------------------------------------------------
// Per-target SIMD kernels (this part is compiled once per Highway target).
// ----------------------------------------------------------------------------------------------
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/host.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace hanpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Reports which target this copy was compiled for and the float lanes of its native vector.
void HostTargetInfo(int64_t* target, int* f32_lanes) {
  const hn::ScalableTag<float> d;
  *target = HWY_TARGET;
  *f32_lanes = static_cast<int>(hn::Lanes(d));
}

// Targets with 16 architectural vector registers (SSE4/AVX2) get 12 accumulators so the two
// constants stay in registers; AVX-512, NEON, SVE (32 registers) get 16.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
#define HANPU_FMA_ACCS 12
#else
#define HANPU_FMA_ACCS 16
#endif

#define HANPU_ACC12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#if HANPU_FMA_ACCS == 16
#define HANPU_ACCS(X) HANPU_ACC12(X) X(12) X(13) X(14) X(15)
#else
#define HANPU_ACCS(X) HANPU_ACC12(X)
#endif

/// `iters` rounds of 4 x HANPU_FMA_ACCS independent vector FMAs (acc = acc * mul + add), no memory
/// traffic. Returns the lane sum so nothing can be optimised away; *lane_fmas receives the number of
/// scalar FMAs executed (each = 2 flops).
HWY_NOINLINE float HostFmaKernel(int64_t iters, float mul, float add, int64_t* lane_fmas) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, mul);
  const auto a = hn::Set(d, add);
#define HANPU_DECL(i) auto v##i = hn::Set(d, 1.0f + 0.001f * (i));
  HANPU_ACCS(HANPU_DECL)
#undef HANPU_DECL
#define HANPU_FMA(i) v##i = hn::MulAdd(v##i, m, a);
  for (int64_t it = 0; it < iters; ++it) {
    HANPU_ACCS(HANPU_FMA)
    HANPU_ACCS(HANPU_FMA)
    HANPU_ACCS(HANPU_FMA)
    HANPU_ACCS(HANPU_FMA)
  }
#undef HANPU_FMA
  auto sum = hn::Zero(d);
#define HANPU_SUM(i) sum = hn::Add(sum, v##i);
  HANPU_ACCS(HANPU_SUM)
#undef HANPU_SUM
  *lane_fmas = iters * 4 * HANPU_FMA_ACCS * static_cast<int64_t>(hn::Lanes(d));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}
#undef HANPU_ACCS
#undef HANPU_ACC12
#undef HANPU_FMA_ACCS

/// Sum of n floats with 8 independent accumulators (a pure streaming read).
HWY_NOINLINE float HostReadSum(const float* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  auto s4 = hn::Zero(d), s5 = hn::Zero(d), s6 = hn::Zero(d), s7 = hn::Zero(d);
  size_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    s0 = hn::Add(s0, hn::LoadU(d, p + i + 0 * N));
    s1 = hn::Add(s1, hn::LoadU(d, p + i + 1 * N));
    s2 = hn::Add(s2, hn::LoadU(d, p + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(d, p + i + 3 * N));
    s4 = hn::Add(s4, hn::LoadU(d, p + i + 4 * N));
    s5 = hn::Add(s5, hn::LoadU(d, p + i + 5 * N));
    s6 = hn::Add(s6, hn::LoadU(d, p + i + 6 * N));
    s7 = hn::Add(s7, hn::LoadU(d, p + i + 7 * N));
  }
  for (; i + N <= n; i += N) s0 = hn::Add(s0, hn::LoadU(d, p + i));
  s0 = hn::Add(hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)), hn::Add(hn::Add(s4, s5), hn::Add(s6, s7)));
  float tail = 0.0f;
  for (; i < n; ++i) tail += p[i];
  return hn::GetLane(hn::SumOfLanes(d, s0)) + tail;
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu
HWY_AFTER_NAMESPACE();

// ----------------------------------------------------------------------------------------------
// Target-independent code (compiled once).
// ----------------------------------------------------------------------------------------------
#if HWY_ONCE

#include "cpu/host.hpp"
#include "hanpu/isa.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <hwy/targets.h>

#include "hanpu/tensor.hpp"  // hanpu::Error

namespace hanpu {

HWY_EXPORT(HostTargetInfo);
HWY_EXPORT(HostFmaKernel);
HWY_EXPORT(HostReadSum);

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool read_first_line(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::string line;
  if (!std::getline(f, line)) return false;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  *out = line;
  return true;
}

/// "48K", "2048K", "480M", "1G", "32768" -> bytes; -1 if unparsable.
int64_t parse_size(const std::string& s) {
  if (s.empty()) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || v < 0) return -1;
  int64_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1024;
  else if (*end == 'M' || *end == 'm') mult = 1024LL * 1024;
  else if (*end == 'G' || *end == 'g') mult = 1024LL * 1024 * 1024;
  return static_cast<int64_t>(v) * mult;
}

/// "0-3,8,10-11" -> {0,1,2,3,8,10,11}.
std::vector<int> parse_cpu_list(const std::string& s) {
  std::vector<int> cpus;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    const size_t dash = part.find('-');
    try {
      if (dash == std::string::npos) {
        cpus.push_back(std::stoi(part));
      } else {
        const int a = std::stoi(part.substr(0, dash)), b = std::stoi(part.substr(dash + 1));
        for (int c = a; c <= b && c - a < 65536; ++c) cpus.push_back(c);
      }
    } catch (...) {
      // ignore malformed pieces
    }
  }
  return cpus;
}

/// Number of distinct physical cores (package, core_id) among `cpus`; cpus.size() if unknown.
int count_cores(const std::vector<int>& cpus) {
  std::set<std::pair<std::string, std::string>> cores;
  for (int c : cpus) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::string pkg, core;
    if (!read_first_line(base + "physical_package_id", &pkg) || !read_first_line(base + "core_id", &core))
      return static_cast<int>(cpus.size());
    cores.emplace(pkg, core);
  }
  return std::max<int>(1, static_cast<int>(cores.size()));
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<CacheLevel> caches_from_sysfs() {
  std::vector<CacheLevel> out;
  for (int idx = 0; idx < 16; ++idx) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/";
    std::string level, type, size, line, shared;
    if (!read_first_line(base + "level", &level)) break;
    if (!read_first_line(base + "type", &type) || !read_first_line(base + "size", &size)) continue;
    CacheLevel c;
    try {
      c.level = std::stoi(level);
    } catch (...) {
      continue;
    }
    c.type = type;
    c.size_bytes = parse_size(size);
    if (c.size_bytes <= 0) continue;
    if (read_first_line(base + "coherency_line_size", &line)) {
      const int64_t l = parse_size(line);
      if (l > 0) c.line_bytes = l;
    }
    if (read_first_line(base + "shared_cpu_list", &shared)) {
      const std::vector<int> cpus = parse_cpu_list(shared);
      if (!cpus.empty()) {
        c.shared_by_cpus = static_cast<int>(cpus.size());
        c.shared_by_cores = count_cores(cpus);
      }
    }
    c.source = "sysfs";
    out.push_back(c);
  }
  std::sort(out.begin(), out.end(), [](const CacheLevel& a, const CacheLevel& b) {
    return a.level != b.level ? a.level < b.level : a.type < b.type;
  });
  return out;
}

std::vector<CacheLevel> caches_from_sysconf(int logical_cpus) {
  std::vector<CacheLevel> out;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
  auto add = [&](int level, const char* type, long size, long line, int shared) {
    if (size <= 0) return;
    CacheLevel c;
    c.level = level;
    c.type = type;
    c.size_bytes = size;
    c.line_bytes = line > 0 ? line : 64;
    c.shared_by_cpus = c.shared_by_cores = shared;
    c.source = "sysconf";
    out.push_back(c);
  };
  // sysconf does not say who shares what: assume private L1/L2 and an L3 shared by all CPUs.
  add(1, "Data", sysconf(_SC_LEVEL1_DCACHE_SIZE), sysconf(_SC_LEVEL1_DCACHE_LINESIZE), 1);
  add(2, "Unified", sysconf(_SC_LEVEL2_CACHE_SIZE), sysconf(_SC_LEVEL2_CACHE_LINESIZE), 1);
  add(3, "Unified", sysconf(_SC_LEVEL3_CACHE_SIZE), sysconf(_SC_LEVEL3_CACHE_LINESIZE),
      std::max(1, logical_cpus));
#else
  (void)logical_cpus;
#endif
  return out;
}

bool has_data_level(const std::vector<CacheLevel>& caches, int level) {
  for (const auto& c : caches)
    if (c.level == level && c.type != "Instruction" && c.size_bytes > 0) return true;
  return false;
}

HostInfo detect_host_uncached() {
  HostInfo h;

  // CPU model.
  h.cpu_model = "unknown";
  h.cpu_model_source = "default";
  {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (f && std::getline(f, line)) {
      // x86: "model name"; some ARM kernels: "Processor" / "CPU part" only (left as unknown).
      if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string v = line.substr(colon + 1);
        const size_t b = v.find_first_not_of(" \t");
        v = b == std::string::npos ? "" : v.substr(b);
        if (!v.empty()) {
          h.cpu_model = v;
          h.cpu_model_source = "procfs";
          break;
        }
      }
    }
  }

  // Logical CPUs this process may use.
  const std::vector<int> cpus = allowed_cpus();
  if (!cpus.empty()) {
    h.logical_cpus = static_cast<int>(cpus.size());
    h.logical_cpus_source = "sysconf";
  } else if (const unsigned hc = std::thread::hardware_concurrency(); hc > 0) {
    h.logical_cpus = static_cast<int>(hc);
    h.logical_cpus_source = "sysconf";
  } else {
    h.logical_cpus = 1;
    h.logical_cpus_source = "default";
  }

  // Caches: sysfs, then sysconf, then defaults for whatever of L1d/L2 is still missing.
  h.caches = caches_from_sysfs();
  if (!has_data_level(h.caches, 1) || !has_data_level(h.caches, 2)) {
    for (const CacheLevel& c : caches_from_sysconf(h.logical_cpus))
      if (!has_data_level(h.caches, c.level)) h.caches.push_back(c);
  }
  if (!has_data_level(h.caches, 1)) {
    h.caches.push_back(CacheLevel{1, "Data", 32 * 1024, 64, 1, 1, "default"});
  }
  if (!has_data_level(h.caches, 2)) {
    h.caches.push_back(CacheLevel{2, "Unified", 1024 * 1024, 64, 1, 1, "default"});
  }
  std::sort(h.caches.begin(), h.caches.end(), [](const CacheLevel& a, const CacheLevel& b) {
    return a.level != b.level ? a.level < b.level : a.type < b.type;
  });

  // SIMD target Highway dispatches to.
  int64_t target = 0;
  int lanes = 1;
  HANPU_DISPATCH(HostTargetInfo)(&target, &lanes);
  h.simd_target = hwy::TargetName(target);
  h.simd_f32_lanes = lanes;
  return h;
}

// ---- threads ------------------------------------------------------------------------------

void pin_current_thread(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // failure is fine
}

/// Runs `n` threads pinned to cpus[i % cpus.size()]. Each calls setup(tid) once, then rounds of
/// body(tid) that start together (barrier). After each round `more(round, wall_seconds)` (wall =
/// latest end - earliest start) decides whether another round follows. Returns the per-round wall
/// times; if `per_thread` is given it receives, per round, each thread's own body() duration.
std::vector<double> run_rounds(int n, const std::vector<int>& cpus, const std::function<void(int)>& setup,
                               const std::function<void(int)>& body,
                               const std::function<bool(int, double)>& more,
                               std::vector<std::vector<double>>* per_thread = nullptr) {
  std::vector<Clock::time_point> t0(n), t1(n);
  std::vector<double> walls;
  bool stop = false;
  auto on_round_end = [&]() noexcept {
    const auto start = *std::min_element(t0.begin(), t0.end());
    const auto end = *std::max_element(t1.begin(), t1.end());
    walls.push_back(std::chrono::duration<double>(end - start).count());
    try {
      if (per_thread) {
        std::vector<double> d(n);
        for (int i = 0; i < n; ++i) d[i] = std::chrono::duration<double>(t1[i] - t0[i]).count();
        per_thread->push_back(std::move(d));
      }
      stop = !more(static_cast<int>(walls.size()), walls.back());
    } catch (...) {
      stop = true;
    }
  };
  std::barrier start_bar(n);
  std::barrier end_bar(n, on_round_end);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int tid = 0; tid < n; ++tid) {
    threads.emplace_back([&, tid] {
      pin_current_thread(cpus.empty() ? -1 : cpus[tid % cpus.size()]);
      setup(tid);
      for (;;) {
        start_bar.arrive_and_wait();
        t0[tid] = Clock::now();
        body(tid);
        t1[tid] = Clock::now();
        end_bar.arrive_and_wait();  // completion runs on_round_end once
        if (stop) break;
      }
    });
  }
  for (auto& t : threads) t.join();
  return walls;
}

volatile float g_sink = 0.0f;

/// FMA GFLOP/s of `n` threads started together, each running `iters` kernel iterations: per round
/// the sum over threads of (own flops / own time), best over `repeats` rounds.
double fma_gflops(int n, const std::vector<int>& cpus, int64_t iters, int repeats) {
  // Runtime constants so the compiler cannot fold the chain: acc -> acc * 0.9999999 + 1e-7 stays ~1.
  volatile float vmul = 0.9999999f, vadd = 1e-7f;
  const float mul = vmul, add = vadd;
  std::vector<int64_t> fmas(n, 0);
  std::vector<float> sums(n, 0.0f);
  std::vector<std::vector<double>> per_thread;
  run_rounds(
      n, cpus,
      [&](int tid) {  // warm-up: lets the core reach its wide-vector frequency
        int64_t f = 0;
        sums[tid] += HANPU_DISPATCH(HostFmaKernel)(std::max<int64_t>(1, iters / 4), mul, add, &f);
      },
      [&](int tid) { sums[tid] += HANPU_DISPATCH(HostFmaKernel)(iters, mul, add, &fmas[tid]); },
      [&](int round, double) { return round < repeats; }, &per_thread);
  float total_sum = 0;
  for (float s : sums) total_sum += s;
  g_sink = total_sum;
  double best = 0;
  for (const auto& round : per_thread) {
    double gflops = 0;
    for (int i = 0; i < n; ++i)
      if (round[i] > 0) gflops += 2.0 * static_cast<double>(fmas[i]) / round[i] * 1e-9;
    best = std::max(best, gflops);
  }
  return best;
}

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : -1;
}

}  // namespace

// ---- HostInfo ---------------------------------------------------------------------------------

const CacheLevel* HostInfo::data_cache(int level) const {
  const CacheLevel* best = nullptr;
  for (const auto& c : caches) {
    if (c.level != level || c.type == "Instruction" || c.size_bytes <= 0) continue;
    if (!best || c.type == "Data") best = &c;
  }
  return best;
}

int64_t HostInfo::data_cache_per_core(int level) const {
  const CacheLevel* c = data_cache(level);
  if (!c) return 0;
  return c->size_bytes / std::max(1, c->shared_by_cores);
}

int64_t HostInfo::l1d_bytes() const { return data_cache_per_core(1); }
int64_t HostInfo::l2_bytes() const { return data_cache_per_core(2); }
int64_t HostInfo::l3_bytes() const { return data_cache_per_core(3); }

HostInfo detect_host() {
  static std::once_flag once;
  static HostInfo cached;
  std::call_once(once, [] { cached = detect_host_uncached(); });
  return cached;
}

// ---- measurement --------------------------------------------------------------------------------

HostMeasurement measure_host(int threads, double budget_seconds) {
  const auto t_start = Clock::now();
  const HostInfo info = detect_host();
  if (threads <= 0) threads = info.logical_cpus;
  threads = std::clamp(threads, 1, 1024);
  if (!(budget_seconds > 0)) budget_seconds = 1.0;
  const std::vector<int> cpus = allowed_cpus();

  HostMeasurement m;
  m.threads = threads;

  // FMA: calibrate the iteration count so one run lasts `run_s` (>= 10 ms), 20% of the budget for
  // each of the 1-thread and all-thread measurements, best of 4 runs.
  constexpr int kFmaRepeats = 4;
  const double run_s = std::clamp(budget_seconds * 0.2 / (kFmaRepeats + 1), 0.01, 0.1);
  int64_t iters = 1 << 12;
  {
    volatile float vmul = 0.9999999f, vadd = 1e-7f;
    int64_t f = 0;
    float s = HANPU_DISPATCH(HostFmaKernel)(iters, vmul, vadd, &f);  // warm up
    for (;;) {
      const auto t0 = Clock::now();
      s += HANPU_DISPATCH(HostFmaKernel)(iters, vmul, vadd, &f);
      const double dt = seconds_since(t0);
      if (dt >= 0.002 || iters > (int64_t{1} << 40)) {
        iters = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * run_s / std::max(dt, 1e-9)));
        break;
      }
      iters *= 4;
    }
    g_sink = s;
  }
  m.fma_peak_gflops_1thread = fma_gflops(1, cpus, iters, kFmaRepeats);
  m.fma_peak_gflops_all = threads == 1 ? m.fma_peak_gflops_1thread : fma_gflops(threads, cpus, iters, kFmaRepeats);

  // Bandwidth: pure streaming read (sum) of a buffer much larger than the caches, split into one
  // contiguous chunk per thread, first-touched by the thread that reads it. Target 4x the L3 (total,
  // not per core), at least 64 MiB, at most 1 GiB (256 MiB when the budget is under 0.5 s), at most
  // a quarter of the available memory.
  int64_t l3_total = 0;
  if (const CacheLevel* l3 = info.data_cache(3)) l3_total = l3->size_bytes;
  else if (const CacheLevel* l2 = info.data_cache(2)) l3_total = l2->size_bytes * info.logical_cpus;
  const int64_t kMiB = 1024 * 1024;
  int64_t bytes = std::clamp<int64_t>(4 * l3_total, 64 * kMiB, budget_seconds >= 0.5 ? 1024 * kMiB : 256 * kMiB);
  if (const int64_t avail = mem_available_bytes(); avail > 0) bytes = std::min(bytes, avail / 4);
  const int64_t align = int64_t{threads} * 2 * kMiB;  // per-thread chunks start on 2 MiB boundaries
  bytes = std::max<int64_t>(align, bytes / align * align);

  void* mem = MAP_FAILED;
  while (bytes >= align) {
    mem = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem != MAP_FAILED) break;
    bytes = bytes / 2 / align * align;
  }
  if (mem == MAP_FAILED) throw Error("measure_host: cannot allocate a bandwidth buffer");
#ifdef MADV_HUGEPAGE
  (void)madvise(mem, static_cast<size_t>(bytes), MADV_HUGEPAGE);  // fewer page faults / TLB misses
#endif
  float* buf = static_cast<float*>(mem);
  const size_t chunk = static_cast<size_t>(bytes / threads) / sizeof(float);
  std::vector<float> sums(threads, 0.0f);
  const double bw_budget = std::max(0.05, budget_seconds - seconds_since(t_start));
  const auto bw_start = Clock::now();
  std::vector<double> walls;
  try {
    walls = run_rounds(
        threads, cpus,
        [&](int tid) {
          float* p = buf + static_cast<size_t>(tid) * chunk;
          std::fill(p, p + chunk, 1.0f);  // first touch by the reading thread
        },
        [&](int tid) {
          sums[tid] += HANPU_DISPATCH(HostReadSum)(buf + static_cast<size_t>(tid) * chunk, chunk);
        },
        [&](int round, double) {
          // Round 1 is a warm-up (TLB, prefetchers); keep going to >= 4 timed rounds, at most 11,
          // while the budget lasts.
          if (round < 5) return true;
          return round < 12 && seconds_since(bw_start) < bw_budget * 0.9;
        });
  } catch (...) {
    munmap(mem, static_cast<size_t>(bytes));
    throw;
  }
  munmap(mem, static_cast<size_t>(bytes));
  float total = 0;
  for (float s : sums) total += s;
  g_sink = total;
  std::vector<double> timed(walls.begin() + (walls.size() > 1 ? 1 : 0), walls.end());
  std::sort(timed.begin(), timed.end());
  const double median = timed.size() % 2 ? timed[timed.size() / 2]
                                         : 0.5 * (timed[timed.size() / 2 - 1] + timed[timed.size() / 2]);
  const double bytes_read = static_cast<double>(chunk) * sizeof(float) * threads;
  m.mem_bandwidth_gbs = median > 0 ? bytes_read / median * 1e-9 : 0.0;
  m.bandwidth_buffer_bytes = static_cast<int64_t>(bytes_read);
  m.seconds_spent = seconds_since(t_start);
  return m;
}

// ---- JSON -------------------------------------------------------------------------------------

namespace {
nlohmann::json item(const nlohmann::json& value, const std::string& source, const std::string& status) {
  return nlohmann::json{{"value", value}, {"source", source}, {"status", status}};
}
std::string status_of(const std::string& source) {
  if (source == "measured") return "measured";
  if (source == "default") return "estimate";
  return "detected";
}
}  // namespace

nlohmann::json host_to_json(const HostInfo& info, const HostMeasurement* m) {
  using nlohmann::json;
  json j;
  j["kind"] = "host";
  j["schema_version"] = 1;
  j["cpu_model"] = item(info.cpu_model, info.cpu_model_source, status_of(info.cpu_model_source));
  j["logical_cpus"] = item(info.logical_cpus, info.logical_cpus_source, status_of(info.logical_cpus_source));
  j["simd"] = {
      {"target", item(info.simd_target, "highway", "detected")},
      {"f32_lanes", item(info.simd_f32_lanes, "highway", "detected")},
      {"vector_bytes", item(info.simd_f32_lanes * 4, "highway", "detected")},
  };
  json caches = json::array();
  for (const CacheLevel& c : info.caches) {
    const std::string st = status_of(c.source);
    caches.push_back({
        {"level", c.level},
        {"type", c.type},
        {"size_bytes", item(c.size_bytes, c.source, st)},
        {"line_bytes", item(c.line_bytes, c.source, st)},
        {"shared_by_cpus", item(c.shared_by_cpus, c.source, st)},
        {"shared_by_cores", item(c.shared_by_cores, c.source, st)},
    });
  }
  j["caches"] = caches;
  // Per-core data cache shares: derived from the entries above, so they inherit their source; a
  // share of a shared cache is an estimate of what one core can count on.
  json per_core = json::object();
  for (int level = 1; level <= 3; ++level) {
    const CacheLevel* c = info.data_cache(level);
    const char* key = level == 1 ? "l1d_bytes" : level == 2 ? "l2_bytes" : "l3_bytes";
    if (!c) {
      per_core[key] = item(0, "default", "estimate");
      continue;
    }
    const std::string st = c->shared_by_cores > 1 ? "estimate" : status_of(c->source);
    per_core[key] = item(info.data_cache_per_core(level), c->source, st);
  }
  j["per_core"] = per_core;
  if (m) {
    j["measured"] = {
        {"threads", item(m->threads, "measured", "measured")},
        {"fma_peak_gflops_1thread", item(m->fma_peak_gflops_1thread, "measured", "measured")},
        {"fma_peak_gflops_all", item(m->fma_peak_gflops_all, "measured", "measured")},
        {"mem_bandwidth_gbs", item(m->mem_bandwidth_gbs, "measured", "measured")},
        {"mem_bandwidth_kind", "read"},
        {"bandwidth_buffer_bytes", item(m->bandwidth_buffer_bytes, "measured", "measured")},
        {"seconds_spent", item(m->seconds_spent, "measured", "measured")},
    };
  }
  return j;
}

}  // namespace hanpu

#endif  // HWY_ONCE
