// Subcommands of the `hanpu` command line. Each register_* function adds its subcommand (options
// and the callback that runs it) to the top-level app; errors are thrown as hanpu::Error and
// reported by main().
#pragma once

namespace CLI {
class App;
}

/// `hanpu gdn` and `hanpu kda`: run prefill on tensors from a safetensors file (cmd_la.cpp).
void register_la_commands(CLI::App& app);
/// `hanpu bench`: performance measurements (cmd_bench.cpp).
void register_bench_command(CLI::App& app);
/// `hanpu run` and `hanpu bench-model`: Qwen3.5 models end to end (cmd_model.cpp).
void register_model_commands(CLI::App& app);
/// `hanpu bench-linear`: bf16-weight projection kernels (cmd_bench_linear.cpp).
void register_bench_linear_command(CLI::App& app);
/// `hanpu tokenize`: encode text / decode ids with a checkpoint's tokenizer (cmd_tokenize.cpp).
void register_tokenize_command(CLI::App& app);
/// `hanpu device`: a device description as a table or JSON (cmd_device.cpp).
void register_device_command(CLI::App& app);
/// `hanpu plan` and `hanpu simulate`: HA-NPU and baseline plans on a device model (cmd_plan.cpp).
void register_plan_commands(CLI::App& app);
/// `hanpu report`: sweep strategies and shapes on a device model into one HTML report (cmd_report.cpp).
void register_report_command(CLI::App& app);
/// `hanpu quantize`: a checkpoint copy with int8 projections (cmd_quantize.cpp).
void register_quantize_command(CLI::App& app);
/// `hanpu isa`: the SIMD target the kernels use and the accepted HANPU_ISA values (cmd_isa.cpp).
void register_isa_command(CLI::App& app);
/// `hanpu tune`: measure the CPU parameters on this machine, write the planner's wisdom (cmd_tune.cpp).
void register_tune_command(CLI::App& app);
/// `hanpu serve`: OpenAI-compatible HTTP server with a prefix cache (cmd_serve.cpp, src/serve).
void register_serve_command(CLI::App& app);
/// `hanpu template render`: a chat template rendered with a JSON context (cmd_template.cpp).
void register_template_command(CLI::App& app);
/// `hanpu chat`: an interactive conversation that keeps the model's state between turns (cmd_chat.cpp).
void register_chat_command(CLI::App& app);
