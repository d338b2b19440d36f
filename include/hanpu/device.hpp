// Device descriptions as data (DESIGN.md rule 2): an edge NPU from a file under devices/, or the
// host CPU from detection and measurement, in one schema, so that one planner and one simulator
// can target either. No capacity, bandwidth or throughput is a literal in C++: it comes from here.
//
// JSON schema (devices/*.json; device_to_json writes the same):
//   every number is a Quantity object {"value": <number>, "source": "<where it comes from>",
//   "status": "confirmed" | "derived" | "paper" | "estimate" | "detected" | "measured"}
//   and may carry "alternatives": [{"value", "source", "status"}, ...] when sources conflict
//   (e.g. the 310P3 core count: 8 per HAMi, 10 per the paper); the planner uses "value".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hanpu/tensor.hpp"

namespace hanpu {

/// What kind of device a description is: an NPU (explicit buffers, a Cube-like matrix unit) or a
/// CPU (caches, SIMD; planned with the CPU backend's rules, PlanOptions::backend). JSON "kind":
/// "npu" | "cpu".
enum class DeviceKind { Npu, Cpu };
const char* device_kind_name(DeviceKind k);

/// The layout a matrix unit reads its operands in and writes its results in: Blocked (the Cube's
/// 16x16 fractals, NZ) or Dense (row-major: a CPU's FMA units fed from cache rows). JSON
/// "operand_layout": "blocked" | "dense".
enum class OperandLayout { Blocked, Dense };
const char* operand_layout_name(OperandLayout l);

struct Quantity {
  double value = 0;
  std::string source;
  std::string status;  // confirmed | derived | paper | estimate | detected | measured
  std::vector<Quantity> alternatives;  // conflicting values, kept visible
};

/// An explicitly managed on-core buffer (NPU: UB, L1, L0A, L0B, L0C) or a cache level (CPU).
struct BufferSpec {
  std::string name;         // "UB", "L1", "L0A", "L0B", "L0C"; CPU: "L1D", "L2"
  Quantity capacity_bytes;  // per core
  Quantity alignment_bytes;
  /// Bytes every kernel keeps reserved in this buffer for its whole life (queue descriptors,
  /// scratch space of the vector library's routines); JSON "reserved_bytes", optional (0).
  Quantity reserved_bytes;
  bool per_core = true;     // false for a buffer shared by all cores (e.g. a CPU's L3)
};

/// A data path between two memories ("GM" is the device's global memory; buffer names otherwise).
struct PathSpec {
  std::string from, to;        // e.g. "GM" -> "L1", "L1" -> "L0A", "L0C" -> "UB", "UB" -> "GM"
  Quantity bandwidth_gbs;      // 1e9 bytes/s, per core unless shared
  bool shared = false;         // true: all cores share this bandwidth (the chip's GM interface)
  Quantity energy_pj_per_byte;
  std::string engine;          // the DMA engine that drives it (e.g. "MTE1", "MTE2", "MTE3"); paths
                               // on the same engine serialize, different engines overlap
  std::string name() const { return from + "->" + to; }
};

/// The matrix unit (NPU Cube; CPU: the FMA units seen as a matrix engine).
struct MatrixUnitSpec {
  Quantity tile_m, tile_k, tile_n;             // fractal shape, e.g. 16 x 16 x 16
  std::map<DType, Quantity> macs_per_cycle;    // per core, per input dtype (F16, BF16, F32 ...)
  std::map<std::string, Quantity> macs_per_cycle_extra;  // dtypes hanpu tensors lack ("INT8", "INT4"),
                                                        // kept for reports; same JSON object
  std::string input_a = "L0A", input_b = "L0B", output = "L0C";  // buffers it reads and writes
  /// The layout the unit reads its operands in and writes its results in: "blocked" (the Cube's
  /// 16x16 fractals, NZ) or "dense" (row-major, e.g. a CPU's FMA units fed from cache rows). The
  /// layout planner anchors matrix operands and results to it (JSON "operand_layout", optional,
  /// default "blocked").
  OperandLayout operand_layout = OperandLayout::Blocked;
  /// True when the matrix work runs on the vector unit itself (AIE-ML's vector processor does
  /// the matrix multiplies): matrix and vector steps then share one issue lane. JSON
  /// "runs_on_vector_unit", optional (default false: a separate unit, like the Cube).
  bool runs_on_vector_unit = false;
  Quantity energy_pj_per_mac;
};

/// The vector unit (NPU Vector on the UB; CPU: SIMD).
struct VectorUnitSpec {
  std::map<DType, Quantity> lanes;  // elements per cycle per dtype (F16: 128, F32: 64 on DaVinci)
  std::string buffer = "UB";        // the buffer it operates on
  Quantity energy_pj_per_op;        // per element operation
  /// Elements a dense<->blocked layout transform moves per cycle: one fractal row (16 elements
  /// on DaVinci) per strided vector instruction instead of the full vector width. JSON
  /// "transform_row_elements", optional (absent: transforms run at the F32 lane width).
  Quantity transform_row_elements;
  /// Architectural vector registers (a CPU's register file: 16 on AVX2, 32 on AVX-512 and NEON),
  /// from which the planner sizes the GEMM register tile. JSON "registers", optional (absent: 0,
  /// not a CPU or not known).
  Quantity registers;
};

/// One coherent alternative of a device's core count: the count with everything that follows from
/// it (the clock derived from the same chip peak, bandwidths derived from that clock), so choosing
/// another count never mixes numbers of two configurations. JSON "core_configurations":
/// [{"name", "cores", "clock_ghz", "path_bandwidth_gbs": {"L0C->UB": Quantity, ...}}]; the
/// top-level cores/clock_ghz/paths are the default configuration.
struct CoreConfiguration {
  std::string name;  // e.g. "hami-8-core"
  Quantity cores;
  Quantity clock_ghz;
  std::map<std::string, Quantity> path_bandwidth_gbs;  // "FROM->TO" -> bandwidth in this configuration
};

/// A CPU device's facts about its processor and the kernels that run on it, which the CPU's
/// planning rules read (src/cpu/cpu_planning.cpp) instead of probing the process: the host's
/// description gets them from detection (host_device), a saved description keeps them, so a plan
/// depends on the description alone. JSON "cpu": {"model", "isa", "bf16_gram"} (kind "cpu" only;
/// optional: absent means model "unknown", isa "", no bf16 grams).
struct CpuFacts {
  std::string model;       // /proc/cpuinfo "model name" (wisdom entries are keyed by it)
  std::string isa;         // the Highway target the kernels dispatch to at most (HANPU_ISA respected), e.g. "AVX2"
  bool bf16_gram = false;  // bf16 q/k grams run on the matrix unit (AMX tiles present and permitted)
  bool operator==(const CpuFacts&) const = default;
};

struct Device {
  std::string name;         // "ascend310p"
  DeviceKind kind = DeviceKind::Npu;
  std::string description;
  Quantity cores;           // cores the planner maps heads onto
  Quantity clock_ghz;
  MatrixUnitSpec matrix;
  VectorUnitSpec vector;
  std::vector<BufferSpec> buffers;
  std::vector<PathSpec> paths;
  Quantity gm_bytes;              // device memory capacity
  Quantity kernel_launch_us;      // cost of one kernel launch (host -> device)
  Quantity static_power_w;        // power drawn regardless of activity (energy = P * latency + dynamic)
  /// Cycles of one synchronization between the matrix and the vector unit (a flag set by one
  /// pipe and waited on by the other), paid by every hand-off of data between them. JSON
  /// "handoff_sync_cycles", optional (absent: 0, as on a CPU where one core does both).
  Quantity handoff_sync_cycles;
  /// Fixed costs real kernels pay regardless of bytes and MACs (docs/SIMULATION.md, "Fixed costs
  /// and calibration"); each optional in the JSON (absent: 0), charged per event by the simulator.
  /// Per kernel phase (a launched kernel or a megakernel phase): the pipeline fill and drain at the
  /// boundary and the all-core barrier, with no overlap of one phase's data movement with the next
  /// one's compute. JSON "kernel_boundary_us".
  Quantity kernel_boundary_us;
  /// Per DMA transfer (one move step of one chunk): descriptor set-up and the first access's
  /// latency, on the transfer's DMA lane. JSON "dma_setup_cycles".
  Quantity dma_setup_cycles;
  /// Per contiguous segment after the first of a GM transfer: a new burst (a 64-row tile of a
  /// [T, H, K] tensor is 64 segments of K elements, strided by H K). JSON "gm_segment_cycles".
  Quantity gm_segment_cycles;
  /// Per operator per tile (one compute step of one chunk, either unit): the set_flag/wait_flag
  /// pairs and pipe barriers around it and the scalar unit's address and loop work. JSON
  /// "pipe_sync_cycles".
  Quantity pipe_sync_cycles;
  /// Per vector instruction sequence (a vector compute, transform, cast or zero step of one
  /// chunk): issue start-up, masks and repeat set-up. JSON "vector_startup_cycles".
  Quantity vector_startup_cycles;
  /// The software stack's, not the silicon's: TransData (ND <-> NZ format conversion) kernels the
  /// framework's matmul runs per ND operand and per ND result when the matrix unit cannot take the
  /// operands as they are (torch_npu / aclnn on the 310P for fp32 operands: 1). The vllm-ascend
  /// strategy charges each as a kernel of its own (launch, boundary, GM round trip, transform on
  /// the vector unit). JSON "framework_matmul_transdata_per_tensor", optional (absent: 0).
  Quantity framework_matmul_transdata_per_tensor;
  std::vector<std::string> notes; // open conflicts and caveats, shown in reports
  std::vector<CoreConfiguration> core_configurations;  // coherent alternatives to the default
  CpuFacts cpu;                   // kind Cpu only

