// Device descriptions: the committed device files load and round-trip through JSON, the host is
// described sanely, and every kind of malformed file is rejected with the file and the field named.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "hanpu/host_device.hpp"
#include "hanpu/device.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

using nlohmann::json;

std::filesystem::path devices_dir() {
  if (const char* src = std::getenv("HANPU_SOURCE_DIR"); src && *src) return std::filesystem::path(src) / "devices";
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "devices";
}

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

TEST(Device, Ascend310pLoads) {
  const Device d = load_device((devices_dir() / "ascend310p.json").string());
  EXPECT_EQ(d.name, "ascend310p");
  EXPECT_EQ(d.kind, DeviceKind::Npu);
  // The paper's setup is the default; HAMi's 8 stays visible and usable as a coherent set.
  EXPECT_EQ(d.core_count(), 10);
  EXPECT_EQ(d.cores.status, "paper");
  ASSERT_EQ(d.cores.alternatives.size(), 1u);
  EXPECT_EQ(d.cores.alternatives[0].value, 8);
  EXPECT_EQ(d.cores.alternatives[0].status, "confirmed");
  ASSERT_EQ(d.core_configurations.size(), 1u);
  EXPECT_EQ(d.core_configurations[0].cores.value, 8);
  EXPECT_EQ(d.buffer("UB").capacity_bytes.value, 256 * 1024);
  EXPECT_EQ(d.buffer("L1").capacity_bytes.value, 1024 * 1024);
  EXPECT_EQ(d.buffer("L0A").capacity_bytes.value, 64 * 1024);
  EXPECT_EQ(d.buffer("UB").alignment_bytes.value, 32);
  EXPECT_EQ(d.matrix.macs_per_cycle.at(DType::F16).value, 4096);
  EXPECT_EQ(d.matrix.macs_per_cycle_extra.at("INT8").value, 8192);
  EXPECT_EQ(d.vector.lanes.at(DType::F16).value, 128);
  EXPECT_EQ(d.vector.lanes.at(DType::F32).value, 64);
  // 310P: Cube results go to UB; there is no L0C->GM route.
  EXPECT_TRUE(d.has_path("L0C", "UB"));
  EXPECT_FALSE(d.has_path("L0C", "GM"));
  for (const char* p : {"GM->L1", "GM->UB", "UB->GM", "UB->L1", "L1->L0A", "L1->L0B", "L1->UB"}) {
    const std::string s = p;
    const auto arrow = s.find("->");
    EXPECT_TRUE(d.has_path(s.substr(0, arrow), s.substr(arrow + 2))) << s;
  }
  EXPECT_EQ(d.path("GM", "L1").bandwidth_gbs.value, 95);
  EXPECT_EQ(d.path("GM", "L1").bandwidth_gbs.status, "paper");
  EXPECT_TRUE(d.path("GM", "L1").shared);
  EXPECT_FALSE(d.path("UB", "L1").shared);
  EXPECT_EQ(d.path("UB", "L1").engine, "MTE3");
  EXPECT_EQ(d.path("L1", "L0A").engine, "MTE1");
  EXPECT_FALSE(d.notes.empty());
}

TEST(Device, Ascend310bLoads) {
  const Device d = load_device((devices_dir() / "ascend310b.json").string());
  EXPECT_EQ(d.name, "ascend310b");
  EXPECT_EQ(d.core_count(), 1);
  EXPECT_EQ(d.clock_ghz.value, 0.5);
  EXPECT_TRUE(d.has_path("L0C", "GM"));
  EXPECT_FALSE(d.has_path("L0C", "UB"));
  EXPECT_TRUE(d.path("L0C", "GM").shared);
  // Numbers not found publicly are estimates and say so.
  EXPECT_EQ(d.buffer("L1").capacity_bytes.status, "estimate");
  EXPECT_NE(d.buffer("L1").capacity_bytes.source.find("not found"), std::string::npos);
}

