// Entry point of the `hanpu` command line: builds the CLI11 app from the registered subcommands
// and turns every error into one line on stderr and exit code 1.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>

#include "cli/commands.hpp"
#include "hanpu/isa.hpp"
#include "cpu/linear_kernels.hpp"
#include "hanpu/tensor.hpp"

int main(int argc, char** argv) {
  CLI::App app{"hanpu: linear-attention engine (GDN, KDA) for hybrid LLMs"};
  app.require_subcommand(1);
  // Before any subcommand's callback runs a kernel: caps Highway's runtime dispatch (hanpu/isa.hpp).
  // fallthrough lets it follow the subcommand too (`hanpu bench --isa avx2`).
  app.fallthrough();
  app.add_option_function<std::string>("--isa", [](const std::string& isa) { hanpu::request_isa(isa); },
                                       "SIMD target the kernels may use at most: native (default), avx3, avx2, "
                                       "sse4, portable, ... (as the environment variable HANPU_ISA)");
  // Plans for the host then use the model-based CPU parameters only (cpu_tuning.hpp), as
  // HANPU_WISDOM=none does.
  app.add_flag_callback("--no-wisdom", [] { ::setenv("HANPU_WISDOM", "none", 1); },
                        "Ignore the wisdom file of `hanpu tune`: model-based CPU parameters (as HANPU_WISDOM=none)");
  register_la_commands(app);
  register_bench_command(app);
  register_tokenize_command(app);
  register_device_command(app);
  register_plan_commands(app);
  register_report_command(app);
  register_bench_linear_command(app);
  register_model_commands(app);
  register_isa_command(app);
  register_tune_command(app);
  register_quantize_command(app);
  register_template_command(app);
  register_chat_command(app);
#ifdef HANPU_HAVE_SERVE  // not in builds without cpp-httplib (CMake option HANPU_BUILD_SERVE)
  register_serve_command(app);
#endif

  // Subcommands do their work in callbacks, which run inside parse(); so the hanpu/std handlers
  // below also cover the commands themselves, not just argument parsing.
  try {
    // Environment tuning knobs are checked before any work: a bad value fails at once, not after
    // a benchmark's probes.
    (void)hanpu::cpu::decode_prefetch_bytes();
    (void)hanpu::cpu::decode_prefetch_l2();
    app.parse(argc, argv);
  } catch (const CLI::ValidationError& e) {  // a value out of its ->check() range: one line, exit 1
    std::cerr << "hanpu: error: " << e.what() << '\n';
    return 1;
  } catch (const CLI::ParseError& e) {  // also --help, which exits with 0
    return app.exit(e);
  } catch (const std::bad_alloc&) {  // a size no check caught: still one clear line
    std::cerr << "hanpu: error: out of memory (std::bad_alloc): the sizes asked for need more memory than this "
                 "machine gives; ask for smaller sizes\n";
    return 1;
  } catch (const hanpu::Error& e) {
    std::cerr << "hanpu: error: " << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hanpu: error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
