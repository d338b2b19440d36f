// GGUF decode GEMV (src/cpu/linear_gguf.cpp): GB/s of weight blocks streamed, next to the read
// bandwidth measured in the same run (measure_host, src/cpu/host.cpp), docs/GGUF.md.
//
//   gguf_gemv [--threads T] [--reps R] [--isa NAME] [--types Q8_0,Q4_K,...] [--cases lm_head,mlp,in-cache]
//             [--layout file|lanes] [--working-set MIB]
//
// --types: the GGML types to run (default Q8_0, Q4_K, Q5_K, Q6_K; any type with a GEMV kernel,
// e.g. Q4_0, Q4_1, Q5_0, Q5_1, IQ4_XS). --cases: which of the shapes below (default the first
// three). --layout lanes: the weights repacked into the row-lane layout (gguf_pack_row_lanes, Q4_K
// only) and run by GgufLinear on that layout (the same bytes as the file's rows).
//
// Columns: median wall time per call and its GB/s of weight blocks (and % of the bandwidth), the
// best call, and GB/s over the CPU time the threads got (see below).
//
// Shapes: the Qwen LM head 151936 x 1024 and an MLP projection 3584 x 1024; lm_head_q35 (Qwen3.5's
// 248320 x 1024) and mlp_down (1024 x 3584) on request. A matrix smaller than
// 256 MiB (--working-set) is replicated and the copies are used in turn, so every call reads its
// weights from DRAM (not from a cache that held the previous call's). On a machine whose last-level
// cache is not much smaller than that (the AVX-512 Xeon of docs/GGUF.md reports 480 MiB of L3,
// shared with the host's other guests), --working-set 1024 is the model-sized case. Weight bytes are random with f16 scales in
// [-0.05, 0.05]; the numbers do not depend on the values.
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cpu/gguf_blocks.hpp"
#include "hanpu/isa.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/host.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"

using hanpu::gguf::GgmlType;

