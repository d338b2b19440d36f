// Regression tests of issue 15 ("every bad input a clear error"), one suite per class of failure:
// Crash, Hang, Silent, Unclear, Outputs, Paths. Each test feeds the input that failed before and
// checks the clear error (file/tensor/field, what it got, what it expected) or the right behaviour.
// Inputs that used to block forever (FIFOs, thread creation failures) run in a forked child with
// an alarm, so a regression fails the test instead of hanging the suite.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "cpu/thread_pool.hpp"
#include "hanpu/device.hpp"
#include "hanpu/la.hpp"
#include "hanpu/model.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/reference.hpp"
#include "hanpu/simulate.hpp"
#include "hanpu/tokenizer.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"
#include "io/safetensors.hpp"
#include "la_testing.hpp"
#include "registry_testing.hpp"
#include "test_support.hpp"

namespace hanpu {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::TempDir;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "missing \"" << (needle) << "\" in: " << (haystack)

std::string device_file() { return (testing::golden_dir().parent_path().parent_path() / "devices" / "ascend310p.json").string(); }

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string deep_json(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Runs fn (returning a message) in a forked child with an alarm: "HANG" if the alarm fired.
template <typename F>
std::string in_child(F fn, unsigned seconds = 20) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(seconds);
    std::string msg;
    try {
      msg = fn();
    } catch (const std::exception& e) {
      msg = std::string("unexpected exception: ") + e.what();
    }
    const ssize_t ignored = ::write(fds[1], msg.data(), msg.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGALRM ? "HANG" : "child killed by signal " + std::to_string(WTERMSIG(status));
  return out;
}

// --- Crash ---------------------------------------------------------------------------------------

// A value nested 100,000 deep used to overflow the stack in every JSON reader but the safetensors
// header; now each stops at 256 levels with an error naming the file, and the message stays short.
TEST(Crash, DeeplyNestedJsonIsAnErrorInEveryReader) {
  TempDir tmp("hanpu_bad");
  const std::string deep = deep_json(100000);
  const std::string nested_obj = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(100000, '}');
    return s;
  }();
  const std::string dev = tmp.file("device.json"), plan = tmp.file("plan.json"), tok = tmp.file("tokenizer.json");
  write_text(dev, deep);
  write_text(plan, nested_obj);
  write_text(tok, "{\"model\": " + deep + "}");
  for (const auto& [what, msg, file] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"device", error_of([&] { load_device(dev); }), dev},
           {"plan", error_of([&] { plan_from_json(read_json_file(plan), plan); }), plan},
           {"plan text", error_of([&] { parse_json(nested_obj, "plan JSON"); }), "plan JSON"},
           {"config", error_of([&] { parse_qwen_config("{\"text_config\": " + deep + "}", "config.json"); }), "config.json"},
           {"tokenizer", error_of([&] { Tokenizer::from_file(tok); }), tok}}) {
    SCOPED_TRACE(what);
    EXPECT_CONTAINS(msg, file);
    EXPECT_CONTAINS(msg, "nested deeper than 256 levels");
    EXPECT_LT(msg.size(), 400u) << "the message dumps the value";
  }
  // 256 levels are accepted (the limit is exact, not approximate).
  EXPECT_NO_THROW(parse_json(deep_json(256), "x"));
  EXPECT_CONTAINS(error_of([] { parse_json(deep_json(257), "x"); }), "nested deeper than 256");
}

