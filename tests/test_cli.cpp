// The `hanpu` executable end to end: bad input files and bad tensors must give a clean error (exit
// code non-zero, one message naming the file or tensor, no crash, no uncaught exception, no output
// file), good inputs must give FLA's results, and `hanpu bench --json` must print well-formed rows.
// The executable's path comes from CMake (HANPU_EXE).
#include <gtest/gtest.h>

#include "test_support.hpp"
#include "plan_testing.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "hanpu/tensor.hpp"
#include "io/safetensors.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace fs = std::filesystem;
using hanpu::DType;
using hanpu::SafetensorsFile;
using hanpu::Tensor;
using hanpu::TensorView;

using hanpu::testing::TempDir;
using hanpu::testing::golden_dir;

namespace {


std::string golden(const std::string& name) {
  const fs::path p = golden_dir() / (name + ".safetensors");
  if (!fs::is_regular_file(p)) ADD_FAILURE() << "golden file " << p << " is missing";
  return p.string();
}


using hanpu::testing::read_text;
using RunResult = hanpu::testing::CommandResult;
std::string quote(const std::string& s) { return hanpu::testing::shell_quote(s); }

// Runs `hanpu <args>` with stdout and stderr captured to files in `dir`.
RunResult run_hanpu(const TempDir& dir, const std::string& args) {
  return hanpu::testing::run_command(dir, quote(HANPU_EXE) + " " + args);
}

// Inputs of a small problem, FLA names; mutable before writing.
using Tensors = std::vector<std::pair<std::string, Tensor>>;

Tensor random_tensor(DType dt, std::vector<int64_t> shape, std::mt19937_64& rng, double lo, double hi) {
  Tensor t(dt, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// GDN (g [B,T,HV]) or KDA (g [B,T,HV,K]) inputs with B, T, H, HV, K, V.
Tensors make_inputs(bool kda, int64_t B = 1, int64_t T = 10, int64_t H = 2, int64_t HV = 2, int64_t K = 8,
                    int64_t V = 8) {
  std::mt19937_64 rng(7);
  Tensors t;
  t.emplace_back("q", random_tensor(DType::F32, {B, T, H, K}, rng, -0.3, 0.3));
  t.emplace_back("k", random_tensor(DType::F32, {B, T, H, K}, rng, -0.3, 0.3));
  t.emplace_back("v", random_tensor(DType::F32, {B, T, HV, V}, rng, -1, 1));
  if (kda)
    t.emplace_back("g", random_tensor(DType::F32, {B, T, HV, K}, rng, -1, 0));
  else
    t.emplace_back("g", random_tensor(DType::F32, {B, T, HV}, rng, -1, 0));
  t.emplace_back("beta", random_tensor(DType::F32, {B, T, HV}, rng, 0, 1));
  return t;
}

void set_tensor(Tensors& t, const std::string& name, Tensor x) {
  for (auto& [n, y] : t)
    if (n == name) {
      y = std::move(x);
      return;
    }
  t.emplace_back(name, std::move(x));
}

void remove_tensor(Tensors& t, const std::string& name) {
  std::erase_if(t, [&](const auto& p) { return p.first == name; });
}

Tensor cu_seqlens(std::vector<int64_t> offsets) {
  Tensor t(DType::I64, {static_cast<int64_t>(offsets.size())});
  for (size_t i = 0; i < offsets.size(); ++i) t.ptr<int64_t>()[i] = offsets[i];
  return t;
}

std::string write_inputs(const TempDir& dir, const std::string& name, const Tensors& t) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [n, x] : t) views.emplace_back(n, x.view());
  const std::string path = dir.file(name);
  hanpu::write_safetensors(path, views);
  return path;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A failed run: a clean error exit, the message names what is wrong, nothing crashed, and no
// output file appeared.
void expect_clean_failure(const TempDir& dir, const std::string& args, const std::vector<std::string>& must_name,
                          const std::string& out_path = "") {
  const RunResult r = run_hanpu(dir, args);
  SCOPED_TRACE("command: " + r.command + "\nstderr: " + r.err);
  std::printf("exit %d, stderr: %s", r.code, r.err.c_str());
  EXPECT_TRUE(r.exited) << "hanpu did not exit normally (killed by a signal?)";
  EXPECT_NE(r.code, 0) << "hanpu must fail";
  EXPECT_LT(r.code, 128) << "exit code looks like a signal";
  for (const std::string& s : must_name) EXPECT_NE(r.err.find(s), std::string::npos) << "stderr must mention " << s;
  for (const char* bad : {"Segmentation", "terminate called", "Aborted", "core dumped", "what():"})
    EXPECT_EQ(r.err.find(bad), std::string::npos) << "stderr contains '" << bad << "'";
  EXPECT_NE(r.err.find("hanpu: error:"), std::string::npos) << "expected hanpu's one-line error";
  if (!out_path.empty()) EXPECT_FALSE(fs::exists(out_path)) << "no output file may be written on failure";
}

// Runs `hanpu <variant> --in <in> --out <out> <extra>` on inputs and expects a clean failure
// whose message contains every string of must_name.
void expect_tensor_error(const TempDir& dir, const std::string& variant, const Tensors& t,
                         const std::vector<std::string>& must_name, const std::string& extra = "") {
  const std::string in = write_inputs(dir, "in.safetensors", t);
  const std::string out = dir.file("out.safetensors");
  std::error_code ec;
  fs::remove(out, ec);
  expect_clean_failure(dir, variant + " --in " + quote(in) + " --out " + quote(out) + " " + extra, must_name, out);
}

// ------------------------------------------------------------------------------------------------
// Bad files

TEST(SimulateCli, AStrategyThatExceedsGmStaysInTheTable) {
  // vLLM-Ascend (and FLA) at T = 1M need more GM than the 310P has: listed as "does not fit",
  // the others still simulated; a single such plan remains an error.
  TempDir dir;
  const std::string dev = "--device " + quote(hanpu::testing::device_path("ascend310p"));
  const RunResult r = run_hanpu(dir, "simulate " + dev + " --strategies all --T 1048576 --heads 16");
  ASSERT_TRUE(r.exited && r.code == 0) << r.err;
  // (vLLM-Ascend: its intermediates, per-chunk states and the NZ copies of its TransData kernels.)
  EXPECT_NE(r.out.find("vllm-ascend                    does not fit: needs 82.69 GiB of GM, the device has 24.00 GiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nhanpu  "), std::string::npos) << r.out;
  const RunResult j = run_hanpu(dir, "simulate " + dev + " --strategies all --T 1048576 --heads 16 --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const auto arr = nlohmann::json::parse(j.out);
  EXPECT_EQ(arr.at(0).at("fits"), false);
  EXPECT_GT(arr.at(0).at("needs_gm_bytes").get<int64_t>(), arr.at(0).at("device_gm_bytes").get<int64_t>());
  EXPECT_GT(arr.back().at("latency_ms").get<double>(), 0);
  const RunResult one = run_hanpu(dir, "simulate " + dev + " --strategy vllm-ascend --T 1048576 --heads 16");
  EXPECT_NE(one.code, 0);
  EXPECT_NE(one.err.find("bytes of device memory (GM)"), std::string::npos) << one.err;
}

TEST(SimulateCli, BufferPolicyFlag) {
  TempDir dir;
  const std::string dev = "--device " + quote(hanpu::testing::device_path("ascend310p"));
  const RunResult st = run_hanpu(dir, "simulate " + dev + " --strategy fla+mapping --T 1024 --heads 16 --buffer-policy static --json");
  ASSERT_EQ(st.code, 0) << st.err;
  const auto r = nlohmann::json::parse(st.out).at(0);
  EXPECT_EQ(r.at("buffer_policy"), "static");
  EXPECT_GT(r.at("static_spill_bytes").get<int64_t>(), 0);
  const RunResult bad = run_hanpu(dir, "simulate " + dev + " --buffer-policy greedy");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--buffer-policy"), std::string::npos) << bad.err;
}

TEST(CliErrors, MissingInputFile) {
  TempDir dir("hanpu_cli");
  const std::string in = dir.file("does_not_exist.safetensors"), out = dir.file("out.safetensors");
  expect_clean_failure(dir, "gdn --in " + quote(in) + " --out " + quote(out), {"does_not_exist.safetensors"}, out);
}

TEST(CliErrors, TruncatedFile) {
  TempDir dir("hanpu_cli");
  const std::string bytes = read_text(golden("gdn_basic"));
  ASSERT_GT(bytes.size(), 1000u);
  const std::string in = dir.file("truncated.safetensors"), out = dir.file("out.safetensors");
  write_bytes(in, bytes.substr(0, bytes.size() / 2));
  expect_clean_failure(dir, "gdn --in " + quote(in) + " --out " + quote(out), {"truncated.safetensors"}, out);
}

TEST(CliErrors, HeaderLengthLargerThanFile) {
  TempDir dir("hanpu_cli");
  std::string bytes(8, '\0');
  const uint64_t len = 4096;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(len >> (8 * i));
  bytes += "{}";
  const std::string in = dir.file("bad_header.safetensors"), out = dir.file("out.safetensors");
  write_bytes(in, bytes);
  expect_clean_failure(dir, "gdn --in " + quote(in) + " --out " + quote(out), {"bad_header.safetensors", "header"},
                       out);
}

TEST(CliErrors, MissingBeta) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  remove_tensor(t, "beta");
  expect_tensor_error(dir, "gdn", t, {"'beta'", "in.safetensors"});
}

// ------------------------------------------------------------------------------------------------
// Bad tensors

TEST(CliErrors, QRank3) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  set_tensor(t, "q", Tensor(DType::F32, {10, 2, 8}));
  expect_tensor_error(dir, "gdn", t, {"'q'", "rank 3"});
}

TEST(CliErrors, KShapeDiffersFromQ) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  set_tensor(t, "k", Tensor(DType::F32, {1, 10, 2, 16}));
  expect_tensor_error(dir, "gdn", t, {"'k'", "[1,10,2,16]"});
}

