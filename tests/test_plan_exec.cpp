// One Plan drives the CPU (issue 11 items 1, 2): every strategy and ablation step planned for the
// host runs on the CPU backend and gives the fp64 reference's outputs, or is refused naming the
// field; what runs is the plan's mapping (tail tiers included), its lockstep groups and its
// operator order as CPU stages; plans read from JSON run the same; the default path takes its
// plan from the planner through the engine's plan cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "cpu_plan_testing.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/device.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/plan_exec.hpp"
#include "hanpu/simulate.hpp"
#include "la_testing.hpp"
#include "registry_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::ProblemSpec;

const Device& host(int threads) {
  static std::map<int, Device> devices;
  auto it = devices.find(threads);
  if (it == devices.end()) it = devices.emplace(threads, host_device(threads, 0.0)).first;  // detected, not measured
  return it->second;
}

std::vector<int64_t> seq_lens_of(const ProblemSpec& s) {
  return s.seqlens.empty() ? std::vector<int64_t>(static_cast<size_t>(s.B), s.T) : s.seqlens;
}

struct Case {
  ProblemSpec spec;
  int cores;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Variant v : testing::every_variant()) {
    ProblemSpec a;  // T not a multiple of 64, HV > H, heads not a multiple of cores (tier 2)
    a.variant = v, a.T = 200, a.H = 1, a.HV = 3, a.K = 64, a.V = 64, a.seed = 3;
    out.push_back({a, 2});
    ProblemSpec b = a;  // varlen batch with an empty sequence
    b.T = 0, b.seqlens = {70, 0, 129}, b.HV = 2, b.H = 2, b.seed = 4;
    out.push_back({b, 2});
    ProblemSpec c = a;  // one head on three cores
    c.HV = 1, c.V = 48, c.seed = 5;
    out.push_back({c, 3});
    ProblemSpec d = a;  // odd head dims, GVA 2:1 in lockstep groups of like heads
    d.T = 130, d.H = 2, d.HV = 4, d.K = 33, d.V = 40, d.seed = 6;
    out.push_back({d, 1});
    ProblemSpec e = a;  // one head of V = 16 on 2 cores: tier 3 (chunk-parallel) once the quantum is 16
    e.T = 300, e.HV = 1, e.K = 32, e.V = 16, e.seed = 7;
    out.push_back({e, 2});
    ProblemSpec f = a;  // one head of V = 32 on 3 cores: tier 3 with its state in two column blocks
    f.T = 200, f.HV = 1, f.K = 40, f.V = 32, f.seed = 8;
    out.push_back({f, 3});
  }
  return out;
}

const Kernel* fused_kernel(const Plan& plan) {
  for (const Kernel& k : plan.kernels)
    if (k.name == "fused") return &k;
  return nullptr;
}

LaResult run_plan(const ProblemSpec& spec, const testing::Problem& p, const Plan& plan, ExecReport* rep = nullptr) {
  ExecOptions eo;
  eo.plan = &plan;
  eo.report = rep;
  return la_prefill_alloc(spec.variant, p.inputs(), spec.opt, eo);
}