TEST(Crash, DeeplyNestedCheckpointIndexIsAnError) {
  TempDir tmp("hanpu_bad");
  const fs::path src = testing::golden_dir() / "qwen35_tiny";
  fs::copy_file(src / "config.json", tmp.path() / "config.json");
  write_text(tmp.file("model.safetensors.index.json"), "{\"weight_map\": " + deep_json(100000) + "}");
  const std::string msg = error_of([&] { HybridModel::load(tmp.path().string()); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "nested deeper than 256 levels");
}

// --- Hang ----------------------------------------------------------------------------------------

// The OS refusing worker N used to leave workers 1..N-1 waiting on a pool whose constructor threw.
TEST(Hang, ThreadPoolCreationFailureJoinsWorkersAndThrows) {
  const std::string out = in_child([] {
    ThreadPool::fail_thread_creation_for_testing(3);
    std::string msg = error_of([] { ThreadPool pool(6); });
    ThreadPool::fail_thread_creation_for_testing(0);
    ThreadPool pool(4);  // still usable afterwards
    std::atomic<int> ran{0};
    pool.run(4, [&](int) { ++ran; });
    return msg + "|ran=" + std::to_string(ran.load());
  });
  EXPECT_NE(out, "HANG") << "the pool blocked after a failed thread creation";
  EXPECT_CONTAINS(out, "thread pool: cannot create worker thread 3 of 6");
  EXPECT_CONTAINS(out, "|ran=4");
}

TEST(Hang, ThreadPoolCreationFailureUnderRlimitNproc) {
  // The real failure: a child process whose RLIMIT_NPROC is below the threads it asks for. Root
  // ignores the limit, so a child of root first becomes the unprivileged user "nobody" (65534),
  // whose few processes are far below the limit's other side (CI runs as root).
  const std::string out = in_child([] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0))
      return std::string("cannot drop root privileges to uid 65534: ") + std::strerror(errno);
    struct rlimit rl {};
    ::getrlimit(RLIMIT_NPROC, &rl);
    rl.rlim_cur = 1;
    ::setrlimit(RLIMIT_NPROC, &rl);
    return error_of([] { ThreadPool pool(8); });
  });
  EXPECT_NE(out, "HANG");
  EXPECT_CONTAINS(out, "thread pool: cannot create worker thread");
}

// A FIFO given as an input used to block forever in open(); now it is an error naming the file.
TEST(Hang, FifoInputsAreRefused) {
  TempDir tmp("hanpu_bad");
  const std::string fifo = tmp.file("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path ckpt = tmp.path() / "ckpt";
  fs::create_directories(ckpt);
  ASSERT_EQ(::mkfifo((ckpt / "config.json").c_str(), 0600), 0);
  const std::string shard_ckpt = (tmp.path() / "ckpt2").string();
  fs::create_directories(shard_ckpt);
  fs::copy_file(testing::golden_dir() / "qwen35_tiny" / "config.json", fs::path(shard_ckpt) / "config.json");
  ASSERT_EQ(::mkfifo((fs::path(shard_ckpt) / "model.safetensors").c_str(), 0600), 0);
  const std::string out = in_child([&] {
    std::string all;
    all += error_of([&] { load_device(fifo); }) + "\n";
    all += error_of([&] { read_json_file(fifo); }) + "\n";
    all += error_of([&] { Tokenizer::from_file(fifo); }) + "\n";
    all += error_of([&] { SafetensorsFile::open(fifo); }) + "\n";
    all += error_of([&] { HybridModel::load(ckpt.string()); }) + "\n";
    all += error_of([&] { HybridModel::load(shard_ckpt); }) + "\n";
    return all;
  });
  ASSERT_NE(out, "HANG") << "a FIFO input blocked";
  std::istringstream lines(out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    SCOPED_TRACE("reader " + std::to_string(n++));
    EXPECT_CONTAINS(line, "is a FIFO, expected a regular file");
    EXPECT_TRUE(line.find("fifo.json") != std::string::npos || line.find("config.json") != std::string::npos ||
                line.find("model.safetensors") != std::string::npos)
        << line;
  }
  EXPECT_EQ(n, 6);
}

// simulate --T 1e9, --V 1e9, plan --T 1e12 used to run for minutes; now validate_problem refuses
// them at once, naming the field and the limit.
TEST(Hang, HugeProblemSizesAreRefusedBeforePlanning) {
  const Device dev = load_device(device_file());
  struct Case {
    std::function<void(Problem&)> edit;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {[](Problem& p) { p.seqlens = {1000000000}; }, "problem.seqlens[0] (T): got 1000000000, expected at most 2097152"},
           {[](Problem& p) { p.seqlens = {1000000000000}; }, "expected at most 2097152 tokens"},
           {[](Problem& p) { p.seqlens.assign(100, 2000000); }, "at most 2097152 tokens in total"},
           {[](Problem& p) { p.V = 1000000000; }, "problem.V: got 1000000000, expected 1..1024"},
           {[](Problem& p) { p.K = 1000000000; }, "problem.K: got 1000000000"},
           {[](Problem& p) { p.H = p.HV = 100000; }, "problem.H: got 100000, expected 1..1024"},
           {[](Problem& p) { p.seqlens.assign(100000, 1); }, "100000 sequences, expected at most 65536"},
           {[](Problem& p) { p.seqlens = {2097152}; p.H = p.HV = 1024; }, "HV x chunks"}}) {
    Problem p;
    p.seqlens = {4096};
    c.edit(p);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { make_plan(p, dev, "hanpu"); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    EXPECT_CONTAINS(msg, c.needle);
  }
  // The largest allowed single sequence still plans and simulates (in about a second; 8 heads so
  // that it fits the device's 24 GiB).
  Problem p;
  p.seqlens = {kMaxTokens};
  p.H = p.HV = 8;
  EXPECT_NO_THROW(simulate(make_plan(p, dev, "hanpu"), dev));
}

TEST(Hang, ConfigWithHugeSizesIsRefusedBeforeLooping) {
  const std::string cfg = testing::read_text((testing::golden_dir() / "qwen35_tiny" / "config.json").string());
  for (const auto& [key, value, needle] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"num_hidden_layers", "1000000000000000", "expected a positive integer at most 1024"},
           {"vocab_size", "100000000000", "at most 16777216"},
           {"hidden_size", "18446744073709551615", "at most 65536"},
           {"intermediate_size", "-5", "is an integer -5, expected a positive integer"},
           // found by fuzz_config_json: 0 (stored unsigned) passed and divided by zero
           {"num_key_value_heads", "0", "is an integer 0, expected a positive integer"},
           {"linear_num_key_heads", "0", "is an integer 0, expected a positive integer"}}) {
    json j = json::parse(cfg);
    json& text = j.contains("text_config") ? j["text_config"] : j;
    text[key] = json::parse(value);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { parse_qwen_config(j.dump(), "config.json"); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    EXPECT_CONTAINS(msg, "config 'config.json'");
    EXPECT_CONTAINS(msg, key);
    EXPECT_CONTAINS(msg, needle);
  }
}

