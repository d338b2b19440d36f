// The CPU part of a Plan (include/hanpu/cpu_tuning.hpp): the model-based choice of the CPU
// backend's free parameters from the host description, their JSON edge, and the wisdom file
// `hanpu tune` writes and the planner reads.
#include "hanpu/cpu_tuning.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "cpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "cpu/lowering.hpp"
#include "device/host.hpp"
#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"
#include "plan/cpu_tuning_plan.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;

constexpr const char* kWisdomSchema = "hanpu-wisdom-1";
// Wisdom files are a few KiB; anything near this is not one.
constexpr uint64_t kMaxWisdomBytes = 16u << 20;

// Ranges the plan alone decides (the CPU refuses shapes beyond its compiled tile separately).
constexpr int64_t kMaxLockstepGroup = 64;     // max_lockstep_group's own cap
constexpr int64_t kMaxGemmRows = 16;          // no target's register file holds taller tiles
constexpr int64_t kMaxGemmVectors = 8;        // 8 vectors: a whole 128-column row of AVX-512
constexpr int64_t kMaxPrefetchRate = 16;      // 16x the even share issues a chunk's lines in ~6 tiles
constexpr int64_t kMaxArenaBytes = int64_t{1} << 30;  // 64 states of 128 x 128 (4 MiB) are far below

std::string kib(double bytes) {
  std::ostringstream s;
  s.precision(bytes >= 10 * 1024 ? 0 : 1);
  s << std::fixed << bytes / 1024 << " KiB";
  return s.str();
}

int64_t buffer_bytes(const Device& dev, const char* name) {
  for (const BufferSpec& b : dev.buffers)
    if (b.name == name) return static_cast<int64_t>(b.capacity_bytes.value);
  return 0;
}

// A state row as the arena holds it (max_lockstep_group's rule): whole cache lines, plus one line
// when the row is a multiple of four lines (rows a power of two apart share cache sets).
int64_t padded_state_bytes(int64_t K, int64_t width) {
  int64_t row = (width * 4 + 63) / 64 * 64;
  if (row % 256 == 0) row += 64;
  return K * row;
}

}  // namespace

std::vector<std::string> cpu_param_names() {
  return {"lockstep_group", "column_block", "gemm_rows", "gemm_vectors", "prefetch_rate"};
}

CpuParam& cpu_param(CpuTuning& t, const std::string& name) {
  if (name == "lockstep_group") return t.lockstep_group;
  if (name == "column_block") return t.column_block;
  if (name == "gemm_rows") return t.gemm_rows;
  if (name == "gemm_vectors") return t.gemm_vectors;
  if (name == "prefetch_rate") return t.prefetch_rate;
  if (name == "arena_bytes") return t.arena_bytes;
  throw Error("CPU parameter: got \"" + name +
              "\", expected lockstep_group, column_block, gemm_rows, gemm_vectors, prefetch_rate or arena_bytes");
}
const CpuParam& cpu_param(const CpuTuning& t, const std::string& name) { return cpu_param(const_cast<CpuTuning&>(t), name); }

void validate_cpu_tuning(const CpuTuning& t, int64_t V, const std::string& path) {
  auto range = [&](const CpuParam& p, const char* name, int64_t lo, int64_t hi) {
    if (p.value < lo || p.value > hi)
      throw Error(path + "." + name + ": got " + std::to_string(p.value) + ", expected " + std::to_string(lo) + ".." +
                  std::to_string(hi));
  };
  range(t.lockstep_group, "lockstep_group", 1, kMaxLockstepGroup);
  range(t.column_block, "column_block", 1, std::max<int64_t>(1, V));
  range(t.gemm_rows, "gemm_rows", 1, kMaxGemmRows);
  range(t.gemm_vectors, "gemm_vectors", 1, kMaxGemmVectors);
  range(t.prefetch_rate, "prefetch_rate", 0, kMaxPrefetchRate);
  range(t.arena_bytes, "arena_bytes", 1, kMaxArenaBytes);
}

namespace {
// Every field of plan.cpu: the tuned parameters, then the derived arena size.
std::vector<std::string> cpu_field_names() {
  std::vector<std::string> names = cpu_param_names();
  names.push_back("arena_bytes");
  return names;
}
}  // namespace

json cpu_tuning_to_json(const CpuTuning& t) {
  json j;
  for (const std::string& name : cpu_field_names()) {
    const CpuParam& p = cpu_param(t, name);
    j[name] = {{"value", p.value}, {"reason", p.reason}};
  }
  j["source"] = t.source;
  return j;
}

