// The host CPU as a Device (the schema of devices/*.json), so the planner and the simulator can
// target the machine we run on. Structure (cores, caches, SIMD width, memory size, clock) is
// detected; FMA peak and memory bandwidth are measured by measure_host(); what neither gives
// (cache-to-cache bandwidths, energies, launch cost) is an estimate whose source says why.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "cpu/host.hpp"
#include "hanpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/device.hpp"

namespace hanpu {

namespace {

Quantity q(double value, std::string source, std::string status) {
  Quantity out;
  out.value = value;
  out.source = std::move(source);
  out.status = std::move(status);
  return out;
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s.precision(digits);
  s << std::fixed << v;
  return s.str();
}

/// Status of a number read from the OS by host.cpp (its source vocabulary: sysfs/sysconf/procfs
/// are detected, "default" is a built-in fallback).
std::string status_of(const std::string& source) { return source == "default" ? "estimate" : "detected"; }

struct Clock {
  double ghz = 0;
  std::string source, status;
};

/// The core clock: sysfs cpuinfo_max_freq (the turbo ceiling, what the FMA measurement runs at on
/// an idle machine), else /proc/cpuinfo "cpu MHz" (current or nominal clock; in VMs the TSC rate),
/// else an assumed 2.5 GHz, a mid-range server/desktop clock, marked estimate.
Clock host_clock() {
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    double khz = 0;
    if (f >> khz && khz > 0)
      return {khz / 1e6, "sysfs /sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "detected"};
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    try {
      const double mhz = std::stod(line.substr(colon + 1));
      if (mhz > 0)
        return {mhz / 1e3, "procfs /proc/cpuinfo \"cpu MHz\" of the first CPU (current or nominal clock)",
                "detected"};
    } catch (const std::exception&) {
    }
  }
  return {2.5, "no clock in sysfs or /proc/cpuinfo; assumed 2.5 GHz, a mid-range server/desktop clock", "estimate"};
}

}  // namespace

Device host_device(int threads, double measure_seconds) { return host_device(detect_host(), threads, measure_seconds); }

Device host_device(const HostInfo& info, int threads, double measure_seconds) {
  const bool threads_given = threads > 0;
  if (!threads_given) threads = info.logical_cpus;
  HostMeasurement m;
  const bool measured = measure_seconds > 0;
  if (measured) m = measure_host(threads, measure_seconds);
  const Clock clock = host_clock();

  Device d;
  d.name = "host";
  d.kind = DeviceKind::Cpu;
  // What the CPU's planning rules read instead of probing the process (src/cpu/cpu_planning.cpp):
  // the wisdom key (CPU model, the ISA the kernels dispatch to) and whether bf16 grams run on AMX.
  d.cpu.model = info.cpu_model;
  d.cpu.isa = isa_selection().target;
  d.cpu.bf16_gram = cpu::gram_bf16_usable();
  d.description = info.cpu_model + " (" + info.simd_target + ", " + std::to_string(info.simd_f32_lanes) +
                  " f32 lanes), " + std::to_string(threads) + " thread(s)";
  d.cores = threads_given ? q(threads, "threads requested by the caller", "confirmed")
                          : q(threads, "CPUs this process may run on (" + info.logical_cpus_source + ")",
                              status_of(info.logical_cpus_source));
  d.clock_ghz = q(clock.ghz, clock.source, clock.status);

  // The FMA units seen as a matrix unit: one vector FMA is a 1 x lanes tile of MACs.
  const int lanes = info.simd_f32_lanes;
  d.matrix.tile_m = q(1, "one vector FMA instruction computes 1 x lanes MACs", "derived");
  d.matrix.tile_k = q(1, "one vector FMA instruction computes 1 x lanes MACs", "derived");
  d.matrix.tile_n = q(lanes, "highway target " + info.simd_target + ": f32 lanes per vector", "detected");
  if (measured && m.fma_peak_gflops_1thread > 0) {
    // GFLOP/s / 2 flops per MAC / GHz = MACs per cycle of one core.
    const double macs = m.fma_peak_gflops_1thread / 2 / clock.ghz;
    d.matrix.macs_per_cycle[DType::F32] =
        q(macs, "measured one-thread FMA peak " + fixed(m.fma_peak_gflops_1thread, 1) + " GFLOP/s / 2 / clock " +
                    fixed(clock.ghz, 3) + " GHz",
          clock.status == "estimate" ? "estimate" : "measured");
  } else {
    // Two FMA pipes per core is the common case on x86 (Haswell and later, Zen 2+) and big ARM cores.
    d.matrix.macs_per_cycle[DType::F32] =
        q(2.0 * lanes, "not measured: assumed 2 FMA pipes x " + std::to_string(lanes) + " f32 lanes", "estimate");
  }
  // The planner's "on-core buffer" on a CPU is the per-core L2: the head-fused path keeps each
  // item's state and the chunk's intermediates there (the CPU's planning rules size lockstep groups
  // from it, src/cpu/cpu_planning.cpp), while L1D only holds the rows streaming into the
  // register tiles. A 48 KiB L1D as the working buffer would fail capacity checks the real kernels
  // never face. Without an L2, fall back to L1D.
  const std::string working = info.data_cache(2) ? "L2" : "L1D";
  d.matrix.input_a = d.matrix.input_b = d.matrix.output = working;
  // FMA units take their operands from cache rows and produce rows: there is no fractal format a
  // CPU's "matrix unit" needs, so the layout planner anchors matrix operands dense here.
  d.matrix.operand_layout = OperandLayout::Dense;
  // ~1.5 pJ per f32 FMA lane: instruction fetch/decode/register-file overhead of an out-of-order
  // core amortised over the vector's lanes dominates the arithmetic (Horowitz, ISSCC 2014, scaled to
  // a 7-14 nm node).
  d.matrix.energy_pj_per_mac =
      q(1.5, "estimate: f32 FMA lane plus out-of-order core overhead per lane (Horowitz ISSCC 2014, scaled)",
        "estimate");

  d.vector.lanes[DType::F32] =
      q(lanes, "highway target " + info.simd_target + " f32 lanes; one vector op per cycle assumed", "derived");
  d.vector.buffer = working;
  // The architectural vector registers of the target (the planner sizes the GEMM register tile
  // from them, src/plan/cpu_tuning.cpp): AVX-512 has 32 zmm, AVX2/SSE 16 ymm/xmm, AArch64 NEON/SVE
  // 32; Highway's portable targets (EMU128, SCALAR) are compiled code whose "registers" are the
  // compiler's, counted as 16 like the narrowest x86 file.
  {
    const std::string& t = info.simd_target;
    const bool wide_file = t.rfind("AVX3", 0) == 0 || t.rfind("AVX10", 0) == 0 || t.rfind("NEON", 0) == 0 ||
                           t.rfind("SVE", 0) == 0;
    d.vector.registers = q(wide_file ? 32 : 16, "highway target " + t + ": architectural vector registers", "derived");
  }
  d.vector.energy_pj_per_op = q(1.5, "estimate: same per-lane cost as a FMA lane", "estimate");

  // Caches as buffers. Alignment is the coherency line: tiles aligned to it avoid split lines.
  auto add_cache = [&](int level, const char* name, bool per_core) {
    const CacheLevel* c = info.data_cache(level);
    if (!c) return false;
    BufferSpec b;
    b.name = name;
    const int64_t size = per_core ? info.data_cache_per_core(level) : c->size_bytes;
    const bool shared_share = per_core && c->shared_by_cores > 1;
    b.capacity_bytes =
        q(static_cast<double>(size),
          c->source + (per_core ? (shared_share ? " (one core's share of a cache shared by " +
                                                     std::to_string(c->shared_by_cores) + " cores)"
                                                : " (private to a core)")
                                : " (one instance, shared by " + std::to_string(c->shared_by_cores) + " cores)"),
          shared_share ? "estimate" : status_of(c->source));
    b.alignment_bytes = q(static_cast<double>(c->line_bytes), c->source + " coherency line size", status_of(c->source));
    b.per_core = per_core;
    d.buffers.push_back(std::move(b));
    return true;
  };
  add_cache(1, "L1D", true);
  add_cache(2, "L2", true);
  const bool has_l3 = add_cache(3, "L3", false);
  if (d.buffers.size() < 2 || d.buffers[0].name != "L1D" || d.buffers[1].name != "L2")
    throw Error("host: cache detection found no L1D and L2 data caches; cannot describe the host as a device");

  // Main memory: DRAM fills go straight to L2 on current x86 (L3 is a victim/non-inclusive cache on
  // Skylake-SP and Zen) and ARM cores, so GM<->L2 is the path the planner uses.
  PathSpec gm_in, gm_out;
  gm_in.from = "GM", gm_in.to = "L2", gm_out.from = "L2", gm_out.to = "GM";
  if (measured && m.mem_bandwidth_gbs > 0) {
    gm_in.bandwidth_gbs = q(m.mem_bandwidth_gbs,
                            "measured read bandwidth, " + std::to_string(m.threads) + " threads summing " +
                                std::to_string(m.bandwidth_buffer_bytes >> 20) + " MiB",
                            "measured");
    gm_out.bandwidth_gbs = q(m.mem_bandwidth_gbs, "estimate: write bandwidth taken equal to the measured read bandwidth",
                             "estimate");
  } else {
    gm_in.bandwidth_gbs = q(10, "not measured: assumed 10 GB/s, one DDR4 channel's sustained read", "estimate");
    gm_out.bandwidth_gbs = gm_in.bandwidth_gbs;
  }
  for (PathSpec* p : {&gm_in, &gm_out}) {
    p->shared = true;
    p->engine = "memory";
    // ~60 pJ/byte: DDR4 access including I/O is commonly quoted at 5-10 pJ/bit (plus the uncore).
    p->energy_pj_per_byte = q(60, "estimate: DDR4 access incl. I/O ~5-10 pJ/bit plus uncore", "estimate");
  }
  d.paths.push_back(gm_in);
  d.paths.push_back(gm_out);

  // Cache-to-cache bandwidths are not measured: estimated per cycle from typical core designs.
  auto on_core = [&](const std::string& from, const std::string& to, double bytes_per_cycle, double pj,
                     const std::string& why) {
    PathSpec p;
    p.from = from, p.to = to;
    p.bandwidth_gbs = q(bytes_per_cycle * clock.ghz,
                        "estimate: " + fixed(bytes_per_cycle, 0) + " B/cycle x clock (" + why + ")", "estimate");
    p.shared = false;
    p.engine = "core";
    p.energy_pj_per_byte = q(pj, "estimate: SRAM read + write per byte at a 7-14 nm node", "estimate");
    d.paths.push_back(p);
  };
  // 64 B/cycle L2->L1D (one line per cycle on Skylake/Zen), half that back; L3<->L2 ~32 B/cycle.
  on_core("L2", "L1D", 64, 2, "one cache line per cycle, Skylake/Zen class");
  on_core("L1D", "L2", 32, 2, "half a line per cycle for write-backs");
  if (has_l3) {
    on_core("L3", "L2", 32, 5, "ring/mesh L3 read per core");
    on_core("L2", "L3", 32, 5, "ring/mesh L3 write-back per core");
  }

  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  d.gm_bytes = pages > 0 && page_size > 0
                   ? q(static_cast<double>(pages) * static_cast<double>(page_size), "sysconf(_SC_PHYS_PAGES)", "detected")
                   : q(8.0 * (1LL << 30), "sysconf gave no memory size; assumed 8 GiB", "estimate");
  // A parallel region on the thread pool: waking the workers and a barrier, a few microseconds.
  d.kernel_launch_us = q(5, "estimate: thread-pool wake-up plus barrier for one parallel region", "estimate");
  d.static_power_w = q(2.0 * threads, "estimate: ~2 W per core of idle/uncore power", "estimate");

  d.notes.push_back("CPU caches are hardware-managed: capacities are what a tile can count on, not explicit buffers.");
  if (!measured) d.notes.push_back("No measurement was requested: FMA peak and memory bandwidth are estimates.");
  else
    d.notes.push_back("Measured with " + std::to_string(m.threads) + " threads in " + fixed(m.seconds_spent, 2) +
                      " s; all-thread FMA peak " + fixed(m.fma_peak_gflops_all, 1) +
                      " GFLOP/s. Concurrent load on the machine lowers both numbers.");
  if (clock.status == "estimate") d.notes.push_back("The clock is an estimate, so MACs per cycle are too.");
  // More than two FMA pipes' worth of MACs per cycle means the core ran faster than the clock we
  // read (turbo above the nominal/VM-reported rate); the product MACs/cycle x clock stays the peak.
  const double macs = d.matrix.macs_per_cycle.at(DType::F32).value;
  if (macs > 2.0 * lanes * 1.05)
    d.notes.push_back("Measured " + fixed(macs, 1) + " f32 MACs/cycle exceeds 2 FMA pipes x " + std::to_string(lanes) +
                      " lanes: the core likely runs above the " + fixed(clock.ghz, 2) +
                      " GHz read from the OS (turbo); MACs/cycle x clock is still the measured peak.");
  return d;
}

}  // namespace hanpu
