// Host (CPU) description: what the OS tells us (model, CPU count, cache hierarchy, SIMD target) and
// what a short measurement finds (FP32 FMA peak, main-memory bandwidth). Used to size per-thread
// arenas/tiles and as the roofline for benchmark reports.
//
// Source vocabulary used in HostInfo/host_to_json:
//   "sysfs"    /sys/devices/system/cpu/...            "sysconf"  sysconf(_SC_*) / sched_getaffinity
//   "procfs"   /proc/cpuinfo                          "highway"  hwy runtime CPU detection (cpuid/auxv)
//   "measured" timed by measure_host()                "default"  conservative built-in fallback
// Status vocabulary: "detected" (read from the OS), "measured", "estimate" (default/derived).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hanpu {

struct CacheLevel {
  int level = 0;              // 1, 2, 3, ...
  std::string type;           // "Data", "Instruction", "Unified"
  int64_t size_bytes = 0;     // total size of one instance of this cache
  int64_t line_bytes = 64;    // coherency line size
  int shared_by_cpus = 1;     // logical CPUs sharing one instance (SMT siblings included)
  int shared_by_cores = 1;    // distinct physical cores among those CPUs (== shared_by_cpus if unknown)
  std::string source;         // "sysfs", "sysconf" or "default"
};

struct HostInfo {
  std::string cpu_model;           // /proc/cpuinfo "model name" (or "unknown")
  std::string cpu_model_source;    // "procfs" or "default"
  int logical_cpus = 1;            // CPUs this process may run on (sched_getaffinity, else hardware_concurrency)
  std::string logical_cpus_source; // "sysconf" or "default"
  std::vector<CacheLevel> caches;  // all levels, instruction caches included
  std::string simd_target;         // hwy::TargetName of the best target Highway dispatches to, e.g. "AVX3"
  int simd_f32_lanes = 1;          // float lanes of that target's native vector

  /// Per-core share of the data cache at that level, in bytes: size / shared_by_cores (so an L2
  /// private to a core, even if shared by its SMT siblings, counts whole). 0 if there is no such
  /// level (e.g. l3_bytes() on a machine without L3). Unified caches count as data caches.
  int64_t l1d_bytes() const;
  int64_t l2_bytes() const;
  int64_t l3_bytes() const;
  /// Generic form of the above.
  int64_t data_cache_per_core(int level) const;
  /// The data/unified cache entry at `level`, or nullptr.
  const CacheLevel* data_cache(int level) const;
};

/// Reads /proc, /sys, sysconf and Highway's CPU detection. No measurement; the result is computed
/// once and cached (thread-safe).
HostInfo detect_host();

struct HostMeasurement {
  double fma_peak_gflops_1thread = 0;  // FP32 FMA throughput of one pinned thread, GFLOP/s (FMA = 2 flops)
  double fma_peak_gflops_all = 0;      // `threads` pinned threads at once: total flops / wall time
  int threads = 1;
  double mem_bandwidth_gbs = 0;        // bytes READ per second (1e9) by all threads summing a buffer >> caches
  int64_t bandwidth_buffer_bytes = 0;  // size of that buffer
  double seconds_spent = 0;            // wall time of measure_host() including allocation/first touch
};

/// Measures the FMA peak (best of repeats) and the read bandwidth (median of repeats) using Highway
/// dynamic dispatch (AVX-512 / AVX2 / NEON / SVE...). threads <= 0 means detect_host().logical_cpus.
/// budget_seconds is a target, not a hard limit: ~40% goes to the FMA runs, the rest to bandwidth,
/// but first-touching the bandwidth buffer (up to 1 GiB; 256 MiB when budget < 0.5 s) can alone
/// take 0.3-2 s in a VM, so check seconds_spent. Numbers are only meaningful in optimised builds,
/// on an otherwise idle machine (concurrent load lowers them; FMA takes the best of 4 runs,
/// bandwidth the median of >= 4 runs after a warm-up).
HostMeasurement measure_host(int threads, double budget_seconds = 1.0);

/// Device-description JSON. Every number is an object {"value", "source", "status"}.
/// `m` may be null (no "measured" section then).
nlohmann::json host_to_json(const HostInfo& info, const HostMeasurement* m);

}  // namespace hanpu
