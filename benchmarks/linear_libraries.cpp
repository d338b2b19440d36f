// hanpu's projections (Bf16Linear) next to the libraries a user could call instead, on the
// projection shapes of Qwen3.5-0.8B or 2B (src/cli/linear_shapes.hpp), in one process, interleaved:
//
//   hanpu exact     f32 activations x the checkpoint's bf16 weights, f32 accumulation (the default)
//   hanpu bf16      activations rounded to bf16 (--precision bf16; VDPBF16PS/AMX where present)
//   openblas f32    cblas_sgemm on weights converted to f32 once (twice the bf16 bytes)
//   onednn f32      dnnl::matmul, f32 weights reordered once into the layout oneDNN chooses
//   onednn bf16     dnnl::matmul, bf16 x bf16 -> f32, weights reordered once; the activations'
//                   f32 -> bf16 conversion runs inside the timed call (as hanpu bf16 rounds them)
//
// Every figure is printed next to the f32 FMA peak measured in the same run; results are checked
// against hanpu exact (nMSE) so that every contender computes the same y = x W^T. Rounds are
// interleaved (every contender once per round) and the median per shape is reported, because the
// machines this runs on drift by tens of percent within a minute (docs/PERFORMANCE.md).
//
// --isa avx2 restarts the process with HANPU_ISA=avx2, OPENBLAS_CORETYPE=Haswell and
// ONEDNN_MAX_CPU_ISA=AVX2 (each library reads its setting when it loads), so an AVX-512 machine
// measures what all three do on AVX2.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "compare.hpp"
#include "cli/linear_shapes.hpp"
#include "hanpu/isa.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/host.hpp"
#include "hanpu/linear.hpp"

namespace {

using namespace hanpu;
using bench::nmse;
using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<int64_t> Ms{512, 2048};
  std::string model = "0.8b";  // which Qwen3.5 size's projection shapes
  int threads = 0;  // 0: all
  int rounds = 3;
  double min_seconds = 0.15;
  std::string isa = "native";
};

// One contender on one shape: run() computes y from x (row-major [M,K] f32 -> [M,N] f32).
struct Contender {
  std::string name;
  double bytes_per_weight = 0;
  std::function<void()> run;
  const float* y = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double seconds_per_call(const std::function<void()>& f, double min_seconds) {
  f();  // warm-up: scratch, thread start, first touch of y
  int reps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    f();
    ++reps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < min_seconds || reps < 2);
  return elapsed / reps;
}


// oneDNN matmul y[M,N] = x[M,K] W^T with W stored [N,K] row-major, i.e. a [K,N] matrix in "ba"
// order; the primitive picks its own weight layout (format_tag::any) and the weight is reordered
// into it once, as a library user would do at load time.
struct OnednnMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  dnnl::memory src_f32;  // bf16 variant: the caller's f32 activations, converted in the timed call
  dnnl::reorder to_bf16;
  bool bf16 = false;

  OnednnMatmul(int64_t M, int64_t K, int64_t N, const float* w_f32, bool use_bf16, float* x, float* y) : bf16(use_bf16) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt t = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc src_md({M, K}, t, tag::ab), wei_any({K, N}, t, tag::any), dst_md({M, N}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_any, dst_md), eng);
    prim = dnnl::matmul(pd);
    // The weight: f32 [K,N] in "ba" order (our [N,K] rows), reordered into the primitive's layout
    // and type.
    dnnl::memory w_user({{K, N}, dt::f32, tag::ba}, eng, const_cast<float*>(w_f32));
    wei = dnnl::memory(pd.weights_desc(), eng);
    dnnl::reorder(w_user, wei).execute(strm, w_user, wei);
    dst = dnnl::memory(dst_md, eng, y);
    if (bf16) {
      src_f32 = dnnl::memory({{M, K}, dt::f32, tag::ab}, eng, x);
      src = dnnl::memory(src_md, eng);
      to_bf16 = dnnl::reorder(src_f32, src);
    } else {
      src = dnnl::memory(src_md, eng, x);
    }
    strm.wait();
  }
  void run() {
    if (bf16) to_bf16.execute(strm, src_f32, src);
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
};

const char* onednn_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