// Every strategy and every ablation step through the CPU: runs and matches the reference, or (the
// segment-parallel flashqla) is refused naming the field. The mapping the CPU ran is the plan's.
TEST(PlanExec, EveryStrategyAndAblationStepMatchesTheReferenceOrIsRefused) {
  std::vector<std::string> strategies = strategy_names();
  for (const std::string& a : ablation_names()) strategies.push_back(a);
  for (const Case& c : cases()) {
    const auto p = make_problem(c.spec);
    const LaInputs in = p.inputs();
    const LaReference ref = la_reference(c.spec.variant, in, c.spec.opt);
    const LaShape shape = validate_la(c.spec.variant, in, c.spec.opt);
    const Problem prob = problem_for_inputs(c.spec.variant, in, c.spec.opt);
    EXPECT_EQ(prob.seqlens, seq_lens_of(c.spec));
    Device dev = host(c.cores);
    dev.matrix.tile_n.value = 16;  // the column quantum of an AVX-512 host under every ISA
    for (const std::string& s : strategies) {
      SCOPED_TRACE(c.spec.describe() + " cores " + std::to_string(c.cores) + " strategy " + s);
      PlanOptions po;
      po.cores = c.cores;
      const Plan plan = testing::plan_as_callers_do(prob, dev, s, po);
      if (s == "flashqla") {
        EXPECT_NE(cpu_cannot_run(plan).find(".parallel: got \"segment\""), std::string::npos) << cpu_cannot_run(plan);
        EXPECT_THROW(run_plan(c.spec, p, plan), Error);
        continue;
      }
      EXPECT_EQ(cpu_cannot_run(plan), "");
      const CpuSchedule ex = lower_plan_for_cpu(plan, shape, prob.seqlens);
      EXPECT_EQ(ex.threads, c.cores);
      EXPECT_FALSE(ex.summary.empty());
      ExecReport rep;
      const LaResult r = run_plan(c.spec, p, plan, &rep);
      EXPECT_LT(nmse(r.o, ref.o), 1e-10);
      EXPECT_LT(nmse(r.final_state, ref.final_state), 1e-10);
      ASSERT_TRUE(rep.schedule);
      EXPECT_EQ(*rep.plan, plan);
      EXPECT_FALSE(rep.plan_cache_hit);
      const Kernel* fused = fused_kernel(plan);
      EXPECT_EQ(ex.path, fused || plan.kernels.front().name == "tail_map" ? CpuPath::HeadFused : CpuPath::FlaChunk);
      // The chunk-parallel phases (FLA-style kernels, or the tier-3 tail kernels) run the plan's
      // mapping: the state kernel's items and the output kernel's (chunk, column block) tasks per
      // core, in order; the Map kernels' (chunk, head)s.
      for (const Kernel& k : plan.kernels) {
        const bool state = k.name == "fwd_h" || k.name == "chunk_gated_delta_rule_fwd_h" || k.name == "tail_state";
        const bool output = k.name == "fwd_o" || k.name == "chunk_fwd_o" || k.name == "tail_output";
        for (size_t t = 0; t < k.cores.size(); ++t) {
          if (state) {
            std::vector<WorkItem> want;
            for (const PlanItem& it : k.cores[t]) want.push_back({it.seq, it.head, it.col0, it.col1});
            const size_t empty_copies = t == 0 && ex.path == CpuPath::FlaChunk ? ex.fla_state[0].size() - want.size() : 0;
            EXPECT_EQ(std::vector<WorkItem>(ex.fla_state[t].begin(), ex.fla_state[t].end() - static_cast<long>(empty_copies)), want) << k.name;
          }
          if (output) {
            std::vector<ChunkTask> want;
            for (const PlanItem& it : k.cores[t])
              for (int64_t ch = it.chunk0; ch < it.chunk1; ++ch) want.push_back({it.seq, it.head, ch, it.col0, it.col1});
            EXPECT_EQ(ex.fla_output[t], want) << k.name;
          }
          if (&k == &plan.kernels.front() && !fused) {
            size_t chunks = 0;
            for (const PlanItem& it : k.cores[t]) chunks += static_cast<size_t>(it.chunk1 - it.chunk0);
            EXPECT_EQ(ex.fla_map[t].size(), chunks) << k.name;  // whole-width Map kernels: one task per chunk
          }
        }
      }
      size_t tier3 = 0;
      for (const Kernel& k : plan.kernels)
        if (k.name == "tail_map") {
          std::set<std::pair<int32_t, int32_t>> heads;
          for (const auto& l : k.cores)
            for (const PlanItem& it : l) heads.insert({it.seq, it.head});
          tier3 = heads.size();
        }
      EXPECT_EQ(ex.chunk_parallel.size(), tier3);
      if (tier3) EXPECT_EQ(ex.chunk_parallel_gemm_first, plan.form == GraphForm::GemmFirst);
      if (ex.path != CpuPath::HeadFused || !fused) continue;
      // The CPU runs the plan's mapping as planned: per thread the fused kernel's items in order,
      // in the plan's lockstep groups; tier-3 heads chunk-parallel.
      for (size_t t = 0; t < fused->cores.size(); ++t) {
        // Thread 0 may also carry the empty sequences' state copies, after the planned items.
        ASSERT_GE(ex.per_thread[t].size(), fused->cores[t].size());
        for (size_t i = 0; i < fused->cores[t].size(); ++i) {
          EXPECT_EQ(ex.per_thread[t][i].seq, fused->cores[t][i].seq);
          EXPECT_EQ(ex.per_thread[t][i].head, fused->cores[t][i].head);
          EXPECT_EQ(ex.per_thread[t][i].col0, fused->cores[t][i].col0);
          EXPECT_EQ(ex.per_thread[t][i].col1, fused->cores[t][i].col1);
        }
        ASSERT_FALSE(fused->groups.empty());
        const std::vector<int32_t> planned(ex.groups[t].begin(), ex.groups[t].begin() + static_cast<long>(fused->groups[t].size()));
        EXPECT_EQ(planned, fused->groups[t]);
      }
      EXPECT_EQ(ex.program.gemm_first, plan.form == GraphForm::GemmFirst);
      EXPECT_EQ(ex.program.state_in_place, plan.state_in_place);
    }
  }
}

