// Device descriptions: strict JSON reading and writing (devices/*.json) and the host CPU in the same
// schema. The reader checks every field it knows and rejects every field it does not, so a typo in
// a device file is an error naming the field rather than a silently defaulted number; messages
// carry the file and the JSON path ("buffers[2].capacity_bytes.value").
#include "hanpu/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "io/file_io.hpp"
#include "io/json_io.hpp"

namespace hanpu {

namespace {

using nlohmann::json;

const std::set<std::string>& known_statuses() {
  static const std::set<std::string> s{"confirmed", "derived", "paper", "estimate", "detected", "measured"};
  return s;
}

// Dtypes a device may list that hanpu tensors do not have (integer Cube/SIMD formats); they are kept
// for reports in MatrixUnitSpec::macs_per_cycle_extra.
const std::set<std::string>& extra_dtype_names() {
  static const std::set<std::string> s{"INT8", "INT4"};
  return s;
}

/// What a number must satisfy; checked on the value and on every alternative.
enum class Constraint { kPositive, kPositiveInteger, kNonNegative, kPowerOfTwo };

const char* expectation(Constraint c) {
  switch (c) {
    case Constraint::kPositive: return "a positive number";
    case Constraint::kPositiveInteger: return "a positive integer";
    case Constraint::kNonNegative: return "a non-negative number";
    case Constraint::kPowerOfTwo: return "a positive power of two";
  }
  return "a number";
}

bool satisfies(double v, Constraint c) {
  if (!std::isfinite(v)) return false;
  const bool integral = v == std::floor(v);
  switch (c) {
    case Constraint::kPositive: return v > 0;
    case Constraint::kPositiveInteger: return v >= 1 && integral;
    case Constraint::kNonNegative: return v >= 0;
    case Constraint::kPowerOfTwo: {
      if (v < 1 || !integral || v > 9.007199254740992e15) return false;
      const auto u = static_cast<uint64_t>(v);
      return (u & (u - 1)) == 0;
    }
  }
  return false;
}

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Shortest form that reads back exactly: try fewer digits first.
  for (int digits = 1; digits <= 17; ++digits) {
    char shorter[64];
    std::snprintf(shorter, sizeof shorter, "%.*g", digits, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

/// A short rendering of a JSON value for error messages (strings quoted, long values cut).
std::string show(const json& j) {
  // Containers are summarised, never dumped (json_summary does not recurse).
  return j.is_number() ? format_number(j.get<double>()) : json_summary(j);
}

/// The optional fixed-cost fields (JSON key, member), read and written alike.
std::vector<std::pair<const char*, Quantity*>> fixed_cost_fields(Device& d) {
  return {{"kernel_boundary_us", &d.kernel_boundary_us},
          {"dma_setup_cycles", &d.dma_setup_cycles},
          {"gm_segment_cycles", &d.gm_segment_cycles},
          {"pipe_sync_cycles", &d.pipe_sync_cycles},
          {"vector_startup_cycles", &d.vector_startup_cycles},
          {"framework_matmul_transdata_per_tensor", &d.framework_matmul_transdata_per_tensor}};
}

/// Reads one device description, remembering the file for error messages.
class DeviceReader {
 public:
  explicit DeviceReader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw Error(origin_ + ": " + (path.empty() ? std::string("(top level)") : path) + ": " + msg);
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  void expect_type(const json& j, const std::string& path, json::value_t type, const char* name) const {
    const bool ok = type == json::value_t::number_float ? j.is_number() : j.type() == type;
    if (!ok) fail(path, std::string("got ") + j.type_name() + " " + show(j) + ", expected " + name);
  }

  void expect_object(const json& j, const std::string& path) const {
    expect_type(j, path, json::value_t::object, "an object");
  }

  /// Rejects keys outside `allowed` (typos would otherwise silently fall back to defaults).
  void only_keys(const json& obj, const std::string& path, std::initializer_list<const char*> allowed) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool known = false;
      for (const char* a : allowed) known = known || it.key() == a;
      if (known) continue;
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      fail(join(path, it.key()), "unknown field, expected one of: " + list);
    }
  }

  const json& field(const json& obj, const std::string& path, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(join(path, key), "missing field");
    return *it;
  }

  std::string string_field(const json& obj, const std::string& path, const char* key, bool required = true,
                           const std::string& fallback = "") const {
    if (!required && !obj.contains(key)) return fallback;
    const json& j = field(obj, path, key);
    expect_type(j, join(path, key), json::value_t::string, "a string");
    std::string s = j.get<std::string>();
    if (required && s.empty()) fail(join(path, key), "got an empty string, expected a non-empty string");
    return s;
  }

  bool bool_field(const json& obj, const std::string& path, const char* key, bool fallback) const {
    if (!obj.contains(key)) return fallback;
    const json& j = obj.at(key);
    expect_type(j, join(path, key), json::value_t::boolean, "true or false");
    return j.get<bool>();
  }

  Quantity quantity(const json& j, const std::string& path, Constraint c, bool allow_alternatives = true) const {
    expect_type(j, path, json::value_t::object, "an object {\"value\", \"source\", \"status\"}");
    if (allow_alternatives)
      only_keys(j, path, {"value", "source", "status", "alternatives"});
    else
      only_keys(j, path, {"value", "source", "status"});
    Quantity q;
    const json& v = field(j, path, "value");
    expect_type(v, join(path, "value"), json::value_t::number_float, "a number");
    q.value = v.get<double>();
    if (!satisfies(q.value, c)) fail(join(path, "value"), "got " + show(v) + ", expected " + expectation(c));
    q.source = string_field(j, path, "source");
    q.status = string_field(j, path, "status");
    if (!known_statuses().count(q.status))
      fail(join(path, "status"),
           "got \"" + q.status + "\", expected one of: confirmed, derived, paper, estimate, detected, measured");
    if (auto it = j.find("alternatives"); it != j.end()) {
      const std::string apath = join(path, "alternatives");
      expect_type(*it, apath, json::value_t::array, "an array of {\"value\", \"source\", \"status\"}");
      for (size_t i = 0; i < it->size(); ++i)
        q.alternatives.push_back(quantity((*it)[i], apath + "[" + std::to_string(i) + "]", c, false));
    }
    return q;
  }

  Quantity quantity_field(const json& obj, const std::string& path, const char* key, Constraint c) const {
    return quantity(field(obj, path, key), join(path, key), c);
  }

  /// A {dtype name: Quantity} object; names hanpu tensors have go to `typed`, INT8/INT4 to `extra`.
  void dtype_map(const json& obj, const std::string& path, const char* key, std::map<DType, Quantity>* typed,
                 std::map<std::string, Quantity>* extra) const {
    const json& m = field(obj, path, key);
    const std::string mpath = join(path, key);
    expect_object(m, mpath);
    if (m.empty()) fail(mpath, "got an empty object, expected at least one dtype (e.g. \"F16\")");
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string name = it.key();
      const Quantity q = quantity(it.value(), join(mpath, name), Constraint::kPositive);
      if (extra_dtype_names().count(name)) {
        if (!extra) fail(join(mpath, name), "unknown dtype, expected one of: F32, F16, BF16, F64, I32, I64");
        (*extra)[name] = q;
        continue;
      }
      DType dt;
      try {
        dt = dtype_from_name(name);
      } catch (const Error&) {
        fail(join(mpath, name), std::string("unknown dtype, expected one of: F32, F16, BF16, F64, I32, I64") +
                                    (extra ? ", INT8, INT4" : ""));
      }
      (*typed)[dt] = q;
    }
  }

