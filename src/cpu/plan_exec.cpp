// Plan -> CPU schedule (include/hanpu/plan_exec.hpp), and the engine's host plan cache.
//
// Which kernels of a plan the CPU runs, and how:
//   a head-parallel kernel that runs every operator of the graph (hanpu's and the fla+mapping...
//     ablation steps' "fused"): the head-fused path. Its per-core item lists become the threads'
//     lists verbatim (column blocks included), its lockstep groups the threads' groups, and its
//     operator order a sequence of CPU stages (plan_exec.hpp, CpuStage) run in that order;
//   chunk-parallel Map kernels, one head-parallel state kernel and chunk-parallel output kernels
//     (fla, fla-megakernel, vllm-ascend): the CPU's chunk-parallel (FLA-style) path, whose three
//     phases are the W/U form's Map (gate .. wu), state recurrence (ws .. state_add) and output
//     (qkt .. out); each kernel must fall into one phase, and each thread runs its core's tasks of
//     those kernels in order (the Map kernels fused: they must map alike). On a CPU a kernel
//     launch is a function call, so the three differ only in what the simulator charges;
//   the tier-3 "tail_" kernels of a head mapping: their heads run on the same chunk-parallel path
//     with the tail kernels' mapping, in the plan's form (GEMM-first: Map forms the masked grams
//     A and P, the state phase solves for v_new, the output reads P; W/U: as FLA's kernels, with
//     Q K^T recomputed in the output phase instead of stored by the Map phase);
//   anything else (segment-parallel kernels: flashqla; the inverse form; blocked layouts; a chunk
//     other than 64) is refused, naming the field.
#include "hanpu/host_device.hpp"
#include "hanpu/plan_exec.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "cpu/engine_impl.hpp"
#include "cpu/lowering.hpp"
#include "la/job.hpp"

