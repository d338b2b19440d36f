// The planners: HA-NPU (head-level mapping with tail tiers, lifetime-aware reordering, layout DP)
// and the baselines (vLLM-Ascend, FLA, FLA + MegaKernel, FlashQLA) as plans of the same graph,
// plus the ablation steps between FLA and HA-NPU (the paper's techniques and the baselines it compares with).
//
// A strategy is: a graph form and operator order, a grouping of the operators into kernels, a
// mapping of each kernel's work onto cores, and a layout per on-core tensor. Everything a kernel
// reads that it does not produce comes from GM; everything a later kernel needs goes to GM.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "hanpu/plan.hpp"
#include "plan/lower.hpp"

namespace hanpu {

namespace {

using plan_detail::LowerContext;

// FLA's V tile of the state recurrence on NPUs (FLA's fla/ops/common/chunk_delta_h.py: BV in {32, 64}; the Ascend
// Triton port picks the UB-friendly 64).
constexpr int kFlaStateColumns = 64;
// vLLM-Ascend's fwd_h kernel takes value-column blocks of 128 (vLLM-Ascend's chunk kernels: vBlockSize).
constexpr int kVllmStateColumns = 128;
// FlashQLA's segment length rule (FlashQLA's segment planning): max(4, 2^round(log2(3 sqrt(H chunks / SMs)))).
constexpr double kFlashQlaSegmentFactor = 3.0;
constexpr int64_t kFlashQlaMinSegmentChunks = 4;

std::vector<PlanItem> whole_items(const Problem& p, int width) {
  std::vector<PlanItem> items;
  for (int64_t s = 0; s < p.sequences(); ++s) {
    const int64_t nc = p.chunks_of(s);
    if (nc == 0) continue;
    for (int64_t h = 0; h < p.HV; ++h)
      for (int64_t c0 = 0; c0 < p.V; c0 += width)
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h), static_cast<int32_t>(c0),
                         static_cast<int32_t>(std::min<int64_t>(p.V, c0 + width)), 0, nc, 0});
  }
  return items;
}

std::vector<std::vector<PlanItem>> round_robin(const std::vector<PlanItem>& items, int cores) {
  std::vector<std::vector<PlanItem>> out(static_cast<size_t>(std::max(1, cores)));
  for (size_t i = 0; i < items.size(); ++i) out[i % out.size()].push_back(items[i]);
  return out;
}

void append_ops(std::vector<OpId>& order, const std::vector<OpId>& ids) { order.insert(order.end(), ids.begin(), ids.end()); }

// A strategy's own kernel (KernelRole::Named).
Kernel kernel(const std::string& name, Parallel parallel, std::vector<OpId> order) {
  Kernel k;
  k.name = name;
  k.parallel = parallel;
  k.order = std::move(order);
  return k;
}

// A kernel whose role the backends know (the fused kernel, the tail kernels): named after it.
Kernel kernel(KernelRole role, Parallel parallel, std::vector<OpId> order) {
  Kernel k = kernel(kernel_role_name(role), parallel, std::move(order));
  k.role = role;
  return k;
}

bool reads(const OpGraph& g, const Kernel& k, const std::string& t) {
  for (const OpId o : k.order) {
    const auto& in = g.op(o).inputs;
    if (std::find(in.begin(), in.end(), t) != in.end()) return true;
  }
  return false;
}

bool produces(const OpGraph& g, const Kernel& k, const std::string& t) {
  for (const OpId o : k.order) {
    const auto& out = g.op(o).outputs;
    if (std::find(out.begin(), out.end(), t) != out.end()) return true;
  }
  return false;
}

// Produced before its first read inside the kernel (the state is carried instead).
bool produced_before_read(const OpGraph& g, const Kernel& k, const std::string& t) {
  for (const OpId o : k.order) {
    const OperatorDef& op = g.op(o);
    if (std::find(op.inputs.begin(), op.inputs.end(), t) != op.inputs.end()) return false;
    if (std::find(op.outputs.begin(), op.outputs.end(), t) != op.outputs.end()) return true;
  }
  return false;
}

// Splits an order into the state-independent Map operators, the state recurrence (operators the
// next state depends on) and the rest (the output), for chunk-parallel execution.
struct Phases {
  std::vector<OpId> map, reduce, output;
};
Phases split_phases(const OpGraph& g, const std::vector<OpId>& order) {
  std::set<std::string> dep_state = {"S"};
  std::set<OpId> ops_dep;
  for (const OpId o : order) {
    const OperatorDef& op = g.op(o);
    bool d = false;
    for (const std::string& in : op.inputs) d |= dep_state.count(in) > 0;
    if (d) {
      ops_dep.insert(o);
      for (const std::string& out : op.outputs) dep_state.insert(out);
    }
  }
  // Backward: operators whose results reach the state update.
  const std::string s_out = g.state_in_place ? "S" : "S_next";
  std::set<std::string> needed = {s_out};
  std::set<OpId> ops_needed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const OperatorDef& op = g.op(*it);
    bool n = false;
    for (const std::string& out : op.outputs) n |= needed.count(out) > 0;
    if (n) {
      ops_needed.insert(*it);
      for (const std::string& in : op.inputs) needed.insert(in);
    }
  }
  Phases ph;
  for (const OpId o : order) {
    if (!ops_dep.count(o)) ph.map.push_back(o);
    else if (ops_needed.count(o)) ph.reduce.push_back(o);
    else ph.output.push_back(o);
  }
  return ph;
}

std::vector<OpId> default_order(const OpGraph& g) {
  std::vector<OpId> o;
  for (const OperatorDef& op : g.ops) o.push_back(op.id);
  return o;
}

// Kernels running `items` the FLA way: Map phases chunk-parallel over all cores, the recurrence
// head-parallel on column blocks of `state_cols`, the output chunk-parallel.
std::vector<Kernel> tail_kernels(const Problem& p, const OpGraph& g, const std::vector<OpId>& order,
                                 const std::vector<PlanItem>& items, int cores, int state_cols) {
  const Phases ph = split_phases(g, order);
  std::vector<Kernel> ks;
  Kernel map = kernel(KernelRole::TailMap, Parallel::Chunk, ph.map);
  map.cores = map_chunks(p, items, cores);
  ks.push_back(map);
  Kernel red = kernel(KernelRole::TailState, Parallel::Head, ph.reduce);
  std::vector<PlanItem> blocks;
  for (const PlanItem& it : items)
    for (int32_t c0 = it.col0; c0 < it.col1; c0 += state_cols) {
      PlanItem b = it;
      b.col0 = c0, b.col1 = std::min(it.col1, c0 + state_cols);
      blocks.push_back(b);
    }
  red.cores = round_robin(blocks, cores);
  red.state_in = StateIn::Initial, red.state_out = StateOut::Final;
  ks.push_back(red);
  Kernel out = kernel(KernelRole::TailOutput, Parallel::Chunk, ph.output);
  out.cores = map_chunks(p, items, cores);
  ks.push_back(out);
  return ks;
}

