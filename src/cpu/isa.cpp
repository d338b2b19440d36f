#include "hanpu/isa.hpp"

// The same targets as the kernels' translation units (la_kernels.cpp, layer_kernels.cpp,
// linear_portable.cpp), so that every name offered here is one they were compiled for.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
#include <hwy/targets.h>

#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace hanpu {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Highway's targets are bits of one mask; a lower bit is a better target (hwy/detect_targets.h).
int64_t best_of(int64_t mask) { return mask & -mask; }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The compiled targets this CPU can run, best first, as Highway names them.
std::vector<int64_t> runnable_targets() {
  std::vector<int64_t> out;
  for (int64_t m = hwy::SupportedTargets() & HWY_TARGETS; m != 0; m &= m - 1) out.push_back(best_of(m));
  return out;
}

IsaSelection select_from_environment() {
  IsaSelection s;
  const char* env = std::getenv("HANPU_ISA");
  s.requested = env ? env : "";
  const std::string want = lower(s.requested);
  if (!want.empty() && want != "native") {
    int64_t chosen = 0;
    for (int64_t m = HWY_TARGETS; m != 0; m &= m - 1) {
      // "portable": the last compiled target, Highway's plain C++ one (EMU128, or SCALAR where the
      // build has no EMU128).
      if (lower(hwy::TargetName(best_of(m))) == want || (want == "portable" && (m & (m - 1)) == 0))
        chosen = best_of(m);
    }
    if (chosen == 0)
      throw std::invalid_argument("HANPU_ISA=" + s.requested + ": not a SIMD target of this build; expected one of " +
                                  join(isa_choices()));
    if ((hwy::SupportedTargets() & chosen) == 0)
      throw std::invalid_argument("HANPU_ISA=" + s.requested + ": this CPU cannot run " + hwy::TargetName(chosen) +
                                  "; expected one of " + join(isa_choices()));
    // Every better target off: dispatch then picks `chosen`, the best one left. Not through
    // hwy::DisableTargets: in Highway 1.0.3 (Debian 12) SupportedTargets() re-detects and sets the
    // dispatch choice from the *unmasked* targets whenever no test mock is active, so any later
    // SupportedTargets() call would undo the cap (seen: AVX3 kernels under HANPU_ISA=avx2). With
    // the mock set, SupportedTargets() returns it and leaves the dispatch choice alone.
    hwy::SetSupportedTargetsForTest(hwy::SupportedTargets() & ~(chosen - 1));
    s.native = false;
  }
  const std::vector<int64_t> left = runnable_targets();
  s.target = left.empty() ? hwy::TargetName(HWY_STATIC_TARGET) : hwy::TargetName(left.front());
  return s;
}

}  // namespace

const IsaSelection& isa_selection() {
  // A throwing initializer leaves the static uninitialised: the next call tries (and throws) again.
  static const IsaSelection selection = select_from_environment();
  return selection;
}

void request_isa(const std::string& name) {
  // Before the selection exists this only sets what select_from_environment() will read.
  const char* before = std::getenv("HANPU_ISA");
  const std::string previous = before ? before : "";
  ::setenv("HANPU_ISA", name.c_str(), 1);
  const IsaSelection& s = isa_selection();
  if (s.requested != name) {
    ::setenv("HANPU_ISA", previous.c_str(), 1);
    throw std::invalid_argument("--isa " + name + ": the kernels already run with HANPU_ISA=" +
                                (s.requested.empty() ? std::string("native") : s.requested) +
                                "; the ISA can only be chosen before the first kernel runs");
  }
}

std::vector<std::string> isa_choices() {
  std::vector<std::string> out{"native"};
  for (int64_t t : runnable_targets()) out.push_back(lower(hwy::TargetName(t)));
  out.push_back("portable");
  return out;
}

std::string describe_isa(bool choices_only) {
  const IsaSelection& selection = isa_selection();  // first: a bad HANPU_ISA is refused either way
  const std::vector<std::string> choices = isa_choices();
  std::string out;
  if (choices_only) {
    for (const std::string& c : choices) out += c + '\n';
    return out;
  }
  out = "kernels: " + selection.target + " (HANPU_ISA=" + (selection.requested.empty() ? std::string("native") : selection.requested) +
        ")\nchoices:";
  for (const std::string& c : choices) out += ' ' + c;
  return out + '\n';
}

}  // namespace hanpu
