// Small helpers shared by the test programs: where the committed fixtures are, and a scratch
// directory per test that cleans up after itself.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

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
    dir_ = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
            (info ? info->name() : "none"));
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

}  // namespace hanpu::testing
