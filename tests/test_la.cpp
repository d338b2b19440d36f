// Every CPU path against the fp64 token-by-token reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "cpu_plan_testing.hpp"
#include "cpu/kernels.hpp"
#include "cpu/la_amx.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/plan_exec.hpp"
#include "la_testing.hpp"
#include "registry_testing.hpp"

namespace hanpu::testing {
namespace {

// The accuracy bounds (normalized MSE): outputs by input dtype, states always 1e-10.
double output_bound(DType dt) {
  switch (dt) {
    case DType::F16: return 1e-7;
    case DType::BF16: return 1e-5;
    default: return 1e-10;
  }
}
constexpr double kStateBound = 1e-10;

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

const CpuPath kPaths[] = {CpuPath::HeadFused, CpuPath::FlaChunk, CpuPath::Recurrent};

void expect_accurate(const Problem& p, const LaReference& ref, CpuPath path, int threads) {
  const Accuracy a = run_and_compare(p, ref, ExecOptions{path, threads, nullptr});
  EXPECT_LE(a.o, output_bound(p.spec.dtype)) << cpu_path_name(path) << " o: " << p.spec.describe();
  EXPECT_LE(a.state, kStateBound) << cpu_path_name(path) << " state: " << p.spec.describe();
}

// Problem p's inputs for token t alone (views into its tensors) and no initial state: one decode
// step's inputs.
LaInputs token_inputs(const Problem& p, int64_t t) {
  LaInputs step = p.inputs();
  for (TensorView* v : {&step.q, &step.k, &step.v, &step.g, &step.beta}) {
    v->data = static_cast<std::byte*>(v->data) + t * v->stride[1] * static_cast<int64_t>(dtype_size(v->dtype));
    v->shape[1] = 1;
  }
  step.initial_state = {};
  return step;
}

// The variant traits (include/hanpu/la_variant.hpp): one entry per variant, found by its key and
// its name, and the gate tensor's width follows the gate granularity.
TEST(LaVariants, TraitsTableKeysAndNames) {
  for (const VariantTraits& t : kVariantTraits) {
    EXPECT_EQ(&variant_traits(t.variant), &t) << t.name;
    EXPECT_STREQ(variant_name(t.variant), t.name);
    EXPECT_EQ(variant_from_name(t.name), t.variant) << t.name;
  }
  EXPECT_EQ(variant_traits(Variant::GDN).gate, GateGranularity::Head);
  EXPECT_EQ(variant_traits(Variant::KDA).gate, GateGranularity::Channel);
  EXPECT_EQ(variant_traits(Variant::GDN).gate_width(128), 1);
  EXPECT_EQ(variant_traits(Variant::KDA).gate_width(128), 128);
  EXPECT_EQ(variant_names(" or "), "gdn or kda");
  EXPECT_FALSE(variant_from_name("GDN").has_value());
}

TEST(LaPaths, SmallGdnAllPaths) {
  ProblemSpec s{.T = 130, .H = 2, .HV = 4, .K = 32, .V = 48};
  const Problem p = make_problem(s);
  const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
  for (CpuPath path : kPaths)
    for (int th : {1, 2, 3}) expect_accurate(p, ref, path, th);
}

TEST(LaPaths, SmallKdaAllPaths) {
  ProblemSpec s{.variant = Variant::KDA, .T = 130, .H = 2, .HV = 4, .K = 32, .V = 48};
  const Problem p = make_problem(s);
  const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
  for (CpuPath path : kPaths)
    for (int th : {1, 2, 3}) expect_accurate(p, ref, path, th);
}

// The random grid of the issue: T, K, V, HV/H, dtypes, gate regimes, options; every path.
TEST(LaGrid, RandomInstancesAgainstFp64Reference) {
  const int64_t Ts[] = {1, 15, 63, 64, 65, 75, 500, 1500};
  const int64_t dims[] = {1, 60, 64, 100, 128, 256};
  const int64_t groups[] = {1, 2, 4};
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16};
  const GateRegime regimes[] = {GateRegime::kMild, GateRegime::kStrong, GateRegime::kMasked, GateRegime::kZeros};
  std::mt19937_64 rng(20261129);
  auto pick = [&](const auto& arr) { return arr[rng() % std::size(arr)]; };
  constexpr int kInstances = 360;
  // Keep the fp64 reference affordable: at most this many (token x head x K x V) per instance.
  constexpr double kWorkBudget = 1.2e7;
  struct Worst {
    double ratio = 0, value = 0;
    std::string what;
  };
  std::map<std::string, Worst> worst;  // "o F32", "o F16", "o BF16", "state"
  int done = 0;
  while (done < kInstances) {
    // Field by field: the draws keep their order (the grid's instances are fixed by the seed).
    ProblemSpec s;
    s.variant = rng() % 2 ? Variant::KDA : Variant::GDN;
    s.T = pick(Ts);
    s.K = pick(dims);
    s.V = pick(dims);
    s.H = 1 + static_cast<int64_t>(rng() % 3);
    s.HV = s.H * pick(groups);
    s.B = 1 + static_cast<int64_t>(rng() % 2);
    s.dtype = pick(dtypes);
    s.gates = pick(regimes);
    s.initial_state = rng() % 4 != 0;
    s.opt.qk_l2norm = rng() % 3 == 0;
    s.opt.gate_in_kernel = rng() % 5 == 0;
    s.opt.beta_sigmoid = rng() % 4 == 0;
    if (s.variant == Variant::KDA && s.opt.gate_in_kernel && rng() % 2)  // Ling's lower-bounded gate
      s.opt.lower_bound = -0.5f - static_cast<float>(rng() % 10) * 0.5f;  // -0.5 .. -5
    s.seed = rng();
    if (rng() % 6 == 0) {  // varlen batch: a 15-token sequence next to longer ones
      s.seqlens = {15, 1 + static_cast<int64_t>(rng() % 300), 64};
    }
    const double work = static_cast<double>((s.seqlens.empty() ? s.B * s.T : 400)) * s.HV * s.K * s.V;
    if (work > kWorkBudget) continue;
    const Problem p = make_problem(s);
    const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
    const CpuPath path = kPaths[done % 3];
    const int threads = 1 + done % 3;
    const Accuracy a = run_and_compare(p, ref, ExecOptions{path, threads, nullptr});
    const std::string what = std::string(cpu_path_name(path)) + " threads=" + std::to_string(threads) + " " + s.describe();
    EXPECT_LE(a.o, output_bound(s.dtype)) << "o nmse " << a.o << ": " << what;
    EXPECT_LE(a.state, kStateBound) << "state nmse " << a.state << ": " << what;
    auto track = [&](const std::string& key, double value, double bound) {
      Worst& w = worst[key];
      if (value / bound >= w.ratio) w = {value / bound, value, what};
    };
    track(std::string("o ") + dtype_name(s.dtype), a.o, output_bound(s.dtype));
    track("state", a.state, kStateBound);
    ++done;
  }
  std::printf("[grid] %d instances\n", done);
  for (const auto& [key, w] : worst)
    std::printf("[grid] worst %s nmse %.3g (%.3g of the bound): %s\n", key.c_str(), w.value, w.ratio, w.what.c_str());
}

// KDA's lower-bounded ("safe") gate in kernel, g = lb sigmoid(exp(A_log) (raw + dt_bias)), with and
// without A_log: the fp64 reference against the formula evaluated here and passed as a finished
// gate, and every path (and decode) against the reference. Tails: T = 130, HV > H, K = 36.
TEST(LaGates, LowerBoundedKdaGate) {
  for (bool with_a_log : {true, false}) {
    ProblemSpec s{.variant = Variant::KDA, .T = 130, .H = 2, .HV = 4, .K = 36, .V = 20};
    s.opt.gate_in_kernel = true;
    s.opt.lower_bound = -5.f;
    Problem p = make_problem(s);
    if (!with_a_log) p.A_log = Tensor();
    const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
    // The formula, in double, outside the reference: the same result from a finished gate.
    Tensor g(DType::F32, p.g.shape());
    double lo = 0, hi = -5;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const int64_t hv = (i / s.K) % s.HV;
      const double rate = with_a_log ? std::exp(p.A_log.get(hv)) : 1.0;
      const double x = -5.0 / (1.0 + std::exp(-rate * (p.g.get(i) + p.dt_bias.get(hv * s.K + i % s.K))));
      g.set(i, x);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    EXPECT_LT(lo, -4.0);  // the inputs reach both ends of (lower_bound, 0)
    EXPECT_GT(hi, -1.0);
    LaInputs finished = p.inputs();
    finished.g = g.view();
    finished.A_log = {};
    finished.dt_bias = {};
    const LaReference ref2 = la_reference(s.variant, finished, LaOptions{});
    EXPECT_LE(nmse(ref.o, ref2.o), 1e-12);  // g rounded to fp32 in the finished copy
    EXPECT_LE(nmse(ref.final_state, ref2.final_state), 1e-12);
    for (CpuPath path : kPaths)
      for (int th : {1, 2}) expect_accurate(p, ref, path, th);
    // Decode, token by token from the initial state, reaches the same final state.
    Tensor state(DType::F32, p.h0.shape());
    for (int64_t i = 0; i < state.numel(); ++i) state.set(i, p.h0.get(i));
    Tensor o(DType::F32, {1, 1, s.HV, s.V});
    for (int64_t t = 0; t < s.T; ++t) {
      kda_decode(token_inputs(p, t), s.opt, state.view(), o.view(), 2);
    }
    EXPECT_LE(nmse(state, ref.final_state), kStateBound) << "decode, A_log " << with_a_log;
  }
}

TEST(LaGates, LowerBoundRefusedWhereItWouldDoNothing) {
  ProblemSpec s;
  s.variant = Variant::KDA;
  s.opt.gate_in_kernel = true;
  const Problem p = make_problem(s);
  auto message = [&](Variant v, const LaInputs& in, const LaOptions& o) {
    try {
      la_reference(v, in, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LaOptions o = s.opt;
  o.lower_bound = 0.25f;
  EXPECT_NE(message(Variant::KDA, p.inputs(), o).find("expected a finite negative number"), std::string::npos);
  o.lower_bound = -1.f;
  o.gate_in_kernel = false;
  EXPECT_NE(message(Variant::KDA, p.inputs(), o).find("needs gate_in_kernel"), std::string::npos);
  ProblemSpec sg;
  sg.opt.gate_in_kernel = true;
  const Problem pg = make_problem(sg);
  LaOptions og = sg.opt;
  og.lower_bound = -1.f;
  EXPECT_NE(message(Variant::GDN, pg.inputs(), og).find("GDN has none"), std::string::npos);
  LaInputs no_a = p.inputs();
  no_a.A_log = {};
  EXPECT_NE(message(Variant::KDA, no_a, s.opt).find("'A_log'"), std::string::npos);  // needed without a bound
}

TEST(LaPaths, HeadsNotMultipleOfThreadsAndColumnSplits) {
  for (Variant var : testing::every_variant()) {
    ProblemSpec s{.variant = var, .T = 200, .H = 3, .HV = 3, .K = 64, .V = 100};
    const Problem p = make_problem(s);
    const LaReference ref = la_reference(var, p.inputs(), s.opt);
    for (int th : {2, 4, 5}) expect_accurate(p, ref, CpuPath::HeadFused, th);
  }
}

TEST(LaPaths, ExplicitPlansGiveTheSameResult) {
  ProblemSpec s{.T = 150, .H = 1, .HV = 2, .K = 64, .V = 64};
  const Problem p = make_problem(s);
  const LaResult base = la_prefill_alloc(s.variant, p.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 1, nullptr});
  // A planner plan with its mapping replaced: every 16 columns of V in a block of their own, spread
  // over 3 cores (the plan still validates: columns are independent).
  const hanpu::Problem prob = problem_for_inputs(s.variant, p.inputs(), s.opt);
  PlanOptions po;
  po.cores = 3;
  Plan plan = testing::plan_as_callers_do(prob, host_device(3, 0.0), "hanpu", po);
  ASSERT_EQ(plan.kernels.size(), 1u);
  Kernel& fused = plan.kernels[0];
  fused.cores.assign(3, {});
  fused.groups.clear();
  int t = 0;
  for (int hv = 0; hv < 2; ++hv)
    for (int c = 0; c < 64; c += 16) fused.cores[(t++) % 3].push_back({0, hv, c, c + 16, 0, 3, 2});
  ExecOptions ex;
  ex.plan = &plan;
  const LaResult split = la_prefill_alloc(s.variant, p.inputs(), s.opt, ex);
  EXPECT_LE(nmse(split.o, [&] {
              Tensor d(DType::F64, base.o.shape());
              for (int64_t i = 0; i < d.numel(); ++i) d.set(i, base.o.get(i));
              return d;
            }()),
            1e-12);
}

TEST(LaPaths, ChunkParallelFallbackIsExact) {
  ProblemSpec s{.T = 300, .K = 32, .V = 16};
  const Problem p = make_problem(s);
  const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
  expect_accurate(p, ref, CpuPath::HeadFused, 2);
}

// Varlen with a 15-token and a multi-thousand-token sequence equals per-sequence runs.
TEST(LaVarlen, EqualsPerSequenceRuns) {
  for (Variant var : testing::every_variant()) {
    ProblemSpec s{.variant = var, .H = 1, .HV = 2, .K = 32, .V = 32, .seqlens = {15, 2100, 77},
                     .gates = GateRegime::kMasked};
    const Problem p = make_problem(s);
    const LaResult whole = la_prefill_alloc(var, p.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 2, nullptr});
    int64_t bos = 0;
    for (size_t n = 0; n < s.seqlens.size(); ++n) {
      const int64_t len = s.seqlens[n];
      // Slice the inputs of sequence n into a B=1 problem of its own.
      ProblemSpec one = s;
      one.seqlens.clear();
      one.B = 1;
      one.T = len;
      Problem q = make_problem(one);
      const int64_t K = s.K, V = s.V, HV = s.HV, H = s.H, gk = var == Variant::GDN ? 1 : K;
      for (int64_t i = 0; i < len * H * K; ++i) {
        q.q.set(i, p.q.get(bos * H * K + i));
        q.k.set(i, p.k.get(bos * H * K + i));
      }
      for (int64_t i = 0; i < len * HV * V; ++i) q.v.set(i, p.v.get(bos * HV * V + i));
      for (int64_t i = 0; i < len * HV * gk; ++i) q.g.set(i, p.g.get(bos * HV * gk + i));
      for (int64_t i = 0; i < len * HV; ++i) q.beta.set(i, p.beta.get(bos * HV + i));
      for (int64_t i = 0; i < HV * K * V; ++i) q.h0.set(i, p.h0.get(static_cast<int64_t>(n) * HV * K * V + i));
      const LaResult sep = la_prefill_alloc(var, q.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 1, nullptr});
      for (int64_t i = 0; i < len * HV * V; ++i)
        ASSERT_NEAR(sep.o.get(i), whole.o.get(bos * HV * V + i), 1e-5) << "seq " << n << " o[" << i << "]";
      for (int64_t i = 0; i < HV * K * V; ++i)
        ASSERT_NEAR(sep.final_state.get(i), whole.final_state.get(static_cast<int64_t>(n) * HV * K * V + i), 1e-5)
            << "seq " << n << " state[" << i << "]";
      bos += len;
    }
  }
}

// Prefill of T1 tokens then decode of n tokens equals one prefill of T1 + n.
TEST(LaDecode, PrefillThenDecodeEqualsLongerPrefill) {
  for (Variant var : testing::every_variant()) {
    ProblemSpec s{.variant = var, .B = 2, .T = 140, .H = 2, .HV = 4, .K = 60, .V = 100, .dtype = DType::BF16};
    const Problem full = make_problem(s);
    const LaResult ref = la_prefill_alloc(var, full.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 2, nullptr});
    const int64_t T1 = 130;
    // Views of the first T1 tokens and of each later token (strided views into the same tensors).
    auto first = [&](const Tensor& t, int64_t t0, int64_t len) {
      TensorView v = t.view();
      v.data = static_cast<std::byte*>(v.data) + t0 * v.stride[1] * static_cast<int64_t>(dtype_size(v.dtype));
      v.shape[1] = len;
      return v;
    };
    LaInputs in = full.inputs();
    LaInputs pre = in;
    pre.q = first(full.q, 0, T1);
    pre.k = first(full.k, 0, T1);
    pre.v = first(full.v, 0, T1);
    pre.g = first(full.g, 0, T1);
    pre.beta = first(full.beta, 0, T1);
    const LaResult pr = la_prefill_alloc(var, pre, s.opt, ExecOptions{CpuPath::HeadFused, 2, nullptr});
    Tensor state = pr.final_state;
    Tensor o1(DType::BF16, {s.B, 1, s.HV, s.V});
    for (int64_t t = T1; t < s.T; ++t) {
      LaInputs step = in;
      step.q = first(full.q, t, 1);
      step.k = first(full.k, t, 1);
      step.v = first(full.v, t, 1);
      step.g = first(full.g, t, 1);
      step.beta = first(full.beta, t, 1);
      step.initial_state = TensorView{};
      if (var == Variant::GDN)
        gdn_decode(step, s.opt, state.view(), o1.view(), 2);
      else
        kda_decode(step, s.opt, state.view(), o1.view(), 2);
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t i = 0; i < s.HV * s.V; ++i) {
          const double got = o1.get(b * s.HV * s.V + i);
          const double want = ref.o.get((b * s.T + t) * s.HV * s.V + i);
          ASSERT_NEAR(got, want, 2e-2 * std::max(1.0, std::abs(want))) << "token " << t << " b " << b;
        }
    }
    for (int64_t i = 0; i < state.numel(); ++i)
      ASSERT_NEAR(state.get(i), ref.final_state.get(i), 1e-4 * std::max(1.0, std::abs(ref.final_state.get(i))));
  }
}

