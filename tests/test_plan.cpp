// The planner: operator graph counts, head mapping with tail tiers, coverage and dependencies of
// every strategy's plan, the layout DP against exhaustive search, plan JSON round trips and
// errors, and the capacity check.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>

#include <random>
#include <set>

#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"
#include "plan_testing.hpp"

namespace hanpu {
namespace {

using testing::ascend310p;
using testing::every_strategy;
using testing::every_variant;
using testing::problem;
using testing::op_names;
using testing::op_id;
using testing::position;

// --- the operator manifest (hanpu/operators.hpp) ----------------------------------------------------

bool variant_has(Variant v, GateKind gate) {
  switch (gate) {
    case GateKind::Any: return true;
    case GateKind::Channel: return variant_traits(v).channel_gate();
    case GateKind::Head: return variant_traits(v).head_gate();
  }
  return false;
}

using VariantForm = std::tuple<Variant, GraphForm>;
std::string variant_form_name(const ::testing::TestParamInfo<VariantForm>& info) {
  return std::string(variant_name(std::get<0>(info.param))) + "_" + graph_form_name(std::get<1>(info.param));
}

class GraphOfVariantForm : public ::testing::TestWithParam<VariantForm> {};
class PlanOfVariant : public ::testing::TestWithParam<Variant> {};
std::string variant_param_name(const ::testing::TestParamInfo<Variant>& info) { return variant_name(info.param); }

TEST_P(GraphOfVariantForm, HoldsExactlyTheManifestsOperatorsWithTheirRows) {
  const auto [v, f] = GetParam();
  std::set<OpId> want;
  for (const OperatorManifestRow& r : kOperatorManifest)
    if ((r.forms & form_bit(f)) && variant_has(v, r.gate)) want.insert(r.id);
  for (bool in_place : {true, false}) {
    const OpGraph g = make_op_graph(v, f, in_place);
    std::set<OpId> got;
    for (const OperatorDef& op : g.ops) {
      EXPECT_TRUE(got.insert(op.id).second) << op.name << " twice";
      const OperatorManifestRow& row = operator_row(op.id);
      EXPECT_EQ(op.name, row.name);
      EXPECT_EQ(op.paper_op, row.paper_op) << op.name;
      EXPECT_EQ(op.unit, row.unit) << op.name;
      EXPECT_EQ(&g.op(op.id), &op) << op.name;
      EXPECT_EQ(operator_id(op.name), op.id) << op.name;
    }
    EXPECT_EQ(got, want) << (in_place ? "in place" : "double-buffered");
    for (const OperatorManifestRow& r : kOperatorManifest)
      if (!want.count(r.id)) EXPECT_THROW(g.op(r.id), Error) << r.name;
    // The shared graph is the same graph, built once.
    const OpGraph& shared = op_graph(v, f, in_place);
    EXPECT_EQ(&shared, &op_graph(v, f, in_place));
    EXPECT_EQ(shared.ops, g.ops);
    EXPECT_EQ(shared.tensors, g.tensors);
    EXPECT_EQ(shared.variant, v);
    EXPECT_EQ(shared.form, f);
    EXPECT_EQ(shared.state_in_place, in_place);
  }
}

TEST_P(GraphOfVariantForm, EveryOperatorHasACpuStageAndAnFlaPhaseWhereTheCpuRunsTheForm) {
  // The CPU runs the GEMM-first form head-fused (every operator in a stage) and the W/U form both
  // head-fused and chunk-parallel (every operator in a phase, or recomputed); the inverse form not.
  const auto [v, f] = GetParam();
  for (const OperatorDef& op : op_graph(v, f, true).ops) {
    const OperatorManifestRow& row = operator_row(op.id);
    EXPECT_EQ(cpu_stage_of(op.id, f).has_value(), f != GraphForm::Inverse) << op.name;
    if (f == GraphForm::WU) EXPECT_NE(row.fla_phase, FlaPhase::None) << op.name;
    EXPECT_EQ(row.fla_phase == FlaPhase::Recomputed, is_decay_operator(op.id)) << op.name;
  }
}


TEST(OperatorManifest, NamesAreTheJsonEdgeOnly) {
  for (const OperatorManifestRow& r : kOperatorManifest) {
    EXPECT_EQ(operator_id(r.name), r.id) << r.name;
    EXPECT_EQ(operator_name(r.id), r.name);
  }
  EXPECT_EQ(operator_id("decay_k"), std::nullopt);  // a kernel name of vllm-ascend's, no operator
  EXPECT_EQ(operator_id(""), std::nullopt);
  const OpGraph& wu = op_graph(Variant::GDN, GraphForm::WU, false);
  try {
    wu.op(OpId::Solve);  // GEMM-first only
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"solve\""), std::string::npos) << e.what();
  }
  // The decay operators are the manifest's channel-gate rows.
  std::vector<OpId> decays;
  for (const OperatorManifestRow& r : kOperatorManifest)
    if (r.gate == GateKind::Channel) decays.push_back(r.id);
  EXPECT_EQ(kda_decay_operators(), decays);
}

TEST(StepOp, NamesRoundTrip) {
  for (const OperatorManifestRow& r : kOperatorManifest) {
    EXPECT_EQ(step_op_name(r.id), r.name);
    EXPECT_EQ(step_op_of_name(r.name), StepOp(r.id)) << r.name;
  }
  for (StateTraffic s : {StateTraffic::StateIn, StateTraffic::StateOut, StateTraffic::StateSnapshot}) {
    EXPECT_FALSE(StepOp(s).is_operator());
    EXPECT_EQ(step_op_of_name(step_op_name(s)), StepOp(s)) << step_op_name(s);
  }
  EXPECT_EQ(step_op_name(StateTraffic::StateIn), "state_in");
  EXPECT_EQ(step_op_name(StateTraffic::StateOut), "state_out");
  EXPECT_EQ(step_op_name(StateTraffic::StateSnapshot), "state_snapshot");
  EXPECT_FALSE(step_op_of_name("decay_k"));
  EXPECT_FALSE(step_op_of_name(""));
}

TEST(KernelRole, NamesRoundTripAndPlansCarryTheRolesThroughJson) {
  for (KernelRole r : {KernelRole::Named, KernelRole::Fused, KernelRole::TailMap, KernelRole::TailState, KernelRole::TailOutput})
    EXPECT_EQ(kernel_role_of_name(kernel_role_name(r)), r) << kernel_role_name(r);
  EXPECT_EQ(kernel_role_of_name("fused_fwd"), KernelRole::Named);
  EXPECT_EQ(kernel_role_of_name("tail_"), KernelRole::Named);
  // 11 heads on 10 cores: whole heads, and tier-3 work run by the tail kernels.
  PlanOptions o;
  o.cores = 10;
  const Plan plan = make_plan(problem(Variant::GDN, {300}, 11), ascend310p(), "hanpu", o);
  std::vector<KernelRole> roles;
  for (const Kernel& k : plan.kernels) {
    roles.push_back(k.role);
    EXPECT_EQ(k.name, kernel_role_name(k.role));
  }
  EXPECT_EQ(roles, (std::vector<KernelRole>{KernelRole::Fused, KernelRole::TailMap, KernelRole::TailState, KernelRole::TailOutput}));
  EXPECT_EQ(plan_from_json(plan_to_json(plan)), plan);
  for (const Kernel& k : make_plan(problem(Variant::GDN, {512}, 5), ascend310p(), "fla").kernels) EXPECT_EQ(k.role, KernelRole::Named) << k.name;
}