void run(const Args& a) {
  const int threads = a.threads > 0 ? a.threads : hardware_threads();
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
  const HostMeasurement host = measure_host(threads, 0.6);
  std::printf("machine: %s; f32 FMA peak %.0f GFLOP/s, read bandwidth %.1f GB/s with %d threads (measured now)\n",
              detect_host().cpu_model.c_str(), host.fma_peak_gflops_all, host.mem_bandwidth_gbs, threads);
  std::printf("kernels: hanpu %s (linear backend %s), OpenBLAS %s (%s), oneDNN %d.%d.%d (%s)\n",
              isa_selection().target.c_str(),
              linear_avx512bf16_available() ? "avx512bf16" : (linear_amx_available() ? "amx" : "portable"),
              openblas_get_corename(), openblas_get_config(), dnnl_version()->major, dnnl_version()->minor,
              dnnl_version()->patch, onednn_isa_name());
  if (!linear_avx512bf16_available() && !linear_amx_available())
    std::printf("no bf16 instructions in use: hanpu bf16 runs the exact f32 kernel (docs/LINEAR.md)\n");
  std::printf("%d interleaved rounds, median per contender; GFLOP/s = 2 M K N per call\n\n", a.rounds);
  std::printf("%-18s %5s %5s %6s | %-12s %9s %9s %7s %6s %10s\n", "shape", "M", "K", "N", "contender", "ms/call",
              "GFLOP/s", "x peak", "B/wt", "nMSE");

  std::mt19937_64 rng(7);
  std::normal_distribution<float> nrm(0.f, 1.f);
  // Per (M, contender): seconds of all projections of one model forward.
  std::map<std::pair<int64_t, std::string>, double> model_seconds;
  std::vector<std::string> order;
  for (const ProjectionShape& s : qwen35_projections(a.model)) {
    if (s.per_model == 0) continue;  // the LM head runs once per prefill, for the last row only
    std::vector<uint16_t> w(static_cast<size_t>(s.N * s.K));
    for (auto& v : w) v = f32_to_bf16(0.03f * nrm(rng));
    std::vector<float> w_f32(w.size());
    for (size_t i = 0; i < w.size(); ++i) w_f32[i] = bf16_to_f32(w[i]);
    const Bf16Linear lin(TensorView::contiguous(w.data(), DType::BF16, {s.N, s.K}), s.name);
    for (int64_t M : a.Ms) {
      std::vector<float> x(static_cast<size_t>(M * s.K));
      for (auto& v : x) v = nrm(rng);
      const size_t ny = static_cast<size_t>(M * s.N);
      std::vector<float> y_exact(ny), y_bf16(ny), y_blas(ny), y_dnnl(ny), y_dnnl16(ny);
      const TensorView xv = TensorView::contiguous(x.data(), DType::F32, {M, s.K});
      OnednnMatmul dnnl_f32(M, s.K, s.N, w_f32.data(), false, x.data(), y_dnnl.data());
      // oneDNN 2.6 has no bf16 matmul below AVX-512 ("could not create a primitive descriptor").
      std::optional<OnednnMatmul> dnnl_bf16;
      try {
        dnnl_bf16.emplace(M, s.K, s.N, w_f32.data(), true, x.data(), y_dnnl16.data());
      } catch (const dnnl::error&) {
      }
      std::vector<Contender> cs{
          {"hanpu exact", 2,
           [&] { lin.forward(xv, TensorView::contiguous(y_exact.data(), DType::F32, {M, s.N}), threads); },
           y_exact.data()},
          {"hanpu bf16", 2,
           [&] {
             lin.forward(xv, TensorView::contiguous(y_bf16.data(), DType::F32, {M, s.N}), threads, false,
                         LinearPrecision::kBf16);
           },
           y_bf16.data()},
          {"openblas f32", 4,
           [&] {
             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(s.N),
                         static_cast<int>(s.K), 1.f, x.data(), static_cast<int>(s.K), w_f32.data(),
                         static_cast<int>(s.K), 0.f, y_blas.data(), static_cast<int>(s.N));
           },
           y_blas.data()},
          {"onednn f32", 4, [&] { dnnl_f32.run(); }, y_dnnl.data()},
      };
      if (dnnl_bf16) cs.push_back({"onednn bf16", 2, [&] { dnnl_bf16->run(); }, y_dnnl16.data()});
      std::vector<std::vector<double>> times(cs.size());
      for (int r = 0; r < a.rounds; ++r)
        for (size_t c = 0; c < cs.size(); ++c) times[c].push_back(seconds_per_call(cs[c].run, a.min_seconds));
      const double flops = 2.0 * static_cast<double>(M) * s.K * s.N;
      for (size_t c = 0; c < cs.size(); ++c) {
        const double sec = median(times[c]);
        std::printf("%-18s %5lld %5lld %6lld | %-12s %9.3f %9.1f %7.2f %6.0f %10.2e\n", s.name.c_str(),
                    static_cast<long long>(M), static_cast<long long>(s.K), static_cast<long long>(s.N),
                    cs[c].name.c_str(), sec * 1e3, flops / sec / 1e9, flops / sec / 1e9 / host.fma_peak_gflops_all,
                    cs[c].bytes_per_weight, nmse(cs[c].y, y_exact.data(), ny));
        model_seconds[{M, cs[c].name}] += s.per_model * sec;
        if (std::find(order.begin(), order.end(), cs[c].name) == order.end()) order.push_back(cs[c].name);
      }
      std::fflush(stdout);
    }
  }
  std::printf("\nQwen3.5-%s, all projections of one prefill forward (24 layers, LM head excluded), sum of medians:\n",
              qwen35_projection_model(a.model).label);
  for (int64_t M : a.Ms) {
    const double base = model_seconds[{M, "hanpu exact"}];
    for (const std::string& name : order) {
      const double sec = model_seconds[{M, name}];
      std::printf("  M=%-5lld %-12s %9.1f ms  (%.2fx hanpu exact's time)\n", static_cast<long long>(M), name.c_str(),
                  sec * 1e3, sec / base);
    }
  }
}