// Decode token by token against the fp64 reference, for widths the recurrence updates in the state
// tensor itself (V = 128: whole vectors on every target) and widths it copies through its arena
// (V = 100 on 8- and 16-lane targets), with HV > H, two sequences, strong gates, and thread counts
// that split heads into column ranges (3 threads over 8 heads).
TEST(LaDecode, StepsInPlaceAndCopiedAgainstFp64Reference) {
  for (Variant var : testing::every_variant())
    for (int64_t V : {128, 100})
      for (int threads : {1, 2, 3}) {
        ProblemSpec s{.variant = var, .B = 2, .T = 6, .H = 2, .HV = 4, .K = 64, .V = V, .gates = GateRegime::kStrong};
        const Problem p = make_problem(s);
        const LaReference ref = la_reference(var, p.inputs(), s.opt);
        Tensor state(DType::F32, p.h0.shape());
        for (int64_t i = 0; i < state.numel(); ++i) state.set(i, p.h0.get(i));
        Tensor o_all(DType::F32, {s.B, s.T, s.HV, s.V});
        Tensor o(DType::F32, {s.B, 1, s.HV, s.V});
        for (int64_t t = 0; t < s.T; ++t) {
          const LaInputs step = token_inputs(p, t);
          if (var == Variant::GDN) gdn_decode(step, s.opt, state.view(), o.view(), threads);
          else kda_decode(step, s.opt, state.view(), o.view(), threads);
          for (int64_t b = 0; b < s.B; ++b)
            for (int64_t i = 0; i < s.HV * s.V; ++i) o_all.set((b * s.T + t) * s.HV * s.V + i, o.get(b * s.HV * s.V + i));
        }
        const std::string what = s.describe() + " threads " + std::to_string(threads);
        EXPECT_LE(nmse(o_all, ref.o), output_bound(DType::F32)) << what;
        EXPECT_LE(nmse(state, ref.final_state), kStateBound) << what;
      }
}

