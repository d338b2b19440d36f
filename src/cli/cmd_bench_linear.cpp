// `hanpu bench-linear`: Bf16Linear (y = x W^T, bf16 weight, f32 activations) on random data, next
// to the machine's f32 FMA peak and read bandwidth measured in the same run. Prints GFLOP/s
// (2*M*K*N per forward) and GB/s of weight bytes streamed (N*K*2 per forward: the decode limit),
// and the error of the result against an fp64 reference on a sample of outputs. cpu% is the
// process CPU time over wall time x threads: below ~95 other processes shared the cores and the
// speeds are low by about that factor.
//
// Without --K/--N it runs the projection shapes of Qwen3.5-0.8B or, with --model 2b, 2B (docs/LINEAR.md) and sums them, per
// row count, into the projection time of one whole-model prefill forward.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/linear_shapes.hpp"
#include "cpu/host.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/linear.hpp"

namespace {

using namespace hanpu;

struct Args {
  std::vector<int64_t> Ms{1, 512, 2048};
  int64_t K = 0, N = 0;
  std::string model = "0.8b";  // which Qwen3.5 size's projection shapes (without --K/--N)
  std::vector<int> threads{1, 2};
  std::vector<std::string> modes{"exact"};
  std::string backend = "auto";
  double min_seconds = 0.3;
  bool lm_head = false;
  int64_t int8_group = 0;  // > 0: Int8Linear with this group instead of Bf16Linear
};

// The layer under test: a Bf16Linear, or an Int8Linear quantized from the same bf16 weight (then
// the reference is the dequantized weight with f32 activations, and of the precision modes only
// int8 applies: its error columns show the activations' quantization).
struct Layer {
  std::optional<Bf16Linear> bf16;
  std::optional<Int8Linear> int8;
  int64_t K = 0, N = 0;
  Engine* engine = nullptr;  // the command's (every thread count on the first threads of its pool)
  void forward(TensorView x, TensorView y, int threads, LinearPrecision p) const {
    if (int8) int8->forward(*engine, x, y, threads, false, p);
    else bf16->forward(*engine, x, y, threads, false, p);
  }
  double weight(const std::vector<uint16_t>& w, int64_t n, int64_t k) const {
    return int8 ? int8->weight(n, k) : bf16_to_f32(w[static_cast<size_t>(n * K + k)]);
  }
  double weight_bytes() const { return int8 ? static_cast<double>(int8->bytes()) : 2.0 * K * N; }
  std::string backend() const {
    return int8 ? "int8/g" + std::to_string(int8->group()) : linear_backend_name(bf16->backend());
  }
};

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Result {
  double seconds_per_call = 0;
  double cpu_share = 0;    // process CPU time / (wall time x threads): < 1 when others share the cores
  double max_rel_err = 0;  // max |y - ref| / sum|x w| over sampled outputs
  double nmse = 0;         // sum (y - ref)^2 / sum ref^2 over sampled outputs
};

Result run_one(const Layer& lin, const std::vector<uint16_t>& w, int64_t M, int threads, LinearPrecision prec,
               double min_seconds) {
  const int64_t K = lin.K, N = lin.N;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nrm(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  for (auto& v : x) v = nrm(rng);
  const TensorView xv = TensorView::contiguous(x.data(), DType::F32, {M, K});
  const TensorView yv = TensorView::contiguous(y.data(), DType::F32, {M, N});
  lin.forward(xv, yv, threads, prec);  // warm-up (scratch buffers, thread pool)
  int reps = 0;
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    lin.forward(xv, yv, threads, prec);
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds || reps < 2);
  Result r;
  r.seconds_per_call = elapsed / reps;
  r.cpu_share = (process_cpu_seconds() - cpu0) / (elapsed * threads);
  // Error on a sample of outputs (fp64 reference).
  double se = 0, sr = 0;
  for (int s = 0; s < 256; ++s) {
    const int64_t m = static_cast<int64_t>(rng() % static_cast<uint64_t>(M));
    const int64_t n = static_cast<int64_t>(rng() % static_cast<uint64_t>(N));
    double ref = 0, abs = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double p = static_cast<double>(x[static_cast<size_t>(m * K + k)]) * lin.weight(w, n, k);
      ref += p;
      abs += std::fabs(p);
    }
    const double e = y[static_cast<size_t>(m * N + n)] - ref;
    se += e * e;
    sr += ref * ref;
    if (abs > 0) r.max_rel_err = std::max(r.max_rel_err, std::fabs(e) / abs);
  }
  r.nmse = sr > 0 ? se / sr : 0;
  return r;
}

