// GGUF prefill GEMM (src/cpu/linear_gguf_prefill.cpp, linear_gguf_prefill_small_blocks.cpp, the f32
// tiles of linear_gguf.cpp and the AMX-BF16 path of linear_gguf_amx.cpp):
// GOP/s of y = x W^T for M activation rows, next to the integer peak of docs/GGUF.md ("Prefill").
//
//   gguf_prefill [--threads T] [--reps R] [--rows M] [--types q4_k,q6_k,...]
//                [--paths int,avx2,f32,amx] [--shape NxK]
//
// Paths: int (the integer prefill as it runs here, labelled vnni where its AVX512-VNNI form runs),
// avx2 (the integer prefill's AVX2 form there: HANPU_GGUF_INT_FORM=avx2), f32 (the f32 tiles),
// amx (HANPU_GGUF_AMX_TERMS bf16 terms per activation, default 1) or amx1 / amx2 / amx3 (that many
// terms); the amx paths only where AMX is usable.
//
// Shapes: Qwen3.5-0.8B's MLP projections (gate / up 3584 x 1024, down 1024 x 3584), the ones
// that carry most of its prefill. One multiply-add counts as 2 operations. Columns: median wall
// time per call, GOP/s over it, and GOP/s over the CPU time the process got divided by the
// threads (on a shared machine the load-robust figure: what the threads did while they ran).
// Weight bytes random with f16 scales in [-0.05, 0.05]; activations normal; the speed does not
// depend on the values.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cstdlib>

#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/isa.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"

using hanpu::gguf::GgmlType;

namespace {

double cpu_seconds() {
  timespec c;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
  return static_cast<double>(c.tv_sec) + 1e-9 * static_cast<double>(c.tv_nsec);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 5;
  int64_t M = 512;
  std::string types = "q8_0,q4_k,q5_k,q6_k", paths = "int,f32";
  std::vector<std::pair<int64_t, int64_t>> shapes = {{3584, 1024}, {1024, 3584}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--rows") M = std::stoll(argv[i + 1]);
    else if (a == "--types") types = argv[i + 1];
    else if (a == "--paths") paths = argv[i + 1];
    else if (a == "--shape") {  // NxK, e.g. 16x1024 (one tile: the kernel from the caches)
      const std::string v = argv[i + 1];
      const size_t xpos = v.find('x');
      if (xpos == std::string::npos) {
        std::fprintf(stderr, "gguf_prefill: --shape: got '%s', expected NxK\n", v.c_str());
        return 2;
      }
      shapes = {{std::stoll(v.substr(0, xpos)), std::stoll(v.substr(xpos + 1))}};
    }
    else if (a == "--isa") hanpu::request_isa(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gguf_prefill [--threads T] [--reps R] [--rows M] [--types q8_0,q4_k,q5_k,q6_k,q4_0,iq4_nl,iq4_xs] "
                           "[--paths int,f32,amx,amx1,amx2,amx3] [--shape NxK] [--isa NAME]\n");
      return 2;
    }
  }
  hanpu::Engine engine(threads);
  threads = engine.threads();
  std::printf("ISA target %s, %d threads, M = %lld activation rows\n", hanpu::isa_selection().target.c_str(), threads,
              static_cast<long long>(M));
  std::printf("%-5s %-4s %-10s %10s %9s %9s\n", "type", "path", "N x K", "ms/call", "GOP/s", "cpu GOP/s");
  std::mt19937 rng(34);
  for (const std::string& tn : split(types)) {
    GgmlType t;
    if (tn == "q8_0") t = GgmlType::Q8_0;
    else if (tn == "q4_k") t = GgmlType::Q4_K;
    else if (tn == "q5_k") t = GgmlType::Q5_K;
    else if (tn == "q6_k") t = GgmlType::Q6_K;
    else if (tn == "q4_0") t = GgmlType::Q4_0;  // these three: linear_gguf_prefill_small_blocks.cpp
    else if (tn == "iq4_nl") t = GgmlType::IQ4_NL;
    else if (tn == "iq4_xs") t = GgmlType::IQ4_XS;
    else {
      std::fprintf(stderr, "gguf_prefill: --types: got '%s', expected q8_0, q4_k, q5_k, q6_k, q4_0, iq4_nl or iq4_xs\n",
                   tn.c_str());
      return 2;
    }
    const auto& f = hanpu::gguf::block_format(t);
    for (auto [N, K] : shapes) {
      const int64_t nb = N * K / f.block_elems;
      std::vector<uint8_t> w(static_cast<size_t>(nb * f.block_bytes));
      for (auto& b : w) b = static_cast<uint8_t>(rng());
      std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
      for (int64_t c = 0; c < nb; ++c) {
        const uint16_t d = hanpu::f32_to_f16(scale(rng));
        std::memcpy(w.data() + c * f.block_bytes + (t == GgmlType::Q6_K ? 208 : 0), &d, 2);
        if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) std::memcpy(w.data() + c * f.block_bytes + 2, &d, 2);
      }
      std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
      std::normal_distribution<float> nrm(0.f, 1.f);
      for (float& v : x) v = nrm(rng);
      hanpu::GgufLinear lin(t, w.data(), N, K, "bench");
      for (const std::string& p : split(paths)) {
        std::string p_label = p;
        const bool amx = p.rfind("amx", 0) == 0;
        if (p != "int" && p != "avx2" && p != "f32" && p != "amx" && p != "amx1" && p != "amx2" && p != "amx3") {
          std::fprintf(stderr, "gguf_prefill: --paths: got '%s', expected int, avx2, f32, amx, amx1, amx2 or amx3\n",
                       p.c_str());
          return 2;
        }
        if (p.size() == 4 && amx) setenv("HANPU_GGUF_AMX_TERMS", p.substr(3).c_str(), 1);  // amx1 .. amx3
        lin.set_prefill(amx ? hanpu::GgufPrefill::kAmxBf16
                            : p == "f32" ? hanpu::GgufPrefill::kF32Tiles : hanpu::GgufPrefill::kIntegerDot);
        if ((p == "int" || p == "avx2") && !lin.prefill_is_integer()) continue;
        if (amx && !lin.prefill_is_amx()) continue;
        // avx2: the integer path's AVX2 form where the AVX512-VNNI one would run (int)
        if (p == "avx2") setenv("HANPU_GGUF_INT_FORM", "avx2", 1);
        else unsetenv("HANPU_GGUF_INT_FORM");
        if (p == "int" && hanpu::cpu::gguf_int_prefill_vnni_available(t)) p_label = "vnni";
        lin.forward(engine, x.data(), K, y.data(), N, M, threads, false);  // warm-up
        std::vector<double> wall, cpu;
        for (int r = 0; r < reps; ++r) {
          const double c0 = cpu_seconds();
          const auto t0 = std::chrono::steady_clock::now();
          lin.forward(engine, x.data(), K, y.data(), N, M, threads, false);
          wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          cpu.push_back(cpu_seconds() - c0);
        }
        std::sort(wall.begin(), wall.end());
        std::sort(cpu.begin(), cpu.end());
        const double ops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
        const double med = wall[wall.size() / 2], cmed = cpu[cpu.size() / 2] / threads;
        char shape[32];
        std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(N), static_cast<long long>(K));
        std::printf("%-5s %-4s %-10s %10.2f %9.1f %9.1f\n", f.name, p_label.c_str(), shape, med * 1e3, ops / med * 1e-9,
                    ops / cmed * 1e-9);
        std::fflush(stdout);
        if (p.size() == 4) unsetenv("HANPU_GGUF_AMX_TERMS");
      }
    }
  }
  return 0;
}
