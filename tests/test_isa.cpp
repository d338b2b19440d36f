// HANPU_ISA / --isa (hanpu/isa.hpp): the kernels really dispatch to the capped target, every target
// this CPU runs can be chosen, and a bad value is a one-line error naming it. scripts/test.sh runs
// the whole suite under HANPU_ISA=avx2 and =portable as well, so these also run capped.
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "hanpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "cpu/linear_kernels.hpp"
#include "test_support.hpp"

#ifndef HANPU_EXE
#error "HANPU_EXE must be defined to the path of the hanpu executable"
#endif

namespace {

using hanpu::testing::TempDir;
using hanpu::testing::shell_quote;

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

hanpu::testing::CommandResult host_device(const TempDir& dir, const std::string& env, const std::string& args = "") {
  return hanpu::testing::run_command(dir, env + " " + shell_quote(HANPU_EXE) + " device --host --measure-seconds 0.01" + args);
}

// What `hanpu device --host` reports as the target its kernels dispatch to ("highway target X").
std::string reported_target(const std::string& out) {
  const std::string key = "highway target ";
  const size_t at = out.find(key);
  if (at == std::string::npos) return "";
  const size_t end = out.find_first_of(": ", at + key.size());
  return out.substr(at + key.size(), end - at - key.size());
}

TEST(Isa, DispatchFollowsTheSelection) {
  // In this process (whatever HANPU_ISA the suite runs under): the LA kernels' own target is the
  // one the selection names. Highway 1.0.3's DisableTargets alone did not hold (cpu/isa.cpp).
  const hanpu::IsaSelection& s = hanpu::isa_selection();
  EXPECT_EQ(s.target, hanpu::cpu::simd_target_name());
  if (!s.native) EXPECT_FALSE(hanpu::cpu::amx_usable());
}

TEST(Isa, EveryRunnableTargetCanBeChosen) {
  TempDir dir;
  const std::vector<std::string> choices = hanpu::isa_choices();
  ASSERT_GE(choices.size(), 3u);  // native, at least one target, portable
  EXPECT_EQ(choices.front(), "native");
  EXPECT_EQ(choices.back(), "portable");
  std::string portable_target;
  for (const std::string& c : choices) {
    if (c == "native" || c == "portable") continue;
    SCOPED_TRACE(c);
    const auto r = host_device(dir, "HANPU_ISA=" + c);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(reported_target(r.out), upper(c));
    portable_target = upper(c);  // the last one listed is the plain C++ target
  }
  const auto r = host_device(dir, "HANPU_ISA=portable");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(reported_target(r.out), portable_target);
  EXPECT_TRUE(portable_target == "EMU128" || portable_target == "SCALAR") << portable_target;
}

TEST(Isa, CommandLineOptionCapsLikeTheEnvironment) {
  TempDir dir;
  const std::vector<std::string> choices = hanpu::isa_choices();
  const std::string lowest = choices[choices.size() - 2];  // the plain C++ target, runnable everywhere
  for (const std::string& args : std::vector<std::string>{" --isa " + lowest, ""}) {
    const std::string env = args.empty() ? "HANPU_ISA=" + lowest : "HANPU_ISA=";
    const auto r = host_device(dir, env, args);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(reported_target(r.out), upper(lowest)) << args;
  }
  const auto before = hanpu::testing::run_command(
      dir, "HANPU_ISA= " + shell_quote(HANPU_EXE) + " --isa " + lowest + " device --host --measure-seconds 0.01");
  ASSERT_EQ(before.code, 0) << before.err;
  EXPECT_EQ(reported_target(before.out), upper(lowest));
}

TEST(Isa, BadValueIsAOneLineErrorNamingIt) {
  TempDir dir;
  for (const std::string env : {"HANPU_ISA=avx9", "HANPU_ISA=AVX-2"}) {
    SCOPED_TRACE(env);
    const auto r = host_device(dir, env);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find(env), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("expected one of native"), std::string::npos) << r.err;
  }
  const auto r = host_device(dir, "HANPU_ISA=", " --isa nope");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("HANPU_ISA=nope"), std::string::npos) << r.err;
}

TEST(Isa, IsaCommandListsTheChoicesAndTheTarget) {
  TempDir dir;
  const auto listed = hanpu::testing::run_command(dir, "HANPU_ISA= " + shell_quote(HANPU_EXE) + " isa --choices");
  ASSERT_EQ(listed.code, 0) << listed.err;
  std::string expected;
  for (const std::string& c : hanpu::isa_choices()) expected += c + "\n";
  EXPECT_EQ(listed.out, expected);
  const std::vector<std::string> choices = hanpu::isa_choices();
  const std::string lowest = choices[choices.size() - 2];
  const auto shown = hanpu::testing::run_command(dir, "HANPU_ISA= " + shell_quote(HANPU_EXE) + " --isa " + lowest + " isa");
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_NE(shown.out.find("kernels: " + upper(lowest) + " (HANPU_ISA=" + lowest + ")"), std::string::npos) << shown.out;
  const auto bad = hanpu::testing::run_command(dir, "HANPU_ISA=avx9 " + shell_quote(HANPU_EXE) + " isa");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("HANPU_ISA=avx9"), std::string::npos) << bad.err;
}

}  // namespace