TEST(Plans, CarryTheGraphBuiltOnce) {
  for (const std::string& s : every_strategy()) {
    const Plan plan = make_plan(problem(Variant::KDA, {300}, 4), ascend310p(), s);
    EXPECT_EQ(&plan.graph(), &op_graph(Variant::KDA, plan.form, plan.state_in_place)) << s;
    EXPECT_EQ(&plan.graph(), &plan_from_json(plan_to_json(plan)).graph()) << s;
  }
}

TEST(OpGraph, GemmFirstMacsMatchTheEngineOperationCount) {
  // la_flops_per_token_head (src/la/flops.cpp) counts the same GEMM-first products independently.
  const Problem p = problem(Variant::GDN, {4096}, 16);
  const double per_token = la_flops_per_token_head(Variant::GDN, 128, 128, 64) / 2;
  EXPECT_DOUBLE_EQ(layer_macs(p, GraphForm::GemmFirst), per_token * 4096 * 16);
  EXPECT_DOUBLE_EQ(per_token, 65536.0);
}

TEST(OpGraph, WuFormMacsFollowTheClosedFormula) {
  // WU form per chunk: K K^T and Q K^T triangles, the inverse L(L-1)(L-2)/6, W and U
  // triangles L(L+1)/2 (K+V), W S, Q S and K^T v_new (3 L K V), P v_new L(L+1)/2 V.
  const double L = 64, K = 128, V = 128;
  const double per_chunk = L * (L - 1) / 2 * K + L * (L + 1) / 2 * K + L * (L - 1) * (L - 2) / 6 + L * (L + 1) / 2 * (K + V) +
                           3 * L * K * V + L * (L + 1) / 2 * V;
  const Problem p = problem(Variant::KDA, {640}, 2);
  EXPECT_DOUBLE_EQ(layer_macs(p, GraphForm::WU), per_chunk * 10 * 2);
}

TEST_P(GraphOfVariantForm, EveryOperatorHasCountsAndKnownTensors) {
  const auto [v, f] = GetParam();
      for (bool in_place : {true, false}) {
        const OpGraph g = make_op_graph(v, f, in_place);
        std::set<std::string> produced = {"q", "k", "v", "g", "beta", "S"};
        for (const OperatorDef& op : g.ops) {
          for (const auto& in : op.inputs) {
            EXPECT_TRUE(g.has_tensor(in)) << op.name << " reads unknown " << in;
            EXPECT_TRUE(produced.count(in)) << op.name << " reads " << in << " before it is produced (" << graph_form_name(f) << ")";
          }
          for (const auto& out : op.outputs) produced.insert(out);
          const OpCounts c = op_counts(g, op, 64, 128, 128, 16);
          if (op.unit == Unit::Matrix) {
            EXPECT_GT(c.macs, 0) << op.name;
            EXPECT_GE(c.executed_macs, c.macs) << op.name;
          } else {
            EXPECT_GT(c.vector_ops, 0) << op.name;
          }
        }
        EXPECT_TRUE(produced.count("o"));
      }
}

TEST(OpGraph, KdaDecaysAreOneOperatorPerOperandAndKeepTheWorkOfOne) {
  // One operator per decayed operand (so an order can build each for its own consumers); together
  // they do the work the single decay_k did: two exponentials and three products on L x K, with
  // decay_q's exponential e^G reused for k e^G.
  const std::map<std::string, std::string> operand = {{"decay_q", "qe"}, {"decay_ke", "ke"}, {"decay_ki", "ki"}, {"decay_kl", "kl"}};
  for (GraphForm f : {GraphForm::WU, GraphForm::Inverse, GraphForm::GemmFirst})
    for (bool in_place : {true, false}) {
      const OpGraph g = make_op_graph(Variant::KDA, f, in_place);
      for (const auto& [L, K] : std::vector<std::pair<int64_t, int64_t>>{{64, 128}, {37, 48}}) {
        double decay_k_ops = 0;
        for (const OperatorDef& op : g.ops) {
          if (!is_decay_operator(op.id)) continue;
          EXPECT_EQ(op.outputs, std::vector<std::string>{operand.at(op.name)}) << op.name;
          EXPECT_EQ(op.unit, Unit::Vector);
          if (op.name != "decay_q") decay_k_ops += op_counts(g, op, L, K, 128, 16).vector_ops;
        }
        EXPECT_DOUBLE_EQ(decay_k_ops, 5.0 * static_cast<double>(L * K)) << graph_form_name(f);
        EXPECT_DOUBLE_EQ(op_counts(g, g.op(OpId::DecayQ), L, K, 128, 16).vector_ops, 2.0 * static_cast<double>(L * K));
      }
      for (const auto& [op, out] : operand) EXPECT_NO_THROW(g.op(op_id(op))) << op;
      EXPECT_FALSE(make_op_graph(Variant::GDN, f, in_place).has_tensor("ke"));
    }
  EXPECT_FALSE(is_decay_operator(OpId::Gate));
  EXPECT_FALSE(operator_id("decay_k"));  // the single decay_k of old is gone
}

TEST(Plans, FlaRunsItsSixKernelsWithAThroughGm) {
  // FLA's fla/ops/gated_delta_rule/chunk.py: cumsum, K K^T, solve_tril, W/U, fwd_h, fwd_o; A goes
  // from the K K^T kernel to the solve through GM in fp32 (the solve reads it on the vector unit).
  for (const Variant v : every_variant()) {
    const Plan fla = make_plan(problem(v, {1000}, 16), ascend310p(), "fla");
    std::vector<std::string> names;
    for (const Kernel& k : fla.kernels) names.push_back(k.name);
    EXPECT_EQ(names, (std::vector<std::string>{"chunk_local_cumsum", "chunk_scaled_dot_kkt_fwd", "solve_tril", "recompute_w_u", "fwd_h", "fwd_o"}))
        << variant_name(v);
    auto moves_of = [&](const Kernel& k, const std::string& path) {
      int n = 0, elem = 0;
      for (const Step& st : k.steps)
        if (st.kind == StepKind::Move && st.tensor == "A" && st.path == path) ++n, elem = st.elem_bytes;
      return std::pair{n, elem};
    };
    EXPECT_EQ(moves_of(fla.kernels[1], "UB->GM"), (std::pair{1, 4})) << variant_name(v);
    EXPECT_EQ(moves_of(fla.kernels[2], "GM->UB"), (std::pair{1, 4})) << variant_name(v);
    EXPECT_EQ(op_names(fla.kernels[2].order), (std::vector<std::string>{"solve_diag", "solve_inv"}));
    // The megakernel: the same six phases, one launch.
    const Plan mk = make_plan(problem(v, {1000}, 16), ascend310p(), "fla-megakernel");
    ASSERT_EQ(mk.kernels.size(), 6u);
    for (size_t i = 0; i < mk.kernels.size(); ++i) EXPECT_EQ(mk.kernels[i].launch, i == 0);
  }
}

