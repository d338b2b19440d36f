// The ceilings of the integer prefill GEMM's inner loops (src/cpu/linear_gguf_prefill.cpp) on the
// running core: each loop body of docs/GGUF.md ("Prefill GEMM", "Fourth round") on operands in
// registers or L1, 16 times unrolled, timed by the thread's CPU time. GOP/s per core, one
// multiply-add = 2 operations, next to the peak of one pair of 256-bit integer multiplies per
// cycle (32 multiply-adds of VPMADDUBSW + VPMADDWD, or two VPMADDWD of 16).
//
//   avx2_int_loops [--iters N]
//
// Loops:
//   vpmaddwd only        12 independent VPMADDWD per step: the multiply pipes alone
//   q8_0 step, regs      Q8_0's 6 x 2 step: 12 x (VPMADDWD, VPADDD), operands in registers
//   q8_0 step, L1        the same with its 2 weight loads and 6 activation broadcasts from L1
//   k-quant step, regs   the K-quants' 4 x 2 step: 8 x (VPMADDUBSW, VPMADDWD by scales, VPADDD)
//   q4_k int16 x8, L1    the 4 x 2 step with int16 sums (kquant_rl_dot_4x2_i16): 8 x (VPMADDUBSW,
//                        VPADDW), loads and broadcasts from L1, per 8 steps one VPMADDWD by the
//                        scales and the int32 sums added in L1; q5_k x4 and q6_k x2 per 4 / 2 steps
// The Q8_0 form issues 4 vector operations per 32 products against the K-quants' 3, and its adds
// share the vector pipes with the multiplies: the ratio of the second and fourth lines is what
// keeps Q8_0's GEMM below the K-quants'.
// Where the CPU has AVX512-VNNI, the loops of the VNNI form (linear_gguf_prefill.cpp, "AVX512-VNNI
// form"; 512-bit registers, 64 multiply-adds per VPDPBUSD):
//   vpdpbusd only        12 independent VPDPBUSD: the int8 peak
//   vpmulld only         12 independent VPMULLD (the sub-block scale, once per 8 or 4 VPDPBUSD)
//   q4_k chunk, vnni     Q4_K's chunk of 32 for 8 activation rows: per row and half of 16 elements
//                        4 VPDPBUSD into a zeroed sum and one VPDPWSSD of it by the scales
//   q4_k chunk, L1       the same with the step's 64 weight bytes and each row's 4 activation bytes
//                        from L1 (VPDPBUSD's broadcast memory operand), as the GEMM reads them
//   q5_k chunk, vnni     Q5_K's: per row 8 VPDPBUSD into a zeroed sum, VPMULLD by the scales, VPADDD
//   q6_k chunk, vnni     Q6_K's: two halves of 4 VPDPBUSD, each VPMULLD and VPADDD
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

#if defined(__x86_64__)
alignas(64) int16_t g_weights[2 * 16 * 16];  // 2 groups x 16 vectors of 16 int16
alignas(64) int16_t g_x[6 * 64];             // 6 activation rows

#define HANPU_REP16 ".irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15\n\t"
#define HANPU_ALL_YMM                                                                                          \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15"

__attribute__((target("avx2"))) void madd_only() {
  __asm__ volatile(HANPU_REP16 ".irp m, 0, 1, 2, 3, 4, 5\n\t"
                   "vpmaddwd %%ymm14, %%ymm12, %%ymm\\m\n\t"
                   ".endr\n\t"
                   ".irp m, 6, 7, 8, 9, 10, 11\n\t"
                   "vpmaddwd %%ymm14, %%ymm13, %%ymm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t" ::: HANPU_ALL_YMM);
}

// accumulators ymm0-5 (group 0) and ymm6-11 (group 1), weights ymm12 / 13, broadcast ymm14, product ymm15
#define HANPU_Q8_PAIR(a, b)                                            \
  "vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm" #a ", %%ymm" #a "\n\t" \
  "vpmaddwd %%ymm14, %%ymm13, %%ymm15\n\tvpaddd %%ymm15, %%ymm" #b ", %%ymm" #b "\n\t"