// Found by fuzz_tokenizer_json: a vocabulary id of 107,333,333 (in int32 range) sized the id
// tables to 107 M entries (3.4 GB) before anything else was checked.
TEST(Hang, TokenizerWithHugeTokenIdIsRefusedBeforeAllocating) {
  TempDir tmp("hanpu_bad");
  json j = json::parse(testing::read_text((testing::golden_dir() / "qwen35_tiny" / "tokenizer.json").string()));
  j["model"]["vocab"]["zzz"] = 107333333;
  const std::string path = tmp.file("tokenizer.json");
  write_text(path, j.dump());
  const std::string msg = error_of([&] { Tokenizer::from_file(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "model.vocab[\"zzz\"]\" is 107333333, expected a token id (integer 0..16777215)");
}

// --- Silent --------------------------------------------------------------------------------------

// NaN in g used to act as -inf on the chunk and FLA-style paths (a finite wrong answer) while the
// recurrent path and the reference gave NaN. Policy: non-finite gates are an error on every path.
TEST(Silent, NonFiniteGateIsAnErrorOnEveryPath) {
  for (Variant variant : testing::every_variant()) {
    testing::ProblemSpec spec;
    spec.variant = variant;
    spec.T = 100;
    spec.H = 2, spec.HV = 2, spec.K = 32, spec.V = 32;
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      for (const char* tensor : {"g", "beta"}) {
        testing::Problem prob = testing::make_problem(spec);
        Tensor& t = std::string(tensor) == "g" ? prob.g : prob.beta;
        // element [0, 70, 1(, 3)]: in the second chunk, second head
        const int64_t flat = variant == Variant::KDA && t.shape().size() == 4 ? (70 * 2 + 1) * 32 + 3 : 70 * 2 + 1;
        static_cast<float*>(t.data())[flat] = bad;
        const std::string at = variant == Variant::KDA && t.shape().size() == 4 ? "[0,70,1,3]" : "[0,70,1]";
        const std::string kind = std::isnan(bad) ? "NaN" : bad > 0 ? "+Inf" : "-Inf";
        const LaInputs in = prob.inputs();
        SCOPED_TRACE(std::string(variant_name(variant)) + " " + tensor + " " + kind);
        std::vector<std::pair<std::string, std::string>> msgs;
        msgs.emplace_back("reference", error_of([&] { la_reference(variant, in, spec.opt); }));
        for (CpuPath path : {CpuPath::HeadFused, CpuPath::FlaChunk, CpuPath::Recurrent}) {
          ExecOptions ex;
          ex.path = path;
          ex.threads = 2;
          msgs.emplace_back(cpu_path_name(path), error_of([&] { la_prefill_alloc(variant, in, spec.opt, ex); }));
        }
        for (const auto& [path, msg] : msgs) {
          SCOPED_TRACE(path);
          EXPECT_CONTAINS(msg, std::string("tensor '") + tensor + "' has " + kind + " at index " + at);
          EXPECT_CONTAINS(msg, "expected finite values");
        }
      }
    }
  }
}

TEST(Silent, NanInGateIsAnErrorInDecode) {
  testing::ProblemSpec spec;
  spec.T = 1;
  spec.H = spec.HV = 2;
  spec.K = spec.V = 16;
  testing::Problem prob = testing::make_problem(spec);
  static_cast<float*>(prob.g.data())[1] = std::numeric_limits<float>::quiet_NaN();
  Tensor state(DType::F32, {1, 2, 16, 16});
  Tensor o(DType::F32, {1, 1, 2, 16});
  EXPECT_CONTAINS(error_of([&] { gdn_decode(prob.inputs(), spec.opt, state.view(), o.view(), 1); }), "tensor 'g' has NaN at index [0,0,1]");
}

// nlohmann keeps the last of duplicate keys: two tensors of one name used to be read as one.
// A safetensors file: the 8-byte little-endian header length, the header, `payload` zero bytes.
std::string safetensors_bytes(const std::string& header, size_t payload) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + std::string(payload, '\0');
}

