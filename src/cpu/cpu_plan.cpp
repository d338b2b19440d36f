#include "hanpu/cpu_plan.hpp"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <tuple>
#include <string>

namespace hanpu {

namespace {

// Share of a chunk's work that does not scale with the column block width: the Map operators
// (gate, K K^T, Q K^T and their gating) run in full for every column block of a head. From the
// operation count (la_flops_per_token_head): for K = V = 128 the C x C products are 8K of the 65K
// multiply-adds per token, the K x V ones the rest; 0.15 leaves room for the loads and exps.
constexpr double kColumnInvariantShare = 0.15;

struct Costed {
  WorkItem item;
  double cost;
};

double chunks_of(int64_t len, int chunk) { return static_cast<double>(std::max<int64_t>(1, (len + chunk - 1) / chunk)); }

}  // namespace

std::string CpuPlan::describe() const {
  std::ostringstream os;
  os << "threads=" << threads << " chunk=" << chunk << " head_group=" << head_group
     << " order=" << (order.gemm_first ? "gemm-first" : "w-u-form") << ","
     << (order.state_in_place ? "in-place-state" : "double-buffered-state");
  for (size_t t = 0; t < per_thread.size(); ++t) {
    os << "\n  thread " << t << ":";
    for (const WorkItem& w : per_thread[t]) os << " (s" << w.seq << ",h" << w.head << ",v" << w.col0 << ":" << w.col1 << ")";
  }
  if (!chunk_parallel.empty()) {
    os << "\n  chunk-parallel:";
    for (const WorkItem& w : chunk_parallel) os << " (s" << w.seq << ",h" << w.head << ")";
  }
  return os.str();
}

void validate_cpu_plan(const CpuPlan& plan, const LaShape& shape) {
  if (plan.threads < 1 || static_cast<int>(plan.per_thread.size()) != plan.threads)
    throw Error("CpuPlan: per_thread has " + std::to_string(plan.per_thread.size()) + " lists for " +
                std::to_string(plan.threads) + " threads");
  // Coverage count per (sequence, head, column).
  std::vector<uint8_t> seen(static_cast<size_t>(shape.N * shape.HV * shape.V), 0);
  auto mark = [&](const WorkItem& w, bool whole_heads) {
    if (w.seq < 0 || w.seq >= shape.N || w.head < 0 || w.head >= shape.HV || w.col0 < 0 || w.col1 > shape.V ||
        w.col0 >= w.col1 || (whole_heads && (w.col0 != 0 || w.col1 != shape.V)))
      throw Error("CpuPlan: item (seq " + std::to_string(w.seq) + ", head " + std::to_string(w.head) + ", columns " +
                  std::to_string(w.col0) + ":" + std::to_string(w.col1) + ") is out of range for N=" +
                  std::to_string(shape.N) + " HV=" + std::to_string(shape.HV) + " V=" + std::to_string(shape.V) +
                  (whole_heads ? " (chunk-parallel items take whole heads)" : ""));
    for (int32_t c = w.col0; c < w.col1; ++c) {
      uint8_t& s = seen[static_cast<size_t>((w.seq * shape.HV + w.head) * shape.V + c)];
      if (s++) throw Error("CpuPlan: (seq " + std::to_string(w.seq) + ", head " + std::to_string(w.head) + ", column " +
                           std::to_string(c) + ") is covered twice");
    }
  };
  for (const auto& per : plan.per_thread)
    for (const WorkItem& w : per) mark(w, false);
  for (const WorkItem& w : plan.chunk_parallel) mark(w, true);
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i])
      throw Error("CpuPlan: (seq " + std::to_string(i / shape.V / shape.HV) + ", head " +
                  std::to_string(i / shape.V % shape.HV) + ", column " + std::to_string(i % shape.V) +
                  ") is not covered by any item");
}