TEST(Device, EveryNumberHasSourceAndStatus) {
  for (const char* f : {"ascend310p.json", "ascend310b.json", "xdna-phoenix.json"}) {
    const Device d = load_device((devices_dir() / f).string());
    auto check = [&](const Quantity& q, const std::string& what) {
      EXPECT_FALSE(q.source.empty()) << f << " " << what;
      EXPECT_FALSE(q.status.empty()) << f << " " << what;
    };
    for (const BufferSpec& b : d.buffers) check(b.capacity_bytes, b.name);
    for (const PathSpec& p : d.paths) {
      check(p.bandwidth_gbs, p.name());
      check(p.energy_pj_per_byte, p.name());
      EXPECT_FALSE(p.engine.empty()) << p.name();
    }
    check(d.matrix.energy_pj_per_mac, "energy_pj_per_mac");
    check(d.static_power_w, "static_power_w");
    // The simulator's mechanism constants and the coherent core sets carry theirs too.
    for (const BufferSpec& b : d.buffers)
      if (b.reserved_bytes.value > 0) check(b.reserved_bytes, b.name + ".reserved_bytes");
    check(d.vector.transform_row_elements, "vector.transform_row_elements");
    check(d.handoff_sync_cycles, "handoff_sync_cycles");
    // The fixed costs the simulator charges per event (the Ascend files calibrate three of them).
    if (std::string(f).rfind("ascend", 0) == 0) {
      check(d.kernel_boundary_us, "kernel_boundary_us");
      check(d.dma_setup_cycles, "dma_setup_cycles");
      check(d.gm_segment_cycles, "gm_segment_cycles");
      check(d.pipe_sync_cycles, "pipe_sync_cycles");
      check(d.vector_startup_cycles, "vector_startup_cycles");
    }
    for (const CoreConfiguration& c : d.core_configurations) {
      check(c.cores, c.name + ".cores");
      check(c.clock_ghz, c.name + ".clock_ghz");
      for (const auto& [path, q] : c.path_bandwidth_gbs) check(q, c.name + "." + path);
    }
  }
}

TEST(Device, ACoreCountBringsItsOwnClockAndBandwidths) {
  const Device d = load_device((devices_dir() / "ascend310p.json").string());
  // The chip peak (140 TOPS INT8) is the same in both sets: cores x clock is conserved.
  const Device eight = device_with_cores(d, 8);
  EXPECT_EQ(eight.core_count(), 8);
  EXPECT_DOUBLE_EQ(eight.clock_ghz.value, 1.068);
  EXPECT_EQ(eight.clock_ghz.status, "derived");
  EXPECT_NEAR(eight.core_count() * eight.clock_ghz.value, d.core_count() * d.clock_ghz.value, 0.01);
  EXPECT_EQ(eight.path("L0C", "UB").bandwidth_gbs.value, 274);
  EXPECT_EQ(d.path("L0C", "UB").bandwidth_gbs.value, 218.75);
  // Paths the set does not list keep their (clock-independent) numbers.
  EXPECT_EQ(eight.path("GM", "L1").bandwidth_gbs.value, d.path("GM", "L1").bandwidth_gbs.value);
  // Reversible: the old default is now a configuration of the result.
  const Device back = device_with_cores(eight, 10);
  EXPECT_EQ(back.clock_ghz.value, d.clock_ghz.value);
  EXPECT_EQ(back.path("L0C", "UB").bandwidth_gbs.value, 218.75);
  EXPECT_EQ(device_with_cores(d, 10).clock_ghz.value, d.clock_ghz.value);
  // A count without a coherent set is an error naming the choices.
  try {
    (void)device_with_cores(d, 9);
    FAIL() << "9 cores accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("got 9"), std::string::npos) << m;
    EXPECT_NE(m.find("10 (default)"), std::string::npos) << m;
    EXPECT_NE(m.find("8 (hami-8-core)"), std::string::npos) << m;
  }
}

void expect_error_naming(const json& j, const std::string& field) {
  try {
    (void)device_from_json(j, "x.json");
    ADD_FAILURE() << "accepted a file with a bad " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: " + field), std::string::npos) << e.what();
  }
}

TEST(Device, MalformedCoreConfigurationsNameTheField) {
  json j = read_json(devices_dir() / "ascend310p.json");
  json bad = j;
  bad["core_configurations"][0]["path_bandwidth_gbs"]["L0C->GM"] = bad["core_configurations"][0]["path_bandwidth_gbs"]["L0C->UB"];
  expect_error_naming(bad, "core_configurations[0].path_bandwidth_gbs.L0C->GM");
  bad = j;
  bad["core_configurations"][0]["cores"]["value"] = 10;
  expect_error_naming(bad, "core_configurations[0].cores.value");
  bad = j;
  bad["core_configurations"][0].erase("clock_ghz");
  expect_error_naming(bad, "core_configurations[0].clock_ghz");
}

TEST(Device, RoundTripReproducesTheFiles) {
  for (const char* f : {"ascend310p.json", "ascend310b.json", "xdna-phoenix.json"}) {
    const json original = read_json(devices_dir() / f);
    const json written = device_to_json(device_from_json(original, f));
    EXPECT_EQ(written, original) << f << "\nwritten:\n" << written.dump(2);
    // And once more through text, as a file would be.
    EXPECT_EQ(device_to_json(device_from_json(json::parse(written.dump()), f)), original) << f;
  }
}

