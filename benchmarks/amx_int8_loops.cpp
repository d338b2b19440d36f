// What an AMX-INT8 (TDPBUSD) form of the GGUF integer prefill (src/cpu/linear_gguf_prefill.cpp)
// could reach on the running core: the tile unit alone, and the two ways of applying the K-quants'
// sub-block scales, on operands in L1, timed by the thread's CPU time. GOP/s per core, one
// multiply-add = 2 operations (docs/GGUF.md "AVX-512", "AMX-INT8: assessed, not built").
//
//   amx_int8_loops [--iters N]
//
// Tiles: C0-C3 16 x 16 int32, A (tmm4-5) 16 rows x K bytes (activations), B (tmm6-7) K / 4 rows x
// 64 bytes (16 weight rows, 4 bytes each per row of B).
//   tdpbusd K=64         4 independent TDPBUSD on full tiles: the unit's peak
//   tdpbusd K=32         the same with 32 bytes of K per instruction (one Q4_K / Q5_K sub-block)
//   per-32 scales        per sub-block of 32: 4 TDPBUSD (K = 32) into zeroed C tiles, the 4 tiles
//                        stored and each row of C multiplied by the 16 weight rows' scales (VPMULLD)
//                        and added into accumulators (VPADDD; in memory: 4 x 16 vectors)
//   q4_k two planes      Q4_K's scales folded into the weights as two int8 planes q * (sc % 8) and
//                        q * (sc / 8) (each at most 15 * 7 = 105): per super-block 4 K-steps of 2 A and
//                        2 B loads and 4 TDPBUSD (2 activation blocks x 2 planes), then per activation
//                        block and row of C: C_lo + 8 C_hi, conversion, FMA by d x activation scale.
//                        Counted: the real multiply-adds (half of those the tiles execute).
// Linux only (the kernel must grant the tile data state, arch_prctl ARCH_REQ_XCOMP_PERM).
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HANPU_AMX_LOOPS 1
#endif

namespace {

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

#if HANPU_AMX_LOOPS
#define HANPU_AMX __attribute__((target("amx-tile,amx-int8,avx512f")))

struct alignas(64) TileConfig {
  uint8_t palette_id = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

alignas(64) uint8_t g_a[8][16 * 64], g_b[8][16 * 64];
alignas(64) int32_t g_c[4][256], g_acc[4][256];
alignas(64) float g_f[2][256];

HANPU_AMX void configure(int kbytes) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.colsb[t] = 64, c.rows[t] = 16;  // C
  for (int t = 4; t < 6; ++t) c.colsb[t] = static_cast<uint16_t>(kbytes), c.rows[t] = 16;  // A
  for (int t = 6; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = static_cast<uint8_t>(kbytes / 4);  // B
  // (GCC 12 drops the stores to an object only the ldtilecfg builtin reads: linear_amx.cpp)
  __asm__ volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

HANPU_AMX double tdpbusd_only(int kbytes, int64_t iters) {
  configure(kbytes);
  _tile_loadd(4, g_a[0], 64);
  _tile_loadd(5, g_a[1], 64);
  _tile_loadd(6, g_b[0], 64);
  _tile_loadd(7, g_b[1], 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const double t0 = thread_cpu_seconds();
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  const double t = thread_cpu_seconds() - t0;
  _tile_stored(0, g_c[0], 64);
  _tile_release();
  return 2.0 * 4 * 16 * 16 * kbytes * static_cast<double>(iters) / t * 1e-9;
}

HANPU_AMX double per_32_scales(int64_t iters) {
  configure(32);
  _tile_loadd(4, g_a[0], 64);
  _tile_loadd(5, g_a[1], 64);
  _tile_loadd(6, g_b[0], 64);
  _tile_loadd(7, g_b[1], 64);
  const __m512i sc = _mm512_set1_epi32(37);
  const double t0 = thread_cpu_seconds();
  for (int64_t i = 0; i < iters; ++i) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
    _tile_stored(0, g_c[0], 64);
    _tile_stored(1, g_c[1], 64);
    _tile_stored(2, g_c[2], 64);
    _tile_stored(3, g_c[3], 64);
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 16; ++r) {
        const __m512i c = _mm512_load_si512(g_c[t] + 16 * r);
        _mm512_store_si512(g_acc[t] + 16 * r, _mm512_add_epi32(_mm512_load_si512(g_acc[t] + 16 * r),
                                                               _mm512_mullo_epi32(c, sc)));
      }
  }
  const double t = thread_cpu_seconds() - t0;
  _tile_release();
  return 2.0 * 4 * 16 * 16 * 32 * static_cast<double>(iters) / t * 1e-9;
}

HANPU_AMX double q4k_two_planes(int64_t iters) {
  configure(64);
  const __m512 d = _mm512_set1_ps(0.5f);
  const double t0 = thread_cpu_seconds();
  for (int64_t i = 0; i < iters; ++i) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < 4; ++k) {
      _tile_loadd(4, g_a[2 * k], 64);
      _tile_loadd(5, g_a[2 * k + 1], 64);
      _tile_loadd(6, g_b[2 * k], 64);
      _tile_loadd(7, g_b[2 * k + 1], 64);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, g_c[0], 64);
    _tile_stored(1, g_c[1], 64);
    _tile_stored(2, g_c[2], 64);
    _tile_stored(3, g_c[3], 64);
    for (int a = 0; a < 2; ++a)
      for (int r = 0; r < 16; ++r) {
        const __m512i v = _mm512_add_epi32(_mm512_load_si512(g_c[2 * a] + 16 * r),
                                           _mm512_slli_epi32(_mm512_load_si512(g_c[2 * a + 1] + 16 * r), 3));
        const __m512 f = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, v), d, _mm512_load_ps(g_f[a] + 16 * r));
        _mm512_store_ps(g_f[a] + 16 * r, f);
      }
  }
  const double t = thread_cpu_seconds() - t0;
  _tile_release();
  return 2.0 * 32 * 16 * 256 * static_cast<double>(iters) / t * 1e-9;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int64_t iters = 1000000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "amx_int8_loops: unknown argument '%s' (expected --iters N)\n", argv[i]);
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "amx_int8_loops: --iters must be positive\n");
    return 2;
  }
#if HANPU_AMX_LOOPS
  if (!__builtin_cpu_supports("amx-int8") || !__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "amx_int8_loops: this CPU has no AMX-INT8 / AVX-512\n");
    return 1;
  }
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::fprintf(stderr, "amx_int8_loops: the kernel refused the AMX tile state\n");
    return 1;
  }
  std::memset(g_a, 1, sizeof g_a);
  std::memset(g_b, 1, sizeof g_b);
  std::printf("loop                 GOP/s per core (CPU time)\n");
  std::printf("%-20s %7.1f\n", "tdpbusd K=64", tdpbusd_only(64, iters));
  std::printf("%-20s %7.1f\n", "tdpbusd K=32", tdpbusd_only(32, iters));
  std::printf("%-20s %7.1f\n", "per-32 scales", per_32_scales(iters / 4));
  std::printf("%-20s %7.1f\n", "q4_k two planes", q4k_two_planes(iters / 4));
  return 0;
#else
  std::fprintf(stderr, "amx_int8_loops: x86-64 Linux only\n");
  return 1;
#endif
}