// The V = 16 head on two cores really is tier 3, and 3 heads on 2 cores really split the tail head.
TEST(PlanExec, TailTiersReachTheCpu) {
  Device dev = host(2);
  dev.matrix.tile_n.value = 16;
  Problem p;
  p.seqlens = {1024};
  p.H = p.HV = 3, p.K = 64, p.V = 128;
  PlanOptions po;
  po.cores = 2;
  LaShape shape;
  shape.variant = p.variant, shape.H = shape.HV = 3, shape.K = 64, shape.V = 128, shape.N = 1;
  CpuSchedule s = lower_plan_for_cpu(testing::plan_as_callers_do(p, dev, "hanpu", po), shape, p.seqlens);
  EXPECT_EQ(s.per_thread[0].size() + s.per_thread[1].size(), 4u);  // 2 whole heads + the third in two column blocks
  EXPECT_TRUE(s.chunk_parallel.empty());
  p.H = p.HV = shape.H = shape.HV = 1, p.V = shape.V = 16;
  s = lower_plan_for_cpu(testing::plan_as_callers_do(p, dev, "hanpu", po), shape, p.seqlens);
  EXPECT_EQ(s.chunk_parallel.size(), 1u);
  EXPECT_TRUE(s.per_thread[0].empty() && s.per_thread[1].empty());
  EXPECT_TRUE(s.chunk_parallel_gemm_first);
  // V = 32 on 3 cores: tier 3, the state recurrence in two column blocks of 16 on two threads.
  p.V = shape.V = 32;
  po.cores = 3;
  s = lower_plan_for_cpu(testing::plan_as_callers_do(p, dev, "hanpu", po), shape, p.seqlens);
  ASSERT_EQ(s.chunk_parallel.size(), 1u);
  size_t blocks = 0;
  for (const auto& items : s.fla_state)
    for (const WorkItem& w : items) {
      EXPECT_EQ(w.col1 - w.col0, 16);
      ++blocks;
    }
  EXPECT_EQ(blocks, 2u);
}

// Plans written to JSON and read back run exactly as the plan they came from.
TEST(PlanExec, PlansReadFromJsonRunTheSame) {
  for (Variant v : testing::every_variant()) {
    ProblemSpec a;
    a.variant = v, a.T = 150, a.H = 2, a.HV = 4, a.K = 40, a.V = 64, a.seed = 9;
    const auto p = make_problem(a);
    const Problem prob = problem_for_inputs(v, p.inputs(), a.opt);
    PlanOptions po;
    po.cores = 2;
    for (const std::string s : {"hanpu", "fla", "fla+mapping"}) {
      SCOPED_TRACE(std::string(variant_name(v)) + " " + s);
      const Plan plan = testing::plan_as_callers_do(prob, host(2), s, po);
      const Plan back = plan_from_json(nlohmann::json::parse(plan_to_json(plan).dump()), "test.json");
      EXPECT_EQ(back, plan);
      const LaResult x = run_plan(a, p, plan), y = run_plan(a, p, back);
      EXPECT_EQ(nmse(y.o, x.o), 0.0);
      EXPECT_EQ(nmse(y.final_state, x.final_state), 0.0);
    }
  }
}