// Chunk equals recurrent directly (not only through the reference).
TEST(LaPaths, ChunkEqualsRecurrent) {
  ProblemSpec s{.variant = Variant::KDA, .T = 333, .H = 2, .HV = 2, .K = 100, .V = 60, .gates = GateRegime::kStrong};
  const Problem p = make_problem(s);
  const LaResult a = la_prefill_alloc(s.variant, p.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 2, nullptr});
  const LaResult b = la_prefill_alloc(s.variant, p.inputs(), s.opt, ExecOptions{CpuPath::Recurrent, 2, nullptr});
  Tensor bo(DType::F64, b.o.shape()), bs(DType::F64, b.final_state.shape());
  for (int64_t i = 0; i < bo.numel(); ++i) bo.set(i, b.o.get(i));
  for (int64_t i = 0; i < bs.numel(); ++i) bs.set(i, b.final_state.get(i));
  EXPECT_LE(nmse(a.o, bo), 1e-10);
  EXPECT_LE(nmse(a.final_state, bs), 1e-10);
}


// T = 0 (and zero-length sequences inside cu_seqlens): no output rows, final_state = initial_state.
TEST(LaPaths, EmptySequencesKeepTheInitialState) {
  for (Variant var : testing::every_variant()) {
    for (bool varlen : {false, true}) {
      ProblemSpec s{.variant = var, .T = 0, .H = 1, .HV = 2, .K = 16, .V = 16};
      if (varlen) s.seqlens = {0, 70, 0};
      const Problem p = make_problem(s);
      const LaReference ref = la_reference(var, p.inputs(), s.opt);
      for (CpuPath path : kPaths) {
        const LaResult r = la_prefill_alloc(var, p.inputs(), s.opt, ExecOptions{path, 2, nullptr});
        EXPECT_LE(nmse(r.final_state, ref.final_state), 1e-10) << cpu_path_name(path) << " " << s.describe();
        // Sequence 0 is empty in both cases: its final state is its initial state, bit for bit.
        for (int64_t i = 0; i < s.HV * s.K * s.V; ++i) ASSERT_EQ(r.final_state.get(i), p.h0.get(i));
      }
    }
  }
}

