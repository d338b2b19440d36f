// The host CPU as a Device (hanpu/device.hpp): built by the CPU backend, which detects the
// processor, measures it on request and knows what its kernels can run there (the Device's
// CpuFacts: ISA target, bf16 grams on the matrix unit). A build without the CPU backend (the
// simulator alone) has no host device; it plans and simulates the device files.
#pragma once

#include "hanpu/device.hpp"

namespace hanpu {

/// The host CPU in the same schema: cores and caches detected, FMA peak and bandwidth measured with
/// `threads` threads for about `measure_seconds` (0: not measured, those numbers marked estimate). Its "matrix unit" is the FMA units (F32 MACs/cycle =
/// measured peak / 2 / clock), its "vector unit" the SIMD lanes, its buffers L1D/L2 (per core)
/// and L3 (shared), its GM the main memory.
Device host_device(int threads, double measure_seconds = 1.0);
struct HostInfo;  // src/cpu/host.hpp
/// The same from a host description already read (an engine's, Engine::host()) instead of detected.
Device host_device(const HostInfo& info, int threads, double measure_seconds);

}  // namespace hanpu