// Operator orders other than the default: the planner lowers them, the CPU runs its stages in that
// order (and the result stays exact); orders the CPU cannot follow are refused by name.
TEST(PlanExec, OperatorOrdersAreStagesInPlanOrder) {
  for (Variant v : testing::every_variant()) {
    ProblemSpec a;
    a.variant = v, a.T = 150, a.H = 1, a.HV = 2, a.K = 48, a.V = 64, a.seed = 11;
    a.gates = testing::GateRegime::kMasked;
    const auto p = make_problem(a);
    const LaReference ref = la_reference(v, p.inputs(), a.opt);
    const Problem prob = problem_for_inputs(v, p.inputs(), a.opt);
    const LaShape shape = validate_la(v, p.inputs(), a.opt);
    PlanOptions po;
    po.cores = 2;
    // The state GEMMs before the grams (the CPU's hand-wired order before plans drove it).
    std::vector<OpId> order = {OpId::Gate};
    if (v == Variant::KDA) order.insert(order.end(), {OpId::DecayQ, OpId::DecayKe, OpId::DecayKi, OpId::DecayKl});
    order.insert(order.end(), {OpId::Ks, OpId::Qs, OpId::Kkt, OpId::Qkt, OpId::KktGate, OpId::QktGate, OpId::Rhs, OpId::SolveDiag,
                               OpId::Solve, OpId::Pv, OpId::Out});
    if (v == Variant::GDN) order.push_back(OpId::UpdateGate);
    order.insert(order.end(), {OpId::Update, OpId::StateAdd});
    po.order = order;
    const Plan plan = testing::plan_as_callers_do(prob, host(2), "hanpu", po);
    const CpuSchedule s = lower_plan_for_cpu(plan, shape, prob.seqlens);
    const std::vector<CpuStage> want = {CpuStage::Gate,  CpuStage::StateK, CpuStage::StateQ, CpuStage::Grams,
                                        CpuStage::Mask,  CpuStage::Solve,  CpuStage::Output, CpuStage::Update};
    EXPECT_EQ(s.program.stages, want);
    const LaResult r = run_plan(a, p, plan);
    EXPECT_LT(nmse(r.o, ref.o), 1e-10);
    EXPECT_LT(nmse(r.final_state, ref.final_state), 1e-10);
    // The host plan's default order is that one too (the hand-wired CPU order); the graph's default
    // order, the grams first, is what an NPU plan runs.
    const CpuSchedule d = lower_plan_for_cpu(testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, {}}), shape, prob.seqlens);
    EXPECT_EQ(d.program.stages, want);
    std::vector<OpId> graph_order;
    for (const OperatorDef& op : make_op_graph(v, GraphForm::GemmFirst, true).ops) graph_order.push_back(op.id);
    const CpuSchedule n = lower_plan_for_cpu(testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, graph_order}), shape, prob.seqlens);
    EXPECT_EQ(n.program.stages.at(1), CpuStage::Grams);
    const LaResult rn = run_plan(a, p, testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, graph_order}));
    EXPECT_LT(nmse(rn.o, ref.o), 1e-10);
    EXPECT_LT(nmse(rn.final_state, ref.final_state), 1e-10);
    // FLA's order (the W/U form, the next state built before the output): GDN keeps v_new apart.
    const CpuSchedule f = lower_plan_for_cpu(testing::plan_as_callers_do(prob, host(2), "fla+mapping", PlanOptions{2, {}}), shape, prob.seqlens);
    EXPECT_FALSE(f.program.gemm_first);
    EXPECT_FALSE(f.program.state_in_place);
    EXPECT_EQ(f.program.update_keeps_vnew, v == Variant::GDN);
    EXPECT_LT(std::find(f.program.stages.begin(), f.program.stages.end(), CpuStage::Update) - f.program.stages.begin(),
              std::find(f.program.stages.begin(), f.program.stages.end(), CpuStage::Output) - f.program.stages.begin());

    // Refused: the output after the in-place update would read the new state (qs after state_add;
    // every operator still follows its producers, so only the in-place hazard is wrong).
    Plan late_qs = testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, {}});
    for (Kernel& k : late_qs.kernels) {
      if (k.name != "fused") continue;
      for (const OpId op : {OpId::Qs, OpId::Pv, OpId::Out}) {
        k.order.erase(std::find(k.order.begin(), k.order.end(), op));
        k.order.push_back(op);
      }
    }
    EXPECT_NE(cpu_cannot_run(late_qs).find("plan.kernels[0] (fused).order: stage state_q (operator qs) reads the state after the in-place update"),
              std::string::npos)
        << cpu_cannot_run(late_qs);
    // Refused: an operator the form does not have.
    Plan foreign = testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, {}});
    foreign.kernels[0].order.insert(foreign.kernels[0].order.begin() + 1, OpId::Wu);
    EXPECT_NE(cpu_cannot_run(foreign).find("operator \"wu\" has no CPU stage in the gemm_first form"), std::string::npos)
        << cpu_cannot_run(foreign);
    // make_plan itself refuses an order that reads a tensor before its producer.
    std::vector<OpId> bad = order;
    std::swap(bad[0], bad.back());
    EXPECT_THROW(testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, bad}), Error);
  }
}