TEST(LaValidation, ErrorsNameTheTensor) {
  ProblemSpec s;
  s.H = 2;
  s.HV = 3;  // not a multiple of H
  Problem p = make_problem([&] {
    ProblemSpec ok = s;
    ok.HV = 4;
    return ok;
  }());
  LaInputs in = p.inputs();
  Tensor v3(DType::F32, {1, s.T, 3, s.V});
  in.v = v3.view();
  try {
    la_prefill_alloc(s.variant, in, s.opt);
    FAIL() << "HV = 3 with H = 2 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'v'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of H"), std::string::npos) << e.what();
  }
  EXPECT_THROW(la_prefill_alloc(s.variant, p.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 5000, nullptr}), Error);
}


// Inputs given as strided views (head-major storage seen through [B,T,H,K] strides, and a
// non-unit stride on the last dimension) give the same result as contiguous inputs.
TEST(LaViews, StridedInputsMatchContiguous) {
  for (Variant var : testing::every_variant()) {
    ProblemSpec s{.variant = var, .B = 2, .T = 90, .H = 2, .HV = 4, .K = 32, .V = 48, .dtype = DType::BF16};
    const Problem p = make_problem(s);
    const LaResult want = la_prefill_alloc(var, p.inputs(), s.opt, ExecOptions{CpuPath::HeadFused, 2, nullptr});

    // q stored head-major [B,H,T,K]; k stored with every element doubled along K (stride 2).
    Tensor q_hm(DType::BF16, {s.B, s.H, s.T, s.K}), k_wide(DType::BF16, {s.B, s.T, s.H, 2 * s.K});
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t d = 0; d < s.K; ++d) {
            const int64_t src = ((b * s.T + t) * s.H + h) * s.K + d;
            q_hm.set(((b * s.H + h) * s.T + t) * s.K + d, p.q.get(src));
            k_wide.set(((b * s.T + t) * s.H + h) * 2 * s.K + 2 * d, p.k.get(src));
          }
    LaInputs in = p.inputs();
    in.q = q_hm.view();
    in.q.shape = {s.B, s.T, s.H, s.K, 0};
    in.q.stride = {s.H * s.T * s.K, s.K, s.T * s.K, 1, 0};
    in.k = k_wide.view();
    in.k.shape = {s.B, s.T, s.H, s.K, 0};
    in.k.stride = {s.T * s.H * 2 * s.K, s.H * 2 * s.K, 2 * s.K, 2, 0};
    for (CpuPath path : kPaths) {
      const LaResult got = la_prefill_alloc(var, in, s.opt, ExecOptions{path, 2, nullptr});
      for (int64_t i = 0; i < want.o.numel(); ++i)
        ASSERT_NEAR(got.o.get(i), want.o.get(i), 1e-2 * std::max(1.0, std::abs(want.o.get(i))))
            << cpu_path_name(path) << " o[" << i << "]";
      for (int64_t i = 0; i < want.final_state.numel(); ++i)
        ASSERT_NEAR(got.final_state.get(i), want.final_state.get(i), 1e-4) << cpu_path_name(path);
    }
  }
}


