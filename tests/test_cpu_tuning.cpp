// The planner tunes the CPU (issue 11 item 3): the CPU backend's free parameters are fields of the
// Plan's CPU part with reasons, chosen from the host description; the CPU runs every allowed value
// exactly (fp64 reference) and refuses a value it cannot run naming the field; wisdom files round
// trip, malformed ones are errors naming the file and field, another CPU's wisdom is ignored with a
// reason; `hanpu tune` on a tiny problem writes wisdom the planner then uses. No timing is checked.
#include <gtest/gtest.h>

#include <map>

#include "cpu/cpu_planning.hpp"
#include "cpu/kernels.hpp"
#include "cpu/lowering.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/cpu_tuning.hpp"
#include "hanpu/device.hpp"
#include "hanpu/plan_exec.hpp"
#include "io/file_io.hpp"
#include "la_testing.hpp"
#include "registry_testing.hpp"
#include "test_support.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace hanpu {
namespace {

using testing::error_of;
using testing::make_problem;
using testing::nmse;
using testing::ProblemSpec;
using testing::shell_quote;
using testing::TempDir;

const Device& host(int threads) {
  static std::map<int, Device> devices;
  auto it = devices.find(threads);
  if (it == devices.end()) it = devices.emplace(threads, host_device(threads, 0.0)).first;
  return it->second;
}

Problem big_gdn() {
  Problem p;
  p.seqlens = {4096};
  p.H = p.HV = 16;
  p.qkv_dtype = p.out_dtype = DType::F32;
  return p;
}

// The CPU backend's rules without wisdom: the model-based choice.
PlanOptions no_wisdom(int cores) {
  PlanOptions po;
  po.cores = cores;
  po.backend = &cpu_plan_backend();
  return po;
}

// `po` with the CPU backend's rules and the wisdom of `path`, read as the callers do.
PlanOptions with_wisdom_file(PlanOptions po, const std::string& path) {
  po.backend = &cpu_plan_backend();
  po.wisdom = std::make_shared<const Wisdom>(read_wisdom(path));
  po.wisdom_origin = path;
  return po;
}

TEST(CpuTuning, PlansForTheHostCarryEveryParameterWithAReasonAndRoundTripThroughJson) {
  const Plan plan = make_plan(big_gdn(), host(2), "hanpu", no_wisdom(2));
  ASSERT_TRUE(plan.cpu.set());
  EXPECT_EQ(plan.cpu.source, "model");
  for (const std::string& name : cpu_param_names()) {
    EXPECT_FALSE(cpu_param(plan.cpu, name).reason.empty()) << name;
    EXPECT_TRUE(plan_to_json(plan)["cpu"].contains(name)) << name;
  }
  EXPECT_EQ(plan_from_json(plan_to_json(plan)), plan);
  // An NPU plan has no CPU part and its JSON none either.
  const Plan npu = make_plan(big_gdn(), load_device(testing::golden_dir().parent_path().parent_path().string() +
                                                    "/devices/ascend310p.json"),
                             "hanpu");
  EXPECT_FALSE(npu.cpu.set());
  EXPECT_FALSE(plan_to_json(npu).contains("cpu"));
  EXPECT_EQ(plan_from_json(plan_to_json(npu)), npu);
}

TEST(CpuTuning, TheModelFollowsTheHostDescription) {
  Device dev = host(2);
  for (BufferSpec& b : dev.buffers)
    if (b.name == "L2") b.capacity_bytes.value = 1 << 20;
  dev.vector.registers.value = 32;
  dev.matrix.tile_n.value = 16;
  CpuTuning t = cpu::model_cpu_tuning(big_gdn(), dev, 2);
  EXPECT_EQ(t.gemm_rows.value, 8);
  EXPECT_EQ(t.gemm_vectors.value, 3);
  EXPECT_NE(t.gemm_rows.reason.find("of 32 vector registers"), std::string::npos) << t.gemm_rows.reason;
  EXPECT_EQ(t.column_block.value, 128);  // a 72 KiB state fits a quarter of 1 MiB
  EXPECT_EQ(t.lockstep_group.value, 3);  // 3 states of 72 KiB in 256 KiB
  EXPECT_NE(t.lockstep_group.reason.find("1024 KiB L2"), std::string::npos) << t.lockstep_group.reason;
  EXPECT_EQ(t.prefetch_rate.value, 1);
  // The cap counts a core's items over every sequence: 2 sequences x 4 small heads on 2 cores.
  Problem batch;
  batch.seqlens = {75, 75};
  batch.H = batch.HV = 4;
  batch.K = batch.V = 32;
  EXPECT_EQ(cpu::model_cpu_tuning(batch, dev, 2).lockstep_group.value, 4) << cpu::model_cpu_tuning(batch, dev, 2).lockstep_group.reason;
  dev.vector.registers.value = 16;  // AVX2 register file: the 6 x 2 tile
  t = cpu::model_cpu_tuning(big_gdn(), dev, 2);
  EXPECT_EQ(t.gemm_rows.value, 6);
  EXPECT_EQ(t.gemm_vectors.value, 2);
  for (BufferSpec& b : dev.buffers)
    if (b.name == "L2") b.capacity_bytes.value = 128 << 10;  // a state crowds a 128 KiB L2: column blocks
  t = cpu::model_cpu_tuning(big_gdn(), dev, 2);
  EXPECT_EQ(t.column_block.value, 32);  // 128 x 32 f32 = 16 KiB <= 32 KiB; 64 columns pad to 40 KiB
  EXPECT_EQ(t.lockstep_group.value, 2);
  // The planner follows its CPU part: column blocks of 32 and groups of at most 2 like blocks.
  const Plan plan = make_plan(big_gdn(), dev, "hanpu", no_wisdom(2));
  ASSERT_EQ(plan.kernels[0].name, "fused");
  for (const auto& list : plan.kernels[0].cores)
    for (const PlanItem& it : list) EXPECT_EQ(it.col1 - it.col0, 32);
  for (const auto& g : plan.kernels[0].groups)
    for (int32_t n : g) {
      EXPECT_LE(n, 2);
      EXPECT_GE(n, 2);  // like column blocks of neighbouring heads are adjacent, so groups fill up
    }
}

// Every allowed value of every parameter through the CPU on tail cases, against fp64.
TEST(CpuTuning, EveryAllowedValueRunsExactly) {
  struct Case {
    ProblemSpec spec;
    int cores;
  };
  std::vector<Case> cases;
  for (Variant v : testing::every_variant()) {
    ProblemSpec a;  // T not a multiple of 64, HV > H, heads not a multiple of the cores (tier 2)
    a.variant = v, a.T = 200, a.H = 2, a.HV = 6, a.K = 64, a.V = 64, a.seed = 21;
    cases.push_back({a, 4});
    ProblemSpec b = a;  // odd dims, one thread, every head in the groups
    b.T = 77, b.H = 1, b.HV = 3, b.K = 40, b.V = 48, b.seed = 22;
    cases.push_back({b, 1});
  }
  const int max_rows = cpu::gemm_max_rows(), max_vectors = cpu::gemm_max_vectors();
  for (const Case& c : cases) {
    const auto p = make_problem(c.spec);
    const LaReference ref = la_reference(c.spec.variant, p.inputs(), c.spec.opt);
    const Problem prob = problem_for_inputs(c.spec.variant, p.inputs(), c.spec.opt);
    const CpuTuning model = make_plan(prob, host(c.cores), "hanpu", no_wisdom(c.cores)).cpu;
    std::map<std::string, std::vector<int64_t>> values = {
        {"lockstep_group", {1, 2, 3}},
        {"column_block", {c.spec.V, c.spec.V / 2, 16}},
        {"prefetch_rate", {0, 1, 2, 4, 16}}};
    for (int r = 1; r <= max_rows; ++r) values["gemm_rows"].push_back(r);
    for (int v = 1; v <= max_vectors; ++v) values["gemm_vectors"].push_back(v);
    for (const auto& [name, list] : values)
      for (int64_t v : list) {
        SCOPED_TRACE(c.spec.describe() + " cores " + std::to_string(c.cores) + " " + name + " = " + std::to_string(v));
        CpuTuning given;
        cpu_param(given, name) = {v, "test"};
        PlanOptions po = no_wisdom(c.cores);
        po.cpu = &given;
        const Plan plan = make_plan(prob, host(c.cores), "hanpu", po);
        EXPECT_EQ(cpu_param(plan.cpu, name).value, v);
        for (const std::string& other : cpu_param_names())
          if (other != name) EXPECT_EQ(cpu_param(plan.cpu, other).value, cpu_param(model, other).value) << other;
        ExecOptions ex;
        ex.plan = &plan;
        ExecReport rep;
        ex.report = &rep;
        const LaResult res = la_prefill_alloc(c.spec.variant, p.inputs(), c.spec.opt, ex);
        EXPECT_LT(nmse(res.o, ref.o), 1e-10);
        EXPECT_LT(nmse(res.final_state, ref.final_state), 1e-10);
        // The CPU ran the plan's values.
        ASSERT_TRUE(rep.schedule);
        EXPECT_EQ(rep.schedule->program.gemm_rows, plan.cpu.gemm_rows.value);
        EXPECT_EQ(rep.schedule->program.gemm_vectors, plan.cpu.gemm_vectors.value);
        EXPECT_EQ(rep.schedule->program.prefetch_rate, plan.cpu.prefetch_rate.value);
        for (const auto& list : rep.schedule->per_thread)
          for (const WorkItem& w : list) EXPECT_LE(w.col1 - w.col0, plan.cpu.column_block.value);
        for (const auto& g : rep.schedule->groups)
          for (int32_t n : g) EXPECT_LE(n, plan.cpu.lockstep_group.value);
      }
  }
}

TEST(CpuTuning, ValuesTheCpuCannotRunAreRefusedByName) {
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 4, a.K = 32, a.V = 32, a.seed = 23;
  const auto p = make_problem(a);
  const Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  const Plan plan = make_plan(prob, host(2), "hanpu", no_wisdom(2));
  auto refusal = [&](Plan edited) { return cpu_cannot_run(edited); };
  Plan tall = plan;
  tall.cpu.gemm_rows.value = cpu::gemm_max_rows() + 1;
  EXPECT_NE(refusal(tall).find("plan.cpu.gemm_rows: got " + std::to_string(cpu::gemm_max_rows() + 1)), std::string::npos) << refusal(tall);
  Plan wide = plan;
  wide.cpu.gemm_vectors.value = cpu::gemm_max_vectors() + 1;
  EXPECT_NE(refusal(wide).find("plan.cpu.gemm_vectors"), std::string::npos) << refusal(wide);
  Plan narrow = plan;  // items of 32 columns, the block says 16
  narrow.cpu.column_block.value = 16;
  EXPECT_NE(refusal(narrow).find("plan.cpu.column_block: got 16, but plan.kernels[0].cores[0][0] is 32 columns wide"),
            std::string::npos)
      << refusal(narrow);
  Plan small = plan;  // groups of 2, the cap says 1
  ASSERT_EQ(plan.kernels[0].groups[0], std::vector<int32_t>{2});
  small.cpu.lockstep_group.value = 1;
  EXPECT_NE(refusal(small).find("plan.cpu.lockstep_group: got 1, but plan.kernels[0].groups[0][0] has 2 items"), std::string::npos)
      << refusal(small);
  // The refusal reaches the caller before anything runs.
  ExecOptions ex;
  ex.plan = &tall;
  EXPECT_NE(error_of([&] { la_prefill_alloc(a.variant, p.inputs(), a.opt, ex); }).find("plan.cpu.gemm_rows"), std::string::npos);
  // Out of range in JSON and in PlanOptions: errors name the field.
  nlohmann::json j = plan_to_json(plan);
  j["cpu"]["prefetch_rate"]["value"] = -1;
  EXPECT_NE(error_of([&] { plan_from_json(j, "p.json"); }).find("p.json: plan.cpu.prefetch_rate: got -1"), std::string::npos)
      << error_of([&] { plan_from_json(j, "p.json"); });
  j = plan_to_json(plan);
  j["cpu"]["gemm_rows"] = 4;
  EXPECT_NE(error_of([&] { plan_from_json(j, "p.json"); }).find("plan.cpu.gemm_rows: expected an object"), std::string::npos);
  j = plan_to_json(plan);
  j["cpu"].erase("column_block");
  EXPECT_NE(error_of([&] { plan_from_json(j, "p.json"); }).find("plan.cpu.column_block: missing"), std::string::npos);
  CpuTuning given;
  given.lockstep_group = {100, "too many"};
  PlanOptions po = no_wisdom(2);
  po.cpu = &given;
  EXPECT_NE(error_of([&] { make_plan(prob, host(2), "hanpu", po); }).find("PlanOptions.cpu.lockstep_group: got 100, expected 1..64"),
            std::string::npos);
}

// plan.cpu.arena_bytes: chosen by the planner from the lockstep group and column block with the
// kernels' layout and its reason in numbers, in the JSON, refused by name when smaller than the
// plan's groups need, and what the CPU sizes each thread's arena by.
TEST(CpuTuning, TheArenaSizeIsAPlanFieldThePlannerChoosesAndTheCpuRuns) {
  ProblemSpec a;
  a.T = 100, a.H = 2, a.HV = 4, a.K = 32, a.V = 32, a.seed = 24;
  const auto p = make_problem(a);
  const LaReference ref = la_reference(a.variant, p.inputs(), a.opt);
  const Problem prob = problem_for_inputs(a.variant, p.inputs(), a.opt);
  const Plan plan = make_plan(prob, host(2), "hanpu", no_wisdom(2));
  const CpuTuning& t = plan.cpu;
  ASSERT_GT(t.arena_bytes.value, 0);
  EXPECT_NE(t.arena_bytes.reason.find("lockstep_group " + std::to_string(t.lockstep_group.value) + " x "), std::string::npos)
      << t.arena_bytes.reason;
  EXPECT_NE(t.arena_bytes.reason.find(" per thread"), std::string::npos) << t.arena_bytes.reason;
  // At least what any program the lowering makes needs for a full group of full-width items.
  const int64_t width = std::min(t.column_block.value, prob.V);
  EXPECT_EQ(static_cast<size_t>(t.arena_bytes.value),
            cpu::fused_arena_bound(prob, width, static_cast<size_t>(t.lockstep_group.value), false).bytes);

  // JSON: written, read back, validated by name.
  nlohmann::json j = plan_to_json(plan);
  ASSERT_TRUE(j["cpu"].contains("arena_bytes"));
  EXPECT_EQ(j["cpu"]["arena_bytes"]["value"].get<int64_t>(), t.arena_bytes.value);
  EXPECT_EQ(plan_from_json(j).cpu.arena_bytes, t.arena_bytes);
  j["cpu"]["arena_bytes"]["value"] = 0;
  EXPECT_NE(error_of([&] { plan_from_json(j, "p.json"); }).find("p.json: plan.cpu.arena_bytes: got 0, expected 1.."),
            std::string::npos)
      << error_of([&] { plan_from_json(j, "p.json"); });
  j = plan_to_json(plan);
  j["cpu"].erase("arena_bytes");
  EXPECT_NE(error_of([&] { plan_from_json(j, "p.json"); }).find("plan.cpu.arena_bytes: missing"), std::string::npos);

  // The planner's choice runs, exactly, and each thread's arena is that size.
  ExecOptions ex;
  ex.plan = &plan;
  ExecReport rep;
  ex.report = &rep;
  size_t workspace = 0;
  ex.workspace_bytes = &workspace;
  const LaResult res = la_prefill_alloc(a.variant, p.inputs(), a.opt, ex);
  EXPECT_LT(nmse(res.o, ref.o), 1e-10);
  EXPECT_LT(nmse(res.final_state, ref.final_state), 1e-10);
  ASSERT_TRUE(rep.schedule);
  ASSERT_EQ(rep.schedule->path, CpuPath::HeadFused);
  ASSERT_TRUE(rep.schedule->chunk_parallel.empty());
  size_t busy = 0;
  for (const auto& list : rep.schedule->per_thread) busy += list.empty() ? 0 : 1;
  EXPECT_EQ(workspace, busy * static_cast<size_t>(t.arena_bytes.value));
  EXPECT_NE(rep.schedule->summary.find("arena " + std::to_string(t.arena_bytes.value) + " bytes per thread"), std::string::npos)
      << rep.schedule->summary;

  // Exactly what this plan's program needs runs too; one byte less is refused naming the field and
  // both numbers, before anything runs.
  const size_t need = cpu::fused_arena_bytes(prob, width, static_cast<size_t>(t.lockstep_group.value), rep.schedule->program, false);
  ASSERT_LE(need, static_cast<size_t>(t.arena_bytes.value));
  Plan exact = plan;
  exact.cpu.arena_bytes.value = static_cast<int64_t>(need);
  ex.plan = &exact;
  const LaResult res2 = la_prefill_alloc(a.variant, p.inputs(), a.opt, ex);
  EXPECT_LT(nmse(res2.o, ref.o), 1e-10);
  Plan tight = plan;
  tight.cpu.arena_bytes.value = static_cast<int64_t>(need) - 1;
  const std::string want = "plan.cpu.arena_bytes: got " + std::to_string(need - 1) + " bytes, but lockstep_group " +
                           std::to_string(t.lockstep_group.value) + " x column_block " + std::to_string(width) + " need " +
                           std::to_string(need) + " bytes per thread";
  EXPECT_NE(cpu_cannot_run(tight).find(want), std::string::npos) << cpu_cannot_run(tight);
  ex.plan = &tight;
  EXPECT_NE(error_of([&] { la_prefill_alloc(a.variant, p.inputs(), a.opt, ex); }).find(want), std::string::npos);

  // Given explicitly (PlanOptions.cpu), the planner keeps it; otherwise it follows a given group.
  CpuTuning given;
  given.arena_bytes = {static_cast<int64_t>(need) * 2, "test"};
  PlanOptions po = no_wisdom(2);
  po.cpu = &given;
  EXPECT_EQ(make_plan(prob, host(2), "hanpu", po).cpu.arena_bytes.value, static_cast<int64_t>(need) * 2);
  CpuTuning one;
  one.lockstep_group = {1, "test"};
  po.cpu = &one;
  const Plan single = make_plan(prob, host(2), "hanpu", po);
  EXPECT_LT(single.cpu.arena_bytes.value, t.arena_bytes.value);
  EXPECT_NE(single.cpu.arena_bytes.reason.find("lockstep_group 1 x "), std::string::npos) << single.cpu.arena_bytes.reason;
}

WisdomEntry entry_for(const WisdomMachine& m, const std::string& cls) {
  WisdomEntry e;
  e.machine = m;
  e.problem_class = cls;
  e.measured = "2026-12-01T19:00Z";
  e.params = {{"lockstep_group", 1}, {"column_block", 64}, {"gemm_rows", 2}, {"gemm_vectors", 1}, {"prefetch_rate", 0}};
  e.times = {{"all", {{"model_ms", 2.0}, {"tuned_ms", 1.5}}}};
  return e;
}

TEST(CpuTuning, WisdomRoundTripsAndThePlannerUsesIt) {
  TempDir dir;
  const std::string path = dir.file("sub/wisdom.json");  // the directory is created
  const Problem prob = big_gdn();
  const std::string cls = wisdom_problem_class(prob, 2);
  EXPECT_EQ(cls, "gdn K=128 V=128 f32 threads=2");
  const WisdomMachine me = this_machine();
  write_wisdom_entry(path, entry_for(me, cls));
  WisdomEntry other = entry_for({"Some Other CPU", me.isa}, cls);
  other.params[0].second = 2;
  write_wisdom_entry(path, other);
  write_wisdom_entry(path, entry_for(me, cls));  // replaces, does not duplicate
  bool exists = false;
  const Wisdom w = read_wisdom(path, &exists);
  EXPECT_TRUE(exists);
  ASSERT_EQ(w.entries.size(), 2u);
  EXPECT_EQ(w.entries[0], entry_for(me, cls));
  EXPECT_EQ(wisdom_from_json(wisdom_to_json(w), "x"), w);
  read_wisdom(dir.file("missing.json"), &exists);
  EXPECT_FALSE(exists);

  PlanOptions po;
  po.cores = 2;
  const Plan plan = make_plan(prob, host(2), "hanpu", with_wisdom_file(po, path));
  EXPECT_EQ(plan.cpu.source, "wisdom " + path + ", measured 2026-12-01T19:00Z");
  EXPECT_EQ(plan.cpu.lockstep_group.value, 1);
  EXPECT_EQ(plan.cpu.column_block.value, 64);
  EXPECT_EQ(plan.cpu.gemm_rows.value, 2);
  EXPECT_EQ(plan.cpu.prefetch_rate.value, 0);
  EXPECT_EQ(plan.cpu.gemm_rows.reason.rfind("from wisdom " + path + ", measured 2026-12-01T19:00Z", 0), 0u) << plan.cpu.gemm_rows.reason;
  for (const auto& list : plan.kernels[0].cores)
    for (const PlanItem& it : list) EXPECT_EQ(it.col1 - it.col0, 64);
  // no_wisdom: the model.
  EXPECT_EQ(make_plan(prob, host(2), "hanpu", no_wisdom(2)).cpu.source, "model");
  // Another problem class (3 threads): the model, the wisdom says nothing about it.
  PlanOptions po3;
  po3.cores = 3;
  EXPECT_EQ(make_plan(prob, host(3), "hanpu", with_wisdom_file(po3, path)).cpu.source, "model");
}

TEST(CpuTuning, WisdomForAnotherCpuOrIsaIsIgnoredWithAReason) {
  TempDir dir;
  const std::string path = dir.file("wisdom.json");
  const Problem prob = big_gdn();
  const WisdomMachine me = this_machine();
  write_wisdom_entry(path, entry_for({"Some Other CPU", me.isa}, wisdom_problem_class(prob, 2)));
  write_wisdom_entry(path, entry_for({me.cpu_model, me.isa + "X"}, wisdom_problem_class(prob, 2)));
  PlanOptions po;
  po.cores = 2;
  const Plan plan = make_plan(prob, host(2), "hanpu", with_wisdom_file(po, path));
  const CpuTuning model = make_plan(prob, host(2), "hanpu", no_wisdom(2)).cpu;
  for (const std::string& name : cpu_param_names()) {
    EXPECT_EQ(cpu_param(plan.cpu, name).value, cpu_param(model, name).value) << name;
    EXPECT_NE(cpu_param(plan.cpu, name).reason.find("is for another CPU or ISA (Some Other CPU / " + me.isa), std::string::npos)
        << cpu_param(plan.cpu, name).reason;
  }
  EXPECT_EQ(plan.cpu.source, "model (wisdom " + path + " is for another CPU or ISA)");
}

TEST(CpuTuning, MalformedWisdomIsAnErrorNamingTheFileAndField) {
  TempDir dir;
  const std::string path = dir.file("wisdom.json");
  PlanOptions po;
  po.cores = 2;
  auto plan_error = [&](const std::string& text) {
    write_file_atomic(path, text);
    return error_of([&] { make_plan(big_gdn(), host(2), "hanpu", with_wisdom_file(po, path)); });
  };
  EXPECT_NE(plan_error("{not json").find(path), std::string::npos);
  EXPECT_NE(plan_error(R"({"schema": "hanpu-wisdom-0", "entries": []})").find(path + ": schema: got \"hanpu-wisdom-0\""), std::string::npos)
      << plan_error(R"({"schema": "hanpu-wisdom-0", "entries": []})");
  EXPECT_NE(plan_error(R"({"schema": "hanpu-wisdom-1"})").find(path + ": entries: expected an array"), std::string::npos);
  nlohmann::json j = wisdom_to_json({{entry_for(this_machine(), "gdn K=128 V=128 f32 threads=2")}});
  j["entries"][0]["params"]["gemm_rows"] = "eight";
  EXPECT_NE(plan_error(j.dump()).find(path + ": entries[0].params.gemm_rows: got \"eight\", expected an integer"), std::string::npos)
      << plan_error(j.dump());
  j["entries"][0]["params"]["gemm_rows"] = 2;
  j["entries"][0]["params"]["gemm_cols"] = 2;
  EXPECT_NE(plan_error(j.dump()).find("entries[0].params.gemm_cols: unknown CPU parameter"), std::string::npos);
  j["entries"][0]["params"].erase("gemm_cols");
  j["entries"][0].erase("isa");
  EXPECT_NE(plan_error(j.dump()).find("entries[0].isa: expected a string"), std::string::npos);
  // A value out of range in matching wisdom: named as the planner's field.
  j["entries"][0]["isa"] = this_machine().isa;
  j["entries"][0]["params"]["lockstep_group"] = 0;
  EXPECT_NE(plan_error(j.dump()).find(path + ": the entry for gdn K=128 V=128 f32 threads=2: params.lockstep_group: got 0"),
            std::string::npos)
      << plan_error(j.dump());
}

TEST(CpuTuning, TuneOnATinyProblemWritesWisdomThePlannerUses) {
  TempDir dir;
  const std::string path = dir.file("wisdom.json");
  const auto r = testing::run_command(dir, shell_quote(HANPU_EXE) +
                                               " tune --variants gdn --T 100 --heads 2 --dim 32 --threads 1 --rounds 1 --wisdom " +
                                               shell_quote(path));
  ASSERT_TRUE(r.exited && r.code == 0) << r.out << r.err;
  EXPECT_NE(r.out.find("| parameter | model-based | tuned | model-based ms | tuned ms | model/tuned |"), std::string::npos) << r.out;
  for (const std::string& name : cpu_param_names()) EXPECT_NE(r.out.find("| " + name + " | "), std::string::npos) << name;
  const Wisdom w = read_wisdom(path);
  ASSERT_EQ(w.entries.size(), 1u);
  EXPECT_EQ(w.entries[0].machine, this_machine());
  EXPECT_EQ(w.entries[0].problem_class, "gdn K=32 V=32 f32 threads=1");
  Problem prob;
  prob.seqlens = {1000};
  prob.H = prob.HV = 4;
  prob.K = prob.V = 32;
  prob.qkv_dtype = prob.out_dtype = DType::F32;
  PlanOptions po;
  po.cores = 1;
  const Plan plan = make_plan(prob, host(1), "hanpu", with_wisdom_file(po, path));
  EXPECT_EQ(plan.cpu.source, "wisdom " + path + ", measured " + w.entries[0].measured);
  EXPECT_NE(plan.cpu.lockstep_group.reason.find("from wisdom " + path + ", measured "), std::string::npos);
  // HANPU_WISDOM names the default file; "none" turns wisdom off (the CLI's --no-wisdom sets it).
  const char* saved = std::getenv("HANPU_WISDOM");
  const std::string before = saved ? saved : "";
  ::setenv("HANPU_WISDOM", path.c_str(), 1);
  EXPECT_EQ(default_wisdom_path(), path);
  PlanOptions dflt;
  dflt.cores = 1;
  EXPECT_EQ(make_plan(prob, host(1), "hanpu", cpu_plan_options(host(1), dflt)).cpu.source, plan.cpu.source);
  ::setenv("HANPU_WISDOM", "none", 1);
  EXPECT_EQ(default_wisdom_path(), "");
  EXPECT_EQ(make_plan(prob, host(1), "hanpu", cpu_plan_options(host(1), dflt)).cpu.source, "model");
  if (saved) ::setenv("HANPU_WISDOM", before.c_str(), 1);
  else ::unsetenv("HANPU_WISDOM");
}

// The CLI's calls plan through the host plan cache: a malformed wisdom file stops them with an
// error naming it; --no-wisdom runs them with the model's parameters.
TEST(CpuTuning, TheCliReadsWisdomUnlessToldNotTo) {
  TempDir dir;
  const std::string wisdom = dir.file("bad.json");
  write_file_atomic(wisdom, "{\"schema\": \"something else\"}");
  const std::string run = " gdn --in " + shell_quote((testing::golden_dir() / "gdn_basic.safetensors").string()) + " --out " +
                          shell_quote(dir.file("out.safetensors")) + " --show-plan";
  const auto bad = testing::run_command(dir, "HANPU_WISDOM=" + shell_quote(wisdom) + " " + shell_quote(HANPU_EXE) + run);
  EXPECT_TRUE(bad.exited && bad.code == 1) << bad.out << bad.err;
  EXPECT_NE(bad.err.find(wisdom + ": schema: got \"something else\""), std::string::npos) << bad.err;
  const auto ok = testing::run_command(dir, "HANPU_WISDOM=" + shell_quote(wisdom) + " " + shell_quote(HANPU_EXE) + " --no-wisdom" + run);
  EXPECT_TRUE(ok.exited && ok.code == 0) << ok.out << ok.err;
  EXPECT_NE(ok.err.find("CPU parameters (model)"), std::string::npos) << ok.err;  // --show-plan prints to stderr
}

}  // namespace
}  // namespace hanpu
