// `hanpu device` end to end: the table and the JSON of a device file, the host, and one-line errors
// with exit code 1 for bad files and bad arguments. The executable's path comes from CMake.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_support.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace {

namespace fs = std::filesystem;
using hanpu::testing::TempDir;

fs::path devices_dir() {
  if (const char* src = std::getenv("HANPU_SOURCE_DIR"); src && *src) return fs::path(src) / "devices";
  return fs::path(__FILE__).parent_path().parent_path() / "devices";
}

using hanpu::testing::read_text;
using RunResult = hanpu::testing::CommandResult;
std::string quote(const std::string& s) { return hanpu::testing::shell_quote(s); }

RunResult run_hanpu(const TempDir& dir, const std::string& args) {
  return hanpu::testing::run_command(dir, quote(HANPU_EXE) + " " + args);
}

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(DeviceCli, TableShowsEveryNumberWithStatusAndSource) {
  TempDir tmp;
  const RunResult r = run_hanpu(tmp, "device --device " + quote((devices_dir() / "ascend310p.json").string()));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"field", "status", "source", "cores", "confirmed", "HAMi", "alternative", "GM->L1 [MTE2, shared]",
                        "L0C->UB", "262144 (256 KiB)", "notes:", "kernel_boundary_us", "dma_setup_cycles",
                        "gm_segment_cycles", "pipe_sync_cycles", "vector_startup_cycles", "handoff_sync_cycles",
                        "framework_matmul_transdata_per_tensor"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(DeviceCli, JsonIsTheFile) {
  TempDir tmp;
  const fs::path file = devices_dir() / "ascend310b.json";
  const RunResult r = run_hanpu(tmp, "device --json --device " + quote(file.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(file);
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse(in));
}

TEST(DeviceCli, HostWithoutMeasurement) {
  TempDir tmp;
  const RunResult r = run_hanpu(tmp, "device --host --measure-seconds 0 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("kind"), "cpu");
  EXPECT_GE(j.at("cores").at("value").get<double>(), 1);
}

TEST(DeviceCli, BadInputIsOneLineAndExitCode1) {
  TempDir tmp;
  std::ifstream in(devices_dir() / "ascend310p.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["buffers"][2]["capacity_bytes"]["value"] = -1;
  const std::string bad = tmp.file("x.json");
  std::ofstream(bad) << j.dump(2);
  struct Case {
    std::string args, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"device --device " + quote(bad), "x.json: buffers[2].capacity_bytes.value: got -1, expected a positive integer"},
           {"device --device " + quote(tmp.file("missing.json")), "missing.json: cannot open device file"},
           {"device", "give exactly one of --device FILE or --host"},
           {"device --host --measure-seconds -1", "--measure-seconds: got -1"},
       }) {
    const RunResult r = run_hanpu(tmp, c.args);
    EXPECT_EQ(r.code, 1) << c.args;
    EXPECT_EQ(lines(r.err), 1u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
}

}  // namespace

namespace {

TEST(DeviceCli, CoresSelectsACoherentConfigurationOrNamesTheChoices) {
  TempDir dir;
  const std::string dev = quote((devices_dir() / "ascend310p.json").string());
  const RunResult eight = run_hanpu(dir, "simulate --device " + dev + " --T 256 --heads 8 --cores 8");
  ASSERT_EQ(eight.code, 0) << eight.err;
  EXPECT_NE(eight.out.find("(8 cores)"), std::string::npos) << eight.out;
  const RunResult nine = run_hanpu(dir, "simulate --device " + dev + " --T 256 --heads 8 --cores 9");
  EXPECT_EQ(nine.code, 1);
  EXPECT_EQ(lines(nine.err), 1u) << nine.err;
  EXPECT_NE(nine.err.find("--cores got 9"), std::string::npos) << nine.err;
  EXPECT_NE(nine.err.find("10 (default), 8 (hami-8-core)"), std::string::npos) << nine.err;
}

}  // namespace
