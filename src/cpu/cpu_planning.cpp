// The CPU backend's planning rules (PlanBackend, hanpu/plan.hpp): the model-based choice of the
// CPU's free parameters (Plan::cpu) from the device description, the wisdom the caller loaded, the
// fused kernel's operator order, and the order of column blocks. They live here, next to the
// kernels whose facts they use (cpu/kernel_facts.hpp, the arena layout of cpu/lowering.hpp), and
// read only their arguments: the same (problem, device, options) plans the same on any machine.
#include "cpu/cpu_planning.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "cpu/kernel_facts.hpp"
#include "cpu/lowering.hpp"
#include "hanpu/host_device.hpp"
#include "hanpu/plan.hpp"
#include "hanpu/plan_exec.hpp"

namespace hanpu {
namespace cpu {

namespace {

std::string kib(double bytes) {
  std::ostringstream s;
  s.precision(bytes >= 10 * 1024 ? 0 : 1);
  s << std::fixed << bytes / 1024 << " KiB";
  return s.str();
}

int64_t buffer_bytes(const Device& dev, const char* name) {
  for (const BufferSpec& b : dev.buffers)
    if (b.name == name) return static_cast<int64_t>(b.capacity_bytes.value);
  return 0;
}

}  // namespace

CpuTuning model_cpu_tuning(const Problem& p, const Device& dev, int cores) {
  CpuTuning t;
  t.source = "model";
  const int64_t l2 = buffer_bytes(dev, "L2"), l1 = buffer_bytes(dev, "L1D");
  const int64_t lanes = std::max<int64_t>(1, static_cast<int64_t>(dev.matrix.tile_n.value));

  // Column block: whole heads while one state (as the arena pads it) takes at most a quarter of
  // the L2, the share max_lockstep_group gives all of a group's states; every narrower block
  // recomputes the chunk's K K^T and Q K^T, so splitting buys nothing until the state crowds out
  // the chunk's intermediates.
  int64_t block = p.V;
  while (block > lanes && l2 > 0 && arena_state_bytes(p.K, block) > l2 / 4)
    block = std::max<int64_t>(lanes, (block / 2 + lanes - 1) / lanes * lanes);
  t.column_block.value = block;
  t.column_block.reason =
      block == p.V ? "whole heads (V = " + std::to_string(p.V) + "): one " + std::to_string(p.K) + " x " + std::to_string(p.V) +
                         " f32 state (" + kib(static_cast<double>(arena_state_bytes(p.K, p.V))) + " as the arena pads its rows) fits a quarter of the " +
                         kib(static_cast<double>(l2)) + " L2; narrower blocks would recompute the grams per block"
                   : std::to_string(block) + " columns: a whole " + std::to_string(p.K) + " x " + std::to_string(p.V) +
                         " state exceeds a quarter of the " + kib(static_cast<double>(l2)) + " L2, a block of " + std::to_string(block) +
                         " columns (" + kib(static_cast<double>(arena_state_bytes(p.K, block))) + ") does not";

  // Lockstep group: as many states as a quarter of the L2 holds (the rest for the chunk's
  // intermediates and the rows in flight), capped by the items a core gets (sequences x value
  // heads x column blocks, dealt out evenly).
  const int by_cache = max_lockstep_group(dev, p.K, block, arena_state_bytes(p.K, block));
  int64_t sequences = 0;
  for (int64_t s = 0; s < p.sequences(); ++s) sequences += p.chunks_of(s) > 0 ? 1 : 0;
  const int64_t items = std::max<int64_t>(1, sequences) * p.HV * ((p.V + block - 1) / block);
  const int64_t heads_per_core = (items + cores - 1) / std::max(1, cores);
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>(by_cache, heads_per_core));
  t.lockstep_group.value = group;
  t.lockstep_group.reason = std::to_string(by_cache) + " state(s) of " + kib(static_cast<double>(arena_state_bytes(p.K, block))) +
                            " fit a quarter of the " + kib(static_cast<double>(l2)) + " L2, the rest left for the chunk's intermediates" +
                            (group < by_cache ? "; capped at the " + std::to_string(heads_per_core) + " items a core gets" : "");