void print_model_estimate(const std::map<std::tuple<int64_t, int, int>, std::pair<double, int>>& model_time,
                          int model_shapes, const std::string& model) {
  bool header = false;
  for (const auto& [key, value] : model_time) {
    const auto& [M, t, p] = key;
    if (value.second != model_shapes || M < 2) continue;
    if (!header) {
      std::printf("\nQwen3.5-%s, all projections of one prefill forward (24 layers, LM head excluded):\n",
                  qwen35_projection_model(model).label);
      header = true;
    }
    std::printf("  M=%-5lld threads=%d %-7s %9.1f ms  -> %8.0f tokens/s if projections were all the work\n",
                static_cast<long long>(M), t, linear_precision_name(static_cast<LinearPrecision>(p)),
                value.first * 1e3, static_cast<double>(M) / value.first);
  }
}

void run(const Args& a) {
  const LinearBackend backend = linear_backend_from_name(a.backend);
  std::vector<LinearPrecision> precs;
  for (const auto& m : a.modes) precs.push_back(linear_precision_from_name(m));
  std::vector<ProjectionShape> shapes;
  if (a.K > 0 || a.N > 0) {
    if (a.K <= 0 || a.N <= 0) throw Error("bench-linear: give both --K and --N (got K=" + std::to_string(a.K) +
                                          ", N=" + std::to_string(a.N) + ")");
    shapes.push_back({"custom", a.K, a.N, 0});
  } else {
    for (const auto& s : qwen35_projections(a.model))
      if (s.name != "lm_head" || a.lm_head) shapes.push_back(s);
  }
  for (int64_t M : a.Ms)
    if (M <= 0) throw Error("bench-linear: --M must be positive, got " + std::to_string(M));
  // Sizes are checked before anything is allocated (docs/RELIABILITY.md): at most 2^31 elements
  // per matrix (4 GiB of bf16 weights), not a bare std::bad_alloc later.
  constexpr int64_t kMaxElems = int64_t{1} << 31;
  for (const auto& s : shapes) {
    if (s.K * s.N > kMaxElems)
      throw Error("bench-linear: --K x --N = " + std::to_string(s.K) + " x " + std::to_string(s.N) +
                  " weights, expected at most 2^31 elements");
    for (int64_t M : a.Ms)
      if (M * std::max(s.K, s.N) > kMaxElems)
        throw Error("bench-linear: --M " + std::to_string(M) + " x " + std::to_string(std::max(s.K, s.N)) +
                    " activations, expected at most 2^31 elements");
  }
  for (int t : a.threads)
    if (t <= 0) throw Error("bench-linear: --threads must be positive, got " + std::to_string(t));

  const int max_threads = *std::max_element(a.threads.begin(), a.threads.end());
  const HostMeasurement h1 = measure_host(1, 0.6);
  const HostMeasurement hn = max_threads > 1 ? measure_host(max_threads, 0.6) : h1;
  std::printf("machine: f32 FMA peak %.0f GFLOP/s (1 thread), %.0f GFLOP/s (%d threads); read bandwidth "
              "%.1f GB/s (1 thread), %.1f GB/s (%d threads)\n",
              h1.fma_peak_gflops_1thread, hn.fma_peak_gflops_all, hn.threads, h1.mem_bandwidth_gbs,
              hn.mem_bandwidth_gbs, hn.threads);
  if (linear_avx512bf16_available())
    std::printf("VDPBF16PS: %.2fx the multiply-adds per second of VFMADD231PS (measured now); the auto backend "
                "takes %s\n",
                linear_bf16dot_mac_ratio(), linear_backend_name(linear_auto_backend()));
  std::printf("%-18s %6s %6s %7s %3s %-8s %-7s %10s %9s %9s %7s %5s %10s %10s\n", "shape", "M", "K", "N", "thr",
              "backend", "mode", "ms/call", "GFLOP/s", "x f32pk", "GB/s W", "cpu%", "max rel", "nMSE");
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nrm(0.f, 1.f);
  // Per (M, threads, mode): seconds of all projections of one model forward, and shapes counted.
  std::map<std::tuple<int64_t, int, int>, std::pair<double, int>> model_time;
  int model_shapes = 0;
  for (const auto& s : shapes) model_shapes += s.per_model > 0;
  Engine engine(max_threads);
  for (const auto& s : shapes) {
    std::vector<uint16_t> w(static_cast<size_t>(s.N * s.K));
    for (auto& v : w) v = f32_to_bf16(0.03f * nrm(rng));
    const TensorView wv = TensorView::contiguous(w.data(), DType::BF16, {s.N, s.K});
    Layer lin;
    lin.K = s.K;
    lin.N = s.N;
    lin.engine = &engine;
    if (a.int8_group > 0) lin.int8.emplace(wv, s.name, a.int8_group);
    else lin.bf16.emplace(wv, s.name, backend);
    for (int64_t M : a.Ms) {
      for (int t : a.threads) {
        for (LinearPrecision p : precs) {
          const Result r = run_one(lin, w, M, t, p, a.min_seconds);
          const double flops = 2.0 * M * s.K * s.N, wbytes = lin.weight_bytes();
          const double peak = t == 1 ? h1.fma_peak_gflops_1thread : hn.fma_peak_gflops_all;
          std::printf("%-18s %6lld %6lld %7lld %3d %-8s %-7s %10.3f %9.1f %9.2f %7.1f %5.0f %10.2e %10.2e\n",
                      s.name.c_str(),
                      static_cast<long long>(M), static_cast<long long>(s.K), static_cast<long long>(s.N), t,
                      lin.backend().c_str(),
                      lin.int8 ? (p == LinearPrecision::kInt8 && Int8Linear::int8_activations_available(M) ? "int8" : "f32")
                               : linear_precision_name(p), r.seconds_per_call * 1e3,
                      flops / r.seconds_per_call / 1e9, flops / r.seconds_per_call / 1e9 / peak,
                      wbytes / r.seconds_per_call / 1e9, 100 * r.cpu_share, r.max_rel_err, r.nmse);
          std::fflush(stdout);
          if (s.per_model > 0) {
            auto& [sec, count] = model_time[{M, t, static_cast<int>(p)}];
            sec += s.per_model * r.seconds_per_call;
            ++count;
          }
        }
      }
    }
  }
  print_model_estimate(model_time, model_shapes, a.model);
}

}  // namespace

