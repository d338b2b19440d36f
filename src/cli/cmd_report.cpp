// `hanpu report`: sweep strategies x shapes on a device model and write one self-contained HTML
// report (report/report_builder.hpp); progress on stderr, optionally every number as JSON.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "hanpu/device.hpp"
#include "hanpu/plan_exec.hpp"
#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
#include "report/html_report.hpp"
#include "report/report_builder.hpp"

namespace {

struct ReportArgs {
  std::string device = "devices/ascend310p.json";
  std::string output = "report.html";
  std::string variants = "gdn,kda";
  std::string T = "512,1024,2048,4096";
  std::string heads = "16,32,48";
  int64_t max_T = 65536;
  std::string json_out;
  bool quiet = false;
};

// Atomic (io/file_io.hpp): a failed write leaves the previous report in place.
void write_text(const std::string& path, const std::string& text) { hanpu::write_file_atomic(path, text); }

}  // namespace

void register_report_command(CLI::App& app) {
  auto* c = app.add_subcommand("report", "sweep GDN/KDA x T x heads x strategies on a device model; write one HTML report");
  auto a = std::make_shared<ReportArgs>();
  c->add_option("--device", a->device, "device description (JSON file under devices/)")->capture_default_str();
  c->add_option("-o,--output", a->output, "HTML file to write")->capture_default_str();
  c->add_option("--variants", a->variants, "comma-separated: gdn, kda")->capture_default_str();
  c->add_option("--T", a->T, "comma-separated sequence lengths (K = x1024)")->capture_default_str();
  c->add_option("--heads", a->heads, "comma-separated head counts (H = HV)")->capture_default_str();
  c->add_option("--max-T", a->max_T, "peak GM memory is planned for T doubling up to this")->capture_default_str();
  c->add_option("--json-out", a->json_out, "also write every number of the report as JSON here");
  c->add_flag("-q,--quiet", a->quiet, "no progress on stderr");
  c->callback([a] {
    using namespace hanpu;
    report::ReportOptions opt;
    opt.backend = &cpu_plan_backend();
    opt.variants = report::parse_variant_list(a->variants, "--variants");
    opt.T = report::parse_size_list(a->T, "--T");
    opt.heads = report::parse_size_list(a->heads, "--heads");
    opt.max_T = a->max_T;
    report::validate_report_options(opt);
    const Device dev = load_device(a->device);
    const auto t0 = std::chrono::steady_clock::now();
    report::ProgressFn progress;
    if (!a->quiet)
      progress = [](int done, int total, const std::string& what) {
        std::fprintf(stderr, "[%d/%d] %s\n", done + 1, total, what.c_str());
      };
    const report::ReportData data = report::run_report_sweep(dev, opt, progress);
    const std::string html = report::render_report(dev, opt, data);
    write_text(a->output, html);
    if (!a->json_out.empty()) write_text(a->json_out, report::report_data_to_json(data).dump(1) + "\n");
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "report: %d simulations, %d plan-only runs in %.1f s (sweep %.1f s); %zu bytes written to %s\n",
                 data.simulations, data.plans, total, data.seconds, html.size(), a->output.c_str());
  });
}