TEST(Plans, VllmAscendConvertsTheOperandsAndResultsOfItsTorchMatmuls) {
  // On the 310P every torch matmul of the WY preparation (K K^T; T kb and T vb) runs TransData
  // kernels: one per ND operand before it, one per result after it (the device's
  // framework_matmul_transdata_per_tensor = 1); a device without them gets the same plan without.
  const Device dev = ascend310p();
  ASSERT_EQ(dev.framework_matmul_transdata_per_tensor.value, 1);
  Device none = dev;
  none.framework_matmul_transdata_per_tensor.value = 0;
  for (const Variant v : every_variant()) {
    const Problem p = problem(v, {1000}, 16);
    const Plan with = make_plan(p, dev, "vllm-ascend"), without = make_plan(p, none, "vllm-ascend");
    std::vector<std::string> converted;
    std::vector<Kernel> rest;
    for (const Kernel& k : with.kernels) {
      if (k.name.rfind("transdata_", 0) != 0) {
        rest.push_back(k);
        continue;
      }
      EXPECT_TRUE(k.order.empty()) << k.name;
      ASSERT_EQ(k.steps.size(), 3u) << k.name;
      EXPECT_EQ(k.steps[0].path, "GM->UB");
      EXPECT_EQ(k.steps[1].kind, StepKind::Transform);
      EXPECT_EQ(k.steps[2].path, "UB->GM");
      for (const Step& st : k.steps) EXPECT_EQ(st.tensor, k.steps[0].tensor) << k.name;
      EXPECT_EQ(k.cores, with.kernels[0].cores) << k.name;  // chunk-parallel like the torch kernels
      EXPECT_LE(k.peak_bytes.at("UB"), static_cast<int64_t>(dev.buffer("UB").capacity_bytes.value));
      converted.push_back(k.steps[0].tensor + (k.name.find("nd_to_nz") != std::string::npos ? ">" : "<"));
    }
    const bool kda = variant_traits(v).channel_gate();
    const std::vector<std::string> want = {kda ? "ke>" : "k>", kda ? "ki>" : "k>", "KK<", "Tm>", "kb>", "Tm>", "vb>", "W<", "U<"};
    EXPECT_EQ(converted, want) << variant_name(v);
    EXPECT_EQ(rest, without.kernels) << variant_name(v);
    EXPECT_NO_THROW(validate_plan(with));
    EXPECT_EQ(plan_from_json(plan_to_json(with)), with);
  }
}

TEST(Plans, KdaKernelsBuildOnlyTheDecayedOperandsTheyMultiply) {
  // FLA's kernels recompute the decayed q/k they multiply: K K^T k e^G and k e^-G, W/U k e^G,
  // the recurrence k e^(G_L - G) only, the output q e^G and k e^-G; the solve reads A alone.
  auto decays = [](const Kernel& k) {
    std::vector<std::string> d;
    for (const OpId o : k.order)
      if (is_decay_operator(o)) d.emplace_back(operator_name(o));
    return d;
  };
  const Plan fla = make_plan(problem(Variant::KDA, {1024}, 10), ascend310p(), "fla");
  std::map<std::string, std::vector<std::string>> want = {{"chunk_local_cumsum", {}},
                                                          {"chunk_scaled_dot_kkt_fwd", {"decay_ke", "decay_ki"}},
                                                          {"solve_tril", {}},
                                                          {"recompute_w_u", {"decay_ke"}},
                                                          {"fwd_h", {"decay_kl"}},
                                                          {"fwd_o", {"decay_q", "decay_ki"}}};
  ASSERT_EQ(fla.kernels.size(), want.size());
  for (const Kernel& k : fla.kernels) EXPECT_EQ(decays(k), want.at(k.name)) << k.name;
  // Every strategy: a kernel's decay operator feeds another operator of that kernel, or its
  // operand goes to GM for a later kernel (vLLM-Ascend's decay kernels: one torch kernel for q,
  // one for the three decayed keys).
  for (const std::string& s : every_strategy()) {
    const Plan plan = make_plan(problem(Variant::KDA, {300}, 11), ascend310p(), s);
    const OpGraph g = plan.graph();
    for (const Kernel& k : plan.kernels)
      for (const std::string& d : decays(k)) {
        const std::string& operand = g.op(op_id(d)).outputs.at(0);
        bool read_here = false;
        for (const OpId o : k.order)
          for (const std::string& in : g.op(o).inputs) read_here |= in == operand;
        const bool stored = std::any_of(k.steps.begin(), k.steps.end(), [&](const Step& st) {
          return st.kind == StepKind::Move && st.tensor == operand && st.path.find("->GM") != std::string::npos;
        });
        EXPECT_TRUE(read_here || stored) << s << " " << k.name << " " << d;
      }
  }
  const Plan vllm = make_plan(problem(Variant::KDA, {256}, 10), ascend310p(), "vllm-ascend");
  auto named = [&](const char* n) {
    for (const Kernel& k : vllm.kernels)
      if (k.name == n) return op_names(k.order);
    return std::vector<std::string>{};
  };
  EXPECT_EQ(named("decay_q"), std::vector<std::string>{"decay_q"});
  EXPECT_EQ(named("decay_k"), (std::vector<std::string>{"decay_ke", "decay_ki", "decay_kl"}));
}

// --- mapping -------------------------------------------------------------------------------------

std::map<int, int> tiers(const HeadMapping& m) {
  std::map<int, int> n;
  for (const auto& l : m.cores)
    for (const PlanItem& it : l) ++n[it.tier];
  for (const PlanItem& it : m.chunk_parallel) ++n[it.tier];
  return n;
}

