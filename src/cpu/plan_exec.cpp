// Plan -> CPU execution (include/hanpu/plan_exec.hpp).
//
// Which CPU path runs which strategy, and why:
//   hanpu and the fla+mapping... ablation steps: their head-parallel "fused" kernel is a head-level
//     mapping; its per-core item lists become the CpuPlan's per-thread lists verbatim (a head the
//     planner split into column blocks for buffer capacity stays split), and the items of the
//     tier-3 "tail_" kernels go to the CPU's chunk-parallel fallback. The graph form picks the
//     operator order: gemm_first for GemmFirst, the W/U form for WU.
//   fla, fla-megakernel, vllm-ascend: chunk-parallel Map phases with intermediates in memory, the
//     CPU's FLA-style path (on a CPU a kernel launch is a function call, so the three differ only
//     in what the simulator charges for launches and kernel boundaries).
//   flashqla: the CPU has no segment-parallel (chunk-seg-seg) path; it runs as the FLA-style path
//     and the summary says so.
#include "hanpu/plan_exec.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "device/host.hpp"
#include "la/job.hpp"

namespace hanpu {

namespace {

std::string shape_mismatch(const std::string& what, int64_t plan_value, int64_t input_value) {
  return "plan for another problem: " + what + " is " + std::to_string(plan_value) + " in the plan, " +
         std::to_string(input_value) + " in the inputs";
}

void check_problem(const Problem& p, const LaShape& shape, const std::vector<int64_t>& seq_lens) {
  if (p.variant != shape.variant)
    throw Error(std::string("plan for another problem: variant is ") + (p.variant == Variant::GDN ? "gdn" : "kda") +
                " in the plan, " + (shape.variant == Variant::GDN ? "gdn" : "kda") + " in the inputs");
  if (p.H != shape.H) throw Error(shape_mismatch("H", p.H, shape.H));
  if (p.HV != shape.HV) throw Error(shape_mismatch("HV", p.HV, shape.HV));
  if (p.K != shape.K) throw Error(shape_mismatch("K", p.K, shape.K));
  if (p.V != shape.V) throw Error(shape_mismatch("V", p.V, shape.V));
  if (p.chunk != 64) throw Error("plan.problem.chunk: got " + std::to_string(p.chunk) + ", the CPU backend runs chunk 64");
  if (p.seqlens != seq_lens) {
    std::string a, b;
    for (int64_t x : p.seqlens) a += (a.empty() ? "" : ",") + std::to_string(x);
    for (int64_t x : seq_lens) b += (b.empty() ? "" : ",") + std::to_string(x);
    throw Error("plan for another problem: sequence lengths are [" + a + "] in the plan, [" + b + "] in the inputs");
  }
}

}  // namespace

Problem problem_for_inputs(Variant variant, const LaInputs& in, const LaOptions& opt) {
  const LaShape s = validate_la(variant, in, opt);
  static float placeholder;  // make_la_job validates an output view; planning never touches it
  const TensorView o = TensorView::contiguous(&placeholder, DType::F32, {s.B, s.T, s.HV, s.V});
  const LaJob job = make_la_job(variant, in, opt, LaOutputs{o, TensorView{}});
  Problem p;
  p.variant = variant;
  for (const SeqSpan& sp : job.seqs) p.seqlens.push_back(sp.len);
  p.varlen = s.varlen;
  p.H = s.H, p.HV = s.HV, p.K = s.K, p.V = s.V;
  p.qkv_dtype = in.q.dtype;
  p.out_dtype = in.v.dtype;
  p.gate_dtype = in.g.dtype;
  p.beta_dtype = in.beta.dtype;
  p.read_initial_state = !in.initial_state.empty();
  p.write_final_state = true;  // la_prefill always returns the final state when asked; planning assumes it
  return p;
}

CpuExecution cpu_execution_for(const Plan& plan, const LaShape& shape, const std::vector<int64_t>& seq_lens) {
  check_problem(plan.problem, shape, seq_lens);
  if (plan.cores < 1 || plan.cores > 1024)
    throw Error("plan.cores: got " + std::to_string(plan.cores) + ", the CPU backend runs 1..1024 threads");
  CpuExecution ex;
  ex.threads = plan.cores;
  const std::string& s = plan.strategy;
  if (s == "fla" || s == "fla-megakernel" || s == "vllm-ascend" || s == "flashqla") {
    ex.path = CpuPath::FlaChunk;
    ex.summary = "FLA-style chunk path, " + std::to_string(ex.threads) + " threads";
    if (s == "flashqla") ex.summary += " (the CPU has no segment-parallel path: flashqla runs as fla)";
    return ex;
  }
  // Layouts: the CPU kernels work on dense rows (the host's matrix unit is "dense" in its device
  // description, so the layout planner chooses dense for it). A plan asking for a blocked tensor
  // was made for another kind of device.
  for (const auto& [tensor, layout] : plan.layouts)
    if (layout != Layout::Dense)
      throw Error("plan.layouts." + tensor + ": got blocked; the CPU backend executes dense layouts only (plan for "
                  "the host device, whose matrix unit reads dense rows)");
  const Kernel* fused = nullptr;
  std::set<std::pair<int32_t, int32_t>> tail;
  for (const Kernel& k : plan.kernels) {
    if (k.name == "fused") fused = &k;
    else if (k.name.rfind("tail_", 0) == 0)
      for (const auto& list : k.cores)
        for (const PlanItem& it : list) tail.insert({it.seq, it.head});
    else throw Error("plan.kernels: kernel '" + k.name + "' of strategy '" + s + "' has no CPU execution");
  }
  CpuPlan& cp = ex.plan;
  cp.threads = plan.cores;
  cp.order.gemm_first = plan.form != GraphForm::WU;
  cp.order.state_in_place = plan.state_in_place;
  if (plan.form == GraphForm::Inverse)
    throw Error("plan.form: 'inverse' has no CPU execution (the CPU runs gemm_first or wu)");
  cp.per_thread.assign(static_cast<size_t>(plan.cores), {});
  if (fused) {
    if (static_cast<int>(fused->cores.size()) > plan.cores)
      throw Error("plan.kernels.fused.cores: " + std::to_string(fused->cores.size()) + " core lists for " +
                  std::to_string(plan.cores) + " cores");
    for (size_t c = 0; c < fused->cores.size(); ++c)
      for (const PlanItem& it : fused->cores[c]) {
        if (it.chunk0 != 0 || it.chunk1 != plan.problem.chunks_of(it.seq))
          throw Error("plan.kernels.fused: an item of sequence " + std::to_string(it.seq) + " head " +
                      std::to_string(it.head) + " covers chunks [" + std::to_string(it.chunk0) + ", " +
                      std::to_string(it.chunk1) + "); the CPU's head-fused path runs whole sequences");
        cp.per_thread[c].push_back({it.seq, it.head, it.col0, it.col1});
      }
  }
  // The planner gives an empty sequence no work (it has no chunks); the CPU still has to copy its
  // initial state to its final state, which a whole-head item on thread 0 does.
  for (size_t n = 0; n < seq_lens.size(); ++n)
    if (seq_lens[n] == 0)
      for (int64_t h = 0; h < shape.HV; ++h)
        cp.per_thread[0].push_back({static_cast<int32_t>(n), static_cast<int32_t>(h), 0, static_cast<int32_t>(shape.V)});
  for (const auto& [seq, head] : tail) cp.chunk_parallel.push_back({seq, head, 0, static_cast<int32_t>(shape.V)});
  // Consecutive items of a thread that share sequence and columns advance in lockstep: as many as
  // a quarter of this machine's L2 holds (cpu_plan.hpp).
  cp.head_group = head_group_for_cache(shape, detect_host().l2_bytes());
  validate_cpu_plan(cp, shape);
  ex.summary = "head-fused, " + std::to_string(ex.threads) + " threads, " +
               (cp.order.gemm_first ? "gemm-first" : "W/U form") + ", " +
               (cp.order.state_in_place ? "in-place state" : "double-buffered state") +
               (cp.chunk_parallel.empty() ? "" : ", " + std::to_string(cp.chunk_parallel.size()) + " tier-3 items chunk-parallel") +
               (plan.layout_planned ? ", layouts planned (all dense)" : "");
  return ex;
}

}  // namespace hanpu
