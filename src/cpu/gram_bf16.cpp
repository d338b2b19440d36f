// The intra-chunk grams of GDN (K K^T and Q K^T) on bf16 inputs with AMX (TDPBF16PS).
//
// Why it is exact enough: both operands are the caller's bf16 values, unchanged (scale and the
// L2 norms are applied afterwards, to the f32 result, by the masking pass). A bf16 x bf16 product
// has at most 16 significant bits and is exact in f32; TDPBF16PS accumulates the products in f32,
// so the grams are the f32 dot products the f32 path forms, summed in another order.
//
// Why AMX and not AVX512-BF16: VDPBF16PS does 32 multiply-adds per instruction but issues once
// per cycle on this CPU (measured: 4.0 G instructions/s against 7.9 G for f32 FMAs, i.e. the same
// 128 G multiply-adds/s), so it gained nothing over converting to f32, and the staging made it
// 10% slower. One TDPBF16PS does 16 x 16 x 32 = 8192 multiply-adds in ~19 cycles (Bf16Linear
// measures 2.87 TFLOP/s per core), 13x the f32 FMA rate.
//
// Operands need no packing: a 16-row A tile is 16 staged bf16 rows (32 values = 64 bytes of each,
// any row stride), a B tile is 16 rows of K^T in bf16 pairs (16 columns x 4 bytes), both loaded
// with their natural strides.
//
// x86-64 with GCC/Clang only; the functions carry target attributes and run only after
// gram_bf16_usable() said yes (amx_usable: CPUID, XCR0 and the Linux tile permission).
#include "cpu/kernels.hpp"

#include "cpu/linear_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HANPU_HAVE_GRAM_AMX 1
#include <immintrin.h>
#endif

namespace hanpu::cpu {

bool gram_bf16_usable() { return amx_usable(); }

#if HANPU_HAVE_GRAM_AMX

__attribute__((target("amx-tile,amx-bf16"))) void gram_bf16_lower(const uint16_t* k_rows, const uint16_t* q_rows,
                                                                  size_t ld_rows, const uint32_t* kt_pairs,
                                                                  size_t ld_pairs, size_t L, float* KK, float* QK,
                                                                  size_t ldc) {
  amx_configure_tiles();
  const size_t blocks = (L + 15) / 16;
  const size_t ksteps = ld_rows / 32;  // 32 bf16 of K (16 pairs) per tile step
  const size_t row_bytes = ld_rows * 2, pair_bytes = ld_pairs * 4, c_bytes = ldc * 4;
  // Tiles: 0 = K K^T block, 1 = Q K^T block, 2 = k rows, 3 = q rows, 4 = K^T pairs.
  for (size_t ib = 0; ib < blocks; ++ib) {
    for (size_t jb = 0; jb <= ib; ++jb) {  // blocks above the diagonal are not needed
      _tile_zero(0);
      _tile_zero(1);
      for (size_t ks = 0; ks < ksteps; ++ks) {
        _tile_loadd(2, k_rows + ib * 16 * ld_rows + ks * 32, row_bytes);
        _tile_loadd(3, q_rows + ib * 16 * ld_rows + ks * 32, row_bytes);
        _tile_loadd(4, kt_pairs + ks * 16 * ld_pairs + jb * 16, pair_bytes);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(1, 3, 4);
      }
      _tile_stored(0, KK + ib * 16 * ldc + jb * 16, c_bytes);
      _tile_stored(1, QK + ib * 16 * ldc + jb * 16, c_bytes);
    }
  }
  amx_release_tiles();
}

#else  // no AMX code in this build

void gram_bf16_lower(const uint16_t*, const uint16_t*, size_t, const uint32_t*, size_t, size_t, float*, float*,
                     size_t) {}

#endif

}  // namespace hanpu::cpu