int matrix_quantum(const Device& dev) { return std::max(1, static_cast<int>(dev.matrix.tile_n.value)); }

struct Recipe {
  GraphForm form = GraphForm::GemmFirst;
  bool in_place = true;
  bool layout = false;
  bool spill = false;
};

void add_decay(std::vector<Kernel>& ks, const OpGraph& g);

// Head-level mapping (with the chunk-parallel fallback for tier-3 items) of one fused kernel.
std::vector<Kernel> head_mapped_kernels(const Problem& p, const Device& dev, const OpGraph& g, int cores,
                                        const std::vector<OpId>& order) {
  const HeadMapping m = map_heads(p, cores, matrix_quantum(dev));
  std::vector<Kernel> ks;
  const bool any = std::any_of(m.cores.begin(), m.cores.end(), [](const auto& l) { return !l.empty(); });
  if (any) {
    Kernel fused = kernel(KernelRole::Fused, Parallel::Head, order.empty() ? default_order(g) : order);
    fused.cores = m.cores;
    fused.state_in = StateIn::Initial, fused.state_out = StateOut::Final;
    ks.push_back(fused);
  }
  if (!m.chunk_parallel.empty()) {
    // Tier 3: the recurrence of these heads split over columns as far as the quantum allows.
    const int quantum = matrix_quantum(dev);
    const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cores, (p.V + quantum - 1) / quantum)));
    const int cols = static_cast<int>((p.V + blocks - 1) / blocks + quantum - 1) / quantum * quantum;
    auto tail = tail_kernels(p, g, default_order(g), m.chunk_parallel, cores, cols);
    add_decay(tail, g);
    for (Kernel& k : tail)
      for (auto& list : k.cores)
        for (PlanItem& it : list) it.tier = 3;
    ks.insert(ks.end(), tail.begin(), tail.end());
  }
  return ks;
}

// KDA: every kernel that multiplies decayed q/k forms exactly the decayed operands it reads,
// after the gate (FLA recomputes them in each kernel instead of storing four L x K copies per
// chunk); a decay operator whose operand no other operator of its kernel reads is dropped (the
// chunk-parallel split puts every decay in the Map phase).
void add_decay(std::vector<Kernel>& ks, const OpGraph& g) {
  if (!variant_traits(g.variant).channel_gate()) return;
  auto read_in = [&](const Kernel& k, const OpId decay) {
    const std::string& operand = g.op(decay).outputs.at(0);
    for (const OpId o : k.order)
      if (o != decay)
        for (const std::string& in : g.op(o).inputs)
          if (in == operand) return true;
    return false;
  };
  for (Kernel& k : ks) {
    std::vector<OpId> kept;
    for (const OpId o : k.order)
      if (!is_decay_operator(o) || read_in(k, o)) kept.push_back(o);
    k.order = kept;
    std::vector<OpId> missing;
    for (const OpId op : kda_decay_operators())
      if (std::find(k.order.begin(), k.order.end(), op) == k.order.end() && read_in(k, op)) missing.push_back(op);
    auto gate = std::find(k.order.begin(), k.order.end(), OpId::Gate);
    k.order.insert(gate == k.order.end() ? k.order.begin() : gate + 1, missing.begin(), missing.end());
  }
}

// A format conversion kernel (transdata_kernel): its steps get the tensor's element size as the
// plan keeps it in GM (fp16 for inputs and for fp32 results only the matrix unit reads later),
// its load is double-buffered (the next chunk's tile arrives while this one is converted), and
// its lifetimes are the tile and its converted copy in the vector buffer.
void finish_conversion_kernel(Kernel& k, const Device& dev, const OpGraph& g, const std::set<std::string>& f16_in_gm, const Problem& p) {
  const TensorDef& t = g.tensor(k.steps.front().tensor);
  const int elem = f16_in_gm.count(t.name) ? 2 : static_cast<int>(dtype_size(t.dtype));
  for (Step& st : k.steps) st.elem_bytes = elem;
  int64_t width = 0;
  for (const auto& l : k.cores)
    for (const PlanItem& it : l) width = std::max<int64_t>(width, it.col1 - it.col0);
  const int64_t bytes = tensor_bytes(t, p.chunk, p.K, width > 0 ? width : p.V) / static_cast<int64_t>(dtype_size(t.dtype)) * elem;
  const std::string ub = dev.vector.buffer;
  for (const auto& [st, from, to] : {std::tuple{&k.steps[0], std::string("GM"), ub}, std::tuple{&k.steps[2], ub, std::string("GM")}}) {
    if (!dev.has_path(from, to))
      throw Error("device " + dev.name + ": framework_matmul_transdata_per_tensor is " +
                  std::to_string(static_cast<int>(dev.framework_matmul_transdata_per_tensor.value)) + ", but there is no path " + from + "->" +
                  to + " for a TransData kernel to move its tiles on");
    const PathSpec& path = dev.path(from, to);
    st->path = path.name();
    st->engine = path.engine.empty() ? path.name() : path.engine;
  }
  k.double_buffered = {t.name};
  k.buffering = 2;
  k.steps[0].reuse_of = 1;  // the next tile overwrites this one once it is converted
  k.steps[1].reuse_of = 2;  // the converted copy, once it is stored
  k.lifetimes = {{t.name, ub, 0, 1, bytes, 1}, {t.name + "(converted)", ub, 1, 2, bytes, 1}, {t.name + "(next chunk)", ub, 0, 2, bytes, 1}};
  const int64_t reserved = static_cast<int64_t>(dev.buffer(ub).reserved_bytes.value);
  if (reserved > 0) k.lifetimes.push_back({"(reserved)", ub, 0, 2, reserved, 1});
  k.peak_bytes = {{ub, 3 * bytes + reserved}};
  k.peak_tensors = {{ub, {}}};
  for (const Lifetime& lt : k.lifetimes)
    if (lt.first <= 1 && 1 <= lt.last) k.peak_tensors[ub].push_back(lt.tensor);
  if (static_cast<double>(k.peak_bytes[ub]) > dev.buffer(ub).capacity_bytes.value)
    throw Error("plan on " + dev.name + ": kernel " + k.name + " needs " + std::to_string(k.peak_bytes[ub]) + " bytes of " + ub +
                " for a tile, its converted copy and the next tile, capacity " +
                std::to_string(static_cast<int64_t>(dev.buffer(ub).capacity_bytes.value)));
}