CpuTuning cpu_tuning_from_json(const json& j, const std::string& path) {
  if (!j.is_object()) throw Error(path + ": got " + std::string(j.type_name()) + ", expected an object");
  CpuTuning t;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto names = cpu_field_names();
    if (it.key() != "source" && std::find(names.begin(), names.end(), it.key()) == names.end())
      throw Error(path + "." + it.key() + ": unknown field (expected source or one of the CPU parameters)");
  }
  for (const std::string& name : cpu_field_names()) {
    const std::string at = path + "." + name;
    if (!j.contains(name)) throw Error(at + ": missing (the field is required)");
    const json& pj = j.at(name);
    if (!pj.is_object() || !pj.contains("value") || !pj.contains("reason"))
      throw Error(at + ": expected an object {\"value\": <integer>, \"reason\": <string>}");
    if (!pj.at("value").is_number_integer()) throw Error(at + ".value: got " + pj.at("value").dump() + ", expected an integer");
    if (!pj.at("reason").is_string()) throw Error(at + ".reason: got " + pj.at("reason").dump() + ", expected a string");
    CpuParam& p = cpu_param(t, name);
    p.value = pj.at("value").get<int64_t>();
    p.reason = pj.at("reason").get<std::string>();
  }
  if (!j.contains("source") || !j.at("source").is_string()) throw Error(path + ".source: expected a string");
  t.source = j.at("source").get<std::string>();
  return t;
}

std::string describe_cpu_tuning_lines(const CpuTuning& t) {
  std::string s = "  CPU parameters (" + t.source + "):\n";
  for (const std::string& name : cpu_field_names())
    s += "    " + name + " = " + std::to_string(cpu_param(t, name).value) + ": " + cpu_param(t, name).reason + "\n";
  return s;
}

GemmTileLimit compiled_gemm_tile(int vector_registers) {
  // the LA kernels (src/cpu/la/gemm-inl.h) compile 8 x 3 tiles for 32-register targets and 6 x 2 for 16.
  return vector_registers >= 32 ? GemmTileLimit{8, 3} : GemmTileLimit{6, 2};
}