CpuPlan make_cpu_plan(const LaShape& shape, const std::vector<int64_t>& seq_lens, int threads, int column_quantum) {
  CpuPlan plan;
  plan.threads = std::max(1, threads);
  plan.column_quantum = std::max(1, column_quantum);
  plan.per_thread.assign(static_cast<size_t>(plan.threads), {});
  const int P = plan.threads;
  const int V = static_cast<int>(shape.V);

  std::vector<Costed> items;
  for (size_t n = 0; n < seq_lens.size(); ++n)
    for (int64_t hv = 0; hv < shape.HV; ++hv)
      items.push_back({{static_cast<int32_t>(n), static_cast<int32_t>(hv), 0, V}, chunks_of(seq_lens[n], plan.chunk)});
  // Longest first (stable, so equal-length items keep (sequence, head) order).
  std::stable_sort(items.begin(), items.end(), [](const Costed& a, const Costed& b) { return a.cost > b.cost; });

  const int n = static_cast<int>(items.size());
  const int tail = n % P;  // tier 1 places n - tail whole items evenly; the tail would idle threads
  std::vector<Costed> blocks(items.begin(), items.end() - tail);
  const int max_blocks = std::max(1, V / plan.column_quantum);
  const int split = tail ? std::min(P / tail, max_blocks) : 1;
  for (int i = n - tail; i < n; ++i) {
    const Costed& c = items[i];
    if (split <= 1) {
      blocks.push_back(c);
      continue;
    }
    // Tier 2: column blocks of equal width in multiples of the quantum (the last one takes the rest).
    const int quanta = (V + plan.column_quantum - 1) / plan.column_quantum;
    for (int b = 0; b < split; ++b) {
      const int q0 = quanta * b / split, q1 = quanta * (b + 1) / split;
      WorkItem w = c.item;
      w.col0 = q0 * plan.column_quantum;
      w.col1 = std::min(V, q1 * plan.column_quantum);
      if (w.col1 <= w.col0) continue;
      const double width = static_cast<double>(w.col1 - w.col0) / V;
      blocks.push_back({w, c.cost * (kColumnInvariantShare + (1 - kColumnInvariantShare) * width)});
    }
  }

  // Tier 3: still fewer items than threads and something to share along the sequence: run those
  // items chunk-parallel on all threads instead.
  if (static_cast<int>(blocks.size()) < P && n > 0) {
    const bool multi_chunk = std::any_of(items.begin(), items.end(), [](const Costed& c) { return c.cost > 1; });
    if (multi_chunk) {
      for (const Costed& c : items) plan.chunk_parallel.push_back(c.item);
      return plan;
    }
  }

  std::stable_sort(blocks.begin(), blocks.end(), [](const Costed& a, const Costed& b) { return a.cost > b.cost; });
  const bool uniform = !blocks.empty() && blocks.front().cost == blocks.back().cost;
  if (uniform) {
    // Equal items: contiguous blocks per thread (thread t takes items [t n/P, (t+1) n/P)), so a
    // thread's heads are neighbours in memory and can run as one lockstep group.
    std::stable_sort(blocks.begin(), blocks.end(), [](const Costed& a, const Costed& b) {
      return std::tie(a.item.seq, a.item.col0, a.item.head) < std::tie(b.item.seq, b.item.col0, b.item.head);
    });
    const size_t nb = blocks.size();
    for (size_t t = 0; t < static_cast<size_t>(P); ++t)
      for (size_t i = t * nb / P; i < (t + 1) * nb / P; ++i) plan.per_thread[t].push_back(blocks[i].item);
  } else {
    // Longest-processing-time-first assignment to the least-loaded thread.
    std::vector<double> load(static_cast<size_t>(P), 0.0);
    for (const Costed& c : blocks) {
      const size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      plan.per_thread[t].push_back(c.item);
      load[t] += c.cost;
    }
    // Neighbouring heads next to each other so that they can form lockstep groups.
    for (auto& per : plan.per_thread)
      std::stable_sort(per.begin(), per.end(), [](const WorkItem& a, const WorkItem& b) {
        return std::tie(a.seq, a.col0, a.head) < std::tie(b.seq, b.col0, b.head);
      });
  }
  return plan;
}

int head_group_for_cache(const LaShape& shape, int64_t l2_bytes) {
  const int64_t vp = (shape.V + 15) / 16 * 16 + 16;  // padded row (upper bound of the arena's)
  const int64_t state_bytes = shape.K * vp * static_cast<int64_t>(sizeof(float));
  // A quarter of L2 for the group's states: measured on AVX-512 (2 MiB L2, K = V = 128: groups of
  // 1, 4, 8, 14) 4-8 states are fastest; more states push the chunk buffers and rows out of L2.
  return static_cast<int>(std::clamp<int64_t>(l2_bytes / 4 / std::max<int64_t>(1, state_bytes), 1, 64));
}

}  // namespace hanpu