// Decides which tensors cross kernels, lowers every kernel (with the capacity check), fills the plan.
void finish_plan(Plan& plan, const Device& dev, const OpGraph& g) {
  const Problem& p = plan.problem;
  std::vector<Kernel>& ks = plan.kernels;
  // Pass 1: what each kernel reads from and stores to GM, and which fp32 tensors are kept in GM as
  // fp16. Pass 2 lowers every kernel with the GM precision known to readers too.
  std::vector<LowerContext> cxs(ks.size());
  std::set<std::string> f16_in_gm;
  for (size_t i = 0; i < ks.size(); ++i) {
    LowerContext& cx = cxs[i];
    cx.graph = &g;
    cx.device = &dev;
    cx.layouts = plan.layouts;
    cx.K = p.K;
    for (const TensorDef& t : g.tensors)
      if (t.role == TensorRole::Input) cx.from_gm.insert(t.name);
    for (const TensorDef& t : g.tensors) {
      if (t.role == TensorRole::Input) continue;
      const bool carried_here = t.role == TensorRole::State && ks[i].state_in != StateIn::None;
      if (reads(g, ks[i], t.name) && !carried_here && !produced_before_read(g, ks[i], t.name)) cx.from_gm.insert(t.name);
      // Stored if a later kernel reads it without producing it first, before another producer.
      if (produces(g, ks[i], t.name) || (t.name == "S" && carried_here)) {
        bool later_matrix_only = true, stored = false;
        for (size_t j = i + 1; j < ks.size(); ++j) {
          const bool carried_there = t.role == TensorRole::State && ks[j].state_in != StateIn::None;
          if (reads(g, ks[j], t.name) && !carried_there && !produced_before_read(g, ks[j], t.name)) {
            stored = true;
            for (const OpId o : ks[j].order) {
              const OperatorDef& op = g.op(o);
              if (op.unit != Unit::Matrix && std::find(op.inputs.begin(), op.inputs.end(), t.name) != op.inputs.end())
                later_matrix_only = false;
            }
          }
          if (produces(g, ks[j], t.name)) break;
        }
        if (stored) {
          cx.to_gm.insert(t.name);
          // Intermediates go to GM in the input precision as FLA stores them (FLA's chunk kernels
          // store w, u, h, v_new in k.dtype); gate sums stay fp32, and so does A, which
          // chunk_scaled_dot_kkt_fwd writes with output_dtype=torch.float32 for solve_tril
          // (fla/ops/gated_delta_rule/chunk.py). The state snapshot h feeds only matrix products.
          if (t.dtype == DType::F32 && t.name != "Gc" && t.name != "A" && (t.role != TensorRole::State || later_matrix_only))
            f16_in_gm.insert(t.name);
        }
      }
    }
  }
  const int64_t quantum = matrix_quantum(dev);
  for (size_t i = 0; i < ks.size(); ++i) {
    LowerContext& cx = cxs[i];
    cx.f16_in_gm = f16_in_gm;
    if (ks[i].order.empty() && !ks[i].steps.empty()) {
      finish_conversion_kernel(ks[i], dev, g, f16_in_gm, p);
      continue;
    }
    int64_t width = 0;
    for (const auto& l : ks[i].cores)
      for (const PlanItem& it : l) width = std::max<int64_t>(width, it.col1 - it.col0);
    const std::vector<std::string> spilled = ks[i].spilled;
    for (;;) {
      try {
        ks[i].spilled = spilled;  // a narrower retry starts from the kernel's own spills
        plan_detail::lower_with_capacity(ks[i], cx, p.chunk, width > 0 ? width : p.V, plan.allow_spill, plan.strategy);
        break;
      } catch (const Error&) {
        // FLA's kernels tile the value columns (BV): a kernel other than the fused one whose chunk
        // does not fit the buffers runs on column blocks half as wide (the fused kernel's own loop
        // in make_plan does this for it). Plans that fit are unchanged.
        if (ks[i].role == KernelRole::Fused || width <= quantum) throw;
        width = (width / 2 + quantum - 1) / quantum * quantum;
        for (auto& list : ks[i].cores) {
          std::vector<PlanItem> split;
          for (const PlanItem& it : list)
            for (int32_t c0 = it.col0; c0 < it.col1; c0 += static_cast<int32_t>(width)) {
              PlanItem b = it;
              b.col0 = c0, b.col1 = std::min<int32_t>(it.col1, c0 + static_cast<int32_t>(width));
              split.push_back(b);
            }
          list = split;
        }
      }
    }
  }
}

void plan_layouts(Plan& plan, const Device& dev, const OpGraph& g) {
  plan.layouts.clear();
  for (const TensorDef& t : g.tensors)
    if (plan_detail::is_layout_decision(t) && t.name != "S_next") plan.layouts[t.name] = Layout::Dense;
  if (!plan.layout_planned) return;
  // One DP per distinct order; the fused kernel's order is the one that matters (baselines do not
  // plan layouts), so it is solved on the full default order.
  const LayoutProblem lp = layout_problem(g, default_order(g), dev, plan.problem.chunk, plan.problem.K, plan.problem.V);
  const LayoutSolution sol = solve_layouts_dp(lp);
  for (size_t i = 0; i < lp.tensors.size(); ++i) plan.layouts[lp.tensors[i]] = sol.layout[i];
}


// ---------------------------------------------------------------------------------------------
// The strategies: each a recipe (form, state handling, layout planning, spills) and a way to
// group the operators into kernels mapped onto cores.

using KernelBuilder = std::vector<Kernel> (*)(const Problem& p, const Device& dev, const OpGraph& g, int cores);

// FLA's forward as its public fla/ops/gated_delta_rule/chunk.py (fla-org/flash-linear-attention,
// the versions ported to Ascend) runs it: chunk_local_cumsum, chunk_scaled_dot_kkt_fwd (A = the
// gated, beta-scaled K K^T, stored to GM in fp32), solve_tril (reads A, writes (I + A)^-1),
// recompute_w_u_fwd, chunk_gated_delta_rule_fwd_h, chunk_fwd_o: six kernels, A materialized between
// the second and the third. FLA's KDA (fla/ops/kda/chunk.py; vLLM-Ascend's port in
// vllm_ascend/ops/triton/kda/kda.py, chunk_kda_fwd) runs the same six stages
// (chunk_kda_scaled_dot_kkt_fwd, solve_tril, recompute_w_u_fwd, chunk_gated_delta_rule_fwd_h,
// chunk_gla_fwd_o_gk after the cumsum).
std::vector<Kernel> fla_kernels(const Problem& p, const OpGraph& g, int cores, bool megakernel) {
  const auto items = whole_items(p, static_cast<int>(p.V));
  Kernel cumsum = kernel("chunk_local_cumsum", Parallel::Chunk, std::vector<OpId>{OpId::Gate});
  Kernel kkt = kernel("chunk_scaled_dot_kkt_fwd", Parallel::Chunk, std::vector<OpId>{OpId::Kkt, OpId::KktGate});
  Kernel solve = kernel("solve_tril", Parallel::Chunk, std::vector<OpId>{OpId::SolveDiag, OpId::SolveInv});
  Kernel wu = kernel("recompute_w_u", Parallel::Chunk, std::vector<OpId>{OpId::WuScale, OpId::Wu});
  std::vector<OpId> h_ops = std::vector<OpId>{OpId::Ws, OpId::Vnew};
  if (variant_traits(p.variant).head_gate()) h_ops.push_back(OpId::UpdateGate);
  append_ops(h_ops, {OpId::Update, OpId::StateAdd});
  Kernel h = kernel("fwd_h", Parallel::Head, h_ops);
  h.state_in = StateIn::Initial, h.state_out = StateOut::Final;
  h.cores = round_robin(whole_items(p, kFlaStateColumns), cores);
  Kernel o = kernel("fwd_o", Parallel::Chunk, std::vector<OpId>{OpId::Qkt, OpId::QktGate, OpId::Qs, OpId::Pv, OpId::Out});
  for (Kernel* k : {&cumsum, &kkt, &solve, &wu, &o}) k->cores = map_chunks(p, items, cores);
  std::vector<Kernel> ks = {cumsum, kkt, solve, wu, h, o};
  add_decay(ks, g);
  if (megakernel)
    for (size_t i = 1; i < ks.size(); ++i) ks[i].launch = false;
  return ks;
}