  Device read(const json& j) const {
    expect_object(j, "");
    only_keys(j, "", {"schema_version", "name", "kind", "description", "cores", "clock_ghz", "matrix", "vector",
                      "buffers", "paths", "gm_bytes", "kernel_launch_us", "static_power_w", "handoff_sync_cycles", "kernel_boundary_us",
                      "dma_setup_cycles", "gm_segment_cycles", "pipe_sync_cycles", "vector_startup_cycles",
                      "framework_matmul_transdata_per_tensor", "notes",
                      "core_configurations", "cpu"});
    if (auto it = j.find("schema_version"); it != j.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() != 1)
        fail("schema_version", "got " + show(*it) + ", expected 1");
    }
    Device d;
    d.name = string_field(j, "", "name");
    const std::string kind = string_field(j, "", "kind");
    if (kind != "npu" && kind != "cpu") fail("kind", "got \"" + kind + "\", expected \"npu\" or \"cpu\"");
    d.kind = kind == "cpu" ? DeviceKind::Cpu : DeviceKind::Npu;
    if (j.contains("cpu")) {
      if (d.kind != DeviceKind::Cpu) fail("cpu", "a device of kind \"npu\" has no CPU facts");
      const json& c = j.at("cpu");
      expect_object(c, "cpu");
      only_keys(c, "cpu", {"model", "isa", "bf16_gram"});
      d.cpu.model = string_field(c, "cpu", "model");
      d.cpu.isa = string_field(c, "cpu", "isa");
      d.cpu.bf16_gram = bool_field(c, "cpu", "bf16_gram", false);
    }
    d.description = string_field(j, "", "description", false);
    d.cores = quantity_field(j, "", "cores", Constraint::kPositiveInteger);
    d.clock_ghz = quantity_field(j, "", "clock_ghz", Constraint::kPositive);
    d.gm_bytes = quantity_field(j, "", "gm_bytes", Constraint::kPositiveInteger);
    d.kernel_launch_us = quantity_field(j, "", "kernel_launch_us", Constraint::kNonNegative);
    d.static_power_w = quantity_field(j, "", "static_power_w", Constraint::kNonNegative);
    if (j.contains("handoff_sync_cycles"))
      d.handoff_sync_cycles = quantity_field(j, "", "handoff_sync_cycles", Constraint::kNonNegative);
    for (auto [key, q] : fixed_cost_fields(d))
      if (j.contains(key)) *q = quantity_field(j, "", key, Constraint::kNonNegative);

