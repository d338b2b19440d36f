// The simulator: compulsory traffic of the HA-NPU plan with unlimited buffers (to the byte), exact
// MAC accounting, physical lower bounds on latency, launch costs, timelines, peak GM memory, and
// every tail case simulated under every strategy.
#include <gtest/gtest.h>


#include "cpu_plan_testing.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/simulate.hpp"
#include "plan_testing.hpp"

namespace hanpu {
namespace {

using testing::ascend310p;
using testing::compulsory_traffic;
using testing::problem;
using testing::unlimited_buffers;

TEST(Simulate, HanpuMovesOnlyCompulsoryTrafficWithUnlimitedBuffers) {
  const Device dev = unlimited_buffers(ascend310p());
  // Whole-head mappings (value heads a multiple of the cores, q/k heads = value heads): every
  // input is read once. Tails (T not a multiple of the chunk) and the state flags included.
  // The 310P default has the paper's 10 cores: 10, 20, 30 and 40 items are whole heads, for GDN
  // and KDA alike.
  std::vector<Problem> ps = {problem(Variant::GDN, {4096}, 20), problem(Variant::KDA, {1000}, 10), problem(Variant::GDN, {130, 64, 3}, 10),
                             problem(Variant::KDA, {777, 1}, 20), problem(Variant::GDN, {1024}, 30),
                             problem(Variant::KDA, {1024}, 30),     problem(Variant::GDN, {640}, 40),
                             problem(Variant::KDA, {640}, 40)};
  ps[2].read_initial_state = false;
  ps[3].write_final_state = false;
  for (const Problem& p : ps) {
    const SimResult r = simulate(testing::plan_as_callers_do(p, dev, "hanpu"), dev);
    const auto c = compulsory_traffic(p);
    EXPECT_EQ(r.gm_read_bytes, c.read) << variant_name(p.variant) << " T=" << p.total_tokens();
    EXPECT_EQ(r.gm_write_bytes, c.write) << variant_name(p.variant) << " T=" << p.total_tokens();
    EXPECT_EQ(r.peak_gm_bytes, c.read + c.write);
    EXPECT_EQ(r.spill_bytes, 0);
  }
}

class SimulateVariant : public ::testing::TestWithParam<Variant> {};

TEST_P(SimulateVariant, HanpuFitsThe310pWithoutExtraTraffic) {
  // Head counts that are multiples of the core count, on the default (10 cores) and on the
  // 8-core configuration.
  const Device ten = ascend310p();
  const Device eight = device_with_cores(ten, 8);
  const Variant v = GetParam();
  for (const auto& [dev, heads] : {std::pair{&ten, int64_t{20}}, std::pair{&eight, int64_t{16}}}) {
    const Problem p = problem(v, {4096}, heads);
    const SimResult r = simulate(testing::plan_as_callers_do(p, *dev, "hanpu"), *dev);
    EXPECT_EQ(r.gm_read_bytes, compulsory_traffic(p).read) << heads;
    EXPECT_EQ(r.gm_write_bytes, compulsory_traffic(p).write) << heads;
  }
}

TEST(Simulate, TheCoreConfigurationSetsTheClock) {
  // 16 heads: on 8 cores whole heads; on the paper's 10 cores 6 tail heads split by columns, whose
  // blocks re-read q and k (the paper's head-mapping example).
  const Device ten = ascend310p();
  const Device eight = device_with_cores(ten, 8);
  const Problem p = problem(Variant::GDN, {1024}, 16);
  const SimResult r10 = simulate(testing::plan_as_callers_do(p, ten, "hanpu"), ten);
  const SimResult r8 = simulate(testing::plan_as_callers_do(p, eight, "hanpu"), eight);
  EXPECT_GT(r10.gm_read_bytes, compulsory_traffic(p).read);
  EXPECT_EQ(r8.gm_read_bytes, compulsory_traffic(p).read);
  // A plan for 8 cores simulated with the default file runs at the 8-core set's clock.
  PlanOptions o;
  o.cores = 8;
  const SimResult via_default = simulate(testing::plan_as_callers_do(p, ten, "hanpu", o), ten);
  EXPECT_DOUBLE_EQ(via_default.latency_s, r8.latency_s);
  // Utilization is against each set's own peak, and the two peaks are the same chip peak.
  EXPECT_NEAR(8 * eight.clock_ghz.value, 10 * ten.clock_ghz.value, 0.01);
}

TEST(Simulate, BaselinesMoveMoreThanCompulsory) {
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {2048}, 16);
  const auto c = compulsory_traffic(p);
  for (const char* s : {"vllm-ascend", "fla", "fla-megakernel", "flashqla"}) {
    const SimResult r = simulate(testing::plan_as_callers_do(p, dev, s), dev);
    EXPECT_GT(r.gm_read_bytes + r.gm_write_bytes, c.read + c.write) << s;
    EXPECT_GT(r.peak_gm_bytes, c.read + c.write) << s;
  }
  // FLA materializes at least the per-chunk states h (fp16 K x V per chunk and head).
  const SimResult fla = simulate(testing::plan_as_callers_do(p, dev, "fla"), dev);
  EXPECT_GE(fla.gm_intermediate_bytes, 32 * 16 * 128 * 128 * 2);
}

TEST(Simulate, MacsAreTheGraphsAndLatencyRespectsPhysicalBounds) {
  const Device dev = ascend310p();
  const double rate = dev.matrix.macs_per_cycle.at(DType::F16).value * dev.clock_ghz.value * 1e9;
  for (const std::string& s : strategy_names()) {
    const Problem p = problem(Variant::KDA, {1500}, 20);
    const Plan plan = testing::plan_as_callers_do(p, dev, s);
    const SimResult r = simulate(plan, dev);
    if (s == "hanpu" || s == "fla" || s == "vllm-ascend") EXPECT_DOUBLE_EQ(r.macs, layer_macs(p, plan.form)) << s;
    EXPECT_GE(r.executed_macs, r.macs);
    // No faster than the matrix unit of every core together, nor than GM's shared bandwidth.
    EXPECT_GE(r.latency_s, r.executed_macs / rate / plan.cores) << s;
    const double gm_bw = dev.path("GM", "L1").bandwidth_gbs.value * 1e9;
    EXPECT_GE(r.latency_s * 1.0000001, static_cast<double>(r.gm_read_bytes) / gm_bw / 1.0) << s;
    EXPECT_GT(r.matrix_utilization, 0);
    EXPECT_LT(r.matrix_utilization, 1);
    EXPECT_NEAR(r.energy_j, r.dynamic_energy_j + dev.static_power_w.value * r.latency_s, 1e-12);
  }
}

TEST(Simulate, LatencyScalesWithLength) {
  const Device dev = ascend310p();
  // The per-kernel fixed costs (launch, boundary) do not grow with T; the rest does, linearly.
  auto variable = [&](int64_t T) {
    const SimResult r = simulate(testing::plan_as_callers_do(problem(Variant::GDN, {T}, 16), dev, "hanpu"), dev);
    return r.latency_s - r.fixed_cost_s.at("launch") - r.fixed_cost_s.at("kernel_boundary");
  };
  EXPECT_NEAR(variable(4096) / variable(2048), 2.0, 0.1);
}

TEST(Simulate, MegakernelSavesExactlyTheLaunches) {
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1024}, 16);
  const SimResult fla = simulate(testing::plan_as_callers_do(p, dev, "fla"), dev);
  const SimResult mk = simulate(testing::plan_as_callers_do(p, dev, "fla-megakernel"), dev);
  EXPECT_EQ(fla.gm_read_bytes, mk.gm_read_bytes);
  EXPECT_NEAR(fla.latency_s - mk.latency_s, (fla.kernels.size() - 1) * dev.kernel_launch_us.value * 1e-6, 1e-12);
}

