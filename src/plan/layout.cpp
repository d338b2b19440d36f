// Dataflow-aware layout planning (the paper's layout planning).
//
// How the three prunings shape the problem built here:
//  1. Only the state crosses chunks, so one chunk is solved and its solution repeated; the state's
//     layout is the one decision shared by every chunk (S and the next chunk's S are one variable).
//  2. Tensors feeding the matrix unit must end blocked: whatever their layout on the vector side,
//     all their matrix consumers are served by ONE conversion (a blocked copy staged in L1), a
//     unary cost of the dense choice; such a branch adds no coupling.
//  3. A vector operator works in one layout (its output's): its other operands in the other layout
//     are converted, a pairwise cost; a chain of such operators is all dense or all blocked unless
//     the conversions pay for themselves.
// What remains is a DP over the tensors in production order whose state is the layouts of the
// tensors still coupled to a later one (D_i(s) = min_p D_{i-1}(p) + c_i(p, s)); in the LA graphs
// that frontier holds at most a few tensors.
#include <algorithm>
#include <limits>
#include <map>

#include "hanpu/plan.hpp"
#include "plan/lower.hpp"

namespace hanpu {

namespace {

double pair_cost(const LayoutProblem::Pair& p, int la, int lb) { return p.cost[static_cast<size_t>(la * 2 + lb)]; }

}  // namespace

LayoutSolution solve_layouts_dp(const LayoutProblem& lp) {
  const int n = static_cast<int>(lp.tensors.size());
  if (n > 63) throw Error("layout DP: more than 63 tensors");
  // last_partner[i]: the latest tensor coupled to i (i stays open until then).
  std::vector<int> last_partner(static_cast<size_t>(n), -1);
  std::vector<std::vector<const LayoutProblem::Pair*>> incoming(static_cast<size_t>(n));
  for (const auto& p : lp.pairs) {
    if (p.a >= p.b || p.a < 0 || p.b >= n) throw Error("layout DP: pair (" + std::to_string(p.a) + ", " + std::to_string(p.b) + ") not in production order");
    last_partner[static_cast<size_t>(p.a)] = std::max(last_partner[static_cast<size_t>(p.a)], p.b);
    incoming[static_cast<size_t>(p.b)].push_back(&p);
  }
  struct Entry {
    double cost;
    uint64_t prev;
    int layout;
  };
  // states[i]: open-tensor assignment (bit j = layout of tensor j) -> best entry after tensor i.
  std::vector<std::map<uint64_t, Entry>> states(static_cast<size_t>(n) + 1);
  states[0][0] = {0, 0, 0};
  for (int i = 0; i < n; ++i) {
    uint64_t open_mask = 0;  // tensors <= i still coupled to a later tensor
    for (int j = 0; j <= i; ++j)
      if (last_partner[static_cast<size_t>(j)] > i) open_mask |= uint64_t{1} << j;
    for (const auto& [mask, e] : states[static_cast<size_t>(i)]) {
      for (int l = 0; l < 2; ++l) {
        double c = e.cost + lp.unary[static_cast<size_t>(i)][static_cast<size_t>(l)];
        for (const auto* p : incoming[static_cast<size_t>(i)]) c += pair_cost(*p, static_cast<int>((mask >> p->a) & 1), l);
        const uint64_t next = (mask | (static_cast<uint64_t>(l) << i)) & open_mask;
        auto& slot = states[static_cast<size_t>(i) + 1];
        auto it = slot.find(next);
        if (it == slot.end() || c < it->second.cost) slot[next] = {c, mask, l};
      }
    }
  }
  // Backtrack.
  LayoutSolution sol;
  sol.layout.assign(static_cast<size_t>(n), Layout::Dense);
  if (n == 0) return sol;
  auto best = std::min_element(states[static_cast<size_t>(n)].begin(), states[static_cast<size_t>(n)].end(),
                               [](const auto& a, const auto& b) { return a.second.cost < b.second.cost; });
  sol.cost = best->second.cost;
  uint64_t mask = best->first;
  for (int i = n; i >= 1; --i) {
    const Entry& e = states[static_cast<size_t>(i)].at(mask);
    sol.layout[static_cast<size_t>(i) - 1] = e.layout ? Layout::Blocked : Layout::Dense;
    mask = e.prev;
  }
  return sol;
}

LayoutSolution solve_layouts_exhaustive(const LayoutProblem& lp) {
  const int n = static_cast<int>(lp.tensors.size());
  if (n > 24) throw Error("layout exhaustive search: " + std::to_string(n) + " tensors is too many (limit 24)");
  LayoutSolution best;
  best.cost = std::numeric_limits<double>::infinity();
  for (uint64_t m = 0; m < (uint64_t{1} << n); ++m) {
    double c = 0;
    for (int i = 0; i < n; ++i) c += lp.unary[static_cast<size_t>(i)][(m >> i) & 1];
    for (const auto& p : lp.pairs) c += pair_cost(p, static_cast<int>((m >> p.a) & 1), static_cast<int>((m >> p.b) & 1));
    if (c < best.cost) {
      best.cost = c;
      best.layout.assign(static_cast<size_t>(n), Layout::Dense);
      for (int i = 0; i < n; ++i) best.layout[static_cast<size_t>(i)] = ((m >> i) & 1) ? Layout::Blocked : Layout::Dense;
    }
  }
  return best;
}

LayoutProblem layout_problem(const OpGraph& g, const std::vector<OpId>& order, const Device& dev, int64_t chunk,
                             int64_t K, int64_t V) {
  using plan_detail::is_layout_decision;
  const double lanes = dev.vector.lanes.count(DType::F32) ? dev.vector.lanes.at(DType::F32).value : 0;
  const double hz = dev.clock_ghz.value * 1e9;
  if (lanes <= 0 || hz <= 0) throw Error("device " + dev.name + ": vector.lanes.F32 and clock_ghz must be positive for layout planning");
  auto var = [](const std::string& t) { return t == "S_next" ? std::string("S") : t; };
  auto numel = [&](const std::string& t) {
    const TensorDef& d = g.tensor(t);
    return static_cast<double>(tensor_bytes(d, chunk, K, V) / static_cast<int64_t>(dtype_size(d.dtype)));
  };
  auto xform = [&](const std::string& t) { return transform_seconds(dev, numel(t)); };
  auto two_d = [&](const std::string& t) {
    const TensorDef& d = g.tensor(t);
    return d.rows != "1" && d.cols != "1";
  };

  // The matrix unit's own layout (device data): its results arrive in it and its operands must be
  // in it, so the other layout costs one conversion (pruning 2 anchors, on either side).
  const size_t foreign = dev.matrix.operand_layout == OperandLayout::Dense ? 1 : 0;  // index of the layout that converts
  LayoutProblem lp;
  std::map<std::string, int> index;
  auto add = [&](const std::string& t) {
    if (index.count(t)) return;
    index[t] = static_cast<int>(lp.tensors.size());
    lp.tensors.push_back(t);
    lp.unary.push_back({0, 0});
  };
  // The state first: it is there when the chunk starts (pruning 1).
  bool has_state = false;
  for (const OpId o : order)
    for (const std::string& in : g.op(o).inputs)
      if (in == "S") has_state = true;
  if (has_state) add("S");
  // A GM input several vector operators read (KDA's k, read by its three decay operators) arrives
  // dense and is converted at most once, on arrival: its layout in UB is a decision of its own,
  // coupled to each reader. An input with one vector reader keeps the equivalent unary cost below.
  std::map<std::string, int> vector_readers;
  for (const OpId o : order)
    if (g.op(o).unit != Unit::Matrix)
      for (const std::string& in : g.op(o).inputs) ++vector_readers[in];
  for (const TensorDef& t : g.tensors)
    if (plan_detail::is_shared_input(t, vector_readers[t.name])) {
      add(t.name);
      lp.unary[static_cast<size_t>(index.at(t.name))][1] += xform(t.name);  // dense in GM: blocked costs the conversion
    }
  for (const OpId o : order)
    for (const std::string& out : g.op(o).outputs)
      if (is_layout_decision(g.tensor(out))) add(var(out));

  std::map<std::pair<int, int>, std::array<double, 4>> pairs;
  // A conversion when the two layouts differ (symmetric, so the pair's order does not matter).
  auto couple = [&](const std::string& a, const std::string& b, double cost_if_differ) {
    int ia = index.at(var(a)), ib = index.at(var(b));
    if (ia == ib) return;
    if (ia > ib) std::swap(ia, ib);
    auto& c = pairs[{ia, ib}];
    c[1] += cost_if_differ;  // (dense, blocked)
    c[2] += cost_if_differ;  // (blocked, dense)
  };

  for (const OpId o : order) {
    const OperatorDef& op = g.op(o);
    if (op.unit == Unit::Matrix) {
      for (const std::string& out : op.outputs)
        if (is_layout_decision(g.tensor(out))) lp.unary[static_cast<size_t>(index.at(var(out)))][foreign] += xform(out);
      continue;
    }
    if (op.outputs.empty()) continue;
    const std::string& first = op.outputs.front();
    const bool decides = is_layout_decision(g.tensor(first));
    const double hz_ops = op_counts(g, op, chunk, K, V, 16).vector_ops / lanes / hz;
    if (decides) {
      if (op.row_structured) lp.unary[static_cast<size_t>(index.at(var(first)))][1] += (kBlockedRowPenalty - 1) * hz_ops;
      for (const std::string& in : op.inputs) {
        if (!two_d(in)) continue;
        if (index.count(var(in))) couple(in, first, xform(in));
        else lp.unary[static_cast<size_t>(index.at(var(first)))][1] += xform(in);  // dense input converted for a blocked op
      }
      for (size_t i = 1; i < op.outputs.size(); ++i)
        if (is_layout_decision(g.tensor(op.outputs[i]))) couple(first, op.outputs[i], xform(op.outputs[i]));
    } else {
      // Dense working layout (e.g. the output o): blocked inputs are converted.
      for (const std::string& in : op.inputs)
        if (two_d(in) && index.count(var(in))) lp.unary[static_cast<size_t>(index.at(var(in)))][1] += xform(in);
    }
  }
  // Matrix consumers: one conversion for all of them when the tensor is not in the unit's layout
  // (pruning 2).
  for (const std::string& t : lp.tensors) {
    if (g.tensor(t).role == TensorRole::Input) continue;  // matrix operands come from GM, converted by the DMA
    bool matrix_use = false;
    for (const OpId o : order) {
      const OperatorDef& op = g.op(o);
      if (op.unit == Unit::Matrix && std::find(op.inputs.begin(), op.inputs.end(), t) != op.inputs.end()) matrix_use = true;
    }
    if (matrix_use) lp.unary[static_cast<size_t>(index.at(t))][foreign] += xform(t);
  }
  for (const auto& [ab, c] : pairs) lp.pairs.push_back({ab.first, ab.second, c});
  return lp;
}

double transform_seconds(const Device& dev, double elements) {
  const double hz = dev.clock_ghz.value * 1e9;
  const double per_cycle = dev.vector.transform_row_elements.value > 0 ? dev.vector.transform_row_elements.value
                                                                        : dev.vector_lanes(DType::F32);
  return elements / per_cycle / hz;
}

}  // namespace hanpu