TEST(Silent, DuplicateSafetensorsTensorNamesAreRejected) {
  TempDir tmp("hanpu_bad");
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  const std::string path = tmp.file("dup.safetensors");
  write_text(path, safetensors_bytes(header, 8));
  const std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "duplicate key \"w\", expected each key once");
}

TEST(Silent, DuplicateKeysAreRejectedInEveryJsonFile) {
  EXPECT_CONTAINS(error_of([] { parse_json(R"({"a": {"b": 1, "b": 2}})", "f.json"); }), "f.json: /a: duplicate key \"b\"");
  EXPECT_CONTAINS(error_of([] { parse_json(R"([0, {"x": 1, "x": 1}])", "f.json"); }), "f.json: /1: duplicate key \"x\"");
  const std::string cfg = testing::read_text((testing::golden_dir() / "qwen35_tiny" / "config.json").string());
  const std::string twice = "{\"model_type\": \"x\", " + cfg.substr(cfg.find('{') + 1);
  EXPECT_CONTAINS(error_of([&] { parse_qwen_config(twice, "config.json"); }), "duplicate key \"model_type\"");
}

// hanpu's plan of a small GDN problem (256 tokens, 4 heads) on `dev`, as JSON.
json small_plan_json(const Device& dev) {
  Problem p;
  p.seqlens = {256};
  p.H = p.HV = 4;
  return plan_to_json(make_plan(p, dev, "hanpu"));
}

// Plan JSON used to be trusted: integers cut to 32 bits, lifetimes past the steps, negative peaks.
TEST(Silent, PlanJsonIntegersAndRangesAreValidated) {
  const Device dev = load_device(device_file());
  const json good = small_plan_json(dev);
  ASSERT_NO_THROW(plan_from_json(good, "plan.json"));
  struct Case {
    std::function<void(json&)> edit;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {[](json& j) { j["kernels"][0]["cores"][0][0][1] = 4294967296ll; },
            "plan.kernels[0].cores[0][0][1] (head): got 4294967296, expected an integer in [0, 2147483647]"},
           {[](json& j) { j["cores"] = 4294967297ll; }, "plan.cores: got 4294967297, expected an integer in [1, 4096]"},
           {[](json& j) { j["kernels"][0]["buffering"] = 4294967297ll; }, "plan.kernels[0].buffering: got 4294967297"},
           {[](json& j) { j["kernels"][0]["lifetimes"][0]["last"] = 100000; }, "plan.kernels[0].lifetimes[0].last: got 100000"},
           {[](json& j) { j["kernels"][0]["lifetimes"][0]["bytes"] = -1; }, "plan.kernels[0].lifetimes[0].bytes: got -1"},
           {[](json& j) { j["kernels"][0]["peak_bytes"].begin().value() = -5; }, "got -5, expected an integer in [0,"},
           {[](json& j) { j["problem"]["V"] = 4294967296ll; }, "plan.problem.V: got 4294967296, expected an integer in [1, 1024]"},
           {[](json& j) { j["problem"]["seqlens"][0] = 1000000000000ll; }, "plan.problem.seqlens[0]: got 1000000000000"},
           {[](json& j) { j["kernels"][0]["steps"][1]["deps"] = json::array({18446744073709551615ull}); }, "plan.kernels[0].steps[1].deps[0]: got 18446744073709551615"}}) {
    json j = good;
    c.edit(j);
    const std::string msg = error_of([&] { plan_from_json(j, "plan.json"); });
    EXPECT_CONTAINS(msg, "plan.json: plan.");
    EXPECT_CONTAINS(msg, c.needle);
  }
}