__attribute__((target("avx2"))) void q8_0_regs() {
  __asm__ volatile(HANPU_REP16 HANPU_Q8_PAIR(0, 6) HANPU_Q8_PAIR(1, 7) HANPU_Q8_PAIR(2, 8) HANPU_Q8_PAIR(3, 9)
                       HANPU_Q8_PAIR(4, 10) HANPU_Q8_PAIR(5, 11) ".endr\n\t" ::: HANPU_ALL_YMM);
}

#define HANPU_Q8_ROW(p, a, b) "vpbroadcastd 4*\\j(%[" #p "]), %%ymm14\n\t" HANPU_Q8_PAIR(a, b)
__attribute__((target("avx2"))) void q8_0_l1() {
  __asm__ volatile(HANPU_REP16 "vmovdqa 32*\\j(%[w]), %%ymm12\n\t"
                   "vmovdqa 32*\\j+512(%[w]), %%ymm13\n\t" HANPU_Q8_ROW(x0, 0, 6) HANPU_Q8_ROW(x1, 1, 7)
                       HANPU_Q8_ROW(x2, 2, 8) HANPU_Q8_ROW(x3, 3, 9) HANPU_Q8_ROW(x4, 4, 10) HANPU_Q8_ROW(x5, 5, 11)
                   ".endr\n\t"
                   :
                   : [w] "r"(g_weights), [x0] "r"(g_x), [x1] "r"(g_x + 64), [x2] "r"(g_x + 128),
                     [x3] "r"(g_x + 192), [x4] "r"(g_x + 256), [x5] "r"(g_x + 320)
                   : "memory", HANPU_ALL_YMM);
}

// accumulators ymm0-3 (group 0) and ymm4-7 (group 1), scales ymm8 / 9, weights ymm12 / 13
#define HANPU_KQ_ROW(a, b)                                                                               \
  "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\tvpmaddwd %%ymm8, %%ymm15, %%ymm15\n\t"                        \
  "vpaddd %%ymm15, %%ymm" #a ", %%ymm" #a "\n\t"                                                        \
  "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\tvpmaddwd %%ymm9, %%ymm15, %%ymm15\n\t"                        \
  "vpaddd %%ymm15, %%ymm" #b ", %%ymm" #b "\n\t"
__attribute__((target("avx2"))) void kquant_regs() {
  __asm__ volatile(HANPU_REP16 HANPU_KQ_ROW(0, 4) HANPU_KQ_ROW(1, 5) HANPU_KQ_ROW(2, 6) HANPU_KQ_ROW(3, 7)
                   ".endr\n\t" ::: HANPU_ALL_YMM);
}

// The K-quants' 4 x 2 step with int16 sums (linear_gguf_prefill.cpp, kquant_rl_dot_4x2_i16): per
// step 2 weight loads, 4 broadcasts, 8 VPMADDUBSW and 8 VPADDW into int16 accumulators ymm0-7 (the
// run's first step writes them), and per run of R steps (Q4_K 8, Q5_K 4, Q6_K 2) one VPMADDWD by
// the scales and the int32 sums added in memory (L1), as the kernel does. Per call 16 steps.
alignas(64) uint8_t g_wk[2 * 16 * 32];
alignas(64) int8_t g_xk[4 * 64];
alignas(64) int16_t g_sk[2 * 16];
alignas(64) int32_t g_acc[8 * 8];
#define HANPU_KQ16_ROW(m, n)                                                                        \
  "vpbroadcastd 4*\\j+64*" #m "(%[x]), %%ymm14\n\t"                                             \
  ".if (\\j & (%c[r] - 1)) == 0\n\t"                                                          \
  "vpmaddubsw %%ymm14, %%ymm12, %%ymm" #m "\n\tvpmaddubsw %%ymm14, %%ymm13, %%ymm" #n "\n\t" \
  ".else\n\t"                                                                                 \
  "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\tvpaddw %%ymm15, %%ymm" #m ", %%ymm" #m "\n\t"        \
  "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\tvpaddw %%ymm15, %%ymm" #n ", %%ymm" #n "\n\t"    \
  ".endif\n\t"