TEST(Simulate, TimelineLanesNeverOverlap) {
  const Device dev = ascend310p();
  SimOptions o;
  o.timeline = true;
  o.timeline_chunks = 3;
  const SimResult r = simulate(testing::plan_as_callers_do(problem(Variant::GDN, {1024}, 16), dev, "hanpu"), dev, o);
  ASSERT_FALSE(r.timeline.empty());
  std::map<std::pair<int, std::string>, double> lane_end;
  std::set<std::string> lanes;
  for (const TimelineEvent& e : r.timeline) {
    EXPECT_LE(e.start_s, e.end_s);
    EXPECT_LE(e.end_s, r.latency_s);
    double& end = lane_end[{e.core, e.lane}];
    EXPECT_GE(e.start_s, end - 1e-15) << "core " << e.core << " lane " << e.lane;
    end = e.end_s;
    lanes.insert(e.lane);
  }
  EXPECT_TRUE(lanes.count("matrix") && lanes.count("vector") && lanes.count("MTE2"));
}

TEST(Simulate, EveryTailCaseUnderEveryStrategy) {
  const Device dev = ascend310p();
  struct Case {
    Problem p;
    int cores;
  };
  const std::vector<Case> cases = {{problem(Variant::GDN, {1000}, 4), 8},     {problem(Variant::KDA, {700}, 9), 8},
                                   {problem(Variant::GDN, {2048}, 1), 16},    {problem(Variant::KDA, {300}, 11), 10},
                                   {problem(Variant::GDN, {15, 1000, 64}, 2, 4), 8}};
  for (const Case& c : cases) {
    auto names = strategy_names();
    for (const auto& a : ablation_names()) names.push_back(a);
    for (const std::string& s : names) {
      PlanOptions o;
      o.cores = c.cores;
      const SimResult r = simulate(testing::plan_as_callers_do(c.p, dev, s, o), dev);
      EXPECT_GT(r.latency_s, 0) << s;
      EXPECT_GE(r.gm_read_bytes, compulsory_traffic(c.p).read) << s;
      EXPECT_GE(r.gm_write_bytes, compulsory_traffic(c.p).write) << s;
    }
  }
}