TEST(Mapping, TailTiers) {
  // 16 heads on 8 cores: whole heads only.
  EXPECT_EQ(tiers(map_heads(problem(Variant::GDN, {256}, 16), 8, 16)), (std::map<int, int>{{1, 16}}));
  // 12 heads on 8 cores: 8 whole, the other 4 split by columns over all 8 cores.
  auto m = map_heads(problem(Variant::GDN, {256}, 12), 8, 16);
  EXPECT_EQ(tiers(m)[1], 8);
  EXPECT_GE(tiers(m)[2], 8);
  for (const auto& l : m.cores) {
    int cols = 0;
    for (const PlanItem& it : l)
      if (it.tier == 2) cols += it.col1 - it.col0;
    EXPECT_EQ(cols, 4 * 128 / 8);  // equal column share of the tail
  }
  // heads = cores + 1: one tail head, 8 quanta of 16 columns on 8 cores.
  m = map_heads(problem(Variant::GDN, {256}, 9), 8, 16);
  EXPECT_EQ(tiers(m)[1], 8);
  EXPECT_EQ(tiers(m)[2], 8);
  // 11 heads on 10 cores: the tail head has 8 quanta for 10 cores: chunk-parallel fallback.
  m = map_heads(problem(Variant::GDN, {256}, 11), 10, 16);
  EXPECT_EQ(tiers(m)[1], 10);
  EXPECT_EQ(tiers(m)[3], 1);
  // One head on many cores: column split (8 cores), fallback (16 cores).
  EXPECT_EQ(tiers(map_heads(problem(Variant::GDN, {4096}, 1), 8, 16))[2], 8);
  EXPECT_EQ(tiers(map_heads(problem(Variant::GDN, {4096}, 1), 16, 16))[3], 1);
}

TEST(Mapping, VarlenBalancesWholeHeadsLongestFirst) {
  const Problem p = problem(Variant::GDN, {4096, 64, 1000, 300}, 4);
  const HeadMapping m = map_heads(p, 8, 16);
  ASSERT_TRUE(m.chunk_parallel.empty());
  std::vector<double> load;
  for (const auto& l : m.cores) {
    double s = 0;
    for (const PlanItem& it : l) s += static_cast<double>(it.chunk1 - it.chunk0) * (it.col1 - it.col0) / 128;
    load.push_back(s);
  }
  // 16 items on 8 cores: the 4 longest (64 chunks each) go to 4 different cores.
  int heavy = 0;
  for (double x : load) heavy += x >= 64 ? 1 : 0;
  EXPECT_EQ(heavy, 4);
}

// --- coverage, dependencies, tiers for every strategy ------------------------------------------

struct Case {
  const char* name;
  Problem p;
  int cores;
};

std::vector<Case> shapes() {
  return {{"heads_lt_cores", problem(Variant::GDN, {1000}, 4), 8},
          {"heads_eq_cores_plus_1", problem(Variant::KDA, {700}, 9), 8},
          {"one_head_many_cores", problem(Variant::GDN, {2048}, 1), 16},
          {"tier3_tail", problem(Variant::KDA, {300}, 11), 10},
          {"varlen", problem(Variant::GDN, {15, 1000, 0, 64, 129}, 2, 4), 8},
          {"gva_batch", problem(Variant::KDA, {256, 256}, 2, 6), 8}};
}

// Counts, independently of validate_plan, how often the output operator runs on each cell.
void expect_output_once(const Plan& plan) {
  const Problem& p = plan.problem;
  std::map<std::tuple<int, int, int, int64_t>, int> seen;
  for (const Kernel& k : plan.kernels) {
    if (std::find(k.order.begin(), k.order.end(), OpId::Out) == k.order.end()) continue;
    for (const auto& l : k.cores)
      for (const PlanItem& it : l)
        for (int64_t c = it.chunk0; c < it.chunk1; ++c)
          for (int col = it.col0; col < it.col1; ++col) ++seen[{it.seq, it.head, col, c}];
  }
  int64_t cells = 0;
  for (int64_t s = 0; s < p.sequences(); ++s) cells += p.chunks_of(s) * p.HV * p.V;
  EXPECT_EQ(static_cast<int64_t>(seen.size()), cells) << plan.strategy;
  for (const auto& [cell, n] : seen) ASSERT_EQ(n, 1) << plan.strategy;
}

TEST(Plans, EveryStrategyCoversEveryCellOnEveryTailCase) {
  const Device dev = ascend310p();
  for (const Case& c : shapes())
    for (const std::string& s : every_strategy()) {
      SCOPED_TRACE(std::string(c.name) + " " + s);
      PlanOptions o;
      o.cores = c.cores;
      const Plan plan = make_plan(c.p, dev, s, o);  // runs validate_plan
      expect_output_once(plan);
      EXPECT_NO_THROW(validate_plan(plan));
    }
}

// Checks a chunk program without the lowering's bookkeeping: every operand a compute step reads
// must have been brought to the buffer its unit reads (L0A/L0B for the matrix unit, UB for the
// vector unit) by an earlier step that the compute transitively depends on, or be the carried state.
void expect_operands_delivered(const Plan& plan, const Device& dev) {
  const OpGraph g = plan.graph();
  for (const Kernel& k : plan.kernels) {
    SCOPED_TRACE(plan.strategy + " kernel " + k.name);
    std::vector<std::set<int>> closure(k.steps.size());
    std::map<std::pair<std::string, std::string>, int> arrived;  // (tensor, buffer) -> step
    for (size_t i = 0; i < k.steps.size(); ++i) {
      const Step& s = k.steps[i];
      for (int d : s.deps) {
        ASSERT_LT(d, static_cast<int>(i));
        closure[i].insert(d);
        closure[i].insert(closure[static_cast<size_t>(d)].begin(), closure[static_cast<size_t>(d)].end());
      }
      if (s.kind == StepKind::Compute) {
        ASSERT_TRUE(s.op.is_operator()) << step_op_name(s.op);
        const OperatorDef& op = g.op(s.op.op);
        for (size_t a = 0; a < op.inputs.size(); ++a) {
          const std::string& t = op.inputs[a];
          const std::string buf = op.unit == Unit::Vector ? dev.vector.buffer
                                  : static_cast<int>(a) < op.left ? dev.matrix.input_a : dev.matrix.input_b;
          auto it = arrived.find({t, buf});
          if (it == arrived.end()) {
            // Only the carried state may be there from the previous chunk.
            EXPECT_TRUE(t == "S" && buf == dev.vector.buffer && k.state_in != StateIn::None) << step_op_name(s.op) << " reads " << t << " from " << buf;
            continue;
          }
          EXPECT_TRUE(closure[i].count(it->second)) << step_op_name(s.op) << " does not wait for " << t << " in " << buf;
        }
        for (const std::string& out : op.outputs) arrived[{out, op.unit == Unit::Matrix ? dev.matrix.output : dev.vector.buffer}] = static_cast<int>(i);
      } else if (s.kind == StepKind::Move) {
        arrived[{s.tensor, s.path.substr(s.path.find("->") + 2)}] = static_cast<int>(i);
      } else if (s.kind == StepKind::Zero) {
        arrived[{s.tensor, dev.vector.buffer}] = static_cast<int>(i);
      }
    }
  }
}

TEST(Plans, ChunkProgramsDeliverEveryOperandBeforeItsUse) {
  const Device dev = ascend310p();
  for (const Case& c : shapes())
    for (const std::string& s : every_strategy()) {
      PlanOptions o;
      o.cores = c.cores;
      expect_operands_delivered(make_plan(c.p, dev, s, o), dev);
    }
}