// KDA's decayed operands built just in time (each decay operator right before its first consumer,
// as an NPU's reordering pass may place them): the CPU's gate stage builds them all at chunk start,
// wherever the order has them, and the result stays exact. The order the 310P's pass chooses runs too.
TEST(PlanExec, KdaDecaysJustInTimeRunInTheGateStage) {
  ProblemSpec a;
  a.variant = Variant::KDA, a.T = 150, a.H = 1, a.HV = 2, a.K = 48, a.V = 64, a.seed = 12;
  a.gates = testing::GateRegime::kMasked;
  const auto p = make_problem(a);
  const LaReference ref = la_reference(a.variant, p.inputs(), a.opt);
  const Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  const LaShape shape = validate_la(a.variant, p.inputs(), a.opt);
  const std::vector<OpId> just_in_time = {OpId::Gate,    OpId::DecayKe, OpId::DecayKi, OpId::Kkt,       OpId::DecayQ, OpId::Qkt,
                                          OpId::Ks,      OpId::Qs,      OpId::KktGate, OpId::QktGate,   OpId::Rhs,    OpId::SolveDiag,
                                          OpId::Solve,   OpId::Pv,      OpId::Out,     OpId::DecayKl,   OpId::Update, OpId::StateAdd};
  const OpGraph g = make_op_graph(Variant::KDA, GraphForm::GemmFirst, true);
  const ReorderResult pass = lifetime_aware_order(g, 64, a.K, a.V, 256 * 1024);
  for (const std::vector<OpId>& order : {just_in_time, pass.order}) {
    const Plan plan = testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, order});
    ASSERT_EQ(fused_kernel(plan)->order, order);
    const CpuSchedule s = lower_plan_for_cpu(plan, shape, prob.seqlens);
    ASSERT_FALSE(s.program.stages.empty());
    EXPECT_EQ(s.program.stages.front(), CpuStage::Gate);
    EXPECT_EQ(std::count(s.program.stages.begin(), s.program.stages.end(), CpuStage::Gate), 1);
    const LaResult r = run_plan(a, p, plan);
    EXPECT_LT(nmse(r.o, ref.o), 1e-10);
    EXPECT_LT(nmse(r.final_state, ref.final_state), 1e-10);
  }
  // The old single operator is no operator of the manifest any more: a plan file whose order
  // names it is refused by name at the JSON edge.
  EXPECT_FALSE(operator_id("decay_k"));
  nlohmann::json old = plan_to_json(testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, just_in_time}));
  old["kernels"][0]["order"][1] = "decay_k";
  try {
    (void)plan_from_json(old, "old.json");
    ADD_FAILURE() << "an order naming decay_k was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("old.json: plan.kernels[0].order[1]: got \"decay_k\""), std::string::npos) << e.what();
  }
}

