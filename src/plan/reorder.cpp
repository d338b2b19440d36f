// Lifetime-aware operator reordering (the paper's lifetime-aware reordering) as a planner pass: over the chunk's
// operator graph, find the order that runs every operator after its inputs and minimizes the peak
// live bytes of the vector buffer (UB), with matrix results allowed to wait in the matrix unit's
// output buffer (L0C) until their first consumer, within that buffer's capacity.
//
// The live set after a prefix of the order depends only on which operators have run, not on
// their order, so the problem is a bottleneck path through the lattice of downward-closed operator
// sets: best(S + o) = min over o of max(best(S), bytes live while o runs). A dynamic program over
// those sets (2^n for n operators; n <= 22 in every LA graph) finds the exact optimum; tests check
// it against enumerating every topological order on small graphs.
#include <algorithm>
#include <array>
#include <limits>

#include "hanpu/plan.hpp"

namespace hanpu {

namespace {

// Beyond this many operators the subset lattice (2^n entries) is too large to enumerate.
constexpr size_t kMaxScheduledOperators = 22;

struct TensorInfo {
  int64_t bytes = 0;
  int producer = -1;           // operator index; -1: a graph input or the incoming state
  uint32_t consumers = 0;      // bit mask of reading operators
  bool carried = false;        // the state the next chunk reads: live for the whole chunk once it exists
  bool at_start = false;       // on core when the chunk starts (the incoming state)
  bool output = false;         // stored to GM as it is produced: live only while produced
  bool matrix_result = false;  // produced by the matrix unit: waits in its output buffer
};

struct Model {
  std::vector<TensorInfo> tensors;
  std::vector<uint32_t> needs;                 // per operator: operators producing its inputs
  std::vector<std::vector<int>> reads, writes;  // per operator: tensor indices
  std::vector<bool> matrix;                    // per operator
};

Model build_model(const OpGraph& g, int64_t L, int64_t K, int64_t V, bool results_wait) {
  if (g.ops.size() > kMaxScheduledOperators)
    throw Error("reordering: the graph has " + std::to_string(g.ops.size()) + " operators, expected at most " +
                std::to_string(kMaxScheduledOperators) + " (the exact search enumerates 2^n operator sets)");
  Model m;
  std::map<std::string, int> index;
  auto tensor = [&](const std::string& name) {
    auto it = index.find(name);
    if (it != index.end()) return it->second;
    const TensorDef& d = g.tensor(name);
    TensorInfo t;
    t.bytes = tensor_bytes(d, L, K, V);
    // In place, "S" is the state the next chunk reads; otherwise "S_next" is, and the incoming "S"
    // lives until its last reader.
    t.carried = d.role == TensorRole::State && (g.state_in_place || name == "S_next");
    t.at_start = d.role == TensorRole::State && name == "S";
    t.output = d.role == TensorRole::Output;
    m.tensors.push_back(t);
    return index[name] = static_cast<int>(m.tensors.size()) - 1;
  };
  const size_t n = g.ops.size();
  m.needs.assign(n, 0), m.reads.resize(n), m.writes.resize(n), m.matrix.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const OperatorDef& op = g.ops[i];
    m.matrix[i] = op.unit == Unit::Matrix;
    for (const std::string& out : op.outputs) {
      const int t = tensor(out);
      // An in-place update writes the state it read: that is not a new producer.
      if (std::find(op.inputs.begin(), op.inputs.end(), out) != op.inputs.end()) continue;
      m.tensors[static_cast<size_t>(t)].producer = static_cast<int>(i);
      m.tensors[static_cast<size_t>(t)].matrix_result = results_wait && m.matrix[i] && !m.tensors[static_cast<size_t>(t)].output;
      m.writes[i].push_back(t);
    }
  }
  for (size_t i = 0; i < n; ++i)
    for (const std::string& in : g.ops[i].inputs) {
      const int t = tensor(in);
      m.tensors[static_cast<size_t>(t)].consumers |= 1u << i;
      m.reads[i].push_back(t);
      const int p = m.tensors[static_cast<size_t>(t)].producer;
      if (p >= 0 && p != static_cast<int>(i)) m.needs[i] |= 1u << p;
    }
  // An in-place writer (the state update) runs after every other reader of the value it overwrites.
  for (size_t i = 0; i < n; ++i)
    for (const std::string& out : g.ops[i].outputs)
      if (std::find(g.ops[i].inputs.begin(), g.ops[i].inputs.end(), out) != g.ops[i].inputs.end())
        m.needs[i] |= m.tensors[static_cast<size_t>(index.at(out))].consumers & ~(1u << i);
  return m;
}

struct Occupancy {
  int64_t vector_buffer = 0, result_buffer = 0;
};

// Where a tensor is after the operators of `done` ran: not live, in the result buffer (a matrix
// result no consumer has taken yet) or in the vector buffer.
enum class Place { None, Result, Vector };

Place place(const TensorInfo& t, uint32_t done) {
  const bool exists = t.producer < 0 ? (t.at_start || (t.consumers & done) != 0) : (done >> t.producer & 1u) != 0;
  if (!exists || t.output) return Place::None;
  const bool all_read = (t.consumers & ~done) == 0;
  if (t.carried) return Place::Vector;  // the state stays until the chunk ends (the next chunk reads it)
  if (all_read) return Place::None;
  if (t.matrix_result && (t.consumers & done) == 0) return Place::Result;
  return Place::Vector;
}

Occupancy live_after(const Model& m, uint32_t done) {
  Occupancy o;
  for (const TensorInfo& t : m.tensors) {
    const Place p = place(t, done);
    if (p == Place::Vector) o.vector_buffer += t.bytes;
    if (p == Place::Result) o.result_buffer += t.bytes;
  }
  return o;
}

// Bytes live while operator i runs after `done`: everything live before, its inputs where they
// are read (a waiting matrix result moves to the vector buffer for its first consumer), and its
// outputs as they are made.
Occupancy live_during(const Model& m, uint32_t done, size_t i) {
  const uint32_t with = done | (1u << i);
  Occupancy o;
  for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
    const TensorInfo& t = m.tensors[ti];
    const bool read = std::find(m.reads[i].begin(), m.reads[i].end(), static_cast<int>(ti)) != m.reads[i].end();
    const bool written = std::find(m.writes[i].begin(), m.writes[i].end(), static_cast<int>(ti)) != m.writes[i].end();
    Place before = place(t, done);
    if (read && !m.matrix[i] && before == Place::Result) before = Place::Vector;
    if (read && before == Place::None && t.producer < 0 && !t.output) before = Place::Vector;  // loaded for this reader
    if (written) before = t.matrix_result ? Place::Result : Place::Vector;
    const Place after = place(t, with);
    const Place p = before != Place::None ? before : after;
    if (p == Place::Vector) o.vector_buffer += t.bytes;
    if (p == Place::Result) o.result_buffer += t.bytes;
  }
  return o;
}

}  // namespace