TEST(CliErrors, HvNotMultipleOfH) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false, 1, 10, /*H=*/2, /*HV=*/3);
  expect_tensor_error(dir, "gdn", t, {"'v'", "HV = 3", "H = 2"});
}

TEST(CliErrors, CuSeqlensNotStartingAtZero) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  set_tensor(t, "cu_seqlens", cu_seqlens({1, 5, 10}));
  expect_tensor_error(dir, "gdn", t, {"'cu_seqlens'", "starts at 1"});
}

TEST(CliErrors, CuSeqlensDecreasing) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  set_tensor(t, "cu_seqlens", cu_seqlens({0, 7, 4, 10}));
  expect_tensor_error(dir, "gdn", t, {"'cu_seqlens'", "decreases"});
}

TEST(CliErrors, CuSeqlensNotEndingAtT) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  set_tensor(t, "cu_seqlens", cu_seqlens({0, 4, 9}));
  expect_tensor_error(dir, "gdn", t, {"'cu_seqlens'", "ends at 9", "T = 10"});
}

TEST(CliErrors, CuSeqlensWithBatch2) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false, /*B=*/2);
  set_tensor(t, "cu_seqlens", cu_seqlens({0, 4, 10}));
  expect_tensor_error(dir, "gdn", t, {"cu_seqlens", "B = 2"});
}

