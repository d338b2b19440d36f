// `hanpu bench`: GDN and KDA prefill on synthetic inputs through the head-fused path, the
// FLA-style baseline and the recurrent form, next to the machine's FMA peak measured in the same
// run. The operation count is la_flops_per_token_head (docs/PERFORMANCE.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "cli/bench_inputs.hpp"
#include "cli/commands.hpp"
#include "cpu/kernels.hpp"
#include "cpu/la_amx.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/host.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/device.hpp"
#include "hanpu/la.hpp"
#include "hanpu/operator_timers.hpp"
#include "hanpu/plan_exec.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/simulate.hpp"
#include "io/file_io.hpp"

namespace {

using namespace hanpu;

struct BenchArgs {
  std::vector<std::string> variants{"gdn", "kda"};
  std::vector<int64_t> Ts{512, 1024, 2048, 4096, 16384};
  std::vector<int64_t> heads{16, 32, 48};
  std::vector<std::string> dtypes{"f32", "bf16"};
  std::vector<int> threads;  // default: 1 and all
  std::vector<std::string> paths{"hanpu", "fla", "recurrent"};
  int64_t dim = 128;
  double min_seconds = 0.2;  // per row: repeat until this much time (and at least min_reps)
  int min_reps = 3;
  bool json = false;
  std::string json_out;  // also write the JSON rows to this file (the table still prints)
  bool ablation = false;  // run the planner's ablation steps for real, next to their simulation
  bool operator_times = false;  // per-operator time of the head-fused rows (a "timers" build only)
  // ExecOptions::bf16_dot settings to run the head-fused path with on bf16 GDN rows ("on", "off")
  std::vector<std::string> bf16_dot{"on"};
  // ExecOptions::amx settings for the same rows ("off", "round", "split"; with --bf16-dot on)
  std::vector<std::string> amx{"off"};
};


struct Row {
  std::string variant, path, dtype;
  bool bf16_dot = false;  // the GDN grams ran on bf16 dot-product instructions
  int64_t T, heads, K, V;
  int threads;
  double ms, tokens_per_s, gflops, peak_gflops, peak_fraction;
  size_t extra_bytes;
  int reps;
  std::string amx = "off";  // the engine's GEMMs ran on AMX (ExecOptions::amx), else "off"
  double plan_hit_us = 0;  // planning cost of a call whose plan is in the cache (plan look-up + nothing else)
};


// Runs `run` once to warm up (arenas, pool, caches), calls `after_warmup`, then times it until at
// least min_reps runs and min_seconds have passed (at most 50 runs): the seconds of each timed run.
template <class Run, class AfterWarmup = void (*)()>
std::vector<double> time_runs(const BenchArgs& a, Run&& run, AfterWarmup after_warmup = [] {}) {
  run();
  after_warmup();
  std::vector<double> times;
  double total = 0;
  while (static_cast<int>(times.size()) < a.min_reps || total < a.min_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(s);
    total += s;
    if (times.size() >= 50) break;
  }
  return times;
}

CpuPath parse_path(const std::string& p) {
  if (const std::optional<CpuPath> path = cpu_path_from_name(p)) return *path;
  throw Error("unknown path '" + p + "' (expected hanpu, fla or recurrent)");
}

void print_header() {
  std::printf("%-4s %-10s %6s %5s %-4s %3s %10s %11s %9s %7s %10s %8s\n", "var", "path", "T", "heads", "dt", "thr", "ms",
              "tokens/s", "GFLOP/s", "%peak", "extra MiB", "plan us");
}

void print_row(const Row& r) {
  std::string path = r.bf16_dot ? r.path + "+dot" : r.path;
  if (r.amx != "off") path = r.path + (r.amx == "split" ? "+amx2" : "+amx");
  std::printf("%-4s %-10s %6lld %5lld %-4s %3d %10.3f %11.0f %9.1f %6.1f%% %10.2f %8.1f\n", r.variant.c_str(), path.c_str(),
              static_cast<long long>(r.T), static_cast<long long>(r.heads), r.dtype.c_str(), r.threads, r.ms,
              r.tokens_per_s, r.gflops, 100.0 * r.peak_fraction, static_cast<double>(r.extra_bytes) / (1 << 20),
              r.plan_hit_us);
  std::fflush(stdout);
}

// Rejects bad selections before the (slow) peak measurement.
void validate_args(const BenchArgs& a) {
  for (const std::string& v : a.variants)
    if (!variant_from_name(v)) throw Error("unknown variant '" + v + "' (expected " + variant_names(" or ") + ")");
  for (const std::string& d : a.dtypes)
    if (d != "f32" && d != "bf16" && d != "f16") throw Error("unknown dtype '" + d + "' (expected f32, bf16 or f16)");
  for (const std::string& p : a.paths) parse_path(p);
  for (const std::string& b : a.bf16_dot)
    if (b != "on" && b != "off") throw Error("unknown --bf16-dot '" + b + "' (expected on or off)");
  for (const std::string& m : a.amx)
    if (!la_amx_from_name(m)) throw Error("unknown --amx '" + m + "' (expected off, round or split)");
  for (int64_t t : a.Ts)
    if (t < 1) throw Error("--T " + std::to_string(t) + ": sequence lengths must be positive");
    else if (t > kMaxTokens)
      throw Error("--T " + std::to_string(t) + ": expected at most " + std::to_string(kMaxTokens) + " tokens (docs/RELIABILITY.md)");
  for (int64_t h : a.heads)
    if (h < 1) throw Error("--heads " + std::to_string(h) + ": head counts must be positive");
    else if (h > kMaxHeads) throw Error("--heads " + std::to_string(h) + ": expected at most " + std::to_string(kMaxHeads));
  for (int t : a.threads)
    if (t < 1 || t > 1024) throw Error("--threads " + std::to_string(t) + ": expected 1..1024");
  if (a.operator_times && !read_operator_times().enabled)
    throw Error("--operator-times needs a build with the per-operator timers: cmake --preset timers && "
                "cmake --build --preset timers, then build/timers/hanpu bench --operator-times");
}

// "load 15.0K, gate 2.1K, ..." per (value head, column block, chunk) step, and the total.
std::string operator_times_line(const OperatorTimes& t) {
  std::string line = "  operators, " + t.unit + " per head-chunk (" + std::to_string(t.head_chunks) + " measured):";
  double total = 0;
  char buf[64];
  for (const auto& [name, v] : t.per_head_chunk) {
    std::snprintf(buf, sizeof buf, " %s %.1fK,", name.c_str(), v / 1e3);
    line += buf;
    total += v;
  }
  std::snprintf(buf, sizeof buf, " total %.1fK", total / 1e3);
  return line + buf;
}

void run_bench(const BenchArgs& a) {
  validate_args(a);
  const int all = hardware_threads();
  std::vector<int> thread_counts = a.threads;
  if (thread_counts.empty()) thread_counts = all > 1 ? std::vector<int>{1, all} : std::vector<int>{1};
  std::sort(thread_counts.begin(), thread_counts.end());
  thread_counts.erase(std::unique(thread_counts.begin(), thread_counts.end()), thread_counts.end());
  Engine engine(thread_counts.back());  // every count runs on the first threads of one pool

  // The limit, measured in this run: FP32 FMA peak for 1 thread and for each thread count used.
  const HostInfo host = detect_host();
  std::map<int, double> peak;
  double bandwidth = 0;
  for (int t : thread_counts) {
    const HostMeasurement m = measure_host(t, 0.6);
    peak[t] = t == 1 ? m.fma_peak_gflops_1thread : m.fma_peak_gflops_all;
    bandwidth = std::max(bandwidth, m.mem_bandwidth_gbs);
  }
  if (!a.json) {
    std::printf("hanpu bench: %s, %d hardware threads, SIMD %s (%d f32 lanes)\n", host.cpu_model.c_str(), all,
                cpu::simd_target_name(), cpu::simd_float_lanes());
    for (auto [t, p] : peak) std::printf("measured FP32 FMA peak, %d thread%s: %.1f GFLOP/s\n", t, t > 1 ? "s" : "", p);
    std::printf("measured memory read bandwidth: %.1f GB/s\n", bandwidth);
    std::printf("op count: %.1f kFLOP per token per head (K=V=%lld; GEMM-first chunk-64 count, docs/PERFORMANCE.md)\n\n",
                la_flops_per_token_head(Variant::GDN, a.dim, a.dim) / 1e3, static_cast<long long>(a.dim));
    print_header();
  }
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& vname : a.variants) {
    const std::optional<Variant> parsed = variant_from_name(vname);
    if (!parsed) throw Error("unknown variant '" + vname + "' (expected " + variant_names(" or ") + ")");
    const Variant var = *parsed;
    for (const std::string& dname : a.dtypes) {
      if (dname != "f32" && dname != "bf16" && dname != "f16")
        throw Error("unknown dtype '" + dname + "' (expected f32, bf16 or f16)");
      const DType dt = dname == "f32" ? DType::F32 : dname == "bf16" ? DType::BF16 : DType::F16;
      for (int64_t H : a.heads) {
        for (int64_t T : a.Ts) {
          if (T < 1 || H < 1) throw Error("--T and --heads must be positive");
          const cli::BenchInputs in = cli::make_bench_inputs(var, T, H, H, a.dim, a.dim, dt, 42);
          const LaInputs li = in.views();
          Tensor o(dt, {1, T, H, a.dim}), ht(DType::F32, {1, H, a.dim, a.dim});
          const LaOutputs lo{o.view(), ht.view()};
          for (const std::string& pname : a.paths) {
            const CpuPath path = parse_path(pname);
            // bf16 dot products exist only for the head-fused GDN grams (one gate per head) on bf16 inputs.
            const bool dot_applies = path == CpuPath::HeadFused && variant_traits(var).head_gate() && dt == DType::BF16;
            // AMX GEMMs: GDN's with the bf16 dot products on, KDA's (decayed f32 operands) on bf16 inputs.
            const bool kda_amx_applies = path == CpuPath::HeadFused && variant_traits(var).channel_gate() && dt == DType::BF16;
            for (const std::string& dot : dot_applies ? a.bf16_dot : std::vector<std::string>{"off"})
            for (int th : thread_counts)
            for (const std::string& amx : (dot_applies && dot == "on") || kda_amx_applies ? a.amx
                                                                                           : std::vector<std::string>{"off"}) {
              size_t extra = 0;
              ExecReport rep;
              ExecOptions ex{path, th, nullptr, &extra};
              ex.bf16_dot = dot == "on";
              ex.amx = *la_amx_from_name(amx);
              ex.engine = &engine;
              ex.report = &rep;
              const bool timed_operators = a.operator_times && path == CpuPath::HeadFused;
              // Every call plans through the host plan cache: the first (warm-up) call of a shape
              // plans, the timed ones find the plan; both costs are reported.
              double miss_seconds = -1;
              const std::vector<double> times = time_runs(
                  a, [&] {
                    la_prefill(var, li, LaOptions{}, lo, ex);
                    if (miss_seconds < 0) miss_seconds = rep.plan_cache_hit ? 0 : rep.planning_seconds;
                  },
                  [] { reset_operator_times(); });
              const OperatorTimes op_times = timed_operators ? read_operator_times() : OperatorTimes{};
              Row r{vname, pname, dname, dot_applies && ex.bf16_dot && cpu::gram_bf16_usable(), T, H, a.dim, a.dim, th,
                    0, 0, 0, 0, 0, extra, static_cast<int>(times.size())};
              const double sec = cli::median(times);
              // What ran (the engine reports a requested setting that did not run, and why).
              r.amx = rep.gemms == "amx-round" ? "round" : rep.gemms == "amx-split" ? "split" : "off";
              if (ex.amx != LaAmx::Off && r.amx == "off" && !a.json)
                std::printf("note: --amx %s did not run: %s\n", amx.c_str(), rep.gemms.c_str());
              r.plan_hit_us = rep.plan_cache_hit ? rep.planning_seconds * 1e6 : 0;
              r.ms = sec * 1e3;
              r.tokens_per_s = static_cast<double>(T) / sec;
              r.gflops = la_flops_per_token_head(var, a.dim, a.dim) * static_cast<double>(T * H) / sec / 1e9;
              r.peak_gflops = peak[th];
              r.peak_fraction = r.gflops / r.peak_gflops;
              {
                out.push_back({{"variant", r.variant},
                               {"path", r.path},
                               {"T", r.T},
                               {"heads", r.heads},
                               {"K", r.K},
                               {"V", r.V},
                               {"dtype", r.dtype},
                               {"threads", r.threads},
                               {"ms", r.ms},
                               {"tokens_per_s", r.tokens_per_s},
                               {"gflops", r.gflops},
                               {"peak_gflops", r.peak_gflops},
                               {"peak_fraction", r.peak_fraction},
                               {"extra_bytes", r.extra_bytes},
                               {"reps", r.reps},
                               {"ms_min", *std::min_element(times.begin(), times.end()) * 1e3},
                               {"bf16_dot", r.bf16_dot},
                               {"amx", r.amx},
                               {"gemms", rep.gemms},
                               {"plan_first_call_us", miss_seconds * 1e6},
                               {"plan_cache_hit_us", rep.plan_cache_hit ? rep.planning_seconds * 1e6 : -1.0},
                               {"executed_as", rep.schedule ? rep.schedule->summary : std::string()},
                               {"mem_bandwidth_gbs", bandwidth}});
                if (timed_operators) {
                  nlohmann::json ops = nlohmann::json::object();
                  for (const auto& [name, v] : op_times.per_head_chunk) ops[name] = v;
                  out.back()["operator_times"] = {{"unit", op_times.unit}, {"head_chunks", op_times.head_chunks},
                                                  {"per_head_chunk", ops}};
                }
              }
              if (!a.json) print_row(r);
              if (!a.json && timed_operators) std::printf("%s\n", operator_times_line(op_times).c_str());
              if (!a.json_out.empty()) {
                write_file_atomic(a.json_out, out.dump(2) + "\n");  // io/file_io.hpp
              }
            }
          }
        }
      }
    }
  }
  if (a.json) std::cout << out.dump(2) << std::endl;
}


