// The GGML block layouts (ggml/src/ggml-common.h) the dequantizers and the GGUF kernels read
// (src/cpu/gguf_blocks.cpp, linear_gguf.cpp). The type registry, dequantize and quantize are public:
// hanpu/gguf_format.hpp.
#pragma once

#include <cstdint>

#include "hanpu/gguf_format.hpp"

namespace hanpu::gguf {

// Block layouts (ggml-common.h). Sizes are checked against the registry in gguf_blocks.cpp.
inline constexpr int kQK4_0 = 32, kQK8_0 = 32, kQK_K = 256, kKScaleSize = 12;
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK8_0];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];  // element j in the low nibble of byte j, element j+16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;           // f16 scale and offset: w = d * q + m
  uint8_t qs[kQK4_0 / 2];  // as Q4_0
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];           // 5th bit of element j in bit j of the little-endian u32
  uint8_t qs[kQK4_0 / 2];  // low 4 bits, as Q4_0
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK4_0 / 2];
};
struct BlockQ4_K {
  uint16_t d, dmin;               // f16 super-block scales for the 6-bit scales and mins
  uint8_t scales[kKScaleSize];    // 8 scales and 8 mins of 6 bits each
  uint8_t qs[kQK_K / 2];          // 4-bit quants, 64 elements per 32 bytes (low nibbles, then high)
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];  // 5th bit: bit j of qh[l] belongs to sub-block j, element l
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];     // low 4 bits
  uint8_t qh[kQK_K / 4];     // high 2 bits
  int8_t scales[kQK_K / 16];  // 16 signed 8-bit scales
  uint16_t d;
};
struct BlockIQ4_NL {
  uint16_t d;              // f16 scale
  uint8_t qs[kQK4_0 / 2];  // 4-bit indices into kIQ4NLValues, laid out as Q4_0's nibbles
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;           // high 2 bits of the 8 6-bit scales
  uint8_t scales_l[kQK_K / 64];  // low 4 bits
  uint8_t qs[kQK_K / 2];         // 4-bit indices into the IQ4_NL table
};

/// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block (ggml's get_scale_min_k4).
inline void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// IQ4_NL / IQ4_XS non-linear 4-bit levels (ggml-common.h kvalues_iq4nl).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace hanpu::gguf