namespace hanpu {

const char* cpu_stage_name(CpuStage s) {
  switch (s) {
    case CpuStage::Gate: return "gate";
    case CpuStage::Grams: return "grams";
    case CpuStage::Mask: return "mask";
    case CpuStage::StateK: return "state_k";
    case CpuStage::StateQ: return "state_q";
    case CpuStage::Solve: return "solve";
    case CpuStage::Inverse: return "inverse";
    case CpuStage::WU: return "wu";
    case CpuStage::StateW: return "state_w";
    case CpuStage::Output: return "output";
    case CpuStage::Update: return "update";
  }
  return "?";
}

std::string CpuSchedule::describe() const {
  std::ostringstream os;
  os << summary << "\n  threads=" << threads << " chunk=" << chunk;
  if (path == CpuPath::HeadFused) {
    os << " stages:";
    for (CpuStage s : program.stages) os << " " << cpu_stage_name(s);
    for (size_t t = 0; t < per_thread.size(); ++t) {
      os << "\n  thread " << t << ":";
      size_t i = 0;
      for (size_t g = 0; g < groups[t].size(); ++g) {
        os << " [";
        for (int32_t n = 0; n < groups[t][g]; ++n, ++i) {
          const WorkItem& w = per_thread[t][i];
          os << (n ? " " : "") << "s" << w.seq << ",h" << w.head << ",v" << w.col0 << ":" << w.col1;
        }
        os << "]";
      }
    }
    if (!chunk_parallel.empty()) {
      os << "\n  chunk-parallel (tier 3):";
      for (const WorkItem& w : chunk_parallel) os << " (s" << w.seq << ",h" << w.head << ")";
    }
  }
  return os.str();
}

namespace {

std::string shape_mismatch(const std::string& what, int64_t plan_value, int64_t input_value) {
  return "plan for another problem: " + what + " is " + std::to_string(plan_value) + " in the plan, " +
         std::to_string(input_value) + " in the inputs";
}

void check_problem(const Problem& p, const LaShape& shape, const std::vector<int64_t>& seq_lens) {
  if (p.variant != shape.variant)
    throw Error(std::string("plan for another problem: variant is ") + variant_name(p.variant) + " in the plan, " +
                variant_name(shape.variant) + " in the inputs");
  if (p.H != shape.H) throw Error(shape_mismatch("H", p.H, shape.H));
  if (p.HV != shape.HV) throw Error(shape_mismatch("HV", p.HV, shape.HV));
  if (p.K != shape.K) throw Error(shape_mismatch("K", p.K, shape.K));
  if (p.V != shape.V) throw Error(shape_mismatch("V", p.V, shape.V));
  if (p.seqlens != seq_lens) {
    std::string a, b;
    for (int64_t x : p.seqlens) a += (a.empty() ? "" : ",") + std::to_string(x);
    for (int64_t x : seq_lens) b += (b.empty() ? "" : ",") + std::to_string(x);
    throw Error("plan for another problem: sequence lengths are [" + a + "] in the plan, [" + b + "] in the inputs");
  }
}

std::string kernel_at(size_t ki, const Kernel& k) { return "plan.kernels[" + std::to_string(ki) + "] (" + k.name + ")"; }

// The plan operators each CPU stage runs in a form (plan_exec.hpp, CpuStage), derived from the
// operator manifest (hanpu/operators.hpp): the stages in first-listed order, each with its
// operators in manifest order.
struct StageOps {
  CpuStage stage;
  std::vector<OpId> ops;
};
std::vector<StageOps> derive_stage_table(GraphForm form) {
  std::vector<StageOps> table;
  for (const OperatorManifestRow& row : kOperatorManifest) {
    const std::optional<CpuStage> stage = cpu_stage_of(row.id, form);
    if (!stage) continue;
    auto it = std::find_if(table.begin(), table.end(), [&](const StageOps& so) { return so.stage == *stage; });
    if (it == table.end()) table.push_back({*stage, {row.id}});
    else it->ops.push_back(row.id);
  }
  return table;
}
const std::vector<StageOps>& stage_table(GraphForm form) {
  static const std::vector<StageOps> gemm_first = derive_stage_table(GraphForm::GemmFirst);
  static const std::vector<StageOps> wu = derive_stage_table(GraphForm::WU);
  return form == GraphForm::WU ? wu : gemm_first;
}

bool in_order(const Kernel& k, OpId id) {
  return std::find(k.order.begin(), k.order.end(), id) != k.order.end();
}

// The fused kernel's order as CPU stages; "" on success, else why not (naming the field).
std::string lower_order(const Plan& plan, size_t ki, FusedProgram& prog) {
  const Kernel& k = plan.kernels[ki];
  const OpGraph& g = plan.graph();
  const auto& table = stage_table(plan.form);
  const std::string at = kernel_at(ki, k) + ".order";
  std::vector<size_t> stages;
  for (const OpId id : k.order) {
    const std::optional<CpuStage> stage = cpu_stage_of(id, plan.form);
    if (!stage) return at + ": operator \"" + std::string(operator_name(id)) + "\" has no CPU stage in the " + graph_form_name(plan.form) + " form";
    const size_t s = static_cast<size_t>(
        std::find_if(table.begin(), table.end(), [&](const StageOps& so) { return so.stage == *stage; }) - table.begin());
    if (std::find(stages.begin(), stages.end(), s) == stages.end()) stages.push_back(s);
  }
  // A stage runs all its operators where the first of them stands: every tensor one of them reads
  // must be an input, the state, or made by an earlier stage (or inside the stage).
  std::set<std::string> made;
  for (const TensorDef& t : g.tensors)
    if (t.role == TensorRole::Input) made.insert(t.name);
  bool state_written = false, grams_done = false;
  const std::string vnew = plan.form == GraphForm::WU ? "vn" : "E";
  bool update_done = false;
  for (size_t s : stages) {
    const StageOps& so = table[s];
    std::set<std::string> inside;
    for (OpId op : so.ops)
      if (in_order(k, op))
        for (const std::string& out : g.op(op).outputs) inside.insert(out);
    for (OpId id : so.ops) {
      if (!in_order(k, id)) continue;
      const std::string op(operator_name(id));
      for (const std::string& in : g.op(id).inputs) {
        if (in == "S") {
          if (state_written && plan.state_in_place)
            return at + ": stage " + cpu_stage_name(so.stage) + " (operator " + op +
                   ") reads the state after the in-place update overwrote it";
          continue;
        }
        if (!made.count(in) && !inside.count(in))
          return at + ": the CPU runs " + op + " in stage " + cpu_stage_name(so.stage) + ", where the first of its operators stands, but it reads " +
                 in + ", which no earlier stage has made";
      }
      if (update_done && so.stage != CpuStage::Update)
        for (const std::string& in : g.op(id).inputs)
          if (in == vnew && variant_traits(g.variant).head_gate()) prog.update_keeps_vnew = true;
    }
    // The CPU's update reuses the transposed (KDA: decayed) keys the grams stage leaves behind.
    if (so.stage == CpuStage::Update) {
      if (!grams_done) return at + ": the state update stands before kkt; the CPU's update reuses the keys the grams stage transposes";
      state_written = true;
      update_done = true;
    }
    if (so.stage == CpuStage::Grams) grams_done = true;
    for (const std::string& t : inside) made.insert(t);
    prog.stages.push_back(so.stage);
  }
  prog.gemm_first = plan.form == GraphForm::GemmFirst;
  prog.state_in_place = plan.state_in_place;
  return "";
}

// The CPU's FLA-style phases (W/U form): the operator's FlaPhase in the manifest (KDA's decays
// are recomputed in every phase that needs them, as FLA's kernels do).
FlaPhase fla_phase(OpId op) { return operator_row(op).fla_phase; }
const char* fla_phase_name(FlaPhase p) { return p == FlaPhase::Map ? "map" : p == FlaPhase::State ? "state" : "output"; }
// Index into the map / state / output kernel lists.
size_t phase_index(FlaPhase p) { return static_cast<size_t>(p); }
static_assert(static_cast<int>(FlaPhase::Map) == 0 && static_cast<int>(FlaPhase::State) == 1 && static_cast<int>(FlaPhase::Output) == 2,
              "phase_index: Map, State, Output index the chunk-parallel path's phase kernels");

// One of the tier-3 kernels of a head mapping (their role, and every item of tier 3).
bool is_tail_kernel(const Kernel& k) {
  if (k.role != KernelRole::TailMap && k.role != KernelRole::TailState && k.role != KernelRole::TailOutput) return false;
  bool any = false;
  for (const auto& list : k.cores)
    for (const PlanItem& it : list) {
      if (it.tier != 3) return false;
      any = true;
    }
  return any;
}

bool runs_whole_graph(const Kernel& k, const OpGraph& g) {
  if (k.parallel != Parallel::Head) return false;
  for (const OperatorDef& op : g.ops)
    if (std::find(k.order.begin(), k.order.end(), op.id) == k.order.end()) return false;
  return true;
}

// The per-thread task lists of the chunk-parallel path from the plan's map, state and output
// kernels (none: nothing to fill). The CPU's Map phase computes a (chunk, head) whole, once: every
// Map kernel must put it on the same core (and only one), in the same order.
std::string chunk_parallel_mapping(const Plan& plan, const std::vector<size_t> (&phase)[3], CpuSchedule& s) {
  const size_t P = static_cast<size_t>(plan.cores);
  s.fla_map.assign(P, {});
  s.fla_state.assign(P, {});
  s.fla_output.assign(P, {});
  if (phase[0].empty() && phase[1].empty() && phase[2].empty()) return "";
  const char* names[] = {"map", "state", "output"};
  for (int ph = 0; ph < 3; ++ph)
    if (phase[ph].empty())
      return std::string("plan.kernels: no ") + names[ph] + " kernel; the CPU's chunk-parallel path runs map, state and output phases";
  if (phase[1].size() > 1)
    return kernel_at(phase[1][1], plan.kernels[phase[1][1]]) + ": a second state kernel; the CPU's chunk-parallel path has one state phase";
  // Map: whole (chunk, head) tasks per core, in first-appearance order.
  auto map_tasks = [&](const Kernel& k) {
    std::vector<std::vector<ChunkTask>> per(P);
    for (size_t c = 0; c < k.cores.size(); ++c) {
      std::set<std::tuple<int32_t, int32_t, int64_t>> on_core;  // column blocks of one task count once
      for (const PlanItem& it : k.cores[c])
        for (int64_t ch = it.chunk0; ch < it.chunk1; ++ch)
          if (on_core.insert({it.seq, it.head, ch}).second)
            per[c].push_back({it.seq, it.head, ch, 0, static_cast<int32_t>(plan.problem.V)});
    }
    return per;
  };
  s.fla_map = map_tasks(plan.kernels[phase[0][0]]);
  std::set<std::tuple<int32_t, int32_t, int64_t>> seen;
  for (size_t c = 0; c < P; ++c)
    for (const ChunkTask& t : s.fla_map[c])
      if (!seen.insert({t.seq, t.head, t.chunk}).second)
        return kernel_at(phase[0][0], plan.kernels[phase[0][0]]) + ".cores[" + std::to_string(c) + "]: (seq " + std::to_string(t.seq) +
               ", head " + std::to_string(t.head) + ", chunk " + std::to_string(t.chunk) +
               ") is on two cores; the CPU's Map phase computes a (chunk, head) whole, on one thread";
  for (size_t i = 1; i < phase[0].size(); ++i)
    if (map_tasks(plan.kernels[phase[0][i]]) != s.fla_map)
      return kernel_at(phase[0][i], plan.kernels[phase[0][i]]) + ".cores: mapped differently from " +
             kernel_at(phase[0][0], plan.kernels[phase[0][0]]) + "; the CPU runs the Map kernels fused, with one mapping";
  for (size_t c = 0; c < plan.kernels[phase[1][0]].cores.size(); ++c)
    for (const PlanItem& it : plan.kernels[phase[1][0]].cores[c]) s.fla_state[c].push_back({it.seq, it.head, it.col0, it.col1});
  // Output: (chunk, head, column block) tasks; several output kernels must map alike.
  auto output_tasks = [&](const Kernel& k) {
    std::vector<std::vector<ChunkTask>> per(P);
    for (size_t c = 0; c < k.cores.size(); ++c)
      for (const PlanItem& it : k.cores[c])
        for (int64_t ch = it.chunk0; ch < it.chunk1; ++ch) per[c].push_back({it.seq, it.head, ch, it.col0, it.col1});
    return per;
  };
  s.fla_output = output_tasks(plan.kernels[phase[2][0]]);
  for (size_t i = 1; i < phase[2].size(); ++i)
    if (output_tasks(plan.kernels[phase[2][i]]) != s.fla_output)
      return kernel_at(phase[2][i], plan.kernels[phase[2][i]]) + ".cores: mapped differently from " +
             kernel_at(phase[2][0], plan.kernels[phase[2][0]]) + "; the CPU runs the output kernels fused, with one mapping";
  return "";
}

// Checks everything but the problem; fills `out` when given. "" when the CPU runs the plan.
std::string check_plan(const Plan& plan, CpuSchedule* out) {
  if (plan.cores < 1 || plan.cores > 1024)
    return "plan.cores: got " + std::to_string(plan.cores) + ", the CPU backend runs 1..1024 threads";
  if (plan.problem.chunk != 64)
    return "plan.problem.chunk: got " + std::to_string(plan.problem.chunk) + ", the CPU backend runs chunk 64";
  for (size_t ki = 0; ki < plan.kernels.size(); ++ki)
    if (plan.kernels[ki].parallel == Parallel::Segment)
      return kernel_at(ki, plan.kernels[ki]) + ".parallel: got \"segment\"; the CPU backend has no segment-parallel execution";
  if (plan.form == GraphForm::Inverse)
    return "plan.form: got \"inverse\"; the CPU backend runs the gemm_first and wu forms";
  // Layouts: the CPU kernels work on dense rows (the host's matrix unit is "dense" in its device
  // description, so the layout planner chooses dense for it).
  for (const auto& [tensor, layout] : plan.layouts)
    if (layout != Layout::Dense)
      return "plan.layouts." + tensor + ": got blocked; the CPU backend executes dense layouts only (plan for the host "
             "device, whose matrix unit reads dense rows)";
  const OpGraph& g = plan.graph();
  CpuSchedule s;
  s.threads = plan.cores;
  s.per_thread.assign(static_cast<size_t>(plan.cores), {});
  s.groups.assign(static_cast<size_t>(plan.cores), {});
  int fused = -1;
  FlaPhase last_phase = FlaPhase::Map;
  bool fla_kernels = false, state_kernel = false;
  std::set<std::pair<int32_t, int32_t>> tail;
  std::vector<size_t> phase_kernels[3];  // map, state, output kernels of the chunk-parallel path
  for (size_t ki = 0; ki < plan.kernels.size(); ++ki) {
    const Kernel& k = plan.kernels[ki];
    if (runs_whole_graph(k, g)) {
      if (fused >= 0) return kernel_at(ki, k) + ": a second fused kernel; the CPU runs one head-fused pass";
      fused = static_cast<int>(ki);
      if (std::string why = lower_order(plan, ki, s.program); !why.empty()) return why;
      for (size_t c = 0; c < k.cores.size(); ++c) {
        for (const PlanItem& it : k.cores[c]) {
          if (it.chunk0 != 0 || it.chunk1 != plan.problem.chunks_of(it.seq))
            return kernel_at(ki, k) + ".cores[" + std::to_string(c) + "]: an item covers chunks [" + std::to_string(it.chunk0) +
                   ", " + std::to_string(it.chunk1) + "); the CPU's head-fused path runs whole sequences";
          s.per_thread[c].push_back({it.seq, it.head, it.col0, it.col1});
        }
        if (c < k.groups.size() && !k.groups[c].empty()) s.groups[c] = k.groups[c];
        else s.groups[c].assign(k.cores[c].size(), 1);
      }
      continue;
    }
    if (is_tail_kernel(k)) {
      for (const auto& list : k.cores)
        for (const PlanItem& it : list) tail.insert({it.seq, it.head});
      const FlaPhase phase = k.role == KernelRole::TailMap ? FlaPhase::Map : k.role == KernelRole::TailState ? FlaPhase::State : FlaPhase::Output;
      phase_kernels[phase_index(phase)].push_back(ki);
      continue;
    }
    // A kernel of the FLA-style path: all its operators in one phase, phases in order.
    std::optional<FlaPhase> phase;
    for (const OpId op : k.order) {
      const FlaPhase p = fla_phase(op);
      if (p == FlaPhase::None) return kernel_at(ki, k) + ".order: operator \"" + std::string(operator_name(op)) + "\" has no phase on the CPU's FLA-style path";
      if (p == FlaPhase::Recomputed) continue;
      if (phase && p != *phase)
        return kernel_at(ki, k) + ".order: operators of the " + fla_phase_name(*phase) + " and " + fla_phase_name(p) +
               " phases in one kernel; the CPU's FLA-style path runs them in separate phases";
      phase = p;
    }
    // A kernel of decays only (vllm-ascend's decay_q, and decay_k with decay_ke, decay_ki,
    // decay_kl): the CPU recomputes them inside the phase it stands in.
    if (!phase) phase = last_phase;
    if (phase_index(*phase) < phase_index(last_phase))
      return kernel_at(ki, k) + ": a " + fla_phase_name(*phase) + " kernel after a " + fla_phase_name(last_phase) +
             " kernel; the CPU's FLA-style path runs map, state, output in that order";
    const Parallel want = *phase == FlaPhase::State ? Parallel::Head : Parallel::Chunk;
    if (k.parallel != want)
      return kernel_at(ki, k) + ".parallel: got \"" + parallel_name(k.parallel) + "\", the CPU runs the " + fla_phase_name(*phase) +
             " phase " + parallel_name(want) + "-parallel";
    if (*phase == FlaPhase::State) {
      if (state_kernel) return kernel_at(ki, k) + ": a second state kernel; the CPU's FLA-style path has one state phase";
      state_kernel = true;
    }
    last_phase = *phase;
    fla_kernels = true;
    phase_kernels[phase_index(*phase)].push_back(ki);
  }
  if (fused >= 0 && fla_kernels)
    return "plan.kernels: a fused kernel next to FLA-style phase kernels; the CPU runs one or the other";
  if (std::string why = cpu::lower_cpu_tuning(plan, fused, s.program); !why.empty()) return why;
  if (std::string why = chunk_parallel_mapping(plan, phase_kernels, s); !why.empty()) return why;
  if (fla_kernels) {
    if (!state_kernel) return "plan.kernels: no state kernel (ws .. state_add); the CPU's FLA-style path needs one";
    s.path = CpuPath::FlaChunk;
    s.summary = "FLA-style chunk path (W/U form), " + std::to_string(s.threads) + " threads, the plan's mapping";
  } else {
    s.path = CpuPath::HeadFused;
    for (const auto& [seq, head] : tail) s.chunk_parallel.push_back({seq, head, 0, static_cast<int32_t>(plan.problem.V)});
    s.chunk_parallel_gemm_first = plan.form == GraphForm::GemmFirst;
    std::string stages;
    for (CpuStage st : s.program.stages) stages += std::string(stages.empty() ? "" : " ") + cpu_stage_name(st);
    s.summary = "head-fused, " + std::to_string(s.threads) + " threads, " +
                (s.program.gemm_first ? "gemm-first" : "W/U form") + ", " +
                (s.program.state_in_place ? "in-place state" : "double-buffered state") + ", stages " + stages +
                (s.chunk_parallel.empty() ? "" : ", " + std::to_string(s.chunk_parallel.size()) + " tier-3 heads on the chunk-parallel path (" +
                                                      (s.chunk_parallel_gemm_first ? "gemm-first" : "W/U form") + ")") +
                (plan.layout_planned ? ", layouts planned (all dense)" : "") + cpu::describe_cpu_tuning(plan.cpu);
  }
  if (out) *out = std::move(s);
  return "";
}

}  // namespace

std::string cpu_cannot_run(const Plan& plan) { return check_plan(plan, nullptr); }

CpuSchedule lower_plan_for_cpu(const Plan& plan, const LaShape& shape, const std::vector<int64_t>& seq_lens) {
  check_problem(plan.problem, shape, seq_lens);
  CpuSchedule s;
  if (std::string why = check_plan(plan, &s); !why.empty()) throw Error(why);
  // The planner gives an empty sequence no work (it has no chunks); the CPU still has to copy its
  // initial state to its final state, which a whole-head item on thread 0 does.
  for (size_t n = 0; n < seq_lens.size(); ++n)
    if (seq_lens[n] == 0)
      for (int64_t h = 0; h < shape.HV; ++h) {
        const WorkItem copy{static_cast<int32_t>(n), static_cast<int32_t>(h), 0, static_cast<int32_t>(shape.V)};
        if (s.path == CpuPath::HeadFused) {
          s.per_thread[0].push_back(copy);
          s.groups[0].push_back(1);
        } else {
          s.fla_state[0].push_back(copy);
        }
      }
  return s;
}

Problem cpu::problem_of_job(const LaJob& job) {
  const LaShape& s = job.shape;
  Problem p;
  p.variant = s.variant;
  p.seqlens.reserve(job.seqs.size());
  for (const SeqSpan& sp : job.seqs) p.seqlens.push_back(sp.len);
  p.varlen = s.varlen;
  p.H = s.H, p.HV = s.HV, p.K = s.K, p.V = s.V;
  p.qkv_dtype = job.in.q.dtype;
  p.out_dtype = job.in.v.dtype;
  p.gate_dtype = job.in.g.dtype;
  p.beta_dtype = job.in.beta.dtype;
  p.read_initial_state = !job.in.initial_state.empty();
  p.write_final_state = true;  // la_prefill always returns the final state when asked; planning assumes it
  return p;
}

Problem problem_for_inputs(Variant variant, const LaInputs& in, const LaOptions& opt) {
  const LaShape s = validate_la(variant, in, opt);
  static float placeholder;  // make_la_job validates an output view; planning never touches it
  const TensorView o = TensorView::contiguous(&placeholder, DType::F32, {s.B, s.T, s.HV, s.V});
  return cpu::problem_of_job(make_la_job(variant, in, opt, LaOutputs{o, TensorView{}}));
}

// ---------------------------------------------------------------------------------------------
// The engine's plan cache (cpu/engine_impl.hpp, PlanCache).

namespace {

// Everything make_plan reads from the problem, plus the cores and the strategy.
std::string signature(const Problem& p, int threads, const std::string& strategy) {
  std::string key;
  key.reserve(64 + p.seqlens.size() * 6);
  auto add = [&](int64_t x) {
    key += std::to_string(x);
    key += ',';
  };
  key += strategy;
  key += '|';
  for (int64_t x : {static_cast<int64_t>(p.variant), static_cast<int64_t>(threads), p.H, p.HV, p.K, p.V, p.chunk,
                    static_cast<int64_t>(p.varlen), static_cast<int64_t>(p.qkv_dtype), static_cast<int64_t>(p.out_dtype),
                    static_cast<int64_t>(p.gate_dtype), static_cast<int64_t>(p.beta_dtype),
                    static_cast<int64_t>(p.state_dtype), static_cast<int64_t>(p.read_initial_state),
                    static_cast<int64_t>(p.write_final_state)})
    add(x);
  key += '|';
  for (int64_t x : p.seqlens) add(x);
  return key;
}

}  // namespace

HostPlan host_plan(Engine& engine, const Problem& p, int threads, const std::string& strategy) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const std::string key = signature(p, threads, strategy);
  cpu::PlanCache& c = engine.impl().plans;
  std::unique_lock<std::mutex> lock(c.mu);
  if (auto it = c.entries.find(key); it != c.entries.end()) {
    c.lru.splice(c.lru.begin(), c.lru, it->second.pos);
    HostPlan hit = it->second.value;
    hit.cache_hit = true;
    hit.seconds = elapsed();
    return hit;
  }
  auto dev = c.devices.find(threads);
  if (dev == c.devices.end()) dev = c.devices.emplace(threads, host_device(engine.host(), threads, 0.0)).first;
  const Device device = dev->second;
  lock.unlock();  // planning a long varlen batch takes a while; other signatures need not wait
  PlanOptions po = cpu_plan_options(device);
  po.cores = threads;
  auto plan = std::make_shared<const Plan>(make_plan(p, device, strategy, po));
  LaShape shape;
  shape.variant = p.variant, shape.H = p.H, shape.HV = p.HV, shape.K = p.K, shape.V = p.V, shape.N = p.sequences();
  auto schedule = std::make_shared<const CpuSchedule>(lower_plan_for_cpu(*plan, shape, p.seqlens));
  HostPlan made{plan, schedule, false, 0};
  lock.lock();
  if (!c.entries.count(key)) {
    c.lru.push_front(key);
    c.entries[key] = {made, c.lru.begin()};
    while (c.entries.size() > kPlanCacheEntries) {
      c.entries.erase(c.lru.back());
      c.lru.pop_back();
    }
  }
  made.seconds = elapsed();
  return made;
}

void clear_plan_cache(Engine& engine) {
  cpu::PlanCache& c = engine.impl().plans;
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries.clear();
  c.lru.clear();
}

size_t plan_cache_size(const Engine& engine) {
  cpu::PlanCache& c = engine.impl().plans;
  std::lock_guard<std::mutex> lock(c.mu);
  return c.entries.size();
}

}  // namespace hanpu
