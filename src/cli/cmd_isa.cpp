// `hanpu isa`: which SIMD target the CPU kernels dispatch to under the current HANPU_ISA / --isa,
// and every value HANPU_ISA accepts on this build and CPU (hanpu/isa.hpp). `--choices` prints only
// the values, one per line, for scripts that run the tests on every target (scripts/test_arm64.sh).
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.hpp"
#include "hanpu/isa.hpp"

void register_isa_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("isa", "Show the SIMD target the kernels use and the values HANPU_ISA accepts");
  auto choices_only = std::make_shared<bool>(false);
  cmd->add_flag("--choices", *choices_only, "Print only the accepted values, one per line, best first");
  cmd->callback([choices_only] { std::cout << hanpu::describe_isa(*choices_only); });
}