    // Buffers first: the units and paths below refer to them by name.
    const json& bufs = field(j, "", "buffers");
    expect_type(bufs, "buffers", json::value_t::array, "an array of buffers");
    if (bufs.empty()) fail("buffers", "got an empty array, expected at least one buffer");
    for (size_t i = 0; i < bufs.size(); ++i) {
      const std::string p = "buffers[" + std::to_string(i) + "]";
      expect_object(bufs[i], p);
      only_keys(bufs[i], p, {"name", "capacity_bytes", "alignment_bytes", "reserved_bytes", "per_core"});
      BufferSpec b;
      b.name = string_field(bufs[i], p, "name");
      if (b.name == "GM") fail(join(p, "name"), "got \"GM\", which is reserved for the device's global memory");
      for (const BufferSpec& prev : d.buffers)
        if (prev.name == b.name) fail(join(p, "name"), "got \"" + b.name + "\" twice, expected unique buffer names");
      b.capacity_bytes = quantity_field(bufs[i], p, "capacity_bytes", Constraint::kPositiveInteger);
      b.alignment_bytes = quantity_field(bufs[i], p, "alignment_bytes", Constraint::kPowerOfTwo);
      if (bufs[i].contains("reserved_bytes")) {
        b.reserved_bytes = quantity_field(bufs[i], p, "reserved_bytes", Constraint::kNonNegative);
        if (b.reserved_bytes.value >= b.capacity_bytes.value)
          fail(join(p, "reserved_bytes.value"), "got " + show(bufs[i]["reserved_bytes"]["value"]) + ", expected less than capacity_bytes.value");
      }
      b.per_core = bool_field(bufs[i], p, "per_core", true);
      d.buffers.push_back(std::move(b));
    }
    auto known_buffer = [&](const std::string& name) {
      return std::any_of(d.buffers.begin(), d.buffers.end(), [&](const BufferSpec& b) { return b.name == name; });
    };
    auto buffer_list = [&](bool with_gm) {
      std::string s = with_gm ? "GM" : "";
      for (const BufferSpec& b : d.buffers) s += (s.empty() ? "" : ", ") + b.name;
      return s;
    };
    auto expect_buffer = [&](const std::string& name, const std::string& path, bool gm_ok) {
      if ((gm_ok && name == "GM") || known_buffer(name)) return;
      fail(path, "got \"" + name + "\", expected a buffer of this device (" + buffer_list(gm_ok) + ")");
    };

