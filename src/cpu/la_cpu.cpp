// The CPU backend's driver: validates, builds the job, gets the call's Plan (given, or from the
// host plan cache) and its lowered CpuSchedule (plan_exec.hpp), runs it on the thread pool.
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/la_amx.hpp"
#include "cpu/lowering.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/engine_impl.hpp"
#include "hanpu/plan_exec.hpp"
#include "la/job.hpp"

namespace hanpu {
namespace {

// More threads than this is a mistake, not a plan: each thread gets an arena and a pinned worker.
constexpr int kMaxThreads = 1024;

// 0: the engine's threads. More than the engine has is allowed (its threads run the parts in turn).
int resolve_threads(int threads, const Engine& engine) {
  if (threads > kMaxThreads)
    throw Error("threads = " + std::to_string(threads) + " exceeds the limit of " + std::to_string(kMaxThreads));
  return threads > 0 ? threads : engine.threads();
}

// The per-thread arena: the engine's workspace of that part (cpu/workspace.hpp), reused across
// calls (sized by the kernels' layouts: the state and the per-chunk intermediates of one item,
// independent of T).
float* arena(cpu::Workspace& ws, size_t floats) { return ws.get<float>(cpu::kLaArena, floats); }

// GDN grams from raw bf16 rows (cpu::gram_bf16_lower): q and k bf16 with contiguous rows, and a
// CPU with AVX512-BF16. KDA's grams multiply decay-scaled rows, which are no longer bf16 values.
bool bf16_grams_possible(const LaJob& job) {
  const LaInputs& in = job.in;
  return job.traits().head_gate() && in.q.dtype == DType::BF16 && in.k.dtype == DType::BF16 &&
         in.q.stride[3] == 1 && in.k.stride[3] == 1 && cpu::gram_bf16_usable();
}

std::vector<int64_t> seq_lengths(const LaJob& job) {
  std::vector<int64_t> lens;
  for (const SeqSpan& s : job.seqs) lens.push_back(s.len);
  return lens;
}

size_t run_chunk_parallel(const LaJob& job, const CpuSchedule& plan, Engine& engine);

// Floats of arena the largest lockstep group of the schedule needs (the kernels' layout).
size_t head_fused_need_floats(const LaJob& job, const CpuSchedule& plan) {
  size_t need = 0;
  for (size_t t = 0; t < plan.per_thread.size(); ++t) {
    const std::vector<WorkItem>& items = plan.per_thread[t];
    size_t i = 0;
    for (const int32_t n : plan.groups[t]) {
      need = std::max(need, cpu::fused_arena_floats(job, items[i].col1 - items[i].col0, plan.chunk,
                                                    static_cast<size_t>(n), plan.program));
      i += static_cast<size_t>(n);
    }
  }
  return need;
}

// Floats of the head-fused arena every thread takes: the plan's plan.cpu.arena_bytes (the
// lowering checked it holds the plan's groups), or for a plan without a CPU part (0) what the
// schedule's largest group needs.
size_t head_fused_arena_floats(const LaJob& job, const CpuSchedule& plan, size_t planned_bytes) {
  const size_t need = head_fused_need_floats(job, plan);
  if (planned_bytes == 0) return need;
  if (need * sizeof(float) > planned_bytes)  // la_prefill leaves bf16 grams off when they do not fit
    throw Error("plan.cpu.arena_bytes: got " + std::to_string(planned_bytes) + " bytes, but this call's groups need " +
                std::to_string(need * sizeof(float)) + " bytes per thread");
  return planned_bytes / sizeof(float);
}

// Returns the workspace bytes: the arena each thread used, summed over threads.
size_t run_head_fused(const LaJob& job, const CpuSchedule& plan, Engine& engine, size_t planned_arena_bytes) {
  const size_t floats = head_fused_arena_floats(job, plan, planned_arena_bytes);
  std::vector<size_t> arena_floats(static_cast<size_t>(plan.threads), 0);
  engine.impl().run(plan.threads, [&](int t, cpu::Workspace& ws) {
    cpu::DenormalGuard ftz;
    const std::vector<WorkItem>& items = plan.per_thread[static_cast<size_t>(t)];
    if (items.empty()) return;
    float* a = arena(ws, floats);
    arena_floats[static_cast<size_t>(t)] = floats;
    size_t i = 0;
    // The plan's lockstep groups, in order (lower_plan_for_cpu checked that they sum to the items).
    for (const int32_t n : plan.groups[static_cast<size_t>(t)]) {
      cpu::fused_group(job, &items[i], static_cast<size_t>(n), a, plan.chunk, plan.program);
      i += static_cast<size_t>(n);
    }
  });
  size_t bytes = 0;
  for (size_t f : arena_floats) bytes += f * sizeof(float);
  if (!plan.chunk_parallel.empty()) bytes = std::max(bytes, run_chunk_parallel(job, plan, engine));
  return bytes;
}

size_t run_recurrent(const LaJob& job, const CpuSchedule& plan, Engine& engine) {
  // The recurrence has nothing to share along the sequence: the plan's head-level assignment as
  // it is, and the heads it runs chunk-parallel (tier 3) spread round-robin instead.
  const int threads = plan.threads;
  std::vector<std::vector<WorkItem>> per = plan.per_thread;
  for (size_t i = 0; i < plan.chunk_parallel.size(); ++i)
    per[i % static_cast<size_t>(threads)].push_back(plan.chunk_parallel[i]);
  std::vector<size_t> arena_floats(static_cast<size_t>(threads), 0);
  engine.impl().run(threads, [&](int t, cpu::Workspace& ws) {
    cpu::DenormalGuard ftz;
    for (const WorkItem& item : per[static_cast<size_t>(t)]) {
      const size_t need = cpu::recurrent_arena_floats(job, item.col1 - item.col0);
      arena_floats[static_cast<size_t>(t)] = std::max(arena_floats[static_cast<size_t>(t)], need);
      cpu::recurrent_item(job, item, arena(ws, need));
    }
  });
  size_t bytes = 0;
  for (size_t f : arena_floats) bytes += f * sizeof(float);
  return bytes;
}

// The chunk-parallel (FLA-style) path as the schedule maps it: every thread runs its Map tasks,
// then (after all Map tasks) its state items, then its output tasks; intermediates in main memory
// as FLA materialises them between its kernels.
size_t run_chunk_parallel(const LaJob& job, const CpuSchedule& plan, Engine& engine) {
  const LaShape& s = job.shape;
  const int threads = plan.threads, chunk = plan.chunk;
  cpu::FlaBuffers buf;
  buf.chunk = chunk;
  std::vector<int64_t> chunk_seq, chunk_start, first(static_cast<size_t>(s.N), 0);
  for (int64_t n = 0; n < s.N; ++n) {
    first[static_cast<size_t>(n)] = static_cast<int64_t>(chunk_seq.size());
    for (int64_t t0 = 0; t0 < job.seqs[static_cast<size_t>(n)].len; t0 += chunk) {
      chunk_seq.push_back(n);
      chunk_start.push_back(t0);
    }
  }
  buf.total_chunks = static_cast<int64_t>(chunk_seq.size());
  buf.chunk_seq = chunk_seq.data();
  buf.chunk_start = chunk_start.data();
  buf.seq_first_chunk = first.data();
  const size_t C = static_cast<size_t>(chunk), K = static_cast<size_t>(s.K);
  const size_t Kp = (K + 15) / 16 * 16, Vp = (static_cast<size_t>(s.V) + 15) / 16 * 16;
  const size_t gk = static_cast<size_t>(variant_traits(s.variant).gate_width(s.K));
  const size_t slots = static_cast<size_t>(buf.total_chunks * s.HV);
  // The W/U form keeps T, W, U per (chunk, head); the GEMM-first form A (in T) and P.
  const bool gemm_first = plan.chunk_parallel_gemm_first;
  std::vector<double> gamma(slots * C * gk);
  std::vector<float> T(slots * C * C), W(gemm_first ? 0 : slots * C * Kp), U(gemm_first ? 0 : slots * C * Vp),
      P(gemm_first ? slots * C * C : 0), h(slots * K * Vp), v_new(slots * C * Vp);
  buf.gamma = gamma.data();
  buf.T = T.data();
  buf.W = W.data();
  buf.U = U.data();
  buf.P = P.data();
  buf.h = h.data();
  buf.v_new = v_new.data();

  const size_t scratch_floats = cpu::fla_scratch_floats(job, chunk);
  auto phase = [&](const auto& per_thread, const auto& fn) {
    engine.impl().run(threads, [&](int t, cpu::Workspace& ws) {
      cpu::DenormalGuard ftz;
      float* scratch = arena(ws, scratch_floats);
      for (const auto& task : per_thread[static_cast<size_t>(t)]) fn(task, scratch);
    });
  };
  auto global_chunk = [&](const ChunkTask& t) { return first[static_cast<size_t>(t.seq)] + t.chunk; };
  phase(plan.fla_map, [&](const ChunkTask& t, float* sc) {
    (gemm_first ? cpu::gf_map_chunk : cpu::fla_map_chunk)(job, buf, global_chunk(t), t.head, sc);
  });
  phase(plan.fla_state, [&](const WorkItem& w, float* sc) {
    (gemm_first ? cpu::gf_state_item : cpu::fla_reduce_item)(job, buf, w, sc);
  });
  phase(plan.fla_output, [&](const ChunkTask& t, float* sc) {
    (gemm_first ? cpu::gf_output_chunk : cpu::fla_output_chunk)(job, buf, global_chunk(t), t.head, t.col0, t.col1, sc);
  });
  const size_t intermediates = gamma.size() * sizeof(double) +
                               (T.size() + W.size() + U.size() + P.size() + h.size() + v_new.size()) * sizeof(float);
  return intermediates + static_cast<size_t>(threads) * scratch_floats * sizeof(float);
}

std::vector<WorkItem> whole_items(const LaJob& job) {
  std::vector<WorkItem> items;
  for (int64_t n = 0; n < job.shape.N; ++n)
    for (int64_t hv = 0; hv < job.shape.HV; ++hv)
      items.push_back({static_cast<int32_t>(n), static_cast<int32_t>(hv), 0, static_cast<int32_t>(job.shape.V)});
  return items;
}

// The call's plan and schedule: the caller's plan lowered, or the engine's host plan cache's.
HostPlan schedule_for(const LaJob& job, const ExecOptions& ex, Engine& engine, bool recurrent) {
  const bool no_tokens = std::all_of(job.seqs.begin(), job.seqs.end(), [](const SeqSpan& s) { return s.len == 0; });
  if (!ex.plan && no_tokens) {
    // Nothing to plan (the planner refuses a problem without tokens): each head's final state is
    // its initial state, copied by a whole-head item on one thread.
    auto s = std::make_shared<CpuSchedule>();
    s->per_thread = {whole_items(job)};
    s->groups = {std::vector<int32_t>(s->per_thread[0].size(), 1)};
    s->summary = "no tokens: the initial states copied to the final states";
    return HostPlan{nullptr, s, false, 0};
  }
  if (!ex.plan) {
    const int threads = resolve_threads(ex.threads, engine);
    return host_plan(engine, cpu::problem_of_job(job), threads, ex.path == CpuPath::FlaChunk ? "fla" : "hanpu");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Plan& plan = *ex.plan;
  if (recurrent)
    throw Error("ExecOptions.path: recurrent with a plan; a plan's chunk program is not the token-by-token "
                "recurrence (leave path at hanpu, the plan decides)");
  if (ex.threads > 0 && ex.threads != plan.cores)
    throw Error("ExecOptions.threads: got " + std::to_string(ex.threads) + ", but the plan is for " +
                std::to_string(plan.cores) + " cores (plan.cores); pass 0 or re-plan");
  validate_plan(plan);
  auto schedule = std::make_shared<const CpuSchedule>(lower_plan_for_cpu(plan, job.shape, seq_lengths(job)));
  if (ex.path == CpuPath::FlaChunk && schedule->path != CpuPath::FlaChunk)
    throw Error("ExecOptions.path: fla with a plan of strategy " + plan.strategy +
                ", which the CPU runs head-fused (leave path at hanpu, the plan decides)");
  HostPlan hp{std::make_shared<const Plan>(plan), schedule, false, 0};
  hp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return hp;
}

void report(const ExecOptions& ex, const HostPlan& hp) {
  if (!ex.report) return;
  ex.report->plan = hp.plan;
  ex.report->schedule = hp.schedule;
  ex.report->plan_cache_hit = hp.cache_hit;
  ex.report->planning_seconds = hp.seconds;
}

}  // namespace

void la_prefill(Variant variant, const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex) {
  LaJob job = make_la_job(variant, in, opt, out);
  Engine& engine = cpu::engine_or_default(ex.engine);
  resolve_threads(ex.threads, engine);  // the thread limit before any planning
  const bool recurrent = ex.path == CpuPath::Recurrent;
  const HostPlan hp = schedule_for(job, ex, engine, recurrent);
  report(ex, hp);
  if (ex.report) ex.report->gemms = ex.amx == LaAmx::Off ? "f32" : "f32 (amx: the head-fused path only)";
  const CpuSchedule& s = *hp.schedule;
  size_t workspace = 0;
  if (recurrent) {
    workspace = run_recurrent(job, s, engine);
  } else if (s.path == CpuPath::HeadFused) {
    // The plan's arena (plan.cpu.arena_bytes; 0: a plan without a CPU part). The planner counts
    // the bf16 gram rows when this CPU runs them; a plan made without them runs the f32 grams.
    const size_t planned = hp.plan && hp.plan->cpu.set() ? static_cast<size_t>(hp.plan->cpu.arena_bytes.value) : 0;
    job.bf16_grams = ex.bf16_dot && bf16_grams_possible(job);
    // AMX GEMMs (cpu/la_amx.hpp): GDN's on top of the bf16 grams (raw q and k rows), KDA's on its
    // decayed f32 operands (bf16 inputs; its grams stay f32), for the GEMM-first program only (the
    // W/U form keeps its f32 GEMMs); a plan whose arena cannot hold the packed operands runs without.
    std::string why_not;  // a requested AMX setting that does not run, and why
    if (ex.amx != LaAmx::Off) {
      if (!cpu::la_amx_usable()) why_not = "no usable AMX-BF16 (CPU, OS tile permission, or HANPU_ISA below native)";
      else if (job.traits().channel_gate() && (job.in.q.dtype != DType::BF16 || job.in.k.dtype != DType::BF16))
        why_not = "needs bf16 q and k";  // KDA: the decayed f32 operands are rounded, whatever the inputs
      else if (!job.traits().channel_gate() && !job.bf16_grams)
        why_not = "needs bf16 q and k with contiguous rows and ExecOptions::bf16_dot";
      else if (!s.program.gemm_first) why_not = "the plan's program is the W/U form (GEMM-first only)";
      else job.amx_terms = ex.amx == LaAmx::Split ? 2 : 1;
    }
    if (job.amx_terms && planned > 0 && head_fused_need_floats(job, s) * sizeof(float) > planned) {
      job.amx_terms = 0;
      why_not = "the plan's arena (plan.cpu.arena_bytes " + std::to_string(planned) + ") cannot hold the packed operands";
    }
    if (job.bf16_grams && planned > 0 && head_fused_need_floats(job, s) * sizeof(float) > planned) job.bf16_grams = false;
    if (ex.report)
      ex.report->gemms = job.amx_terms == 2 ? "amx-split" : job.amx_terms == 1 ? "amx-round"
                         : why_not.empty()  ? "f32"
                                            : "f32 (amx: " + why_not + ")";
    workspace = run_head_fused(job, s, engine, planned);
  } else {
    workspace = run_chunk_parallel(job, s, engine);
  }
  if (ex.workspace_bytes) *ex.workspace_bytes = workspace;
}

void gdn_prefill(const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex) {
  la_prefill(Variant::GDN, in, opt, out, ex);
}
void kda_prefill(const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex) {
  la_prefill(Variant::KDA, in, opt, out, ex);
}

namespace {
void la_decode(Variant variant, const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o,
               const ExecOptions& given) {
  if (given.plan || given.path != CpuPath::HeadFused)
    throw Error("ExecOptions.plan / path: decode runs the recurrence of the cached \"hanpu\" plan's mapping; "
                "leave plan null and path at hanpu");
  if (state.empty()) throw Error("decode needs tensor 'state' [N,HV,K,V] fp32, which is missing");
  if (state.dtype != DType::F32)
    throw Error(std::string("tensor 'state' has dtype ") + dtype_name(state.dtype) + ", expected F32");
  LaInputs din = in;
  din.initial_state = state;  // read, then written back in place: items own disjoint columns
  LaOutputs out{o, state};
  const LaJob job = make_la_job(variant, din, opt, out);
  // The mapping of the "hanpu" plan for this signature (cached: a decode step does not re-plan).
  ExecOptions ex;
  ex.threads = given.threads;
  ex.engine = given.engine;
  Engine& engine = cpu::engine_or_default(ex.engine);
  run_recurrent(job, *schedule_for(job, ex, engine, false).schedule, engine);
}
ExecOptions with_threads(int threads) {
  ExecOptions ex;
  ex.threads = threads;
  return ex;
}
}  // namespace

void gdn_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads) {
  la_decode(Variant::GDN, in, opt, state, o, with_threads(threads));
}
void kda_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads) {
  la_decode(Variant::KDA, in, opt, state, o, with_threads(threads));
}
void gdn_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, const ExecOptions& ex) {
  la_decode(Variant::GDN, in, opt, state, o, ex);
}
void kda_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, const ExecOptions& ex) {
  la_decode(Variant::KDA, in, opt, state, o, ex);
}

LaResult la_prefill_alloc(Variant variant, const LaInputs& in, const LaOptions& opt, const ExecOptions& ex) {
  const LaShape s = validate_la(variant, in, opt);
  LaResult r{Tensor(in.v.dtype, {s.B, s.T, s.HV, s.V}), Tensor(DType::F32, {s.N, s.HV, s.K, s.V})};
  la_prefill(variant, in, opt, LaOutputs{r.o.view(), r.final_state.view()}, ex);
  return r;
}

}  // namespace hanpu