// GDN on bf16 q/k: the grams from bf16 dot products (ExecOptions::bf16_dot, AVX512-BF16) and from
// f32 conversions both meet the bounds, with and without in-kernel L2 norms (the norms and scale
// are then applied to the raw grams), odd K (a zero pads the last bf16 pair), tails, GVA, varlen.
// The two differ only in f32 summation order: their final states agree to ~1e-12.
TEST(LaBf16Dot, GramsFromBf16DotProductsAreExact) {
  if (!cpu::gram_bf16_usable()) GTEST_SKIP() << "no usable AMX (AMX-BF16 with the OS tile permission, and HANPU_ISA unset or native): the bf16 gram path cannot run here";
  struct Case {
    int64_t T, H, HV, K, V;
    std::vector<int64_t> seqlens;
    bool l2norm;
  };
  const Case cases[] = {{150, 2, 4, 63, 100, {}, false}, {150, 2, 4, 63, 100, {}, true}, {65, 1, 1, 128, 128, {}, false},
                        {64, 3, 3, 1, 60, {}, true},     {0, 1, 2, 100, 64, {15, 300, 64}, true},
                        {200, 2, 2, 256, 32, {}, false}};
  for (const Case& c : cases) {
    ProblemSpec s{.variant = Variant::GDN, .T = c.T, .H = c.H, .HV = c.HV, .K = c.K, .V = c.V, .seqlens = c.seqlens,
                     .dtype = DType::BF16, .gates = GateRegime::kStrong};
    s.opt.qk_l2norm = c.l2norm;
    s.opt.beta_sigmoid = true;
    const Problem p = make_problem(s);
    const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
    ExecOptions dot{CpuPath::HeadFused, 2, nullptr};
    ExecOptions f32 = dot;
    f32.bf16_dot = false;
    for (const ExecOptions& ex : {dot, f32}) {
      const Accuracy a = run_and_compare(p, ref, ex);
      EXPECT_LE(a.o, output_bound(DType::BF16)) << "bf16_dot=" << ex.bf16_dot << " o: " << s.describe();
      EXPECT_LE(a.state, kStateBound) << "bf16_dot=" << ex.bf16_dot << " state: " << s.describe();
    }
    const LaResult with_dot = la_prefill_alloc(s.variant, p.inputs(), s.opt, dot);
    const LaResult without = la_prefill_alloc(s.variant, p.inputs(), s.opt, f32);
    EXPECT_LE(nmse(with_dot.final_state, without.final_state), 1e-12) << s.describe();
  }
}