TEST(Simulate, JsonCarriesTheReportedFields) {
  const Device dev = ascend310p();
  const SimResult r = simulate(testing::plan_as_callers_do(problem(Variant::GDN, {512}, 16), dev, "fla"), dev);
  const nlohmann::json j = sim_result_to_json(r, true);
  for (const char* key : {"strategy", "variant", "T", "heads", "latency_ms", "energy_mj", "gm_read_bytes", "gm_write_bytes",
                          "l1_to_l0_bytes", "ub_l1_bytes", "macs", "matrix_utilization", "peak_bytes", "peak_gm_bytes",
                          "per_operator", "per_kernel"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["strategy"], "fla");
  EXPECT_EQ(j["T"], 512);
  EXPECT_DOUBLE_EQ(j["latency_ms"].get<double>(), r.latency_s * 1e3);
  EXPECT_TRUE(j["peak_bytes"].contains("UB"));
  // Per-operator GM bytes add up to the totals.
  int64_t read = 0;
  for (const auto& o : j["per_operator"]) read += o["gm_read_bytes"].get<int64_t>();
  EXPECT_EQ(read, r.gm_read_bytes);
}

TEST(Simulate, FinalStatesAreWrittenOnceInFp32UnderEveryStrategy) {
  // Tier 3 (11 heads on 10 cores) stores per-chunk state snapshots in fp16; the final state must
  // still be written in fp32, once per (sequence, head).
  const Device dev = ascend310p();
  PlanOptions o;
  o.cores = 10;
  const Problem p = problem(Variant::GDN, {300}, 11);
  auto names = strategy_names();
  for (const auto& a : ablation_names()) names.push_back(a);
  for (const std::string& s : names) {
    SimOptions so;
    const SimResult r = simulate(testing::plan_as_callers_do(p, dev, s, o), dev, so);
    int64_t final_bytes = 0;
    for (const OperatorStats& st : r.per_operator)
      if (st.op == "state_out") final_bytes += st.gm_write_bytes;
    EXPECT_EQ(final_bytes, 11 * 128 * 128 * 4) << s;
  }
}

TEST(Simulate, DeviceWhoseUnitsShareOneBuffer) {
  // A CPU-like device: the "matrix unit" (FMA) reads and writes the vector unit's buffer, fp32.
  Device dev = unlimited_buffers(ascend310p());
  dev.matrix.input_a = dev.matrix.input_b = dev.matrix.output = dev.vector.buffer;
  dev.matrix.macs_per_cycle.erase(DType::F16);
  dev.matrix.macs_per_cycle[DType::F32] = dev.vector.lanes.at(DType::F32);
  const Problem p = problem(Variant::KDA, {1000}, 10);
  for (const std::string& s : strategy_names()) {
    const SimResult r = simulate(testing::plan_as_callers_do(p, dev, s), dev);
    EXPECT_GT(r.latency_s, 0) << s;
    if (s == "hanpu") {
      EXPECT_EQ(r.gm_read_bytes, compulsory_traffic(p).read);
      EXPECT_EQ(r.gm_write_bytes, compulsory_traffic(p).write);
    }
  }
}

TEST(Simulate, RejectsAPlanForAnotherDevice) {
  Device dev = ascend310p();
  const Plan plan = testing::plan_as_callers_do(problem(Variant::GDN, {256}, 16), dev, "hanpu");
  dev.name = "other";
  EXPECT_THROW(simulate(plan, dev), Error);
}

// Every strategy's plan simulates in work that does not grow with T once the timing is periodic
// (the report sweeps ~72 shapes x every strategy, and `--strategies all` at T = 1M must answer):
// a bound on the stepped rounds per item, not a wall-clock limit (a timed version failed under
// ASan on a loaded 2-core machine; the simulator's speed is a benchmark: docs/SIMULATION.md).
TEST(Simulate, EveryStrategyStepsAFewRoundsPerItem) {
  const Device dev = ascend310p();
  const int64_t T = 65536, chunk_rounds = T / 64;  // per sequence and head
  for (const std::string& s : strategy_names()) {
    SCOPED_TRACE(s);
    const Plan plan = testing::plan_as_callers_do(problem(Variant::KDA, {T}, 32), dev, s);
    const SimResult r = simulate(plan, dev);
    EXPECT_GT(r.latency_s, 0);
    int64_t items = 0;  // an upper bound on the lockstep groups
    for (const auto& k : plan.kernels)
      for (const auto& core : k.cores) items += static_cast<int64_t>(core.size());
    // Measured 5 to 12.4 rounds per item (hanpu's lockstep groups take the longest to settle
    // with the fixed costs), against 1,024 chunk rounds per sequence and head without the shortcut.
    EXPECT_LE(r.simulated_rounds, 16 * items) << "of " << chunk_rounds << " chunk rounds per sequence and head";
  }
}


// The steady-state shortcut accounts periodic rounds as multiples: its totals must be the chunk
// loop's (integers to the byte, times and energies up to floating-point rounding).
void expect_same_totals(const SimResult& fast, const SimResult& loop, const std::string& what) {
  SCOPED_TRACE(what);
  const double tol = 1e-9;
  EXPECT_NEAR(fast.latency_s, loop.latency_s, tol * loop.latency_s);
  EXPECT_NEAR(fast.energy_j, loop.energy_j, tol * loop.energy_j);
  EXPECT_EQ(fast.gm_read_bytes, loop.gm_read_bytes);
  EXPECT_EQ(fast.gm_write_bytes, loop.gm_write_bytes);
  EXPECT_EQ(fast.l1_to_l0_bytes, loop.l1_to_l0_bytes);
  EXPECT_EQ(fast.ub_l1_bytes, loop.ub_l1_bytes);
  EXPECT_EQ(fast.spill_bytes, loop.spill_bytes);
  EXPECT_EQ(fast.transform_bytes, loop.transform_bytes);
  EXPECT_EQ(fast.bytes_per_path, loop.bytes_per_path);
  EXPECT_NEAR(fast.macs, loop.macs, tol * loop.macs);
  EXPECT_NEAR(fast.executed_macs, loop.executed_macs, tol * loop.executed_macs);
  EXPECT_NEAR(fast.vector_ops, loop.vector_ops, tol * loop.vector_ops);
  ASSERT_EQ(fast.busy_s.size(), loop.busy_s.size());
  for (const auto& [lane, s] : loop.busy_s) EXPECT_NEAR(fast.busy_s.at(lane), s, tol * s) << lane;
  ASSERT_EQ(fast.kernels.size(), loop.kernels.size());
  for (size_t k = 0; k < loop.kernels.size(); ++k)
    EXPECT_NEAR(fast.kernels[k].latency_s, loop.kernels[k].latency_s, tol * loop.kernels[k].latency_s) << loop.kernels[k].name;
  ASSERT_EQ(fast.per_operator.size(), loop.per_operator.size());
  for (size_t o = 0; o < loop.per_operator.size(); ++o) {
    EXPECT_EQ(fast.per_operator[o].gm_read_bytes, loop.per_operator[o].gm_read_bytes) << loop.per_operator[o].op;
    EXPECT_NEAR(fast.per_operator[o].busy_s, loop.per_operator[o].busy_s, tol * loop.per_operator[o].busy_s) << loop.per_operator[o].op;
  }
}

TEST(Simulate, SteadyStateShortcutEqualsTheChunkLoop) {
  const Device ten = ascend310p();
  const Device eight = device_with_cores(ten, 8);
  SimOptions loop;
  loop.steady_state_shortcut = false;
  // Tails (T not a multiple of 64), one chunk, two chunks, varlen, tier-2 column blocks and
  // tier-3 heads (11 on 10 cores), every strategy and ablation step.
  const std::vector<std::pair<Problem, const Device*>> cases = {
      {problem(Variant::GDN, {4096}, 16), &ten},     {problem(Variant::KDA, {1000}, 20), &ten},
      {problem(Variant::GDN, {2500}, 11), &ten},     {problem(Variant::KDA, {64}, 8), &eight},
      {problem(Variant::GDN, {128}, 8), &eight},     {problem(Variant::GDN, {700, 64, 1900}, 2, 4), &ten},
      {problem(Variant::KDA, {3000}, 16), &eight}};
  auto names = strategy_names();
  for (const auto& a : ablation_names()) names.push_back(a);
  for (const auto& [p, dev] : cases)
    for (const std::string& s : names) {
      const Plan plan = testing::plan_as_callers_do(p, *dev, s);
      expect_same_totals(simulate(plan, *dev), simulate(plan, *dev, loop),
                         s + " " + variant_name(p.variant) + " T=" + std::to_string(p.total_tokens()) + " HV=" + std::to_string(p.HV));
    }
}

TEST(Simulate, SteadyStateShortcutEqualsTheLoopWithLockstepGroups) {
  // The host CPU's plans run items in lockstep groups (rounds of several items).
  const Device host = host_device(2, 0.0);
  SimOptions loop;
  loop.steady_state_shortcut = false;
  for (const Problem& p : {problem(Variant::GDN, {2000}, 6), problem(Variant::KDA, {1100, 300}, 4)}) {
    const Plan plan = testing::plan_as_callers_do(p, host, "hanpu");
    expect_same_totals(simulate(plan, host), simulate(plan, host, loop), variant_name(p.variant));
  }
}

// T = 1M must not cost work proportional to T: the steady-state shortcut steps a few rounds per
// core and group and accounts the rest (its totals equal the chunk loop's: tested above). A count,
// not a wall-clock limit (the time is a benchmark: docs/SIMULATION.md).
TEST(Simulate, AMillionTokensStepOnlyAFewRounds) {
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1 << 20}, 16);
  const Plan plan = testing::plan_as_callers_do(p, dev, "hanpu");
  const SimResult r = simulate(plan, dev);
  EXPECT_GT(r.latency_s, 0);
  int64_t items = 0;  // an upper bound on the lockstep groups
  for (const auto& k : plan.kernels)
    for (const auto& core : k.cores) items += static_cast<int64_t>(core.size());
  const int64_t chunk_rounds = (int64_t{1} << 20) / 64;  // per item
  // (8 per item before the fixed costs; with them the timing takes a few rounds more to settle.)
  EXPECT_LE(r.simulated_rounds, 12 * items) << "of " << chunk_rounds << " rounds per item";
  SimOptions loop;
  loop.steady_state_shortcut = false;
  const SimResult slow = simulate(testing::plan_as_callers_do(problem(Variant::GDN, {1 << 14}, 16), dev, "hanpu"), dev, loop);
  EXPECT_GE(slow.simulated_rounds, (int64_t{1} << 14) / 64) << "without the shortcut every round is stepped";
}

