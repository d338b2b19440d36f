// The CPU part of a Plan: the CPU backend's free parameters, chosen by the CPU backend's planning
// rules (src/cpu/cpu_planning.cpp, PlanOptions::backend) from the device description (vector
// registers, f32 lanes, L1D/L2/L3, cores) or taken from wisdom (which the caller loads) from a file that
// `hanpu tune` wrote after measuring candidates on this machine (as FFTW's wisdom), each value with
// the reason it was chosen. The CPU backend executes exactly these values or refuses the plan,
// naming the field (cpu_cannot_run in plan_exec.hpp).
//
// Wisdom (JSON, schema "hanpu-wisdom-1"): entries keyed by the CPU model string (/proc/cpuinfo),
// the Highway target the kernels dispatch to (HANPU_ISA / --isa respected) and the problem class
// (variant, K, V, input dtype, threads); each holds the tuned values, the date measured and the
// times. Path: $HANPU_WISDOM if set ("none": no wisdom), else $XDG_CACHE_HOME/hanpu/wisdom.json,
// else ~/.cache/hanpu/wisdom.json. A missing file means model-based choices; a malformed file is an
// error naming the file and the field; entries for another CPU or ISA are ignored (the plan says so).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hanpu {

struct Device;
struct Problem;

/// One free parameter: its value and why the planner chose it.
struct CpuParam {
  int64_t value = 0;  // 0: not set (a plan for an NPU has no CPU part)
  std::string reason;
  bool operator==(const CpuParam&) const = default;
};

struct CpuTuning {
  /// Most items of one lockstep group (Kernel::groups is cut with it): the states of a group stay
  /// in the per-core L2 together with the chunk's intermediates. 1..64.
  CpuParam lockstep_group;
  /// Column block of a head-fused item (tier 1): V runs whole heads; narrower blocks split every
  /// head into column blocks run one after another (each recomputes the chunk's grams). A multiple
  /// of the f32 lane count, or V. 1..V.
  CpuParam column_block;
  /// Register tile of the head-fused path's GEMMs: rows x vectors of C held in registers. The CPU
  /// runs any shape up to the compiled maximum of the dispatched target (8 x 3 with 32 vector
  /// registers, 6 x 2 with 16); the chunk-parallel (FLA-style) path keeps the compiled maximum.
  CpuParam gemm_rows, gemm_vectors;
  /// Software prefetch of the next item's rows during a chunk's GEMM tiles: 0 off; r >= 1 issues r
  /// times the even share per tile (the lines spread over the first 1/r of the tiles). 0, 1, 2, 4.
  CpuParam prefetch_rate;
  /// Bytes per thread of the head-fused path's arena (the states of a lockstep group and the
  /// chunk's intermediates, independent of T), derived from lockstep_group and column_block by the
  /// kernels' layout: the largest of the fused programs the CPU lowers a plan to. The CPU's
  /// per-thread workspace (hanpu/engine.hpp) is sized from it; a plan whose groups need more is
  /// refused. Not a tuned parameter (not in cpu_param_names): it follows from the two.
  CpuParam arena_bytes;
  /// Where the values come from: "model" or "wisdom <file>, measured <date>".
  std::string source;
  bool operator==(const CpuTuning&) const = default;

  bool set() const { return lockstep_group.value != 0; }
};

/// The names of CpuTuning's tuned parameters, in table order (arena_bytes, derived, is not one).
std::vector<std::string> cpu_param_names();
CpuParam& cpu_param(CpuTuning& t, const std::string& name);  // also "arena_bytes"; throws hanpu::Error for an unknown name
const CpuParam& cpu_param(const CpuTuning& t, const std::string& name);

/// Checks ranges the plan alone decides (lane multiples need the problem: validate_cpu_tuning);
/// errors name the field ("plan.cpu.gemm_rows: got 0, expected 1..8").
void validate_cpu_tuning(const CpuTuning& t, int64_t V, const std::string& path = "plan.cpu");
nlohmann::json cpu_tuning_to_json(const CpuTuning& t);
CpuTuning cpu_tuning_from_json(const nlohmann::json& j, const std::string& path);

/// The CPU part as describe_plan prints it: one line per parameter with its reason.
std::string describe_cpu_tuning_lines(const CpuTuning& t);

// ---------------------------------------------------------------------------------------------
// Wisdom

/// The wisdom key of this machine: CPU model and the Highway target the kernels dispatch to.
struct WisdomMachine {
  std::string cpu_model, isa;
  bool operator==(const WisdomMachine&) const = default;
};

/// Problem class of a wisdom entry, e.g. "gdn K=128 V=128 f32 threads=2".
std::string wisdom_problem_class(const Problem& p, int cores);

struct WisdomEntry {
  WisdomMachine machine;
  std::string problem_class;
  std::string measured;  // UTC date and time, ISO 8601
  /// Tuned values (parameter name -> value) and the median milliseconds measured at each tuned
  /// and model-based value (informational).
  std::vector<std::pair<std::string, int64_t>> params;
  nlohmann::json times = nlohmann::json::object();
  bool operator==(const WisdomEntry&) const = default;
};
struct Wisdom {
  std::vector<WisdomEntry> entries;
  bool operator==(const Wisdom&) const = default;
};

/// The default wisdom path ($HANPU_WISDOM, else $XDG_CACHE_HOME/hanpu/wisdom.json, else
/// ~/.cache/hanpu/wisdom.json); "" when HANPU_WISDOM is "none" or no home is known.
std::string default_wisdom_path();
/// Parses wisdom; errors name `origin` (the file) and the field.
Wisdom wisdom_from_json(const nlohmann::json& j, const std::string& origin);
nlohmann::json wisdom_to_json(const Wisdom& w);
/// Reads the file (missing: empty wisdom, *exists = false); malformed: hanpu::Error naming it.
Wisdom read_wisdom(const std::string& path, bool* exists = nullptr);
/// Replaces the entry with the same machine and problem class (or adds it) and writes the file
/// atomically (AtomicFile), creating its directory.
void write_wisdom_entry(const std::string& path, const WisdomEntry& entry);

/// Applies wisdom for `p` to a model-based tuning: the matching entry's values replace the model's
/// (reason "from wisdom <file>, measured <date>"); with entries for this problem class but another
/// CPU or ISA only, the model's values stay and their reasons say why the wisdom was ignored.
void apply_wisdom(CpuTuning& t, const Wisdom& w, const std::string& path, const Problem& p, int cores,
                  const WisdomMachine& machine);

}  // namespace hanpu