// The engine's GEMMs on AMX (both settings, 1 and 2 threads) against the fp64 reference on bf16 q/k:
// tails, H odd, HV = 2H, varlen, L2 norms, K = 1, both gate regimes; each test below gives the
// bounds' derivation. The report must name the AMX path and the result differ from the f32 engine's.
void expect_engine_amx_within_bounds(Variant variant, double split_state_bound) {
  struct Case {
    int64_t T, H, HV, K, V;
    std::vector<int64_t> seqlens;
    bool l2norm;
  };
  const Case cases[] = {{150, 2, 4, 63, 100, {}, false}, {150, 3, 3, 63, 100, {}, true}, {65, 1, 1, 128, 128, {}, false},
                        {64, 3, 3, 1, 60, {}, true},     {0, 1, 2, 100, 64, {15, 300, 64}, true},
                        {1, 1, 1, 128, 128, {}, true},   {500, 2, 2, 128, 128, {}, true},
                        {200, 2, 2, 256, 32, {}, false}, {129, 1, 2, 33, 17, {}, false}};
  constexpr double kRoundO = 1e-4, kRoundState = 1e-4;
  for (const Case& c : cases)
    for (GateRegime gates : {GateRegime::kStrong, GateRegime::kMild}) {
      ProblemSpec s{.variant = variant, .T = c.T, .H = c.H, .HV = c.HV, .K = c.K, .V = c.V, .seqlens = c.seqlens,
                       .dtype = DType::BF16, .gates = gates};
      s.opt.qk_l2norm = c.l2norm;
      s.opt.beta_sigmoid = true;
      const Problem p = make_problem(s);
      const LaReference ref = la_reference(s.variant, p.inputs(), s.opt);
      ExecOptions f32{CpuPath::HeadFused, 2, nullptr};
      const LaResult base = la_prefill_alloc(s.variant, p.inputs(), s.opt, f32);
      for (LaAmx mode : {LaAmx::Split, LaAmx::Round})
        for (int threads : {1, 2}) {
          ExecOptions ex = f32;
          ex.threads = threads;
          ex.amx = mode;
          const Accuracy a = run_and_compare(p, ref, ex);
          const bool split = mode == LaAmx::Split;
          const std::string what = std::string(la_amx_name(mode)) + ", " + std::to_string(threads) + " threads: " + s.describe();
          EXPECT_LE(a.o, split ? output_bound(DType::BF16) : kRoundO) << "o " << what;
          EXPECT_LE(a.state, split ? split_state_bound : kRoundState) << "state " << what;
          ExecReport rep;
          ex.report = &rep;
          const LaResult r = la_prefill_alloc(s.variant, p.inputs(), s.opt, ex);
          EXPECT_EQ(rep.gemms, split ? "amx-split" : "amx-round") << what;
          EXPECT_GT(nmse(r.final_state, base.final_state), 0.0) << "the AMX path did not run: " << what;
          std::printf("[amx] %-5s o %.2e state %.2e  %s\n", la_amx_name(mode), a.o, a.state, what.c_str());
        }
    }
}