std::vector<Kernel> fla_separate_kernels(const Problem& p, const Device&, const OpGraph& g, int cores) { return fla_kernels(p, g, cores, false); }
std::vector<Kernel> fla_megakernel_kernels(const Problem& p, const Device&, const OpGraph& g, int cores) { return fla_kernels(p, g, cores, true); }

// A framework format conversion (torch_npu's TransData, ND <-> NZ) of one tensor as a kernel of
// its own: per chunk, the tensor's tile from GM into the vector buffer, the layout transform on the
// vector unit, the converted tile back to GM. It computes no operator (empty order); its steps
// serve the matrix operator whose operand or result it converts, and finish_plan gives them the
// tensor's element size in GM. So it pays what every kernel pays (launch, boundary, DMA set-ups,
// vector start-up) plus its GM round trip and its transform.
Kernel transdata_kernel(const std::string& tensor, OpId serves, const char* direction) {
  Kernel k = kernel("transdata_" + tensor + "_" + direction, Parallel::Chunk, {});
  Step load;
  load.kind = StepKind::Move, load.op = serves, load.tensor = tensor, load.lane = StepLane::Dma;  // path: finish_conversion_kernel
  Step convert;
  convert.kind = StepKind::Transform, convert.op = serves, convert.tensor = tensor, convert.lane = StepLane::Vector;
  convert.deps = {0};
  Step store;
  store.kind = StepKind::Move, store.op = serves, store.tensor = tensor, store.lane = StepLane::Dma;
  store.deps = {1};
  k.steps = {load, convert, store};
  return k;
}

// The TransData kernels a framework matmul runs around one product on `dev`: per ND operand and
// per ND result, dev.framework_matmul_transdata_per_tensor of them (docs/SIMULATION.md section 8:
// on the 310P the aclnn matmul converts its fp32 ND operands to NZ and its NZ result back; the
// Cast kernels it also runs are not charged, since the plan keeps those operands fp16 in GM).
void add_transdata(std::vector<Kernel>& ks, const Device& dev, const std::vector<std::string>& operands, OpId matmul,
                   const std::vector<std::string>& results, bool before) {
  const int per_tensor = static_cast<int>(dev.framework_matmul_transdata_per_tensor.value);
  for (int r = 0; r < per_tensor; ++r)
    for (const std::string& t : before ? operands : results) ks.push_back(transdata_kernel(t, matmul, before ? "nd_to_nz" : "nz_to_nd"));
}

std::vector<Kernel> vllm_ascend_kernels(const Problem& p, const Device& dev, const OpGraph& g, int cores) {
  // Every operator of the paper its own general-purpose kernel; the recurrence and the output
  // are vLLM-Ascend's two AscendC kernels (docs/DEVICES.md).
  const auto items = whole_items(p, static_cast<int>(p.V));
  // On 310P the WY preparation runs as torch operations, each its own kernel (one per fine
  // operator here), before the two AscendC kernels.
  std::vector<Kernel> ks;
  // The three decayed keys stay one kernel, as they were while the graph had one operator for them.
  struct TorchKernel {
    const char* name;
    std::vector<OpId> ops;
  };
  const TorchKernel torch_kernels[] = {
      {"gate", {OpId::Gate}},           {"decay_q", {OpId::DecayQ}},
      {"decay_k", {OpId::DecayKe, OpId::DecayKi, OpId::DecayKl}},
      {"kkt", {OpId::Kkt}},             {"kkt_gate", {OpId::KktGate}},
      {"solve_diag", {OpId::SolveDiag}}, {"solve_inv", {OpId::SolveInv}},
      {"wu_scale", {OpId::WuScale}},    {"wu", {OpId::Wu}}};
  // The torch matmuls of the WY preparation (vLLM-Ascend's
  // vllm_ascend/_310p/ops/fla/chunk_gated_delta_rule.py, _compute_kernel_inputs_from_torch_wy:
  // k_beta @ key^T, then attn @ v_beta and attn @ k_beta e^g, all on fp32 ND tensors) each get
  // their TransData kernels: two operands in, one result out; attn is converted once per product
  // (eager torch keeps no converted copy). fwd_h and fwd_o are AscendC kernels that convert on
  // the fly in their DMA (no TransData).
  for (const TorchKernel& tk : torch_kernels) {
    if (is_decay_operator(tk.ops.front()) && !variant_traits(p.variant).channel_gate()) continue;
    const OpId first = tk.ops.front();
    const OperatorDef* mm = first == OpId::Kkt || first == OpId::Wu ? &g.op(first) : nullptr;
    std::vector<std::string> results;
    if (mm) {
      results = mm->outputs;
      if (first == OpId::Kkt) add_transdata(ks, dev, mm->inputs, first, results, true);
      else  // W = T kb and U = T vb: T once for each product, then each right operand
        add_transdata(ks, dev, {mm->inputs.at(0), mm->inputs.at(1), mm->inputs.at(0), mm->inputs.at(2)}, first, results, true);
    }
    ks.push_back(kernel(tk.name, Parallel::Chunk, tk.ops));
    if (mm) add_transdata(ks, dev, {}, first, results, false);
  }
  for (Kernel& k : ks) k.cores = map_chunks(p, items, cores);
  std::vector<OpId> h_ops = std::vector<OpId>{OpId::Ws, OpId::Vnew};
  if (variant_traits(p.variant).head_gate()) h_ops.push_back(OpId::UpdateGate);
  append_ops(h_ops, {OpId::Update, OpId::StateAdd});
  Kernel h = kernel("chunk_gated_delta_rule_fwd_h", Parallel::Head, h_ops);
  h.state_in = StateIn::Initial, h.state_out = StateOut::Final;
  h.cores = round_robin(whole_items(p, kVllmStateColumns), cores);
  Kernel o = kernel("chunk_fwd_o", Parallel::Chunk, std::vector<OpId>{OpId::Qkt, OpId::QktGate, OpId::Qs, OpId::Pv, OpId::Out});
  o.cores = map_chunks(p, items, cores);
  ks.push_back(h);
  ks.push_back(o);
  return ks;
}

