// Mapping work onto cores: HA-NPU's head-level mapping with its three tail tiers (the paper's head-level mapping)
// and the chunk-parallel mapping of FLA-style Map phases.
#include <algorithm>
#include <numeric>

#include "hanpu/plan.hpp"

namespace hanpu {

HeadMapping map_heads(const Problem& p, int cores, int quantum) {
  const int P = std::max(1, cores);
  quantum = std::max(1, quantum);
  HeadMapping m;
  m.cores.assign(static_cast<size_t>(P), {});
  struct Costed {
    PlanItem item;
    double cost;
  };
  std::vector<Costed> items;
  for (int64_t s = 0; s < p.sequences(); ++s) {
    const int64_t nc = p.chunks_of(s);
    if (nc == 0) continue;  // an empty sequence has no work (its final state is its initial state)
    for (int64_t h = 0; h < p.HV; ++h)
      items.push_back({{static_cast<int32_t>(s), static_cast<int32_t>(h), 0, static_cast<int32_t>(p.V), 0, nc, 1},
                       static_cast<double>(nc)});
  }
  // Longest first; stable so equal items keep (sequence, head) order.
  std::stable_sort(items.begin(), items.end(), [](const Costed& a, const Costed& b) { return a.cost > b.cost; });
  const int n = static_cast<int>(items.size());
  const int tail = n % P;
  std::vector<double> load(static_cast<size_t>(P), 0.0);
  // Tier 1: whole heads, longest first to the least-loaded core. When every item costs the same
  // (one sequence, or a batch of equal lengths), that rule deals heads out round robin; contiguous
  // blocks instead give each core neighbouring heads, whose rows of q/k/v are adjacent in memory
  // (a CPU core streaming a head group reads whole cache lines; an NPU does not care).
  const bool uniform = n > 0 && items.front().cost == items[static_cast<size_t>(n - 1)].cost;
  if (uniform) {
    const int per_core = (n - tail) / P;
    for (int i = 0; i < n - tail; ++i) {
      m.cores[static_cast<size_t>(i / per_core)].push_back(items[static_cast<size_t>(i)].item);
      load[static_cast<size_t>(i / per_core)] += items[static_cast<size_t>(i)].cost;
    }
  }
  for (int i = uniform ? n - tail : 0; i < n - tail; ++i) {
    const size_t c = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    m.cores[c].push_back(items[static_cast<size_t>(i)].item);
    load[c] += items[static_cast<size_t>(i)].cost;
  }
  if (tail == 0) return m;
  const int quanta_per_head = static_cast<int>((p.V + quantum - 1) / quantum);
  const int64_t tail_quanta = static_cast<int64_t>(tail) * quanta_per_head;
  if (tail_quanta < P) {
    // Tier 3: even one column quantum per core leaves cores idle: chunk-parallel fallback.
    for (int i = n - tail; i < n; ++i) {
      PlanItem it = items[static_cast<size_t>(i)].item;
      it.tier = 3;
      m.chunk_parallel.push_back(it);
    }
    return m;
  }
  // Tier 2: the tail heads' columns, laid end to end (head after head), cut at quantum boundaries
  // into P parts of equal work (a quantum costs its head's chunk count); the least-loaded core
  // takes the first part. Columns are independent, so no part needs a reduction.
  struct Unit {
    int item;
    int q;
    double cost;
  };
  std::vector<Unit> units;
  double total = 0;
  for (int i = n - tail; i < n; ++i)
    for (int q = 0; q < quanta_per_head; ++q) {
      units.push_back({i, q, items[static_cast<size_t>(i)].cost});
      total += items[static_cast<size_t>(i)].cost;
    }
  std::vector<size_t> order(static_cast<size_t>(P));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return load[a] < load[b]; });
  size_t u = 0;
  double done = 0;
  for (int part = 0; part < P; ++part) {
    const double target = total * (part + 1) / P;
    const size_t begin = u;
    // At least one quantum per part; stop when the cumulative cost reaches the target, leaving
    // enough quanta for the remaining parts.
    while (u < units.size() && (u == begin || done + units[u].cost / 2 <= target) &&
           units.size() - u > static_cast<size_t>(P - part - 1)) {
      done += units[u].cost;
      ++u;
    }
    if (part == P - 1)
      while (u < units.size()) done += units[u++].cost;
    // Group consecutive quanta of the same head into one item.
    for (size_t a = begin; a < u;) {
      size_t b = a;
      while (b + 1 < u && units[b + 1].item == units[a].item) ++b;
      PlanItem it = items[static_cast<size_t>(units[a].item)].item;
      it.col0 = units[a].q * quantum;
      it.col1 = static_cast<int32_t>(std::min<int64_t>(p.V, static_cast<int64_t>(units[b].q + 1) * quantum));
      it.tier = 2;
      m.cores[order[static_cast<size_t>(part)]].push_back(it);
      a = b + 1;
    }
  }
  return m;
}