ReorderResult order_occupancy(const OpGraph& g, const std::vector<OpId>& order, int64_t L, int64_t K, int64_t V,
                              bool results_wait) {
  const Model m = build_model(g, L, K, V, results_wait);
  ReorderResult r;
  r.order = order;
  uint32_t done = 0;
  int last_unit = -1;
  const Occupancy start = live_after(m, 0);
  r.peak_vector_bytes = start.vector_buffer, r.peak_result_bytes = start.result_buffer;
  for (const OpId id : order) {
    const std::string name(operator_name(id));
    size_t i = 0;
    while (i < g.ops.size() && g.ops[i].id != id) ++i;
    if (i == g.ops.size()) throw Error("reordering: order names operator \"" + name + "\", which the graph does not have");
    if ((m.needs[i] & ~done) != 0) throw Error("reordering: operator " + name + " runs before an operator producing its input");
    const Occupancy o = live_during(m, done, i);
    r.peak_vector_bytes = std::max(r.peak_vector_bytes, o.vector_buffer);
    r.peak_result_bytes = std::max(r.peak_result_bytes, o.result_buffer);
    const int unit = m.matrix[i] ? 1 : 0;
    if (last_unit >= 0 && unit != last_unit) ++r.handoffs;
    last_unit = unit;
    done |= 1u << i;
  }
  return r;
}