    const json& mat = field(j, "", "matrix");
    expect_object(mat, "matrix");
    only_keys(mat, "matrix",
              {"tile_m", "tile_k", "tile_n", "macs_per_cycle", "input_a", "input_b", "output", "operand_layout",
               "runs_on_vector_unit", "energy_pj_per_mac"});
    d.matrix.tile_m = quantity_field(mat, "matrix", "tile_m", Constraint::kPositiveInteger);
    d.matrix.tile_k = quantity_field(mat, "matrix", "tile_k", Constraint::kPositiveInteger);
    d.matrix.tile_n = quantity_field(mat, "matrix", "tile_n", Constraint::kPositiveInteger);
    dtype_map(mat, "matrix", "macs_per_cycle", &d.matrix.macs_per_cycle, &d.matrix.macs_per_cycle_extra);
    d.matrix.input_a = string_field(mat, "matrix", "input_a");
    d.matrix.input_b = string_field(mat, "matrix", "input_b");
    d.matrix.output = string_field(mat, "matrix", "output");
    expect_buffer(d.matrix.input_a, "matrix.input_a", false);
    expect_buffer(d.matrix.input_b, "matrix.input_b", false);
    expect_buffer(d.matrix.output, "matrix.output", false);
    const std::string layout = string_field(mat, "matrix", "operand_layout", false, "blocked");
    if (layout != "blocked" && layout != "dense")
      fail("matrix.operand_layout", "got \"" + layout + "\", expected \"blocked\" or \"dense\"");
    d.matrix.operand_layout = layout == "dense" ? OperandLayout::Dense : OperandLayout::Blocked;
    d.matrix.runs_on_vector_unit = bool_field(mat, "matrix", "runs_on_vector_unit", false);
    d.matrix.energy_pj_per_mac = quantity_field(mat, "matrix", "energy_pj_per_mac", Constraint::kNonNegative);

    const json& vec = field(j, "", "vector");
    expect_object(vec, "vector");
    only_keys(vec, "vector", {"lanes", "buffer", "energy_pj_per_op", "transform_row_elements", "registers"});
    dtype_map(vec, "vector", "lanes", &d.vector.lanes, nullptr);
    d.vector.buffer = string_field(vec, "vector", "buffer");
    expect_buffer(d.vector.buffer, "vector.buffer", false);
    d.vector.energy_pj_per_op = quantity_field(vec, "vector", "energy_pj_per_op", Constraint::kNonNegative);
    if (vec.contains("transform_row_elements"))
      d.vector.transform_row_elements = quantity_field(vec, "vector", "transform_row_elements", Constraint::kPositive);
    if (vec.contains("registers"))
      d.vector.registers = quantity_field(vec, "vector", "registers", Constraint::kPositive);

    const json& paths = field(j, "", "paths");
    expect_type(paths, "paths", json::value_t::array, "an array of data paths");
    for (size_t i = 0; i < paths.size(); ++i) {
      const std::string p = "paths[" + std::to_string(i) + "]";
      expect_object(paths[i], p);
      only_keys(paths[i], p, {"from", "to", "engine", "bandwidth_gbs", "shared", "energy_pj_per_byte"});
      PathSpec ps;
      ps.from = string_field(paths[i], p, "from");
      ps.to = string_field(paths[i], p, "to");
      expect_buffer(ps.from, join(p, "from"), true);
      expect_buffer(ps.to, join(p, "to"), true);
      if (ps.from == ps.to) fail(join(p, "to"), "got \"" + ps.to + "\", expected a memory other than \"from\"");
      for (const PathSpec& prev : d.paths)
        if (prev.from == ps.from && prev.to == ps.to)
          fail(p, "got path " + ps.name() + " twice, expected each path once");
      ps.engine = string_field(paths[i], p, "engine");
      ps.bandwidth_gbs = quantity_field(paths[i], p, "bandwidth_gbs", Constraint::kPositive);
      ps.shared = bool_field(paths[i], p, "shared", false);
      ps.energy_pj_per_byte = quantity_field(paths[i], p, "energy_pj_per_byte", Constraint::kNonNegative);
      d.paths.push_back(std::move(ps));
    }