TEST(Simulate, BaselinesExecuteFullTilesHanpuBlockTriangles) {
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1024}, 20);
  const OpGraph g = make_op_graph(Variant::GDN, GraphForm::WU, false);
  // One 64-token chunk of K K^T: 4 x 4 tiles of 16 x 16 when masked afterwards, 10 of them as a
  // block triangle; the useful count is the strict triangle either way.
  const OpCounts full = op_counts(g, g.op(OpId::Kkt), 64, 128, 128, 16, true);
  const OpCounts tri = op_counts(g, g.op(OpId::Kkt), 64, 128, 128, 16, false);
  EXPECT_EQ(full.executed_macs, 16.0 * 256 * 128);
  EXPECT_EQ(tri.executed_macs, 10.0 * 256 * 128);
  EXPECT_EQ(full.macs, tri.macs);
  EXPECT_EQ(full.macs, 64.0 * 63 / 2 * 128);
  for (const std::string& s : strategy_names()) {
    const Plan plan = testing::plan_as_callers_do(p, dev, s);
    const SimResult r = simulate(plan, dev);
    for (const Kernel& k : plan.kernels) EXPECT_EQ(k.masked_full_tiles, s != "hanpu") << s << " " << k.name;
    // Utilization from executed MACs, the useful fraction beside it.
    EXPECT_GT(r.matrix_utilization, r.useful_matrix_utilization) << s;
    EXPECT_NEAR(r.matrix_utilization / r.useful_matrix_utilization, r.executed_macs / r.macs, 1e-12) << s;
    // The same plan with block triangles executes fewer MACs when it has triangular products.
    if (s != "hanpu") {
      Plan tri_plan = plan;
      for (Kernel& k : tri_plan.kernels) k.masked_full_tiles = false;
      const SimResult rt = simulate(tri_plan, dev);
      EXPECT_LT(rt.executed_macs, r.executed_macs) << s;
      EXPECT_EQ(rt.macs, r.macs) << s;
    }
  }
}