TEST(CliErrors, KdaGateRank3) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(true);
  set_tensor(t, "g", Tensor(DType::F32, {1, 10, 2}));  // GDN's shape, not KDA's [B,T,HV,K]
  expect_tensor_error(dir, "kda", t, {"'g'", "[1,10,2]"});
}

TEST(CliErrors, GateInKernelWithoutALog) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  expect_tensor_error(dir, "gdn", t, {"A_log"}, "--gate-in-kernel");
}

TEST(CliErrors, InitialStateWrongShape) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false);
  set_tensor(t, "initial_state", Tensor(DType::F32, {1, 2, 8, 4}));
  expect_tensor_error(dir, "gdn", t, {"'initial_state'", "[1,2,8,4]"});
}

TEST(CliErrors, HeadDimTooLarge) {
  TempDir dir("hanpu_cli");
  Tensors t = make_inputs(false, 1, /*T=*/2, /*H=*/1, /*HV=*/1, /*K=*/300, /*V=*/8);
  expect_tensor_error(dir, "gdn", t, {"'q'", "K = 300"});
}

// The unmodified small inputs work, so every failure above is due to the one change it makes.
TEST(CliErrors, ControlCaseSucceeds) {
  TempDir dir("hanpu_cli");
  for (bool kda : {false, true}) {
    Tensors t = make_inputs(kda);
    const std::string in = write_inputs(dir, "in.safetensors", t), out = dir.file("out.safetensors");
    const RunResult r = run_hanpu(dir, std::string(kda ? "kda" : "gdn") + " --in " + quote(in) + " --out " + quote(out));
    EXPECT_TRUE(r.exited && r.code == 0) << r.command << "\n" << r.err;
    EXPECT_TRUE(fs::exists(out));
  }
}

