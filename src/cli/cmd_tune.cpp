// `hanpu tune`: measures candidate values of the CPU backend's free parameters (plan.cpu,
// include/hanpu/cpu_tuning.hpp) on this machine and writes them to the wisdom file the planner
// reads, keyed by CPU model, ISA and problem class (as FFTW's wisdom).
//
// Method: start from the model-based values; per parameter in turn (coordinate search), plan the
// problem once per candidate with the other parameters at their current values, check that the
// candidate's output and final state equal the model-based run's within the fp32 bound the tests
// use (normalized MSE < 1e-10), then time all candidates in interleaved rounds (candidate a, b,
// c, a, b, c, ...: drifting load hits every candidate alike) and keep the fastest median when it
// beats the current value by more than kMinGain (smaller differences are noise on a shared
// machine). Finally the whole model-based plan and the whole tuned plan are timed interleaved.
// The table printed is the report of how far the model-based choices are from the tuned ones.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

#include "cli/bench_inputs.hpp"
#include "cli/commands.hpp"
#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/cpu_tuning.hpp"
#include "hanpu/device.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"

namespace {

using namespace hanpu;

// A candidate replaces the current value only if its median is this much faster: two runs of the
// same plan differ by a few percent on a loaded 2-core machine.
constexpr double kMinGain = 0.02;
// The fp32 equality bound of the tests (tests/la_testing.hpp: normalized MSE against fp64).
constexpr double kMaxNmse = 1e-10;

struct TuneArgs {
  std::vector<std::string> variants{"gdn", "kda"};
  int64_t T = 4096, heads = 16, value_heads = 0, dim = 128;
  int threads = 0;
  int rounds = 5;
  std::string dtype = "f32";
  std::string wisdom;  // default_wisdom_path()
  bool dry_run = false;
};


double nmse(const Tensor& x, const Tensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = x.get(i) - ref.get(i);
    num += d * d;
    den += ref.get(i) * ref.get(i);
  }
  return den > 0 ? num / den : num;
}


std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%MZ", &tm);
  return buf;
}

std::string ms(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(s < 0.01 ? 3 : 2) << s * 1e3;
  return o.str();
}

// The values tried for a parameter, the model's among them.
std::vector<int64_t> candidates(const std::string& name, const CpuTuning& model, const Problem& p, int threads) {
  std::set<int64_t> c = {cpu_param(model, name).value};
  const int lanes = cpu::simd_float_lanes();
  if (name == "lockstep_group") {
    const int64_t per_core = (p.HV + threads - 1) / threads;
    for (int64_t g : {1, 2, 3, 4, 6, 8})
      if (g <= std::max<int64_t>(1, per_core)) c.insert(g);
  } else if (name == "column_block") {
    for (int64_t d : {1, 2, 4}) {
      const int64_t w = (p.V / d + lanes - 1) / lanes * lanes;
      if (w >= lanes && w <= p.V) c.insert(w);
    }
  } else if (name == "gemm_rows") {
    const int r = cpu::gemm_max_rows();
    for (int64_t x : {r / 2, (3 * r) / 4, r})
      if (x >= 1) c.insert(x);
  } else if (name == "gemm_vectors") {
    for (int64_t x = 1; x <= cpu::gemm_max_vectors(); ++x) c.insert(x);
  } else if (name == "prefetch_rate") {
    for (int64_t x : {0, 1, 2, 4}) c.insert(x);
  }
  return {c.begin(), c.end()};
}

struct Runner {
  Variant variant;
  cli::BenchInputs in;
  LaOptions opt;
  int threads;
  Tensor o, state;
  Engine* engine = nullptr;