std::vector<Kernel> flashqla_kernels(const Problem& p, const Device&, const OpGraph& g, int cores) {
  // kkt_solve chunk-parallel; then per segment its end state from a zero start (the extra
  // pre-computation; the transition matrix is skipped by the gate shortcut), chained into the
  // next segment's start state; then all segments in parallel, fused.
  const auto items = whole_items(p, static_cast<int>(p.V));
  std::vector<OpId> prep = std::vector<OpId>{OpId::Gate, OpId::Kkt, OpId::KktGate, OpId::SolveDiag, OpId::SolveInv};
  Kernel ks0 = kernel("kkt_solve", Parallel::Chunk, prep);
  ks0.cores = map_chunks(p, items, cores);
  const double per_core = static_cast<double>(p.HV * p.total_chunks()) / cores;
  const int64_t seg = std::max<int64_t>(kFlashQlaMinSegmentChunks,
                                        static_cast<int64_t>(std::pow(2.0, std::round(std::log2(kFlashQlaSegmentFactor * std::sqrt(per_core))))));
  // Column block: the widest of 128/64/32 that still gives every core an item.
  int64_t segments = 0;
  for (int64_t s = 0; s < p.sequences(); ++s) segments += (p.chunks_of(s) + seg - 1) / seg;
  int64_t bdv = 32;
  for (int64_t w : {128, 64, 32})
    if ((p.V + w - 1) / w * p.HV * segments >= cores) {
      bdv = w;
      break;
    }
  std::vector<PlanItem> seg_items, state_items;
  for (const PlanItem& it : whole_items(p, static_cast<int>(bdv))) {
    for (int64_t c0 = it.chunk0; c0 < it.chunk1; c0 += seg) {
      PlanItem s = it;
      s.chunk0 = c0, s.chunk1 = std::min(it.chunk1, c0 + seg);
      seg_items.push_back(s);
      if (s.chunk1 < it.chunk1) state_items.push_back(s);  // the last segment's end state is not needed
    }
  }
  std::vector<OpId> state_ops = std::vector<OpId>{OpId::Ks, OpId::Rhs, OpId::Apply};
  if (variant_traits(p.variant).head_gate()) state_ops.push_back(OpId::UpdateGate);
  append_ops(state_ops, {OpId::Update, OpId::StateAdd});
  Kernel ks1 = kernel("segment_states", Parallel::Segment, state_ops);
  ks1.state_in = StateIn::Zero, ks1.state_out = StateOut::Segment;
  ks1.cores = round_robin(state_items, cores);
  std::vector<OpId> fwd = std::vector<OpId>{OpId::Ks, OpId::Qs, OpId::Qkt, OpId::QktGate, OpId::Rhs, OpId::Apply, OpId::Pv, OpId::Out};
  if (variant_traits(p.variant).head_gate()) fwd.push_back(OpId::UpdateGate);
  append_ops(fwd, {OpId::Update, OpId::StateAdd});
  Kernel ks2 = kernel("fused_fwd", Parallel::Segment, fwd);
  ks2.state_in = StateIn::Initial, ks2.state_out = StateOut::Final;
  ks2.cores = round_robin(seg_items, cores);
  std::vector<Kernel> ks = {ks0};
  if (!state_items.empty()) ks.push_back(ks1);
  ks.push_back(ks2);
  add_decay(ks, g);
  return ks;
}

struct StrategyDef {
  const char* name;
  bool listed;    // in strategy_names() (the strategies the paper compares)
  bool ablation;  // a step of ablation_names() (FLA -> HA-NPU)
  Recipe recipe;
  KernelBuilder build;  // null: HA-NPU's head-level mapping of one fused kernel (with tail tiers)
};

// In strategy_names() / ablation_names() order.
const std::vector<StrategyDef>& strategies() {
  static const std::vector<StrategyDef> defs = {
      {"vllm-ascend", true, false, {GraphForm::WU, false, false, true}, vllm_ascend_kernels},
      {"fla", true, true, {GraphForm::WU, false, false, true}, fla_separate_kernels},
      {"fla-megakernel", true, false, {GraphForm::WU, false, false, true}, fla_megakernel_kernels},
      {"flashqla", true, false, {GraphForm::Inverse, true, false, true}, flashqla_kernels},
      {"hanpu", true, false, {GraphForm::GemmFirst, true, true, false}, nullptr},
      {"fla+mapping", false, true, {GraphForm::WU, false, false, true}, nullptr},
      {"fla+mapping+reordering", false, true, {GraphForm::GemmFirst, true, false, true}, nullptr},
      {"fla+mapping+reordering+layout", false, true, {GraphForm::GemmFirst, true, true, false}, nullptr},
  };
  return defs;
}

const StrategyDef& strategy_def(const std::string& name) {
  for (const StrategyDef& d : strategies())
    if (name == d.name) return d;
  std::string names;
  for (const StrategyDef& d : strategies()) names += std::string(" ") + d.name;
  throw Error("strategy: got \"" + name + "\", expected one of" + names);
}

