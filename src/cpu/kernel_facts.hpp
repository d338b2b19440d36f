// Facts of the LA kernels' code that the CPU's planning rules (cpu_planning.cpp) must know, each
// stated once here and used by both: the kernels (src/cpu/la/*-inl.h) compile with them, the
// planning rules size arenas, lockstep groups and register tiles from them. Plain C++ (no Highway),
// so that target-independent code can include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hanpu::cpu {

// Row padding of every arena matrix whose columns are a GEMM's N dimension: 16 floats = 64 bytes,
// a multiple of the vector length of every target (4, 8 or 16 floats), so tiles never need
// partial vectors; the pad columns are kept at zero.
inline constexpr size_t kArenaRowPadFloats = 16;

// Leading dimension (floats) of an arena matrix with n columns: padded to kArenaRowPadFloats, plus
// one more pad when the row length is a multiple of 256 bytes. Rows a power-of-two apart fall into
// a few L1 sets (with 512-byte rows, a 128-row GEMM panel maps to 8 of the 64 sets and thrashes
// the 12 ways); the extra 64 bytes spread consecutive rows over all sets.
constexpr size_t arena_leading_dim(size_t n) {
  const size_t padded = (n + kArenaRowPadFloats - 1) / kArenaRowPadFloats * kArenaRowPadFloats;
  return padded % 64 == 0 ? padded + kArenaRowPadFloats : padded;
}

// Bytes of one K x width f32 state as the arena holds it (rows at arena_leading_dim).
constexpr int64_t arena_state_bytes(int64_t K, int64_t width) {
  return K * static_cast<int64_t>(arena_leading_dim(static_cast<size_t>(width)) * sizeof(float));
}

// GEMM register tiles the LA kernels compile: rows x vectors of C held in registers.
// 32-register targets (AVX-512, NEON, SVE) use 8 x 3 (24 accumulators + 3 B vectors + 1 broadcast:
// 11 loads per 24 FMAs; measured on AVX-512 against 8x2, 12x2, 6x4 and 7x4). 16-register targets
// (AVX2, SSE4, the portable ones): 6 x 2 (12 accumulators + 2 B vectors + 1 broadcast = 15
// registers). The plan may pick any smaller tile (plan.cpu.gemm_rows / gemm_vectors).
struct GemmTile {
  int rows = 0, vectors = 0;
};
inline constexpr GemmTile kGemmTileWideFile{8, 3};
inline constexpr GemmTile kGemmTileNarrowFile{6, 2};
constexpr GemmTile compiled_gemm_tile(int vector_registers) {
  return vector_registers >= 32 ? kGemmTileWideFile : kGemmTileNarrowFile;
}

}  // namespace hanpu::cpu
