// The same plans on the CPU (issue 3 item 7): every strategy and ablation step planned for the
// detected host runs on the CPU backend and gives the fp64 reference's outputs; the plan's mapping
// (tail tiers included) and operator order are what runs; mismatched plans are refused.
#include <gtest/gtest.h>

#include "hanpu/device.hpp"
#include "hanpu/plan_exec.hpp"
#include "la_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::ProblemSpec;

const Device& host() {
  static const Device d = host_device(2, 0.0);  // detected, not measured: planning only
  return d;
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
  for (Variant v : {Variant::GDN, Variant::KDA}) {
    ProblemSpec a;  // T not a multiple of 64, HV > H, heads not a multiple of cores (tier 2)
    a.variant = v, a.T = 200, a.H = 1, a.HV = 3, a.K = 64, a.V = 64, a.seed = 3;
    out.push_back({a, 2});
    ProblemSpec b = a;  // varlen batch with an empty sequence
    b.T = 0, b.seqlens = {70, 0, 129}, b.HV = 2, b.H = 2, b.seed = 4;
    out.push_back({b, 2});
    ProblemSpec c = a;  // one head on three cores
    c.HV = 1, c.V = 48, c.seed = 5;
    out.push_back({c, 3});
  }
  return out;
}

TEST(PlanExec, EveryStrategyAndAblationStepMatchesTheReference) {
  std::vector<std::string> strategies = strategy_names();
  for (const std::string& a : ablation_names()) strategies.push_back(a);
  for (const Case& c : cases()) {
    const auto p = make_problem(c.spec);
    const LaInputs in = p.inputs();
    const LaReference ref = la_reference(c.spec.variant, in, c.spec.opt);
    const LaShape shape = validate_la(c.spec.variant, in, c.spec.opt);
    const Problem prob = problem_for_inputs(c.spec.variant, in, c.spec.opt);
    EXPECT_EQ(prob.seqlens, seq_lens_of(c.spec));
    for (const std::string& s : strategies) {
      SCOPED_TRACE(c.spec.describe() + " cores " + std::to_string(c.cores) + " strategy " + s);
      PlanOptions po;
      po.cores = c.cores;
      const Plan plan = make_plan(prob, host(), s, po);
      const CpuExecution ex = cpu_execution_for(plan, shape, prob.seqlens);
      EXPECT_EQ(ex.threads, c.cores);
      EXPECT_FALSE(ex.summary.empty());
      ExecOptions eo{ex.path, ex.threads, ex.path == CpuPath::HeadFused ? &ex.plan : nullptr, nullptr};
      const LaResult r = la_prefill_alloc(c.spec.variant, in, c.spec.opt, eo);
      EXPECT_LT(nmse(r.o, ref.o), 1e-10);
      EXPECT_LT(nmse(r.final_state, ref.final_state), 1e-10);
      if (ex.path == CpuPath::HeadFused) {
        // The CPU runs the plan's mapping as planned: per thread the fused kernel's items in order.
        const Kernel* fused = nullptr;
        for (const Kernel& k : plan.kernels)
          if (k.name == "fused") fused = &k;
        ASSERT_NE(fused, nullptr);
        for (size_t t = 0; t < fused->cores.size(); ++t) {
          // Thread 0 may also carry the empty sequences' state copies, after the planned items.
          ASSERT_GE(ex.plan.per_thread[t].size(), fused->cores[t].size());
          for (size_t i = 0; i < fused->cores[t].size(); ++i) {
            EXPECT_EQ(ex.plan.per_thread[t][i].head, fused->cores[t][i].head);
            EXPECT_EQ(ex.plan.per_thread[t][i].col0, fused->cores[t][i].col0);
            EXPECT_EQ(ex.plan.per_thread[t][i].col1, fused->cores[t][i].col1);
          }
        }
        EXPECT_EQ(ex.plan.order.gemm_first, plan.form == GraphForm::GemmFirst);
        EXPECT_EQ(ex.plan.order.state_in_place, plan.state_in_place);
      }
    }
  }
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
  const Plan wrong_len = make_plan(longer, host(), "hanpu", po);
  try {
    cpu_execution_for(wrong_len, shape, prob.seqlens);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence lengths are [128] in the plan, [100] in the inputs"), std::string::npos)
        << e.what();
  }
  Problem kda = prob;
  kda.variant = Variant::KDA;
  const Plan wrong_var = make_plan(kda, host(), "hanpu", po);
  EXPECT_THROW(cpu_execution_for(wrong_var, shape, prob.seqlens), Error);
}

TEST(PlanExec, HostLayoutsAreDenseAndBlockedPlansAreRefused) {
  EXPECT_EQ(host().matrix.operand_layout, "dense");
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 2, a.K = 32, a.V = 32;
  const auto p = make_problem(a);
  const LaShape shape = validate_la(a.variant, p.inputs(), a.opt);
  const Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  PlanOptions po;
  po.cores = 2;
  // On the host the layout planner keeps everything dense (the FMA units read rows), and the
  // lowering places no layout transform.
  const Plan on_host = make_plan(prob, host(), "hanpu", po);
  EXPECT_TRUE(on_host.layout_planned);
  for (const auto& [t, l] : on_host.layouts) EXPECT_EQ(l, Layout::Dense) << t;
  for (const Kernel& k : on_host.kernels)
    for (const Step& s : k.steps) EXPECT_NE(s.kind, "transform") << k.name << " " << s.op << " " << s.tensor;
  EXPECT_NO_THROW(cpu_execution_for(on_host, shape, prob.seqlens));
  // A plan for the Ascend 310P keeps some matrix results blocked (its Cube's fractal format): the
  // CPU refuses it, naming the tensor.
  const Device npu = load_device((testing::golden_dir().parent_path().parent_path() / "devices" / "ascend310p.json").string());
  const Plan on_npu = make_plan(prob, npu, "hanpu", po);
  std::string blocked;
  for (const auto& [t, l] : on_npu.layouts)
    if (l == Layout::Blocked && blocked.empty()) blocked = t;
  ASSERT_FALSE(blocked.empty());
  try {
    cpu_execution_for(on_npu, shape, prob.seqlens);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.layouts." + blocked + ": got blocked"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hanpu