  // GEMM register tile: the tile with the most FMAs per load (rows x vectors / (rows + vectors))
  // among those whose accumulators, B vectors and one broadcast fit the register file, up to the
  // tile the kernels compile for it.
  const int regs = dev.vector.registers.value > 0 ? static_cast<int>(dev.vector.registers.value) : 16;
  const GemmTile limit = compiled_gemm_tile(regs);
  int best_r = 1, best_v = 1;
  double best = 0;
  for (int r = 1; r <= limit.rows; ++r)
    for (int v = 1; v <= limit.vectors; ++v) {
      if (r * v + v + 1 > regs) continue;
      const double intensity = static_cast<double>(r * v) / (r + v);
      if (intensity > best + 1e-12) best = intensity, best_r = r, best_v = v;
    }
  const std::string tile_why = std::to_string(best_r) + " x " + std::to_string(best_v) + " vectors of " + std::to_string(lanes) +
                               " lanes: " + std::to_string(best_r * best_v) + " accumulators + " + std::to_string(best_v) +
                               " B vectors + 1 broadcast = " + std::to_string(best_r * best_v + best_v + 1) + " of " +
                               std::to_string(regs) + " vector registers, the most FMAs per load (" + std::to_string(best_r * best_v) +
                               " per " + std::to_string(best_r + best_v) + ") of the tiles the kernels compile (up to " +
                               std::to_string(limit.rows) + " x " + std::to_string(limit.vectors) + ")";
  t.gemm_rows = {best_r, tile_why};
  t.gemm_vectors = {best_v, tile_why};

