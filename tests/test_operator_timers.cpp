// The per-operator timers of the head-fused path (hanpu/operator_timers.hpp): in a default build
// they report "not enabled" and nothing else; in a build with HANPU_OPERATOR_TIMERS (preset
// "timers") they count every (value head, chunk) step and attribute time to the operators.
#include <gtest/gtest.h>

#include <string>

#include "hanpu/la.hpp"
#include "hanpu/operator_timers.hpp"
#include "la_testing.hpp"

namespace hanpu {
namespace {

TEST(OperatorTimes, CountEveryHeadChunkOnlyWhenCompiledIn) {
  testing::ProblemSpec spec;
  spec.variant = Variant::GDN;
  spec.T = 200;  // 4 chunks of 64, the last one a tail of 8
  spec.H = 2;
  spec.HV = 4;   // 4 value heads over 2 threads: whole heads, no column split
  spec.K = spec.V = 64;
  const testing::Problem p = testing::make_problem(spec);
  Tensor o(DType::F32, {1, 200, 4, 64}), state(DType::F32, {1, 4, 64, 64});
  ExecOptions ex;
  ex.threads = 2;
  reset_operator_times();
  gdn_prefill(p.inputs(), spec.opt, LaOutputs{o.view(), state.view()}, ex);
  const OperatorTimes t = read_operator_times();
#ifdef HANPU_OPERATOR_TIMERS
  ASSERT_TRUE(t.enabled);
  EXPECT_FALSE(t.unit.empty());
  EXPECT_EQ(t.head_chunks, 4 * 4);
  ASSERT_EQ(t.per_head_chunk.size(), 9u);
  double gemms = 0, total = 0;
  for (const auto& [name, v] : t.per_head_chunk) {
    EXPECT_GE(v, 0.0) << name;
    total += v;
    if (name == "state GEMMs") gemms = v;
  }
  EXPECT_GT(gemms, 0.0);
  EXPECT_GT(total, gemms);
  reset_operator_times();
  EXPECT_EQ(read_operator_times().head_chunks, 0);
#else
  EXPECT_FALSE(t.enabled);
  EXPECT_EQ(t.head_chunks, 0);
  EXPECT_TRUE(t.per_head_chunk.empty());
#endif
}

}  // namespace
}  // namespace hanpu