    if (auto it = j.find("core_configurations"); it != j.end()) {
      expect_type(*it, "core_configurations", json::value_t::array, "an array of {\"name\", \"cores\", \"clock_ghz\", \"path_bandwidth_gbs\"}");
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string p = "core_configurations[" + std::to_string(i) + "]";
        const json& cj = (*it)[i];
        expect_object(cj, p);
        only_keys(cj, p, {"name", "cores", "clock_ghz", "path_bandwidth_gbs"});
        CoreConfiguration c;
        c.name = string_field(cj, p, "name");
        c.cores = quantity_field(cj, p, "cores", Constraint::kPositiveInteger);
        c.clock_ghz = quantity_field(cj, p, "clock_ghz", Constraint::kPositive);
        if (c.cores.value == d.cores.value)
          fail(join(p, "cores.value"), "got " + show(cj["cores"]["value"]) + ", the default's core count; expected another count (the default is the top-level configuration)");
        for (const CoreConfiguration& prev : d.core_configurations)
          if (prev.cores.value == c.cores.value)
            fail(join(p, "cores.value"), "got " + show(cj["cores"]["value"]) + " twice, expected one configuration per core count");
        if (auto bw = cj.find("path_bandwidth_gbs"); bw != cj.end()) {
          const std::string bpath = join(p, "path_bandwidth_gbs");
          expect_object(*bw, bpath);
          for (auto b = bw->begin(); b != bw->end(); ++b) {
            const bool known = std::any_of(d.paths.begin(), d.paths.end(), [&](const PathSpec& ps) { return ps.name() == b.key(); });
            if (!known) fail(join(bpath, b.key()), "got a path this device does not have, expected one of its paths (\"FROM->TO\")");
            c.path_bandwidth_gbs[b.key()] = quantity(b.value(), join(bpath, b.key()), Constraint::kPositive);
          }
        }
        d.core_configurations.push_back(std::move(c));
      }
    }

    if (auto it = j.find("notes"); it != j.end()) {
      expect_type(*it, "notes", json::value_t::array, "an array of strings");
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string p = "notes[" + std::to_string(i) + "]";
        expect_type((*it)[i], p, json::value_t::string, "a string");
        d.notes.push_back((*it)[i].get<std::string>());
      }
    }
    return d;
  }

 private:
  std::string origin_;
};

/// Integral values are written as JSON integers so files round-trip without "8.0".
json number_to_json(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) return static_cast<int64_t>(v);
  return v;
}

json quantity_to_json(const Quantity& q) {
  json j = {{"value", number_to_json(q.value)}, {"source", q.source}, {"status", q.status}};
  if (!q.alternatives.empty()) {
    json alts = json::array();
    for (const Quantity& a : q.alternatives) alts.push_back(quantity_to_json(a));
    j["alternatives"] = alts;
  }
  return j;
}

}  // namespace

const BufferSpec& Device::buffer(const std::string& buffer_name) const {
  for (const BufferSpec& b : buffers)
    if (b.name == buffer_name) return b;
  std::string have;
  for (const BufferSpec& b : buffers) have += (have.empty() ? "" : ", ") + b.name;
  throw Error("device " + name + ": no buffer named \"" + buffer_name + "\" (it has " + have + ")");
}

bool Device::has_path(const std::string& from, const std::string& to) const {
  return std::any_of(paths.begin(), paths.end(), [&](const PathSpec& p) { return p.from == from && p.to == to; });
}

const PathSpec& Device::path(const std::string& from, const std::string& to) const {
  for (const PathSpec& p : paths)
    if (p.from == from && p.to == to) return p;
  std::string have;
  for (const PathSpec& p : paths) have += (have.empty() ? "" : ", ") + p.name();
  throw Error("device " + name + ": no data path " + from + "->" + to + " (it has " + have + ")");
}