  // Prefetch: the next item's rows of one chunk (q, k, v and KDA's g) go into L2 while the GEMM
  // tiles run, spread evenly over the tiles: the fewest line-fill buffers taken from the tiles' own
  // refills at any moment that still finishes one chunk ahead. Without an L2 beyond the L1D there
  // is nowhere to prefetch to that the GEMM operands do not need.
  const int64_t in_bytes = static_cast<int64_t>(dtype_size(p.qkv_dtype));
  const int64_t lines = p.chunk * ((2 * p.K + std::min(block, p.V)) * in_bytes + (variant_traits(p.variant).channel_gate() ? p.K * 4 : 0)) / 64;
  if (l2 > l1 && l2 > 0)
    t.prefetch_rate = {1, "the next item's ~" + std::to_string(lines) + " lines of a chunk into the " + kib(static_cast<double>(l2)) +
                              " L2, spread evenly over the chunk's GEMM tiles (the fewest line-fill buffers taken from the tiles' refills)"};
  else
    t.prefetch_rate = {0, "no L2 larger than the L1D to prefetch into"};
  choose_cpu_arena(t, p, dev);
  return t;
}

void choose_cpu_arena(CpuTuning& t, const Problem& p, const Device& dev) {
  // The kernels' own layout (cpu/kernels.hpp via cpu/lowering.hpp) for a full group of full-width
  // items, in the largest program the lowering can make of a plan's order: the arena then holds
  // any head-fused kernel the planner cuts with these two values.
  const bool bf16 = dev.cpu.bf16_gram && variant_traits(p.variant).head_gate() && p.qkv_dtype == DType::BF16;
  const int64_t width = std::min(t.column_block.value, p.V), group = t.lockstep_group.value;
  const ArenaBound b = fused_arena_bound(p, width, static_cast<size_t>(group), bf16);
  const int64_t l2 = buffer_bytes(dev, "L2");
  const double per_state = static_cast<double>(b.state_bytes) / static_cast<double>(std::max<int64_t>(1, group));
  const bool two = !b.program.state_in_place;
  t.arena_bytes.value = static_cast<int64_t>(b.bytes);
  t.arena_bytes.reason =
      "lockstep_group " + std::to_string(group) + " x " + (two ? "2 states (double-buffered) " : "1 state ") + "of " +
      kib(per_state / (two ? 2 : 1)) + " (K " + std::to_string(p.K) + " x " + std::to_string(width) + " columns, padded rows) + chunk " +
      std::to_string(p.chunk) + " intermediates " + kib(static_cast<double>(b.bytes - b.state_bytes)) +
      (bf16 ? " (bf16 gram rows included)" : "") + " = " + kib(static_cast<double>(b.bytes)) +
      " per thread, the largest of the fused programs (" + (b.program.gemm_first ? "GEMM-first" : "W/U form") + ")" +
      (l2 > 0 ? std::string(b.bytes <= static_cast<size_t>(l2) ? ", within" : ", beyond") + " the " + kib(static_cast<double>(l2)) + " L2"
              : "");
}


namespace {

CpuTuning plan_cpu_tuning(const Problem& p, const Device& dev, int cores, const PlanOptions& opt) {
  CpuTuning t = model_cpu_tuning(p, dev, cores);
  // Wisdom the caller loaded (the rules read no file): entries keyed by this device's CPU model and
  // ISA apply, others are named as ignored.
  if (opt.wisdom) {
    apply_wisdom(t, *opt.wisdom, opt.wisdom_origin, p, cores, WisdomMachine{dev.cpu.model, dev.cpu.isa});
    validate_cpu_tuning(t, p.V, opt.wisdom_origin + ": the entry for " + wisdom_problem_class(p, cores) + ": params");
  }
  if (opt.cpu)
    for (const std::string& name : cpu_param_names()) {
      const CpuParam& given = cpu_param(*opt.cpu, name);
      // Given: a value other than 0, or a reason (prefetch_rate 0, prefetch off, is a value).
      if (given.value == 0 && given.reason.empty()) continue;
      cpu_param(t, name) = {given.value, given.reason.empty() ? "given explicitly (PlanOptions.cpu)" : given.reason};
    }
  // The arena follows the group and column block finally chosen, unless given explicitly.
  if (opt.cpu && opt.cpu->arena_bytes.value != 0)
    t.arena_bytes = {opt.cpu->arena_bytes.value,
                     opt.cpu->arena_bytes.reason.empty() ? "given explicitly (PlanOptions.cpu)" : opt.cpu->arena_bytes.reason};
  else
    choose_cpu_arena(t, p, dev);
  validate_cpu_tuning(t, p.V, "PlanOptions.cpu");
  return t;
}

}  // namespace

void order_blocks_for_lockstep(std::vector<PlanItem>& items) {
  // Within each run of whole-head items (tier 1) of one sequence, block b of every head before
  // block b + 1 of any: like column blocks of neighbouring heads become adjacent, so they can
  // share a lockstep group (their rows of one token lie side by side in q, k, v and o).
  for (size_t i = 0; i < items.size();) {
    size_t j = i;
    while (j < items.size() && items[j].tier == 1 && items[j].seq == items[i].seq) ++j;
    if (j == i) {
      ++i;
      continue;
    }
    std::stable_sort(items.begin() + static_cast<std::ptrdiff_t>(i), items.begin() + static_cast<std::ptrdiff_t>(j),
                     [](const PlanItem& a, const PlanItem& b) { return a.col0 < b.col0; });
    i = j;
  }
}



namespace {

class CpuPlanBackend final : public PlanBackend {
 public:
  CpuTuning tune(const Problem& p, const Device& dev, int cores, const PlanOptions& opt) const override {
    return plan_cpu_tuning(p, dev, cores, opt);
  }
  // The fused kernel's order: the graph's default; in the GEMM-first form the state GEMMs (ks, qs)
  // right after the gate, before the grams. That is the order of the hand-wired CPU schedule that
  // plans replaced, whose speed the default path must keep; the grams first measured no faster on
  // the bench shapes (docs/bench/history.md, "One plan drives the CPU").
  std::vector<OpId> fused_order(const OpGraph& g) const override {
    std::vector<OpId> order;  // the graph's default: its operators in definition order
    for (const OperatorDef& op : g.ops) order.push_back(op.id);
    if (g.form != GraphForm::GemmFirst) return order;
    std::vector<OpId> front, rest;
    for (const OperatorDef& op : g.ops) (op.id == OpId::Gate || is_decay_operator(op.id) ? front : rest).push_back(op.id);
    for (const OpId o : {OpId::Ks, OpId::Qs}) {
      rest.erase(std::find(rest.begin(), rest.end(), o));
      front.push_back(o);
    }
    front.insert(front.end(), rest.begin(), rest.end());
    return front;
  }
  void order_column_blocks(std::vector<PlanItem>& items) const override { order_blocks_for_lockstep(items); }
};

}  // namespace
}  // namespace cpu

const PlanBackend& cpu_plan_backend() {
  static const cpu::CpuPlanBackend backend;
  return backend;
}

PlanOptions cpu_plan_options(const Device& dev, PlanOptions opt) {
  opt.backend = &cpu_plan_backend();
  // Wisdom describes the machine the process runs on, so only plans for the host device read it;
  // the file the process is configured for is read now and handed to the planner.
  if (dev.kind == DeviceKind::Cpu && dev.name == "host" && !opt.wisdom) {
    const std::string path = default_wisdom_path();
    if (!path.empty()) {
      opt.wisdom = std::make_shared<const Wisdom>(read_wisdom(path));
      opt.wisdom_origin = path;
    }
  }
  return opt;
}

WisdomMachine this_machine() {
  const Device host = host_device(1, 0.0);
  return {host.cpu.model, host.cpu.isa};
}

}  // namespace hanpu