// A plan edited after planning: peaks that disagree with the lifetimes are refused, and a plan
// whose peaks do not fit the device's buffers is refused by the simulator.
TEST(Silent, PlanFieldsChangedAfterPlanningAreRefused) {
  const Device dev = load_device(device_file());
  const json good = small_plan_json(dev);
  json j = good;
  auto it = j["kernels"][0]["peak_bytes"].begin();
  const std::string buf = it.key();
  const int64_t real = it.value().get<int64_t>();
  it.value() = real / 2;
  EXPECT_CONTAINS(error_of([&] { plan_from_json(j, "plan.json"); }),
                  "plan.json: plan.kernels[0].peak_bytes." + buf + ": got " + std::to_string(real / 2) + ", expected " +
                      std::to_string(real) + ", the peak of the kernel's lifetimes");
  j = good;
  j["kernels"][0]["peak_bytes"]["L9"] = 0;
  EXPECT_CONTAINS(error_of([&] { plan_from_json(j, "plan.json"); }), "no lifetime of this kernel is in buffer L9");
  // Consistent but impossible on this device: every lifetime 1,000x larger.
  j = good;
  for (json& lt : j["kernels"][0]["lifetimes"]) lt["bytes"] = lt["bytes"].get<int64_t>() * 1000;
  for (auto b = j["kernels"][0]["peak_bytes"].begin(); b != j["kernels"][0]["peak_bytes"].end(); ++b)
    b.value() = b.value().get<int64_t>() * 1000;
  const Plan big = plan_from_json(j, "plan.json");
  EXPECT_CONTAINS(error_of([&] { simulate(big, dev); }), "bytes of L0A, but device \"ascend310p\" has a capacity of 65536 bytes");
}

// The device's memory (gm_bytes) was never compared with what a plan needs.
TEST(Silent, PlanExceedingDeviceMemoryIsRefused) {
  json dj = device_to_json(load_device(device_file()));
  dj["gm_bytes"]["value"] = 1 << 20;  // 1 MiB
  const Device small = device_from_json(dj, "small.json");
  Problem p;
  p.seqlens = {4096};
  const std::string msg = error_of([&] { simulate(make_plan(p, small, "hanpu"), small); });
  EXPECT_CONTAINS(msg, "bytes of device memory (GM) at peak");
  EXPECT_CONTAINS(msg, "has gm_bytes 1048576");
}

// eos ids used to be cut to 32 bits (4294967296 became 0) and non-integers skipped.
TEST(Silent, ConfigEosIdsOutsideTokenIdRangeAreRejected) {
  const std::string cfg = testing::read_text((testing::golden_dir() / "qwen35_tiny" / "config.json").string());
  for (const auto& [value, needle] : std::vector<std::pair<std::string, std::string>>{
           {"4294967296", "eos_token_id' is an integer 4294967296, expected a token id in [0, 2147483647]"},
           {"-1", "is an integer -1, expected a token id"},
           {"[1, \"2\"]", "eos_token_id[1]' is a string \"2\", expected a token id"},
           {"1.5", "is a number 1.5, expected a token id"}}) {
    json j = json::parse(cfg);
    j.erase("eos_token_id");
    if (j.contains("text_config")) j["text_config"].erase("eos_token_id");
    j["eos_token_id"] = json::parse(value);
    EXPECT_CONTAINS(error_of([&] { parse_qwen_config(j.dump(), "config.json"); }), needle);
  }
}

// --- Unclear -------------------------------------------------------------------------------------