TEST(Simulate, TransformsAndHandOffsCostWhatTheDeviceSays) {
  const Device dev = ascend310p();
  ASSERT_EQ(dev.vector.transform_row_elements.value, 16);
  ASSERT_EQ(dev.vector.transform_row_elements.status, "estimate");
  ASSERT_GT(dev.handoff_sync_cycles.value, 0);
  // One transform of 64 x 128 elements: 8192 / 16 per cycle.
  EXPECT_DOUBLE_EQ(transform_seconds(dev, 8192), 8192 / 16.0 / (dev.clock_ghz.value * 1e9));
  const Problem p = problem(Variant::GDN, {1024}, 10);
  const Plan dense = testing::plan_as_callers_do(p, dev, "fla+mapping+reordering");  // every tensor dense: transforms
  // Without the sync cost and with transforms at the lane width, the same plan is faster.
  Device free_handoffs = dev;
  free_handoffs.handoff_sync_cycles.value = 0;
  Device wide_transforms = dev;
  wide_transforms.vector.transform_row_elements.value = dev.vector.lanes.at(DType::F32).value;
  const SimResult r = simulate(dense, dev);
  EXPECT_LT(simulate(dense, free_handoffs).latency_s, r.latency_s);
  EXPECT_LT(simulate(dense, wide_transforms).latency_s, r.latency_s);
  EXPECT_GT(r.transform_bytes, 0);
  // Layout planning exists to remove transforms: it must win on a device where they are costly.
  EXPECT_LT(simulate(testing::plan_as_callers_do(p, dev, "hanpu"), dev).latency_s, r.latency_s);
}