double Device::matrix_macs_per_cycle(DType dt) const {
  auto it = matrix.macs_per_cycle.find(dt);
  if (it != matrix.macs_per_cycle.end()) return it->second.value;
  std::string have;
  for (const auto& [d, q] : matrix.macs_per_cycle) have += (have.empty() ? "" : ", ") + std::string(dtype_name(d));
  throw Error("device " + name + ": the matrix unit takes no " + dtype_name(dt) + " inputs (it takes " + have + ")");
}

double Device::vector_lanes(DType dt) const {
  auto it = vector.lanes.find(dt);
  if (it != vector.lanes.end()) return it->second.value;
  std::string have;
  for (const auto& [d, q] : vector.lanes) have += (have.empty() ? "" : ", ") + std::string(dtype_name(d));
  throw Error("device " + name + ": the vector unit has no " + dtype_name(dt) + " lanes (it has " + have + ")");
}

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::Cpu ? "cpu" : "npu"; }
const char* operand_layout_name(OperandLayout l) { return l == OperandLayout::Dense ? "dense" : "blocked"; }

std::string Device::staging_buffer() const {
  // An NPU whose matrix engine works on the vector unit's own memory (AIE-ML's tile data memory)
  // stages nothing: operands are read where the vector unit left them.
  if (kind == DeviceKind::Npu && matrix.input_a == vector.buffer && matrix.input_b == vector.buffer) return vector.buffer;
  for (const BufferSpec& b : buffers)
    if (has_path(b.name, matrix.input_a) && has_path(b.name, matrix.input_b)) return b.name;
  return matrix.input_a;
}

Device device_from_json(const nlohmann::json& j, const std::string& origin) {
  return DeviceReader(origin).read(j);
}

Device load_device(const std::string& path) {
  // The project's JSON layer (io/json_io.hpp): regular files only, nesting limited, duplicate
  // keys (a repeated "value" in a hand-edited file) rejected with their JSON pointer.
  const json j = parse_json(read_regular_file(path, "device file", kMaxJsonFileBytes), path);
  return device_from_json(j, path);
}