TEST(Unclear, ReadErrorsNameTheFile) {
  TempDir tmp("hanpu_bad");
  const std::string dir = tmp.file("adir");
  fs::create_directories(dir);
  EXPECT_CONTAINS(error_of([&] { load_device(dir); }), dir + ": device file is a directory, expected a regular file");
  EXPECT_CONTAINS(error_of([&] { Tokenizer::from_file(dir); }), dir + ": JSON file is a directory");
  EXPECT_CONTAINS(error_of([&] { read_json_file(tmp.file("missing.json")); }), "missing.json: cannot open JSON file: No such file");
  // A checkpoint whose config.json is a directory.
  fs::create_directories(tmp.path() / "ckpt" / "config.json");
  EXPECT_CONTAINS(error_of([&] { HybridModel::load((tmp.path() / "ckpt").string()); }), "config.json: JSON file is a directory");
}

TEST(Unclear, JsonTypeErrorsNameFileAndField) {
  const std::string cfg = testing::read_text((testing::golden_dir() / "qwen35_tiny" / "config.json").string());
  json j = json::parse(cfg);
  json& text = j.contains("text_config") ? j["text_config"] : j;
  const std::string prefix = j.contains("text_config") ? "text_config." : "";
  text["num_hidden_layers"] = "24";
  EXPECT_CONTAINS(error_of([&] { parse_qwen_config(j.dump(), "config.json"); }),
                  "config 'config.json': field '" + prefix + "num_hidden_layers' is a string \"24\", expected a positive integer");
  // A field read with nlohmann's value() (model_type) of the wrong type: named, no bare type_error.
  json k = json::parse(cfg);
  k["model_type"] = 5;
  const std::string msg = error_of([&] { parse_qwen_config(k.dump(), "config.json"); });
  EXPECT_CONTAINS(msg, "config 'config.json'");
  EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
}

TEST(Unclear, ParseErrorsNameTheFileAndDoNotDumpTheValue) {
  const std::string big = "{\"a\": \"" + std::string(1000000, 'x') + "\", \"b\": ]";
  const std::string msg = error_of([&] { parse_json(big, "tokenizer.json"); });
  EXPECT_CONTAINS(msg, "tokenizer.json: not valid JSON: ");
  EXPECT_LT(msg.size(), 400u);
  EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
  // Plan values in messages are summarised, not dumped.
  json huge = json::array();
  for (int i = 0; i < 100000; ++i) huge.push_back(i);
  EXPECT_LT(json_summary(huge).size(), 61u);
  EXPECT_EQ(json_summary(json::array({1, 2})), "[1,2]");
}

// Found by fuzz_device_json and fuzz_config_json: a number too large for a double ("2e22222")
// made nlohmann throw out_of_range, which escaped every reader (std::terminate).
TEST(Unclear, NumberOverflowIsAnErrorNamingTheFile) {
  EXPECT_CONTAINS(error_of([] { parse_json("{\"x\": 2e22222}", "device.json"); }),
                  "device.json: not valid JSON: number overflow parsing '2e22222'");
  EXPECT_CONTAINS(error_of([] { parse_qwen_config("{\"vocab_size\": 6666666E666666666}", "config.json"); }),
                  "config 'config.json': not valid JSON: number overflow");
}

TEST(Unclear, ThreadCountsAboveTheLimitAreAClearError) {
  EXPECT_CONTAINS(error_of([] { ThreadPool pool(100000); }), "thread pool: got 100000 threads, expected at most 1024");
}

// --- Outputs -------------------------------------------------------------------------------------

size_t files_in(const fs::path& dir) { return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }

TEST(Outputs, AtomicWriteKeepsTheOldContentUntilCommit) {
  TempDir tmp("hanpu_bad");
  const std::string out = tmp.file("out.json");
  write_file_atomic(out, "old\n");
  {
    AtomicFile f(out);
    f.write(std::string("new, half written"));
    EXPECT_EQ(testing::read_text(out), "old\n");  // readers see the old file while writing
    // destroyed without commit: a failed write
  }
  EXPECT_EQ(testing::read_text(out), "old\n");
  EXPECT_EQ(files_in(tmp.path()), 1u) << "the temporary file was left behind";
  write_file_atomic(out, "new\n");
  EXPECT_EQ(testing::read_text(out), "new\n");
  EXPECT_EQ(files_in(tmp.path()), 1u);
}

TEST(Outputs, TwoWritersOfOneOutputUseDistinctTemporaryFiles) {
  TempDir tmp("hanpu_bad");
  const std::string out = tmp.file("model.safetensors");
  AtomicFile a(out), b(out);
  EXPECT_NE(a.temp_path(), b.temp_path());
  EXPECT_EQ(fs::path(a.temp_path()).parent_path(), tmp.path());
  a.write(std::string("AAAA"));
  b.write(std::string("BB"));
  a.commit();
  b.commit();
  EXPECT_EQ(testing::read_text(out), "BB");  // one writer's bytes, never a mix
}