// ------------------------------------------------------------------------------------------------
// Good runs

double nmse(const TensorView& x, const TensorView& ref) {
  const Tensor a = hanpu::copy_to_tensor(x), b = hanpu::copy_to_tensor(ref);
  if (a.shape() != b.shape()) return INFINITY;
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double u = a.get(i), r = b.get(i);
    if (!std::isfinite(u)) return INFINITY;
    num += (u - r) * (u - r);
    den += r * r;
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : num / den;
}

std::vector<int64_t> shape_of(const TensorView& t) { return std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank); }

TEST(CliRun, GdnBasicGoldenAllModes) {
  TempDir dir("hanpu_cli");
  const std::string in = golden("gdn_basic");
  const SafetensorsFile ref = SafetensorsFile::open(in);
  for (const std::string mode : {"", "--mode chunk", "--mode recurrent", "--mode fla --threads 2"}) {
    SCOPED_TRACE("mode: " + mode);
    const std::string out = dir.file("tmp.safetensors");
    std::error_code ec;
    fs::remove(out, ec);
    const RunResult r = run_hanpu(dir, "gdn --in " + quote(in) + " --out " + quote(out) + " " + mode);
    ASSERT_TRUE(r.exited) << r.command;
    ASSERT_EQ(r.code, 0) << r.command << "\n" << r.err;
    const SafetensorsFile f = SafetensorsFile::open(out);
    ASSERT_TRUE(f.has("o") && f.has("final_state"));
    const TensorView o = f.get("o"), st = f.get("final_state");
    EXPECT_EQ(o.dtype, DType::F32);
    EXPECT_EQ(st.dtype, DType::F32);
    EXPECT_EQ(shape_of(o), (std::vector<int64_t>{2, 75, 4, 32}));
    EXPECT_EQ(shape_of(st), (std::vector<int64_t>{2, 4, 32, 32}));
    const double eo = nmse(o, ref.get("o_ref")), es = nmse(st, ref.get("final_state_ref"));
    std::printf("hanpu gdn %-22s nmse(o) %.3g  nmse(final_state) %.3g\n", mode.empty() ? "(default)" : mode.c_str(), eo,
                es);
    EXPECT_LE(eo, 1e-9);
    EXPECT_LE(es, 1e-9);
  }
}