  double run(const Plan& plan) {
    ExecOptions ex;
    ex.plan = &plan;
    ex.engine = engine;
    const auto t0 = std::chrono::steady_clock::now();
    la_prefill(variant, in.views(), opt, LaOutputs{o.view(), state.view()}, ex);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

struct TableRow {
  std::string name;
  int64_t model, tuned;
  double model_s, tuned_s;
};

void tune_variant(const TuneArgs& a, const std::string& vname, std::ostream& out) {
  const Variant variant = *variant_from_name(vname);  // --variants checked the name
  const int threads = a.threads > 0 ? a.threads : hardware_threads();
  const int64_t HV = a.value_heads > 0 ? a.value_heads : a.heads;
  const DType dt = a.dtype == "bf16" ? DType::BF16 : DType::F32;
  Runner r{variant, cli::make_bench_inputs(variant, a.T, a.heads, HV, a.dim, a.dim, dt, 7), {}, threads,
           Tensor(dt, {1, a.T, HV, a.dim}), Tensor(DType::F32, {1, HV, a.dim, a.dim})};
  Engine engine(threads);
  r.engine = &engine;
  const Problem p = problem_for_inputs(variant, r.in.views(), r.opt);
  const Device dev = host_device(threads, 0.0);
  // The model's choice: the CPU rules without wisdom.
  PlanOptions base;
  base.backend = &cpu_plan_backend();
  base.cores = threads;
  const Plan model_plan = make_plan(p, dev, "hanpu", base);
  const CpuTuning& model = model_plan.cpu;
  const WisdomMachine machine{dev.cpu.model, dev.cpu.isa};
  const std::string cls = wisdom_problem_class(p, threads);
  out << "tuning " << cls << " (T = " << a.T << ", H = " << a.heads << ", HV = " << HV << ") on " << machine.cpu_model
      << ", " << machine.isa << ", " << a.rounds << " interleaved rounds per parameter\n";
  for (const std::string& name : cpu_param_names())
    out << "  model " << name << " = " << cpu_param(model, name).value << ": " << cpu_param(model, name).reason << "\n";
  r.run(model_plan);  // warm-up: arenas, pool, caches
  r.run(model_plan);
  const Tensor o_ref = r.o, s_ref = r.state;

  auto plan_with = [&](const CpuTuning& values) {
    PlanOptions po = base;
    CpuTuning given = values;
    for (const std::string& name : cpu_param_names()) cpu_param(given, name).reason = "hanpu tune candidate";
    po.cpu = &given;
    return make_plan(p, dev, "hanpu", po);
  };
  CpuTuning current = model;
  std::vector<TableRow> table;
  for (const std::string& name : cpu_param_names()) {
    const std::vector<int64_t> values = candidates(name, model, p, threads);
    std::vector<Plan> plans;
    std::vector<int64_t> kept;
    for (int64_t v : values) {
      CpuTuning t = current;
      cpu_param(t, name).value = v;
      Plan plan = plan_with(t);
      if (std::string why = cpu_cannot_run(plan); !why.empty()) {
        out << "  " << name << " = " << v << ": skipped, " << why << "\n";
        continue;
      }
      r.run(plan);
      const double eo = nmse(r.o, o_ref), es = nmse(r.state, s_ref);
      if (!(eo < kMaxNmse) || !(es < kMaxNmse)) {
        std::ostringstream e;
        e << "hanpu tune: " << name << " = " << v << " gives a different result from the model-based plan (normalized MSE "
          << eo << " of o, " << es << " of the final state; the bound is " << kMaxNmse << "): a CPU backend bug";
        throw Error(e.str());
      }
      plans.push_back(std::move(plan));
      kept.push_back(v);
    }
    std::vector<std::vector<double>> times(plans.size());
    for (int round = 0; round < a.rounds; ++round)
      for (size_t i = 0; i < plans.size(); ++i) times[i].push_back(r.run(plans[i]));
    const int64_t cur = cpu_param(current, name).value;
    size_t cur_i = 0, best_i = 0;
    std::vector<double> med(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) {
      med[i] = cli::median(times[i]);
      if (kept[i] == cur) cur_i = i;
      if (med[i] < med[best_i]) best_i = i;
    }
    if (med[best_i] >= med[cur_i] * (1 - kMinGain)) best_i = cur_i;
    out << "  " << name << ":";
    // The median with the range of the rounds: a range wider than the differences between
    // candidates says the machine was too noisy for this parameter.
    for (size_t i = 0; i < plans.size(); ++i)
      out << " " << kept[i] << "=" << ms(med[i]) << "ms [" << ms(*std::min_element(times[i].begin(), times[i].end())) << "-"
          << ms(*std::max_element(times[i].begin(), times[i].end())) << "]" << (i == best_i ? "*" : "");
    out << "\n" << std::flush;
    cpu_param(current, name).value = kept[best_i];
    // The model-based value's time: measured in this parameter's round (the earlier parameters at
    // their tuned values); a model value the CPU refused has no time.
    const auto mi = std::find(kept.begin(), kept.end(), cpu_param(model, name).value);
    table.push_back({name, cpu_param(model, name).value, kept[best_i], mi == kept.end() ? 0 : med[mi - kept.begin()], med[best_i]});
  }
  // The whole plans against each other.
  const Plan tuned_plan = plan_with(current);
  std::vector<double> tm, tt;
  for (int round = 0; round < a.rounds; ++round) {
    tm.push_back(r.run(model_plan));
    tt.push_back(r.run(tuned_plan));
  }
  table.push_back({"all (whole plan)", 0, 0, cli::median(tm), cli::median(tt)});

  out << "\n" << cls << " on " << machine.cpu_model << " (" << machine.isa << "), T = " << a.T << ", H = " << a.heads
      << ", medians of " << a.rounds << " interleaved runs\n";
  out << "| parameter | model-based | tuned | model-based ms | tuned ms | model/tuned |\n|---|---|---|---|---|---|\n";
  nlohmann::json times = nlohmann::json::object();
  for (const TableRow& row : table) {
    const bool whole = row.name.rfind("all", 0) == 0;
    std::ostringstream ratio;
    ratio << std::fixed << std::setprecision(3) << (row.model_s > 0 && row.tuned_s > 0 ? row.model_s / row.tuned_s : 0);
    out << "| " << row.name << " | " << (whole ? "" : std::to_string(row.model)) << " | " << (whole ? "" : std::to_string(row.tuned))
        << " | " << (row.model_s > 0 ? ms(row.model_s) : "refused") << " | " << ms(row.tuned_s) << " | " << ratio.str() << " |\n";
    times[whole ? "all" : row.name] = {{"model", row.model}, {"tuned", row.tuned}, {"model_ms", row.model_s * 1e3}, {"tuned_ms", row.tuned_s * 1e3}};
  }
  times["T"] = a.T, times["H"] = a.heads, times["HV"] = HV, times["rounds"] = a.rounds;
  if (a.dry_run) return;
  const std::string path = a.wisdom.empty() ? default_wisdom_path() : a.wisdom;
  if (path.empty()) throw Error("hanpu tune: no wisdom path (HANPU_WISDOM is \"none\" or no HOME); pass --wisdom PATH");
  WisdomEntry e;
  e.machine = machine;
  e.problem_class = cls;
  e.measured = utc_now();
  for (const std::string& name : cpu_param_names()) e.params.emplace_back(name, cpu_param(current, name).value);
  e.times = times;
  write_wisdom_entry(path, e);
  // What the planner now does with it.
  PlanOptions po;
  po.backend = &cpu_plan_backend();
  po.cores = threads;
  po.wisdom = std::make_shared<const Wisdom>(read_wisdom(path));
  po.wisdom_origin = path;
  const Plan check = make_plan(p, dev, "hanpu", po);
  out << "wrote " << path << "; the planner now plans " << cls << " with " << check.cpu.source << "\n\n" << std::flush;
}

}  // namespace

void register_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand(
      "tune",
      "Measure the CPU parameters' candidates (lockstep group, column block, GEMM tile, prefetch rate) on this machine "
      "and write the wisdom file the planner reads (key: CPU model, ISA, problem class); prints model-based vs tuned");
  cmd->add_option("--variants", args->variants, "gdn and/or kda")->check(CLI::IsMember({"gdn", "kda"}));
  cmd->add_option("--T", args->T, "tokens")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--heads", args->heads, "key heads H")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--value-heads", args->value_heads, "value heads HV (default H; a multiple of H)")->check(CLI::Range(int64_t{0}, int64_t{1024}));
  cmd->add_option("--dim", args->dim, "K = V")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--threads", args->threads, "threads (default all)")->check(CLI::Range(0, 1024));
  cmd->add_option("--rounds", args->rounds, "interleaved timed rounds per parameter (median)")->check(CLI::Range(1, 1000));
  cmd->add_option("--dtype", args->dtype, "q/k/v dtype")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--wisdom", args->wisdom,
                  "wisdom file to update (default $HANPU_WISDOM, else $XDG_CACHE_HOME/hanpu/wisdom.json or ~/.cache/hanpu/wisdom.json)");
  cmd->add_flag("--dry-run", args->dry_run, "measure and print, write nothing");
  cmd->callback([args] {
    for (const std::string& v : args->variants) tune_variant(*args, v, std::cout);
  });
}
