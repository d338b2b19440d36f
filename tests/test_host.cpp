#include <gtest/gtest.h>

#include <sched.h>

#include <cmath>
#include <fstream>
#include <string>

#include "device/host.hpp"

namespace hanpu {
namespace {

void expect_item(const nlohmann::json& j, const std::string& what) {
  ASSERT_TRUE(j.is_object()) << what;
  EXPECT_TRUE(j.contains("value")) << what;
  ASSERT_TRUE(j.contains("source")) << what;
  ASSERT_TRUE(j.contains("status")) << what;
  const std::string st = j["status"].get<std::string>();
  EXPECT_TRUE(st == "detected" || st == "measured" || st == "estimate") << what << ": " << st;
}

TEST(Host, DetectBasics) {
  const HostInfo h = detect_host();
  EXPECT_GE(h.logical_cpus, 1);
  EXPECT_FALSE(h.cpu_model.empty());
  ASSERT_FALSE(h.caches.empty());
  for (const CacheLevel& c : h.caches) {
    EXPECT_GE(c.level, 1);
    EXPECT_GT(c.size_bytes, 0);
    EXPECT_GT(c.line_bytes, 0);
    EXPECT_GE(c.shared_by_cpus, 1);
    EXPECT_GE(c.shared_by_cores, 1);
    EXPECT_LE(c.shared_by_cores, c.shared_by_cpus);
    EXPECT_FALSE(c.source.empty());
  }
  EXPECT_GT(h.l1d_bytes(), 0);
  EXPECT_GT(h.l2_bytes(), 0);
  EXPECT_GE(h.l2_bytes(), h.l1d_bytes());
  // l3_bytes() is the per-core share of the level-3 data/unified cache, 0 without one.
  const CacheLevel* l3 = h.data_cache(3);
  EXPECT_EQ(h.l3_bytes(), l3 ? l3->size_bytes / l3->shared_by_cores : 0);
  EXPECT_FALSE(h.simd_target.empty());
  EXPECT_GE(h.simd_f32_lanes, 1);
}

// Detection against the OS read independently here: the CPUs this process may run on
// (sched_getaffinity), the "model name" of /proc/cpuinfo, and every data or unified cache level
// sysfs lists for cpu0 (its size and line).
TEST(Host, DetectMatchesTheOs) {
  const HostInfo h = detect_host();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(h.logical_cpus, CPU_COUNT(&set));
  EXPECT_EQ(h.logical_cpus_source, "sysconf");

  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model;
  while (model.empty() && std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 1);
      model.erase(0, model.find_first_not_of(" \t"));
    }
  if (!model.empty()) EXPECT_EQ(h.cpu_model, model);

  int levels_seen = 0;
  for (int index = 0;; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    if (!level_file) break;
    int level = 0;
    std::string type, size;
    level_file >> level;
    type_file >> type;
    size_file >> size;
    if (type == "Instruction" || size.empty()) continue;
    // sysfs writes sizes as "48K" or "32768K" (KiB) or "1M".
    int64_t bytes = std::stoll(size);
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    const CacheLevel* c = h.data_cache(level);
    ASSERT_NE(c, nullptr) << "sysfs lists a level-" << level << " " << type << " cache";
    EXPECT_EQ(c->size_bytes, bytes) << "level " << level;
    EXPECT_EQ(c->source, "sysfs") << "level " << level;
    ++levels_seen;
  }
  if (levels_seen == 0) GTEST_SKIP() << "no cache levels in /sys/devices/system/cpu/cpu0/cache on this machine";
}

TEST(Host, MeasureSmallBudget) {
  const HostMeasurement m = measure_host(0, 0.2);
  EXPECT_EQ(m.threads, detect_host().logical_cpus);
  EXPECT_TRUE(std::isfinite(m.fma_peak_gflops_1thread));
  EXPECT_TRUE(std::isfinite(m.fma_peak_gflops_all));
  EXPECT_TRUE(std::isfinite(m.mem_bandwidth_gbs));
  EXPECT_GT(m.fma_peak_gflops_1thread, 0.0);
  EXPECT_GT(m.fma_peak_gflops_all, 0.0);
  EXPECT_GT(m.mem_bandwidth_gbs, 0.0);
  EXPECT_GT(m.bandwidth_buffer_bytes, 0);
  EXPECT_GT(m.seconds_spent, 0.0);
  EXPECT_GE(m.fma_peak_gflops_all, 0.8 * m.fma_peak_gflops_1thread);
}

TEST(Host, MeasureOneThread) {
  const HostMeasurement m = measure_host(1, 0.1);
  EXPECT_EQ(m.threads, 1);
  EXPECT_GT(m.fma_peak_gflops_1thread, 0.0);
  EXPECT_DOUBLE_EQ(m.fma_peak_gflops_all, m.fma_peak_gflops_1thread);
  EXPECT_GT(m.mem_bandwidth_gbs, 0.0);
}

TEST(Host, JsonKeys) {
  const HostInfo h = detect_host();
  const nlohmann::json j0 = host_to_json(h, nullptr);
  EXPECT_FALSE(j0.contains("measured"));
  expect_item(j0["cpu_model"], "cpu_model");
  expect_item(j0["logical_cpus"], "logical_cpus");
  EXPECT_EQ(j0["logical_cpus"]["value"].get<int>(), h.logical_cpus);
  expect_item(j0["simd"]["target"], "simd.target");
  expect_item(j0["simd"]["f32_lanes"], "simd.f32_lanes");
  ASSERT_TRUE(j0["caches"].is_array());
  EXPECT_EQ(j0["caches"].size(), h.caches.size());
  for (const auto& c : j0["caches"]) {
    EXPECT_TRUE(c.contains("level"));
    EXPECT_TRUE(c.contains("type"));
    expect_item(c["size_bytes"], "cache.size_bytes");
    expect_item(c["line_bytes"], "cache.line_bytes");
    expect_item(c["shared_by_cpus"], "cache.shared_by_cpus");
  }
  for (const char* k : {"l1d_bytes", "l2_bytes", "l3_bytes"}) expect_item(j0["per_core"][k], k);
  EXPECT_EQ(j0["per_core"]["l2_bytes"]["value"].get<int64_t>(), h.l2_bytes());

  HostMeasurement m;
  m.fma_peak_gflops_1thread = 100;
  m.fma_peak_gflops_all = 200;
  m.threads = 2;
  m.mem_bandwidth_gbs = 10;
  m.bandwidth_buffer_bytes = 1 << 20;
  m.seconds_spent = 0.5;
  const nlohmann::json j1 = host_to_json(h, &m);
  ASSERT_TRUE(j1.contains("measured"));
  for (const char* k : {"threads", "fma_peak_gflops_1thread", "fma_peak_gflops_all", "mem_bandwidth_gbs",
                        "bandwidth_buffer_bytes", "seconds_spent"}) {
    expect_item(j1["measured"][k], k);
    EXPECT_EQ(j1["measured"][k]["source"], "measured") << k;
    EXPECT_EQ(j1["measured"][k]["status"], "measured") << k;
  }
  EXPECT_DOUBLE_EQ(j1["measured"]["fma_peak_gflops_all"]["value"].get<double>(), 200.0);
}

}  // namespace
}  // namespace hanpu
