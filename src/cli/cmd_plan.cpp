// `hanpu plan` and `hanpu simulate`: plan GDN/KDA prefill for a device with a strategy, print or
// save the plan; simulate one strategy, all of them, or the ablation (or a saved plan) and print a
// table or JSON.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "hanpu/device.hpp"
#include "hanpu/plan_exec.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/simulate.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"

namespace {

using namespace hanpu;

struct ProblemArgs {
  std::string device = "devices/ascend310p.json";
  std::string variant = "gdn";
  int64_t T = 4096;
  int64_t heads = 16;
  int64_t value_heads = 0;  // 0: = heads
  int64_t batch = 1;
  std::string seqlens;
  int64_t K = 128, V = 128;
  bool no_initial_state = false, no_final_state = false;
  int cores = 0;
};

void add_problem_options(CLI::App* c, ProblemArgs& a, bool device_required) {
  auto* d = c->add_option("--device", a.device, "device description (JSON file under devices/)");
  if (device_required) d->capture_default_str();
  c->add_option("--variant", a.variant, "gdn or kda")->capture_default_str();
  c->add_option("--T", a.T, "tokens per sequence")->capture_default_str();
  c->add_option("--heads", a.heads, "q/k heads H")->capture_default_str();
  // Negative or zero values are errors (CLI11 Range), never "the default".
  c->add_option("--value-heads", a.value_heads, "value heads HV (a multiple of H; default H)")->check(CLI::Range(int64_t{1}, kMaxHeads));
  c->add_option("--batch", a.batch, "sequences of T tokens each")->capture_default_str();
  c->add_option("--seqlens", a.seqlens, "comma-separated sequence lengths (varlen; replaces --T/--batch)");
  c->add_option("--K", a.K, "key head dim")->capture_default_str();
  c->add_option("--V", a.V, "value head dim")->capture_default_str();
  c->add_flag("--no-initial-state", a.no_initial_state, "do not read an initial state");
  c->add_flag("--no-final-state", a.no_final_state, "do not write the final state");
  c->add_option("--cores", a.cores, "use the device's coherent configuration with this many cores (its own clock and bandwidths)")->check(CLI::Range(1, static_cast<int>(kMaxCores)));
}

// The device file, switched to the coherent core configuration `--cores` names (an error naming the
// counts the file offers when it has configurations and none has that count).
Device load_device_for(const ProblemArgs& a) {
  const Device dev = load_device(a.device);
  return a.cores > 0 ? device_with_cores(dev, a.cores) : dev;
}

Problem make_problem(const ProblemArgs& a) {
  Problem p;
  const std::optional<Variant> variant = variant_from_name(a.variant);
  if (!variant) throw Error("--variant: got \"" + a.variant + "\", expected " + variant_names(" or "));
  p.variant = *variant;
  if (!a.seqlens.empty()) {
    std::stringstream ss(a.seqlens);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      try {
        size_t used = 0;
        const long long v = std::stoll(tok, &used);
        if (used != tok.size()) throw std::invalid_argument(tok);
        p.seqlens.push_back(v);
      } catch (const std::exception&) {
        throw Error("--seqlens: got \"" + tok + "\", expected comma-separated integers");
      }
    }
    p.varlen = true;
  } else {
    if (a.batch < 1) throw Error("--batch: got " + std::to_string(a.batch) + ", expected at least 1");
    if (a.T < 1) throw Error("--T: got " + std::to_string(a.T) + ", expected at least 1");
    p.seqlens.assign(static_cast<size_t>(a.batch), a.T);
  }
  p.H = a.heads;
  p.HV = a.value_heads > 0 ? a.value_heads : a.heads;
  p.K = a.K, p.V = a.V;
  p.read_initial_state = !a.no_initial_state;
  p.write_final_state = !a.no_final_state;
  validate_problem(p);
  return p;
}

void write_file(const std::string& path, const std::string& text) { write_file_atomic(path, text); }

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, u[i]);
  return buf;
}

// One row of the table: a simulated plan, or a strategy whose plan does not fit the device's GM.
struct Row {
  std::string strategy;
  std::optional<SimResult> result;
  GmFit fit;
};