Plan g_broken_plan;
Device g_device;

TEST(Plans, OperandCheckCatchesAMissingDependency) {
  g_device = ascend310p();
  g_broken_plan = make_plan(problem(Variant::GDN, {256}, 16), g_device, "hanpu");
  for (Step& s : g_broken_plan.kernels[0].steps)
    if (s.kind == StepKind::Compute && s.op == StepOp(OpId::Gate)) s.deps.clear();  // reads only g
  EXPECT_NONFATAL_FAILURE(expect_operands_delivered(g_broken_plan, g_device), "does not wait for");
}

TEST(Plans, TierThreeUsesChunkParallelFallbackKernels) {
  PlanOptions o;
  o.cores = 10;
  const Plan plan = make_plan(problem(Variant::GDN, {300}, 11), ascend310p(), "hanpu", o);
  std::vector<std::string> names;
  for (const Kernel& k : plan.kernels) names.push_back(k.name + ":" + parallel_name(k.parallel));
  EXPECT_EQ(names, (std::vector<std::string>{"fused:head", "tail_map:chunk", "tail_state:head", "tail_output:chunk"}));
}

TEST(Plans, ValidateCatchesMissingAndDuplicateWork) {
  Plan plan = make_plan(problem(Variant::GDN, {256}, 16), ascend310p(), "hanpu");
  Plan missing = plan;
  missing.kernels[0].cores[3].pop_back();
  try {
    validate_plan(missing);
    FAIL() << "missing item accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs 0 times"), std::string::npos) << e.what();
  }
  Plan twice = plan;
  twice.kernels[0].cores[0].push_back(twice.kernels[0].cores[1][0]);
  try {
    validate_plan(twice);
    FAIL() << "duplicate item accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("covered twice"), std::string::npos) << e.what();
  }
  // A chunk-parallel kernel cannot carry the state.
  Plan bad = make_plan(problem(Variant::GDN, {256}, 16), ascend310p(), "fla");
  std::swap(bad.kernels[4], bad.kernels[5]);  // fwd_o before fwd_h: the per-chunk states do not exist yet
  EXPECT_THROW(validate_plan(bad), Error);
}

TEST(Plans, HanpuKeepsOneStateAndFlaOrderTwo) {
  const Device dev = ascend310p();
  auto state_bytes = [](const Plan& p) {
    int64_t b = 0;
    for (const Lifetime& lt : p.kernels[0].lifetimes)
      if (lt.buffer == "UB" && (lt.tensor == "S" || lt.tensor == "S_next")) b += lt.bytes;
    return b;
  };
  const Problem p = problem(Variant::GDN, {1024}, 16);
  EXPECT_EQ(state_bytes(make_plan(p, dev, "hanpu")), 128 * 128 * 4);
  EXPECT_EQ(state_bytes(make_plan(p, dev, "fla+mapping")), 2 * 128 * 128 * 4);
}

TEST(Plans, GemmFirstGroupsSharedInputGemmsBeforeTheSolve) {
  const Plan plan = make_plan(problem(Variant::GDN, {256}, 16), ascend310p(), "hanpu");
  const auto& order = plan.kernels[0].order;
  auto pos = [&](const char* n) { return position(order, n); };
  for (const char* gemm : {"kkt", "qkt", "ks", "qs"}) EXPECT_LT(pos(gemm), pos("solve")) << gemm;
  EXPECT_EQ(pos("qkt") - pos("kkt"), 1);
  EXPECT_EQ(pos("ks") - pos("qkt"), 1);
  EXPECT_EQ(pos("qs") - pos("ks"), 1);
  EXPECT_LT(pos("out"), pos("state_add"));  // chunk-first: the output reads S before the update
}

// --- capacity ------------------------------------------------------------------------------------

Device with_ub(double bytes) {
  Device d = ascend310p();
  for (BufferSpec& b : d.buffers)
    if (b.name == "UB") b.capacity_bytes.value = bytes;
  return d;
}

TEST(Capacity, HeadsThatDoNotFitAreSplitByColumns) {
  // 96 KiB of UB cannot hold a 64 KiB state plus its chunk: the planner halves the column block
  // until the live set fits, rather than spilling.
  const Plan plan = make_plan(problem(Variant::GDN, {256}, 16), with_ub(96 * 1024), "hanpu");
  EXPECT_LE(plan.kernels[0].peak_bytes.at("UB"), 96 * 1024);
  EXPECT_TRUE(plan.kernels[0].spilled.empty());
  for (const auto& l : plan.kernels[0].cores)
    for (const PlanItem& it : l) EXPECT_LT(it.col1 - it.col0, 128);
}

TEST(Capacity, OverflowNamesBufferAndTensors) {
  // 12 KiB: not even the chunk's 64 x 64 fp32 products fit, whatever the column block.
  try {
    make_plan(problem(Variant::GDN, {256}, 16), with_ub(12 * 1024), "hanpu");
    FAIL() << "12 KiB of UB accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bytes of UB"), std::string::npos) << m;
    EXPECT_NE(m.find("capacity 12288"), std::string::npos) << m;
    EXPECT_NE(m.find("live at the peak: "), std::string::npos) << m;
    EXPECT_NE(m.find(" B)"), std::string::npos) << m;
  }
}

TEST(Capacity, SpillingStrategiesAccountTheirSpills) {
  const Device small = with_ub(216 * 1024);
  // FLA order keeps two states (128 KiB) plus the update product K^T v_new (64 KiB), v_new and the
  // 16 KiB the kernel reserves: without its prefetch slots it still does not fit, and spilling
  // v_new makes it fit at full width (under 208 KiB the states and the reserve alone do not fit,
  // and the head is split by columns instead).
  const Plan plan = make_plan(problem(Variant::GDN, {512}, 16), small, "fla+mapping");
  ASSERT_FALSE(plan.kernels[0].spilled.empty());
  EXPECT_LE(plan.kernels[0].peak_bytes.at("UB"), 216 * 1024);
  EXPECT_TRUE(plan.kernels[0].double_buffered.empty());  // prefetch slots are given up before spilling
  int32_t widest = 0;  // whole heads stay whole (the 6 tail heads of 16 on 10 cores are column-split by the mapping)
  for (const auto& l : plan.kernels[0].cores)
    for (const PlanItem& it : l) widest = std::max(widest, it.col1 - it.col0);
  EXPECT_EQ(widest, 128);
}

// --- layout DP -------------------------------------------------------------------------------------