CpuTuning model_cpu_tuning(const Problem& p, const Device& dev, int cores) {
  CpuTuning t;
  t.source = "model";
  const int64_t l2 = buffer_bytes(dev, "L2"), l1 = buffer_bytes(dev, "L1D");
  const int64_t lanes = std::max<int64_t>(1, static_cast<int64_t>(dev.matrix.tile_n.value));

  // Column block: whole heads while one state (as the arena pads it) takes at most a quarter of
  // the L2, the share max_lockstep_group gives all of a group's states; every narrower block
  // recomputes the chunk's K K^T and Q K^T, so splitting buys nothing until the state crowds out
  // the chunk's intermediates.
  int64_t block = p.V;
  while (block > lanes && l2 > 0 && padded_state_bytes(p.K, block) > l2 / 4)
    block = std::max<int64_t>(lanes, (block / 2 + lanes - 1) / lanes * lanes);
  t.column_block.value = block;
  t.column_block.reason =
      block == p.V ? "whole heads (V = " + std::to_string(p.V) + "): one " + std::to_string(p.K) + " x " + std::to_string(p.V) +
                         " f32 state (" + kib(static_cast<double>(padded_state_bytes(p.K, p.V))) + " as the arena pads its rows) fits a quarter of the " +
                         kib(static_cast<double>(l2)) + " L2; narrower blocks would recompute the grams per block"
                   : std::to_string(block) + " columns: a whole " + std::to_string(p.K) + " x " + std::to_string(p.V) +
                         " state exceeds a quarter of the " + kib(static_cast<double>(l2)) + " L2, a block of " + std::to_string(block) +
                         " columns (" + kib(static_cast<double>(padded_state_bytes(p.K, block))) + ") does not";

  // Lockstep group: as many states as a quarter of the L2 holds (the rest for the chunk's
  // intermediates and the rows in flight), capped by the items a core gets (sequences x value
  // heads x column blocks, dealt out evenly).
  const int by_cache = max_lockstep_group(dev, p.K, block);
  int64_t sequences = 0;
  for (int64_t s = 0; s < p.sequences(); ++s) sequences += p.chunks_of(s) > 0 ? 1 : 0;
  const int64_t items = std::max<int64_t>(1, sequences) * p.HV * ((p.V + block - 1) / block);
  const int64_t heads_per_core = (items + cores - 1) / std::max(1, cores);
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>(by_cache, heads_per_core));
  t.lockstep_group.value = group;
  t.lockstep_group.reason = std::to_string(by_cache) + " state(s) of " + kib(static_cast<double>(padded_state_bytes(p.K, block))) +
                            " fit a quarter of the " + kib(static_cast<double>(l2)) + " L2, the rest left for the chunk's intermediates" +
                            (group < by_cache ? "; capped at the " + std::to_string(heads_per_core) + " items a core gets" : "");

  // GEMM register tile: the tile with the most FMAs per load (rows x vectors / (rows + vectors))
  // among those whose accumulators, B vectors and one broadcast fit the register file, up to the
  // tile the kernels compile for it.
  const int regs = dev.vector.registers.value > 0 ? static_cast<int>(dev.vector.registers.value) : 16;
  const GemmTileLimit limit = compiled_gemm_tile(regs);
  int best_r = 1, best_v = 1;
  double best = 0;
  for (int r = 1; r <= limit.rows; ++r)
    for (int v = 1; v <= limit.vectors; ++v) {
      if (r * v + v + 1 > regs) continue;
      const double intensity = static_cast<double>(r * v) / (r + v);
      if (intensity > best + 1e-12) best = intensity, best_r = r, best_v = v;
    }
  const std::string tile_why = std::to_string(best_r) + " x " + std::to_string(best_v) + " vectors of " + std::to_string(lanes) +
                               " lanes: " + std::to_string(best_r * best_v) + " accumulators + " + std::to_string(best_v) +
                               " B vectors + 1 broadcast = " + std::to_string(best_r * best_v + best_v + 1) + " of " +
                               std::to_string(regs) + " vector registers, the most FMAs per load (" + std::to_string(best_r * best_v) +
                               " per " + std::to_string(best_r + best_v) + ") of the tiles the kernels compile (up to " +
                               std::to_string(limit.rows) + " x " + std::to_string(limit.vectors) + ")";
  t.gemm_rows = {best_r, tile_why};
  t.gemm_vectors = {best_v, tile_why};

  // Prefetch: the next item's rows of one chunk (q, k, v and KDA's g) go into L2 while the GEMM
  // tiles run, spread evenly over the tiles: the fewest line-fill buffers taken from the tiles' own
  // refills at any moment that still finishes one chunk ahead. Without an L2 beyond the L1D there
  // is nowhere to prefetch to that the GEMM operands do not need.
  const int64_t in_bytes = static_cast<int64_t>(dtype_size(p.qkv_dtype));
  const int64_t lines = p.chunk * ((2 * p.K + std::min(block, p.V)) * in_bytes + (variant_traits(p.variant).channel_gate() ? p.K * 4 : 0)) / 64;
  if (l2 > l1 && l2 > 0)
    t.prefetch_rate = {1, "the next item's ~" + std::to_string(lines) + " lines of a chunk into the " + kib(static_cast<double>(l2)) +
                              " L2, spread evenly over the chunk's GEMM tiles (the fewest line-fill buffers taken from the tiles' refills)"};
  else
    t.prefetch_rate = {0, "no L2 larger than the L1D to prefetch into"};
  choose_cpu_arena(t, p, dev);
  return t;
}

void choose_cpu_arena(CpuTuning& t, const Problem& p, const Device& dev) {
  // The kernels' own layout (cpu/kernels.hpp via cpu/lowering.hpp) for a full group of full-width
  // items, in the largest program the lowering can make of a plan's order: the arena then holds
  // any head-fused kernel the planner cuts with these two values.
  const bool bf16 = dev.name == "host" && variant_traits(p.variant).head_gate() && p.qkv_dtype == DType::BF16 && cpu::gram_bf16_usable();
  const int64_t width = std::min(t.column_block.value, p.V), group = t.lockstep_group.value;
  const cpu::ArenaBound b = cpu::fused_arena_bound(p, width, static_cast<size_t>(group), bf16);
  const int64_t l2 = buffer_bytes(dev, "L2");
  const double per_state = static_cast<double>(b.state_bytes) / static_cast<double>(std::max<int64_t>(1, group));
  const bool two = !b.program.state_in_place;
  t.arena_bytes.value = static_cast<int64_t>(b.bytes);
  t.arena_bytes.reason =
      "lockstep_group " + std::to_string(group) + " x " + (two ? "2 states (double-buffered) " : "1 state ") + "of " +
      kib(per_state / (two ? 2 : 1)) + " (K " + std::to_string(p.K) + " x " + std::to_string(width) + " columns, padded rows) + chunk " +
      std::to_string(p.chunk) + " intermediates " + kib(static_cast<double>(b.bytes - b.state_bytes)) +
      (bf16 ? " (bf16 gram rows included)" : "") + " = " + kib(static_cast<double>(b.bytes)) +
      " per thread, the largest of the fused programs (" + (b.program.gemm_first ? "GEMM-first" : "W/U form") + ")" +
      (l2 > 0 ? std::string(b.bytes <= static_cast<size_t>(l2) ? ", within" : ", beyond") + " the " + kib(static_cast<double>(l2)) + " L2"
              : "");
}

