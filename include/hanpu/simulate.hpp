// The NPU simulator: executes a Plan on a Device model and accounts for every byte moved per
// path, every unit's busy time, buffer occupancy, latency and energy (docs/SIMULATION.md).
//
// Per core, each kernel's items run chunk after chunk through the kernel's chunk program; every
// lane (matrix unit, vector unit, each DMA engine) issues its steps in program order and a step
// starts when its lane is free and its dependencies are done: the step's deps in the same chunk,
// the state written by the previous chunk of the same item, and the last reader of the buffer it
// overwrites `buffering` chunks earlier (double buffering lets loads of chunk c+1 overlap chunk c).
// Shared paths (the chip's GM interface) split their bandwidth evenly over the kernel's busy cores.
// Kernels run one after another, each paying the device's launch cost unless part of a megakernel,
// and every kernel (megakernel phases too) its boundary cost. Fixed costs per event (device data:
// dma_setup_cycles per transfer, gm_segment_cycles per extra strided GM segment, pipe_sync_cycles
// per operator per tile, vector_startup_cycles per vector instruction sequence) lengthen the step
// that pays them, so overlap with other lanes is simulated, not assumed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"

namespace hanpu {

struct SimOptions {
  /// Record a timeline of the first `timeline_chunks` chunks each core runs in each kernel.
  bool timeline = false;
  int timeline_chunks = 4;
  /// Account the rounds of identical chunks after the timing has become periodic as multiples of
  /// one round instead of simulating each (same totals as the chunk loop up to floating-point
  /// rounding; integer byte counts exactly); off: the plain loop, for tests that compare.
  bool steady_state_shortcut = true;
  /// How on-core buffers are allocated. LastReader: each tensor copy is freed after its last
  /// reader (the plan's lowering; an ideal allocator). Static: as Ascend C kernels allocate their
  /// TPipe/TQue buffers, every tensor copy of the kernel (double-buffered slots twice) holds its
  /// bytes for the kernel's whole life; what does not fit is spilled (see SimResult::static_*).
  enum class BufferPolicy { LastReader, Static };
  BufferPolicy buffer_policy = BufferPolicy::LastReader;
};

/// "static" / "last-reader"; buffer_policy_from_name throws hanpu::Error naming the choices.
const char* buffer_policy_name(SimOptions::BufferPolicy p);
SimOptions::BufferPolicy buffer_policy_from_name(const std::string& name);

/// Totals for one operator (fine operator name; "state_in"/"state_out"/"state_snapshot" for the
/// state's own loads and stores).
struct OperatorStats {
  std::string op;
  std::string paper_op;       // "1".."6", "5r", "5u", or "" for state movement
  double busy_s = 0;          // summed over lanes and cores
  double matrix_s = 0, vector_s = 0, dma_s = 0;
  double macs = 0, executed_macs = 0, vector_ops = 0;
  int64_t gm_read_bytes = 0, gm_write_bytes = 0, l1_to_l0_bytes = 0, ub_l1_bytes = 0;
  double energy_j = 0;  // dynamic
};

struct KernelStats {
  std::string name;
  double latency_s = 0;  // including its launch
  double launch_s = 0;
  double boundary_s = 0;  // the device's kernel_boundary_us (fill, drain, barrier)
  int busy_cores = 0;
  /// Buffer policy Static: bytes each buffer needs with every copy allocated for the kernel's
  /// life, the tensors spilled to make it fit, and their GM traffic (store + reload per chunk).
  std::map<std::string, int64_t> static_bytes;
  std::vector<std::string> static_spilled;
  int64_t static_spill_bytes = 0;
};

struct TimelineEvent {
  int core = 0;
  std::string kernel, lane, op;  // lane: step_lane_name of the step
  StepKind kind = StepKind::Compute;
  std::string tensor;
  int64_t item = 0, chunk = 0;  // index of the item on its core, chunk within the sequence
  double start_s = 0, end_s = 0;
};

struct SimResult {
  std::string strategy, device;
  Variant variant = Variant::GDN;
  int64_t T = 0;          // total tokens
  int64_t heads = 0;      // value heads
  int64_t sequences = 0;
  double latency_s = 0, energy_j = 0, static_energy_j = 0, dynamic_energy_j = 0;
  int64_t gm_read_bytes = 0, gm_write_bytes = 0, l1_to_l0_bytes = 0, ub_l1_bytes = 0;
  std::map<std::string, int64_t> bytes_per_path;  // "GM->L1" -> bytes
  double macs = 0;           // useful multiply-adds (exact triangles)
  double executed_macs = 0;  // what the matrix unit executes (tile-rounded)
  double vector_ops = 0;
  double matrix_utilization = 0;         // executed_macs / (latency x cores x peak MAC rate)
  double useful_matrix_utilization = 0;  // macs / (latency x cores x peak MAC rate)
  std::map<std::string, int64_t> peak_bytes;  // per buffer, max over kernels
  int64_t peak_gm_bytes = 0;      // inputs + outputs + states + every intermediate materialized in GM
  int64_t gm_intermediate_bytes = 0;
  int64_t spill_bytes = 0;        // GM traffic of spills and reloads
  int64_t transform_bytes = 0;    // bytes layout transforms read and write inside the vector buffer
  std::map<std::string, double> busy_s;  // per lane, summed over cores
  /// Time each fixed-cost mechanism adds, summed over lanes and cores for the per-step ones
  /// ("dma_setup", "gm_segments", "pipe_sync", "vector_startup"), over kernels for "launch" and
  /// "kernel_boundary" (these two add to the latency exactly).
  std::map<std::string, double> fixed_cost_s;
  /// Counted events: "launches", "kernel_boundaries", "dma_transfers", "gm_segments" (extra
  /// segments), "operator_syncs", "vector_sequences".
  std::map<std::string, double> fixed_cost_events;
  std::string buffer_policy = "last-reader";
  int64_t static_spill_bytes = 0;  // buffer policy Static: GM traffic its spills add (in gm_*_bytes too)
  std::vector<OperatorStats> per_operator;
  std::vector<KernelStats> kernels;
  std::vector<TimelineEvent> timeline;
  // Chunk rounds (chunk c of every item of a lockstep group on one core) stepped one by one; the
  // steady-state shortcut accounts the others as multiples. What makes a long T cheap to simulate.
  int64_t simulated_rounds = 0;
};

/// Throws hanpu::Error if the plan was made for another device (by name) or uses a path, buffer
/// or unit rate the device does not have.
SimResult simulate(const Plan& plan, const Device& dev, const SimOptions& opt = {});

/// Whether a plan's peak GM footprint fits the device's GM: bytes needed and available.
struct GmFit {
  bool fits = true;
  int64_t needs_bytes = 0, device_bytes = 0;
  /// "does not fit: needs X GiB of GM, the device has Y GiB"
  std::string message() const;
};
GmFit gm_fit(const Plan& plan, const Device& dev);

/// Peak GM footprint of a plan without timing it (cheap; for peak-memory sweeps to long T).
int64_t plan_peak_gm_bytes(const Plan& plan);

/// The --json object: strategy, variant, T, heads, latency_ms, energy_mj, gm_read_bytes,
/// gm_write_bytes, l1_to_l0_bytes, ub_l1_bytes, macs, matrix_utilization, peak_bytes,
/// peak_gm_bytes, and more; `detail` adds per-operator and per-kernel figures.
nlohmann::json sim_result_to_json(const SimResult& r, bool detail = false);

}  // namespace hanpu