TEST(Device, OptionalFieldsRoundTripSemantically) {
  // A file that leaves out what has a default (schema_version, description, per_core, shared,
  // notes) describes the same device as one that writes them out.
  json full = read_json(devices_dir() / "ascend310p.json");
  json minimal = full;
  minimal.erase("schema_version");
  minimal.erase("description");
  minimal.erase("notes");
  for (json& b : minimal["buffers"]) b.erase("per_core");  // all true, the default
  for (json& p : minimal["paths"])
    if (!p["shared"].get<bool>()) p.erase("shared");
  full["description"] = "";
  full["notes"] = json::array();
  EXPECT_EQ(device_to_json(device_from_json(minimal, "minimal.json")), full);
}

TEST(Device, HostIsSane) {
  const Device d = host_device(0, 0.0);  // no measurement: seconds, not a benchmark
  EXPECT_EQ(d.kind, DeviceKind::Cpu);
  EXPECT_GE(d.core_count(), 1);
  EXPECT_GT(d.clock_ghz.value, 0);
  EXPECT_GT(d.buffer("L1D").capacity_bytes.value, 0);
  EXPECT_GT(d.buffer("L2").capacity_bytes.value, 0);
  EXPECT_GE(d.buffer("L2").capacity_bytes.value, d.buffer("L1D").capacity_bytes.value);
  EXPECT_TRUE(d.has_path("GM", "L2"));
  EXPECT_TRUE(d.path("GM", "L2").shared);
  EXPECT_GT(d.matrix.macs_per_cycle.at(DType::F32).value, 0);
  EXPECT_EQ(d.matrix.macs_per_cycle.at(DType::F32).status, "estimate");  // not measured
  EXPECT_GT(d.gm_bytes.value, 0);
  // The host's description passes the same validation as a device file.
  const json j = device_to_json(d);
  EXPECT_EQ(device_to_json(device_from_json(j, "host")), j);

  const Device two = host_device(2, 0.0);
  EXPECT_EQ(two.core_count(), 2);
  EXPECT_EQ(two.cores.status, "confirmed");
}

TEST(Device, HostMeasuredNumbersAreMarkedMeasured) {
  const Device d = host_device(1, 0.1);
  const Quantity& macs = d.matrix.macs_per_cycle.at(DType::F32);
  EXPECT_GT(macs.value, 0);
  EXPECT_TRUE(macs.status == "measured" || macs.status == "estimate") << macs.status;
  EXPECT_EQ(d.path("GM", "L2").bandwidth_gbs.status, "measured");
  EXPECT_GT(d.path("GM", "L2").bandwidth_gbs.value, 0);
}

TEST(Device, LookupErrorsNameTheMissingThing) {
  const Device d = load_device((devices_dir() / "ascend310p.json").string());
  try {
    d.buffer("L2");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"L2\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.matrix_macs_per_cycle(DType::F16), 4096);
  EXPECT_EQ(d.vector_lanes(DType::F32), 64);
  try {
    d.matrix_macs_per_cycle(DType::F32);  // the Cube takes F16/INT8 only
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no F32 inputs (it takes F16)"), std::string::npos) << e.what();
  }
  try {
    d.path("L0C", "GM");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("L0C->GM"), std::string::npos) << e.what();
  }
}

struct Malformed {
  const char* what;
  std::function<void(json&)> mutate;
  const char* expected;  // must appear in the message, after "x.json: "
};