TEST_P(GraphOfVariantForm, LayoutDpMatchesExhaustiveSearch) {
  const Device dev = ascend310p();
  const auto [v, f] = GetParam();
      for (bool in_place : {true, false}) {
        const OpGraph g = make_op_graph(v, f, in_place);
        std::vector<OpId> order;
        for (const auto& op : g.ops) order.push_back(op.id);
        const LayoutProblem lp = layout_problem(g, order, dev, 64, 128, 128);
        ASSERT_LE(lp.tensors.size(), 24u);
        const LayoutSolution dp = solve_layouts_dp(lp), ex = solve_layouts_exhaustive(lp);
        EXPECT_NEAR(dp.cost, ex.cost, 1e-15) << variant_name(v) << " " << graph_form_name(f);
      }
}

TEST(LayoutDp, AGmInputSeveralVectorOperatorsReadIsConvertedOnceOnArrival) {
  // KDA's k feeds three decay operators: its UB layout is a decision, blocked costs one conversion
  // on arrival that the three share. q (one decay) and GDN's inputs stay unary costs of their reader.
  const Device dev = ascend310p();
  for (Variant v : every_variant()) {
    const OpGraph g = make_op_graph(v, GraphForm::GemmFirst, true);
    std::vector<OpId> order;
    for (const auto& op : g.ops) order.push_back(op.id);
    const LayoutProblem lp = layout_problem(g, order, dev, 64, 128, 128);
    const bool has_k = std::find(lp.tensors.begin(), lp.tensors.end(), "k") != lp.tensors.end();
    EXPECT_EQ(has_k, variant_traits(v).channel_gate()) << variant_name(v);
    EXPECT_EQ(std::find(lp.tensors.begin(), lp.tensors.end(), "q"), lp.tensors.end()) << variant_name(v);
  }
  const Plan plan = make_plan(problem(Variant::KDA, {256}, 10), dev, "hanpu");
  ASSERT_EQ(plan.layouts.at("k"), Layout::Blocked);
  int k_transforms = 0;
  for (const Step& st : plan.kernels[0].steps) k_transforms += st.kind == StepKind::Transform && st.tensor == "k";
  EXPECT_EQ(k_transforms, 1);
  // Unplanned (every tensor dense, the decays included) k is read as it arrives: no conversion.
  const Plan dense = make_plan(problem(Variant::KDA, {256}, 10), dev, "fla+mapping+reordering");
  for (const Step& st : dense.kernels[0].steps) EXPECT_FALSE(st.kind == StepKind::Transform && st.tensor == "k");
}

double evaluate(const LayoutProblem& lp, const std::vector<Layout>& l) {
  double c = 0;
  for (size_t i = 0; i < lp.tensors.size(); ++i) c += lp.unary[i][l[i] == Layout::Blocked];
  for (const auto& p : lp.pairs) c += p.cost[(l[p.a] == Layout::Blocked) * 2 + (l[p.b] == Layout::Blocked)];
  return c;
}

TEST(LayoutDp, MatchesExhaustiveSearchOnRandomProblems) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    LayoutProblem lp;
    const int n = 1 + trial % 12;
    for (int i = 0; i < n; ++i) {
      lp.tensors.push_back("t" + std::to_string(i));
      lp.unary.push_back({cost(rng), cost(rng)});
    }
    const int pairs = static_cast<int>(rng() % (2 * n + 1));
    for (int k = 0; k < pairs && n > 1; ++k) {
      int a = static_cast<int>(rng() % n), b = static_cast<int>(rng() % n);
      if (a == b) continue;
      if (a > b) std::swap(a, b);
      lp.pairs.push_back({a, b, {cost(rng), cost(rng), cost(rng), cost(rng)}});
    }
    const LayoutSolution dp = solve_layouts_dp(lp), ex = solve_layouts_exhaustive(lp);
    ASSERT_NEAR(dp.cost, ex.cost, 1e-12) << "trial " << trial;
    ASSERT_NEAR(evaluate(lp, dp.layout), dp.cost, 1e-12) << "the DP's assignment does not cost what it claims";
  }
}

TEST(LayoutDp, PlannedLayoutsAreNoWorseThanAllDense) {
  const Device dev = ascend310p();
  const OpGraph g = make_op_graph(Variant::GDN, GraphForm::GemmFirst, true);
  std::vector<OpId> order;
  for (const auto& op : g.ops) order.push_back(op.id);
  const LayoutProblem lp = layout_problem(g, order, dev, 64, 128, 128);
  const LayoutSolution dp = solve_layouts_dp(lp);
  EXPECT_LT(dp.cost, evaluate(lp, std::vector<Layout>(lp.tensors.size(), Layout::Dense)));
}

// --- JSON ------------------------------------------------------------------------------------------

TEST(PlanJson, RoundTripIsIdentical) {
  const Device dev = ascend310p();
  for (const Case& c : shapes())
    for (const std::string& s : every_strategy()) {
      SCOPED_TRACE(std::string(c.name) + " " + s);
      PlanOptions o;
      o.cores = c.cores;
      const Plan plan = make_plan(c.p, dev, s, o);
      const nlohmann::json j = plan_to_json(plan);
      const Plan back = plan_from_json(nlohmann::json::parse(j.dump()));
      EXPECT_TRUE(back == plan);
      EXPECT_EQ(plan_to_json(back).dump(), j.dump());
    }
}