// ---------------------------------------------------------------------------------------------
// Wisdom

WisdomMachine this_machine() { return {detect_host().cpu_model, cpu::isa_selection().target}; }

std::string wisdom_problem_class(const Problem& p, int cores) {
  std::string dt = dtype_name(p.qkv_dtype);
  std::transform(dt.begin(), dt.end(), dt.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::string(variant_name(p.variant)) + " K=" + std::to_string(p.K) + " V=" + std::to_string(p.V) + " " + dt +
         " threads=" + std::to_string(cores);
}

std::string default_wisdom_path() {
  if (const char* e = std::getenv("HANPU_WISDOM"); e && *e) return std::string(e) == "none" ? "" : e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/hanpu/wisdom.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/hanpu/wisdom.json";
  return "";
}

Wisdom wisdom_from_json(const json& j, const std::string& origin) {
  auto fail = [&](const std::string& field, const std::string& what) { throw Error(origin + ": " + field + ": " + what); };
  if (!j.is_object()) fail("(top level)", "got " + std::string(j.type_name()) + ", expected an object");
  if (!j.contains("schema") || !j.at("schema").is_string() || j.at("schema").get<std::string>() != kWisdomSchema)
    fail("schema", "got " + (j.contains("schema") ? j.at("schema").dump() : std::string("nothing")) + ", expected \"" + kWisdomSchema + "\"");
  if (!j.contains("entries") || !j.at("entries").is_array()) fail("entries", "expected an array");
  Wisdom w;
  const auto names = cpu_param_names();
  for (size_t i = 0; i < j.at("entries").size(); ++i) {
    const json& e = j.at("entries")[i];
    const std::string at = "entries[" + std::to_string(i) + "]";
    if (!e.is_object()) fail(at, "expected an object");
    auto str = [&](const char* key) {
      if (!e.contains(key) || !e.at(key).is_string()) fail(at + "." + key, "expected a string");
      return e.at(key).get<std::string>();
    };
    WisdomEntry we;
    we.machine.cpu_model = str("cpu_model");
    we.machine.isa = str("isa");
    we.problem_class = str("problem");
    we.measured = str("measured");
    if (!e.contains("params") || !e.at("params").is_object()) fail(at + ".params", "expected an object");
    for (const std::string& name : names) {
      const json& pj = e.at("params");
      if (!pj.contains(name) || !pj.at(name).is_number_integer())
        fail(at + ".params." + name, "got " + (pj.contains(name) ? pj.at(name).dump() : std::string("nothing")) + ", expected an integer");
      we.params.emplace_back(name, pj.at(name).get<int64_t>());
    }
    for (auto it = e.at("params").begin(); it != e.at("params").end(); ++it)
      if (std::find(names.begin(), names.end(), it.key()) == names.end()) fail(at + ".params." + it.key(), "unknown CPU parameter");
    if (e.contains("times")) we.times = e.at("times");
    w.entries.push_back(std::move(we));
  }
  return w;
}

json wisdom_to_json(const Wisdom& w) {
  json entries = json::array();
  for (const WisdomEntry& e : w.entries) {
    json params = json::object();
    for (const auto& [name, value] : e.params) params[name] = value;
    entries.push_back({{"cpu_model", e.machine.cpu_model},
                       {"isa", e.machine.isa},
                       {"problem", e.problem_class},
                       {"measured", e.measured},
                       {"params", params},
                       {"times", e.times}});
  }
  return {{"schema", kWisdomSchema}, {"entries", entries}};
}

Wisdom read_wisdom(const std::string& path, bool* exists) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    if (exists) *exists = false;
    return {};
  }
  if (exists) *exists = true;
  return wisdom_from_json(parse_json(read_regular_file(path, "wisdom file", kMaxWisdomBytes), path), path);
}