TEST(Simulate, EveryStrategyOnAnXdnaDevice) {
  // AIE-ML: bf16 matrix work on the vector processor's own data memory (one buffer for both
  // units, nothing staged), 5 array columns as cores.
  const Device dev = load_device(testing::device_path("xdna-phoenix"));
  EXPECT_EQ(dev.matrix.input_a, dev.vector.buffer);
  EXPECT_TRUE(dev.matrix.runs_on_vector_unit);
  // One issue lane for matrix and vector work: no "matrix" lane in the results.
  const SimResult one = simulate(testing::plan_as_callers_do(problem(Variant::GDN, {256}, 5), dev, "hanpu"), dev);
  EXPECT_EQ(one.busy_s.count("matrix"), 0u);
  EXPECT_GT(one.busy_s.at("vector"), 0);
  EXPECT_TRUE(dev.matrix.macs_per_cycle.count(DType::BF16));
  for (Variant v : testing::every_variant())
    for (const std::string& s : testing::every_strategy()) {
      const Problem p = problem(v, {1000}, 10);
      const SimResult r = simulate(testing::plan_as_callers_do(p, dev, s), dev);
      EXPECT_GT(r.latency_s, 0) << s;
      EXPECT_EQ(r.l1_to_l0_bytes, 0) << s;  // no operand staging level
      // 10 heads on 5 columns: whole heads, and with the reordering pass's order both variants'
      // live sets fit the column's 256 KiB: only compulsory traffic.
      if (s == "hanpu") {
        EXPECT_EQ(r.gm_read_bytes, compulsory_traffic(p).read) << variant_name(v);
        EXPECT_EQ(r.gm_write_bytes, compulsory_traffic(p).write) << variant_name(v);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed costs: each charged per event, so a plan with fewer events gains exactly by the constant.

// The plan with only kernel `ki` of `full` (simulated alone; simulate() does not validate plans).
Plan only_kernel(const Plan& full, size_t ki) {
  Plan p = full;
  p.kernels = {full.kernels[ki]};
  return p;
}

double summed_busy(const SimResult& r) {
  double s = 0;
  for (const auto& [lane, t] : r.busy_s) s += t;
  return s;
}

TEST(FixedCosts, EveryKernelPaysItsBoundaryAndEveryLaunchedOneItsLaunch) {
  const Device dev = ascend310p();
  ASSERT_GT(dev.kernel_boundary_us.value, 0);
  const Problem p = problem(Variant::GDN, {1024}, 16);
  Device more = dev;
  more.kernel_boundary_us.value += 7;
  more.kernel_launch_us.value += 3;
  for (const char* s : {"fla", "fla-megakernel", "vllm-ascend", "hanpu", "flashqla"}) {
    const Plan plan = testing::plan_as_callers_do(p, dev, s);
    const SimResult a = simulate(plan, dev), b = simulate(plan, more);
    size_t launched = 0;
    for (const Kernel& k : plan.kernels) launched += k.launch ? 1 : 0;
    // Exactly: the boundary of every kernel (megakernel phases too), the launch of launched ones.
    EXPECT_NEAR(b.latency_s - a.latency_s, (plan.kernels.size() * 7 + launched * 3) * 1e-6, 1e-12) << s;
    EXPECT_EQ(a.fixed_cost_events.at("kernel_boundaries"), static_cast<double>(plan.kernels.size())) << s;
    EXPECT_EQ(a.fixed_cost_events.at("launches"), static_cast<double>(launched)) << s;
    EXPECT_NEAR(a.fixed_cost_s.at("kernel_boundary"), plan.kernels.size() * dev.kernel_boundary_us.value * 1e-6, 1e-15) << s;
  }
  // The megakernel keeps FLA's traffic and its boundaries and drops the launches after the first.
  const SimResult fla = simulate(testing::plan_as_callers_do(p, dev, "fla"), dev), mk = simulate(testing::plan_as_callers_do(p, dev, "fla-megakernel"), dev);
  EXPECT_EQ(fla.gm_read_bytes + fla.gm_write_bytes, mk.gm_read_bytes + mk.gm_write_bytes);
  EXPECT_EQ(fla.fixed_cost_events.at("kernel_boundaries"), mk.fixed_cost_events.at("kernel_boundaries"));
  EXPECT_EQ(mk.fixed_cost_events.at("launches"), 1);
}

TEST(FixedCosts, PerStepCostsAreChargedOncePerEvent) {
  // FLA's first kernel alone (chunk-parallel, every step in every chunk): the events are its
  // steps times its items' chunks, and each constant adds exactly events x constant of busy time.
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1000}, 16);  // a tail chunk too
  const Plan fla = testing::plan_as_callers_do(p, dev, "fla");
  int checked = 0;
  for (size_t ki = 0; ki < fla.kernels.size(); ++ki) {
    const Kernel& k = fla.kernels[ki];
    if (k.parallel != Parallel::Chunk) continue;
    bool every = true;
    for (const Step& st : k.steps) every = every && st.when == StepWhen::Every;
    if (!every) continue;
    const Plan one = only_kernel(fla, ki);
    ++checked;
    const OpGraph g = one.graph();
    int64_t chunks = 0;
    for (const auto& items : k.cores)
      for (const PlanItem& it : items) chunks += it.chunk1 - it.chunk0;
    double moves = 0, computes = 0, vector_steps = 0;
    bool only_l_rows_or_states = true;  // then the segment count below is exact
    for (const Step& st : k.steps) {
      if (st.kind == StepKind::Move) {
        moves += 1;
        const TensorDef& t = g.tensor(st.tensor);
        if (st.path.rfind("GM->", 0) == 0 || st.path.find("->GM") != std::string::npos)
          only_l_rows_or_states = only_l_rows_or_states && (t.rows == "L" || (t.rows == "K" && t.cols == "V"));
      } else {
        if (st.kind == StepKind::Compute) computes += 1;
        if (st.lane == StepLane::Vector) vector_steps += 1;
      }
    }
    const SimResult r = simulate(one, dev);
    const double n = static_cast<double>(chunks);
    EXPECT_EQ(r.fixed_cost_events.at("dma_transfers"), moves * n) << k.name;
    EXPECT_EQ(r.fixed_cost_events.at("operator_syncs"), computes * n) << k.name;
    EXPECT_EQ(r.fixed_cost_events.at("vector_sequences"), vector_steps * n) << k.name;
    // Segments: (rows - 1) per GM transfer of an L-row tile ([T, H, ...] rows strided by the
    // heads; L is the chunk or the tail); a whole K x V block (items cover all columns) is one.
    double want_segments = 0;
    for (const Step& st : k.steps) {
      if (st.kind != StepKind::Move || !(st.path.rfind("GM->", 0) == 0 || st.path.find("->GM") != std::string::npos)) continue;
      const TensorDef& t = g.tensor(st.tensor);
      if (t.rows != "L") continue;
      for (const auto& items : k.cores)
        for (const PlanItem& it : items)
          for (int64_t c = it.chunk0; c < it.chunk1; ++c) want_segments += static_cast<double>(p.chunk_len(it.seq, c) - 1);
    }
    if (only_l_rows_or_states) EXPECT_EQ(r.fixed_cost_events.at("gm_segments"), want_segments) << k.name;
    // Each constant adds exactly its events' worth of busy time.
    const double hz = dev.clock_ghz.value * 1e9;
    for (auto [field, events] : {std::pair{&Device::dma_setup_cycles, "dma_transfers"}, std::pair{&Device::pipe_sync_cycles, "operator_syncs"},
                                 std::pair{&Device::vector_startup_cycles, "vector_sequences"}, std::pair{&Device::gm_segment_cycles, "gm_segments"}}) {
      Device more = dev;
      (more.*field).value += 50;
      const SimResult m = simulate(one, more);
      EXPECT_NEAR(summed_busy(m) - summed_busy(r), r.fixed_cost_events.at(events) * 50 / hz, 1e-12) << k.name << " " << events;
      EXPECT_GE(m.latency_s, r.latency_s) << k.name << " " << events;
    }
  }
  EXPECT_GE(checked, 4);  // cumsum, K K^T, solve_tril, recompute_w_u, fwd_o
}

TEST(FixedCosts, FusingSavesTransfersSyncsAndBoundaries) {
  // The mechanism behind the mapping step: one fused head-mapped kernel issues far fewer DMA
  // transfers than FLA's six kernels (no intermediate round trips, no per-chunk states), and
  // pays one boundary instead of six.
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1024}, 16);
  const SimResult fla = simulate(testing::plan_as_callers_do(p, dev, "fla"), dev);
  const SimResult mapped = simulate(testing::plan_as_callers_do(p, dev, "fla+mapping"), dev);
  EXPECT_LT(mapped.fixed_cost_events.at("dma_transfers"), fla.fixed_cost_events.at("dma_transfers"));
  EXPECT_LT(mapped.fixed_cost_events.at("gm_segments"), fla.fixed_cost_events.at("gm_segments"));
  EXPECT_LT(mapped.fixed_cost_events.at("kernel_boundaries"), fla.fixed_cost_events.at("kernel_boundaries"));
  // Zeroing the fixed costs gives back the bytes-and-MACs model: the same traffic.
  Device none = dev;
  for (Quantity* q : {&none.dma_setup_cycles, &none.gm_segment_cycles, &none.pipe_sync_cycles, &none.vector_startup_cycles, &none.kernel_boundary_us})
    q->value = 0;
  const SimResult bare = simulate(testing::plan_as_callers_do(p, none, "fla"), none);
  EXPECT_EQ(bare.gm_read_bytes, fla.gm_read_bytes);
  EXPECT_LT(bare.latency_s, fla.latency_s);
}