std::string parse_error(const nlohmann::json& j) {
  try {
    plan_from_json(j, "plan.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PlanJson, MalformedFieldsAreNamed) {
  const nlohmann::json good = plan_to_json(make_plan(problem(Variant::GDN, {256}, 16), ascend310p(), "fla"));
  auto j = good;
  j["kernels"][1]["steps"][3].erase("kind");
  EXPECT_NE(parse_error(j).find("plan.kernels[1].steps[3].kind"), std::string::npos) << parse_error(j);
  j = good;
  j["kernels"][1]["steps"][3]["kind"] = "mov";
  EXPECT_NE(parse_error(j).find("expected one of compute, move"), std::string::npos) << parse_error(j);
  // A unit lane is "matrix" or "vector"; only a move's lane may name a DMA engine.
  size_t compute = 0, move = 0;
  while (good["kernels"][1]["steps"][compute]["kind"] != "compute") ++compute;
  while (good["kernels"][1]["steps"][move]["kind"] != "move") ++move;
  j = good;
  j["kernels"][1]["steps"][compute]["lane"] = "MTE2";
  EXPECT_NE(parse_error(j).find("plan.kernels[1].steps[" + std::to_string(compute) + "].lane: got \"MTE2\", expected one of matrix, vector"),
            std::string::npos)
      << parse_error(j);
  j = good;
  j["kernels"][1]["steps"][move]["lane"] = "";
  EXPECT_NE(parse_error(j).find("expected one of matrix, vector, or the name of a DMA engine"), std::string::npos) << parse_error(j);
  j = good;
  j["kernels"][1]["steps"][3]["when"] = "always";
  EXPECT_NE(parse_error(j).find("plan.kernels[1].steps[3].when: got \"always\", expected one of every, first, last"), std::string::npos)
      << parse_error(j);
  j = good;
  j["cores"] = "eight";
  EXPECT_NE(parse_error(j).find("plan.cores: got \"eight\", expected an integer"), std::string::npos) << parse_error(j);
  j = good;
  j["problem"]["variant"] = "gla";
  EXPECT_NE(parse_error(j).find("plan.problem.variant"), std::string::npos) << parse_error(j);
  j = good;
  j["problem"]["HV"] = 5;
  EXPECT_NE(parse_error(j).find("problem.HV: got 5"), std::string::npos) << parse_error(j);
  j = good;
  j["kernels"][0]["cores"][2][0] = {0, 0, 0, 128, 0};
  EXPECT_NE(parse_error(j).find("plan.kernels[0].cores[2][0]"), std::string::npos) << parse_error(j);
  j = good;
  j["kernels"][2]["order"][0] = "nonsense";
  EXPECT_NE(parse_error(j).find("plan.kernels[2].order[0]"), std::string::npos) << parse_error(j);
  j = good;
  j["kernels"][0]["steps"][2]["deps"] = {5};
  EXPECT_NE(parse_error(j).find("plan.kernels[0].steps[2].deps[0]"), std::string::npos) << parse_error(j);
  j = good;
  std::swap(j["kernels"][4]["order"][0], j["kernels"][4]["order"][1]);  // order no longer matches the steps
  EXPECT_NE(parse_error(j).find("plan.kernels[4].steps: the compute steps do not run"), std::string::npos) << parse_error(j);
  // Step operators by name at the edge: a compute step's must be an operator of this graph, any
  // other step's may also be the state's traffic; anything else is refused naming the field.
  j = good;
  j["kernels"][1]["steps"][compute]["op"] = "state_in";
  EXPECT_NE(parse_error(j).find("plan.kernels[1].steps[" + std::to_string(compute) + "].op: got \"state_in\", expected an operator of the graph"),
            std::string::npos)
      << parse_error(j);
  j = good;
  j["kernels"][1]["steps"][move]["op"] = "decay_k";
  EXPECT_NE(parse_error(j).find("plan.kernels[1].steps[" + std::to_string(move) +
                                "].op: got \"decay_k\", expected an operator of the graph, state_in, state_out or state_snapshot"),
            std::string::npos)
      << parse_error(j);
  j = good;
  j["kernels"][0]["cores"][0].erase(0);  // coverage broken
  EXPECT_NE(parse_error(j).find("runs 0 times"), std::string::npos) << parse_error(j);
}

TEST(PlanJson, UnknownStrategyIsRejected) {
  try {
    make_plan(problem(Variant::GDN, {256}, 16), ascend310p(), "flash");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strategy: got \"flash\""), std::string::npos);
  }
}


// --- lifetime-aware reordering -------------------------------------------------------------------

// Every topological order of `g` (with the in-place update after the other readers of the state),
// by recursion; calls `visit` with each.
void each_order(const OpGraph& g, std::vector<OpId>& prefix, std::vector<bool>& used,
                const std::function<void(const std::vector<OpId>&)>& visit) {
  if (prefix.size() == g.ops.size()) {
    visit(prefix);
    return;
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (used[i]) continue;
    bool ready = true;
    for (const std::string& in : g.ops[i].inputs)
      for (size_t j = 0; j < g.ops.size(); ++j) {
        const auto& outs = g.ops[j].outputs;
        const bool produces = j != i && std::find(outs.begin(), outs.end(), in) != outs.end() &&
                              std::find(g.ops[j].inputs.begin(), g.ops[j].inputs.end(), in) == g.ops[j].inputs.end();
        if (produces && !used[j]) ready = false;
      }
    for (const std::string& out : g.ops[i].outputs)  // in place: every other reader first
      if (std::find(g.ops[i].inputs.begin(), g.ops[i].inputs.end(), out) != g.ops[i].inputs.end())
        for (size_t j = 0; j < g.ops.size(); ++j) {
          const auto& in = g.ops[j].inputs;
          if (j != i && std::find(in.begin(), in.end(), out) != in.end() && !used[j]) ready = false;
        }
    if (!ready) continue;
    used[i] = true;
    prefix.push_back(g.ops[i].id);
    each_order(g, prefix, used, visit);
    prefix.pop_back();
    used[i] = false;
  }
}

// A random chunk graph: `n` operators, each reading one or two earlier tensors or inputs and
// writing one tensor of a random shape; random units; an in-place state update at the end.
OpGraph random_graph(std::mt19937& rng, int n) {
  OpGraph g;
  const char* dims[] = {"L", "K", "V", "1"};
  std::uniform_int_distribution<int> dim(0, 3), coin(0, 1);
  g.tensors.push_back({"x", "L", "K", DType::F16, TensorRole::Input});
  g.tensors.push_back({"y", "L", "V", DType::F16, TensorRole::Input});
  g.tensors.push_back({"S", "K", "V", DType::F32, TensorRole::State});
  std::vector<std::string> available = {"x", "y", "S"};
  for (int i = 0; i < n - 1; ++i) {
    OperatorDef op;
    // Distinct operators need distinct ids (orders hold OpIds): the manifest's first n, as labels.
    op.id = static_cast<OpId>(i);
    op.name = std::string(operator_name(op.id));
    op.unit = coin(rng) ? Unit::Matrix : Unit::Vector;
    std::uniform_int_distribution<size_t> pick(0, available.size() - 1);
    op.inputs.push_back(available[pick(rng)]);
    if (coin(rng)) {
      const std::string second = available[pick(rng)];
      if (second != op.inputs[0]) op.inputs.push_back(second);
    }
    op.left = 1;
    const std::string out = "t" + std::to_string(i);
    g.tensors.push_back({out, dims[dim(rng)], dims[dim(rng)], op.unit == Unit::Matrix ? DType::F32 : DType::F16,
                         i == n - 2 ? TensorRole::Output : TensorRole::Intermediate});
    op.outputs.push_back(out);
    g.ops.push_back(op);
    if (i != n - 2) available.push_back(out);
  }
  OperatorDef update;
  update.id = static_cast<OpId>(n - 1);
  update.name = std::string(operator_name(update.id));
  update.inputs = {"S", available.back()};
  update.outputs = {"S"};
  g.ops.push_back(update);
  return g;
}