// Lockstep groups are a plan field: the planner sizes them from the working buffer, the JSON keeps
// them, validate_plan checks them, and the CPU runs the groups it is given (any grouping is exact).
TEST(PlanExec, LockstepGroupsAreAPlanField) {
  ProblemSpec a;
  a.T = 130, a.H = 2, a.HV = 8, a.K = 32, a.V = 32, a.seed = 13;
  const auto p = make_problem(a);
  const LaReference ref = la_reference(a.variant, p.inputs(), a.opt);
  const Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  const Plan plan = testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, {}});
  const Kernel& f = plan.kernels[0];
  ASSERT_EQ(f.name, "fused");
  ASSERT_EQ(f.groups.size(), 2u);
  // 4 heads per core, 32 x 32 states: a quarter of any L2 holds all 4.
  EXPECT_EQ(f.groups[0], std::vector<int32_t>{4});
  EXPECT_EQ(plan_to_json(plan)["kernels"][0]["groups"], nlohmann::json::parse("[[4],[4]]"));
  EXPECT_EQ(lockstep_groups(f.cores[0], 3), (std::vector<int32_t>{2, 2}));  // fewest groups, near-equal
  for (const std::vector<std::vector<int32_t>>& groups :
       {std::vector<std::vector<int32_t>>{{1, 1, 1, 1}, {4}}, {{2, 2}, {3, 1}}, {}}) {
    Plan g = plan;
    g.kernels[0].groups = groups;
    const LaResult r = run_plan(a, p, g);
    EXPECT_LT(nmse(r.o, ref.o), 1e-10);
    EXPECT_LT(nmse(r.final_state, ref.final_state), 1e-10);
  }
  // The simulator runs the groups too: a group's items interleave chunk by chunk, so one item's
  // recurrence overlaps the others' work (never slower than every item alone).
  Problem big;
  big.seqlens = {4096};
  big.H = big.HV = 16;
  Device dev = host(2);
  for (BufferSpec& b : dev.buffers)
    if (b.name == dev.matrix.output) b.capacity_bytes.value = 1 << 20;  // a 1 MiB L2 wherever the test runs
  const Plan grouped = testing::plan_as_callers_do(big, dev, "hanpu", PlanOptions{2, {}});
  // 64 KiB states as 72 KiB in cache (rows of 512 B padded by a line): 3 in a quarter of 1 MiB,
  // so a core's 8 heads run as 3 + 3 + 2.
  ASSERT_EQ(grouped.kernels[0].groups[0], (std::vector<int32_t>{3, 3, 2}));
  Plan alone = grouped;
  alone.kernels[0].groups.clear();
  const double with_groups = simulate(grouped, dev).latency_s, without = simulate(alone, dev).latency_s;
  EXPECT_LE(with_groups, without);
  EXPECT_NE(with_groups, without);
  Plan bad = plan;
  bad.kernels[0].groups = {{3}, {4}};
  try {
    validate_plan(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.kernels[0].groups[0]: group sizes sum to 3, the core has 4 items"), std::string::npos)
        << e.what();
  }
  nlohmann::json j = plan_to_json(plan);
  j["kernels"][0]["groups"] = nlohmann::json::parse("[[0],[4]]");
  try {
    plan_from_json(j, "groups.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.kernels[0].groups[0][0]"), std::string::npos) << e.what();
  }
}

// The default path: the planner's "hanpu" plan for the host, from the engine's plan cache after
// the first call.
TEST(PlanExec, DefaultPathPlansThroughTheCache) {
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 2, a.K = 32, a.V = 32, a.seed = 15;
  const auto p = make_problem(a);
  Engine engine(2);  // an empty cache, whatever other tests planned on the default engine
  ExecReport first, second, fla;
  ExecOptions eo;
  eo.engine = &engine;
  eo.threads = 2;
  eo.report = &first;
  const LaResult x = la_prefill_alloc(a.variant, p.inputs(), a.opt, eo);
  eo.report = &second;
  const LaResult y = la_prefill_alloc(a.variant, p.inputs(), a.opt, eo);
  ASSERT_TRUE(first.plan && second.plan);
  EXPECT_FALSE(first.plan_cache_hit);
  EXPECT_TRUE(second.plan_cache_hit);
  EXPECT_EQ(first.plan.get(), second.plan.get());  // the same cached plan, not re-planned
  EXPECT_EQ(first.plan->strategy, "hanpu");
  EXPECT_EQ(first.plan->device, "host");
  EXPECT_EQ(first.plan->cores, 2);
  EXPECT_EQ(plan_cache_size(engine), 1u);
  EXPECT_EQ(nmse(y.o, x.o), 0.0);
  // The FLA-style path plans "fla"; decode plans once per signature too.
  eo.path = CpuPath::FlaChunk;
  eo.report = &fla;
  la_prefill_alloc(a.variant, p.inputs(), a.opt, eo);
  EXPECT_EQ(fla.plan->strategy, "fla");
  EXPECT_EQ(fla.schedule->path, CpuPath::FlaChunk);
  EXPECT_EQ(plan_cache_size(engine), 2u);
  // A given plan must match the threads asked for.
  eo.path = CpuPath::HeadFused;
  eo.plan = first.plan.get();
  eo.threads = 3;
  try {
    la_prefill_alloc(a.variant, p.inputs(), a.opt, eo);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ExecOptions.threads: got 3, but the plan is for 2 cores (plan.cores)"), std::string::npos)
        << e.what();
  }
}

