// `hanpu device`: shows a device description (a file under devices/ or the detected host) as a
// table of every number with its status and source, or as JSON (device_to_json).
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/device.hpp"

namespace {

using namespace hanpu;

struct DeviceArgs {
  std::string file;
  bool host = false;
  int threads = 0;
  double measure_seconds = 1.0;
  bool json = false;
};

struct TableRow {
  std::string field, value, status, source;
};

std::string number(double v) {
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// Bytes with a binary-unit hint: "262144 (256 KiB)".
std::string bytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double x = v;
  while (x >= 1024 && u < 4) x /= 1024, ++u;
  if (u == 0) return number(v);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return number(v) + " (" + buf + " " + units[u] + ")";
}

void add(std::vector<TableRow>& rows, const std::string& field, const Quantity& q, bool is_bytes = false) {
  rows.push_back({field, is_bytes ? bytes(q.value) : number(q.value), q.status, q.source});
  for (const Quantity& a : q.alternatives)
    rows.push_back({"  alternative", is_bytes ? bytes(a.value) : number(a.value), a.status, a.source});
}

void print_table(const Device& d) {
  std::vector<TableRow> rows;
  add(rows, "cores", d.cores);
  add(rows, "clock_ghz", d.clock_ghz);
  add(rows, "matrix.tile_m", d.matrix.tile_m);
  add(rows, "matrix.tile_k", d.matrix.tile_k);
  add(rows, "matrix.tile_n", d.matrix.tile_n);
  for (const auto& [dt, q] : d.matrix.macs_per_cycle)
    add(rows, std::string("matrix.macs_per_cycle.") + dtype_name(dt), q);
  for (const auto& [name, q] : d.matrix.macs_per_cycle_extra) add(rows, "matrix.macs_per_cycle." + name, q);
  add(rows, "matrix.energy_pj_per_mac", d.matrix.energy_pj_per_mac);
  for (const auto& [dt, q] : d.vector.lanes) add(rows, std::string("vector.lanes.") + dtype_name(dt), q);
  add(rows, "vector.energy_pj_per_op", d.vector.energy_pj_per_op);
  for (const BufferSpec& b : d.buffers) {
    add(rows, b.name + (b.per_core ? "" : " (shared)") + ".capacity_bytes", b.capacity_bytes, true);
    add(rows, b.name + ".alignment_bytes", b.alignment_bytes);
  }
  for (const PathSpec& p : d.paths) {
    add(rows, p.name() + " [" + p.engine + (p.shared ? ", shared" : "") + "].bandwidth_gbs", p.bandwidth_gbs);
    add(rows, p.name() + ".energy_pj_per_byte", p.energy_pj_per_byte);
  }
  add(rows, "gm_bytes", d.gm_bytes, true);
  add(rows, "kernel_launch_us", d.kernel_launch_us);
  add(rows, "static_power_w", d.static_power_w);
  // The per-event fixed costs the simulator charges (docs/SIMULATION.md, "Fixed costs and
  // calibration"); a device file without them reads 0, and so does the table.
  add(rows, "handoff_sync_cycles", d.handoff_sync_cycles);
  add(rows, "kernel_boundary_us", d.kernel_boundary_us);
  add(rows, "dma_setup_cycles", d.dma_setup_cycles);
  add(rows, "gm_segment_cycles", d.gm_segment_cycles);
  add(rows, "pipe_sync_cycles", d.pipe_sync_cycles);
  add(rows, "vector_startup_cycles", d.vector_startup_cycles);
  add(rows, "framework_matmul_transdata_per_tensor", d.framework_matmul_transdata_per_tensor);

  size_t wf = 5, wv = 5, ws = 6;
  for (const TableRow& r : rows) {
    wf = std::max(wf, r.field.size());
    wv = std::max(wv, r.value.size());
    ws = std::max(ws, r.status.size());
  }
  std::cout << d.name << " (" << device_kind_name(d.kind) << "): " << d.description << "\n\n";
  auto line = [&](const std::string& f, const std::string& v, const std::string& s, const std::string& src) {
    std::cout << f << std::string(wf - f.size() + 2, ' ') << std::string(wv - v.size(), ' ') << v << "  " << s
              << std::string(ws - s.size() + 2, ' ') << src << '\n';
  };
  line("field", "value", "status", "source");
  for (const TableRow& r : rows) line(r.field, r.value, r.status, r.source);
  if (!d.notes.empty()) {
    std::cout << "\nnotes:\n";
    for (const std::string& n : d.notes) std::cout << "  - " << n << '\n';
  }
}

void run_device(const DeviceArgs& a) {
  if (a.host == !a.file.empty()) throw Error("hanpu device: give exactly one of --device FILE or --host");
  if (a.measure_seconds < 0 || !std::isfinite(a.measure_seconds))
    throw Error("hanpu device: --measure-seconds: got " + std::to_string(a.measure_seconds) +
                ", expected a non-negative number");
  const Device d = a.host ? host_device(a.threads, a.measure_seconds) : load_device(a.file);
  if (a.json)
    std::cout << device_to_json(d).dump(2) << '\n';
  else
    print_table(d);
}

}  // namespace

void register_device_command(CLI::App& app) {
  auto args = std::make_shared<DeviceArgs>();
  CLI::App* cmd = app.add_subcommand("device", "Show a device description: every number with its status and source");
  cmd->add_option("--device", args->file, "Device file (devices/ascend310p.json, ...)");
  cmd->add_flag("--host", args->host, "Describe this machine (detected and measured)");
  cmd->add_option("--threads", args->threads, "With --host: threads to count as cores and to measure with (0 = all)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--measure-seconds", args->measure_seconds,
                  "With --host: time budget for measuring FMA peak and bandwidth (0 = no measurement, estimates)");
  cmd->add_flag("--json", args->json, "Print the description as JSON (the devices/*.json schema)");
  cmd->callback([args] { run_device(*args); });
}