TEST(Reordering, ExactAgainstEveryOrderOnSmallGraphs) {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 200; ++trial) {
    const OpGraph g = random_graph(rng, 4 + trial % 5);
    const int64_t capacity = trial % 3 == 0 ? 64 * 1024 : 1 << 30;  // sometimes L0C binds
    int64_t best_peak = std::numeric_limits<int64_t>::max();
    int best_handoffs = std::numeric_limits<int>::max();
    std::vector<OpId> prefix;
    std::vector<bool> used(g.ops.size(), false);
    // The exhaustive reference: each order's peak is the model's, feasible only within capacity.
    each_order(g, prefix, used, [&](const std::vector<OpId>& order) {
      const ReorderResult r = order_occupancy(g, order, 64, 128, 128);
      if (r.peak_result_bytes > capacity) return;
      if (r.peak_vector_bytes < best_peak || (r.peak_vector_bytes == best_peak && r.handoffs < best_handoffs))
        best_peak = r.peak_vector_bytes, best_handoffs = r.handoffs;
    });
    SCOPED_TRACE("trial " + std::to_string(trial));
    if (best_peak == std::numeric_limits<int64_t>::max()) {
      EXPECT_THROW(lifetime_aware_order(g, 64, 128, 128, capacity), Error);
      continue;
    }
    const ReorderResult pass = lifetime_aware_order(g, 64, 128, 128, capacity);
    EXPECT_EQ(pass.peak_vector_bytes, best_peak);
    EXPECT_EQ(pass.handoffs, best_handoffs);
    // The order it returns is valid and has the peak it claims.
    const ReorderResult check = order_occupancy(g, pass.order, 64, 128, 128);
    EXPECT_EQ(check.peak_vector_bytes, pass.peak_vector_bytes);
    EXPECT_EQ(check.handoffs, pass.handoffs);
    EXPECT_LE(check.peak_result_bytes, capacity);
  }
}

TEST_P(PlanOfVariant, ReorderingGivesGemmFirstAndALowerPeakThanTheGraphOrder) {
  {
    const Variant v = GetParam();
    const OpGraph g = make_op_graph(v, GraphForm::GemmFirst, true);
    std::vector<OpId> graph_order;
    for (const OperatorDef& op : g.ops) graph_order.push_back(op.id);
    const ReorderResult pass = lifetime_aware_order(g, 64, 128, 128, 256 * 1024);
    const ReorderResult fixed = order_occupancy(g, graph_order, 64, 128, 128);
    EXPECT_LE(pass.peak_vector_bytes, fixed.peak_vector_bytes) << variant_name(v);
    EXPECT_LE(pass.handoffs, fixed.handoffs) << variant_name(v);
    // The four shared-input GEMMs run back to back, and the output reads S before the update.
    auto pos = [&](const char* n) { return position(pass.order, n); };
    EXPECT_EQ(pos("qkt") - pos("kkt"), 1) << variant_name(v);
    EXPECT_EQ(pos("ks") - pos("qkt"), 1) << variant_name(v);
    EXPECT_EQ(pos("qs") - pos("ks"), 1) << variant_name(v);
    EXPECT_LT(pos("qs"), pos("state_add"));
    EXPECT_LT(pos("out"), pos("state_add"));
    // The planned hanpu kernel uses this order and lets results wait in L0C.
    const Plan plan = make_plan(problem(v, {256}, 10), ascend310p(), "fla+mapping+reordering");
    EXPECT_EQ(plan.kernels[0].order, pass.order);
    EXPECT_TRUE(plan.kernels[0].results_wait);
    EXPECT_FALSE(make_plan(problem(v, {256}, 10), ascend310p(), "fla+mapping").kernels[0].results_wait);
  }
}

// --- buffer accounting ---------------------------------------------------------------------------

TEST(BufferAccounting, PrefetchSlotsSpanTheChunkAndReservedScratchIsCounted) {
  const Device dev = ascend310p();
  const Plan plan = make_plan(problem(Variant::GDN, {1024}, 10), dev, "hanpu");
  const Kernel& k = plan.kernels[0];
  const int last = static_cast<int>(k.steps.size()) - 1;
  ASSERT_FALSE(k.double_buffered.empty());
  for (const std::string& t : k.double_buffered) {
    bool slot = false;
    for (const Lifetime& lt : k.lifetimes)
      if (lt.tensor == t + "(next chunk)") slot = slot || (lt.first == 0 && lt.last == last);
    EXPECT_TRUE(slot) << t;
  }
  bool reserved = false;
  for (const Lifetime& lt : k.lifetimes)
    if (lt.tensor == "(reserved)" && lt.buffer == "UB")
      reserved = lt.bytes == static_cast<int64_t>(dev.buffer("UB").reserved_bytes.value) && lt.first == 0 && lt.last == last;
  EXPECT_TRUE(reserved);
  EXPECT_GT(dev.buffer("UB").reserved_bytes.value, 0);
  EXPECT_EQ(dev.buffer("UB").reserved_bytes.status, "estimate");
}

TEST(BufferAccounting, OperandsStayInL0OnlyAcrossAdjacentGemms) {
  // GEMM-first (K K^T, Q K^T, K S, Q S adjacent) loads K and Q into L0 once for the group; the
  // FLA order, with vector work between its GEMMs, reloads them.
  const Device dev = ascend310p();
  auto l1_to_l0_moves = [](const Kernel& k, const std::string& t) {
    int n = 0;
    for (const Step& s : k.steps)
      if (s.kind == StepKind::Move && s.tensor == t && s.path.rfind("L1->L0", 0) == 0 && s.when == StepWhen::Every) ++n;
    return n;
  };
  const Plan reordered = make_plan(problem(Variant::GDN, {256}, 10), dev, "fla+mapping+reordering");
  const Kernel& k = reordered.kernels[0];
  // k feeds kkt (both sides), qkt and ks: adjacent, so k's L0A/L0B copies are each loaded once
  // for the group; its later use (the update) reloads it after vector work.
  int k_loads_in_group = 0;
  bool in_group = true;
  for (const Step& s : k.steps) {
    if (s.kind == StepKind::Compute && s.lane == StepLane::Vector) in_group = false;
    if (in_group && s.kind == StepKind::Move && s.tensor == "k" && s.path.rfind("L1->L0", 0) == 0) ++k_loads_in_group;
  }
  EXPECT_LE(k_loads_in_group, 2);
  EXPECT_GT(l1_to_l0_moves(k, "k"), k_loads_in_group);  // reloaded after the vector operators
  // The old state stays in UB until its last reader in state-first order (FLA's, next state in
  // a second buffer): both states are live together.
  const Plan fla_order = make_plan(problem(Variant::GDN, {256}, 10), dev, "fla+mapping");
  bool both = false;
  const Kernel& f = fla_order.kernels[0];
  for (const Lifetime& s : f.lifetimes)
    for (const Lifetime& n : f.lifetimes)
      if (s.tensor == "S" && n.tensor == "S_next" && s.buffer == "UB" && n.buffer == "UB" && s.last >= n.first) both = true;
  EXPECT_TRUE(both);
}

INSTANTIATE_TEST_SUITE_P(Registry, GraphOfVariantForm,
                         ::testing::Combine(::testing::ValuesIn(every_variant()), ::testing::ValuesIn(kGraphForms)),
                         variant_form_name);
INSTANTIATE_TEST_SUITE_P(Registry, PlanOfVariant, ::testing::ValuesIn(every_variant()), variant_param_name);

}  // namespace
}  // namespace hanpu