// The plan cache is the engine's: a second call on one engine is a hit; another engine plans the
// same signature anew and shares no plan, and clearing one cache leaves the other.
TEST(PlanExec, EnginesKeepSeparatePlanCaches) {
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 2, a.K = 32, a.V = 32, a.seed = 16;
  const auto p = make_problem(a);
  Engine one(2), two(2);
  auto run = [&](Engine& engine) {
    ExecReport report;
    ExecOptions eo;
    eo.engine = &engine;
    eo.report = &report;
    la_prefill_alloc(a.variant, p.inputs(), a.opt, eo);
    return report;
  };
  const ExecReport first = run(one), again = run(one), other = run(two);
  ASSERT_TRUE(first.plan && again.plan && other.plan);
  EXPECT_FALSE(first.plan_cache_hit);
  EXPECT_TRUE(again.plan_cache_hit);
  EXPECT_EQ(again.plan.get(), first.plan.get());
  EXPECT_FALSE(other.plan_cache_hit);
  EXPECT_NE(other.plan.get(), first.plan.get());
  EXPECT_TRUE(*other.plan == *first.plan);  // one host, planned alike
  EXPECT_EQ(plan_cache_size(one), 1u);
  EXPECT_EQ(plan_cache_size(two), 1u);
  clear_plan_cache(one);
  EXPECT_EQ(plan_cache_size(one), 0u);
  EXPECT_EQ(plan_cache_size(two), 1u);
  EXPECT_TRUE(run(two).plan_cache_hit);
  EXPECT_FALSE(run(one).plan_cache_hit);
}

