// `hanpu gdn` / `hanpu kda`: prefill on tensors read from a safetensors file, outputs written to
// another. Tensor names follow FLA's argument names so a PyTorch script can dump its inputs with
// safetensors.torch.save_file({"q": q, "k": k, ...}) and compare against FLA's outputs.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/la.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"
#include "io/safetensors.hpp"

namespace {

struct LaCommandArgs {
  std::string in_path;
  std::string out_path;
  float scale = 0.0f;
  CLI::Option* scale_option = nullptr;  // scale is used only when given: the default is K^-0.5
  float lower_bound = 0.0f;
  CLI::Option* lower_bound_option = nullptr;  // KDA's lower-bounded gate, only when given
  bool qk_l2norm = false;
  bool gate_in_kernel = false;
  bool beta_sigmoid = false;
  bool allow_neg_eigval = false;
  bool show_plan = false;
  std::string plan_path;  // --plan: a plan JSON (hanpu plan -o) to run instead of planning
  std::string mode = "chunk";
  int threads = 0;
};

const char* const kRequiredTensors[] = {"q", "k", "v", "g", "beta"};
const char* const kOptionalTensors[] = {"initial_state", "cu_seqlens", "A_log", "dt_bias"};

hanpu::CpuPath cpu_path_for_mode(const std::string& mode) {
  if (mode == "chunk") return hanpu::CpuPath::HeadFused;
  if (mode == "fla") return hanpu::CpuPath::FlaChunk;
  if (mode == "recurrent") return hanpu::CpuPath::Recurrent;
  // CLI11's IsMember check has already refused anything else; this guards future edits.
  throw hanpu::Error("unknown --mode '" + mode + "' (expected chunk, recurrent or fla)");
}

std::string describe(const char* name, const hanpu::TensorView& t) {
  return std::string(name) + " " + t.shape_str() + " " + hanpu::dtype_name(t.dtype);
}

void run_la_command(hanpu::Variant variant, const LaCommandArgs& args) {
  const std::string command = hanpu::variant_name(variant);
  const hanpu::SafetensorsFile file = hanpu::SafetensorsFile::open(args.in_path);

  auto required = [&](const char* name) {
    if (!file.has(name))
      throw hanpu::Error(command + ": input file '" + args.in_path + "' has no tensor '" + name +
                         "' (required: q, k, v, g, beta)");
    return file.get(name);
  };
  auto optional = [&](const char* name) { return file.has(name) ? file.get(name) : hanpu::TensorView{}; };

  hanpu::LaInputs in;
  in.q = required("q");
  in.k = required("k");
  in.v = required("v");
  in.g = required("g");
  in.beta = required("beta");
  in.initial_state = optional("initial_state");
  in.cu_seqlens = optional("cu_seqlens");
  in.A_log = optional("A_log");
  in.dt_bias = optional("dt_bias");

  if (!in.cu_seqlens.empty() && in.cu_seqlens.dtype != hanpu::DType::I32 && in.cu_seqlens.dtype != hanpu::DType::I64)
    throw hanpu::Error(command + ": tensor 'cu_seqlens' in '" + args.in_path + "' is " +
                       hanpu::dtype_name(in.cu_seqlens.dtype) + ", expected I32 or I64");
  const bool bounded = args.lower_bound_option && args.lower_bound_option->count() > 0;
  if (bounded && !args.gate_in_kernel)
    throw hanpu::Error(command + ": --lower-bound bounds the gate computed in kernel; add --gate-in-kernel");
  if (args.gate_in_kernel && in.A_log.empty() && !bounded)
    throw hanpu::Error(command + ": --gate-in-kernel computes the decay from g, A_log and dt_bias, but '" +
                       args.in_path + "' has no tensor 'A_log' [HV]");
  // Tensors the run would silently not use usually mean a mistake in how the file was made.
  if (!args.gate_in_kernel)
    for (const char* name : {"A_log", "dt_bias"})
      if (file.has(name))
        std::cerr << "hanpu " << command << ": note: tensor '" << name << "' is ignored without --gate-in-kernel\n";
  std::set<std::string> used(std::begin(kRequiredTensors), std::end(kRequiredTensors));
  used.insert(std::begin(kOptionalTensors), std::end(kOptionalTensors));
  std::string unused;
  for (const std::string& name : file.names())
    if (!used.count(name)) unused += (unused.empty() ? "" : ", ") + name;
  if (!unused.empty()) std::cerr << "hanpu " << command << ": note: input tensors not used: " << unused << '\n';

  hanpu::LaOptions opt;
  if (args.scale_option && args.scale_option->count() > 0) opt.scale = args.scale;
  opt.qk_l2norm = args.qk_l2norm;
  opt.gate_in_kernel = args.gate_in_kernel;
  if (bounded) opt.lower_bound = args.lower_bound;
  opt.beta_sigmoid = args.beta_sigmoid;
  opt.allow_neg_eigval = args.allow_neg_eigval;

  hanpu::ExecOptions ex;
  ex.path = cpu_path_for_mode(args.mode);
  ex.threads = args.threads;
  std::optional<hanpu::Plan> given;
  if (!args.plan_path.empty()) {
    if (ex.path != hanpu::CpuPath::HeadFused)
      throw hanpu::Error(command + ": --plan with --mode " + args.mode + "; the plan decides how it runs (drop --mode)");
    given = hanpu::plan_from_json(
        hanpu::parse_json(hanpu::read_regular_file(args.plan_path, "plan file", hanpu::kMaxJsonFileBytes), args.plan_path),
        args.plan_path);
    ex.plan = &*given;
  }
  hanpu::ExecReport report;
  ex.report = &report;
  hanpu::Engine engine(given ? given->cores : args.threads);  // the plan's cores, or --threads (0: all)
  ex.engine = &engine;
  const auto start = std::chrono::steady_clock::now();
  const hanpu::LaResult result = hanpu::la_prefill_alloc(variant, in, opt, ex);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const hanpu::CpuPath ran = given ? report.schedule->path : ex.path;  // a given plan decides the path
  if (args.show_plan && report.plan) {
    std::cerr << "hanpu " << command << ": " << (given ? "plan from " + args.plan_path : std::string("planned for the host"))
              << (given ? "" : report.plan_cache_hit ? " (plan cache hit)" : " (planned in this call)") << ", "
              << report.planning_seconds * 1e3 << " ms to plan and lower\n"
              << hanpu::describe_plan(*report.plan) << "executed as: " << report.schedule->describe() << '\n';
  }

  std::vector<std::pair<std::string, hanpu::TensorView>> outputs{{"o", result.o.view()}};
  if (result.final_state.defined()) outputs.emplace_back("final_state", result.final_state.view());
  hanpu::write_safetensors(args.out_path, outputs,
                           {{"producer", "hanpu"}, {"variant", command}, {"path", hanpu::cpu_path_name(ran)}});

  std::ostringstream summary;
  summary << "hanpu " << command << ": " << describe("q", in.q) << ", " << describe("v", in.v) << ", "
          << describe("g", in.g);
  if (!in.cu_seqlens.empty()) summary << ", " << in.cu_seqlens.numel() - 1 << " sequences (varlen)";
  summary << " -> " << describe("o", result.o.view());
  if (result.final_state.defined()) summary << ", " << describe("final_state", result.final_state.view());
  summary << "; path " << hanpu::cpu_path_name(ran) << ", threads ";
  if (args.threads > 0) summary << args.threads;
  else summary << "all (" << std::thread::hardware_concurrency() << ")";
  char ms_text[32];
  std::snprintf(ms_text, sizeof ms_text, "%.3f", ms);
  summary << ", " << ms_text << " ms -> " << args.out_path;
  std::cerr << summary.str() << '\n';
}

void add_la_subcommand(CLI::App& app, hanpu::Variant variant, const std::string& description) {
  CLI::App* sub = app.add_subcommand(hanpu::variant_name(variant), description);
  // The callback runs after parsing, when the options below have been filled in; shared
  // ownership keeps them alive for as long as the subcommand exists.
  auto args = std::make_shared<LaCommandArgs>();
  sub->add_option("--in", args->in_path,
                  "input safetensors: q, k, v, g, beta; optional initial_state, cu_seqlens, A_log, dt_bias")
      ->required();
  sub->add_option("--out", args->out_path, "output safetensors: o (dtype of v), final_state (F32)")->required();
  args->scale_option = sub->add_option("--scale", args->scale, "query scale (default K^-0.5)");
  sub->add_flag("--l2norm", args->qk_l2norm, "L2-normalise q and k per head inside the kernel");
  sub->add_flag("--gate-in-kernel", args->gate_in_kernel,
                "g is the raw gate pre-activation; the decay is computed with A_log (and dt_bias)");
  if (hanpu::variant_traits(variant).lower_bound_gate)
    args->lower_bound_option =
        sub->add_option("--lower-bound", args->lower_bound,
                        "with --gate-in-kernel: the lower-bounded (safe) gate g = LB sigmoid(exp(A_log) (g + dt_bias)), "
                        "LB < 0; A_log is then optional (rate 1)");
  sub->add_flag("--beta-sigmoid", args->beta_sigmoid, "beta <- sigmoid(beta)");
  sub->add_flag("--allow-neg-eigval", args->allow_neg_eigval, "with --beta-sigmoid: beta <- 2 sigmoid(beta)");
  sub->add_option("--mode", args->mode,
                  "chunk: hanpu's head-fused chunked path; fla: FLA-style chunked baseline; recurrent: token by token")
      ->check(CLI::IsMember(std::vector<std::string>{"chunk", "recurrent", "fla"}))
      ->capture_default_str();
  sub->add_flag("--show-plan", args->show_plan,
                "print the plan the call ran (mapping, lockstep groups, order, layouts) and how the CPU executed it");
  sub->add_option("--plan", args->plan_path,
                  "run this plan (JSON from `hanpu plan --device host -o`) instead of planning; refused, naming the "
                  "field, if it is for another problem or asks for something the CPU cannot run");
  sub->add_option("--threads", args->threads, "worker threads (0: all hardware threads)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub->callback([variant, args] { run_la_command(variant, *args); });
}

}  // namespace

void register_la_commands(CLI::App& app) {
  add_la_subcommand(app, hanpu::Variant::GDN,
                    "Gated DeltaNet prefill: q,k [B,T,H,K], v [B,T,HV,V], g [B,T,HV] (log decay), beta [B,T,HV]");
  add_la_subcommand(app, hanpu::Variant::KDA,
                    "Kimi Delta Attention prefill: q,k [B,T,H,K], v [B,T,HV,V], g [B,T,HV,K] (per-channel "
                    "log decay), beta [B,T,HV]");
}
