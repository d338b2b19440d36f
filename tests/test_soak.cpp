// Concurrency soak (issue 15, item 4): several threads call the engine at once with random shapes,
// CPU paths, thread counts and plans, and every result is compared with the fp64 reference (the
// bounds of docs/ACCURACY.md for f32 inputs). Bounded: a fixed number of rounds of small problems.
// scripts/soak.sh runs it for longer and under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hanpu/host_device.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/plan_exec.hpp"
#include "hanpu/la.hpp"
#include "hanpu/model.hpp"
#include "hanpu/reference.hpp"
#include "la_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

int rounds() {
  const char* r = std::getenv("HANPU_SOAK_ROUNDS");
  return r && *r ? std::atoi(r) : 40;
}

TEST(Soak, ConcurrentCallersGetReferenceResults) {
  constexpr int kCallers = 4;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_failure;
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::mt19937_64 rng(1000 + c);
      auto pick = [&](std::initializer_list<int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
      for (int i = 0; i < rounds(); ++i) {
        testing::ProblemSpec spec;
        spec.variant = rng() % 2 ? Variant::KDA : Variant::GDN;
        spec.T = pick({1, 15, 64, 65, 130});
        spec.H = pick({1, 2});
        spec.HV = spec.H * pick({1, 2});
        spec.K = pick({16, 33, 64});
        spec.V = pick({16, 40, 64});
        spec.B = pick({1, 2});
        if (rng() % 4 == 0) spec.seqlens = {pick({1, 20, 64}), pick({15, 70})}, spec.B = 1;
        spec.initial_state = rng() % 2;
        spec.seed = rng();
        const testing::Problem prob = testing::make_problem(spec);
        const LaReference ref = la_reference(spec.variant, prob.inputs(), spec.opt);
        ExecOptions ex;
        ex.path = static_cast<CpuPath>(pick({0, 1, 2}));
        ex.threads = static_cast<int>(pick({1, 2, 3}));
        Plan plan;
        if (ex.path == CpuPath::HeadFused && rng() % 2) {  // an explicit plan, made here for the host
          PlanOptions po;
          po.cores = ex.threads;
          plan = make_plan(problem_for_inputs(spec.variant, prob.inputs(), spec.opt), host_device(ex.threads, 0.0), "hanpu", cpu_plan_options(host_device(ex.threads, 0.0), po));
          ex.plan = &plan;
        }
        try {
          const testing::Accuracy a = testing::run_and_compare(prob, ref, ex);
          if (!(a.o <= 1e-10) || !(a.state <= 1e-10)) {
            std::lock_guard<std::mutex> lock(mu);
            if (failures++ == 0)
              first_failure = spec.describe() + " path " + cpu_path_name(ex.path) + " threads " + std::to_string(ex.threads) +
                              ": nmse o " + std::to_string(a.o) + " state " + std::to_string(a.state);
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (failures++ == 0) first_failure = spec.describe() + ": " + e.what();
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0) << first_failure;
}

// Two models in one process, each run by two threads at once: every forward must give the logits
// of the same forward run alone, bit for bit (the same parts run, whichever thread runs them).
TEST(Soak, TwoModelsFromSeveralThreadsGiveTheirSoloLogits) {
  const std::vector<std::string> dirs = {(testing::golden_dir() / "qwen35_tiny").string(),
                                         (testing::golden_dir() / "qwen3next_tiny").string()};
  std::vector<HybridModel> models;
  for (const std::string& d : dirs) models.push_back(HybridModel::load(d));
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % 300));
  ForwardOptions fo;
  fo.threads = 2;
  fo.all_logits = true;
  std::vector<Tensor> solo;
  for (const HybridModel& m : models) {
    HybridState st = m.new_state();
    solo.push_back(m.forward(st, ids, fo));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      const HybridModel& m = models[static_cast<size_t>(c % 2)];
      const Tensor& want = solo[static_cast<size_t>(c % 2)];
      for (int r = 0; r < rounds() / 4 + 1; ++r) {
        HybridState st = m.new_state();
        const Tensor got = m.forward(st, ids, fo);
        if (got.shape() != want.shape() || std::memcmp(got.data(), want.data(), want.bytes()) != 0) ++mismatches;
      }
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// The logits of a prefill of `ids` and then `decode` single-token steps, one after another.
std::vector<float> prefill_then_decode(const HybridModel& m, const std::vector<int32_t>& ids, int decode,
                                       const ForwardOptions& fo) {
  HybridState st = m.new_state();
  const Tensor pre = m.forward(st, ids, fo);
  std::vector<float> out(pre.ptr<float>(), pre.ptr<float>() + pre.numel());
  for (int i = 0; i < decode; ++i) {
    const int32_t next = static_cast<int32_t>((i * 53 + 7) % 300);
    const Tensor step = m.forward(st, std::span<const int32_t>(&next, 1), fo);
    out.insert(out.end(), step.ptr<float>(), step.ptr<float>() + step.numel());
  }
  return out;
}

// Two models in one process, each with its own engine (hanpu/engine.hpp: its pool, workspaces and
// activation scratch), and two threads each running its own model over and over: every prefill
// and decode step gives the logits of that model run alone, bit for bit.
TEST(Soak, TwoModelsWithTheirOwnEnginesOnTwoThreadsGiveTheirSoloLogits) {
  const std::vector<std::string> dirs = {(testing::golden_dir() / "qwen35_tiny").string(),
                                         (testing::golden_dir() / "qwen3next_tiny").string()};
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % 300));
  ForwardOptions fo;
  fo.threads = 2;
  fo.all_logits = true;
  constexpr int kDecode = 3;
  // Alone: each model the only one in the process's life so far, on a fresh engine.
  std::vector<std::vector<float>> solo;
  for (const std::string& d : dirs) {
    const HybridModel m = HybridModel::load(d, {.engine = std::make_shared<Engine>(2)});
    solo.push_back(prefill_then_decode(m, ids, kDecode, fo));
  }
  std::vector<HybridModel> models;
  for (const std::string& d : dirs) models.push_back(HybridModel::load(d, {.engine = std::make_shared<Engine>(2)}));
  ASSERT_NE(&models[0].engine(), &models[1].engine());
  ASSERT_NE(&models[0].engine(), &Engine::default_engine());
  std::atomic<int> mismatches{0};
  std::vector<std::thread> callers;
  for (size_t c = 0; c < models.size(); ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < rounds() / 4 + 2; ++r)
        if (prefill_then_decode(models[c], ids, kDecode, fo) != solo[c]) ++mismatches;
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// The LA entry points on engines of their own (ExecOptions::engine), from two threads at once:
// the outputs and final states of a call alone, bit for bit, on every CPU path.
TEST(Soak, LaCallsOnTheirOwnEnginesFromTwoThreadsGiveTheirSoloResults) {
  testing::ProblemSpec spec;
  spec.T = 130;
  spec.H = 2;
  spec.HV = 4;
  spec.K = 33;
  spec.V = 40;
  const testing::Problem prob = testing::make_problem(spec);
  auto run = [&](Engine& engine, CpuPath path) {
    ExecOptions ex;
    ex.engine = &engine;
    ex.threads = 2;
    ex.path = path;
    const LaResult r = la_prefill_alloc(spec.variant, prob.inputs(), spec.opt, ex);
    std::vector<std::byte> bytes(r.o.bytes() + r.final_state.bytes());
    std::memcpy(bytes.data(), r.o.data(), r.o.bytes());
    std::memcpy(bytes.data() + r.o.bytes(), r.final_state.data(), r.final_state.bytes());
    return bytes;
  };
  for (CpuPath path : {CpuPath::HeadFused, CpuPath::FlaChunk, CpuPath::Recurrent}) {
    Engine alone(2);
    const std::vector<std::byte> want = run(alone, path);
    Engine a(2), b(1);  // b: one thread running the two parts in turn
    std::atomic<int> mismatches{0};
    std::vector<std::thread> callers;
    for (Engine* e : {&a, &b})
      callers.emplace_back([&, e] {
        for (int r = 0; r < rounds() / 4 + 2; ++r)
          if (run(*e, path) != want) ++mismatches;
      });
    for (std::thread& t : callers) t.join();
    EXPECT_EQ(mismatches.load(), 0) << cpu_path_name(path);
  }
}

}  // namespace
}  // namespace hanpu