std::vector<std::vector<PlanItem>> map_chunks(const Problem&, const std::vector<PlanItem>& items, int cores) {
  const int P = std::max(1, cores);
  std::vector<std::vector<PlanItem>> out(static_cast<size_t>(P));
  int64_t n = 0;
  for (const PlanItem& it : items) n += it.chunk1 - it.chunk0;
  // Task t goes to core t * P / n (contiguous, equal ranges); consecutive tasks of one item on one
  // core become one item.
  int64_t t = 0;
  for (const PlanItem& it : items) {
    for (int64_t c = it.chunk0; c < it.chunk1; ++c, ++t) {
      const size_t core = static_cast<size_t>(n ? t * P / n : 0);
      auto& list = out[core];
      if (!list.empty()) {
        PlanItem& last = list.back();
        if (last.seq == it.seq && last.head == it.head && last.col0 == it.col0 && last.col1 == it.col1 && last.chunk1 == c) {
          last.chunk1 = c + 1;
          continue;
        }
      }
      PlanItem x = it;
      x.chunk0 = c, x.chunk1 = c + 1;
      list.push_back(x);
    }
  }
  return out;
}

}  // namespace hanpu

namespace hanpu {

std::vector<int32_t> lockstep_groups(const std::vector<PlanItem>& items, int max_group) {
  const size_t max_n = static_cast<size_t>(std::max(1, max_group));
  std::vector<int32_t> sizes;
  for (size_t i = 0; i < items.size();) {
    // The run of following items that can share a chunk loop: same sequence, columns and chunks.
    size_t run = 1;
    while (i + run < items.size() && items[i + run].seq == items[i].seq && items[i + run].col0 == items[i].col0 &&
           items[i + run].col1 == items[i].col1 && items[i + run].chunk0 == items[i].chunk0 &&
           items[i + run].chunk1 == items[i].chunk1)
      ++run;
    // The fewest groups of at most max_n, of near-equal size: a lone last head reads isolated rows
    // and streams no better than a group (measured on GDN f32 H = 16, 2 threads: 4 + 4 a few
    // percent faster than 7 + 1, KDA unchanged).
    const size_t groups = (run + max_n - 1) / max_n;
    const size_t n = (run + groups - 1) / groups;
    for (size_t left = run; left > 0; left -= std::min(n, left)) sizes.push_back(static_cast<int32_t>(std::min(n, left)));
    i += run;
  }
  return sizes;
}

int max_lockstep_group(const Device& dev, int64_t K, int64_t width, int64_t state_bytes) {
  int64_t capacity = 0;
  for (const BufferSpec& b : dev.buffers)
    if (b.name == dev.matrix.output) capacity = static_cast<int64_t>(b.capacity_bytes.value);
  // A scratchpad (an NPU's buffers) holds a state's rows as they are; a cache's padding is the
  // caller's to state (the CPU's rules pass the arena's padded size, src/cpu/cpu_planning.cpp).
  if (state_bytes <= 0) state_bytes = std::max<int64_t>(1, K * width * static_cast<int64_t>(sizeof(float)));
  // A quarter of the buffer for the group's states: on AVX-512 with a 2 MiB L2 and K = V = 128,
  // groups of 4-8 states measured fastest of 1, 4, 8, 14; more push the chunk's buffers out.
  return static_cast<int>(std::clamp<int64_t>(capacity / 4 / state_bytes, 1, 64));
}

}  // namespace hanpu