TEST(FixedCosts, TransDataKernelsPayTheirLaunchesRoundTripsAndTransforms) {
  // vLLM-Ascend on the 310P: each TransData kernel (docs/SIMULATION.md section 8) is charged its
  // launch and boundary, its tile's GM round trip (read and written once per chunk, in the
  // tensor's GM precision) and its transform on the vector unit; nothing else changes.
  const Device dev = ascend310p();
  Device none = dev;
  none.framework_matmul_transdata_per_tensor.value = 0;
  for (const Variant v : {Variant::GDN, Variant::KDA}) {
    const Problem p = problem(v, {1000}, 16);  // a tail chunk too
    const Plan with = testing::plan_as_callers_do(p, dev, "vllm-ascend"), without = testing::plan_as_callers_do(p, none, "vllm-ascend");
    const SimResult a = simulate(with, dev), b = simulate(without, none);
    const OpGraph& g = with.graph();
    double conversions = 0;
    int64_t bytes = 0, transform_bytes = 0;
    for (const Kernel& k : with.kernels) {
      if (!k.order.empty()) continue;
      conversions += 1;
      const TensorDef& t = g.tensor(k.steps[0].tensor);
      for (const auto& items : k.cores)
        for (const PlanItem& it : items)
          for (int64_t c = it.chunk0; c < it.chunk1; ++c) {
            const int64_t tile = tensor_bytes(t, p.chunk_len(it.seq, c), p.K, it.col1 - it.col0) / static_cast<int64_t>(dtype_size(t.dtype)) *
                                 k.steps[0].elem_bytes;
            bytes += tile;
            transform_bytes += 2 * tile;
          }
    }
    EXPECT_EQ(conversions, 9) << variant_name(v);
    EXPECT_EQ(a.fixed_cost_events.at("launches") - b.fixed_cost_events.at("launches"), conversions);
    EXPECT_EQ(a.fixed_cost_events.at("kernel_boundaries") - b.fixed_cost_events.at("kernel_boundaries"), conversions);
    EXPECT_EQ(a.gm_read_bytes - b.gm_read_bytes, bytes) << variant_name(v);
    EXPECT_EQ(a.gm_write_bytes - b.gm_write_bytes, bytes) << variant_name(v);
    EXPECT_EQ(a.transform_bytes - b.transform_bytes, transform_bytes) << variant_name(v);
    EXPECT_EQ(a.executed_macs, b.executed_macs);
    // At least their fixed per-kernel costs: each adds its launch and boundary to the latency.
    EXPECT_GT(a.latency_s - b.latency_s, conversions * (dev.kernel_launch_us.value + dev.kernel_boundary_us.value) * 1e-6);
    // The NZ copies are materialized in GM (every chunk's), so the peak GM footprint grows too.
    EXPECT_GT(a.peak_gm_bytes, b.peak_gm_bytes);
  }
}