// GDN on bf16 q/k with the engine's GEMMs on AMX (ExecOptions::amx, cpu/la_amx.hpp) against the
// fp64 reference: tails (T not a multiple of the chunk, K and V not multiples of 16 or 32), H odd,
// GVA (HV > H), varlen, L2 norms in the kernel or not, K = 1, 1 and 2 threads. Bounds
// (docs/ACCURACY.md, "The engine's GEMMs on AMX"): split (operands to 2^-16) keeps the bounds of
// every bf16 path, o 1e-5 and states 1e-10 (measured: o 3.0e-6, states 8e-12). round (2^-8, bf16's
// unit roundoff u) has six rounding points on the way to o (S in K S and in Q S, P and v_new in
// P v_new, the decayed v_new of the update, o itself), each adding at most u^2/3 = 5.1e-6 to the
// NMSE of the term it enters: 3.1e-5 without cancellation; v_new = beta v - K S cancels when the
// state already predicts v (measured up to 1.6x that at K = 1), so the bound is 1e-4 for o and the
// states. Both settings must differ from the f32 engine (a silent fallback fails the test).
TEST(LaAmx, EngineGemmsOnAmxAgainstFp64) {
  if (!cpu::la_amx_usable()) GTEST_SKIP() << "no usable AMX (AMX-BF16 with the OS tile permission, and HANPU_ISA unset or native): the engine's AMX GEMMs cannot run here";
  expect_engine_amx_within_bounds(Variant::GDN, kStateBound);
}

// KDA with the engine's GEMMs on AMX against the fp64 reference. KDA's products carry per-channel
// decays, so every operand is f32 and rounded (Round) or split (Split): Kn = −β k ⊙ e^Γ and S in
// the X product, q ⊙ e^Γ and S in the output's state read, P and v_new in P v_new, the decayed K^T
// and v_new in the update. Same shapes as GDN's test (tails, H odd, HV = 2H, varlen, L2 norms,
// K = 1, 1 and 2 threads), both gate regimes. Bounds (docs/ACCURACY.md, "KDA on AMX"): Split has
// three error terms per product (each side's lo rounding and the dropped lo x lo, mean square
// <= (u^2/3)^2 = 2.6e-11 each), six on the way to the state (X = ... + Kn S, then the update):
// 1.6e-10 without cancellation, 2.5e-10 with GDN's worst cancellation (1.6x, K = 1): state bound
// 5e-10 (measured: 2.0e-10 at K = 1, <= 2.5e-11 otherwise); o keeps the bf16 bound (its own
// rounding). Round has nine rounding points on the way to o (Kn and S, q e^Γ and S, P and v_new,
// the decayed K^T and v_new through the state, o): 4.6e-5 without cancellation, 7.4e-5 with 1.6x:
// 1e-4 for o and the states, as GDN's (measured: 5.1e-5 / 5.3e-5 at K = 1, <= 1.1e-5 otherwise).
// Both settings must differ from the f32 engine (a silent fallback fails the test).
TEST(LaAmx, KdaEngineGemmsOnAmxAgainstFp64) {
  if (!cpu::la_amx_usable()) GTEST_SKIP() << "no usable AMX (AMX-BF16 with the OS tile permission, and HANPU_ISA unset or native): the engine's AMX GEMMs cannot run here";
  expect_engine_amx_within_bounds(Variant::KDA, /*split_state_bound=*/5e-10);
}