void write_wisdom_entry(const std::string& path, const WisdomEntry& entry) {
  Wisdom w = read_wisdom(path);
  bool replaced = false;
  for (WisdomEntry& e : w.entries)
    if (e.machine == entry.machine && e.problem_class == entry.problem_class) e = entry, replaced = true;
  if (!replaced) w.entries.push_back(entry);
  // The directory chain (~/.cache/hanpu): created as needed, an existing one is fine.
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    const std::string dir = path.substr(0, pos);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw Error(path + ": cannot create directory " + dir);
  }
  write_file_atomic(path, wisdom_to_json(w).dump(2) + "\n");
}

void apply_wisdom(CpuTuning& t, const Wisdom& w, const std::string& path, const Problem& p, int cores,
                  const WisdomMachine& machine) {
  const std::string cls = wisdom_problem_class(p, cores);
  const WisdomEntry* match = nullptr;
  std::vector<std::string> others;
  for (const WisdomEntry& e : w.entries) {
    if (e.problem_class != cls) continue;
    if (e.machine == machine) match = &e;
    else others.push_back(e.machine.cpu_model + " / " + e.machine.isa);
  }
  if (match) {
    for (const auto& [name, value] : match->params) {
      CpuParam& param = cpu_param(t, name);
      const std::string model = std::to_string(param.value);
      param.value = value;
      param.reason = "from wisdom " + path + ", measured " + match->measured + " (model-based: " + model + ")";
    }
    t.source = "wisdom " + path + ", measured " + match->measured;
    return;
  }
  if (others.empty()) return;
  std::string list;
  for (const std::string& o : others) list += (list.empty() ? "" : "; ") + o;
  const std::string why = "; wisdom " + path + " for " + cls + " is for another CPU or ISA (" + list + ", this is " +
                          machine.cpu_model + " / " + machine.isa + "), ignored";
  for (const std::string& name : cpu_param_names()) cpu_param(t, name).reason += why;
  t.source = "model (wisdom " + path + " is for another CPU or ISA)";
}

// ---------------------------------------------------------------------------------------------
// The planner's use

namespace plan_detail {

CpuTuning plan_cpu_tuning(const Problem& p, const Device& dev, int cores, const PlanOptions& opt) {
  CpuTuning t = model_cpu_tuning(p, dev, cores);
  // Wisdom describes the machine the process runs on, so only a plan for the host device reads it.
  if (dev.name == "host" && !opt.no_wisdom) {
    const std::string path = opt.wisdom_path.empty() ? default_wisdom_path() : opt.wisdom_path;
    if (!path.empty()) {
      apply_wisdom(t, read_wisdom(path), path, p, cores, this_machine());
      validate_cpu_tuning(t, p.V, path + ": the entry for " + wisdom_problem_class(p, cores) + ": params");
    }
  }
  if (opt.cpu)
    for (const std::string& name : cpu_param_names()) {
      const CpuParam& given = cpu_param(*opt.cpu, name);
      // Given: a value other than 0, or a reason (prefetch_rate 0, prefetch off, is a value).
      if (given.value == 0 && given.reason.empty()) continue;
      cpu_param(t, name) = {given.value, given.reason.empty() ? "given explicitly (PlanOptions.cpu)" : given.reason};
    }
  // The arena follows the group and column block finally chosen, unless given explicitly.
  if (opt.cpu && opt.cpu->arena_bytes.value != 0)
    t.arena_bytes = {opt.cpu->arena_bytes.value,
                     opt.cpu->arena_bytes.reason.empty() ? "given explicitly (PlanOptions.cpu)" : opt.cpu->arena_bytes.reason};
  else
    choose_cpu_arena(t, p, dev);
  validate_cpu_tuning(t, p.V, "PlanOptions.cpu");
  return t;
}

void order_blocks_for_lockstep(std::vector<PlanItem>& items) {
  // Within each run of whole-head items (tier 1) of one sequence, block b of every head before
  // block b + 1 of any: like column blocks of neighbouring heads become adjacent, so they can
  // share a lockstep group (their rows of one token lie side by side in q, k, v and o).
  for (size_t i = 0; i < items.size();) {
    size_t j = i;
    while (j < items.size() && items[j].tier == 1 && items[j].seq == items[i].seq) ++j;
    if (j == i) {
      ++i;
      continue;
    }
    std::stable_sort(items.begin() + static_cast<std::ptrdiff_t>(i), items.begin() + static_cast<std::ptrdiff_t>(j),
                     [](const PlanItem& a, const PlanItem& b) { return a.col0 < b.col0; });
    i = j;
  }
}

}  // namespace plan_detail

}  // namespace hanpu
