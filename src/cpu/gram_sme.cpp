// A small f32 GEMM of the LA engine on Arm SME (the Scalable Matrix Extension): C = A B^T, the
// chunk's grams (K K^T, Q K^T: 64 x 64 by 128 deep in the engine's shapes), taken in the operand
// layout SME's outer product wants. Issue 38, item 4; docs/ARCHITECTURE.md, "The same plan on Arm
// SME/SME2", says how the planner would target it. Not wired into the engine's dispatch.
//
// Why K-major operands: FMOPA (Arm Architecture Reference Manual, "FMOPA (non-widening)")
// adds the outer product of two vectors, Zn (SVL/32 values of column k of A, i.e. row k of A^T)
// and Zm (row k of B^T), to a whole f32 tile ZAd.S. So each step of the depth loop loads one
// contiguous row of A^T and one of B^T: for f32 no pair packing as AMX's VNNI layout needs
// (BFMOPA would take bf16 pairs). The head-fused arena already holds K^T (FusedLayout::Kt, K x C),
// so K K^T needs no conversion at all; Q K^T needs Q^T as well.
//
// Why one asm statement from SMSTART to SMSTOP: in streaming mode Advanced SIMD and scalar FP
// instructions are illegal (unless FEAT_SME_FA64), and GCC 12 knows nothing of streaming mode, so
// no compiler-generated code may run between the two. SMSTART and SMSTOP zero the Z registers,
// hence every vector register is clobbered (the compiler saves the callee-saved d8-d15). qemu
// enforces the rule only without FEAT_SME_FA64 (-cpu max,sme_fa64=off), where scripts/test_arm64.sh
// runs the test once.
//
// Why it holds for any SVL: the streaming vector length is read at run time (CNTW in streaming
// mode: SVL/32 f32 lanes, the side of one f32 tile); every load and store is predicated by
// WHILELT against M, N, so tails and shapes smaller than a tile need no padding and read or
// write nothing outside the operands. The four f32 tiles ZA0-ZA3.S hold a 2 x 2 block of tiles,
// 2 SVL/32 rows by 2 SVL/32 columns of C: each depth step loads 4 vectors for 4 outer products.
//
// Built on aarch64 Linux with GCC or Clang only (GCC 12 has no SME intrinsics, so the kernel is
// assembly; binutils 2.40 assembles it); it runs only after gram_f32_sme_usable() said yes
// (HWCAP2_SME from the kernel, and HANPU_ISA unset or native).
#include "cpu/kernels.hpp"

#include "hanpu/isa.hpp"

#if HANPU_HAVE_GRAM_SME
#include <sys/auxv.h>
#endif