void print_table(const std::vector<Row>& rows) {
  // util% is from executed MACs (masked full tiles included), useful% from exact triangles.
  std::printf("%-30s %11s %10s %11s %11s %11s %11s %7s %8s %11s %11s %11s\n", "strategy", "latency_ms", "energy_mJ", "GM_read",
              "GM_write", "L1->L0", "UB<->L1", "util%", "useful%", "peak_UB", "spill", "peak_GM");
  for (const Row& row : rows) {
    if (!row.result) {
      std::printf("%-30s %s\n", row.strategy.c_str(), row.fit.message().c_str());
      continue;
    }
    const SimResult& r = *row.result;
    auto peak = [&](const char* b) {
      auto it = r.peak_bytes.find(b);
      return it == r.peak_bytes.end() ? std::string("-") : human_bytes(static_cast<double>(it->second));
    };
    std::printf("%-30s %11.3f %10.3f %11s %11s %11s %11s %7.2f %8.2f %11s %11s %11s\n", r.strategy.c_str(), r.latency_s * 1e3,
                r.energy_j * 1e3, human_bytes(static_cast<double>(r.gm_read_bytes)).c_str(),
                human_bytes(static_cast<double>(r.gm_write_bytes)).c_str(), human_bytes(static_cast<double>(r.l1_to_l0_bytes)).c_str(),
                human_bytes(static_cast<double>(r.ub_l1_bytes)).c_str(), r.matrix_utilization * 100, r.useful_matrix_utilization * 100,
                peak("UB").c_str(), human_bytes(static_cast<double>(r.spill_bytes)).c_str(),
                human_bytes(static_cast<double>(r.peak_gm_bytes)).c_str());
  }
}

}  // namespace

