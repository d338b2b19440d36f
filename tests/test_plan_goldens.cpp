// The planner is a function of its arguments (issue 32): the same problem, device description
// and options give the same plan, byte for byte, on every machine. The host descriptions under
// tests/golden/plans are fixed (an AVX2 host, an AVX-512 host, an AVX-512 host with bf16 grams),
// so these plans must not change when the suite runs on a Zen 3, a Zen 4 or a Xeon: a planner that
// probed the machine it runs on (its ISA, its caches, a wisdom file) would fail here on every
// machine unlike the one the goldens were written on. The three hosts also differ from each
// other, so the CPU backend's rules are seen to read the description they are given.
//
// Regenerate after an intended planner change: HANPU_WRITE_PLAN_GOLDENS=1 ctest -R PlanGoldens,
// then review the diff of tests/golden/plans/*.plan.json.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "cpu_plan_testing.hpp"
#include "hanpu/device.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"
#include "plan_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;

struct GoldenCase {
  std::string host;  // tests/golden/plans/host_<host>.json
  Variant variant;
  std::string shape;  // a label for the file name
  std::string strategy;
};

void PrintTo(const GoldenCase& c, std::ostream* os);

Problem shape_problem(Variant v, const std::string& shape) {
  if (shape == "t512_h16") return testing::problem(v, {512}, 16);
  // Odd shape: three sequences of varying length (one of a single token), grouped value heads,
  // head dims that are not powers of two.
  Problem p = testing::problem(v, {70, 1, 200}, 4, 12);
  p.K = 96;
  p.V = 80;
  return p;
}

std::string case_name(const GoldenCase& c) {
  return c.host + "." + variant_name(c.variant) + "." + c.shape + "." + c.strategy;
}

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> cases;
  for (const char* host : {"avx2", "avx512", "avx512_bf16"})
    for (Variant v : {Variant::GDN, Variant::KDA})
      for (const char* shape : {"t512_h16", "varlen_h4_hv12_k96_v80"}) {
        cases.push_back({host, v, shape, "hanpu"});
        // The chunk-parallel baseline the CPU also runs, on one host (its CPU parameters come
        // from the same rules).
        if (std::string(host) == "avx512") cases.push_back({host, v, shape, "fla"});
      }
  return cases;
}

void PrintTo(const GoldenCase& c, std::ostream* os) { *os << case_name(c); }

class PlanGoldens : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(PlanGoldens, ByteIdenticalFromAFixedHostDescription) {
  const GoldenCase& c = GetParam();
  const fs::path dir = testing::golden_dir() / "plans";
  const Device dev = load_device((dir / ("host_" + c.host + ".json")).string());
  ASSERT_EQ(dev.kind, DeviceKind::Cpu);
  // No wisdom: these descriptions are not the host (cpu_plan_options reads wisdom for "host" only).
  ASSERT_NE(dev.name, "host");
  const Plan plan = testing::plan_as_callers_do(shape_problem(c.variant, c.shape), dev, c.strategy);
  const std::string text = plan_to_json(plan).dump(1) + "\n";
  const fs::path golden = dir / (case_name(c) + ".plan.json");
  if (const char* w = std::getenv("HANPU_WRITE_PLAN_GOLDENS"); w && std::string(w) == "1") {
    std::ofstream(golden, std::ios::binary) << text;
    GTEST_SKIP() << "wrote " << golden;
  }
  std::ifstream in(golden, std::ios::binary);
  ASSERT_TRUE(in) << golden << " is missing (HANPU_WRITE_PLAN_GOLDENS=1 writes it)";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(text, expected.str()) << "the plan of " << case_name(c)
                                  << " changed: the planner must depend only on its arguments";
}

INSTANTIATE_TEST_SUITE_P(Grid, PlanGoldens, ::testing::ValuesIn(golden_cases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& i) {
                           std::string n = case_name(i.param);
                           for (char& ch : n)
                             if (ch == '.') ch = '_';
                           return n;
                         });

// The three fixed hosts are planned differently (the rules read the description): lockstep groups
// follow the L2 size, register tiles the ISA.
TEST(PlanGoldensHosts, DifferentDescriptionsGiveDifferentCpuParameters) {
  const fs::path dir = testing::golden_dir() / "plans";
  auto tuning = [&](const std::string& host) {
    const Device dev = load_device((dir / ("host_" + host + ".json")).string());
    return testing::plan_as_callers_do(testing::problem(Variant::GDN, {512}, 16), dev, "hanpu").cpu;
  };
  const CpuTuning avx2 = tuning("avx2"), avx512 = tuning("avx512"), bf16 = tuning("avx512_bf16");
  EXPECT_NE(avx2.gemm_rows.value * 100 + avx2.gemm_vectors.value,
            avx512.gemm_rows.value * 100 + avx512.gemm_vectors.value);
  EXPECT_LT(avx2.lockstep_group.value, avx512.lockstep_group.value);
  EXPECT_LT(avx512.lockstep_group.value, bf16.lockstep_group.value);
}

}  // namespace
}  // namespace hanpu