nlohmann::json device_to_json(const Device& d) {
  json j;
  j["schema_version"] = 1;
  j["name"] = d.name;
  j["kind"] = device_kind_name(d.kind);
  j["description"] = d.description;
  j["cores"] = quantity_to_json(d.cores);
  j["clock_ghz"] = quantity_to_json(d.clock_ghz);
  json macs = json::object();
  for (const auto& [dt, q] : d.matrix.macs_per_cycle) macs[dtype_name(dt)] = quantity_to_json(q);
  for (const auto& [name, q] : d.matrix.macs_per_cycle_extra) macs[name] = quantity_to_json(q);
  j["matrix"] = {{"tile_m", quantity_to_json(d.matrix.tile_m)},
                 {"tile_k", quantity_to_json(d.matrix.tile_k)},
                 {"tile_n", quantity_to_json(d.matrix.tile_n)},
                 {"macs_per_cycle", macs},
                 {"input_a", d.matrix.input_a},
                 {"input_b", d.matrix.input_b},
                 {"output", d.matrix.output},
                 {"operand_layout", operand_layout_name(d.matrix.operand_layout)},
                 {"energy_pj_per_mac", quantity_to_json(d.matrix.energy_pj_per_mac)}};
  if (d.matrix.runs_on_vector_unit) j["matrix"]["runs_on_vector_unit"] = true;
  json lanes = json::object();
  for (const auto& [dt, q] : d.vector.lanes) lanes[dtype_name(dt)] = quantity_to_json(q);
  j["vector"] = {{"lanes", lanes},
                 {"buffer", d.vector.buffer},
                 {"energy_pj_per_op", quantity_to_json(d.vector.energy_pj_per_op)}};
  if (!d.vector.transform_row_elements.source.empty())
    j["vector"]["transform_row_elements"] = quantity_to_json(d.vector.transform_row_elements);
  if (!d.vector.registers.source.empty()) j["vector"]["registers"] = quantity_to_json(d.vector.registers);
  json bufs = json::array();
  for (const BufferSpec& b : d.buffers) {
    json bj = {{"name", b.name},
               {"capacity_bytes", quantity_to_json(b.capacity_bytes)},
               {"alignment_bytes", quantity_to_json(b.alignment_bytes)},
               {"per_core", b.per_core}};
    if (!b.reserved_bytes.source.empty()) bj["reserved_bytes"] = quantity_to_json(b.reserved_bytes);
    bufs.push_back(bj);
  }
  j["buffers"] = bufs;
  json paths = json::array();
  for (const PathSpec& p : d.paths)
    paths.push_back({{"from", p.from},
                     {"to", p.to},
                     {"engine", p.engine},
                     {"bandwidth_gbs", quantity_to_json(p.bandwidth_gbs)},
                     {"shared", p.shared},
                     {"energy_pj_per_byte", quantity_to_json(p.energy_pj_per_byte)}});
  j["paths"] = paths;
  j["gm_bytes"] = quantity_to_json(d.gm_bytes);
  j["kernel_launch_us"] = quantity_to_json(d.kernel_launch_us);
  j["static_power_w"] = quantity_to_json(d.static_power_w);
  if (!d.handoff_sync_cycles.source.empty()) j["handoff_sync_cycles"] = quantity_to_json(d.handoff_sync_cycles);
  Device fixed = d;  // fixed_cost_fields names the members of a mutable device
  for (auto [key, q] : fixed_cost_fields(fixed))
    if (!q->source.empty()) j[key] = quantity_to_json(*q);
  j["notes"] = d.notes;
  if (d.kind == DeviceKind::Cpu && d.cpu != CpuFacts{})
    j["cpu"] = {{"model", d.cpu.model}, {"isa", d.cpu.isa}, {"bf16_gram", d.cpu.bf16_gram}};
  if (!d.core_configurations.empty()) {
    json confs = json::array();
    for (const CoreConfiguration& c : d.core_configurations) {
      json bw = json::object();
      for (const auto& [path, q] : c.path_bandwidth_gbs) bw[path] = quantity_to_json(q);
      confs.push_back({{"name", c.name}, {"cores", quantity_to_json(c.cores)}, {"clock_ghz", quantity_to_json(c.clock_ghz)},
                       {"path_bandwidth_gbs", bw}});
    }
    j["core_configurations"] = confs;
  }
  return j;
}

Device device_with_cores(const Device& d, int cores) {
  if (cores == d.core_count()) return d;
  if (d.core_configurations.empty()) {
    // No coherent alternatives described (the host CPU: its cores are threads at one clock).
    Device out = d;
    out.cores.value = cores;
    return out;
  }
  for (const CoreConfiguration& c : d.core_configurations) {
    if (static_cast<int>(c.cores.value) != cores) continue;
    Device out = d;
    // The default becomes an alternative of the result, so the choice stays reversible and visible.
    CoreConfiguration old_default;
    old_default.name = "default";
    old_default.cores = d.cores;
    old_default.clock_ghz = d.clock_ghz;
    for (const auto& [path, q] : c.path_bandwidth_gbs)
      for (const PathSpec& ps : d.paths)
        if (ps.name() == path) old_default.path_bandwidth_gbs[path] = ps.bandwidth_gbs;
    out.cores = c.cores;
    out.clock_ghz = c.clock_ghz;
    for (PathSpec& ps : out.paths) {
      auto it = c.path_bandwidth_gbs.find(ps.name());
      if (it != c.path_bandwidth_gbs.end()) ps.bandwidth_gbs = it->second;
    }
    out.core_configurations.clear();
    out.core_configurations.push_back(old_default);
    for (const CoreConfiguration& other : d.core_configurations)
      if (&other != &c) out.core_configurations.push_back(other);
    return out;
  }
  std::string choices = std::to_string(d.core_count()) + " (default)";
  for (const CoreConfiguration& c : d.core_configurations)
    choices += ", " + std::to_string(static_cast<int>(c.cores.value)) + " (" + c.name + ")";
  throw Error("device " + d.name + ": --cores got " + std::to_string(cores) +
              ", expected a core count the device file describes as a coherent configuration: " + choices);
}

}  // namespace hanpu