// --plan runs a plan made with `hanpu plan` for the host; --show-plan prints the plan a call ran
// and how the CPU executed it; a plan for other inputs or one with --mode is refused by name.
TEST(CliRun, GivenPlanAndShowPlan) {
  TempDir dir("hanpu_cli");
  const std::string in = golden("gdn_basic");  // B = 2, T = 75, H = 2, HV = 4, K = V = 32
  const SafetensorsFile ref = SafetensorsFile::open(in);
  const RunResult host = run_hanpu(dir, "device --host --threads 2 --measure-seconds 0 --json");
  ASSERT_TRUE(host.exited && host.code == 0) << host.err;
  const std::string host_json = dir.file("host.json");
  write_bytes(host_json, host.out);
  for (const auto& [strategy, how] : std::vector<std::pair<std::string, std::string>>{
           {"hanpu", "executed as: head-fused, 2 threads, gemm-first"}, {"fla", "executed as: FLA-style chunk path"}}) {
    SCOPED_TRACE(strategy);
    const std::string plan = dir.file(strategy + ".json"), out = dir.file("out.safetensors");
    const RunResult p = run_hanpu(dir, "plan --device " + quote(host_json) + " --variant gdn --T 75 --batch 2 --heads 2 "
                                       "--value-heads 4 --K 32 --V 32 --cores 2 --strategy " + strategy + " -o " + quote(plan));
    ASSERT_TRUE(p.exited && p.code == 0) << p.command << "\n" << p.err;
    const RunResult r = run_hanpu(dir, "gdn --in " + quote(in) + " --out " + quote(out) + " --plan " + quote(plan) + " --show-plan");
    ASSERT_TRUE(r.exited && r.code == 0) << r.command << "\n" << r.err;
    EXPECT_NE(r.err.find("plan from " + plan), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("plan " + strategy + " for gdn on host (2 cores)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(how), std::string::npos) << r.err;
    const SafetensorsFile f = SafetensorsFile::open(out);
    EXPECT_LE(nmse(f.get("o"), ref.get("o_ref")), 1e-9);
    EXPECT_LE(nmse(f.get("final_state"), ref.get("final_state_ref")), 1e-9);
  }
  // Without --plan: the host plan of this call, planned in this process.
  const RunResult d = run_hanpu(dir, "gdn --in " + quote(in) + " --out " + quote(dir.file("d.safetensors")) + " --threads 2 --show-plan");
  ASSERT_TRUE(d.exited && d.code == 0) << d.err;
  EXPECT_NE(d.err.find("planned for the host (planned in this call)"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("lockstep groups:"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("stages: gate state_k state_q grams mask solve output update"), std::string::npos) << d.err;
  // Refused: a plan for 76 tokens, and --plan with --mode.
  const std::string other = dir.file("other.json");
  ASSERT_EQ(run_hanpu(dir, "plan --device " + quote(host_json) + " --variant gdn --T 76 --batch 2 --heads 2 --value-heads 4 "
                           "--K 32 --V 32 --cores 2 -o " + quote(other)).code, 0);
  expect_clean_failure(dir, "gdn --in " + quote(in) + " --out " + quote(dir.file("x.safetensors")) + " --plan " + quote(other),
                       {"sequence lengths are [76,76] in the plan, [75,75] in the inputs"}, dir.file("x.safetensors"));
  expect_clean_failure(dir, "gdn --in " + quote(in) + " --out " + quote(dir.file("y.safetensors")) + " --plan " +
                                quote(dir.file("hanpu.json")) + " --mode recurrent",
                       {"--plan with --mode recurrent"}, dir.file("y.safetensors"));
}

TEST(CliRun, KdaGateVarlenGolden) {
  TempDir dir("hanpu_cli");
  const std::string in = golden("kda_gate_varlen"), out = dir.file("tmp.safetensors");
  const SafetensorsFile ref = SafetensorsFile::open(in);
  const RunResult r = run_hanpu(dir, "kda --in " + quote(in) + " --out " + quote(out) +
                                         " --gate-in-kernel --beta-sigmoid --threads 1");
  ASSERT_TRUE(r.exited && r.code == 0) << r.command << "\n" << r.err;
  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_LE(nmse(f.get("o"), ref.get("o_ref")), 1e-9);
  EXPECT_LE(nmse(f.get("final_state"), ref.get("final_state_ref")), 1e-9);
}

nlohmann::json run_bench_json(const TempDir& dir, const std::string& T) {
  const RunResult r = run_hanpu(dir, "bench --variant gdn --T " + T +
                                         " --heads 3 --dtype f32 --threads 1 --path hanpu,fla,recurrent --json "
                                         "--min-seconds 0");
  EXPECT_TRUE(r.exited && r.code == 0) << r.command << "\n" << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "bench stdout is not JSON: " << e.what() << "\n" << r.out;
    return nlohmann::json();
  }
}

TEST(CliBench, JsonRowsAndMemoryIndependentOfT) {
  TempDir dir("hanpu_cli");
  const nlohmann::json rows70 = run_bench_json(dir, "70");
  ASSERT_TRUE(rows70.is_array()) << rows70.dump();
  ASSERT_EQ(rows70.size(), 3u) << rows70.dump(2);
  std::map<std::string, uint64_t> extra70;
  const char* const keys[] = {"variant", "path",  "T",           "heads",         "K",          "V",          "dtype",
                              "threads", "ms",    "gflops",      "peak_gflops",   "peak_fraction", "extra_bytes"};
  for (const auto& row : rows70) {
    ASSERT_TRUE(row.is_object());
    for (const char* key : keys) EXPECT_TRUE(row.contains(key)) << "row lacks '" << key << "': " << row.dump();
    if (!row.contains("path") || !row.contains("extra_bytes")) continue;
    EXPECT_EQ(row.value("variant", ""), "gdn");
    EXPECT_EQ(row.value("T", 0), 70);
    EXPECT_EQ(row.value("heads", 0), 3);
    EXPECT_EQ(row.value("dtype", ""), "f32");
    EXPECT_EQ(row.value("threads", 0), 1);
    EXPECT_GT(row.value("ms", 0.0), 0.0);
    EXPECT_GT(row.value("gflops", 0.0), 0.0);
    EXPECT_GT(row.value("peak_gflops", 0.0), 0.0);
    EXPECT_GT(row.value("peak_fraction", 0.0), 0.0);
    extra70[row["path"].get<std::string>()] = row["extra_bytes"].get<uint64_t>();
  }
  EXPECT_EQ(extra70.size(), 3u) << "expected one row per path hanpu, fla, recurrent";

  const nlohmann::json rows700 = run_bench_json(dir, "700");
  ASSERT_TRUE(rows700.is_array() && rows700.size() == 3u) << rows700.dump(2);
  std::map<std::string, uint64_t> extra700;
  for (const auto& row : rows700) {
    EXPECT_EQ(row.value("T", 0), 700);
    extra700[row.value("path", "")] = row.value("extra_bytes", uint64_t{0});
  }
  std::printf("extra_bytes T=70 -> T=700: hanpu %llu -> %llu, fla %llu -> %llu, recurrent %llu -> %llu\n",
              static_cast<unsigned long long>(extra70["hanpu"]), static_cast<unsigned long long>(extra700["hanpu"]),
              static_cast<unsigned long long>(extra70["fla"]), static_cast<unsigned long long>(extra700["fla"]),
              static_cast<unsigned long long>(extra70["recurrent"]),
              static_cast<unsigned long long>(extra700["recurrent"]));
  // The head-fused path's working memory is per-thread arenas only: independent of T.
  EXPECT_EQ(extra70["hanpu"], extra700["hanpu"]);
  EXPECT_GT(extra70["hanpu"], 0u);
  // The FLA-style baseline keeps its chunk intermediates in main memory: grows with T.
  EXPECT_GT(extra700["fla"], extra70["fla"]);
}

TEST(CliBench, AblationRunsEveryStepForRealAndSimulated) {
  TempDir dir("hanpu_cli");
  const RunResult r =
      run_hanpu(dir, "bench --ablation --variant gdn,kda --T 130 --heads 3 --threads 2 --min-seconds 0 --json");
  ASSERT_TRUE(r.exited && r.code == 0) << r.command << "\n" << r.err;
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 8u) << rows.dump(2);  // 2 variants x 4 ablation steps
  const char* const steps[] = {"fla", "fla+mapping", "fla+mapping+reordering", "fla+mapping+reordering+layout"};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].value("step", ""), steps[i % 4]);
    EXPECT_EQ(rows[i].value("threads", 0), 2);
    EXPECT_GT(rows[i].value("cpu_ms", 0.0), 0.0);
    EXPECT_GT(rows[i].value("sim_latency_ms", 0.0), 0.0);
    EXPECT_GT(rows[i].value("sim_gm_bytes", 0.0), 0.0);
    const std::string how = rows[i].value("executed_as", "");
    EXPECT_NE(how.find(i % 4 == 0 ? "FLA-style" : "head-fused"), std::string::npos) << how;
  }
  // The FLA-style plan materializes its intermediates in memory; the head-mapped ones do not.
  EXPECT_GT(rows[0]["sim_gm_bytes"].get<double>(), rows[1]["sim_gm_bytes"].get<double>());
}