// `hanpu bench --ablation`: the planner's ablation (fla -> +mapping -> +reordering -> +layout)
// planned for this machine (host_device: detected and measured in this run), each step executed
// for real by the CPU backend (plan_exec.hpp) and simulated on the same host model, so the
// simulator's prediction and the measurement sit side by side.
void run_ablation(const BenchArgs& a) {
  validate_args(a);
  const int threads = a.threads.empty() ? hardware_threads() : a.threads.front();
  const Device host = host_device(threads, 1.0);
  Engine engine(threads);
  const double peak = host.matrix_macs_per_cycle(DType::F32) * 2 * host.clock_ghz.value * threads;
  if (!a.json) {
    std::printf("hanpu bench --ablation: %s; host model: FMA peak %.1f GFLOP/s (%s), GM %s\n",
                host.description.c_str(), peak, host.matrix.macs_per_cycle.at(DType::F32).status.c_str(),
                host.paths.empty() ? "?" : (std::to_string(static_cast<int>(host.path("GM", "L2").bandwidth_gbs.value)) + " GB/s").c_str());
    std::printf("%-4s %6s %5s %-4s %-31s %10s %9s %7s %10s %12s  %s\n", "var", "T", "heads", "dt", "step", "cpu ms",
                "GFLOP/s", "%peak", "sim ms", "sim GM MiB", "executed as");
  }
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& vname : a.variants) {
    const Variant var = *variant_from_name(vname);  // checked by validate_args
    for (const std::string& dname : a.dtypes) {
      const DType dt = dname == "f32" ? DType::F32 : dname == "bf16" ? DType::BF16 : DType::F16;
      for (int64_t H : a.heads) {
        for (int64_t T : a.Ts) {
          const cli::BenchInputs in = cli::make_bench_inputs(var, T, H, H, a.dim, a.dim, dt, 42);
          const LaInputs li = in.views();
          Tensor o(dt, {1, T, H, a.dim}), ht(DType::F32, {1, H, a.dim, a.dim});
          const LaOutputs lo{o.view(), ht.view()};
          const LaShape shape = validate_la(var, li, LaOptions{});
          Problem prob = problem_for_inputs(var, li, LaOptions{});
          for (const std::string& step : ablation_names()) {
            PlanOptions po = cpu_plan_options(host);
            po.cores = threads;
            const Plan plan = make_plan(prob, host, step, po);
            const CpuSchedule ex = lower_plan_for_cpu(plan, shape, prob.seqlens);
            const SimResult sim = simulate(plan, host);
            ExecOptions eo;
            eo.plan = &plan;
            eo.engine = &engine;
            const double sec = cli::median(time_runs(a, [&] { la_prefill(var, li, LaOptions{}, lo, eo); }));
            const double gflops = la_flops_per_token_head(var, a.dim, a.dim) * static_cast<double>(T * H) / sec / 1e9;
            const double gm = static_cast<double>(sim.gm_read_bytes + sim.gm_write_bytes);
            out.push_back({{"variant", vname}, {"T", T}, {"heads", H}, {"dtype", dname}, {"threads", threads},
                           {"step", step}, {"cpu_ms", sec * 1e3}, {"gflops", gflops}, {"peak_gflops", peak},
                           {"peak_fraction", gflops / peak}, {"sim_latency_ms", sim.latency_s * 1e3},
                           {"sim_gm_bytes", gm}, {"executed_as", ex.summary}});
            if (!a.json)
              std::printf("%-4s %6lld %5lld %-4s %-31s %10.3f %9.1f %6.1f%% %10.3f %12.2f  %s\n", vname.c_str(),
                          static_cast<long long>(T), static_cast<long long>(H), dname.c_str(), step.c_str(), sec * 1e3,
                          gflops, 100 * gflops / peak, sim.latency_s * 1e3, gm / (1 << 20), ex.summary.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
  }
  if (a.json) std::cout << out.dump(2) << std::endl;
  if (!a.json_out.empty()) {
    write_file_atomic(a.json_out, out.dump(2) + "\n");
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "benchmark GDN/KDA prefill on synthetic inputs against the measured peak");
  sub->add_option("--variant", args->variants, "gdn, kda (default both)")->delimiter(',');
  sub->add_option("--T", args->Ts, "sequence lengths (default 512,1024,2048,4096,16384)")->delimiter(',');
  sub->add_option("--heads", args->heads, "H = HV head counts (default 16,32,48)")->delimiter(',');
  sub->add_option("--dtype", args->dtypes, "input dtypes: f32, bf16, f16 (default f32,bf16)")->delimiter(',');
  sub->add_option("--threads", args->threads, "thread counts (default 1 and all)")->delimiter(',');
  sub->add_option("--path", args->paths, "hanpu, fla, recurrent (default all)")->delimiter(',');
  sub->add_option("--dim", args->dim, "K = V head dim (default 128)")->check(CLI::Range(1, 256));
  sub->add_option("--min-seconds", args->min_seconds, "time per row at least (default 0.2)")->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--bf16-dot", args->bf16_dot,
                  "bf16 GDN rows of the hanpu path: on (K K^T and Q K^T with AVX512-BF16 dot products when the CPU "
                  "has them), off (f32 conversion first), or on,off for both (default on)")
      ->delimiter(',');
  sub->add_option("--amx", args->amx,
                  "bf16 rows of the hanpu path (GDN with --bf16-dot on, KDA): the engine's GEMMs on AMX tiles with the "
                  "f32 operands rounded to bf16 (round) or split into two bf16 terms (split), or not (off); a list "
                  "runs each (default off)")
      ->delimiter(',');
  sub->add_flag("--json", args->json, "print the rows as a JSON array");
  sub->add_option("--json-out", args->json_out, "also write the JSON rows to this file (updated after every row)");
  sub->add_flag("--operator-times", args->operator_times,
                 "per-operator time of the head-fused rows (load, gate, state GEMMs, grams, mask, solve, output, "
                 "store, update) per head-chunk; needs a build with -DHANPU_OPERATOR_TIMERS=ON (preset timers)");
  sub->add_flag("--ablation", args->ablation,
                 "run the planner's ablation steps (fla, +mapping, +reordering, +layout) planned for this machine, "
                 "for real and simulated (defaults: --T 4096 --heads 16 --dtype f32 --threads all)");
  sub->callback([args, sub] {
    if (args->ablation) {
      BenchArgs a = *args;
      if (!sub->count("--T")) a.Ts = {4096};
      if (!sub->count("--heads")) a.heads = {16};
      if (!sub->count("--dtype")) a.dtypes = {"f32"};
      run_ablation(a);
    } else {
      run_bench(*args);
    }
  });
}