// HA-NPU's head-mapped plan (hanpu and the fla+mapping... steps).
void plan_head_mapped(Plan& plan, const Device& dev, const OpGraph& g, int cores, const PlanOptions& opt) {
  const Problem& p = plan.problem;
  // A head whose state and chunk do not fit the buffers is split into column blocks (columns are
  // independent) run one after another on its core: halve the block until the plan fits.
  const int64_t quantum = matrix_quantum(dev);
  // Lifetime-aware reordering (the +reordering step and hanpu, on an NPU): the order is the
  // reordering pass's; where matrix results leave through a result buffer of their own (L0C)
  // they wait there for their first consumer. A given order (PlanOptions::order) and a CPU (its
  // order is the CPU schedule's) keep theirs.
  std::vector<OpId> order = opt.order;
  if (order.empty() && opt.backend) order = opt.backend->fused_order(g);
  const bool reorder_pass = plan.form == GraphForm::GemmFirst && plan.state_in_place && order.empty();
  const bool results_wait = reorder_pass && dev.matrix.output != dev.vector.buffer;
  if (reorder_pass) {
    const auto result_capacity = results_wait ? static_cast<int64_t>(dev.buffer(dev.matrix.output).capacity_bytes.value) : 0;
    order = lifetime_aware_order(g, p.chunk, p.K, p.V, result_capacity, results_wait).order;
  }
  // On a CPU the column block is the plan's CPU parameter (plan.cpu, the backend's rules).
  const int64_t first_width = plan.cpu.set() ? plan.cpu.column_block.value : p.V;
  for (int64_t width = first_width;; width = (width / 2 + quantum - 1) / quantum * quantum) {
    plan.kernels = head_mapped_kernels(p, dev, g, cores, order);
    for (Kernel& k : plan.kernels) {
      if (k.role != KernelRole::Fused) continue;
      k.results_wait = results_wait;
      for (auto& list : k.cores) {
        std::vector<PlanItem> split;
        for (const PlanItem& it : list)
          for (int32_t c0 = it.col0; c0 < it.col1; c0 += static_cast<int32_t>(width)) {
            PlanItem b = it;
            b.col0 = c0, b.col1 = std::min<int32_t>(it.col1, c0 + static_cast<int32_t>(width));
            split.push_back(b);
          }
        list = split;
        if (opt.backend && width < p.V) opt.backend->order_column_blocks(list);
      }
    }
    try {
      finish_plan(plan, dev, g);
      break;
    } catch (const Error&) {
      if (width <= quantum) throw;
    }
  }
  // Lockstep groups of the fused kernel: consecutive items of a core that share sequence and
  // columns advance chunk by chunk together, as many as the working buffer holds states of.
  for (Kernel& k : plan.kernels) {
    if (k.role != KernelRole::Fused) continue;
    k.groups.clear();
    for (const auto& list : k.cores) {
      int64_t w = 0;
      for (const PlanItem& it : list) w = std::max<int64_t>(w, it.col1 - it.col0);
      k.groups.push_back(lockstep_groups(
          list, plan.cpu.set() ? static_cast<int>(plan.cpu.lockstep_group.value) : max_lockstep_group(dev, p.K, w)));
    }
  }
}

}  // namespace

const char* parallel_name(Parallel p) {
  switch (p) {
    case Parallel::Head: return "head";
    case Parallel::Segment: return "segment";
    case Parallel::Chunk: return "chunk";
  }
  return "?";
}
const char* kernel_role_name(KernelRole r) {
  switch (r) {
    case KernelRole::Named: return "";
    case KernelRole::Fused: return "fused";
    case KernelRole::TailMap: return "tail_map";
    case KernelRole::TailState: return "tail_state";
    case KernelRole::TailOutput: return "tail_output";
  }
  return "";
}
KernelRole kernel_role_of_name(const std::string& name) {
  for (KernelRole r : {KernelRole::Fused, KernelRole::TailMap, KernelRole::TailState, KernelRole::TailOutput})
    if (name == kernel_role_name(r)) return r;
  return KernelRole::Named;
}
const char* state_in_name(StateIn s) {
  switch (s) {
    case StateIn::None: return "none";
    case StateIn::Initial: return "initial";
    case StateIn::Zero: return "zero";
  }
  return "?";
}
const char* state_out_name(StateOut s) {
  switch (s) {
    case StateOut::None: return "none";
    case StateOut::Final: return "final";
    case StateOut::Segment: return "segment";
  }
  return "?";
}

const char* step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::Compute: return "compute";
    case StepKind::Move: return "move";
    case StepKind::Transform: return "transform";
    case StepKind::Cast: return "cast";
    case StepKind::Zero: return "zero";
  }
  return "?";
}
const char* step_when_name(StepWhen w) {
  switch (w) {
    case StepWhen::Every: return "every";
    case StepWhen::First: return "first";
    case StepWhen::Last: return "last";
  }
  return "?";
}
std::string_view step_op_name(StepOp s) {
  switch (s.state) {
    case StateTraffic::None: return operator_name(s.op);
    case StateTraffic::StateIn: return "state_in";
    case StateTraffic::StateOut: return "state_out";
    case StateTraffic::StateSnapshot: return "state_snapshot";
  }
  return "?";
}
std::optional<StepOp> step_op_of_name(std::string_view name) {
  for (StateTraffic s : {StateTraffic::StateIn, StateTraffic::StateOut, StateTraffic::StateSnapshot})
    if (name == step_op_name(s)) return StepOp(s);
  if (const std::optional<OpId> id = operator_id(name)) return StepOp(*id);
  return std::nullopt;
}
std::string step_lane_name(const Step& s) {
  switch (s.lane) {
    case StepLane::Matrix: return "matrix";
    case StepLane::Vector: return "vector";
    case StepLane::Dma: return s.engine;
  }
  return "?";
}

std::vector<std::string> strategy_names() {
  std::vector<std::string> out;
  for (const StrategyDef& d : strategies())
    if (d.listed) out.push_back(d.name);
  return out;
}
std::vector<std::string> ablation_names() {
  std::vector<std::string> out;
  for (const StrategyDef& d : strategies())
    if (d.ablation) out.push_back(d.name);
  return out;
}

Plan make_plan(const Problem& p, const Device& device_file, const std::string& strategy, const PlanOptions& given) {
  validate_problem(p);
  // A backend's rules apply to the devices it executes on: a CPU backend given for an NPU plan
  // (a caller planning every device the same way) changes nothing.
  PlanOptions opt = given;
  if (device_file.kind != DeviceKind::Cpu) opt.backend = nullptr;
  const int cores = opt.cores > 0 ? opt.cores : device_file.core_count();
  // A core count the device describes as a coherent configuration plans with that
  // configuration's clock and bandwidths (the layout DP's costs depend on them), as simulate()
  // runs it; any other count is a mapping experiment on the default's numbers.
  const bool configured = std::any_of(device_file.core_configurations.begin(), device_file.core_configurations.end(),
                                      [&](const CoreConfiguration& c) { return static_cast<int>(c.cores.value) == cores; });
  const Device dev = configured ? device_with_cores(device_file, cores) : device_file;
  if (cores < 1) throw Error("device " + dev.name + ": cores.value must be at least 1");
  const StrategyDef& def = strategy_def(strategy);
  Plan plan;
  plan.problem = p;
  plan.device = dev.name;
  plan.cores = cores;
  plan.strategy = strategy;
  const Recipe& r = def.recipe;
  plan.form = r.form;
  plan.state_in_place = r.in_place;
  plan.layout_planned = r.layout;
  plan.allow_spill = r.spill;
  if (dev.kind == DeviceKind::Cpu) {
    if (!opt.backend)
      throw Error("PlanOptions.backend: device " + dev.name +
                  " is a CPU; its plans need the CPU backend's planning rules (cpu_plan_backend(), hanpu/plan_exec.hpp)");
    plan.cpu = opt.backend->tune(p, dev, cores, opt);
  }
  const OpGraph& g = plan.graph();
  plan_layouts(plan, dev, g);
  if (!opt.order.empty() && def.build)
    throw Error("PlanOptions.order: strategy " + strategy + " has no fused kernel whose order could be given");
  for (const OpId o : opt.order) g.op(o);  // throws naming an operator not of this graph
  if (def.build) {
    plan.kernels = def.build(p, dev, g, cores);
    // The baselines' kernels are general-purpose (torch ops, Triton-style tiles): they multiply
    // full chunk x chunk tiles and mask afterwards, as the hardware-recorded MACs of the paper's
    // method count them.
    for (Kernel& k : plan.kernels) k.masked_full_tiles = true;
    finish_plan(plan, dev, g);
  } else {
    plan_head_mapped(plan, dev, g, cores, opt);
  }
  validate_plan(plan);
  return plan;
}

