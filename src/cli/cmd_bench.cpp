#include <CLI/CLI.hpp>
#include "cli/commands.hpp"
void register_bench_command(CLI::App& app) { (void)app; }