template <int R>
__attribute__((target("avx2"))) void kquant_i16_l1() {
  __asm__ volatile(HANPU_REP16 "vmovdqa 32*\\j(%[w]), %%ymm12\n\t"
                   "vmovdqa 32*\\j+512(%[w]), %%ymm13\n\t" HANPU_KQ16_ROW(0, 4) HANPU_KQ16_ROW(1, 5) HANPU_KQ16_ROW(2, 6)
                       HANPU_KQ16_ROW(3, 7)
                   ".if ((\\j + 1) & (%c[r] - 1)) == 0\n\t"
                   ".irp a, 0, 1, 2, 3, 4, 5, 6, 7\n\t"
                   "vpmaddwd 32*(\\a & 1)(%[s]), %%ymm\\a, %%ymm\\a\n\t"
                   "vpaddd 32*\\a(%[acc]), %%ymm\\a, %%ymm\\a\n\t"
                   "vmovdqa %%ymm\\a, 32*\\a(%[acc])\n\t"
                   ".endr\n\t"
                   ".endif\n\t"
                   ".endr\n\t"
                   :
                   : [w] "r"(g_wk), [x] "r"(g_xk), [s] "r"(g_sk), [acc] "r"(g_acc), [r] "i"(R)
                   : "memory", HANPU_ALL_YMM);
}
#undef HANPU_KQ16_ROW

// AVX512-VNNI: accumulators zmm0-11, weights zmm16, broadcast zmm17, scales zmm18, product zmm19, sums zmm20-27
#define HANPU_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define HANPU_ALL_ZMM                                                                                    \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",     \
      "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27"