// ---------------------------------------------------------------------------------------------

void validate_plan(const Plan& plan) {
  const Problem& p = plan.problem;
  validate_problem(p);
  const OpGraph& g = plan.graph();
  auto op_index = [&](const OpId id) {
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].id == id) return i;
    throw Error("plan: unknown operator " + std::string(operator_name(id)));
  };
  auto where = [](size_t k) { return "plan.kernels[" + std::to_string(k) + "]"; };

  // Items per (sequence, head), checked item by item for range; coverage is counted below on a
  // grid compressed to the items' own column and chunk boundaries (cheap at any T).
  struct Rect {
    size_t kernel, core, index;
    PlanItem item;
  };
  std::map<std::pair<int32_t, int32_t>, std::vector<Rect>> per_head;
  std::set<std::string> available;  // in GM after a kernel
  for (const TensorDef& t : g.tensors)
    if (t.role == TensorRole::Input) available.insert(t.name);
  std::vector<std::vector<size_t>> kernel_ops(plan.kernels.size());
  for (size_t ki = 0; ki < plan.kernels.size(); ++ki) {
    const Kernel& k = plan.kernels[ki];
    if (static_cast<int>(k.cores.size()) != plan.cores)
      throw Error(where(ki) + ".cores: " + std::to_string(k.cores.size()) + " lists for " + std::to_string(plan.cores) + " cores");
    for (const OpId o : k.order) kernel_ops[ki].push_back(op_index(o));
    // The chunk program computes exactly the order's operators, in that order.
    std::vector<StepOp> computed, ordered(k.order.begin(), k.order.end());
    for (const Step& st : k.steps)
      if (st.kind == StepKind::Compute) computed.push_back(st.op);
    if (computed != ordered)
      throw Error(where(ki) + ".steps: the compute steps do not run the operators of " + where(ki) +
                  ".order in that order (re-plan after changing the order)");
    for (size_t ci = 0; ci < k.cores.size(); ++ci)
      for (size_t ii = 0; ii < k.cores[ci].size(); ++ii) {
        const PlanItem& it = k.cores[ci][ii];
        const std::string at = where(ki) + ".cores[" + std::to_string(ci) + "][" + std::to_string(ii) + "]";
        if (it.seq < 0 || it.seq >= p.sequences() || it.head < 0 || it.head >= p.HV || it.col0 < 0 || it.col1 > p.V ||
            it.col0 >= it.col1 || it.chunk0 < 0 || it.chunk1 > p.chunks_of(it.seq) || it.chunk0 >= it.chunk1)
          throw Error(at + ": item (seq " + std::to_string(it.seq) + ", head " + std::to_string(it.head) + ", columns " +
                      std::to_string(it.col0) + ":" + std::to_string(it.col1) + ", chunks " + std::to_string(it.chunk0) + ":" +
                      std::to_string(it.chunk1) + ") is out of range");
        if (k.parallel == Parallel::Head && (it.chunk0 != 0 || it.chunk1 != p.chunks_of(it.seq)))
          throw Error(at + ": a head-parallel kernel's item must run all chunks of its sequence in order (the state depends on every earlier chunk)");
        per_head[{it.seq, it.head}].push_back({ki, ci, ii, it});
      }
    // Dependencies: every tensor read is an input, produced earlier in the order, carried, or in GM.
    std::set<std::string> here;
    for (const OpId o : k.order) {
      const OperatorDef& op = g.op(o);
      for (const std::string& in : op.inputs) {
        const bool carried = g.tensor(in).role == TensorRole::State && k.state_in != StateIn::None && k.parallel != Parallel::Chunk;
        if (!here.count(in) && !carried && !available.count(in))
          throw Error(where(ki) + ".order: operator " + std::string(operator_name(o)) + " reads " + in + ", which is not produced before it in kernel " + k.name +
                      (g.tensor(in).role == TensorRole::State ? " (a chunk-parallel kernel cannot carry the state)" : "") +
                      " nor by an earlier kernel");
      }
      for (const std::string& out : op.outputs) here.insert(out);
    }
    for (const std::string& t : here) available.insert(t);
    if (k.state_in != StateIn::None || k.state_out != StateOut::None) available.insert("S");
  }

  // Coverage: no kernel twice on a cell, the output once everywhere, every operator at least once.
  for (int32_t s = 0; s < p.sequences(); ++s) {
    const int64_t nc = p.chunks_of(s);
    if (nc == 0) continue;
    for (int32_t h = 0; h < p.HV; ++h) {
      const auto found = per_head.find({s, h});
      static const std::vector<Rect> none;
      const std::vector<Rect>& rects = found == per_head.end() ? none : found->second;
      std::vector<int64_t> cols = {0, p.V}, chunks = {0, nc};
      for (const Rect& r : rects) {
        cols.push_back(r.item.col0), cols.push_back(r.item.col1);
        chunks.push_back(r.item.chunk0), chunks.push_back(r.item.chunk1);
      }
      for (auto* v : {&cols, &chunks}) {
        std::sort(v->begin(), v->end());
        v->erase(std::unique(v->begin(), v->end()), v->end());
      }
      const size_t ncol = cols.size() - 1, nch = chunks.size() - 1;
      auto idx = [](const std::vector<int64_t>& v, int64_t x) { return static_cast<size_t>(std::lower_bound(v.begin(), v.end(), x) - v.begin()); };
      std::vector<std::vector<uint16_t>> per_kernel(plan.kernels.size());
      for (const Rect& r : rects) {
        auto& grid = per_kernel[r.kernel];
        if (grid.empty()) grid.assign(ncol * nch, 0);
        for (size_t a = idx(cols, r.item.col0); a < idx(cols, r.item.col1); ++a)
          for (size_t b = idx(chunks, r.item.chunk0); b < idx(chunks, r.item.chunk1); ++b)
            if (grid[a * nch + b]++)
              throw Error(where(r.kernel) + ".cores[" + std::to_string(r.core) + "][" + std::to_string(r.index) + "]: (seq " +
                          std::to_string(s) + ", head " + std::to_string(h) + ", column " + std::to_string(cols[a]) + ", chunk " +
                          std::to_string(chunks[b]) + ") is covered twice in kernel " + plan.kernels[r.kernel].name);
      }
      for (size_t oi = 0; oi < g.ops.size(); ++oi) {
        const std::string& op = g.ops[oi].name;
        const bool is_out = g.ops[oi].id == OpId::Out;
        for (size_t a = 0; a < ncol; ++a)
          for (size_t b = 0; b < nch; ++b) {
            int n = 0;
            for (size_t ki = 0; ki < plan.kernels.size(); ++ki)
              if (!per_kernel[ki].empty() && std::find(kernel_ops[ki].begin(), kernel_ops[ki].end(), oi) != kernel_ops[ki].end())
                n += per_kernel[ki][a * nch + b];
            if (is_out ? n != 1 : n == 0)
              throw Error("plan: operator " + op + " runs " + std::to_string(n) + " times on (seq " + std::to_string(s) + ", head " +
                          std::to_string(h) + ", column " + std::to_string(cols[a]) + ", chunk " + std::to_string(chunks[b]) + ")" +
                          (is_out ? ", expected exactly once" : ", expected at least once"));
          }
      }
    }
  }
  // Lockstep groups (after coverage, whose errors say more about a broken mapping): per core,
  // sizes summing to its items, each group of like items.
  for (size_t ki = 0; ki < plan.kernels.size(); ++ki) {
    const Kernel& k = plan.kernels[ki];
    if (!k.groups.empty()) {
      if (k.groups.size() != k.cores.size())
        throw Error(where(ki) + ".groups: " + std::to_string(k.groups.size()) + " lists for " + std::to_string(k.cores.size()) +
                    " cores (one list of group sizes per core, or none)");
      if (k.parallel != Parallel::Head && std::any_of(k.groups.begin(), k.groups.end(), [](const auto& l) { return !l.empty(); }))
        throw Error(where(ki) + ".groups: lockstep groups need a head-parallel kernel, this one is " + std::string(parallel_name(k.parallel)) + "-parallel");
      for (size_t ci = 0; ci < k.groups.size(); ++ci) {
        const std::vector<int32_t>& sizes = k.groups[ci];
        if (sizes.empty()) continue;
        const std::string at = where(ki) + ".groups[" + std::to_string(ci) + "]";
        size_t i = 0;
        for (size_t gi = 0; gi < sizes.size(); ++gi) {
          if (sizes[gi] < 1 || i + static_cast<size_t>(sizes[gi]) > k.cores[ci].size())
            throw Error(at + "[" + std::to_string(gi) + "]: group size " + std::to_string(sizes[gi]) + " at item " + std::to_string(i) +
                        " of " + std::to_string(k.cores[ci].size()) + " items (sizes must be positive and sum to the core's items)");
          const PlanItem& a = k.cores[ci][i];
          for (size_t j = i + 1; j < i + static_cast<size_t>(sizes[gi]); ++j) {
            const PlanItem& b = k.cores[ci][j];
            if (b.seq != a.seq || b.col0 != a.col0 || b.col1 != a.col1 || b.chunk0 != a.chunk0 || b.chunk1 != a.chunk1)
              throw Error(at + "[" + std::to_string(gi) + "]: items " + std::to_string(i) + " and " + std::to_string(j) +
                          " differ in sequence, columns or chunks; a lockstep group advances like items together");
          }
          i += static_cast<size_t>(sizes[gi]);
        }
        if (i != k.cores[ci].size())
          throw Error(at + ": group sizes sum to " + std::to_string(i) + ", the core has " + std::to_string(k.cores[ci].size()) + " items");
      }
    }
  }
}

