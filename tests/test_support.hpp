// Small helpers shared by the test programs: where the committed fixtures are, a scratch directory
// per test that cleans up after itself, and running a command with its output captured.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "hanpu/tensor.hpp"

namespace hanpu::testing {

/// tests/golden of the source tree (CTest sets HANPU_SOURCE_DIR; otherwise next to this file).
inline std::filesystem::path golden_dir() {
  if (const char* src = std::getenv("HANPU_SOURCE_DIR"); src && *src)
    return std::filesystem::path(src) / "tests" / "golden";
  return std::filesystem::path(__FILE__).parent_path() / "golden";
}

/// A fresh directory under the system temp dir, named after the running test; removed with it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "hanpu") {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // A parameterized test's name is "Name/N": as a path that is a subdirectory, and removing it
    // would leave "Name" behind in /tmp, so the separator becomes '_'.
    std::string test_name = info ? info->name() : "none";
    std::replace(test_name.begin(), test_name.end(), '/', '_');
    dir_ = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + test_name);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

/// The whole file as bytes ("" if it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// `s` quoted for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CommandResult {
  bool exited = false;  // false: killed by a signal (or system() failed)
  int code = -1;        // exit code when exited
  std::string out, err;
  std::string command;
};

/// Runs `command` (a shell command line, arguments already quoted) with stdout and stderr captured
/// to files in `dir`, and stdin from `stdin_text` if given.
inline CommandResult run_command(const TempDir& dir, const std::string& command, const std::string* stdin_text = nullptr) {
  CommandResult r;
  const std::string out_path = dir.file("stdout.txt"), err_path = dir.file("stderr.txt");
  std::string line = command;
  if (stdin_text) {
    const std::string in_path = dir.file("stdin.txt");
    std::ofstream(in_path, std::ios::binary) << *stdin_text;
    line += " <" + shell_quote(in_path);
  }
  r.command = command;
  const int status = std::system((line + " >" + shell_quote(out_path) + " 2>" + shell_quote(err_path)).c_str());
  if (status != -1 && WIFEXITED(status)) {
    r.exited = true;
    r.code = WEXITSTATUS(status);
  }
  r.out = read_text(out_path);
  r.err = read_text(err_path);
  return r;
}

/// The message of the hanpu::Error that f() throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace hanpu::testing