// A requested AMX setting that cannot run falls back to the f32 engine and says why (on every CPU).
TEST(LaAmx, FallsBackByName) {
  ProblemSpec s{.variant = Variant::GDN, .T = 70, .H = 2, .HV = 2, .K = 32, .V = 48, .dtype = DType::BF16};
  const Problem p = make_problem(s);
  ExecReport rep;
  ExecOptions ex{CpuPath::HeadFused, 1, nullptr};
  ex.report = &rep;
  la_prefill_alloc(s.variant, p.inputs(), s.opt, ex);
  EXPECT_EQ(rep.gemms, "f32");
  ex.amx = LaAmx::Split;
  la_prefill_alloc(s.variant, p.inputs(), s.opt, ex);
  if (!cpu::la_amx_usable()) {
    EXPECT_EQ(rep.gemms.rfind("f32 (amx: no usable AMX-BF16", 0), 0u) << rep.gemms;
    return;
  }
  EXPECT_EQ(rep.gemms, "amx-split");
  ex.bf16_dot = false;  // no staged bf16 rows
  la_prefill_alloc(s.variant, p.inputs(), s.opt, ex);
  EXPECT_EQ(rep.gemms.rfind("f32 (amx: needs bf16 q and k", 0), 0u) << rep.gemms;
  ex.bf16_dot = true;
  ex.path = CpuPath::FlaChunk;
  la_prefill_alloc(s.variant, p.inputs(), s.opt, ex);
  EXPECT_EQ(rep.gemms, "f32 (amx: the head-fused path only)");
  ex.path = CpuPath::HeadFused;
  s.variant = Variant::KDA;
  const Problem kda = make_problem(s);
  la_prefill_alloc(s.variant, kda.inputs(), s.opt, ex);
  EXPECT_EQ(rep.gemms, "amx-split");  // KDA's operands are f32 either way: no bf16 dot products needed
  s.dtype = DType::F32;
  const Problem kda32 = make_problem(s);
  la_prefill_alloc(s.variant, kda32.inputs(), s.opt, ex);
  EXPECT_EQ(rep.gemms.rfind("f32 (amx: needs bf16 q and k", 0), 0u) << rep.gemms;
  s.dtype = DType::BF16;
  s.variant = Variant::GDN;
  s.dtype = DType::F32;
  const Problem f32 = make_problem(s);
  la_prefill_alloc(s.variant, f32.inputs(), s.opt, ex);
  EXPECT_EQ(rep.gemms.rfind("f32 (amx: needs bf16 q and k", 0), 0u) << rep.gemms;
}

// The operator orders a plan may choose (GEMM-first or the W/U form; in-place or double-buffered
// state) give the reference's results, with tails (T = 150, K = 60, V = 100) and groups.
// The operator orders of the planner's head-mapped strategies (GEMM-first with the state in place;
// FLA's W/U form with the next state built before the output), in lockstep groups of 2, with GVA.
TEST(LaPlan, OperatorOrdersAreExact) {
  for (Variant var : testing::every_variant()) {
    ProblemSpec s{.variant = var, .T = 150, .H = 2, .HV = 4, .K = 60, .V = 100, .gates = GateRegime::kMasked};
    const Problem p = make_problem(s);
    const LaReference ref = la_reference(var, p.inputs(), s.opt);
    const hanpu::Problem prob = problem_for_inputs(var, p.inputs(), s.opt);
    for (const std::string strategy : {"hanpu", "fla+mapping"}) {
      PlanOptions po;
      po.cores = 2;
      Plan plan = testing::plan_as_callers_do(prob, host_device(2, 0.0), strategy, po);
      for (Kernel& k : plan.kernels)
        for (auto& g : k.groups) g = lockstep_groups(k.cores[&g - &k.groups[0]], 2);
      ExecOptions ex;
      ex.plan = &plan;
      const LaResult r = la_prefill_alloc(var, p.inputs(), s.opt, ex);
      EXPECT_LE(nmse(r.o, ref.o), 1e-10) << strategy;
      EXPECT_LE(nmse(r.final_state, ref.final_state), 1e-10) << strategy;
    }
  }
}

}  // namespace
}  // namespace hanpu::testing
