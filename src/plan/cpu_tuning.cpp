// The CPU part of a Plan (include/hanpu/cpu_tuning.hpp) as data: its JSON edge, its ranges, and the
// wisdom file `hanpu tune` writes and callers load for the planner. The choice of the values is
// the CPU backend's (src/cpu/cpu_planning.cpp), next to the kernels whose facts it uses.
#include "hanpu/cpu_tuning.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "hanpu/device.hpp"
#include "hanpu/plan.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;

constexpr const char* kWisdomSchema = "hanpu-wisdom-1";
// Wisdom files are a few KiB; anything near this is not one.
constexpr uint64_t kMaxWisdomBytes = 16u << 20;

// Ranges the plan alone decides (the CPU refuses shapes beyond its compiled tile separately).
constexpr int64_t kMaxLockstepGroup = 64;     // max_lockstep_group's own cap (src/plan/mapping.cpp)
constexpr int64_t kMaxGemmRows = 16;          // no target's register file holds taller tiles
constexpr int64_t kMaxGemmVectors = 8;        // 8 vectors: a whole 128-column row of AVX-512
constexpr int64_t kMaxPrefetchRate = 16;      // 16x the even share issues a chunk's lines in ~6 tiles
constexpr int64_t kMaxArenaBytes = int64_t{1} << 30;  // 64 states of 128 x 128 (4 MiB) are far below

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

// ---------------------------------------------------------------------------------------------
// Wisdom

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

}  // namespace hanpu