// bench-linear: bad arguments are one-line errors with exit code 1.
TEST(CliErrors, BenchLinearBadArguments) {
  TempDir dir("hanpu_cli");
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"bench-linear --K 64", "--N"}, {"bench-linear --K 64 --N 8 --mode fp8", "fp8"},
           {"bench-linear --K 64 --N 8 --backend gpu", "gpu"}, {"bench-linear --K 64 --N 8 --M 0", "--M"},
           {"bench-linear --model 3b", "--model"}}) {
    const RunResult r = run_hanpu(dir, args);
    EXPECT_TRUE(r.exited && r.code == 1) << r.command << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.command << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// The decode prefetch distance's environment override: a bad value is one line naming the
// variable, exit code 1, before any subcommand runs.
TEST(CliErrors, DecodePrefetchBytesEnvironment) {
  TempDir dir("hanpu_cli");
  for (const char* value : {"100", "-64", "abc", "131072"}) {
    const RunResult r =
        hanpu::testing::run_command(dir, std::string("HANPU_DECODE_PREFETCH_BYTES=") + value + " " + quote(HANPU_EXE) + " isa");
    EXPECT_TRUE(r.exited && r.code == 1) << r.command << "\n" << r.err;
    EXPECT_NE(r.err.find("HANPU_DECODE_PREFETCH_BYTES"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  const RunResult ok = hanpu::testing::run_command(dir, "HANPU_DECODE_PREFETCH_BYTES=0 " + quote(HANPU_EXE) + " isa");
  EXPECT_TRUE(ok.exited && ok.code == 0) << ok.command << "\n" << ok.err;
}

// Per-operator times exist only in a build with HANPU_OPERATOR_TIMERS (preset timers); a default
// build refuses the flag with a one-line error that says how to get such a build.
#ifndef HANPU_OPERATOR_TIMERS
TEST(CliErrors, BenchOperatorTimesNeedsTimersBuild) {
  TempDir dir("hanpu_cli");
  const RunResult r = run_hanpu(dir, "bench --operator-times --variant gdn --T 64 --heads 1 --threads 1");
  EXPECT_TRUE(r.exited && r.code == 1) << r.command << "\n" << r.err;
  EXPECT_NE(r.err.find("--operator-times"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--preset timers"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
#endif

}  // namespace