  int core_count() const { return static_cast<int>(cores.value); }
  /// Throws hanpu::Error naming the buffer if there is none of that name.
  const BufferSpec& buffer(const std::string& name) const;
  /// Throws hanpu::Error naming the path ("GM->L1") if there is none.
  const PathSpec& path(const std::string& from, const std::string& to) const;
  bool has_path(const std::string& from, const std::string& to) const;
  /// The matrix unit's staging buffer: the one with paths to both operand buffers (L1 on
  /// DaVinci); on an NPU whose matrix engine works on the vector unit's own memory, that memory.
  std::string staging_buffer() const;
  /// MACs per cycle per core of the matrix unit for inputs of `dt`; throws hanpu::Error naming the
  /// device and the dtype if the unit does not take it (e.g. F32 on the Ascend Cube).
  double matrix_macs_per_cycle(DType dt) const;
  /// Vector lanes (elements per cycle per core) for `dt`; throws hanpu::Error likewise.
  double vector_lanes(DType dt) const;
};

/// Parses and validates a device description; every problem (missing field, wrong type, a
/// Quantity without source/status, an unknown status, a non-positive capacity or bandwidth, a path
/// naming an unknown buffer, a matrix unit whose inputs are not buffers ...) is a hanpu::Error
/// naming `origin` (the file) and the field, e.g. "devices/x.json: buffers[2].capacity_bytes.value:
/// got -1, expected a positive number".
Device device_from_json(const nlohmann::json& j, const std::string& origin);

/// The device with `cores` cores: itself when `cores` is its core count; the matching
/// core_configurations entry applied as a whole (cores, clock, the bandwidths it lists, and the
/// entry becomes the default) when there is one; for a device without configurations (the host
/// CPU, whose cores are threads at one clock) the count alone. Otherwise throws hanpu::Error
/// naming the device, the count got and the counts it offers.
Device device_with_cores(const Device& d, int cores);
Device load_device(const std::string& path);
nlohmann::json device_to_json(const Device& d);

}  // namespace hanpu