TEST(Device, MalformedFilesNameTheField) {
  const json good = read_json(devices_dir() / "ascend310p.json");
  const std::vector<Malformed> cases = {
      {"missing cores", [](json& j) { j.erase("cores"); }, "cores: missing field"},
      {"negative capacity", [](json& j) { j["buffers"][2]["capacity_bytes"]["value"] = -1; },
       "buffers[2].capacity_bytes.value: got -1, expected a positive integer"},
      {"fractional cores", [](json& j) { j["cores"]["value"] = 8.5; },
       "cores.value: got 8.5, expected a positive integer"},
      {"clock as string", [](json& j) { j["clock_ghz"]["value"] = "fast"; },
       "clock_ghz.value: got string \"fast\", expected a number"},
      {"no source", [](json& j) { j["clock_ghz"].erase("source"); }, "clock_ghz.source: missing field"},
      {"no status", [](json& j) { j["gm_bytes"].erase("status"); }, "gm_bytes.status: missing field"},
      {"unknown status", [](json& j) { j["gm_bytes"]["status"] = "rumour"; },
       "gm_bytes.status: got \"rumour\", expected one of"},
      {"path to unknown buffer", [](json& j) { j["paths"][0]["to"] = "L9"; },
       "paths[0].to: got \"L9\", expected a buffer of this device"},
      {"matrix input unknown", [](json& j) { j["matrix"]["input_a"] = "L7"; }, "matrix.input_a: got \"L7\""},
      {"operand layout unknown", [](json& j) { j["matrix"]["operand_layout"] = "nz"; },
       "matrix.operand_layout: got \"nz\", expected \"blocked\" or \"dense\""},
      {"vector buffer unknown", [](json& j) { j["vector"]["buffer"] = "GM"; }, "vector.buffer: got \"GM\""},
      {"duplicate buffer", [](json& j) { j["buffers"][1]["name"] = "UB"; },
       "buffers[1].name: got \"UB\" twice"},
      {"zero bandwidth", [](json& j) { j["paths"][3]["bandwidth_gbs"]["value"] = 0; },
       "paths[3].bandwidth_gbs.value: got 0, expected a positive number"},
      {"non-positive clock", [](json& j) { j["clock_ghz"]["value"] = -1.5; },
       "clock_ghz.value: got -1.5, expected a positive number"},
      {"alignment not a power of two", [](json& j) { j["buffers"][0]["alignment_bytes"]["value"] = 48; },
       "buffers[0].alignment_bytes.value: got 48, expected a positive power of two"},
      {"negative fixed cost", [](json& j) { j["dma_setup_cycles"]["value"] = -5; },
       "dma_setup_cycles.value: got -5, expected a non-negative number"},
      {"fixed cost without source", [](json& j) { j["pipe_sync_cycles"].erase("source"); }, "pipe_sync_cycles.source: missing field"},
      {"misspelt fixed cost", [](json& j) { j["dma_setup_cycle"] = j["dma_setup_cycles"]; }, "dma_setup_cycle: unknown field"},
      {"alternative without status", [](json& j) { j["cores"]["alternatives"][0].erase("status"); },
       "cores.alternatives[0].status: missing field"},
      {"alternative violating the constraint", [](json& j) { j["cores"]["alternatives"][0]["value"] = 0; },
       "cores.alternatives[0].value: got 0, expected a positive integer"},
      {"misspelled field", [](json& j) { j["buffers"][0]["capacity"] = j["buffers"][0]["capacity_bytes"]; },
       "buffers[0].capacity: unknown field"},
      {"unknown dtype", [](json& j) { j["vector"]["lanes"]["F99"] = j["vector"]["lanes"]["F16"]; },
       "vector.lanes.F99: unknown dtype"},
      {"INT8 lanes are not a tensor dtype", [](json& j) { j["vector"]["lanes"]["INT8"] = j["vector"]["lanes"]["F16"]; },
       "vector.lanes.INT8: unknown dtype"},
      {"wrong kind", [](json& j) { j["kind"] = "gpu"; }, "kind: got \"gpu\""},
      {"duplicate path", [](json& j) { j["paths"].push_back(j["paths"][0]); }, "paths[8]: got path GM->L1 twice"},
      {"path to itself", [](json& j) { j["paths"][0]["to"] = "GM"; }, "paths[0].to: got \"GM\", expected a memory other"},
      {"buffers not an array", [](json& j) { j["buffers"] = json::object(); }, "buffers: got object"},
      {"bool as number", [](json& j) { j["matrix"]["macs_per_cycle"]["F16"]["value"] = true; },
       "matrix.macs_per_cycle.F16.value: got boolean true, expected a number"},
      {"quantity as bare number", [](json& j) { j["static_power_w"] = 25; },
       "static_power_w: got number 25, expected an object"},
      {"shared not boolean", [](json& j) { j["paths"][0]["shared"] = "yes"; }, "paths[0].shared: got string"},
      {"empty source", [](json& j) { j["cores"]["source"] = ""; }, "cores.source: got an empty string"},
      {"note not a string", [](json& j) { j["notes"][1] = 3; }, "notes[1]: got number 3, expected a string"},
      {"buffer named GM", [](json& j) { j["buffers"][4]["name"] = "GM"; }, "buffers[4].name: got \"GM\""},
      {"wrong schema version", [](json& j) { j["schema_version"] = 2; }, "schema_version: got 2, expected 1"},
  };
  for (const Malformed& c : cases) {
    json j = good;
    c.mutate(j);
    try {
      device_from_json(j, "x.json");
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("x.json: ", 0), 0u) << c.what << ": " << msg;
      EXPECT_NE(msg.find(std::string("x.json: ") + c.expected), std::string::npos)
          << c.what << "\n  got:      " << msg << "\n  expected: " << c.expected;
    }
  }
}

TEST(Device, LoadDeviceReportsFileProblems) {
  testing::TempDir tmp;
  const std::string bad = tmp.file("bad.json");
  std::ofstream(bad) << "{\"name\": \"x\",";
  try {
    load_device(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ": not valid JSON"), std::string::npos) << e.what();
  }
  const std::string dup = tmp.file("dup.json");
  std::ofstream(dup) << R"({"name": "x", "cores": {"value": 8, "value": 10, "source": "s", "status": "paper"}})";
  try {
    load_device(dup);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dup + ": /cores: duplicate key \"value\", expected each key once"),
              std::string::npos)
        << e.what();
  }
  try {
    load_device(tmp.file("missing.json"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json: cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hanpu