void register_bench_linear_command(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("bench-linear",
                                 "Benchmark the bf16-weight projections (GFLOP/s, weight GB/s, error) next to the "
                                 "machine's FMA peak and bandwidth");
  cmd->add_option("--M", args->Ms, "rows (tokens), comma separated")->delimiter(',')->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--model", args->model, "without --K/--N: the projection shapes of Qwen3.5 0.8b (default) or 2b")
      ->check(CLI::IsMember(qwen35_projection_model_keys()));
  cmd->add_option("--K", args->K, "in_features (with --N; default: the --model shapes)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--N", args->N, "out_features")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--threads", args->threads, "thread counts, comma separated")->delimiter(',')->check(CLI::Range(1, 1024));
  cmd->add_option("--mode", args->modes, "precision modes: exact, bf16x2, bf16, int8 (with --int8-group) (comma separated)")->delimiter(',');
  cmd->add_option("--backend", args->backend, "auto, portable, amx or avx512bf16");
  cmd->add_option("--int8-group", args->int8_group,
                  "benchmark Int8Linear (int8 weights, one scale per this many inputs) instead of Bf16Linear")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seconds", args->min_seconds, "minimum time per row")->check(CLI::Range(0.0, 3600.0));
  cmd->add_flag("--lm-head", args->lm_head, "include the LM head (248320 x hidden) in the default shapes");
  cmd->callback([args] { run(*args); });
}