TEST(FixedCosts, CalibratedAblationIsWithinFifteenPercentOfThePaper) {
  // The fitted constants of devices/ascend310p.json (tools/calibrate_fixed_costs.py) against the
  // paper's measured ablation (arXiv 2609.32114, GDN, T = 1024, H = 16, 310P).
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1024}, 16);
  const std::vector<std::pair<std::string, double>> paper = {
      {"fla", 5.46e-3}, {"fla+mapping", 1.91e-3}, {"fla+mapping+reordering", 1.45e-3}, {"fla+mapping+reordering+layout", 1.23e-3}};
  for (const auto& [s, t] : paper) {
    const double sim = simulate(testing::plan_as_callers_do(p, dev, s), dev).latency_s;
    EXPECT_NEAR(sim / t, 1.0, 0.15) << s << ": simulated " << sim * 1e3 << " ms, paper " << t * 1e3 << " ms";
  }
}

TEST(BufferPolicy, StaticHoldsEveryCopyForTheKernelsLife) {
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1024}, 16);
  SimOptions st;
  st.buffer_policy = SimOptions::BufferPolicy::Static;
  for (const char* s : {"fla+mapping", "hanpu", "fla"}) {
    const Plan plan = testing::plan_as_callers_do(p, dev, s);
    const SimResult a = simulate(plan, dev), b = simulate(plan, dev, st);
    EXPECT_EQ(b.buffer_policy, "static");
    ASSERT_EQ(a.kernels.size(), b.kernels.size());
    for (size_t i = 0; i < plan.kernels.size(); ++i)
      for (const auto& [buf, peak] : plan.kernels[i].peak_bytes) EXPECT_GE(b.kernels[i].static_bytes.at(buf), peak) << s << " " << buf;
    // What static allocation spills is extra GM traffic, accounted exactly, never less time.
    EXPECT_EQ(b.gm_read_bytes + b.gm_write_bytes - a.gm_read_bytes - a.gm_write_bytes, b.static_spill_bytes) << s;
    EXPECT_GE(b.latency_s, a.latency_s) << s;
    EXPECT_EQ(a.static_spill_bytes, 0);
  }
  // FLA's default order fused on one core (the +mapping step) does not fit the UB when every
  // copy is held for the kernel's life: it spills (the paper's finding), and the spilled tensors
  // are named.
  const SimResult mapped = simulate(testing::plan_as_callers_do(p, dev, "fla+mapping"), dev, st);
  EXPECT_GT(mapped.static_spill_bytes, 0);
  EXPECT_FALSE(mapped.kernels.front().static_spilled.empty());
  EXPECT_EQ(buffer_policy_from_name("static"), SimOptions::BufferPolicy::Static);
  EXPECT_THROW(buffer_policy_from_name("greedy"), Error);
}

TEST(GmFit, AStrategyThatExceedsGmIsReportedNotSimulated) {
  const Device dev = ascend310p();
  const Problem p = problem(Variant::GDN, {1 << 20}, 16);
  const Plan native = testing::plan_as_callers_do(p, dev, "vllm-ascend");
  const GmFit f = gm_fit(native, dev);
  EXPECT_FALSE(f.fits);
  EXPECT_GT(f.needs_bytes, f.device_bytes);
  EXPECT_NE(f.message().find("does not fit: needs"), std::string::npos);
  EXPECT_THROW(simulate(native, dev), Error);
  EXPECT_TRUE(gm_fit(testing::plan_as_callers_do(p, dev, "hanpu"), dev).fits);
}

// Every device file of devices/, every variant of the traits table, every strategy of the registry:
// a valid plan (with a partial chunk and tier-2/3 heads) that round-trips through JSON and
// simulates with at least the compulsory traffic.
using DeviceVariantStrategy = std::tuple<std::string, Variant, std::string>;
class EveryDeviceVariantStrategy : public ::testing::TestWithParam<DeviceVariantStrategy> {};

TEST_P(EveryDeviceVariantStrategy, PlansAValidPlanThatSimulates) {
  const auto& [device, v, strategy] = GetParam();
  const Device dev = load_device(testing::device_path(device));
  const Problem p = problem(v, {300}, 6, 12);
  const Plan plan = testing::plan_as_callers_do(p, dev, strategy);
  EXPECT_NO_THROW(validate_plan(plan));
  EXPECT_EQ(plan_from_json(plan_to_json(plan)), plan);
  const SimResult r = simulate(plan, dev);
  EXPECT_GT(r.latency_s, 0);
  EXPECT_GE(r.gm_read_bytes, compulsory_traffic(p).read);
  EXPECT_GE(r.gm_write_bytes, compulsory_traffic(p).write);
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryDeviceVariantStrategy,
                         ::testing::Combine(::testing::ValuesIn(testing::device_names()), ::testing::ValuesIn(testing::every_variant()),
                                            ::testing::ValuesIn(testing::every_strategy())),
                         [](const ::testing::TestParamInfo<DeviceVariantStrategy>& info) {
                           return testing::param_name(std::get<0>(info.param) + "_" + variant_name(std::get<1>(info.param)) + "_" +
                                                      std::get<2>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(Registry, SimulateVariant, ::testing::ValuesIn(testing::every_variant()),
                         [](const ::testing::TestParamInfo<Variant>& info) { return std::string(variant_name(info.param)); });

}  // namespace
}  // namespace hanpu