TEST(PlanExec, PlanForAnotherProblemIsRefused) {
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 2, a.K = 32, a.V = 32;
  const auto p = make_problem(a);
  const LaShape shape = validate_la(a.variant, p.inputs(), a.opt);
  Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  PlanOptions po;
  po.cores = 2;
  Problem longer = prob;
  longer.seqlens = {128};
  const Plan wrong_len = testing::plan_as_callers_do(longer, host(2), "hanpu", po);
  try {
    lower_plan_for_cpu(wrong_len, shape, prob.seqlens);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence lengths are [128] in the plan, [100] in the inputs"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(run_plan(a, p, wrong_len), Error);
  Problem kda = prob;
  kda.variant = Variant::KDA;
  const Plan wrong_var = testing::plan_as_callers_do(kda, host(2), "hanpu", po);
  EXPECT_THROW(lower_plan_for_cpu(wrong_var, shape, prob.seqlens), Error);
  Problem chunk32 = prob;
  chunk32.chunk = 32;
  EXPECT_NE(cpu_cannot_run(testing::plan_as_callers_do(chunk32, host(2), "hanpu", po)).find("plan.problem.chunk: got 32"), std::string::npos);
}

// Refusals name the field: kernels the CPU has no execution for, phases out of order.
TEST(PlanExec, UnrunnablePlansAreRefusedByName) {
  Problem prob;
  prob.seqlens = {200};
  prob.H = prob.HV = 2, prob.K = prob.V = 32;
  const Plan fla = testing::plan_as_callers_do(prob, host(2), "fla", PlanOptions{2, {}});
  EXPECT_EQ(cpu_cannot_run(fla), "");
  Plan swapped = fla;  // fwd_o before fwd_h
  std::swap(swapped.kernels[4], swapped.kernels[5]);
  EXPECT_NE(cpu_cannot_run(swapped).find("plan.kernels[5] (fwd_h): a state kernel after a output kernel"), std::string::npos)
      << cpu_cannot_run(swapped);
  Plan mixed = fla;  // one kernel with Map and output operators
  mixed.kernels[1].order.push_back(OpId::Qkt);
  EXPECT_NE(cpu_cannot_run(mixed).find("plan.kernels[1] (chunk_scaled_dot_kkt_fwd).order: operators of the map and output phases in one kernel"),
            std::string::npos)
      << cpu_cannot_run(mixed);
  Plan remapped = fla;  // the W/U kernel's chunks on other cores than the cumsum's: the CPU fuses them
  std::swap(remapped.kernels[3].cores[0], remapped.kernels[3].cores[1]);
  EXPECT_NE(cpu_cannot_run(remapped).find("plan.kernels[3] (recompute_w_u).cores: mapped differently from plan.kernels[0] (chunk_local_cumsum)"),
            std::string::npos)
      << cpu_cannot_run(remapped);
  Plan cores = fla;
  cores.cores = 0;
  EXPECT_NE(cpu_cannot_run(cores).find("plan.cores: got 0"), std::string::npos);
  Plan inverse = testing::plan_as_callers_do(prob, host(2), "hanpu", PlanOptions{2, {}});
  inverse.form = GraphForm::Inverse;
  EXPECT_NE(cpu_cannot_run(inverse).find("plan.form: got \"inverse\""), std::string::npos);
}

TEST(PlanExec, HostLayoutsAreDenseAndBlockedPlansAreRefused) {
  EXPECT_EQ(host(2).matrix.operand_layout, OperandLayout::Dense);
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 2, a.K = 32, a.V = 32;
  const auto p = make_problem(a);
  const LaShape shape = validate_la(a.variant, p.inputs(), a.opt);
  const Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  PlanOptions po;
  po.cores = 2;
  // On the host the layout planner keeps everything dense (the FMA units read rows), and the
  // lowering places no layout transform.
  const Plan on_host = testing::plan_as_callers_do(prob, host(2), "hanpu", po);
  EXPECT_TRUE(on_host.layout_planned);
  for (const auto& [t, l] : on_host.layouts) EXPECT_EQ(l, Layout::Dense) << t;
  for (const Kernel& k : on_host.kernels)
    for (const Step& s : k.steps) EXPECT_NE(s.kind, StepKind::Transform) << k.name << " " << step_op_name(s.op) << " " << s.tensor;
  EXPECT_NO_THROW(lower_plan_for_cpu(on_host, shape, prob.seqlens));
  // A plan for the Ascend 310P keeps some matrix results blocked (its Cube's fractal format): the
  // CPU refuses it, naming the tensor.
  const Device npu = load_device((testing::golden_dir().parent_path().parent_path() / "devices" / "ascend310p.json").string());
  const Plan on_npu = testing::plan_as_callers_do(prob, npu, "hanpu", po);
  std::string blocked;
  for (const auto& [t, l] : on_npu.layouts)
    if (l == Layout::Blocked && blocked.empty()) blocked = t;
  ASSERT_FALSE(blocked.empty());
  try {
    lower_plan_for_cpu(on_npu, shape, prob.seqlens);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.layouts." + blocked + ": got blocked"), std::string::npos) << e.what();
  }
}

TEST(PlanExec, ACpuDeviceWithoutTheCpuBackendIsRefusedByName) {
  // The planner depends only on its arguments: a CPU device's plan needs the CPU backend's rules
  // handed in (PlanOptions::backend); an NPU's is planned by the planner's own passes.
  Problem prob;
  prob.seqlens = {128};
  prob.H = prob.HV = 2;
  const std::string err = testing::error_of([&] { make_plan(prob, host_device(2, 0.0), "hanpu", PlanOptions{2, {}}); });
  EXPECT_NE(err.find("PlanOptions.backend: device host is a CPU"), std::string::npos) << err;
  PlanOptions with_backend{2, {}};
  with_backend.backend = &cpu_plan_backend();
  EXPECT_TRUE(make_plan(prob, host_device(2, 0.0), "hanpu", with_backend).cpu.set());
}

}  // namespace
}  // namespace hanpu