int main(int argc, char** argv) {
  int threads = 0, reps = 15;
  std::vector<GgmlType> types{GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  std::string cases = "lm_head,mlp,in-cache";
  bool lanes = false;
  size_t working_set_mib = 256;
  auto listed = [](const std::string& list, const std::string& name) {
    return ("," + list + ",").find("," + name + ",") != std::string::npos;
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--isa") hanpu::request_isa(argv[i + 1]);
    else if (a == "--types") {
      types.clear();
      const std::string list = argv[i + 1];
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        const std::string name = list.substr(p, q - p);
        bool found = false;
        for (const auto& f : hanpu::gguf::block_formats())
          if (name == f.name && hanpu::cpu::gguf_gemv_supported(f.type)) {
            types.push_back(f.type);
            found = true;
          }
        if (!found) {
          std::fprintf(stderr, "gguf_gemv: --types: '%s' is not a GGML type with a GEMV kernel\n", name.c_str());
          return 2;
        }
        p = q + 1;
      }
    }
    else if (a == "--cases") cases = argv[i + 1];
    else if (a == "--working-set") working_set_mib = static_cast<size_t>(std::max(1, std::stoi(argv[i + 1])));
    else if (a == "--layout" && (std::string(argv[i + 1]) == "file" || std::string(argv[i + 1]) == "lanes"))
      lanes = std::string(argv[i + 1]) == "lanes";
    else {
      std::fprintf(stderr, "usage: gguf_gemv [--threads T] [--reps R] [--isa NAME] [--types Q8_0,Q4_K,...] "
                           "[--cases lm_head,mlp,in-cache,lm_head_q35,mlp_down] [--layout file|lanes] "
                           "[--working-set MIB]\n");
      return 2;
    }
  }
  hanpu::Engine engine(threads);
  threads = engine.threads();
  const hanpu::HostMeasurement host = hanpu::measure_host(threads, 1.0);
  const char* hp = std::getenv("HANPU_GGUF_BENCH_HUGEPAGES");
  std::printf("ISA target %s, %d threads; read bandwidth %.1f GB/s (measure_host, this run, %.0f MiB); %s layout; "
              "weights in %s, %zu MiB per case\n",
              hanpu::isa_selection().target.c_str(), threads, host.mem_bandwidth_gbs,
              static_cast<double>(host.bandwidth_buffer_bytes) / (1 << 20), lanes ? "row-lane" : "file",
              hp && std::string(hp) == "0" ? "4 KiB pages" : "memory advised for huge pages", working_set_mib);
  std::printf("%-6s %-9s %-12s %6s %10s %9s %8s %9s %8s %9s\n", "type", "case", "shape", "copies", "us/call",
              "GB/s W", "% of bw", "best GB/s", "% of bw", "cpu GB/s");
  struct Shape {
    const char* name;
    int64_t N, K;
    bool from_dram;  // false: one copy, read from the caches on every call (the kernel's own ceiling)
  };
  std::mt19937 rng(34);
  for (GgmlType t : types) {
    for (const Shape& s : {Shape{"lm_head", 151936, 1024, true}, Shape{"mlp", 3584, 1024, true},
                           Shape{"in-cache", 256, 1024, false}, Shape{"lm_head_q35", 248320, 1024, true},
                           Shape{"mlp_down", 1024, 3584, true}}) {
      const auto& f = hanpu::gguf::block_format(t);
      if (!listed(cases, s.name)) continue;
      if (lanes && !hanpu::cpu::gguf_row_lanes_available(t, s.N)) {
        std::fprintf(stderr, "gguf_gemv: --layout lanes: no row-lane form for %s here\n", f.name);
        return 2;
      }
      const int64_t nb = s.N * s.K / f.block_elems;
      const size_t bytes = static_cast<size_t>(nb * f.block_bytes);
      const size_t copies = s.from_dram ? std::max<size_t>(1, (working_set_mib << 20) / bytes) : 1;
      // Weights in memory advised for transparent huge pages, as measure_host's probe buffer is
      // (HANPU_GGUF_BENCH_HUGEPAGES=0: plain 4 KiB pages, as a file mapping gets).
      const bool huge = !std::getenv("HANPU_GGUF_BENCH_HUGEPAGES") || std::string(std::getenv("HANPU_GGUF_BENCH_HUGEPAGES")) != "0";
      const size_t stride = lanes ? hanpu::cpu::gguf_row_lanes_bytes(t, s.N, s.K) : bytes;  // per copy
      const size_t total = stride * copies;
      void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mem == MAP_FAILED) {
        std::fprintf(stderr, "gguf_gemv: cannot allocate %zu bytes\n", total);
        return 1;
      }
#ifdef MADV_HUGEPAGE
      if (huge) (void)madvise(mem, total, MADV_HUGEPAGE);
#endif
      struct Unmap {
        void* p;
        size_t n;
        ~Unmap() { munmap(p, n); }
      } unmap{mem, total};
      std::span<uint8_t> w(static_cast<uint8_t*>(mem), total);
      for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(rng());
      std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
      for (int64_t c = 0; c < static_cast<int64_t>(copies) * nb; ++c) {
        const uint16_t d = hanpu::f32_to_f16(scale(rng));
        std::memcpy(w.data() + c * f.block_bytes + (t == GgmlType::Q6_K ? 208 : 0), &d, 2);
        if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q4_1 || t == GgmlType::Q5_1)
          std::memcpy(w.data() + c * f.block_bytes + 2, &d, 2);  // dmin / m
      }
      if (lanes) {  // pack each copy in place, from its end down (stride >= bytes)
        std::vector<uint8_t> tmp(bytes);
        for (size_t c = copies; c-- > 0;) {
          std::memcpy(tmp.data(), w.data() + c * bytes, bytes);
          hanpu::cpu::gguf_pack_row_lanes(t, tmp.data(), s.N, s.K, w.data() + c * stride);
        }
      }
      // Through GgufLinear::forward, the model's decode path (its split of the rows over the threads).
      auto run = [&](size_t c, const float* xv, float* yv) {
        const hanpu::GgufLinear lin(t, w.data() + c * (lanes ? stride : bytes), s.N, s.K, "gguf_gemv",
                                    lanes ? hanpu::GgufLayout::kRowLanes : hanpu::GgufLayout::kFile);
        lin.forward(engine, xv, s.K, yv, s.N, 1, threads, false);
      };
      std::vector<float> x(static_cast<size_t>(s.K)), y(static_cast<size_t>(s.N));
      std::normal_distribution<float> nrm(0.f, 1.f);
      for (float& v : x) v = nrm(rng);
      // warm-up over every copy (page faults, the pool), then timed calls: median per call
      for (size_t c = 0; c < copies; ++c) run(c, x.data(), y.data());
      std::vector<double> per_call, cpu_per_call;
      const int calls = s.from_dram ? static_cast<int>(std::max<size_t>(copies, static_cast<size_t>(reps))) : 20 * reps;
      for (int r = 0; r < calls; ++r) {
        timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        const auto t0 = std::chrono::steady_clock::now();
        run(static_cast<size_t>(r) % copies, x.data(), y.data());
        per_call.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        cpu_per_call.push_back(static_cast<double>(c1.tv_sec - c0.tv_sec) + 1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec));
      }
      std::sort(per_call.begin(), per_call.end());
      std::sort(cpu_per_call.begin(), cpu_per_call.end());
      // GB/s over the CPU time the threads got (process CPU time / threads): on a machine shared
      // with other work, a long call is descheduled part of its wall time; this is what the kernel
      // streams while it runs (the pool's brief polling counts as busy, so it errs low).
      const double cpu_gbs = static_cast<double>(bytes) / (cpu_per_call[cpu_per_call.size() / 2] / threads) * 1e-9;
      const double med = per_call[per_call.size() / 2];
      const double gbs = static_cast<double>(bytes) / med * 1e-9;
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(s.N), static_cast<long long>(s.K));
      const double best = static_cast<double>(bytes) / per_call.front() * 1e-9;
      std::printf("%-6s %-9s %-12s %6zu %10.1f %9.1f %7.0f%% %9.1f %7.0f%% %9.1f\n", f.name, s.name, shape, copies,
                  med * 1e6, gbs, 100.0 * gbs / host.mem_bandwidth_gbs, best, 100.0 * best / host.mem_bandwidth_gbs,
                  cpu_gbs);
    }
  }
  return 0;
}