HANPU_VNNI void dpbusd_only() {
  __asm__ volatile(HANPU_REP16 ".irp m, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11\n\t"
                   "vpdpbusd %%zmm17, %%zmm16, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t" ::: HANPU_ALL_ZMM);
}
HANPU_VNNI void pmulld_only() {
  __asm__ volatile(HANPU_REP16 ".irp m, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11\n\t"
                   "vpmulld %%zmm18, %%zmm16, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t" ::: HANPU_ALL_ZMM);
}
// per call: 16 chunks of 8 rows x 8 steps
HANPU_VNNI void q4k_chunk_vnni() {
  __asm__ volatile(HANPU_REP16 ".irp h, 0, 1\n\t"
                   ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpxord %%zmm\\m, %%zmm\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".irp q, 0, 1, 2, 3\n\t"
                   ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpdpbusd %%zmm17, %%zmm16, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t"
                   ".irp m, 0, 1, 2, 3, 4, 5, 6, 7\n\t"
                   "vpdpwssd %%zmm18, %%zmm2\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t"
                   ".endr\n\t" ::: HANPU_ALL_ZMM);
}
alignas(64) uint8_t g_w8[8 * 512];
alignas(64) int8_t g_x8[8 * 1024];
alignas(64) int32_t g_sc[8 * 16];
#define HANPU_L1_ROW(m, s) "vpdpbusd 32*\\c+4*(\\q+4*\\h)+1024*" #m "(%[x])%{1to16%}, %%zmm16, %%zmm" #s "\n\t"
// per call: a super-block (8 chunks) of 8 rows
HANPU_VNNI void q4k_chunk_l1() {
  __asm__ volatile(".irp c, 0, 1, 2, 3, 4, 5, 6, 7\n\t.irp h, 0, 1\n\t"
                   ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpxord %%zmm\\m, %%zmm\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".irp q, 0, 1, 2, 3\n\t"
                   "vmovdqa64 64*(\\q+4*\\h)+512*\\c(%[w]), %%zmm16\n\t"
                   HANPU_L1_ROW(0, 20) HANPU_L1_ROW(1, 21) HANPU_L1_ROW(2, 22) HANPU_L1_ROW(3, 23)
                   HANPU_L1_ROW(4, 24) HANPU_L1_ROW(5, 25) HANPU_L1_ROW(6, 26) HANPU_L1_ROW(7, 27)
                   ".endr\n\t"
                   "vmovdqa64 64*\\c(%[s]), %%zmm18\n\t"
                   ".irp m, 0, 1, 2, 3, 4, 5, 6, 7\n\t"
                   "vpdpwssd %%zmm18, %%zmm2\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t.endr\n\t"
                   :
                   : [w] "r"(g_w8), [x] "r"(g_x8), [s] "r"(g_sc)
                   : "memory", HANPU_ALL_ZMM);
}
#undef HANPU_L1_ROW
HANPU_VNNI void kquant_chunk_vnni() {
  __asm__ volatile(HANPU_REP16 ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpxord %%zmm\\m, %%zmm\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".irp q, 0, 1, 2, 3, 4, 5, 6, 7\n\t"
                   ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpdpbusd %%zmm17, %%zmm16, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t"
                   ".irp m, 0, 1, 2, 3, 4, 5, 6, 7\n\t"
                   "vpmulld %%zmm18, %%zmm2\\m, %%zmm19\n\t"  // zmm20 + m
                   "vpaddd %%zmm19, %%zmm\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t" ::: HANPU_ALL_ZMM);
}
HANPU_VNNI void q6k_chunk_vnni() {
  __asm__ volatile(HANPU_REP16 ".irp h, 0, 1\n\t"
                   ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpxord %%zmm\\m, %%zmm\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".irp q, 0, 1, 2, 3\n\t"
                   ".irp m, 20, 21, 22, 23, 24, 25, 26, 27\n\t"
                   "vpdpbusd %%zmm17, %%zmm16, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t"
                   ".irp m, 0, 1, 2, 3, 4, 5, 6, 7\n\t"
                   "vpmulld %%zmm18, %%zmm2\\m, %%zmm19\n\t"
                   "vpaddd %%zmm19, %%zmm\\m, %%zmm\\m\n\t"
                   ".endr\n\t"
                   ".endr\n\t"
                   ".endr\n\t" ::: HANPU_ALL_ZMM);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int64_t iters = 2000000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "avx2_int_loops: unknown argument '%s' (expected --iters N)\n", argv[i]);
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "avx2_int_loops: --iters must be positive\n");
    return 2;
  }
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) {
    std::fprintf(stderr, "avx2_int_loops: this CPU has no AVX2\n");
    return 1;
  }
  struct Loop {
    const char* name;
    void (*body)();
    double macs_per_call;  // multiply-adds per call (16 steps)
  };
  const Loop loops[] = {
      {"vpmaddwd only", madd_only, 16.0 * 12 * 16},
      {"q8_0 step, regs", q8_0_regs, 16.0 * 12 * 16},
      {"q8_0 step, L1", q8_0_l1, 16.0 * 12 * 16},
      {"k-quant step, regs", kquant_regs, 16.0 * 8 * 32},
      {"q4_k int16 x8, L1", kquant_i16_l1<8>, 16.0 * 8 * 32},
      {"q5_k int16 x4, L1", kquant_i16_l1<4>, 16.0 * 8 * 32},
      {"q6_k int16 x2, L1", kquant_i16_l1<2>, 16.0 * 8 * 32},
  };
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vnni");
  const Loop vnni_loops[] = {
      {"vpdpbusd only", dpbusd_only, 16.0 * 12 * 64},
      {"vpmulld only", pmulld_only, 16.0 * 12 * 16},  // (32-bit multiplies)
      {"q4_k chunk, vnni", q4k_chunk_vnni, 16.0 * 2 * 8 * 4 * 64},
      {"q4_k chunk, L1", q4k_chunk_l1, 8.0 * 2 * 8 * 4 * 64},
      {"q5_k chunk, vnni", kquant_chunk_vnni, 16.0 * 8 * 8 * 64},
      {"q6_k chunk, vnni", q6k_chunk_vnni, 16.0 * 2 * 8 * 4 * 64},
  };
  std::printf("loop                 GOP/s per core (CPU time)\n");
  for (const Loop& l : loops) {
    const double t0 = thread_cpu_seconds();
    for (int64_t i = 0; i < iters; ++i) l.body();
    const double t = thread_cpu_seconds() - t0;
    std::printf("%-20s %7.1f\n", l.name, 2.0 * l.macs_per_call * static_cast<double>(iters) / t * 1e-9);
  }
  for (const Loop& l : vnni_loops) {
    if (!vnni) break;
    const double t0 = thread_cpu_seconds();
    for (int64_t i = 0; i < iters / 4; ++i) l.body();
    const double t = thread_cpu_seconds() - t0;
    std::printf("%-20s %7.1f\n", l.name, 2.0 * l.macs_per_call * static_cast<double>(iters / 4) / t * 1e-9);
  }
  return 0;
#else
  std::fprintf(stderr, "avx2_int_loops: x86-64 only\n");
  return 1;
#endif
}
