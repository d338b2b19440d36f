// Which instruction set the CPU kernels may use: the best this CPU supports (the default), or a
// lower one named by the user, so that AVX2 and the portable path can be run and measured on an
// AVX-512 machine (docs/PERFORMANCE.md, "Method"; scripts/test.sh runs the suite that way). The cap
// holds for the engine's kernels (src/cpu) and for the model's own Highway kernels
// (src/model/layer_kernels.cpp) alike, so `--isa avx2` applies to the whole forward.
//
// The choice comes from the environment variable HANPU_ISA, read once, before the first kernel
// runs: "native" (or unset/empty) keeps everything; a Highway target name in lower case ("avx3",
// "avx2", "sse4", "emu128", on ARM "neon", ...) caps runtime dispatch at that target, and also
// turns off the kernels outside Highway (AMX and AVX512-BF16 in src/cpu/linear_amx.cpp,
// gram_bf16.cpp): those run only under "native". "portable" is Highway's plain C++ target (EMU128,
// or SCALAR where the build has no EMU128, as with Debian 12's Highway 1.0.3).
//
// A name that is not a compiled target, or a target this CPU cannot run, is refused with an
// std::invalid_argument naming HANPU_ISA, the value and the choices: never a silent fallback.
#pragma once

#include <string>
#include <vector>

namespace hanpu {

struct IsaSelection {
  std::string requested;    // HANPU_ISA as given ("" when unset)
  std::string target;       // the Highway target the kernels dispatch to, e.g. "AVX2"
  bool native = true;       // no cap: AMX / AVX512-BF16 kernels allowed where the CPU has them
};

/// Applies HANPU_ISA on first use (thread-safe) and returns the selection. Throws
/// std::invalid_argument for a bad value (every later call throws the same error).
const IsaSelection& isa_selection();

/// Call before every Highway dynamic dispatch (HANPU_DISPATCH does): makes sure the cap is applied
/// before the first kernel chooses its target.
inline void ensure_isa_selected() { (void)isa_selection(); }

/// Sets HANPU_ISA to `name` and applies it (the CLI's --isa). Must come before any kernel ran:
/// once a selection is in force, asking for another throws std::invalid_argument.
void request_isa(const std::string& name);

/// The values HANPU_ISA accepts on this build and CPU, best first ("native" first).
std::vector<std::string> isa_choices();

/// What `hanpu isa` prints: "kernels: TARGET (HANPU_ISA=...)" and the choices, or with
/// `choices_only` the choices one per line (for scripts that run the tests on every target).
/// Shared by the CLI and tools/isa_query.cpp, which the ARM64 cross build uses instead of the CLI.
std::string describe_isa(bool choices_only);

}  // namespace hanpu

/// HWY_DYNAMIC_DISPATCH after the ISA cap has been applied.
#define HANPU_DISPATCH(FUNC) (::hanpu::ensure_isa_selected(), HWY_DYNAMIC_DISPATCH(FUNC))