ReorderResult lifetime_aware_order(const OpGraph& g, int64_t L, int64_t K, int64_t V, int64_t result_capacity,
                                   bool results_wait) {
  const Model m = build_model(g, L, K, V, results_wait);
  const size_t n = g.ops.size();
  const uint32_t all = (1u << n) - 1;
  constexpr int64_t kUnreachable = std::numeric_limits<int64_t>::max();
  // Pass 1: the least peak UB bytes any order reaches (L0C within capacity on every step).
  std::vector<int64_t> peak(static_cast<size_t>(all) + 1, kUnreachable);
  peak[0] = live_after(m, 0).vector_buffer;
  // Sets grow by one operator, so increasing masks visit every set after all its subsets.
  for (uint32_t done = 0; done < all; ++done) {
    if (peak[done] == kUnreachable) continue;
    for (size_t i = 0; i < n; ++i) {
      if ((done >> i & 1u) || (m.needs[i] & ~done) != 0) continue;
      const Occupancy during = live_during(m, done, i);
      if (during.result_buffer > result_capacity) continue;  // the waiting results would not fit L0C
      const uint32_t with = done | (1u << i);
      peak[with] = std::min(peak[with], std::max(peak[done], during.vector_buffer));
    }
  }
  if (peak[all] == kUnreachable)
    throw Error("reordering: no order keeps the waiting matrix results within the result buffer's " +
                std::to_string(result_capacity) + " bytes");
  const int64_t best_peak = peak[all];
  // Pass 2: among the orders that reach that peak, the fewest hand-offs between the matrix and the
  // vector unit (each is a synchronization, and GEMMs adjacent in the order share their operands
  // in L0A/L0B: the GEMM-first grouping), then the least peak L0C bytes. State: the operator set
  // and the unit of the last operator; exact for (UB peak, hand-offs).
  struct Best {
    int handoffs = std::numeric_limits<int>::max();
    int64_t result_peak = kUnreachable;
    int8_t last = -1;      // the last operator run
    int8_t from_unit = 0;  // the unit before it (its predecessor state)
  };
  std::vector<std::array<Best, 2>> best(static_cast<size_t>(all) + 1);
  best[0][0].handoffs = 0, best[0][0].result_peak = 0;
  best[0][1] = best[0][0];
  for (uint32_t done = 0; done < all; ++done)
    for (int unit = 0; unit < 2; ++unit) {
      const Best here = best[done][static_cast<size_t>(unit)];
      if (here.handoffs == std::numeric_limits<int>::max()) continue;
      for (size_t i = 0; i < n; ++i) {
        if ((done >> i & 1u) || (m.needs[i] & ~done) != 0) continue;
        const Occupancy during = live_during(m, done, i);
        if (during.result_buffer > result_capacity || during.vector_buffer > best_peak) continue;
        const int next_unit = m.matrix[i] ? 1 : 0;
        Best next;
        next.handoffs = here.handoffs + (done != 0 && next_unit != unit ? 1 : 0);
        next.result_peak = std::max(here.result_peak, during.result_buffer);
        next.last = static_cast<int8_t>(i), next.from_unit = static_cast<int8_t>(unit);
        Best& slot = best[done | (1u << i)][static_cast<size_t>(next_unit)];
        if (next.handoffs < slot.handoffs || (next.handoffs == slot.handoffs && next.result_peak < slot.result_peak)) slot = next;
      }
    }
  int unit = best[all][1].handoffs < best[all][0].handoffs ||
                     (best[all][1].handoffs == best[all][0].handoffs && best[all][1].result_peak < best[all][0].result_peak)
                 ? 1
                 : 0;
  ReorderResult r;
  r.peak_vector_bytes = best_peak;
  r.peak_result_bytes = best[all][static_cast<size_t>(unit)].result_peak;
  r.handoffs = best[all][static_cast<size_t>(unit)].handoffs;
  for (uint32_t s = all; s != 0;) {
    const Best& b = best[s][static_cast<size_t>(unit)];
    r.order.push_back(g.ops[static_cast<size_t>(b.last)].id);
    s &= ~(1u << b.last);
    unit = b.from_unit;
  }
  std::reverse(r.order.begin(), r.order.end());
  return r;
}

}  // namespace hanpu