namespace hanpu::cpu {

#if HANPU_HAVE_GRAM_SME

namespace {

// Linux's bit for SME in AT_HWCAP2 (arch/arm64/include/uapi/asm/hwcap.h), for C libraries whose
// headers predate it.
constexpr unsigned long kHwcap2Sme = 1UL << 23;

bool detect_sme() { return (getauxval(AT_HWCAP2) & kHwcap2Sme) != 0; }

}  // namespace

bool gram_f32_sme_usable() {
  // HANPU_ISA below "native" turns the kernels outside Highway off (hanpu/isa.hpp), as for AMX.
  static const bool usable = detect_sme();
  return usable && isa_selection().native;
}

size_t sme_vector_bytes() {
  uint64_t svl = 0;
  // RDSVL reads the streaming vector length without entering streaming mode.
  __asm__ volatile(
      ".arch armv9-a+sme\n"
      "rdsvl %0, #1\n"
      : "=r"(svl));
  return static_cast<size_t>(svl);
}

void gram_f32_sme(const float* At, size_t lda, const float* Bt, size_t ldb, size_t M, size_t N, size_t Kd, float* C,
                  size_t ldc) {
  if (M == 0 || N == 0) return;
  const uint64_t lda_bytes = lda * 4, ldb_bytes = ldb * 4, ldc_bytes = ldc * 4;
  uint64_t vl, i0, j0, a, b, k, t, c, rows;
  // Registers: vl = f32 lanes (tile side); [i0, i0 + 2vl) x [j0, j0 + 2vl) the block of C in
  // ZA0 (top left), ZA1 (top right), ZA2 (bottom left), ZA3 (bottom right); p0/p1 the rows of the
  // top/bottom tiles that exist (< M), p2/p3 the columns of the left/right tiles (< N). x12 is the
  // tile slice index (ZA slices are addressed by w12-w15 only).
  __asm__ volatile(
      ".arch armv9-a+sme\n"
      "smstart\n"
      "cntw %[vl]\n"
      "mov %[i0], #0\n"
      "1:\n"  // block rows
      "cmp %[i0], %[M]\n"
      "b.hs 9f\n"
      "whilelo p0.s, %[i0], %[M]\n"
      "add %[t], %[i0], %[vl]\n"
      "whilelo p1.s, %[t], %[M]\n"
      "mov %[j0], #0\n"
      "2:\n"  // block columns
      "cmp %[j0], %[N]\n"
      "b.hs 8f\n"
      "whilelo p2.s, %[j0], %[N]\n"
      "add %[t], %[j0], %[vl]\n"
      "whilelo p3.s, %[t], %[N]\n"
      "zero {za}\n"
      "add %[a], %[At], %[i0], lsl #2\n"
      "add %[b], %[Bt], %[j0], lsl #2\n"
      "mov %[k], %[Kd]\n"
      "3:\n"  // depth: one row of A^T and one of B^T, four outer products
      "cbz %[k], 4f\n"
      "ld1w {z0.s}, p0/z, [%[a]]\n"
      "ld1w {z1.s}, p1/z, [%[a], %[vl], lsl #2]\n"
      "ld1w {z2.s}, p2/z, [%[b]]\n"
      "ld1w {z3.s}, p3/z, [%[b], %[vl], lsl #2]\n"
      "fmopa za0.s, p0/m, p2/m, z0.s, z2.s\n"
      "fmopa za1.s, p0/m, p3/m, z0.s, z3.s\n"
      "fmopa za2.s, p1/m, p2/m, z1.s, z2.s\n"
      "fmopa za3.s, p1/m, p3/m, z1.s, z3.s\n"
      "add %[a], %[a], %[lda]\n"
      "add %[b], %[b], %[ldb]\n"
      "sub %[k], %[k], #1\n"
      "b 3b\n"
      "4:\n"  // store the top tiles' rows that exist: min(vl, M - i0) of them
      "sub %[rows], %[M], %[i0]\n"
      "cmp %[rows], %[vl]\n"
      "csel %[rows], %[rows], %[vl], lo\n"
      "madd %[c], %[i0], %[ldc], %[C]\n"  // c = C + i0 rows + j0 columns
      "add %[c], %[c], %[j0], lsl #2\n"
      "mov x12, #0\n"
      "5:\n"
      "cmp x12, %[rows]\n"
      "b.hs 6f\n"
      "st1w {za0h.s[w12, 0]}, p2, [%[c]]\n"
      "st1w {za1h.s[w12, 0]}, p3, [%[c], %[vl], lsl #2]\n"
      "add %[c], %[c], %[ldc]\n"
      "add x12, x12, #1\n"
      "b 5b\n"
      "6:\n"  // the bottom tiles' rows: min(vl, M - i0 - vl), none when M - i0 <= vl
      "sub %[rows], %[M], %[i0]\n"
      "cmp %[rows], %[vl]\n"
      "b.ls 7f\n"
      "sub %[rows], %[rows], %[vl]\n"
      "cmp %[rows], %[vl]\n"
      "csel %[rows], %[rows], %[vl], lo\n"
      "mov x12, #0\n"
      "10:\n"
      "cmp x12, %[rows]\n"
      "b.hs 7f\n"
      "st1w {za2h.s[w12, 0]}, p2, [%[c]]\n"
      "st1w {za3h.s[w12, 0]}, p3, [%[c], %[vl], lsl #2]\n"
      "add %[c], %[c], %[ldc]\n"
      "add x12, x12, #1\n"
      "b 10b\n"
      "7:\n"
      "add %[j0], %[j0], %[vl], lsl #1\n"
      "b 2b\n"
      "8:\n"
      "add %[i0], %[i0], %[vl], lsl #1\n"
      "b 1b\n"
      "9:\n"
      "smstop\n"
      : [vl] "=&r"(vl), [i0] "=&r"(i0), [j0] "=&r"(j0), [a] "=&r"(a), [b] "=&r"(b), [k] "=&r"(k), [t] "=&r"(t),
        [c] "=&r"(c), [rows] "=&r"(rows)
      : [At] "r"(At), [Bt] "r"(Bt), [C] "r"(C), [M] "r"(static_cast<uint64_t>(M)),
        [N] "r"(static_cast<uint64_t>(N)), [Kd] "r"(static_cast<uint64_t>(Kd)), [lda] "r"(lda_bytes),
        [ldb] "r"(ldb_bytes), [ldc] "r"(ldc_bytes)
      : "x12", "cc", "memory", "p0", "p1", "p2", "p3", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12",
        "v13", "v14", "v15", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27",
        "v28", "v29", "v30", "v31");
}

#else  // not aarch64 Linux: no SME code in this build

bool gram_f32_sme_usable() { return false; }

#endif

}  // namespace hanpu::cpu
