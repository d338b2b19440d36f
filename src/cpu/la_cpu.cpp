// The CPU backend's driver: validates, builds the job, runs the chosen path on the thread pool.
#include <algorithm>
#include <memory>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "device/host.hpp"
#include "hanpu/cpu_plan.hpp"
#include "la/job.hpp"

namespace hanpu {
namespace {

// Per-thread arena, 64-byte aligned, reused across calls (sized by the kernels' layouts: the
// state and the per-chunk intermediates of one item, independent of T).
struct Arena {
  std::unique_ptr<float, decltype(&std::free)> mem{nullptr, &std::free};
  size_t floats = 0;
  float* get(size_t n) {
    if (n > floats) {
      void* p = std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
      if (!p) throw Error("out of memory allocating a " + std::to_string(n * sizeof(float)) + "-byte arena");
      mem.reset(static_cast<float*>(p));
      floats = n;
    }
    return mem.get();
  }
};

// One arena per pool thread (thread_local: each worker keeps its own across calls).
Arena& thread_arena() {
  thread_local Arena arena;
  return arena;
}

// More threads than this is a mistake, not a plan: each thread gets an arena and a pinned worker.
constexpr int kMaxThreads = 1024;

int resolve_threads(int threads) {
  if (threads > kMaxThreads)
    throw Error("threads = " + std::to_string(threads) + " exceeds the limit of " + std::to_string(kMaxThreads));
  return threads > 0 ? threads : hardware_threads();
}

// GDN grams from raw bf16 rows (cpu::gram_bf16_lower): q and k bf16 with contiguous rows, and a
// CPU with AVX512-BF16. KDA's grams multiply decay-scaled rows, which are no longer bf16 values.
bool bf16_grams_possible(const LaJob& job) {
  const LaInputs& in = job.in;
  return job.variant() == Variant::GDN && in.q.dtype == DType::BF16 && in.k.dtype == DType::BF16 &&
         in.q.stride[3] == 1 && in.k.stride[3] == 1 && cpu::gram_bf16_usable();
}

std::vector<int64_t> seq_lengths(const LaJob& job) {
  std::vector<int64_t> lens;
  for (const SeqSpan& s : job.seqs) lens.push_back(s.len);
  return lens;
}

size_t run_fla_items(const LaJob& job, const std::vector<WorkItem>& items, int threads, int chunk);

// Returns the workspace bytes: the largest arena each thread needed, summed over threads.
size_t run_head_fused(const LaJob& job, const CpuPlan& plan, int chunk) {
  ThreadPool& pool = ThreadPool::shared(plan.threads);
  std::vector<size_t> arena_floats(static_cast<size_t>(plan.threads), 0);
  const size_t max_group = static_cast<size_t>(std::max(1, plan.head_group));
  pool.run(plan.threads, [&](int t) {
    cpu::DenormalGuard ftz;
    Arena& arena = thread_arena();
    const std::vector<WorkItem>& items = plan.per_thread[static_cast<size_t>(t)];
    for (size_t i = 0; i < items.size();) {
      // The run of following items with the same sequence and columns, cut into the fewest groups
      // of at most max_group, of near-equal size: 8 heads with max_group 7 run as 4 + 4, not as
      // 7 + 1 (a lone head reads isolated rows and streams no better than a group; measured on
      // GDN f32 H = 16, 2 threads: 4 + 4 a few percent faster, KDA unchanged).
      size_t run = 1;
      while (i + run < items.size() && items[i + run].seq == items[i].seq &&
             items[i + run].col0 == items[i].col0 && items[i + run].col1 == items[i].col1)
        ++run;
      const size_t groups = (run + max_group - 1) / max_group;
      const size_t n = (run + groups - 1) / groups;
      const size_t need = cpu::fused_arena_floats(job, items[i].col1 - items[i].col0, chunk, n, plan.order);
      arena_floats[static_cast<size_t>(t)] = std::max(arena_floats[static_cast<size_t>(t)], need);
      cpu::fused_group(job, &items[i], n, arena.get(need), chunk, plan.order);
      i += n;
    }
  });
  size_t bytes = 0;
  for (size_t f : arena_floats) bytes += f * sizeof(float);
  if (!plan.chunk_parallel.empty()) bytes = std::max(bytes, run_fla_items(job, plan.chunk_parallel, plan.threads, chunk));
  return bytes;
}

size_t run_recurrent(const LaJob& job, int threads) {
  // The recurrence has nothing to share along the sequence: the plan's head-level assignment as
  // it is, and the items it would run chunk-parallel spread round-robin instead.
  const CpuPlan plan = make_cpu_plan(job.shape, seq_lengths(job), threads);
  std::vector<std::vector<WorkItem>> per = plan.per_thread;
  for (size_t i = 0; i < plan.chunk_parallel.size(); ++i)
    per[i % static_cast<size_t>(threads)].push_back(plan.chunk_parallel[i]);
  ThreadPool& pool = ThreadPool::shared(threads);
  std::vector<size_t> arena_floats(static_cast<size_t>(threads), 0);
  pool.run(threads, [&](int t) {
    cpu::DenormalGuard ftz;
    Arena& arena = thread_arena();
    for (const WorkItem& item : per[static_cast<size_t>(t)]) {
      const size_t need = cpu::recurrent_arena_floats(job, item.col1 - item.col0);
      arena_floats[static_cast<size_t>(t)] = std::max(arena_floats[static_cast<size_t>(t)], need);
      cpu::recurrent_item(job, item, arena.get(need));
    }
  });
  size_t bytes = 0;
  for (size_t f : arena_floats) bytes += f * sizeof(float);
  return bytes;
}

// FLA-style: all items' Map phases chunk-parallel, then the Reduce per item, then the output Map.
size_t run_fla_items(const LaJob& job, const std::vector<WorkItem>& items, int threads, int chunk) {
  const LaShape& s = job.shape;
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
  const size_t gk = s.variant == Variant::KDA ? K : 1;
  const size_t slots = static_cast<size_t>(buf.total_chunks * s.HV);
  // Intermediates in main memory, as FLA materialises them between its kernels.
  std::vector<double> gamma(slots * C * gk);
  std::vector<float> T(slots * C * C), W(slots * C * Kp), U(slots * C * Vp),
      h(slots * K * Vp), v_new(slots * C * Vp);
  buf.gamma = gamma.data();
  buf.T = T.data();
  buf.W = W.data();
  buf.U = U.data();
  buf.h = h.data();
  buf.v_new = v_new.data();

  // Which (chunk, head) pairs belong to the requested items (whole heads: the baseline does not
  // split columns).
  std::vector<std::pair<int64_t, int64_t>> map_tasks;
  for (const WorkItem& w : items) {
    const int64_t c0 = first[static_cast<size_t>(w.seq)];
    const int64_t nc = (job.seqs[static_cast<size_t>(w.seq)].len + chunk - 1) / chunk;
    for (int64_t c = c0; c < c0 + nc; ++c) map_tasks.emplace_back(c, w.head);
  }
  ThreadPool& pool = ThreadPool::shared(threads);
  const size_t scratch_floats = cpu::fla_scratch_floats(job, chunk);
  auto parallel_tasks = [&](const auto& fn, size_t count) {
    pool.run(threads, [&](int t) {
      cpu::DenormalGuard ftz;
      float* scratch = thread_arena().get(scratch_floats);
      for (size_t i = static_cast<size_t>(t); i < count; i += static_cast<size_t>(threads)) fn(i, scratch);
    });
  };
  parallel_tasks([&](size_t i, float* sc) { cpu::fla_map_chunk(job, buf, map_tasks[i].first, map_tasks[i].second, sc); },
                 map_tasks.size());
  parallel_tasks([&](size_t i, float* sc) { cpu::fla_reduce_item(job, buf, items[i], sc); }, items.size());
  parallel_tasks(
      [&](size_t i, float* sc) { cpu::fla_output_chunk(job, buf, map_tasks[i].first, map_tasks[i].second, sc); },
      map_tasks.size());
  const size_t intermediates = gamma.size() * sizeof(double) +
                               (T.size() + W.size() + U.size() + h.size() + v_new.size()) * sizeof(float);
  return intermediates + static_cast<size_t>(threads) * scratch_floats * sizeof(float);
}

CpuPlan default_plan(const LaJob& job, int threads) {
  CpuPlan plan = make_cpu_plan(job.shape, seq_lengths(job), threads);
  plan.head_group = head_group_for_cache(job.shape, detect_host().l2_bytes());
  return plan;
}

std::vector<WorkItem> whole_items(const LaJob& job) {
  std::vector<WorkItem> items;
  for (int64_t n = 0; n < job.shape.N; ++n)
    for (int64_t hv = 0; hv < job.shape.HV; ++hv)
      items.push_back({static_cast<int32_t>(n), static_cast<int32_t>(hv), 0, static_cast<int32_t>(job.shape.V)});
  return items;
}

}  // namespace

void la_prefill(Variant variant, const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex) {
  LaJob job = make_la_job(variant, in, opt, out);
  job.bf16_grams = ex.bf16_dot && ex.path == CpuPath::HeadFused && bf16_grams_possible(job);
  const int threads = resolve_threads(ex.threads);
  constexpr int kChunk = 64;  // C = 64 tokens, as FLA: the arena and the op count assume it
  size_t workspace = 0;
  switch (ex.path) {
    case CpuPath::HeadFused: {
      if (ex.plan) {
        validate_cpu_plan(*ex.plan, job.shape);
        if (ex.plan->chunk != kChunk)
          throw Error("CpuPlan: chunk " + std::to_string(ex.plan->chunk) + " is not supported, expected 64");
        workspace = run_head_fused(job, *ex.plan, ex.plan->chunk);
      } else {
        workspace = run_head_fused(job, default_plan(job, threads), kChunk);
      }
      break;
    }
    case CpuPath::FlaChunk:
      workspace = run_fla_items(job, whole_items(job), threads, kChunk);
      break;
    case CpuPath::Recurrent:
      workspace = run_recurrent(job, threads);
      break;
  }
  if (ex.workspace_bytes) *ex.workspace_bytes = workspace;
}

CpuPlan default_cpu_plan(Variant variant, const LaInputs& in, const LaOptions& opt, int threads) {
  const LaShape s = validate_la(variant, in, opt);
  // The job needs an output view to validate; planning never touches it.
  static float placeholder;
  const TensorView o = TensorView::contiguous(&placeholder, DType::F32, {s.B, s.T, s.HV, s.V});
  const LaJob job = make_la_job(variant, in, opt, LaOutputs{o, TensorView{}});
  return default_plan(job, resolve_threads(threads));
}

void gdn_prefill(const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex) {
  la_prefill(Variant::GDN, in, opt, out, ex);
}
void kda_prefill(const LaInputs& in, const LaOptions& opt, const LaOutputs& out, const ExecOptions& ex) {
  la_prefill(Variant::KDA, in, opt, out, ex);
}

namespace {
void la_decode(Variant variant, const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads) {
  if (state.empty()) throw Error("decode needs tensor 'state' [N,HV,K,V] fp32, which is missing");
  if (state.dtype != DType::F32)
    throw Error(std::string("tensor 'state' has dtype ") + dtype_name(state.dtype) + ", expected F32");
  LaInputs din = in;
  din.initial_state = state;  // read, then written back in place: items own disjoint columns
  LaOutputs out{o, state};
  const LaJob job = make_la_job(variant, din, opt, out);
  run_recurrent(job, resolve_threads(threads));
}
}  // namespace

void gdn_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads) {
  la_decode(Variant::GDN, in, opt, state, o, threads);
}
void kda_decode(const LaInputs& in, const LaOptions& opt, TensorView state, TensorView o, int threads) {
  la_decode(Variant::KDA, in, opt, state, o, threads);
}

LaResult la_prefill_alloc(Variant variant, const LaInputs& in, const LaOptions& opt, const ExecOptions& ex) {
  const LaShape s = validate_la(variant, in, opt);
  LaResult r{Tensor(in.v.dtype, {s.B, s.T, s.HV, s.V}), Tensor(DType::F32, {s.N, s.HV, s.K, s.V})};
  la_prefill(variant, in, opt, LaOutputs{r.o.view(), r.final_state.view()}, ex);
  return r;
}

}  // namespace hanpu