void register_plan_commands(CLI::App& app) {
  {
    auto* c = app.add_subcommand("plan", "plan LA prefill on a device with a strategy; print a summary, optionally save the plan JSON");
    auto a = std::make_shared<ProblemArgs>();
    auto strategy = std::make_shared<std::string>("hanpu");
    auto out = std::make_shared<std::string>();
    add_problem_options(c, *a, true);
    c->add_option("--strategy", *strategy, "hanpu, vllm-ascend, fla, fla-megakernel, flashqla, or an ablation step")->capture_default_str();
    c->add_option("-o,--output", *out, "write the plan as JSON to this file");
    c->callback([a, strategy, out] {
      const Device dev = load_device_for(*a);
      const Problem p = make_problem(*a);
      PlanOptions po = cpu_plan_options(dev);
      po.cores = a->cores;
      const Plan plan = make_plan(p, dev, *strategy, po);
      std::cout << describe_plan(plan);
      if (!out->empty()) {
        write_file(*out, plan_to_json(plan).dump(1) + "\n");
        std::cout << "plan written to " << *out << "\n";
      }
    });
  }
  {
    auto* c = app.add_subcommand("simulate", "simulate strategies (or a saved plan) on a device model");
    auto a = std::make_shared<ProblemArgs>();
    auto strategy = std::make_shared<std::string>();
    auto all = std::make_shared<bool>(false);
    auto ablation = std::make_shared<bool>(false);
    auto json = std::make_shared<bool>(false);
    auto detail = std::make_shared<bool>(false);
    auto plan_file = std::make_shared<std::string>();
    auto timeline = std::make_shared<std::string>();
    auto timeline_chunks = std::make_shared<int>(4);
    auto buffer_policy = std::make_shared<std::string>("last-reader");
    add_problem_options(c, *a, true);
    c->add_option("plan", *plan_file, "a plan JSON written by `hanpu plan -o` (then --device must describe its device)");
    c->add_option("--strategy", *strategy, "one strategy (default hanpu)");
    c->add_flag("--strategies", *all, "all strategies: vllm-ascend, fla, fla-megakernel, flashqla, hanpu");
    c->add_flag("--ablation", *ablation, "the ablation: fla, +mapping, +reordering, +layout");
    c->add_flag("--json", *json, "print a JSON array, one object per strategy");
    c->add_flag("--detail", *detail, "with --json: per-operator and per-kernel figures");
    c->add_option("--timeline", *timeline, "write the per-core timeline (first chunks of every core and kernel) of the first plan as JSON");
    c->add_option("--timeline-chunks", *timeline_chunks, "chunks per core and kernel in the timeline")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    c->add_option("--buffer-policy", *buffer_policy,
                  "on-core buffer allocation: last-reader (each copy freed after its last reader) or static (every copy held for the "
                  "kernel's life, as Ascend C TPipe/TQue; overflow spilled to GM)")
        ->capture_default_str()
        ->check(CLI::IsMember({"last-reader", "static"}));
    c->callback([=] {
      // `--strategies all` reads naturally; CLI11 flags take no value, so accept "all" as the plan slot.
      bool every = *all;
      std::string file = *plan_file;
      if (file == "all") every = true, file.clear();
      const Device dev = load_device_for(*a);
      std::vector<Plan> plans;
      if (!file.empty()) {
        plans.push_back(plan_from_json(parse_json(read_regular_file(file, "plan file", kMaxJsonFileBytes), file), file));
      } else {
        const Problem p = make_problem(*a);
        PlanOptions po = cpu_plan_options(dev);
        po.cores = a->cores;
        std::vector<std::string> names;
        if (every) names = strategy_names();
        else if (*ablation) names = ablation_names();
        else names = {strategy->empty() ? std::string("hanpu") : *strategy};
        for (const std::string& n : names) plans.push_back(make_plan(p, dev, n, po));
      }
      // A plan whose GM footprint exceeds the device's stays in the table as "does not fit"
      // when several strategies are compared; a single plan that does not fit is an error.
      std::vector<Row> rows;
      std::vector<SimResult> rs;
      for (size_t i = 0; i < plans.size(); ++i) {
        SimOptions so;
        so.timeline = rs.empty() && !timeline->empty();
        so.timeline_chunks = *timeline_chunks;
        so.buffer_policy = buffer_policy_from_name(*buffer_policy);
        Row row;
        row.strategy = plans[i].strategy;
        row.fit = gm_fit(plans[i], dev);
        if (!row.fit.fits && plans.size() > 1) {
          rows.push_back(row);
          continue;
        }
        row.result = simulate(plans[i], dev, so);
        rs.push_back(*row.result);
        rows.push_back(row);
      }
      if (!timeline->empty() && !rs.empty()) {
        nlohmann::json ev = nlohmann::json::array();
        for (const TimelineEvent& e : rs.front().timeline)
          ev.push_back({{"core", e.core}, {"kernel", e.kernel}, {"lane", e.lane}, {"op", e.op}, {"kind", step_kind_name(e.kind)}, {"tensor", e.tensor},
                        {"item", e.item}, {"chunk", e.chunk}, {"start_us", e.start_s * 1e6}, {"end_us", e.end_s * 1e6}});
        write_file(*timeline, nlohmann::json{{"strategy", rs.front().strategy}, {"latency_us", rs.front().latency_s * 1e6}, {"events", ev}}.dump() + "\n");
      }
      if (*json) {
        nlohmann::json arr = nlohmann::json::array();
        for (const Row& row : rows)
          arr.push_back(row.result ? sim_result_to_json(*row.result, *detail)
                                   : nlohmann::json{{"strategy", row.strategy}, {"fits", false}, {"needs_gm_bytes", row.fit.needs_bytes},
                                                    {"device_gm_bytes", row.fit.device_bytes}, {"message", row.fit.message()}});
        std::cout << arr.dump(1) << "\n";
      } else {
        const Problem& p = plans.front().problem;
        std::cout << variant_name(p.variant) << " on " << dev.name << " (" << plans.front().cores << " cores): " << p.sequences()
                  << " sequence(s), " << p.total_tokens() << " tokens, H=" << p.H << " HV=" << p.HV << " K=" << p.K << " V=" << p.V << "\n";
        print_table(rows);
      }
    });
  }
}