// --isa X: every library reads its ISA setting when it loads, so the process restarts itself
// with the three settings in its environment.
// Natively, an OpenBLAS older than the CPU (Debian 12's 0.3.21 on an Emerald Rapids Xeon, family
// 6 model 207) does not know the model and falls back to its SSE3 "Prescott" kernels: 0.10 of the
// FMA peak, which would make it look 5x slower than it is. The process then restarts with the
// newest core type the CPU runs that this OpenBLAS has (SkylakeX for AVX-512, Haswell for AVX2),
// and the kernels line says so.
void restart_with_isa(const std::string& isa, char** argv) {
  if (std::getenv("HANPU_LIBRARIES_ISA_SET")) return;
  if (isa == "native") {
    if (std::getenv("OPENBLAS_CORETYPE") || std::string(openblas_get_corename()) != "Prescott") return;
#if defined(__x86_64__)
    const char* core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl")
                           ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                          : nullptr;
#else
    const char* core = nullptr;
#endif
    if (core == nullptr) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
  } else if (isa == "avx2") {
    setenv("HANPU_ISA", "avx2", 1);
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
  } else {
    throw Error("--isa: got '" + isa + "', expected native or avx2");
  }
  setenv("HANPU_LIBRARIES_ISA_SET", "1", 1);
  execv("/proc/self/exe", argv);
  throw Error(std::string("--isa: could not restart the process: ") + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hanpu's bf16-weight projections next to OpenBLAS and oneDNN on the Qwen3.5-0.8B or 2B shapes"};
  Args a;
  app.add_option("--model", a.model, "projection shapes of Qwen3.5 0.8b (default) or 2b")
      ->check(CLI::IsMember(qwen35_projection_model_keys()));
  app.add_option("--M", a.Ms, "rows (tokens), comma separated (default 512,2048)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--threads", a.threads, "threads (default all)")->check(CLI::Range(1, 1024));
  app.add_option("--rounds", a.rounds, "interleaved rounds (default 3)")->check(CLI::Range(1, 100));
  app.add_option("--seconds", a.min_seconds, "minimum time per measurement (default 0.15)")->check(CLI::Range(0.0, 60.0));
  app.add_option("--isa", a.isa, "native (default) or avx2: caps hanpu, OpenBLAS and oneDNN alike");
  try {
    app.parse(argc, argv);
    restart_with_isa(a.isa, argv);
    run(a);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_linear_libraries: %s\n", e.what());
    return 1;
  }
  return 0;
}