TEST(Outputs, SymlinkTargetIsFollowedNotReplaced) {
  TempDir tmp("hanpu_bad");
  const std::string real = tmp.file("real.json"), link = tmp.file("link.json");
  write_text(real, "old");
  fs::create_symlink("real.json", link);
  write_file_atomic(link, "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(testing::read_text(real), "new");
  // safetensors writer, through the same helper
  float x = 1.5f;
  write_safetensors(link, {{"x", TensorView::contiguous(&x, DType::F32, {1})}});
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FLOAT_EQ(static_cast<const float*>(SafetensorsFile::open(real).get("x").data)[0], 1.5f);
  // a dangling symlink is refused (creating its target behind the user's back would surprise)
  fs::create_symlink("nowhere/x.json", tmp.file("dangling.json"));
  EXPECT_CONTAINS(error_of([&] { write_file_atomic(tmp.file("dangling.json"), "x"); }), "symlink whose target cannot be resolved");
}

TEST(Outputs, NonRegularTargetsAreRefused) {
  TempDir tmp("hanpu_bad");
  const std::string fifo = tmp.file("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string out = in_child([&] {
    float x = 0;
    return error_of([&] { write_file_atomic(fifo, "x"); }) + "\n" +
           error_of([&] { write_safetensors(fifo, {{"x", TensorView::contiguous(&x, DType::F32, {1})}}); }) + "\n" +
           error_of([&] { write_file_atomic(tmp.path().string(), "x"); });
  });
  ASSERT_NE(out, "HANG");
  EXPECT_CONTAINS(out, fifo + ": the output exists and is a FIFO, expected a regular file");
  EXPECT_CONTAINS(out, "the output exists and is a directory");
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(Outputs, NewFilesGetTheUsualPermissions) {
  TempDir tmp("hanpu_bad");
  const mode_t old = ::umask(022);
  write_file_atomic(tmp.file("a.json"), "{}");
  ::umask(old);
  struct stat st {};
  ASSERT_EQ(::stat(tmp.file("a.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);  // not mkstemp's 0600
}

// --- Paths ---------------------------------------------------------------------------------------

TEST(Paths, ShardsOutsideTheCheckpointDirectoryAreRejected) {
  TempDir tmp("hanpu_bad");
  const fs::path src = testing::golden_dir() / "qwen35_tiny";
  for (const std::string shard : {"../evil.safetensors", "/etc/passwd", "sub/../../evil.safetensors"}) {
    const fs::path ckpt = tmp.path() / ("ckpt" + std::to_string(std::hash<std::string>{}(shard) % 1000));
    fs::create_directories(ckpt);
    fs::copy_file(src / "config.json", ckpt / "config.json", fs::copy_options::overwrite_existing);
    write_text((ckpt / "model.safetensors.index.json").string(),
               json{{"weight_map", {{"model.embed_tokens.weight", shard}}}}.dump());
    const std::string msg = error_of([&] { HybridModel::load(ckpt.string()); });
    SCOPED_TRACE(shard);
    EXPECT_CONTAINS(msg, "model.safetensors.index.json");
    EXPECT_CONTAINS(msg, "is \"" + shard + "\", expected a relative path inside the checkpoint directory");
  }
}

TEST(Paths, ControlCharactersInNamesAreEscaped) {
  TempDir tmp("hanpu_bad");
  const std::string name = "evil\x1b[2J\nname";
  const std::string header = json{{name, {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}.dump();
  const std::string path = tmp.file("ctl.safetensors");
  write_text(path, safetensors_bytes(header, 1));
  const std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(msg, "evil\\x1b[2J\\nname");
  EXPECT_EQ(msg.find('\x1b'), std::string::npos);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_EQ(printable("a\tb\x7f"), "a\\tb\\x7f");
}


// --- the command line: every one of these is one line on stderr and exit code 1 ------------------

testing::CommandResult hanpu_cli(const TempDir& dir, const std::string& args) {
  return testing::run_command(dir, testing::shell_quote(HANPU_EXE) + " " + args);
}

void expect_one_line_error(const testing::CommandResult& r, const std::string& needle) {
  SCOPED_TRACE(r.command);
  EXPECT_TRUE(r.exited && r.code == 1) << r.err;
  EXPECT_CONTAINS(r.err, needle);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Silent, NegativeCliValuesAreErrorsNotDefaults) {
  TempDir tmp("hanpu_bad");
  const std::string dev = "--device " + testing::shell_quote(device_file());
  expect_one_line_error(hanpu_cli(tmp, "simulate " + dev + " --cores -3"), "--cores");
  expect_one_line_error(hanpu_cli(tmp, "plan " + dev + " --value-heads -1"), "--value-heads");
  expect_one_line_error(hanpu_cli(tmp, "simulate " + dev + " --value-heads 0"), "--value-heads");
  expect_one_line_error(hanpu_cli(tmp, "simulate " + dev + " --timeline-chunks -1 --timeline " + testing::shell_quote(tmp.file("t.json"))),
                        "--timeline-chunks");
  expect_one_line_error(hanpu_cli(tmp, "device --host --threads -2"), "--threads");
}

TEST(Silent, DecodeOfNothingIsAnError) {
  TempDir tmp("hanpu_bad");
  const std::string tok = "--tokenizer " + testing::shell_quote((testing::golden_dir() / "tokenizer" / "tokenizer.json").string());
  expect_one_line_error(hanpu_cli(tmp, "tokenize " + tok + " --decode ''"), "--decode: got \"\"");
  expect_one_line_error(hanpu_cli(tmp, "tokenize " + tok + " --decode 1,,2"), "--decode: got \"\" in \"1,,2\"");
  expect_one_line_error(hanpu_cli(tmp, "tokenize " + tok + " --decode 1.5"), "--decode: got \"1.5\"");
  const testing::CommandResult ok = hanpu_cli(tmp, "tokenize " + tok + " --decode 72,105");
  EXPECT_TRUE(ok.exited && ok.code == 0) << ok.err;
}

TEST(Hang, HugeCliSizesAreRefusedAtOnce) {
  TempDir tmp("hanpu_bad");
  const std::string dev = "--device " + testing::shell_quote(device_file());
  expect_one_line_error(hanpu_cli(tmp, "simulate " + dev + " --T 1000000000"), "problem.seqlens[0] (T): got 1000000000, expected at most 2097152");
  expect_one_line_error(hanpu_cli(tmp, "simulate " + dev + " --V 1000000000"), "problem.V: got 1000000000");
  expect_one_line_error(hanpu_cli(tmp, "plan " + dev + " --T 1000000000000"), "expected at most 2097152");
  expect_one_line_error(hanpu_cli(tmp, "bench --T 1000000000 --path hanpu --variant gdn"), "--T 1000000000: expected at most 2097152");
  // These used to end in a bare std::bad_alloc (or build 1.6 GB of weights first).
  expect_one_line_error(hanpu_cli(tmp, "bench-linear --K 1048576 --N 1048576"), "--K x --N = 1048576 x 1048576 weights, expected at most 2^31");
  expect_one_line_error(hanpu_cli(tmp, "bench-linear --K 4096 --N 4096 --M 1048576"), "--M 1048576 x 4096 activations");
  expect_one_line_error(hanpu_cli(tmp, "bench-model --synthetic qwen3.5-0.8b -p 100000000"), "-p: prompt length 100000000, expected at most 262144");
}

TEST(Outputs, CliOutputsAreWrittenAtomically) {
  TempDir tmp("hanpu_bad");
  const std::string dev = "--device " + testing::shell_quote(device_file());
  const std::string fifo = tmp.file("plan.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_one_line_error(hanpu_cli(tmp, "plan " + dev + " --T 256 -o " + testing::shell_quote(fifo)), "is a FIFO, expected a regular file");
  // -o over a symlink: the link's target gets the plan, the link stays.
  const std::string real = tmp.file("real.json"), link = tmp.file("link.json");
  write_text(real, "old");
  fs::create_symlink("real.json", link);
  const testing::CommandResult r = hanpu_cli(tmp, "plan " + dev + " --T 256 -o " + testing::shell_quote(link));
  ASSERT_TRUE(r.exited && r.code == 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_NO_THROW(plan_from_json(read_json_file(real), real));
  // --timeline into a missing directory: an error naming the file, nothing created.
  expect_one_line_error(hanpu_cli(tmp, "simulate " + dev + " --T 256 --timeline " + testing::shell_quote(tmp.file("no/dir/t.json"))),
                        "t.json: cannot open for writing");
}

}  // namespace
}  // namespace hanpu