std::string describe_plan(const Plan& plan) {
  const Problem& p = plan.problem;
  std::ostringstream os;
  os << "plan " << plan.strategy << " for " << variant_name(p.variant) << " on " << plan.device << " (" << plan.cores << " cores)\n";
  os << "  problem: " << p.sequences() << " sequence(s), " << p.total_tokens() << " tokens, H=" << p.H << " HV=" << p.HV << " K=" << p.K
     << " V=" << p.V << " chunk=" << p.chunk << (p.read_initial_state ? ", initial state read" : ", no initial state")
     << (p.write_final_state ? ", final state written" : ", no final state") << "\n";
  os << "  form: " << graph_form_name(plan.form) << (plan.state_in_place ? ", state in place" : ", state double-buffered")
     << (plan.layout_planned ? ", layouts planned" : ", layouts dense") << (plan.allow_spill ? ", spills allowed" : ", no spills") << "\n";
  os.precision(4);
  os << "  total MACs (useful, " << graph_form_name(plan.form) << " form): " << layer_macs(p, plan.form) << "\n";
  for (const Kernel& k : plan.kernels) {
    os << "  kernel " << k.name << " (" << parallel_name(k.parallel) << "-parallel" << (k.launch ? "" : ", same launch") << ", double-buffered:" << (k.double_buffered.empty() ? std::string(" none") : "") << [&] {
      std::string s;
      for (const auto& t : k.double_buffered) s += " " + t;
      return s;
    }()
       << ")\n    order:";
    for (const OpId o : k.order) os << " " << operator_name(o);
    os << "\n    steps: " << k.steps.size() << "\n";
    for (const auto& [b, bytes] : k.peak_bytes) {
      os << "    peak " << b << ": " << bytes << " B (";
      const auto& names = k.peak_tensors.at(b);
      for (size_t i = 0; i < names.size(); ++i) os << (i ? " " : "") << names[i];
      os << ")\n";
    }
    if (!k.spilled.empty()) {
      os << "    spilled to GM:";
      for (const auto& t : k.spilled) os << " " << t;
      os << "\n";
    }
    os << "    lifetimes (tensor@buffer [first,last] bytes):";
    int shown = 0;
    for (const Lifetime& lt : k.lifetimes) {
      if (shown++ % 4 == 0) os << "\n     ";
      os << " " << lt.tensor << "@" << lt.buffer << "[" << lt.first << "," << lt.last << "] " << lt.bytes * lt.copies;
    }
    os << "\n";
    for (size_t c = 0; c < k.cores.size(); ++c) {
      os << "    core " << c << ":";
      const auto& l = k.cores[c];
      const size_t limit = 8;
      for (size_t i = 0; i < l.size() && i < limit; ++i) {
        const PlanItem& it = l[i];
        os << " (s" << it.seq << ",h" << it.head << ",v" << it.col0 << ":" << it.col1 << ",c" << it.chunk0 << ":" << it.chunk1;
        if (it.tier) os << ",tier" << it.tier;
        os << ")";
      }
      if (l.size() > limit) os << " ... (" << l.size() << " items)";
      if (c < k.groups.size() && !k.groups[c].empty()) {
        os << " lockstep groups:";
        for (int32_t g : k.groups[c]) os << " " << g;
      }
      os << "\n";
    }
  }
  os << "  layouts:";
  for (const auto& [t, l] : plan.layouts) os << " " << t << "=" << (l == Layout::Blocked ? "blocked" : "dense");
  os << "\n";
  if (plan.cpu.set()) os << describe_cpu_tuning_lines(plan.cpu);
  return os.str();
}

}  // namespace hanpu
